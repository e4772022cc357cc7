"""sm_90 SASS counts of every kernel variant the AOT test plans (no GPU): shared memory, instructions,
shared-memory loads / stores, barriers, spills (LDL / STL) and shuffles, one line a variant. A scan for
layout staging and spills like the ones that made int4's workspace un-rotation 11x FP8's (session 14,
results/engine_s14/sass_all_variants_sm90.txt).

    python benchmarks/sass_all_variants.py [--arch 90] > sass.txt
    python benchmarks/sass_all_variants.py --loops decode-t4/int4/D128/splits2/separate/pf1,decode-ring/int8/D128

`--loops`: for the named variants only, each loop's instruction mix (the body of every backward branch,
largest first): what one pass of a decode kernel's tile loop issues per warp.
`--dump DIR` (with `--loops`): also write each named variant's PTX and SASS to DIR (name with "/" as "_"), e.g. to
see what ptxas fused in an epilogue (session 45: the merge kernel's o * NORM + V mean, one FFMA).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    # before triton loads (in main, not at import: importing `loop_mixes_of` must not turn a test
    # process's interpreter off): compile, do not interpret
    os.environ["TRITON_INTERPRET"] = "0"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--loops", default=None, help="comma list of variant names: their loops' instruction mix")
    ap.add_argument("--dump", default=None, help="with --loops: write the named variants' PTX and SASS here")
    args = ap.parse_args()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import _runtime as gluon_runtime

    from tests.test_kernels_aot import disassemble, sass_counts, signature, split_options, variants

    loops = args.loops.split(",") if args.loops else None
    if args.dump and not loops:
        ap.error("--dump needs --loops (the variants to write)")
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    if not loops:
        print("# variant, shared bytes, instructions, LDS, STS, BAR, LDL, STL, SHFL (LDL / STL: register spills)")
    for name, fn, fargs, opts in variants():
        if loops and name not in loops:
            continue
        own, opts = split_options(fn, opts)
        sig, consts, attrs = signature(fn, fargs, own)
        gluon = isinstance(fn, gluon_runtime.GluonJITFunction)
        source = (gluon_runtime.GluonASTSource if gluon else triton.compiler.ASTSource)(fn, sig, consts, attrs)
        try:
            ck = triton.compile(source, target=GPUTarget("cuda", args.arch, 32), options=opts)
        except Exception as e:  # reported in the table, the scan goes on
            print((name, "compile error", f"{type(e).__name__}: {str(e)[:80]}"), flush=True)
            continue
        if loops:
            print(f"== {name}: {ck.metadata.shared} bytes shared")
            sass = disassemble(ck.asm["cubin"])
            if args.dump:
                stem = os.path.join(args.dump, name.replace("/", "_"))
                for ext, text in ((".ptx", ck.asm["ptx"]), (".sass", sass)):
                    with open(stem + ext, "w") as f:
                        f.write(text)
            for (start, end), mix in loop_mixes_of(sass):
                ops = sum(mix.values())
                print(f"  loop {start:#x}-{end:#x}: {ops} instructions")
                print("   ", ", ".join(f"{op} {n}" for op, n in mix.most_common(40)))
            continue
        c = sass_counts(ck.asm["cubin"])
        print((name, ck.metadata.shared, sum(c.values()),
               *(c.get(k, 0) for k in ("LDS", "STS", "BAR", "LDL", "STL", "SHFL"))), flush=True)
    return 0


def loop_mixes_of(sass: str) -> list[tuple[tuple[int, int], collections.Counter]]:
    """Each loop of nvdisasm's SASS text (the instructions from a backward branch's target label to the
    branch), largest first, with its instruction counts by full opcode (loads keep their width:
    LDG.E.U16, LDG.E.128)."""
    labels, ins, pending = {}, [], []
    for line in sass.splitlines():
        m = re.match(r"^\s*(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"^\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*);", line)
        if m:
            addr = int(m.group(1), 16)
            labels.update((p, addr) for p in pending)
            pending = []
            ins.append((addr, m.group(2), m.group(3)))
    spans = set()
    for addr, op, rest in ins:
        t = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if t and labels.get(t.group(1), addr) < addr:
            spans.add((labels[t.group(1)], addr))
    out = [(span, collections.Counter(op for a, op, _ in ins if span[0] <= a <= span[1])) for span in spans]
    return sorted(out, key=lambda x: -sum(x[1].values()))


if __name__ == "__main__":
    raise SystemExit(main())
