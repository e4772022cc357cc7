"""Where a decode step's time goes on the GPU: each kernel's own time against the CUDA-graph replay.

    python benchmarks/probe_decode_breakdown.py [--shapes llama8b-1x32768,...] [--formats bf16,int8,...]

For each shape and format (the plan's default variant and split count): the median time of one CUDA
graph replay (`bench_attention.time_graph`, L2 flushed before each) and, from torch.profiler over eager
calls, every kernel the step launches with its mean GPU time. The replay's time less the kernels' sum
is what the step spends outside them (launch gaps, the ramp of a one-wave grid). The decode kernel's
bytes over its own time is the bandwidth reached while it runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import SHAPES, environment, kv_bytes, make_case, time_graph  # noqa: E402


def kernel_times(fn, iters: int = 20) -> dict[str, float]:
    """{kernel name: mean microseconds per call} of fn's GPU kernels over `iters` eager calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name[:60]] += ev.device_time
    return {k: v / iters for k, v in total.most_common()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="llama8b-1x32768,llama8b-8x8192,llama8b-32x4096,llama8b-128x1024")
    ap.add_argument("--formats", default="bf16,int8,int4,fp8_e4m3")
    ap.add_argument("--rep-ms", type=int, default=15)
    ap.add_argument("--out", default="probe_decode_breakdown.json")
    args = ap.parse_args()
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    gen = torch.Generator().manual_seed(0)
    print(json.dumps(environment(sys.argv)), flush=True)
    rows = []
    for shape in [s for s in SHAPES if s.name in args.shapes.split(",")]:
        scale = shape.head_dim ** -0.5
        for fmt in args.formats.split(","):
            lc, meta, q = make_case(fmt, shape, "cuda", gen)
            plan = plan_decode(q, lc, meta, scale)
            fn = lambda: decode_paged_attention(q, lc, meta, scale)  # noqa: E731
            us = time_graph(fn, args.rep_ms)
            kt = kernel_times(fn)
            main_us = max(kt.values())
            row = {"shape": shape.name, "format": fmt, "variant": plan.variant, "splits": plan.grid[2],
                   "graph_us": us, "kernels_us": kt, "outside_us": us - sum(kt.values()),
                   "TBps_graph": kv_bytes(lc, shape) / us / 1e6, "TBps_main_kernel": kv_bytes(lc, shape) / main_us / 1e6}
            rows.append(row)
            ks = "; ".join(f"{k[:28]} {v:.1f}" for k, v in kt.items())
            print(f"{shape.name:18s} {fmt:9s} {plan.variant:5s} sp={plan.grid[2]:3d} graph {us:6.1f} us "
                  f"({row['TBps_graph']:.2f} TB/s), main kernel {row['TBps_main_kernel']:.2f} TB/s, "
                  f"outside {row['outside_us']:5.1f} us | {ks}", flush=True)
            del lc, meta, q
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"env": environment(sys.argv), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
