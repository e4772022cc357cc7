"""Decode per layer (graph of 8 calls, each on its own cache, L2 flushed), 32 q / 32 kv heads at head dims 80 / 96:
bf16 padded to 128 (the default) against "dot" in two parts (`two_part_head` with its 16-bit exclusion lifted)."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_attention import Shape, make_case, time_graph
import kvpack.kernels.decode_attention as da
from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode
from kvpack.kernels.quant import next_pow2
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
orig = da.two_part_head


def lifted(variant, kp, vp):
    d = kp.fmt.head_dim
    if variant == "dot" and kp.fmt.kind == vp.fmt.kind == "float" and d != next_pow2(d):
        return max(16, next_pow2(d - next_pow2(d) // 2))
    return orig(variant, kp, vp)


rows = []
for d in (80, 96):
    for bc in ("8x4096", "1x32768", "32x2048"):
        b, ctx = map(int, bc.split("x"))
        shape = Shape(f"32/32/D{d}-{bc}", b, ctx, 32, 32, d)
        cases = [make_case("bf16", shape, dev, gen) for _ in range(8)]
        scale = d ** -0.5
        lc, m, q = cases[0]
        ref = decode_paged_attention(q, lc, m, scale).float()
        for name, fn in (("padded", orig), ("two-part", lifted), ("padded again", orig)):
            da.two_part_head = fn
            try:
                plan = plan_decode(q, lc, m, scale)
                diff = (decode_paged_attention(q, lc, m, scale).float() - ref).abs().max().item()
                us = time_graph(lambda: [decode_paged_attention(q, lc, m, scale) for lc, m, q in cases], 20) / 8
            finally:
                da.two_part_head = orig
            nbytes = 2 * b * ctx * 32 * d * 2
            r = {"shape": shape.name, "run": name, "D_B": plan.options.get("D_B", 0), "splits": plan.grid[2],
                 "us_layer": round(us, 2), "TB/s": round(nbytes / us / 1e6, 3), "max_diff": diff}
            rows.append(r); print(json.dumps(r), flush=True)
        del cases; torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "bf16_parts.json"), "w"), indent=1)
