"""Host side of the prefill/mixed paged-attention kernel (`prefill_attention._prefill_attn_kernel`).

`TileConfig` / `pick_tile_config` (tiling heuristics), `build_tile_map` (program -> sequence map
built on the device), per-pool launch arguments and the launcher
`prefill_paged_attention`. All public names are re-exported by `kvpack.kernels.prefill_attention`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton.language as tl

from kvpack.config import KVPackError
from kvpack.formats import FMT_FLOAT, FMT_INT4, FMT_INT8
from kvpack.kernels.quant import INTERPRET, next_pow2
from kvpack.kernels.rotate import rotate_heads

if TYPE_CHECKING:
    from kvpack.attention.kv_cache import CachePool, LayerKVCache
    from kvpack.attention.metadata import AttentionMetadata


# a head dim that is not a power of two runs in two parts (`two_part_head`); KVPACK_PREFILL_TWO_PART=0: padded to
# the next power of two, for measuring
TWO_PART = os.environ.get("KVPACK_PREFILL_TWO_PART", "1") != "0"


@dataclass(frozen=True)
class TileConfig:
    """Tiling of one launch: BLOCK_M query rows (tokens x GROUP heads), BLOCK_N keys per step."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    carry_block_ids: bool | None = None  # None: when K and V are both quantized (see _attend)


def pick_tile_config(head_dim: int, device: torch.device, dtype: torch.dtype = torch.bfloat16,
                     quantized: bool = False) -> TileConfig:
    """Heuristic table (no autotuning: deterministic, CUDA-graph friendly, interpreter-safe).

    Chosen from ptxas reports of every format (no register spills on sm_90 for all head dims;
    a few hundred bytes at most on sm_80 for int8/int4); `bench_prefill.py --sweep` times the
    alternatives on a real GPU.
    """
    if INTERPRET or device.type != "cuda":
        return TileConfig(32, 16, 4, 1)
    d_pad = max(16, next_pow2(head_dim))
    if dtype == torch.float32:  # FMA dots (input_precision="ieee") hold whole tiles in registers
        return TileConfig(16, 16, 4, 1) if d_pad > 128 else TileConfig(32, 16, 4, 1)
    major, _ = torch.cuda.get_device_capability(device)
    if major >= 9:  # Hopper: wgmma over 2 warpgroups x 64 rows
        if d_pad > 128:
            return TileConfig(128, 16, 8, 2) if quantized else TileConfig(64, 32, 8, 2)
        if not quantized and TWO_PART and head_dim != d_pad and head_dim >= 32:
            # 16-bit sides in two parts (head dims 80 / 96): 64 rows, 4 warps, block ids and scale data carried.
            # H200, bf16, 32 x 32 heads, a 2048-token chunk on 2048 / 8192 cached tokens (`bench_prefill.py
            # --sweep`, session 32): head dim 80 390.9 -> 222.7 / 1031.7 -> 591.4 us against (128, 64, 8, 3),
            # 96 395.8 -> 279.9 / 1044.4 -> 729.0 (results/prefill_heads_s32/call4)
            return TileConfig(64, 64, 4, 3, True)
        return TileConfig(128, 64, 8, 3)
    if d_pad > 128:  # Ampere / Ada: mma.sync keeps q and the accumulator in registers
        return TileConfig(32, 16, 4, 2)
    return TileConfig(128, 64, 8, 2) if d_pad <= 64 else TileConfig(128, 32, 8, 2)


def build_tile_map(query_start_loc: torch.Tensor, block_q: int, num_tokens: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Map each program to (sequence, first query token of its tile) with device ops only.

    query_start_loc: [B + 1] int32. Returns tile_seq, tile_start: [num_tokens // block_q + B] int32
    (an upper bound on the tile count that needs no host sync, so the launch is CUDA-graph
    capturable for fixed T and B); unused programs get tile_seq == -1. Within a sequence the tiles
    run last-first: the ones with the most keys start earliest.
    """
    num_seqs = query_start_loc.numel() - 1
    dev = query_start_loc.device
    grid = num_tokens // block_q + num_seqs
    if num_seqs <= 0:
        empty = torch.empty(0, dtype=torch.int32, device=dev)
        return empty, empty
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    n_tiles = (q_lens + block_q - 1) // block_q
    ends = torch.cumsum(n_tiles, 0)
    t = torch.arange(grid, device=dev)
    seq = torch.searchsorted(ends, t, right=True).clamp_(max=max(num_seqs - 1, 0))
    local = t - (ends[seq] - n_tiles[seq])
    start = (n_tiles[seq] - 1 - local) * block_q
    tile_seq = torch.where(t < ends[-1], seq, -1).to(torch.int32)
    return tile_seq, start.to(torch.int32)


_MODES = {"none": 0, "token": 1, "static": 2}
_DOT_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _operand_dtype(fmt, q_dtype: torch.dtype) -> torch.dtype:
    """Dot operand dtype for one side: fp32 under fp32 q; a 16-bit float cache as stored;
    quantized formats fp16 (codes decode to fp16 exactly with integer ops and scales apply in
    packed fp16; bf16 would need a quarter-rate conversion per element)."""
    if q_dtype == torch.float32:
        return torch.float32
    if fmt.kind == "float":
        return fmt.storage_dtype if fmt.storage_dtype in (torch.float16, torch.bfloat16) else q_dtype
    return torch.float16


def _pool_args(pool: CachePool) -> tuple[list, list, int, int, int]:
    fmt = pool.fmt
    codes = pool.codes
    if codes.stride(-1) != 1:
        raise KVPackError("KV cache codes must be contiguous in their last dim")
    scales = pool.scales if pool.scales is not None else codes
    zeros = pool.zeros if pool.zeros is not None else scales
    if scales.stride(-1) != 1 or zeros.stride() != scales.stride():
        raise KVPackError("KV cache scales and zeros must share one layout, contiguous in the last dim")
    static = pool.static_scale if pool.static_scale is not None else codes
    mode = _MODES[fmt.scale_mode]
    if mode == 1 and (pool.scales is None or (fmt.kind == "int4" and pool.zeros is None)):
        raise KVPackError(f"KV format {fmt.name!r} needs per-token scales in the cache")
    if mode == 2 and pool.static_scale is None:
        raise KVPackError(f"KV format {fmt.name!r} needs static per-head scales")
    ptrs = [codes, scales, zeros, static]
    strides = [codes.stride(0), codes.stride(1), codes.stride(2),
               scales.stride(0), scales.stride(1), scales.stride(2)]
    gs = fmt.group_size if fmt.kind == "int4" else 1
    return ptrs, strides, fmt.kernel_id, mode, gs


def _use_qk8(k_fmt: int, k_mode: int, dtype: torch.dtype, block_n: int = 64, block_size: int = 16) -> bool:
    """int8 K scores from int8 MMAs (q in two int8 parts, `quant.split_q_int8`), measured on an H200
    (results/prefill_s6; 2048-token chunks on 0-8k prefixes, Llama-8B heads, of kvpack bf16):
    int8-static 1.00-1.03x with them, 1.11-1.18x without; dynamic int8 1.15-1.18x with them (its
    per-token scales gathered into the score layout), 1.18-1.28x without. Dynamic scales need
    whole cache blocks per KV tile (block_n % block_size == 0) for that gather; otherwise they
    would load in the score layout (1.40-1.50x), so that case keeps fp16 MMAs. Not for float32 q
    (fp32 operands). KVPACK_PREFILL_QK8=0 / =1 turns it off / forces it."""
    if k_fmt != FMT_INT8 or dtype == torch.float32:
        return False
    env = os.environ.get("KVPACK_PREFILL_QK8", "")
    if env in ("0", "1"):
        return env == "1"
    return k_mode == 2 or block_n % block_size == 0


def two_part_head(head_dim: int, k_fmt: int, v_fmt: int, qk8: bool) -> int:
    """The kernel's D_B: the width of the second part where a head dim that is not a power of two runs in two
    parts, channels [0, D_PAD / 2) and the next D_B (the rest, padded to a power of two, >= 16: 80 = 64 + 16,
    96 = 64 + 32), two dots for the scores and two accumulators, instead of one tile padded to D_PAD; else 0.
    Not for int4 sides read in the kernel (their nibble-half columns) nor int8 MMAs (QK8); a workspace's sides are
    16-bit. Padded, a head of 80 or 96 had cost as much as one of 128. H200, 32 x 32 heads, a 2048-token chunk on
    0-8192-token prefixes, old and new trees in one call (session 32, results/prefill_heads_s32): bf16 0.953x its
    time at 80, 0.963-0.969x at 96 (the softmax, not the dots, bounds it there); FP8 dequantized in the kernel
    0.79-0.82x at 80, 0.87-0.88x at 96."""
    d_pad = next_pow2(head_dim)
    if not TWO_PART or head_dim == d_pad or head_dim < 32 or qk8 or FMT_INT4 in (k_fmt, v_fmt):
        return 0
    return max(16, next_pow2(head_dim - d_pad // 2))


def prefill_paged_attention(
    q: torch.Tensor,
    layer_cache: LayerKVCache,
    metadata: AttentionMetadata,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    config: TileConfig | None = None,
    tile_map: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Causal paged attention of a mixed batch (prefill chunks and decodes) over the cache.

    q:   [T, Hq, D] float16 / bfloat16 / float32, unrotated (as `reference.paged_attention`).
         Query token i of sequence b sits at position seq_lens[b] - q_len[b] + i.
    layer_cache: K and V pools (any formats; codes [num_blocks, Hkv, block_size, code_width]).
    metadata: query_start_loc [B+1] int32, seq_lens [B] int32, block_tables [B, max_blocks] int32.
    scale: softmax scale (usually D ** -0.5).
    out: optional [T, Hq, D] in q's dtype. Rows past query_start_loc[-1] (padding) are unspecified.
    config / tile_map: override the tiling / reuse a `build_tile_map` result (same block_q).
    Returns out [T, Hq, D] in q's dtype. Rotated formats: q @ R before the kernel when K rotates,
    out @ R (+ the V mean of a centered V) after it when V rotates (`rotate_heads`).
    Quantized caches with `metadata.workspace` planned (and q not float32) are first dequantized
    into a copy of the batch's blocks in q's dtype (`prefill_workspace`; rotation and V centering
    undone there where it can), which the kernel then reads.
    """
    kp, vp = layer_cache.k, layer_cache.v
    if q.dim() != 3 or q.dtype not in _DOT_DTYPES:
        raise KVPackError(
            f"q must be [T, Hq, D] float16/bfloat16/float32, got {tuple(q.shape)} {q.dtype}")
    T, Hq, D = q.shape
    Hkv = kp.num_kv_heads
    if D != kp.fmt.head_dim or D != vp.fmt.head_dim or D % 2:
        raise KVPackError(f"q head dim {D} does not match the KV cache head dim {kp.fmt.head_dim}")
    if Hq % Hkv or vp.num_kv_heads != Hkv:
        raise KVPackError(f"{Hq} query heads are not a multiple of {Hkv} kv heads")
    if vp.block_size != kp.block_size:
        raise KVPackError("K and V pools must share one block size")
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise KVPackError(f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")
    num_seqs = metadata.seq_lens.shape[0]
    if T == 0 or num_seqs == 0:
        return out
    dtype = q.dtype
    quantized = kp.fmt.kind != "float" or vp.fmt.kind != "float"
    ws = metadata.workspace if quantized and dtype != torch.float32 else None
    # the workspace undoes the rotation (and V's centering) where it can: then neither q nor the
    # output is rotated around the kernel
    from kvpack.kernels.prefill_workspace import can_unrotate, dequantize_to_workspace

    k_ws_rot = ws is not None and can_unrotate(kp.fmt)
    v_ws_post = ws is not None and (not vp.fmt.rotate or can_unrotate(vp.fmt))
    rotate_q = kp.fmt.rotate and not k_ws_rot
    rotate_out = vp.fmt.rotate and not v_ws_post
    v_mean = None if v_ws_post else layer_cache.v_mean
    # rotated K: q @ R in float32 for the fused kernel; in q's dtype for the workspace (a bf16 / fp16
    # cache kernel: q loads as its operand, where an in-kernel conversion measured ~10 % slower)
    q_in = rotate_heads(q, torch.float32 if ws is None else dtype) if rotate_q else q
    # float32 kernel output when something follows it: out = o @ R + V mean, one launch
    o = torch.empty(q.shape, dtype=torch.float32, device=q.device) if rotate_out or v_mean is not None else out
    if q_in.stride(-1) != 1:
        q_in = q_in.contiguous()

    group = Hq // Hkv
    bt = metadata.block_tables
    if ws is not None:  # a copy of the batch's blocks in q's dtype, then the float-cache kernel
        kp, vp = dequantize_to_workspace(kp, vp, ws.src_blocks, ws.num_blocks, dtype, unrotate_k=k_ws_rot,
                                         unrotate_v=v_ws_post and vp.fmt.rotate,
                                         v_mean=layer_cache.v_mean if v_ws_post else None)
        bt = ws.block_tables
        quantized = False
    cfg = config or pick_tile_config(D, q.device, dtype, quantized)
    block_m = max(cfg.block_m, next_pow2(group))
    block_q = block_m // group
    if tile_map is None:  # once per step (every layer launches the same grid)
        make = lambda: build_tile_map(metadata.query_start_loc, block_q, T)  # noqa: E731
        derived = getattr(metadata, "derived", None)
        tile_map = derived(("prefill_tile_map", block_q, T), make) if derived else make()
    tile_seq, tile_start = tile_map
    k_ptrs, k_strides, k_fmt, k_mode, k_gs = _pool_args(kp)
    v_ptrs, v_strides, v_fmt, v_mode, v_gs = _pool_args(vp)
    dt_k, dt_v = _operand_dtype(kp.fmt, dtype), _operand_dtype(vp.fmt, dtype)
    carry = cfg.carry_block_ids
    if carry is None:
        carry = k_fmt != FMT_FLOAT and v_fmt != FMT_FLOAT
    qk8 = _use_qk8(k_fmt, k_mode, dtype, cfg.block_n, kp.block_size)
    grid = (tile_seq.numel(), Hkv)
    from kvpack.kernels.prefill_attention import _prefill_attn_kernel  # lazy: that module re-exports this one
    _prefill_attn_kernel[grid](
        q_in, o, tile_seq, tile_start, metadata.query_start_loc, metadata.seq_lens, bt,
        *k_ptrs, *v_ptrs, float(scale),
        q_in.stride(0), q_in.stride(1), o.stride(0), o.stride(1), bt.stride(0),
        *k_strides, *v_strides,
        GROUP=group, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_SIZE=kp.block_size,
        HEAD_DIM=D, D_PAD=max(16, next_pow2(D)),
        K_FMT=k_fmt, V_FMT=v_fmt, K_MODE=k_mode, V_MODE=v_mode, K_GS=k_gs, V_GS=v_gs,
        DT_K=_DOT_DTYPES[dt_k], DT_V=_DOT_DTYPES[dt_v],
        Q_SHIFT=dt_k == torch.float16 and q_in.dtype != torch.float16,
        F32=dtype == torch.float32, CARRY=carry, INTERPRET=INTERPRET,
        QK8=qk8, D_B=two_part_head(D, k_fmt, v_fmt, qk8),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if o is not out:
        rotate_heads(o, out.dtype, rotate_out, v_mean, out=out)
    return out
