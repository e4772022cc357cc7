"""Per-channel K and V means for the centered formats (`KVFormat.center`, `formats.CENTER_KINDS`).

The keys of Llama-family models carry large per-channel offsets that hardly change from token to
token (SmolLM2's outlier channels are 3-6x the median). A quantized key spends its range on them.
Subtracting a fixed mean vector per (layer, kv head) before quantizing removes them at no cost:
every score of one query shifts by the same q . mean, which softmax ignores. For V the mean is added
back to the attention output (the probabilities sum to 1). Both are exact in real arithmetic; only
the quantization error changes.

Where the means come from, in order: a scales file written by `kvpack calibrate` (its `k_mean` /
`v_mean`, measured on the calibration text), else a probe run at start: the model reads the
packaged text `kvpack/data/probe.txt` (~840 tokens of mixed English prose, a dialogue, a recipe,
code) through an unquantized paged cache and the means of K (after RoPE) and V are taken over all
its tokens. Without a tokenizer (dummy weights) there is no probe and nothing is centered.
"""

from __future__ import annotations

import logging
from importlib import resources

import torch

from kvpack.attention.backend import forced_backend
from kvpack.attention.kv_cache import resolve_kv_formats
from kvpack.attention.layer import Attention
from kvpack.config import CacheConfig, KVPackError
from kvpack.models.loader import LoadedModel

logger = logging.getLogger("kvpack")
PROBE_MAX_TOKENS = 1024


def probe_ids(tokenizer) -> list[int]:
    """The packaged probe text's token ids (at most PROBE_MAX_TOKENS)."""
    text = resources.files("kvpack.data").joinpath("probe.txt").read_text(encoding="utf-8")
    return tokenizer.encode(text, add_special_tokens=False)[:PROBE_MAX_TOKENS]


class _MeanRecorder:
    """Sums of K and V per (layer, kv head, channel) as they enter the cache (forward pre-hooks)."""

    def __init__(self, layers: list[Attention]) -> None:
        self.k = [None] * len(layers)
        self.v = [None] * len(layers)
        self.count = [0] * len(layers)
        self.handles = [m.register_forward_pre_hook(self._hook(i)) for i, m in enumerate(layers)]

    def _hook(self, i: int):
        def hook(module: Attention, args):
            _, k, v = args[:3]
            t = k.shape[0]
            k = k.reshape(t, module.num_kv_heads, module.head_dim).double().sum(0)
            v = v.reshape(t, module.num_kv_heads, module.head_dim).double().sum(0)
            self.k[i] = k if self.k[i] is None else self.k[i] + k
            self.v[i] = v if self.v[i] is None else self.v[i] + v
            self.count[i] += t
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.stack([s / n for s, n in zip(self.k, self.count)]).float().cpu()
        v = torch.stack([s / n for s, n in zip(self.v, self.count)]).float().cpu()
        return k, v


def attention_layers(loaded: LoadedModel) -> list[Attention]:
    layers = [m for m in loaded.model.modules() if isinstance(m, Attention)]
    if len(layers) != loaded.model_config.num_layers:
        raise KVPackError(f"found {len(layers)} attention layers, expected {loaded.model_config.num_layers}")
    return layers


@torch.inference_mode()
def measure_kv_means(loaded: LoadedModel, windows: list[list[int]], chunk_size: int = 256,
                     progress=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Means of K (post-RoPE) and V over every token of `windows`, read through an unquantized paged
    cache: ([L, Hkv, D], [L, Hkv, D]) float32 on the CPU. `progress` wraps the window iterable."""
    from kvpack.tools.scoring import PagedScorer  # lazy: tools import the engine

    if not windows:
        raise KVPackError("no tokens to measure K/V means on")
    layers = attention_layers(loaded)
    scorer = PagedScorer(loaded, CacheConfig(kv_cache_dtype="auto", kv_centering=False),
                         max(len(w) for w in windows), chunk_size)
    rec = _MeanRecorder(layers)
    # on CPU the PyTorch reference, even where the Triton kernels are forced (the interpreter, in
    # tests: a 1024-token probe through the interpreted prefill kernel took ~3 minutes); the means are
    # then the same whichever backend the engine is tested with
    on_cpu = next(loaded.model.parameters()).device.type == "cpu"
    try:
        with forced_backend("reference" if on_cpu else None):
            for ids in (progress(windows) if progress else windows):
                scorer.logits(ids, want_logits=False)
    finally:
        rec.remove()
    return rec.means()


def wants_means(loaded: LoadedModel, cache_config: CacheConfig) -> bool:
    """Whether some side of this cache config would be centered (centering on, a centered kind)."""
    if not cache_config.kv_centering:
        return False
    dtype = next(loaded.model.parameters()).dtype
    k_fmt, v_fmt = resolve_kv_formats(loaded.model_config, cache_config, dtype, static=False, centered=True)
    return k_fmt.center or v_fmt.center


def kv_means(loaded: LoadedModel, cache_config: CacheConfig, scales=None, *, force: bool = False):
    """(k_mean, v_mean) for `allocate_kv_cache(means=...)`, or None (no side centered).

    scales: a loaded `KVScales` (or None; loaded from cache_config.kv_scales_path when set) whose means
    take precedence; otherwise the probe text is run (needs a tokenizer). `force` measures whenever
    centering is on, whatever the formats (eval: one set of means for every item)."""
    if not cache_config.kv_centering or not (force or wants_means(loaded, cache_config)):
        return None
    if scales is None and cache_config.kv_scales_path is not None:
        from kvpack.formats import load_scales

        scales = load_scales(cache_config.kv_scales_path, loaded.model_config)
    if scales is not None and scales.k_mean is not None:
        logger.info("KV centering: means from the scales file %s (%d calibration tokens)",
                    scales.path, scales.num_tokens)
        return scales.k_mean, scales.v_mean
    if loaded.tokenizer is None:
        logger.info("KV centering: off (no tokenizer for the probe text and no scales file with means)")
        return None
    ids = probe_ids(loaded.tokenizer)[: loaded.model_config.max_position_embeddings]
    if not ids:
        logger.info("KV centering: off (the probe text has no tokens for this tokenizer)")
        return None
    means = measure_kv_means(loaded, [ids])
    logger.info("KV centering: means from the probe text (%d tokens)", len(ids))
    return means
