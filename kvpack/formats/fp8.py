"""Software FP8 (OCP E4M3FN and E5M2): encode float32 -> uint8 code, decode code -> float32.

Integer and bit operations only (float32 viewed as int32, shifts, masks, compares), so the same
steps port to a Triton kernel and run on GPUs without FP8 hardware. No torch float8 dtype is used.

Layouts (sign | exponent | mantissa), value of a normal code `(-1)^S * 2^(E - bias) * 1.M`,
of a subnormal (E == 0) `(-1)^S * 2^(1 - bias) * 0.M`:

| format   | bits    | bias | max finite       | min subnormal | inf         | NaN                      |
|----------|---------|------|------------------|---------------|-------------|--------------------------|
| fp8_e4m3 | 1.4.3   | 7    | 448   (0x7E)     | 2^-9          | none        | S.1111.111 (0x7F, 0xFF)  |
| fp8_e5m2 | 1.5.2   | 15   | 57344 (0x7B)     | 2^-16         | S.11111.00  | S.11111.{01,10,11}       |

Encoding (round to nearest, ties to even; signed zero kept; float32 subnormals and anything
below half the smallest fp8 subnormal become +-0) is bit-exact with
`torch.clamp(x, -MAX, MAX).to(torch.float8_*).view(torch.uint8)` for every float32 input, i.e.:

- finite values past +-MAX and +-inf **saturate** to +-MAX (0x7E/0xFE e4m3, 0x7B/0xFB e5m2);
  the e5m2 inf codes 0x7C/0xFC are never produced by the encoder;
- every NaN (any payload) maps to 0x7F | sign << 7 for both formats: this is what torch 2.13
  produces (checked by experiment: NaN and -NaN with quiet/signalling payloads give 0x7F / 0xFF
  in both formats, on the scalar and the vectorised CPU paths). Dequantized cache entries are
  never NaN unless the input was.

Decoding maps every one of the 256 codes as torch's float8 -> float32 conversion does
(e4m3: 0x7F/0xFF NaN; e5m2: 0x7C/0xFC +-inf, 0x7D-0x7F/0xFD-0xFF NaN; 0x80 is -0.0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpack.formats.base import Codec, KVFormat, dynamic_scale, register_codec


@dataclass(frozen=True)
class FP8Spec:
    name: str
    exp_bits: int
    man_bits: int
    bias: int
    max_finite: float
    max_code: int  # positive code of max_finite
    nan_code: int  # positive NaN code the encoder emits (| 0x80 for negative NaN)
    has_inf: bool

    @property
    def max_bits(self) -> int:
        """float32 bit pattern of max_finite (inputs with |x| bits >= this saturate)."""
        return int(torch.tensor([self.max_finite], dtype=torch.float32).view(torch.int32).item())


# Module-level constants for kernels (tl.constexpr).
FP8E4M3_EXP_BITS, FP8E4M3_MAN_BITS, FP8E4M3_BIAS = 4, 3, 7
FP8E4M3_MAX, FP8E4M3_MAX_CODE, FP8E4M3_NAN_CODE = 448.0, 0x7E, 0x7F
FP8E5M2_EXP_BITS, FP8E5M2_MAN_BITS, FP8E5M2_BIAS = 5, 2, 15
FP8E5M2_MAX, FP8E5M2_MAX_CODE, FP8E5M2_NAN_CODE = 57344.0, 0x7B, 0x7F
FP8E5M2_INF_CODE = 0x7C

FP8_E4M3 = FP8Spec("fp8_e4m3", FP8E4M3_EXP_BITS, FP8E4M3_MAN_BITS, FP8E4M3_BIAS,
                   FP8E4M3_MAX, FP8E4M3_MAX_CODE, FP8E4M3_NAN_CODE, has_inf=False)
FP8_E5M2 = FP8Spec("fp8_e5m2", FP8E5M2_EXP_BITS, FP8E5M2_MAN_BITS, FP8E5M2_BIAS,
                   FP8E5M2_MAX, FP8E5M2_MAX_CODE, FP8E5M2_NAN_CODE, has_inf=True)
FP8_SPECS = {"fp8_e4m3": FP8_E4M3, "fp8_e5m2": FP8_E5M2}


def _spec(fmt: str | FP8Spec) -> FP8Spec:
    return fmt if isinstance(fmt, FP8Spec) else FP8_SPECS[fmt]


def fp8_encode(x: torch.Tensor, fmt: str | FP8Spec) -> torch.Tensor:
    """float32 tensor (any shape) -> uint8 codes of the same shape."""
    sp = _spec(fmt)
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    sign = (bits >> 31) & 1  # arithmetic shift, then mask: 0 or 1
    a = bits & 0x7FFFFFFF  # |x| bits
    e32 = a >> 23
    shift = 23 - sp.man_bits
    # normal fp8 range: round the float32 mantissa to man_bits (carry may bump the exponent)
    ar = torch.clamp(a, max=sp.max_bits)  # no int32 overflow below; larger inputs saturate anyway
    rn = (ar + ((1 << (shift - 1)) - 1) + ((ar >> shift) & 1)) >> shift
    normal = rn - ((127 - sp.bias) << sp.man_bits)
    # subnormal fp8 range: code = round(|x| / 2^(1 - bias - man_bits)) from the 24-bit significand
    mant = (a & 0x7FFFFF) | ((e32 > 0).to(torch.int32) << 23)
    s = (151 - sp.bias - sp.man_bits) - torch.clamp(e32, min=1)  # >= 1 where used
    s = torch.clamp(s, 1, 30)
    half = torch.bitwise_left_shift(torch.ones_like(s), s - 1)
    sub = torch.bitwise_right_shift(mant + half - 1 + (torch.bitwise_right_shift(mant, s) & 1), s)
    min_normal_e32 = 128 - sp.bias  # float32 biased exponent of 2^(1 - bias)
    code = torch.where(e32 >= min_normal_e32, normal, sub)
    code = torch.where(a >= sp.max_bits, sp.max_code, code)  # saturate (includes +-inf)
    code = torch.where(a > 0x7F800000, sp.nan_code, code)  # NaN
    return (code | (sign << 7)).to(torch.uint8)


def fp8_decode(codes: torch.Tensor, fmt: str | FP8Spec) -> torch.Tensor:
    """uint8 codes (any shape) -> float32 values of the same shape."""
    sp = _spec(fmt)
    c = codes.to(torch.int32)
    sign = (c >> 7) & 1
    m_mask = (1 << sp.man_bits) - 1
    e_max = (1 << sp.exp_bits) - 1
    e = (c >> sp.man_bits) & e_max
    m = c & m_mask
    normal = ((e + (127 - sp.bias)) << 23) | (m << (23 - sp.man_bits))
    # subnormal: value m * 2^(1 - bias - man_bits); normalise on the leading bit p of m
    p = torch.zeros_like(m)
    for k in range(1, sp.man_bits):
        p = p + (m >= (1 << k)).to(torch.int32)
    sub_exp = p + (1 - sp.bias - sp.man_bits + 127)
    sub_man = torch.bitwise_left_shift(m - torch.bitwise_left_shift(torch.ones_like(p), p), 23 - p)
    sub = torch.where(m == 0, 0, (sub_exp << 23) | sub_man)
    out = torch.where(e == 0, sub, normal)
    if sp.has_inf:
        out = torch.where(e == e_max, torch.where(m == 0, 0x7F800000, 0x7FC00000), out)
    else:
        out = torch.where((e == e_max) & (m == m_mask), 0x7FC00000, out)
    out = out | (sign << 31)
    return out.to(torch.int32).view(torch.float32)


def _quantize(fmt: KVFormat, x: torch.Tensor, static_scale: torch.Tensor | None):
    if fmt.scale_mode == "static":
        return fp8_encode(x / static_scale.float()[None, :, None], fmt.kind), None, None
    s = dynamic_scale(x.abs().amax(dim=-1, keepdim=True), fmt.qmax)  # [N, H, 1] fp16
    return fp8_encode(x / s.float(), fmt.kind), s, None


def _dequantize(fmt: KVFormat, codes, scales, zeros, static_scale) -> torch.Tensor:
    x = fp8_decode(codes, fmt.kind)
    if fmt.scale_mode == "static":
        return x * static_scale.float()[None, :, None]
    return x * scales.float()


register_codec("fp8_e4m3", Codec(_quantize, _dequantize))
register_codec("fp8_e5m2", Codec(_quantize, _dequantize))
