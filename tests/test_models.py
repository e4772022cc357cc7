"""Tier (e): kvpack's model logits == transformers' on the same weights (float32, max |diff| <= 1e-4).

Each variant is a tiny random transformers model saved with save_pretrained and read back with
kvpack's HF-folder loader; it runs cache-free (whole sequences) and through the paged KV cache
(prefill in two chunks, then decode steps, two sequences batched, shuffled block tables).
"""

from __future__ import annotations

import pytest
import torch

from helpers_models import VARIANTS, hf_logits, save_tiny_hf
from kvpack.attention.kv_cache import allocate_kv_cache
from kvpack.attention.metadata import AttentionMetadata
from kvpack.config import CacheConfig
from kvpack.models import load_model

TOL = 1e-4


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny(request, tmp_path_factory):
    path, hf_model = save_tiny_hf(tmp_path_factory.mktemp("hf"), request.param)
    loaded = load_model(path, dtype="float32")
    return request.param, hf_model, loaded


def _ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (n,), generator=g).tolist()


def test_config_translation(tiny):
    variant, hf_model, loaded = tiny
    cfg, hf = loaded.model_config, hf_model.config
    assert cfg.architecture == type(hf_model).__name__
    assert cfg.tie_word_embeddings == hf.tie_word_embeddings
    assert cfg.attention_bias == (variant == "qwen2")
    assert cfg.qk_norm == (variant == "qwen3")
    assert (cfg.rope_scaling or {}).get("rope_type") == ("llama3" if variant == "llama3" else None)
    assert loaded.model.lm_head is None if cfg.tie_word_embeddings else loaded.model.lm_head is not None


def test_logits_match_transformers(tiny):
    variant, hf_model, loaded = tiny
    ids = _ids(40, 1)
    ref = hf_logits(hf_model, ids)
    m = loaded.model
    with torch.no_grad():
        out = m.compute_logits(m(torch.tensor(ids), torch.arange(len(ids))))
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert ref.std() > 0.3, "logits too flat for the tolerance to mean anything"
    assert (out - ref).abs().max().item() <= TOL


def test_batched_whole_sequences_match(tiny):
    """Two sequences in one flat batch, cache-free: each equals its own transformers run."""
    variant, hf_model, loaded = tiny
    a, b = _ids(13, 2), _ids(7, 3)
    meta = AttentionMetadata.build([13, 7], [13, 7], [[0, 1], [2]], block_size=8)
    m = loaded.model
    with torch.no_grad():
        h = m(torch.tensor(a + b), torch.tensor(list(range(13)) + list(range(7))), None, meta)
        out = m.compute_logits(h)
    assert (out[:13] - hf_logits(hf_model, a)).abs().max().item() <= TOL
    assert (out[13:] - hf_logits(hf_model, b)).abs().max().item() <= TOL


def test_paged_cache_chunked_prefill_and_decode(tiny):
    """Sequence A: prefill 11 + 9 tokens (two chunks), then 4 decode steps; sequence B joins the
    second step with a 5-token prefill and decodes alongside. Block size 8, shuffled tables."""
    variant, hf_model, loaded = tiny
    cfg, m = loaded.model_config, loaded.model
    bs = 8
    cache = allocate_kv_cache(cfg, CacheConfig(block_size=bs, kv_cache_dtype="float32"), 12, "cpu",
                              torch.float32)
    seqs = {"a": _ids(24, 4), "b": _ids(9, 5)}
    tables = {"a": [7, 2, 9, 4], "b": [5, 11]}
    done = {"a": 0, "b": 0}
    got: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    # each step: which sequences advance by how many tokens
    steps = [{"a": 11}, {"a": 9, "b": 5}, {"a": 1, "b": 1}, {"a": 1, "b": 1}, {"a": 1, "b": 1},
             {"a": 1, "b": 1}]
    for step in steps:
        ids, pos, qlens, slens, tabs = [], [], [], [], []
        for s, n in step.items():
            start = done[s]
            ids += seqs[s][start:start + n]
            pos += list(range(start, start + n))
            qlens.append(n)
            slens.append(start + n)
            tabs.append(tables[s])
            done[s] += n
        meta = AttentionMetadata.build(qlens, slens, tabs, block_size=bs)
        with torch.no_grad():
            logits = m.compute_logits(m(torch.tensor(ids), torch.tensor(pos), cache, meta))
        off = 0
        for s, n in step.items():
            got[s].append(logits[off:off + n])
            off += n
    for s in ("a", "b"):
        out = torch.cat(got[s])
        ref = hf_logits(hf_model, seqs[s][:done[s]])
        assert (out - ref).abs().max().item() <= TOL, s


def test_bfloat16_close_to_float32(tiny):
    """The model runs in bf16 end to end (activations stay bf16) and stays near the fp32 logits."""
    variant, hf_model, loaded = tiny
    from kvpack.models import build_model
    from kvpack.models.weights import load_weights

    m16 = build_model(loaded.model_config, torch.bfloat16, "cpu")
    load_weights(m16, loaded.model.state_dict().items(), source="fp32 model")
    ids = _ids(20, 6)
    with torch.no_grad():
        h = m16(torch.tensor(ids), torch.arange(20))
        assert h.dtype == torch.bfloat16
        out = m16.compute_logits(h)
        ref = hf_logits(hf_model, ids)
    assert out.dtype == torch.float32
    err = (out - ref).abs().max().item()
    assert err < 0.1 * ref.abs().max().item()
