"""Building blocks of the Llama family: RMSNorm and rotary position embedding (RoPE).

Both follow Hugging Face transformers' arithmetic so logits match it on the same weights:
RMSNorm normalizes in float32 and casts back before the weight multiply; RoPE is "rotate half"
(the first and second halves of each head form the pairs), with cos/sin computed in float32 and
cast to the activation dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from kvpack.config import ConfigError

try:  # Triton kernels for CUDA tensors (same rounding as the PyTorch code below)
    from kvpack.kernels import fused_ops as _fused
except ImportError:  # no triton installed: PyTorch only
    _fused = None


def _use_fused(x: torch.Tensor) -> bool:
    return _fused is not None and _fused.fused_ops_enabled(x)


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), the normalization done in float32.

    forward(x) -> y; forward(x, residual) -> (rms_norm(x + residual), x + residual), the
    residual add fused in (rounded to x's dtype, as transformers' separate add rounds).
    x, residual: [..., hidden] any float dtype -> same shape and dtype.
    """

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if _use_fused(x):
            if residual is None:
                return _fused.rms_norm(x, self.weight, self.eps)
            return _fused.fused_add_rms_norm(x, residual, self.weight, self.eps)
        if residual is not None:
            x = x + residual
            return self._norm(x), x
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2I] (gate | up) -> silu(gate) * up: [..., I]."""
    if _use_fused(x):
        return _fused.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] float32 of RoPE, with optional scaling.

    scaling (from `ModelConfig.rope_scaling`):
      None                                  plain RoPE, theta^(-2i/d)
      {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
       original_max_position_embeddings}    Llama 3.1's wavelength-dependent scaling
      {"rope_type": "freq_factors", "freq_factors": [d/2 floats]}
                                            per-frequency divisors, as a GGUF's rope_freqs tensor stores
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if kind in (None, "default"):
        return inv_freq
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "freq_factors":
        factors = torch.tensor(scaling["freq_factors"], dtype=torch.float32)
        if factors.shape != inv_freq.shape:
            raise ConfigError(f"rope freq_factors has {factors.numel()} entries, expected {inv_freq.numel()}")
        return inv_freq / factors
    raise ConfigError(f"unsupported rope scaling type {kind!r}")


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    # Long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    factor = s["factor"]
    low, high = s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with a cos/sin table computed once for positions [0, max_positions).

    bind(positions [T] int64) -> `BoundRotary`, made once per forward and shared by every layer;
    calling it on (q [T, Hq, D], k [T, Hkv, D]) returns both rotated: one fused Triton launch on
    CUDA (`kvpack.kernels.fused_ops.rotary_embedding`, the same rounding), else `apply_rotary` with
    cos_sin(positions [T] int64, dtype) -> (cos, sin), each [T, 1, D] in `dtype`.
    The table is kept in float32 and cast per call (as transformers casts cos/sin to x's dtype).
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        self.scaling = scaling
        self.register_buffer("table", torch.empty(0), persistent=False)
        self.reset_cache()

    def reset_cache(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the table [max_positions, 2, D // 2] float32, e.g. after `to_empty`."""
        device = device if device is not None else self.table.device
        if torch.device(device).type == "meta":
            self.table = torch.empty(self.max_positions, 2, self.head_dim // 2, device="meta")
            return
        inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(device)
        pos = torch.arange(self.max_positions, dtype=torch.float32, device=device)
        freqs = pos[:, None] * inv_freq[None, :]  # [P, D/2]
        self.table = torch.stack([freqs.cos(), freqs.sin()], dim=1)

    def bind(self, positions: torch.Tensor) -> "BoundRotary":
        return BoundRotary(self, positions)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cs = self.table[positions].to(dtype)  # [T, 2, D/2]
        cos = torch.cat([cs[:, 0], cs[:, 0]], dim=-1)[:, None, :]  # [T, 1, D]
        sin = torch.cat([cs[:, 1], cs[:, 1]], dim=-1)[:, None, :]
        return cos, sin

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_positions={self.max_positions}, theta={self.theta}"


class BoundRotary:
    """RoPE for the positions of one forward pass: `(q, k) -> (rotated q, rotated k)`."""

    def __init__(self, rotary: RotaryEmbedding, positions: torch.Tensor) -> None:
        self.rotary = rotary
        self.positions = positions
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None  # the unfused path's, made once

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if _use_fused(q):
            return _fused.rotary_embedding(self.positions, q, k, self.rotary.table)
        if self._cos_sin is None:
            self._cos_sin = self.rotary.cos_sin(self.positions, q.dtype)
        return apply_rotary(q, *self._cos_sin), apply_rotary(k, *self._cos_sin)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos, sin: [T, 1, D] in x's dtype -> x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
