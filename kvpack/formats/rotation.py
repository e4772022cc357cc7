"""Hadamard rotation of the head dim (int4, on by default).

R is the normalized Sylvester-Hadamard matrix H_n / sqrt(n) when head_dim n is a power of two;
otherwise block-diagonal with Hadamard blocks of size b = the largest power of two dividing n
(80 -> 5 blocks of 16, 96 -> 3 blocks of 32). R is symmetric and orthogonal, so R @ R = I:
K and V are stored as `x @ R`, and rotating again recovers x. It spreads outlier channels over
the block before int4 quantization; attention scores and outputs are mathematically unchanged
(q is multiplied by R when K is rotated, the output by R when V is rotated).

Storage rotation is defined operation by operation (`hadamard_transform`): log2(b) float32
butterfly stages (a, c) -> (a + c, a - c) over channel pairs i, i + h for h = 1, 2, ..., b/2, then one
multiply by `hadamard_norm(b)`. Every output is the same sequence of IEEE float32 adds and one
multiply in any implementation, so the Triton cache write reproduces the reference codes bit for
bit. Mathematically it is `x @ R` (the dense R serves the query/output side, where rounding is free).
"""

from __future__ import annotations

import functools
import math

import torch


def hadamard_block_size(head_dim: int) -> int:
    """The largest power of two dividing head_dim."""
    return head_dim & -head_dim


@functools.lru_cache(maxsize=None)
def _hadamard_cpu64(head_dim: int) -> torch.Tensor:
    b = hadamard_block_size(head_dim)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < b:  # Sylvester: H_2k = [[H, H], [H, -H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = h / (b ** 0.5)
    return torch.block_diag(*([h] * (head_dim // b)))


@functools.lru_cache(maxsize=None)
def _hadamard(head_dim: int, device: str) -> torch.Tensor:
    return _hadamard_cpu64(head_dim).to(device=device, dtype=torch.float32)


def hadamard(head_dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[head_dim, head_dim] float32 R, cached per (head_dim, device). Do not modify in place."""
    if head_dim <= 0:
        raise ValueError(f"head_dim must be positive, got {head_dim}")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return _hadamard(head_dim, str(dev))


@functools.lru_cache(maxsize=None)  # called per layer by the cache write and the rotation launches
def hadamard_norm(block: int) -> float:
    """1/sqrt(block) rounded to float32 (the constant both the reference and the kernels multiply by)."""
    return float(torch.tensor(1.0 / math.sqrt(block), dtype=torch.float32))


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """x @ R on the last dim (x [..., D]) as the storage rotation: float32 butterflies in the fixed
    order above, block b = `hadamard_block_size(D)`, then the multiply by `hadamard_norm(b)`."""
    x = x.to(torch.float32)
    d = x.shape[-1]
    b = hadamard_block_size(d)
    lead = x.shape[:-1]
    h = 1
    while h < b:
        y = x.reshape(*lead, d // (2 * h), 2, h)
        a, c = y[..., 0, :], y[..., 1, :]
        x = torch.stack((a + c, a - c), dim=-2).reshape(*lead, d)
        h *= 2
    return x * hadamard_norm(b)


def rotate(x: torch.Tensor, r: torch.Tensor | None) -> torch.Tensor:
    """x @ R on the last dim (x [..., D]), in float32; identity when r is None."""
    if r is None:
        return x
    return x.float() @ r
