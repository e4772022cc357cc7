"""`kvpack eval`: what each KV cache format costs in accuracy, measured through the paged cache.

For every window of the text, the model is run once with a bfloat16 cache (the baseline) and
once per format; each run prefills the window in chunks so later tokens attend to cached,
quantized keys and values. Per format: perplexity, its change against the baseline, the mean
KL divergence KL(p_bf16 || p_format) of the next-token distributions, the fraction of positions
whose argmax agrees, bytes per token and capacity relative to bf16.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from tqdm import tqdm

from kvpack.attention.kv_cache import resolve_kv_formats
from kvpack.config import CacheConfig, ConfigError
from kvpack.engine.centering import kv_means
from kvpack.formats import kv_bytes_per_token, load_scales
from kvpack.models.loader import LoadedModel
from kvpack.tools.scoring import PagedScorer, perplexity, token_windows

EVAL_KEYS = ("kv_cache_dtype", "ppl", "delta_ppl_pct", "kl_mean", "top1_agree",
             "bytes_per_token", "capacity_vs_bf16")
BASELINE = "bfloat16"


@dataclass
class _Acc:
    nll: float = 0.0
    kl: float = 0.0
    agree: int = 0
    count: int = 0
    extra: dict = field(default_factory=dict)


SCALE_SUFFIXES = ("static", "dynamic")


def parse_format_item(item: str) -> tuple[str, str, str | None]:
    """'int8' -> ('int8', 'int8', None); 'int8/int4' -> K int8, V int4; a suffix ':static' or
    ':dynamic' forces static (file) or per-token scales for that item whatever --kv-scales says."""
    body, suffix = item.strip(), None
    if ":" in body:
        body, suffix = body.rsplit(":", 1)
        if suffix not in SCALE_SUFFIXES:
            raise ConfigError(f"bad --kv-cache-dtype item {item!r}: suffix must be :static or :dynamic")
    parts = body.split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], parts[0], suffix
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1], suffix
    raise ConfigError(f"bad --kv-cache-dtype item {item!r}: use FORMAT or KFORMAT/VFORMAT")


def _cache_config(item: str, base: CacheConfig) -> CacheConfig:
    k, v, suffix = parse_format_item(item)
    if suffix == "static" and base.kv_scales_path is None:
        raise ConfigError(f"--kv-cache-dtype item {item!r} needs a scales file (--kv-scales)")
    path = None if suffix == "dynamic" else base.kv_scales_path
    return replace(base, kv_cache_dtype=k, k_cache_dtype=k, v_cache_dtype=v, kv_scales_path=path)


def evaluate(loaded: LoadedModel, text_ids: list[int], items: list[str], *, window: int = 1024,
             max_tokens: int | None = None, kv_scales: str | None = None, block_size: int = 16,
             chunk_size: int = 256, kv_rotation: bool = True, int4_group_size: int = 32,
             progress: bool = True, kv_centering: bool = True) -> list[dict]:
    mc = loaded.model_config
    dtype = next(loaded.model.parameters()).dtype
    base = CacheConfig(block_size=block_size, kv_scales_path=kv_scales, kv_rotation=kv_rotation,
                       int4_group_size=int4_group_size, kv_centering=kv_centering)
    static = load_scales(kv_scales, mc) if kv_scales else None
    # one set of means for every item: the scales file's, else the probe text's (engine.centering)
    means = kv_means(loaded, base, static, force=True)
    windows = token_windows(text_ids, window, max_tokens)
    baseline_cc = replace(base, kv_cache_dtype=BASELINE, kv_scales_path=None)
    configs = {item: _cache_config(item, base) for item in items}  # validates names up front
    formats = {item: resolve_kv_formats(mc, cc, dtype, centered=means is not None) for item, cc in configs.items()}
    baseline = PagedScorer(loaded, baseline_cc, window, chunk_size)
    scorers = {}
    for item, cc in configs.items():
        kf, vf = formats[item]
        ss = None
        if static is not None and "static" in (kf.scale_mode, vf.scale_mode):
            ss = (static.for_format(kf, "k")[0] if kf.scale_mode == "static" else None,
                  static.for_format(vf, "v")[1] if vf.scale_mode == "static" else None)
        scorers[item] = PagedScorer(loaded, cc, window, chunk_size, static_scales=ss, means=means)
    base_acc, accs = _Acc(), {item: _Acc() for item in items}
    for ids in tqdm(windows, desc="eval", unit="window", disable=not progress):
        target = torch.tensor(ids[1:])
        ref = F.log_softmax(baseline.logits(ids)[:-1], dim=-1)  # [n-1, vocab]
        _accumulate(base_acc, ref, ref, target)
        for item, scorer in scorers.items():
            lp = F.log_softmax(scorer.logits(ids)[:-1], dim=-1)
            _accumulate(accs[item], lp, ref, target)
    bf16_bytes = kv_bytes_per_token(mc, *resolve_kv_formats(mc, baseline_cc, dtype))
    base_ppl = perplexity(base_acc.nll, base_acc.count)
    rows = [_row(BASELINE, base_acc, base_ppl, bf16_bytes, bf16_bytes)]
    for item in items:
        rows.append(_row(item, accs[item], base_ppl, kv_bytes_per_token(mc, *formats[item]), bf16_bytes))
    return rows


def _accumulate(acc: _Acc, lp: torch.Tensor, ref: torch.Tensor, target: torch.Tensor) -> None:
    acc.nll -= float(lp.gather(1, target[:, None]).sum())
    acc.kl += float((ref.exp() * (ref - lp)).sum())
    acc.agree += int((lp.argmax(-1) == ref.argmax(-1)).sum())
    acc.count += int(target.numel())


def _row(item: str, acc: _Acc, base_ppl: float, nbytes: int, bf16_bytes: int) -> dict:
    ppl = perplexity(acc.nll, acc.count)
    return {
        "kv_cache_dtype": item,
        "ppl": round(ppl, 4),
        "delta_ppl_pct": round(100.0 * (ppl / base_ppl - 1.0), 3),
        "kl_mean": round(acc.kl / max(acc.count, 1), 6),
        "top1_agree": round(acc.agree / max(acc.count, 1), 4),
        "bytes_per_token": nbytes,
        "capacity_vs_bf16": round(bf16_bytes / nbytes, 4),
    }


def markdown_table(rows: list[dict]) -> str:
    head = "| " + " | ".join(EVAL_KEYS) + " |\n|" + "---|" * len(EVAL_KEYS) + "\n"
    return head + "".join("| " + " | ".join(str(r[k]) for k in EVAL_KEYS) + " |\n" for r in rows)
