"""Test doubles for the server tests: `FakeEngine` has LLMEngine's API (docs/structures.md,
"Engine API") with deterministic output and a block pool, so the server's error handling,
streaming, disconnect and overload paths can be tested fast and exactly. It is not the engine:
the acceptance tests (test_server_e2e.py) run the real LLMEngine on the embedded model.

Also: `ServerThread`, a uvicorn server in a background thread on a free loopback port.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn

BOS, EOS, OFFSET = 1, 2, 3  # byte b is token b + OFFSET


class FakeTokenizer:
    vocab_size = 256 + OFFSET
    eos_token_ids = (EOS,)
    bos_token_id = BOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([BOS] if add_special_tokens else []) + [b + OFFSET for b in text.encode()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode(errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@dataclass
class FakeOutput:
    request_id: str
    prompt: Any
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    logprobs: list[dict[int, float]] | None


class _Req:
    def __init__(self, rid: str, ids: list[int], params: Any):
        self.rid, self.ids, self.params = rid, ids, params
        self.out: list[int] = []
        self.blocks = 0


class FakeEngine:
    """Generates the alphabet from the letter after the prompt's last byte, one token per step
    per running request; at most `max_num_seqs` run, the rest wait; each running request holds
    ceil(len / block_size) blocks of `num_blocks`. `step_delay` paces the steps. With `hold_after`
    = k a request stops after its k-th token and holds its blocks until it is aborted, so a test
    of the abort path does not race the request's natural end."""

    def __init__(self, *, num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 4,
                 max_model_len: int = 256, step_delay: float = 0.01, hold_after: int | None = None):
        self.tokenizer = FakeTokenizer()
        self.max_model_len = max_model_len
        self.num_blocks, self.block_size, self.max_num_seqs = num_blocks, block_size, max_num_seqs
        self.step_delay = step_delay
        self.hold_after = hold_after
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.used_blocks = 0
        self.aborted: list[str] = []
        self.added: list[str] = []

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.used_blocks

    def add_request(self, request_id: str, prompt: str | list[int], params: Any) -> None:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.added.append(request_id)
        self.waiting.append(_Req(request_id, ids, params))

    def abort_request(self, request_id: str) -> None:
        self.aborted.append(request_id)
        for q in (self.waiting, self.running):
            for r in list(q):
                if r.rid == request_id:
                    q.remove(r)
                    self.used_blocks -= r.blocks

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def stats(self) -> dict[str, Any]:
        return {"num_running": len(self.running), "num_waiting": len(self.waiting),
                "kv_cache_usage": self.used_blocks / self.num_blocks, "num_preemptions": 0,
                "prefix_cache_hit_rate": 0.0, "num_total_blocks": self.num_blocks}

    def kv_cache_info(self) -> dict[str, Any]:
        return {"k_format": "int8", "v_format": "int4", "block_size": self.block_size,
                "num_blocks": self.num_blocks, "bytes": self.num_blocks * 1024}

    def _blocks(self, r: _Req) -> int:
        return -(-(len(r.ids) + len(r.out) + 1) // self.block_size)

    def step(self) -> list[FakeOutput]:
        time.sleep(self.step_delay)
        while self.waiting and len(self.running) < self.max_num_seqs:
            r = self.waiting[0]
            need = self._blocks(r)
            if need > self.num_free_blocks:
                break
            self.waiting.pop(0)
            r.blocks, self.used_blocks = need, self.used_blocks + need
            self.running.append(r)
        outs = []
        for r in list(self.running):
            if self.hold_after is not None and len(r.out) >= self.hold_after:
                continue  # held: no output, blocks kept, until abort_request
            start = (r.ids[-1] - OFFSET) % 26 + 1
            tid = ord("a") + (start + len(r.out)) % 26 + OFFSET
            r.out.append(tid)
            need = self._blocks(r)
            self.used_blocks += need - r.blocks
            r.blocks = need
            text = self.tokenizer.decode(r.out)
            reason = None
            for s in r.params.stop_strings:
                if s in text:
                    text, reason = text[:text.index(s)], "stop"
            if reason is None and len(r.out) >= r.params.max_tokens:
                reason = "length"
            lps = None
            if r.params.logprobs is not None:
                lps = [{t: -0.5 - 0.1 * j for j, t in enumerate([o, o + 1, o + 2][:max(1, r.params.logprobs)])}
                       for o in r.out]
            outs.append(FakeOutput(r.rid, None, r.ids, text, list(r.out), reason is not None,
                                   reason, lps))
            if reason is not None:
                self.running.remove(r)
                self.used_blocks -= r.blocks
        return outs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn on 127.0.0.1:<free port> in a daemon thread; `with ServerThread(app) as url:`."""

    def __init__(self, app: Any):
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)
