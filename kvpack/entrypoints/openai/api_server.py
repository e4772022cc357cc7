"""The FastAPI app: routes, OpenAI-style errors, API key and body-size guard, engine lifecycle.

Status codes (docs/serving.md has the table): malformed JSON and every validation error
(missing field, wrong type, bad value) are 400 with `type: invalid_request_error` and `param`
naming the field; 401 wrong or missing Bearer key (when --api-key is set; /health and /metrics
stay open); 404 unknown model or route; 405 wrong method; 413 body over --max-body-bytes
(by Content-Length or by the bytes actually received); 503 queue full (--max-queue) or shutting
down; 500 an engine failure on that request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvpack.entrypoints.openai.protocol import (
    ChatCompletionRequest, CompletionRequest, ErrorInfo, ErrorResponse, ModelCard, ModelList,
)
from kvpack.entrypoints.openai.serving import APIError, ServingContext
from kvpack.entrypoints.openai.serving_chat import create_chat_completion
from kvpack.entrypoints.openai.serving_completion import create_completion

logger = logging.getLogger("kvpack.serve")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class BodyTooLargeError(Exception):
    pass


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=type, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


class GuardMiddleware:
    """Pure ASGI: Bearer key on /v1/*, then the body-size limit (header and streamed bytes)."""

    def __init__(self, app: Any, api_key: str | None, max_body_bytes: int | None):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key and scope["path"].startswith("/v1"):
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(
                    token.strip().encode(), self.api_key.encode()):
                resp = error_response(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                      code="invalid_api_key",
                                      headers={"WWW-Authenticate": "Bearer"})
                return await resp(scope, receive, send)
        limit = self.max_body_bytes
        if limit:
            length = headers.get("content-length")
            if length is not None:
                if not length.isdigit():
                    return await error_response(400, "malformed Content-Length header")(
                        scope, receive, send)
                if int(length) > limit:
                    return await _too_large(limit)(scope, receive, send)
            receive = _counting_receive(receive, limit)
        await self.app(scope, receive, send)


def _too_large(limit: int) -> JSONResponse:
    return error_response(413, f"request body is larger than --max-body-bytes ({limit} bytes)",
                          code="request_too_large")


def _counting_receive(receive, limit: int):
    seen = 0

    async def wrapped():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLargeError(limit)
        return message

    return wrapped


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "TextPart"}


def _validation_message(err: ValidationError) -> tuple[str, str | None]:
    first = err.errors()[0]
    if first["type"] == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', first['msg'])}", None
    # Drop pydantic's union-member tags ("str", "list[int]", ...) from the location.
    loc = [str(p) for p in first["loc"]
           if str(p) not in _TYPE_TAGS and not str(p).startswith(("function-", "list[", "dict["))]
    param = ".".join(loc) or None
    if param is None:
        return f"the request body must be a JSON object ({first['msg']})", None
    if first["type"] == "missing":
        return f"missing required field {param!r}", param
    return f"invalid value for {param!r}: {first['msg']}", param


async def parse_body(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        message, param = _validation_message(e)
        if not raw.strip():
            message = "the request body is empty; expected a JSON object"
        raise APIError(400, message, param=param,
                       code="invalid_json" if param is None else "invalid_value") from None


def build_app(ctx: ServingContext, *, api_key: str | None = None,
              max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The app over a running-or-not `ctx.engine`; startup starts the engine thread and
    shutdown stops it (aborting what is left)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        ctx.engine.start()
        yield
        ctx.engine.shutdown()

    app = FastAPI(title="kvpack", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ctx = ctx
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        ctx.metrics.http_errors.labels(status=str(e.status)).inc()
        return error_response(e.status, e.message, e.type, e.param, e.code)

    @app.exception_handler(BodyTooLargeError)
    async def _too_big(request: Request, e: BodyTooLargeError):
        ctx.metrics.http_errors.labels(status="413").inc()
        return _too_large(int(e.args[0]))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        ctx.metrics.http_errors.labels(status=str(e.status_code)).inc()
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"method {request.method} is not allowed on {request.url.path}"}
        return error_response(e.status_code, message.get(e.status_code, str(e.detail)),
                              code="not_found" if e.status_code == 404 else None)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):  # not used by our routes
        ctx.metrics.http_errors.labels(status="400").inc()
        return error_response(400, json.dumps(e.errors(), default=str))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        logger.exception("unhandled error on %s", request.url.path)
        ctx.metrics.http_errors.labels(status="500").inc()
        return error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error")

    @app.get("/health")
    async def health() -> Response:
        if ctx.engine.draining:
            return error_response(503, "shutting down", "server_error", code="shutting_down")
        if ctx.engine.dead:
            return error_response(503, "the engine thread died", "server_error", code="engine_dead")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        from kvpack.entrypoints.openai.metrics import CONTENT_TYPE

        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> Response:
        card = ModelCard(id=ctx.model_name, root=ctx.model_name, max_model_len=ctx.max_model_len)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> Response:
        ctx.check_model(name)
        return JSONResponse(ModelCard(id=ctx.model_name, max_model_len=ctx.max_model_len).model_dump())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await create_completion(ctx, await parse_body(request, CompletionRequest), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await create_chat_completion(ctx, await parse_body(request, ChatCompletionRequest),
                                            request)

    return app
