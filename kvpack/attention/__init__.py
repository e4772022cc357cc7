"""Paged attention: metadata, the KV cache pools, the reference ops, backend selection, the layer."""

from __future__ import annotations

from kvpack.attention.backend import AttentionBackend, get_attention_backend
from kvpack.attention.kv_cache import (
    CachePool,
    KVCache,
    LayerKVCache,
    allocate_kv_cache,
    allocate_pool,
    num_blocks_for_memory,
    resolve_kv_formats,
)
from kvpack.attention.layer import Attention
from kvpack.attention.metadata import AttentionMetadata

__all__ = [
    "Attention",
    "AttentionBackend",
    "AttentionMetadata",
    "CachePool",
    "KVCache",
    "LayerKVCache",
    "allocate_kv_cache",
    "allocate_pool",
    "get_attention_backend",
    "num_blocks_for_memory",
    "resolve_kv_formats",
]
