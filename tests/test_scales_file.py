"""The KV scales file: round trip, derived scales, and one clear ConfigError per kind of problem."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from kvpack.config import ConfigError, ModelConfig
from kvpack.formats import (
    QMAX, SCALES_FORMAT, load_scales, model_fingerprint, resolve_format, save_scales,
)

MC = ModelConfig("LlamaForCausalLM", vocab_size=256, hidden_size=256, intermediate_size=512,
                 num_layers=3, num_heads=8, num_kv_heads=2, head_dim=32, name="tiny")


def absmax(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = torch.rand(3, 2, generator=g) * 20 + 0.1
    v = torch.rand(3, 2, generator=g) * 5
    v[1, 1] = 0.0  # a head that was all zeros in calibration
    return k, v


@pytest.fixture
def scales_path(tmp_path):
    k, v = absmax()
    p = tmp_path / "scales.json"
    save_scales(p, MC, k_absmax=k, v_absmax=v, num_tokens=4096, statistic="percentile:99.9")
    return p


def test_round_trip(scales_path):
    k, v = absmax()
    s = load_scales(scales_path, MC)
    assert s.statistic == "percentile:99.9" and s.num_tokens == 4096 and s.rotation is False
    assert torch.equal(s.k_absmax, k) and torch.equal(s.v_absmax, v)  # float32 survives JSON exactly
    assert s.fingerprint == model_fingerprint(MC)
    for kind in ("int8", "fp8_e4m3", "fp8_e5m2"):
        ks, vs = s.for_format(kind)
        assert ks.shape == (3, 2) and ks.dtype == torch.float32
        assert torch.equal(ks, k / QMAX[kind])
        assert vs[1, 1].item() == 1.0  # 0 -> 1
        assert torch.equal(vs[0], v[0] / QMAX[kind])
    fmt = resolve_format("int8", head_dim=32, static=True)
    assert torch.equal(s.for_format(fmt)[0], k / 127)
    with pytest.raises(ConfigError, match="not 'int4'"):
        s.for_format("int4")


def test_file_layout(scales_path):
    data = json.loads(scales_path.read_text())
    assert data["format"] == SCALES_FORMAT and data["version"] == 2
    assert data["model"]["num_layers"] == 3 and data["model"]["head_dim"] == 32
    assert len(data["k"]["absmax"]) == 3 and len(data["k"]["absmax"][0]) == 2
    assert set(data["scales"]) == {"int8", "fp8_e4m3", "fp8_e5m2"}


def test_version_1_files_still_load(scales_path):
    """A version 1 file (no means, no per-kind flags: raw statistics) loads; its scales serve formats
    that neither center nor rotate, and a format that does is refused with the reason."""
    data = json.loads(scales_path.read_text())
    data["version"] = 1
    for obj in data["scales"].values():
        for key in ("k_center", "k_rotate", "v_center", "v_rotate"):
            del obj[key]
    scales_path.write_text(json.dumps(data))
    s = load_scales(scales_path, MC)
    assert s.k_mean is None and s.transforms["int8"] == dict.fromkeys(("k_center", "k_rotate", "v_center", "v_rotate"), False)
    plain = resolve_format("int8", head_dim=32, static=True)
    assert torch.equal(s.for_format(plain, "k")[0], s.for_format("int8")[0])
    rotated = resolve_format("fp8_e4m3", head_dim=32, static=True)  # fp8 rotates by default
    with pytest.raises(ConfigError, match="calibrated without rotation"):
        s.for_format(rotated, "v")


def test_derived_scales_optional(scales_path):
    data = json.loads(scales_path.read_text())
    del data["scales"]
    scales_path.write_text(json.dumps(data))
    k, _ = absmax()
    assert torch.equal(load_scales(scales_path, MC).for_format("fp8_e4m3")[0], k / 448)


def expect_error(path, match, mc=MC, **kw):
    with pytest.raises(ConfigError, match=match) as e:
        load_scales(path, mc, **kw)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("field,value", [("num_layers", 4), ("num_kv_heads", 4), ("head_dim", 64)])
def test_other_model_shapes(scales_path, field, value):
    other = dataclasses.replace(MC, **{field: value}, num_heads=8)
    expect_error(scales_path, f"different model: {field}", mc=other)


def test_other_model_fingerprint(scales_path):
    expect_error(scales_path, "fingerprint", mc=dataclasses.replace(MC, vocab_size=300))
    expect_error(scales_path, "fingerprint", mc=dataclasses.replace(MC, architecture="Qwen2ForCausalLM"))


def test_weights_hash(tmp_path):
    k, v = absmax()
    p = tmp_path / "s.json"
    save_scales(p, MC, k_absmax=k, v_absmax=v, num_tokens=10, weights_hash="abc")
    assert load_scales(p, MC, weights_hash="abc").weights_hash == "abc"
    assert load_scales(p, MC).weights_hash == "abc"  # hash unknown to the loader: shapes still checked
    expect_error(p, "different weights", weights_hash="def")
    assert model_fingerprint(MC, "abc") != model_fingerprint(MC)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found") as e:
        load_scales(tmp_path / "nope.json", MC)
    assert "nope.json" in str(e.value)


def _edit(path, fn):
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.update(version=3), "unsupported version 3"),
    (lambda d: d.update(format="something"), "not a kvpack KV scales file"),
    (lambda d: d["k"].update(absmax=[[1.0, 2.0]] * 2), r"k.absmax must be a \[3\]\[2\]"),
    (lambda d: d["v"].update(absmax=[[1.0, 2.0, 3.0]] * 3), r"v.absmax must be a \[3\]\[2\]"),
    (lambda d: d["k"].update(absmax=[[1.0, "x"]] * 3), "k.absmax must be"),
    (lambda d: d["k"]["absmax"][0].__setitem__(0, -1.0), "k.absmax holds values"),
    (lambda d: d["scales"]["int8"]["k"][2].__setitem__(1, 0.0), "scales.int8.k holds values that are not finite and positive"),
    (lambda d: d["scales"]["fp8_e4m3"]["v"][0].__setitem__(0, -0.5), "scales.fp8_e4m3.v holds"),
    (lambda d: d["scales"].update(int4={"k": [], "v": []}), "unknown format 'int4'"),
    (lambda d: d.update(statistic="mean"), "statistic"),
    (lambda d: d.update(num_tokens=0), "num_tokens"),
    (lambda d: d.pop("v"), "missing \"v\""),
    (lambda d: d["model"].pop("head_dim"), "missing model.head_dim"),
])
def test_malformed(scales_path, edit, match):
    _edit(scales_path, edit)
    expect_error(scales_path, match)


def test_non_finite_and_bad_json(scales_path):
    text = scales_path.read_text()
    data = json.loads(text)
    data["scales"]["int8"]["k"][0][0] = float("nan")
    scales_path.write_text(json.dumps(data))  # writes the NaN literal json accepts
    expect_error(scales_path, "not finite")
    scales_path.write_text(text.replace(str(data["k"]["absmax"][0][0]), "1e999", 1))
    expect_error(scales_path, "not finite")
    scales_path.write_text(text[: len(text) // 2])
    expect_error(scales_path, "not valid JSON")


def test_save_validates(tmp_path):
    k, v = absmax()
    with pytest.raises(Exception, match="shape"):
        save_scales(tmp_path / "a.json", MC, k_absmax=k[:2], v_absmax=v, num_tokens=1)
    with pytest.raises(Exception, match="non-finite"):
        save_scales(tmp_path / "a.json", MC, k_absmax=k * float("nan"), v_absmax=v, num_tokens=1)
    assert not (tmp_path / "a.json").exists()
