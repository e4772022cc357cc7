"""Paged attention for mixed prefill/decode batches (any query length), every KV format, in Triton.

Flash-attention-2 over the paged cache. One program owns a query tile of one sequence and one kv
head; the `GROUP = Hq // Hkv` query heads sharing that kv head are folded into the M dimension
(row r = token r // GROUP, head r % GROUP), so each K/V tile is read and dequantized once for all
of them. Programs find their sequence in a tile map built on the device (`build_tile_map`: no host
sync, a grid that depends only on T and B) and walk KV tiles of BLOCK_N tokens through the block
table up to the causal limit of their tile: first the tiles every row sees whole (no masks), then
the diagonal ones (masked).

Head dims that are not powers of two (80, 96): 16-bit and 8-bit sides run in two parts, channels [0, D_PAD / 2)
and the rest padded to D_B (80 = 64 + 16, 96 = 64 + 32: two dots for the scores, two accumulators;
`prefill_launch.two_part_head`); int4 sides read in the kernel and int8 MMAs pad the head to D_PAD with masks.

Numerics: accumulation is fp32 and the online softmax runs in fp32 with exp2. Dot operands:
a 16-bit float cache side uses its own dtype (bf16 cache: bf16 q and p); a quantized side uses
fp16 operands (fp32 when q is fp32, with input_precision="ieee"): codes become exact fp16 with
integer ops (`kvpack.kernels.quant`: byte permutes for int8/int4, bit moves for fp8) and
per-token scales (int4: per-group scale and zero) apply in packed fp16 with one rounding, so no
per-element float conversion (a quarter-rate instruction on sm_80/90) is left in the loop. A
bf16 q meeting an fp16 K side is converted once per program after an exact power-of-two
rescale (|q| < 2^15; the factor joins the softmax scale). Dequantized K/V values must lie within
fp16's range (|x| <= 65504; beyond it a tile overflows to inf: such models need a 16-bit cache).
Static per-head scales and the fp8 factor are constants, applied to the softmax scale (K) and to
the output (V).

int4 tiles are a [BLOCK_N, D/2] byte tile decoded into its low and high nibbles and joined as
columns [0, D_PAD/2) and [D_PAD/2, D_PAD); for head dims that are not powers of two, q is loaded
and the output stored through the same column -> channel map (`_channel_of`).

Rotated formats (int4) and a centered V: the kernel reads q @ R and leaves its output in the
rotated basis; the launcher forms q @ R before it and out @ R + V mean after it with
`kernels.rotate.rotate_heads` (one launch each, float32).

The host side (`TileConfig`, `pick_tile_config`, `build_tile_map` and the launcher
`prefill_paged_attention`) lives in `prefill_launch` and is re-exported from here.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kvpack.kernels.prefill_launch import (  # noqa: F401 (re-exported: the public launcher and its tiling)
    TileConfig, build_tile_map, pick_tile_config, prefill_paged_attention,
)
from kvpack.kernels.quant import (
    INTERPRET, K_FMT_FP8E4M3, K_FMT_FP8E5M2, K_FMT_INT4, K_FMT_INT8, Q_LO_STEPS, fp8_decode_f16,
    fp8_f16_factor, int4_to_f16, int8_to_f16, split_q_int8,
)


@triton.jit
def _ld(ptrs, mask, other, HAS_MASK: tl.constexpr):
    if HAS_MASK:
        return tl.load(ptrs, mask=mask, other=other)
    else:
        return tl.load(ptrs)


@triton.jit
def _channel_of(c, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, INT4: tl.constexpr):
    """True channel of tile column c, and whether it exists: int4 tiles hold the low-nibble
    channels in columns [0, D_PAD/2) and the high-nibble ones from D_PAD/2 (identity unless
    D is not a power of 2)."""
    if INT4:
        HALF: tl.constexpr = HEAD_DIM // 2
        HP: tl.constexpr = D_PAD // 2
        jj = c % HP
        ch = jj + (c // HP) * HALF
        ok = jj < HALF
    else:
        ch = c
        ok = c < HEAD_DIM
    return ch, ok


_INTERPRET_C = tl.constexpr(INTERPRET)


# ---- one K or V tile -------------------------------------------------------------------------
@triton.jit
def _tile_scales(scales_ptr, zeros_ptr, scale_off, n_mask, FMT: tl.constexpr,
                 TOKEN_SCALE: tl.constexpr, GS: tl.constexpr, HEAD_DIM: tl.constexpr,
                 D_PAD: tl.constexpr):
    """Scale data of one K or V tile, fp16 as stored (past kv_end: scale 1, zero 0).

    scale_off: [BLOCK_N] int64 offsets of each token's scale groups. Returns (s0, s1, z0, z1):
    int4 -> scales and zeros of the low / high half ([N, groups per half], 1 where one group covers
    the head; or [N, D_PAD/2] one per channel when groups straddle the halves: head dims 80, 96);
    per-token int8/fp8 -> (s [N], 0, 0, 0);
    otherwise zeros.
    """
    s0 = 0.0
    s1 = 0.0
    z0 = 0.0
    z1 = 0.0
    if FMT == K_FMT_INT4:
        HALF: tl.constexpr = HEAD_DIM // 2
        HP: tl.constexpr = D_PAD // 2
        if (HALF == HP) and ((HALF % GS == 0) or (GS == HEAD_DIM)):  # whole groups per half, or one a head
            NGH: tl.constexpr = (HALF + GS - 1) // GS
            HI: tl.constexpr = HALF // GS  # the high half's first group (0: the head's one group)
            sp = scale_off[:, None] + tl.arange(0, NGH)[None, :]
            m = n_mask[:, None]
        else:  # head dims 80, 96: each channel's group
            j = tl.arange(0, HP)
            NGH: tl.constexpr = 0
            HI: tl.constexpr = 0
            sp = scale_off[:, None] + (j // GS)[None, :]
            sp1 = scale_off[:, None] + ((j + HALF) // GS)[None, :]
            m = (j < HALF)[None, :] & n_mask[:, None]
        s0 = tl.load(scales_ptr + sp, mask=m, other=1.0)
        z0 = tl.load(zeros_ptr + sp, mask=m, other=0.0)
        if NGH > 0:
            if HI == 0:
                s1 = s0
                z1 = z0
            else:
                s1 = tl.load(scales_ptr + sp + HI, mask=m, other=1.0)
                z1 = tl.load(zeros_ptr + sp + HI, mask=m, other=0.0)
        else:
            s1 = tl.load(scales_ptr + sp1, mask=m, other=1.0)
            z1 = tl.load(zeros_ptr + sp1, mask=m, other=0.0)
    elif TOKEN_SCALE:
        s0 = tl.load(scales_ptr + scale_off, mask=n_mask, other=1.0)
    return s0, s1, z0, z1


@triton.jit
def _widen(g, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr, DT: tl.constexpr):
    """[N, G] group values -> [N, WIDTH] (each repeated WIDTH // G times) in DT."""
    G: tl.constexpr = g.shape[1]
    if G == WIDTH:
        out = g.to(DT)
    else:
        out = tl.reshape(tl.broadcast_to(g.to(DT)[:, :, None], (BLOCK_N, G, WIDTH // G)), (BLOCK_N, WIDTH))
    return out


@triton.jit
def _load_kv_tile(codes_ptr, code_off, n_mask, s0, s1, z0, z1,
                  FMT: tl.constexpr, TOKEN_SCALE: tl.constexpr, HEAD_DIM: tl.constexpr,
                  D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, MASK_N: tl.constexpr,
                  DT: tl.constexpr, C0: tl.constexpr = 0):
    """Load BLOCK_N tokens of one kv head as a [BLOCK_N, D_PAD] tile in DT (the side's operand
    dtype: fp16 for quantized formats, fp32 under F32); s0, s1, z0, z1 from `_tile_scales`.
    Not int4: channels [C0, C0 + D_PAD) (a part of a head in two, `two_part_head`), masked at HEAD_DIM.

    code_off: [BLOCK_N] int64 element offsets of each token's codes. Codes become exact DT values
    with integer ops; per-token scales (and int4 zeros) are applied in DT (one rounding, as from
    fp32). Returns (x, c): the tile's values are x * c, c a constant (1.0, or the fp8 factor when
    the format has no per-token scale to carry it).
    """
    d = C0 + tl.arange(0, D_PAD)
    col = 1.0
    if FMT == K_FMT_INT4:
        # byte j holds channel j (low nibble) and channel j + D/2 (high): decode both halves of
        # a [BLOCK_N, D_PAD / 2] byte tile and join them as columns [0, D_PAD/2) and
        # [D_PAD/2, D_PAD) (`_channel_of` maps columns to channels when D is not a power of 2)
        HALF: tl.constexpr = HEAD_DIM // 2
        HP: tl.constexpr = D_PAD // 2
        j = tl.arange(0, HP)
        jm = (j < HALF)[None, :] & n_mask[:, None]
        lo, hi = int4_to_f16(_ld(codes_ptr + code_off[:, None] + j[None, :], jm, 0,
                                 MASK_N or (HALF != HP)))
        lo = lo.to(DT) * _widen(s0, BLOCK_N, HP, DT) + _widen(z0, BLOCK_N, HP, DT)
        hi = hi.to(DT) * _widen(s1, BLOCK_N, HP, DT) + _widen(z1, BLOCK_N, HP, DT)
        x = tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BLOCK_N, D_PAD))
    else:
        msk = (d < HEAD_DIM)[None, :] & n_mask[:, None]
        x = _ld(codes_ptr + code_off[:, None] + d[None, :], msk, 0, MASK_N or (HEAD_DIM != C0 + D_PAD))
        if FMT == K_FMT_INT8:
            x = int8_to_f16(x)  # exact, packed byte permutes
        if FMT == K_FMT_FP8E4M3 or FMT == K_FMT_FP8E5M2:
            # exact fp16 values divided by the fp8 factor (e4m3 NaN codes are not kept: finite
            # inputs never produce them); the factor joins the scale
            x = fp8_decode_f16(x, FMT)
            col = fp8_f16_factor(FMT)
        if TOKEN_SCALE:
            x = x.to(DT) * (s0.to(tl.float32) * col).to(DT)[:, None]
            col = 1.0
    return x.to(DT), col


@triton.jit
def _dot(a, b, acc, F32: tl.constexpr):
    if F32:
        out = tl.dot(a, b, acc, input_precision="ieee")
    elif _INTERPRET_C and a.dtype == tl.bfloat16:
        # the CPU interpreter multiplies bf16 dots wrongly: widen (exact) there; the GPU runs bf16
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


# ---- the kernel ------------------------------------------------------------------------------
@triton.jit
def _block_ids(bt_row, n0, kv_end, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Physical block of each key position n0 .. n0 + BLOCK_N - 1 ([BLOCK_N] int64; positions
    past kv_end read the last valid entry, so the block table row is never overrun)."""
    pos = n0 + tl.arange(0, BLOCK_N)
    # positions are >= 0: unsigned division (a signed one costs sign fix-ups per key)
    return tl.load(bt_row + (tl.minimum(pos, kv_end - 1).to(tl.uint32) // BLOCK_SIZE).to(tl.int32)).to(tl.int64)


@triton.jit
def _scale_offsets(ids, n0, kvh, s_b, s_h, s_t, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    return ids * s_b + kvh * s_h + ((n0 + tl.arange(0, BLOCK_N)) & (BLOCK_SIZE - 1)).to(tl.int64) * s_t


@triton.jit
def _attend(acc, m_i, l_i, blk, ks0, ks1, kz0, kz1, vs0, vs1, vz0, vz1,
            q, pos_m, n0, kv_end, bt_row, kvh, qk_scale,
            kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
            s_kcb, s_kch, s_kct, s_ksb, s_ksh, s_kst,
            s_vcb, s_vch, s_vct, s_vsb, s_vsh, s_vst,
            K_FMT: tl.constexpr, V_FMT: tl.constexpr, K_TOKEN: tl.constexpr, V_TOKEN: tl.constexpr,
            K_GS: tl.constexpr, V_GS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
            MASKED: tl.constexpr, DT_K: tl.constexpr, DT_V: tl.constexpr, F32: tl.constexpr,
            CARRY: tl.constexpr, QK8: tl.constexpr, q_lo, q_s, D_B: tl.constexpr, q_b, acc_b):
    """One KV tile [n0, n0 + BLOCK_N) of the online softmax (MASKED: causal + length masks).

    D_B > 0 (a head in two parts, `prefill_launch.two_part_head`): q / acc hold channels [0, D_PAD / 2) and
    q_b / acc_b the next D_B (the last HEAD_DIM - D_PAD / 2 of them real); else acc_b is returned as it came.

    CARRY: blk and the K/V scale data (`_tile_scales`) are this tile's, and the next tile's are
    returned with the new state: no K/V address depends on a load of the same iteration, so the
    software pipeliner keeps K/V copies num_stages - 1 tiles ahead (with the block table read
    in-iteration it waits for each tile's copies at the top of its iteration), and the small
    scale loads (not pipelined) have a whole iteration to land. On sm_90 + Triton 3.6, carrying
    serializes the wgmmas that read K/V straight from the copy buffers (float formats; ptxas
    C7515), so the launcher carries by default only when both sides are dequantized in registers.
    """
    # dynamic K scales for int8 MMAs over whole cache blocks load in-iteration as block rows (below);
    # the carried per-token K scales are not loaded then
    K_CARRIED: tl.constexpr = K_TOKEN and not (QK8 and BLOCK_N % BLOCK_SIZE == 0)
    pos_n = n0 + tl.arange(0, BLOCK_N)
    n_mask = pos_n < kv_end
    off = (pos_n & (BLOCK_SIZE - 1)).to(tl.int64)
    if not CARRY:
        blk = _block_ids(bt_row, n0, kv_end, BLOCK_N, BLOCK_SIZE)
        ks0, ks1, kz0, kz1 = _tile_scales(
            ks_ptr, kz_ptr, blk * s_ksb + kvh * s_ksh + off * s_kst, n_mask,
            K_FMT, K_CARRIED, K_GS, HEAD_DIM, D_PAD)
        vs0, vs1, vz0, vz1 = _tile_scales(
            vs_ptr, vz_ptr, blk * s_vsb + kvh * s_vsh + off * s_vst, n_mask,
            V_FMT, V_TOKEN, V_GS, HEAD_DIM, D_PAD)
    if QK8:  # int8 codes straight into int8 MMAs with q's two int8 parts (q, q_lo; `split_q_int8`)
        d = tl.arange(0, D_PAD)
        kt = tl.trans(_ld(kc_ptr + (blk * s_kcb + kvh * s_kch + off * s_kct)[:, None] + d[None, :],
                          (d < HEAD_DIM)[None, :] & n_mask[:, None], 0, MASKED or (HEAD_DIM != D_PAD)))
        si = tl.dot(q, kt, out_dtype=tl.int32) * Q_LO_STEPS
        s = tl.dot(q_lo, kt, si, out_dtype=tl.int32).to(tl.float32)
        if K_TOKEN:  # q_s (per row) carries the softmax scale: applied in the exponent below
            if not K_CARRIED:
                # the tile's scales as [blocks, block_size] rows (one block id per block, contiguous
                # scales), then to the score tile's column layout by a gather: loaded in that
                # layout directly (Triton's choice otherwise), every thread would load 16 scales and
                # 16 block ids per tile (measured 1.40-1.50x bf16 prefill against 1.2-1.3x without
                # int8 MMAs); the carried per-token scales (`_tile_scales`) are not loaded then
                NB: tl.constexpr = BLOCK_N // BLOCK_SIZE
                bi = tl.arange(0, NB)
                bpos = n0 + bi * BLOCK_SIZE
                bids = tl.load(bt_row + (bpos.to(tl.uint32) // BLOCK_SIZE).to(tl.int32), mask=bpos < kv_end,
                               other=0).to(tl.int64)
                ti = tl.arange(0, BLOCK_SIZE)
                ks2 = tl.load(ks_ptr + (bids * s_ksb + kvh * s_ksh)[:, None] + (ti * s_kst)[None, :],
                              mask=(bpos[:, None] + ti[None, :]) < kv_end, other=1.0)
                ksv = tl.gather(tl.reshape(ks2.to(tl.float32), (BLOCK_N,)), tl.arange(0, BLOCK_N), 0)
            else:
                ksv = ks0.to(tl.float32)
            s = s * ksv[None, :]
    elif D_B > 0:
        k_off = blk * s_kcb + kvh * s_kch + off * s_kct
        k, k_col = _load_kv_tile(kc_ptr, k_off, n_mask, ks0, ks1, kz0, kz1, K_FMT, K_TOKEN, HEAD_DIM, D_PAD // 2,
                                 BLOCK_N, MASKED, DT_K)
        k_b, _ = _load_kv_tile(kc_ptr, k_off, n_mask, ks0, ks1, kz0, kz1, K_FMT, K_TOKEN, HEAD_DIM, D_B,
                               BLOCK_N, MASKED, DT_K, D_PAD // 2)
        s = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), F32)
        s = _dot(q_b, tl.trans(k_b), s, F32)
        s = s * (k_col * qk_scale)
    else:
        k, k_col = _load_kv_tile(kc_ptr, blk * s_kcb + kvh * s_kch + off * s_kct, n_mask,
                                 ks0, ks1, kz0, kz1, K_FMT, K_TOKEN, HEAD_DIM, D_PAD, BLOCK_N, MASKED, DT_K)
        s = _dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), F32)
        s = s * (k_col * qk_scale)
    if MASKED:
        s = tl.where((pos_n[None, :] <= pos_m[:, None]) & n_mask[None, :], s, float("-inf"))
    if QK8:  # scores s * q_s, q_s > 0 per row
        m_new = tl.maximum(m_i, tl.max(s, 1) * q_s)
        p = tl.math.exp2(s * q_s[:, None] - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    # v_col is a constant (1 or the fp8 factor): the kernel applies it to the output
    v_off = blk * s_vcb + kvh * s_vch + off * s_vct
    if D_B > 0:
        v, v_col = _load_kv_tile(vc_ptr, v_off, n_mask, vs0, vs1, vz0, vz1, V_FMT, V_TOKEN, HEAD_DIM, D_PAD // 2,
                                 BLOCK_N, MASKED, DT_V)
        v_b, _ = _load_kv_tile(vc_ptr, v_off, n_mask, vs0, vs1, vz0, vz1, V_FMT, V_TOKEN, HEAD_DIM, D_B,
                               BLOCK_N, MASKED, DT_V, D_PAD // 2)
    else:
        v, v_col = _load_kv_tile(vc_ptr, v_off, n_mask, vs0, vs1, vz0, vz1, V_FMT, V_TOKEN, HEAD_DIM, D_PAD,
                                 BLOCK_N, MASKED, DT_V)
    if CARRY:  # the next tile's block ids and scale data
        n1 = n0 + BLOCK_N
        blk = _block_ids(bt_row, n1, kv_end, BLOCK_N, BLOCK_SIZE)
        m1 = (n1 + tl.arange(0, BLOCK_N)) < kv_end
        ks0, ks1, kz0, kz1 = _tile_scales(
            ks_ptr, kz_ptr, _scale_offsets(blk, n1, kvh, s_ksb, s_ksh, s_kst, BLOCK_N, BLOCK_SIZE),
            m1, K_FMT, K_CARRIED, K_GS, HEAD_DIM, D_PAD)
        vs0, vs1, vz0, vz1 = _tile_scales(
            vs_ptr, vz_ptr, _scale_offsets(blk, n1, kvh, s_vsb, s_vsh, s_vst, BLOCK_N, BLOCK_SIZE),
            m1, V_FMT, V_TOKEN, V_GS, HEAD_DIM, D_PAD)
    acc = _dot(p.to(DT_V), v, acc * alpha[:, None], F32)
    if D_B > 0:
        acc_b = _dot(p.to(DT_V), v_b, acc_b * alpha[:, None], F32)
    return acc, m_new, l_i, blk, ks0, ks1, kz0, kz1, vs0, vs1, vz0, vz1, acc_b


@triton.jit
def _prefill_attn_kernel(
    q_ptr, o_ptr, tile_seq_ptr, tile_start_ptr, qsl_ptr, seq_lens_ptr, bt_ptr,
    kc_ptr, ks_ptr, kz_ptr, kss_ptr, vc_ptr, vs_ptr, vz_ptr, vss_ptr,
    sm_scale,
    s_qt, s_qh, s_ot, s_oh, s_bt,
    s_kcb, s_kch, s_kct, s_ksb, s_ksh, s_kst,
    s_vcb, s_vch, s_vct, s_vsb, s_vsh, s_vst,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    K_FMT: tl.constexpr, V_FMT: tl.constexpr, K_MODE: tl.constexpr, V_MODE: tl.constexpr,
    K_GS: tl.constexpr, V_GS: tl.constexpr, DT_K: tl.constexpr, DT_V: tl.constexpr,
    Q_SHIFT: tl.constexpr, F32: tl.constexpr, CARRY: tl.constexpr, INTERPRET: tl.constexpr,
    QK8: tl.constexpr = False, D_B: tl.constexpr = 0,
):
    # K_MODE / V_MODE: 0 no scales, 1 per-token scales in the cache, 2 static per-head scale.
    # Rotated sides: q arrives as q @ R and the output leaves in the rotated basis (the launcher).
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + pid)
    if seq < 0:
        return
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP  # query tokens per tile
    t0 = tl.load(tile_start_ptr + pid)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    ctx = tl.load(seq_lens_ptr + seq) - q_len  # cached prefix before this step's tokens

    rows = tl.arange(0, BLOCK_M)
    tok = t0 + rows // GROUP
    head = kvh * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (tok < q_len)
    pos_m = ctx + tok
    tl.static_assert(D_B == 0 or not (QK8 or K_FMT == K_FMT_INT4 or V_FMT == K_FMT_INT4), "two parts: no int4, QK8")
    D_A: tl.constexpr = D_PAD // 2 if D_B > 0 else D_PAD  # q / acc's channels (the first part's)
    d = tl.arange(0, D_A)
    ch, ok = _channel_of(d, HEAD_DIM, D_PAD, K_FMT == K_FMT_INT4)  # q columns follow K's tile
    q_row = q_ptr + (q_start + tok).to(tl.int64)[:, None] * s_qt + head[:, None] * s_qh
    q = tl.load(q_row + ch[None, :], mask=row_ok[:, None] & ok[None, :], other=0.0)
    if D_B > 0:  # channels [D_PAD / 2, HEAD_DIM) as the second part, padded to D_B
        db = D_A + tl.arange(0, D_B)
        q_b = tl.load(q_row + db[None, :], mask=row_ok[:, None] & (db < HEAD_DIM)[None, :], other=0.0)
    else:
        q_b = q

    qk_scale = sm_scale * 1.4426950408889634  # log2(e): the softmax runs in base 2
    if Q_SHIFT:  # bf16 q -> fp16 operands: scale by 2^-e (exact) so that |q| stays below 2^15
        qf = q.to(tl.float32)
        qmax = tl.max(tl.max(tl.abs(qf), 1), 0)
        if D_B > 0:
            qmax = tl.maximum(qmax, tl.max(tl.max(tl.abs(q_b.to(tl.float32)), 1), 0))
        e = tl.maximum(tl.ceil(tl.log2(qmax)) - 15.0, 0.0).to(tl.int32)
        q = qf * ((127 - e) << 23).to(tl.float32, bitcast=True)
        if D_B > 0:
            q_b = q_b.to(tl.float32) * ((127 - e) << 23).to(tl.float32, bitcast=True)
        qk_scale = qk_scale * ((127 + e) << 23).to(tl.float32, bitcast=True)
    if K_MODE == 2:
        qk_scale = qk_scale * tl.load(kss_ptr + kvh)
    if QK8:  # int8 K: q as two int8 parts, the step (with the softmax scale) per row
        q, q_lo, q_s = split_q_int8(q.to(tl.float32))
        q_s = q_s * qk_scale
    else:
        q = q.to(DT_K)
        q_lo = q
        q_s = qk_scale
    acc = tl.zeros([BLOCK_M, D_A], dtype=tl.float32)
    if D_B > 0:
        q_b = q_b.to(DT_K)
        acc_b = tl.zeros([BLOCK_M, D_B], dtype=tl.float32)
    else:  # unused: `_attend` hands acc_b back as it came
        acc_b = acc
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    kv_end = ctx + tl.minimum(t0 + BLOCK_Q, q_len)  # keys [0, kv_end) are visible to some row
    kv_full = (ctx + t0 + 1) // BLOCK_N * BLOCK_N  # keys [0, kv_full) are visible to every row
    for phase in tl.static_range(2):  # 0: tiles every row sees whole, 1: the diagonal (masked)
        lo = kv_full * phase
        hi = kv_full + (kv_end - kv_full) * phase
        blk = _block_ids(bt_row, lo, kv_end, BLOCK_N, BLOCK_SIZE)
        m0 = (lo + tl.arange(0, BLOCK_N)) < kv_end
        ks0, ks1, kz0, kz1 = _tile_scales(
            ks_ptr, kz_ptr, _scale_offsets(blk, lo, kvh, s_ksb, s_ksh, s_kst, BLOCK_N, BLOCK_SIZE),
            m0, K_FMT, K_MODE == 1 and not (QK8 and BLOCK_N % BLOCK_SIZE == 0), K_GS, HEAD_DIM, D_PAD)
        vs0, vs1, vz0, vz1 = _tile_scales(
            vs_ptr, vz_ptr, _scale_offsets(blk, lo, kvh, s_vsb, s_vsh, s_vst, BLOCK_N, BLOCK_SIZE),
            m0, V_FMT, V_MODE == 1, V_GS, HEAD_DIM, D_PAD)
        if INTERPRET:  # the CPU interpreter cannot run `range` over tensor bounds (numpy >= 2.4)
            n0 = lo
            while n0 < hi:
                acc, m_i, l_i, blk, ks0, ks1, kz0, kz1, vs0, vs1, vz0, vz1, acc_b = _attend(
                    acc, m_i, l_i, blk, ks0, ks1, kz0, kz1, vs0, vs1, vz0, vz1,
                    q, pos_m, n0, kv_end, bt_row, kvh, qk_scale,
                    kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                    s_kcb, s_kch, s_kct, s_ksb, s_ksh, s_kst, s_vcb, s_vch, s_vct, s_vsb, s_vsh, s_vst,
                    K_FMT, V_FMT, K_MODE == 1, V_MODE == 1, K_GS, V_GS, HEAD_DIM, D_PAD,
                    BLOCK_M, BLOCK_N, BLOCK_SIZE, phase == 1, DT_K, DT_V, F32, CARRY, QK8, q_lo, q_s,
                    D_B, q_b, acc_b)
                n0 += BLOCK_N
        else:
            for n0 in range(lo, hi, BLOCK_N):
                acc, m_i, l_i, blk, ks0, ks1, kz0, kz1, vs0, vs1, vz0, vz1, acc_b = _attend(
                    acc, m_i, l_i, blk, ks0, ks1, kz0, kz1, vs0, vs1, vz0, vz1,
                    q, pos_m, n0, kv_end, bt_row, kvh, qk_scale,
                    kc_ptr, ks_ptr, kz_ptr, vc_ptr, vs_ptr, vz_ptr,
                    s_kcb, s_kch, s_kct, s_ksb, s_ksh, s_kst, s_vcb, s_vch, s_vct, s_vsb, s_vsh, s_vst,
                    K_FMT, V_FMT, K_MODE == 1, V_MODE == 1, K_GS, V_GS, HEAD_DIM, D_PAD,
                    BLOCK_M, BLOCK_N, BLOCK_SIZE, phase == 1, DT_K, DT_V, F32, CARRY, QK8, q_lo, q_s,
                    D_B, q_b, acc_b)

    inv_l = 1.0 / l_i
    if V_MODE == 2:
        inv_l = inv_l * tl.load(vss_ptr + kvh)
    if (V_MODE != 1) and (V_FMT == K_FMT_FP8E4M3 or V_FMT == K_FMT_FP8E5M2):
        inv_l = inv_l * fp8_f16_factor(V_FMT)
    ch, ok = _channel_of(d, HEAD_DIM, D_PAD, V_FMT == K_FMT_INT4)  # acc columns follow V's tile
    o = acc * inv_l[:, None]
    o_row = o_ptr + (q_start + tok).to(tl.int64)[:, None] * s_ot + head[:, None] * s_oh
    tl.store(o_row + ch[None, :], o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & ok[None, :])
    if D_B > 0:
        tl.store(o_row + db[None, :], (acc_b * inv_l[:, None]).to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (db < HEAD_DIM)[None, :])
