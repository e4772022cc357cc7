"""GGUF files (llama.cpp's format): config from metadata, dequantized tensors, the tokenizer.

Supported: architectures `llama` (also Mistral and SmolLM2), `qwen2`, `qwen3`; tensor types F32,
F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q2_K..Q6_K, dequantized to float32 by
`gguf.quants.dequantize`; the byte-level BPE tokenizer (`tokenizer.ggml.model == "gpt2"`).

llama.cpp's converter permutes the rows of Q and K of `llama` models so that each head's RoPE pairs
are interleaved (GPT-J style); kvpack's RoPE rotates halves (as transformers does), so the rows are
put back here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from kvpack.config import ConfigError, KVPackError, ModelConfig
from kvpack.models.tokenizer import Tokenizer, byte_alphabet
from kvpack.models.weights import IGNORED, gguf_to_hf_name

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

# tokenizer.ggml.pre -> how text is split before byte-level BPE (llama.cpp's pre-tokenizer types)
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
           "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
# GPT-2's pattern after splitting every digit apart
_DIGIT_SPLIT = {"smollm", "starcoder", "refact", "codeshell", "command-r"}
_CONTROL, _USER_DEFINED = 3, 4


class GGUFFile:
    """An opened GGUF file: `.metadata(key)`, `.model_config()`, `.weights()`, `.tokenizer()`."""

    def __init__(self, path: str) -> None:
        from gguf import GGUFReader

        self.path = path
        try:
            self.reader = GGUFReader(path)
        except Exception as e:  # gguf raises ValueError, IndexError, struct errors... on bad files
            raise KVPackError(f"cannot read GGUF file {path} (truncated or corrupt?): "
                              f"{type(e).__name__}: {e}") from None
        self.arch = self.metadata("general.architecture")
        self.tensors = {t.name: t for t in self.reader.tensors}

    def metadata(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def _arch_key(self, key: str, default: Any = None) -> Any:
        return self.metadata(f"{self.arch}.{key}", default)

    def model_config(self) -> ModelConfig:
        if self.arch not in ARCHITECTURES:
            raise ConfigError(f"{self.path}: unsupported GGUF architecture {self.arch!r}; kvpack "
                              "supports " + ", ".join(ARCHITECTURES))
        try:
            hidden = int(self._arch_key("embedding_length"))
            num_heads = int(self._arch_key("attention.head_count"))
            num_layers = int(self._arch_key("block_count"))
            inter = int(self._arch_key("feed_forward_length"))
        except TypeError:
            raise ConfigError(f"{self.path}: GGUF metadata lacks {self.arch}.embedding_length, "
                              "attention.head_count, block_count or feed_forward_length") from None
        head_dim = int(self._arch_key("attention.key_length") or hidden // num_heads)
        rope_dim = int(self._arch_key("rope.dimension_count") or head_dim)
        if rope_dim != head_dim:
            raise ConfigError(f"{self.path}: partial rotary embedding ({rope_dim} of {head_dim} dims) "
                              "is not supported")
        if "token_embd.weight" not in self.tensors:
            raise KVPackError(f"{self.path}: missing tensor token_embd.weight")
        vocab = int(self.tensors["token_embd.weight"].shape[1])
        bos = self.metadata("tokenizer.ggml.bos_token_id")
        eos_ids = tuple(dict.fromkeys(
            int(i) for i in (self.metadata(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom"))
            if i is not None))
        return ModelConfig(
            architecture=ARCHITECTURES[self.arch],
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(self._arch_key("attention.head_count_kv") or num_heads),
            head_dim=head_dim,
            rms_norm_eps=float(self._arch_key("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(self._arch_key("rope.freq_base", 10000.0)),
            rope_scaling=self._rope_scaling(),
            max_position_embeddings=int(self._arch_key("context_length", 4096)),
            tie_word_embeddings="output.weight" not in self.tensors,
            attention_bias="blk.0.attn_q.bias" in self.tensors,
            qk_norm="blk.0.attn_q_norm.weight" in self.tensors,
            bos_token_id=int(bos) if bos is not None else None,
            eos_token_ids=eos_ids,
            torch_dtype=self._float_dtype(),
            name=str(self.metadata("general.name") or os.path.basename(self.path)),
        )

    def _rope_scaling(self) -> dict[str, Any] | None:
        kind = self._arch_key("rope.scaling.type")
        factor = float(self._arch_key("rope.scaling.factor", 1.0) or 1.0)
        if kind not in (None, "none") and not (kind == "linear" and factor == 1.0):
            raise ConfigError(f"{self.path}: unsupported GGUF rope scaling type {kind!r}")
        if "rope_freqs.weight" in self.tensors:  # Llama 3.1: llama3 scaling stored as divisors
            factors = self._dequantize(self.tensors["rope_freqs.weight"])
            return {"rope_type": "freq_factors", "freq_factors": [float(x) for x in factors.reshape(-1)]}
        return None

    def _float_dtype(self) -> str:
        types = {t.tensor_type.name for t in self.reader.tensors if len(t.shape) > 1}
        return "float16" if types == {"F16"} else "bfloat16"

    def weights(self, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
        """(transformers name, float32 tensor) for every tensor, Q/K rows un-permuted for `llama`."""
        for name, t in self.tensors.items():
            if IGNORED.search(name):
                continue
            hf_name = gguf_to_hf_name(name)
            if hf_name is None:
                continue
            w = self._dequantize(t)
            if self.arch == "llama" and (".q_proj." in hf_name or ".k_proj." in hf_name):
                heads = cfg.num_heads if ".q_proj." in hf_name else cfg.num_kv_heads
                w = unpermute_rope_rows(w, heads)
            yield hf_name, torch.from_numpy(np.array(w, dtype=np.float32))  # a writable copy

    def _dequantize(self, t: Any) -> np.ndarray:
        from gguf.quants import dequantize

        kind = t.tensor_type.name
        if kind not in TENSOR_TYPES:
            raise KVPackError(f"{self.path}: tensor {t.name} has unsupported GGUF type {kind}; kvpack "
                              "reads " + ", ".join(TENSOR_TYPES))
        try:
            w = dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise KVPackError(f"{self.path}: cannot dequantize {t.name} ({kind}): {e}") from None
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims innermost first
        return w.reshape(shape).astype(np.float32, copy=False)

    def tokenizer(self) -> Tokenizer:
        return gguf_tokenizer(self)


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order. Per head, llama.cpp stores row 2i+j (j in {0, 1}) where the
    checkpoint had row i + j * D/2; w: [num_heads * D, ...] (a weight or a bias)."""
    rows = w.shape[0]
    half = rows // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tokenizer(f: GGUFFile) -> Tokenizer:
    """A byte-level BPE `Tokenizer` from `tokenizer.ggml.*` metadata, split as llama.cpp splits."""
    from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers
    from tokenizers import processors

    kind = f.metadata("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConfigError(f"{f.path}: GGUF tokenizer model {kind!r} is not supported; kvpack reads "
                          "byte-level BPE ('gpt2') tokenizers")
    tokens = f.metadata("tokenizer.ggml.tokens") or []
    types = f.metadata("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in (f.metadata("tokenizer.ggml.merges") or [])]
    alphabet = byte_alphabet()
    allowed = set(alphabet)
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if not set(tok) <= allowed:  # spelled in raw UTF-8: re-spell in the byte alphabet
            tok = "".join(alphabet[b] for b in tok.encode("utf-8"))
        vocab.setdefault(tok, i)
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    pre = f.metadata("tokenizer.ggml.pre") or "default"
    if pre in _SPLITS:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in _DIGIT_SPLIT:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= allowed]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
    tk.add_special_tokens(special)
    tk.add_tokens(user)

    def token(key: str) -> str | None:
        i = f.metadata(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos = token("bos")
    if f.metadata("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    eos_ids = tuple(int(i) for i in (f.metadata(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom"))
                    if i is not None)
    return Tokenizer(tk, bos_token=bos, eos_token=token("eos"), eos_token_ids=eos_ids,
                     chat_template=f.metadata("tokenizer.chat_template"))
