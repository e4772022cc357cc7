"""`SamplingParams`: how one request is decoded (the fields and defaults a vLLM user knows).

`temperature == 0` means greedy (argmax). `top_k` of -1 or 0 turns top-k off; `top_p == 1` turns
top-p off. Generation stops at the first of: an EOS token (unless `ignore_eos`), a token in
`stop_token_ids`, a `stop` string (the text is cut before it), `max_tokens` new tokens, or the
engine's `max_model_len`. Neither EOS nor stop tokens can end a request before `min_tokens`.
`output_kind` (vLLM's RequestOutputKind, by name): "cumulative" (default) returns the request's output
from every step that advanced it; "final_only" only once it finishes, so a large batch of long
requests does not rebuild every output each step (`LLM.generate` and `kvpack bench throughput` use it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpack.config import ConfigError

MAX_LOGPROBS = 20
OUTPUT_KINDS = ("cumulative", "final_only")
# Below this a temperature is treated as 0 (greedy); dividing by it would overflow the logits.
GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    output_kind: str = "cumulative"
    # Normalized forms, derived in __post_init__.
    stop_strings: tuple[str, ...] = field(init=False, repr=False, compare=False, default=())
    stop_ids: frozenset[int] = field(init=False, repr=False, compare=False, default=frozenset())

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ConfigError(f"n must be a positive integer, got {self.n!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ConfigError(f"top_k must be -1 or 0 (off) or a positive integer, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ConfigError(f"min_tokens must be >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ConfigError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise ConfigError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        if self.output_kind not in OUTPUT_KINDS:
            raise ConfigError(f"output_kind must be one of {', '.join(OUTPUT_KINDS)}, got {self.output_kind!r}")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) for s in stop):
            raise ConfigError(f"stop must be a string or a list of strings, got {self.stop!r}")
        ids = list(self.stop_token_ids or [])
        if any(not isinstance(t, int) or t < 0 for t in ids):
            raise ConfigError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_strings", tuple(s for s in stop if s))
        object.__setattr__(self, "stop_ids", frozenset(ids))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # rejects NaN
