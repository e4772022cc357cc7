"""Side-by-side table and plot of the engine's scheduling modes (sync, async output processing,
async scheduling) from `kvpack bench latency` / `bench throughput` JSONs measured in one run.

    python benchmarks/plot_async.py results/engine_s11
reads {latency,short}_{sync,async_output,async_sched}.json there and writes async_modes.md and
async_modes.png beside them.
"""

from __future__ import annotations

import json
import os
import sys

MODES = [("sync", "synchronous (--disable-async-output-proc)"),
         ("async_output", "async output processing (--no-async-scheduling)"),
         ("async_sched", "async scheduling (default)")]


def _load(folder: str, name: str) -> dict | None:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main(folder: str) -> int:
    lat = {m: _load(folder, f"latency_{m}.json") for m, _ in MODES}
    short = {m: _load(folder, f"short_{m}.json") for m, _ in MODES}
    env = next(d["env"] for d in [*lat.values(), *short.values()] if d)
    lines = [f"# Engine scheduling modes, {env['gpu']}", "",
             f"driver {env['driver']}, torch {env['torch']}, triton {env['triton']}, commit `{env['commit'][:7]}`; "
             "preset llama-3.1-8b, dummy bf16 weights, CUDA graphs. One run, modes side by side.", ""]
    lines += ["## Decode latency at 32k context, batch 1 (`kvpack bench latency --context 32768 --batch-size 1 "
              "--output-len 64 --num-iters 3 --kv-cache-memory 8GiB`)", "",
              "| mode | bf16 ms/token | int8 ms/token | int8 vs bf16 |", "|---|---:|---:|---:|"]
    for m, label in MODES:
        if lat[m]:
            r = {x["kv_cache_dtype"]: x for x in lat[m]["results"]}
            b, i = r["bfloat16"]["median_ms"], r["int8"]["median_ms"]
            lines.append(f"| {label} | {b:.3f} | {i:.3f} | {i / b:.2f} |")
    lines += ["", "## Short workload (`kvpack bench throughput --num-prompts 256 --input-len 128 --output-len 128 "
              "--kv-cache-memory 16GiB --repeats 1`): output tokens/s", "",
              "| mode | bf16 | int8 | int4 | TPOT ms bf16 / int8 / int4 |", "|---|---:|---:|---:|---|"]
    for m, label in MODES:
        if short[m]:
            r = {x["kv_cache_dtype"]: x for x in short[m]["results"]}
            fm = ("bfloat16", "int8", "int4")
            lines.append(f"| {label} | " + " | ".join(f"{r[f]['output_tok_s']:,.0f}" for f in fm)
                         + " | " + " / ".join(f"{r[f]['median_tpot_ms']:.1f}" for f in fm) + " |")
    cmd = (short["async_sched"] or next(d for d in short.values() if d))["env"]["command"]
    lines += ["", f"Commands: `{cmd}` with `--disable-async-output-proc`, `--no-async-scheduling` or neither; "
              "the latency rows likewise.", ""]
    with open(os.path.join(folder, "async_modes.md"), "w") as f:
        f.write("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.27
    for k, (m, label) in enumerate(MODES):
        if lat[m]:
            r = {x["kv_cache_dtype"]: x for x in lat[m]["results"]}
            a1.bar([j + (k - 1) * width for j in range(2)], [r["bfloat16"]["median_ms"], r["int8"]["median_ms"]],
                   width, label=label)
        if short[m]:
            r = {x["kv_cache_dtype"]: x for x in short[m]["results"]}
            a2.bar([j + (k - 1) * width for j in range(3)], [r[f]["output_tok_s"] for f in ("bfloat16", "int8", "int4")],
                   width, label=label)
    a1.set_xticks(range(2), ["bf16", "int8"])
    a1.set_ylabel("ms per token (lower is better)")
    a1.set_title("decode, 32k context, batch 1")
    a2.set_xticks(range(3), ["bf16", "int8", "int4"])
    a2.set_ylabel("output tokens/s")
    a2.set_title("256 requests, 128 in / 128 out")
    a2.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"kvpack scheduling modes, Llama-3.1-8B shapes, {env['gpu']}, {env['commit'][:7]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "async_modes.png"), dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "results/engine_s11"))
