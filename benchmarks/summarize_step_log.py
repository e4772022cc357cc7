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


def summarize(path: str) -> dict:
    with open(path) as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f, delimiter="\t")]
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", help="step-log TSV files")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = ap.parse_args(argv)
    res = [summarize(p) for p in args.logs]
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
