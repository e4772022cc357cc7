"""Random-weight ("dummy") presets with real models' shapes, for benchmarks and tests.

`dummy:llama-3.1-8b` (or plain `llama-3.1-8b`) builds the model directly on the target device in
the target dtype and fills it from a seeded generator: N(0, 0.02) for matrices, biases and
embeddings, ones for norms. Text goes through a byte-level stand-in tokenizer.
"""

from __future__ import annotations

import torch
from torch import nn

from kvpack.config import ModelConfig

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _cfg(arch: str, vocab: int, hidden: int, inter: int, layers: int, heads: int, kv_heads: int,
         head_dim: int | None = None, **kw) -> ModelConfig:
    return ModelConfig(architecture=arch, vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                       head_dim=head_dim or hidden // heads, **kw)


PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m": _cfg("LlamaForCausalLM", 49152, 576, 1536, 30, 9, 3, rope_theta=100000.0,
                         rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True),
    "smollm2-360m": _cfg("LlamaForCausalLM", 49152, 960, 2560, 32, 15, 5, rope_theta=100000.0,
                         rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True),
    "llama-2-7b": _cfg("LlamaForCausalLM", 32000, 4096, 11008, 32, 32, 32, rms_norm_eps=1e-5,
                       max_position_embeddings=4096, torch_dtype="float16"),
    "llama-3.2-1b": _cfg("LlamaForCausalLM", 128256, 2048, 8192, 16, 32, 8, rope_theta=500000.0,
                         rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=True,
                         rope_scaling={**_LLAMA3_ROPE, "factor": 32.0}),
    "llama-3.1-8b": _cfg("LlamaForCausalLM", 128256, 4096, 14336, 32, 32, 8, rope_theta=500000.0,
                         rms_norm_eps=1e-5, max_position_embeddings=131072, rope_scaling=_LLAMA3_ROPE),
    "mistral-7b": _cfg("MistralForCausalLM", 32768, 4096, 14336, 32, 32, 8, rope_theta=1000000.0,
                       rms_norm_eps=1e-5, max_position_embeddings=32768),
    "qwen2.5-0.5b": _cfg("Qwen2ForCausalLM", 151936, 896, 4864, 24, 14, 2, rope_theta=1000000.0,
                         max_position_embeddings=32768, tie_word_embeddings=True, attention_bias=True),
    "qwen2.5-7b": _cfg("Qwen2ForCausalLM", 152064, 3584, 18944, 28, 28, 4, rope_theta=1000000.0,
                       max_position_embeddings=32768, attention_bias=True),
    "qwen3-0.6b": _cfg("Qwen3ForCausalLM", 151936, 1024, 3072, 28, 16, 8, head_dim=128,
                       rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=True,
                       qk_norm=True),
    "qwen3-8b": _cfg("Qwen3ForCausalLM", 151936, 4096, 12288, 36, 32, 8, head_dim=128,
                     rope_theta=1000000.0, max_position_embeddings=40960, qk_norm=True),
    # tiny presets for tests: head dims 64 and 80 (int4 groups of 32 and 16), GQA 1, 2, 4
    "tiny-llama": _cfg("LlamaForCausalLM", 512, 256, 512, 2, 4, 2, rms_norm_eps=1e-5,
                       max_position_embeddings=2048),
    "tiny-llama3": _cfg("LlamaForCausalLM", 512, 256, 512, 2, 4, 1, rope_theta=500000.0,
                        max_position_embeddings=2048, tie_word_embeddings=True,
                        rope_scaling={**_LLAMA3_ROPE, "original_max_position_embeddings": 256}),
    "tiny-qwen2": _cfg("Qwen2ForCausalLM", 512, 320, 512, 2, 4, 4, head_dim=80,
                       max_position_embeddings=2048, attention_bias=True),
    "tiny-qwen3": _cfg("Qwen3ForCausalLM", 512, 256, 512, 2, 8, 2, head_dim=64,
                       max_position_embeddings=2048, qk_norm=True, tie_word_embeddings=True),
}


def preset_config(name: str) -> ModelConfig | None:
    """The preset called `name` (with or without `dummy:`), or None."""
    key = name.removeprefix("dummy:").lower()
    cfg = PRESETS.get(key)
    if cfg is None:
        return None
    from dataclasses import replace

    # text goes through `byte_tokenizer`: <|endoftext|> = 256, <|im_end|> = 258
    return replace(cfg, name=f"dummy:{key}", bos_token_id=None, eos_token_ids=(256, 258))


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Fill every parameter in place (on its device, in its dtype), deterministically for a seed."""
    for i, (name, p) in enumerate(sorted(model.named_parameters())):
        if "norm" in name:
            p.fill_(1.0)
            continue
        g = torch.Generator(device=p.device)
        g.manual_seed(seed * 1_000_003 + i)
        p.normal_(0.0, std, generator=g)
