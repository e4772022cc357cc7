"""`kvpack calibrate`: static per-(layer, kv head) K/V scales for int8 and fp8 caches."""

from __future__ import annotations

import argparse
import sys

from kvpack.entrypoints.common import add_model_args, load_for_tool
from kvpack.tools.calibrate import DEFAULT_STATISTIC
from kvpack.tools.output_paths import prepare_output


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "calibrate", help="compute static KV scales from text (for --kv-scales)",
        description="Run the model over a text through the paged cache, record per (layer, kv head) "
                    "statistics of post-RoPE K and of V, and write a versioned scales file "
                    "(docs/scales_format.md).")
    add_model_args(p)
    p.add_argument("--text", required=True, help="calibration text file (plain or .gz)")
    p.add_argument("--max-tokens", type=int, default=None, help="use at most this many tokens")
    p.add_argument("--skip-tokens", type=int, default=0, help="skip this many tokens of the text first")
    p.add_argument("--window", type=int, default=1024, help="tokens per window (default 1024)")
    p.add_argument("--statistic", default=DEFAULT_STATISTIC,
                   help="absmax, or percentile:P: the P-th percentile over tokens of each token's "
                        f"absolute maximum (default {DEFAULT_STATISTIC}; measured more accurate than "
                        "absmax, see results/eval/static_scale_statistic.md)")
    p.add_argument("--no-kv-centering", dest="kv_centering", action="store_false",
                   help="do not measure K/V means; statistics of uncentered vectors")
    p.add_argument("--no-kv-rotation", dest="kv_rotation", action="store_false",
                   help="fp8 statistics of unrotated vectors (for caches run with --no-kv-rotation)")
    p.add_argument("--out", required=True, help="output scales file (JSON)")
    return p


def run(args: argparse.Namespace) -> int:
    from kvpack.tools.calibrate import calibrate, parse_statistic

    parse_statistic(args.statistic)  # fail before loading the model
    prepare_output(args.out, "--out")
    loaded, ids = load_for_tool(args)
    data = calibrate(loaded, ids[args.skip_tokens:], args.out, window=args.window,
                     max_tokens=args.max_tokens, statistic=args.statistic,
                     block_size=args.block_size, progress=sys.stderr.isatty(),
                     kv_centering=args.kv_centering, kv_rotation=args.kv_rotation)
    print(f"kvpack calibrate: {data['num_tokens']} tokens, statistic {data['statistic']}, "
          f"{len(data['k']['absmax'])} layers x {len(data['k']['absmax'][0])} kv heads -> {args.out}",
          file=sys.stderr)
    return 0
