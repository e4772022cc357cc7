from __future__ import annotations

import os

import torch

# Without CUDA, Triton kernels run through the interpreter; this must be set before any
# kernel module is imported (triton reads it when @triton.jit decorates).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

# The server tests need the `serve` extra (fastapi, uvicorn, openai, httpx): on a machine without it
# (the GPU box) they are not collected instead of failing at import. CI installs it (.[test]).
_SERVER_TESTS = ["test_bench_serve.py", "test_server.py", "test_server_e2e.py", "test_server_fakes.py",
                 "test_server_sigterm.py"]
try:
    import fastapi, httpx, openai, uvicorn  # noqa: E401, F401
except ImportError:
    collect_ignore = _SERVER_TESTS

# Two CPU cores: keep intra-op threads bounded; under pytest-xdist (`make test`) the workers share the cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))


def pytest_collection_modifyitems(config, items):
    # the ahead-of-time compiles (minutes, in subprocesses on every core) first: under pytest-xdist
    # --dist loadfile --no-loadscope-reorder (`make test`; xdist's default reorder, most tests first, left
    # this 10-test file for the end) their file then starts at once and overlaps the other workers' files
    items.sort(key=lambda item: not item.nodeid.startswith("tests/test_kernels_aot.py"))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
