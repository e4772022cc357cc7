"""The Llama-family decoder: Llama 2/3/3.1, SmolLM2, Mistral, Qwen2/2.5 (q/k/v bias), Qwen3 (q/k norm).

One flat batch of T tokens from any number of sequences goes through the model at once; how tokens
map onto sequences and the paged KV cache is `AttentionMetadata`'s business, not the model's.
Parameter names follow transformers' except two fused projections: `qkv_proj` (q, k, v stacked on
the output dim) and `gate_up_proj` (gate, up); `kvpack.models.weights` maps checkpoint names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvpack.attention.kv_cache import KVCache, LayerKVCache
from kvpack.attention.layer import Attention
from kvpack.attention.metadata import AttentionMetadata
from kvpack.config import ModelConfig
from kvpack.models.layers import BoundRotary, RMSNorm, RotaryEmbedding, silu_and_mul


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        d = cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.attention_bias, dtype=dtype)
        # transformers puts the bias on o_proj too for Llama and Qwen3 (not Qwen2).
        o_bias = cfg.attention_bias and cfg.architecture != "Qwen2ForCausalLM"
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=o_bias, dtype=dtype)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps, dtype)
        else:
            self.q_norm = self.k_norm = None
        self.attn = Attention(cfg.num_heads, cfg.num_kv_heads, d, scale=d ** -0.5)

    def forward(self, x: torch.Tensor, rope: BoundRotary,
                layer_cache: LayerKVCache | None, metadata: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, k)
        return self.o_proj(self.attn(q, k, v, layer_cache, metadata))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = LlamaAttention(cfg, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = LlamaMLP(cfg, dtype)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None,
                rope: BoundRotary, layer_cache: LayerKVCache | None,
                metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (mlp output, residual stream before it): the next norm adds them (fused)."""
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm(h, residual)
        x = self.self_attn(x, rope, layer_cache, metadata)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, dtype) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class LlamaForCausalLM(nn.Module):
    """Decoder + LM head.

    forward(input_ids [T] int64, positions [T] int64, kv_cache, metadata) -> hidden [T, hidden] dtype
      kv_cache: `KVCache` (layer i gets `kv_cache.layers[i]`), or None for cache-free causal attention,
      which needs each sequence's tokens to be the whole sequence; metadata None means one sequence.
    compute_logits(hidden [T, hidden]) -> [T, vocab] float32
    """

    def __init__(self, model_config: ModelConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        cfg = self.config = model_config
        self.dtype = dtype
        self.model = LlamaModel(cfg, dtype)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                      cfg.rope_scaling)
        if cfg.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_cache: KVCache | None = None,
                metadata: AttentionMetadata | None = None) -> torch.Tensor:
        if metadata is None:
            metadata = _one_sequence(input_ids.shape[0], input_ids.device)
        h = self.model.embed_tokens(input_ids)
        rope = self.rotary.bind(positions)  # shared by all layers
        residual = None
        for i, layer in enumerate(self.model.layers):
            layer_cache = kv_cache.layers[i] if kv_cache is not None else None
            h, residual = layer(h, residual, rope, layer_cache, metadata)
        return self.model.norm(h, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head_weight).float()


def _one_sequence(num_tokens: int, device: torch.device) -> AttentionMetadata:
    """Metadata for a batch that is one whole sequence (cache-free use: tests, scoring)."""
    return AttentionMetadata(
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
        block_tables=torch.zeros(1, 1, dtype=torch.int32, device=device),
        max_query_len=num_tokens,
        max_seq_len=num_tokens,
    )
