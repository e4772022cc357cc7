"""Probe (not a benchmark table): where the prefill workspace path spends its time on an H200.

Times, in one run (CUDA-graph replays, L2 flushed), for a 2048-token chunk on `--prefix` cached
tokens (Llama-3.1-8B heads): the bf16-cache kernel; the same data as a float16 cache (bf16 q and
fp16 q); the dequantize kernel alone (int8 into float16 and bfloat16, int4 into float16, and int4
un-rotated into bfloat16 with a V mean: the engine's path at head_dim 128, and fp8_e4m3 the same); the full workspace path
for int8 / int4; the q and output rotations of int4. Prints one line per item.

    python benchmarks/probe_prefill_workspace.py --prefix 8192
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--rep-ms", type=int, default=40)
    ap.add_argument("--only", default=None, help="time only the items whose name contains this")
    args = ap.parse_args()
    import triton

    from benchmarks.bench_attention import time_graph
    from benchmarks.bench_prefill import build_layer
    from kvpack.attention.kv_cache import LayerKVCache
    from kvpack.attention.metadata import AttentionMetadata
    from kvpack.kernels.prefill_attention import prefill_paged_attention
    from kvpack.kernels.prefill_workspace import dequantize_to_workspace
    from kvpack.kernels.rotate import rotate_heads

    dev = torch.device("cuda")
    torch.manual_seed(0)
    hq, hkv, d, bs = 32, 8, 128, 16
    seq = args.prefix + args.chunk
    nb = triton.cdiv(seq, bs)
    table = torch.randperm(nb).tolist()
    slots = (torch.tensor(table, device=dev)[:, None] * bs + torch.arange(bs, device=dev)).flatten()[:seq]
    k = torch.randn(seq, hkv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(seq, hkv, d, device=dev, dtype=torch.bfloat16)
    q = torch.randn(args.chunk, hq, d, device=dev, dtype=torch.bfloat16)
    meta = AttentionMetadata.build([args.chunk], [seq], [table], bs, dev, workspace=False)
    wmeta = AttentionMetadata.build([args.chunk], [seq], [table], bs, dev, workspace=True)
    layers = {f: build_layer(f, k, v, nb, bs, slots, torch.bfloat16) for f in ("bfloat16", "int8", "int4", "fp8_e4m3")}
    bf = layers["bfloat16"]
    f16 = LayerKVCache(*[type(p)(p.codes.half(), None, None, None,
                                 __import__("kvpack.formats", fromlist=["x"]).resolve_format("float16", head_dim=d))
                         for p in (bf.k, bf.v)])
    ws = wmeta.workspace
    v_mean = torch.randn(hkv, d, device=dev)
    items = {
        "bf16 cache, bf16 q": lambda: prefill_paged_attention(q, bf, meta, d ** -0.5),
        "fp16 cache, bf16 q": lambda: prefill_paged_attention(q, f16, meta, d ** -0.5),
        "fp16 cache, fp16 q": lambda: prefill_paged_attention(q.half(), f16, meta, d ** -0.5),
        "dequant int8 -> fp16": lambda: dequantize_to_workspace(layers["int8"].k, layers["int8"].v, ws.src_blocks, ws.num_blocks),
        "dequant int8 -> bf16": lambda: dequantize_to_workspace(layers["int8"].k, layers["int8"].v, ws.src_blocks,
                                                                ws.num_blocks, torch.bfloat16),
        "dequant int4 -> fp16": lambda: dequantize_to_workspace(layers["int4"].k, layers["int4"].v, ws.src_blocks, ws.num_blocks),
        # the engine's int4 path at a power-of-two head dim: un-rotated, V's mean added back
        "dequant int4 -> bf16, un-rot": lambda: dequantize_to_workspace(
            layers["int4"].k, layers["int4"].v, ws.src_blocks, ws.num_blocks, torch.bfloat16, unrotate_k=True,
            unrotate_v=True, v_mean=v_mean),
        "dequant fp8_e4m3 -> bf16, un-rot": lambda: dequantize_to_workspace(
            layers["fp8_e4m3"].k, layers["fp8_e4m3"].v, ws.src_blocks, ws.num_blocks, torch.bfloat16, unrotate_k=True,
            unrotate_v=True, v_mean=v_mean),
        "int8 workspace path": lambda: prefill_paged_attention(q, layers["int8"], wmeta, d ** -0.5),
        "int8 fused": lambda: prefill_paged_attention(q, layers["int8"], meta, d ** -0.5),
        "int4 workspace path": lambda: prefill_paged_attention(q, layers["int4"], wmeta, d ** -0.5),
        "rotate q (bf16 -> fp32)": lambda: rotate_heads(q, torch.float32),
        "rotate out (fp32 -> bf16)": lambda: rotate_heads(q.float(), torch.bfloat16),
    }
    for name, fn in items.items():
        if args.only and args.only not in name:
            continue
        print(f"prefix {args.prefix:5d} {name:28s} {time_graph(fn, args.rep_ms):9.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
