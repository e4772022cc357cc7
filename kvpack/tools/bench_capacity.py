"""`kvpack bench capacity`: how many tokens of KV cache fit per format in a memory budget.

No GPU and no weights: the model's shapes come from a preset, a HF folder's config.json or a GGUF's
metadata, and the numbers from the memory planner (`plan_for_budget`), i.e. exactly what the engine
prints at start ("GPU KV cache size: N tokens") for `--kv-cache-memory` of that size.

    kvpack bench capacity --model llama-3.1-8b --kv-cache-memory 8GiB --json capacity.json
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from kvpack.config import CacheConfig, add_int4_group_size_arg
from kvpack.engine.memory_planner import GiB, parse_bytes, plan_for_budget
from kvpack.tools.bench_common import (
    BASELINE, DEFAULT_BENCH_MODEL, bytes_arg, format_table, model_config_only, parse_format_list,
    split_format, write_json,
)

ALL_FORMATS = "bfloat16,int8,fp8_e4m3,fp8_e5m2,int4"
JSON_KEYS = ("kv_cache_dtype", "tokens", "bytes_per_token", "capacity_vs_bf16")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_BENCH_MODEL,
                   help=f"preset, HF folder or .gguf; only its config is read (default {DEFAULT_BENCH_MODEL})")
    p.add_argument("--kv-cache-memory", type=bytes_arg, default=parse_bytes("8GiB"),
                   help="KV budget, e.g. 8GiB or 16GB (default 8GiB)")
    p.add_argument("--kv-cache-dtype", default=ALL_FORMATS,
                   help=f"comma list of formats, FORMAT or KFORMAT/VFORMAT (default {ALL_FORMATS})")
    p.add_argument("--dtype", default="bfloat16", choices=tuple(_DTYPES),
                   help="activation dtype that `auto` resolves to (default bfloat16)")
    p.add_argument("--block-size", type=int, default=16)
    add_int4_group_size_arg(p)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="request length for the concurrency column (default: the model's maximum)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write the rows as a JSON list (to stdout without PATH)")


def capacity_rows(model: str, budget: int, formats: list[str], dtype: torch.dtype = torch.bfloat16,
                  block_size: int = 16, int4_group_size: int = 32,
                  max_model_len: int | None = None) -> list[dict]:
    """One dict per format: kv_cache_dtype, tokens, bytes_per_token, capacity_vs_bf16, blocks, gib,
    tokens_per_gib, max_concurrency (requests of max_model_len tokens)."""
    mc = model_config_only(model)
    max_model_len = max_model_len or mc.max_position_embeddings
    base_cc = CacheConfig(block_size=block_size, int4_group_size=int4_group_size, kv_cache_memory=budget)

    def plan(item: str):
        kv, k, v = split_format(item)
        cc = replace(base_cc, kv_cache_dtype=kv, k_cache_dtype=k, v_cache_dtype=v)
        return plan_for_budget(mc, cc, dtype, budget, f"--kv-cache-memory {budget / GiB:.2f} GiB")

    bf16_tokens = plan(BASELINE).num_tokens
    rows = []
    for item in formats:
        p = plan(item)
        rows.append({
            "kv_cache_dtype": item, "tokens": p.num_tokens, "bytes_per_token": p.bytes_per_token,
            "capacity_vs_bf16": p.num_tokens / bf16_tokens if bf16_tokens else None,
            "blocks": p.num_blocks, "gib": p.kv_bytes / GiB, "tokens_per_gib": p.num_tokens / (budget / GiB),
            "max_model_len": max_model_len, "max_concurrency": p.max_concurrency(max_model_len),
        })
    return rows


COLUMNS = [("kv_cache_dtype", "format", ""), ("bytes_per_token", "bytes/token", ",d"),
           ("blocks", "blocks", ",d"), ("tokens", "KV cache tokens", ",d"),
           ("tokens_per_gib", "tokens/GiB", ",.0f"), ("capacity_vs_bf16", "vs bf16", ".3f"),
           ("max_concurrency", "max concurrency", ".2f")]


def run(args: argparse.Namespace) -> int:
    formats = parse_format_list(args.kv_cache_dtype)
    rows = capacity_rows(args.model, args.kv_cache_memory, formats, _DTYPES[args.dtype], args.block_size,
                         args.int4_group_size, args.max_model_len)
    to_stdout = args.json == "-"
    if not to_stdout:
        mc = model_config_only(args.model)
        print(f"KV capacity of {mc.name or args.model} ({mc.num_layers} layers, {mc.num_kv_heads} kv heads, "
              f"head_dim {mc.head_dim}) in {args.kv_cache_memory / GiB:.2f} GiB, block size {args.block_size}; "
              f"concurrency at {rows[0]['max_model_len']:,} tokens per request")
        print(format_table(rows, COLUMNS))
    write_json(args.json, rows)
    return 0
