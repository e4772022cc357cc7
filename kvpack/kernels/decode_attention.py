"""Decode paged attention (one query token per sequence), GQA-aware, split-K (flash-decoding).

Grid (num_seqs, Hkv, num_splits): a program loads each KV tile of its split once for all GROUP =
Hq / Hkv query heads that share it (q tile [GROUP_PAD >= 16, D] for tl.dot) and dequantizes in
registers without conversion instructions (`quant.int8_to_f16` etc.: byte permutes into fp16 bit
patterns): per-token K scales multiply the scores, per-token V scales multiply the probabilities
(normalised by the tile's largest scale), int4 tiles become code * s + m in fp16.
With several splits, the partial (max, sum, acc) triples are merged either by the last program of
each (sequence, kv head) to finish (`_merge_last`, the "fused" merge: an atomic counter per pair,
`decode_plan.choose_merge`) or by a second kernel (`_merge_kernel`). Rotated formats
and a centered V: q @ R is formed in the kernel as it loads q, and out @ R + V mean in the kernel's
epilogue or, with splits, in the merge (`kernels.rotate._hadamard`, the storage butterflies). The
Gluon "frag" kernel and int4 at head dims 80 / 96 (halves that straddle Hadamard blocks) leave them to
`kernels.rotate.rotate_heads` (one launch each) where the merge does not run.

Variants of the main kernel (`choose_variant`: argument, env KVPACK_DECODE_VARIANT=auto|dot|imma|frag|fragt,
else "auto": "fragt" for int4 K and V, "frag" for 8-bit K and V (int8 or FP8) with long splits, else "imma"
for int8 K, else "dot"): "dot" (`_decode_kernel`, tensor cores, described here), "imma" (the same kernel
with int8 K codes fed to an int8 MMA: q split into two int8 parts, `split_q_int8`), "frag" (`decode_frag`,
Gluon: codes loaded straight into the MMA fragment layout; where its grid holds <= 4 programs per SM, 8-bit
tiles copied a tile ahead through a cp.async ring in shared memory, `decode_plan.choose_ring_splits`) and
"fragt" (`decode_frag` with both products transposed, the query heads as the MMA's n = 8).
Head dims that are not powers of two: "dot" takes a head of 8-bit codes (and of bf16 at 96) as two parts, D_PAD / 2 channels and
the rest padded to a power of two (80 = 64 + 16, 96 = 64 + 32: `two_part_head`; "auto" prefers it to "imma"
there), and int4 loads each nibble half's first 32 channels as before and the rest of both halves as a third,
interleaved tile (40 = 32 + 8 a half, a 16-wide tile, at head dim 80; 48 = 32 + 16 at 96: `int4_parts`; H200, 32 x 32
heads, 8 x 4096, per layer: 94.3 -> 78.0 us at 80, 85.4 -> 79.1 at 96 against each half padded to 64, session 32).
All write the same partials for `_merge_kernel` (or merge them in their epilogue).
Shared host-side heuristics and the `DecodePlan` live in `decode_plan`; `plan_decode` and the
public launcher `decode_paged_attention` are here. (Sessions 3-5 also had "fma", CUDA-core dot
products, and "dott", scores as K @ q^T; neither won a tune round since session 4: removed in
session 6, results/attention_tune_s4/ has their last numbers.)

Dot operands (input_precision stated): float caches use their own dtype (bf16/fp16; fp32 caches
use fp32 operands with input_precision="ieee"); quantized caches are decoded exactly into fp16
(int8 and fp8 codes are exact in fp16, int4 values are code * s + m in fp16 arithmetic), q is
cast to fp16 and so are the (scaled) probabilities. Accumulation, softmax and the split merge
are float32.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kvpack.attention.kv_cache import LayerKVCache
from kvpack.formats import hadamard_block_size, hadamard_norm
from kvpack.kernels.rotate import _hadamard, rotate_heads
from kvpack.kernels.decode_plan import (  # noqa: F401 (re-exported: tests, benchmarks)
    FRAG_INT4_MIN_GROUP, FRAG_MIN_TOKENS, RING_MIN_TOKENS, VARIANTS, DecodePlan, _side_args, choose_merge,
    choose_num_splits, choose_ring_splits, choose_variant, e5m2_hw_decode, fallback_variant, hw_fp8_decode,
    int4_ring_default, merge_chunk,
    merge_counters, merge_warps, pdl_mode, SMALL_HEAD_MAXNREG, _sm_count,
)
from kvpack.kernels.quant import (
    INTERPRET, K_FMT_FLOAT, K_FMT_INT4, K_FMT_INT8, add_rn, cdiv, f32_to_bf16_rne, fp8_decode_f16, fp8_decode_f16_bits,
    int4_hi, int4_lo, int4_to_f16, int8_to_f16, next_pow2, prefetch_l2, probe_entry, probe_exit, probe_stamp, PROBE_SLOTS,
    Q_LO_STEPS, split_q_int8,
)

try:  # Triton's Gluon dialect (triton >= 3.5): the "frag" experiment only
    from kvpack.kernels.decode_frag import _frag_decode_kernel, _fragt_decode_kernel
except ImportError:  # pragma: no cover - an older Triton: "frag" falls back to "dot"
    _frag_decode_kernel = _fragt_decode_kernel = None

_LOG2E = 1.4426950408889634
# the Gluon kernels ("frag", "fragt") rotate q themselves (session 19); KVPACK_GLUON_ROT_Q=0 puts it back in
# `rotate_heads` before the launch (for measuring), read once at import
GLUON_ROT_Q = os.environ.get("KVPACK_GLUON_ROT_Q", "1") != "0"
# ... and "frag" with one split too (q @ R in the kernel, out @ R + V mean in the merge kernel: `plan_decode`;
# session 22, H200, per layer: fp8 at 64 x 2048 79.0 -> 75.8 us, 128 x 1024 84.8 -> 82.3-83.5, against
# `rotate_heads` before and after); KVPACK_FRAG_ROT_ONE_SPLIT=0 puts them back there (measuring), read at import
FRAG_ROT_ONE_SPLIT = os.environ.get("KVPACK_FRAG_ROT_ONE_SPLIT", "1") != "0"
# ... and with one split "frag" forms out @ R + V mean in its own epilogue, in the MMA accumulator layout
# (`decode_frag._frag_hadamard_mma`, session 35; the merge kernel's bits), instead of storing a partial for the
# merge kernel (H200, per layer, results/frag_epilogue_s35: fp8 at 64 x 2048 0.97x, at 128 x 1024 0.93-0.95x the
# time); KVPACK_FRAG_ROT_EPILOGUE=0 puts them back in the merge kernel (measuring), read at import
FRAG_ROT_EPILOGUE = os.environ.get("KVPACK_FRAG_ROT_EPILOGUE", "1") != "0"
# the Gluon kernels can take a batch whose every sequence has its query token (T == B: every decode step the engine
# plans) as a constant (ALL_Q): q's row is the sequence's and no "has a query" predicate is carried through the tile
# loop (session 35: with one split it took "frag"'s int8 loop from 1,358 to 1,437 sm_90 instructions). Planned for
# the variants listed: "fragt" (session 36, H200, per layer, side by side, results/merge_s36: int4 0.98-1.00x the
# time, 8-bit at head dim 64 0.98x int8 / 0.95x fp8_e4m3 at SmolLM2's 32 x 4096), "dot" and "imma" (`_decode_kernel`,
# whose q loads otherwise wait on the query_start_loc load; session 37, results/allq_s37: 0.97-1.00x, bf16 at
# 1 x 32768 0.99x, SmolLM2 int4 0.988x, 256 x 256 int8 ("imma") 0.99x, fp8_e5m2 0.97x; the other bf16 shapes
# 1.000x), not "frag" (0.99-1.03x: int8 1.00-1.01x, fp8_e4m3 0.99-1.00x, fp8_e5m2 at 128 x 1024 1.03x).
# KVPACK_DECODE_ALL_Q=0: none, "all": "frag" too (read at import)
_ALL_Q_ENV = os.environ.get("KVPACK_DECODE_ALL_Q", "").strip()
if _ALL_Q_ENV not in ("", "0", "all"):
    raise ValueError(f"KVPACK_DECODE_ALL_Q={_ALL_Q_ENV!r}: 0 (no kernel), all (every decode kernel), "
                     "or unset ('fragt', 'dot', 'imma')")
ALL_Q_VARIANTS = {"": ("fragt", "dot", "imma"), "0": (), "all": ("frag", "fragt", "dot", "imma")}[_ALL_Q_ENV]
# "fragt" on int4 K and V (groups of 32, 64 or 128, blocks >= 16 tokens, contiguous pools): whole tiles through a cp.async
# ring this many tiles ahead (`decode_frag._r4_issue`) instead of direct loads and an L2 prefetch. Session 25 built
# it; session 26 measured it on the H200 (results/int4_ring_s26, per layer, side by side): 0.55-0.65x bf16's time
# -> 0.41-0.56x, distance 2 no better than direct loads. KVPACK_INT4_RING unset: distance 1 where the device holds
# enough ring programs an SM (`decode_plan.int4_ring_default`), else direct loads; 0: direct loads; N: distance N.
_INT4_RING_ENV = os.environ.get("KVPACK_INT4_RING", "").strip()
if _INT4_RING_ENV and not (_INT4_RING_ENV.isdigit() and int(_INT4_RING_ENV) <= 2):
    raise ValueError(f"KVPACK_INT4_RING={_INT4_RING_ENV!r}: 0 (direct loads), 1 or 2 (the ring's distance in tiles), "
                     "or unset (1 where the GPU holds enough ring programs)")
INT4_RING: int | None = int(_INT4_RING_ENV) if _INT4_RING_ENV else None
# ... and a ptxas register cap for it (KVPACK_INT4_RING_MAXNREG; 0: none): fed from shared memory as it computes, its
# tile loop compiles for sm_90 with 128 registers (16 one-warp programs an SM by registers, 11 by shared memory)
# without spills (direct loads: 150-175 STL in the loop at 168 or 128), its masked last tile does spill
INT4_RING_MAXNREG = int(os.environ.get("KVPACK_INT4_RING_MAXNREG", "0"))
# ... converting V by token pairs (`decode_frag._v4_dequant_pairs`: sm_90 tile loop 1,652 -> 1,497 instructions);
# KVPACK_INT4_RING_VPAIRS=0: by channel pairs as the direct loads do (measuring)
INT4_RING_VPAIRS = os.environ.get("KVPACK_INT4_RING_VPAIRS", "1") != "0"
# "dot" splits 8-bit heads of 80 / 96 channels into 64 + 16 / 32 instead of padding them to 128 (`two_part_head`),
# and int4's nibble halves of 40 / 48 into 32 + a third tile (`int4_parts`); KVPACK_DECODE_TWO_PART=0: padded, for
# measuring
TWO_PART = os.environ.get("KVPACK_DECODE_TWO_PART", "1") != "0"
# "fragt" takes 8-bit K and V at head dim 64 too (session 33: `decode_frag`'s int4 layouts at head dim 128 hold a
# token's 64 code bytes), asked for or, with FRAGT_HEAD64_AUTO, by "auto" (H200, per layer, results/head64_s33: 0.64-0.99x
# the former "imma" / "dot" time at five SmolLM2 / Llama-3.2-1B shapes); KVPACK_FRAGT_HEAD64=0: the fallback there
FRAGT_HEAD64_AUTO = os.environ.get("KVPACK_FRAGT_HEAD64", "1") != "0"
# ... and int4 K and V at head dim 64 (session 41: `decode_frag.K4_LOAD64` / `V4_LOAD64`, a lane's 8 K bytes and 4 V bytes
# a token; "auto" takes "fragt" for int4 K and V at any head dim); KVPACK_FRAGT_HEAD64_INT4=0: "dot" there, as before
FRAGT_HEAD64_INT4 = os.environ.get("KVPACK_FRAGT_HEAD64_INT4", "1") != "0"
# ... in groups of 32 there, each token's two scales and two zero-points loaded as one 32-bit word each (`decode_frag`
# P_WORDS, `int4_words_ok`); KVPACK_FRAGT_HEAD64_INT4_WORDS=0: one 2-byte load a group (measuring)
FRAGT_HEAD64_INT4_WORDS = os.environ.get("KVPACK_FRAGT_HEAD64_INT4_WORDS", "1") != "0"
# ... with V converted by token pairs (V_PAIRS, session 42, `decode_frag._v4_dequant_pairs64`) where the grid runs under
# FRAGT_HEAD64_MAXNREG's cap (below: not thin). H200, per layer, side by side (results/int4_vpairs_s42/call1): SmolLM2
# 32 x 4096 18.50 -> 17.74 us, 8 x 8192 12.58 -> 12.23, Llama-3.2-1B 32 x 4096 39.45 -> 38.57, 8 x 8192 23.02 -> 22.67;
# on the uncapped thin grids 1.01x (SmolLM2 1 x 32768 12.51 -> 12.66, 1 x 8192 8.06 -> 8.16), so not there.
# KVPACK_FRAGT_HEAD64_INT4_VPAIRS=0: by channel pairs, then swapped into the MMA operand's token pairs (measuring)
FRAGT_HEAD64_INT4_VPAIRS = os.environ.get("KVPACK_FRAGT_HEAD64_INT4_VPAIRS", "1") != "0"
# ... and each int4 tile's own V rows asked into L2 as its K loads go out (V_PF0; ptxas issues V's loads after the
# scores' MMAs) where the plan takes no L2 prefetch of the next tile. H200, per layer, side by side (call1, call2):
# groups of 32 (with V_PAIRS) 0.96-0.98x (SmolLM2 32 x 4096 17.74 -> 17.45 us, Llama-3.2-1B 8 x 8192 22.67 -> 22.04),
# 16 and 64 0.96-0.99x; on top of the next tile's prefetch 1.08-1.30x, and for 8-bit codes 1.01-1.20x (call2: V's code
# and scale rows; call3: code rows only, 1.03-1.17x), so neither. KVPACK_FRAGT_HEAD64_VPF0=0 / 1: never / at every int4
# head-64 plan (measuring)
_VPF0_ENV = os.environ.get("KVPACK_FRAGT_HEAD64_VPF0", "auto").strip()
if _VPF0_ENV not in ("auto", "0", "1"):
    raise ValueError(f"KVPACK_FRAGT_HEAD64_VPF0={_VPF0_ENV!r}: auto, 0 or 1")
FRAGT_HEAD64_VPF0 = None if _VPF0_ENV == "auto" else _VPF0_ENV == "1"
# ... 8-bit codes at head dim 64 through a cp.async ring this many tiles ahead (RING8, session 42, `decode_frag._r4_issue`:
# int4's ring at head dim 128 copies the same 64-byte rows) instead of the L2 prefetch where the plan would take it (at
# most FRAGT_HEAD64_PREFETCH_PER_SM programs a multiprocessor) and no prefetch is asked for. H200, per layer, side by
# side (results/int4_vpairs_s42, calls 4-5), at nine SmolLM2 / Llama-3.2-1B grids of 1.5-7.8 programs an SM: int8
# 0.91-0.95x, int8-static 0.92-0.95x, fp8_e4m3 0.95-1.00x (Llama-3.2-1B 1 x 8192 1.004x), e.g. SmolLM2 1 x 32768 int8
# 11.98 -> 10.96 us; 2 tiles ahead 0.95-1.01x; on fuller grids (11.6-16 an SM: a program's 16.5 KB of shared memory
# holds 13 an SM) 1.06-1.26x. KVPACK_FRAGT_HEAD64_RING8=0: the direct loads everywhere
FRAGT_HEAD64_RING8 = int(os.environ.get("KVPACK_FRAGT_HEAD64_RING8", "1"))
# ... and without FRAGT_HEAD64_MAXNREG's cap (161 registers, no spills, against 63 spilled words a program at 128) where
# its grid has at most this many programs a multiprocessor. H200, per layer, side by side (results/int4_h64_s41/call6):
# SmolLM2 1 x 8192 / 1 x 32768 / 2 x 16384 / 4 x 8192 (1.5-5.8 programs an SM) 0.94-0.97x the capped time, Llama-3.2-1B
# 1 x 8192 (3.9) 1.008x; at 7.8 (Llama-3.2-1B 1 x 32768, 4 x 4096) 1.007x and 1.05x, so those keep the cap
FRAGT_HEAD64_INT4_UNCAPPED_PER_SM = 6
# ... int8 K there as fp16 through fp16 MMAs (`decode_frag` K8_F16) rather than int8 MMAs with q in two int8 parts, under
# a 128-register cap (0: none). Side by side (call3): int8 MMAs took 166 registers (a cap of 128 spilled: 0.99-1.16x);
# uncapped they were 2-8 % faster at SmolLM2's 3 kv heads and 7-10 % slower at Llama-3.2-1B's 8 (fewer programs an SM);
# fp16 K under the cap was the fastest there (int8 50.2 -> 47.8 us at 32 x 4096) and at most 1.09x the best elsewhere
FRAGT_HEAD64_K8_F16 = True
FRAGT_HEAD64_MAXNREG = 128
# ... and its splits keep >= 2 tiles (`choose_num_splits`' min_tiles; 4 elsewhere). H200, call3's h64_splits.json, the
# split counts this gives against 4 tiles' (SmolLM2 8 x 8192: 64 against 32, int8 16.54 -> 13.35 us, fp8_e4m3 15.45 ->
# 13.53; 32 x 4096: 22 against 16, int8 21.43 -> 20.82, fp8_e4m3 21.18 -> 21.66; Llama-3.2-1B 8 x 8192: 32 either way)
FRAGT_HEAD64_MIN_TILES = 2
# ... and its L2 prefetch distance in tiles (`decode_frag._fragt_tile8`'s L2PF; KVPACK_FRAGT_HEAD64_PREFETCH), taken where
# the grid has at most FRAGT_HEAD64_PREFETCH_PER_SM programs a multiprocessor (of the 16 one holds). H200, per layer,
# side by side (results/head64_s34), int8 / fp8_e4m3: 1.5-3.9 programs an SM (SmolLM2 1 x 8192, 4 x 4096, 1 x 32768;
# Llama-3.2-1B 1 x 8192) 0.76-0.86x the time without it (1 x 32768: 15.5 -> 11.8 us), 5.8-7.8 (SmolLM2 2 x 16384,
# 4 x 8192; Llama-3.2-1B 1 x 32768) 0.93-0.97x; 11.6-16 (8 x 8192, 32 x 4096) 1.04-1.16x; 2 tiles ahead slower
_PF_ENV = os.environ.get("KVPACK_FRAGT_HEAD64_PREFETCH", "1").strip()
if not (_PF_ENV.isdigit() and int(_PF_ENV) <= 4):
    raise ValueError(f"KVPACK_FRAGT_HEAD64_PREFETCH={_PF_ENV!r}: 0 (none) or 1-4 (the L2 prefetch distance in tiles)")
FRAGT_HEAD64_PREFETCH = int(_PF_ENV)
FRAGT_HEAD64_PREFETCH_PER_SM = 8
# ... and int4 there, with its group parameters as 2-byte values (groups of 16 or 64: not P_WORDS), also where a split
# has >= this many tokens. H200, per layer, side by side (session 41, results/int4_h64_s41): one tile ahead against
# none, groups of 32 loaded as 2-byte values (call1): Llama-3.2-1B (32 / 8 heads) 32 x 4096 (8 tiles a split, 15.5
# programs an SM) 41.3 -> 39.9 us, 8 x 8192 (4 tiles) 24.3 -> 23.5; SmolLM2 32 x 4096 (3 tiles, 16 an SM) 19.1 ->
# 19.7, 8 x 8192 (2 tiles) 12.9 -> 13.2; its 1 x 32768 (thin) 16.4 -> 13.8. With P_WORDS (call4) it pays only on the
# thin grid (1 x 32768 15.2 -> 13.2): Llama-3.2-1B 39.4 -> 40.1, 22.9 -> 23.5
FRAGT_HEAD64_INT4_PF_TOKENS = 256
# 8-bit V by token pairs in "frag" and "fragt" (V8_PAIRS, session 44, `decode_frag._v8_pairs`): each register of the
# MMA operand picked from the two tokens' loaded registers at once; int8 as subnormal fp16 (c + 128) * 2^-24 with the
# offset taken off once a program (sums of P on the tensor cores), FP8 (sm >= 89: `hw_fp8_decode`) by the conversion
# instruction. sm_90 SASS of the tile loops: "frag" int8 1,312 -> 1,131 instructions, its ring 1,359 -> 1,178,
# int8-static's ring 1,105 -> 949; "fragt" at head dim 64 int8 904 -> 833. H200, per layer, side by side
# (results/decode_s44, call 1): "frag" (Llama-3.1-8B's five shapes) int8 0.988-0.995x the time, int8-static
# 0.971-1.001x, fp8_e4m3 0.980-0.999x, fp8_e5m2 0.988-0.997x; "fragt" at SmolLM2's three shapes int8 0.974-0.993x,
# int8-static 0.973-0.991x, FP8 0.986-1.012x (so FP8 keeps the channel pairs there). The instructions saved buy
# little time: the loops wait on memory more than they issue. None (the default): int8 V in both kernels, FP8 in
# "frag"; KVPACK_V8_PAIRS=0 / 1: never / every 8-bit V both kernels take (measuring)
_V8P_ENV = os.environ.get("KVPACK_V8_PAIRS", "auto").strip()
if _V8P_ENV not in ("auto", "0", "1"):
    raise ValueError(f"KVPACK_V8_PAIRS={_V8P_ENV!r}: auto, 0 or 1")
V8_PAIRS = None if _V8P_ENV == "auto" else _V8P_ENV == "1"


def v8_pairs(variant: str, v_kind: str, hw_fp8: bool) -> bool:
    """Whether a "frag" / "fragt" plan converts its 8-bit V by token pairs (V8_PAIRS; FP8 only where the conversion
    instruction decodes it, `hw_fp8`)."""
    if variant not in ("frag", "fragt") or not (v_kind == "int8" or hw_fp8 and v_kind.startswith("fp8")):
        return False
    if V8_PAIRS is not None:
        return V8_PAIRS
    return v_kind == "int8" or variant == "frag"
FLOAT_PREFETCH_PER_SM = 4  # 16-bit caches at head dim <= 64: "dot"'s L2 prefetch up to this many programs an SM
INT4_FUSED_TILE = 64  # int4 K and V at head dims 65-128 with the fused merge (`default_tile`: 32)
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
               HALF_PAD: tl.constexpr, G: tl.constexpr, GPATH: tl.constexpr, BLOCK_N: tl.constexpr,
               FAST: tl.constexpr):
    """int4 tile as two fp16 halves [BLOCK_N, HALF_PAD]: channels j and j + D/2, code * s + m. GPATH: how the group
    parameters reach the halves, `decode_plan.int4_group_path` as its index in INT4_GROUP_PATHS (0 broadcast, 1
    chunks)."""
    HALF: tl.constexpr = D // 2
    j = tl.arange(0, HALF_PAD)
    ROWA: tl.constexpr = HALF & (0 - HALF)  # the code rows' alignment in bytes (`_side_args` checks the strides)
    if ROWA < 16:  # head dim 80's 40-byte rows: their token stride is not specialized (not a multiple of 16), and
        # without the shifts, which tell the compiler the alignment, they loaded byte by byte (a tl.multiple_of hint
        # did not reach the load); 8-byte loads now
        c_row = (c_row >> ROWA.bit_length() - 1) << ROWA.bit_length() - 1
    b = tl.load(codes_ptr + c_row[:, None] + j[None, :], mask=nmask[:, None] & (j < HALF)[None, :], other=0)
    if FAST:
        lo, hi = int4_to_f16(b)
    else:
        lo = int4_lo(b).to(tl.float16)
        hi = int4_hi(b).to(tl.float16)
    if GPATH == 0:  # D a power of two, each half whole groups or one group the whole head: broadcast group params
        NGH: tl.constexpr = (HALF + G - 1) // G  # groups per half (1 when one group covers the head)
        GH: tl.constexpr = HALF // NGH  # a group's channels within a half
        HI: tl.constexpr = HALF // G  # the high half's first group (0: the head's one group)
        gi = tl.arange(0, NGH)
        sp = scales_ptr + s_row[:, None] + gi[None, :]
        zp = zeros_ptr + s_row[:, None] + gi[None, :]
        m2 = nmask[:, None]
        s_lo = tl.load(sp, mask=m2, other=0.0)
        z_lo = tl.load(zp, mask=m2, other=0.0)
        if HI == 0:
            s_hi = s_lo
            z_hi = z_lo
        else:
            s_hi = tl.load(sp + HI, mask=m2, other=0.0)
            z_hi = tl.load(zp + HI, mask=m2, other=0.0)
        lo = tl.reshape(lo, (BLOCK_N, NGH, GH)) * s_lo[:, :, None] + z_lo[:, :, None]
        hi = tl.reshape(hi, (BLOCK_N, NGH, GH)) * s_hi[:, :, None] + z_hi[:, :, None]
        lo = tl.reshape(lo, (BLOCK_N, HALF_PAD))
        hi = tl.reshape(hi, (BLOCK_N, HALF_PAD))
    else:  # chunks: each half cut into chunks of C channels (the largest power of two dividing both the half and the
        # group), each inside one group, whose parameters load once a chunk and broadcast over it (head dim 80, groups
        # of 16: 8-channel chunks, 5 a half; head dim 96, groups of 32: 16-channel chunks, 3 a half). They had been
        # loaded per channel (head dim 80: 4.7x bf16's decode time, now ~1.07x; session 31), or selected per half
        # (head dim 96: 102 us a layer at 32 x 32 heads x 8 x 4096, the chunks with 64-token tiles 85)
        C: tl.constexpr = G if HALF % G == 0 else HALF & (0 - HALF)
        NCH: tl.constexpr = HALF_PAD // C
        k = tl.arange(0, NCH)
        cm = nmask[:, None] & (k * C < HALF)[None, :]
        g_lo = (k * C // G)[None, :]
        g_hi = ((k * C + HALF) // G)[None, :]
        s_lo = tl.load(scales_ptr + s_row[:, None] + g_lo, mask=cm, other=0.0)
        z_lo = tl.load(zeros_ptr + s_row[:, None] + g_lo, mask=cm, other=0.0)
        s_hi = tl.load(scales_ptr + s_row[:, None] + g_hi, mask=cm, other=0.0)
        z_hi = tl.load(zeros_ptr + s_row[:, None] + g_hi, mask=cm, other=0.0)
        lo = tl.reshape(lo, (BLOCK_N, NCH, C)) * s_lo[:, :, None] + z_lo[:, :, None]
        hi = tl.reshape(hi, (BLOCK_N, NCH, C)) * s_hi[:, :, None] + z_hi[:, :, None]
        lo = tl.reshape(lo, (BLOCK_N, HALF_PAD))
        hi = tl.reshape(hi, (BLOCK_N, HALF_PAD))
    return lo, hi


@triton.jit
def _load_int4_tail(codes_ptr, scales_ptr, zeros_ptr, c_row, s_row, nmask, D: tl.constexpr, HA: tl.constexpr,
                    P: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr, FAST: tl.constexpr):
    """The code bytes [HA, D / 2) of each row beyond `_load_int4`'s first HA (int4 in parts, `int4_parts`) as one
    fp16 tile [BLOCK_N, P], code * s + m: element 2 i holds channel HA + i (low nibble), 2 i + 1 channel D / 2 + HA +
    i (high nibble); past the row, 0. Group parameters per chunk, as `_load_int4`'s chunks."""
    HALF: tl.constexpr = D // 2
    RB: tl.constexpr = P // 2
    REST: tl.constexpr = HALF - HA
    ROWA: tl.constexpr = HALF & (0 - HALF)
    if ROWA < 16:
        c_row = (c_row >> ROWA.bit_length() - 1) << ROWA.bit_length() - 1
    jb = tl.arange(0, RB)
    b = tl.load(codes_ptr + c_row[:, None] + HA + jb[None, :], mask=nmask[:, None] & (jb < REST)[None, :], other=0)
    if FAST:
        lo, hi = int4_to_f16(b)
    else:
        lo = int4_lo(b).to(tl.float16)
        hi = int4_hi(b).to(tl.float16)
    C: tl.constexpr = G if HALF % G == 0 else HALF & (0 - HALF)
    NCB: tl.constexpr = RB // C
    k = tl.arange(0, NCB)
    cm = nmask[:, None] & (k * C < REST)[None, :]
    g_lo = ((HA + k * C) // G)[None, :]
    g_hi = ((HA + k * C + HALF) // G)[None, :]
    s_lo = tl.load(scales_ptr + s_row[:, None] + g_lo, mask=cm, other=0.0)
    z_lo = tl.load(zeros_ptr + s_row[:, None] + g_lo, mask=cm, other=0.0)
    s_hi = tl.load(scales_ptr + s_row[:, None] + g_hi, mask=cm, other=0.0)
    z_hi = tl.load(zeros_ptr + s_row[:, None] + g_hi, mask=cm, other=0.0)
    lo = tl.reshape(tl.reshape(lo, (BLOCK_N, NCB, C)) * s_lo[:, :, None] + z_lo[:, :, None], (BLOCK_N, RB))
    hi = tl.reshape(tl.reshape(hi, (BLOCK_N, NCB, C)) * s_hi[:, :, None] + z_hi[:, :, None], (BLOCK_N, RB))
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, P))


@triton.jit
def _dot(a, b, DT: tl.constexpr, acc=None):
    """a @ b (+ acc, accumulated by the MMA) with operands of dtype DT: fp32 operands use
    input_precision="ieee" (no TF32); the CPU interpreter multiplies bf16 as integers, so there
    bf16 operands are widened to fp32 (exact)."""
    if DT == tl.float32:
        out = tl.dot(a, b, acc, input_precision="ieee")
    elif _INTERPRET_C and DT == tl.bfloat16:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def _prefetch_side(c_ptr, s_ptr, z_ptr, c_row, s_row, FMT: tl.constexpr, STATIC: tl.constexpr,
                   D: tl.constexpr):
    """L2 prefetch of one side's rows: every 128-byte line of the codes, the scale (and zero) rows."""
    ROW: tl.constexpr = D // 2 if FMT == K_FMT_INT4 else D  # elements per code row
    LINE: tl.constexpr = 1024 // c_ptr.dtype.element_ty.primitive_bitwidth  # elements per 128 bytes
    LINES: tl.constexpr = triton.next_power_of_2(triton.cdiv(ROW, LINE))
    if LINES == 1:
        prefetch_l2(c_ptr + c_row)
    else:
        prefetch_l2(c_ptr + c_row[:, None] + tl.minimum(tl.arange(0, LINES) * LINE, ROW - 1)[None, :])
    if FMT != K_FMT_FLOAT and not STATIC:
        prefetch_l2(s_ptr + s_row)
        if FMT == K_FMT_INT4:
            prefetch_l2(z_ptr + s_row)


@triton.jit
def _attend_tile(
    n0, end, h, bt_row, q_a, q_b, qk_scale, m_i, l_i, acc_a, acc_b,
    q_c, acc_c,
    kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
    vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
    D: tl.constexpr, D_PAD: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, K_FMT: tl.constexpr, K_STATIC: tl.constexpr, K_G: tl.constexpr,
    K_GPATH: tl.constexpr, K_DT: tl.constexpr, V_FMT: tl.constexpr, V_STATIC: tl.constexpr,
    V_G: tl.constexpr, V_GPATH: tl.constexpr, V_FACTOR: tl.constexpr, V_DT: tl.constexpr,
    FAST: tl.constexpr, IDX64: tl.constexpr, MASKED: tl.constexpr,
    PREFETCH: tl.constexpr, QK8: tl.constexpr, q_s, D_B: tl.constexpr = 0, K4P: tl.constexpr = 0,
    V4P: tl.constexpr = 0,
):
    """One BLOCK_N-token tile: scores, online-softmax update, P @ V. Returns (m_i, l_i, acc_a, acc_b, acc_c).
    K4P / V4P > 0 (int4 in parts, `int4_parts`): q_a / q_b and acc_a / acc_b hold the halves' first HALF_PAD / 2
    channels, q_c and acc_c the rest of both halves as `_load_int4_tail` lays them out.
    QK8 ("imma"): q_a, q_b are q's int8 parts and q_s its per-row step times the softmax scale
    (`split_q_int8`); the int8 K tile feeds int8 MMAs. PREFETCH > 0: once this tile's
    K has arrived, ask L2 for the K and V rows (codes, scales, zeros) of the tile PREFETCH tiles
    ahead (clamped to the split's tokens), so that its loads wait on L2 rather than DRAM; a
    one-warp program issues its loads one tile at a time and otherwise waits for DRAM each tile."""
    offs = n0 + tl.arange(0, BLOCK_N)
    if MASKED:  # the split's last, partial tile
        nmask = offs < end
    else:  # a whole tile: no token masks on the loads and scores
        nmask = tl.full([BLOCK_N], 1, tl.int1)
    # offs >= 0: unsigned division and a mask (a signed // and % cost sign fix-ups per token)
    blk = tl.load(bt_row + (offs.to(tl.uint32) // BLOCK_SIZE).to(tl.int32), mask=nmask, other=0)
    if IDX64:
        blk = blk.to(tl.int64)
    off = offs & (BLOCK_SIZE - 1)
    if PREFETCH > 0:  # the block-table entries of the tile to prefetch (used once K has arrived)
        offs_pf = tl.minimum(offs + PREFETCH * BLOCK_N, end - 1)
        blk_pf = tl.load(bt_row + (offs_pf.to(tl.uint32) // BLOCK_SIZE).to(tl.int32))
        if IDX64:
            blk_pf = blk_pf.to(tl.int64)
        off_pf = offs_pf & (BLOCK_SIZE - 1)
    # ---- scores [GROUP_PAD, BLOCK_N] ----
    kc_row = blk * k_cs0 + h * k_cs1 + off * k_cs2
    ks_row = blk * k_ss0 + h * k_ss1 + off * k_ss2
    if K_FMT == K_FMT_INT4:
        KHP: tl.constexpr = HALF_PAD // 2 if K4P > 0 else HALF_PAD
        k_lo, k_hi = _load_int4(kc_ptr, ks_ptr, kz_ptr, kc_row, ks_row, nmask, D, KHP, K_G,
                                K_GPATH, BLOCK_N, FAST)
        s = _dot(q_a, tl.trans(k_lo.to(K_DT)), K_DT) + _dot(q_b, tl.trans(k_hi.to(K_DT)), K_DT)
        if K4P > 0:
            k_t = _load_int4_tail(kc_ptr, ks_ptr, kz_ptr, kc_row, ks_row, nmask, D, KHP, K4P, K_G, BLOCK_N, FAST)
            s += _dot(q_c, tl.trans(k_t.to(K_DT)), K_DT)
    elif QK8:  # int8 codes straight into an int8 MMA with q's two int8 parts (see `split_q_int8`)
        d = tl.arange(0, D_PAD)
        k8 = tl.load(kc_ptr + kc_row[:, None] + d[None, :], mask=nmask[:, None] & (d < D)[None, :], other=0)
        kt = tl.trans(k8)
        si = tl.dot(q_a, kt, out_dtype=tl.int32) * Q_LO_STEPS
        si = tl.dot(q_b, kt, si, out_dtype=tl.int32)
        s = si.to(tl.float32)  # times q_s (per row, with the softmax scale) in the softmax below
    elif D_B > 0:  # two parts: D_PAD / 2 channels, then D_B (their last D - D_PAD / 2 loaded)
        k_a = _load_raw(kc_ptr, kc_row, nmask, K_FMT, D_PAD // 2, D_PAD // 2, FAST)
        k_b = _load_raw(kc_ptr, kc_row + D_PAD // 2, nmask, K_FMT, D - D_PAD // 2, D_B, FAST)
        s = _dot(q_a, tl.trans(k_a), K_DT) + _dot(q_b, tl.trans(k_b), K_DT)
    else:
        k = _load_raw(kc_ptr, kc_row, nmask, K_FMT, D, D_PAD, FAST)
        s = _dot(q_a, tl.trans(k), K_DT)
    if QK8:  # the softmax scale is in q_s
        if not K_STATIC:
            s = s * tl.load(ks_ptr + ks_row, mask=nmask, other=0.0).to(tl.float32)[None, :]
    elif K_FMT != K_FMT_FLOAT and K_FMT != K_FMT_INT4 and not K_STATIC:
        # per-token K scales times the softmax scale: one multiply per score
        s = s * (tl.load(ks_ptr + ks_row, mask=nmask, other=0.0).to(tl.float32) * qk_scale)[None, :]
    else:
        s = s * qk_scale
    if MASKED:
        s = tl.where(nmask[None, :], s, -float("inf"))
    if PREFETCH > 0:
        _prefetch_side(kc_ptr, ks_ptr, kz_ptr, blk_pf * k_cs0 + h * k_cs1 + off_pf * k_cs2,
                       blk_pf * k_ss0 + h * k_ss1 + off_pf * k_ss2, K_FMT, K_STATIC, D)
        _prefetch_side(vc_ptr, vs_ptr, vz_ptr, blk_pf * v_cs0 + h * v_cs1 + off_pf * v_cs2,
                       blk_pf * v_ss0 + h * v_ss1 + off_pf * v_ss2, V_FMT, V_STATIC, D)
    vc_row = blk * v_cs0 + h * v_cs1 + off * v_cs2
    vs_row = blk * v_ss0 + h * v_ss1 + off * v_ss2
    VTOK: tl.constexpr = V_FMT != K_FMT_FLOAT and V_FMT != K_FMT_INT4 and not V_STATIC
    # ---- online softmax (base 2) ----
    if QK8:  # scores s * q_s: q_s > 0 scales the row maximum, and joins the exponent's subtraction
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * q_s)
        p = tl.exp2(s * q_s[:, None] - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    m_i = m_new
    # ---- P @ V ----
    if V_FMT == K_FMT_INT4:
        VHP: tl.constexpr = HALF_PAD // 2 if V4P > 0 else HALF_PAD
        v_lo, v_hi = _load_int4(vc_ptr, vs_ptr, vz_ptr, vc_row, vs_row, nmask, D, VHP, V_G,
                                V_GPATH, BLOCK_N, FAST)
        pd = p.to(V_DT)
        acc_a = acc_a * alpha[:, None] + _dot(pd, v_lo, V_DT)
        acc_b = acc_b * alpha[:, None] + _dot(pd, v_hi, V_DT)
        if V4P > 0:
            v_t = _load_int4_tail(vc_ptr, vs_ptr, vz_ptr, vc_row, vs_row, nmask, D, VHP, V4P, V_G, BLOCK_N, FAST)
            acc_c = acc_c * alpha[:, None] + _dot(pd, v_t, V_DT)
    else:
        if D_B > 0:
            v_a = _load_raw(vc_ptr, vc_row, nmask, V_FMT, D_PAD // 2, D_PAD // 2, FAST)
            v_b = _load_raw(vc_ptr, vc_row + D_PAD // 2, nmask, V_FMT, D - D_PAD // 2, D_B, FAST)
        else:
            v_a = _load_raw(vc_ptr, vc_row, nmask, V_FMT, D, D_PAD, FAST)
            v_b = v_a
        if VTOK:
            # fold the per-token V scale into p (normalised by the tile's largest scale, so fp16 p
            # keeps its range), and the tile scale into the [GROUP, D] product
            vs = tl.load(vs_ptr + vs_row, mask=nmask, other=0.0).to(tl.float32)
            vmax = tl.max(vs, axis=0)
            vmax = tl.where(vmax > 0, vmax, 1.0)
            pd = (p * (vs * (1.0 / vmax))[None, :]).to(V_DT)
            if D_B > 0:
                vf = vmax * V_FACTOR
                acc_a = acc_a * alpha[:, None] + _dot(pd, v_a, V_DT) * vf
                acc_b = acc_b * alpha[:, None] + _dot(pd, v_b, V_DT) * vf
            else:
                acc_a = acc_a * alpha[:, None] + _dot(pd, v_a, V_DT) * (vmax * V_FACTOR)
        else:
            pd = p.to(V_DT)
            acc_a = acc_a * alpha[:, None] + _dot(pd, v_a, V_DT)
            if D_B > 0:
                acc_b = acc_b * alpha[:, None] + _dot(pd, v_b, V_DT)
    return m_i, l_i, acc_a, acc_b, acc_c



@triton.jit
def _decode_kernel(
    q_ptr, sq_t, sq_h, qsl_ptr, seq_lens_ptr, bt_ptr, s_bt,
    kc_ptr, ks_ptr, kz_ptr, kst_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
    vc_ptr, vs_ptr, vz_ptr, vst_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
    out_ptr, so_t, so_h, po_ptr, pml_ptr, qk_scale, tokens_per_split,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    K_FMT: tl.constexpr, K_STATIC: tl.constexpr, K_G: tl.constexpr, K_GPATH: tl.constexpr,
    K_FACTOR: tl.constexpr, K_DT: tl.constexpr,
    V_FMT: tl.constexpr, V_STATIC: tl.constexpr, V_G: tl.constexpr, V_GPATH: tl.constexpr,
    V_FACTOR: tl.constexpr, V_DT: tl.constexpr, INTERPRET: tl.constexpr, FAST: tl.constexpr,
    IDX64: tl.constexpr = True, PREFETCH: tl.constexpr = 0,
    QK8: tl.constexpr = False, vmean_ptr=None, ROT_HB: tl.constexpr = 1, ROT_NORM: tl.constexpr = 1.0,
    ROT_Q: tl.constexpr = False, ROT_OUT: tl.constexpr = False, OUT_MEAN: tl.constexpr = False,
    cnt_ptr=None, MERGE_G: tl.constexpr = 1, MERGE_CH: tl.constexpr = 0, PDL: tl.constexpr = 0,
    times_ptr=None, D_B: tl.constexpr = 0, K4P: tl.constexpr = 0, V4P: tl.constexpr = 0, ALL_Q: tl.constexpr = False,
):
    if times_ptr is not None:  # the timeline probe (`quant.probe_stamp`)
        t_ptr = probe_entry(times_ptr)
    if PDL == 1:  # the separate merge may launch now (it waits for this grid before reading: `pdl_mode`)
        gdc_launch_dependents()
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    HALF: tl.constexpr = D // 2
    tl.static_assert(D_B == 0 or not (QK8 or K_FMT == K_FMT_INT4 or V_FMT == K_FMT_INT4), "two parts: no int4, imma")
    tl.static_assert(V4P == 0 or SPLIT or not (ROT_OUT or OUT_MEAN), "int4 in parts: rotated around the kernel")
    if ALL_Q:  # every sequence has its query token (`ALL_Q_VARIANTS`): q's row is b, no dependent load before q's
        q_row = b
        has_q = True
        seq_len = tl.load(seq_lens_ptr + b)
    else:
        q_row = tl.load(qsl_ptr + b)
        has_q = tl.load(qsl_ptr + b + 1) > q_row
        seq_len = tl.where(has_q, tl.load(seq_lens_ptr + b), 0)
    start = split * tokens_per_split
    end = tl.minimum(seq_len, start + tokens_per_split)

    g = tl.arange(0, GROUP_PAD)
    gm = g < GROUP
    heads = h * GROUP + g
    q_base = q_ptr + q_row.to(tl.int64) * sq_t + heads[:, None] * sq_h
    if K_FMT == K_FMT_INT4 and ROT_Q:  # D a power of two (the launcher's rule): rotate, then halves
        d = tl.arange(0, D)
        q_f = tl.load(q_base + d[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
        q_f = _hadamard(q_f, GROUP_PAD, D, ROT_HB, ROT_NORM)
        q_a, q_b = tl.split(tl.permute(tl.reshape(q_f, (GROUP_PAD, 2, HALF)), (0, 2, 1)))
        q_a = q_a.to(K_DT)
        q_b = q_b.to(K_DT)
    elif K_FMT == K_FMT_INT4:
        j = tl.arange(0, HALF_PAD // 2 if K4P > 0 else HALF_PAD)
        qm = gm[:, None] & (j < HALF)[None, :]
        q_a = tl.load(q_base + j[None, :], mask=qm, other=0.0).to(tl.float32).to(K_DT)
        q_b = tl.load(q_base + HALF + j[None, :], mask=qm, other=0.0).to(tl.float32).to(K_DT)
        if K4P > 0:  # the rest of both halves, as `_load_int4_tail` lays them out
            i = tl.arange(0, K4P)
            qc = HALF_PAD // 2 + i // 2 + (i % 2) * HALF
            qcm = gm[:, None] & (i // 2 < HALF - HALF_PAD // 2)[None, :]
            q_c = tl.load(q_base + qc[None, :], mask=qcm, other=0.0).to(tl.float32).to(K_DT)
    elif D_B > 0:  # two parts, channels [0, D_PAD / 2) and the next D_B (`two_part_head`)
        da = tl.arange(0, D_PAD // 2)
        db = tl.arange(0, D_B)
        q_a = tl.load(q_base + da[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
        q_b = tl.load(q_base + D_PAD // 2 + db[None, :], mask=gm[:, None] & (D_PAD // 2 + db < D)[None, :],
                      other=0.0).to(tl.float32)
        if ROT_Q:  # each part whole Hadamard blocks (`two_part_head`)
            q_a = _hadamard(q_a, GROUP_PAD, D_PAD // 2, ROT_HB, ROT_NORM)
            q_b = _hadamard(q_b, GROUP_PAD, D_B, ROT_HB, ROT_NORM)
        q_a = q_a.to(K_DT)
        q_b = q_b.to(K_DT)
    else:
        d = tl.arange(0, D_PAD)
        q_a = tl.load(q_base + d[None, :], mask=gm[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)
        if ROT_Q:  # q @ R (padding channels 0: whole Hadamard blocks of their own)
            q_a = _hadamard(q_a, GROUP_PAD, D_PAD, ROT_HB, ROT_NORM)
        if QK8:
            q_a, q_b, q_s = split_q_int8(q_a)
            q_s = q_s * (qk_scale * K_FACTOR * (tl.load(kst_ptr + h) if K_STATIC else 1.0))
        else:
            q_a = q_a.to(K_DT)
            q_b = q_a
    if not QK8:
        q_s = qk_scale  # unused
    if K4P == 0:
        q_c = q_a  # unused
    if K_STATIC:
        qk_scale = qk_scale * tl.load(kst_ptr + h)
    qk_scale = qk_scale * K_FACTOR

    m_i = tl.full([GROUP_PAD], -float("inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    if V_FMT == K_FMT_INT4:
        acc_a = tl.zeros([GROUP_PAD, HALF_PAD // 2 if V4P > 0 else HALF_PAD], tl.float32)
        acc_b = tl.zeros([GROUP_PAD, HALF_PAD // 2 if V4P > 0 else HALF_PAD], tl.float32)
    elif D_B > 0:
        acc_a = tl.zeros([GROUP_PAD, D_PAD // 2], tl.float32)
        acc_b = tl.zeros([GROUP_PAD, D_B], tl.float32)
    else:
        acc_a = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
        acc_b = acc_a

    if V4P > 0:
        acc_c = tl.zeros([GROUP_PAD, V4P], tl.float32)
    else:
        acc_c = acc_a  # unused
    bt_row = bt_ptr + b.to(tl.int64) * s_bt
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    if times_ptr is not None:
        probe_stamp(t_ptr + 1, 0)
    for phase in tl.static_range(2):  # 0: whole tiles, unmasked; 1: the last, partial tile (if any)
        lo = start + (full_end - start) * phase
        hi = full_end + (end - full_end) * phase
        if INTERPRET:  # the CPU interpreter cannot run `range` over tensor bounds (numpy >= 2.4)
            n0 = lo
            while n0 < hi:
                m_i, l_i, acc_a, acc_b, acc_c = _attend_tile(
                    n0, end, h, bt_row, q_a, q_b, qk_scale, m_i, l_i, acc_a, acc_b, q_c, acc_c,
                    kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                    vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                    D, D_PAD, HALF_PAD, BLOCK_SIZE, BLOCK_N,
                    K_FMT, K_STATIC, K_G, K_GPATH, K_DT, V_FMT, V_STATIC, V_G, V_GPATH, V_FACTOR, V_DT, FAST,
                    IDX64, phase == 1, PREFETCH, QK8, q_s, D_B, K4P, V4P)
                n0 += BLOCK_N
        else:
            for n0 in range(lo, hi, BLOCK_N):
                m_i, l_i, acc_a, acc_b, acc_c = _attend_tile(
                    n0, end, h, bt_row, q_a, q_b, qk_scale, m_i, l_i, acc_a, acc_b, q_c, acc_c,
                    kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                    vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                    D, D_PAD, HALF_PAD, BLOCK_SIZE, BLOCK_N,
                    K_FMT, K_STATIC, K_G, K_GPATH, K_DT, V_FMT, V_STATIC, V_G, V_GPATH, V_FACTOR, V_DT, FAST,
                    IDX64, phase == 1, PREFETCH, QK8, q_s, D_B, K4P, V4P)
    if V_STATIC:
        v_scale = tl.load(vst_ptr + h) * V_FACTOR
        acc_a = acc_a * v_scale
        acc_b = acc_b * v_scale

    if times_ptr is not None:
        probe_stamp(t_ptr + 3, 0)
    if PDL == 2:  # the tiles are done: the separate merge may launch
        gdc_launch_dependents()
    if V_FMT == K_FMT_INT4:
        c = tl.arange(0, HALF_PAD // 2 if V4P > 0 else HALF_PAD)
        cm = gm[:, None] & (c < HALF)[None, :]
        B_OFF: tl.constexpr = HALF  # acc_b's first channel
        cb = c
        cbm = cm
    elif D_B > 0:
        c = tl.arange(0, D_PAD // 2)
        cm = gm[:, None] & (c < D)[None, :]
        B_OFF: tl.constexpr = D_PAD // 2
        cb = tl.arange(0, D_B)
        cbm = gm[:, None] & (D_PAD // 2 + cb < D)[None, :]
    else:
        c = tl.arange(0, D_PAD)
        cm = gm[:, None] & (c < D)[None, :]
    if V4P > 0:  # acc_c's channels (`_load_int4_tail`'s layout)
        i4 = tl.arange(0, V4P)
        vc = HALF_PAD // 2 + i4 // 2 + (i4 % 2) * HALF
        vcm = gm[:, None] & (i4 // 2 < HALF - HALF_PAD // 2)[None, :]
    l_safe = tl.where(l_i > 0, l_i, 1.0)[:, None]
    if not SPLIT and (ROT_OUT or OUT_MEAN):  # out @ R + V mean on whole rows (int4: D a power of two)
        if V_FMT == K_FMT_INT4:
            o = tl.reshape(tl.permute(tl.join(acc_a / l_safe, acc_b / l_safe), (0, 2, 1)), (GROUP_PAD, D_PAD))
            c = tl.arange(0, D_PAD)
            _store_out(o, out_ptr, q_row, so_t, so_h, heads, c, gm & has_q, vmean_ptr, h,
                       D, GROUP_PAD, D_PAD, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN)
        elif D_B > 0:  # each part whole Hadamard blocks
            _store_out(acc_a / l_safe, out_ptr, q_row, so_t, so_h, heads, c, gm & has_q, vmean_ptr, h,
                       D, GROUP_PAD, D_PAD // 2, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN)
            _store_out(acc_b / l_safe, out_ptr, q_row, so_t, so_h, heads, B_OFF + cb, gm & has_q, vmean_ptr, h,
                       D, GROUP_PAD, D_B, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN)
        else:
            _store_out(acc_a / l_safe, out_ptr, q_row, so_t, so_h, heads, c, gm & has_q, vmean_ptr, h,
                       D, GROUP_PAD, D_PAD, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN)
    elif not SPLIT:
        o_ptr = out_ptr + q_row.to(tl.int64) * so_t + heads[:, None] * so_h + c[None, :]
        cm = cm & has_q
        tl.store(o_ptr, (acc_a / l_safe).to(out_ptr.dtype.element_ty), mask=cm)
        if V_FMT == K_FMT_INT4 or D_B > 0:
            ob_ptr = out_ptr + q_row.to(tl.int64) * so_t + heads[:, None] * so_h + B_OFF + cb[None, :]
            tl.store(ob_ptr, (acc_b / l_safe).to(out_ptr.dtype.element_ty), mask=cbm & has_q)
        if V4P > 0:
            oc_ptr = out_ptr + q_row.to(tl.int64) * so_t + heads[:, None] * so_h + vc[None, :]
            tl.store(oc_ptr, (acc_c / l_safe).to(out_ptr.dtype.element_ty), mask=vcm & has_q)
    else:
        # partials: po [B, Hq, num_splits, D] fp32, pml [B, Hq, num_splits, 2] fp32
        ph = (b * (GROUP * tl.num_programs(1)) + heads).to(tl.int64) * tl.num_programs(2) + split
        p_ptr = po_ptr + ph[:, None] * D + c[None, :]
        tl.store(p_ptr, acc_a, mask=cm)
        if V_FMT == K_FMT_INT4 or D_B > 0:
            tl.store(po_ptr + ph[:, None] * D + B_OFF + cb[None, :], acc_b, mask=cbm)
        if V4P > 0:
            tl.store(po_ptr + ph[:, None] * D + vc[None, :], acc_c, mask=vcm)
        tl.store(pml_ptr + ph * 2, m_i, mask=gm)
        tl.store(pml_ptr + ph * 2 + 1, l_i, mask=gm)
        if MERGE_CH > 0:  # the split merge fused: the last of this (sequence, kv head)'s programs merges
            _merge_last(po_ptr, pml_ptr, cnt_ptr, out_ptr, so_t, so_h, q_row, has_q, b, h, vmean_ptr,
                        GROUP, MERGE_G, MERGE_CH, D, D_PAD, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN)
    if times_ptr is not None:
        probe_exit(t_ptr)


@triton.jit
def _store_out(o, out_ptr, q_row, so_t, so_h, heads, c, rmask, vmean_ptr, hkv, D: tl.constexpr,
               ROWS: tl.constexpr, DP: tl.constexpr, ROT_HB: tl.constexpr, ROT_NORM: tl.constexpr,
               ROT_OUT: tl.constexpr, OUT_MEAN: tl.constexpr):
    """Store rows o [ROWS, DP] float32 of query heads `heads` (kv head(s) `hkv`) as o @ R (ROT_OUT)
    + the V mean [Hkv, D] (OUT_MEAN), in out's dtype: `rotate_heads`' operations, bf16 rounded to
    nearest even on the interpreter too."""
    if ROT_OUT:
        o = _hadamard(o, ROWS, DP, ROT_HB, ROT_NORM)
    cm = rmask[:, None] & (c < D)[None, :]
    if OUT_MEAN:
        o = add_rn(o, tl.load(vmean_ptr + hkv * D + c[None, :], mask=cm, other=0.0))
    o_ptr = out_ptr + q_row.to(tl.int64) * so_t + heads[:, None] * so_h + c[None, :]
    if out_ptr.dtype.element_ty == tl.bfloat16:
        tl.store(o_ptr, f32_to_bf16_rne(o), mask=cm)
    else:
        tl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=cm)


@triton.jit
def _merge_last(po_ptr, pml_ptr, cnt_ptr, out_ptr, so_t, so_h, q_row, has_q, b, h, vmean_ptr,
                GROUP: tl.constexpr, MG: tl.constexpr, CH: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                ROT_HB: tl.constexpr, ROT_NORM: tl.constexpr, ROT_OUT: tl.constexpr, OUT_MEAN: tl.constexpr):
    """The split merge in the decode kernel's epilogue, after this program stored its partials: a
    counter per (sequence, kv head) (`decode_plan.merge_counters`, zero between launches) counts the
    finished splits; the program that finishes last merges the GROUP heads' partials, CH splits at a
    time (an online rescale across chunks), writes the output (`_store_out`: out @ R, + V mean) and
    puts the counter back to 0 (no memset between launches, none in a CUDA graph). The atomic add
    is acq_rel at GPU scope behind a barrier: it releases all of this program's partial stores and
    acquires the other programs'; the partials are read through L2 (.cg)."""
    n_splits = tl.num_programs(2)
    cnt = cnt_ptr + b * tl.num_programs(1) + h
    tl.debug_barrier()  # every lane's partial stores before the (one lane's) releasing atomic
    if tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == n_splits - 1:
        tl.store(cnt, 0)
        g = tl.arange(0, MG)
        gm = g < GROUP
        sp = tl.arange(0, CH)
        d = tl.arange(0, D_PAD)
        base = (b * (GROUP * tl.num_programs(1)) + h * GROUP + g).to(tl.int64) * n_splits
        m_run = tl.full([MG], -float("inf"), tl.float32)
        l_run = tl.zeros([MG], tl.float32)
        o = tl.zeros([MG, D_PAD], tl.float32)
        s0 = n_splits * 0
        while s0 < n_splits:  # (a while loop: the interpreter's range cannot take tensor bounds)
            sm = gm[:, None] & ((s0 + sp) < n_splits)[None, :]
            ph = base[:, None] + s0 + sp[None, :]
            m = tl.load(pml_ptr + ph * 2, mask=sm, other=-float("inf"), cache_modifier=".cg")
            l = tl.load(pml_ptr + ph * 2 + 1, mask=sm, other=0.0, cache_modifier=".cg")
            a = tl.load(po_ptr + ph[:, :, None] * D + d[None, None, :],
                        mask=sm[:, :, None] & (d < D)[None, None, :], other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m_run, tl.max(m, axis=1))
            m_ref = tl.where(m_new > -float("inf"), m_new, 0.0)  # rows without tokens so far: weights 0
            alpha = tl.exp2(m_run - m_ref)
            w = tl.exp2(m - m_ref[:, None])
            l_run = l_run * alpha + tl.sum(w * l, axis=1)
            o = o * alpha[:, None] + tl.sum(a * w[:, :, None], axis=1)
            m_run = m_new
            s0 += CH
        o = o / tl.where(l_run > 0, l_run, 1.0)[:, None]
        _store_out(o, out_ptr, q_row, so_t, so_h, h * GROUP + g, d, gm & has_q, vmean_ptr, h,
                   D, MG, D_PAD, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN)


@triton.jit
def _merge_kernel(po_ptr, pml_ptr, out_ptr, so_t, so_h, qsl_ptr, HQ, num_splits,
                  SPLITS_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                  vmean_ptr=None, GROUP: tl.constexpr = 1, ROT_HB: tl.constexpr = 1,
                  ROT_NORM: tl.constexpr = 1.0, ROT_OUT: tl.constexpr = False, OUT_MEAN: tl.constexpr = False,
                  PDL: tl.constexpr = False, times_ptr=None):
    b = tl.program_id(0)
    hq = tl.program_id(1)
    if times_ptr is not None:  # the timeline probe: 0 entry, 1 past the wait, 4 exit, 7 %smid
        t_ptr = times_ptr + (b * tl.num_programs(1) + hq).to(tl.int64) * PROBE_SLOTS
        probe_stamp(t_ptr, 0)
        probe_stamp(t_ptr + 7, 2)
    q_row = tl.load(qsl_ptr + b)
    has_q = tl.load(qsl_ptr + b + 1) > q_row
    if PDL:  # launched as a dependent of the decode kernel: its partials are complete past this point
        gdc_wait()
    if times_ptr is not None:
        probe_stamp(t_ptr + 1, 0)
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
    if ROT_OUT or OUT_MEAN:  # out @ R + V mean here: one row [1, D_PAD]
        one = tl.zeros([1], tl.int32)
        _store_out(tl.reshape(o, (1, D_PAD)), out_ptr, q_row, so_t, so_h, hq + one, d, has_q & (one == 0),
                   vmean_ptr, hq // GROUP, D, 1, D_PAD, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN)
    else:
        tl.store(out_ptr + q_row.to(tl.int64) * so_t + hq * so_h + d, o.to(out_ptr.dtype.element_ty),
                 mask=(d < D) & has_q)
    if times_ptr is not None:
        probe_stamp(t_ptr + 4, 0)


# ---- launch plan and launcher ----------------------------------------------------------------
def _needs_idx64(*pools) -> bool:
    """Whether an element offset into a pool tensor (from its strides: views included) can reach
    2**31; then the kernel indexes in int64, else in int32 (fewer instructions per token)."""
    def max_offset(t):
        return sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) if t.numel() else 0

    return any(t is not None and max_offset(t) >= 2**31 - 1 for p in pools for t in (p.codes, p.scales, p.zeros))


def default_prefetch(kp, vp, head_dim: int, programs: int, sms: int) -> int:
    """L2 prefetch distance in tiles (`_attend_tile`) of "dot" for a grid of `programs` on `sms` multiprocessors,
    measured on an H200. int4 K and V: one tile ahead, at head dims 65-128 3-7 % faster (results/attention_tune_s5),
    at 64 0.79-0.99x the time at every SmolLM2 / Llama-3.2-1B shape measured (session 34, results/head64_s34, per
    layer: SmolLM2 1 x 32768 20.6 -> 16.3 us, 32 x 4096 22.0 -> 21.7). 16-bit K and V at head dim <= 64: one tile ahead
    where the grid has <= FLOAT_PREFETCH_PER_SM programs a multiprocessor (0.93-0.95x at 2-3 an SM, SmolLM2 1 x 8192,
    4 x 4096, 1 x 32768; level at 5.8, 1.03-1.08x from 7.8 up). int8 and fp8_e4m3 ran 3-11 % slower with it at 128
    (their tile math, not DRAM latency, is the bound), so they and the unmeasured cases keep none ("fragt" at head
    dim 64 has its own rule: `FRAGT_HEAD64_PREFETCH_PER_SM`)."""
    if kp.fmt.kind == vp.fmt.kind == "int4" and 64 <= head_dim <= 128:
        return 1
    if (kp.fmt.kind == vp.fmt.kind == "float" and torch.float32 not in (kp.codes.dtype, vp.codes.dtype)
            and head_dim <= 64 and programs <= FLOAT_PREFETCH_PER_SM * sms):
        return 1
    return 0


def default_tile(kp, vp, head_dim: int) -> tuple[int, int, int]:
    """(block_n, num_warps, num_stages) of the "dot" variant, measured on an H200
    (benchmarks/bench_attention.py --tune; results/attention_tune_s4). Head dims up to 128 run one
    warp per program: its softmax row reductions stay inside the warp, where four warps paid
    shared-memory round trips and barriers on every tile; quantized sides take 64-token tiles
    without shared-memory pipelining (codes load straight into registers; 0.60-0.90x the time of
    the four-warp configuration; head_dim 64: 32-token tiles), 16-bit sides 32-token tiles with two
    stages (0.95-0.98x).
    Head dim 256 and float32 caches (register-heavy tiles) keep four warps and 64-token tiles.
    int4 K and V at head dims 65-128 (session 10, results/attention_s10; head dims 80 and 96 take 64 since session 31,
    results/head_dims_s31): the 64-token one-warp tile
    spilled (61 local stores, 58 loads in its sm_90 SASS; 32 tokens: none) and 32-token tiles ran 3-6 %
    faster (1 x 32768 36.0 -> 33.7 us, 8 x 8192 55.3 -> 53.6, 128 x 1024 97.4 -> 94.4), except with the
    fused merge (2-4 splits: 32 x 4096 91.8 -> 95.3, 64 x 2048 91.9 -> 94.9), where `plan_decode` keeps 64."""
    if head_dim > 128 or torch.float32 in (kp.codes.dtype, vp.codes.dtype):
        return 64 if head_dim > 128 else 128, 4, 2
    if "float" == kp.fmt.kind == vp.fmt.kind:
        return 32, 1, 2
    if head_dim <= 64:  # fp8's longer decode (bit moves) keeps two stages there: 38.7 against 48.4 us
        fp8 = kp.fmt.kind.startswith("fp8") or vp.fmt.kind.startswith("fp8")
        return 32, 1, 2 if fp8 else 1
    if kp.fmt.kind == vp.fmt.kind == "int4":  # session 10: int4's 64-token tile spills (sm_90: 61 STL)
        # (`plan_decode` takes INT4_FUSED_TILE where the merge is fused); head dims 80 and 96 (session 31, 32 x 32
        # heads, 1 x 32768, per layer): 64-token tiles, 106.9 -> 94.2 us (80) and 110.5 -> 102.2 (96)
        return (32 if head_dim == next_pow2(head_dim) else 64), 1, 1
    return 64, 1, 1


def two_part_head(variant: str, kp, vp) -> int:
    """The width of the second part where "dot" splits a head dim that is not a power of two in two (the kernel's
    D_B: channels [0, D_PAD / 2), then D_B more, D_B the next power of two >= D - D_PAD / 2, at least 16), else 0:
    8-bit codes on one side at least, neither int4, K through fp16 dots (not "imma"), each part whole Hadamard
    blocks where a side rotates (80 = 64 + 16, blocks of 16; 96 = 64 + 32, blocks of 32). A head of 80 padded to
    128 had spent 128 channels' work on each token: int8 and FP8 decoded 32 x 32 heads x 8 x 4096 in about the same
    time at head dims 80 and 96 (78.7-95.5 us a layer; bf16 88.6 / 114.7, session 31). 16-bit caches only where the
    second part is >= 32 wide (head dim 96; H200, bf16, per layer, side by side: 8 x 4096 114.4 -> 104.3 us, 32 x
    2048 215.8 -> 199.8; at 80 a 16-wide part was 2.5 % faster at 8 x 4096 and 6.7 % slower at 32 x 2048, session 32,
    results/prefill_heads_s32)."""
    d = kp.fmt.head_dim
    d_pad = next_pow2(d)
    if (variant != "dot" or d == d_pad or "int4" in (kp.fmt.kind, vp.fmt.kind)
            or kp.fmt.kind == vp.fmt.kind == "float" and d - d_pad // 2 < 32
            or (kp.fmt.rotate or vp.fmt.rotate) and (d - d_pad // 2) % hadamard_block_size(d)):
        return 0
    return max(16, next_pow2(d - d_pad // 2))


def int4_parts(fmt) -> int:
    """int4 at head dims whose half is not a power of two (80: 40, 96: 48): the width of the kernel's third tile
    (K4P / V4P; `_load_int4_tail`), else 0. The halves' first HALF_PAD / 2 channels load as before and the rest of
    both halves as one tile, low and high nibbles interleaved, padded to a power of two: 40 = 32 + 8 (16 a tile),
    48 = 32 + 16 (32), instead of each half padded to 64. H200, 32 q / 32 kv heads, per layer, side by side with the
    halves padded (session 32, results/int4_parts_s32): head dim 80 8 x 4096 94.3 -> 78.0 us (1.08x -> 0.89x bf16),
    1 x 32768 94.4 -> 77.6; 96: 85.4 -> 79.1 (0.73x -> 0.68x), 87.3 -> 78.2. KVPACK_DECODE_TWO_PART=0 pads them."""
    if fmt.kind != "int4":
        return 0
    half = fmt.head_dim // 2
    half_pad = next_pow2(half)
    if half == half_pad:
        return 0
    return 2 * next_pow2(half - half_pad // 2)


def int4_ring_ok(kp, vp) -> bool:
    """Whether "fragt"'s int4 ring (`decode_frag._r4_issue`) can copy these pools: int4 K and V in the same groups
    of 32, 64 or 128 channels (4, 2, 1 parameters a token), blocks of >= 16 tokens, and each block's code rows and
    parameter rows adjacent (a token pair's 128 code bytes, an 8-token group's parameters: 16-byte copies)."""
    if kp.fmt.kind != "int4" or vp.fmt.kind != "int4" or kp.fmt.group_size != vp.fmt.group_size:
        return False
    for p in (kp, vp):
        if p.fmt.group_size not in (32, 64, 128) or p.block_size < 16 or p.fmt.head_dim != 128:
            return False
        if (p.codes.stride()[2:] != (64, 1) or p.scales.stride()[2:] != (p.fmt.num_groups, 1)
                or p.zeros.stride() != p.scales.stride()):
            return False
    return True


def ring8_ok(kp, vp) -> bool:
    """Whether "fragt"'s ring (`decode_frag._r4_issue`, RING8) can copy 8-bit K and V at head dim 64: blocks of >= 16
    tokens, each block's 64-byte code rows adjacent (a token pair's 128 bytes) and its per-token scales adjacent (an
    8-token group's 16 bytes), and 16-byte aligned bases."""
    for p in (kp, vp):
        if p.fmt.kind not in ("int8", "fp8_e4m3", "fp8_e5m2") or p.fmt.head_dim != 64 or p.block_size < 16:
            return False
        if p.codes.stride()[2:] != (64, 1) or p.codes.data_ptr() % 16 or any(st % 16 for st in p.codes.stride()[:2]):
            return False
        if p.scales is not None and (p.scales.stride()[2:] != (1, 1) or p.scales.data_ptr() % 16
                                     or any(st % 8 for st in p.scales.stride()[:2])):
            return False
    return True


def int4_words_ok(kp, vp) -> bool:
    """Whether "fragt" at head dim 64 can load int4 K and V's group parameters as words (P_WORDS): groups of 32 on
    both sides (a token's two), and every token's scale / zero-point pair 4-byte aligned (even strides, an aligned
    base, adjacent groups)."""
    for p in (kp, vp):
        if p.fmt.kind != "int4" or p.fmt.head_dim != 64 or p.fmt.group_size != 32:
            return False
        for t in (p.scales, p.zeros):
            if t.stride(-1) != 1 or any(st % 2 for st in t.stride()[:-1]) or t.data_ptr() % 4:
                return False
    return True


def plan_decode(q, layer_cache: LayerKVCache, metadata, scale: float, num_splits: int | None = None,
                block_n: int | None = None, num_warps: int | None = None,
                num_stages: int | None = None, fast_cvt: bool = True, variant: str | None = None,
                maxnreg: int | None = None, index64: bool | None = None, prefetch: int | None = None,
                merge: str | None = None, ring4: int | None = None) -> DecodePlan:
    """Shapes, heuristics and argument lists for `decode_paged_attention` (no launch). ring4: "fragt"'s int4
    cp.async ring distance (default `INT4_RING`, else 1 where `int4_ring_default`; only where `int4_ring_ok`)."""
    kp, vp = layer_cache.k, layer_cache.v
    T, Hq, D = q.shape
    Hkv, block_size = kp.num_kv_heads, kp.block_size
    assert Hq % Hkv == 0 and kp.fmt.head_dim == D and vp.fmt.head_dim == D, (q.shape, kp.fmt, vp.fmt)
    assert vp.block_size == block_size and vp.num_kv_heads == Hkv
    assert block_size & (block_size - 1) == 0, f"block size {block_size} is not a power of two"
    B = metadata.num_seqs
    group = Hq // Hkv
    dev = q.device
    asked = variant or os.environ.get("KVPACK_DECODE_VARIANT", "") or "auto"
    variant = choose_variant(kp.fmt.kind, vp.fmt.kind, variant)

    int4 = "int4" in (kp.fmt.kind, vp.fmt.kind)
    # int4 in "frag": groups of >= 16 channels; not with int8 K (its int8 MMAs and int4 V spill: sm_90 SASS
    # 96 LDL / 128 STL a program, never run on a GPU)
    int4_out = int4 and (min(kp.fmt.group_size, vp.fmt.group_size) < FRAG_INT4_MIN_GROUP or kp.fmt.kind == "int8")
    # head dim 64: "fragt" on 8-bit codes (asked for, or "auto" with FRAGT_HEAD64_AUTO) and on int4 K and V (asked
    # for or "auto", with FRAGT_HEAD64_INT4), groups <= 8
    head64 = D == 64 and group <= 8 and (
        not int4 and (variant == "fragt" or variant == "frag?" and FRAGT_HEAD64_AUTO)
        or kp.fmt.kind == vp.fmt.kind == "int4" and variant == "fragt" and FRAGT_HEAD64_INT4)
    if head64:
        variant = "fragt"
    # int4 there in groups of 32: a token's group parameters as words (P_WORDS)
    words = head64 and int4 and FRAGT_HEAD64_INT4_WORDS and int4_words_ok(kp, vp)
    if variant in ("frag", "frag?", "fragt") and (INTERPRET or _frag_decode_kernel is None or (D != 128 and not head64)
                                                    or group > (8 if variant == "fragt" else 16)
                                                    or block_size < 8 or int4_out):
        variant = fallback_variant(kp.fmt.kind)  # outside decode_frag's scope (Gluon has no CPU interpreter)
    # "frag" copies whole tiles a tile ahead through a cp.async ring where its grid stays small
    # (`choose_ring_splits`; blocks >= 16 tokens: the scale copies need 4-byte alignment; 8-bit codes only)
    ring_splits = None
    if variant in ("frag", "frag?") and prefetch is None and block_size >= 16 and not int4:
        ring_splits = choose_ring_splits(B, Hkv, metadata.max_seq_len, dev)

    def split_len(splits: int) -> int:
        return cdiv(cdiv(max(metadata.max_seq_len, 1), splits), 64) * 64

    if variant == "frag?":  # "auto" on 8-bit K and V: "frag" with >= FRAG_MIN_TOKENS tokens per program
        # (RING_MIN_TOKENS with the ring)
        if num_splits is None and ring_splits and split_len(ring_splits) < RING_MIN_TOKENS:
            ring_splits = None  # the ring's splits are short: the plain kernel's rule decides
        splits = num_splits or ring_splits or choose_num_splits(B, Hkv, metadata.max_seq_len, 64, dev, 1, D)
        least = RING_MIN_TOKENS if ring_splits and splits == ring_splits else FRAG_MIN_TOKENS
        variant = "frag" if split_len(splits) >= least else fallback_variant(kp.fmt.kind)
    if variant == "imma" and asked == "auto" and TWO_PART and two_part_head("dot", kp, vp):
        # head dims 80 / 96: "dot" with the head in two parts beats "imma" padded to 128 (session 31, H200, 32 x 32
        # heads, per layer: int8 78.7 -> 63.1 us at head dim 80, 80.6 -> 69.4 at 96; int8-static 74.4 -> 58.0)
        variant = "dot"
    asked_prefetch = prefetch
    ring8 = 0
    if variant in ("frag", "fragt"):  # one warp, 64-token tiles, codes in registers (the layouts are fixed)
        block_n, num_warps, num_stages = 64, 1, 1
        if num_splits is None:
            num_splits = ring_splits or choose_num_splits(B, Hkv, metadata.max_seq_len, block_n, dev, num_warps, D,
                                                          min_tiles=FRAGT_HEAD64_MIN_TILES if head64 else 4)
        if prefetch is None:  # int4: an L2 prefetch distance (no ring), as "dot" prefetches int4
            prefetch = 1 if ring_splits or int4 else 0
        elif block_size < 16 and not int4:  # the ring's scale copies need 4-byte alignment
            prefetch = 0
        if variant == "fragt" and (not int4 or head64):  # 8-bit codes transposed, and int4 at head dim 64: direct
            prefetch = asked_prefetch  # loads (no ring), an L2 prefetch
            if prefetch is None:  # head dim 64: where the grid is thin (`FRAGT_HEAD64_PREFETCH_PER_SM`), and int4
                # without P_WORDS also on long splits (`FRAGT_HEAD64_INT4_PF_TOKENS`)
                thin = B * Hkv * num_splits <= FRAGT_HEAD64_PREFETCH_PER_SM * _sm_count(dev)
                long = int4 and not words and split_len(num_splits) >= FRAGT_HEAD64_INT4_PF_TOKENS
                prefetch = FRAGT_HEAD64_PREFETCH if head64 and (thin or long) else 0
                if head64 and not int4 and thin and FRAGT_HEAD64_RING8 and ring8_ok(kp, vp):  # 8-bit codes there:
                    ring8, prefetch = FRAGT_HEAD64_RING8, 0  # the cp.async ring instead
    else:
        bn, warps, stages = default_tile(kp, vp, D)
        int4_default = block_n is None and kp.fmt.kind == vp.fmt.kind == "int4" and 64 < D <= 128
        block_n = max(block_n or bn, block_size)
        num_warps = num_warps or warps
        num_stages = num_stages or stages
        if num_splits is None:
            num_splits = choose_num_splits(B, Hkv, metadata.max_seq_len, block_n, dev, num_warps, D,
                                           not (kp.fmt.kind == vp.fmt.kind == "float"))
        if int4_default and choose_merge(num_splits, variant, merge):
            block_n = max(INT4_FUSED_TILE, block_size)  # int4 with the fused merge: 64-token tiles measured faster
    max_len = max(metadata.max_seq_len, 1)
    tokens_per_split = cdiv(cdiv(max_len, num_splits), block_n) * block_n
    num_splits = max(1, cdiv(max_len, tokens_per_split))

    # rotated K: q @ R; rotated or centered V: out @ R + V mean. In the kernel (q as it loads, the output
    # in its epilogue) or the merge; `rotate_heads` before / after the launch where they cannot: the
    # Gluon kernel, int4 halves at a head dim that is not a power of two (Hadamard blocks straddle them)
    d_pad = next_pow2(D)
    hb = hadamard_block_size(D)
    def in_kernel_ok(kind: str) -> bool:  # `_decode_kernel` rotates this side's rows itself
        return variant not in ("frag", "fragt") and (D == d_pad or kind != "int4")

    # the Gluon kernels rotate q as they load it (one 128-wide block: `decode_frag._q_rot`) and, with one
    # split, "fragt" forms out @ R + V mean in its epilogue (`decode_frag._store_out_rot`), since session 19: "fragt"
    # always (H200, int4: 0.5-5 % faster at every shape of bench_attention), "frag" with split-K (FP8: 4-6 %
    # faster at 8 x 8192 and 32 x 4096; in its one-split epilogue 3-7 % slower at 64 x 2048 and 128 x 1024, so
    # with one split the merge kernel rotated its output from session 22, FRAG_ROT_ONE_SPLIT, and since session 35
    # the epilogue again, in the accumulator's layout: FRAG_ROT_EPILOGUE; not with int4 on either side, where the
    # rotation made its sm_90 code spill, 55-69 STL / LDL, against none)
    gluon_rot = GLUON_ROT_Q and hb == D and D in (64, 128) and (variant == "fragt" or variant == "frag" and not int4
                                                              and (num_splits > 1 or FRAG_ROT_ONE_SPLIT))
    rot_q = kp.fmt.rotate and (in_kernel_ok(kp.fmt.kind) or gluon_rot)
    post = (vp.fmt.rotate, layer_cache.v_mean) if vp.fmt.rotate or layer_cache.v_mean is not None else None
    v_mean = None if post is None or post[1] is None else \
        post[1].to(device=dev, dtype=torch.float32).contiguous()
    # the split merge fused into the kernel's epilogue (`choose_merge`), or `_merge_kernel` after it
    # (the Gluon kernels' fused merge, `decode_frag._frag_merge_last`, is written for head dim 128)
    fused = choose_merge(num_splits, variant, merge) and not (variant in ("frag", "fragt") and D != 128)
    cnt = merge_counters(dev, B * Hkv) if fused else None
    fused = cnt is not None
    # "frag" rotating with one split (FRAG_ROT_ONE_SPLIT): q @ R in the kernel, and out @ R + V mean in its
    # epilogue (FRAG_ROT_EPILOGUE) or, without it, in `_merge_kernel` (a dependent launch) after the kernel stores
    # its output as a split's partial; not `rotate_heads` before and after
    one_split_merge = (gluon_rot and variant == "frag" and num_splits == 1 and post is not None
                       and not FRAG_ROT_EPILOGUE)
    split_out = num_splits > 1 or one_split_merge
    in_merge = post is not None and split_out
    in_kernel = post is not None and (num_splits == 1 and not one_split_merge
                                      and (in_kernel_ok(vp.fmt.kind) or gluon_rot) or fused)
    rot_args = [False, False]  # (out @ R, + V mean) in the kernel's epilogue or the merge
    if in_merge or in_kernel:
        assert v_mean is None or v_mean.shape == (Hkv, D), (v_mean.shape, Hkv, D)
        rot_args = [post[0], v_mean is not None]
        post = None
    q_in = torch.empty(q.shape, dtype=torch.float32, device=dev) if kp.fmt.rotate and not rot_q else q
    if q_in.stride(-1) != 1:
        q_in = q_in.contiguous()
    out_dtype = torch.float32 if post is not None else q.dtype
    alloc = torch.empty if T == B else torch.zeros
    out = alloc((T, Hq, D), dtype=out_dtype, device=dev)
    hw_fp8 = variant in ("frag", "fragt") and hw_fp8_decode(dev)  # the Gluon kernels only
    k_t, k_c = _side_args(kp, hw_fp8)
    v_t, v_c = _side_args(vp, hw_fp8)
    if split_out:
        po = torch.empty((B, Hq, num_splits, D), dtype=torch.float32, device=dev)
        pml = torch.empty((B, Hq, num_splits, 2), dtype=torch.float32, device=dev)
    else:
        po = pml = out
    bt, qsl = metadata.block_tables, metadata.query_start_loc
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if hw_fp8 and "fp8_e5m2" in (kp.fmt.kind, vp.fmt.kind) and e5m2_hw_decode(variant):
        options["E5M2_HW"] = True
    if variant == "fragt" and int4_ring_ok(kp, vp):
        if ring4 is None:
            ring4 = INT4_RING if INT4_RING is not None else int(int4_ring_default(dev))
    else:
        ring4 = 0
    if ring4:
        options["RING4"] = ring4
        options["RING4_VPAIRS"] = INT4_RING_VPAIRS
        if INT4_RING_MAXNREG and not maxnreg:
            options["maxnreg"] = INT4_RING_MAXNREG
    elif (variant in ("dot", "imma") and num_warps == 1 and D <= 64 and not maxnreg
          and not kp.fmt.kind == vp.fmt.kind == "float"):
        options["maxnreg"] = SMALL_HEAD_MAXNREG  # the programs an SM holds, as `choose_num_splits` counts them
    if variant in ALL_Q_VARIANTS and T == B:
        options["ALL_Q"] = True
    if v8_pairs(variant, vp.fmt.kind, hw_fp8):
        options["V8_PAIRS"] = True
    if variant == "fragt" and D == 64:
        if kp.fmt.kind == "int8" and FRAGT_HEAD64_K8_F16:
            options["K8_F16"] = True
        thin = B * Hkv * num_splits <= FRAGT_HEAD64_INT4_UNCAPPED_PER_SM * _sm_count(dev)
        if words:
            options["P_WORDS"] = True
            if FRAGT_HEAD64_INT4_VPAIRS and not thin:
                options["V_PAIRS"] = True
        if int4 and (FRAGT_HEAD64_VPF0 if FRAGT_HEAD64_VPF0 is not None else not prefetch):
            options["V_PF0"] = True
        if ring8:
            options["RING8"] = ring8
        if FRAGT_HEAD64_MAXNREG and not maxnreg and not (words and thin):
            options["maxnreg"] = FRAGT_HEAD64_MAXNREG
    if maxnreg:  # ptxas register cap (tuning: more CTAs per SM against spills)
        options["maxnreg"] = maxnreg
    d_b = two_part_head(variant, kp, vp) if TWO_PART else 0
    if d_b:
        options["D_B"] = d_b
    if variant in ("dot", "imma") and TWO_PART:
        for side, pool in (("K4P", kp), ("V4P", vp)):
            if int4_parts(pool.fmt):
                options[side] = int4_parts(pool.fmt)
    args = [q_in, q_in.stride(0), q_in.stride(1), qsl, metadata.seq_lens, bt, bt.stride(0)]
    kernel = {"frag": _frag_decode_kernel, "fragt": _fragt_decode_kernel}.get(variant, _decode_kernel)
    args += [*k_t, *v_t, out, out.stride(0), out.stride(1), po, pml, float(scale) * _LOG2E, tokens_per_split]
    half_pad = next_pow2(max(D // 2, 1))
    group_pad = max(16, next_pow2(group))
    args += [group, group_pad, D, d_pad, half_pad, block_size, block_n, split_out,
             *k_c, *v_c, INTERPRET, fast_cvt,
             _needs_idx64(kp, vp) if index64 is None else index64,
             0 if INTERPRET else default_prefetch(kp, vp, D, B * Hkv * num_splits, _sm_count(dev)) if prefetch is None
             else prefetch,
             variant == "imma"]
    mg, ch = merge_chunk(group, d_pad, num_splits, num_warps) if fused else (1, 0)
    args += [v_mean, hb, hadamard_norm(hb), rot_q, *(rot_args if in_kernel else (False, False)), cnt, mg, ch]
    merge_grid = merge_args = merge_options = None
    if split_out and not fused:
        merge_grid = (B, Hq)
        splits_pad = max(2, next_pow2(num_splits))
        merge_args = [po, pml, out, out.stride(0), out.stride(1), qsl, Hq, num_splits, splits_pad, D, d_pad]
        merge_args += [v_mean, group, hb, hadamard_norm(hb), *rot_args]
        pdl = 0 if INTERPRET else pdl_mode(variant, kp.fmt.kind, vp.fmt.kind, dev, B * Hq, D)
        merge_options = {"num_warps": merge_warps(splits_pad, d_pad)}
        if pdl:
            options["PDL"] = pdl
            merge_options.update({"PDL": True, "launch_pdl": True})
    return DecodePlan((B, Hkv, num_splits), args, options, merge_grid, merge_args, out, post, kernel, variant,
                      kp.fmt.rotate and not rot_q, merge_options)


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
    index64: bool | None = None,
    prefetch: int | None = None,
    merge: str | None = None,
    ring4: int | None = None,
) -> torch.Tensor:
    """Paged attention for a pure-decode batch (each sequence has 0 or 1 query token).

    q: [T, Hq, D] bf16/fp16/fp32 (last dim contiguous); layer_cache: K/V `CachePool`s
    (codes [num_blocks, Hkv, block_size, code_width], scales/zeros [.., num_groups] fp16);
    metadata: `AttentionMetadata` (query_start_loc [B+1], seq_lens [B], block_tables [B, M] int32).
    Returns [T, Hq, D] in q's dtype. num_splits / block_n / num_warps / num_stages override the
    heuristics (tests and tuning); fast_cvt=False decodes codes with plain Triton conversions
    instead of the PTX byte permutes (for measuring). variant: "auto" | "dot" | "imma" | "frag" | "fragt"
    (see `choose_variant`; default: KVPACK_DECODE_VARIANT, else "auto"). maxnreg caps ptxas'
    registers per thread (tuning). index64:
    force int64 (True) or int32 (False) offsets in the "dot" kernel (default: int64 only for pools
    whose offsets can reach 2**31, `_needs_idx64`). prefetch: L2 prefetch distance in tiles of
    the "dot" kernel (0: none; default: `default_tile`; the CPU interpreter has no inline PTX: 0).
    merge: "auto" | "fused" | "separate": where the split merge runs (`choose_merge`; default:
    KVPACK_DECODE_MERGE, else "auto"). ring4: "fragt"'s int4 cp.async ring distance in tiles (default
    KVPACK_INT4_RING, else 1 where `int4_ring_default`; 0: direct loads).
    """
    plan = plan_decode(q, layer_cache, metadata, scale, num_splits, block_n, num_warps, num_stages, fast_cvt,
                       variant, maxnreg, index64, prefetch, merge, ring4)
    out = plan.out
    if metadata.num_seqs == 0 or q.shape[0] == 0:
        return out.to(q.dtype)
    if plan.rotate_q:  # rotated K, outside the kernel: it reads q @ R (planned as an empty buffer)
        rotate_heads(q, torch.float32, out=plan.args[0])
    plan.kernel[plan.grid](*plan.args, **plan.options)
    if plan.merge_grid is not None:
        _merge_kernel[plan.merge_grid](*plan.merge_args, **(plan.merge_options or {}))
    if plan.post is not None:
        out = rotate_heads(out, q.dtype, *plan.post)
    return out
