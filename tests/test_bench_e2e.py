"""benchmarks/bench_e2e.py on CPU: the transformers model built on kvpack's weights is the same model
(logits equal kvpack's cache-free forward within float32 rounding, parameters share storage), and a
tiny run of both workloads writes the table and the JSON with one transformers row per workload."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from kvpack.models import load_model

pytest.importorskip("transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench_e2e():
    spec = importlib.util.spec_from_file_location("bench_e2e", os.path.join(ROOT, "benchmarks", "bench_e2e.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-llama3"])  # untied + plain RoPE; tied + llama3 RoPE
@torch.no_grad()
def test_hf_model_shares_kvpack_weights(preset):
    lm = load_model(preset, "float32", "cpu", seed=3)
    hf = _bench_e2e().hf_model_from_kvpack(lm)
    ids = torch.randint(0, 500, (37,), generator=torch.Generator().manual_seed(0))
    ours = lm.model.compute_logits(lm.model(ids, torch.arange(37), None, None))
    theirs = hf(ids[None]).logits[0].float()
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)
    qkv = lm.model.model.layers[1].self_attn.qkv_proj.weight  # [q + 2 kv, hidden], q rows first
    q_rows = lm.model_config.num_heads * lm.model_config.head_dim
    hf_attn = hf.model.layers[1].self_attn
    assert hf_attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert hf_attn.k_proj.weight.data_ptr() == qkv.data_ptr() + q_rows * qkv.shape[1] * qkv.element_size()


def test_e2e_tiny_run(tmp_path, capsys):
    rc = _bench_e2e().main([
        "--model", "tiny-llama", "--dtype", "float32", "--device", "cpu", "--kv-cache-memory", "1MiB",
        "--kv-cache-dtype", "bfloat16", "--short-requests", "3", "--short-input-len", "8",
        "--short-output-len", "3", "--kv-requests", "2", "--kv-input-len", "20:40", "--kv-output-len", "3:5",
        "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "vs transformers" in out
    rows = json.loads((tmp_path / "e2e.json").read_text())["results"]
    assert [(r["workload"], r["engine"]) for r in rows] == [
        ("short", "kvpack"), ("short", "transformers"), ("kv-bound", "kvpack"), ("kv-bound", "transformers")]
    for r in rows:
        assert r["output_tok_s"] > 0 and (r["workload"] != "short" or r["output_tokens"] == 3 * 3)
    kv = [r for r in rows if r["workload"] == "kv-bound"]
    assert kv[0]["output_tokens"] == kv[1]["output_tokens"]  # the same requests, the same useful tokens
    assert (tmp_path / "e2e.md").exists()
