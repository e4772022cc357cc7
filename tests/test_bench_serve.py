"""`kvpack bench serve` against the server on the test double engine (loopback only).

The fake engine takes at least `step_delay` per token, so the measured TPOT / ITL have a known
lower bound, and it always generates exactly max_tokens, so token totals are known exactly."""

from __future__ import annotations

import json
import math

import pytest
from test_server_fakes import FakeEngine, ServerThread

from kvpack.config import ConfigError
from kvpack.entrypoints.cli import main
from kvpack.entrypoints.openai.api_server import build_app
from kvpack.entrypoints.openai.launcher import make_context
from kvpack.tools.bench_serve import RequestResult, random_requests, summarize

STEP = 0.01


@pytest.fixture(scope="module")
def url():
    ctx = make_context(FakeEngine(step_delay=STEP, max_num_seqs=4), served_model_name="fake")
    with ServerThread(build_app(ctx)) as u:
        yield u


def bench(url, tmp_path, *extra) -> tuple[int, dict]:
    out = tmp_path / "bench.json"
    rc = main(["bench", "serve", "--base-url", url, "--json", str(out), "--input-len", "8",
               "--output-len", "5", *extra])
    return rc, json.loads(out.read_text())


def test_concurrency_mode_counts_and_latencies(url, tmp_path, capsys):
    rc, s = bench(url, tmp_path, "--num-prompts", "12", "--max-concurrency", "4")
    assert rc == 0 and s["completed"] == 12 and s["failed"] == 0
    assert s["total_output_tokens"] == 12 * 5
    # The fake tokenizer is byte-level with a BOS: the server's usage counts are exact.
    prompts = random_requests(12, 8, 5, seed=0)
    assert s["total_input_tokens"] == sum(len(r.prompt.encode()) + 1 for r in prompts)
    assert s["request_throughput"] == pytest.approx(12 / s["duration_s"])
    assert s["output_throughput"] == pytest.approx(60 / s["duration_s"])
    # Each token takes at least one engine step.
    assert s["tpot_ms"]["mean"] >= STEP * 1000 * 0.9 and s["itl_ms"]["median"] >= STEP * 1000 * 0.9
    assert s["ttft_ms"]["mean"] < s["e2el_ms"]["mean"]
    assert s["e2el_ms"]["p99"] >= s["e2el_ms"]["median"] >= 5 * STEP * 1000 * 0.9
    table = capsys.readouterr().out
    assert "| TTFT |" in table and "| request_throughput |" in table
    assert s["config"]["max_concurrency"] == 4


def test_rate_mode_chat_and_file_dataset(url, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "hello there"}\n\n{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}\n')
    rc, s = bench(url, tmp_path, "--num-prompts", "6", "--request-rate", "40", "--endpoint", "chat",
                  "--dataset", str(data))
    assert rc == 0 and s["completed"] == 6
    assert s["total_output_tokens"] == 3 * 5 + 3 * 3  # cycled: 5, 3, 5, 3, 5, 3
    rc, s = bench(url, tmp_path, "--num-prompts", "4", "--dataset", str(data))
    assert rc == 0 and s["completed"] == 4


def test_failures_are_counted_not_raised(tmp_path):
    ctx = make_context(FakeEngine(), served_model_name="fake")
    with ServerThread(build_app(ctx, api_key="k")) as u:
        rc, s = bench(u, tmp_path, "--num-prompts", "3")
        assert rc == 1 and s["completed"] == 0 and s["errors"] == {"401": 3}
        rc, s = bench(u, tmp_path, "--num-prompts", "3", "--api-key", "k")
        assert rc == 0 and s["completed"] == 3
        assert "api_key" not in s["config"]


def test_duration_bounds_the_run(tmp_path):
    ctx = make_context(FakeEngine(step_delay=0.05, max_num_seqs=1), served_model_name="fake")
    with ServerThread(build_app(ctx)) as u:
        rc, s = bench(u, tmp_path, "--num-prompts", "1000", "--max-concurrency", "1",
                      "--duration", "0.5")
        assert rc == 0 and 1 <= s["num_requests"] <= 3 and s["completed"] == s["num_requests"]


@pytest.mark.parametrize("args", [["--num-prompts", "0"], ["--request-rate", "0"],
                                  ["--max-concurrency", "0"], ["--duration", "-1"]])
def test_bad_arguments(args):
    from kvpack.entrypoints.cli import build_parser
    from kvpack.tools import bench_serve

    ns = build_parser().parse_args(["bench", "serve", *args])
    with pytest.raises(ConfigError):
        bench_serve.run(ns)


def test_summary_of_known_timings():
    rs = [RequestResult(ok=True, ttft=0.1, e2el=0.5, itl=[0.1] * 4, prompt_tokens=10, output_tokens=5),
          RequestResult(ok=True, ttft=0.3, e2el=0.7, itl=[0.2, 0.2], prompt_tokens=10, output_tokens=3),
          RequestResult(ok=False, status=503)]
    s = summarize(rs, 2.0)
    assert (s["completed"], s["failed"], s["errors"]) == (2, 1, {"503": 1})
    assert s["ttft_ms"]["mean"] == pytest.approx(200) and s["ttft_ms"]["median"] == pytest.approx(200)
    assert s["tpot_ms"]["mean"] == pytest.approx((100 + 200) / 2)
    assert s["itl_ms"]["median"] == pytest.approx(100)
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 4.0
    assert math.isclose(s["e2el_ms"]["p99"], 700 - 0.01 * 200, rel_tol=1e-9)
