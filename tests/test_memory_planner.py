"""Memory planner arithmetic on CPU: byte strings, budgets, blocks per format, the vLLM-style lines.

The oracle for bytes per token is hand arithmetic from the format definition (docs/structures.md):
bf16 2 bytes/element; int8 1 byte/element + one fp16 scale; int4 half a byte/element + an fp16 scale
and an fp16 zero per group of 32; summed over layers, kv heads, K and V.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvpack.config import CacheConfig, ConfigError
from kvpack.engine.memory_planner import (
    CPU_KV_CAP_BYTES, GiB, blocks_for_budget, kv_budget_bytes, parse_bytes, plan_for_budget,
    plan_kv_cache, profile_batch,
)
from kvpack.models.presets import preset_config

LLAMA8B = preset_config("llama-3.1-8b")
D = 128
L_H_KV = 32 * 8 * 2  # layers * kv heads * (K and V)
HAND_BPT = {"bfloat16": L_H_KV * 2 * D, "int8": L_H_KV * (D + 2), "fp8_e4m3": L_H_KV * (D + 2),
            "int4": L_H_KV * (D // 2 + (D // 32) * 4)}


def _loaded(cfg=LLAMA8B, dtype=torch.bfloat16):
    return SimpleNamespace(model_config=cfg, model=SimpleNamespace(dtype=dtype))


@pytest.mark.parametrize("text,expected", [
    ("8GiB", 8 * 2**30), ("16GB", 16 * 10**9), ("512MiB", 512 * 2**20), ("1.5GiB", 3 * 2**29),
    ("4096", 4096), (" 2 gib ", 2 * 2**30), ("10k", 10_000), ("1TiB", 2**40), (123, 123),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "8 GiBs", "-1GiB", "0", "eight", "1.2.3G"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ConfigError, match="memory size"):
        parse_bytes(bad)


def test_format_bytes():
    """GiB with two decimals as vLLM logs it; a budget under 0.01 GiB in MiB or KiB rather than "0.00 GiB"."""
    from kvpack.engine.memory_planner import format_bytes

    assert [format_bytes(n) for n in (16 * 2**30, 2**30 // 100 + 1, 5 * 2**20, 1024, 0)] == [
        "16.00 GiB", "0.01 GiB", "5.00 MiB", "1.00 KiB", "0.00 KiB"]


def test_budget_and_blocks_arithmetic():
    total = 140 * GiB
    # 0.9 * 140 GiB - 16 GiB torch peak - 1 GiB outside torch - 0.5 GiB graphs
    b = kv_budget_bytes(total, 0.9, 16 * GiB, 1 * GiB, GiB // 2)
    assert b == int(0.9 * total) - 16 * GiB - GiB - GiB // 2
    assert kv_budget_bytes(total, 0.9, 16 * GiB, -5, 0) == int(0.9 * total) - 16 * GiB  # negative non-torch ignored
    assert blocks_for_budget(b, 131072, 16) == b // (131072 * 16)
    assert blocks_for_budget(131072 * 16 - 1, 131072, 16) == 0
    assert blocks_for_budget(-10, 131072, 16) == 0


@pytest.mark.parametrize("fmt", list(HAND_BPT))
def test_plan_for_budget_matches_format_definition(fmt):
    cc = CacheConfig(kv_cache_dtype=fmt, block_size=16)
    plan = plan_for_budget(LLAMA8B, cc, torch.bfloat16, 16 * GiB, "test")
    assert plan.bytes_per_token == HAND_BPT[fmt]
    assert plan.num_blocks == (16 * GiB) // (HAND_BPT[fmt] * 16)
    assert plan.kv_bytes <= 16 * GiB < plan.kv_bytes + HAND_BPT[fmt] * 16
    assert plan.num_tokens == plan.num_blocks * 16


def test_capacity_ratios_vs_bf16():
    cc = lambda f: CacheConfig(kv_cache_dtype=f)  # noqa: E731
    tok = {f: plan_for_budget(LLAMA8B, cc(f), torch.bfloat16, 16 * GiB, "").num_tokens for f in HAND_BPT}
    assert tok["int8"] / tok["bfloat16"] == pytest.approx(256 / 130, rel=0.01)  # ~1.97x
    assert tok["int4"] / tok["bfloat16"] == pytest.approx(3.2, rel=0.01)


def test_plan_kv_cache_precedence_and_lines():
    cc = CacheConfig(kv_cache_dtype="int8", kv_cache_memory=parse_bytes("8GiB"))
    plan = plan_kv_cache(_loaded(), cc, "cpu", max_num_seqs=256, max_model_len=32768,
                         max_num_batched_tokens=8192)
    assert plan.num_blocks == (8 * GiB) // (HAND_BPT["int8"] * 16)
    assert "--kv-cache-memory 8.00 GiB" in plan.source
    lines = plan.log_lines(32768)
    assert lines[1] == f"CPU KV cache size: {plan.num_tokens:,} tokens"  # "GPU" on CUDA, as vLLM
    assert lines[2] == (f"Maximum concurrency for 32,768 tokens per request: "
                        f"{plan.num_tokens / 32768:.2f}x")
    assert "int8" in lines[0] and f"{plan.num_blocks} blocks" in lines[0]
    # num_blocks wins over the memory budget
    cc2 = CacheConfig(kv_cache_dtype="int4", kv_cache_memory=GiB, num_blocks=77)
    plan2 = plan_kv_cache(_loaded(), cc2, "cpu", 8, 1024, 2048)
    assert plan2.num_blocks == 77 and plan2.bytes_per_token == HAND_BPT["int4"]


def test_cpu_default_is_capped():
    small = plan_kv_cache(_loaded(), CacheConfig(), "cpu", max_num_seqs=2, max_model_len=100,
                          max_num_batched_tokens=2048)
    assert small.num_blocks == 2 * 7  # ceil(100 / 16) blocks per sequence
    big = plan_kv_cache(_loaded(), CacheConfig(), "cpu", 256, 131072, 8192)
    assert big.num_blocks == CPU_KV_CAP_BYTES // (HAND_BPT["bfloat16"] * 16)


def test_too_small_budget_is_an_error():
    with pytest.raises(ConfigError, match="no room for even one KV block"):
        plan_kv_cache(_loaded(), CacheConfig(kv_cache_memory=1000), "cpu", 8, 1024, 2048)


@pytest.mark.parametrize("tokens,seqs", [(8192, 256), (2048, 64), (100, 256), (7, 3), (1, 1)])
def test_profile_batch(tokens, seqs):
    lens = profile_batch(tokens, seqs)
    assert sum(lens) == tokens and len(lens) == min(seqs, tokens)
    assert max(lens) - min(lens) <= 1 and lens == sorted(lens, reverse=True)


def test_cuda_branch_uses_profile(monkeypatch):
    """The utilization path: budget = util * total - peak_torch - non_torch - graph reserve."""
    import kvpack.engine.memory_planner as mp

    prof = {"total": 140 * GiB, "peak_torch": 17 * GiB, "non_torch": GiB // 2, "num_tokens": 8192, "num_seqs": 256}
    monkeypatch.setattr(mp, "profile_cuda_memory", lambda *a, **k: dict(prof))
    cc = CacheConfig(kv_cache_dtype="int4", gpu_memory_utilization=0.5)
    plan = plan_kv_cache(_loaded(), cc, "cuda", 256, 131072, 8192)
    budget = int(0.5 * 140 * GiB) - 17 * GiB - GiB // 2 - mp.CUDA_GRAPH_RESERVE_BYTES
    assert plan.budget_bytes == budget and plan.num_blocks == budget // (HAND_BPT["int4"] * 16)
    assert plan.profile["graph_reserve"] == mp.CUDA_GRAPH_RESERVE_BYTES
    assert "--gpu-memory-utilization 0.5" in plan.source
    prof["peak_torch"] = 80 * GiB  # weights + activations past the utilization: a one-line error
    with pytest.raises(ConfigError, match="no room for even one KV block"):
        plan_kv_cache(_loaded(), cc, "cuda", 256, 131072, 8192)
