"""The engine's host work per step at a large decode batch, part by part, as the outputs grow.

A decode step under CUDA graphs costs the GPU a few milliseconds; the host's own work per step
(scheduling, inputs and metadata, the outputs) must stay below that, or the step waits on the host.
This runs `--batch` requests of `--input` prompt tokens and `--output` new tokens through the engine
(eager; the model forward is timed apart and left out) and prints, over `--window` steps near the end,
the milliseconds a step spends in each part. `--output-kind final_only` (what `LLM.generate` and
`kvpack bench throughput` use since session 16) skips the per-step outputs of unfinished requests.
Runs on CPU (a tiny preset) or a GPU.

    python benchmarks/probe_host_step.py --model dummy:tiny-llama --device cpu --batch 256 --output 700
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvpack.engine.llm_engine import LLMEngine, _Request  # noqa: E402
from kvpack.sampling_params import SamplingParams  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:tiny-llama")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kv-cache-dtype", default="int8")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--input", type=int, default=32)
    ap.add_argument("--output", type=int, default=700)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--output-kind", default="cumulative", choices=("cumulative", "final_only"))
    args = ap.parse_args(argv)
    n_in, n_out, b = args.input, args.output, args.batch
    engine = LLMEngine.from_args(args.model, kv_cache_dtype=args.kv_cache_dtype, device=args.device,
                                 max_model_len=n_in + n_out + 16, num_blocks=b * (n_in + n_out + 16) // 16 + 64,
                                 max_num_seqs=b, max_num_batched_tokens=8192, enforce_eager=True)
    params = SamplingParams(max_tokens=n_out, ignore_eos=True, temperature=0.0, output_kind=args.output_kind)
    for i in range(b):
        engine.add_request(str(i), list(range(1, n_in + 1)), params)
    spent: collections.Counter = collections.Counter()

    def timed(obj, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] += time.perf_counter() - t
        setattr(obj, name, wrapper)

    for name in ("schedule", "advance", "fill"):
        timed(engine.scheduler, name, name)
    timed(engine.model_runner, "prepare_inputs", "prepare_inputs (metadata)")
    timed(engine.model_runner, "run_model", "forward (left out)")
    timed(_Request, "output", "request outputs")
    first = max(0, n_out - 10 - args.window)
    step = 0
    while engine.has_unfinished_requests():
        if step == first:
            spent.clear()
            t0 = time.perf_counter()
        engine.step()
        step += 1
        if step == first + args.window:
            total = time.perf_counter() - t0
            host = total - spent["forward (left out)"]
            print(f"batch {b}, steps {first}..{step - 1} (outputs ~{first + args.window // 2} tokens, "
                  f"{args.output_kind}): host {host / args.window * 1e3:.2f} ms a step")
            for key, sec in spent.most_common():
                if key != "forward (left out)":
                    print(f"  {key:28s} {sec / args.window * 1e3:6.2f} ms")
            print(f"  {'rest of the step':28s} {(host - sum(v for k, v in spent.items() if k != 'forward (left out)')) / args.window * 1e3:6.2f} ms")
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
