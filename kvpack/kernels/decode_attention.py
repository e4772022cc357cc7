"""Decode paged attention (one query token per sequence), GQA-aware, split-K (flash-decoding).

Grid (num_seqs, Hkv, num_splits): a program loads each KV tile of its split once for all GROUP =
Hq / Hkv query heads that share it (q tile [GROUP_PAD >= 16, D] for tl.dot) and dequantizes in
registers without conversion instructions (`quant.int8_to_f16` etc.: byte permutes into fp16 bit
patterns): per-token K scales multiply the scores, per-token V scales multiply the probabilities
(normalised by the tile's largest scale), int4 tiles become code * s + m in fp16.
With several splits, a second kernel merges the partial (max, sum, acc) triples.

Two variants of the main kernel (`choose_variant`: argument, env KVPACK_DECODE_VARIANT=dot|fma, else
"dot"): "dot" (`_decode_kernel`, tensor cores, described here) and "fma" (`_fma_decode_kernel`,
quantized K and V only: CUDA-core float32 broadcast-multiply-sums, no shared memory in the loop;
see the comment above it). Both write the same partials for `_merge_kernel`.

Dot operands (input_precision stated): float caches use their own dtype (bf16/fp16; fp32 caches
use fp32 operands with input_precision="ieee"); quantized caches are decoded exactly into fp16
(int8 and fp8 codes are exact in fp16, int4 values are code * s + m in fp16 arithmetic), q is
cast to fp16 and so are the (scaled) probabilities. Accumulation, softmax and the split merge
are float32.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvpack.attention.kv_cache import CachePool, LayerKVCache
from kvpack.config import ConfigError
from kvpack.kernels.quant import (
    INTERPRET, K_FMT_FLOAT, K_FMT_FP8E4M3, K_FMT_INT4, K_FMT_INT8, e4m3_sub_f32, fp8_decode_f16, fp8_decode_f16_bits,
    int4_hi, int4_lo, int4_sub_f32, int4_to_f16, int8_sub_f32, int8_to_f16,
)

_LOG2E = 1.4426950408889634
_INTERPRET_C = tl.constexpr(INTERPRET)


@triton.jit
def _load_raw(codes_ptr, c_row, nmask, FMT: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
              FAST: tl.constexpr):
    """Non-int4 tile [BLOCK_N, D_PAD], unscaled, dot-ready (float: storage dtype; else fp16)."""
    d = tl.arange(0, D_PAD)
    c = tl.load(codes_ptr + c_row[:, None] + d[None, :], mask=nmask[:, None] & (d < D)[None, :], other=0)
    if FMT == K_FMT_FLOAT:
        out = c
    elif FMT == K_FMT_INT8:
        out = int8_to_f16(c) if FAST else c.to(tl.float16)
    elif FAST:
        out = fp8_decode_f16(c, FMT)  # value / factor, exact
    else:
        out = fp8_decode_f16_bits(c, FMT)
    return out


@triton.jit
def _load_int4(codes_ptr, scales_ptr, zeros_ptr, c_row, s_row, nmask, D: tl.constexpr,
               HALF_PAD: tl.constexpr, G: tl.constexpr, ALIGNED: tl.constexpr, BLOCK_N: tl.constexpr,
               FAST: tl.constexpr):
    """int4 tile as two fp16 halves [BLOCK_N, HALF_PAD]: channels j and j + D/2, code * s + m."""
    HALF: tl.constexpr = D // 2
    j = tl.arange(0, HALF_PAD)
    b = tl.load(codes_ptr + c_row[:, None] + j[None, :], mask=nmask[:, None] & (j < HALF)[None, :], other=0)
    if FAST:
        lo, hi = int4_to_f16(b)
    else:
        lo = int4_lo(b).to(tl.float16)
        hi = int4_hi(b).to(tl.float16)
    if ALIGNED:  # D a power of two and groups never straddle the halves: broadcast group params
        NGH: tl.constexpr = HALF // G
        gi = tl.arange(0, NGH)
        sp = scales_ptr + s_row[:, None] + gi[None, :]
        zp = zeros_ptr + s_row[:, None] + gi[None, :]
        m2 = nmask[:, None]
        s_lo = tl.load(sp, mask=m2, other=0.0)
        s_hi = tl.load(sp + NGH, mask=m2, other=0.0)
        z_lo = tl.load(zp, mask=m2, other=0.0)
        z_hi = tl.load(zp + NGH, mask=m2, other=0.0)
        lo = tl.reshape(lo, (BLOCK_N, NGH, G)) * s_lo[:, :, None] + z_lo[:, :, None]
        hi = tl.reshape(hi, (BLOCK_N, NGH, G)) * s_hi[:, :, None] + z_hi[:, :, None]
        lo = tl.reshape(lo, (BLOCK_N, HALF_PAD))
        hi = tl.reshape(hi, (BLOCK_N, HALF_PAD))
    else:  # gather each channel's group parameters
        jm = nmask[:, None] & (j < HALF)[None, :]
        g_lo = (j // G)[None, :]
        g_hi = ((j + HALF) // G)[None, :]
        s_lo = tl.load(scales_ptr + s_row[:, None] + g_lo, mask=jm, other=0.0)
        s_hi = tl.load(scales_ptr + s_row[:, None] + g_hi, mask=jm, other=0.0)
        z_lo = tl.load(zeros_ptr + s_row[:, None] + g_lo, mask=jm, other=0.0)
        z_hi = tl.load(zeros_ptr + s_row[:, None] + g_hi, mask=jm, other=0.0)
        lo = lo * s_lo + z_lo
        hi = hi * s_hi + z_hi
    return lo, hi


@triton.jit
def _dot(a, b, DT: tl.constexpr):
    """a @ b with operands of dtype DT: fp32 operands use input_precision="ieee" (no TF32); the CPU
    interpreter multiplies bf16 as integers, so there bf16 operands are widened to fp32 (exact)."""
    if DT == tl.float32:
        out = tl.dot(a, b, input_precision="ieee")
    elif _INTERPRET_C and DT == tl.bfloat16:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _attend_tile(
    n0, end, h, bt_row, q_a, q_b, qk_scale, m_i, l_i, acc_a, acc_b,
    kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
    vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
    D: tl.constexpr, D_PAD: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, K_FMT: tl.constexpr, K_STATIC: tl.constexpr, K_G: tl.constexpr,
    K_ALIGNED: tl.constexpr, K_DT: tl.constexpr, V_FMT: tl.constexpr, V_STATIC: tl.constexpr,
    V_G: tl.constexpr, V_ALIGNED: tl.constexpr, V_FACTOR: tl.constexpr, V_DT: tl.constexpr,
    FAST: tl.constexpr,
):
    """One BLOCK_N-token tile: scores, online-softmax update, P @ V. Returns (m_i, l_i, acc_a, acc_b)."""
    offs = n0 + tl.arange(0, BLOCK_N)
    nmask = offs < end
    blk = tl.load(bt_row + offs // BLOCK_SIZE, mask=nmask, other=0).to(tl.int64)
    off = offs % BLOCK_SIZE
    # ---- scores [GROUP_PAD, BLOCK_N] ----
    kc_row = blk * k_cs0 + h * k_cs1 + off * k_cs2
    ks_row = blk * k_ss0 + h * k_ss1 + off * k_ss2
    if K_FMT == K_FMT_INT4:
        k_lo, k_hi = _load_int4(kc_ptr, ks_ptr, kz_ptr, kc_row, ks_row, nmask, D, HALF_PAD, K_G,
                                K_ALIGNED, BLOCK_N, FAST)
        s = _dot(q_a, tl.trans(k_lo.to(K_DT)), K_DT) + _dot(q_b, tl.trans(k_hi.to(K_DT)), K_DT)
    else:
        k = _load_raw(kc_ptr, kc_row, nmask, K_FMT, D, D_PAD, FAST)
        s = _dot(q_a, tl.trans(k), K_DT)
        if K_FMT != K_FMT_FLOAT:
            if not K_STATIC:
                s = s * tl.load(ks_ptr + ks_row, mask=nmask, other=0.0).to(tl.float32)[None, :]
    s = tl.where(nmask[None, :], s * qk_scale, -float("inf"))
    # ---- online softmax (base 2) ----
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    m_i = m_new
    # ---- P @ V ----
    vc_row = blk * v_cs0 + h * v_cs1 + off * v_cs2
    vs_row = blk * v_ss0 + h * v_ss1 + off * v_ss2
    if V_FMT == K_FMT_INT4:
        v_lo, v_hi = _load_int4(vc_ptr, vs_ptr, vz_ptr, vc_row, vs_row, nmask, D, HALF_PAD, V_G,
                                V_ALIGNED, BLOCK_N, FAST)
        pd = p.to(V_DT)
        acc_a = acc_a * alpha[:, None] + _dot(pd, v_lo, V_DT)
        acc_b = acc_b * alpha[:, None] + _dot(pd, v_hi, V_DT)
    else:
        v = _load_raw(vc_ptr, vc_row, nmask, V_FMT, D, D_PAD, FAST)
        if V_FMT != K_FMT_FLOAT and not V_STATIC:
            # fold the per-token V scale into p (normalised by the tile's largest scale, so fp16 p
            # keeps its range), and the tile scale into the [GROUP, D] product
            vs = tl.load(vs_ptr + vs_row, mask=nmask, other=0.0).to(tl.float32)
            vmax = tl.max(vs, axis=0)
            vmax = tl.where(vmax > 0, vmax, 1.0)
            pv = _dot((p * (vs / vmax)[None, :]).to(V_DT), v, V_DT) * (vmax * V_FACTOR)
        else:
            pv = _dot(p.to(V_DT), v, V_DT)
        acc_a = acc_a * alpha[:, None] + pv
    return m_i, l_i, acc_a, acc_b


@triton.jit
def _decode_kernel(
    q_ptr, sq_t, sq_h, qsl_ptr, seq_lens_ptr, bt_ptr, s_bt,
    kc_ptr, ks_ptr, kz_ptr, kst_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
    vc_ptr, vs_ptr, vz_ptr, vst_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
    out_ptr, so_t, so_h, po_ptr, pml_ptr, qk_scale, tokens_per_split,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    K_FMT: tl.constexpr, K_STATIC: tl.constexpr, K_G: tl.constexpr, K_ALIGNED: tl.constexpr,
    K_FACTOR: tl.constexpr, K_DT: tl.constexpr,
    V_FMT: tl.constexpr, V_STATIC: tl.constexpr, V_G: tl.constexpr, V_ALIGNED: tl.constexpr,
    V_FACTOR: tl.constexpr, V_DT: tl.constexpr, INTERPRET: tl.constexpr, FAST: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    HALF: tl.constexpr = D // 2
    q_row = tl.load(qsl_ptr + b)
    has_q = tl.load(qsl_ptr + b + 1) > q_row
    seq_len = tl.where(has_q, tl.load(seq_lens_ptr + b), 0)
    start = split * tokens_per_split
    end = tl.minimum(seq_len, start + tokens_per_split)

    g = tl.arange(0, GROUP_PAD)
    gm = g < GROUP
    heads = h * GROUP + g
    q_base = q_ptr + q_row.to(tl.int64) * sq_t + heads[:, None] * sq_h
    if K_FMT == K_FMT_INT4:
        j = tl.arange(0, HALF_PAD)
        qm = gm[:, None] & (j < HALF)[None, :]
        q_a = tl.load(q_base + j[None, :], mask=qm, other=0.0).to(tl.float32).to(K_DT)
        q_b = tl.load(q_base + HALF + j[None, :], mask=qm, other=0.0).to(tl.float32).to(K_DT)
    else:
        d = tl.arange(0, D_PAD)
        q_a = tl.load(q_base + d[None, :], mask=gm[:, None] & (d < D)[None, :], other=0.0).to(tl.float32).to(K_DT)
        q_b = q_a
    if K_STATIC:
        qk_scale = qk_scale * tl.load(kst_ptr + h)
    qk_scale = qk_scale * K_FACTOR

    m_i = tl.full([GROUP_PAD], -float("inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    if V_FMT == K_FMT_INT4:
        acc_a = tl.zeros([GROUP_PAD, HALF_PAD], tl.float32)
        acc_b = tl.zeros([GROUP_PAD, HALF_PAD], tl.float32)
    else:
        acc_a = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
        acc_b = acc_a

    bt_row = bt_ptr + b.to(tl.int64) * s_bt
    if INTERPRET:  # the CPU interpreter cannot run `range` over tensor bounds (numpy >= 2.4)
        n0 = start
        while n0 < end:
            m_i, l_i, acc_a, acc_b = _attend_tile(
                n0, end, h, bt_row, q_a, q_b, qk_scale, m_i, l_i, acc_a, acc_b,
                kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                D, D_PAD, HALF_PAD, BLOCK_SIZE, BLOCK_N,
                K_FMT, K_STATIC, K_G, K_ALIGNED, K_DT, V_FMT, V_STATIC, V_G, V_ALIGNED, V_FACTOR, V_DT, FAST)
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            m_i, l_i, acc_a, acc_b = _attend_tile(
                n0, end, h, bt_row, q_a, q_b, qk_scale, m_i, l_i, acc_a, acc_b,
                kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                D, D_PAD, HALF_PAD, BLOCK_SIZE, BLOCK_N,
                K_FMT, K_STATIC, K_G, K_ALIGNED, K_DT, V_FMT, V_STATIC, V_G, V_ALIGNED, V_FACTOR, V_DT, FAST)
    if V_STATIC:
        v_scale = tl.load(vst_ptr + h) * V_FACTOR
        acc_a = acc_a * v_scale
        acc_b = acc_b * v_scale

    if V_FMT == K_FMT_INT4:
        c = tl.arange(0, HALF_PAD)
        cm = gm[:, None] & (c < HALF)[None, :]
    else:
        c = tl.arange(0, D_PAD)
        cm = gm[:, None] & (c < D)[None, :]
    if not SPLIT:
        o_ptr = out_ptr + q_row.to(tl.int64) * so_t + heads[:, None] * so_h + c[None, :]
        cm = cm & has_q
        l_safe = tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr, (acc_a / l_safe).to(out_ptr.dtype.element_ty), mask=cm)
        if V_FMT == K_FMT_INT4:
            tl.store(o_ptr + HALF, (acc_b / l_safe).to(out_ptr.dtype.element_ty), mask=cm)
    else:
        # partials: po [B, Hq, num_splits, D] fp32, pml [B, Hq, num_splits, 2] fp32
        ph = (b * (GROUP * tl.num_programs(1)) + heads).to(tl.int64) * tl.num_programs(2) + split
        p_ptr = po_ptr + ph[:, None] * D + c[None, :]
        tl.store(p_ptr, acc_a, mask=cm)
        if V_FMT == K_FMT_INT4:
            tl.store(p_ptr + HALF, acc_b, mask=cm)
        tl.store(pml_ptr + ph * 2, m_i, mask=gm)
        tl.store(pml_ptr + ph * 2 + 1, l_i, mask=gm)


@triton.jit
def _merge_kernel(po_ptr, pml_ptr, out_ptr, so_t, so_h, qsl_ptr, HQ, num_splits,
                  SPLITS_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr):
    b = tl.program_id(0)
    hq = tl.program_id(1)
    q_row = tl.load(qsl_ptr + b)
    has_q = tl.load(qsl_ptr + b + 1) > q_row
    sp = tl.arange(0, SPLITS_PAD)
    smask = sp < num_splits
    ph = (b * HQ + hq).to(tl.int64) * num_splits + sp
    m = tl.load(pml_ptr + ph * 2, mask=smask, other=-float("inf"))
    l = tl.load(pml_ptr + ph * 2 + 1, mask=smask, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.where(m > -float("inf"), tl.exp2(m - m_max), 0.0)
    denom = tl.sum(w * l, axis=0)
    denom = tl.where(denom > 0, denom, 1.0)
    d = tl.arange(0, D_PAD)
    acc = tl.load(po_ptr + ph[:, None] * D + d[None, :], mask=smask[:, None] & (d < D)[None, :], other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / denom
    tl.store(out_ptr + q_row.to(tl.int64) * so_t + hq * so_h + d, o.to(out_ptr.dtype.element_ty),
             mask=(d < D) & has_q)


# ---------------------------------------------------------------------------------------------
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
_SM_COUNT: dict[int, int] = {}
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
_rotations: dict[tuple, torch.Tensor] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # CPU interpreter: a few splits, so split-K is exercised
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _rotation(pool: CachePool, device: torch.device) -> torch.Tensor | None:
    if not pool.fmt.rotate:
        return None
    key = (pool.fmt.head_dim, str(device))
    if key not in _rotations:
        _rotations[key] = pool.fmt.rotation(device).to(device=device, dtype=torch.float32)
    return _rotations[key]


def _side_args(pool: CachePool) -> tuple[list, list]:
    """(tensor/stride args, constexpr args) for one pool."""
    fmt = pool.fmt
    codes = pool.codes
    scales = pool.scales if pool.scales is not None else codes
    zeros = pool.zeros if pool.zeros is not None else scales
    static = pool.static_scale if pool.static_scale is not None else codes
    half = fmt.head_dim // 2
    aligned = fmt.kind == "int4" and half & (half - 1) == 0 and half % fmt.group_size == 0
    factor = 256.0 if fmt.kind == "fp8_e4m3" else 1.0
    dot_dt = _TL_DTYPES[codes.dtype] if fmt.kind == "float" else tl.float16
    tensors = [codes, scales, zeros, static, *codes.stride()[:3], *scales.stride()[:3]]
    consts = [fmt.kernel_id, fmt.scale_mode == "static", fmt.group_size, aligned, factor, dot_dt]
    return tensors, consts


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_n: int,
                      device: torch.device) -> int:
    """Splits per sequence when num_seqs * Hkv programs do not fill the GPU: at least ~2 programs
    per SM and at most ~1024 tokens per split (H200 tuning), each split keeping >= 4 tiles."""
    work = max(1, num_seqs * num_kv_heads)  # an empty batch plans (and launches nothing)
    sms = _sm_count(device)
    if work >= sms:
        return 1
    max_splits = max(1, triton.cdiv(max_seq_len, 4 * block_n))
    want = max(triton.cdiv(2 * sms, work), triton.cdiv(max_seq_len, 1024))
    return max(1, min(max_splits, want, 128))


def choose_fma_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_n: int,
                      device: torch.device, programs_per_sm: int = 4) -> int:
    """fma variant (small CTAs, no shared memory): splits so that num_seqs * Hkv * splits reaches
    ~programs_per_sm programs per SM, each split keeping >= 2 tiles (not yet measured)."""
    work = max(1, num_seqs * num_kv_heads)
    want = triton.cdiv(programs_per_sm * _sm_count(device), work)
    max_splits = max(1, triton.cdiv(max_seq_len, 2 * block_n))
    return max(1, min(want, max_splits, 256))


VARIANTS = ("dot", "fma")
# fma defaults, a guess from the compiled sm_90 code (registers, loop instructions per KV byte), not
# a measurement: A = 8 tokens per thread (4 with an int4 side, whose q and accumulator halves need
# twice the registers: A = 8 spills there), 4 warps, num_stages 1 (Triton's pipeliner stages the
# tile through shared memory and re-lays it out: ~1.8x the loop instructions at num_stages 2).
# `benchmarks/bench_attention.py --tune` sweeps the alternatives.
FMA_TOKENS_PER_THREAD = 8
FMA_NUM_WARPS = 4


def choose_variant(k_kind: str, v_kind: str, variant: str | None = None) -> str:
    """"dot" (tensor cores, the default) or "fma" (CUDA cores; both sides quantized only).
    `variant` or else the environment variable KVPACK_DECODE_VARIANT picks; a float side
    always runs "dot"."""
    name = variant or os.environ.get("KVPACK_DECODE_VARIANT", "") or "dot"
    if name not in VARIANTS:
        raise ConfigError(f"decode variant {name!r} (argument or KVPACK_DECODE_VARIANT) is not one of "
                          + ", ".join(VARIANTS))
    if "float" in (k_kind, v_kind):
        return "dot"
    return name


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


@dataclass
class DecodePlan:
    """Everything one decode call launches: kernel args (also used to compile ahead of time)."""

    grid: tuple[int, int, int]
    args: list
    options: dict
    merge_grid: tuple[int, int] | None
    merge_args: list | None
    out: torch.Tensor  # [T, Hq, D], q's dtype (fp32 when V rotates: rotated back afterwards)
    rv: torch.Tensor | None
    kernel: object = None  # the @triton.jit decode kernel (`_decode_kernel` or `_fma_decode_kernel`)
    variant: str = "dot"


def plan_decode(q, layer_cache: LayerKVCache, metadata, scale: float, num_splits: int | None = None,
                block_n: int | None = None, num_warps: int | None = None,
                num_stages: int | None = None, fast_cvt: bool = True, variant: str | None = None,
                maxnreg: int | None = None) -> DecodePlan:
    """Shapes, heuristics and argument lists for `decode_paged_attention` (no launch)."""
    kp, vp = layer_cache.k, layer_cache.v
    T, Hq, D = q.shape
    Hkv, block_size = kp.num_kv_heads, kp.block_size
    assert Hq % Hkv == 0 and kp.fmt.head_dim == D and vp.fmt.head_dim == D, (q.shape, kp.fmt, vp.fmt)
    assert vp.block_size == block_size and vp.num_kv_heads == Hkv
    B = metadata.num_seqs
    group = Hq // Hkv
    dev = q.device
    variant = choose_variant(kp.fmt.kind, vp.fmt.kind, variant)

    rk, rv = _rotation(kp, dev), _rotation(vp, dev)
    q_in = q.float() @ rk if rk is not None else q
    if q_in.stride(-1) != 1:
        q_in = q_in.contiguous()
    out_dtype = torch.float32 if rv is not None else q.dtype
    alloc = torch.empty if T == B else torch.zeros
    out = alloc((T, Hq, D), dtype=out_dtype, device=dev)

    if variant == "fma":
        for p in (kp, vp):  # the kernel takes the code rows and scale entries as contiguous
            assert p.codes.stride(-1) == 1 and (p.scales is None or p.scales.stride(-1) == 1), p.fmt
        num_warps = num_warps or FMA_NUM_WARPS
        num_stages = num_stages or 1
        cpt, nch, a, r = fma_tile(D, block_n, num_warps, "int4" in (kp.fmt.kind, vp.fmt.kind))
        block_n = a * r
        if num_splits is None:
            num_splits = choose_fma_splits(B, Hkv, metadata.max_seq_len, block_n, dev)
    else:
        int4 = "int4" in (kp.fmt.kind, vp.fmt.kind)
        if block_n is None:  # measured on an H200 (benchmarks/bench_attention.py --tune)
            block_n = (256 if int4 else 128) if D <= 128 else 64
        block_n = max(block_n, block_size)
        num_warps = num_warps or 4
        num_stages = num_stages or 2
        if num_splits is None:
            num_splits = choose_num_splits(B, Hkv, metadata.max_seq_len, block_n, dev)
    max_len = max(metadata.max_seq_len, 1)
    tokens_per_split = triton.cdiv(triton.cdiv(max_len, num_splits), block_n) * block_n
    num_splits = max(1, triton.cdiv(max_len, tokens_per_split))

    k_t, k_c = _side_args(kp)
    v_t, v_c = _side_args(vp)
    if num_splits > 1:
        po = torch.empty((B, Hq, num_splits, D), dtype=torch.float32, device=dev)
        pml = torch.empty((B, Hq, num_splits, 2), dtype=torch.float32, device=dev)
    else:
        po = pml = out
    d_pad = triton.next_power_of_2(D)
    bt, qsl = metadata.block_tables, metadata.query_start_loc
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg:  # ptxas register cap (tuning: more CTAs per SM against spills)
        options["maxnreg"] = maxnreg
    args = [q_in, q_in.stride(0), q_in.stride(1), qsl, metadata.seq_lens, bt, bt.stride(0)]
    if variant == "fma":  # the codes' token stride is compile-time (immediate load offsets)
        kernel = _fma_decode_kernel
        args += [*k_t[:6], *k_t[7:], *v_t[:6], *v_t[7:], out, out.stride(0), out.stride(1), po, pml,
                 float(scale) * _LOG2E, tokens_per_split, k_t[6], v_t[6]]
        # per side: FMT, STATIC, G, FACTOR (the dot kernel's ALIGNED and DT are not used)
        args += [group, triton.next_power_of_2(group), D, nch, cpt, nch * cpt != D, a, r, block_size,
                 num_splits > 1, *k_c[:3], *_fma_factors(kp.fmt.kind), *v_c[:3], *_fma_factors(vp.fmt.kind),
                 INTERPRET, fast_cvt, num_stages]
    else:
        kernel = _decode_kernel
        args += [*k_t, *v_t, out, out.stride(0), out.stride(1), po, pml, float(scale) * _LOG2E, tokens_per_split]
        half_pad = triton.next_power_of_2(max(D // 2, 1))
        group_pad = max(16, triton.next_power_of_2(group))
        args += [group, group_pad, D, d_pad, half_pad, block_size, block_n, num_splits > 1,
                 *k_c, *v_c, INTERPRET, fast_cvt]
    merge_grid = merge_args = None
    if num_splits > 1:
        merge_grid = (B, Hq)
        merge_args = [po, pml, out, out.stride(0), out.stride(1), qsl, Hq, num_splits,
                      max(2, triton.next_power_of_2(num_splits)), D, d_pad]
    return DecodePlan((B, Hkv, num_splits), args, options, merge_grid, merge_args, out, rv, kernel, variant)


def decode_paged_attention(
    q: torch.Tensor,
    layer_cache: LayerKVCache,
    metadata,
    scale: float,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    fast_cvt: bool = True,
    variant: str | None = None,
    maxnreg: int | None = None,
) -> torch.Tensor:
    """Paged attention for a pure-decode batch (each sequence has 0 or 1 query token).

    q: [T, Hq, D] bf16/fp16/fp32 (last dim contiguous); layer_cache: K/V `CachePool`s
    (codes [num_blocks, Hkv, block_size, code_width], scales/zeros [.., num_groups] fp16);
    metadata: `AttentionMetadata` (query_start_loc [B+1], seq_lens [B], block_tables [B, M] int32).
    Returns [T, Hq, D] in q's dtype. num_splits / block_n / num_warps / num_stages override the
    heuristics (tests and tuning); fast_cvt=False decodes codes with plain Triton conversions
    instead of the PTX byte permutes (for measuring). variant: "dot" | "fma" (see `choose_variant`;
    default: KVPACK_DECODE_VARIANT, else "dot"); for "fma", block_n is rounded down to a multiple
    of the tile's rows (`fma_tile`). maxnreg caps ptxas' registers per thread (tuning).
    """
    plan = plan_decode(q, layer_cache, metadata, scale, num_splits, block_n, num_warps, num_stages, fast_cvt,
                       variant, maxnreg)
    out = plan.out
    if metadata.num_seqs == 0 or q.shape[0] == 0:
        return out.to(q.dtype)
    plan.kernel[plan.grid](*plan.args, **plan.options)
    if plan.merge_grid is not None:
        _merge_kernel[plan.merge_grid](*plan.merge_args)
    if plan.rv is not None:
        out = (out @ plan.rv).to(q.dtype)
    return out
