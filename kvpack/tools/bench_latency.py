"""`kvpack bench latency`: per-token decode latency of one batch at a given context, per KV format.

A batch of `--batch-size` requests with `--context`-token prompts decodes `--output-len` tokens,
`--num-iters` times. The first iteration prefills (its TTFT is reported) and warms up; later ones
find the prompts in the prefix cache, so their steps are (almost) all pure decode at that context.
Only pure-decode steps are timed (a step's wall time includes the sampler's device sync). Reported:
mean / median / p90 per-token latency, tokens/s, and the roofline unit of decode: GB/s of KV cache
read (context x bytes per token x batch per step) next to the weights read, and the bytes one step
reads relative to bf16 (weights + KV), the bandwidth bound of the latency ratio: at batch 1 an 8B
model's 16 GB of weights dwarf a 32k context's 4 GiB of bf16 KV, so no format can cut the step by
more than ~10% there; the KV share (and the gain) grows with context and batch.

    kvpack bench latency --model llama-3.1-8b --context 32768 --batch-size 1 --kv-cache-dtype bfloat16,int8
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tqdm import tqdm

from kvpack.config import KVPackError
from kvpack.sampling_params import SamplingParams
from kvpack.tools.bench_common import (
    LenRange, add_engine_args, add_ratios, build_engine, env_info, format_table, mean, parse_format_list,
    percentile, random_prompts, release, write_json,
)
from kvpack.tools.output_paths import prepare_output

COLUMNS = [("kv_cache_dtype", "format", ""), ("context", "context", ",d"), ("batch_size", "batch", "d"),
           ("median_ms", "median ms/token", ".3f"), ("mean_ms", "mean ms", ".3f"), ("p90_ms", "p90 ms", ".3f"),
           ("median_vs_bf16", "vs bf16", ".2f"), ("bytes_vs_bf16", "bytes vs bf16", ".2f"),
           ("tokens_per_s", "tok/s", ",.0f"),
           ("kv_gb_s", "KV GB/s", ",.0f"), ("total_gb_s", "KV+weights GB/s", ",.0f"),
           ("ttft_ms", "prefill ms", ",.0f")]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_args(p)
    p.add_argument("--context", type=int, default=32768, help="prompt tokens per request (default 32768)")
    p.add_argument("--batch-size", type=int, default=1, help="requests decoding together (default 1)")
    p.add_argument("--output-len", type=int, default=64, help="decode steps per iteration (default 64)")
    p.add_argument("--num-iters", type=int, default=3,
                   help="iterations; the first (prefill + warm-up) is not timed unless it is the only one")


def _weight_bytes(engine: Any) -> int:
    model = engine.model_runner.model
    return sum(p.numel() * p.element_size() for p in model.parameters())


def run_iteration(engine: Any, prompts: list[list[int]], output_len: int, tag: str) -> dict[str, Any]:
    """One batch to completion: (TTFT s, list of pure-decode step seconds)."""
    t0 = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True)
    for j, ids in enumerate(prompts):
        engine.add_request(f"{tag}-{j}", ids, params)
    ttft, decode = None, []
    while engine.has_unfinished_requests():
        computed = engine.counters["computed_tokens"]
        running = len(engine.scheduler.running)
        s = time.perf_counter()
        outputs = engine.step()
        dt = time.perf_counter() - s
        if ttft is None and outputs:
            ttft = time.perf_counter() - t0
        n_tok = engine.counters["computed_tokens"] - computed
        if running == len(prompts) and n_tok == len(prompts):  # every sequence decoded one token
            decode.append(dt)
    return {"ttft": ttft, "decode": decode}


def bench_format(args: argparse.Namespace, item: str) -> dict[str, Any]:
    max_len = args.context + args.output_len + 1
    engine = build_engine(args, item, max_model_len=max(max_len, args.max_model_len or 0),
                          max_num_seqs=max(args.batch_size, args.max_num_seqs or 0) or None)
    try:
        info = engine.kv_cache_info()
        prompts = [ids for ids, _ in random_prompts(args.batch_size, LenRange(args.context, args.context),
                                                    LenRange(1, 1), engine.model_config.vocab_size, args.seed)]
        runs = []
        for it in tqdm(range(args.num_iters), desc=item, unit="iter", leave=False):
            runs.append(run_iteration(engine, prompts, args.output_len, f"it{it}"))
        timed = runs[1:] if len(runs) > 1 else runs
        steps = [d for r in timed for d in (r["decode"][2:] if len(runs) == 1 else r["decode"])]
        if not steps:
            raise KVPackError("no pure-decode step was timed; raise --output-len")
        med = percentile(steps, 50)
        kv_bytes = args.batch_size * (args.context + args.output_len / 2) * info["bytes_per_token"]
        w_bytes = _weight_bytes(engine)
        return {
            "kv_cache_dtype": item, "context": args.context, "batch_size": args.batch_size,
            "output_len": args.output_len, "timed_steps": len(steps),
            "median_ms": 1000 * med, "mean_ms": 1000 * mean(steps), "p90_ms": 1000 * percentile(steps, 90),
            "min_ms": 1000 * min(steps), "tokens_per_s": args.batch_size / med,
            "kv_gb_s": kv_bytes / med / 1e9, "total_gb_s": (kv_bytes + w_bytes) / med / 1e9,
            "kv_bytes_per_token": info["bytes_per_token"], "weight_bytes": w_bytes,
            "bytes_per_step": kv_bytes + w_bytes,
            "ttft_ms": None if runs[0]["ttft"] is None else 1000 * runs[0]["ttft"],
            "kv_cache_tokens": info["num_tokens"], "all_blocks_free": engine.num_free_blocks == engine.num_total_blocks,
        }
    finally:
        release(engine)


def run(args: argparse.Namespace) -> int:
    formats = parse_format_list(args.kv_cache_dtype)
    if args.context < 1 or args.batch_size < 1 or args.output_len < 4 or args.num_iters < 1:
        raise KVPackError("--context, --batch-size and --num-iters must be >= 1 and --output-len >= 4")
    prepare_output(args.output_json, "--output-json")
    rows = []
    for item in formats:
        rows.append(bench_format(args, item))
        print(f"{item}: {rows[-1]['median_ms']:.3f} ms/token at {args.context:,} tokens of context", flush=True)
    add_ratios(rows, "median_ms", "median_vs_bf16")
    add_ratios(rows, "bytes_per_step", "bytes_vs_bf16")  # the bandwidth bound of median_vs_bf16
    print(f"\nlatency: {args.model}, batch {args.batch_size}, context {args.context:,}, "
          f"{args.output_len} decode steps x {args.num_iters} iterations")
    print(format_table(rows, COLUMNS))
    write_json(args.output_json, {
        "bench": "latency", "env": env_info(),
        "config": {"model": args.model, "context": args.context, "batch_size": args.batch_size,
                   "output_len": args.output_len, "num_iters": args.num_iters,
                   "enforce_eager": args.enforce_eager, "dtype": args.dtype,
                   "disable_async_output_proc": args.disable_async_output_proc,
                           "async_scheduling": not args.no_async_scheduling},
        "results": rows})
    return 0 if all(r["all_blocks_free"] for r in rows) else 1
