"""The cache write's row layouts side by side (one process, configurations alternating, order reversed every other
round): KVPACK_WRITE_LANE_BIT=3 (lanes on channel bits 3-4, the layout of sessions 15-37), 2 (lanes on bits 3 and 5),
4 (lanes on bits 4-5), read at plan time. 65536 new tokens of Llama-3.1-8B K and V (8 kv heads, head dim 128, bf16),
CUDA-graph replays, L2 flushed (`bench_attention.time_graph`); TB/s of input. Env: FORMATS, SLOTS, LANES, ROUNDS,
TOKENS. Prints one JSON line per case."""
import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.bench_attention import Shape, make_cache, time_graph, write_slots  # noqa: E402
from kvpack.kernels.cache_write import _cache_write_kernel, plan_write  # noqa: E402


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    T = int(os.environ.get("TOKENS", 65536))
    shape = Shape("write", 1, 1, 32, 8, 128)
    nb = T // shape.block_size + 1
    k = torch.randn(T, shape.hkv, shape.head_dim, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    in_bytes = 2 * k.numel() * k.element_size()
    kk, vv = torch.empty_like(k), torch.empty_like(v)

    def copy():
        kk.copy_(k)
        vv.copy_(v)

    lanes = os.environ.get("LANES", "3,4").split(",")
    rounds = int(os.environ.get("ROUNDS", 3))
    for fmt_name in os.environ.get("FORMATS", "int4,int4-g64,int4-g128,fp8_e4m3").split(","):
        lc = make_cache(fmt_name, shape, nb, dev)
        for sp in os.environ.get("SLOTS", "random,blocks").split(","):
            slots = write_slots(sp, T, shape.block_size, dev)
            for r in range(rounds):
                order = lanes if r % 2 == 0 else lanes[::-1]
                us = time_graph(copy, 20)
                print(json.dumps({"fmt": "copy", "slots": sp, "round": r, "us": round(us, 2),
                                  "tbs": round(in_bytes / us / 1e6, 3)}), flush=True)
                for lb in order:
                    os.environ["KVPACK_WRITE_LANE_BIT"] = lb
                    grid, kargs, opts = plan_write(k, v, lc, slots)
                    us = time_graph(lambda: _cache_write_kernel[grid](*kargs, **opts), 30)
                    print(json.dumps({"fmt": fmt_name, "slots": sp, "lane_bit": int(lb), "round": r,
                                      "rows": [kargs[-3], kargs[-2]], "us": round(us, 2),
                                      "tbs": round(in_bytes / us / 1e6, 3)}), flush=True)


if __name__ == "__main__":
    main()
