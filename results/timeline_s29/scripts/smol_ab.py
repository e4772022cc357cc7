"""SmolLM2 32 x 4096 per layer: bf16 (and the quantized formats) at other splits / merges / warps."""
import json, os, sys
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_attention import SHAPES, make_case, time_graph
from benchmarks.probe_decode_timeline import launches
from kvpack.kernels.decode_attention import plan_decode

dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
shape = {s.name: s for s in SHAPES}["smollm2-32x4096"]
scale = shape.head_dim ** -0.5
L = 8
res = []
for fmt in ("bf16", "int8", "int4"):
    cases = [make_case(fmt, shape, dev, gen) for _ in range(L)]
    configs = [("default", {})]
    if fmt == "bf16":
        configs += [(f"s{s}_{m}", dict(num_splits=s, merge=m)) for s in (6, 8, 11, 16) for m in ("fused", "separate")]
        configs += [(f"s11_w{w}", dict(num_splits=11, num_warps=w)) for w in (1, 2)]
        configs += [(f"s6_w2_{m}", dict(num_splits=6, num_warps=2, merge=m)) for m in ("fused", "separate")]
        configs += [(f"bn{b}", dict(block_n=b)) for b in (16, 64)]
    else:
        configs += [(f"s{s}_{m}", dict(num_splits=s, merge=m)) for s in (11, 16, 22) for m in ("fused", "separate")]
    for rnd in range(2):
        for name, kw in configs:
            try:
                plans = [(plan_decode(q, lc, meta, scale, **kw), q) for lc, meta, q in cases]
                us = time_graph(launches(plans, [(None, None)] * L), 20) / L
            except Exception as e:  # noqa: BLE001
                print(json.dumps(dict(fmt=fmt, config=name, error=str(e)[:200])), flush=True)
                continue
            p0 = plans[0][0]
            row = dict(fmt=fmt, config=name, round=rnd, us_layer=round(us, 2), grid=list(p0.grid),
                       merge=p0.merge_grid is not None, variant=p0.variant, opts=str(p0.options.get("num_warps")))
            res.append(row)
            print(json.dumps(row), flush=True)
    del cases
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "smol_ab.json"), "w"), indent=1)
