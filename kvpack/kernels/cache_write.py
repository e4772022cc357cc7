"""Cache write: quantize the new tokens' K and V and scatter them into the paged pools (one launch).

Grid (cdiv(T, BLOCK_T), Hkv): each program takes BLOCK_T tokens of one kv head, for K and for V.
Codes, scales and zeros equal `kvpack.attention.reference.write_kv` bit for bit: float32 math with
IEEE division (`div_by_scale`: from r = 1/s, two fused multiply-adds per element give the IEEE
quotient), scales rounded to float16 before use, round-half-even, clamp. No `div_rn` on the GPU: a
dynamic scale is absmax (or range) / QMAX by `div_by_const` and its r by `recip_f16` (both exact, no
branch; `div_rn`'s slow-path call had cost int4 a third of its instructions' worth of registers: sm_90
119 -> 64 a thread, 65536 tokens of Llama-8B 168 -> 149 us on the H200, FP8 135 -> 123 us;
results/attention_s20/write). Centering
(x minus the layer's mean) and the storage rotation run in the kernel as the reference defines them
(`kvpack.attention.reference.storage_input`): a float32 subtract, then `_hadamard`, the same butterfly
stages and final multiply as `kvpack.formats.hadamard_transform`. One exception: int4 with a head dim
that is not a power of two (80, 96: Hadamard blocks straddle the two nibble halves) is centered and
rotated by `storage_input` in the launcher, and the kernel quantizes.

Long writes (>= ROW_MIN_TOKENS tokens: prefill) of rotated or int4 sides at head dims 64 and 128 use
the row layout (`_load_rows`, `row_layout`): a quarter of a row per thread (4 lanes a row), so that
most butterfly stages and group reductions stay in registers; short ones (decode) keep the plain layout.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kvpack.attention.kv_cache import CachePool, LayerKVCache
from kvpack.attention.reference import storage_input
from kvpack.formats import QMAX, hadamard_block_size, hadamard_norm
from kvpack.kernels.rotate import _hadamard
from kvpack.kernels.quant import (
    INTERPRET, _INTERPRET_C, K_FMT_FLOAT, K_FMT_INT4, K_FMT_INT8, cdiv, div_by_const, div_by_scale,
    div_by_scale_rows, recip_f16,
    f32_to_bf16_rne, fp8_encode,
    fp8_encode_hw, int4_encode, int4_pack, int8_encode, min_nan,
    next_pow2, to_f32,
)


@triton.jit
def _absmax_scale(x, QMAX: tl.constexpr):
    """Dynamic scale per row of x [BT, D] (padding holds 0): fp16(absmax / QMAX), 0 -> 1; float32."""
    s = div_by_const(tl.max(tl.abs(x), axis=1), QMAX).to(tl.float16)
    return tl.where(s == 0.0, 1.0, s.to(tl.float32))


_ASM_ST_F16 = tl.constexpr("""{
.reg .pred p;
setp.ne.b32 p, $3, 0;
@p st.global.b16 [$1], $2;
mov.u32 $0, 0;
}""")


@triton.jit
def _store_rows_f16(ptrs, x, mask):
    """tl.store(ptrs, x, mask) for a per-row fp16 vector, done by every thread that holds the row (the
    same address from several lanes of a warp is one transaction): a plain store made the compiler
    move the vector through shared memory, behind a barrier, to a layout of one row per thread."""
    if _INTERPRET_C:
        tl.store(ptrs, x, mask=mask)
    else:
        tl.inline_asm_elementwise(_ASM_ST_F16, "=r,l,h,r",
                                  [ptrs.to(tl.int64), x.to(tl.int16, bitcast=True), mask.to(tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)


ROW_CHUNK = tl.constexpr(32)  # channels a thread holds in the row layout (`_load_rows`)
ROW_VEC = tl.constexpr(8)  # of them per load (16 bytes of bf16 / fp16)


@triton.jit
def _row_offsets(N: tl.constexpr):
    """Element offsets within a row of N, as [chunk, 1 (token), piece, vec]: element piece * ROW_CHUNK
    + chunk * ROW_VEC + vec. Triton's coalescing gives the vec axis to one thread (16 bytes) and lanes
    to the other axes in axis order: the 4 chunks of a piece go to 4 lanes (64 contiguous bytes a
    row), the tokens to the rest, and the pieces to registers (sm_90 layout: a thread holds channels
    c..c+7 of each 32, c = 8 x its lane's chunk)."""
    ch = tl.arange(0, ROW_CHUNK // ROW_VEC)[:, None, None, None] * ROW_VEC
    piece = tl.arange(0, N // ROW_CHUNK)[None, None, :, None] * ROW_CHUNK
    return ch + piece + tl.arange(0, ROW_VEC)[None, None, None, :]


@triton.jit
def _row_offsets_lanes(N: tl.constexpr, LANE_BIT: tl.constexpr, VEC: tl.constexpr = ROW_VEC):
    """`_row_offsets` with channel bits LANE_BIT and LANE_BIT + 1 on the 4 lanes of a row (instead of
    3-4) and every other bit in registers, as [lane, 1 (token), hi, mid, vec]: element hi * 4 L +
    lane * L + mid * VEC + vec, L = 2 ** LANE_BIT (VEC elements a vector access: 16 bytes)."""
    L: tl.constexpr = 1 << LANE_BIT
    lane = tl.arange(0, 4)[:, None, None, None, None] * L
    hi = tl.arange(0, N // (4 * L))[None, None, :, None, None] * (4 * L)
    mid = tl.arange(0, L // VEC)[None, None, None, :, None] * VEC
    return lane + hi + mid + tl.arange(0, VEC)[None, None, None, None, :]


@triton.jit
def _load_rows(x_ptr, stride_xt, stride_xh, tok, tmask, h, D: tl.constexpr, D_PAD: tl.constexpr,
               ROWS: tl.constexpr = 0):
    """The program's rows of one side [BT, D_PAD] in the input dtype (padding 0).

    ROWS (`row_layout`: 0 the plain layout, else the lower of the two channel bits a row's 4 lanes
    hold). ROWS = 4 (head dim 128): through the 5-D pointer tensor of `_row_offsets_lanes`, each thread
    holds channel bits 0-3 and 6 (two runs of 16 channels), bits 4-5 on the lanes: an int4 group of 32
    spans 2 lanes, not 4, so each thread reduces and parameterizes 2 groups a side instead of 4 (sm_90
    SASS of int4 group 32: 1,600 -> 1,496 instructions a program, 32 tokens x K and V; H200, 65536
    tokens of Llama-8B, random slots / a prompt's blocks: 1.88 / 2.02 -> 2.14 / 2.16 TB/s of input,
    group 64 2.09 / 2.13 -> 2.14 / 2.16, group 128 and FP8 equal or up to 0.7 % faster;
    results/write_s38). Its codes leave in one 16-byte store a thread (two 8-byte ones had run at
    1.85 TB/s on random slots: half-written sectors). ROWS = 3 (head dim 64; 128 before session 38):
    through the 4-D pointer tensor of `_row_offsets`, so that each thread holds a quarter of a row
    (at 128: 8 consecutive channels in each 32, bits 0-2 and 5-6 in registers, bits 3-4 on 4 lanes), and the permute + reshape back to [BT, D] move no data. Five of the seven
    Hadamard stages, int4's nibble pairing (j, j + 64) and most of each group reduction then run in
    registers (the rest: 2 shuffles deep), and `_store_row_layout` stores the codes from the same
    lanes (sm_90 SASS: int4 47.8 -> 34.9 instructions an element, FP8 32.5 -> 26.6, no shared
    memory; the write is bound by instruction issue. H200, 65536 tokens of Llama-8B: int4 217 -> 182
    us, FP8 159 -> 147 us; with the per-row / per-group division guards then 168 and 134 us;
    results/write_s15). A thread holding 64 channels (bits 0-4 and 6, two lanes a row: 22.6
    instructions an element against 27.6) measured slower, int4 186 against 149 us and FP8 200
    against 123: each warp-wide 16-byte load then touches 32 lines instead of 8
    (results/attention_s20/write)."""
    x_row = x_ptr + tok.to(tl.int64) * stride_xt + h * stride_xh
    if ROWS > 3:  # channel bits ROWS, ROWS + 1 on the lanes
        x5 = tl.load(x_row[None, :, None, None, None] + _row_offsets_lanes(D, ROWS),
                     mask=tmask[None, :, None, None, None], other=0.0)
        return tl.reshape(tl.permute(x5, (1, 2, 0, 3, 4)), (tok.shape[0], D))
    if ROWS:  # D a power of two, a multiple of ROW_CHUNK
        BT: tl.constexpr = tok.shape[0]
        x4 = tl.load(x_row[None, :, None, None] + _row_offsets(D), mask=tmask[None, :, None, None], other=0.0)
        return tl.reshape(tl.permute(x4, (1, 2, 0, 3)), (BT, D))
    d = tl.arange(0, D_PAD)
    return tl.load(x_row[:, None] + d[None, :], mask=tmask[:, None] & (d < D)[None, :], other=0.0)


@triton.jit
def _store_row_layout(row_ptr, x, tmask, N: tl.constexpr, ROWS: tl.constexpr = 3):
    """tl.store of x [BT, N] (N a multiple of ROW_CHUNK) into rows row_ptr [BT] + 0..N-1, through the
    pointer tensor of `_load_rows`' row layout, so that x (computed in that layout) is stored without a
    layout conversion (a plain [BT, N] store moved the codes through shared memory)."""
    BT: tl.constexpr = x.shape[0]
    if ROWS > 3:
        L: tl.constexpr = 1 << ROWS
        VEC: tl.constexpr = min(L, 128 // x.dtype.primitive_bitwidth)  # a run in one 16-byte store if it fits
        x5 = tl.permute(tl.reshape(x, (BT, N // (4 * L), 4, L // VEC, VEC)), (2, 0, 1, 3, 4))
        tl.store(row_ptr[None, :, None, None, None] + _row_offsets_lanes(N, ROWS, VEC), x5,
                 mask=tmask[None, :, None, None, None])
        return
    x4 = tl.permute(tl.reshape(x, (BT, N // ROW_CHUNK, ROW_CHUNK // ROW_VEC, ROW_VEC)), (2, 0, 1, 3))
    tl.store(row_ptr[None, :, None, None] + _row_offsets(N), x4, mask=tmask[None, :, None, None])


@triton.jit
def _write_side(x_in, x_ptr, stride_xt, stride_xh, codes_ptr, scales_ptr, zeros_ptr, static_ptr, mean_ptr,
                cs0, cs1, cs2, ss0, ss1, ss2, blk, off, tok, tmask, h,
                FMT: tl.constexpr, STATIC: tl.constexpr, QMAX: tl.constexpr,
                D: tl.constexpr, D_PAD: tl.constexpr, HALF_PAD: tl.constexpr, G: tl.constexpr,
                NG: tl.constexpr, CENTER: tl.constexpr, ROTATE: tl.constexpr, HB: tl.constexpr,
                NORM: tl.constexpr, BT: tl.constexpr, HW_FP8: tl.constexpr, ROWS: tl.constexpr = 0):
    c_row = blk * cs0 + h * cs1 + off * cs2  # [BT] int64 element offsets
    s_row = blk * ss0 + h * ss1 + off * ss2
    if FMT == K_FMT_INT4 and D == D_PAD:  # a power-of-two head dim: whole rows, groups in place
        d = tl.arange(0, D)
        x = to_f32(x_in)
        if CENTER:
            x = x - tl.load(mean_ptr + h * D + d)[None, :]
        if ROTATE:
            x = _hadamard(x, BT, D, HB, NORM, True)
        # groups: reductions over the last axis of [BT, NG, G] kept as size-1 axes, so the parameters
        # broadcast back in the same layout (no reshape of a broadcast: that went through shared memory)
        xg = tl.reshape(x, (BT, NG, G))
        mx = tl.max(xg, axis=2, keep_dims=True)
        mn = min_nan(xg, 2)  # a NaN makes the group's zero and scale NaN, as the reference's amin does
        s = div_by_const(mx - mn, QMAX).to(tl.float16)
        s = tl.where(s == 0.0, 1.0, s.to(tl.float32))
        m = mn.to(tl.float16)
        g_off = s_row[:, None, None] + tl.arange(0, NG)[None, :, None]
        if ROWS:  # stored from the lanes that hold each group (a plain store staged them in shared memory)
            gmask = tl.broadcast_to(tmask[:, None, None], (BT, NG, 1))
            _store_rows_f16(scales_ptr + g_off, s.to(tl.float16), gmask)
            _store_rows_f16(zeros_ptr + g_off, m, gmask)
        else:
            tl.store(scales_ptr + g_off, s.to(tl.float16), mask=tmask[:, None, None])
            tl.store(zeros_ptr + g_off, m, mask=tmask[:, None, None])
        code = int4_encode(xg, m.to(tl.float32), recip_f16(s))
        # byte j = code j | code (j + D/2) << 4: a sum over the halves' axis (disjoint bits)
        c2 = tl.reshape(code, (BT, 2, D // 2)) << (4 * tl.arange(0, 2))[None, :, None]
        packed = tl.sum(c2, axis=1).to(tl.uint8)
        if ROWS:  # (head dims 64 / 128: D / 2 a multiple of ROW_CHUNK)
            _store_row_layout(codes_ptr + c_row, packed, tmask, D // 2, ROWS)
        else:
            j = tl.arange(0, D // 2)
            tl.store(codes_ptr + c_row[:, None] + j[None, :], packed, mask=tmask[:, None])
    elif FMT == K_FMT_INT4:  # head dims 80, 96 (centered and rotated by the launcher): two padded halves
        HALF: tl.constexpr = D // 2
        j = tl.arange(0, HALF_PAD)
        jm = tmask[:, None] & (j < HALF)[None, :]
        x_row = x_ptr + tok.to(tl.int64) * stride_xt + h * stride_xh  # [BT] pointers
        x_lo = tl.load(x_row[:, None] + j[None, :], mask=jm, other=0.0).to(tl.float32)
        x_hi = tl.load(x_row[:, None] + HALF + j[None, :], mask=jm, other=0.0).to(tl.float32)
        # groups may straddle the halves, and padding: one masked pass per group
        r_lo = tl.zeros_like(x_lo)
        r_hi = tl.zeros_like(x_lo)
        m_lo = tl.zeros_like(x_lo)
        m_hi = tl.zeros_like(x_lo)
        for g in tl.static_range(NG):
            in_lo = ((j >= g * G) & (j < g * G + G) & (j < HALF))[None, :]
            in_hi = ((j + HALF >= g * G) & (j + HALF < g * G + G) & (j < HALF))[None, :]
            mx = tl.maximum(tl.max(tl.where(in_lo, x_lo, -float("inf")), axis=1),
                            tl.max(tl.where(in_hi, x_hi, -float("inf")), axis=1))
            mn = tl.minimum(min_nan(tl.where(in_lo, x_lo, float("inf")), 1, False),
                            min_nan(tl.where(in_hi, x_hi, float("inf")), 1, False), propagate_nan=tl.PropagateNan.ALL)
            s = div_by_const(mx - mn, QMAX).to(tl.float16)
            s = tl.where(s == 0.0, 1.0, s.to(tl.float32))
            m = mn.to(tl.float16)
            tl.store(scales_ptr + s_row + g, s.to(tl.float16), mask=tmask)
            tl.store(zeros_ptr + s_row + g, m, mask=tmask)
            r = recip_f16(s)
            r_lo = tl.where(in_lo, r[:, None], r_lo)
            r_hi = tl.where(in_hi, r[:, None], r_hi)
            m_lo = tl.where(in_lo, m.to(tl.float32)[:, None], m_lo)
            m_hi = tl.where(in_hi, m.to(tl.float32)[:, None], m_hi)
        r_lo = tl.where(jm, r_lo, 1.0)
        r_hi = tl.where(jm, r_hi, 1.0)
        packed = int4_pack(int4_encode(x_lo, m_lo, r_lo), int4_encode(x_hi, m_hi, r_hi))
        tl.store(codes_ptr + c_row[:, None] + j[None, :], packed, mask=jm)
    else:
        d = tl.arange(0, D_PAD)
        dm = tmask[:, None] & (d < D)[None, :]
        x = to_f32(x_in)
        if CENTER:
            x = x - tl.load(mean_ptr + h * D + d, mask=d < D, other=0.0)[None, :]
        if ROTATE:  # padding channels are 0 and fill whole Hadamard blocks of their own
            x = _hadamard(x, BT, D_PAD, HB, NORM, True)
        c_ptrs = codes_ptr + c_row[:, None] + d[None, :]
        if FMT == K_FMT_FLOAT:
            if (codes_ptr.dtype.element_ty == x_in.dtype) and not CENTER and not ROTATE:  # a copy
                tl.store(c_ptrs, x_in, mask=dm)
            elif codes_ptr.dtype.element_ty == tl.bfloat16:
                tl.store(c_ptrs, f32_to_bf16_rne(x), mask=dm)
            else:
                tl.store(c_ptrs, x.to(codes_ptr.dtype.element_ty), mask=dm)
        else:
            if STATIC:
                s = tl.load(static_ptr + h)
                r = tl.math.div_rn(1.0, s)
            else:
                s1 = _absmax_scale(x, QMAX)
                _store_rows_f16(scales_ptr + s_row, s1.to(tl.float16), tmask)
                s = s1[:, None]
                r = recip_f16(s1)[:, None]  # one reciprocal per row; per element: div_by_scale
            # a dynamic scale is the row's own: the quotient needs no per-element NaN guard and is
            # never infinite (`div_by_scale_rows`); a static one needs both
            if FMT == K_FMT_INT8:
                code = int8_encode(x, s, r, not STATIC).to(tl.int8)
            elif STATIC:
                v = div_by_scale(x, s, r)
                code = fp8_encode_hw(v, FMT) if HW_FP8 else fp8_encode(v, FMT)
            else:
                v = div_by_scale_rows(x, s, r)
                code = fp8_encode_hw(v, FMT, True) if HW_FP8 else fp8_encode(v, FMT)
            if ROWS:
                _store_row_layout(codes_ptr + c_row, code, tmask, D, ROWS)
            else:
                tl.store(c_ptrs, code, mask=dm)


# T varies step by step: not specialized (equal to 1 / a multiple of 16 would each compile another
# variant in the middle of a run; it only bounds the token mask)
@triton.jit(do_not_specialize=["T"])
def _cache_write_kernel(
    k_ptr, v_ptr, stride_kt, stride_kh, stride_vt, stride_vh, slot_ptr, T,
    kc_ptr, ks_ptr, kz_ptr, kst_ptr, km_ptr, kcs0, kcs1, kcs2, kss0, kss1, kss2,
    vc_ptr, vs_ptr, vz_ptr, vst_ptr, vm_ptr, vcs0, vcs1, vcs2, vss0, vss1, vss2,
    BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
    K_FMT: tl.constexpr, K_STATIC: tl.constexpr, K_QMAX: tl.constexpr, K_G: tl.constexpr,
    K_NG: tl.constexpr, K_CENTER: tl.constexpr, K_ROTATE: tl.constexpr, K_HB: tl.constexpr,
    K_NORM: tl.constexpr,
    V_FMT: tl.constexpr, V_STATIC: tl.constexpr, V_QMAX: tl.constexpr, V_G: tl.constexpr,
    V_NG: tl.constexpr, V_CENTER: tl.constexpr, V_ROTATE: tl.constexpr, V_HB: tl.constexpr,
    V_NORM: tl.constexpr, K_ROWS: tl.constexpr, V_ROWS: tl.constexpr, HW_FP8: tl.constexpr,
):
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + tok, mask=tok < T, other=-1).to(tl.int64)
    tmask = slot >= 0
    # slot >= 0 here: unsigned division and a mask (BLOCK_SIZE is a power of two)
    slot = tl.where(tmask, slot, 0).to(tl.uint64)
    blk = (slot // BLOCK_SIZE).to(tl.int64)
    off = (slot & (BLOCK_SIZE - 1)).to(tl.int64)
    # both sides' rows are loaded before either is stored (stores could alias later loads for the
    # compiler, which would otherwise wait for K's stores before V's loads go out)
    # (int4 at head dims 80 / 96 loads two padded halves inside `_write_side` instead)
    xk = tl.zeros((BLOCK_T, D_PAD), tl.float32)
    xv = tl.zeros((BLOCK_T, D_PAD), tl.float32)
    if not (K_FMT == K_FMT_INT4 and D != D_PAD):
        xk = _load_rows(k_ptr, stride_kt, stride_kh, tok, tmask, h, D, D_PAD, K_ROWS)
    if not (V_FMT == K_FMT_INT4 and D != D_PAD):
        xv = _load_rows(v_ptr, stride_vt, stride_vh, tok, tmask, h, D, D_PAD, V_ROWS)
    _write_side(xk, k_ptr, stride_kt, stride_kh, kc_ptr, ks_ptr, kz_ptr, kst_ptr, km_ptr,
                kcs0, kcs1, kcs2, kss0, kss1, kss2, blk, off, tok, tmask, h,
                K_FMT, K_STATIC, K_QMAX, D, D_PAD, HALF_PAD, K_G, K_NG, K_CENTER, K_ROTATE, K_HB, K_NORM,
                BLOCK_T, HW_FP8, K_ROWS)
    _write_side(xv, v_ptr, stride_vt, stride_vh, vc_ptr, vs_ptr, vz_ptr, vst_ptr, vm_ptr,
                vcs0, vcs1, vcs2, vss0, vss1, vss2, blk, off, tok, tmask, h,
                V_FMT, V_STATIC, V_QMAX, D, D_PAD, HALF_PAD, V_G, V_NG, V_CENTER, V_ROTATE, V_HB, V_NORM,
                BLOCK_T, HW_FP8, V_ROWS)


def _side_input(x: torch.Tensor, pool: CachePool, mean: torch.Tensor | None) -> tuple[torch.Tensor, list]:
    """(kernel input, [mean tensor, CENTER, ROTATE, HB, NORM]) for one side. Centering and rotation
    run in the kernel, except int4 with a head dim that is not a power of two (see the module doc)."""
    fmt = pool.fmt
    d = fmt.head_dim
    if fmt.kind == "int4" and (fmt.rotate or mean is not None) and d & (d - 1):
        x = storage_input(x, pool, mean)
        mean, rotate = None, False
    else:
        rotate = fmt.rotate
    if mean is not None:
        assert mean.shape == (pool.num_kv_heads, d), (mean.shape, pool.num_kv_heads, d)
        mean = mean.to(device=x.device, dtype=torch.float32).contiguous()
    hb = hadamard_block_size(d)
    x = x if x.stride(-1) == 1 else x.contiguous()
    return x, [mean if mean is not None else x, mean is not None, rotate, hb, hadamard_norm(hb)]


# measured on the H200 (session 15, results/write_s15): from 2048 tokens the row layout is faster (int4
# 14.2 -> 12.3 us, FP8 equal), at 256-512 tokens 2-7 % slower (a longer chain of instructions per thread)
ROW_MIN_TOKENS = 1024


# the lower of the two channel bits on a row's lanes in the row layout at head dim 128 (`_load_rows`);
# KVPACK_WRITE_LANE_BIT=3 gives the layout of sessions 15-37 (for side-by-side probes)
ROW_LANE_BIT_128 = 4


def row_layout(pool: CachePool, rotate: bool) -> int:
    """The `_load_rows` layout of this side in a long write: 0 (plain), or the lower of the channel
    bits on a row's lanes: rotated or int4 sides (Hadamard stages, group reductions) at head dim 128
    take ROW_LANE_BIT_128, at 64 bits 3-4 (timed and tested on the H200; int4's packed rows of 32
    bytes there hold no 4 lanes' runs of 16). int8 without rotation and the float formats keep the
    plain layout (no per-channel work to gain from it). At 256 the compiler moved the rows through
    shared memory (sm_90: 128 LDS / 128 STS a program) and FP8 gained nothing; 32 (half the SASS of the
    plain layout on sm_90) has not run on a GPU: plain at both."""
    d = pool.fmt.head_dim
    if not ((rotate or pool.fmt.kind == "int4") and d in (64, 128)):
        return 0
    if d == 64:
        return 3
    lane_bit = os.environ.get("KVPACK_WRITE_LANE_BIT", str(ROW_LANE_BIT_128))
    if lane_bit not in ("3", "4"):
        raise ValueError(f"KVPACK_WRITE_LANE_BIT={lane_bit!r}: expected 3 (lanes on channel bits 3-4) "
                         f"or 4 (bits 4-5)")
    return int(lane_bit)


def _pool_args(pool: CachePool, mean_arg) -> list:
    codes = pool.codes
    scales = pool.scales if pool.scales is not None else codes
    zeros = pool.zeros if pool.zeros is not None else scales
    static = pool.static_scale if pool.static_scale is not None else codes
    return [codes, scales, zeros, static, mean_arg, *codes.stride()[:3], *scales.stride()[:3]]


def _fmt_constexprs(pool: CachePool) -> list:
    fmt = pool.fmt
    qmax = float(QMAX.get(fmt.kind, 1.0))
    return [fmt.kernel_id, fmt.scale_mode == "static", qmax, fmt.group_size, fmt.head_dim // fmt.group_size]


def hw_fp8_encode(device: torch.device) -> bool:
    """Encode FP8 with the conversion instruction (CUDA sm >= 89; identical codes, ~20 fewer integer
    operations per element), or in software (`fp8_encode`: Ampere, the CPU interpreter), forced by
    KVPACK_SOFT_FP8_ENCODE=1."""
    if device.type != "cuda" or INTERPRET or os.environ.get("KVPACK_SOFT_FP8_ENCODE", "0") == "1":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def plan_write(k: torch.Tensor, v: torch.Tensor, layer_cache: LayerKVCache, slot_mapping: torch.Tensor,
               block_t: int | None = None, num_warps: int = 4,
               rows: bool | None = None) -> tuple[tuple[int, int], list, dict]:
    """(grid, args, options) of the cache-write launch (also used to compile ahead of time).
    `block_t` (tokens per program, a power of two), `num_warps` and `rows` (the row layout where the
    side's format can use it, `row_layout`; default: with >= ROW_MIN_TOKENS tokens) override the
    defaults (for `benchmarks/probe_write.py`)."""
    kp, vp = layer_cache.k, layer_cache.v
    T, H, D = k.shape
    assert v.shape == k.shape and slot_mapping.shape == (T,), (k.shape, v.shape, slot_mapping.shape)
    assert kp.fmt.head_dim == D and vp.fmt.head_dim == D and kp.num_kv_heads == H
    for pool in (kp, vp):
        assert pool.codes.is_contiguous() and (pool.scales is None or pool.scales.is_contiguous())
    k, k_extra = _side_input(k, kp, layer_cache.k_mean)
    v, v_extra = _side_input(v, vp, layer_cache.v_mean)
    slots = slot_mapping if slot_mapping.is_contiguous() else slot_mapping.contiguous()
    d_pad = next_pow2(D)
    half_pad = max(next_pow2(D // 2), 1)
    # the row layout where many tokens make the write issue-bound; a decode step's few tokens keep the
    # plain one, whose per-thread chain of instructions (the latency there) is shorter
    use_rows = T >= ROW_MIN_TOKENS if rows is None else rows
    rows = [row_layout(kp, k_extra[2]) if use_rows else 0, row_layout(vp, v_extra[2]) if use_rows else 0]
    # small batches (decode) take small token tiles: the per-thread instruction chain is the latency.
    # The row layout (head dims 64 and 128): a quarter of a row per thread, so 4 warps fill 32 tokens. The
    # plain layout: 2048 elements a program, but 32 tokens at head dim 64 in a long write. H200, 65536 tokens
    # of SmolLM2's K and V (3 kv heads, head dim 64), random slots / a prompt's blocks, side by side: int4 39.9 /
    # 33.4 -> 36.5 / 33.2 us with 32-token tiles instead of 64 (two quarter rows a thread), FP8 33.1 / 29.9 ->
    # 31.4 / 29.0, int8 30.8 / 29.3 -> 30.4 / 27.3 with 32 instead of 16 (results/write_h64_s39)
    if block_t is None:
        cap = 32 if any(rows) or (d_pad == 64 and T >= ROW_MIN_TOKENS) else min(16, 2048 // d_pad)
        block_t = max(1, min(cap, next_pow2(T)), 8 * num_warps if any(rows) else 1)
    if block_t < 1 or block_t & (block_t - 1) or num_warps < 1 or num_warps & (num_warps - 1):
        raise ValueError(f"block_t={block_t}, num_warps={num_warps}: both must be powers of two")
    if any(rows) and 4 * block_t < 32 * num_warps:
        # more threads than quarter rows: threads repeat each other's rows (H200: 4-7x slower)
        raise ValueError(f"the row layout gives each thread a quarter of a row: block_t={block_t} tokens "
                         f"have {4 * block_t} quarter rows, fewer than num_warps={num_warps} warps' "
                         f"{32 * num_warps} threads; use block_t >= {8 * num_warps} or fewer warps")
    grid = (cdiv(T, block_t), H)
    args = [k, v, k.stride(0), k.stride(1), v.stride(0), v.stride(1), slots, T,
            *_pool_args(kp, k_extra[0]), *_pool_args(vp, v_extra[0]),
            kp.block_size, block_t, D, d_pad, half_pad,
            *_fmt_constexprs(kp), *k_extra[1:], *_fmt_constexprs(vp), *v_extra[1:], *rows, hw_fp8_encode(k.device)]
    # no mul+add -> fma contraction: the reference rounds every product (e.g. x * NORM, then x - m)
    return grid, args, {"num_warps": num_warps, "enable_fp_fusion": False}


def write_kv(k: torch.Tensor, v: torch.Tensor, layer_cache: LayerKVCache, slot_mapping: torch.Tensor) -> None:
    """Quantize and scatter new tokens into the cache (Triton), same contract as the reference.

    k, v:         [T, Hkv, D] float (bf16/fp16/fp32), post-RoPE, as the model computed them
                  (uncentered, unrotated: the kernel does both, see the module doc).
    layer_cache:  LayerKVCache whose pools follow `kvpack.attention.kv_cache.CachePool`.
    slot_mapping: [T] int64 (or int32), block_id * block_size + offset; -1 entries are skipped.
    """
    if k.shape[0] == 0:
        return
    grid, args, options = plan_write(k, v, layer_cache, slot_mapping)
    _cache_write_kernel[grid](*args, **options)
