"""Table and plot of `run_kv_budget_sweep.sh`'s runs: output tokens/s per KV format and budget, each
against bf16 at the same budget and workload, beside the capacity ratio it could reach at most.

    python benchmarks/plot_kv_budget.py results/kv_budget_s23 [--out results/kv_budget_s23]

Reads every `bench throughput` JSON in the folders given (one format each, as the sweep writes them), or
the JSON files given (to set one session's runs beside another's bf16),
writes `kv_budget.md` (the table), `kv_budget.json` (its rows) and `kv_budget.png` (needs matplotlib)
into --out (default: the first folder). A run interrupted by its time cap wrote no JSON and is absent.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

TARGETS = {"int8": 1.6, "int4": 2.4}  # the KV-bound criteria (output tok/s vs bf16)


def label(result: dict, payload: dict) -> str:
    """The format, and int4's group size: from the config (since session 23), else the command line."""
    fmt = result["kv_cache_dtype"]
    if "int4" not in fmt:
        return fmt
    group = payload["config"].get("int4_group_size")
    if group is None:
        m = re.search(r"--int4-group-size[ =](\d+)", payload["env"].get("command", ""))
        group = m.group(1) if m else 32
    return f"{fmt} g{group}"


def budget_text(gib: float) -> str:
    n = gib * 2**30
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def load(folders: list[str]) -> list[dict]:
    rows = []
    for folder in folders:
        paths = [folder] if os.path.isfile(folder) else sorted(glob.glob(os.path.join(folder, "*.json")))
        for path in paths:
            with open(path) as f:
                try:
                    d = json.load(f)
                except ValueError:
                    continue
            if not isinstance(d, dict) or d.get("bench") != "throughput" or not d.get("complete"):
                continue
            cfg = d["config"]
            if not cfg.get("kv_cache_memory"):
                print(f"{path}: no --kv-cache-memory (a --num-blocks run?), skipped", file=sys.stderr)
                continue
            for r in d["results"]:
                rows.append({
                    "workload": f"{cfg['input_len']} in / {cfg['output_len']} out",
                    "budget_gib": cfg["kv_cache_memory"] / 2**30,
                    "format": label(r, d),
                    "kv_tokens": r["kv_cache_tokens"],
                    "output_tok_s": r["output_tok_s"],
                    "decode_tok_s": r["decode_tok_s"],
                    "mean_decode_batch": r["mean_decode_batch"],
                    "mean_decode_step_ms": r["mean_decode_step_ms"],
                    "prefill_s": r["step_kinds"].get("prefill", {}).get("seconds", 0.0),
                    "elapsed_s": r["elapsed_s"],
                    "preemptions": r["preemptions"],
                    "all_blocks_free": r["all_blocks_free"],
                    "commit": d["env"].get("commit"),
                    "file": os.path.basename(path),
                })
    base = {(r["workload"], r["budget_gib"]): r for r in rows if r["format"] == "bfloat16"}
    for r in rows:
        b = base.get((r["workload"], r["budget_gib"]))
        r["capacity_vs_bf16"] = r["kv_tokens"] / b["kv_tokens"] if b else None
        r["output_vs_bf16"] = r["output_tok_s"] / b["output_tok_s"] if b else None
        r["decode_vs_bf16"] = r["decode_tok_s"] / b["decode_tok_s"] if b else None
    order = {"bfloat16": 0, "int8": 1, "int4 g32": 2, "int4 g128": 3}
    rows.sort(key=lambda r: (r["workload"], r["budget_gib"], order.get(r["format"], 9), r["format"]))
    return rows


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(rows: list[dict]) -> str:
    out = ["| workload | KV budget | format | KV tokens (vs bf16) | output tok/s | vs bf16 | decode tok/s (vs bf16) "
           "| mean decode batch | decode step ms | prompt steps s | run s | preemptions | blocks free | commit |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        out.append(
            f"| {r['workload']} | {budget_text(r['budget_gib'])} | {r['format']} | {r['kv_tokens']:,} "
            f"({ratio(r['capacity_vs_bf16'])}x) | {r['output_tok_s']:,.0f} | **{ratio(r['output_vs_bf16'])}** | "
            f"{r['decode_tok_s']:,.0f} ({ratio(r['decode_vs_bf16'])}) | {r['mean_decode_batch']:.1f} | "
            f"{r['mean_decode_step_ms']:.2f} | {r['prefill_s']:.1f} | {r['elapsed_s']:.1f} | {r['preemptions']} | "
            f"{r['all_blocks_free']} | {(r['commit'] or '-')[:7]} |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a workload with bf16 alone (a quantized run cut by its cap) has no ratio to draw
    workloads = sorted({r["workload"] for r in rows if r["format"] != "bfloat16" and r["output_vs_bf16"]})
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 4.2 * len(workloads)), squeeze=False)
    colors = {"bfloat16": "tab:gray", "int8": "tab:blue", "int4 g32": "tab:orange", "int4 g128": "tab:red"}
    for ax_row, wl in zip(axes, workloads):
        sel = [r for r in rows if r["workload"] == wl]
        for fmt in sorted({r["format"] for r in sel}, key=lambda f: list(colors).index(f) if f in colors else 9):
            pts = sorted((r for r in sel if r["format"] == fmt), key=lambda r: r["budget_gib"])
            x = [r["budget_gib"] for r in pts]
            c = colors.get(fmt)
            ax_row[0].plot(x, [r["output_tok_s"] for r in pts], "o-", color=c, label=fmt)
            if fmt != "bfloat16":
                pr = [r for r in pts if r["output_vs_bf16"] is not None]
                ax_row[1].plot([r["budget_gib"] for r in pr], [r["output_vs_bf16"] for r in pr], "o-", color=c,
                               label=f"{fmt}: output tok/s")
                ax_row[1].plot([r["budget_gib"] for r in pr], [r["capacity_vs_bf16"] for r in pr], ":_", color=c,
                               label=f"{fmt}: capacity")
        for fmt, t in TARGETS.items():
            ax_row[1].axhline(t, color=colors["int8" if fmt == "int8" else "int4 g32"], lw=0.8, ls="--")
        for ax in ax_row:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("KV cache budget (GiB)")
            ax.grid(alpha=0.3)
        ax_row[0].set_ylabel("output tokens/s")
        ax_row[0].set_title(f"{wl}: output tokens/s")
        ax_row[1].set_ylabel("vs bf16 at the same budget")
        ax_row[1].set_title("vs bf16 (dashed: the issue's 1.6x / 2.4x)")
        ax_row[0].legend(fontsize=8)
        ax_row[1].legend(fontsize=7, ncol=2)
    fig.suptitle("Llama-3.1-8B (dummy bf16 weights), 256 requests, H200: KV format vs KV budget", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="folders of bench throughput JSONs, or JSON files")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    out = args.out or (args.folders[0] if os.path.isdir(args.folders[0]) else os.path.dirname(args.folders[0]) or ".")
    rows = load(args.folders)
    if not rows:
        print(f"no complete `bench throughput` JSON in {args.folders}", file=sys.stderr)
        return 1
    md = table(rows)
    print(md)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "kv_budget.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "kv_budget.json"), "w") as f:
        json.dump(rows, f, indent=1)
    try:
        plot(rows, os.path.join(out, "kv_budget.png"))
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
