"""Decode per layer (a graph of 8 calls, each on its own cache, L2 flushed) at head dim 64, session 34: "fragt" on 8-bit
codes with the L2 prefetch of the tile PF ahead (`decode_frag._prefetch_tile8`, the first PF tiles before q's loads)
and the register cap, side by side in one process, ROUNDS rounds. Shapes: SmolLM2 (9 q / 3 kv heads) and
Llama-3.2-1B (32 q / 8 kv heads). Env: SHAPES (name list), FMTS, ROUNDS, NAME, OUT."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import Shape, make_case, time_graph
import kvpack.kernels.decode_attention as da
from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

SHAPES = {"smollm2-32x4096": Shape("smollm2-32x4096", 32, 4096, 9, 3, 64),
          "smollm2-8x8192": Shape("smollm2-8x8192", 8, 8192, 9, 3, 64),
          "smollm2-1x32768": Shape("smollm2-1x32768", 1, 32768, 9, 3, 64),
          "llama1b-32x4096": Shape("llama1b-32x4096", 32, 4096, 32, 8, 64),
          "llama1b-8x8192": Shape("llama1b-8x8192", 8, 8192, 32, 8, 64),
          # call 2: grids between 1.5 and 8 programs an SM (the prefetch rule's boundary)
          "smollm2-1x8192": Shape("smollm2-1x8192", 1, 8192, 9, 3, 64),
          "smollm2-4x4096": Shape("smollm2-4x4096", 4, 4096, 9, 3, 64),
          "smollm2-2x16384": Shape("smollm2-2x16384", 2, 16384, 9, 3, 64),
          "smollm2-4x8192": Shape("smollm2-4x8192", 4, 8192, 9, 3, 64),
          "llama1b-1x8192": Shape("llama1b-1x8192", 1, 8192, 32, 8, 64),
          "llama1b-1x32768": Shape("llama1b-1x32768", 1, 32768, 32, 8, 64)}
# (name, FRAGT_HEAD64_MAXNREG, FRAGT_HEAD64_PREFETCH, plan_decode kwargs)
# (call 1 ran FRAGT_HEAD64_PREFETCH = 0 as the default; call 2 the rule: 1 where the grid is thin)
QUANT = [("pf0 cap128", 128, 0, {}), ("pf1 cap128", 128, 1, {}), ("pf2 cap128", 128, 2, {}),
         ("pf0 cap136", 136, 0, {}), ("pf1 cap136", 136, 1, {})]
if os.environ.get("RUNSET") == "rule":  # call 2: explicit prefetch 0 / 1 and the plan's rule, optional split counts
    QUANT = [("pf0", 128, 0, {"prefetch": 0}), ("pf1", 128, 1, {"prefetch": 1}), ("rule", 128, 1, {})]
    for sp in [int(x) for x in os.environ.get("SPLITS", "").split(",") if x]:
        QUANT += [(f"pf0 s{sp}", 128, 0, {"prefetch": 0, "num_splits": sp}),
                  (f"pf1 s{sp}", 128, 1, {"prefetch": 1, "num_splits": sp})]
RUNS = {"bf16": [("default", 128, 0, {})], "int8": QUANT, "int8-static": QUANT, "fp8_e4m3": QUANT}
if os.environ.get("RUNSET") == "dot":  # call 4: "dot" at head dim 64 (bf16, int4) with its L2 prefetch 0 / 1
    DOT = [("pf0", 128, 0, {"prefetch": 0}), ("pf1", 128, 0, {"prefetch": 1})]
    RUNS = {"bf16": DOT, "int4": DOT}


DEFAULT_PF = da.FRAGT_HEAD64_PREFETCH


def main():
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    rows = []
    rounds = int(os.environ.get("ROUNDS", "2"))
    for sname in os.environ.get("SHAPES", ",".join(SHAPES)).split(","):
        shape = SHAPES[sname]
        base = {}
        for fmt, runs in RUNS.items():
            if os.environ.get("FMTS") and fmt not in os.environ["FMTS"].split(",") and fmt != "bf16":
                continue
            cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
            scale = 64 ** -0.5
            for rnd in range(rounds):
                ref = None
                for name, cap, pf, kw in runs:
                    da.FRAGT_HEAD64_MAXNREG, da.FRAGT_HEAD64_PREFETCH = cap, pf
                    try:
                        plan = plan_decode(cases[0][2], cases[0][0], cases[0][1], scale, **kw)
                        out = decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale, **kw)
                        us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale, **kw) for lc, m, q in cases],
                                        20) / 8
                    except Exception as e:
                        print(shape.name, fmt, name, "ERR", type(e).__name__, str(e)[:300], flush=True)
                        continue
                    finally:
                        da.FRAGT_HEAD64_MAXNREG, da.FRAGT_HEAD64_PREFETCH = 128, DEFAULT_PF
                    if fmt == "bf16":
                        base[rnd] = us
                    same = None
                    if ref is None:
                        ref, ref_grid = out, plan.grid
                    else:
                        same = bool(torch.equal(out, ref)) if plan.grid == ref_grid else None
                    r = {"shape": shape.name, "format": fmt, "run": name, "round": rnd, "variant": plan.variant,
                         "splits": plan.grid[2], "maxnreg": plan.options.get("maxnreg", 0),
                         "prefetch": plan.args[plan.kernel.arg_names.index("PREFETCH")] if plan.variant == "fragt" else None,
                         "us_layer": round(us, 2), "vs_bf16": round(us / base.get(rnd, base.get(0, us)), 3),
                         "bits_equal_first_run": same, "finite": bool(torch.isfinite(out).all())}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
            cases = None
            torch.cuda.empty_cache()
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("NAME", "h64_pf") + ".json"), "w"),
              indent=1)


if __name__ == "__main__":
    main()
