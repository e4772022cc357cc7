"""CUDA-core ("fma") decode variant: `_fma_decode_kernel` and its plan helpers (`fma_tile`,
`choose_fma_splits`, `_fma_factors`). Launched by `decode_attention.plan_decode` for quantized K
and V; writes the same partials as `decode_attention._decode_kernel` for `_merge_kernel`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpack.kernels.decode_plan import _sm_count
from kvpack.kernels.quant import (
    K_FMT_FLOAT, K_FMT_FP8E4M3, K_FMT_INT4, K_FMT_INT8, e4m3_sub_f32, fp8_decode_f16, fp8_decode_f16_bits,
    int4_sub_f32, int8_sub_f32,
)

# CUDA-core variant ("fma"): no tl.dot, no shared memory in the loop. A tile holds A * R tokens
# as codes [1, NCH, R, A, CW]: token r * A + a (R rows over lanes and warps, each thread's A
# tokens consecutive, in one cache block), channel chunk c (NCH chunks over lanes) of CW
# contiguous code elements (8-bit codes: 16 bytes = one vector load; int4: 8 bytes = 16 channels).
# The dim order is the layout: Triton 3.6 gives the contiguous dim's vector to a thread, then lanes
# and warps to the other dims in index order, so NCH and R spread over lanes and warps and A stays
# in registers (checked in the TTGIR). Every tensor of the loop has that 5-d shape (per-token
# tensors carry NCH too, so each load's pointer tensor gets the same layout and nothing is
# converted; the scale token stride stays a runtime value, since a specialized stride of 1 would
# make the scale loads contiguous along A and change their layout): scores [GP, NCH, R, A, 1] are
# summed over a chunk in registers and over NCH by shuffles; each row r keeps its own online
# softmax state (m, l [GP, NCH, R, 1, 1]) and accumulator ([GP, NCH, R, 1, CW]), so p @ V sums
# over a thread's own A tokens; the R rows are merged once, after the loop.
# Numerics: all products and sums are float32. Codes become float32 operands without arithmetic
# (quant.int8_sub_f32 etc.: subnormal encodings, int8 biased by +128, e4m3 scaled by 2**-120);
# the other operand (q, or p times the V scale) is multiplied by PRE = 2**64 so products are
# normal floats, and UNDO = 2**(149 or 120) / PRE is applied once per score / output. The int8
# bias and the int4 zero-points are folded out of the sums:
#   sum_c q_c (s * code_c + m) = s * sum_c q_c code_c + m * sum_c q_c
# per (token, group), with the sums of q per chunk computed once per program (likewise for p @ V,
# which accumulates sum_n p_n m_n apart).


@triton.jit
def _fma_codes(codes_ptr, row, tmask, WIDTH: tl.constexpr, NCH: tl.constexpr, R: tl.constexpr, A: tl.constexpr,
               CW: tl.constexpr, MASK_W: tl.constexpr, MASK_N: tl.constexpr):
    """Raw codes [1, NCH, R, A, CW]: element c * CW + e of each token (row: [1, NCH, R, A, 1] int64)."""
    j = tl.arange(0, NCH)[None, :, None, None, None] * CW + tl.arange(0, CW)[None, None, None, None, :]
    if MASK_W and MASK_N:
        x = tl.load(codes_ptr + row + j, mask=tmask & (j < WIDTH), other=0)
    elif MASK_W:
        x = tl.load(codes_ptr + row + j, mask=tl.broadcast_to(j < WIDTH, (1, NCH, R, A, CW)), other=0)
    elif MASK_N:
        x = tl.load(codes_ptr + row + j, mask=tmask, other=0)
    else:
        x = tl.load(codes_ptr + row + j)
    return x


@triton.jit
def _fma_values(x, FMT: tl.constexpr, ASM: tl.constexpr):
    """8-bit codes -> float32 operands: int8 (code + 128) * 2**-149, e4m3 value * 2**-120, e5m2 value."""
    tl.static_assert(FMT != K_FMT_FLOAT and FMT != K_FMT_INT4)
    if FMT == K_FMT_INT8:
        v = int8_sub_f32(x, ASM)
    elif FMT == K_FMT_FP8E4M3:
        v = e4m3_sub_f32(x, ASM)
    elif ASM:
        v = fp8_decode_f16(x, FMT).to(tl.float32)
    else:
        v = fp8_decode_f16_bits(x, FMT).to(tl.float32)
    return v


@triton.jit
def _fma_scale(ptr, mask, MASKED: tl.constexpr):
    """fp16 scales -> float32 (0 where masked)."""
    if MASKED:
        x = tl.load(ptr, mask=mask, other=0.0)
    else:
        x = tl.load(ptr)
    return x.to(tl.float32)


@triton.jit
def _fma_int4(codes_ptr, scales_ptr, zeros_ptr, row, srow, tmask, HALF: tl.constexpr, NCH: tl.constexpr,
              R: tl.constexpr, A: tl.constexpr, CW: tl.constexpr, G: tl.constexpr, MASK_W: tl.constexpr,
              MASK_N: tl.constexpr, ASM: tl.constexpr):
    """int4 tile: lo, hi [1, NCH, R, A, CW] float32 code * 2**-149 (channels c*CW+e and HALF+c*CW+e)
    and each chunk's group scale and zero-point s_lo, m_lo, s_hi, m_hi [1, NCH, R, A, 1] float32."""
    lo, hi = int4_sub_f32(_fma_codes(codes_ptr, row, tmask, HALF, NCH, R, A, CW, MASK_W, MASK_N), ASM)
    c = tl.arange(0, NCH)[None, :, None, None, None]
    g_lo = (c * CW) // G
    g_hi = (HALF + c * CW) // G
    if MASK_W:
        cm = tl.broadcast_to(c * CW < HALF, srow.shape)
        if MASK_N:
            cm = cm & tmask
    else:
        cm = tmask
    s_lo = _fma_scale(scales_ptr + srow + g_lo, cm, MASK_W or MASK_N)
    m_lo = _fma_scale(zeros_ptr + srow + g_lo, cm, MASK_W or MASK_N)
    s_hi = _fma_scale(scales_ptr + srow + g_hi, cm, MASK_W or MASK_N)
    m_hi = _fma_scale(zeros_ptr + srow + g_hi, cm, MASK_W or MASK_N)
    return lo, hi, s_lo, m_lo, s_hi, m_hi


@triton.jit
def _fma_tile(
    n0, end, h, bt_row, q_a, q_b, qs_a, qs_b, m_i, l_i, acc_a, acc_b, z_a, z_b,
    kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_ss0, k_ss1, k_ss2,
    vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_ss0, v_ss1, v_ss2, K_CS2: tl.constexpr, V_CS2: tl.constexpr,
    D: tl.constexpr, NCH: tl.constexpr, CPT: tl.constexpr, MASK_W: tl.constexpr, A: tl.constexpr,
    R: tl.constexpr, BLOCK_SIZE: tl.constexpr, K_FMT: tl.constexpr, K_STATIC: tl.constexpr,
    K_G: tl.constexpr, K_UNDO: tl.constexpr, V_FMT: tl.constexpr, V_STATIC: tl.constexpr,
    V_G: tl.constexpr, V_PRE: tl.constexpr, ASM: tl.constexpr, MASK_N: tl.constexpr,
):
    """One tile of A * R tokens (MASK_N: some may lie at or past `end`). Returns the updated
    (m_i, l_i, acc_a, acc_b, z_a, z_b)."""
    HALF: tl.constexpr = D // 2
    CB: tl.constexpr = CPT // 2
    row0 = tl.broadcast_to(n0 + tl.arange(0, R)[None, None, :, None, None] * A, (1, NCH, R, 1, 1))
    a = tl.arange(0, A)[None, None, None, :, None]
    offs = row0 + a  # [1, NCH, R, A, 1]
    tmask = offs < end
    if BLOCK_SIZE % A == 0:  # a row's A tokens lie in one cache block: one block-table entry per row
        if MASK_N:
            blk = tl.load(bt_row + row0 // BLOCK_SIZE, mask=row0 < end, other=0)
        else:
            blk = tl.load(bt_row + row0 // BLOCK_SIZE)
        off = row0 % BLOCK_SIZE  # per row; the token adds a * stride (an immediate offset)
    else:
        blk = tl.load(bt_row + offs // BLOCK_SIZE, mask=tmask, other=0)
        off = offs % BLOCK_SIZE - a
    blk = blk.to(tl.int64)
    # ---- scores [GP, NCH, R, A, 1], base 2 (q carries scale * log2(e), the static scale, PRE) ----
    k_row = blk * k_cs0 + h * k_cs1 + off * K_CS2 + a * K_CS2
    ks_row = blk * k_ss0 + h * k_ss1 + (off + a) * k_ss2
    if K_FMT == K_FMT_INT4:
        lo, hi, s_lo, m_lo, s_hi, m_hi = _fma_int4(kc_ptr, ks_ptr, kz_ptr, k_row, ks_row, tmask, HALF, NCH, R, A,
                                                   CB, K_G, MASK_W, MASK_N, ASM)
        part = s_lo * tl.sum(q_a * lo, axis=4, keep_dims=True) + m_lo * qs_a
        part += s_hi * tl.sum(q_b * hi, axis=4, keep_dims=True) + m_hi * qs_b
        s = tl.sum(part, axis=1, keep_dims=True) * K_UNDO
    else:
        k = _fma_values(_fma_codes(kc_ptr, k_row, tmask, D, NCH, R, A, CPT, MASK_W, MASK_N), K_FMT, ASM)
        s = tl.sum(tl.sum(q_a * k, axis=4, keep_dims=True), axis=1, keep_dims=True)
        if K_FMT == K_FMT_INT8:
            s = s - qs_a  # the +128 bias: 128 * sum(q) (qs_a here: [GP, 1, 1, 1, 1], in units of s)
        if not K_STATIC:
            s = s * (_fma_scale(ks_ptr + ks_row, tmask, MASK_N) * K_UNDO)
        elif K_UNDO != 1.0:
            s = s * K_UNDO
    if MASK_N:
        s = tl.where(tmask, s, -float("inf"))
    # ---- online softmax per row (a row without tokens so far keeps m = -inf, p = 0) ----
    m_new = tl.maximum(m_i, tl.max(s, axis=3, keep_dims=True))  # [GP, NCH, R, 1, 1]
    m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use)  # [GP, NCH, R, A, 1]
    l_i = l_i * alpha + tl.sum(p, axis=3, keep_dims=True)
    # ---- p @ V over the thread's A tokens (p times the V scale times PRE) ----
    v_row = blk * v_cs0 + h * v_cs1 + off * V_CS2 + a * V_CS2
    vs_row = blk * v_ss0 + h * v_ss1 + (off + a) * v_ss2
    if V_FMT == K_FMT_INT4:
        lo, hi, s_lo, m_lo, s_hi, m_hi = _fma_int4(vc_ptr, vs_ptr, vz_ptr, v_row, vs_row, tmask, HALF, NCH, R, A,
                                                   CB, V_G, MASK_W, MASK_N, ASM)
        acc_a = acc_a * alpha + tl.sum((p * (s_lo * V_PRE)) * lo, axis=3, keep_dims=True)
        acc_b = acc_b * alpha + tl.sum((p * (s_hi * V_PRE)) * hi, axis=3, keep_dims=True)
        z_a = z_a * alpha + tl.sum(p * m_lo, axis=3, keep_dims=True)
        z_b = z_b * alpha + tl.sum(p * m_hi, axis=3, keep_dims=True)
    else:
        v = _fma_values(_fma_codes(vc_ptr, v_row, tmask, D, NCH, R, A, CPT, MASK_W, MASK_N), V_FMT, ASM)
        if not V_STATIC:
            p = p * (_fma_scale(vs_ptr + vs_row, tmask, MASK_N) * V_PRE)
        elif V_PRE != 1.0:
            p = p * V_PRE
        acc_a = acc_a * alpha + tl.sum(p * v, axis=3, keep_dims=True)
        if V_FMT == K_FMT_INT8:
            z_a = z_a * alpha + tl.sum(p, axis=3, keep_dims=True)  # for the +128 bias
    return m_new, l_i, acc_a, acc_b, z_a, z_b


@triton.jit
def _fma_q(q_base, g_ok, first, WIDTH: tl.constexpr, NCH: tl.constexpr, CW: tl.constexpr, scale):
    """q channels first + c * CW + e as [GP, NCH, 1, 1, CW] float32 times scale, and its chunk sums."""
    j = tl.arange(0, NCH)[None, :, None, None, None] * CW + tl.arange(0, CW)[None, None, None, None, :]
    q = tl.load(q_base + first + j, mask=g_ok & (j < WIDTH), other=0.0).to(tl.float32) * scale
    return q, tl.sum(q, axis=4, keep_dims=True)


@triton.jit
def _fma_store(o, first, base, mask, WIDTH: tl.constexpr, NCH: tl.constexpr, CW: tl.constexpr):
    """o [GP, NCH, 1, 1, CW] to channels first + c * CW + e of base [GP, 1, 1, 1, 1] (mask: [GP, ...])."""
    j = tl.arange(0, NCH)[None, :, None, None, None] * CW + tl.arange(0, CW)[None, None, None, None, :]
    tl.store(base + first + j, o.to(base.dtype.element_ty), mask=mask & (j < WIDTH))


@triton.jit(do_not_specialize=["k_ss2", "v_ss2"])  # a scale stride of 1 must not change the layout
def _fma_decode_kernel(
    q_ptr, sq_t, sq_h, qsl_ptr, seq_lens_ptr, bt_ptr, s_bt,
    kc_ptr, ks_ptr, kz_ptr, kst_ptr, k_cs0, k_cs1, k_ss0, k_ss1, k_ss2,
    vc_ptr, vs_ptr, vz_ptr, vst_ptr, v_cs0, v_cs1, v_ss0, v_ss1, v_ss2,
    out_ptr, so_t, so_h, po_ptr, pml_ptr, qk_scale, tokens_per_split,
    K_CS2: tl.constexpr, V_CS2: tl.constexpr,
    GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, NCH: tl.constexpr, CPT: tl.constexpr,
    MASK_W: tl.constexpr, A: tl.constexpr, R: tl.constexpr, BLOCK_SIZE: tl.constexpr, SPLIT: tl.constexpr,
    K_FMT: tl.constexpr, K_STATIC: tl.constexpr, K_G: tl.constexpr, K_PRE: tl.constexpr, K_UNDO: tl.constexpr,
    V_FMT: tl.constexpr, V_STATIC: tl.constexpr, V_G: tl.constexpr, V_PRE: tl.constexpr, V_UNDO: tl.constexpr,
    INTERPRET: tl.constexpr, ASM: tl.constexpr, STAGES: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    HALF: tl.constexpr = D // 2
    CB: tl.constexpr = CPT // 2
    q_row = tl.load(qsl_ptr + b)
    has_q = tl.load(qsl_ptr + b + 1) > q_row
    seq_len = tl.where(has_q, tl.load(seq_lens_ptr + b), 0)
    start = split * tokens_per_split
    end = tl.minimum(seq_len, start + tokens_per_split)

    g = tl.arange(0, GP)[:, None, None, None, None]
    g_ok = g < GROUP
    heads = h * GROUP + g  # [GP, 1, 1, 1, 1]
    q_base = q_ptr + q_row.to(tl.int64) * sq_t + heads * sq_h
    if K_STATIC:
        qk_scale = qk_scale * tl.load(kst_ptr + h)
    if K_FMT == K_FMT_INT4:  # q halves; chunk sums of q in units of the code sums (for the zero-points)
        q_a, qs_a = _fma_q(q_base, g_ok, 0, HALF, NCH, CB, qk_scale)
        q_b, qs_b = _fma_q(q_base, g_ok, HALF, HALF, NCH, CB, qk_scale)
        qs_a = qs_a * (1.0 / K_UNDO)
        qs_b = qs_b * (1.0 / K_UNDO)
        q_b = q_b * K_PRE
    else:  # qs_a: the int8 bias term 128 * sum(q) in units of the code sums
        q_a, qs_a = _fma_q(q_base, g_ok, 0, D, NCH, CPT, qk_scale)
        qs_a = tl.sum(qs_a, axis=1, keep_dims=True) * (128.0 / K_UNDO)
        q_b = q_a
        qs_b = qs_a
    q_a = q_a * K_PRE

    m_i = tl.full([GP, NCH, R, 1, 1], -float("inf"), tl.float32)
    l_i = tl.zeros([GP, NCH, R, 1, 1], tl.float32)
    if V_FMT == K_FMT_INT4:
        acc_a = tl.zeros([GP, NCH, R, 1, CB], tl.float32)
        acc_b = tl.zeros([GP, NCH, R, 1, CB], tl.float32)
        z_a = tl.zeros([GP, NCH, R, 1, 1], tl.float32)
        z_b = tl.zeros([GP, NCH, R, 1, 1], tl.float32)
    else:
        acc_a = tl.zeros([GP, NCH, R, 1, CPT], tl.float32)
        acc_b = tl.zeros([GP, 1, 1, 1, 1], tl.float32)  # unused
        z_a = tl.zeros([GP, NCH, R, 1, 1], tl.float32)  # int8: sum of p * scale * PRE (the bias)
        z_b = acc_b

    bt_row = bt_ptr + b.to(tl.int64) * s_bt
    full_end = start + tl.maximum(end - start, 0) // (A * R) * (A * R)  # full tiles: no token masks
    if INTERPRET:  # the CPU interpreter cannot run `range` over tensor bounds (numpy >= 2.4)
        n0 = start
        while n0 < full_end:
            m_i, l_i, acc_a, acc_b, z_a, z_b = _fma_tile(
                n0, end, h, bt_row, q_a, q_b, qs_a, qs_b, m_i, l_i, acc_a, acc_b, z_a, z_b,
                kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_ss0, k_ss1, k_ss2,
                vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_ss0, v_ss1, v_ss2, K_CS2, V_CS2, D, NCH, CPT, MASK_W, A, R,
                BLOCK_SIZE, K_FMT, K_STATIC, K_G, K_UNDO, V_FMT, V_STATIC, V_G, V_PRE, ASM, False)
            n0 += A * R
    else:
        for n0 in tl.range(start, full_end, A * R, num_stages=STAGES):
            m_i, l_i, acc_a, acc_b, z_a, z_b = _fma_tile(
                n0, end, h, bt_row, q_a, q_b, qs_a, qs_b, m_i, l_i, acc_a, acc_b, z_a, z_b,
                kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_ss0, k_ss1, k_ss2,
                vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_ss0, v_ss1, v_ss2, K_CS2, V_CS2, D, NCH, CPT, MASK_W, A, R,
                BLOCK_SIZE, K_FMT, K_STATIC, K_G, K_UNDO, V_FMT, V_STATIC, V_G, V_PRE, ASM, False)
    if full_end < end:  # the last, partial tile
        m_i, l_i, acc_a, acc_b, z_a, z_b = _fma_tile(
            full_end, end, h, bt_row, q_a, q_b, qs_a, qs_b, m_i, l_i, acc_a, acc_b, z_a, z_b,
            kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_ss0, k_ss1, k_ss2,
            vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_ss0, v_ss1, v_ss2, K_CS2, V_CS2, D, NCH, CPT, MASK_W, A, R,
            BLOCK_SIZE, K_FMT, K_STATIC, K_G, K_UNDO, V_FMT, V_STATIC, V_G, V_PRE, ASM, True)

    # ---- merge the R rows: weights 2^(m_r - m); rows without tokens weigh 0 ----
    m = tl.max(m_i, axis=2, keep_dims=True)  # [GP, NCH, 1, 1, 1], equal over NCH
    w = tl.exp2(m_i - tl.where(m == -float("inf"), 0.0, m))
    l = tl.sum(w * l_i, axis=2, keep_dims=True)
    v_scale = V_UNDO
    if V_STATIC:
        v_scale = tl.load(vst_ptr + h) * V_UNDO
    if V_FMT == K_FMT_INT4:  # code sums * UNDO + zero-point sums
        o_a = tl.sum(w * acc_a, axis=2, keep_dims=True) * V_UNDO + tl.sum(w * z_a, axis=2, keep_dims=True)
        o_b = tl.sum(w * acc_b, axis=2, keep_dims=True) * V_UNDO + tl.sum(w * z_b, axis=2, keep_dims=True)
    else:
        o_a = tl.sum(w * acc_a, axis=2, keep_dims=True)  # [GP, NCH, 1, 1, CPT]
        if V_FMT == K_FMT_INT8:  # remove the +128 bias: 128 * sum(p * scale)
            o_a = o_a - tl.sum(w * z_a, axis=2, keep_dims=True) * (128.0 / (V_PRE * V_UNDO))
        o_a = o_a * v_scale
        o_b = o_a
    if not SPLIT:
        o_ptr = out_ptr + q_row.to(tl.int64) * so_t + heads * so_h
        l_safe = tl.where(l > 0, l, 1.0)
        if V_FMT == K_FMT_INT4:
            _fma_store(o_a / l_safe, 0, o_ptr, g_ok & has_q, HALF, NCH, CB)
            _fma_store(o_b / l_safe, HALF, o_ptr, g_ok & has_q, HALF, NCH, CB)
        else:
            _fma_store(o_a / l_safe, 0, o_ptr, g_ok & has_q, D, NCH, CPT)
    else:
        # partials: po [B, Hq, num_splits, D] fp32, pml [B, Hq, num_splits, 2] fp32
        ph = (b * (GROUP * tl.num_programs(1)) + heads).to(tl.int64) * tl.num_programs(2) + split
        p_ptr = po_ptr + ph * D
        if V_FMT == K_FMT_INT4:
            _fma_store(o_a, 0, p_ptr, g_ok, HALF, NCH, CB)
            _fma_store(o_b, HALF, p_ptr, g_ok, HALF, NCH, CB)
        else:
            _fma_store(o_a, 0, p_ptr, g_ok, D, NCH, CPT)
        first = g_ok & (tl.arange(0, NCH)[None, :, None, None, None] == 0)
        tl.store(pml_ptr + ph * 2 + tl.zeros_like(m).to(tl.int64), m, mask=first)
        tl.store(pml_ptr + ph * 2 + 1 + tl.zeros_like(l).to(tl.int64), l, mask=first)


# ---------------------------------------------------------------------------------------------
# fma defaults, a guess from the compiled sm_90 code (registers, loop instructions per KV byte), not
# a measurement: A = 8 tokens per thread (4 with an int4 side, whose q and accumulator halves need
# twice the registers: A = 8 spills there), 4 warps, num_stages 1 (Triton's pipeliner stages the
# tile through shared memory and re-lays it out: ~1.8x the loop instructions at num_stages 2).
# `benchmarks/bench_attention.py --tune` sweeps the alternatives.
FMA_TOKENS_PER_THREAD = 8
FMA_NUM_WARPS = 4


def choose_fma_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_n: int,
                      device: torch.device, programs_per_sm: int = 4) -> int:
    """fma variant (small CTAs, no shared memory): splits so that num_seqs * Hkv * splits reaches
    ~programs_per_sm programs per SM, each split keeping >= 2 tiles (not yet measured)."""
    work = max(1, num_seqs * num_kv_heads)
    want = triton.cdiv(programs_per_sm * _sm_count(device), work)
    max_splits = max(1, triton.cdiv(max_seq_len, 2 * block_n))
    return max(1, min(want, max_splits, 256))


def fma_tile(head_dim: int, block_n: int | None, num_warps: int, int4: bool) -> tuple[int, int, int, int]:
    """(CPT, NCH, A, R) of the fma tile: CPT channels per chunk (<= 16: one 16-byte load of 8-bit
    codes, 8 bytes of int4), NCH chunks (a power of two, over lanes), R token rows (the other
    lanes times the warps), A tokens per thread: block_n // R (>= 1), by default
    FMA_TOKENS_PER_THREAD (half with an int4 side). A tile holds A * R tokens."""
    cpt = min(16, head_dim & -head_dim)
    nch = triton.next_power_of_2(head_dim // cpt)
    r = max(1, 32 // min(nch, 32)) * num_warps
    a = FMA_TOKENS_PER_THREAD // (2 if int4 else 1) if block_n is None else block_n // r
    return cpt, nch, max(1, a), r


def _fma_factors(kind: str) -> tuple[float, float]:
    """(PRE, UNDO) of a side in the fma kernel: code operands are value * 2**-149 (int8, int4) or
    * 2**-120 (e4m3) subnormal encodings, the other operand is scaled by PRE = 2**64."""
    code_exp = {"int8": 149, "int4": 149, "fp8_e4m3": 120}.get(kind)
    return (1.0, 1.0) if code_exp is None else (2.0 ** 64, 2.0 ** (code_exp - 64))
