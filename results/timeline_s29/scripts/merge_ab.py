"""A/B: the split merge's warps, and int4's merge as a dependent launch (PDL end / start), per layer."""
import json, os, sys
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_attention import SHAPES, make_case, time_graph
from benchmarks.probe_decode_timeline import launches
from kvpack.kernels.decode_attention import plan_decode

dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
shapes = {s.name: s for s in SHAPES}
L = 8
res = []
for sname in ("llama8b-1x32768", "llama8b-8x8192", "smollm2-32x4096"):
    shape = shapes[sname]
    scale = shape.head_dim ** -0.5
    for fmt in ("bf16", "int8", "fp8_e4m3", "int4"):
        cases = [make_case(fmt, shape, dev, gen) for _ in range(L)]
        configs = [("default", None, None), ("mw1", None, 1), ("mw2", None, 2), ("mw8", None, 8)]
        if fmt == "int4":
            configs += [("pdl_end", "end", None), ("pdl_start", "start", None), ("pdl_end_mw2", "end", 2)]
        for rnd in range(2):
            for name, pdl, mw in configs:
                if pdl:
                    os.environ["KVPACK_DECODE_PDL"] = pdl
                else:
                    os.environ.pop("KVPACK_DECODE_PDL", None)
                plans = [(plan_decode(q, lc, meta, scale), q) for lc, meta, q in cases]
                os.environ.pop("KVPACK_DECODE_PDL", None)
                if plans[0][0].merge_grid is None and name != "default":
                    continue
                if mw:
                    for p, _ in plans:
                        p.merge_options = dict(p.merge_options or {}, num_warps=mw)
                us = time_graph(launches(plans, [(None, None)] * L), 20) / L
                row = dict(shape=sname, fmt=fmt, config=name, round=rnd, us_layer=round(us, 2),
                           merge=plans[0][0].merge_grid is not None, grid=list(plans[0][0].grid))
                res.append(row)
                print(json.dumps(row), flush=True)
        del cases
        torch.cuda.empty_cache()
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "merge_ab.json"), "w"), indent=1)
