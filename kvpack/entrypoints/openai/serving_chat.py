"""POST /v1/chat/completions: the model's chat template, plain and streaming (SSE), n, logprobs."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kvpack.config import KVPackError
from kvpack.entrypoints.openai.protocol import (
    ChatChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs,
    ChatResponseMessage, ChatStreamChoice, ChatTokenLogprob, DeltaMessage, TopLogprob, UsageInfo,
)
from kvpack.entrypoints.openai.serving import (
    usage_info,
    ChoiceState, GroupStream, ServingContext, bad_request, build_params, check_prompt_ids,
    open_stream, raise_for_error, stop_holdback,
)
from kvpack.entrypoints.openai.sse import DONE, error_event, sse


def _prompt_ids(ctx: ServingContext, req: ChatCompletionRequest) -> list[int]:
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    try:
        text = ctx.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except KVPackError as e:
        raise bad_request(f"the chat template rejected the messages: {e}", "messages") from None
    except Exception as e:  # jinja errors raised by the template itself (raise_exception)
        raise bad_request(f"the chat template rejected the messages: {e}", "messages") from None
    # The template writes any BOS itself; encoding must not add another.
    return check_prompt_ids(ctx, ctx.tokenizer.encode(text, add_special_tokens=False), "messages")


def _logprobs(ctx: ServingContext, ids: list[int], lps: list[dict[int, float]] | None,
              k: int) -> ChatLogprobs:
    content = []
    for tid, d in zip(ids, lps or []):
        tok = ctx.token_str(tid)
        top = sorted(d.items(), key=lambda kv: -kv[1])[:k]
        content.append(ChatTokenLogprob(
            token=tok, logprob=d.get(tid, float("-inf")), bytes=list(tok.encode()),
            top_logprobs=[TopLogprob(token=ctx.token_str(t), logprob=lp,
                                     bytes=list(ctx.token_str(t).encode())) for t, lp in top]))
    return ChatLogprobs(content=content)


async def create_chat_completion(ctx: ServingContext, req: ChatCompletionRequest,
                                 request: Request) -> Response:
    ctx.check_model(req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
    k = (req.top_logprobs or 0) if req.logprobs else None
    ids = _prompt_ids(ctx, req)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = build_params(ctx, req, prompt_len=len(ids), max_tokens=max_tokens,
                          default_max_tokens=ctx.max_model_len, logprobs=k, n=req.n)
    states = [ChoiceState(holdback=stop_holdback(req.stop)) for _ in range(req.n)]
    rid, stream = await open_stream(ctx, "chatcmpl", [ids] * req.n, params, request)
    if stream is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    model, created = req.model or ctx.model_name, int(time.time())
    if req.stream:
        gen = _stream(ctx, req, rid, created, model, stream, states, len(ids), k)
        return StreamingResponse(gen, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    async for kind, index, payload in stream:
        if kind == "error":
            await stream.close()
            raise_for_error(payload)
        states[index].apply(kind, payload)
    choices = [ChatChoice(index=i, message=ChatResponseMessage(content=st.text),
                          logprobs=_logprobs(ctx, st.token_ids, st.logprobs, k) if k is not None else None,
                          finish_reason=st.finish_reason) for i, st in enumerate(states)]
    body = ChatCompletionResponse(id=rid, created=created, model=model, choices=choices,
                                  usage=usage_info(ctx, len(ids), states))
    return JSONResponse(body.model_dump())


async def _stream(ctx: ServingContext, req: ChatCompletionRequest, rid: str, created: int,
                  model: str, stream: GroupStream, states: list[ChoiceState], prompt_tokens: int,
                  k: int | None):
    def chunk(choices: list[ChatStreamChoice], usage: UsageInfo | None = None) -> str:
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=choices,
                                       usage=usage))

    yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                 for i in range(len(states))])
    finished = False
    async for kind, index, payload in stream:
        st = states[index]
        if kind == "error":
            yield error_event(payload)
            break
        st.apply(kind, payload)
        delta, ids, lps = st.take_delta()
        if not (delta or st.finish_reason or (ids and k is not None)):
            continue
        yield chunk([ChatStreamChoice(
            index=index, delta=DeltaMessage(content=delta or None),
            logprobs=_logprobs(ctx, ids, lps, k) if k is not None else None,
            finish_reason=st.finish_reason)])
    else:
        finished = True
    usage = usage_info(ctx, prompt_tokens, states)
    if finished and req.include_usage:
        yield chunk([], usage)
    yield DONE
