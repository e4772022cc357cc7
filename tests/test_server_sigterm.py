"""`kvpack serve` as a subprocess (real engine, embedded model, CPU): the start-up log names the
KV format and cache size; SIGTERM stops accepting connections, ends an in-flight stream cleanly
(`finish_reason` set, then `[DONE]`), frees every KV block, and the process exits 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
from test_server_fakes import free_port


def test_sigterm_finishes_cleanly_and_exits_0(tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvpack", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--max-model-len", "256", "--max-num-seqs", "4", "--kv-cache-dtype", "int8",
         "--shutdown-grace", "1.5", "--served-model-name", "smol"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 150
        while True:
            assert proc.poll() is None, open(tmp_path / "serve.log").read()
            assert time.time() < deadline, "server did not come up"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        text = open(tmp_path / "serve.log").read()
        m = re.search(r"KV cache: K=int8 V=int8, (\d+) blocks x (\d+) tokens = (\d+) tokens, "
                      r"([\d.]+) GiB", text)
        assert m and int(m[1]) * int(m[2]) == int(m[3]) and float(m[4]) > 0, text

        events: list = []
        got_two = threading.Event()

        def stream():
            body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 240,
                    "ignore_eos": True, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        if len(events) == 2:
                            got_two.set()

        th = threading.Thread(target=stream)
        th.start()
        assert got_two.wait(60)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.6)
        try:  # no longer accepting
            httpx.get(url + "/health", timeout=2)
            accepted = True
        except httpx.TransportError:
            accepted = False
        th.join(60)
        assert proc.wait(60) == 0
        assert not accepted
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])["choices"][0]
        assert last["finish_reason"] in ("abort", "length")
        text = open(tmp_path / "serve.log").read()
        m = re.search(r"engine stopped: (\d+) of (\d+) KV blocks free", text)
        assert m and m[1] == m[2], text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
