"""Session 36: decode_paged_attention keyword sweep, per layer (a graph of 8 decode calls, each on its own cache, L2
flushed: bench_attention's "per layer"). python kw_sweep.py, from the repository root. Env: SHAPES, FMTS, REP_MS,
ROUNDS, CONFIGS: ";"-separated, each "k=v+k=v" of decode_paged_attention keywords (integers or strings; "plan"
alone: the plan's own choice). Per shape, format and configuration: us per layer, the ratio to the same process's
bf16 plan, and the largest difference of the output from the plan's."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import SHAPES, kv_bytes, make_case, time_graph
from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

shapes = {s.name: s for s in SHAPES}
names = os.environ.get("SHAPES", "smollm2-32x4096").split(",")
fmts = os.environ.get("FMTS", "bf16").split(",")
configs = os.environ.get("CONFIGS", "plan").split(";")
rep = int(os.environ.get("REP_MS", "20"))
rounds = int(os.environ.get("ROUNDS", "2"))
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)


def parse(c):
    kw = {}
    for part in c.split("+"):
        if part == "plan":
            continue
        k, v = part.split("=")
        kw[k] = int(v) if v.lstrip("-").isdigit() else v
    return kw


for sname in names:
    shape = shapes[sname]
    base = None
    for fmt in fmts:
        cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
        scale = shape.head_dim ** -0.5
        ref = decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale).float()
        if base is None:  # the first format's plan (bf16)
            base = time_graph(lambda: [decode_paged_attention(q, lc, m, scale) for lc, m, q in cases], rep) / 8
        for rnd in range(rounds):
            for c in (configs if rnd % 2 == 0 else configs[::-1]):
                kw = parse(c)
                try:
                    plan = plan_decode(cases[0][2], cases[0][0], cases[0][1], scale, **kw)
                    o = decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale, **kw).float()
                    us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale, **kw) for lc, m, q in cases],
                                    rep) / 8
                except Exception as e:  # a configuration the kernel does not take
                    print(json.dumps({"shape": sname, "format": fmt, "config": c, "error": repr(e)[:200]}), flush=True)
                    continue
                nbytes = kv_bytes(cases[0][0], shape)
                print(json.dumps({"round": rnd, "shape": sname, "format": fmt, "config": c, "variant": plan.variant,
                                  "grid": list(plan.grid), "options": {k: v for k, v in plan.options.items()
                                                                        if isinstance(v, (int, float, str, bool))},
                                  "merge_kernel": plan.merge_grid is not None, "us_layer": round(us, 2),
                                  "vs_bf16": round(us / base, 4), "TBps": round(nbytes / us / 1e6, 3),
                                  "max_diff_vs_plan": float((o - ref).abs().max())}), flush=True)
        cases = None
        torch.cuda.empty_cache()
