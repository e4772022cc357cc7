"""The default model, SmolLM2-135M-Instruct (Q4_1 GGUF): logits == transformers loading the same
GGUF (float32, 32 tokens, max |diff| <= 1e-4), and a greedy answer that knows its capitals,
through the paged KV cache and checked token by token against the cache-free path."""

from __future__ import annotations

import os

import pytest
import torch

from kvpack.attention.kv_cache import allocate_kv_cache
from kvpack.attention.metadata import AttentionMetadata
from kvpack.config import CacheConfig
from kvpack.models import default_model_path, load_model

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smol():
    return load_model(default_model_path(), dtype="float32")


def test_config_from_gguf_metadata(smol):
    cfg = smol.model_config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert cfg.vocab_size == 49152 and cfg.intermediate_size == 1536
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0 and cfg.rope_scaling is None
    assert cfg.eos_token_ids == (2,)


def test_logits_equal_transformers_gguf(smol):
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    ref_model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                     dtype=torch.float32).eval()
    text = ("The quick brown fox jumps over the lazy dog, and then the dog chased the fox far away "
            "into the woods, where an old owl watched them both from a tall oak tree.")
    ids = smol.tokenizer.encode(text)[:32]
    assert len(ids) == 32
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0].float()
        out = smol.model.compute_logits(smol.model(torch.tensor(ids), torch.arange(32)))
    assert ref.std() > 1.0
    err = (out - ref).abs().max().item()
    print(f"max |logit diff| = {err:.3g}")
    assert err <= 1e-4


def _greedy_paged(loaded, ids: list[int], max_tokens: int, kv_dtype: str) -> list[int]:
    m, bs = loaded.model, 16
    cache = allocate_kv_cache(loaded.model_config, CacheConfig(block_size=bs, kv_cache_dtype=kv_dtype),
                              8, "cpu", torch.float32)
    table = [5, 1, 6, 3, 0, 2, 7, 4]
    out: list[int] = []
    new, start = ids, 0
    with torch.no_grad():
        for _ in range(max_tokens):
            meta = AttentionMetadata.build([len(new)], [start + len(new)], [table], block_size=bs)
            h = m(torch.tensor(new), torch.arange(start, start + len(new)), cache, meta)
            nxt = int(m.compute_logits(h[-1:]).argmax(-1))
            if nxt in loaded.tokenizer.eos_token_ids:
                break
            out.append(nxt)
            start, new = start + len(new), [nxt]
    return out


def test_greedy_answer_mentions_paris(smol):
    """Greedy through the paged cache; one cache-free forward over prompt + answer must pick the
    same token at every step (teacher forcing), so both paths agree."""
    tok, m = smol.tokenizer, smol.model
    ids = tok.encode(tok.apply_chat_template(QUESTION))
    out = _greedy_paged(smol, ids, 20, "float32")
    assert "Paris" in tok.decode(out)
    full = ids + out
    with torch.no_grad():
        logits = m.compute_logits(m(torch.tensor(full), torch.arange(len(full))))
    picks = logits[len(ids) - 1:].argmax(-1).tolist()
    assert picks[:len(out)] == out
    if len(out) < 20:  # stopped early: the next pick is an end-of-sequence token
        assert picks[len(out)] in tok.eos_token_ids


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["int8", "int4", "fp8_e4m3"])
def test_greedy_answer_with_quantized_cache(smol, kv_dtype):
    tok = smol.tokenizer
    ids = tok.encode(tok.apply_chat_template(QUESTION))
    assert "Paris" in tok.decode(_greedy_paged(smol, ids, 20, kv_dtype))
