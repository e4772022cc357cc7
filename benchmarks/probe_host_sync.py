"""Where the host blocks inside a step: torch.profiler over a throughput run, each step's longest CPU calls.

Under async scheduling `engine.step()` launches the next batch and then waits for the one in flight,
so a step's wall time should be the device time of the batch it waits for. When launching the next
batch blocks the host (a device sync, a copy that waits for the stream, an allocation that frees
cached memory), the wait lands in the launch instead, the device can idle while the host enqueues
what follows, and the step log of `bench throughput --step-log` charges the next batch's work to this
step. This script runs a workload twice per format (a warm-up with other prompts, then profiled),
marks each step, and prints:

- the steps by kind (`bench_throughput.step_kind`: decode->decode, decode->prefill, decode->none, prefill),
  their count and mean wall time;
- for the slowest decode steps, the CPU events of most self time (CUDA runtime calls included) with the Python
  frames that made them;
- over the whole run, the CPU time in each blocking runtime call (`cudaStreamSynchronize`,
  `cudaEventSynchronize`, `cudaMemcpy*`, `cudaMalloc`, `cudaFree`, ...) by call site, the expected
  wait for the sampled tokens (`PendingSample.result`) listed apart.

    python benchmarks/probe_host_sync.py --model dummy:llama-3.1-8b --dtype bfloat16 --kv-cache-memory 4GiB \\
        --kv-cache-dtype bfloat16,int8 --num-prompts 48 --input-len 2048:8192 --output-len 64:128
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import os
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvpack.sampling_params import SamplingParams  # noqa: E402
from kvpack.tools.bench_common import (  # noqa: E402
    LenRange, add_engine_args, build_engine, parse_format_list, parse_len_range, random_prompts, release,
)
from kvpack.tools.bench_throughput import step_kind  # noqa: E402

BLOCKING = ("Synchronize", "cudaMemcpy", "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaMemset",
            "aten::item", "aten::_local_scalar_dense")
STEP_MARK = "probe_step_"


def run(engine, workload):
    """Queue the workload, step until done; per step (index, wall s, computed, generated, next tokens,
    next seqs)."""
    for i, (ids, out_len) in enumerate(workload):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", ids,
                           SamplingParams(temperature=0.0, max_tokens=out_len, min_tokens=out_len, ignore_eos=True))
    rows, i = [], 0
    while engine.has_unfinished_requests():
        c, g = engine.counters["computed_tokens"], engine.counters["generation_tokens"]
        s = time.perf_counter()
        with torch.profiler.record_function(f"{STEP_MARK}{i}"):
            engine.step()
        dt = time.perf_counter() - s
        nxt = engine._inflight
        rows.append((i, dt, engine.counters["computed_tokens"] - c, engine.counters["generation_tokens"] - g,
                     nxt[0].num_tokens if nxt else 0, len(nxt[0]) if nxt else 0))
        i += 1
    return rows


def kind(r) -> str:
    _, _, comp, gen, nt, ns = r
    return step_kind(comp, gen, nt, ns)


def is_frame(ev) -> bool:
    return ".py(" in ev.name  # a Python function event (with_stack=True)


def site(ev, depth: int) -> str:
    """The innermost `depth` kvpack Python frames around an event: its own stack where it has one,
    else the Python function events enclosing it."""
    frames = [f for f in (ev.stack or []) if "kvpack" in f]
    p = ev.cpu_parent
    while not frames and p is not None:
        if is_frame(p) and "kvpack" in p.name:
            frames.append(p.name)
            if len(frames) >= depth:
                break
        p = p.cpu_parent
    if frames and len(frames) < depth:
        while p is not None and len(frames) < depth:
            p = p.cpu_parent
            if p is not None and is_frame(p) and "kvpack" in p.name:
                frames.append(p.name)
    return " < ".join(f.split("kvpack/")[-1] for f in frames[:depth]) or "(no kvpack frame)"


def probe(args, item: str) -> dict:
    engine = build_engine(args, item, max_model_len=args.input_len.hi + args.output_len.hi)
    try:
        vocab = engine.model_config.vocab_size
        run(engine, random_prompts(args.num_prompts, args.input_len, args.output_len, vocab, args.seed + 1))
        workload = random_prompts(args.num_prompts, args.input_len, args.output_len, vocab, args.seed)
        cuda = engine.device.type == "cuda"
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=acts, with_stack=True) as prof:
            rows = run(engine, workload)
            if cuda:
                torch.cuda.synchronize()
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
        marks = {int(e.name[len(STEP_MARK):]): e for e in evs if e.name.startswith(STEP_MARK)}
        calls = sorted((e for e in evs if not e.name.startswith(STEP_MARK) and not is_frame(e)),
                       key=lambda e: e.time_range.start)
        by_kind = defaultdict(list)
        for r in rows:
            by_kind[kind(r)].append(r[1] * 1000)
        print(f"\n== {item}: {len(rows)} steps", flush=True)
        for k, v in sorted(by_kind.items()):
            print(f"  {k:16s} {len(v):5d} steps, mean {sum(v) / len(v):8.2f} ms, total {sum(v) / 1000:7.2f} s")
        blocking = defaultdict(lambda: [0, 0.0])
        for e in calls:
            if any(b in e.name for b in BLOCKING):
                key = f"{e.name} @ {site(e, args.depth)}"
                blocking[key][0] += 1
                blocking[key][1] += (e.time_range.end - e.time_range.start) / 1000
        print("  blocking CUDA runtime calls over the run (count, ms total):")
        top_blocking = sorted(blocking.items(), key=lambda kv: -kv[1][1])[:args.top]
        for k, (n, ms) in top_blocking:
            print(f"    {ms:9.1f} ms  x{n:<6d} {k}")
        slow = sorted((r for r in rows if kind(r) != "prefill"), key=lambda r: -r[1])[:args.slow_steps]
        detail = []
        for r in slow:
            m = marks.get(r[0])
            if m is None:
                continue
            a, b = m.time_range.start, m.time_range.end
            inside = [e for e in calls if a <= e.time_range.start and e.time_range.end <= b]
            longest = sorted(inside, key=lambda e: -e.self_cpu_time_total)[:args.events]  # self: children excluded
            print(f"  step {r[0]} ({kind(r)}, waited batch {r[2]} tokens, launched {r[4]} tokens / {r[5]} seqs): "
                  f"{r[1] * 1000:.1f} ms")
            for e in longest:
                print(f"    {e.self_cpu_time_total / 1000:8.2f} ms  {e.name[:40]:40s} {site(e, args.depth)}")
            detail.append({"step": r[0], "ms": r[1] * 1000, "kind": kind(r), "events": [
                {"name": e.name, "self_ms": e.self_cpu_time_total / 1000, "site": site(e, args.depth)}
                for e in longest]})
        return {"steps": {k: {"count": len(v), "mean_ms": sum(v) / len(v), "total_s": sum(v) / 1000}
                          for k, v in by_kind.items()},
                "blocking": [{"call": k, "count": n, "ms": ms} for k, (n, ms) in top_blocking],
                "slow_steps": detail}
    finally:
        release(engine)


def kernel_times(prof) -> dict[str, float]:
    """Device kernel time (us) by kernel name (first 80 characters) of a finished profile."""
    out: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
            out[e.name[:80]] += e.time_range.end - e.time_range.start
    return dict(out)


def enqueue(args, item: str) -> dict:
    """Host time to enqueue one eager forward pass (a chunk of N tokens on a prefix, writing nothing),
    for each N of --enqueue, twice in a row (the second meets every per-shape cache warm), against the
    device time of the same pass; and the same for a lone `torch.mm` of the model's MLP shape."""
    from kvpack.engine.model_runner import build_metadata, dummy_block_tables

    if not torch.cuda.is_available() or (args.device or "cuda") == "cpu":
        raise SystemExit("probe_host_sync --enqueue times CUDA launches: it needs a CUDA device")
    engine = build_engine(args, item, max_model_len=args.input_len.hi + args.output_len.hi)
    try:
        runner, dev = engine.model_runner, engine.device
        bs, nblocks = runner.block_size, runner.kv_cache.num_blocks
        res = []
        nd = args.enqueue_decodes
        for n in args.enqueue:
            ctx = min(runner.max_model_len, n + args.enqueue_prefix)
            dctx = min(runner.max_model_len, args.enqueue_decode_context or args.enqueue_prefix + 1024)
            lens_q, lens_s = [1] * nd + [n], [dctx] * nd + [ctx]
            tables = dummy_block_tables(lens_s, bs, nblocks)
            for rep in range(4 if args.kernels else 3):
                torch.cuda.synchronize()
                prof = cProfile.Profile() if rep == 2 and args.cprofile else None
                kprof = None
                if rep == 3:  # --kernels: the device kernels of one more pass, by name
                    kprof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
                    kprof.__enter__()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t = time.perf_counter()
                a.record()
                if prof:
                    prof.enable()
                md, pos = build_metadata(lens_q, lens_s, tables, bs, dev)
                for m in (md, *(md.decode_split or ())):
                    m.slot_mapping.fill_(-1)
                ids = torch.zeros(sum(lens_q), dtype=torch.int64, device=dev)
                with torch.inference_mode():
                    runner.model(ids, pos, runner.kv_cache, md)
                if prof:
                    prof.disable()
                host = time.perf_counter() - t
                b.record()
                torch.cuda.synchronize()
                if kprof is not None:
                    kprof.__exit__(None, None, None)
                    kernels = kernel_times(kprof)
                    total = sum(kernels.values())
                    print(f"  {item} {n} tokens + {nd} decode rows: device kernels {total / 1000:.2f} ms")
                    for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:args.top]:
                        print(f"    {us / 1000:8.3f} ms  {name}")
                    res.append({"tokens": n, "decodes": nd, "kernels_us": kernels})
                    continue
                res.append({"tokens": n, "decodes": nd, "rep": rep, "host_ms": host * 1000,
                            "device_ms": a.elapsed_time(b)})
                print(f"  {item} forward of {n} tokens on {ctx - n} cached + {nd} decode rows (metadata included): "
                      f"host enqueue {host * 1000:7.2f} ms, device {a.elapsed_time(b):7.2f} ms"
                      + (" (cProfile on)" if prof else " (again)" if rep else ""), flush=True)
                if prof:
                    st = pstats.Stats(prof)
                    st.sort_stats("cumulative").print_stats("kvpack", 30)
                    st.sort_stats("tottime").print_stats(20)
        cfg = engine.model_config
        w = torch.randn(cfg.intermediate_size * 2, cfg.hidden_size, dtype=torch.bfloat16, device=dev)
        for n in args.enqueue:
            x = torch.randn(n, cfg.hidden_size, dtype=torch.bfloat16, device=dev)
            for rep in range(2):
                torch.cuda.synchronize()
                t = time.perf_counter()
                torch.nn.functional.linear(x, w)
                host = time.perf_counter() - t
                torch.cuda.synchronize()
                res.append({"tokens": n, "rep": rep, "mm_host_ms": host * 1000})
                print(f"  linear [{n}, {cfg.hidden_size}] x [{cfg.hidden_size}, {w.shape[0]}]: host {host * 1000:6.3f} ms"
                      + (" (again)" if rep else ""), flush=True)
        return {"enqueue": res}
    finally:
        release(engine)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_args(ap)
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--input-len", type=parse_len_range, default=LenRange(2048, 8192))
    ap.add_argument("--output-len", type=parse_len_range, default=LenRange(64, 128))
    ap.add_argument("--top", type=int, default=15, help="blocking call sites listed")
    ap.add_argument("--slow-steps", type=int, default=4, help="slowest decode steps detailed")
    ap.add_argument("--events", type=int, default=8, help="longest CPU events listed per slow step")
    ap.add_argument("--depth", type=int, default=4, help="kvpack frames shown per call site")
    ap.add_argument("--out", default=None, help="JSON of the results per format")
    ap.add_argument("--enqueue", type=lambda t: [int(x) for x in t.split(",")], default=None,
                    help="instead of the run: host time to enqueue eager forward passes of these token counts")
    ap.add_argument("--enqueue-prefix", type=int, default=2048, help="cached tokens before each --enqueue chunk")
    ap.add_argument("--enqueue-decodes", type=int, default=0, help="decode rows beside each --enqueue chunk")
    ap.add_argument("--cprofile", action="store_true", help="with --enqueue: cProfile the third pass of each")
    ap.add_argument("--enqueue-decode-context", type=int, default=0,
                    help="context of each decode row (default: --enqueue-prefix + 1024)")
    ap.add_argument("--kernels", action="store_true",
                    help="with --enqueue: a fourth pass under torch.profiler, its device kernels by name (to "
                         "compare formats' mixed steps kernel by kernel)")
    args = ap.parse_args(argv)
    what = enqueue if args.enqueue else probe
    out = {item: what(args, item) for item in parse_format_list(args.kv_cache_dtype)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": {**vars(args), "input_len": str(args.input_len), "output_len": str(args.output_len)},
                       "formats": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
