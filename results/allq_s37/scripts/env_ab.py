"""Session 37: A/B of environment settings read at plan time (e.g. KVPACK_DECODE_PDL), per layer (a graph of 8 decode
calls, each on its own cache, L2 flushed: bench_attention's "per layer"), side by side in one process: python
env_ab.py, from the repository root. Env: CASES ("shape:format,..."), SETTINGS (";"-separated, each "NAME=value+..." or
"default": none set), REP_MS, ROUNDS (the order reversed every other round). Per case and setting: us per layer, the
plan's variant, splits and PDL option, and whether the output has the same bits as the default's."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import SHAPES, make_case, time_graph
import kvpack.kernels.decode_attention as da

shapes = {s.name: s for s in SHAPES}
cases_env = os.environ.get("CASES", "smollm2-32x4096:int4,smollm2-32x4096:bf16").split(",")
settings = os.environ.get("SETTINGS", "default;KVPACK_DECODE_PDL=0;KVPACK_DECODE_PDL=start;KVPACK_DECODE_PDL=end").split(";")
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
    ref = da.decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale)
    for rnd in range(rounds):
        for st in (settings if rnd % 2 == 0 else settings[::-1]):
            apply(st)
            try:
                plan = da.plan_decode(cases[0][2], cases[0][0], cases[0][1], scale)
                out = da.decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale)
                us = time_graph(lambda: [da.decode_paged_attention(q, lc, m, scale) for lc, m, q in cases], rep) / 8
            finally:
                clear(st)
            print(json.dumps({"round": rnd, "shape": sname, "format": fmt, "setting": st, "variant": plan.variant,
                              "splits": plan.grid[2], "PDL": plan.options.get("PDL", 0), "us_layer": round(us, 2),
                              "bits_equal": bool(torch.equal(out, ref))}), flush=True)
    cases = None
    torch.cuda.empty_cache()
