"""The engine's scheduler on a `bench throughput` workload, without a model or a GPU (CPU, seconds).

Runs kvpack's own `Scheduler` and `BlockManager` (prefix caching on, as the engine runs them) over the
same seeded requests `kvpack bench throughput` would send, in a KV pool of the size the memory planner
gives each format for `--kv-cache-memory` (`bench capacity`'s arithmetic). Every sampled token is a
dummy; a request ends at its output length, as with `ignore_eos`. Per format it reports the steps,
the pure-decode steps and their mean batch, the preemptions, and the tokens computed beyond the
workload's own (a preempted sequence's prompt and output computed again: what its prefix-cache blocks
no longer held).

    python benchmarks/simulate_schedule.py --kv-cache-memory 2GiB --input-len 2048 --output-len 512 \
        --kv-cache-dtype bfloat16,int8,int4

Checked against the H200 runs of results/kv_budget_s23 (same commit, same seeds): steps, preemptions
and mean decode batch within ~1 % of the measured ones (the engine schedules a step ahead of its
tokens, async scheduling; this runs each step's update before the next schedule). `--watermark` is the
scheduler's admission watermark (the engine's default 0.01; 0 is the scheduler before session 24):
results/kv_budget_s24 measured both, preemptions within 2 and steps within 0.3 % of these.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvpack.config import DEFAULT_WATERMARK, SchedulerConfig, add_int4_group_size_arg, add_watermark_arg  # noqa: E402
from kvpack.engine.block_manager import BlockManager  # noqa: E402
from kvpack.engine.memory_planner import parse_bytes  # noqa: E402
from kvpack.engine.scheduler import Scheduler  # noqa: E402
from kvpack.engine.sequence import Sequence  # noqa: E402
from kvpack.sampling_params import SamplingParams  # noqa: E402
from kvpack.tools.bench_capacity import capacity_rows  # noqa: E402
from kvpack.tools.bench_common import (  # noqa: E402
    LenRange, format_table, model_config_only, parse_format_list, parse_len_range, random_prompts)


def simulate(workload: list[tuple[list[int], int]], num_blocks: int, block_size: int = 16,
             max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
             watermark: float = DEFAULT_WATERMARK) -> dict:
    """Schedule `workload` ((prompt ids, output length) pairs) to the end in a pool of `num_blocks`."""
    max_model_len = max(len(p) + o for p, o in workload)
    sched = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                      max_model_len=max_model_len, watermark=watermark),
                      BlockManager(num_blocks, block_size))
    for i, (prompt, out) in enumerate(workload):
        sched.add(Sequence(str(i), prompt, SamplingParams(max_tokens=out, ignore_eos=True)))
    steps = computed = decode_steps = decode_rows = 0
    while sched.has_unfinished():
        batch = sched.schedule()
        if not batch.seqs:
            raise RuntimeError(f"nothing schedulable: {num_blocks} blocks of {block_size} cannot hold one request")
        steps += 1
        computed += batch.num_tokens
        if all(s.num_computed_tokens >= s.num_prompt_tokens for s in batch.seqs):  # every row decodes
            decode_steps += 1
            decode_rows += len(batch.seqs)
        sampled = {s.seq_id: 0 for i, s in enumerate(batch.seqs) if batch.needs_sample(i)}
        for seq in sched.update(batch, sampled):
            if seq.num_output_tokens >= seq.params.max_tokens:
                sched.finish(seq, "length")
    # each request computes its prompt and all but its last output token (the last is never fed back)
    own = sum(len(p) + o - 1 for p, o in workload)
    return {"steps": steps, "decode_steps": decode_steps, "mean_decode_batch": decode_rows / max(decode_steps, 1),
            "preemptions": sched.num_preemptions, "computed_tokens": computed, "recomputed_tokens": computed - own,
            "recomputed_vs_prompts": (computed - own) / sum(len(p) for p, _ in workload)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="dummy:llama-3.1-8b", help="preset or HF folder / GGUF (its config only)")
    p.add_argument("--kv-cache-memory", type=parse_bytes, required=True)
    p.add_argument("--kv-cache-dtype", default="bfloat16,int8,int4")
    add_int4_group_size_arg(p)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=parse_len_range, default=LenRange(128, 128))
    p.add_argument("--output-len", type=parse_len_range, default=LenRange(128, 128))
    p.add_argument("--max-num-seqs", type=int, default=256, help="the engine's CUDA default")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="the engine's CUDA default")
    add_watermark_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    formats = parse_format_list(args.kv_cache_dtype)
    workload = random_prompts(args.num_prompts, args.input_len, args.output_len,
                              model_config_only(args.model).vocab_size, args.seed)
    caps = capacity_rows(args.model, args.kv_cache_memory, formats, block_size=args.block_size,
                         int4_group_size=args.int4_group_size)
    rows = []
    for cap in caps:
        r = simulate(workload, cap["blocks"], args.block_size, args.max_num_seqs, args.max_num_batched_tokens,
                     args.watermark)
        rows.append({"kv_cache_dtype": cap["kv_cache_dtype"], "tokens": cap["tokens"], **r})
    print(f"{args.model}, {args.num_prompts} requests of {args.input_len} in / {args.output_len} out, "
          f"{args.kv_cache_memory / 2**30:g} GiB of KV, watermark {args.watermark:g}")
    print(format_table(rows, [("kv_cache_dtype", "format", ""), ("tokens", "KV tokens", ",d"), ("steps", "steps", ",d"),
                              ("decode_steps", "decode steps", ",d"), ("mean_decode_batch", "mean decode batch", ".1f"),
                              ("preemptions", "preemptions", ",d"), ("recomputed_tokens", "recomputed tokens", ",d"),
                              ("recomputed_vs_prompts", "vs prompt tokens", ".3f")]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
