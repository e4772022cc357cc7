"""`Sequence`: one stream of tokens being generated, plus its place in the paged KV cache.

A request with `n > 1` owns `n` sequences over the same prompt. `token_ids` holds the prompt and
every token generated so far; `num_computed_tokens` of them have their K/V in the cache (the
last generated token never has: it is fed to the model on the next step). Output text is
detokenized incrementally, and stop strings are checked on the new text only.
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
    def decode(self, ids: list[int]) -> str: ...


# Prompt tokens kept as left context when decoding new tokens, so that tokenizers which treat a
# word's first piece specially (leading spaces, byte fallbacks) decode it as they would in place.
_CONTEXT_TOKENS = 5

_seq_counter = itertools.count()


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
        # Incremental detokenization state (offsets into token_ids).
        self.output_text = ""
        self._prefix_offset = max(0, self.num_prompt_tokens - _CONTEXT_TOKENS)
        self._read_offset = self.num_prompt_tokens
        self._stop_checked = 0  # output_text[:_stop_checked] holds no stop string

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

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason

    # ---- detokenization and stop strings -------------------------------------------------------

    def detokenize(
        self, tokenizer: Detokenizer, skip_ids: frozenset[int] = frozenset(), final: bool = False
    ) -> str:
        """Append the text of the tokens added since the last call; returns the new text.

        Text is emitted only once it no longer ends in an incomplete UTF-8 sequence (U+FFFD),
        unless `final` (the sequence has finished: flush whatever is there).
        `skip_ids` (special tokens, when `skip_special_tokens`) contribute no text.
        """
        ids = self.token_ids
        if skip_ids:
            context = [t for t in ids[self._prefix_offset:self._read_offset] if t not in skip_ids]
            full = context + [t for t in ids[self._read_offset:] if t not in skip_ids]
        else:
            context, full = ids[self._prefix_offset:self._read_offset], ids[self._prefix_offset:]
        if len(full) == len(context):
            self._read_offset = len(ids)  # only skipped tokens arrived
            return ""
        prefix_text = tokenizer.decode(context) if context else ""
        text = tokenizer.decode(full)
        if len(text) <= len(prefix_text) or (text.endswith("\ufffd") and not final):
            return ""  # nothing visible yet, or an incomplete UTF-8 sequence: wait for more tokens
        new = text[len(prefix_text):]
        self.output_text += new
        self._prefix_offset = self._read_offset
        self._read_offset = len(ids)
        return new

    def find_stop_string(self) -> bool:
        """Cut `output_text` before the first stop string it now contains; True if one was found."""
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
        self.output_text = self.output_text[:best]
        return True
