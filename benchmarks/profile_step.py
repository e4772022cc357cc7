"""Where one decode step's time goes, per KV format: torch.profiler over eager decode steps.

`kvpack bench latency` gives the step time under CUDA graphs; this script runs the same batch
(`--context` tokens of prompt, `--batch-size` requests) eagerly, profiles `--steps` pure-decode
steps and prints, per format, the GPU kernels grouped by name with their total time per step,
so the difference between formats can be attributed (attention kernel, cache write, rotation and
centering ops, model GEMMs). Eager steps carry launch overhead that CUDA graphs remove, so compare
kernel times (self CUDA time), not wall time. Without a GPU (or --device cpu) it lists the ops'
self CPU time instead.

    python benchmarks/profile_step.py --model llama-3.1-8b --context 32768 --kv-cache-dtype bfloat16,int8,int4
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvpack.sampling_params import SamplingParams  # noqa: E402
from kvpack.tools.bench_common import (  # noqa: E402
    LenRange, add_engine_args, build_engine, parse_format_list, parse_len_range, profile_timeline, random_prompts,
    release,
)


def profile_format(args: argparse.Namespace, item: str) -> list[dict]:
    cuda = torch.cuda.is_available() and (args.device or "cuda") != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    # sequences prefilled first decode while the others prefill (chunked prefill): their output must
    # last through every prefill step, or the profiled steps decode a smaller batch than asked
    # (before session 12 it lasted steps + 4 tokens: at 24 x 5400 only a few sequences were left)
    ctx = args.context
    chunk = args.max_num_batched_tokens or (8192 if cuda else 2048)
    out_len = -(-args.batch_size * ctx.hi // chunk) + 2 + args.steps + 4
    engine = build_engine(args, item, max_model_len=ctx.hi + out_len + 8,
                          enforce_eager=not args.cuda_graphs, max_num_seqs=max(args.batch_size, 1))
    try:
        prompts = [ids for ids, _ in random_prompts(args.batch_size, ctx, LenRange(1, 1),
                                                    engine.model_config.vocab_size, args.seed)]
        params = SamplingParams(temperature=0.0, max_tokens=out_len, min_tokens=out_len, ignore_eos=True)
        for j, ids in enumerate(prompts):
            engine.add_request(f"p{j}", ids, params)
        while engine.counters["computed_tokens"] < sum(map(len, prompts)):  # prefill
            engine.step()
        for _ in range(2):  # warm up the decode path
            engine.step()
        sync()
        running = len(engine.scheduler.running)
        print(f"== {item}: profiling {args.steps} steps decoding {running} of {args.batch_size} sequences", flush=True)
        if running != args.batch_size:
            print(f"WARNING: {args.batch_size - running} sequences are not decoding (finished or waiting)", flush=True)
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(args.steps):
                with torch.profiler.record_function("kvpack_step"):
                    engine.step()
            sync()
        if args.cuda_graphs and cuda:
            if args.trace:
                prof.export_chrome_trace(f"{args.trace}_{item}.json")
            return profile_timeline(prof, args.steps)
        while engine.has_unfinished_requests():
            engine.step()
        rows = []
        kernel = torch.autograd.DeviceType.CUDA
        for e in prof.key_averages():  # GPU kernels (self device time); on CPU, the ops' self CPU time
            if cuda and getattr(e, "device_type", kernel) != kernel:
                continue  # operator rows repeat their kernels' time
            t = getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) if cuda \
                else e.self_cpu_time_total
            if t > 0:
                rows.append({"name": e.key[:90], "us_per_step": t / args.steps, "calls_per_step": e.count / args.steps})
        rows.sort(key=lambda r: -r["us_per_step"])
        return rows
    finally:
        release(engine)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_args(ap)
    ap.add_argument("--context", type=parse_len_range, default=LenRange(32768, 32768),
                    help="prompt tokens per sequence: N, or LO:HI for lengths uniform in [LO, HI] (mixed batches)")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="decode steps profiled")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--out", default=None, help="JSON of every kernel row per format")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="profile decode steps as the engine runs them (CUDA graphs) and print where each "
                         "step's wall time goes: GPU busy and idle, the idle time before each kernel")
    ap.add_argument("--trace", default=None, help="with --cuda-graphs: chrome trace path prefix")
    args = ap.parse_args(argv)
    out = {}
    for item in parse_format_list(args.kv_cache_dtype):
        rows = profile_format(args, item)
        out[item] = rows
        if args.cuda_graphs and rows and "wall_us" in rows[0]:
            print(f"\n== {item}: decode steps under CUDA graphs (context {args.context}, batch {args.batch_size})")
            for r in rows:
                if "wall_us" in r:
                    print(f"  {r['name']}: wall {r['wall_us']:8.1f} us, GPU busy {r['busy_us']:8.1f}, GPU idle "
                          f"{r['idle_us']:7.1f}, {r['kernels']:.0f} kernels (profiler overhead included)")
                else:
                    print(f"  {r['us_per_step']:8.1f} us  {r['name']}")
            continue
        total = sum(r["us_per_step"] for r in rows)
        print(f"\n== {item}: kernel time per decode step {total / 1000:.3f} ms "
              f"(context {args.context}, batch {args.batch_size}, eager)")
        for r in rows[:args.top]:
            print(f"  {r['us_per_step']:9.1f} us  x{r['calls_per_step']:5.0f}  {r['name']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": {**vars(args), "context": str(args.context)}, "formats": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
