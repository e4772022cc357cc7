"""One decode step per format at one Llama-3.1-8B shape, for a profiler to wrap (no timing here).

    ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \\
        -k regex:_decode_kernel --launch-skip 1 --launch-count 1 \\
        python benchmarks/profile_decode.py --format int8 --shape llama8b-32x4096

Each format runs twice (the first launch compiles); profile the second (--launch-skip 1).
`--cases int8:llama8b-32x4096,bf16:smollm2-32x4096,...` runs several cases in one process, each once (the
profiled launch is the one after its compile), in the order given (printed first): profile every launch of
`-k regex:decode_kernel` and read the reports in that order.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import SHAPES, make_case  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="int8")
    ap.add_argument("--shape", default="llama8b-32x4096")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--cases", default=None, help="format:shape,... each run once, in this order")
    ap.add_argument("--splits", type=int, default=None, help="num_splits (default: the plan's)")
    ap.add_argument("--maxnreg", type=int, default=None, help="ptxas register cap (default: none)")
    args = ap.parse_args()
    kw = {"variant": args.variant, "num_splits": args.splits, "maxnreg": args.maxnreg}
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    cases = [c.split(":") for c in args.cases.split(",")] if args.cases else [(args.format, args.shape)]
    for i, (fmt, name) in enumerate(cases):
        shape = next(s for s in SHAPES if s.name == name)
        lc, meta, q = make_case(fmt, shape, torch.device("cuda"), torch.Generator().manual_seed(0))
        scale = shape.head_dim ** -0.5
        plan = plan_decode(q, lc, meta, scale, **kw)
        print(f"case {i}: {fmt} {name}: {plan.variant}, grid {plan.grid}, options {plan.options}, "
              f"merge {'separate' if plan.merge_grid else 'fused or none'}", flush=True)
        for _ in range(1 if args.cases else 2):
            decode_paged_attention(q, lc, meta, scale, **kw)
        torch.cuda.synchronize()
        del lc, meta, q
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
