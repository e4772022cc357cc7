"""Attention backend selection: the PyTorch reference on CPU, the Triton kernels on CUDA.

Both backends expose the same two functions with the signatures of `kvpack.attention.reference`:
`write_kv(k, v, layer_cache, slot_mapping)` and `paged_attention(q, layer_cache, metadata, scale)`.
`KVPACK_ATTENTION_BACKEND=reference|triton` forces one (e.g. triton under TRITON_INTERPRET=1 on CPU).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch

from kvpack.attention.kv_cache import LayerKVCache
from kvpack.attention.metadata import AttentionMetadata
from kvpack.config import ConfigError

ENV_VAR = "KVPACK_ATTENTION_BACKEND"


class AttentionBackend(Protocol):
    name: str

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, layer_cache: LayerKVCache,
                 slot_mapping: torch.Tensor) -> None: ...

    def paged_attention(self, q: torch.Tensor, layer_cache: LayerKVCache,
                        metadata: AttentionMetadata, scale: float) -> torch.Tensor: ...


@dataclass(frozen=True)
class _FunctionBackend:
    name: str
    write_kv: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]


def _reference() -> AttentionBackend:
    from kvpack.attention import reference

    return _FunctionBackend("reference", reference.write_kv, reference.paged_attention)


def _triton() -> AttentionBackend:
    import kvpack.kernels as kernels  # lazy: triton is optional on CPU machines

    return _FunctionBackend("triton", kernels.write_kv, kernels.paged_attention)


BACKENDS: dict[str, Callable[[], AttentionBackend]] = {"reference": _reference, "triton": _triton}
_cache: dict[str, AttentionBackend] = {}
_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvpack_attention_backend", default=None)


@contextlib.contextmanager
def forced_backend(name: str | None) -> Iterator[None]:
    """Inside the block, `get_attention_backend` answers `name` whatever the device and
    $KVPACK_ATTENTION_BACKEND say (None: no override). For work whose result must not depend on
    the backend under test, e.g. the centering probe on CPU."""
    if name is not None and name not in BACKENDS:
        raise ConfigError(f"attention backend {name!r} is not one of {', '.join(BACKENDS)}")
    token = _forced.set(name)
    try:
        yield
    finally:
        _forced.reset(token)


def get_attention_backend(device: torch.device | str | None = None) -> AttentionBackend:
    """The backend for `device`: reference on CPU, triton on CUDA, unless `forced_backend` or
    $KVPACK_ATTENTION_BACKEND names one."""
    name = _forced.get() or os.environ.get(ENV_VAR, "").strip().lower()
    if not name:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        name = "triton" if dev.type == "cuda" else "reference"
    if name not in BACKENDS:
        raise ConfigError(f"{ENV_VAR}={name!r} is not a backend; choose one of {', '.join(BACKENDS)}")
    if name not in _cache:
        _cache[name] = BACKENDS[name]()
    return _cache[name]
