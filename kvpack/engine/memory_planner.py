"""The memory planner: how many KV blocks the paged pools get, and the vLLM-style start-up lines.

Precedence: `cache_config.num_blocks`; else `cache_config.kv_cache_memory` bytes (`--kv-cache-memory
8GiB`); else on CUDA the profile recipe below; else on CPU room for `max_num_seqs * max_model_len`
tokens, at most 2 GiB.

CUDA profile (as vLLM does it): after the weights are loaded, one dummy forward pass of the largest
batch the scheduler can build (`max_num_batched_tokens` tokens over up to `max_num_seqs` prefill
sequences, through the same paged attention path as serving, against a one-block scratch cache with
every slot -1) plus the logits and the sampler's largest temporaries for `max_num_seqs` rows, with
a quantized cache's prefill workspace (`attention.metadata.PrefillWorkspace`, float16 K and V of
one layer for `workspace_max_tokens()` tokens: 128 MiB for Llama-3.1-8B) held throughout. Then

    kv_budget = utilization * total - peak_torch - non_torch - graph_reserve

where `peak_torch` is torch's peak allocation during the run (weights included), `non_torch` what the
process holds outside torch's allocator (CUDA context, cuBLAS workspaces, Triton modules, other
processes) and `graph_reserve` room for the CUDA graphs captured after the pools exist. Bytes per
block come from the format definition (`kv_bytes_per_token`), so every format gets the same budget
and a 4-bit cache about 3.2x the tokens of a bf16 one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import torch

from kvpack.config import CacheConfig, ConfigError, ModelConfig

GiB = 1 << 30
MiB = 1 << 20
CPU_KV_CAP_BYTES = 2 * GiB
# room for the decode CUDA graphs' private pool: measured on an H200 (session 25, results/kv_budget_s25), Llama-3.1-8B,
# 98 graphs at max_model_len 8704 held 0.28 GiB and 146 graphs at 131072 0.59 GiB (the bigger split-K partials)
CUDA_GRAPH_RESERVE_BYTES = 768 * MiB

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str | int | float) -> int:
    """'8GiB' -> 8 * 2**30, '16GB' -> 16 * 10**9, '512MiB', '1.5GiB', '4096' -> bytes (int).

    Decimal units (KB, MB, GB, TB, or K/M/G/T) are powers of 1000, binary ones (KiB ... TiB) of 1024,
    as in vLLM. Raises ConfigError naming the bad value."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _BYTES_RE.match(str(text))
        if m is None or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"bad memory size {text!r}: use a number of bytes or e.g. 8GiB, 16GB, 512MiB")
        value, unit = float(m.group(1)), m.group(2).lower()
    n = int(value * _UNITS[unit])
    if n <= 0:
        raise ConfigError(f"memory size {text!r} must be positive")
    return n


def format_bytes(n: int | float) -> str:
    """GiB with two decimals (vLLM's logs); below 0.01 GiB, MiB or KiB, so that a small budget does not read 0.00."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if abs(n) >= 0.01 * size or unit == "KiB":
            return f"{n / size:.2f} {unit}"


# ---- arithmetic (pure; unit-tested on CPU) --------------------------------------------------------

def kv_budget_bytes(total: int, utilization: float, peak_torch: int, non_torch: int,
                    reserve: int = 0) -> int:
    """Bytes left for the KV pools: utilization * total - peak_torch - non_torch - reserve (may be <= 0)."""
    return int(utilization * total) - int(peak_torch) - max(int(non_torch), 0) - int(reserve)


def blocks_for_budget(budget_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """Whole blocks (every layer, K and V) that fit in budget_bytes; 0 when none does."""
    return max(0, int(budget_bytes) // (bytes_per_token * block_size))


@dataclass(frozen=True)
class KVCachePlan:
    """The planner's answer. `budget_bytes` is what the pools may take; `num_blocks` whole blocks of
    `block_size` tokens fit in it at `bytes_per_token` (all layers, K and V, codes + scales + zeros)."""

    num_blocks: int
    block_size: int
    bytes_per_token: int
    budget_bytes: int
    source: str  # how the size was chosen, e.g. "--kv-cache-memory 8.00 GiB"
    k_format: str = ""
    v_format: str = ""
    profile: dict[str, int] | None = None  # CUDA profile figures (bytes), when one ran
    device_type: str = "cuda"  # "cpu" prints "CPU KV cache size"

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def kv_bytes(self) -> int:
        return self.num_tokens * self.bytes_per_token

    @property
    def format_name(self) -> str:
        return self.k_format if self.k_format == self.v_format else f"K {self.k_format} / V {self.v_format}"

    def max_concurrency(self, max_model_len: int) -> float:
        """Requests of max_model_len tokens that fit at once (vLLM's 'Maximum concurrency')."""
        return self.num_tokens / max_model_len

    def log_lines(self, max_model_len: int) -> list[str]:
        """What the engine prints at start, in vLLM's words."""
        return [
            f"KV cache format: {self.format_name}, {self.bytes_per_token} bytes/token, "
            f"{self.num_blocks} blocks of {self.block_size} tokens, {format_bytes(self.kv_bytes)} ({self.source})",
            f"{'GPU' if self.device_type == 'cuda' else self.device_type.upper()} KV cache size: "
            f"{self.num_tokens:,} tokens",
            f"Maximum concurrency for {max_model_len:,} tokens per request: "
            f"{self.max_concurrency(max_model_len):.2f}x",
        ]


def plan_for_budget(model_config: ModelConfig, cache_config: CacheConfig, model_dtype: torch.dtype,
                    budget_bytes: int, source: str, profile: dict[str, int] | None = None) -> KVCachePlan:
    """The plan for a byte budget: as many whole blocks of the configured formats as fit."""
    from kvpack.attention.kv_cache import resolve_kv_formats
    from kvpack.formats import kv_bytes_per_token

    k_fmt, v_fmt = resolve_kv_formats(model_config, cache_config, model_dtype)
    bpt = kv_bytes_per_token(model_config, k_fmt, v_fmt)
    n = blocks_for_budget(budget_bytes, bpt, cache_config.block_size)
    return KVCachePlan(n, cache_config.block_size, bpt, int(budget_bytes), source, k_fmt.name, v_fmt.name,
                       profile)


def plan_kv_cache(loaded: Any, cache_config: CacheConfig, device: str | torch.device, max_num_seqs: int,
                  max_model_len: int, max_num_batched_tokens: int,
                  graph_reserve: int | None = None) -> KVCachePlan:
    """Size the KV pools for `loaded` (a `LoadedModel` already on `device`); see the module doc.

    graph_reserve: bytes kept for CUDA graphs (default CUDA_GRAPH_RESERVE_BYTES on CUDA).
    Raises ConfigError when not even one block fits."""
    mc, dtype = loaded.model_config, loaded.model.dtype
    cc = cache_config
    if cc.num_blocks is not None:
        probe = plan_for_budget(mc, cc, dtype, 0, "--num-blocks")
        per_block = probe.bytes_per_token * cc.block_size
        plan = plan_for_budget(mc, cc, dtype, cc.num_blocks * per_block, f"--num-blocks {cc.num_blocks}")
    elif cc.kv_cache_memory is not None:
        plan = plan_for_budget(mc, cc, dtype, cc.kv_cache_memory,
                               f"--kv-cache-memory {format_bytes(cc.kv_cache_memory)}")
    elif torch.device(device).type == "cuda":
        reserve = CUDA_GRAPH_RESERVE_BYTES if graph_reserve is None else graph_reserve
        prof = profile_cuda_memory(loaded, cc, torch.device(device), max_num_seqs,
                                   min(max_num_batched_tokens, max_model_len))
        budget = kv_budget_bytes(prof["total"], cc.gpu_memory_utilization, prof["peak_torch"],
                                 prof["non_torch"], reserve)
        prof["graph_reserve"] = reserve
        plan = plan_for_budget(mc, cc, dtype, budget,
                               f"--gpu-memory-utilization {cc.gpu_memory_utilization}: "
                               f"{format_bytes(max(budget, 0))} of {format_bytes(prof['total'])} after "
                               f"{format_bytes(prof['peak_torch'])} peak torch memory", prof)
    else:
        probe = plan_for_budget(mc, cc, dtype, 0, "")
        per_seq = -(-max_model_len // cc.block_size) * cc.block_size * probe.bytes_per_token
        plan = plan_for_budget(mc, cc, dtype, min(max_num_seqs * per_seq, CPU_KV_CAP_BYTES),
                               "CPU default: max_num_seqs x max_model_len, at most 2 GiB")
    if plan.num_blocks < 1:
        raise ConfigError(
            f"no room for even one KV block ({plan.bytes_per_token * plan.block_size} bytes) in "
            f"{format_bytes(max(plan.budget_bytes, 0))} ({plan.source}); raise --gpu-memory-utilization "
            "or --kv-cache-memory, or lower --max-num-batched-tokens")
    return replace(plan, device_type=torch.device(device).type)


# ---- CUDA profile ---------------------------------------------------------------------------------

def profile_batch(num_tokens: int, max_num_seqs: int) -> list[int]:
    """Prefill lengths of the dummy batch: num_tokens split over min(max_num_seqs, num_tokens)
    sequences as evenly as possible (the longest first)."""
    b = max(1, min(max_num_seqs, num_tokens))
    q, r = divmod(num_tokens, b)
    return [q + 1] * r + [q] * (b - r)


@torch.inference_mode()
def profile_cuda_memory(loaded: Any, cache_config: CacheConfig, device: torch.device, max_num_seqs: int,
                        num_tokens: int) -> dict[str, int]:
    """Run the largest batch once and measure. Returns bytes: total, peak_torch, non_torch."""
    from kvpack.attention.kv_cache import allocate_kv_cache
    from kvpack.attention.metadata import AttentionMetadata, workspace_max_tokens
    from kvpack.engine.sampler import apply_top_k_top_p

    model, mc = loaded.model, loaded.model_config
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    # One-block scratch cache: nothing is written (slots -1), every read lands in block 0 (zeros).
    scratch = allocate_kv_cache(mc, cache_config, 1, device, model.dtype)
    for layer in scratch.layers:
        for pool in (layer.k, layer.v):
            for t in (pool.codes, pool.scales, pool.zeros):
                if t is not None:
                    t.zero_()
    # the prefill workspace of one layer at its cap (quantized caches: `PrefillWorkspace`), held
    # through the run so the peak counts it
    lay = scratch.layers[0]
    ws_bytes = 0
    if lay.k.fmt.kind != "float" or lay.v.fmt.kind != "float":
        per_token = sum(p.num_kv_heads * p.fmt.head_dim * (2 if p.fmt.kind != "float" else p.codes.element_size())
                        for p in (lay.k, lay.v))
        ws_bytes = workspace_max_tokens() * per_token
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)
    lens = profile_batch(num_tokens, max_num_seqs)
    ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    pos = torch.cat([torch.arange(n, dtype=torch.int64) for n in lens]).to(device)
    qsl = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    metadata = AttentionMetadata(
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc=qsl.to(device), seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_tables=torch.zeros(len(lens), -(-max(lens) // scratch.block_size), dtype=torch.int32,
                                 device=device),
        max_query_len=max(lens), max_seq_len=max(lens))
    hidden = model(ids, pos, scratch, metadata)
    rows = min(max_num_seqs, num_tokens)
    logits = model.compute_logits(hidden[-rows:])
    del hidden
    masked = apply_top_k_top_p(logits, [50] * rows, [0.9] * rows)  # the sampler's sort and scatter
    masked.softmax(dim=-1).argmax(dim=-1)
    del logits, masked, scratch, workspace
    torch.cuda.synchronize(device)
    peak_torch = torch.cuda.max_memory_allocated(device)
    free, total = torch.cuda.mem_get_info(device)
    non_torch = (total - free) - torch.cuda.memory_reserved(device)
    torch.cuda.empty_cache()
    return {"total": int(total), "peak_torch": int(peak_torch), "non_torch": int(max(non_torch, 0)),
            "num_tokens": int(num_tokens), "num_seqs": len(lens)}
