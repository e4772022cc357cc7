"""How many KV blocks to allocate.

In order of precedence: `cache_config.num_blocks`; `cache_config.kv_cache_memory` bytes; on CUDA,
`gpu_memory_utilization * total` minus what the process holds after loading the weights and
running one profiled forward pass of `max_num_batched_tokens` tokens (the activation peak) and
minus memory used outside PyTorch; on CPU, room for `max_num_seqs * max_model_len` tokens,
capped at 2 GiB. Bytes per block come from the format definition (`kv_bytes_per_token`), so a
4-bit cache gets about four times the blocks of a 16-bit one in the same budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvpack.attention.kv_cache import resolve_kv_formats
from kvpack.attention.metadata import AttentionMetadata
from kvpack.config import CacheConfig, ConfigError

GiB = 1 << 30
CPU_KV_CAP_BYTES = 2 * GiB
_PROFILE_SEQ = 512


@dataclass(frozen=True)
class KVPlan:
    num_blocks: int
    bytes_per_token: int
    source: str  # how the size was chosen, for the start-up log


def plan_kv_cache(
    loaded: Any,
    cache_config: CacheConfig,
    device: str | torch.device,
    max_num_seqs: int,
    max_model_len: int,
    max_num_batched_tokens: int,
) -> KVPlan:
    from kvpack.formats import kv_bytes_per_token

    mc = loaded.model_config
    k_fmt, v_fmt = resolve_kv_formats(mc, cache_config, loaded.model.dtype)
    bpt = kv_bytes_per_token(mc, k_fmt, v_fmt)
    per_block = bpt * cache_config.block_size
    if cache_config.num_blocks is not None:
        return KVPlan(cache_config.num_blocks, bpt, "num_blocks")
    if cache_config.kv_cache_memory is not None:
        n = cache_config.kv_cache_memory // per_block
        if n < 1:
            raise ConfigError(f"--kv-cache-memory {cache_config.kv_cache_memory} bytes is less than "
                              f"one block ({per_block} bytes)")
        return KVPlan(n, bpt, f"kv_cache_memory {cache_config.kv_cache_memory / GiB:.2f} GiB")
    dev = torch.device(device)
    if dev.type == "cuda":
        budget = _cuda_budget(loaded, dev, cache_config.gpu_memory_utilization,
                              min(max_num_batched_tokens, max_model_len), max_num_seqs)
        n = budget // per_block
        if n < 1:
            raise ConfigError(
                f"no GPU memory left for the KV cache at --gpu-memory-utilization "
                f"{cache_config.gpu_memory_utilization} (budget {budget / GiB:.2f} GiB after weights and "
                "activations); raise it or lower --max-num-batched-tokens")
        return KVPlan(n, bpt, f"gpu_memory_utilization {cache_config.gpu_memory_utilization}")
    blocks_per_seq = -(-max_model_len // cache_config.block_size)
    n = min(max_num_seqs * blocks_per_seq, CPU_KV_CAP_BYTES // per_block)
    return KVPlan(max(n, 1), bpt, "CPU default: max_num_seqs x max_model_len, at most 2 GiB")


@torch.inference_mode()
def _cuda_budget(loaded: Any, device: torch.device, utilization: float, num_tokens: int,
                 max_num_seqs: int) -> int:
    """Bytes the KV pools may take: utilization * total - (non-torch memory + torch peak)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    model = loaded.model
    # A cache-free pass over num_tokens tokens, cut into sequences short enough that the cache-free
    # attention's [H, L, L] scores stay small next to the activations of the linear layers.
    lens = [_PROFILE_SEQ] * (num_tokens // _PROFILE_SEQ) + ([num_tokens % _PROFILE_SEQ] if num_tokens % _PROFILE_SEQ else [])
    ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    pos = torch.cat([torch.arange(n, dtype=torch.int64) for n in lens]).to(device)
    qsl = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    metadata = AttentionMetadata(
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc=qsl.to(device), seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_tables=torch.zeros(len(lens), 1, dtype=torch.int32, device=device),
        max_query_len=max(lens), max_seq_len=max(lens))
    hidden = model(ids, pos, None, metadata)
    n = min(max_num_seqs, num_tokens)
    logits = model.compute_logits(hidden[-n:])
    logits.softmax(dim=-1).sort(dim=-1, descending=True)  # the sampler's largest temporaries
    del hidden, logits
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    free, total = torch.cuda.mem_get_info(device)
    non_torch = (total - free) - torch.cuda.memory_reserved(device)
    torch.cuda.empty_cache()
    return int(utilization * total - max(non_torch, 0) - peak)
