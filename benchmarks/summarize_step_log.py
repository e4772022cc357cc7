"""Summarize `kvpack bench throughput --step-log` files: where a run's time went, by kind of step.

A step waits for one batch and (async scheduling) launches the next; its time is the waited batch's
device time, unless launching the next one takes the host longer. Kinds, by the waited batch and the
launched one: decode->decode (the steady decode phase), decode->prefill (a decode batch whose step
also enqueued a prefill or mixed batch: that batch's eager host work lands here), decode->none,
and prefill (the waited batch computes prompt tokens: prefill chunks, mixed steps). Per kind: steps,
seconds, mean ms, tokens generated, and for decode->decode the tokens/s and mean batch. Also: the
step with the most time, the JIT compiles the run met (the log's last `compiles`), and how many
decode batches replayed a CUDA graph (the `replays` column, logs from session 16 on: a pure-decode
batch that did not replay one ran eagerly, with the host's launch overhead).

    python benchmarks/summarize_step_log.py results/gpu_suite_s13/kv_bound_steps_*_d93ef3c.tsv

`--plot PNG` also draws each log's decode->decode step times against the step index (a running
median over `--window` steps) with the decode batch below: a step time that grows while the batch
does not is work that grows with the context (results/gpu_suite_s17: the host's detokenization).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvpack.tools.bench_throughput import STEP_KINDS, step_kind  # noqa: E402


def kind(row: dict) -> str:
    return step_kind(row["computed"], row["generated"], row["next_tokens"], row["next_seqs"])


def read_log(path: str) -> list[dict]:
    with open(path) as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f, delimiter="\t")]


def summarize(path: str) -> dict:
    rows = read_log(path)
    out: dict = {"file": path, "steps": len(rows), "seconds": sum(r["ms"] for r in rows) / 1000,
                 "generated": int(sum(r["generated"] for r in rows)),
                 "compiles": int(rows[-1]["compiles"]) if rows else 0, "kinds": {},
                 "replays": int(sum(r["replays"] for r in rows)) if rows and "replays" in rows[0] else None}
    for r in rows:
        k = out["kinds"].setdefault(kind(r), {"steps": 0, "seconds": 0.0, "generated": 0})
        k["steps"] += 1
        k["seconds"] += r["ms"] / 1000
        k["generated"] += int(r["generated"])
    for k in out["kinds"].values():
        k["mean_ms"] = 1000 * k["seconds"] / k["steps"]
    dd = out["kinds"].get("decode->decode")
    if dd and dd["seconds"]:
        dd["tok_s"] = dd["generated"] / dd["seconds"]
        dd["mean_batch"] = dd["generated"] / dd["steps"]
    if rows:
        worst = max(rows, key=lambda r: r["ms"])
        out["slowest"] = {"step": int(worst["step"]), "ms": worst["ms"], "kind": kind(worst)}
    return out


def plot(paths: list[str], labels: list[str], out: str, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_ms, ax_b) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=(2, 1))
    for path, label in zip(paths, labels):
        dd = [r for r in read_log(path) if kind(r) == "decode->decode"]
        if not dd:
            continue
        step = np.array([r["step"] for r in dd])
        ms = np.array([r["ms"] for r in dd])
        w = max(1, min(window, len(ms)))
        med = np.array([np.median(ms[max(0, i - w + 1):i + 1]) for i in range(len(ms))])
        (line,) = ax_ms.plot(step, med, label=label, lw=1.2)
        ax_b.plot(step, [r["generated"] for r in dd], color=line.get_color(), lw=1.0)
    ax_ms.set_ylabel(f"decode step, ms (median of {window})")
    ax_ms.set_ylim(bottom=0)
    ax_ms.legend(fontsize=8)
    ax_ms.grid(alpha=0.3)
    ax_b.set_ylabel("sequences a step")
    ax_b.set_xlabel("step")
    ax_b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", help="step-log TSV files")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument("--plot", metavar="PNG", help="also plot decode->decode step times and batches per step")
    ap.add_argument("--labels", help="comma list, one legend label per log (default: the file names)")
    ap.add_argument("--window", type=int, default=15, help="--plot: running-median window in steps")
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [os.path.basename(p) for p in args.logs]
    if len(labels) != len(args.logs):
        ap.error(f"--labels has {len(labels)} labels for {len(args.logs)} logs")
    res = [summarize(p) for p in args.logs]
    if args.plot:
        plot(args.logs, labels, args.plot, args.window)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    for s in res:
        print(f"{s['file']}: {s['steps']} steps, {s['seconds']:.1f} s, {s['generated']:,} tokens generated, "
              f"{s['compiles']} JIT compiles; slowest step {s['slowest']['step']} ({s['slowest']['kind']}) "
              f"{s['slowest']['ms']:.1f} ms")
        for name in STEP_KINDS:
            k = s["kinds"].get(name)
            if not k:
                continue
            extra = f", {k['tok_s']:,.0f} tok/s at mean batch {k['mean_batch']:.1f}" if "tok_s" in k else ""
            print(f"  {name:16s} {k['steps']:5d} steps {k['seconds']:7.2f} s  mean {k['mean_ms']:7.2f} ms  "
                  f"{k['generated']:7,d} tokens{extra}")
        if s["replays"] is not None:
            pure = sum(s["kinds"].get(n, {}).get("steps", 0) for n in ("decode->decode", "decode->none"))
            print(f"  CUDA-graph replays: {s['replays']} for {pure} pure-decode steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
