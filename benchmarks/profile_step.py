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
    LenRange, add_engine_args, build_engine, parse_format_list, random_prompts, release,
)


def profile_format(args: argparse.Namespace, item: str) -> list[dict]:
    cuda = torch.cuda.is_available() and (args.device or "cuda") != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    engine = build_engine(args, item, max_model_len=args.context + args.steps + 8, enforce_eager=True,
                          max_num_seqs=max(args.batch_size, 1))
    try:
        prompts = [ids for ids, _ in random_prompts(args.batch_size, LenRange(args.context, args.context),
                                                    LenRange(1, 1), engine.model_config.vocab_size, args.seed)]
        params = SamplingParams(temperature=0.0, max_tokens=args.steps + 4, min_tokens=args.steps + 4,
                                ignore_eos=True)
        for j, ids in enumerate(prompts):
            engine.add_request(f"p{j}", ids, params)
        while engine.counters["computed_tokens"] < args.batch_size * args.context:  # prefill
            engine.step()
        for _ in range(2):  # warm up the decode path
            engine.step()
        sync()
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(args.steps):
                engine.step()
            sync()
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
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="decode steps profiled")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--out", default=None, help="JSON of every kernel row per format")
    args = ap.parse_args(argv)
    out = {}
    for item in parse_format_list(args.kv_cache_dtype):
        rows = profile_format(args, item)
        out[item] = rows
        total = sum(r["us_per_step"] for r in rows)
        print(f"\n== {item}: kernel time per decode step {total / 1000:.3f} ms "
              f"(context {args.context:,}, batch {args.batch_size}, eager)")
        for r in rows[:args.top]:
            print(f"  {r['us_per_step']:9.1f} us  x{r['calls_per_step']:5.0f}  {r['name']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "formats": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
