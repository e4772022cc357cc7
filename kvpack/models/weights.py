"""Checkpoint tensor names -> model parameters: the one place that knows weight names.

Checkpoints speak transformers' names (`model.layers.3.self_attn.q_proj.weight`); GGUF names
(`blk.3.attn_q.weight`) are first translated to those. The model fuses q/k/v into `qkv_proj` and
gate/up into `gate_up_proj`, so those tensors land in a slice of a stacked parameter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from kvpack.config import KVPackError

# transformers' projection name -> (kvpack's fused parameter, shard index)
STACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}

# GGUF per-layer tensor (blk.N.<key>) -> transformers' name under model.layers.N.
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GGUF_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Tensors a checkpoint may carry that kvpack computes itself or does not use.
IGNORED = re.compile(r"(rotary_emb\.inv_freq|rope_freqs\.weight)$")

_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GGUF_GLOBAL = re.compile(r"^(\w+)\.(weight|bias)$")


def gguf_to_hf_name(name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None if unknown."""
    m = _GGUF_LAYER.match(name)
    if m and m.group(2) in GGUF_LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{GGUF_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    m = _GGUF_GLOBAL.match(name)
    if m and m.group(1) in GGUF_GLOBAL_NAMES:
        return f"{GGUF_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    return None


def _target(name: str) -> tuple[str, int | None]:
    """transformers' name -> (kvpack parameter name, shard index or None)."""
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p in STACKED:
            fused, shard = STACKED[p]
            return ".".join(parts[:i] + [fused] + parts[i + 1:]), shard
    return name, None


def _shard_slices(model: nn.Module, param_name: str) -> list[tuple[int, int]]:
    cfg = model.config
    if ".qkv_proj." in param_name:
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        return [(0, q), (q, kv), (q + kv, kv)]
    i = cfg.intermediate_size
    return [(0, i), (i, i)]


def _num_shards(param_name: str) -> int:
    """How many checkpoint tensors are stacked in a parameter (0: not fused)."""
    if ".qkv_proj." in param_name:
        return 3
    return 2 if ".gate_up_proj." in param_name else 0


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], source: str) -> None:
    """Copy (transformers-name, tensor) pairs into `model`'s parameters, casting to their dtype and
    device; raise `KVPackError` naming the tensor on a shape mismatch or when one is missing."""
    params = dict(model.named_parameters())
    tied = getattr(model, "lm_head", 0) is None
    shards = {name: _num_shards(name) for name in params}
    expected = {(name, s) for name, n in shards.items() for s in (range(n) if n else [None])}
    loaded: set[tuple[str, int | None]] = set()
    for hf_name, tensor in weights:
        if IGNORED.search(hf_name) or (tied and hf_name.startswith("lm_head.")):
            continue
        name, shard = _target(hf_name)
        if name not in params:
            continue  # e.g. extra heads of a larger checkpoint family; not ours
        param = params[name]
        dst = param.data
        if shard is not None:
            start, size = _shard_slices(model, name)[shard]
            dst = dst.narrow(0, start, size)
        if tuple(tensor.shape) != tuple(dst.shape):
            raise KVPackError(
                f"{source}: tensor {hf_name} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(dst.shape)}"
            )
        with torch.no_grad():
            dst.copy_(tensor.to(device=dst.device, dtype=dst.dtype))
        if shard is None and shards[name]:  # a whole fused tensor (kvpack's own names)
            loaded |= {(name, s) for s in range(shards[name])}
        else:
            loaded.add((name, shard))
    missing = expected - loaded
    if missing:
        name, shard = sorted(missing, key=lambda x: (x[0], x[1] or 0))[0]
        hf = _hf_name(name, shard)
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise KVPackError(f"{source}: missing tensor {hf}{more}")


def _hf_name(name: str, shard: int | None) -> str:
    if shard is None:
        return name
    fused = [(k, v) for k, v in STACKED.items() if v[1] == shard and f".{v[0]}." in name]
    return name.replace(fused[0][1][0], fused[0][0])
