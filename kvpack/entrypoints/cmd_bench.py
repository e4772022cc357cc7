"""`kvpack bench {throughput,latency,capacity,serve}`: each mode lives in kvpack/tools/bench_<mode>.py
and defines `add_arguments(parser)` and `run(args) -> int`."""

from __future__ import annotations

import argparse
import importlib

MODES = {
    "throughput": "offline throughput: N requests through the engine",
    "latency": "one batch: per-token decode latency at a given context",
    "capacity": "tokens that fit per KV format for a memory budget (no GPU, no weights needed)",
    "serve": "online benchmark client against a running `kvpack serve`",
}


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="benchmarks: throughput, latency, capacity, serve",
                       description="Benchmarks that print a table and write JSON.")
    modes = p.add_subparsers(dest="mode", metavar="MODE")
    modes.required = True
    for name, help_text in MODES.items():
        try:
            module = importlib.import_module(f"kvpack.tools.bench_{name}")
        except ModuleNotFoundError as e:
            if e.name == f"kvpack.tools.bench_{name}":
                continue
            raise
        mp = modes.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(mp)
        mp.set_defaults(_bench_run=module.run)
    return p


def run(args: argparse.Namespace) -> int:
    return int(args._bench_run(args) or 0)
