"""`kvpack calibrate`: static per-(layer, kv head) K and V scales from real text.

The model runs over the text window by window through the paged cache (bf16 cache, chunked
prefill, as `kvpack eval` does); a forward pre-hook on every attention layer sees K (after RoPE)
and V on their way into the cache and records, per (layer, kv head), the absolute maximum of
each token's vector. The statistic over tokens is the maximum (`absmax`) or a percentile
(`percentile:P`) of those per-token maxima. int8 and fp8 formats store unrotated K/V, so the
statistics are of unrotated vectors (`rotation: false` in the file).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from tqdm import tqdm

from kvpack.attention.layer import Attention
from kvpack.config import CacheConfig, KVPackError
from kvpack.formats import save_scales
from kvpack.models.loader import LoadedModel
from kvpack.tools.scoring import PagedScorer, token_windows

# Clips about one token in a thousand and gives the other 999 finer steps: on SmolLM2 + jargon.txt
# it more than halved static int8's perplexity cost against absmax
# (results/eval/static_scale_statistic.md).
DEFAULT_STATISTIC = "percentile:99.9"


def parse_statistic(statistic: str) -> float | None:
    """None for absmax, else the percentile P in (0, 100]."""
    if statistic == "absmax":
        return None
    if statistic.startswith("percentile:"):
        try:
            p = float(statistic.split(":", 1)[1])
        except ValueError:
            p = -1.0
        if 0.0 < p <= 100.0:
            return p
    raise KVPackError(f"--statistic must be 'absmax' or 'percentile:P' with 0 < P <= 100, got {statistic!r}")


class _Recorder:
    """Per-token absmax of K and V for every attention layer: lists of [T, Hkv] float32."""

    def __init__(self, layers: list[Attention]) -> None:
        self.k: list[list[torch.Tensor]] = [[] for _ in layers]
        self.v: list[list[torch.Tensor]] = [[] for _ in layers]
        self.handles = [m.register_forward_pre_hook(self._hook(i)) for i, m in enumerate(layers)]
        self.layers = layers

    def _hook(self, i: int):
        def hook(module: Attention, args):
            _, k, v = args[:3]
            t = k.shape[0]
            k = k.reshape(t, module.num_kv_heads, module.head_dim).float()
            v = v.reshape(t, module.num_kv_heads, module.head_dim).float()
            self.k[i].append(k.abs().amax(dim=-1).cpu())
            self.v[i].append(v.abs().amax(dim=-1).cpu())
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def statistic(self, which: str, percentile: float | None) -> torch.Tensor:
        """[num_layers, num_kv_heads]."""
        rows = []
        for per_layer in getattr(self, which):
            x = torch.cat(per_layer)  # [tokens, Hkv]
            rows.append(x.amax(dim=0) if percentile is None else _percentile(x, percentile))
        return torch.stack(rows)


def _percentile(x: torch.Tensor, p: float) -> torch.Tensor:
    """Per-column P-th percentile of x [N, C] with linear interpolation (torch.quantile's default),
    by sorting: torch.quantile refuses inputs of more than 2^24 elements."""
    s = x.sort(dim=0).values
    pos = (s.shape[0] - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, s.shape[0] - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def calibrate(loaded: LoadedModel, text_ids: list[int], out: str, *, window: int = 1024,
              max_tokens: int | None = None, statistic: str = DEFAULT_STATISTIC, block_size: int = 16,
              chunk_size: int = 256, progress: bool = True) -> dict:
    """Run the calibration and write the scales file; returns its JSON dict."""
    percentile = parse_statistic(statistic)
    windows = token_windows(text_ids, window, max_tokens)
    layers = [m for m in loaded.model.modules() if isinstance(m, Attention)]
    if len(layers) != loaded.model_config.num_layers:
        raise KVPackError(f"found {len(layers)} attention layers, expected {loaded.model_config.num_layers}")
    cache = CacheConfig(block_size=block_size, kv_cache_dtype="bfloat16")
    scorer = PagedScorer(loaded, cache, window, chunk_size)
    rec = _Recorder(layers)
    try:
        for ids in tqdm(windows, desc="calibrate", unit="window", disable=not progress):
            scorer.logits(ids, want_logits=False)
    finally:
        rec.remove()
    num_tokens = sum(len(w) for w in windows)
    return save_scales(out, loaded.model_config, k_absmax=rec.statistic("k", percentile),
                       v_absmax=rec.statistic("v", percentile), num_tokens=num_tokens,
                       statistic=statistic, rotation=False)
