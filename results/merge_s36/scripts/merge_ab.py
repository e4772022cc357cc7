"""Session 36 A/B, per layer (a graph of 8 decode calls, each on its own cache, L2 flushed; bench_attention's
"per layer"): python merge_ab.py LABEL, from the repository root. Per shape and format, every configuration of
CONFIGS ("merge[:splits][@ring]": merge auto / fused / separate, splits an integer or the plan's, ring the
ring programs an SM that `choose_ring_splits` plans for, `decode_plan.RING_PER_SM`, 4 unless given), us per layer and the
ratio to the same process's bf16; each output's largest difference from the first configuration's.
Env: SHAPES, FMTS, CONFIGS, REP_MS, ROUNDS (the configurations' order alternates between rounds)."""
import json, os, sys
label = sys.argv[1] if len(sys.argv) > 1 else "tree"
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import SHAPES, make_case, time_graph
from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode
import kvpack.kernels.decode_plan as dp
RING0 = dp.RING_PER_SM

shapes = {s.name: s for s in SHAPES}
names = os.environ.get("SHAPES", "llama8b-8x8192,llama8b-32x4096").split(",")
fmts = os.environ.get("FMTS", "bf16,int8,int8-static,fp8_e4m3").split(",")
configs = os.environ.get("CONFIGS", "separate,fused").split(",")
rep = int(os.environ.get("REP_MS", "20"))
rounds = int(os.environ.get("ROUNDS", "2"))
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)


def parse(c):
    c, _, ring = c.partition("@")
    m, _, s = c.partition(":")
    return m, (int(s) if s else None), (int(ring) if ring else RING0)


for sname in names:
    shape = shapes[sname]
    base = None
    for fmt in fmts:
        cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
        scale = shape.head_dim ** -0.5
        cfgs = ["auto"] if fmt == "bf16" else configs
        ref = None
        for rnd in range(rounds):
            for c in (cfgs if rnd % 2 == 0 else cfgs[::-1]):
                merge, splits, dp.RING_PER_SM = parse(c)
                kw = dict(merge=merge, num_splits=splits)
                plan = plan_decode(cases[0][2], cases[0][0], cases[0][1], scale, **kw)
                o = decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale, **kw).float()
                if ref is None:
                    ref = o
                us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale, **kw) for lc, m, q in cases],
                                rep) / 8
                if fmt == "bf16" and rnd == 0:
                    base = us
                print(json.dumps({"tree": label, "round": rnd, "shape": sname, "format": fmt, "config": c,
                                  "variant": plan.variant, "splits": plan.grid[2],
                                  "merge_kernel": plan.merge_grid is not None, "us_layer": round(us, 2),
                                  "vs_bf16": round(us / base, 4) if base else None,
                                  "max_diff_vs_first": float((o - ref).abs().max())}), flush=True)
        cases = None
        torch.cuda.empty_cache()
