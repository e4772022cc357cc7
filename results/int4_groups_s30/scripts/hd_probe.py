"""Decode per layer (graph of 8 calls, L2 flushed) at head dims 64 / 80 / 96 / 128: bf16, int8, int4 g32 / g64 / g128."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import Shape, make_case, time_graph
from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
rows = []
ALL = ((32, 32, 96, 8, 4096), (32, 32, 80, 8, 4096), (32, 8, 64, 32, 4096), (32, 8, 128, 32, 4096))
for hq, hkv, d, b, ctx in [a for a in ALL if str(a[2]) in os.environ.get("HD", "96,80,64,128").split(",")]:
    shape = Shape(f"{hq}/{hkv}/D{d}-{b}x{ctx}", b, ctx, hq, hkv, d)
    base = None
    for fmt in os.environ.get("FMTS", "bf16,int8,int4,int4-g64,int4-g128").split(","):
        try:
            cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
        except Exception as e:
            print(shape.name, fmt, "skip", type(e).__name__, str(e)[:100]); continue
        scale = d ** -0.5
        plan = plan_decode(cases[0][2], cases[0][0], cases[0][1], scale)
        us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale) for lc, m, q in cases], 20) / 8
        if fmt == "bf16":
            base = us
        r = {"shape": shape.name, "format": fmt, "variant": plan.variant, "us_layer": round(us, 2), "vs_bf16": round(us / base, 3),
             "group": cases[0][0].v.fmt.group_size}
        rows.append(r); print(json.dumps(r), flush=True)
        del cases; torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "hd_probe.json"), "w"), indent=1)
