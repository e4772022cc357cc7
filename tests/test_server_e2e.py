"""Acceptance: `kvpack serve`'s app on the REAL engine (embedded SmolLM2-135M GGUF, CPU, int8 KV
cache), driven by the official `openai` client and raw httpx.

Oracle: greedy output through the server equals greedy output of the same engine called
directly (same prompt ids, same params); streamed deltas join to the non-streamed text; usage
equals the token counts; KV blocks all come back after a client disconnects mid-stream.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_server_fakes import ServerThread

from kvpack.entrypoints.openai.api_server import build_app
from kvpack.entrypoints.openai.launcher import make_context
from kvpack.sampling_params import SamplingParams

MAX_MODEL_LEN = 256
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def engine():
    from kvpack.engine.llm_engine import LLMEngine

    return LLMEngine.from_args(kv_cache_dtype="int8", max_model_len=MAX_MODEL_LEN, max_num_seqs=4,
                               log_stats=False)


def direct(engine, prompt, max_tokens: int) -> tuple[str, list[int]]:
    """The oracle: the engine without the server (greedy)."""
    engine.add_request("oracle", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    out = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            out = o
    return out.text, list(out.token_ids)


@pytest.fixture(scope="module")
def oracle(engine):
    tok = engine.tokenizer
    chat_ids = tok.encode(tok.apply_chat_template(MESSAGES, add_generation_prompt=True),
                          add_special_tokens=False)
    # Computed before any server starts: only the server's engine thread may touch the engine then.
    return {"completion": direct(engine, tok.encode(PROMPT), 6), "chat": direct(engine, chat_ids, 5),
            "three": direct(engine, tok.encode(PROMPT), 3),
            "prompt_len": len(tok.encode(PROMPT)), "chat_len": len(chat_ids)}


@pytest.fixture(scope="module")
def server(engine, oracle):
    ctx = make_context(engine, served_model_name="smollm2")
    with ServerThread(build_app(ctx)) as url:
        yield url, ctx


def test_openai_client_plain_and_streaming(server, oracle):
    url, _ = server
    c = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    text, ids = oracle["completion"]
    r = c.completions.create(model="smollm2", prompt=PROMPT, max_tokens=6, temperature=0)
    assert r.choices[0].text == text and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (oracle["prompt_len"], len(ids))

    chunks = list(c.completions.create(model="smollm2", prompt=PROMPT, max_tokens=6, temperature=0,
                                       stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text
    assert chunks[-1].usage.completion_tokens == len(ids)

    chat_text, chat_ids = oracle["chat"]
    r = c.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5, temperature=0)
    assert r.choices[0].message.content == chat_text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (oracle["chat_len"], len(chat_ids))
    chunks = list(c.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5,
                                            temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == chat_text


def test_logprobs_match_engine_and_raw_token_prompt(server, oracle, engine):
    url, _ = server
    ids = engine.tokenizer.encode(PROMPT)
    r = httpx.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": 3, "temperature": 0,
                                                  "logprobs": 2}, timeout=60).json()
    lp = r["choices"][0]["logprobs"]
    assert r["choices"][0]["text"] == oracle["three"][0]
    assert len(lp["tokens"]) == 3 and all(len(t) == 2 for t in lp["top_logprobs"])
    # Greedy: the chosen token is the most likely one.
    for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert chosen == pytest.approx(max(top.values()))


def test_bad_requests_then_good(server):
    url, _ = server
    too_long = " ".join(["word"] * (MAX_MODEL_LEN + 10))
    cases = [
        ({"prompt": too_long, "max_tokens": 1}, "prompt"),
        ({"prompt": PROMPT, "max_tokens": MAX_MODEL_LEN + 1}, "max_tokens"),
        ({"prompt": PROMPT, "temperature": -1}, "temperature"),
        ({"prompt": [0, 10 ** 9]}, "prompt"),
    ]
    for body, param in cases:
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(url + "/v1/completions", json={"model": "gpt-4", "prompt": "x"})
    assert r.status_code == 404
    r = httpx.post(url + "/v1/chat/completions", content=b'{"messages": [', timeout=30)
    assert r.status_code == 400
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def _wait_idle(ctx, engine, timeout=30.0):
    deadline = time.time() + timeout
    while (engine.has_unfinished_requests() or ctx.engine.num_waiting) and time.time() < deadline:
        time.sleep(0.05)


def test_disconnect_mid_stream_frees_blocks(server, engine, monkeypatch):
    url, ctx = server
    _wait_idle(ctx, engine)
    # Each engine step then waits 20 ms, so the 200 tokens take >= 4 s and the request is still running when the client
    # has read 2 of them. Unpaced, the 135M model could finish all 200 before a client on a busy CPU read its second
    # line: CI saw the blocks already free mid-stream (sessions 32 and 34).
    step = engine.step

    def paced_step():
        out = step()
        time.sleep(0.02)
        return out

    monkeypatch.setattr(engine, "step", paced_step)
    free0 = engine.num_free_blocks
    gen0 = engine.counters["generation_tokens"]
    with httpx.stream("POST", url + "/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 200, "stream": True, "ignore_eos": True},
            timeout=60) as r:
        seen = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(line)
            if len(seen) == 2:
                break
        assert engine.num_free_blocks < free0, (engine.num_free_blocks, free0, seen, engine.stats())
    _wait_idle(ctx, engine)
    assert not engine.has_unfinished_requests()
    # aborted, not run to 200 tokens (a token count, not wall time: the test may share the CPU)
    assert engine.counters["generation_tokens"] - gen0 < 200
    assert engine.num_free_blocks == free0


def test_metrics_real_engine(server, engine):
    url, ctx = server
    _wait_idle(ctx, engine)
    httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=60)
    time.sleep(0.2)  # the engine thread refreshes its snapshot after the step
    samples = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            samples[s.name] = (s.labels, s.value)
    assert samples["kvpack_kv_cache_free_blocks"][1] == engine.num_free_blocks == engine.num_total_blocks
    assert samples["kvpack_kv_cache_total_blocks"][1] == engine.num_total_blocks
    assert samples["kvpack_kv_cache_usage_ratio"][1] == 0.0
    assert samples["kvpack_generation_tokens_total"][1] >= 2
    labels = samples["kvpack_kv_cache_format_info"][0]
    assert labels["k_format"] == labels["v_format"] == "int8"
    for name in ("kvpack_num_requests_running", "kvpack_num_requests_waiting",
                 "kvpack_prefix_cache_hit_rate", "kvpack_num_preemptions_total",
                 "kvpack_prompt_tokens_total", "kvpack_request_success_total"):
        assert name in samples


def test_max_queue_503_under_a_burst(server):
    # The same server (one engine thread per engine), with --max-queue 1 for this test.
    url, ctx = server
    ctx.engine.max_queue = 1

    async def burst():
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"prompt": PROMPT, "max_tokens": 3, "stream": True}

            async def one():
                async with client.stream("POST", url + "/v1/completions", json=body) as r:
                    text = await r.aread()
                    return r.status_code, text.decode()
            return await asyncio.gather(*(one() for _ in range(8)))

    try:
        results = asyncio.run(burst())
    finally:
        ctx.engine.max_queue = None
    codes = [c for c, _ in results]
    assert codes.count(503) >= 1 and codes.count(200) >= 1, codes
    for code, text in results:
        if code == 503:
            assert '"server_overloaded"' in text
        else:
            assert text.endswith("data: [DONE]\n\n")
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
