"""Decode per layer (graph of 8 calls, each on its own cache, L2 flushed) at head dims 80 / 96, 32 q / 32 kv heads:
bf16, int8, fp8_e4m3, int4 under tile configs (block_n, warps, stages) and, for int4, the group-parameter paths.
Env: CONFIGS (json list), HD, SHAPES (b x ctx), FMTS, OLD=1 (the default plans only: run through run_old.py)."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import Shape, make_case, time_graph
import kvpack.kernels.decode_plan as dp
from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
OLD = os.environ.get("OLD") == "1"
rows = []
CFG8 = [None, (32, 1, 1), (32, 1, 2), (64, 2, 1), (32, 2, 1), (16, 1, 1)]
CFG4 = [None, (64, 1, 1), (16, 1, 1), (32, 2, 1)]
orig_path = dp.int4_group_path
for d in [int(x) for x in os.environ.get("HD", "80,96").split(",")]:
    for bc in os.environ.get("SHAPES", "8x4096,1x32768").split(","):
        b, ctx = map(int, bc.split("x"))
        shape = Shape(f"32/32/D{d}-{bc}", b, ctx, 32, 32, d)
        base = None
        for fmt in os.environ.get("FMTS", "bf16,int8,fp8_e4m3,int4").split(","):
            cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
            scale = d ** -0.5
            cfgs = [None] if OLD or fmt == "bf16" else (CFG4 if fmt.startswith("int4") else CFG8)
            paths = [None]
            if fmt.startswith("int4") and not OLD:
                paths = [None, "select"] if d == 96 else [None, "gather"]
            for path in paths:
                for cfg in cfgs:
                    if path is not None and cfg is not None:
                        continue
                    dp.int4_group_path = (lambda f, p=path: p if f.kind == "int4" else None) if path else orig_path
                    kw = dict(zip(("block_n", "num_warps", "num_stages"), cfg)) if cfg else {}
                    try:
                        plan = plan_decode(cases[0][2], cases[0][0], cases[0][1], scale, **kw)
                        us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale, **kw) for lc, m, q in cases], 20) / 8
                    except Exception as e:
                        print(shape.name, fmt, cfg, path, "ERR", type(e).__name__, str(e)[:200], flush=True); continue
                    finally:
                        dp.int4_group_path = orig_path
                    if fmt == "bf16":
                        base = us
                    opt = plan.options
                    r = {"shape": shape.name, "format": fmt, "tree": "old" if OLD else "new", "path": path or "default",
                         "cfg": list(cfg) if cfg else "default", "variant": plan.variant, "splits": plan.grid[2],
                         "block_n": plan.args[plan.kernel.arg_names.index("BLOCK_N")], "warps": opt.get("num_warps"),
                         "stages": opt.get("num_stages"), "us_layer": round(us, 2), "vs_bf16": round(us / base, 3) if base else None}
                    rows.append(r); print(json.dumps(r), flush=True)
            del cases; torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "hd_tune_old.json" if OLD else "hd_tune.json"), "w"), indent=1)
