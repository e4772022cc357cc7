"""The OpenAI server over a test double engine (tests/test_server_fakes.py): response shapes,
streaming, every bad-request class, auth, body limits, disconnect aborts, overload, graceful
shutdown, metrics. The fake's output is deterministic, so texts are checked exactly.
The same server on the real engine: tests/test_server_e2e.py."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from test_server_fakes import FakeEngine, ServerThread, free_port

from kvpack.entrypoints.openai.api_server import build_app
from kvpack.entrypoints.openai.launcher import GracefulServer, make_context


def serve(engine=None, *, max_queue=None, api_key=None, max_body_bytes=64 * 1024):
    engine = engine or FakeEngine()
    ctx = make_context(engine, served_model_name="fake", model="/models/fake.gguf",
                       max_queue=max_queue)
    return ServerThread(build_app(ctx, api_key=api_key, max_body_bytes=max_body_bytes)), ctx


def expected(prompt: str, k: int) -> str:
    """The fake's continuation: letters after the one following the prompt's last byte."""
    start = prompt.encode()[-1] % 26 + 1
    return "".join(chr(ord("a") + (start + i) % 26) for i in range(k))


def chat_prompt_last(messages) -> str:
    return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


def wait_idle(engine: FakeEngine, timeout: float = 5.0) -> None:
    deadline = time.time() + timeout
    while engine.has_unfinished_requests() and time.time() < deadline:
        time.sleep(0.01)


def sse_events(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine()
    st, ctx = serve(engine)
    with st as url:
        yield url, engine, ctx


def test_openai_client_completions_and_chat(server):
    url, engine, _ = server
    c = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    r = c.completions.create(model="fake", prompt="hello", max_tokens=5)
    assert r.object == "text_completion" and r.model == "fake" and r.id.startswith("cmpl-")
    assert r.choices[0].text == expected("hello", 5) and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (6, 5, 11)

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model="fake", messages=msgs, max_completion_tokens=4, n=2)
    want = expected(chat_prompt_last(msgs), 4)
    assert [ch.message.content for ch in r.choices] == [want, want]
    assert [ch.index for ch in r.choices] == [0, 1] and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens == len(chat_prompt_last(msgs))

    chunks = list(c.completions.create(model="fake", prompt="abc", max_tokens=6, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == expected("abc", 6)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6

    chunks = list(c.chat.completions.create(model="fake", messages=msgs, max_tokens=3, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == expected(chat_prompt_last(msgs), 3)
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage is None
    assert [m.id for m in c.models.list().data] == ["fake"]
    parts = [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]
    r = c.chat.completions.create(model="fake", messages=parts, max_tokens=2)
    assert r.choices[0].message.content == expected(chat_prompt_last([{"role": "user", "content": "hi"}]), 2)


def test_raw_sse_format_and_done(server):
    url, _, _ = server
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": "xy", "max_tokens": 3,
                                                             "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    blocks = raw.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"
    assert all(b.startswith("data: ") for b in blocks[:-1])


def test_completions_batch_n_echo_logprobs_stop_seed(server):
    url, _, _ = server
    r = httpx.post(url + "/v1/completions", json={"model": "/models/fake.gguf", "prompt": ["ab", "q"],
                                                  "n": 2, "max_tokens": 3, "echo": True, "seed": 7})
    body = r.json()
    assert r.status_code == 200, body
    assert [c["text"] for c in body["choices"]] == ["ab" + expected("ab", 3)] * 2 + ["q" + expected("q", 3)] * 2
    assert body["usage"]["prompt_tokens"] == 3 + 2  # each prompt once, with BOS
    # Token-id prompt, logprobs.
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 100, 101], "max_tokens": 2, "logprobs": 2})
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == list(r.json()["choices"][0]["text"])
    assert lp["token_logprobs"] == [-0.5, -0.5] and len(lp["top_logprobs"][0]) == 2
    assert lp["text_offset"] == [0, 1]
    # Stop string: cut before it, and never partly streamed.
    text = expected("hello", 10)
    stop = text[4:6]
    r = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 10, "stop": stop})
    assert r.json()["choices"][0]["text"] == text[:4] and r.json()["choices"][0]["finish_reason"] == "stop"
    with httpx.stream("POST", url + "/v1/completions", json={
            "prompt": "hello", "max_tokens": 10, "stop": [stop], "stream": True}) as s:
        events = sse_events(s.iter_lines())
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text[:4]


BAD = [
    ("completions", "{", "malformed JSON"),
    ("completions", "", "empty"),
    ("completions", "[1, 2]", "JSON object"),
    ("completions", '{"prompt": "x", "temperature": -0.1}', "temperature"),
    ("completions", '{"prompt": "x", "temperature": "hot"}', "temperature"),
    ("completions", '{"prompt": "x", "top_p": 0}', "top_p"),
    ("completions", '{"prompt": "x", "top_p": 1.5}', "top_p"),
    ("completions", '{"prompt": "x", "max_tokens": -1}', "max_tokens"),
    ("completions", '{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    ("completions", '{"prompt": "x", "max_tokens": 1000000}', "max_tokens"),
    ("completions", '{"prompt": "x", "max_tokens": 2.5}', "max_tokens"),
    ("completions", '{"prompt": "x", "n": 0}', "n"),
    ("completions", '{"prompt": "x", "n": 1000}', "n"),
    ("completions", '{"prompt": "x", "logprobs": 21}', "logprobs"),
    ("completions", '{"prompt": "x", "top_k": -5}', "top_k"),
    ("completions", '{"prompt": "x", "stop": ["a", ""]}', "stop"),
    ("completions", '{"prompt": "x", "seed": -1}', "seed"),
    ("completions", '{"prompt": "x", "stream": "yes"}', "stream"),
    ("completions", '{"prompt": "x", "frequency_penalty": 0.5}', "frequency_penalty"),
    ("completions", '{"max_tokens": 3}', "prompt"),
    ("completions", '{"prompt": ""}', "prompt"),
    ("completions", '{"prompt": []}', "prompt"),
    ("completions", '{"prompt": [1, 99999]}', "prompt"),
    ("completions", '{"prompt": [1, -3]}', "prompt"),
    ("completions", '{"prompt": "' + "z" * 300 + '"}', "prompt"),
    ("completions", '{"prompt": "' + "z" * 250 + '", "max_tokens": 10}', "max_tokens"),
    ("completions", '{"prompt": "x", "echo": true, "logprobs": 1}', "echo"),
    ("chat/completions", '{"model": "fake"}', "messages"),
    ("chat/completions", '{"messages": []}', "messages"),
    ("chat/completions", '{"messages": [{"role": "wizard", "content": "x"}]}', "messages"),
    ("chat/completions", '{"messages": [{"role": "user", "content": 5}]}', "messages"),
    ("chat/completions", '{"messages": "hi"}', "messages"),
    ("chat/completions", '{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', "top_logprobs"),
    ("chat/completions", '{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 50}', "logprobs"),
    ("chat/completions", '{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}', "max_tokens"),
]


@pytest.mark.parametrize("route,body,needle", BAD, ids=[f"{r}:{b[:40]}" for r, b, _ in BAD])
def test_bad_request_is_400_then_server_still_serves(server, route, body, needle):
    url, _, _ = server
    r = httpx.post(f"{url}/v1/{route}", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert needle in err["message"] or needle == err["param"], err
    ok = httpx.post(f"{url}/v1/completions", json={"prompt": "ok", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == expected("ok", 2)


def test_unknown_model_route_method(server):
    url, _, _ = server
    r = httpx.post(url + "/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(url + "/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(url + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
    assert httpx.get(url + "/v1/models/fake").status_code == 200
    assert httpx.get(url + "/v1/models/gpt-9").status_code == 404
    assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200


def test_api_key():
    st, _ = serve(api_key="s3cret")
    with st as url:
        body = {"prompt": "x", "max_tokens": 1}
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):
            r = httpx.post(url + "/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/health").status_code == 200  # open, for probes
        assert httpx.get(url + "/metrics").status_code == 200
        r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        c = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            c.completions.create(model="fake", prompt="x", max_tokens=1)
        c = openai.OpenAI(base_url=url + "/v1", api_key="s3cret")
        assert c.completions.create(model="fake", prompt="x", max_tokens=1).choices[0].text


def test_body_too_large_by_header_and_by_stream():
    st, _ = serve(max_body_bytes=2048)
    with st as url:
        big = json.dumps({"prompt": "y" * 4000, "max_tokens": 1}).encode()
        r = httpx.post(url + "/v1/completions", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

        def chunks():  # no Content-Length: chunked transfer encoding
            for i in range(0, len(big), 512):
                yield big[i:i + 512]

        r = httpx.post(url + "/v1/completions", content=chunks())
        assert r.status_code == 413, r.text
        r = httpx.post(url + "/v1/completions", json={"prompt": "y" * 100, "max_tokens": 1})
        assert r.status_code == 200


def test_disconnect_mid_stream_aborts_and_frees_blocks():
    # Each request stops after 5 tokens and holds its blocks: only an abort can free them, so the
    # checks below do not depend on how fast this process runs (under load a 200-token request
    # once ran to its end before the client had read 3 events, and held no blocks to check).
    engine = FakeEngine(step_delay=0.02, hold_after=5)
    st, ctx = serve(engine)
    with st as url:
        free0 = engine.num_free_blocks
        with httpx.stream("POST", url + "/v1/completions", json={
                "prompt": "hello", "max_tokens": 200, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    assert json.loads(line[6:])["choices"][0]["text"]
                    break
            assert engine.num_free_blocks < free0  # the request holds blocks mid-stream
        wait_idle(engine)
        assert not engine.has_unfinished_requests()  # aborted: held requests never finish
        assert engine.aborted == [engine.added[0]] and engine.num_free_blocks == free0
        # A non-streaming request whose client gives up is aborted too.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 200}, timeout=0.3)
        wait_idle(engine)
        assert engine.aborted == engine.added[:2] and engine.num_free_blocks == free0
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        assert ctx.engine.num_waiting == 0


def _start_stream(url: str, results: dict, key: str, max_tokens: int = 30) -> threading.Thread:
    def go():
        with httpx.stream("POST", url + "/v1/completions", json={
                "prompt": "p", "max_tokens": max_tokens, "stream": True}, timeout=30) as r:
            results[key] = (r.status_code, sse_events(r.iter_lines()))

    t = threading.Thread(target=go)
    t.start()
    return t


def _wait(cond, timeout=5.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.mark.parametrize("max_queue", [1, None])
def test_max_queue_rejects_at_once_else_waits(max_queue):
    engine = FakeEngine(max_num_seqs=1, step_delay=0.02)
    st, ctx = serve(engine, max_queue=max_queue)
    with st as url:
        results: dict = {}
        a = _start_stream(url, results, "a")
        _wait(lambda: len(engine.running) == 1 and ctx.engine.num_waiting == 0)
        b = _start_stream(url, results, "b")  # waits behind a (one sequence at a time)
        _wait(lambda: ctx.engine.num_waiting == 1)
        t0 = time.time()
        r = httpx.post(url + "/v1/completions", json={"prompt": "c", "max_tokens": 2}, timeout=30)
        if max_queue is None:
            assert r.status_code == 200 and time.time() - t0 > 0.5  # waited for a and b
        else:
            assert r.status_code == 503 and time.time() - t0 < 0.5
            assert r.json()["error"]["code"] == "server_overloaded"
        a.join(), b.join()
        assert results["a"][0] == results["b"][0] == 200 and results["b"][1][-1] == "[DONE]"
        metrics = httpx.get(url + "/metrics").text
        assert f"kvpack_request_rejected_overload_total {1.0 if max_queue else 0.0}" in metrics
        assert httpx.post(url + "/v1/completions", json={"prompt": "c", "max_tokens": 2}).status_code == 200


class _Broken(FakeEngine):
    def __init__(self):
        super().__init__()
        self.fail_next_step = False

    def add_request(self, request_id, prompt, params):
        if len(prompt) > 3 and prompt[-1] == ord("!") + 3:
            from kvpack.config import ConfigError
            raise ConfigError("the engine refuses prompts ending in '!'")
        super().add_request(request_id, prompt, params)

    def step(self):
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("boom")
        return super().step()


def test_engine_errors_become_http_errors_and_serving_continues():
    engine = _Broken()
    st, ctx = serve(engine)
    with st as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": "go!", "max_tokens": 2})
        assert r.status_code == 400 and "refuses" in r.json()["error"]["message"]
        engine.fail_next_step = True
        r = httpx.post(url + "/v1/completions", json={"prompt": "go", "max_tokens": 2})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert ctx.engine.step_errors == 1
        r = httpx.post(url + "/v1/completions", json={"prompt": "go", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected("go", 2)


def test_metrics_parse_and_count(server):
    url, engine, _ = server
    before = _metrics(url)
    httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 4, "n": 2})
    httpx.post(url + "/v1/completions", json={"prompt": "abc", "temperature": -1})
    wait_idle(engine)
    after = _metrics(url)
    assert after["kvpack_generation_tokens_total"] - before.get("kvpack_generation_tokens_total", 0) == 8
    assert after["kvpack_prompt_tokens_total"] - before.get("kvpack_prompt_tokens_total", 0) == 4
    key = 'kvpack_request_success_total{finished_reason="length"}'
    assert after[key] - before.get(key, 0) == 2
    assert after['kvpack_http_errors_total{status="400"}'] >= 1
    assert after["kvpack_kv_cache_free_blocks"] == engine.num_blocks
    assert after["kvpack_kv_cache_usage_ratio"] == 0.0 and after["kvpack_num_requests_running"] == 0
    for name in ("kvpack_num_requests_waiting", "kvpack_prefix_cache_hit_rate",
                 "kvpack_num_preemptions_total", "kvpack_server_requests_waiting"):
        assert name in after
    info = [k for k in after if k.startswith("kvpack_kv_cache_format_info")]
    assert info and 'k_format="int8"' in info[0] and 'v_format="int4"' in info[0]


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def test_graceful_shutdown_aborts_after_grace_and_ends_streams_cleanly():
    engine = FakeEngine(step_delay=0.02)
    ctx = make_context(engine, served_model_name="fake")
    port = free_port()
    config = uvicorn.Config(build_app(ctx), host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=10)
    server = GracefulServer(config, ctx, grace_s=1.0)
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    _wait(lambda: server.started)
    url = f"http://127.0.0.1:{port}"
    results: dict = {}
    short = _start_stream(url, results, "short", max_tokens=10)
    long = _start_stream(url, results, "long", max_tokens=200)
    _wait(lambda: len(engine.running) == 2)
    server.should_exit = True
    short.join(10), long.join(10)
    th.join(10)
    assert not th.is_alive()
    assert results["short"][1][-2]["choices"][0]["finish_reason"] == "length"  # finished in grace
    events = results["long"][1]
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "abort"
    assert engine.num_free_blocks == engine.num_blocks and not engine.has_unfinished_requests()


def test_slow_consumer_costs_one_pending_output_per_choice():
    """Outputs are cumulative: a consumer that does not read holds at most one queued
    notification and one output per choice, and still gets the whole text."""
    import asyncio

    from kvpack.entrypoints.openai.async_engine import AsyncEngine
    from kvpack.sampling_params import SamplingParams

    engine = FakeEngine(step_delay=0.002)
    ae = AsyncEngine(engine)
    ids = engine.tokenizer.encode("slow")

    async def main():
        ae.start()
        group = ae.submit("g", [ids, ids], [SamplingParams(max_tokens=60)] * 2)
        await asyncio.sleep(0.02)
        _wait_async = time.time() + 10
        while engine.has_unfinished_requests() and time.time() < _wait_async:
            await asyncio.sleep(0.01)
        assert not engine.has_unfinished_requests()
        assert group.queue.qsize() <= 2 and len(group.latest) <= 2
        texts = {}
        async for kind, index, out in ae.results(group):
            texts[index] = out.text
        return texts

    try:
        texts = asyncio.run(main())
    finally:
        ae.shutdown()
    assert texts == {0: expected("slow", 60), 1: expected("slow", 60)}
    assert ae.num_active == 0 and ae.num_waiting == 0


def test_dead_engine_thread_fails_requests_and_health():
    class Dying(FakeEngine):
        def has_unfinished_requests(self):
            if self.added:
                raise SystemError("driver bug")
            return False

    st, ctx = serve(Dying())
    with st as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 500 and "died" in r.json()["error"]["message"]
        assert httpx.get(url + "/health").status_code == 503
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503


@pytest.mark.parametrize("kw", [dict(port=70000), dict(max_queue=0), dict(max_body_bytes=10),
                                dict(shutdown_grace_s=-1), dict(api_key=" "), dict(log_level="loud")])
def test_server_config_rejects_bad_values(kw):
    from kvpack.config import ConfigError
    from kvpack.entrypoints.openai.launcher import ServerConfig

    with pytest.raises(ConfigError):
        ServerConfig(**kw)


def test_cli_fails_fast_on_bad_flags(capsys):
    from kvpack.entrypoints.cli import main

    assert main(["serve", "--max-queue", "0"]) == 2  # before any model is loaded
    assert "--max-queue must be >= 1" in capsys.readouterr().err
