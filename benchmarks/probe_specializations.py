"""Which Triton kernel specializations a timed `bench throughput` run meets for the first time (CPU).

Triton compiles a kernel once per *specialization*: its constexpr values, launch options, and for every
other argument its type and whether an integer equals 1 or is a multiple of 16 and whether a tensor's
address is 16-byte aligned. A specialization first met inside a timed run compiles there (about 1-3 s
on an H200 for the attention kernels), charged to the workload; a server meets it in the middle of a
request. This probe runs the engine on CPU with the Triton attention kernels under the interpreter
(`KVPACK_ATTENTION_BACKEND=triton`, `TRITON_INTERPRET=1`), records the specialization key of every
kernel launch as Triton 3.6 would form it, and reports the keys of the timed run's non-pure-decode
steps (prefill chunks, mixed steps) that the warm-ups did not meet: the engine's own
(`ModelRunner.warmup_eager`, run at start on CUDA; `--no-warmup-eager` leaves it out) and the
benchmark's (`bench_throughput.warmup_workload`). Pure-decode steps are left out: on CUDA they replay
graphs captured (and compiled) at start. The fused model ops (RMSNorm, RoPE, SiLU) run as PyTorch on
CPU, so they are not covered.

    python benchmarks/probe_specializations.py --kv-cache-dtype bfloat16,int8,int4 --input-len 300:700 \
        --output-len 8:16 --num-prompts 8 --max-num-batched-tokens 256
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("KVPACK_ATTENTION_BACKEND", "triton")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from kvpack.sampling_params import SamplingParams  # noqa: E402
from kvpack.tools.bench_common import LenRange, build_engine, parse_len_range, random_prompts, release  # noqa: E402
from kvpack.tools.bench_throughput import warmup_workload  # noqa: E402

_SIGS: dict[int, tuple] = {}


def spec_key(fn, args: tuple, kwargs: dict) -> tuple:
    """(kernel name, per-argument specialization, options) as Triton 3.6's JIT keys a launch."""
    if id(fn) not in _SIGS:
        sig = inspect.signature(fn.fn)
        const = {n for n, p in sig.parameters.items() if "constexpr" in str(p.annotation)}
        plain = set(getattr(fn, "kwargs", {}).get("do_not_specialize") or ())  # `@triton.jit(do_not_specialize=...)`
        _SIGS[id(fn)] = (sig, const, plain)
    sig, const, plain = _SIGS[id(fn)]
    names = set(sig.parameters)
    bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    spec = []
    for name, v in bound.arguments.items():
        if name in const or v is None:
            spec.append((name, "c", v if not isinstance(v, torch.Tensor) else "tensor"))
        elif isinstance(v, bool):
            spec.append((name, "i1"))
        elif isinstance(v, int):
            width = "i32" if -2**31 <= v < 2**31 else "i64"
            spec.append((name, width) if name in plain else (name, width, "1" if v == 1 else "D16" if v % 16 == 0 else "-"))
        elif isinstance(v, float):
            spec.append((name, "fp32"))
        elif isinstance(v, torch.Tensor):
            spec.append((name, str(v.dtype), "D16" if v.data_ptr() % 16 == 0 else "-"))
        else:
            spec.append((name, type(v).__name__, repr(v)))
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in names))
    return fn.fn.__name__, tuple(spec), options


class Recorder:
    def __init__(self) -> None:
        self.bucket: set | None = None
        self._orig = interpreter.InterpretedFunction.run

    def __enter__(self):
        rec = self

        def run(fn, *args, grid, warmup, **kwargs):
            if rec.bucket is not None:
                rec.bucket.add(spec_key(fn, args, kwargs))
            return rec._orig(fn, *args, grid=grid, warmup=warmup, **kwargs)

        interpreter.InterpretedFunction.run = run
        return self

    def __exit__(self, *exc):
        interpreter.InterpretedFunction.run = self._orig


def run_recorded(engine, workload, rec: Recorder, prefix: str) -> tuple[set, set]:
    """Step a workload to completion; (keys of non-pure-decode steps, keys of pure-decode steps)."""
    for i, (ids, out) in enumerate(workload):
        engine.add_request(f"{prefix}-{i}", ids, SamplingParams(temperature=0.0, max_tokens=out, min_tokens=out,
                                                                ignore_eos=True))
    other, decode = set(), set()
    first = True
    while engine.has_unfinished_requests():
        rec.bucket = set()
        engine.step()
        # the kernels a step launches are those of the batch it launches behind the one it waits for
        # (async scheduling; the first step launches two): pure decode when that batch is decode-only
        # (until session 13 this looked at the batch waited for, and so filed the prefill chunks
        # launched by decode steps under decode)
        nxt = getattr(engine, "_inflight", None)
        pure = not first and nxt is not None and nxt[0].num_tokens == len(nxt[0])
        (decode if pure else other).update(rec.bucket)
        rec.bucket = None
        first = False
    return other, decode


def describe(key: tuple, known: set) -> str:
    """The kernel and the arguments in which `key` differs from the closest key of `known`."""
    name, spec, opts = key
    same = [k for k in known if k[0] == name]
    if not same:
        return f"{name}: never launched in the warm-up"
    best = min(same, key=lambda k: sum(a != b for a, b in zip(k[1], spec)) + (k[2] != opts))
    diff = [f"{b[0]}={b[1:]} (warm-up {a[1:]})" for a, b in zip(best[1], spec) if a != b]
    if best[2] != opts:
        diff.append(f"options {opts} (warm-up {best[2]})")
    return f"{name}: " + ", ".join(diff)


def probe(args: argparse.Namespace, item: str) -> dict:
    engine = build_engine(args, item, max_model_len=args.max_model_len)
    try:
        with Recorder() as rec:
            rec.bucket = set()  # the engine's start-up warm-up, as on CUDA (`ModelRunner.warmup_eager`)
            if not args.no_warmup_eager:
                engine.model_runner.warmup_eager(force=True)
            start = rec.bucket
            rec.bucket = None
            warm_other, warm_dec = (run_recorded(engine, warmup_workload(args, engine), rec, "warm")
                                    if args.warmup_requests > 0 else (set(), set()))
            warm_other |= start
            workload = random_prompts(args.num_prompts, args.input_len, args.output_len,
                                      engine.model_config.vocab_size, args.seed)
            run_other, run_dec = run_recorded(engine, workload, rec, "run")
        warm = warm_other | warm_dec
        new = sorted(run_other - warm, key=str)
        return {"kv_cache_dtype": item, "warmup_keys": len(warm), "run_keys": len(run_other | run_dec),
                "new_in_timed_run": [describe(k, warm) for k in new],
                "new_in_pure_decode_steps": len(run_dec - warm)}
    finally:
        release(engine)


def main(argv: list[str] | None = None) -> int:
    from kvpack.tools.bench_common import add_engine_args, parse_format_list

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_args(ap, default_model="dummy:tiny-llama")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--input-len", type=parse_len_range, default=LenRange(300, 700))
    ap.add_argument("--output-len", type=parse_len_range, default=LenRange(8, 16))
    ap.add_argument("--warmup-requests", type=int, default=4)
    ap.add_argument("--no-warmup-eager", action="store_true",
                    help="leave out the engine's start-up warm-up (`ModelRunner.warmup_eager`, run on CUDA)")
    args = ap.parse_args(argv)
    bad = 0
    for item in parse_format_list(args.kv_cache_dtype):
        r = probe(args, item)
        print(f"{item}: {r['warmup_keys']} specializations in the warm-up, {r['run_keys']} in the run; "
              f"first met in the run's prefill / mixed steps: {len(r['new_in_timed_run'])} "
              f"(pure-decode steps, CUDA graphs on GPU: {r['new_in_pure_decode_steps']})")
        for line in r["new_in_timed_run"]:
            print("   ", line)
        bad += len(r["new_in_timed_run"])
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
