"""`kvpack bench throughput`: offline throughput, N requests through the engine, per KV format.

All requests are queued at t0 (as vLLM's offline throughput benchmark does) and run with continuous
batching; every format in `--kv-cache-dtype` gets the same workload (seeded random token ids, or the
lines of `--dataset`), the same weights and the same KV budget. Reported per format: requests/s,
output tokens/s, total tokens/s, TTFT and TPOT means (TTFT counts the queueing from t0), preemptions,
peak KV usage, a check that every block is free at the end, and the decode-phase rate (tokens of
pure-decode steps / their time), which shows the concurrency a format buys without the prefill time
that output tok/s also counts. A step is pure decode when the batch it waits for and the batch it
launches behind it (async scheduling / output processing) are decode-only: a step that launches a
prefill chunk spends the chunk's host work (an eager forward pass, ~50 ms for Llama-8B) inside its
own time, which before session 13 was counted as decode (H200: 11.7 instead of 9.3 ms per bf16
step). `--repeats N` times N runs per format on fresh prompts (seeds seed, seed+1, ...): the row is the median run by output tok/s, with every run's output and decode
tok/s and their spread ((max - min) / median) beside it, so a ratio can be read against the noise.

    kvpack bench throughput --model llama-3.1-8b --num-prompts 256 --input-len 2048:8192 \
        --output-len 256:512 --kv-cache-memory 16GiB --kv-cache-dtype bfloat16,int8,int4
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from tqdm import tqdm

from kvpack.config import KVPackError
from kvpack.sampling_params import SamplingParams
from kvpack.tools.bench_common import (
    LenRange, add_engine_args, add_ratios, build_engine, env_info, format_table, mean, parse_format_list,
    TritonCompileLog, parse_len_range, percentile, profile_timeline, random_prompts, release, sync,
    text_prompts, write_json,
)
from kvpack.tools.output_paths import prepare_output

COLUMNS = [("kv_cache_dtype", "format", ""), ("kv_cache_tokens", "KV tokens", ",d"),
           ("requests_per_s", "req/s", ".2f"), ("output_tok_s", "output tok/s", ",.0f"),
           ("total_tok_s", "total tok/s", ",.0f"), ("output_tok_s_vs_bf16", "vs bf16", ".2f"),
           ("decode_tok_s", "decode tok/s", ",.0f"), ("decode_tok_s_vs_bf16", "vs bf16", ".2f"),
           ("mean_ttft_ms", "TTFT ms", ",.0f"), ("mean_tpot_ms", "TPOT ms", ".1f"),
           ("preemptions", "preempt", "d"), ("peak_kv_usage", "peak KV", ".0%"),
           ("peak_running", "peak seqs", "d"), ("all_blocks_free", "blocks free", "")]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_args(p)
    p.add_argument("--num-prompts", type=int, default=256, help="requests (default 256)")
    p.add_argument("--input-len", type=parse_len_range, default=LenRange(128, 128),
                   help="prompt tokens: N or a uniform range LO:HI (default 128)")
    p.add_argument("--output-len", type=parse_len_range, default=LenRange(128, 128),
                   help="generated tokens per request (EOS ignored): N or LO:HI (default 128)")
    p.add_argument("--dataset", default=None, help="text file, one prompt per line (instead of random ids)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--repeats", type=int, default=1,
                   help="timed runs per format, each on new prompts (seed + run); the table shows the "
                        "median run and the spread of output tok/s (default 1)")
    p.add_argument("--warmup-requests", type=int, default=2,
                   help="short requests run before timing, per format (default 2)")
    p.add_argument("--step-log", default=None, metavar="PREFIX",
                   help="write every timed step to PREFIX_<format>.tsv: its seconds, the tokens of the step "
                        "waited for and of the one launched behind it, running / waiting sequences, JIT "
                        "compiles so far (to see which steps a slow one sits between)")
    p.add_argument("--profile-steps", type=parse_len_range, default=None, metavar="A:B",
                   help="with --step-log: run timed steps A..B-1 of the first run under torch.profiler and "
                        "write PREFIX_<format>_profile.json: per step the wall time, the GPU's busy and idle "
                        "time, and the kernels by name (what a slow step of a real run spends its time on)")


def make_workload(args: argparse.Namespace, model_config: Any, tokenizer: Any,
                  seed: int | None = None) -> list[tuple[list[int], int]]:
    seed = args.seed if seed is None else seed
    if args.dataset:
        return text_prompts(args.dataset, tokenizer, args.num_prompts, args.output_len,
                            args.max_model_len and args.max_model_len - args.output_len.hi, seed)
    return random_prompts(args.num_prompts, args.input_len, args.output_len, model_config.vocab_size, seed)


STEP_KINDS = ("decode->decode", "decode->prefill", "decode->none", "prefill")
PURE_DECODE_KINDS = ("decode->decode", "decode->none")  # the decode phase's steps


def step_kind(computed: int, generated: int, next_tokens: int, next_seqs: int) -> str:
    """A step by the batch it waited for and the one it launched: "prefill" when the waited batch
    computed prompt tokens (a chunk, a mixed step); else "decode->decode" (the steady decode phase),
    "decode->prefill" (the step also enqueued a prefill or mixed batch: its eager host work is in the
    step's time) or "decode->none" (nothing launched: the run's end)."""
    if not generated or computed != generated:
        return "prefill"
    if not next_seqs:
        return "decode->none"
    return "decode->decode" if next_tokens == next_seqs else "decode->prefill"


STEP_LOG_COLUMNS = ("step", "ms", "computed", "generated", "pure_decode", "next_tokens", "next_seqs",
                    "running", "waiting", "compiles", "replays")


def run_requests(engine: Any, workload: list[tuple[list[int], int]], temperature: float = 0.0,
                 prefix: str = "req", progress: bool = True, step_log: list | None = None,
                 profile: tuple[LenRange, list] | None = None) -> dict[str, Any]:
    """Queue every request at once, step until done; timings and KV figures of the run. `step_log`: a
    list that gets one tuple per step (`STEP_LOG_COLUMNS`; the step launched behind the one waited for
    is `next_*`, under async scheduling its host work is inside `ms`; `replays`: CUDA graphs replayed
    inside the step, i.e. by the batch it launched: 0 where that batch ran eagerly). `profile`: (steps
    A:B, a list that gets `profile_timeline`'s rows of timed steps A..B-1, each step a `kvpack_step`
    range under torch.profiler; empty when the run has fewer steps)."""
    before = engine.stats()
    t0 = time.time()
    for i, (ids, out_len) in enumerate(workload):
        params = SamplingParams(temperature=temperature, max_tokens=out_len, min_tokens=out_len,
                                ignore_eos=True, seed=None, output_kind="final_only")
        engine.add_request(f"{prefix}-{i}", ids, params, arrival_time=t0)
    total_blocks = engine.num_total_blocks
    peak_used = peak_running = steps = 0
    ttft, tpot, n_out = [], [], 0
    bar = tqdm(total=len(workload), desc=f"{engine.kv_format_name}", unit="req", mininterval=1.0,
               disable=not progress, leave=False)
    decode_dts: list[float] = []  # each pure-decode step's seconds
    kinds = {k: {"steps": 0, "seconds": 0.0, "generated": 0} for k in STEP_KINDS}
    prof = None
    with TritonCompileLog() as compiles:  # a JIT compile inside the timed run is charged to it: logged
        while engine.has_unfinished_requests():
            computed, generated = engine.counters["computed_tokens"], engine.counters["generation_tokens"]
            replays = getattr(engine.model_runner, "num_replays", 0)
            if profile is not None and steps == profile[0].lo:
                prof = _start_profiler()
            s = time.perf_counter()
            if prof is not None:
                with torch.profiler.record_function("kvpack_step"):
                    outputs = engine.step()
            else:
                outputs = engine.step()
            dt = time.perf_counter() - s
            if prof is not None and (steps + 1 == profile[0].hi or not engine.has_unfinished_requests()):
                sync()
                prof.__exit__(None, None, None)
                profile[1].extend(profile_timeline(prof, steps + 1 - profile[0].lo))
                prof = None
            n_gen = engine.counters["generation_tokens"] - generated
            n_comp = engine.counters["computed_tokens"] - computed
            nxt = getattr(engine, "_inflight", None)  # the batch launched behind the one waited for
            next_tokens, next_seqs = (nxt[0].num_tokens, len(nxt[0])) if nxt else (0, 0)
            kind = step_kind(n_comp, n_gen, next_tokens, next_seqs)
            kinds[kind]["steps"] += 1
            kinds[kind]["seconds"] += dt
            kinds[kind]["generated"] += n_gen
            pure = kind in PURE_DECODE_KINDS
            if pure:
                decode_dts.append(dt)
            if step_log is not None:
                step_log.append((steps, round(dt * 1000, 3), n_comp, n_gen, int(pure), next_tokens, next_seqs,
                                 len(engine.scheduler.running), len(engine.scheduler.waiting),
                                 len(compiles.misses), getattr(engine.model_runner, "num_replays", 0) - replays))
            steps += 1
            peak_used = max(peak_used, total_blocks - engine.num_free_blocks)
            peak_running = max(peak_running, len(engine.scheduler.running))
            for out in outputs:
                if not out.finished:
                    continue
                m = out.metrics
                n = len(out.outputs[0].token_ids)
                n_out += n
                ttft.append(m["first_token_time"] - m["arrival_time"])
                if n > 1:
                    tpot.append((m["finished_time"] - m["first_token_time"]) / (n - 1))
                bar.update(1)
    elapsed = time.time() - t0
    bar.close()
    decode_s, decode_steps = sum(decode_dts), len(decode_dts)
    decode_tokens = sum(kinds[k]["generated"] for k in PURE_DECODE_KINDS)
    other_s = sum(v["seconds"] for k, v in kinds.items() if k not in PURE_DECODE_KINDS)
    other_tokens = sum(v["generated"] for k, v in kinds.items() if k not in PURE_DECODE_KINDS)
    after = engine.stats()
    n_in = sum(len(ids) for ids, _ in workload)
    return {
        "num_requests": len(workload), "input_tokens": n_in, "output_tokens": n_out, "elapsed_s": elapsed,
        "started_at": t0, "ended_at": t0 + elapsed,  # unix seconds: to match a GPU clock log to the run
        "steps": steps, "requests_per_s": len(workload) / elapsed, "output_tok_s": n_out / elapsed,
        "total_tok_s": (n_in + n_out) / elapsed,
        "mean_ttft_ms": _ms(mean(ttft)), "median_ttft_ms": _ms(percentile(ttft, 50)),
        "p99_ttft_ms": _ms(percentile(ttft, 99)), "mean_tpot_ms": _ms(mean(tpot)),
        "median_tpot_ms": _ms(percentile(tpot, 50)),
        "decode_tok_s": decode_tokens / decode_s if decode_s else None, "decode_s": decode_s,
        "decode_tokens": decode_tokens, "decode_steps": decode_steps,
        "mean_decode_batch": decode_tokens / decode_steps if decode_steps else None,
        "mean_decode_step_ms": _ms(decode_s / decode_steps) if decode_steps else None,
        "decode_step_ms_p10_p50_p90_max": [_ms(percentile(decode_dts, q)) for q in (10, 50, 90)]
                                          + [_ms(max(decode_dts)) if decode_dts else None],
        "other_steps": steps - decode_steps, "other_s": other_s, "other_output_tokens": other_tokens,
        "step_kinds": kinds,
        "preemptions": after["num_preemptions"] - before["num_preemptions"],
        "triton_compiles": compiles.summary(),
        "peak_kv_usage": peak_used / total_blocks, "peak_running": peak_running,
        "all_blocks_free": engine.num_free_blocks == total_blocks,
    }


def _start_profiler():
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    prof = torch.profiler.profile(activities=acts)
    prof.__enter__()
    return prof


def write_step_log(path: str, rows: list[tuple]) -> None:
    with open(path, "w") as f:
        f.write("\t".join(STEP_LOG_COLUMNS) + "\n")
        f.writelines("\t".join(map(str, r)) + "\n" for r in rows)


def _ms(x: float | None) -> float | None:
    return None if x is None else 1000.0 * x


def warmup_workload(args: argparse.Namespace, engine: Any) -> list[tuple[list[int], int]]:
    """The untimed requests before a run: `--warmup-requests` short prompts (16-512 tokens, 4 out), and
    where inputs run longer, two prompts of the longest input: chunks onto a cached prefix and mixed
    steps (decode rows beside a chunk) compile their kernel variants here, not inside the timed run
    (`benchmarks/probe_specializations.py` checks that on CPU)."""
    lo, out = min(16, args.input_len.lo), min(4, args.output_len.lo)
    vocab = engine.model_config.vocab_size
    warm = random_prompts(args.warmup_requests, LenRange(lo, max(lo, min(512, args.input_len.hi))),
                          LenRange(out, out), vocab, args.seed + 1)
    if args.input_len.hi > 512:
        n = min(args.input_len.hi, engine.max_model_len - out)
        warm += random_prompts(2, LenRange(n, n), LenRange(out, out), vocab, args.seed + 2)
    return warm


def bench_format(args: argparse.Namespace, item: str, max_model_len: int | None) -> dict[str, Any]:
    engine = build_engine(args, item, max_model_len=max_model_len)
    try:
        info = engine.kv_cache_info()
        if args.warmup_requests > 0:
            run_requests(engine, warmup_workload(args, engine), args.temperature, prefix="warmup", progress=False)
        row = {"kv_cache_dtype": item, "kv_cache_tokens": info["num_tokens"],
               "kv_bytes_per_token": info["bytes_per_token"], "kv_cache_gib": info["gib"],
               "num_blocks": info["num_blocks"], "max_model_len": info["max_model_len"],
               "max_concurrency": info["max_concurrency"]}
        runs = []
        for r in range(args.repeats):  # new prompts each time: no prefix-cache hits between runs
            workload = make_workload(args, engine.model_config, engine.tokenizer, args.seed + r)
            log = [] if getattr(args, "step_log", None) else None
            prof = (args.profile_steps, []) if getattr(args, "profile_steps", None) and r == 0 else None
            runs.append(run_requests(engine, workload, args.temperature, prefix=f"run{r}", step_log=log, profile=prof))
            if log is not None:
                write_step_log(f"{args.step_log}_{item}" + (f"_run{r}" if args.repeats > 1 else "") + ".tsv", log)
            if prof is not None:
                span = f"{args.profile_steps.lo}:{args.profile_steps.hi}"
                write_json(f"{args.step_log}_{item}_profile.json", {"steps": span, "rows": prof[1]})
                if prof[1]:
                    x = prof[1][0]
                    print(f"{item}: steps {span} profiled: wall {x['wall_us'] / 1e3:.2f} ms, GPU busy "
                          f"{x['busy_us'] / 1e3:.2f} ms, idle {x['idle_us'] / 1e3:.2f} ms per step", flush=True)
        ordered = sorted(runs, key=lambda x: x["output_tok_s"])
        row.update(ordered[(len(runs) - 1) // 2])  # the median run (the lower one of an even count)
        row["all_blocks_free"] = all(x["all_blocks_free"] for x in runs)
        if len(runs) > 1:
            out = [x["output_tok_s"] for x in runs]
            row["runs_output_tok_s"] = out
            row["runs_decode_tok_s"] = [x["decode_tok_s"] for x in runs]
            row["output_tok_s_spread"] = (max(out) - min(out)) / row["output_tok_s"]
        return row
    finally:
        release(engine)


def run(args: argparse.Namespace) -> int:
    formats = parse_format_list(args.kv_cache_dtype)
    if args.num_prompts < 1:
        raise KVPackError("--num-prompts must be >= 1")
    if args.repeats < 1:
        raise KVPackError("--repeats must be >= 1")
    if getattr(args, "profile_steps", None):
        if not getattr(args, "step_log", None):
            raise KVPackError("--profile-steps needs --step-log PREFIX (the profile goes to PREFIX_<format>_profile.json)")
        if args.profile_steps.hi <= args.profile_steps.lo:
            raise KVPackError(f"--profile-steps {args.profile_steps.lo}:{args.profile_steps.hi}: A:B profiles steps "
                              "A..B-1, so B must be larger than A")
    # before any format runs: a minutes-long run may not fail at its end
    prepare_output(getattr(args, "step_log", None), "--step-log", prefix=True)
    prepare_output(args.output_json, "--output-json")
    max_model_len = args.max_model_len
    if max_model_len is None and not args.dataset:
        max_model_len = args.input_len.hi + args.output_len.hi
    env = env_info()

    def payload(rows: list[dict], complete: bool) -> dict:
        add_ratios(rows, "output_tok_s", "output_tok_s_vs_bf16")
        add_ratios(rows, "decode_tok_s", "decode_tok_s_vs_bf16")
        add_ratios(rows, "kv_cache_tokens", "kv_tokens_vs_bf16")
        return {"bench": "throughput", "env": env, "complete": complete,
                "config": {"model": args.model, "num_prompts": args.num_prompts, "input_len": str(args.input_len),
                           "output_len": str(args.output_len), "dataset": args.dataset,
                           "kv_cache_memory": args.kv_cache_memory, "num_blocks": args.num_blocks,
                           "int4_group_size": args.int4_group_size,
                           "gpu_memory_utilization": args.gpu_memory_utilization,
                           "max_num_seqs": args.max_num_seqs, "max_model_len": max_model_len,
                           "watermark": args.watermark,
                           "enforce_eager": args.enforce_eager, "dtype": args.dtype, "repeats": args.repeats,
                           "disable_async_output_proc": args.disable_async_output_proc,
                           "async_scheduling": not args.no_async_scheduling},
                "results": rows}

    rows = []
    for item in formats:
        rows.append(bench_format(args, item, max_model_len))
        r = rows[-1]
        print(f"{item}: {r['output_tok_s']:,.0f} output tok/s, {r['requests_per_s']:.2f} req/s, "
              f"{r['preemptions']} preemptions, peak KV {r['peak_kv_usage']:.0%}", flush=True)
        if args.output_json and args.output_json != "-" and len(rows) < len(formats):
            write_json(args.output_json, payload(rows, complete=False))  # kept if a time cap cuts the run
    final = payload(rows, complete=True)
    print(f"\nthroughput: {args.model}, {args.num_prompts} requests, input {args.input_len}, "
          f"output {args.output_len}")
    spread = [("output_tok_s_spread", "spread", ".1%")] if args.repeats > 1 else []
    print(format_table(rows, COLUMNS[:4] + spread + COLUMNS[4:]))
    write_json(args.output_json, final)
    bad = [r["kv_cache_dtype"] for r in rows if not r["all_blocks_free"]]
    if bad:
        print(f"kvpack: error: KV blocks still in use after the run for {', '.join(bad)}")
        return 1
    return 0
