"""Probe (not a benchmark table): the cache-write kernel's tile and warp count per format on a GPU.

Times, in one run (CUDA-graph replays, L2 flushed), `write_kv`'s kernel for `--tokens` new tokens of
K and V (Llama-3.1-8B's 8 kv heads, head dim 128, or `--kv-heads` / `--head-dim`; bf16 input, random slots or `--slots`) at each tokens-per-program
(`--block-t`) and warp count (`--warps`), plus a device-to-device copy of the same input bytes (the
ceiling: it reads and writes them). Prints one line per case: us and TB/s of input.

    python benchmarks/probe_write.py --tokens 16384
    python benchmarks/probe_write.py --tokens 65536 --block-t auto --warps 4 --rows 0,1  # the two layouts
    python benchmarks/probe_write.py --tokens 65536 --formats int4 --block-t auto --warps 4 --maxnreg 0,64
    python benchmarks/probe_write.py --tokens 65536 --kv-heads 3 --head-dim 64 --block-t auto  # SmolLM2's K and V
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--formats", default="bf16,int8,int8-static,int4,fp8_e4m3,fp8_e5m2")
    ap.add_argument("--block-t", default="8,16,32")
    ap.add_argument("--warps", default="2,4,8")
    ap.add_argument("--rep-ms", type=int, default=30)
    ap.add_argument("--kv-heads", type=int, default=8, help="kv heads of K and V (default: Llama-3.1-8B's)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--slots", default="random", help="comma list of slot mappings: random, blocks "
                    "(`bench_attention.write_slots`)")
    ap.add_argument("--maxnreg", default="0", help="comma list of register caps per thread (0: none)")
    ap.add_argument("--rows", default="auto", help="comma list of auto / 0 / 1: the launcher's rule, the "
                    "plain layout, the row layout (`cache_write.row_layout`, where the format takes it)")
    args = ap.parse_args()

    from benchmarks.bench_attention import Shape, make_cache, time_graph, write_slots
    from kvpack.kernels.cache_write import _cache_write_kernel, plan_write

    dev = torch.device("cuda")
    torch.manual_seed(0)
    shape = Shape("write", 1, 1, args.kv_heads, args.kv_heads, args.head_dim)
    T = args.tokens
    nb = T // shape.block_size + 1
    k = torch.randn(T, shape.hkv, shape.head_dim, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    in_bytes = 2 * k.numel() * k.element_size()
    kk, vv = torch.empty_like(k), torch.empty_like(v)

    def copy():
        kk.copy_(k)
        vv.copy_(v)

    us = time_graph(copy, args.rep_ms)
    print(f"{'copy (read + write)':24s} {us:8.1f} us {in_bytes / us / 1e6:6.2f} TB/s of input", flush=True)
    for fmt_name in args.formats.split(","):
        lc = make_cache(fmt_name, shape, nb, dev)
        cases = [(sp, r, bt, nw, mr) for sp in args.slots.split(",") for r in args.rows.split(",")
                 for bt in (None if x == "auto" else int(x) for x in args.block_t.split(","))
                 for nw in (int(x) for x in args.warps.split(","))
                 for mr in (int(x) for x in args.maxnreg.split(","))]
        for sp, rows, bt, nw, mr in cases:
            slots = write_slots(sp, T, shape.block_size, dev)
            try:
                grid, kargs, opts = plan_write(k, v, lc, slots, block_t=bt, num_warps=nw,
                                               rows=None if rows == "auto" else rows == "1")
            except ValueError as e:  # a tile the kernel's layout cannot fill
                print(f"{fmt_name:12s} {sp:6s} rows={rows:4s} bt={bt} w={nw} skipped: {e}", flush=True)
                continue
            if mr:
                opts = {**opts, "maxnreg": mr}
            tag = (f"{fmt_name:12s} {sp:6s} rows={rows:4s} ({int(any(kargs[-3:-1]))}) bt={T // grid[0]:3d} w={nw}"
                   + (f" maxnreg={mr}" if mr else ""))
            try:
                us = time_graph(lambda: _cache_write_kernel[grid](*kargs, **opts), args.rep_ms)
            except Exception as e:  # e.g. out of registers / shared memory for a large tile
                print(f"{tag} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            print(f"{tag}  {us:8.1f} us {in_bytes / us / 1e6:6.2f} TB/s of input", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
