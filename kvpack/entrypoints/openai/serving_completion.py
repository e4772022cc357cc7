"""POST /v1/completions: plain and streaming (SSE), batched prompts, n, echo, logprobs."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvpack.entrypoints.openai.protocol import (
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, UsageInfo,
)
from kvpack.entrypoints.openai.serving import (
    usage_info,
    ChoiceState, GroupStream, MAX_PROMPTS, ServingContext, bad_request, build_params,
    check_prompt_ids, open_stream, raise_for_error, stop_holdback,
)
from kvpack.entrypoints.openai.sse import DONE, error_event, sse

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


def _prompts(ctx: ServingContext, prompt: Any) -> list[tuple[str | None, list[int]]]:
    """`(text or None, token ids)` per prompt, for the four accepted shapes of `prompt`."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        items = [list(prompt)]
    else:
        items = list(prompt)
    if not items:
        raise bad_request("the prompt is empty", "prompt")
    if len(items) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request, got {len(items)}", "prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise bad_request("the prompt is empty", "prompt")
            out.append((item, check_prompt_ids(ctx, ctx.tokenizer.encode(item))))
        else:
            out.append((None, check_prompt_ids(ctx, list(item))))
    return out


def _logprobs(ctx: ServingContext, ids: list[int], lps: list[dict[int, float]] | None, k: int,
              offset: int) -> CompletionLogprobs:
    res = CompletionLogprobs()
    for tid, d in zip(ids, lps or []):
        tok = ctx.token_str(tid)
        res.tokens.append(tok)
        res.token_logprobs.append(d.get(tid))
        top = sorted(d.items(), key=lambda kv: -kv[1])[:k]
        res.top_logprobs.append({ctx.token_str(t): lp for t, lp in top} if k else None)
        res.text_offset.append(offset)
        offset += len(tok)
    return res


async def create_completion(ctx: ServingContext, req: CompletionRequest, request: Request) -> Response:
    ctx.check_model(req.model)
    if req.echo and req.logprobs is not None:
        raise bad_request("echo together with logprobs is not supported (no prompt logprobs)", "echo")
    prompts = _prompts(ctx, req.prompt)
    all_ids: list[list[int]] = []
    params: list[Any] = []
    for _, ids in prompts:
        ps = build_params(ctx, req, prompt_len=len(ids), max_tokens=req.max_tokens,
                          default_max_tokens=DEFAULT_MAX_TOKENS, logprobs=req.logprobs, n=req.n)
        all_ids += [ids] * req.n
        params += ps
    echo = [(text if text is not None else ctx.tokenizer.decode(ids)) if req.echo else ""
            for text, ids in prompts for _ in range(req.n)]
    states = [ChoiceState(holdback=stop_holdback(req.stop)) for _ in all_ids]
    usage_prompt = sum(len(ids) for _, ids in prompts)
    rid, stream = await open_stream(ctx, "cmpl", all_ids, params, request)
    if stream is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    model, created = req.model or ctx.model_name, int(time.time())
    if req.stream:
        gen = _stream(ctx, req, rid, created, model, stream, states, echo, usage_prompt)
        return StreamingResponse(gen, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    async for kind, index, payload in stream:
        if kind == "error":
            await stream.close()
            raise_for_error(payload)
        states[index].apply(kind, payload)
    choices = []
    for i, st in enumerate(states):
        lp = None
        if req.logprobs is not None:
            lp = _logprobs(ctx, st.token_ids, st.logprobs, req.logprobs, len(echo[i]))
        choices.append(CompletionChoice(index=i, text=echo[i] + st.text, logprobs=lp,
                                        finish_reason=st.finish_reason))
    usage = usage_info(ctx, usage_prompt, states)
    body = CompletionResponse(id=rid, created=created, model=model, choices=choices, usage=usage)
    return JSONResponse(body.model_dump())


async def _stream(ctx: ServingContext, req: CompletionRequest, rid: str, created: int, model: str,
                  stream: GroupStream, states: list[ChoiceState], echo: list[str], prompt_tokens: int):
    def chunk(choices: list[CompletionChoice], usage: UsageInfo | None = None) -> str:
        return sse(CompletionResponse(id=rid, created=created, model=model, choices=choices,
                                      usage=usage))

    offsets = [len(e) for e in echo]
    if req.echo:
        yield chunk([CompletionChoice(index=i, text=e) for i, e in enumerate(echo)])
    finished = False
    async for kind, index, payload in stream:
        st = states[index]
        if kind == "error":
            yield error_event(payload)
            break
        st.apply(kind, payload)
        delta, ids, lps = st.take_delta()
        if not (delta or st.finish_reason or (ids and req.logprobs is not None)):
            continue
        lp = None
        if req.logprobs is not None:
            lp = _logprobs(ctx, ids, lps, req.logprobs, offsets[index])
            if lp.tokens:
                offsets[index] = lp.text_offset[-1] + len(lp.tokens[-1])
        yield chunk([CompletionChoice(index=index, text=delta, logprobs=lp,
                                      finish_reason=st.finish_reason)])
    else:
        finished = True
    usage = usage_info(ctx, prompt_tokens, states)
    if finished and req.include_usage:
        yield chunk([], usage)
    yield DONE
