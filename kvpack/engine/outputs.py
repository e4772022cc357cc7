"""What the engine returns per request: `RequestOutput` with one `CompletionOutput` per sequence.

Shaped like vLLM's (`out.outputs[0].text`), with the first completion's fields also on the
request (`out.text`, `out.token_ids`, `out.finish_reason`, `out.logprobs`) as docs/structures.md
lists them. `text` and `token_ids` are cumulative; while a request runs with stop strings, the
last `len(longest stop) - 1` characters are held back, so `text` only ever grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpack.engine.sequence import Sequence


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: list[dict[int, float]] | None = None  # per token: {token id: logprob}
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    metrics: dict[str, float] = field(default_factory=dict)  # arrival/first_token/finished times

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[dict[int, float]] | None:
        return self.outputs[0].logprobs


def completion_of(seq: Sequence) -> CompletionOutput:
    text = seq.output_text
    stops = seq.params.stop_strings
    if stops and not seq.is_finished:
        hold = max(len(s) for s in stops) - 1
        text = text[: max(0, len(text) - hold)]
    return CompletionOutput(
        index=seq.index,
        text=text,
        token_ids=seq.output_token_ids,
        finish_reason=seq.finish_reason,
        stop_reason=seq.stop_reason,
        logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
        cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
    )
