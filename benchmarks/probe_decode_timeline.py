"""Where a decode call's time goes, program by program (H200): every decode program (and every program of the
separate split merge) stamps %globaltimer as it enters, when q is ready and the tile loop starts, when its
first tile is done (the cp.async ring kernels), when the loop ends and as it exits, plus %clock64 at entry and
exit and its SM (`times_ptr`, `quant.probe_stamp`). The calls run as an engine step runs them: a CUDA graph of
`--layers` calls, each on its own cache, L2 flushed before each replay. From the stamps, per layer:

- gap: from the previous call's last exit (decode or merge) to this call's first program entry (launch);
- start spread: first to last program entry (the block scheduler and earlier programs leaving);
- prologue: entry to the loop's start (q's loads, the split, the block table), median over programs;
- stream: loop start to loop end, median and slowest;
- epilogue: loop end to exit (partials, the fused merge);
- tail: the median program's exit to the last one's;
- merge: the last decode exit to the merge's last exit (the separate merge, a dependent launch).

    python benchmarks/probe_decode_timeline.py [--shapes llama8b-1x32768,llama8b-8x8192] [--formats bf16,int8]
        [--layers 8] [--replays 20] [--out probe_decode_timeline.json] [--raw raw.pt] [--plot timeline.png]
    python benchmarks/probe_decode_timeline.py --from-raw raw.pt --plot timeline.png   # the plot only (no GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import SHAPES, capture_graph, environment, kv_bytes, make_case, time_graph  # noqa: E402

SLOTS = 8  # quant.PROBE_SLOTS
ENTRY, QREADY, FIRST, LOOPEND, EXIT, CLK0, CLK1, SMID = range(SLOTS)


def launches(plans, stamps):
    """One engine step's decode calls (and their merges), each stamping into its buffers when `stamps`."""
    from kvpack.kernels.decode_attention import _merge_kernel
    from kvpack.kernels.rotate import rotate_heads

    def step():
        for (plan, q), (td, tm) in zip(plans, stamps):
            if plan.rotate_q:
                rotate_heads(q, torch.float32, out=plan.args[0])
            kw = dict(plan.options)
            if td is not None:
                kw["times_ptr"] = td
            plan.kernel[plan.grid](*plan.args, **kw)
            if plan.merge_grid is not None:
                mkw = dict(plan.merge_options or {})
                if tm is not None:
                    mkw["times_ptr"] = tm
                _merge_kernel[plan.merge_grid](*plan.merge_args, **mkw)
            if plan.post is not None:
                rotate_heads(plan.out, q.dtype, *plan.post)
    return step


def summarize(stamps_host, has_merge: list[bool]) -> list[dict]:
    """Per layer of one replay: the quantities of the module doc, in microseconds."""
    rows, prev_end = [], None
    for (td, tm), merged in zip(stamps_host, has_merge):
        ent = [r[ENTRY] for r in td]
        t0 = min(ent)
        q = [(r[QREADY] - r[ENTRY]) / 1e3 for r in td]
        first = [(r[FIRST] - r[QREADY]) / 1e3 for r in td if r[FIRST] > 0]
        stream = [(r[LOOPEND] - r[QREADY]) / 1e3 for r in td]
        epi = [(r[EXIT] - r[LOOPEND]) / 1e3 for r in td]
        ex = [r[EXIT] for r in td]
        cyc = [r[CLK1] - r[CLK0] for r in td]
        dur = [(r[EXIT] - r[ENTRY]) for r in td]
        row = {
            "programs": len(td), "sms": len({r[SMID] for r in td}),
            "gap_us": None if prev_end is None else (t0 - prev_end) / 1e3,
            "start_spread_us": (max(ent) - t0) / 1e3, "start_p50_us": (statistics.median(ent) - t0) / 1e3,
            "prologue_p50_us": statistics.median(q), "prologue_max_us": max(q),
            "first_tile_p50_us": statistics.median(first) if first else None,
            "stream_p50_us": statistics.median(stream), "stream_max_us": max(stream),
            "stream_min_us": min(stream),
            "epilogue_p50_us": statistics.median(epi), "epilogue_max_us": max(epi),
            "exit_p50_us": (statistics.median(ex) - t0) / 1e3, "exit_max_us": (max(ex) - t0) / 1e3,
            "tail_us": (max(ex) - statistics.median(ex)) / 1e3,
            "ghz": statistics.median(c / d for c, d in zip(cyc, dur) if d > 0),
        }
        end = max(ex)
        if merged and tm is not None:
            ment = [r[ENTRY] for r in tm]
            mwait = [r[QREADY] for r in tm]
            mex = [r[EXIT] for r in tm]
            row.update({"merge_programs": len(tm), "merge_entry_first_us": (min(ment) - t0) / 1e3,
                        "merge_wait_done_first_us": (min(mwait) - end) / 1e3,
                        "merge_after_decode_us": (max(mex) - end) / 1e3})
            end = max(mex)
        row["call_us"] = (end - t0) / 1e3
        prev_end = end
        rows.append(row)
    return rows


def granularity(stamps_host) -> int:
    """The smallest nonzero difference between sorted entry stamps (ns): %globaltimer's resolution, at best."""
    vals = sorted({r[ENTRY] for td, _ in stamps_host for r in td})
    diffs = [b - a for a, b in zip(vals, vals[1:]) if b > a]
    return min(diffs) if diffs else 0


def plot_timeline(raw: dict, cases: list[str], path: str, layer: int = 1) -> None:
    """One layer's programs per case (a panel each), sorted by exit: prologue (entry to q ready), first tile,
    the rest of the tile loop, epilogue; the separate merge's programs above them (parked, then working)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 2.6 * len(cases)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], cases):
        td, tm = (t.tolist() if t is not None else None for t in raw[name][layer])
        t0 = min(r[ENTRY] for r in td)
        td = sorted(td, key=lambda r: r[EXIT])
        for y, r in enumerate(td):
            us = [(x - t0) / 1e3 for x in r[:EXIT + 1]]
            first = us[FIRST] if r[FIRST] > 0 else us[QREADY]
            ax.hlines(y, us[ENTRY], us[QREADY], color="0.6", lw=0.6)
            ax.hlines(y, us[QREADY], first, color="tab:orange", lw=0.6)
            ax.hlines(y, first, us[LOOPEND], color="tab:blue", lw=0.6)
            ax.hlines(y, us[LOOPEND], us[EXIT], color="tab:green", lw=0.6)
        if tm is not None:
            n = len(td)
            for y, r in enumerate(sorted(tm, key=lambda r: r[EXIT])):
                ax.hlines(n + 8 + y, (r[ENTRY] - t0) / 1e3, (r[QREADY] - t0) / 1e3, color="0.85", lw=0.6)
                ax.hlines(n + 8 + y, (r[QREADY] - t0) / 1e3, (r[EXIT] - t0) / 1e3, color="tab:red", lw=0.8)
        ax.set_title(name, fontsize=9, loc="left")
        ax.set_ylabel("program")
    axes[-1, 0].set_xlabel("us from the call's first program entry")
    handles = [plt.Line2D([], [], color=c, lw=2) for c in ("0.6", "tab:orange", "tab:blue", "tab:green", "tab:red")]
    fig.legend(handles, ["prologue (q)", "first tile", "tile loop", "epilogue", "split merge"], loc="upper right",
               fontsize=8, ncol=5)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="llama8b-1x32768,llama8b-8x8192,llama8b-32x4096")
    ap.add_argument("--formats", default="bf16,int8,fp8_e4m3,int4")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--rep-ms", type=int, default=20)
    ap.add_argument("--out", default="probe_decode_timeline.json")
    ap.add_argument("--raw", default="", help="also save one replay's raw stamps per case (torch.save) here")
    ap.add_argument("--plot", default="", help="a PNG of one layer's programs for the cases of --plot-cases")
    ap.add_argument("--plot-cases", default="llama8b-1x32768/bf16,llama8b-1x32768/int8,llama8b-1x32768/int4")
    ap.add_argument("--from-raw", default="", help="plot from a saved --raw file only (no GPU)")
    args = ap.parse_args()
    if args.from_raw:
        plot_timeline(torch.load(args.from_raw), args.plot_cases.split(","), args.plot or "timeline.png")
        return 0
    from kvpack.kernels.decode_attention import plan_decode

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    env = environment(sys.argv)
    print(json.dumps(env), flush=True)
    shapes = {s.name: s for s in SHAPES}
    flush = torch.empty(512 << 20, dtype=torch.int8, device=dev)
    out, raw = {"env": env, "cases": []}, {}
    for sname in args.shapes.split(","):
        shape = shapes[sname]
        scale = shape.head_dim ** -0.5
        for fmt in args.formats.split(","):
            cases = [make_case(fmt, shape, dev, gen) for _ in range(args.layers)]
            plans = [(plan_decode(q, lc, meta, scale), q) for lc, meta, q in cases]
            stamps = []
            for plan, _ in plans:
                n = plan.grid[0] * plan.grid[1] * plan.grid[2]
                td = torch.zeros(n, SLOTS, dtype=torch.int64, device=dev)
                tm = None
                if plan.merge_grid is not None:
                    tm = torch.zeros(plan.merge_grid[0] * plan.merge_grid[1], SLOTS, dtype=torch.int64, device=dev)
                stamps.append((td, tm))
            plain_us = time_graph(launches(plans, [(None, None)] * len(plans)), args.rep_ms) / args.layers
            stamped_us = time_graph(launches(plans, stamps), args.rep_ms) / args.layers
            g = capture_graph(launches(plans, stamps))
            per_layer = []
            for rep in range(args.replays):
                flush.zero_()
                torch.cuda.synchronize()
                g.replay()
                torch.cuda.synchronize()
                host = [(td.tolist(), tm.tolist() if tm is not None else None) for td, tm in stamps]
                if rep == 0:
                    gran = granularity(host)
                    if args.raw or args.plot:
                        raw[f"{sname}/{fmt}"] = [(td.cpu(), tm.cpu() if tm is not None else None) for td, tm in stamps]
                rows = summarize(host, [p.merge_grid is not None for p, _ in plans])
                per_layer += rows[1:]  # the first layer follows the flush, not a layer
            keys = [k for k in per_layer[0] if isinstance(per_layer[0][k], (int, float))]
            med = {k: statistics.median(r[k] for r in per_layer if r.get(k) is not None) for k in keys
                   if any(r.get(k) is not None for r in per_layer)}
            plan = plans[0][0]
            case = {"shape": sname, "format": fmt, "variant": plan.variant, "grid": list(plan.grid),
                    "merge": plan.merge_grid is not None, "kv_bytes": kv_bytes(cases[0][0], shape),
                    "us_layer_plain": plain_us, "us_layer_stamped": stamped_us, "timer_ns_min_step": gran,
                    "median_over_layers": med}
            out["cases"].append(case)
            print(json.dumps(case), flush=True)
            del cases, plans, stamps, g
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    if args.raw:
        torch.save(raw, args.raw)
    if args.plot:
        plot_timeline(raw, [c for c in args.plot_cases.split(",") if c in raw], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
