"""Host-side pieces of the decode kernels (`decode_attention`, `decode_frag`):
SM count, rotations, per-pool launch arguments, split and variant heuristics, the `DecodePlan`."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvpack.attention.kv_cache import CachePool
from kvpack.config import ConfigError
from kvpack.kernels.quant import cdiv, next_pow2

_SM_COUNT: dict[int, int] = {}

_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # CPU interpreter: a few splits, so split-K is exercised
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


INT4_GROUP_PATHS = ("broadcast", "chunk")  # `_load_int4`'s GPATH: the index of `int4_group_path`


def int4_group_path(fmt) -> str | None:
    """How the "dot" decode kernel (`decode_attention._load_int4`: every int4 head dim but "fragt"'s 128) applies an
    int4 side's group scales and zeros to the two nibble halves of its code bytes (channels j and j + D / 2):
    "broadcast": D a power of two, each half whole groups or one group the whole head (groups of D: SmolLM2's 64
        with --int4-group-size 64 / 128 had gathered them per channel, 2.2x groups of 32's time, session 30);
    "chunk": groups straddle the halves (head dims 80 and 96): each half in chunks of the largest power of two
        dividing the half and the group, each chunk's group parameters loaded once a token (session 31: head dim 80
        had loaded them per channel, 4.7x bf16's decode time, now ~1.07x);
    None for other kinds."""
    if fmt.kind != "int4":
        return None
    d, g = fmt.head_dim, fmt.group_size
    half = d // 2
    if half & (half - 1) == 0 and (half % g == 0 or g == d):
        return "broadcast"
    return "chunk"


def _side_args(pool: CachePool, hw_fp8: bool = False) -> tuple[list, list]:
    """(tensor/stride args, constexpr args) for one pool. hw_fp8: the kernel decodes e4m3 with the conversion
    instruction (the value itself, factor 1: `hw_fp8_decode`), else in software (value / 256)."""
    fmt = pool.fmt
    codes = pool.codes
    scales = pool.scales if pool.scales is not None else codes
    zeros = pool.zeros if pool.zeros is not None else scales
    static = pool.static_scale if pool.static_scale is not None else codes
    path = int4_group_path(fmt)
    gpath = INT4_GROUP_PATHS.index(path) if path else 0
    if path:  # `_load_int4` aligns its code rows to the half's lowest set bit (8 bytes at head dim 80)
        align = (fmt.head_dim // 2) & -(fmt.head_dim // 2)
        assert all(st % align == 0 for st in codes.stride()[:3]), (codes.stride(), align)
    factor = 256.0 if fmt.kind == "fp8_e4m3" and not hw_fp8 else 1.0
    dot_dt = _TL_DTYPES[codes.dtype] if fmt.kind == "float" else tl.float16
    tensors = [codes, scales, zeros, static, *codes.stride()[:3], *scales.stride()[:3]]
    consts = [fmt.kernel_id, fmt.scale_mode == "static", fmt.group_size, gpath, factor, dot_dt]
    return tensors, consts


# one-warp "dot" / "imma" programs of a quantized cache at head dims <= 64 (SmolLM2's): the programs an SM holds at
# once, which `choose_num_splits` fills, and the register cap that lets it hold them (65536 / (16 x 32)): SmolLM2's
# 32 x 4096 int4 with one group a head compiled to 140 registers, 14 programs an SM, and its 22 splits ran in 1.14
# waves, 31.0 us a layer against groups of 32's 22.4 at 128 registers (session 30)
SMALL_HEAD_PER_SM = 16
SMALL_HEAD_MAXNREG = 65536 // (SMALL_HEAD_PER_SM * 32)
# and of a 16-bit cache ("dot", 10 KB of shared memory a program, so not a bound): tuned, H200, SmolLM2's 32 x 4096
# bf16, per layer, side by side (session 37, results/allq_s37, with ALL_Q): 16 splits (12 an SM) 0.984-0.99x the time of
# 11 (8 an SM), 13 alike, 22 1.10x (session 21, without ALL_Q: 11 splits 31.2 us against 22's 34.0; session 36: 16
# no faster than 11 without ALL_Q)
SMALL_HEAD_16BIT_PER_SM = 12


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, block_n: int,
                      device: torch.device, num_warps: int = 4, head_dim: int = 128, codes: bool = True,
                      min_tiles: int = 4) -> int:
    """Splits per sequence when num_seqs * Hkv programs do not fill the GPU. The programs that fit
    at once (H200 tuning): 2 per SM with 4 warps, 8 with one warp (at head_dim <= 64: 16 for quantized `codes`,
    SMALL_HEAD_PER_SM, and 12 for a 16-bit cache, SMALL_HEAD_16BIT_PER_SM). Splits
    fill one such wave without starting a second (a 1.2-wave grid measured 15 % slower), or give
    at most ~1024 tokens per split, whichever is more, each split keeping >= `min_tiles` tiles (4; "fragt" at head
    dim 64: 2, `decode_attention.FRAGT_HEAD64_MIN_TILES`)."""
    work = max(1, num_seqs * num_kv_heads)  # an empty batch plans (and launches nothing)
    per_sm = max(2, 8 // max(1, num_warps))
    if num_warps == 1 and head_dim <= 64:
        per_sm = SMALL_HEAD_PER_SM if codes else SMALL_HEAD_16BIT_PER_SM
    slots = per_sm * _sm_count(device)
    if work >= slots:
        return 1
    max_splits = max(1, cdiv(max_seq_len, min_tiles * block_n))
    want = max(slots // work, cdiv(max_seq_len, 1024))
    return max(1, min(max_splits, want, 128))


RING_PER_SM = 4  # "frag" with its cp.async ring: programs per SM (H200, results/attention_s9)
RING_LONG_SPLIT = 2048  # a ring split longer than this is cut into RING_SPLIT_TOKENS pieces (`choose_ring_splits`)
RING_SPLIT_TOKENS = 1024
RING_SMEM_BYTES = 2 * (2 * 64 * 128 + 2 * 64 * 2)  # its two slots: K and V codes, K and V scales
# "fragt"'s int4 ring (`decode_frag._r4_issue`), two slots of 64 tokens: K and V codes, and their scales and
# zero-points (fp16, groups of 32: 4 a token; fewer at 64 and 128, planned alike)
INT4_RING_SMEM_BYTES = 2 * (2 * 64 * 64 + 4 * 64 * 4 * 2)
# the int4 ring by default where a multiprocessor holds at least this many ring programs (H200 10, A100 7; sm_86 /
# sm_89 class GPUs, ~100 KB: 4, keep direct loads there, unmeasured: one warp a program, 4 programs an SM leave each
# scheduler one warp to issue from, against the direct loads' ~8 by registers)
INT4_RING_MIN_PER_SM = 6
_MAX_SMEM: dict[int, int] = {}  # device index -> the opt-in shared memory per block


def _smem_programs_per_sm(device: torch.device, nbytes: int) -> int:
    """How many programs of `nbytes` of shared memory a multiprocessor holds; CPU planning (tests) answers as
    for an H200 (227 KB a block)."""
    if device.type != "cuda":
        smem = 232448
    else:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx not in _MAX_SMEM:
            _MAX_SMEM[idx] = triton.runtime.driver.active.utils.get_device_properties(idx)["max_shared_mem"]
        smem = _MAX_SMEM[idx]
    return (smem + 1024) // (nbytes + 1024)  # the SM reserves 1 KB per block


def _ring_programs_per_sm(device: torch.device) -> int:
    """How many 8-bit ring programs a multiprocessor's shared memory holds (H200 6, A100 4, sm_86 / sm_89
    GPUs 2)."""
    return _smem_programs_per_sm(device, RING_SMEM_BYTES)


def int4_ring_default(device: torch.device) -> bool:
    """Whether "fragt" runs int4 through its cp.async ring by default on this device (INT4_RING_MIN_PER_SM)."""
    return _smem_programs_per_sm(device, INT4_RING_SMEM_BYTES) >= INT4_RING_MIN_PER_SM


def choose_ring_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int | None:
    """Splits per sequence for "frag" with its cp.async ring (`decode_frag`, PREFETCH = 1), or None
    where the ring does not pay. Measured on an H200 (results/attention_tune_s9): with whole tiles
    copied a tile ahead, a program is best left running long: the fastest grids held about 4 programs
    per SM (512 programs at 8 x 8192, 32 x 4096 and 64 x 2048; 3-8 % faster than the best without the
    ring), while a grid of more than ~6 per SM (the ring's 33 KB of shared memory a program) ran in a
    second wave, 20-25 % slower than no ring (128 x 1024). GPUs whose multiprocessors hold fewer than
    RING_PER_SM ring programs (RTX 30xx / A10 / L4 class: about 100 KB of shared memory) keep direct
    loads (unmeasured there)."""
    if _ring_programs_per_sm(device) < RING_PER_SM:
        return None
    work = max(1, num_seqs * num_kv_heads)
    slots = RING_PER_SM * _sm_count(device)
    if work > slots:
        return None
    splits = slots // work
    if cdiv(max_seq_len, splits) > RING_LONG_SPLIT:
        # Long splits leave a batch of mixed lengths to its longest sequences' programs (a CUDA graph
        # plans for its context bucket, not the lengths it replays): splits of >= RING_SPLIT_TOKENS
        # (so "auto" keeps "frag"). H200, 41 sequences of 2.3-8.7k tokens planned for 8704
        # (results/engine_s12/probe_varlen): 1 -> 9 splits, int8 245 -> 163 us, fp8_e4m3 327 -> 185;
        # 41 x 5.3k: int8 158 -> 154, fp8 208 -> 172 (4 splits: 145, 154)
        splits = max(splits, max_seq_len // RING_SPLIT_TOKENS)
    return max(1, min(splits, cdiv(max_seq_len, 4 * 64), 128))


_HW_FP8: dict[int, bool] = {}


def hw_fp8_decode(device: torch.device) -> bool:
    """Whether the Gluon decode kernels ("frag", "fragt") decode e4m3 codes with the sm >= 89 conversion
    instruction (one per two codes, against three integer operations; the codes' values exactly, so the plan
    passes the factor 1 instead of 256: the outputs are the same bits) rather than in software (Ampere, CPU
    plans, or KVPACK_SOFT_FP8_DECODE=1)."""
    if device.type != "cuda" or os.environ.get("KVPACK_SOFT_FP8_DECODE", "0") == "1":
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _HW_FP8:
        _HW_FP8[idx] = torch.cuda.get_device_capability(idx) >= (8, 9)
    return _HW_FP8[idx]

# e5m2 through the conversion instruction too, where e4m3 takes it, in these variants (`e5m2_hw_decode`). H200,
# per layer, side by side (results/e5m2_hw_s40): "fragt" at head dim 64 (SmolLM2 32 x 4096) 21.1 -> 20.0 us, level
# with e4m3 (the same SASS but for F2FP in place of PRMT); "frag" at head dim 128 0.999-1.000x at context >= 2048 and
# 1.008x at 128 x 1024, so it keeps the byte permute
E5M2_HW_VARIANTS = ("fragt",)


def e5m2_hw_decode(variant: str) -> bool:
    """Whether a Gluon decode kernel that decodes e4m3 by the sm >= 89 conversion instruction (`hw_fp8_decode`) turns
    e5m2 codes into fp16 by it too (one per two codes, as e4m3's) rather than by a byte permute (one per two codes
    as well, on the integer pipe): in E5M2_HW_VARIANTS; KVPACK_E5M2_HW=0 / 1 overrides, read at plan time."""
    env = os.environ.get("KVPACK_E5M2_HW")
    if env not in (None, "0", "1"):
        raise ValueError(f"KVPACK_E5M2_HW={env!r}: expected 0 or 1")
    return variant in E5M2_HW_VARIANTS if env is None else env == "1"


_PDL_OK: dict[int, bool] = {}
PDL_MODES = {"0": 0, "start": 1, "end": 2}  # KVPACK_DECODE_PDL: off, trigger as the program starts / after its loop


def pdl_variant(variant: str, k_kind: str, v_kind: str) -> bool:
    """The decode kernels whose separate merge `pdl_mode` launches early by default: measured on an H200
    (session 21, results/attention_s21, `probe_fixed_cost.py`, a call at 8 x 8192's grid, per layer) "frag"
    (int8 43.5 -> 42.6 us, fp8_e4m3 46.9 -> 46.1) and "dot" on 16-bit caches (bf16 69.2 -> 68.6); not
    "fragt" (int4 at 16 splits 73.1 -> 78.2 us with the trigger at its start: slower), nor the others
    (not measured)."""
    return variant == "frag" or variant == "dot" and k_kind == v_kind == "float"


# "fragt" launches its separate merge early (PDL start) while the merge has at most this many programs: H200,
# session 29 (results/timeline_s29/pdl_ab.json, per layer, int4, against a plain launch): 32 / 64 / 128 / 256
# merge programs (1 x 32768, 2 x 16384, 4 x 8192, 8 x 8192) 0.971 / 0.968 / 0.965 / 0.991x; more: not measured
# (session 21 measured 8 x 8192 slower with it, 73.1 -> 78.2 us, before the ring and `merge_warps`)
FRAGT_PDL_MAX_MERGE = 256
# every variant launches its separate merge early at head dims up to this (short programs, whose fixed costs weigh
# more): H200, session 37 (results/allq_s37/call3, per layer, side by side), SmolLM2's 32 x 4096 (288 merge programs,
# 22 splits) 0.967x the time with "dot" int4, 0.968x "fragt" int8, 0.971x fp8_e4m3, 0.979x fp8_e5m2; at head dim 128
# "dot" (fp8_e4m3 at 8 x 8192 1.009x, int4 1.002x) and "imma" (int8 at 8 x 8192 1.002x, 1 x 32768 1.000x) gained
# nothing (call4), nor "fragt" int4 past FRAGT_PDL_MAX_MERGE (there its merge is fused: no separate launch)
PDL_MAX_HEAD_DIM = 64


def pdl_mode(variant: str, k_kind: str, v_kind: str, device: torch.device, merge_programs: int | None = None,
             head_dim: int = 128) -> int:
    """Whether (and where) the separate split merge is launched as a programmatic dependent launch of its
    decode kernel (sm_90+): 0 not; 1 the decode kernel executes `griddepcontrol.launch_dependents` as each
    program starts, 2 after its loop over the tiles. The merge's programs read the partials only after
    `griddepcontrol.wait` (the decode grid complete, its writes visible), so the merge's launch latency hides
    behind the decode kernel instead of following it. Default: 1 for `pdl_variant`'s kernels, for "fragt"
    with at most FRAGT_PDL_MAX_MERGE `merge_programs` and for every kernel at a `head_dim` of at most PDL_MAX_HEAD_DIM,
    else 0; the environment variable KVPACK_DECODE_PDL = 0 |
    start | end sets it for every kernel (experiments)."""
    if device.type != "cuda":
        return 0
    env = os.environ.get("KVPACK_DECODE_PDL", "")
    if env and env not in PDL_MODES:
        raise ConfigError(f"KVPACK_DECODE_PDL={env!r} is not one of " + ", ".join(PDL_MODES))
    early = pdl_variant(variant, k_kind, v_kind) or head_dim <= PDL_MAX_HEAD_DIM or (
        variant == "fragt" and merge_programs is not None and merge_programs <= FRAGT_PDL_MAX_MERGE)
    mode = PDL_MODES[env] if env else (1 if early else 0)
    if mode == 0:
        return 0
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _PDL_OK:
        _PDL_OK[idx] = torch.cuda.get_device_capability(idx)[0] >= 9
    return mode if _PDL_OK[idx] else 0


MERGE_ELEMS_PER_THREAD = 128  # the separate merge's partial elements a thread loads (`merge_warps`)


def merge_warps(splits_pad: int, d_pad: int) -> int:
    """Warps of the separate split merge (`_merge_kernel`: a program per (sequence, query head) loads its
    [splits_pad, d_pad] fp32 partials at once): about MERGE_ELEMS_PER_THREAD a thread, 1 to 4 warps. Measured on
    an H200 against the former 4 warps (session 29, results/timeline_s29/merge_ab.json, per layer): 64 x 128
    partials (int8, FP8 at 1 x 32768) 2 warps 0.97-0.98x; 8-32 x 64-128 (8 x 8192, SmolLM2's 32 x 4096) 1 warp
    0.97-0.99x; 128 x 128 (bf16, int4 at 1 x 32768) 4 warps (1 warp: 1.5x, 512 values a thread spill)."""
    return max(1, min(4, next_pow2(max(1, splits_pad * d_pad // (32 * MERGE_ELEMS_PER_THREAD)))))


MERGES = ("auto", "fused", "separate")
FUSED_MERGE_MAX_SPLITS = 4  # "auto" fuses the split merge up to this many splits (H200, results/attention_s10)
MERGE_ELEMS_PER_LANE = 32  # the fused merge's chunk of partials: fp32 registers a lane holds at once
_MERGE_CNT: dict[tuple, torch.Tensor] = {}
_MERGE_RETIRED: list[torch.Tensor] = []


def choose_merge(num_splits: int, variant: str, merge: str | None = None) -> bool:
    """Whether the split merge runs fused into the decode kernel (the last program of each (sequence,
    kv head) to finish merges: no second launch) rather than as `_merge_kernel`: `merge`, else the
    environment variable KVPACK_DECODE_MERGE, else "auto". "auto", measured on an H200
    (results/attention_s10, side by side): fused for "dot" / "imma" with 2-4 splits (int4 32 x 4096
    96.3 -> 92.0 us, 64 x 2048 95.4 -> 91.6; bf16 1-2 % faster), separate for "frag" (int8 85.3 -> 87.6
    at 2 splits, FP8 0-2 % faster: no gain; "fragt" fused: int4 32 x 4096 81.5 -> 78.8 us, 64 x 2048
    80.5 -> 78.6, results/attention_s18) and from 8 splits on (8 x 8192: equal or 4 % slower; at
    128 splits one program reading them all took 1 x 32768 from 36 to 59-66 us)."""
    name = merge or os.environ.get("KVPACK_DECODE_MERGE", "") or "auto"
    if name not in MERGES:
        raise ConfigError(f"decode merge {name!r} (argument or KVPACK_DECODE_MERGE) is not one of " + ", ".join(MERGES))
    if num_splits <= 1:
        return False
    return name == "fused" or (name == "auto" and variant != "frag" and num_splits <= FUSED_MERGE_MAX_SPLITS)


def merge_chunk(group: int, head_dim_pad: int, num_splits: int, num_warps: int) -> tuple[int, int]:
    """(MERGE_G, MERGE_CH) of the fused merge: the group padded to a power of two, and the splits it
    reads at once (about MERGE_ELEMS_PER_LANE fp32 values per lane, no more than there are splits)."""
    mg = next_pow2(max(1, group))
    ch = max(1, MERGE_ELEMS_PER_LANE * 32 * num_warps // (mg * head_dim_pad))
    ch = min(1 << (ch.bit_length() - 1), next_pow2(num_splits))
    return mg, ch


def merge_counters(device: torch.device, n: int) -> torch.Tensor | None:
    """The fused merge's finished-split counters (int32, one per (sequence, kv head), at least n), kept
    per device and zero between launches (the merging program puts its counter back). None while a
    CUDA graph is being captured and the kept buffer is too small (the caller merges separately)."""
    key = (device.type, device.index)
    cnt = _MERGE_CNT.get(key)
    if cnt is None or cnt.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        if cnt is not None:  # a captured CUDA graph may still point at it: kept alive, never reused
            _MERGE_RETIRED.append(cnt)
        cnt = _MERGE_CNT[key] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return cnt


VARIANTS = ("auto", "dot", "imma", "frag", "fragt")
FRAG_KINDS = ("int8", "fp8_e4m3", "fp8_e5m2")  # the 8-bit codes `decode_frag` reads
FRAG_INT4_MIN_GROUP = 16  # int4 in "frag" (asked for, not "auto"): a lane's 16 K bytes share one group
FP8_KINDS = ("fp8_e4m3", "fp8_e5m2")
FRAG_MIN_TOKENS = 1024  # "auto" runs "frag" at >= this many tokens per program (split)
# ... and "frag" with its cp.async ring at >= this many (session 21, H200, per layer: 1 x 32768 at 64 ring splits
# of 512 tokens, int8 28.6-28.8 us against "imma"'s 29.9 at 128 splits, fp8_e4m3 30.5-30.6 against "dot"'s
# 32.4; 47 or 74 splits were slower: results/attention_s21)
RING_MIN_TOKENS = 512


def choose_variant(k_kind: str, v_kind: str, variant: str | None = None) -> str:
    """The decode kernel variant: `variant`, else the environment variable KVPACK_DECODE_VARIANT,
    else "auto". "auto" (measured on an H200, results/attention_tune_s6 and _s7): "frag" for 8-bit K
    and V (int8 or FP8) where `plan_decode` finds its scope and >= 1024 tokens per program (FP8 5-13 %,
    int8 4-7 % faster there; slower with fewer), else "imma" for int8 K (8-14 % faster than "dot"),
    else "dot"; int4 K and V: "fragt" (session 18, results/attention_s18: 0.84-0.99x the time of "dot"; at head dim 64
    since session 41, results/int4_h64_s41: 0.86-0.91x).
    The others: "dot" (tensor cores, fp16 operands), "imma" ("dot" with the scores from an
    int8 MMA: int8 K only, else "dot"), "frag" (codes loaded in the MMA fragment layout,
    `decode_frag`, int8 K through int8 MMAs; 8-bit codes on both sides, else the fallback), "fragt"
    (`decode_frag` with both products transposed: the query heads are the MMA's n = 8; GQA groups <= 8;
    int4 K and V, or 8-bit codes on both sides (asked for only at head dim 128: session 19 measured it no faster than "frag" /
    "imma"; "auto" at head dim 64, where "frag" does not go: `decode_attention.FRAGT_HEAD64_AUTO`); asked for on int4
    beside an 8-bit side it means "frag").
    `plan_decode` also falls back outside frag's head-dim / group / block scope; the fallback is
    "imma" for int8 K, else "dot" (`fallback_variant`), and "auto" takes "dot" over "imma" at head dims that are not
    powers of two (`decode_attention.two_part_head`). int4 on one side only takes "frag" only when
    asked for (session 16: no faster than "dot", results/attention_s16).
    Returns the variant, or "frag?" ("auto" on 8-bit K and V: `plan_decode` decides between "frag"
    and the fallback once it knows the split length)."""
    name = variant or os.environ.get("KVPACK_DECODE_VARIANT", "") or "auto"
    if name not in VARIANTS:
        raise ConfigError(f"decode variant {name!r} (argument or KVPACK_DECODE_VARIANT) is not one of "
                          + ", ".join(VARIANTS))
    frag_ok = k_kind in FRAG_KINDS and v_kind in FRAG_KINDS
    if name == "auto":
        if k_kind == v_kind == "int4":
            return "fragt"  # session 18: 0.84-0.99x the time of "dot" (`plan_decode` falls back outside its scope)
        return "frag?" if frag_ok else fallback_variant(k_kind)
    if name == "fragt" and not (k_kind == v_kind == "int4" or frag_ok):
        name = "frag"  # the transposed products take int4 K and V, or 8-bit codes on both sides
    frag_ok = k_kind in (*FRAG_KINDS, "int4") and v_kind in (*FRAG_KINDS, "int4")  # int4: when asked for
    if name == "imma" or (name == "frag" and not frag_ok):
        return fallback_variant(k_kind)
    return name


def fallback_variant(k_kind: str) -> str:
    """The variant where "frag" does not apply: "imma" for int8 K, else "dot"."""
    return "imma" if k_kind == "int8" else "dot"


@dataclass
class DecodePlan:
    """Everything one decode call launches: kernel args (also used to compile ahead of time)."""

    grid: tuple[int, int, int]
    args: list
    options: dict
    merge_grid: tuple[int, int] | None
    merge_args: list | None
    out: torch.Tensor  # [T, Hq, D], q's dtype (fp32 when `post`: rotated / mean added afterwards)
    post: tuple[bool, torch.Tensor | None] | None  # (rotate V back, V mean) for `rotate_heads`, or None
    kernel: object = None  # the decode kernel (`_decode_kernel` or Gluon `_frag_decode_kernel`)
    variant: str = "dot"
    rotate_q: bool = False  # q @ R by `rotate_heads` into args[0] before the launch (else in the kernel, or none)
    merge_options: dict | None = None  # `_merge_kernel`'s launch keywords (warps; programmatic dependent launch)
