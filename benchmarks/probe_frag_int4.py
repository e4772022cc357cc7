"""int4 decode on an H200: "dot" against "frag" (codes dequantized in the MMA fragment layout) and
"fragt" (both products transposed; session 18's "fragt-halves*" ran e49d610's KVPACK_FRAGT_HALVES), with or
without the L2 prefetch and either split merge, at #4's Llama-3.1-8B shapes and split counts around
the plan's. Each output is checked against "dot". `--formats int8,fp8_e4m3 --configs auto,imma,frag,fragt`
times the 8-bit codes the same way (their "fragt": direct loads, no cp.async ring).

    python benchmarks/probe_frag_int4.py [--shapes llama8b-32x4096,...] [--rep-ms 15] [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import SHAPES, environment, kv_bytes, make_case, time_graph  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llama8b-1x32768,llama8b-8x8192,llama8b-32x4096,llama8b-64x2048,llama8b-128x1024")
    ap.add_argument("--formats", default="int4")
    ap.add_argument("--rep-ms", type=int, default=15)
    ap.add_argument("--split-mults", default="0.5,1,2")
    ap.add_argument("--block-sizes", default="16", help="KV cache block sizes (tokens), each a full run")
    ap.add_argument("--configs", default="dot,frag,fragt,fragt-pf0,fragt-fused")
    ap.add_argument("--out", default="probe_frag_int4.json")
    args = ap.parse_args()
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    gen = torch.Generator().manual_seed(0)
    rows = []
    print(json.dumps(environment(sys.argv)), flush=True)
    shapes = [replace(s, block_size=int(bs)) for bs in args.block_sizes.split(",")
              for s in SHAPES if s.name in args.shapes.split(",")]
    # name: (variant, environment KVPACK_FRAGT_HALVES (e49d610 only), keyword arguments)
    configs = {"dot": ("dot", "", {}), "frag": ("frag", "", {}), "frag-pf0": ("frag", "", {"prefetch": 0}),
               "frag-pf2": ("frag", "", {"prefetch": 2}), "auto": (None, "", {}),
               "fragt": ("fragt", "", {}), "fragt-pf0": ("fragt", "", {"prefetch": 0}),
               "fragt-pf2": ("fragt", "", {"prefetch": 2}),
               "fragt-fused": ("fragt", "", {"merge": "fused"}), "fragt-sep": ("fragt", "", {"merge": "separate"}),
               "frag-fused": ("frag", "", {"merge": "fused"}), "dot-sep": ("dot", "", {"merge": "separate"}),
               "imma": ("imma", "", {}), "fragt-r168": ("fragt", "", {"maxnreg": 168})}
    for shape in shapes:
        bf = make_case("bf16", shape, "cuda", gen)
        scale = shape.head_dim ** -0.5
        bf16_us = time_graph(lambda: decode_paged_attention(bf[2], bf[0], bf[1], scale, variant="dot"), args.rep_ms)
        for fmt in args.formats.split(","):
            lc, meta, q = make_case(fmt, shape, "cuda", gen)
            ref = decode_paged_attention(q, lc, meta, scale, variant="dot").float()
            if fmt == "bf16":
                ref = None
            for name in args.configs.split(","):
                variant, env, kw = configs[name]
                os.environ["KVPACK_FRAGT_HALVES"] = env
                base = plan_decode(q, lc, meta, scale, variant=variant, **kw).grid[2]
                for m in [float(x) for x in args.split_mults.split(",")]:
                    sp = max(1, int(base * m))
                    fn = lambda: decode_paged_attention(q, lc, meta, scale, num_splits=sp, variant=variant, **kw)  # noqa: E731
                    out = fn().float()
                    diff = 0.0 if ref is None else ((out - ref).abs() / (1 + ref.abs())).max().item()
                    us = time_graph(fn, args.rep_ms)
                    row = {"shape": shape.name, "block_size": shape.block_size, "format": fmt, "config": name, "splits": sp, "us": us,
                           "TBps": kv_bytes(lc, shape) / us / 1e6, "vs_bf16": us / bf16_us, "bf16_us": bf16_us,
                           "diff_vs_dot": diff}
                    rows.append(row)
                    print(f"{shape.name:18s} bs{shape.block_size:<3d} {fmt:6s} {name:15s} sp={sp:3d} {us:7.1f} us {row['TBps']:.2f} TB/s "
                          f"{row['vs_bf16']:.2f}x bf16 diff {diff:.1e}" + ("  WRONG" if diff > 2e-2 else ""), flush=True)
    with open(args.out, "w") as f:
        json.dump({"env": environment(sys.argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
