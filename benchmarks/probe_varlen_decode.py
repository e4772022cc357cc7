"""Decode attention over a batch of *mixed* context lengths, as the KV-bound workload runs it.

bench_attention.py times batches whose sequences all have one length. The KV-bound workload
(inputs 2048-8192 tokens, outputs 256-512, a 16 GiB pool) decodes batches of 22 (bf16), 41 (int8) or
61 (int4) sequences of 2-9k tokens each, from CUDA graphs whose split-K grid was planned for the
context bucket (the longest length the graph serves), not for the lengths it replays. A program of a
long sequence can then run alone while the SMs idle. This probe fills one layer's pools with such a
batch (lengths uniform in --lo..--hi, seeded) and times, per format, the decode launch (CUDA graph
replay, L2 flushed, median) planned from the bucket (`--bucket`, as a captured graph is) for the
default plan and for split counts / variants given on the command line, beside the same number of
tokens in one length (the bench_attention case). Prints a table and writes JSON.

    python benchmarks/probe_varlen_decode.py --cases bf16:22,int8:41,int4:61,fp8_e4m3:41 --out probe_varlen.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import Shape, environment, kv_bytes, make_case, time_graph  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="bf16:22,int8:41,int4:61,fp8_e4m3:41",
                    help="format:batch, comma-separated")
    ap.add_argument("--lo", type=int, default=2304)
    ap.add_argument("--hi", type=int, default=8704)
    ap.add_argument("--bucket", type=int, default=8704, help="max_seq_len the plan sees (a graph's context bucket)")
    ap.add_argument("--splits", default="0,1,2,4,9,18", help="split counts (0: the plan's own)")
    ap.add_argument("--variants", default="auto", help="comma-separated decode variants (auto, dot, imma, frag)")
    ap.add_argument("--ring", default="auto", help="frag: auto (the plan's), or a comma list of prefetch values")
    ap.add_argument("--rep-ms", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tables", default="random",
                    help="comma list: random (a permuted pool) and / or engine (the allocator's order for "
                         "--prompt-token prompts decoding in lockstep, `bench_attention.engine_tables`)")
    ap.add_argument("--prompt", type=int, default=512, help="--tables engine: the prompts' tokens")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    dev = torch.device("cuda")
    rows = []
    shape = Shape("llama8b", 1, 1)
    for case in args.cases.split(","):
        fmt_name, b = case.split(":")
        gen = torch.Generator().manual_seed(args.seed)
        lens = torch.randint(args.lo, args.hi + 1, (int(b),), generator=gen).tolist()
        mean_len = sum(lens) // len(lens)
        for kind, ls, tables in [(k, ls, t) for t in args.tables.split(",")
                                 for k, ls in (("mixed", lens), ("uniform", [mean_len] * len(lens)))]:
            lc, meta, q = make_case(fmt_name, shape, dev, gen, ls, tables=tables, prompt=args.prompt)
            kind = f"{kind}/{tables}"
            meta = dataclasses.replace(meta, max_seq_len=max(args.bucket, max(ls)))  # as a captured graph plans
            nbytes = kv_bytes(lc, dataclasses.replace(shape, batch=1, context=sum(ls)))
            ref = None
            for variant in args.variants.split(","):
                prefetches = [None] if variant != "frag" or args.ring == "auto" else [int(p) for p in args.ring.split(",")]
                for pf in prefetches:
                    for splits in [int(s) for s in args.splits.split(",")]:
                        kw = dict(num_splits=splits or None, variant=variant, prefetch=pf)
                        try:
                            plan = plan_decode(q, lc, meta, 128 ** -0.5, **kw)
                            fn = lambda kw=kw, q=q, lc=lc, meta=meta: decode_paged_attention(q, lc, meta, 128 ** -0.5, **kw)  # noqa: E731
                            out = fn().float()
                            ref = out if ref is None else ref
                            diff = (out - ref).abs().max().item()
                            us = time_graph(fn, args.rep_ms)
                        except Exception as e:  # a config that does not apply: recorded
                            print(f"{fmt_name} b{b} {kind} {variant} pf={pf} splits={splits}: {type(e).__name__} {str(e)[:100]}")
                            continue
                        pf_used = plan.args[plan.kernel.arg_names.index("PREFETCH")] if "PREFETCH" in plan.kernel.arg_names else None
                        row = {"format": fmt_name, "batch": int(b), "lengths": kind, "tokens": sum(ls),
                               "max_len": max(ls), "variant": variant, "plan_variant": plan.variant,
                               "splits": splits, "plan_splits": plan.grid[2], "prefetch": pf_used,
                               "ring4": plan.options.get("RING4", 0),
                               "us": us, "TBps": nbytes / us / 1e6, "max_diff": diff}
                        rows.append(row)
                        print(f"{fmt_name:9s} b{int(b):3d} {kind:14s} {variant:5s}->{plan.variant:5s} pf={pf_used} "
                              f"ring4={row['ring4']} sp={splits:3d}->{plan.grid[2]:3d} {us:8.1f} us {row['TBps']:5.2f} TB/s diff {diff:.1e}",
                              flush=True)
            lc = meta = q = None
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"env": environment(sys.argv), "args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
