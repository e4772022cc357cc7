"""Session 37 A/B of ALL_Q in `_decode_kernel` ("dot" / "imma": `decode_attention.ALL_Q_VARIANTS` with and without
them; session 36's allq_ab.py toggled the Gluon kernels'),
per layer (a graph of 8 decode calls, each on its own cache, L2 flushed: bench_attention's "per layer"), in one
process: python allq_dot_ab.py, from the repository root. Per shape and format, ALL_Q on and off alternately (ROUNDS
rounds, the order reversed every other round), us per layer, the ratio to the same process's bf16, and whether
the two outputs have the same bits. Env: SHAPES, FMTS, REP_MS, ROUNDS."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import SHAPES, make_case, time_graph
import kvpack.kernels.decode_attention as da

shapes = {s.name: s for s in SHAPES}
names = os.environ.get("SHAPES", ",".join(shapes)).split(",")
fmts = os.environ.get("FMTS", "bf16,int8,int8-static,fp8_e4m3,fp8_e5m2,int4").split(",")
ON, OFF = ("fragt", "dot", "imma"), ("fragt",)
rep = int(os.environ.get("REP_MS", "20"))
rounds = int(os.environ.get("ROUNDS", "3"))
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
for sname in names:
    shape = shapes[sname]
    base = None
    for fmt in fmts:
        cases = [make_case(fmt, shape, dev, gen)]
        scale = shape.head_dim ** -0.5
        outs = {}
        da.ALL_Q_VARIANTS = ON
        if da.plan_decode(cases[0][2], cases[0][0], cases[0][1], scale).variant not in ON[1:]:
            print(json.dumps({"shape": sname, "format": fmt, "skipped": "a Gluon plan"}), flush=True)
            continue  # a Gluon plan: session 36's A/B
        cases += [make_case(fmt, shape, dev, gen) for _ in range(7)]
        for rnd in range(rounds):
            for allq in ((True, False) if rnd % 2 == 0 else (False, True)):
                da.ALL_Q_VARIANTS = ON if allq else OFF
                plan = da.plan_decode(cases[0][2], cases[0][0], cases[0][1], scale)
                outs[allq] = da.decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale)
                us = time_graph(lambda: [da.decode_paged_attention(q, lc, m, scale) for lc, m, q in cases], rep) / 8
                if fmt == "bf16" and base is None:  # the first bf16 run, with ALL_Q
                    base = us
                print(json.dumps({"round": rnd, "shape": sname, "format": fmt, "all_q": allq, "variant": plan.variant,
                                  "splits": plan.grid[2], "ALL_Q_option": plan.options.get("ALL_Q", False),
                                  "us_layer": round(us, 2), "vs_bf16": round(us / base, 4),
                                  "bits_equal": bool(torch.equal(outs[True], outs[False])) if len(outs) == 2 else None}),
                      flush=True)
        da.ALL_Q_VARIANTS = OFF
        cases = None
        torch.cuda.empty_cache()
