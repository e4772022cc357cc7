"""Session 39: "frag"'s ring with static splits against dynamic tiles (KVPACK_DECODE_DYNAMIC=0 / 1), per layer (a
graph of 8 decode calls, each on its own cache, L2 flushed: bench_attention's "per layer"), side by side in one
process, the order reversed every other round: python results/dyn_s39/scripts/dyn_ab.py, from the repository root.
Env: CASES ("shape:format,..."), SETTINGS (";"-separated "NAME=value+..." or "default"), REP_MS, ROUNDS. Per case and
setting: us per layer, the plan's variant, splits, DYN and PDL, the largest |output - the first setting's output|,
and whether the claim counters were back at 0 after the timed graph."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import SHAPES, make_case, time_graph
import kvpack.kernels.decode_attention as da

shapes = {s.name: s for s in SHAPES}
default_cases = ",".join(f"{s}:{f}" for s in ("llama8b-1x32768", "llama8b-8x8192", "llama8b-32x4096")
                         for f in ("bf16", "int8", "int8-static", "fp8_e4m3", "fp8_e5m2"))
cases_env = os.environ.get("CASES", default_cases).split(",")
settings = os.environ.get("SETTINGS", "KVPACK_DECODE_DYNAMIC=0;KVPACK_DECODE_DYNAMIC=1").split(";")
rep = int(os.environ.get("REP_MS", "20"))
rounds = int(os.environ.get("ROUNDS", "3"))
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)


def apply(setting):
    for part in setting.split("+"):
        if part != "default":
            k, v = part.split("=")
            os.environ[k] = v


def clear(setting):
    for part in setting.split("+"):
        if part != "default":
            os.environ.pop(part.split("=")[0], None)


for case in cases_env:
    sname, fmt = case.split(":")
    shape = shapes[sname]
    cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
    scale = shape.head_dim ** -0.5
    first = None
    for rnd in range(rounds):
        for st in (settings if rnd % 2 == 0 else settings[::-1]):
            apply(st)
            try:
                plan = da.plan_decode(cases[0][2], cases[0][0], cases[0][1], scale)
                out = da.decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale).float()
                us = time_graph(lambda: [da.decode_paged_attention(q, lc, m, scale) for lc, m, q in cases], rep) / 8
                torch.cuda.synchronize()
                claims = plan.options.get("claim_ptr")
                zero = None if claims is None else not bool(claims.any())
            finally:
                clear(st)
            if first is None:
                first = out
            print(json.dumps({"round": rnd, "shape": sname, "format": fmt, "setting": st, "variant": plan.variant,
                              "splits": plan.grid[2], "DYN": bool(plan.options.get("DYN", False)),
                              "PDL": plan.options.get("PDL", 0), "us_layer": round(us, 2),
                              "max_abs_diff": float((out - first).abs().max()), "claims_zero": zero}), flush=True)
    cases = first = None
    torch.cuda.empty_cache()
