"""Wire an engine into the app and run it under uvicorn with a graceful SIGTERM.

Shutdown on SIGTERM (or SIGINT): uvicorn stops accepting connections and waits for in-flight
responses; requests still running after `shutdown_grace_s` are aborted (their streams end with
`finish_reason: "abort"` and `[DONE]`); then the engine thread stops. `kvpack serve` exits 0
after SIGTERM (130 after SIGINT).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

import uvicorn

from kvpack.config import ConfigError
from kvpack.entrypoints.openai.api_server import DEFAULT_MAX_BODY_BYTES, build_app
from kvpack.entrypoints.openai.async_engine import AsyncEngine
from kvpack.entrypoints.openai.metrics import ServerMetrics
from kvpack.entrypoints.openai.serving import ServingContext

logger = logging.getLogger("kvpack.serve")

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP layer's settings (`kvpack serve` flags that are not the engine's)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int | None = None  # None: requests wait; N: 503 once N are waiting
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    shutdown_grace_s: float = 10.0
    served_model_name: str | None = None
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")
        if self.max_queue is not None and self.max_queue < 1:
            raise ConfigError(f"--max-queue must be >= 1, got {self.max_queue}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")
        if not 0 <= self.shutdown_grace_s <= 3600:
            raise ConfigError(f"--shutdown-grace must be in [0, 3600] s, got {self.shutdown_grace_s}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key must not be empty")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")


def kv_cache_summary(engine: Any) -> dict[str, Any]:
    """The KV format and cache size the engine actually uses (for the start-up log and /metrics).

    Reads `engine.kv_cache_info()` when the engine has it, else the config and stats."""
    info = dict(engine.kv_cache_info()) if hasattr(engine, "kv_cache_info") else {}
    if not info:
        cfg = getattr(engine, "config", None)
        cache = getattr(cfg, "cache_config", None)
        stats = engine.stats()
        info = {
            "k_format": getattr(cache, "k_dtype_name", "?"),
            "v_format": getattr(cache, "v_dtype_name", "?"),
            "block_size": getattr(cache, "block_size", 0),
            "num_blocks": stats.get("num_total_blocks") or stats.get("num_blocks") or 0,
        }
    info.setdefault("num_tokens", int(info.get("num_blocks", 0)) * int(info.get("block_size", 0)))
    return info


def make_context(engine: Any, *, served_model_name: str | None = None, model: str | None = None,
                 max_queue: int | None = None, params_cls: type | None = None) -> ServingContext:
    """A ServingContext over `engine` (the real LLMEngine, or a test double with its API)."""
    if params_cls is None:
        from kvpack.sampling_params import SamplingParams as params_cls
    cfg = getattr(engine, "config", None)
    max_model_len = int(getattr(engine, "max_model_len", 0)
                        or cfg.scheduler_config.max_model_len)
    vocab = int(getattr(engine.tokenizer, "vocab_size", 0) or cfg.model_config.vocab_size)
    name = served_model_name or _default_name(model or getattr(cfg, "model", None))
    async_engine = AsyncEngine(engine, max_queue=max_queue)
    kv = kv_cache_summary(engine)
    metrics = ServerMetrics(lambda: async_engine.snapshot, lambda: async_engine.num_waiting,
                            {k: kv[k] for k in ("k_format", "v_format", "block_size", "num_blocks")
                             if k in kv})
    aliases = frozenset(a for a in (model,) if a and a != name)
    return ServingContext(engine=async_engine, tokenizer=engine.tokenizer, model_name=name,
                          max_model_len=max_model_len, vocab_size=vocab, metrics=metrics,
                          params_cls=params_cls, aliases=aliases)


def _default_name(model: str | None) -> str:
    """`--model`'s last path component without `.gguf`; the embedded model's file name."""
    if not model or model == "default":
        try:
            from kvpack.models.loader import default_model_path

            model = default_model_path()
        except Exception:
            return "SmolLM2-135M-Instruct"
    base = os.path.basename(os.path.normpath(model))
    return base[:-5] if base.endswith(".gguf") else base


class GracefulServer(uvicorn.Server):
    """uvicorn.Server that aborts requests still running `grace_s` after shutdown began."""

    def __init__(self, config: uvicorn.Config, ctx: ServingContext, grace_s: float):
        super().__init__(config)
        self.ctx, self.grace_s = ctx, grace_s

    async def shutdown(self, sockets=None) -> None:
        self.ctx.engine.draining = True
        logger.info("shutting down: finishing %d in-flight requests (up to %.1f s, then abort)",
                    self.ctx.engine.num_active, self.grace_s)
        timer = asyncio.get_running_loop().call_later(self.grace_s, self.ctx.engine.abort_all)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def log_startup(ctx: ServingContext, kv: dict[str, Any], host: str, port: int) -> None:
    gib = kv.get("gib", kv.get("bytes", 0) / 2**30)
    logger.info("model %s, max_model_len %d", ctx.model_name, ctx.max_model_len)
    logger.info("KV cache: K=%s V=%s, %d blocks x %d tokens = %d tokens, %.3f GiB",
                kv.get("k_format"), kv.get("v_format"), int(kv.get("num_blocks", 0)),
                int(kv.get("block_size", 0)), int(kv.get("num_tokens", 0)), gib)
    logger.info("serving on http://%s:%d (OpenAI API under /v1)", host, port)


def serve(ctx: ServingContext, config: ServerConfig) -> None:
    """Run until SIGTERM/SIGINT (blocking). Call from the main thread for signal handling."""
    app = build_app(ctx, api_key=config.api_key, max_body_bytes=config.max_body_bytes)
    uv = uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                        access_log=False, lifespan="on",
                        timeout_graceful_shutdown=int(config.shutdown_grace_s) + 5)
    GracefulServer(uv, ctx, config.shutdown_grace_s).run()
