"""Load test of `kvpack serve` on loopback: N concurrent streaming clients for a bounded time.

Starts `kvpack serve` (embedded SmolLM2-135M, CPU unless --device) on 127.0.0.1 and a free port,
runs `--concurrency` streaming clients for `--duration` seconds (some of which hang up after
their second chunk, to exercise the abort path), waits for the engine to go idle, then reports:
5xx responses, KV blocks leaked (free blocks before vs after, from /metrics), p50/p99 TTFT and
TPOT, throughput; stops the server with SIGTERM and checks it exits 0.
Writes results/serve_load.json. Traffic goes to 127.0.0.1 only.

    python benchmarks/load_test_serve.py [--duration 60] [--concurrency 64] [--kv-cache-dtype int8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from kvpack.tools.bench_serve import random_requests, run_benchmark, summarize

HOST = "127.0.0.1"  # loopback only, by design


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def metrics(url: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            if not s.labels or s.name == "kvpack_http_errors_total":
                key = s.name + (f"{{{s.labels.get('status')}}}" if s.labels else "")
                out[key] = s.value
    return out


async def hang_ups(url: str, clients: int, deadline: float, body: dict) -> dict[str, int]:
    """`clients` loops that open a stream, read two chunks and disconnect, until `deadline`."""
    counts = {"opened": 0, "status_5xx": 0, "transport_errors": 0}

    async def loop(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            counts["opened"] += 1
            try:
                async with client.stream("POST", url + "/v1/completions", json=body) as r:
                    if r.status_code >= 500:
                        counts["status_5xx"] += 1
                        await asyncio.sleep(0.1)
                        continue
                    seen = 0
                    async for line in r.aiter_lines():
                        seen += line.startswith("data: ")
                        if seen >= 2:
                            break  # leaving the block closes the connection mid-stream
            except httpx.HTTPError:
                counts["transport_errors"] += 1
                await asyncio.sleep(0.1)

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        await asyncio.gather(*(loop(c) for _ in range(clients)))
    return counts


async def load(url: str, args: argparse.Namespace) -> tuple[dict, dict]:
    hangups = max(0, round(args.concurrency * args.hangup_frac))
    reqs = random_requests(100_000, args.input_len, args.output_len, seed=0)
    deadline = time.perf_counter() + args.duration
    body = {"prompt": reqs[0].prompt, "max_tokens": args.output_len, "stream": True, "ignore_eos": True}
    (results, wall), counts = await asyncio.gather(
        run_benchmark(url, reqs, max_concurrency=args.concurrency - hangups,
                      duration_s=args.duration, timeout_s=args.timeout),
        hang_ups(url, hangups, deadline, body))
    summary = summarize(results, wall)
    summary["status_5xx"] = sum(1 for r in results if r.status >= 500) + counts["status_5xx"]
    ok = [r for r in results if r.ok]
    tpots = [(r.e2el - r.ttft) / (r.output_tokens - 1) * 1e3 for r in ok if r.output_tokens > 1]
    summary["ttft_ms"]["p50"] = float(np.percentile([r.ttft * 1e3 for r in ok], 50)) if ok else None
    summary["tpot_ms"]["p50"] = float(np.percentile(tpots, 50)) if tpots else None
    return summary, counts


def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise SystemExit(f"load test: timed out waiting for {what}")
        time.sleep(0.5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (max 600)")
    p.add_argument("--concurrency", type=int, default=64, help="streaming clients (max 512)")
    p.add_argument("--hangup-frac", type=float, default=0.125,
                   help="fraction of the clients that disconnect mid-stream")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--timeout", type=float, default=180.0, help="per-request timeout, s")
    p.add_argument("--model", default=None)
    p.add_argument("--kv-cache-dtype", default="int8")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="results/serve_load.json")
    args = p.parse_args()
    if not (0 < args.duration <= 600 and 1 <= args.concurrency <= 512 and 0 <= args.hangup_frac < 1):
        p.error("--duration in (0, 600], --concurrency in [1, 512], --hangup-frac in [0, 1)")

    port = free_port()
    url = f"http://{HOST}:{port}"
    cmd = [sys.executable, "-m", "kvpack", "serve", "--host", HOST, "--port", str(port),
           "--kv-cache-dtype", args.kv_cache_dtype, "--max-model-len", str(args.max_model_len),
           "--max-num-seqs", str(args.concurrency), "--log-level", "warning"]
    cmd += ["--model", args.model] if args.model else []
    cmd += ["--device", args.device] if args.device else []
    server = subprocess.Popen(cmd)
    try:
        def healthy() -> bool:
            if server.poll() is not None:
                raise SystemExit(f"load test: the server exited with {server.returncode}")
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 300, "the server to start")
        before = metrics(url)
        t0 = time.time()
        summary, counts = asyncio.run(load(url, args))
        idle = lambda: (lambda m: m["kvpack_num_requests_running"] == 0  # noqa: E731
                        and m["kvpack_num_requests_waiting"] == 0)(metrics(url))
        wait_until(idle, 120, "the engine to go idle")
        time.sleep(0.5)
        after = metrics(url)
        load_s = time.time() - t0
        server.send_signal(signal.SIGTERM)
        exit_code = server.wait(60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()

    free_before = int(before["kvpack_kv_cache_free_blocks"])
    free_after = int(after["kvpack_kv_cache_free_blocks"])
    server_5xx = int(sum(v for k, v in after.items() if k.startswith("kvpack_http_errors_total{5")))
    result = {
        "config": {**vars(args), "host": HOST, "server_cmd": " ".join(cmd[1:])},
        "env": {"python": platform.python_version(), "machine": platform.machine(),
                "cpus": os.cpu_count(), "commit": _commit()},
        "load_seconds": load_s,
        "requests": summary["num_requests"], "completed": summary["completed"],
        "failed": summary["failed"], "errors": summary["errors"],
        "hangup_streams_opened": counts["opened"],
        "hangup_transport_errors": counts["transport_errors"],
        "status_5xx": summary["status_5xx"], "server_5xx": server_5xx,
        "free_blocks_before": free_before, "free_blocks_after": free_after,
        "total_blocks": int(after["kvpack_kv_cache_total_blocks"]),
        "leaked_blocks": free_before - free_after,
        "ttft_ms": {"p50": summary["ttft_ms"]["p50"], "p99": summary["ttft_ms"]["p99"],
                    "mean": summary["ttft_ms"]["mean"]},
        "tpot_ms": {"p50": summary["tpot_ms"]["p50"], "p99": summary["tpot_ms"]["p99"],
                    "mean": summary["tpot_ms"]["mean"]},
        "request_throughput": summary["request_throughput"],
        "output_throughput": summary["output_throughput"],
        "server_exit_code": exit_code,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps({k: result[k] for k in ("completed", "failed", "status_5xx", "server_5xx",
                                             "leaked_blocks", "ttft_ms", "tpot_ms",
                                             "output_throughput", "server_exit_code")}, indent=1))
    bad = result["status_5xx"] or result["leaked_blocks"] or exit_code != 0
    return 1 if bad else 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
