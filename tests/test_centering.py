"""K/V centering (`KVFormat.center`): attention unchanged in exact arithmetic, quantization error
smaller when keys carry per-channel offsets, the format table, scales-file means, the probe."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest
import torch

from kvpack.attention import AttentionMetadata
from kvpack.attention.kv_cache import allocate_kv_cache, resolve_kv_formats
from kvpack.attention.layer import Attention
from kvpack.attention.reference import causal_attention
from kvpack.config import CacheConfig, ConfigError
from kvpack.engine.centering import kv_means, measure_kv_means
from kvpack.formats import load_scales, resolve_format, save_scales
from kvpack.models import load_model

torch.set_default_dtype(torch.float32)
H, HKV, D, BS = 4, 2, 64, 16


def _case(seed: int, n: int = 40, offset: float = 0.0):
    """One sequence of n tokens: q [n, H, D], k/v [n, HKV, D] (k with a per-channel offset)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, H, D, generator=g)
    k = torch.randn(n, HKV, D, generator=g)
    v = torch.randn(n, HKV, D, generator=g)
    if offset:
        k[:, :, 3:7] += offset  # stable outlier channels, as in Llama keys
        v[:, :, 10:12] += offset / 2
    return q, k, v


def _paged(q, k, v, kv_dtype: str, means=None, chunk: int = 16):
    """Chunked prefill through the paged cache (1 layer) with the Attention module; [n, H, D]."""
    from kvpack.config import ModelConfig

    mc = ModelConfig("LlamaForCausalLM", vocab_size=16, hidden_size=H * D, intermediate_size=16, num_layers=1,
                     num_heads=H, num_kv_heads=HKV, head_dim=D)
    n = q.shape[0]
    kv = allocate_kv_cache(mc, CacheConfig(kv_cache_dtype=kv_dtype, block_size=BS), -(-n // BS) + 1, "cpu",
                           torch.float32, means=means)
    attn = Attention(H, HKV, D, D ** -0.5)
    table = list(range(kv.num_blocks))[::-1]
    outs = []
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        md = AttentionMetadata.build([e - s], [e], [table], BS, "cpu")
        outs.append(attn(q[s:e], k[s:e], v[s:e], kv[0], md).reshape(e - s, H, D))
    return torch.cat(outs), kv


def _exact(q, k, v):
    n = q.shape[0]
    md = AttentionMetadata.build([n], [n], [list(range(-(-n // BS)))], BS, "cpu")
    return causal_attention(q, k, v, md, D ** -0.5)


def _means(k, v):
    return k.mean(0)[None], v.mean(0)[None]  # [1, HKV, D]


def test_centering_leaves_float_attention_unchanged():
    """float32 cache, fp8-style table would center nothing; force both sides through a float32 cache
    by giving the layer means directly: the output equals the uncentered one to float rounding."""
    q, k, v = _case(0, offset=8.0)
    want, _ = _paged(q, k, v, "float32")
    _, kv = _paged(q, k, v, "float32")
    km, vm = _means(k, v)
    lc = dataclasses.replace(kv[0], k_mean=km[0], v_mean=vm[0])
    attn = Attention(H, HKV, D, D ** -0.5)
    n = q.shape[0]
    md = AttentionMetadata.build([n], [n], [list(range(kv.num_blocks))[::-1]], BS, "cpu")
    got = attn(q, k, v, lc, md).reshape(n, H, D)
    assert (got - want).abs().max().item() <= 1e-5
    assert (want - _exact(q, k, v)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("fmt", ["int4", "int8", "fp8_e4m3"])
def test_centering_reduces_quantization_error(fmt):
    """Keys with stable offset channels: centered storage is closer to exact attention (float32
    oracle) than uncentered; the margin is large (measured >= 1.5x smaller error)."""
    q, k, v = _case(1, n=64, offset=12.0)
    exact = _exact(q, k, v)
    plain, kv0 = _paged(q, k, v, fmt)
    centered, kv1 = _paged(q, k, v, fmt, means=_means(k, v))
    assert kv0[0].k_mean is None and kv1[0].k_mean is not None
    e0 = (plain - exact).norm().item()
    e1 = (centered - exact).norm().item()
    assert e1 * 1.5 < e0, (fmt, e0, e1)


def test_center_table():
    fmt = lambda name, side, c=True: resolve_format(name, head_dim=64, side=side, center=c)  # noqa: E731
    assert fmt("int8", "k").center and not fmt("int8", "v").center
    assert fmt("int4", "k").center and not fmt("int4", "v").center
    assert fmt("fp8_e4m3", "k").center and fmt("fp8_e4m3", "v").center
    assert not fmt("bfloat16", "k").center and not fmt("int8", "k", False).center
    assert not resolve_format("int8", head_dim=64).center  # no side: never centered


def test_no_means_no_centering():
    """Without means (no tokenizer, no scales file) nothing is centered and formats say so."""
    lm = dataclasses.replace(load_model("dummy:tiny-llama", "float32", "cpu"), tokenizer=None)
    cc = CacheConfig(kv_cache_dtype="int4")
    assert kv_means(lm, cc) is None
    assert kv_means(lm, replace(cc, kv_centering=False)) is None
    k_fmt, _ = resolve_kv_formats(lm.model_config, cc, torch.float32, centered=False)
    assert not k_fmt.center


class _Tok:
    eos_token_ids = ()

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 200 + 1 for c in text]


def test_probe_means_and_engine_wiring():
    """With a tokenizer the engine measures the means on the probe text: they equal a direct
    measurement on the same tokens, and the int4 K pools (not V) of every layer carry them."""
    from kvpack.engine.centering import probe_ids
    from kvpack.engine.llm_engine import LLMEngine

    lm = load_model("dummy:tiny-llama", "float32", "cpu")
    lm = dataclasses.replace(lm, tokenizer=_Tok())
    km, vm = measure_kv_means(lm, [probe_ids(lm.tokenizer)])
    engine = LLMEngine.from_args(loaded=lm, kv_cache_dtype="int4", num_blocks=32, log_stats=False)
    for i, layer in enumerate(engine.kv_cache.layers):
        assert layer.v_mean is None
        torch.testing.assert_close(layer.k_mean, km[i], rtol=0, atol=1e-6)
    off = LLMEngine.from_args(loaded=lm, kv_cache_dtype="int4", num_blocks=32, log_stats=False, kv_centering=False)
    assert all(layer.k_mean is None for layer in off.kv_cache.layers) and not off.k_format.center


def test_probe_on_cpu_reads_through_the_reference(monkeypatch):
    """On CPU the probe runs the PyTorch reference even where the Triton kernels are forced (tests run
    them through the interpreter, minutes for the probe), so the means do not depend on the backend."""
    import kvpack.attention.reference as reference

    lm = load_model("dummy:tiny-llama", "float32", "cpu")
    ids = [list(range(1, 60))]
    want = measure_kv_means(lm, ids)
    calls = []
    real = reference.paged_attention
    monkeypatch.setattr(reference, "paged_attention", lambda *a: calls.append(1) or real(*a))
    import kvpack.attention.backend as backend
    backend._cache.clear()  # the backends bind the functions when first built
    monkeypatch.setenv("KVPACK_ATTENTION_BACKEND", "triton")
    try:
        got = measure_kv_means(lm, ids)
    finally:
        backend._cache.clear()
    assert calls  # the reference ran
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_probe_fits_short_models():
    """A model with fewer positions than the probe has tokens reads only what fits."""
    lm = load_model("dummy:tiny-llama", "float32", "cpu", config_overrides={"max_position_embeddings": 100})
    lm = dataclasses.replace(lm, tokenizer=_Tok())
    means = kv_means(lm, CacheConfig(kv_cache_dtype="int8"))
    assert means is not None and means[0].shape == (lm.model_config.num_layers, lm.model_config.num_kv_heads,
                                                    lm.model_config.head_dim)


def test_scales_file_means_round_trip_and_mismatch(tmp_path):
    lm = load_model("dummy:tiny-llama", "float32", "cpu")
    mc = lm.model_config
    L, Hk, Dh = mc.num_layers, mc.num_kv_heads, mc.head_dim
    g = torch.Generator().manual_seed(0)
    km, vm = torch.randn(L, Hk, Dh, generator=g), torch.randn(L, Hk, Dh, generator=g)
    stat = torch.rand(L, Hk, generator=g) + 1
    flags = {"k_center": True, "k_rotate": False, "v_center": False, "v_rotate": False}
    p = tmp_path / "s.json"
    save_scales(p, mc, k_absmax=stat, v_absmax=stat, num_tokens=10, means=(km, vm),
                per_kind={"int8": (stat * 0.5, stat, flags)})
    s = load_scales(p, mc)
    assert torch.equal(s.k_mean, km) and torch.equal(s.v_mean, vm) and s.transforms["int8"] == flags
    cc = CacheConfig(kv_cache_dtype="int8", kv_scales_path=str(p))
    got = kv_means(lm, cc)
    assert got is not None and torch.equal(got[0], km)
    k_fmt, v_fmt = resolve_kv_formats(mc, cc, torch.float32, centered=True)
    torch.testing.assert_close(s.for_format(k_fmt, "k")[0], stat * 0.5 / 127)
    # a cache that does not center K cannot use K scales measured on centered keys
    k_plain, _ = resolve_kv_formats(mc, cc, torch.float32, centered=False)
    with pytest.raises(ConfigError, match="re-run kvpack calibrate"):
        s.for_format(k_plain, "k")
    # malformed means: one clear error naming the field
    data = json.loads(p.read_text())
    data["k"]["mean"] = data["k"]["mean"][:-1]
    p.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="k.mean has shape"):
        load_scales(p, mc)
    del data["k"]["mean"]
    p.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="one of K and V"):
        load_scales(p, mc)


@pytest.mark.parametrize("argv,want", [
    (["serve", "--kv-cache-dtype", "int4"], (True, True)),
    (["serve", "--no-kv-centering", "--no-kv-rotation"], (False, False)),
])
def test_serve_flags_reach_the_engine(argv, want):
    """`kvpack serve --no-kv-centering / --no-kv-rotation` become LLMEngine.from_args keywords."""
    from kvpack.entrypoints.cli import build_parser
    from kvpack.entrypoints.cmd_serve import engine_kwargs

    kw = engine_kwargs(build_parser().parse_args(argv))
    assert (kw["kv_centering"], kw["kv_rotation"]) == want


@pytest.mark.parametrize("sub", ["generate", "eval", "calibrate"])
def test_centering_flag_on_every_tool(sub):
    from kvpack.entrypoints.cli import build_parser

    extra = {"generate": ["hi"], "eval": ["--text", "x", "--kv-cache-dtype", "int4"], "calibrate": ["--text", "x", "--out", "y"]}
    args = build_parser().parse_args([sub, "--no-kv-centering", *extra[sub]])
    assert getattr(args, "kv_centering", None) is False or getattr(args, "no_kv_centering", None) is True
