"""Decode per layer (a graph of 8 calls, each on its own cache, L2 flushed) at head dim 64, session 33: 8-bit codes
in "fragt" (`decode_frag` at head dim 64) against the former plan ("imma" / "dot"), side by side in one process.
Shapes: SmolLM2 (9 q / 3 kv heads) and Llama-3.2-1B (32 q / 8 kv heads). Env: SHAPES (name list), FMTS, ONLY."""
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
          "llama1b-8x8192": Shape("llama1b-8x8192", 8, 8192, 32, 8, 64)}
# (name, FRAGT_HEAD64_AUTO, FRAGT_HEAD64_K8_F16, FRAGT_HEAD64_MAXNREG, plan_decode kwargs)
RUNS = {"bf16": [("default", True, True, 128, {})],
        "int8": [("former", False, True, 128, {}), ("fragt i8mma nocap", True, False, 0, {}),
                 ("fragt i8mma cap128", True, False, 128, {}), ("fragt k8f16 cap128", True, True, 128, {}),
                 ("fragt k8f16 nocap", True, True, 0, {})],
        "int8-static": [("former", False, True, 128, {}), ("fragt i8mma nocap", True, False, 0, {}),
                        ("fragt i8mma cap128", True, False, 128, {}), ("fragt k8f16 cap128", True, True, 128, {})],
        "fp8_e4m3": [("former", False, True, 128, {}), ("fragt nocap", True, True, 0, {}),
                     ("fragt cap128", True, True, 128, {})]}
SPLITS = [int(x) for x in os.environ.get("SPLITS", "").split(",") if x]


def main():
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for sname in os.environ.get("SHAPES", ",".join(SHAPES)).split(","):
        shape = SHAPES[sname]
        base = None
        for fmt, runs in RUNS.items():
            if os.environ.get("FMTS") and fmt not in os.environ["FMTS"].split(",") and fmt != "bf16":
                continue
            cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
            scale = 64 ** -0.5
            for name, auto, k8f16, cap, kw0 in runs:
                if os.environ.get("ONLY") and fmt != "bf16" and name not in os.environ["ONLY"].split(","):
                    continue
                for sp in ([None] + (SPLITS if name.startswith("fragt") else [])):
                    kw = dict(kw0, **({"num_splits": sp} if sp else {}))
                    da.FRAGT_HEAD64_AUTO, da.FRAGT_HEAD64_K8_F16, da.FRAGT_HEAD64_MAXNREG = auto, k8f16, cap
                    try:
                        plan = plan_decode(cases[0][2], cases[0][0], cases[0][1], scale, **kw)
                        out = decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale, **kw)
                        us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale, **kw) for lc, m, q in cases], 20) / 8
                    except Exception as e:
                        print(shape.name, fmt, name, sp, "ERR", type(e).__name__, str(e)[:300], flush=True)
                        continue
                    finally:
                        da.FRAGT_HEAD64_AUTO, da.FRAGT_HEAD64_K8_F16, da.FRAGT_HEAD64_MAXNREG = True, True, 128
                    if fmt == "bf16":
                        base = us
                    r = {"shape": shape.name, "format": fmt, "run": name, "variant": plan.variant, "splits": plan.grid[2],
                         "maxnreg": plan.options.get("maxnreg", 0), "k8f16": plan.options.get("K8_F16", False), "us_layer": round(us, 2),
                         "vs_bf16": round(us / base, 3), "finite": bool(torch.isfinite(out).all())}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
            cases = None
            torch.cuda.empty_cache()
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("NAME", "h64_ab") + ".json"), "w"), indent=1)


if __name__ == "__main__":
    main()
