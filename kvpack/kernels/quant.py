"""Shared @triton.jit helpers: rounding, int8/int4 encode, int4 nibbles, software FP8 encode/decode.

Every helper implements the bit-level definition in `kvpack.formats` (docs/structures.md, "KV format
definition") with integer/bit operations and IEEE float32 arithmetic (division for int8 / FP8, the
scale's reciprocal for int4), so that the codes a kernel
writes equal the PyTorch reference bit for bit, on any GPU (Ampere has no FP8 conversion
instructions; none is emitted here) and under the CPU interpreter.

Stable names (the prefill and decode attention kernels and the cache-write kernel import them):
    round_half_even(x)                 float32 (|x| < 2**22) -> int32, ties to even
    div_by_scale(x, s, r)              fl(x / s) from r = fl(1 / s): two fused multiply-adds
    div_by_scale_rows(x, s, r)         the same for a row's own dynamic scale, without the NaN guard
    recip_f16(s)                       fl(1 / s) for an fp16 scale s > 0: approximation + Newton step
    div_by_const(x, C)                 fl(x / C) for a constant C (from fl(1 / C)), no branch
    split_q_int8(q)                    float32 rows -> two int8 parts and a step per row (int8 MMAs)
    int8_encode(x, s, r)               float32 x, scale s (r = 1/s) -> int32 codes in [-127, 127]
    int4_encode(x, m, r)               float32 x, zero m, r = fl(1 / scale) -> int32 codes in [0, 15]
    int4_lo(b), int4_hi(b)             packed byte -> int32 low / high nibble (channel j / j + D/2)
    int4_pack(lo, hi)                  two int32 nibbles -> uint8 byte
    fp8_encode(x, FMT)                 float32 -> uint8 code (FMT = FMT_FP8E4M3 or FMT_FP8E5M2)
    fp8_decode(code, FMT)              uint8 code -> float32, every code as torch decodes it
    fp8_decode_f16(code, FMT)          uint8 code -> float16 equal to value / fp8_f16_factor(FMT)
                                       (exact, subnormals included; e4m3 NaN codes not kept)
    fp8_decode_f16_bits(code, FMT)     the same with plain Triton integer ops (no inline PTX)
    fp8_f16_factor(FMT)                2**8 for e4m3, 1 for e5m2 (fold it into the scale)
    int8_to_f16(c)                     int8 codes -> float16, exact
    int4_to_f16(b)                     packed bytes -> (low, high) nibbles as float16, exact
    decode_codes_f32(codes, FMT)       unscaled code values as float32 (float, int8, fp8 kinds)
    f32_to_bf16_rne(x)                 float32 -> bfloat16, ties to even, with integer ops (the CPU
                                       interpreter truncates in `.to(tl.bfloat16)`; GPUs round)
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from kvpack.formats import (
    FMT_FLOAT, FMT_FP8E4M3, FMT_FP8E5M2, FMT_INT4, FMT_INT8, FP8_E4M3, FP8_E5M2, FP8E4M3_BIAS, FP8E4M3_MAN_BITS,
    FP8E4M3_MAX, FP8E4M3_MAX_CODE, FP8E4M3_NAN_CODE, FP8E5M2_BIAS, FP8E5M2_MAX, FP8E5M2_MAN_BITS, FP8E5M2_MAX_CODE,
    FP8E5M2_NAN_CODE, INT4_HI_SHIFT, INT4_NIBBLE_MASK, QMAX_INT4, QMAX_INT8,
)

# True under the CPU interpreter. Pass it to kernels as a constexpr: there, a loop over tensor
# bounds (`for i in range(start, end)`) fails with numpy >= 2.4 (scalars are 1-element arrays);
# use `while` under INTERPRET and `range` (software-pipelined) on the GPU.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Module constants visible inside @triton.jit bodies.
_INTERPRET_C = tl.constexpr(INTERPRET)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host ints. `triton.cdiv` and `triton.next_power_of_2` are constexpr functions,
    ~5 us a call through their wrapper, and plan / launch code runs for every layer of an eager step."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """`triton.next_power_of_2` for host ints (0 -> 0, 1 -> 1, 5 -> 8), without its ~5 us wrapper."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


K_FMT_FLOAT = tl.constexpr(FMT_FLOAT)
K_FMT_INT8 = tl.constexpr(FMT_INT8)
K_FMT_INT4 = tl.constexpr(FMT_INT4)
K_FMT_FP8E4M3 = tl.constexpr(FMT_FP8E4M3)
K_FMT_FP8E5M2 = tl.constexpr(FMT_FP8E5M2)
_INT8_QMAX = tl.constexpr(float(QMAX_INT8))
_INT4_QMAX = tl.constexpr(float(QMAX_INT4))
_HI_SHIFT = tl.constexpr(INT4_HI_SHIFT)
_NIB_MASK = tl.constexpr(INT4_NIBBLE_MASK)
# float32 bit patterns of the largest finite fp8 values (448, 57344): inputs at or past saturate.
_E4M3_MAX_BITS = tl.constexpr(FP8_E4M3.max_bits)
_E5M2_MAX_BITS = tl.constexpr(FP8_E5M2.max_bits)
_E4M3_MAX_CODE = tl.constexpr(FP8E4M3_MAX_CODE)
_E5M2_MAX_CODE = tl.constexpr(FP8E5M2_MAX_CODE)
_E4M3_NAN_CODE = tl.constexpr(FP8E4M3_NAN_CODE)
_E4M3_FMAX = tl.constexpr(FP8E4M3_MAX)
_E5M2_FMAX = tl.constexpr(FP8E5M2_MAX)
_E5M2_NAN_CODE = tl.constexpr(FP8E5M2_NAN_CODE)
_RNE_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: adding it rounds |x| < 2**22 to an integer
_RNE_MAGIC_BITS = tl.constexpr(0x4B400000)


@triton.jit
def round_half_even(x):
    """float32 -> int32, round to nearest, ties to even (IEEE add in the default mode); |x| < 2**22."""
    y = x + _RNE_MAGIC
    return y.to(tl.int32, bitcast=True) - _RNE_MAGIC_BITS


@triton.jit
def add_rn(a, b):
    """a + b (float32) as an add of its own (`add.rn`), which ptxas never fuses with the multiply before it: the
    output's + V mean rounds o @ R (or o) first wherever it is formed (the merge kernels, the "dot" and "frag"
    epilogues), so their bits agree. A plain add was fused into o * NORM + mean in the merge kernel but not in
    "frag"'s one-split epilogue (`decode_frag._add_rn`; session 45). The interpreter adds as numpy does."""
    if _INTERPRET_C:
        return a + b
    else:
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)


Q_LO_STEPS = tl.constexpr(254)  # q's low part counts steps of (high part's step) / 254


@triton.jit
def split_q_int8(q):
    """q [GROUP_PAD, D] float32 -> (hi, lo, step) with q ~= (hi * 254 + lo) * step per row: hi =
    round(q / (254 step)) in -127..127 (254 step = the row's absmax / 127), lo = round of the
    remainder in steps, |lo| <= 127. The error is at most step / 2 = absmax / 64516 per element
    (bf16 q itself carries 2**-9 of each element). Both parts int8: the scores of an int8 K come from int8 MMAs (decode "imma", prefill).
    """
    amax = tl.max(tl.abs(q), axis=1)
    step = tl.where(amax > 0, amax, 1.0) / (127.0 * Q_LO_STEPS)
    hi = round_half_even(q / (step * Q_LO_STEPS)[:, None])
    lo = q / step[:, None] - hi.to(tl.float32) * Q_LO_STEPS
    lo = round_half_even(tl.minimum(tl.maximum(lo, -127.0), 127.0))
    return hi.to(tl.int8), lo.to(tl.int8), step


# x / s from r = 1 / s (Markstein): q = x r, e = q s - x (exact), q - e r; NaN (x or s infinite) -> q.
# Inline PTX, so that these two intended fused multiply-adds stand apart from compiler contractions
# (the write kernels compile without any: tests/test_kernels_aot.py).
_ASM_DIV_BY_SCALE = tl.constexpr("""{
.reg .f32 q, e;
.reg .pred p;
mul.rn.f32 q, $1, $3;
neg.f32 e, $1;
fma.rn.f32 e, q, $2, e;
neg.f32 e, e;
fma.rn.f32 e, e, $3, q;
testp.notanumber.f32 p, e;
selp.f32 $0, q, e, p;
}""")


@triton.jit
def div_by_scale(x, s, r):
    """x / s correctly rounded (IEEE division, as the format defines it), given r = div_rn(1, s):
    q = x * r, then one Markstein correction q - (q s - x) r, both steps fused multiply-adds; the
    residual q s - x is exact and the corrected quotient is the IEEE one for normal operands (checked
    against exact rational arithmetic over every fp16 scale: tests/test_kernels_write.py). The
    residual is negated (q s - x, not x - q s) so that x = -0 stays -0 (the sum -0 + +0 would be +0,
    a different FP8 code; the negations are operand modifiers of the SASS FFMA, not instructions). Three
    instructions per element where `div_rn` takes ~9 and a branch; r costs one division per scale.
    Where the correction is NaN (x or s infinite) the quotient is x * r, as x / s there. The CPU
    interpreter's fma rounds twice, so there this divides."""
    if _INTERPRET_C:
        v = tl.math.div_rn(x, s)
    else:
        v = tl.inline_asm_elementwise(_ASM_DIV_BY_SCALE, "=f,f,f,f",
                                      [x, tl.broadcast_to(s, x.shape), tl.broadcast_to(r, x.shape)],
                                      dtype=tl.float32, is_pure=True, pack=1)
    return v


# x * r and its correction, both returned, without the NaN guard (`div_by_scale_rows`)
_ASM_DIV_BY_SCALE_PAIR = tl.constexpr("""{
.reg .f32 e;
mul.rn.f32 $0, $2, $4;
neg.f32 e, $2;
fma.rn.f32 e, $0, $3, e;
neg.f32 e, e;
fma.rn.f32 $1, e, $4, $0;
}""")


@triton.jit
def _div_pair(x, s, r):
    """(q, corrected q) of `div_by_scale` without its guard: q = x r, q + (x - q s) r."""
    return tl.inline_asm_elementwise(_ASM_DIV_BY_SCALE_PAIR, "=f,=f,f,f,f",
                                     [x, tl.broadcast_to(s, x.shape), tl.broadcast_to(r, x.shape)],
                                     dtype=(tl.float32, tl.float32), is_pure=True, pack=1)


# 1 / s for an fp16 scale s > 0 (as float32): the hardware approximation, then one Newton step
_ASM_RCP_F16 = tl.constexpr("""{
.reg .f32 r, e, n;
rcp.approx.ftz.f32 r, $1;
neg.f32 n, $1;
fma.rn.f32 e, n, r, 0f3F800000;
fma.rn.f32 $0, r, e, r;
}""")


@triton.jit
def recip_f16(s):
    """div_rn(1, s) for a scale s > 0 that is an fp16 value (float32 holding it, or +inf), in 4
    instructions where `div_rn` takes ~9 on its fast path, plus its slow-path check and call.

    r0 = rcp.approx(s) is within 1 ulp (PTX's bound, any GPU); e = 1 - s r0 by one fma is exact (s has
    11 significant bits, r0 24, and |e| <= 2**-23 leaves at most 13); r0 + r0 e by one fma rounds the
    Newton value, within 2**-46 (relative) of 1 / s. 1 / s = 2**k / m with m an integer below 2**11, so
    unless it is exact it lies at least 2**-35 (relative) from every float32 rounding boundary: both
    round alike. s = +inf gives 0 (as 1 / inf). Checked with exact rationals for every fp16 scale and
    each r0 within 1 ulp (tests/test_kernels_write.py) and against `div_rn` on a GPU. The CPU
    interpreter divides."""
    if _INTERPRET_C:
        r = tl.math.div_rn(1.0, s)
    else:
        r = tl.inline_asm_elementwise(_ASM_RCP_F16, "=f,f", [s], dtype=tl.float32, is_pure=True, pack=1)
        r = tl.where(s == float("inf"), 0.0, r)
    return r


@triton.jit
def div_by_const(x, C: tl.constexpr):
    """div_rn(x, C) for a constant C (an fp16 value: QMAX 15, 127, 448, 57344), from RC = fl(1 / C):
    `div_by_scale` (its Markstein correction and NaN guard, 4 instructions, no branch) in place of
    `div_rn`'s ~9 and its slow path. Exact for normal quotients; a quotient below 2**-126 is within
    an ulp of the IEEE one and rounds to the same fp16 (0) where the dynamic scales round it. Checked
    against `div_rn` on a GPU for every float32 x (tests/test_kernels_write.py)."""
    if _INTERPRET_C:
        v = tl.math.div_rn(x, C)
    else:
        # 1 / C rounds to float32 in one step: no such C puts its float64 reciprocal on a float32 tie
        RC: tl.constexpr = 1.0 / C
        v = div_by_scale(x, tl.full(x.shape, C, tl.float32), tl.full(x.shape, RC, tl.float32))
    return v


@triton.jit
def div_by_scale_rows(x, s, r):
    """`div_by_scale` for a dynamic scale of x's own row, s = fp16(|x|max / QMAX) (0 -> 1), without
    the per-element NaN guard (3 of its 6 instructions an element). With such an s the correction is
    NaN only where the quotient q = x r is NaN too (x NaN), or where s is +inf (the row holds an inf, or
    its absmax overflows fp16); there q is the IEEE quotient (0 for finite x, NaN for infinite x), and
    the correction with s replaced by 0 (once per row) returns exactly q: (x - q 0) r + q = x 0 + q.
    Every finite quotient is bounded by ~QMAX, never inf. Same bits as `div_by_scale` (and IEEE
    division) for every such s, checked by the gpu-marked extreme-value tests."""
    if _INTERPRET_C:
        v = tl.math.div_rn(x, s)
    else:
        _, v = _div_pair(x, tl.where(s == float("inf"), 0.0, s), r)
    return v


@triton.jit
def int8_encode(x, s, r, ROW_SCALE: tl.constexpr = False):
    """code = clamp(round_half_even(x / s), -127, 127); x, s float32, r = div_rn(1, s) (s, r
    broadcastable). ROW_SCALE: s is the row's dynamic scale (`div_by_scale_rows`)."""
    v = div_by_scale_rows(x, s, r) if ROW_SCALE else div_by_scale(x, s, r)
    v = tl.minimum(tl.maximum(v, -_INT8_QMAX), _INT8_QMAX)  # clamp first: same result, no overflow
    return round_half_even(v)


@triton.jit
def int4_encode(x, m, r):
    """code = clamp(round_half_even(fl(x - m) * r), 0, 15) (the format's definition,
    `kvpack.formats.integer`); x, m float32, r = fl(1 / s) (`recip_f16`), broadcastable. Two
    instructions an element before the clamp and rounding, where the IEEE quotient (x - m) / s took
    four (`div_by_scale`'s product and its correction). A NaN x or m gives code 0 (the clamp's
    maximum returns 0), +inf 15; s = +inf has r = 0."""
    v = (x - m) * r
    v = tl.minimum(tl.maximum(v, 0.0), _INT4_QMAX)
    return round_half_even(v)


@triton.jit
def to_f32(x):
    """x.to(tl.float32); bf16 pairs on the GPU by one instruction an element (the low half shifted up, the
    high half masked in place), where the compiler's own conversion took 1.5 (a permute, then a shift, for
    each high half: sm_90 SASS of the cache write)."""
    if _INTERPRET_C or x.dtype != tl.bfloat16:
        return x.to(tl.float32)
    return tl.inline_asm_elementwise("{\nshl.b32 $0, $2, 16;\nand.b32 $1, $2, 0xFFFF0000;\n}", "=r,=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _min_nan_combine(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def min_nan(x, axis: tl.constexpr, keep_dims: tl.constexpr = True):
    """tl.min over `axis` that returns NaN where a value is NaN, as torch.amin does (tl.min skips NaNs): int4's
    group minimum, so that a group holding a NaN gets the reference's NaN zero point and scale (and codes 0)."""
    return tl.reduce(x, axis, _min_nan_combine, keep_dims=keep_dims)


@triton.jit
def int4_lo(b):
    """Low nibble of a packed byte (channel j), as int32 in 0..15."""
    return b.to(tl.int32) & _NIB_MASK


@triton.jit
def int4_hi(b):
    """High nibble of a packed byte (channel j + D/2), as int32 in 0..15."""
    return (b.to(tl.int32) >> _HI_SHIFT) & _NIB_MASK


@triton.jit
def int4_pack(lo, hi):
    """Two int32 codes in 0..15 -> one uint8 byte: lo | hi << 4."""
    return (lo | (hi << _HI_SHIFT)).to(tl.uint8)


def _enc_consts(man: int, bias: int) -> tuple:
    shift = 23 - man
    return tuple(tl.constexpr(v) for v in (
        shift, (1 << (shift - 1)) - 1, (127 - bias) << man, 151 - bias - man, 128 - bias))


# (mantissa shift, round bias, exponent rebias, subnormal shift base, min normal fp32 exponent)
_E4M3_ENC = _enc_consts(FP8E4M3_MAN_BITS, FP8E4M3_BIAS)
_E5M2_ENC = _enc_consts(FP8E5M2_MAN_BITS, FP8E5M2_BIAS)
_E4M3_SHIFT, _E4M3_RBIAS, _E4M3_REBIAS, _E4M3_SUBBASE, _E4M3_MINE = _E4M3_ENC
_E5M2_SHIFT, _E5M2_RBIAS, _E5M2_REBIAS, _E5M2_SUBBASE, _E5M2_MINE = _E5M2_ENC


@triton.jit
def _fp8_encode_spec(x, SHIFT: tl.constexpr, RBIAS: tl.constexpr, REBIAS: tl.constexpr,
                     SUBBASE: tl.constexpr, MINE: tl.constexpr, MAX_BITS: tl.constexpr,
                     MAX_CODE: tl.constexpr, NAN_CODE: tl.constexpr):
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    a = bits & 0x7FFFFFFF  # |x| bits
    e32 = a >> 23
    # normal range: round the 23-bit mantissa to MAN bits, ties to even (carry bumps the exponent)
    ar = tl.minimum(a, MAX_BITS)
    rn = (ar + RBIAS + ((ar >> SHIFT) & 1)) >> SHIFT
    normal = rn - REBIAS
    # subnormal range: round the 24-bit significand right by sh bits, ties to even
    mant = (a & 0x7FFFFF) | tl.where(e32 > 0, 0x800000, 0)
    sh = SUBBASE - tl.maximum(e32, 1)
    sh = tl.minimum(tl.maximum(sh, 1), 30)
    half = tl.full(sh.shape, 1, tl.int32) << (sh - 1)
    sub = (mant + half - 1 + ((mant >> sh) & 1)) >> sh
    code = tl.where(e32 >= MINE, normal, sub)
    code = tl.where(a >= MAX_BITS, MAX_CODE, code)  # saturate, +-inf included
    code = tl.where(a > 0x7F800000, NAN_CODE, code)  # every NaN
    return (code | (sign << 7)).to(tl.uint8)


@triton.jit
def fp8_encode(x, FMT: tl.constexpr):
    """float32 -> uint8 FP8 code (round to nearest even, saturating, NaN -> 0x7F | sign)."""
    if FMT == K_FMT_FP8E4M3:
        out = _fp8_encode_spec(x, _E4M3_SHIFT, _E4M3_RBIAS, _E4M3_REBIAS, _E4M3_SUBBASE, _E4M3_MINE,
                               _E4M3_MAX_BITS, _E4M3_MAX_CODE, _E4M3_NAN_CODE)
    else:
        out = _fp8_encode_spec(x, _E5M2_SHIFT, _E5M2_RBIAS, _E5M2_REBIAS, _E5M2_SUBBASE, _E5M2_MINE,
                               _E5M2_MAX_BITS, _E5M2_MAX_CODE, _E5M2_NAN_CODE)
    return out


# sm >= 89 has FP8 conversion instructions: two float32 -> one e4m3x2 / e5m2x2 pair, round to nearest
# even, saturating (.satfinite); 4 codes per 32-bit register (the first element in the low byte). Each
# input's sign bit is then or-ed into its code (three byte permutes gather the four sign bytes): a no-op
# for numbers, and a NaN's sign, which the instruction's canonical NaN (0x7F, the NaN code of both
# formats) drops.
_ASM_F32_FP8 = """{
.reg .b16 l, h;
.reg .b32 c, s01, s23, s;
cvt.rn.satfinite.FMTx2.f32 l, $2, $1;
cvt.rn.satfinite.FMTx2.f32 h, $4, $3;
mov.b32 c, {l, h};
prmt.b32 s01, $1, $2, 0x0073;
prmt.b32 s23, $3, $4, 0x7300;
prmt.b32 s, s01, s23, 0x7610;
and.b32 s, s, 0x80808080;
or.b32 $0, c, s;
}"""
_ASM_F32_E4M3 = tl.constexpr(_ASM_F32_FP8.replace("FMT", "e4m3"))
_ASM_F32_E5M2 = tl.constexpr(_ASM_F32_FP8.replace("FMT", "e5m2"))


@triton.jit
def fp8_encode_hw(x, FMT: tl.constexpr, FINITE: tl.constexpr = False):
    """`fp8_encode` with the sm >= 89 conversion instruction (compile only for such targets): the
    same codes. The input is clamped to the largest finite value first (.satfinite does not turn
    +-inf into the largest finite code, measured on the H200; the format saturates them), NaN kept
    (a NaN-propagating clamp: the instruction makes it 0x7F, and the asm ors the sign back in).
    FINITE: x is never +-inf (a quotient by a row's dynamic scale, `div_by_scale_rows`): no clamp
    (.satfinite saturates finite values as the clamp would; 2 instructions an element fewer)."""
    if FMT == K_FMT_FP8E4M3:
        xc = x if FINITE else tl.clamp(x, -_E4M3_FMAX, _E4M3_FMAX, propagate_nan=tl.PropagateNan.ALL)
        code = tl.inline_asm_elementwise(_ASM_F32_E4M3, "=r,r,r,r,r", [xc], dtype=tl.uint8, is_pure=True, pack=4)
    else:
        xc = x if FINITE else tl.clamp(x, -_E5M2_FMAX, _E5M2_FMAX, propagate_nan=tl.PropagateNan.ALL)
        code = tl.inline_asm_elementwise(_ASM_F32_E5M2, "=r,r,r,r,r", [xc], dtype=tl.uint8, is_pure=True, pack=4)
    return code


# GPU conversions to fp16 without conversion instructions (expected to bound a memory-bound decode kernel,
# cvt running at 1/8 of the FMA rate; yet e4m3's, one cvt per two codes against three integer operations,
# made "frag" 7-10 % faster on an H200: `_ASM_E4M3_F16_HW`, session 22): 4 codes per 32-bit register,
# bytes moved into fp16
# bit patterns with `prmt` (byte permute), masks and shifts; int codes become 1024 + code (exponent
# byte 0x64) and 1024 is subtracted exactly with one packed fp16 op. Plain PTX, any sm >= 70.
_ASM_INT8_F16 = tl.constexpr("""{
.reg .b32 t, m, k;
xor.b32 t, $2, 0x80808080;
mov.b32 m, 0x64646464;
mov.b32 k, 0x64806480;
prmt.b32 $0, t, m, 0x4140;
prmt.b32 $1, t, m, 0x4342;
sub.f16x2 $0, $0, k;
sub.f16x2 $1, $1, k;
}""")
_ASM_INT4_F16 = tl.constexpr("""{
.reg .b32 t, u, m, k;
mov.b32 m, 0x64646464;
mov.b32 k, 0x64006400;
and.b32 t, $4, 0x0F0F0F0F;
shr.b32 u, $4, 4;
and.b32 u, u, 0x0F0F0F0F;
prmt.b32 $0, t, m, 0x4140;
prmt.b32 $1, t, m, 0x4342;
prmt.b32 $2, u, m, 0x4140;
prmt.b32 $3, u, m, 0x4342;
sub.f16x2 $0, $0, k;
sub.f16x2 $1, $1, k;
sub.f16x2 $2, $2, k;
sub.f16x2 $3, $3, k;
}""")
_ASM_E5M2_F16 = tl.constexpr("""{
.reg .b32 z;
mov.b32 z, 0;
prmt.b32 $0, $2, z, 0x1404;
prmt.b32 $1, $2, z, 0x3424;
}""")
# e4m3: each code c becomes the fp16 bits sign << 15 | (c & 0x7F) << 7. prmt puts c in the low byte of
# each 16-bit half and its sign, replicated (selector bit 3), in the high byte; << 7 lands the sign at
# bit 15 and c's 7 magnitude bits at 7..13, and the mask clears c's own sign copy (bit 14) and what the
# low half shifted into the high one. 3 instructions per two codes (was 4: prmt, shift, two masks).
_ASM_E4M3_F16 = tl.constexpr("""{
.reg .b32 z, u0, u1;
mov.b32 z, 0;
prmt.b32 u0, $2, z, 0x9180;
prmt.b32 u1, $2, z, 0xB3A2;
shl.b32 u0, u0, 7;
shl.b32 u1, u1, 7;
and.b32 $0, u0, 0xBF80BF80;
and.b32 $1, u1, 0xBF80BF80;
}""")

# sm >= 89 (decode kernels planned with factor 1 for e4m3, `decode_plan.hw_fp8_decode`): the conversion
# instruction, two codes a 16-bit half of the input (the first in the low byte) to an fp16 pair, the value
# itself (e4m3's range and subnormals are fp16 normals: exact), NaN codes NaN. 1 instruction per two codes
# against the 3 integer ones of _ASM_E4M3_F16. e5m2 (`decode_plan.e5m2_hw_decode`): one conversion per two codes
# where the byte move takes one permute (integer pipe); its exact values (e5m2 is an fp16's top byte).
def _asm_fp8_f16_hw(kind: str) -> tl.constexpr:
    return tl.constexpr("{\n.reg .b16 l, h;\nmov.b32 {l, h}, $2;\n"
                        f"cvt.rn.f16x2.{kind}x2 $0, l;\ncvt.rn.f16x2.{kind}x2 $1, h;\n}}")


_ASM_E4M3_F16_HW = _asm_fp8_f16_hw("e4m3")
_ASM_E5M2_F16_HW = _asm_fp8_f16_hw("e5m2")


@triton.jit
def prefetch_l2(ptrs):
    """PTX prefetch.global.L2 of every address in ptrs (a hint: no registers, no wait)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


# `times_ptr` probe of the decode kernels (benchmarks/probe_decode_timeline.py): a program's timestamps, 8 int64
# a program: 0 entry, 1 q ready (the tile loop starts), 2 first tile done (ring kernels), 3 tile loop done,
# 4 exit (%globaltimer, ns); 5 entry, 6 exit (%clock64, the SM's cycles); 7 %smid. Not compiled in without it.
PROBE_SLOTS = tl.constexpr(8)


@triton.jit
def probe_stamp(ptr, WHAT: tl.constexpr = 0):
    """Store a timestamp at ptr (int64): WHAT 0 %globaltimer (ns), 1 %clock64 (cycles), 2 %smid."""
    if WHAT == 0:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    elif WHAT == 1:
        t = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    else:
        t = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False,
                                      pack=1).to(tl.int64)
    tl.store(ptr, t)


@triton.jit
def probe_entry(times_ptr):
    """The program's row of the timeline probe (PROBE_SLOTS int64 a program, grid order), with its entry
    stamps (0, 5) and SM (7) stored."""
    t_ptr = times_ptr + ((tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2)
                         + tl.program_id(2)).to(tl.int64) * PROBE_SLOTS
    probe_stamp(t_ptr, 0)
    probe_stamp(t_ptr + 5, 1)
    probe_stamp(t_ptr + 7, 2)
    return t_ptr


@triton.jit
def probe_exit(t_ptr):
    """The exit stamps (4: %globaltimer, 6: %clock64) of a program's probe row."""
    probe_stamp(t_ptr + 4, 0)
    probe_stamp(t_ptr + 6, 1)


@triton.jit
def int8_to_f16(c):
    """int8 codes -> float16 (exact)."""
    if _INTERPRET_C:
        out = c.to(tl.float16)
    else:
        out = tl.inline_asm_elementwise(_ASM_INT8_F16, "=r,=r,r", [c], dtype=tl.float16, is_pure=False, pack=4)
    return out


# float32 -> float16 (nearest even) -> float32 in one asm block: written as two Triton casts, the
# compiler may fold the round trip away on the GPU (measured: 1.1% of fp16 RoPE outputs 1 ulp off).
_ASM_ROUND_F16 = tl.constexpr("{ .reg .b16 h; cvt.rn.f16.f32 h, $1; cvt.f32.f16 $0, h; }")


@triton.jit
def f32_round_f16(x):
    """Round float32 values to the nearest float16 (ties to even), returned as float32."""
    if _INTERPRET_C:
        out = x.to(tl.float16).to(tl.float32)
    else:
        out = tl.inline_asm_elementwise(_ASM_ROUND_F16, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    return out


@triton.jit
def int4_to_f16(b):
    """Packed int4 bytes -> (low nibble, high nibble) as float16 codes 0..15 (exact)."""
    if _INTERPRET_C:
        lo = int4_lo(b).to(tl.float16)
        hi = int4_hi(b).to(tl.float16)
    else:
        lo, hi = tl.inline_asm_elementwise(_ASM_INT4_F16, "=r,=r,=r,=r,r", [b], dtype=(tl.float16, tl.float16),
                                           is_pure=False, pack=4)
    return lo, hi


@triton.jit
def fp8_decode_f16_bits(code, FMT: tl.constexpr):
    """`fp8_decode_f16` with plain Triton integer ops (runs everywhere, interpreter included)."""
    c = code.to(tl.int8, bitcast=True).to(tl.int16)  # sign-extended
    if FMT == K_FMT_FP8E4M3:
        bits = (c << 7) & -16512  # 0xBF80: sign, 4 exponent bits, 3 mantissa bits
    else:
        bits = c << 8
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def fp8_decode_f16(code, FMT: tl.constexpr):
    """uint8 FP8 code -> float16 holding value / fp8_f16_factor(FMT), exactly (subnormals too).

    e4m3: the 7 magnitude bits land in the fp16 exponent/mantissa fields (bias 15 vs 7: a factor
    2**-8); e5m2 is the top byte of an fp16 (inf and NaN kept). e4m3 NaN codes decode to 1.875*2**-8
    *sign here; `fp8_decode` keeps them NaN.
    """
    if _INTERPRET_C:
        out = fp8_decode_f16_bits(code, FMT)
    elif FMT == K_FMT_FP8E4M3:
        out = tl.inline_asm_elementwise(_ASM_E4M3_F16, "=r,=r,r", [code], dtype=tl.float16, is_pure=False, pack=4)
    else:
        out = tl.inline_asm_elementwise(_ASM_E5M2_F16, "=r,=r,r", [code], dtype=tl.float16, is_pure=False, pack=4)
    return out


@triton.jit
def fp8_decode_f16_hw(code, E5M2: tl.constexpr = False):
    """uint8 e4m3 (E5M2: e5m2) codes -> float16 values (e4m3: not / 256), by the sm >= 89 conversion instruction
    (compile only for such targets; exact, as `fp8_decode_f16` (e4m3: times 256), except that NaN codes may
    decode to another NaN)."""
    if E5M2:
        out = tl.inline_asm_elementwise(_ASM_E5M2_F16_HW, "=r,=r,r", [code], dtype=tl.float16, is_pure=True, pack=4)
    else:
        out = tl.inline_asm_elementwise(_ASM_E4M3_F16_HW, "=r,=r,r", [code], dtype=tl.float16, is_pure=True, pack=4)
    return out

@triton.jit
def fp8_f16_factor(FMT: tl.constexpr):
    if FMT == K_FMT_FP8E4M3:
        f = 256.0
    else:
        f = 1.0
    return f


@triton.jit
def fp8_decode(code, FMT: tl.constexpr):
    """uint8 FP8 code -> float32 as torch's float8 -> float32 conversion (NaN, inf, -0 included)."""
    v = fp8_decode_f16(code, FMT).to(tl.float32)
    if FMT == K_FMT_FP8E4M3:
        v = v * 256.0
        v = tl.where((code.to(tl.int32) & 0x7F) == 0x7F, float("nan"), v)
    return v


@triton.jit
def decode_codes_f32(codes, FMT: tl.constexpr):
    """Unscaled code values as float32: float kinds convert, int8 widens, fp8 decodes (not int4)."""
    if FMT == K_FMT_FP8E4M3:
        v = fp8_decode(codes, FMT)
    elif FMT == K_FMT_FP8E5M2:
        v = fp8_decode(codes, FMT)
    else:
        v = codes.to(tl.float32)
    return v


@triton.jit
def f32_to_bf16_rne(x):
    """float32 -> bfloat16 rounded to nearest even (NaN stays a quiet NaN), by integer ops."""
    bits = x.to(tl.int32, bitcast=True)
    r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    r = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, (bits >> 16) | 0x40, r)
    return r.to(tl.int16).to(tl.bfloat16, bitcast=True)
