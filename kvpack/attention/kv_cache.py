"""The paged KV cache: per layer, one pool of blocks for K and one for V.

A pool stores, for every (block, kv head, offset-in-block), the codes of one token of one head and,
for formats with per-token scales, its scale (and int4 zero-point) groups. What a code means is
defined by the pool's `KVFormat` (`kvpack.formats`); this module only decides shapes and placement.
Slot `s` lives at block `s // block_size`, offset `s % block_size`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpack.config import CacheConfig, ConfigError, ModelConfig
from kvpack.formats import (
    SCALE_DTYPE, STATIC_KINDS, STATIC_SCALE_DTYPE, KVFormat, kv_bytes_per_token, resolve_format,
)


@dataclass(frozen=True)
class CachePool:
    """K or V of one layer.

    codes:        [num_blocks, num_kv_heads, block_size, fmt.code_width] fmt.storage_dtype
    scales:       [num_blocks, num_kv_heads, block_size, fmt.num_groups] float16, or None
    zeros:        [num_blocks, num_kv_heads, block_size, fmt.num_groups] float16, or None (int4 only)
    static_scale: [num_kv_heads] float32, or None (static int8 / fp8 only)
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    zeros: torch.Tensor | None
    static_scale: torch.Tensor | None
    fmt: KVFormat

    @property
    def num_blocks(self) -> int:
        return self.codes.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.codes.shape[1]

    @property
    def block_size(self) -> int:
        return self.codes.shape[2]

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes in this pool, as the format defines it."""
        return self.fmt.bytes_per_token_head * self.num_kv_heads * self.block_size

    @property
    def nbytes(self) -> int:
        """Bytes actually held by the per-block tensors (static scales excluded)."""
        return sum(t.nbytes for t in (self.codes, self.scales, self.zeros) if t is not None)


@dataclass(frozen=True)
class LayerKVCache:
    k: CachePool
    v: CachePool
    # [Hkv, D] float32 means subtracted from K / V before they are written (formats' `center`), or None
    k_mean: torch.Tensor | None = None
    v_mean: torch.Tensor | None = None


@dataclass(frozen=True)
class KVCache:
    """All layers' pools; block ids are shared across layers (one block table per sequence)."""

    layers: list[LayerKVCache]
    num_blocks: int
    block_size: int

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerKVCache:
        return self.layers[layer]

    @property
    def bytes_per_block(self) -> int:
        return sum(lc.k.bytes_per_block + lc.v.bytes_per_block for lc in self.layers)

    @property
    def nbytes(self) -> int:
        return sum(lc.k.nbytes + lc.v.nbytes for lc in self.layers)


def resolve_kv_formats(
    model_config: ModelConfig,
    cache_config: CacheConfig,
    model_dtype: torch.dtype,
    static: bool | None = None,
    centered: bool | None = None,
) -> tuple[KVFormat, KVFormat]:
    """K and V formats of `cache_config`. `static` (default: a scales file is configured) switches
    int8 and fp8 formats to static per-(layer, kv head) scales; other formats ignore it. `centered`
    (default: cache_config.kv_centering) centers the sides formats.CENTER_KINDS names; it must be
    False when no means are available (see `kvpack.engine.centering.kv_means`)."""
    if static is None:
        static = cache_config.kv_scales_path is not None
    if centered is None:
        centered = cache_config.kv_centering

    def one(name: str, side: str) -> KVFormat:
        kw = dict(head_dim=model_config.head_dim, rotate=cache_config.kv_rotation,
                  int4_group_size=cache_config.int4_group_size, model_dtype=model_dtype,
                  side=side, center=centered)
        fmt = resolve_format(name, static=False, **kw)
        if static and fmt.kind in STATIC_KINDS:
            fmt = resolve_format(name, static=True, **kw)
        return fmt

    return one(cache_config.k_dtype_name, "k"), one(cache_config.v_dtype_name, "v")


def allocate_pool(
    fmt: KVFormat,
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    device: torch.device | str,
    static_scale: torch.Tensor | None = None,
) -> CachePool:
    """One uninitialized pool (torch.empty); see `CachePool` for the shapes."""
    shape = (num_blocks, num_kv_heads, block_size)
    codes = torch.empty(*shape, fmt.code_width, dtype=fmt.storage_dtype, device=device)
    scales = zeros = None
    if fmt.scale_mode == "token":
        scales = torch.empty(*shape, fmt.num_groups, dtype=SCALE_DTYPE, device=device)
        if fmt.has_zero:
            zeros = torch.empty(*shape, fmt.num_groups, dtype=SCALE_DTYPE, device=device)
    if fmt.scale_mode == "static":
        if static_scale is None:
            raise ConfigError(f"KV format {fmt.name!r} with static scales needs a scales file (--kv-scales)")
        if tuple(static_scale.shape) != (num_kv_heads,):
            raise ConfigError(
                f"static KV scales have shape {tuple(static_scale.shape)} per layer, "
                f"expected ({num_kv_heads},) (one per kv head)"
            )
        static_scale = static_scale.to(device=device, dtype=STATIC_SCALE_DTYPE).contiguous()
    else:
        static_scale = None
    return CachePool(codes=codes, scales=scales, zeros=zeros, static_scale=static_scale, fmt=fmt)


def allocate_kv_cache(
    model_config: ModelConfig,
    cache_config: CacheConfig,
    num_blocks: int,
    device: torch.device | str,
    model_dtype: torch.dtype,
    static_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    means: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> KVCache:
    """Allocate every layer's K and V pools.

    means: optional (k_mean, v_mean), each [num_layers, num_kv_heads, head_dim] float32
    (`kvpack.engine.centering.kv_means`); without them no side is centered.

    static_scales: optional (k_scales, v_scales), each [num_layers, num_kv_heads] float32 (e.g.
    `load_scales(...).for_format(kind)`); given (or `cache_config.kv_scales_path` set), int8 and fp8
    use static scales. With only the path set, the file is loaded here (`kvpack.formats.load_scales`).
    """
    if num_blocks <= 0:
        raise ConfigError(f"the KV cache needs at least one block, got num_blocks={num_blocks}")
    static = static_scales is not None or cache_config.kv_scales_path is not None
    k_fmt, v_fmt = resolve_kv_formats(model_config, cache_config, model_dtype, static=static,
                                      centered=cache_config.kv_centering and means is not None)
    L, H = model_config.num_layers, model_config.num_kv_heads
    if means is not None:
        for name, m in zip("KV", means):
            if tuple(m.shape) != (L, H, model_config.head_dim):
                raise ConfigError(f"{name} means have shape {tuple(m.shape)}, expected "
                                  f"({L}, {H}, {model_config.head_dim}) (num_layers, num_kv_heads, head_dim)")
        means = tuple(m.to(device=device, dtype=torch.float32).contiguous() for m in means)
    if static_scales is None and "static" in (k_fmt.scale_mode, v_fmt.scale_mode):
        from kvpack.formats import load_scales  # lazy: the scales file reader

        file = load_scales(cache_config.kv_scales_path, model_config)
        static_scales = (file.for_format(k_fmt, "k")[0] if k_fmt.scale_mode == "static" else None,
                         file.for_format(v_fmt, "v")[1] if v_fmt.scale_mode == "static" else None)
    if static_scales is not None:
        for name, s in zip("KV", static_scales):
            if s is not None and tuple(s.shape) != (L, H):
                raise ConfigError(
                    f"static {name} scales have shape {tuple(s.shape)}, expected ({L}, {H}) "
                    "(num_layers, num_kv_heads)"
                )
    layers = []
    for i in range(L):
        ks, vs = (None if s is None else s[i] for s in static_scales or (None, None))
        layers.append(LayerKVCache(
            k=allocate_pool(k_fmt, num_blocks, H, cache_config.block_size, device, ks),
            v=allocate_pool(v_fmt, num_blocks, H, cache_config.block_size, device, vs),
            k_mean=means[0][i] if k_fmt.center else None,
            v_mean=means[1][i] if v_fmt.center else None,
        ))
    return KVCache(layers=layers, num_blocks=num_blocks, block_size=cache_config.block_size)


def num_blocks_for_memory(
    model_config: ModelConfig,
    k_fmt: KVFormat,
    v_fmt: KVFormat,
    block_size: int,
    budget_bytes: int,
) -> int:
    """How many whole blocks (all layers, K and V) fit in `budget_bytes`."""
    per_block = kv_bytes_per_token(model_config, k_fmt, v_fmt) * block_size
    return max(0, int(budget_bytes) // per_block)
