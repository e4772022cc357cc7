from __future__ import annotations

import os

import torch

# Without CUDA, Triton kernels run through the interpreter; this must be set before any
# kernel module is imported (triton reads it when @triton.jit decorates).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

# Two CPU cores: keep intra-op threads bounded.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
