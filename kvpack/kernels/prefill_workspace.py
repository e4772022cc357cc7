"""Dequantize a batch's KV blocks into a bf16 / fp16 workspace for the prefill kernel (one launch).

Prefill attention is compute-bound: the fused kernel dequantizes every KV tile once for each query
tile that reads it (a 2048-token chunk: ~64 times per tile at GQA 4), and its quantized sides run
fp16 operands, for which a bf16 q is converted in the kernel (measured ~10 % slower than a q that
loads as its operand). When `AttentionMetadata.workspace` (`kvpack.attention.metadata.PrefillWorkspace`)
is planned, `prefill_paged_attention` first writes each block of the batch once, in q's dtype
(this kernel), and then runs the bf16 / fp16-cache path of the same kernel over the renumbered
block tables (results/prefill_s7).

Values: int8 and FP8 codes decode exactly, times their scale (per-token or static), in float32;
int4 is code * s + m. A rotated side is rotated back there (x @ R again, the storage butterflies:
R @ R = I) where `can_unrotate` says so (int4 at head dims 80 / 96 too since session 32), and a centered V gets its mean
back, so that neither q nor the output is rotated around the kernel (where it cannot, the launcher rotates q and
the output as for the fused path). Each value is then rounded once to the
workspace dtype (int4 without un-rotation: code * s + m in float16 arithmetic first, as the fused
kernel's tiles). Float sides are copied as stored. A bf16 workspace (bf16 models) rounds each value
to 2^-9 relative: next to int8's step (absmax / 127) that adds ~1.5 % to the RMS error of an int8
cache and less to the coarser formats. float16's range applies to an fp16 workspace.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpack.attention.kv_cache import CachePool
from kvpack.formats import hadamard_block_size, hadamard_norm, resolve_format
from kvpack.kernels.quant import (
    K_FMT_FLOAT, K_FMT_INT4, K_FMT_INT8, f32_to_bf16_rne, fp8_decode_f16, fp8_f16_factor, int4_to_f16,
    int8_to_f16, next_pow2,
)
from kvpack.kernels.rotate import _hadamard


@triton.jit
def _round_to(x, dtype: tl.constexpr):
    """float32 / float16 x -> dtype, nearest even (the interpreter truncates a plain bf16 cast)."""
    if dtype == tl.bfloat16:
        y = f32_to_bf16_rne(x.to(tl.float32))
    else:
        y = x.to(dtype)
    return y


@triton.jit
def _dequant_side(src, w, h, codes_ptr, scales_ptr, zeros_ptr, static_ptr, mean_ptr, ws_ptr,
                  cs0, cs1, cs2, ss0, ss1, ss2, ws0, ws1, ws2,
                  FMT: tl.constexpr, MODE: tl.constexpr, GS: tl.constexpr, ROT: tl.constexpr,
                  HB: tl.constexpr, NORM: tl.constexpr, ADD_MEAN: tl.constexpr, D: tl.constexpr,
                  D_PAD: tl.constexpr, BS: tl.constexpr):
    t = tl.arange(0, BS).to(tl.int64)
    c_row = codes_ptr + src * cs0 + h * cs1 + t * cs2  # [BS] pointers
    s_row = src * ss0 + h * ss1 + t * ss2  # [BS] element offsets
    w_row = ws_ptr + w * ws0 + h * ws1 + t * ws2
    d = tl.arange(0, D_PAD)
    dm = (d < D)[None, :]
    if FMT == K_FMT_INT4:  # byte j: channel j (low nibble), channel j + D/2 (high)
        HALF: tl.constexpr = D // 2
        if ROT:  # whole rows in channel order, as the 8-bit kinds (`can_unrotate`)
            # Channel c is byte c % (D/2), its low nibble below D/2 and its high one above (each byte
            # loaded twice, the second time from L1); each token's group parameters load as [BS, D/GS]
            # and broadcast over the groups' channels. Gathered per channel instead (as the path
            # without rotation below does), they made the compiler move every row through shared memory:
            # sm_90 SASS 156 LDS / 161 STS / 25 BAR, against FP8's 8 / 4 / 5 and now int4's 8 / 4 / 5.
            # Measured on an H200 (session 14, 10k tokens of 8 kv heads, one layer): FP8 33 us; int4
            # 370 us with the gather (rows or halves joined), 290 us on halves, 150 us as a tensor-core
            # x @ H. Head dims 80 / 96 (D_PAD 128): the padding channels get scale and zero 0, so they are 0 and
            # fill Hadamard blocks of their own (HB divides D).
            b2 = tl.load(c_row[:, None] + (d % HALF)[None, :], mask=dm, other=0)
            code = tl.where((d < HALF)[None, :], b2 & 15, b2 >> 4)
            NG: tl.constexpr = D_PAD // GS
            gi = tl.arange(0, NG)
            gm = (gi < D // GS)[None, :]
            sc = tl.load(scales_ptr + s_row[:, None] + gi[None, :], mask=gm, other=0.0).to(tl.float32)
            zc = tl.load(zeros_ptr + s_row[:, None] + gi[None, :], mask=gm, other=0.0).to(tl.float32)
            x = tl.reshape(code.to(tl.float32), (BS, NG, GS)) * sc[:, :, None] + zc[:, :, None]
            x = tl.reshape(x, (BS, D_PAD))
            x = _hadamard(x, BS, D_PAD, HB, NORM)
            if ADD_MEAN:
                x = x + tl.load(mean_ptr + h * D + d, mask=d < D, other=0.0)[None, :]
            tl.store(w_row[:, None] + d[None, :], _round_to(x, ws_ptr.dtype.element_ty), mask=dm)
        else:
            j = tl.arange(0, D_PAD // 2)
            jm = (j < HALF)[None, :]
            lo, hi = int4_to_f16(tl.load(c_row[:, None] + j[None, :], mask=jm, other=0))
            g_lo = s_row[:, None] + (j // GS)[None, :]
            g_hi = s_row[:, None] + ((j + HALF) // GS)[None, :]
            lo = lo * tl.load(scales_ptr + g_lo, mask=jm, other=1.0) + tl.load(zeros_ptr + g_lo, mask=jm, other=0.0)
            hi = hi * tl.load(scales_ptr + g_hi, mask=jm, other=1.0) + tl.load(zeros_ptr + g_hi, mask=jm, other=0.0)
            if ADD_MEAN:
                lo = lo.to(tl.float32) + tl.load(mean_ptr + h * D + j, mask=j < HALF, other=0.0)[None, :]
                hi = hi.to(tl.float32) + tl.load(mean_ptr + h * D + HALF + j, mask=j < HALF, other=0.0)[None, :]
            tl.store(w_row[:, None] + j[None, :], _round_to(lo, ws_ptr.dtype.element_ty), mask=jm)
            tl.store(w_row[:, None] + HALF + j[None, :], _round_to(hi, ws_ptr.dtype.element_ty), mask=jm)
    else:
        x = tl.load(c_row[:, None] + d[None, :], mask=dm, other=0)
        if FMT == K_FMT_FLOAT:
            tl.store(w_row[:, None] + d[None, :], x, mask=dm)
        else:
            if FMT == K_FMT_INT8:
                x = int8_to_f16(x)  # exact
                col = 1.0
            else:  # FP8: exact values / fp8_f16_factor
                x = fp8_decode_f16(x, FMT)
                col = fp8_f16_factor(FMT)
            if MODE == 1:  # per-token scale (float16) times the factor: exact, then one rounding
                s = (tl.load(scales_ptr + s_row).to(tl.float32) * col)[:, None]
            elif MODE == 2:
                s = tl.load(static_ptr + h) * col
            else:
                s = col
            x = x.to(tl.float32) * s
            if ROT:  # padding channels are 0 and fill Hadamard blocks of their own
                x = _hadamard(x, BS, D_PAD, HB, NORM)
            if ADD_MEAN:
                x = x + tl.load(mean_ptr + h * D + d, mask=d < D, other=0.0)[None, :]
            tl.store(w_row[:, None] + d[None, :], _round_to(x, ws_ptr.dtype.element_ty), mask=dm)


@triton.jit
def _dequant_blocks_kernel(src_ptr,
                           kc_ptr, ks_ptr, kz_ptr, kst_ptr, km_ptr, kw_ptr, kcs0, kcs1, kcs2, kss0, kss1, kss2,
                           kws0, kws1, kws2,
                           vc_ptr, vs_ptr, vz_ptr, vst_ptr, vm_ptr, vw_ptr, vcs0, vcs1, vcs2, vss0, vss1, vss2,
                           vws0, vws1, vws2,
                           K_FMT: tl.constexpr, K_MODE: tl.constexpr, K_GS: tl.constexpr, K_ROT: tl.constexpr,
                           K_MEAN: tl.constexpr,
                           V_FMT: tl.constexpr, V_MODE: tl.constexpr, V_GS: tl.constexpr, V_ROT: tl.constexpr,
                           V_MEAN: tl.constexpr,
                           HB: tl.constexpr, NORM: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                           BS: tl.constexpr):
    w = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    src = tl.load(src_ptr + w).to(tl.int64)
    _dequant_side(src, w, h, kc_ptr, ks_ptr, kz_ptr, kst_ptr, km_ptr, kw_ptr, kcs0, kcs1, kcs2, kss0, kss1, kss2,
                  kws0, kws1, kws2, K_FMT, K_MODE, K_GS, K_ROT, HB, NORM, K_MEAN, D, D_PAD, BS)
    _dequant_side(src, w, h, vc_ptr, vs_ptr, vz_ptr, vst_ptr, vm_ptr, vw_ptr, vcs0, vcs1, vcs2, vss0, vss1, vss2,
                  vws0, vws1, vws2, V_FMT, V_MODE, V_GS, V_ROT, HB, NORM, V_MEAN, D, D_PAD, BS)


_MODES = {"none": 0, "token": 1, "static": 2}


def can_unrotate(fmt) -> bool:
    """Whether the workspace can store a rotated side un-rotated (x @ R again: R @ R = I): any
    rotated 8-bit kind; int4 when its groups tile the head padded to a power of two (head dims 64 / 128 / 256,
    and 80 / 96 padded to 128 with groups of 16 or 32: session 32; before, int4 at 80 / 96 kept its rotation
    and the launcher rotated q and the output around the kernel, 1.11-1.22x bf16's prefill time on an H200)."""
    d = fmt.head_dim
    return fmt.rotate and (fmt.kind != "int4" or (d % fmt.group_size == 0 and next_pow2(d) % fmt.group_size == 0))


def _side(pool: CachePool, num_blocks: int, ws_dtype: torch.dtype, unrotate: bool,
          mean: torch.Tensor | None) -> tuple[list, list, CachePool]:
    """(kernel args, constexprs, workspace pool) of one side."""
    fmt = pool.fmt
    codes = pool.codes
    dtype = codes.dtype if fmt.kind == "float" else ws_dtype
    ws = torch.empty((num_blocks, pool.num_kv_heads, pool.block_size, fmt.head_dim), dtype=dtype,
                     device=codes.device)
    scales = pool.scales if pool.scales is not None else codes
    zeros = pool.zeros if pool.zeros is not None else scales
    static = pool.static_scale if pool.static_scale is not None else codes
    if mean is not None:
        mean = mean.to(device=codes.device, dtype=torch.float32).contiguous()
    args = [codes, scales, zeros, static, mean if mean is not None else codes, ws,
            *codes.stride()[:3], *scales.stride()[:3], *ws.stride()[:3]]
    gs = fmt.group_size if fmt.kind == "int4" else 1
    name = {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype] if fmt.kind != "float" else fmt.name
    ws_fmt = resolve_format(name, head_dim=fmt.head_dim, model_dtype=dtype)
    consts = [fmt.kernel_id, _MODES[fmt.scale_mode], gs, bool(unrotate), mean is not None]
    return args, consts, CachePool(ws, None, None, None, ws_fmt)


def dequantize_to_workspace(kp: CachePool, vp: CachePool, src_blocks: torch.Tensor, num_blocks: int,
                            ws_dtype: torch.dtype = torch.float16, unrotate_k: bool = False,
                            unrotate_v: bool = False, v_mean: torch.Tensor | None = None
                            ) -> tuple[CachePool, CachePool]:
    """Workspace pools [num_blocks, Hkv, block_size, D] (ws_dtype for quantized sides, the stored
    dtype for float ones) holding blocks src_blocks[i] of `kp` / `vp` at index i. unrotate_k /
    unrotate_v: store x @ R of a rotated side (the unrotated values; `can_unrotate` must hold);
    v_mean [Hkv, D]: add V's centering mean back."""
    for flag, pool in ((unrotate_k, kp), (unrotate_v, vp)):
        assert not flag or can_unrotate(pool.fmt), pool.fmt
    k_args, k_c, k_ws = _side(kp, num_blocks, ws_dtype, unrotate_k, None)
    v_args, v_c, v_ws = _side(vp, num_blocks, ws_dtype, unrotate_v, v_mean)
    if num_blocks:
        d = kp.fmt.head_dim
        hb = hadamard_block_size(d)
        _dequant_blocks_kernel[(num_blocks, kp.num_kv_heads)](
            src_blocks, *k_args, *v_args, *k_c, *v_c, hb, hadamard_norm(hb), d,
            max(16, next_pow2(d)), kp.block_size, num_warps=4, enable_fp_fusion=False)
    return k_ws, v_ws
