"""`Sequence`: one stream of tokens being generated, plus its place in the paged KV cache.

A request with `n > 1` owns `n` sequences over the same prompt. `token_ids` holds the prompt and
every token generated so far; `num_computed_tokens` of them have their K/V in the cache (the
last generated token never has: it is fed to the model on the next step). Output text grows
through an incremental detokenizer, and stop strings are searched for in the new text only.
"""

from __future__ import annotations

import enum
import itertools
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from kvpack.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Detokenizer(Protocol):
    """Incremental decoding (`kvpack.models.Detokenizer`): new ids in, new text out."""

    def add(self, new_ids: list[int]) -> str: ...

    def flush(self) -> str: ...


_seq_counter = itertools.count()
PLACEHOLDER = -1  # a sampled token not back from the device yet (async scheduling)


class Sequence:
    """Mutable per-sequence state, shared by the scheduler, the block manager and the runner."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        index: int = 0,
        arrival: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.seq_id = next(_seq_counter)
        self.request_id = request_id
        self.index = index  # which of the request's n completions
        self.arrival = self.seq_id if arrival is None else arrival  # preemption order
        self.params = params
        self.generator = generator
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the leading full blocks, once computed
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at the last admission
        self.finish_reason: str | None = None
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.stop_reason: str | int | None = None  # the stop string or stop token that ended it
        self.output_text = ""
        self.detokenizer: Detokenizer | None = None  # set by the engine when it has a tokenizer
        self._stop_checked = 0  # output_text[:_stop_checked] holds no stop string
        self.finishes_at_length = False  # its pending token is its last (max_tokens / max_model_len)

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, req={self.request_id!r}, len={len(self)}, "
                f"computed={self.num_computed_tokens}, status={self.status.value})")

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """More than one token lacks K/V: the (re)computed prompt is not through yet."""
        return self.num_uncomputed_tokens > 1

    def append_token(self, token_id: int, logprobs: dict[int, float] | None = None) -> None:
        self.token_ids.append(token_id)
        if logprobs is not None and self.logprobs is not None:
            self.logprobs.append(logprobs)
            self.cumulative_logprob += logprobs.get(token_id, 0.0)

    def fill_placeholder(self, token_id: int, logprobs: dict[int, float] | None = None) -> None:
        """Put the sampled token in place of the PLACEHOLDER that `append_token` left for it."""
        assert self.token_ids[-1] == PLACEHOLDER, self
        self.token_ids.pop()
        self.append_token(token_id, logprobs)

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason

    # ---- output text and stop strings ----------------------------------------------------------

    def add_text(self, text: str) -> None:
        self.output_text += text

    def find_stop_string(self) -> bool:
        """Cut `output_text` before the first stop string it now contains; True if one was found
        (then `stop_reason` is that string)."""
        stops = self.params.stop_strings
        if not stops:
            return False
        longest = max(len(s) for s in stops)
        start = max(0, self._stop_checked - longest + 1)
        best = -1
        for s in stops:
            i = self.output_text.find(s, start)
            if i != -1 and (best == -1 or i < best):
                best = i
        self._stop_checked = len(self.output_text)
        if best == -1:
            return False
        self.stop_reason = next(s for s in stops if self.output_text.startswith(s, best))
        self.output_text = self.output_text[:best]
        return True
