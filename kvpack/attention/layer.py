"""The attention layer the model calls: write the new K/V into the paged cache, then attend."""

from __future__ import annotations

import torch
from torch import nn

from kvpack.attention.backend import get_attention_backend
from kvpack.attention.kv_cache import LayerKVCache
from kvpack.attention.metadata import AttentionMetadata
from kvpack.attention.reference import causal_attention


class Attention(nn.Module):
    """Paged causal GQA attention (no parameters).

    forward(q, k, v, layer_cache, metadata):
      q: [T, Hq * D] or [T, Hq, D]; k, v: [T, Hkv * D] or [T, Hkv, D], post-RoPE, any float dtype.
      layer_cache: this layer's `LayerKVCache`, or None for cache-free causal attention over whole
      sequences (an oracle and a no-cache path; every sequence's new tokens must be all of it).
      Returns [T, Hq * D] in q's dtype.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_cache: LayerKVCache | None,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        t = q.shape[0]
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if layer_cache is None:
            out = causal_attention(q, k, v, metadata, self.scale)
        else:
            backend = get_attention_backend(q.device)
            # write_kv subtracts the layer's K/V means (centered sides; K's is softmax-invariant) and
            # rotates; paged_attention rotates back and adds V's mean (the probabilities sum to 1)
            backend.write_kv(k, v, layer_cache, metadata.slot_mapping)
            out = backend.paged_attention(q, layer_cache, metadata, self.scale)
        return out.reshape(t, self.num_heads * self.head_dim)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, scale={self.scale:.4g}")
