"""Server-sent events: `data: {json}\\n\\n` chunks, an error event, and the closing `[DONE]`."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

DONE = "data: [DONE]\n\n"


def sse(obj: BaseModel | dict[str, Any]) -> str:
    body = obj.model_dump_json() if isinstance(obj, BaseModel) else json.dumps(obj)
    return f"data: {body}\n\n"


def error_event(err: Any) -> str:
    """An error after the stream has started (HTTP status already sent): an OpenAI error object."""
    from kvpack.config import KVPackError

    status = getattr(err, "status", None)
    if status is None:
        status = 400 if isinstance(err, KVPackError) else 500
    return sse({"error": {
        "message": getattr(err, "message", None) or str(err) or type(err).__name__,
        "type": getattr(err, "type", "invalid_request_error" if status < 500 else "server_error"),
        "param": getattr(err, "param", None),
        "code": getattr(err, "code", None) or status,
    }})
