"""Per-token decode latency against context, per KV format: `kvpack bench latency` JSON files in, a table
and a plot out.

Each input is one `bench latency --output-json` run (one context, several formats, same batch). The table
gives each format's median ms a token, its ratio to bf16's at the same context, and the ratio of the bytes a
step reads (weights + KV cache): the floor of the latency ratio when every byte streams at one speed. The
plot draws both ratios against context.

    python benchmarks/plot_latency_context.py results/latency_long_s28/latency_*.json --out results/latency_long_s28
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def rows_of(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        base = {r["kv_cache_dtype"]: r for r in run["results"]}.get("bfloat16")
        if base is None:
            raise SystemExit(f"{path}: no bfloat16 row to compare with")
        for r in run["results"]:
            rows.append({"format": r["kv_cache_dtype"], "context": r["context"], "batch": r["batch_size"],
                         "median_ms": r["median_ms"], "vs_bf16": r["median_ms"] / base["median_ms"],
                         "bytes_vs_bf16": r["bytes_per_step"] / base["bytes_per_step"],
                         "commit": run["env"].get("commit"), "gpu": run["env"].get("gpu")})
    return sorted(rows, key=lambda r: (r["context"], r["format"] != "bfloat16", r["format"]))


def table(rows: list[dict]) -> str:
    lines = ["| context | batch | format | ms / token | vs bf16 | bytes a step vs bf16 |",
             "|---:|---:|---|---:|---:|---:|"]
    lines += [f"| {r['context']:,} | {r['batch']} | {r['format']} | {r['median_ms']:.3f} | {r['vs_bf16']:.2f} | "
              f"{r['bytes_vs_bf16']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, fmt in enumerate(f for f in dict.fromkeys(r["format"] for r in rows) if f != "bfloat16"):
        rs = [r for r in rows if r["format"] == fmt]
        xs = [r["context"] / 1024 for r in rs]
        line, = ax.plot(xs, [r["vs_bf16"] for r in rs], "o-", label=f"{fmt}: measured")
        ax.plot(xs, [r["bytes_vs_bf16"] for r in rs], "--", color=line.get_color(), label=f"{fmt}: bytes a step")
    ax.axhline(0.8, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("context (Ki tokens), batch 1")
    ax.set_ylabel("per-token latency vs bf16 cache")
    first = rows[0]
    ax.set_title(f"decode latency vs context, {first['gpu']}, {first['commit']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="`kvpack bench latency --output-json` files")
    ap.add_argument("--out", required=True, help="folder for latency_context.md / .json / .png")
    args = ap.parse_args(argv)
    rows = rows_of(args.inputs)
    os.makedirs(args.out, exist_ok=True)
    md = table(rows)
    with open(os.path.join(args.out, "latency_context.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "latency_context.json"), "w") as f:
        json.dump(rows, f, indent=1)
    try:
        plot(rows, os.path.join(args.out, "latency_context.png"))
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
