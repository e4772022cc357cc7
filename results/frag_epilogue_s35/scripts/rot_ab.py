"""Session 35 A/B, per layer (a graph of 8 decode calls, each on its own cache, L2 flushed; bench_attention's
"per layer"): python rot_ab.py TREE LABEL, run from the repository root; TREE's kvpack is imported (the old tree
from `git archive`, or "." for the working tree). Per shape and format, us per layer and the ratio to the same
process's bf16. In a tree that has `FRAG_ROT_EPILOGUE`, the rotated formats run with it on and off, and the
outputs of the two are compared bit for bit. Env: SHAPES, FMTS, REP_MS."""
import json, os, sys
tree, label = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.abspath(tree))
import torch
import kvpack
assert os.path.abspath(kvpack.__file__).startswith(os.path.abspath(tree)), kvpack.__file__
from benchmarks.bench_attention import SHAPES, make_case, time_graph
import kvpack.kernels.decode_attention as da
from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

shapes = {s.name: s for s in SHAPES}
names = os.environ.get("SHAPES", "llama8b-64x2048,llama8b-128x1024,llama8b-32x4096").split(",")
fmts = os.environ.get("FMTS", "bf16,int8,int8-static,fp8_e4m3,fp8_e5m2").split(",")
rep = int(os.environ.get("REP_MS", "20"))
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
has_ep = hasattr(da, "FRAG_ROT_EPILOGUE")
for sname in names:
    shape = shapes[sname]
    base = None
    for fmt in fmts:
        cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
        scale = shape.head_dim ** -0.5
        runs = [(None, None)]
        if has_ep and fmt.startswith("fp8"):
            runs = [("epilogue", True), ("merge", False)]
        outs = {}
        for run, ep in runs:
            if ep is not None:
                da.FRAG_ROT_EPILOGUE = ep
            plan = plan_decode(cases[0][2], cases[0][0], cases[0][1], scale)
            outs[run] = decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale)
            us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale) for lc, m, q in cases], rep) / 8
            if fmt == "bf16":
                base = us
            r = {"tree": label, "shape": sname, "format": fmt, "run": run, "variant": plan.variant,
                 "splits": plan.grid[2], "merge_kernel": plan.merge_grid is not None, "us_layer": round(us, 2),
                 "vs_bf16": round(us / base, 4) if base else None}
            if run == "merge":
                r["bits_equal_epilogue"] = bool(torch.equal(outs["merge"], outs["epilogue"]))
            print(json.dumps(r), flush=True)
        if has_ep:
            da.FRAG_ROT_EPILOGUE = True
        cases = None
        torch.cuda.empty_cache()
