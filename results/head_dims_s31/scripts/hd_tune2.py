"""Decode per layer (graph of 8 calls, each on its own cache, L2 flushed), 32 q / 32 kv heads at head dims 80 / 96:
8-bit formats with the head in two parts ("dot", `two_part_head`) against padded to 128, side by side."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import Shape, make_case, time_graph
import kvpack.kernels.decode_attention as da
from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode
RUNS = {"bf16": [("default", True, {})],
        "int8": [("default", True, {}), ("dot two-part", True, {"variant": "dot"}),
                 ("dot two-part bn32", True, {"variant": "dot", "block_n": 32}), ("dot padded", False, {"variant": "dot"})],
        "int8-static": [("default", True, {}), ("dot two-part", True, {"variant": "dot"})],
        "fp8_e4m3": [("default", True, {}), ("padded", False, {}), ("two-part bn32", True, {"block_n": 32})],
        "fp8_e5m2": [("default", True, {}), ("padded", False, {})],
        "int4": [("default", True, {}), ("padded", False, {})]}


def main(table, out_name, v4p=False):
    """Time `table` ({format: [(name, two parts, plan_decode kwargs)]}); rows to $OUT/out_name (v4p: with int4's
    third-tile width, session 32's hd_int4.py)."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for d in (80, 96):
        for bc in os.environ.get("SHAPES", "8x4096,1x32768").split(","):
            b, ctx = map(int, bc.split("x"))
            shape = Shape(f"32/32/D{d}-{bc}", b, ctx, 32, 32, d)
            base = None
            for fmt, runs in table.items():
                if os.environ.get("FMTS") and fmt not in os.environ["FMTS"].split(","):
                    continue
                cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
                scale = d ** -0.5
                for name, two, kw in runs:
                    if os.environ.get("ONLY") and name not in os.environ["ONLY"].split(","):
                        continue
                    da.TWO_PART = two
                    try:
                        plan = plan_decode(cases[0][2], cases[0][0], cases[0][1], scale, **kw)
                        us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale, **kw) for lc, m, q in cases], 20) / 8
                    except Exception as e:
                        print(shape.name, fmt, name, "ERR", type(e).__name__, str(e)[:300], flush=True); continue
                    finally:
                        da.TWO_PART = True
                    if fmt == "bf16":
                        base = us
                    r = {"shape": shape.name, "format": fmt, "run": name, "variant": plan.variant, "splits": plan.grid[2],
                         "block_n": plan.args[plan.kernel.arg_names.index("BLOCK_N")], "D_B": plan.options.get("D_B", 0),
                         **({"V4P": plan.options.get("V4P", 0)} if v4p else {}), "us_layer": round(us, 2), "vs_bf16": round(us / base, 3)}
                    rows.append(r); print(json.dumps(r), flush=True)
                del cases; torch.cuda.empty_cache()
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), out_name), "w"), indent=1)


if __name__ == "__main__":
    main(RUNS, "hd_tune2.json")
