"""Where a decode call's fixed cost goes (H200): per-layer time (a CUDA graph of `--layers` calls, each on
its own cache) against the tiles each program reads, at a fixed grid, for the kernel alone and with its
split merge. A straight-line fit over the tile counts gives, per format, the time per tile-round and the
intercept: what a call costs whatever the context (launch, prologue, first loads, epilogue, tail, merge).
An empty kernel on the same grid times the launch alone.

    python benchmarks/probe_fixed_cost.py [--formats bf16,int8,fp8_e4m3,int4] [--batch 8] [--tiles 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import Shape, environment, kv_bytes, make_case, time_graph  # noqa: E402

# per format: (variant, splits at 8 x 8192, tokens a tile, decode kwargs) as "auto" plans 8 x 8192
CONFIGS = {"bf16": ("dot", 16, 32, {}), "int8": ("frag", 8, 64, {"prefetch": 1}),
           "int8-static": ("frag", 8, 64, {"prefetch": 1}), "fp8_e4m3": ("frag", 8, 64, {"prefetch": 1}),
           "int4": ("fragt", 16, 64, {})}


@triton.jit
def _empty_kernel(x_ptr):
    if tl.program_id(0) < 0:  # never: an empty program that still takes a launch
        tl.store(x_ptr, 0)


def fit(xs, ys) -> tuple[float, float]:
    """Least-squares (slope, intercept)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="bf16,int8,fp8_e4m3,int4")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tiles", default="1,2,4,8,16", help="tiles per program (the context follows)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rep-ms", type=int, default=20)
    ap.add_argument("--out", default="probe_fixed_cost.json")
    args = ap.parse_args()
    from kvpack.kernels.decode_attention import _merge_kernel, plan_decode

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    env = environment(sys.argv)
    print(json.dumps(env), flush=True)
    rows = []
    x = torch.zeros(1, device=dev)
    for fmt in args.formats.split(","):
        variant, splits, tile, kw = CONFIGS[fmt]
        grid = (args.batch, 8, splits)
        us_empty = time_graph(lambda: [_empty_kernel[grid](x) for _ in range(args.layers)], args.rep_ms) / args.layers
        print(f"{fmt}: empty kernel on grid {grid}: {us_empty:.2f} us a launch", flush=True)
        for t in [int(v) for v in args.tiles.split(",")]:
            shape = Shape(f"{args.batch}x{splits * tile * t}", args.batch, splits * tile * t)
            cases = [make_case(fmt, shape, dev, gen) for _ in range(args.layers)]
            scale = shape.head_dim ** -0.5
            plans = [plan_decode(q, lc, meta, scale, num_splits=splits, variant=variant, **kw) for lc, meta, q in cases]
            assert plans[0].grid == grid and plans[0].variant == variant, (plans[0].grid, plans[0].variant)
            assert plans[0].post is None and not plans[0].rotate_q, "rotations outside the kernel: not timed here"

            def kernels(merge: bool):
                for p in plans:
                    p.kernel[p.grid](*p.args, **p.options)
                    if merge and p.merge_grid is not None:
                        _merge_kernel[p.merge_grid](*p.merge_args, **(p.merge_options or {}))

            row = {"format": fmt, "variant": variant, "grid": list(grid), "tiles": t, "context": shape.context,
                   "kv_bytes": kv_bytes(cases[0][0], shape), "separate_merge": plans[0].merge_grid is not None,
                   "us_empty": us_empty}
            row["us_kernel"] = time_graph(lambda: kernels(False), args.rep_ms) / args.layers
            row["us_call"] = time_graph(lambda: kernels(True), args.rep_ms) / args.layers
            rows.append(row)
            print(f"{fmt:12s} tiles {t:3d} ctx {shape.context:6d}: kernel {row['us_kernel']:7.2f} us, "
                  f"with merge {row['us_call']:7.2f} us ({row['kv_bytes'] / row['us_call'] / 1e6:.2f} TB/s)", flush=True)
            cases = plans = None
            torch.cuda.empty_cache()
        fr = [r for r in rows if r["format"] == fmt]
        for key in ("us_kernel", "us_call"):
            slope, icpt = fit([r["tiles"] for r in fr], [r[key] for r in fr])
            print(f"FIT {fmt:12s} {key:9s}: {slope:6.2f} us a tile-round + {icpt:6.2f} us fixed", flush=True)
            for r in fr:
                r[f"fit_{key}"] = [slope, icpt]
    with open(args.out, "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
