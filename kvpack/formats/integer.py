"""int8 (symmetric) and int4 (asymmetric, packed two per byte) quantization: the reference codecs.

All arithmetic is float32 (int8: IEEE division; int4: a multiply by the scale's float32
reciprocal); scales and zero-points are rounded to float16 (`SCALE_DTYPE`) before use, so a kernel
that loads them from the cache computes the same codes.

int8, per (token, head), or per head with a static float32 scale `s`:
    s = fp16(absmax / 127), s == 0 -> 1;  code = clamp(round_half_even(x / s), -127, 127);
    x^ = code * s
int4, per (token, head, group of `group_size` channels):
    m = fp16(min), s = fp16((max - min) / 15), s == 0 -> 1;
    code = clamp(round_half_even(fl(x - m) * r), 0, 15), r = fl(1 / s);  x^ = code * s + m
    (the product is within 1.5 units in the last place of the quotient (x - m) / s, so a code differs
    from the quotient's only where that lies within ~1e-6 of a half-integer: two levels equally near.
    The cache write then needs one multiply an element where the IEEE quotient took three.)
    Nibble order (`INT4_NIBBLE_ORDER = "split_half"`): byte j (0 <= j < D/2) holds channel j in
    its low nibble and channel j + D/2 in its high nibble:  byte = c[j] | c[j + D/2] << 4.
"""

from __future__ import annotations

import torch

from kvpack.formats.base import (
    QMAX_INT4, QMAX_INT8, SCALE_DTYPE, Codec, KVFormat, dynamic_scale, register_codec,
)

INT4_NIBBLE_ORDER = "split_half"  # byte j = channel j (low nibble) | channel j + D/2 (high nibble)
INT4_LO_SHIFT = 0
INT4_HI_SHIFT = 4
INT4_NIBBLE_MASK = 0xF
INT8_CODE_MIN, INT8_CODE_MAX = -QMAX_INT8, QMAX_INT8
INT4_CODE_MIN, INT4_CODE_MAX = 0, QMAX_INT4


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """[..., D] integer codes in 0..15 -> [..., D/2] uint8 (split-half nibble order)."""
    d = codes.shape[-1]
    c = codes.to(torch.uint8)
    return c[..., : d // 2] | (c[..., d // 2:] << INT4_HI_SHIFT)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[..., D/2] uint8 -> [..., D] uint8 codes in 0..15 (inverse of `pack_int4`)."""
    lo = packed & INT4_NIBBLE_MASK
    hi = (packed >> INT4_HI_SHIFT) & INT4_NIBBLE_MASK
    return torch.cat([lo, hi], dim=-1)


# ---- int8 ----------------------------------------------------------------------------------

def _quantize_int8(fmt: KVFormat, x: torch.Tensor, static_scale: torch.Tensor | None):
    if fmt.scale_mode == "static":
        s, scales = static_scale.float()[None, :, None], None
    else:
        scales = dynamic_scale(x.abs().amax(dim=-1, keepdim=True), QMAX_INT8)  # [N, H, 1]
        s = scales.float()
    codes = torch.clamp(torch.round(x / s), INT8_CODE_MIN, INT8_CODE_MAX).to(torch.int8)
    return codes, scales, None


def _dequantize_int8(fmt: KVFormat, codes, scales, zeros, static_scale) -> torch.Tensor:
    s = static_scale.float()[None, :, None] if fmt.scale_mode == "static" else scales.float()
    return codes.float() * s


# ---- int4 ----------------------------------------------------------------------------------

def int4_params(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [N, H, D] float32 -> (scales, zeros) [N, H, D // group_size] float16."""
    n, h, d = x.shape
    xg = x.reshape(n, h, d // group_size, group_size)
    mn, mx = xg.amin(dim=-1), xg.amax(dim=-1)
    return dynamic_scale(mx - mn, QMAX_INT4), mn.to(SCALE_DTYPE)


def _quantize_int4(fmt: KVFormat, x: torch.Tensor, static_scale: torch.Tensor | None):
    n, h, d = x.shape
    scales, zeros = int4_params(x, fmt.group_size)
    xg = x.reshape(n, h, d // fmt.group_size, fmt.group_size)
    r = 1.0 / scales.float()[..., None]  # IEEE float32 division, as the kernels' `recip_f16`
    q = torch.round((xg - zeros.float()[..., None]) * r)
    q = torch.clamp(q, INT4_CODE_MIN, INT4_CODE_MAX).to(torch.uint8).view(n, h, d)
    return pack_int4(q), scales, zeros


def _dequantize_int4(fmt: KVFormat, codes, scales, zeros, static_scale) -> torch.Tensor:
    n, h, _ = codes.shape
    d, gs = fmt.head_dim, fmt.group_size
    q = unpack_int4(codes).float().view(n, h, d // gs, gs)
    return (q * scales.float()[..., None] + zeros.float()[..., None]).view(n, h, d)


register_codec("int8", Codec(_quantize_int8, _dequantize_int8))
register_codec("int4", Codec(_quantize_int4, _dequantize_int4))
