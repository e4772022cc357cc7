"""SmolLM2 32 x 4096 int4 g32 vs g64: the plan and its time per layer under a few split / merge choices."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import SHAPES, make_case, time_graph
from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
shape = [s for s in SHAPES if s.name == "smollm2-32x4096"][0]
rows = []
for fmt in ("int4", "int4-g64", "int4/fp8_e4m3", "int8", "fp8_e4m3"):
    if "/" in fmt:
        import benchmarks.bench_attention as ba
        from kvpack.attention import LayerKVCache
        orig = ba.make_cache
        def mixed(name, shape, nb, device, orig=orig):
            a, b = name.split("/")
            return LayerKVCache(orig(a, shape, nb, device).k, orig(b, shape, nb, device).v)
        ba.make_cache = mixed
        cases = [ba.make_case(fmt, shape, dev, gen) for _ in range(8)]
        ba.make_cache = orig
    else:
        cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
    scale = shape.head_dim ** -0.5
    for splits, merge, bn, mr in ((None, None, None, None), (None, None, None, 255)):
        kw = dict(num_splits=splits, merge=merge, block_n=bn, maxnreg=mr)
        lc, m, q = cases[0]
        p = plan_decode(q, lc, m, scale, **kw)
        an = p.kernel.arg_names
        cons = {k: p.args[an.index(k)] for k in ("BLOCK_N", "K_G", "K_ALIGNED", "V_ALIGNED") if k in an}
        us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale, **kw) for lc, m, q in cases], 20) / 8
        r = {"fmt": fmt, "kw": str(kw), "us_layer": round(us, 2), "variant": p.variant, "grid": p.grid, "merge_grid": p.merge_grid,
             "opts": str(p.options), **cons}
        rows.append(r); print(json.dumps(r), flush=True)
    # the kernel alone, one call per layer, and the pools' strides
    print(fmt, "codes", tuple(lc.k.codes.shape), lc.k.codes.stride(), "scales", tuple(lc.k.scales.shape), lc.k.scales.stride())
    del cases; torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "smol_diag.json"), "w"), indent=1)
