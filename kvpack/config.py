"""Configuration: one frozen dataclass per layer of the system.

`ModelConfig` is translated once from a Hugging Face config (or GGUF metadata, or a preset);
`CacheConfig`, `SchedulerConfig` and `EngineConfig` carry the user's choices. Each validates in
`__post_init__` and raises `ConfigError` with a one-line message naming the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class KVPackError(Exception):
    """Base class of every user-facing error: the CLI prints its message on one line."""


class ConfigError(KVPackError, ValueError):
    """A configuration value is invalid or inconsistent."""


SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and hyper-parameters of a Llama-family decoder."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q, k, v projections
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "bfloat16"  # the checkpoint's dtype, used by dtype="auto"
    name: str = ""

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"unsupported architecture {self.architecture!r}; kvpack supports "
                + ", ".join(SUPPORTED_ARCHITECTURES)
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model config: num_heads ({self.num_heads}) is not a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str = "") -> "ModelConfig":
        """Translate a Hugging Face `config.json` dict (the only place that reads its keys)."""
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else {
            "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
        }.get(cfg.get("model_type", ""), cfg.get("model_type", "unknown"))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"unsupported architecture {arch!r}; kvpack supports " + ", ".join(SUPPORTED_ARCHITECTURES)
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"unsupported hidden_act {cfg['hidden_act']!r}; kvpack supports 'silu'")
        if cfg.get("mlp_bias"):
            raise ConfigError("mlp_bias=true is not supported")
        try:
            num_heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            head_dim = cfg.get("head_dim") or hidden // num_heads
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(cfg.get("rope_theta")
                                 or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
                rope_scaling=_rope_scaling(cfg),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
                qk_norm=arch == "Qwen3ForCausalLM",
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=eos_ids,
                torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
                name=name,
            )
        except KeyError as e:
            raise ConfigError(f"config.json is missing the key {e.args[0]!r}") from None


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, Any] | None:
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not rs:
        return None
    kind = rs.get("rope_type") or rs.get("type")
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ConfigError(f"unsupported rope_scaling type {kind!r}; kvpack supports 'llama3'")
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if key not in rs:
            raise ConfigError(f"rope_scaling of type 'llama3' is missing {key!r}")
    return {k: v for k, v in rs.items() if k != "rope_theta"}


CACHE_DTYPE_HELP = (
    "auto, bfloat16, float16, int8, int4, fp8_e4m3 (alias fp8), fp8_e5m2"
)


DEFAULT_WATERMARK = 0.01  # vLLM's block manager kept the same 1 %


def add_watermark_arg(parser: Any, default: float | None = DEFAULT_WATERMARK) -> None:
    """`--watermark` for every command that builds an engine (`SchedulerConfig.watermark`)."""
    parser.add_argument("--watermark", type=float, default=default,
                        help="fraction of the KV blocks a new request must leave free when admitted while "
                             "others run: room for them to grow before one is preempted (default 0.01; 0: off)")


def add_int4_group_size_arg(parser: Any) -> None:
    """`--int4-group-size` for every command that builds a cache (one definition of its choices)."""
    from kvpack.formats.base import INT4_GROUP_SIZES  # lazy: formats imports this module

    parser.add_argument("--int4-group-size", type=int, default=32, choices=INT4_GROUP_SIZES,
                        help="channels per int4 scale/zero-point group: 32 (default), 64, or 128 (one group "
                             "per head at head_dim 128: ~3.76x bf16 capacity instead of 3.2x, less accurate)")


@dataclass(frozen=True)
class CacheConfig:
    """How the paged KV cache is laid out and stored.

    `kv_cache_dtype` sets K and V; `k_cache_dtype` / `v_cache_dtype` override one side.
    `kv_scales_path` switches int8 and fp8 formats to static per-(layer, kv head) scales.
    """

    block_size: int = 16
    kv_cache_dtype: str = "auto"
    k_cache_dtype: str | None = None
    v_cache_dtype: str | None = None
    kv_scales_path: str | None = None
    kv_rotation: bool = True  # Hadamard rotation of the head dim for int4 and fp8 (formats.ROTATE_KINDS)
    kv_centering: bool = True  # subtract per-channel K (and fp8 V) means before quantizing (CENTER_KINDS)
    int4_group_size: int = 32
    num_blocks: int | None = None  # fixed pool size; otherwise from the memory budget
    kv_cache_memory: int | None = None  # bytes for the KV pools
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ConfigError(f"--block-size must be one of 8, 16, 32, 64, 128, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        from kvpack.formats.base import INT4_GROUP_SIZES  # lazy: formats imports this module

        if self.int4_group_size not in INT4_GROUP_SIZES:
            raise ConfigError(f"int4 group size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}, "
                              f"got {self.int4_group_size}")
        if self.num_blocks is not None and self.num_blocks <= 0:
            raise ConfigError(f"num_blocks must be positive, got {self.num_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ConfigError(f"--kv-cache-memory must be positive, got {self.kv_cache_memory}")
        # checked here, before a model loads: a misspelled format or an unreadable scales file fails at once
        from kvpack.formats.base import canonical_name
        from kvpack.formats.scales import read_scales_file

        for name in (self.kv_cache_dtype, self.k_cache_dtype, self.v_cache_dtype):
            if name is not None:
                canonical_name(name)
        if self.kv_scales_path is not None:
            read_scales_file(self.kv_scales_path)

    @property
    def k_dtype_name(self) -> str:
        return self.k_cache_dtype or self.kv_cache_dtype

    @property
    def v_dtype_name(self) -> str:
        return self.v_cache_dtype or self.kv_cache_dtype


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    # Fraction of the KV blocks a new request must leave free when admitted (room for the running
    # sequences to grow before one is preempted).
    watermark: float = DEFAULT_WATERMARK

    def __post_init__(self) -> None:
        if not 0.0 <= self.watermark < 1.0:
            raise ConfigError(f"--watermark must be in [0, 1), got {self.watermark}")
        if self.max_num_seqs <= 0:
            raise ConfigError(f"--max-num-seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens <= 0:
            raise ConfigError(
                f"--max-num-batched-tokens must be positive, got {self.max_num_batched_tokens}"
            )
        if self.max_model_len <= 0:
            raise ConfigError(f"--max-model-len must be positive, got {self.max_model_len}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                "without chunked prefill, --max-num-batched-tokens must be >= --max-model-len"
            )


@dataclass(frozen=True)
class EngineConfig:
    model: str
    model_config: ModelConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    dtype: str = "auto"  # weights and activations: auto, float32, bfloat16, float16
    device: str = "cpu"
    seed: int = 0
    enforce_eager: bool = False  # no CUDA graphs
    disable_async_output_proc: bool = False  # wait for each step's text work before launching the next
    async_scheduling: bool = True  # launch the next step before this one's tokens are back (needs the above)

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "half", "float"):
            raise ConfigError(f"--dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
