"""`kvpack eval` and `kvpack calibrate` on a tiny random model.

Oracles: a cache-free forward of the same model (perplexity of the float32-cache run), direct
layer-0 arithmetic (post-RoPE K and V absmax), the format definition (bytes per token).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from kvpack.attention.kv_cache import resolve_kv_formats
from kvpack.config import CacheConfig, ConfigError, KVPackError
from kvpack.formats import kv_bytes_per_token, load_scales
from kvpack.models.layers import apply_rotary
from kvpack.models.loader import load_model
from kvpack.tools.calibrate import calibrate, parse_statistic
from kvpack.tools.eval import EVAL_KEYS, evaluate, parse_format_item

TEXT = ("The quick brown fox jumps over the lazy dog while the hacker reads the jargon file. " * 12)


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("dummy:tiny-llama", dtype="float32", device="cpu", seed=3)
    # A wider weight spread than the preset's 0.02, so attention is far from uniform and a
    # wrong cache read would change the logits.
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in loaded.model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    ids = loaded.tokenizer.encode(TEXT, add_special_tokens=False)
    return loaded, ids


def test_parse_format_item():
    assert parse_format_item("int8") == ("int8", "int8", None)
    assert parse_format_item("int8/int4") == ("int8", "int4", None)
    assert parse_format_item("fp8_e4m3:static") == ("fp8_e4m3", "fp8_e4m3", "static")
    for bad in ("", "int8/", "a/b/c", "int8:often"):
        with pytest.raises(ConfigError):
            parse_format_item(bad)


def test_eval_rows_and_float32_equals_cache_free(tiny):
    loaded, ids = tiny
    window = 200
    rows = evaluate(loaded, ids, ["float32", "int8", "int8/int4"], window=window, max_tokens=400,
                    chunk_size=64, progress=False)
    assert [r["kv_cache_dtype"] for r in rows] == ["bfloat16", "float32", "int8", "int8/int4"]
    for r in rows:
        assert set(r) == set(EVAL_KEYS)
    base = rows[0]
    assert base["delta_ppl_pct"] == 0 and base["kl_mean"] == 0 and base["top1_agree"] == 1
    # the float32 cache through the paged path == one cache-free forward per window
    nll, n = 0.0, 0
    with torch.no_grad():
        for w in (ids[:window], ids[window:2 * window]):
            x = torch.tensor(w)
            lp = F.log_softmax(loaded.model.compute_logits(loaded.model(x, torch.arange(len(w)))), -1)
            nll -= float(lp[:-1].gather(1, x[1:, None]).sum())
            n += len(w) - 1
    assert rows[1]["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-4)
    # int8 costs a little, not nothing; bytes per token from the format definition
    assert 0 < rows[2]["kl_mean"] < 0.05
    mc = loaded.model_config
    for r in rows:
        k, v = (r["kv_cache_dtype"].split("/") * 2)[:2]
        cc = CacheConfig(kv_cache_dtype=k, k_cache_dtype=k, v_cache_dtype=v)
        assert r["bytes_per_token"] == kv_bytes_per_token(mc, *resolve_kv_formats(mc, cc, torch.float32))
        assert r["capacity_vs_bf16"] == pytest.approx(base["bytes_per_token"] / r["bytes_per_token"], abs=1e-4)


def test_calibrate_absmax_equals_layer0_arithmetic(tiny, tmp_path):
    loaded, ids = tiny
    out = tmp_path / "scales.json"
    data = calibrate(loaded, ids, str(out), window=128, max_tokens=256, statistic="absmax",
                     progress=False)
    assert data["num_tokens"] == 256
    m, mc = loaded.model, loaded.model_config
    attn = m.model.layers[0].self_attn
    kmax = torch.zeros(mc.num_kv_heads)
    vmax = torch.zeros(mc.num_kv_heads)
    k_tok = []  # per-token maxima of layer 0's K: [tokens, Hkv]
    with torch.no_grad():
        for w in (ids[:128], ids[128:256]):
            pos = torch.arange(len(w))
            h = m.model.layers[0].input_layernorm(m.model.embed_tokens(torch.tensor(w)))
            _, k, v = attn.qkv_proj(h).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
            k = k.reshape(len(w), mc.num_kv_heads, mc.head_dim)
            v = v.reshape(len(w), mc.num_kv_heads, mc.head_dim)
            cos, sin = m.rotary.cos_sin(pos, k.dtype)
            k = apply_rotary(k, cos, sin)
            kmax = torch.maximum(kmax, k.abs().amax(dim=(0, 2)))
            k_tok.append(k.abs().amax(dim=2))
            vmax = torch.maximum(vmax, v.abs().amax(dim=(0, 2)))
    scales = load_scales(str(out), mc)
    torch.testing.assert_close(scales.k_absmax[0], kmax, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scales.v_absmax[0], vmax, rtol=1e-5, atol=1e-6)
    # the default statistic: a percentile of per-token maxima (oracle: torch.quantile)
    data_p = calibrate(loaded, ids, str(tmp_path / "p.json"), window=128, max_tokens=256, progress=False)
    assert data_p["statistic"] == "percentile:99.9"
    want = torch.quantile(torch.cat(k_tok), 0.999, dim=0)
    torch.testing.assert_close(torch.tensor(data_p["k"]["absmax"][0]), want, rtol=1e-5, atol=1e-6)
    assert (torch.tensor(data_p["k"]["absmax"]) <= torch.tensor(data["k"]["absmax"]) + 1e-6).all()
    data_50 = calibrate(loaded, ids, str(tmp_path / "m.json"), window=128, max_tokens=256,
                        statistic="percentile:50", progress=False)
    torch.testing.assert_close(torch.tensor(data_50["k"]["absmax"][0]),
                               torch.quantile(torch.cat(k_tok), 0.5, dim=0), rtol=1e-5, atol=1e-6)
    # static scales from the file run through eval (":static") and differ from per-token ones
    rows = evaluate(loaded, ids, ["int8:static", "int8:dynamic"], window=128, max_tokens=256,
                    kv_scales=str(out), chunk_size=64, progress=False)
    assert rows[1]["bytes_per_token"] < rows[2]["bytes_per_token"]  # no per-token scales stored


def test_tool_errors(tiny):
    loaded, ids = tiny
    with pytest.raises(KVPackError, match="statistic"):
        parse_statistic("median")
    with pytest.raises(KVPackError, match="statistic"):
        parse_statistic("percentile:150")
    with pytest.raises(ConfigError, match="scales file"):
        evaluate(loaded, ids, ["int8:static"], window=128, max_tokens=256, progress=False)
    with pytest.raises(ConfigError, match="unknown KV cache dtype"):
        evaluate(loaded, ids, ["int9"], window=128, max_tokens=256, progress=False)
    with pytest.raises(KVPackError, match="fewer than one window"):
        evaluate(loaded, ids[:50], ["int8"], window=128, progress=False)


@pytest.mark.parametrize("args, needle", [
    (["eval", "--text", "/nonexistent.txt", "--kv-cache-dtype", "int8"], "text file not found"),
    (["calibrate", "--text", "/nonexistent.txt", "--out", "/tmp/x.json"], "text file not found"),
    (["calibrate", "--text", "/nonexistent.txt", "--out", "/tmp/x.json", "--statistic", "max"],
     "--statistic"),
    # an output that cannot be written fails before the model loads and the run starts
    (["eval", "--text", "/nonexistent.txt", "--kv-cache-dtype", "int8", "--json", "README.md/e.json"],
     "README.md is a file, not a folder"),
    (["calibrate", "--text", "/nonexistent.txt", "--out", "."], "--out . is a folder"),
])
def test_cli_errors_are_one_line(args, needle):
    p = subprocess.run([sys.executable, "-m", "kvpack", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_cli_eval_json(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "new" / "e.json"  # its folder is made, as `kvpack bench` makes its JSON's
    p = subprocess.run([sys.executable, "-m", "kvpack", "eval", "--model", "dummy:tiny-llama", "--text",
                        str(text), "--window", "128", "--max-tokens",
                        "256", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())  # no --kv-cache-dtype: every quantized format against bf16
    assert [r["kv_cache_dtype"] for r in rows] == ["bfloat16", "int8", "int4", "fp8_e4m3", "fp8_e5m2"]
    assert all(set(r) == set(EVAL_KEYS) for r in rows)
    assert "| kv_cache_dtype |" in p.stdout


def _layer0_kv(loaded, windows):
    """Post-RoPE K and V of layer 0 for every token of `windows` (oracle arithmetic): [T, Hkv, D] each."""
    m, mc = loaded.model, loaded.model_config
    attn = m.model.layers[0].self_attn
    ks, vs = [], []
    with torch.no_grad():
        for w in windows:
            pos = torch.arange(len(w))
            h = m.model.layers[0].input_layernorm(m.model.embed_tokens(torch.tensor(w)))
            _, k, v = attn.qkv_proj(h).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
            k = k.reshape(len(w), mc.num_kv_heads, mc.head_dim)
            cos, sin = m.rotary.cos_sin(pos, k.dtype)
            ks.append(apply_rotary(k, cos, sin))
            vs.append(v.reshape(len(w), mc.num_kv_heads, mc.head_dim))
    return torch.cat(ks).float(), torch.cat(vs).float()


def test_calibrate_means_and_per_kind_statistics(tiny, tmp_path):
    """Version 2: the file's means are layer 0's K/V means over the calibration tokens; each static
    kind's statistic is taken of K/V as that kind stores them (int8 K centered; fp8 K and V centered
    and rotated; int8 V raw), with flags saying so; --no-kv-centering / --no-kv-rotation change that."""
    from kvpack.formats.rotation import hadamard

    loaded, ids = tiny
    out = tmp_path / "s.json"
    data = calibrate(loaded, ids, str(out), window=128, max_tokens=256, statistic="absmax", progress=False)
    k, v = _layer0_kv(loaded, (ids[:128], ids[128:256]))
    km, vm = k.mean(0), v.mean(0)
    torch.testing.assert_close(torch.tensor(data["k"]["mean"][0]), km, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(data["v"]["mean"][0]), vm, rtol=1e-5, atol=1e-5)
    r = hadamard(loaded.model_config.head_dim)
    amax = lambda x: x.abs().amax(dim=(0, 2))  # noqa: E731
    s8, s4 = data["scales"]["int8"], data["scales"]["fp8_e4m3"]
    assert (s8["k_center"], s8["k_rotate"], s8["v_center"], s8["v_rotate"]) == (True, False, False, False)
    assert (s4["k_center"], s4["k_rotate"], s4["v_center"], s4["v_rotate"]) == (True, True, True, True)
    torch.testing.assert_close(torch.tensor(s8["k"][0]), amax(k - km) / 127, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(s8["v"][0]), amax(v) / 127, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(s4["k"][0]), amax((k - km) @ r) / 448, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(s4["v"][0]), amax((v - vm) @ r) / 448, rtol=1e-5, atol=1e-6)
    plain = calibrate(loaded, ids, str(tmp_path / "p.json"), window=128, max_tokens=256, statistic="absmax",
                      progress=False, kv_centering=False, kv_rotation=False)
    assert "mean" not in plain["k"] and not any(plain["scales"]["fp8_e4m3"][f] for f in ("k_center", "k_rotate"))
    torch.testing.assert_close(torch.tensor(plain["scales"]["fp8_e4m3"]["k"][0]), amax(k) / 448, rtol=1e-5, atol=1e-6)
    # the centered file drives a centered static cache through eval; the plain one an uncentered one
    rows = evaluate(loaded, ids, ["int8:static", "fp8_e4m3:static"], window=128, max_tokens=256,
                    kv_scales=str(out), chunk_size=64, progress=False)
    assert all(0 < r_["kl_mean"] < 0.05 for r_ in rows[1:])
    evaluate(loaded, ids, ["fp8_e4m3:static"], window=128, max_tokens=256, kv_scales=str(tmp_path / "p.json"),
             chunk_size=64, progress=False, kv_centering=False, kv_rotation=False)
    with pytest.raises(ConfigError, match="re-run kvpack calibrate"):  # raw fp8 scales, rotating cache
        evaluate(loaded, ids, ["fp8_e4m3:static"], window=128, max_tokens=256, kv_scales=str(tmp_path / "p.json"),
                 chunk_size=64, progress=False, kv_centering=False)
