"""`kvpack bench serve`: an online benchmark client for a running `kvpack serve` (or any
OpenAI-compatible server), over httpx async streaming.

Every request streams (`stream_options.include_usage`), so per request we measure
- TTFT: request sent -> first chunk with text,
- ITL: the gaps between successive text chunks,
- TPOT: (end-to-end - TTFT) / (output tokens - 1), output tokens from the final usage chunk,
- E2EL: request sent -> `[DONE]`;
and over the run: requests/s, output tokens/s, total tokens/s. Mean, median and p99 of each.

Arrivals: Poisson at --request-rate (inf: all at once), at most --max-concurrency in flight.
Bounded: --num-prompts requests at most, nothing new after --duration seconds, each request
gives up after --timeout seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpack.config import ConfigError
from kvpack.tools.output_paths import prepare_output

# Common English words: each is one token (with its leading space) in most BPE vocabularies.
_WORDS = ("time year people way day man thing woman life child world school state family "
          "student group country problem hand part place case week company system program "
          "question work government number night point home water room mother area money "
          "story fact month lot right study book eye job word business issue side kind head "
          "house service friend father power hour game line end member law car city name "
          "team minute idea kid body back parent face others level office door health person "
          "art war history party result change morning reason research girl guy moment air "
          "teacher force education").split()


@dataclass
class BenchRequest:
    prompt: str | list[dict[str, str]]  # text (completions) or messages (chat)
    max_tokens: int


@dataclass
class RequestResult:
    ok: bool = False
    status: int = 0
    error: str = ""
    start: float = 0.0
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0


def random_requests(n: int, input_len: int, output_len: int, seed: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    return [BenchRequest(" ".join(rng.choice(_WORDS) for _ in range(input_len)), output_len)
            for _ in range(n)]


def file_requests(path: str, n: int, output_len: int) -> list[BenchRequest]:
    """A .jsonl file ({"prompt": str} or {"messages": [...]}, optional "max_tokens") or a text
    file with one prompt per line; cycled to `n` requests."""
    items: list[BenchRequest] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.endswith(".jsonl"):
                try:
                    obj = json.loads(line)
                    prompt = obj["messages"] if "messages" in obj else obj["prompt"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise ConfigError(f"{path}:{lineno}: expected a JSON object with "
                                      "'prompt' or 'messages'") from None
                items.append(BenchRequest(prompt, int(obj.get("max_tokens", output_len))))
            else:
                items.append(BenchRequest(line.rstrip("\n"), output_len))
    if not items:
        raise ConfigError(f"{path}: no prompts")
    return [items[i % len(items)] for i in range(n)]


async def _one(client: Any, url: str, body: dict[str, Any], timeout: float) -> RequestResult:
    import httpx

    res = RequestResult(start=time.perf_counter())
    try:
        await asyncio.wait_for(_stream(client, url, body, res), timeout)
    except asyncio.TimeoutError:
        res.ok, res.error = False, f"timed out after {timeout} s"
    except httpx.HTTPError as e:
        res.ok, res.error = False, f"{type(e).__name__}: {e}"
    res.e2el = time.perf_counter() - res.start
    return res


async def _stream(client: Any, url: str, body: dict[str, Any], res: RequestResult) -> None:
    last = None
    async with client.stream("POST", url, json=body) as r:
        res.status = r.status_code
        if r.status_code != 200:
            res.error = (await r.aread()).decode(errors="replace")[:200]
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                res.ok = not res.error
                return
            chunk = json.loads(data)
            if "error" in chunk:
                res.error = str(chunk["error"].get("message"))[:200]
                continue
            if chunk.get("usage"):
                res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                res.output_tokens = chunk["usage"]["completion_tokens"]
            for ch in chunk.get("choices") or []:
                text = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
                if text:
                    now = time.perf_counter()
                    if last is None:
                        res.ttft = now - res.start
                    else:
                        res.itl.append(now - last)
                    last = now


def _body(req: BenchRequest, endpoint: str, model: str | None, ignore_eos: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": req.max_tokens, "stream": True, "temperature": 0.0,
                            "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    if endpoint == "chat":
        body["messages"] = (req.prompt if isinstance(req.prompt, list)
                            else [{"role": "user", "content": req.prompt}])
    else:
        body["prompt"] = (req.prompt if isinstance(req.prompt, str)
                          else "\n".join(m["content"] for m in req.prompt))
    if model:
        body["model"] = model
    return body


async def run_benchmark(base_url: str, requests: list[BenchRequest], *, model: str | None = None,
                        endpoint: str = "completions", request_rate: float = math.inf,
                        max_concurrency: int | None = None, duration_s: float = 600.0,
                        timeout_s: float = 300.0, seed: int = 0, ignore_eos: bool = True,
                        api_key: str | None = None) -> tuple[list[RequestResult], float]:
    """Send `requests`; returns the per-request results and the wall time of the run."""
    import httpx

    url = base_url.rstrip("/") + ("/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
    rng = random.Random(seed)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limit = min(max_concurrency or len(requests), 1024)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0))

    async def go(client: Any, req: BenchRequest) -> RequestResult:
        try:
            return await _one(client, url, _body(req, endpoint, model, ignore_eos), timeout_s)
        finally:
            if sem is not None:
                sem.release()

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout, headers=headers,
                                 limits=httpx.Limits(max_connections=limit,
                                                     max_keepalive_connections=limit)) as client:
        tasks = []
        for req in requests:
            left = duration_s - (time.perf_counter() - t0)
            if left <= 0:
                break
            if sem is not None:  # take the slot here, so nothing queues past --duration
                try:
                    await asyncio.wait_for(sem.acquire(), left)
                except asyncio.TimeoutError:
                    break
            tasks.append(asyncio.create_task(go(client, req)))
            if math.isfinite(request_rate):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - t0


def _dist(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"mean": None, "median": None, "p99": None}
    a = np.asarray(xs) * 1000.0
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p99": float(np.percentile(a, 99))}


def summarize(results: list[RequestResult], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = str(r.status or r.error.split(":")[0] or "error")
            errors[key] = errors.get(key, 0) + 1
    return {
        "num_requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": errors, "duration_s": duration,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": out_tokens / duration if duration else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration else 0.0,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "ttft_ms": _dist([r.ttft for r in ok]),
        "tpot_ms": _dist([(r.e2el - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]),
        "itl_ms": _dist([x for r in ok for x in r.itl]),
        "e2el_ms": _dist([r.e2el for r in ok]),
    }


def format_table(s: dict[str, Any]) -> str:
    lines = ["| metric | value |", "|---|---|"]
    for key in ("completed", "failed", "duration_s", "request_throughput", "output_throughput",
                "total_token_throughput", "total_input_tokens", "total_output_tokens"):
        v = s[key]
        lines.append(f"| {key} | {v:.2f} |" if isinstance(v, float) else f"| {key} | {v} |")
    lines.append("| | mean / median / p99 (ms) |")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        d = s[key]
        vals = " / ".join("-" if d[k] is None else f"{d[k]:.1f}" for k in ("mean", "median", "p99"))
        lines.append(f"| {key[:-3].upper()} | {vals} |")
    if s["errors"]:
        lines.append(f"| errors | {s['errors']} |")
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default %(default)s)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--model", default=None, help="`model` field to send (default: the server's)")
    p.add_argument("--api-key", default=None, help="Bearer key, if the server wants one")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests per second, Poisson arrivals (default inf: all at once)")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument("--num-prompts", type=int, default=100, help="requests to send (default 100)")
    p.add_argument("--dataset", default="random", help="'random' or a .jsonl / text file of prompts")
    p.add_argument("--input-len", type=int, default=128, help="random prompts: words (~tokens)")
    p.add_argument("--output-len", type=int, default=64, help="max_tokens per request")
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS")
    p.add_argument("--duration", type=float, default=600.0, help="send nothing new after this many s")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the summary (and the config) as JSON here")


def run(args: argparse.Namespace) -> int:
    for name in ("num_prompts", "input_len", "output_len"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.num_prompts > 100_000:
        raise ConfigError(f"--num-prompts must be <= 100000, got {args.num_prompts}")
    if not args.request_rate > 0:
        raise ConfigError(f"--request-rate must be > 0, got {args.request_rate}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ConfigError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if not 0 < args.duration <= 86400 or not 0 < args.timeout <= 3600:
        raise ConfigError("--duration must be in (0, 86400] and --timeout in (0, 3600]")
    prepare_output(args.json, "--json")
    if args.dataset == "random":
        reqs = random_requests(args.num_prompts, args.input_len, args.output_len, args.seed)
    else:
        reqs = file_requests(args.dataset, args.num_prompts, args.output_len)
    results, duration = asyncio.run(run_benchmark(
        args.base_url, reqs, model=args.model, endpoint=args.endpoint,
        request_rate=args.request_rate, max_concurrency=args.max_concurrency,
        duration_s=args.duration, timeout_s=args.timeout, seed=args.seed,
        ignore_eos=not args.no_ignore_eos, api_key=args.api_key))
    summary = summarize(results, duration)
    print(format_table(summary), end="")
    if args.json:
        config = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "api_key"}
        config["request_rate"] = str(config["request_rate"])
        with open(args.json, "w") as f:
            json.dump({"config": config, **summary}, f, indent=1, default=str)
            f.write("\n")
    return 0 if summary["completed"] else 1

