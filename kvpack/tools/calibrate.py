"""`kvpack calibrate`: static per-(layer, kv head) K and V scales from real text.

The model runs over the text window by window through the paged cache (bf16 cache, chunked
prefill, as `kvpack eval` does); a forward pre-hook on every attention layer sees K (after RoPE)
and V on their way into the cache and records, per (layer, kv head), the absolute maximum of
each token's vector. The statistic over tokens is the maximum (`absmax`) or a percentile
(`percentile:P`) of those per-token maxima, taken of K and V as each static kind stores them:
minus the means (centering, measured in a first pass and written to the file) and/or rotated.
"""

from __future__ import annotations


import torch
from tqdm import tqdm

from kvpack.attention.layer import Attention
from kvpack.config import CacheConfig, KVPackError
from kvpack.engine.centering import attention_layers, measure_kv_means
from kvpack.formats import save_scales
from kvpack.formats.base import CENTER_KINDS, ROTATE_KINDS, STATIC_KINDS
from kvpack.formats.rotation import hadamard_transform
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
    """Per-token absmax of K and V for every attention layer, for each way a format stores them:
    {(side, center, rotate): per layer list of [T, Hkv] float32}."""

    def __init__(self, layers: list[Attention], views: set[tuple[str, bool, bool]], means=None) -> None:
        self.views = sorted(views)
        self.stats = {view: [[] for _ in layers] for view in self.views}
        self.means = means
        self.handles = [m.register_forward_pre_hook(self._hook(i)) for i, m in enumerate(layers)]

    def _hook(self, i: int):
        def hook(module: Attention, args):
            _, k, v = args[:3]
            t = k.shape[0]
            x = {"k": k.reshape(t, module.num_kv_heads, module.head_dim).float(),
                 "v": v.reshape(t, module.num_kv_heads, module.head_dim).float()}
            for side, center, rotate in self.views:
                y = x[side]
                if center:
                    y = y - self.means[0 if side == "k" else 1][i].to(y.device)
                if rotate:
                    y = hadamard_transform(y)  # the storage rotation, as the cache write does it
                self.stats[(side, center, rotate)][i].append(y.abs().amax(dim=-1).cpu())
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def statistic(self, view: tuple[str, bool, bool], percentile: float | None) -> torch.Tensor:
        """[num_layers, num_kv_heads]."""
        rows = []
        for per_layer in self.stats[view]:
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
              chunk_size: int = 256, progress: bool = True, kv_centering: bool = True,
              kv_rotation: bool = True) -> dict:
    """Run the calibration and write the scales file; returns its JSON dict.

    With centering, a first pass over the text measures the K and V means (stored in the file and
    used by every centered format that loads it); the second pass records, for each static kind, the
    statistic of K and V as that kind stores them (centered / rotated per formats.CENTER_KINDS and
    ROTATE_KINDS, unless kv_centering / kv_rotation turn them off)."""
    percentile = parse_statistic(statistic)
    windows = token_windows(text_ids, window, max_tokens)
    if not windows:
        raise KVPackError("calibrate: the text has no tokens to calibrate on")
    layers = attention_layers(loaded)
    bar = (lambda desc: (lambda it: tqdm(it, desc=desc, unit="window", disable=not progress)))  # noqa: E731
    means = measure_kv_means(loaded, windows, chunk_size, bar("calibrate: means")) if kv_centering else None
    flags = {kind: {f"{side}_center": kv_centering and kind in CENTER_KINDS[side] for side in "kv"}
             | {f"{side}_rotate": kv_rotation and kind in ROTATE_KINDS for side in "kv"} for kind in STATIC_KINDS}
    views = {(side, False, False) for side in "kv"}
    views |= {(side, f[f"{side}_center"], f[f"{side}_rotate"]) for f in flags.values() for side in "kv"}
    cache = CacheConfig(block_size=block_size, kv_cache_dtype="bfloat16", kv_centering=False)
    scorer = PagedScorer(loaded, cache, window, chunk_size)
    rec = _Recorder(layers, views, means)
    try:
        for ids in bar("calibrate: scales")(windows):
            scorer.logits(ids, want_logits=False)
    finally:
        rec.remove()
    num_tokens = sum(len(w) for w in windows)
    stat = {view: rec.statistic(view, percentile) for view in rec.views}
    per_kind = {kind: (stat[("k", f["k_center"], f["k_rotate"])], stat[("v", f["v_center"], f["v_rotate"])], f)
                for kind, f in flags.items()}
    return save_scales(out, loaded.model_config, k_absmax=stat[("k", False, False)],
                       v_absmax=stat[("v", False, False)], num_tokens=num_tokens,
                       statistic=statistic, rotation=False, means=means, per_kind=per_kind)
