"""Decode paged attention and cache write on the GPU: time, KV bytes read, TB/s, ratios.

    python benchmarks/bench_attention.py [--quick] [--check] [--out results/attention]
    python benchmarks/bench_attention.py --write-only  # the cache-write rows alone

For each shape (Llama-3.1-8B attention: 32 q / 8 kv heads, head_dim 128, block 16, at batch x
context 1x32768 ... 128x1024, plus SmolLM2: 9 q / 3 kv / 64) and each KV format (bf16, int8,
int8-static, int4, fp8_e4m3, fp8_e5m2): the median time of one decode step (CUDA graph replay,
`triton.testing.do_bench`, which flushes L2 before every replay), the KV bytes it must read
(codes + scales of every context token), TB/s, the ratio to kvpack's bf16 cache, and the ratio
to torch SDPA (cuDNN and flash backends) on the same context stored contiguously in bf16, all in
the same run; then cache-write throughput per format. Block tables are random permutations.
Writes JSON, a markdown table and a PNG plot to --out, with GPU, driver, torch, triton, commit and
the command line. `--check` compares every kernel with the PyTorch reference first. `--tune`
sweeps the decode variants (auto / dot / imma / frag) and their tile/warp/stage/split choices for
the quantized formats (TUNE_CONFIGS), printing every measurement and a summary table (tune.json,
tune.md). KVPACK_DECODE_VARIANT=dot (or imma, frag, fragt) runs the whole benchmark on that variant.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvpack.attention import AttentionMetadata, LayerKVCache, allocate_pool  # noqa: E402
from kvpack.formats import resolve_format  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    context: int
    hq: int = 32
    hkv: int = 8
    head_dim: int = 128
    block_size: int = 16


SHAPES = [Shape("llama8b-1x32768", 1, 32768), Shape("llama8b-8x8192", 8, 8192),
          Shape("llama8b-32x4096", 32, 4096), Shape("llama8b-64x2048", 64, 2048),
          Shape("llama8b-128x1024", 128, 1024), Shape("smollm2-32x4096", 32, 4096, 9, 3, 64),
          Shape("llama8b-256x256", 256, 256)]  # the short workload's decode (256 requests, 128 + 128 tokens)
QUICK_SHAPES = ["llama8b-1x32768", "llama8b-32x4096", "smollm2-32x4096"]
FORMATS = ["bf16", "int8", "int8-static", "int4", "fp8_e4m3", "fp8_e5m2"]
# vLLM's Triton paged-attention kernel on the same shapes (from the issue), microseconds.
VLLM_US = {
    "bf16": {"llama8b-1x32768": 174, "llama8b-8x8192": 130, "llama8b-32x4096": 239,
             "llama8b-64x2048": 154, "llama8b-128x1024": 157},
    "int8": {"llama8b-1x32768": 315, "llama8b-8x8192": 222, "llama8b-32x4096": 417,
             "llama8b-64x2048": 420, "llama8b-128x1024": 425},
    "int4": {"llama8b-1x32768": 360, "llama8b-8x8192": 318, "llama8b-32x4096": 589,
             "llama8b-64x2048": 596, "llama8b-128x1024": 470},
}


def format_spec(fmt_name: str) -> tuple[str, bool, int]:
    """(KV cache dtype, static scales, int4 group size) of a benchmark format name: a `--kv-cache-dtype` value
    ("bf16" for bfloat16), "int8-static" / "fp8_e4m3-static" (static scales) or "int4-g64" / "int4-g128" (int4 with
    groups of that many channels; "int4" is group 32). Also bench_prefill's and probe_read_floor's."""
    base, _, variant = fmt_name.partition("-")
    base = {"bf16": "bfloat16"}.get(base, base)
    group = int(variant[1:]) if re.fullmatch(r"g\d+", variant) else 32
    if variant not in ("", "static") and not (base == "int4" and variant == f"g{group}"):
        raise ValueError(f"unknown benchmark format {fmt_name!r}: expected a KV cache dtype, "
                         f"'<int8|fp8_*>-static' or 'int4-g<group size>'")
    return base, variant == "static", group


def make_cache(fmt_name: str, shape: Shape, num_blocks: int, device) -> LayerKVCache:
    """A layer's pools for a benchmark format name (`format_spec`)."""
    base, static_scales, group = format_spec(fmt_name)

    def pool():
        fmt = resolve_format(base, head_dim=shape.head_dim, static=static_scales, int4_group_size=group)
        static = None
        if fmt.scale_mode == "static":  # randn K/V: |x| <= ~5 maps onto the code range
            static = torch.full((shape.hkv,), 5.0 / fmt.qmax, device=device)
        return allocate_pool(fmt, num_blocks, shape.hkv, shape.block_size, device, static)

    return LayerKVCache(pool(), pool())


def engine_tables(lens: list[int], block_size: int, prompt: int) -> list[list[int]]:
    """Block tables as the engine's allocator hands them out to a batch whose prompts of `prompt` tokens
    were prefilled one after another and which then decodes in lockstep: sequence i holds blocks
    i * P .. i * P + P - 1 (P = its prompt's blocks), then every decode block is taken in turn, one per
    sequence still growing (block B * P + k * B + i for the k-th in a full batch: a fixed stride)."""
    nblk = [(n + block_size - 1) // block_size for n in lens]
    p = -(-prompt // block_size)
    tables = [list(range(i * p, i * p + min(p, m))) for i, m in enumerate(nblk)]
    nxt = len(lens) * p
    while any(len(t) < m for t, m in zip(tables, nblk)):
        for t, m in zip(tables, nblk):
            if len(t) < m:
                t.append(nxt)
                nxt += 1
    return tables


def make_case(fmt_name: str, shape: Shape, device, gen: torch.Generator, lens: list[int] | None = None,
              tables: str = "random", prompt: int = 512):
    """Cache filled through the Triton write (random K/V), block tables, decode metadata, q:
    shape.batch sequences of shape.context tokens, or sequences of `lens` tokens (mixed lengths).
    Tables "random": a random permutation of the pool; "engine": `engine_tables` with `prompt`-token
    prompts (a decode-heavy run's allocation pattern)."""
    from kvpack.kernels import write_kv

    bs = shape.block_size
    lens = lens or [shape.context] * shape.batch
    nblk = [(n + bs - 1) // bs for n in lens]
    if tables == "engine":
        tables = [torch.tensor(t) for t in engine_tables(lens, bs, prompt)]
    elif tables == "random":
        perm = torch.randperm(sum(nblk) + 1, generator=gen)
        tables, at = [], 0
        for m in nblk:
            tables.append(perm[at:at + m])
            at += m
    else:
        raise ValueError(f"tables {tables!r}: random or engine")
    num_blocks = 1 + max([sum(nblk)] + [int(t.max()) for t in tables if len(t)])
    lc = make_cache(fmt_name, shape, num_blocks, device)
    slots = torch.cat([t[torch.arange(n) // bs] * bs + torch.arange(n) % bs for t, n in zip(tables, lens)])
    T = len(slots)
    for lo in range(0, T, 1 << 17):  # fill in chunks: bounded temporary memory
        hi = min(T, lo + (1 << 17))
        k = torch.randn(hi - lo, shape.hkv, shape.head_dim, device=device, dtype=torch.bfloat16)
        v = torch.randn(hi - lo, shape.hkv, shape.head_dim, device=device, dtype=torch.bfloat16)
        write_kv(k, v, lc, slots[lo:hi].to(device))
    meta = AttentionMetadata.build([1] * len(lens), lens, [t.tolist() for t in tables], bs, device=device)
    q = torch.randn(len(lens), shape.hq, shape.head_dim, device=device, dtype=torch.bfloat16)
    return lc, meta, q


def kv_bytes(lc: LayerKVCache, shape: Shape) -> int:
    per_token = (lc.k.fmt.bytes_per_token_head + lc.v.fmt.bytes_per_token_head) * shape.hkv
    return per_token * shape.batch * shape.context


def capture_graph(fn) -> "torch.cuda.CUDAGraph":
    """fn captured in a CUDA graph (run once before, outside the capture: compile, warm up)."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return g


def time_graph(fn, rep_ms: int) -> float:
    """Median microseconds of one replay of fn captured in a CUDA graph (L2 flushed before each)."""
    import triton

    g = capture_graph(fn)
    return 1000 * triton.testing.do_bench(g.replay, warmup=max(5, rep_ms // 5), rep=rep_ms, return_mode="median")


def bench_sdpa(shape: Shape, device, rep_ms: int, gen: torch.Generator) -> dict:
    """torch SDPA on the same context, contiguous bf16 [B, H, S, D]; q [B, Hq, 1, D]."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, S, D = shape.batch, shape.context, shape.head_dim
    q = torch.randn(B, shape.hq, 1, D, device=device, dtype=torch.bfloat16)
    k = torch.randn(B, shape.hkv, S, D, device=device, dtype=torch.bfloat16)
    v = torch.randn(B, shape.hkv, S, D, device=device, dtype=torch.bfloat16)
    out = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        for mode in ("gqa", "repeat_kv"):
            try:
                if mode == "gqa":
                    kk, vv, kw = k, v, {"enable_gqa": True}
                else:
                    g = shape.hq // shape.hkv
                    kk, vv, kw = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), {}

                def fn(kk=kk, vv=vv, kw=kw, backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, kk, vv, **kw)

                us = time_graph(fn, rep_ms)
                out[name] = {"us": us, "mode": mode}
                break
            except Exception as e:  # backend unavailable for this shape: try the next mode
                out[name] = {"us": None, "error": f"{type(e).__name__}: {str(e)[:160]}"}
    return out


def check_case(lc, meta, q, scale) -> float:
    from kvpack.attention import reference
    from kvpack.kernels import paged_attention

    ref = reference.paged_attention(q.float(), lc, meta, scale)
    out = paged_attention(q, lc, meta, scale).float()
    return ((out - ref).abs() / (1 + ref.abs())).max().item()


WRITE_SLOTS = ("random", "blocks")


def write_slots(pattern: str, tokens: int, block_size: int, device) -> torch.Tensor:
    """A write's slot mapping over a pool of tokens // block_size + 1 blocks. "random": every token in
    a random slot (the worst case: each token-head row lands apart from its neighbours). "blocks": a
    prefill's mapping, whole blocks in a random order with consecutive tokens inside each (what the
    engine writes for a prompt or a chunk; a decode step writes one token per sequence)."""
    nb = tokens // block_size + 1
    if pattern == "random":
        return torch.randperm(nb * block_size, device=device)[:tokens]
    if pattern == "blocks":
        blocks = torch.randperm(nb, device=device)
        t = torch.arange(tokens, device=device)
        return blocks[t // block_size] * block_size + t % block_size
    raise ValueError(f"unknown slot pattern {pattern!r}: expected one of {', '.join(WRITE_SLOTS)}")


def bench_write(fmt_name: str, shape: Shape, device, rep_ms: int, tokens: int, slots_pattern: str = "random") -> dict:
    from kvpack.kernels import write_kv

    nb = tokens // shape.block_size + 1
    lc = make_cache(fmt_name, shape, nb, device)
    k = torch.randn(tokens, shape.hkv, shape.head_dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    slots = write_slots(slots_pattern, tokens, shape.block_size, device)
    us = time_graph(lambda: write_kv(k, v, lc, slots), rep_ms)
    in_bytes = 2 * k.numel() * k.element_size()
    return {"format": fmt_name, "tokens": tokens, "slots": slots_pattern, "us": us, "input_TBps": in_bytes / us / 1e6,
            "cache_bytes_written": kv_bytes(lc, Shape("w", 1, tokens, shape.hq, shape.hkv, shape.head_dim))}


def bench_copy(shape: Shape, device, rep_ms: int, tokens: int) -> dict:
    """The write's ceiling, same run: torch's device-to-device copy of the same K and V bytes (it
    reads and writes each input byte once, as the bf16 cache write does)."""
    k = torch.randn(tokens, shape.hkv, shape.head_dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kk, vv = torch.empty_like(k), torch.empty_like(v)

    def copy():
        kk.copy_(k)
        vv.copy_(v)

    us = time_graph(copy, rep_ms)
    return {"format": "torch copy (ceiling)", "tokens": tokens, "us": us,
            "input_TBps": 2 * k.numel() * k.element_size() / us / 1e6}


# --tune: decode kernel variants, tiles, warps, stages and splits for the quantized formats, in one
# run (an estimate, not yet timed: 5-8 minutes on an H200 with the default shapes and formats,
# mostly compiling; --budget-s stops it and keeps what it measured). Each entry: (name, variant,
# kwargs for decode_paged_attention). Ordered by priority: the first entries run on every case
# before the next entry starts. Sessions 3-5 also swept "fma" (CUDA-core dot products) and "dott"
# (scores as K @ q^T) configs; neither variant won since session 4 and both were removed in session 6
# (their rows: results/attention_tune*/ up to _s5).
TUNE_CONFIGS = [
    ("auto", "auto", {}),  # the default (plan_decode's variant choice and heuristics)
    ("dot", "dot", {}),  # fp16 MMAs with the default tile (the baseline of "dot default us")
    ("dot-r128", "dot", {"maxnreg": 128}),  # ncu: int8 runs 2 CTAs/SM, limited by 200 registers
    ("dot-r168", "dot", {"maxnreg": 168}),
    ("dot-bn64-r128", "dot", {"block_n": 64, "maxnreg": 128}),
    ("dot-nocvt", "dot", {"fast_cvt": False}),
    ("dot-bn256-w4", "dot", {"block_n": 256, "num_warps": 4}),
    ("dot-bn256-w8", "dot", {"block_n": 256, "num_warps": 8}),
    ("dot-bn128-w8", "dot", {"block_n": 128, "num_warps": 8}),
    ("dot-bn128-w4-s3", "dot", {"block_n": 128, "num_warps": 4, "num_stages": 3}),
    ("dot-bn256-w8-s3", "dot", {"block_n": 256, "num_warps": 8, "num_stages": 3}),
    ("dot-bn64-w4-s3", "dot", {"block_n": 64, "num_warps": 4, "num_stages": 3}),
    ("dot-bn128-w4-s1", "dot", {"block_n": 128, "num_warps": 4, "num_stages": 1}),  # no smem pipelining
    ("dot-bn512-w8", "dot", {"block_n": 512, "num_warps": 8}),
    # session-3 diagnosis: the per-tile cost is fixed work (cross-warp softmax reductions, barriers,
    # P re-layout), not bytes. One or two warps per CTA need no cross-warp reduction; small tiles keep
    # registers low enough for ~10 CTAs per SM (AOT, sm_90: bn32-w1 189 registers, 20.5 KB shared;
    # bn64-w2 195 registers, 38.9 KB). Not yet measured: run with --tune-splits 1,2,4.
    ("dot-bn32-w1", "dot", {"block_n": 32, "num_warps": 1}),
    ("dot-bn64-w2", "dot", {"block_n": 64, "num_warps": 2}),
    ("dot-bn32-w2", "dot", {"block_n": 32, "num_warps": 2}),
    # session 4: dot-bn32-w1 won every shape and format (0.86-0.97x bf16 against 1.05-1.24x), best with
    # the most splits tried (~8 one-warp programs per SM); its neighbours:
    ("dot-bn16-w1", "dot", {"block_n": 16, "num_warps": 1}),
    ("dot-bn64-w1", "dot", {"block_n": 64, "num_warps": 1}),
    ("dot-bn32-w1-s3", "dot", {"block_n": 32, "num_warps": 1, "num_stages": 3}),
    ("dot-bn32-w1-s1", "dot", {"block_n": 32, "num_warps": 1, "num_stages": 1}),
    ("dot-bn64-w1-s1", "dot", {"block_n": 64, "num_warps": 1, "num_stages": 1}),
    ("dot-bn16-w1-s1", "dot", {"block_n": 16, "num_warps": 1, "num_stages": 1}),
    # then dot-bn64-w1-s1 won every quantized case (0.60-0.90x bf16); its neighbours:
    ("dot-bn128-w1-s1", "dot", {"block_n": 128, "num_warps": 1, "num_stages": 1}),
    ("dot-bn64-w2-s1", "dot", {"block_n": 64, "num_warps": 2, "num_stages": 1}),
    ("dot-bn128-w2-s1", "dot", {"block_n": 128, "num_warps": 2, "num_stages": 1}),
    ("dot-bn64-w1-s1-nocvt", "dot", {"block_n": 64, "num_warps": 1, "num_stages": 1, "fast_cvt": False}),
    # session 4, after the GPU calls: int32 offsets, unsigned block indexing, unmasked whole tiles
    # and fewer scale ops in the default kernel (SASS per 64-token tile, sm_90: int8 2194 -> 1524
    # instructions, int4 2145 -> 1759, fp8_e4m3 2597 -> 1673, bf16 2x898 -> 2x410); int64 offsets for
    # comparison (`dot` is the default configuration, whatever it is):
    ("dot-idx64", "dot", {"index64": True}),
    # session 5: int32 offsets measured no different from int64 (within 2 %); a LAZY experiment (softmax
    # references moved on large jumps only) measured 0-7 % slower and was removed. The quantized
    # one-warp programs sit at 255 registers (8 per SM) and issue each tile's loads only after the
    # previous tile's math: L2 prefetch of the tile `prefetch` tiles ahead, and register caps that fit
    # more programs per SM (run with --tune-splits 1,2):
    ("dot-pf1", "dot", {"prefetch": 1}),
    ("dot-pf2", "dot", {"prefetch": 2}),
    ("dot-pf4", "dot", {"prefetch": 4}),
    ("dot-pf2-r168", "dot", {"prefetch": 2, "maxnreg": 168}),
    ("dot-bn32-w1-pf2", "dot", {"block_n": 32, "num_warps": 1, "prefetch": 2}),
    ("dot-bn128-w1-s1-pf2", "dot", {"block_n": 128, "num_warps": 1, "num_stages": 1, "prefetch": 2}),
    # session 5, after the GPU calls: the Gluon kernel with codes loaded in the MMA fragment layout
    # (no shared memory, 200-237 registers; SASS per 64-token tile, sm_90: int8 1633 against dot's
    # 1524, fp8_e4m3 1820 / 1673, int8-static 1345 / 1330): not yet timed; 8-bit formats only.
    ("frag", "frag", {}),
    # session 6: frag measured 6 % faster than dot at 1024 tokens per program (batch >= 32), 3-15 %
    # slower at 256-512 (1 x 32768, 8 x 8192). "imma": int8 K codes straight into an int8 MMA with q
    # as two int8 parts (SASS per 64-token tile, sm_90: int8 1524 -> 1252, int8-static 1330 -> 1037).
    ("imma", "imma", {}),
    ("imma-pf1", "imma", {"prefetch": 1}),
    # session 9 (ncu at 32 x 4096: frag-int8 3.5 TB/s, 12.5 % occupancy, half its stalls waiting on its
    # loads, against bf16's 4.2 TB/s with cp.async pipelining): frag with whole tiles copied 1 or 2
    # tiles ahead through a cp.async ring in shared memory (33 / 50 KB per program: 6 / 4 per SM)
    ("frag-pf1", "frag", {"prefetch": 1}),
    ("frag-pf2", "frag", {"prefetch": 2}),
    # session 16: int4 in "frag" (dequantized in registers; PREFETCH is an L2 prefetch distance there,
    # default 1): sm_90 SASS 2147 instructions per 64-token tile, no shared memory, 251 registers
    ("frag-pf0", "frag", {"prefetch": 0}),
    ("frag-r168", "frag", {"maxnreg": 168}),
    ("frag-r128", "frag", {"maxnreg": 128}),
    # int4 "dot" (32-token tiles) compiles without spills down to 216 registers (9 programs per SM
    # against 8), with 14 / 19 spilled words at 200 / 184 (sm_90 SASS, session 16)
    ("dot-r216", "dot", {"maxnreg": 216}),
    ("dot-r200", "dot", {"maxnreg": 200}),
    ("dot-r184", "dot", {"maxnreg": 184}),
    # session 10: the split merge fused into the decode kernels (the last split program merges) against
    # `_merge_kernel` as a second launch, every variant at its own plan (run with --tune-splits 0)
    ("auto-separate", "auto", {"merge": "separate"}),
    ("auto-fused", "auto", {"merge": "fused"}),
    # session 18: both products transposed ("fragt", the query heads as the MMA's n = 8): "auto" for int4
    # (0.84-0.99x dot); 8-bit codes asked for only (sm_90: 168-206 registers against frag's 240-246;
    # int8-static spill-free at 168): session 19 timed them at 0.98-1.11x frag / imma, results/attention_s19
    ("fragt", "fragt", {}),
    ("fragt-r168", "fragt", {"maxnreg": 168}),
    ("fragt-fused", "fragt", {"merge": "fused"}),
    # session 26: int4 "fragt" through its cp.async ring (whole tiles a tile ahead; the default where it fits,
    # `decode_plan.int4_ring_default`) against its direct loads, and the ring's split counts and merges
    ("fragt-direct", "fragt", {"ring4": 0}),
    ("fragt-ring1", "fragt", {"ring4": 1}),
    ("fragt-ring1-separate", "fragt", {"ring4": 1, "merge": "separate"}),
    ("fragt-ring1-fused", "fragt", {"ring4": 1, "merge": "fused"}),
    # ncu at 32 x 4096 (results/int4_ring_s26/ncu): 255 registers, 8 programs an SM, 1.87 warps a scheduler, issue
    # slots 50 % busy; a register cap only pays with a grid that fills the extra programs (--tune-splits 1.25)
    ("fragt-ring1-r168", "fragt", {"ring4": 1, "maxnreg": 168}),
    ("fragt-ring1-r128", "fragt", {"ring4": 1, "maxnreg": 128}),
    ("fragt-ring1-r168-fused", "fragt", {"ring4": 1, "maxnreg": 168, "merge": "fused"}),
]
TUNE_FORMATS = ["int8", "fp8_e4m3", "int4", "fp8_e5m2"]
TUNE_SHAPES = ["llama8b-1x32768", "llama8b-8x8192", "llama8b-32x4096", "llama8b-64x2048", "llama8b-128x1024"]
# time vs kvpack bf16 at context >= 2048 (issue targets)
TARGETS = {"int8": 0.55, "int8-static": 0.55, "fp8_e4m3": 0.60, "fp8_e5m2": 0.60, "int4": 0.33}


def _tune_kwargs(variant: str, cfg: dict, shape: Shape, lc, dev: torch.device) -> tuple[dict, int]:
    """decode_paged_attention kwargs (without num_splits) and the heuristic split count."""
    from kvpack.kernels.decode_attention import choose_num_splits, default_tile

    kw = dict(cfg)
    # the split count the launcher would pick for this tile (default_tile where cfg is silent)
    bn, nw, _ = default_tile(lc.k, lc.v, shape.head_dim)
    base = choose_num_splits(shape.batch, shape.hkv, shape.context, kw.get("block_n", bn), dev,
                             kw.get("num_warps", nw), shape.head_dim, not (lc.k.fmt.kind == lc.v.fmt.kind == "float"))
    return kw, base


def tune(shapes, formats, device, rep_ms, gen, budget_s: float = 540.0, out_path: str | None = None,
         configs=None, split_mults=(0.5, 1, 2), layers: int = 1) -> list[dict]:
    """Every config of TUNE_CONFIGS (or the names in `configs`) on every (shape, format) at splits
    base * split_mults (base: the launcher's heuristic); each result is checked against the dot output. bf16 (dot,
    default) is timed per shape as the baseline. Rows go to out_path after every config. layers > 1: each time
    is that of one graph of `layers` calls, each on its own cache (as the table's "us / layer"), / layers."""
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    t0 = time.time()
    cases = {}
    for shape in shapes:
        for fmt_name in ["bf16", *formats]:
            cases[(shape.name, fmt_name)] = (shape, *make_case(fmt_name, shape, device, gen))
    rows, ref_out, bf16_us = [], {}, {}

    def timed(key, call) -> float:
        """us of call(lc, meta, q) on the case of key; layers > 1: per call of a graph of `layers` (the
        extra caches are made here and freed after)."""
        shape, lc, meta, q = cases[key]
        if layers <= 1:
            return time_graph(lambda: call(lc, meta, q), rep_ms)
        more = [make_case(key[1], shape, device, gen) for _ in range(layers - 1)]

        def step():
            call(lc, meta, q)
            for c in more:
                call(*c)

        us = time_graph(step, rep_ms) / layers
        torch.cuda.empty_cache()
        return us

    for shape in shapes:
        bf16_us[shape.name] = timed((shape.name, "bf16"), lambda lc, meta, q, s=shape: decode_paged_attention(
            q, lc, meta, s.head_dim ** -0.5, variant="dot"))
    for name, variant, cfg in [c for c in TUNE_CONFIGS if configs is None or c[0] in configs]:
        print(f"TUNE config {name} {cfg} at {time.time() - t0:.0f} s", flush=True)
        for shape in shapes:
            for fmt_name in formats:
                if time.time() - t0 > budget_s:
                    print(f"TUNE budget {budget_s:.0f} s reached: stopping", flush=True)
                    return rows
                _, lc, meta, q = cases[(shape.name, fmt_name)]
                scale = shape.head_dim ** -0.5
                kw, base = _tune_kwargs(variant, cfg, shape, lc, q.device)
                if (shape.name, fmt_name) not in ref_out:
                    ref_out[(shape.name, fmt_name)] = decode_paged_attention(q, lc, meta, scale, variant="dot").float()
                ref = ref_out[(shape.name, fmt_name)]
                # multiplier 0: the plan's own split count (num_splits=None)
                for splits in sorted({min(256, max(1, int(base * m))) if m else 0 for m in split_mults}):
                    row = {"shape": shape.name, "format": fmt_name, "config": name, "variant": variant,
                           **{k: v for k, v in cfg.items()}, "block_n": kw.get("block_n"), "splits": splits,
                           "kv_bytes": kv_bytes(lc, shape), "bf16_us": bf16_us[shape.name], "layers": layers}
                    try:
                        fn = lambda: decode_paged_attention(q, lc, meta, scale, num_splits=splits or None,  # noqa: E731
                                                            variant=variant, **kw)
                        out = fn().float()
                        plan = plan_decode(q, lc, meta, scale, num_splits=splits or None, variant=variant, **kw)
                        row["plan_variant"], row["plan_splits"] = plan.variant, plan.grid[2]
                        row["fused_merge"] = plan.merge_grid is None and plan.grid[2] > 1
                        row["max_diff_vs_dot"] = ((out - ref).abs() / (1 + ref.abs())).max().item()
                        row["us"] = timed((shape.name, fmt_name), lambda lc_, meta_, q_: decode_paged_attention(
                            q_, lc_, meta_, scale, num_splits=splits or None, variant=variant, **kw))
                    except Exception as e:  # a config that does not compile or launch: recorded
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        print(f"  tune fail {shape.name} {fmt_name} {name} splits={splits}: {row['error'][:120]}",
                              flush=True)
                        rows.append(row)
                        continue
                    row["TBps"] = row["kv_bytes"] / row["us"] / 1e6
                    row["vs_bf16"] = row["us"] / row["bf16_us"]
                    bad = row["max_diff_vs_dot"] > 2e-2
                    print(f"{shape.name:18s} {fmt_name:9s} {name:16s} sp={splits:3d} "
                          f"({row['plan_variant']} {row['plan_splits']}{' fused' if row['fused_merge'] else ''}) "
                          f"{row['us']:8.1f} us "
                          f"{row['TBps']:5.2f} TB/s {row['vs_bf16']:5.2f}x bf16  diff {row['max_diff_vs_dot']:.1e}"
                          + ("  WRONG" if bad else ""), flush=True)
                    rows.append(row)
        if out_path:
            with open(out_path, "w") as f:
                json.dump({"rows": rows, "partial": True}, f, indent=1)
    return rows


def tune_summary(rows: list[dict]) -> str:
    """Per (shape, format): the default dot time, the best config of every variant, the best ratio
    to bf16 (any variant) and the issue's target."""
    ok = [r for r in rows if "us" in r and r.get("max_diff_vs_dot", 1) <= 2e-2]
    variants = list(dict.fromkeys(r["variant"] for r in ok))
    lines = ["| shape | format | dot default us | " + " | ".join(f"best {v}" for v in variants)
             + " | best vs bf16 | target |",
             "|---|---|---:|" + "---|" * len(variants) + "---:|---:|"]
    for key in dict.fromkeys((r["shape"], r["format"]) for r in ok):
        rs = [r for r in ok if (r["shape"], r["format"]) == key]
        dflt_us = min((r["us"] for r in rs if r["config"] == "dot"), default=None)
        cells = []
        for v in variants:
            b = min((r for r in rs if r["variant"] == v), key=lambda r: r["us"], default=None)
            cells.append(b and f"{b['us']:.1f} us {b['TBps']:.2f} TB/s ({b['config']}, sp {b['splits']})" or "-")
        best = min(rs, key=lambda r: r["us"])
        lines.append(f"| {key[0]} | {key[1]} | {dflt_us and f'{dflt_us:.1f}'} | " + " | ".join(cells)
                     + f" | {best['vs_bf16']:.2f} | {TARGETS.get(key[1], '-')} |")
    return "\n".join(lines) + "\n"


def environment(argv) -> dict:
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:
            return ""

    import triton

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # KVPACK_COMMIT=... first: a copied tree (the GPU box) may carry a stale .git
    commit = os.environ.get("KVPACK_COMMIT") or sh(["git", "-C", root, "rev-parse", "HEAD"])
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        commit = "unknown"
    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
            "driver": sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "commit": commit, "command": " ".join(argv),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def markdown(results: dict) -> str:
    env = results["env"]
    fmts = list(dict.fromkeys(r["format"] for r in results["decode"]))
    by = {(r["shape"], r["format"]): r for r in results["decode"]}
    layers = next((r["layers"] for r in results["decode"] if "layers" in r), "-")
    lines = [f"# Decode paged attention, {env['gpu']}", "",
             f"driver {env['driver']}, torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, "
             f"commit `{env['commit'][:12]}`, {env['time']}", "", f"`{env['command']}`", "",
             "Median us per decode step (CUDA graph replay, L2 flushed), TB/s of KV bytes read "
             "(codes + scales), time relative to kvpack bf16 and to the best torch SDPA backend "
             "(bf16, contiguous). vLLM: their Triton kernel's us from the issue. Per layer: a graph of "
             f"{layers} decode calls, each on its own cache of the same shape and format (an engine step's "
             "layers; the replay's fixed cost, ~10 us on an H200, shared by them), its time / "
             f"{layers}.", "",
             "| shape | format | us | TB/s | vs bf16 | vs SDPA | SDPA cudnn / flash us | vLLM us | us / layer | "
             "TB/s | vs bf16 | check |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for shape in dict.fromkeys(r["shape"] for r in results["decode"]):
        sd = results["sdpa"].get(shape, {})
        sd_us = [v["us"] for v in sd.values() if v.get("us")]
        sd_txt = " / ".join(f"{v['us']:.1f}" if v.get("us") else "n/a" for v in sd.values()) or "-"
        bf = by.get((shape, "bf16"))
        for f in fmts:
            r = by.get((shape, f))
            if r is None:
                continue
            vs_bf = f"{r['us'] / bf['us']:.2f}" if bf else "-"
            vs_sd = f"{r['us'] / min(sd_us):.2f}" if sd_us else "-"
            vl = results["vllm_us"].get(f.split("-")[0] if f != "int8-static" else "-", {}).get(shape)
            chk = f"{r['check_err']:.1e}" if "check_err" in r else "-"
            lay = "- | - | -"
            if "us_layer" in r:
                vs_l = f"{r['us_layer'] / bf['us_layer']:.2f}" if bf and "us_layer" in bf else "-"
                lay = f"{r['us_layer']:.1f} | {r['TBps_layer']:.2f} | {vs_l}"
            lines.append(f"| {shape} | {f} | {r['us']:.1f} | {r['TBps']:.2f} | {vs_bf} | {vs_sd} | "
                         f"{sd_txt if f == fmts[0] else ''} | {vl or '-'} | {lay} | {chk} |")
    lines += ["", "## Cache write (Triton, bf16 input K and V)", "",
              "torch copy: a device-to-device copy of the same input (read and written once), the ceiling "
              "of a cache write that stores as many bytes as it reads (bf16). Slots: `random`, every token "
              "in a random slot (the worst case); `blocks`, a prompt's mapping (whole blocks in a random "
              "order, consecutive tokens inside each).", "",
              "| format | tokens | slots | us | TB/s of input | time vs torch copy |", "|---|---:|---|---:|---:|---:|"]
    copy_us = {w["tokens"]: w["us"] for w in results["write"] if w["format"].startswith("torch copy")}
    for w in results["write"]:
        vs = f"{w['us'] / copy_us[w['tokens']]:.2f}" if w["tokens"] in copy_us else "-"
        lines.append(f"| {w['format']} | {w['tokens']} | {w.get('slots', '-')} | {w['us']:.1f} | "
                     f"{w['input_TBps']:.2f} | {vs} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    shapes = list(dict.fromkeys(r["shape"] for r in results["decode"]))
    if not shapes:  # --write-only: the table has the rows
        return
    fmts = list(dict.fromkeys(r["format"] for r in results["decode"]))
    by = {(r["shape"], r["format"]): r["us"] for r in results["decode"]}
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(shapes)), 4.5))
    series = [(f, [by.get((s, f), 0) for s in shapes]) for f in fmts]
    sd = [min([v["us"] for v in results["sdpa"].get(s, {}).values() if v.get("us")] or [0]) for s in shapes]
    if any(sd):
        series.append(("SDPA bf16 (best)", sd))
    width = 0.8 / len(series)
    for i, (name, ys) in enumerate(series):
        ax.bar([x + i * width for x in range(len(shapes))], ys, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))], shapes, rotation=15, fontsize=8)
    ax.set_ylabel("us per decode step (lower is better)")
    ax.set_title(f"kvpack decode attention, {results['env']['gpu']}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_reports(results: dict, out: str) -> None:
    with open(os.path.join(out, "bench_attention.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = markdown(results)
    with open(os.path.join(out, "bench_attention.md"), "w") as f:
        f.write(md)
    plot(results, os.path.join(out, "bench_attention.png"))
    print(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 shapes, shorter timing")
    ap.add_argument("--check", action="store_true", help="compare each kernel with the reference first")
    ap.add_argument("--tune", action="store_true",
                    help="sweep variant (auto/dot/imma/frag) x tile x warps x stages x splits for the quantized formats instead")
    ap.add_argument("--tune-configs", default=None, help="--tune: comma-separated TUNE_CONFIGS names")
    ap.add_argument("--tune-layers", type=int, default=1,
                    help="--tune: time a graph of this many calls, each on its own cache, per call (as --layers)")
    ap.add_argument("--tune-splits", default="1,2", help="--tune: split multipliers of the heuristic (0.5,1,2; 0: the plan's own)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="--tune: stop after this many seconds")
    ap.add_argument("--shapes", default=None, help="comma-separated shape names")
    ap.add_argument("--block-size", type=int, default=16, help="KV cache block size (tokens) of every shape")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--write-only", action="store_true", help="only the cache-write rows (no decode shapes)")
    ap.add_argument("--rep-ms", type=int, default=None)
    ap.add_argument("--layers", type=int, default=8,
                    help="also time a graph of this many decode calls, each on its own cache (an engine step's "
                         "layers): us per layer without the per-graph overhead (1: off)")
    ap.add_argument("--out", default="results/attention")
    ap.add_argument("--write-tokens", default="64,2048,16384,65536",
                    help="cache write: tokens per launch (comma-separated; a torch copy of the same bytes each)")
    ap.add_argument("--write-slots", default=",".join(WRITE_SLOTS),
                    help="cache write: slot mappings (comma-separated): random, blocks (a prompt's; see write_slots)")
    args = ap.parse_args(argv)
    bad = [p for p in args.write_slots.split(",") if p not in WRITE_SLOTS]
    if bad:  # before the decode rows, not after them
        ap.error(f"--write-slots: unknown slot mapping {', '.join(bad)} (expected {', '.join(WRITE_SLOTS)})")
    if not torch.cuda.is_available():
        print("bench_attention: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    names = args.shapes.split(",") if args.shapes else (QUICK_SHAPES if args.quick else [s.name for s in SHAPES])
    if args.write_only:
        names = []
    shapes = [replace(s, block_size=args.block_size) for s in SHAPES if s.name in names]
    formats = args.formats.split(",")
    rep = args.rep_ms or (40 if args.quick else 100)
    env = environment(sys.argv)
    print(json.dumps(env), flush=True)
    os.makedirs(args.out, exist_ok=True)
    if args.tune:
        if not args.shapes:
            shapes = [replace(s, block_size=args.block_size) for s in SHAPES if s.name in TUNE_SHAPES]
        tformats = formats if args.formats != ",".join(FORMATS) else TUNE_FORMATS
        path = os.path.join(args.out, "tune.json")
        configs = args.tune_configs.split(",") if args.tune_configs else None
        unknown = set(configs or ()) - {c[0] for c in TUNE_CONFIGS}
        if unknown:
            ap.error(f"--tune-configs: unknown {', '.join(sorted(unknown))}")
        rows = tune(shapes, tformats, device, args.rep_ms or 30, gen,
                    args.budget_s, path, configs, [float(m) for m in args.tune_splits.split(",")],
                    args.tune_layers)
        summary = tune_summary(rows)
        with open(path, "w") as f:
            json.dump({"env": env, "rows": rows, "summary": summary}, f, indent=1)
        with open(os.path.join(args.out, "tune.md"), "w") as f:
            f.write(f"# Decode tune, {env['gpu']}, commit `{env['commit'][:12]}`\n\n`{env['command']}`\n\n{summary}")
        print(summary)
        return 0

    from kvpack.kernels.decode_attention import decode_paged_attention

    results = {"env": env, "decode": [], "sdpa": {}, "write": [], "vllm_us": VLLM_US}
    for shape in shapes:
        scale = shape.head_dim ** -0.5
        if not args.no_sdpa:
            results["sdpa"][shape.name] = bench_sdpa(shape, device, rep, gen)
        for fmt_name in formats:
            lc, meta, q = make_case(fmt_name, shape, device, gen)
            row = {"shape": shape.name, "batch": shape.batch, "context": shape.context, "format": fmt_name,
                   "kv_bytes": kv_bytes(lc, shape)}
            if args.check:
                row["check_err"] = check_case(lc, meta, q, scale)
            row["us"] = time_graph(lambda: decode_paged_attention(q, lc, meta, scale), rep)
            row["TBps"] = row["kv_bytes"] / row["us"] / 1e6
            if args.layers > 1:  # as in an engine's decode step: one graph, a call per layer on its own cache
                cases = [(lc, meta, q)] + [make_case(fmt_name, shape, device, gen) for _ in range(args.layers - 1)]

                def step():
                    for c in cases:
                        decode_paged_attention(c[2], c[0], c[1], scale)

                row["layers"] = args.layers
                row["us_layer"] = time_graph(step, rep) / args.layers
                row["TBps_layer"] = row["kv_bytes"] / row["us_layer"] / 1e6
                del cases, step
            results["decode"].append(row)
            print(f"{shape.name:18s} {fmt_name:12s} {row['us']:8.1f} us {row['TBps']:5.2f} TB/s"
                  + (f" | {row['us_layer']:8.1f} us/layer {row['TBps_layer']:5.2f} TB/s" if "us_layer" in row else "")
                  + (f"  check {row['check_err']:.1e}" if "check_err" in row else ""), flush=True)
            del lc, meta, q
            torch.cuda.empty_cache()
    wshape = Shape("write", 1, 1, 32, 8, 128)
    write_tokens = [int(t) for t in args.write_tokens.split(",") if t]
    results["write"] += [bench_copy(wshape, device, rep, t) for t in write_tokens]
    for fmt_name in formats:
        for t in write_tokens:
            for pattern in args.write_slots.split(","):
                results["write"].append(bench_write(fmt_name, wshape, device, rep, t, pattern))
    write_reports(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
