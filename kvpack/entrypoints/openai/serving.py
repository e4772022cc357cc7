"""What the completions and chat handlers share: validation, tokenization, sampling params,
admission into the engine, per-choice streaming state, and the disconnect watch.

Validation happens here, before anything reaches the engine, so every bad value is an HTTP 400
naming the offending field (`param`), and the engine only ever sees well-formed requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from starlette.requests import Request

from kvpack.config import KVPackError
from kvpack.entrypoints.openai.async_engine import (
    DISCONNECTED, AsyncEngine, QueueFullError, RequestGroup, ShuttingDownError,
)
from kvpack.entrypoints.openai.metrics import ServerMetrics
from kvpack.entrypoints.openai.protocol import (
    MAX_LOGPROBS, MAX_N, UNSUPPORTED_NEUTRAL, UsageInfo, random_id,
)

MAX_STOP = 16  # stop strings per request
MAX_PROMPTS = 64  # prompts in one batched completions request


class APIError(Exception):
    """An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}` with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_value" if param else None)


@dataclass
class ServingContext:
    """Everything a handler needs, built once per app."""

    engine: AsyncEngine
    tokenizer: Any
    model_name: str
    max_model_len: int
    vocab_size: int
    metrics: ServerMetrics
    params_cls: type
    aliases: frozenset[str] = frozenset()
    _token_cache: dict[int, str] = field(default_factory=dict, repr=False)

    def token_str(self, token_id: int) -> str:
        """The text of one token (cached; byte-fallback pieces may decode to U+FFFD)."""
        s = self._token_cache.get(token_id)
        if s is None:
            s = self._token_cache[token_id] = self.tokenizer.decode([token_id])
        return s

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name and name not in self.aliases:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                                f"{self.model_name!r}", param="model", code="model_not_found")


@dataclass
class ChoiceState:
    """One choice's progress; turns cumulative RequestOutputs into deltas.

    While stop strings are set and the choice runs, the last `holdback` characters are not sent:
    they may turn out to be the start of a stop string that the engine will cut."""

    holdback: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    sent_chars: int = 0
    sent_tokens: int = 0

    def update(self, out: Any) -> None:
        self.text, self.token_ids = out.text, list(out.token_ids)
        self.logprobs = out.logprobs
        if out.finished:
            self.finish_reason = out.finish_reason or "stop"

    def apply(self, kind: str, payload: Any) -> None:
        """Take one ("out", RequestOutput) or ("abort", None) item from the engine."""
        if kind == "abort":
            self.finish_reason = "abort"
        else:
            self.update(payload)

    def take_delta(self) -> tuple[str, list[int], list[dict[int, float]] | None]:
        """New text, token ids and logprob dicts since the last call."""
        end = len(self.text) if self.finish_reason else max(self.sent_chars,
                                                             len(self.text) - self.holdback)
        delta = self.text[self.sent_chars:end]
        self.sent_chars = max(self.sent_chars, end)
        ids = self.token_ids[self.sent_tokens:]
        lps = self.logprobs[self.sent_tokens:len(self.token_ids)] if self.logprobs is not None else None
        self.sent_tokens = len(self.token_ids)
        return delta, ids, lps


def stop_holdback(stop: str | list[str] | None) -> int:
    """Characters to hold back while streaming so a stop string is never partly sent."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    return max((len(s) for s in stops), default=1) - 1


def check_unsupported(req: Any) -> None:
    for name, neutral in UNSUPPORTED_NEUTRAL.items():
        value = getattr(req, name, neutral)
        if value is not None and value != neutral and value != {}:
            raise bad_request(f"{name} is not supported by kvpack (got {value!r})", name)


def build_params(ctx: ServingContext, req: Any, *, prompt_len: int, max_tokens: int | None,
                 default_max_tokens: int, logprobs: int | None, n: int) -> list[Any]:
    """Validate the sampling fields and return `n` SamplingParams (n=1 each; seeds seed+i)."""
    check_unsupported(req)
    if not 1 <= n <= MAX_N:
        raise bad_request(f"n must be in [1, {MAX_N}], got {n}", "n")
    t = 1.0 if req.temperature is None else req.temperature
    if not 0.0 <= t <= 2.0:
        raise bad_request(f"temperature must be in [0, 2], got {t}", "temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"top_p must be in (0, 1], got {top_p}", "top_p")
    top_k = -1 if req.top_k is None else req.top_k
    if top_k < -1:
        raise bad_request(f"top_k must be -1 or 0 (off) or positive, got {top_k}", "top_k")
    if req.seed is not None and not 0 <= req.seed < 2**63:
        raise bad_request(f"seed must be in [0, 2**63), got {req.seed}", "seed")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP or any(not s for s in stop):
        raise bad_request(f"stop must be at most {MAX_STOP} non-empty strings", "stop")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise bad_request(f"logprobs must be in [0, {MAX_LOGPROBS}], got {logprobs}", "logprobs")
    room = ctx.max_model_len - prompt_len
    if max_tokens is None:
        max_tokens = min(default_max_tokens, room)
    elif max_tokens < 1 or max_tokens > ctx.max_model_len:
        raise bad_request(f"max_tokens must be in [1, {ctx.max_model_len}] (the max model "
                          f"length), got {max_tokens}", "max_tokens")
    if max_tokens > room or room < 1:
        raise bad_request(
            f"this model's maximum context length is {ctx.max_model_len} tokens; the prompt has "
            f"{prompt_len} and max_tokens asks for {max_tokens} more", "max_tokens")
    kw: dict[str, Any] = dict(n=1, temperature=t, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                              stop=stop or None, logprobs=logprobs)
    if req.ignore_eos:
        kw["ignore_eos"] = True
    names = {f.name for f in dataclasses.fields(ctx.params_cls)} \
        if dataclasses.is_dataclass(ctx.params_cls) else set(kw)
    kw = {k: v for k, v in kw.items() if k in names}
    out = []
    for i in range(n):
        seed = None if req.seed is None else (req.seed + i) % 2**63
        try:
            out.append(ctx.params_cls(**kw, **({"seed": seed} if "seed" in names else {})))
        except KVPackError as e:
            raise bad_request(str(e)) from None
    return out


def check_prompt_ids(ctx: ServingContext, ids: list[int], param: str = "prompt") -> list[int]:
    if not ids:
        raise bad_request("the prompt is empty", param)
    bad = next((t for t in ids if not 0 <= t < ctx.vocab_size), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is outside the vocabulary [0, {ctx.vocab_size})", param)
    if len(ids) >= ctx.max_model_len:
        raise bad_request(f"the prompt has {len(ids)} tokens; this model's maximum context "
                          f"length is {ctx.max_model_len}", param)
    return ids


def submit(ctx: ServingContext, prefix: str, prompts: list[list[int]],
           params: list[Any]) -> tuple[str, RequestGroup]:
    """Admit the request: 503 at once when the queue is full or the server is draining."""
    rid = random_id(prefix)
    try:
        group = ctx.engine.submit(rid, prompts, params)
    except QueueFullError as e:
        ctx.metrics.rejected_overload.inc()
        raise APIError(503, str(e), type="server_error", code="server_overloaded") from None
    except ShuttingDownError as e:
        raise APIError(503, str(e), type="server_error", code="shutting_down") from None
    return rid, group


async def watch_disconnect(request: Request, group: RequestGroup) -> None:
    """Put DISCONNECTED on the group's queue when the client goes away (the body is read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            group.queue.put_nowait(DISCONNECTED)
            return


class GroupStream:
    """Iterates a group's results; aborts the engine requests if the client disconnects or the
    consumer stops early. `first()` waits for the first item so errors can still be HTTP errors."""

    def __init__(self, ctx: ServingContext, group: RequestGroup, request: Request):
        self.ctx, self.group = ctx, group
        self._it: AsyncIterator = ctx.engine.results(group)
        self._watch = asyncio.ensure_future(watch_disconnect(request, group))
        self._pending: tuple | None = None

    async def first(self) -> tuple | None:
        """The first `(kind, index, payload)`, or None when the client went away first."""
        try:
            self._pending = await self._it.__anext__()
        except StopAsyncIteration:
            self._pending = None
        except BaseException:
            await self.close()
            raise
        if self._pending is None:
            await self.close()
        return self._pending

    async def __aiter__(self):
        try:
            if self._pending is not None:
                item, self._pending = self._pending, None
                yield item
            async for item in self._it:
                yield item
        finally:
            await self.close()

    async def close(self) -> None:
        self._watch.cancel()
        await self._it.aclose()


async def open_stream(ctx: ServingContext, prefix: str, prompts: list[list[int]], params: list[Any],
                      request: Request) -> tuple[str, GroupStream | None]:
    """Submit the choices and wait for the first result: (request id, stream); the stream is None
    when the client went away first. An engine error on this request raises its HTTP error."""
    rid, group = submit(ctx, prefix, prompts, params)
    stream = GroupStream(ctx, group, request)
    first = await stream.first()
    if first is None:
        return rid, None
    if first[0] == "error":
        await stream.close()
        raise_for_error(first[2])
    return rid, stream


def usage_info(ctx: ServingContext, prompt_tokens: int, states: list[ChoiceState]) -> UsageInfo:
    """OpenAI usage counts of a finished request (all its choices), recorded in the metrics."""
    gen = sum(len(st.token_ids) for st in states)
    ctx.metrics.record_usage(prompt_tokens, gen, [st.finish_reason for st in states])
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=gen,
                     total_tokens=prompt_tokens + gen)


def raise_for_error(payload: Any) -> None:
    if isinstance(payload, KVPackError):
        raise bad_request(str(payload))
    raise APIError(500, f"the engine failed on this request: {payload!r}", type="server_error")
