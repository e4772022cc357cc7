"""Tiny random checkpoints for tests: HF folders (via transformers' save_pretrained) and GGUF files.

    path, hf_model = save_tiny_hf(tmp_path, "qwen3")        # a folder kvpack's loader reads
    write_tiny_gguf(tmp_path / "m.gguf", hf_model, "Q8_0")  # the same weights as llama.cpp stores them

Weights are drawn with a larger spread than transformers' init (std 0.02 makes every logit ~0, and
a 1e-4 tolerance would then prove little); norms are 1 + noise so they are exercised too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

VOCAB = 320
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 10000.0}

# variant -> (transformers config class name, overrides of TINY)
VARIANTS = {
    "llama": ("LlamaConfig", {}),
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "llama3": ("LlamaConfig", {"rope_parameters": LLAMA3_ROPE, "num_key_value_heads": 1}),
    "mistral": ("MistralConfig", {"sliding_window": None, "rope_theta": 1000000.0}),
    "qwen2": ("Qwen2Config", {"rope_theta": 1000000.0}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True, "rope_theta": 1000000.0}),
}


def tiny_hf_model(variant: str, seed: int = 0):
    """A transformers model (float32, eval) of a tiny config with noisy random weights."""
    import transformers

    cls_name, over = VARIANTS[variant]
    kw = {**TINY, **over}
    if "rope_theta" in kw and "rope_parameters" not in kw:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": kw.pop("rope_theta")}
    cfg = getattr(transformers, cls_name)(**kw)
    cfg._attn_implementation = "eager"
    model_cls = getattr(transformers, cls_name.replace("Config", "ForCausalLM"))
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise * (0.5 if "embed" in name else 1.0) / p.shape[-1] ** 0.5)
    return model


def save_tiny_hf(root: Path, variant: str, seed: int = 0, max_shard_size: str | None = None,
                 tokenizer: bool = True):
    """Save a tiny model with save_pretrained (+ a byte-level tokenizer.json). Returns (path, model)."""
    model = tiny_hf_model(variant, seed)
    path = Path(root) / variant
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kw)
    if tokenizer:
        write_byte_tokenizer(path)
    return str(path), model


def write_byte_tokenizer(path: Path) -> None:
    from kvpack.models.tokenizer import CHATML_TEMPLATE, byte_tokenizer

    tok = byte_tokenizer(VOCAB)
    tok.backend.save(str(Path(path) / "tokenizer.json"))
    with open(Path(path) / "tokenizer_config.json", "w") as f:
        json.dump({"eos_token": "<|im_end|>", "chat_template": CHATML_TEMPLATE}, f)


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


# ---------------------------------------------------------------- GGUF


def _permute_like_llama_cpp(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: per head, interleave the two rotary halves (rows i and i + D/2)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, hf_model, qtype: str = "F32", *, tokenizer: bool = True,
                    name: str = "tiny") -> str:
    """Write a transformers model as llama.cpp would: arch `llama` (Llama, Mistral; Q/K rows
    permuted), `qwen2` or `qwen3` (not permuted); 2-D weights in `qtype` (F32, F16, Q8_0, ...),
    norms and biases in F32; a byte-level BPE vocabulary."""
    import gguf

    cfg = hf_model.config
    arch = {"qwen2": "qwen2", "qwen3": "qwen3"}.get(cfg.model_type, "llama")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if tokenizer:
        _add_byte_vocab(w, cfg.vocab_size)
    if cfg.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_freq_factors(cfg.rope_parameters, head_dim))
    names = _hf_to_gguf_names(cfg.num_hidden_layers)
    for hf_name, t in hf_model.state_dict().items():
        if hf_name not in names or (cfg.tie_word_embeddings and hf_name == "lm_head.weight"):
            continue
        a = t.float().numpy()
        if arch == "llama" and ".q_proj." in hf_name:
            a = _permute_like_llama_cpp(a, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            a = _permute_like_llama_cpp(a, cfg.num_key_value_heads)
        _add_tensor(w, names[hf_name], a, qtype if a.ndim == 2 else "F32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _llama3_freq_factors(rope: dict, head_dim: int) -> np.ndarray:
    """Llama 3.1 scaling as llama.cpp's converter stores it: one divisor per frequency."""
    import math

    base = rope["rope_theta"]
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _add_tensor(w, name: str, a: np.ndarray, qtype: str) -> None:
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    if qtype == "F32":
        w.add_tensor(name, a.astype(np.float32))
    elif qtype == "F16":
        w.add_tensor(name, a.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(a.astype(np.float32), kind), raw_dtype=kind)


def _hf_to_gguf_names(layers: int) -> dict[str, str]:
    """transformers name -> GGUF name, the inverse of kvpack's own mapping."""
    from kvpack.models.weights import GGUF_GLOBAL_NAMES, GGUF_LAYER_NAMES, gguf_to_hf_name

    gguf_names = [f"{g}.{kind}" for g in GGUF_GLOBAL_NAMES for kind in ("weight", "bias")]
    gguf_names += [f"blk.{i}.{key}.{kind}" for i in range(layers) for key in GGUF_LAYER_NAMES
                   for kind in ("weight", "bias")]
    return {gguf_to_hf_name(n): n for n in gguf_names}


def _add_byte_vocab(w, vocab_size: int) -> None:
    from kvpack.models.tokenizer import byte_alphabet

    tokens = ["<|endoftext|>", "<s>", "</s>"] + byte_alphabet()
    tokens += [f"<unused{i}>" for i in range(vocab_size - len(tokens))]
    types = [3, 3, 3] + [1] * 256 + [5] * (vocab_size - 259)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)


def truncate(path: str, keep: float = 0.5) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))
