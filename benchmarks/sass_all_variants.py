"""sm_90 SASS counts of every kernel variant the AOT test plans (no GPU): shared memory, instructions,
shared-memory loads / stores, barriers, spills (LDL / STL) and shuffles, one line a variant. A scan for
layout staging and spills like the ones that made int4's workspace un-rotation 11x FP8's (session 14,
results/engine_s14/sass_all_variants_sm90.txt).

    python benchmarks/sass_all_variants.py [--arch 90] > sass.txt
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before triton loads: compile, do not interpret
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import _runtime as gluon_runtime

    from tests.test_kernels_aot import sass_counts, signature, variants

    print("# variant, shared bytes, instructions, LDS, STS, BAR, LDL, STL, SHFL (LDL / STL: register spills)")
    for name, fn, fargs, opts in variants():
        sig, consts, attrs = signature(fn, fargs)
        gluon = isinstance(fn, gluon_runtime.GluonJITFunction)
        source = (gluon_runtime.GluonASTSource if gluon else triton.compiler.ASTSource)(fn, sig, consts, attrs)
        try:
            ck = triton.compile(source, target=GPUTarget("cuda", args.arch, 32), options=opts)
        except Exception as e:  # reported in the table, the scan goes on
            print((name, "compile error", f"{type(e).__name__}: {str(e)[:80]}"), flush=True)
            continue
        c = sass_counts(ck.asm["cubin"])
        print((name, ck.metadata.shared, sum(c.values()),
               *(c.get(k, 0) for k in ("LDS", "STS", "BAR", "LDL", "STL", "SHFL"))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
