"""One decode step per format at one Llama-3.1-8B shape, for a profiler to wrap (no timing here).

    ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \\
        -k regex:_decode_kernel --launch-skip 1 --launch-count 1 \\
        python benchmarks/profile_decode.py --format int8 --shape llama8b-32x4096

Each format runs twice (the first launch compiles); profile the second (--launch-skip 1).
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
    args = ap.parse_args()
    from kvpack.kernels.decode_attention import decode_paged_attention

    shape = next(s for s in SHAPES if s.name == args.shape)
    lc, meta, q = make_case(args.format, shape, torch.device("cuda"), torch.Generator().manual_seed(0))
    for _ in range(2):
        decode_paged_attention(q, lc, meta, shape.head_dim ** -0.5, variant=args.variant)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
