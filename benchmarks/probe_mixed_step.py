"""Attention of a mixed step (decode rows + one prefill chunk) as the engine runs it, against the
same rows split: the decode rows through the decode kernel, the chunk through the prefill kernel.

A chunked-prefill step puts the running sequences' decode tokens first and fills the rest of the
token budget with a prefill chunk; `kernels.paged_attention` sends the whole batch (max query
length > 1) to the prefill kernel, decode rows included. In the KV-bound workload (256 requests,
2k-8k prompts) such steps carry 26 (bf16) to 82 (int4) decode rows of ~5k tokens of context next
to an 8192-token chunk. This probe times, per format, eagerly as the engine calls them (host work
included; mixed steps are not CUDA-graphed): `mixed` (one paged_attention call), `split` (decode
kernel on the decode rows + paged_attention on the chunk) and each part alone, and checks that the
two agree.

    python benchmarks/probe_mixed_step.py [--formats bfloat16,int8,int4] [--decode-rows 26,50,82]
    python benchmarks/probe_mixed_step.py --device cpu     # a smoke run under TRITON_INTERPRET=1, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_prefill import build_layer, env_info  # noqa: E402

from kvpack.engine.model_runner import build_metadata  # noqa: E402
from kvpack.kernels import decode_paged_attention, paged_attention  # noqa: E402


def _time(fn, dev, rep_ms: int) -> float:
    if dev.type != "cuda":
        fn()
        return float("nan")
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=rep_ms) * 1000.0  # us


def probe(fmt: str, nd: int, args, dev) -> dict:
    hq, hkv, d, bs = args.num_heads, args.num_kv_heads, args.head_dim, args.block_size
    g = torch.Generator(device="cpu").manual_seed(nd)
    lens = [args.context] * nd + [args.prefix + args.chunk]
    nblk = [-(-n // bs) for n in lens]
    total = sum(nblk)
    perm = torch.randperm(total, generator=g).tolist()
    tables, at = [], 0
    for n in nblk:
        tables.append(perm[at:at + n])
        at += n
    slots = torch.cat([torch.tensor(t, dtype=torch.int64)[torch.arange(n) // bs] * bs + torch.arange(n) % bs
                       for t, n in zip(tables, lens)]).to(dev)
    k = (torch.randn(slots.numel(), hkv, d, generator=g) * 2).to(dev, torch.bfloat16)
    v = torch.randn(slots.numel(), hkv, d, generator=g).to(dev, torch.bfloat16)
    layer = build_layer(fmt, k, v, total, bs, slots, torch.bfloat16)
    q = torch.randn(nd + args.chunk, hq, d, generator=g).to(dev, torch.bfloat16)
    scale = d ** -0.5
    qlens = [1] * nd + [args.chunk]
    md = build_metadata(qlens, lens, tables, bs, dev)[0]
    md_d = build_metadata([1] * nd, lens[:nd], tables[:nd], bs, dev)[0]
    md_p = build_metadata([args.chunk], lens[nd:], tables[nd:], bs, dev)[0]

    def mixed():
        return paged_attention(q, layer, md, scale)

    def decode_part():
        return decode_paged_attention(q[:nd], layer, md_d, scale)

    def prefill_part():
        return paged_attention(q[nd:], layer, md_p, scale)

    def split():
        return torch.cat([decode_part(), prefill_part()])

    diff = (mixed().float() - split().float()).abs().max().item()
    row = {"format": fmt, "decode_rows": nd, "context": args.context, "chunk": args.chunk, "prefix": args.prefix,
           "mixed_workspace": md.workspace is not None, "chunk_workspace": md_p.workspace is not None,
           "max_abs_diff": diff}
    for name, fn in [("mixed_us", mixed), ("split_us", split), ("decode_part_us", decode_part),
                     ("prefill_part_us", prefill_part)]:
        row[name] = _time(fn, dev, args.rep_ms)
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="bfloat16,int8,int4")
    ap.add_argument("--decode-rows", default="26,50,82")
    ap.add_argument("--context", type=int, default=5000)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--prefix", type=int, default=0)
    ap.add_argument("--num-heads", type=int, default=32)
    ap.add_argument("--num-kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="JSON path")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cpu":  # interpreter smoke run
        args.context, args.chunk, args.num_heads, args.num_kv_heads, args.head_dim = 40, 24, 4, 2, 64
        args.decode_rows = "3"
    rows = []
    print("| format | decode rows | mixed us | split us (decode + chunk) | split / mixed | workspace mixed / chunk | max diff |")
    print("|---|---:|---:|---|---:|---|---:|")
    for fmt in args.formats.split(","):
        for nd in (int(x) for x in args.decode_rows.split(",")):
            r = probe(fmt, nd, args, dev)
            rows.append(r)
            print(f"| {fmt} | {nd} | {r['mixed_us']:.1f} | {r['split_us']:.1f} ({r['decode_part_us']:.1f} + "
                  f"{r['prefill_part_us']:.1f}) | {r['split_us'] / r['mixed_us']:.2f} | {r['mixed_workspace']} / "
                  f"{r['chunk_workspace']} | {r['max_abs_diff']:.2e} |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"env": env_info(argv, dev), "args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
