"""`kvpack eval`: perplexity, KL divergence and top-1 agreement of each KV format vs a bf16 cache."""

from __future__ import annotations

import argparse
import json
import sys

from kvpack.config import add_int4_group_size_arg
from kvpack.entrypoints.common import add_model_args, load_for_tool
from kvpack.tools.output_paths import prepare_output


EVAL_DEFAULT_FORMATS = "int8,int4,fp8_e4m3,fp8_e5m2"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval", help="measure what each KV cache format costs in accuracy",
        description="Perplexity of a text with the KV cache in each format, through the real paged "
                    "cache (windows prefilled in chunks), against the same run with a bfloat16 cache. "
                    "Prints a markdown table; --json writes the rows.")
    add_model_args(p)
    p.add_argument("--text", required=True, help="text file to score (plain or .gz)")
    p.add_argument("--kv-cache-dtype", default=EVAL_DEFAULT_FORMATS,
                   help="comma-separated formats; an item KFMT/VFMT sets K and V separately "
                        "(e.g. int8,int4,fp8_e4m3,int8/int4); a suffix :static or :dynamic forces "
                        "scales from --kv-scales or per-token scales for that item (default: every quantized "
                        f"format, {EVAL_DEFAULT_FORMATS})")
    p.add_argument("--kv-scales", default=None,
                   help="scales file from `kvpack calibrate`: int8 and fp8 items use static scales")
    p.add_argument("--window", type=int, default=1024, help="tokens per window (default 1024)")
    p.add_argument("--max-tokens", type=int, default=None, help="score at most this many tokens")
    p.add_argument("--skip-tokens", type=int, default=0,
                   help="skip this many tokens of the text first (e.g. the calibration part)")
    p.add_argument("--chunk-size", type=int, default=256, help="prefill chunk size (default 256)")
    p.add_argument("--no-kv-rotation", action="store_true", help="no Hadamard rotation for int4 and fp8")
    p.add_argument("--no-kv-centering", action="store_true",
                   help="no per-channel K (fp8: and V) mean subtraction (means: --kv-scales, else the probe text)")
    add_int4_group_size_arg(p)
    p.add_argument("--json", default=None, help="write the rows as a JSON list to this file")
    return p


def run(args: argparse.Namespace) -> int:
    from kvpack.tools.eval import evaluate, markdown_table

    items = [x for x in args.kv_cache_dtype.split(",") if x.strip()]
    prepare_output(args.json, "--json")  # before the run, not after it
    loaded, ids = load_for_tool(args)
    rows = evaluate(loaded, ids[args.skip_tokens:], items, window=args.window,
                    max_tokens=args.max_tokens, kv_scales=args.kv_scales,
                    block_size=args.block_size, chunk_size=args.chunk_size,
                    kv_rotation=not args.no_kv_rotation, int4_group_size=args.int4_group_size,
                    kv_centering=not args.no_kv_centering,
                    progress=sys.stderr.isatty())
    sys.stdout.write(markdown_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")
    return 0
