"""`kvpack serve`: the OpenAI-compatible HTTP server (docs/serving.md)."""

from __future__ import annotations

import argparse
import logging
import os
import signal

from kvpack.config import CACHE_DTYPE_HELP, add_int4_group_size_arg, add_watermark_arg


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve", help="OpenAI-compatible server (/v1/completions, /v1/chat/completions)",
        description="Serve a model over the OpenAI API with continuous batching. "
                    "Endpoints: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.")
    p.add_argument("--model", default=None,
                   help="HF folder, .gguf file or preset (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients send as `model` (default: from --model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on /v1/* (also $KVPACK_API_KEY)")
    p.add_argument("--max-queue", type=int, default=None,
                   help="answer 503 at once when this many requests are waiting (default: no limit)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                   help="largest request body; larger ones get 413 (default 8 MiB)")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="on SIGTERM, seconds to let running requests finish before aborting them")
    p.add_argument("--kv-cache-dtype", default="auto", help=f"K and V cache format: {CACHE_DTYPE_HELP}")
    p.add_argument("--k-cache-dtype", default=None, help="K cache format (overrides --kv-cache-dtype)")
    p.add_argument("--v-cache-dtype", default=None, help="V cache format (overrides --kv-cache-dtype)")
    p.add_argument("--kv-scales", default=None,
                   help="scales file from `kvpack calibrate`: static scales for int8 / fp8")
    p.add_argument("--no-kv-rotation", dest="kv_rotation", action="store_false",
                   help="int4 / fp8: store K/V without the Hadamard rotation")
    add_int4_group_size_arg(p)
    p.add_argument("--no-kv-centering", dest="kv_centering", action="store_false",
                   help="no per-channel K (fp8: and V) mean subtraction")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output, tokens")
    p.add_argument("--max-num-seqs", type=int, default=None, help="sequences per batch")
    add_watermark_arg(p, default=None)
    p.add_argument("--block-size", type=int, default=None, help="KV cache block size (tokens)")
    p.add_argument("--dtype", default=None, help="weights and activations: auto, float32, bfloat16, float16")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="fixed number of KV cache blocks (default: from the memory budget)")
    p.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false", default=None,
                   help="launch each step only after the previous step's tokens are back (default: launch it first, its inputs for those tokens read on the device)")
    p.add_argument("--disable-async-output-proc", action="store_true", default=None,
                   help="process each step's output text before launching the next step (default: the next step runs on the device meanwhile)")
    p.add_argument("--log-level", default="info", help="debug, info, warning or error")
    return p


def engine_kwargs(args: argparse.Namespace) -> dict:
    """CLI flags -> `LLMEngine.from_args` keywords (unset flags keep the engine's defaults)."""
    kw = {
        "model": args.model, "dtype": args.dtype, "device": args.device,
        "kv_cache_dtype": args.kv_cache_dtype, "k_cache_dtype": args.k_cache_dtype,
        "v_cache_dtype": args.v_cache_dtype, "kv_scales_path": args.kv_scales,
        "max_model_len": args.max_model_len, "max_num_seqs": args.max_num_seqs,
        "watermark": getattr(args, "watermark", None),
        "block_size": args.block_size, "num_blocks": args.num_kv_blocks,
        "kv_rotation": getattr(args, "kv_rotation", True), "kv_centering": getattr(args, "kv_centering", True),
        "int4_group_size": getattr(args, "int4_group_size", None),
        "disable_async_output_proc": getattr(args, "disable_async_output_proc", None),
        "async_scheduling": getattr(args, "async_scheduling", None),
    }
    return {k: v for k, v in kw.items() if v is not None}


def run(args: argparse.Namespace) -> int:
    from kvpack.entrypoints.openai.launcher import (
        ServerConfig, kv_cache_summary, log_startup, make_context, serve,
    )

    config = ServerConfig(  # validated before the model loads
        host=args.host, port=args.port, api_key=args.api_key or os.environ.get("KVPACK_API_KEY"),
        max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
        shutdown_grace_s=args.shutdown_grace, served_model_name=args.served_model_name,
        log_level=args.log_level)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from kvpack.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_args(**engine_kwargs(args))
    ctx = make_context(engine, served_model_name=config.served_model_name, model=args.model,
                       max_queue=config.max_queue)
    log_startup(ctx, kv_cache_summary(engine), config.host, config.port)
    # uvicorn re-raises the signal it shut down on once it is done; with a Python handler in
    # place (instead of the default action, which kills the process) SIGTERM ends with exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    serve(ctx, config)
    return 0
