"""A/B (per layer, alternating rounds): int4 "fragt"'s merge as an early dependent launch (start) vs plain, by
merge programs; the new merge warps (`merge_warps`) vs the former 4."""
import json, os, sys
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_attention import SHAPES, Shape, make_case, time_graph
from benchmarks.probe_decode_timeline import launches
from kvpack.kernels.decode_attention import plan_decode

dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
shapes = {s.name: s for s in SHAPES}
for b, c in ((2, 16384), (4, 8192), (16, 4096)):
    shapes[f"llama8b-{b}x{c}"] = Shape(f"llama8b-{b}x{c}", b, c)
L = 8
res = []


def run(sname, fmt, configs):
    shape = shapes[sname]
    scale = shape.head_dim ** -0.5
    cases = [make_case(fmt, shape, dev, gen) for _ in range(L)]
    for rnd in range(2):
        for name, pdl, mw in configs:
            if pdl is not None:
                os.environ["KVPACK_DECODE_PDL"] = pdl
            plans = [(plan_decode(q, lc, meta, scale), q) for lc, meta, q in cases]
            os.environ.pop("KVPACK_DECODE_PDL", None)
            if mw:
                for p, _ in plans:
                    if p.merge_options is not None:
                        p.merge_options = dict(p.merge_options, num_warps=mw)
            us = time_graph(launches(plans, [(None, None)] * L), 20) / L
            p0 = plans[0][0]
            row = dict(shape=sname, fmt=fmt, config=name, round=rnd, us_layer=round(us, 2), grid=list(p0.grid),
                       merge_options={k: v for k, v in (p0.merge_options or {}).items()})
            res.append(row)
            print(json.dumps(row), flush=True)
    del cases
    torch.cuda.empty_cache()


for sname in ("llama8b-1x32768", "llama8b-2x16384", "llama8b-4x8192", "llama8b-8x8192"):
    run(sname, "int4", [("plain", "0", None), ("start", "start", None), ("default", None, None)])
for sname in ("llama8b-1x32768", "llama8b-8x8192", "llama8b-32x4096", "smollm2-32x4096"):
    for fmt in ("bf16", "int8", "fp8_e4m3"):
        run(sname, fmt, [("mw4", None, 4), ("default", None, None)])
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "pdl_ab.json"), "w"), indent=1)
