"""Teacher-forced scoring through the real paged KV cache.

`PagedScorer` runs a model over a token window in prefill chunks: every chunk's K and V are
written into the paged pools in the cache's format (quantized where the format says so) and
attention reads them back from there, so later tokens attend to quantized cached keys and
values exactly as in serving. It is shared by `kvpack eval` (logits at every position) and
`kvpack calibrate` (K/V statistics recorded on the way into the cache).
"""

from __future__ import annotations

import gzip
import math
from dataclasses import replace

import torch

from kvpack.attention.kv_cache import KVCache, allocate_kv_cache
from kvpack.attention.metadata import AttentionMetadata
from kvpack.config import CacheConfig, KVPackError
from kvpack.models.loader import LoadedModel


class PagedScorer:
    """One KV pool sized for one window, reused window after window."""

    def __init__(self, loaded: LoadedModel, cache_config: CacheConfig, window: int,
                 chunk_size: int = 256, static_scales=None, means=None) -> None:
        self.model = loaded.model
        self.mc = loaded.model_config
        p = next(self.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.block_size = cache_config.block_size
        self.chunk_size = chunk_size
        num_blocks = -(-window // self.block_size)
        cc = replace(cache_config, enable_prefix_caching=False)
        self.kv: KVCache = allocate_kv_cache(self.mc, cc, num_blocks, self.device, self.dtype,
                                             static_scales=static_scales, means=means)
        # A shuffled block table, as a busy engine would hand out.
        g = torch.Generator().manual_seed(0)
        self.block_table = torch.randperm(num_blocks, generator=g).tolist()

    @torch.inference_mode()
    def logits(self, ids: list[int], want_logits: bool = True) -> torch.Tensor | None:
        """ids: one window. Returns [len(ids), vocab] float32 logits (or None)."""
        out = []
        n = len(ids)
        for start in range(0, n, self.chunk_size):
            q_len = min(self.chunk_size, n - start)
            seq_len = start + q_len
            table = self.block_table[: -(-seq_len // self.block_size)]
            md = AttentionMetadata.build([q_len], [seq_len], [table], self.block_size, self.device)
            input_ids = torch.tensor(ids[start:seq_len], dtype=torch.long, device=self.device)
            positions = torch.arange(start, seq_len, dtype=torch.long, device=self.device)
            hidden = self.model(input_ids, positions, self.kv, md)
            if want_logits:
                out.append(self.model.compute_logits(hidden).float())
        return torch.cat(out) if want_logits else None


def read_text(path: str) -> str:
    """Read a text file (plain or .gz) with a clear error for a missing or empty one."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        raise KVPackError(f"text file not found: {path}") from None
    except (OSError, EOFError) as e:
        raise KVPackError(f"cannot read text file {path}: {e}") from None
    if not text.strip():
        raise KVPackError(f"text file {path} is empty")
    return text


def token_windows(ids: list[int], window: int, max_tokens: int | None = None) -> list[list[int]]:
    """Non-overlapping windows of `window` tokens (the last partial one dropped), capped by
    `max_tokens` in total."""
    if max_tokens is not None:
        ids = ids[:max_tokens]
    n = len(ids) // window
    if n == 0:
        raise KVPackError(f"the text has {len(ids)} tokens, fewer than one window of {window}")
    return [ids[i * window:(i + 1) * window] for i in range(n)]


def perplexity(nll_sum: float, count: int) -> float:
    return math.exp(nll_sum / max(count, 1))
