"""Decode plan settings side by side (sessions 41-44: the A/B runs of results/int4_h64_s41, int4_vpairs_s42,
decode_s43 and decode_s44; the first two ran copies of this script from their results folders). Per layer: a CUDA graph of 8 decode
calls, each on its own cache, L2 flushed (bench_attention's "us / layer"), every setting in one process, the order
reversed every other round. From the repository root:
    SHAPES=llama8b-8x8192:8:8192:32:8:128 FORMATS=int8,fp8_e4m3 SETTINGS="base|;fused|merge=fused" \
        python benchmarks/ab_decode.py
Env: SHAPES ("name:batch:context:hq:hkv[:head_dim],...", head dim 64 if left out), INT4_GROUPS (int4 group sizes,
"32,16,64") or FORMATS (bench_attention's format names, "int8,fp8_e4m3"), SETTINGS (";"-separated, each
"name|key=value+key=value": plan keywords such as variant / num_splits / prefetch / maxnreg / merge, and module
attributes of decode_attention written A.NAME=value; a value that is not an integer stays a string), ROUNDS, REP_MS.
Per case and setting, one JSON line: us per layer, the plan's variant, splits, prefetch, register cap, and the largest
|output - the first setting's output|; bf16's us on the same shape (its own line) for the ratio."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import Shape, make_case, time_graph
import kvpack.kernels.decode_attention as da

shapes_env = os.environ.get("SHAPES", "smollm2-32x4096:32:4096:9:3,smollm2-8x8192:8:8192:9:3,"
                            "smollm2-1x32768:1:32768:9:3,llama1b-32x4096:32:4096:32:8,llama1b-8x8192:8:8192:32:8")
groups = [int(g) for g in os.environ.get("INT4_GROUPS", "32").split(",")]
settings = os.environ.get("SETTINGS", "dot|variant=dot;fragt|variant=fragt").split(";")
rep = int(os.environ.get("REP_MS", "20"))
rounds = int(os.environ.get("ROUNDS", "2"))
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)


def _num(v):
    try:
        return int(v)
    except ValueError:
        return v


def parse(setting):
    name, _, rest = setting.partition("|")
    kw, attrs = {}, {}
    for part in filter(None, rest.split("+")):
        k, v = part.split("=")
        v = None if v == "None" else v if k == "variant" else bool(int(v)) if k.endswith("VPF0") else _num(v)
        (attrs if k.startswith("A.") else kw)[k.removeprefix("A.")] = v
    return name, kw, attrs


for spec in shapes_env.split(","):
    sname, b, ctx, hq, hkv, *hd = spec.split(":")
    hd = int(hd[0]) if hd else 64
    shape = Shape(sname, int(b), int(ctx), int(hq), int(hkv), hd)
    scale = hd ** -0.5
    cases = [make_case("bf16", shape, dev, gen) for _ in range(8)]
    bf16 = time_graph(lambda: [da.decode_paged_attention(q, lc, m, scale) for lc, m, q in cases], rep) / 8
    print(json.dumps({"shape": sname, "format": "bf16", "us_layer": round(bf16, 2)}), flush=True)
    fmts = os.environ.get("FORMATS", "").split(",") if os.environ.get("FORMATS") else [
        "int4" if g == 32 else f"int4-g{g}" for g in groups]
    for fmt in fmts:
        cases = [make_case(fmt, shape, dev, gen) for _ in range(8)]
        first = None
        for rnd in range(rounds):
            for st in (settings if rnd % 2 == 0 else settings[::-1]):
                name, kw, attrs = parse(st)
                old = {k: getattr(da, k) for k in attrs}
                for k, v in attrs.items():
                    setattr(da, k, v)
                try:
                    plan = da.plan_decode(cases[0][2], cases[0][0], cases[0][1], scale, **kw)
                    out = da.decode_paged_attention(cases[0][2], cases[0][0], cases[0][1], scale, **kw).float()
                    us = time_graph(lambda: [da.decode_paged_attention(q, lc, m, scale, **kw) for lc, m, q in cases],
                                    rep) / 8
                    torch.cuda.synchronize()
                finally:
                    for k, v in old.items():
                        setattr(da, k, v)
                if first is None:
                    first = out
                names = plan.kernel.arg_names
                print(json.dumps({"round": rnd, "shape": sname, "format": fmt, "setting": name, "variant": plan.variant,
                                  "splits": plan.grid[2], "prefetch": plan.args[names.index("PREFETCH")],
                                  "maxnreg": plan.options.get("maxnreg"), "us_layer": round(us, 2),
                                  "vs_bf16": round(us / bf16, 3),
                                  "max_abs_diff": float((out - first).abs().max())}), flush=True)
        cases = first = None
        torch.cuda.empty_cache()
