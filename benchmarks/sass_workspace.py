"""Static SASS counts of the prefill workspace's dequantize kernel (no GPU): where its rows go through
shared memory.

Compiles `_dequant_blocks_kernel` ahead of time (Triton's compiler, sm_90 by default) for the engine's
launch at Llama-3.1-8B's shape (8 kv heads, head_dim 128, block 16, bf16 workspace, K and V un-rotated,
V's mean added), disassembles the cubin with the nvdisasm that Triton ships, and prints per format the
shared memory and the counts of the instructions that tell layout conversions (LDS / STS / BAR) from
the work (global loads and stores, shuffles, float math). `--module FILE` compiles another copy of
`kvpack/kernels/prefill_workspace.py` (e.g. an older commit's, from `git show`) instead.

Session 14 found the int4 path 11x slower than FP8's on an H200 (370 against 33 us a layer for 10k
tokens) with a per-channel gather of its group scales: 156 LDS / 161 STS / 25 BAR against FP8's
8 / 4 / 5 (results/engine_s14). `tests/test_kernels_aot.py` keeps int4's counts at FP8's.

    python benchmarks/sass_workspace.py [--formats int4,fp8_e4m3,int8] [--arch 90] [--module FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before triton loads: compile, do not interpret
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="int4,fp8_e4m3,int8")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--module", default=None, help="a copy of kvpack/kernels/prefill_workspace.py to compile")
    args = ap.parse_args()
    from tests.test_kernels_aot import SASS_OPS, workspace_sass

    module = None
    if args.module:
        spec = importlib.util.spec_from_file_location("prefill_workspace_copy", args.module)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    for name, c in workspace_sass(args.formats.split(","), args.arch, module).items():
        ops = sum(v for k, v in c.items() if k not in ("shared", "unrotated"))
        print(f"{name:9s} un-rotated={c['unrotated']!s:5s} sm_{args.arch} shared={c['shared']:5d} B "
              f"instructions={ops:5d} " + " ".join(f"{k}={c.get(k, 0)}" for k in SASS_OPS), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
