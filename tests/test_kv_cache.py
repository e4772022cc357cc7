"""KV cache allocation, the reference write/gather, and backend selection.

Oracles: shapes and byte counts from `kvpack.formats` (`kv_bytes_per_token`, `KVFormat`), and the
format's own quantize/dequantize for what a written slot must hold.
"""

from __future__ import annotations

import pytest
import torch

from kvpack.attention import (
    AttentionMetadata,
    allocate_kv_cache,
    get_attention_backend,
    num_blocks_for_memory,
    resolve_kv_formats,
)
from kvpack.attention import backend as backend_mod
from kvpack.attention import reference as ref
from kvpack.config import CacheConfig, ConfigError, ModelConfig
from kvpack.formats import hadamard_transform, kv_bytes_per_token, resolve_format


def model_config(head_dim: int = 64, layers: int = 3, heads: int = 8, kv_heads: int = 2) -> ModelConfig:
    return ModelConfig("LlamaForCausalLM", vocab_size=64, hidden_size=heads * head_dim,
                       intermediate_size=128, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=head_dim)


CASES = [  # (k dtype, v dtype, head_dim, block size)
    ("auto", "auto", 64, 16), ("float32", "float32", 80, 32), ("float16", "bfloat16", 128, 16),
    ("int8", "int8", 64, 16), ("int4", "int4", 80, 32), ("int4", "int4", 128, 16),
    ("fp8", "fp8_e5m2", 64, 8), ("int4", "int8", 128, 32), ("fp8_e4m3", "float16", 80, 16),
]


@pytest.mark.parametrize("k_name,v_name,d,bs", CASES)
def test_allocation_shapes_and_bytes(k_name, v_name, d, bs):
    mc = model_config(head_dim=d)
    cc = CacheConfig(block_size=bs, k_cache_dtype=k_name, v_cache_dtype=v_name)
    cache = allocate_kv_cache(mc, cc, num_blocks=7, device="cpu", model_dtype=torch.bfloat16)
    k_fmt = resolve_format(k_name, head_dim=d, model_dtype=torch.bfloat16)
    v_fmt = resolve_format(v_name, head_dim=d, model_dtype=torch.bfloat16)
    assert len(cache) == mc.num_layers and cache.num_blocks == 7 and cache.block_size == bs
    for layer in cache.layers:
        for pool, fmt in ((layer.k, k_fmt), (layer.v, v_fmt)):
            assert pool.fmt == fmt
            assert pool.codes.shape == (7, mc.num_kv_heads, bs, fmt.code_width)
            assert pool.codes.dtype == fmt.storage_dtype
            if fmt.scale_mode == "token":
                assert pool.scales.shape == (7, mc.num_kv_heads, bs, fmt.num_groups)
                assert pool.scales.dtype == torch.float16
            else:
                assert pool.scales is None
            assert (pool.zeros is not None) == fmt.has_zero
            if fmt.has_zero:
                assert pool.zeros.shape == pool.scales.shape and pool.zeros.dtype == torch.float16
            assert pool.static_scale is None
    per_token = kv_bytes_per_token(mc, k_fmt, v_fmt)
    assert cache.bytes_per_block == per_token * bs
    assert cache.nbytes == per_token * bs * 7
    assert num_blocks_for_memory(mc, k_fmt, v_fmt, bs, per_token * bs * 5 + 1) == 5


def test_int4_is_smaller_than_int8_is_smaller_than_bf16():
    mc = model_config(head_dim=128)
    sizes = {n: allocate_kv_cache(mc, CacheConfig(kv_cache_dtype=n), 2, "cpu", torch.bfloat16).bytes_per_block
             for n in ("bfloat16", "int8", "int4")}
    # 128 ch: bf16 256 B; int8 128 + 2 B scale; int4 64 + 4 groups * (2 + 2) B
    assert sizes == {n: 3 * 2 * 2 * b * 16 for n, b in (("bfloat16", 256), ("int8", 130), ("int4", 80))}


def test_static_scales():
    mc = model_config(head_dim=64, layers=2, kv_heads=2)
    ks = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    vs = torch.tensor([[0.5, 0.6], [0.7, 0.8]])
    cc = CacheConfig(k_cache_dtype="int4", v_cache_dtype="fp8")
    cache = allocate_kv_cache(mc, cc, 3, "cpu", torch.float16, static_scales=(ks, vs))
    # int4 ignores static scales (per-token groups); fp8 switches to the static mode
    assert cache[0].k.fmt.scale_mode == "token" and cache[0].k.static_scale is None
    assert cache[1].v.fmt.scale_mode == "static" and cache[1].v.scales is None
    torch.testing.assert_close(cache[1].v.static_scale, vs[1], atol=0, rtol=0)
    k_fmt, v_fmt = resolve_kv_formats(mc, cc, torch.float16, static=True)
    assert cache.bytes_per_block == kv_bytes_per_token(mc, k_fmt, v_fmt) * 16
    with pytest.raises(ConfigError, match="shape"):
        allocate_kv_cache(mc, CacheConfig(kv_cache_dtype="int8"), 3, "cpu", torch.float16,
                          static_scales=(ks[:1], vs))


def test_scales_file_is_loaded_from_cache_config(tmp_path):
    """kv_scales_path alone: the file is read with formats.load_scales, each side takes the
    scales of its own format (K int8, V fp8_e4m3)."""
    from kvpack.formats import load_scales, save_scales

    mc = model_config(head_dim=64, layers=2, kv_heads=2)
    k_abs, v_abs = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    path = tmp_path / "scales.json"
    save_scales(path, mc, k_absmax=k_abs, v_absmax=v_abs, num_tokens=10)
    # raw statistics (no means, no flags): the caches must neither center nor rotate (fp8 rotates by default)
    cc = CacheConfig(k_cache_dtype="int8", v_cache_dtype="fp8", kv_scales_path=str(path), kv_rotation=False)
    cache = allocate_kv_cache(mc, cc, 2, "cpu", torch.bfloat16)
    file = load_scales(path, mc)
    for i in range(2):
        assert cache[i].k.fmt.scale_mode == cache[i].v.fmt.scale_mode == "static"
        torch.testing.assert_close(cache[i].k.static_scale, file.for_format("int8")[0][i], atol=0, rtol=0)
        torch.testing.assert_close(cache[i].v.static_scale, file.for_format("fp8_e4m3")[1][i], atol=0, rtol=0)
    torch.testing.assert_close(cache[1].k.static_scale, k_abs[1] / 127)
    with pytest.raises(ConfigError, match="calibrated without rotation"):  # fp8 V rotates by default
        allocate_kv_cache(mc, CacheConfig(k_cache_dtype="int8", v_cache_dtype="fp8", kv_scales_path=str(path)),
                          2, "cpu", torch.bfloat16)
    with pytest.raises(ConfigError, match="not found"):
        allocate_kv_cache(mc, CacheConfig(kv_cache_dtype="int8", kv_scales_path=str(tmp_path / "x.json")),
                          2, "cpu", torch.bfloat16)


def test_bad_names_raise_config_error():
    with pytest.raises(ConfigError):
        allocate_kv_cache(model_config(), CacheConfig(kv_cache_dtype="int3"), 2, "cpu", torch.bfloat16)
    with pytest.raises(ConfigError):
        allocate_kv_cache(model_config(), CacheConfig(), 0, "cpu", torch.bfloat16)


@pytest.mark.parametrize("name", ["float16", "int8", "int4", "fp8_e4m3", "fp8_e5m2"])
def test_write_then_gather_holds_the_format_codes(name):
    """Slots land at (slot // bs, offset slot % bs); -1 slots write nothing; gather returns the
    format's own dequantize(quantize(x @ R)) for the written positions."""
    d, hkv, bs = 64, 2, 16
    fmt = resolve_format(name, head_dim=d)
    cc = CacheConfig(block_size=bs, kv_cache_dtype=name)
    cache = allocate_kv_cache(model_config(d, layers=1, kv_heads=hkv), cc, 4, "cpu", torch.float32)[0]
    for pool in (cache.k, cache.v):
        pool.codes.view(torch.uint8).fill_(0x5A)
    table = [3, 0, 2]
    md = AttentionMetadata.build([40], [40], [table], bs)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(40, hkv, d, generator=g), torch.randn(40, hkv, d, generator=g)
    slots = md.slot_mapping.clone()
    slots[5] = -1
    ref.write_kv(k, v, cache, slots)
    r = fmt.rotation("cpu")
    kr = hadamard_transform(k) if r is not None else k
    want = fmt.dequantize(*fmt.quantize(kr))
    got = ref.gather_kv(cache.k, md.block_tables[0], 40)
    keep = torch.arange(40) != 5
    torch.testing.assert_close(got[keep], want[keep], atol=0, rtol=0)
    # position 5 (block 3, offset 5) still holds the poison bytes; block 1 was never touched
    assert bool((cache.k.codes[3, :, 5].view(torch.uint8) == 0x5A).all())
    assert bool((cache.v.codes[1].view(torch.uint8) == 0x5A).all())
    assert cache.k.codes[0, 0, 0].tolist() == fmt.quantize(kr[16:17])[0][0, 0].tolist()  # table[1] = 0


def test_backend_selection(monkeypatch):
    monkeypatch.delenv(backend_mod.ENV_VAR, raising=False)
    assert get_attention_backend("cpu").name == "reference"
    assert get_attention_backend(torch.device("cpu")).write_kv is ref.write_kv
    monkeypatch.setenv(backend_mod.ENV_VAR, "reference")
    assert get_attention_backend("cuda").paged_attention is ref.paged_attention
    monkeypatch.setenv(backend_mod.ENV_VAR, "flash")
    with pytest.raises(ConfigError, match="flash"):
        get_attention_backend("cpu")
    # forced_backend overrides the device and the environment inside its block only
    monkeypatch.setenv(backend_mod.ENV_VAR, "triton")
    with backend_mod.forced_backend("reference"):
        assert get_attention_backend("cuda").name == "reference"
        with backend_mod.forced_backend(None):  # no override: the environment again
            assert get_attention_backend("cpu").name == "triton"
        assert get_attention_backend("cuda").name == "reference"
    with pytest.raises(ConfigError, match="flash"):
        with backend_mod.forced_backend("flash"):
            pass


def test_triton_backend_uses_kernel_launchers(monkeypatch):
    kernels = pytest.importorskip("kvpack.kernels")
    if not hasattr(kernels, "paged_attention"):
        pytest.skip("kvpack.kernels has no launchers yet")
    monkeypatch.setenv(backend_mod.ENV_VAR, "triton")
    b = get_attention_backend("cpu")
    assert b.name == "triton" and b.write_kv is kernels.write_kv
    assert b.paged_attention is kernels.paged_attention
