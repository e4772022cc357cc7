"""`kvpack bench capacity | throughput | latency` on CPU: tables, JSON keys and values.

Oracles: capacity against hand arithmetic from the format definition and `kv_bytes_per_token`;
throughput's token counts against the seeded workload it must have run; blocks all free at the end
even when a tiny pool forces preemptions.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from kvpack.config import CacheConfig, ConfigError
from kvpack.entrypoints.cli import main
from kvpack.formats import kv_bytes_per_token
from kvpack.attention.kv_cache import resolve_kv_formats
from kvpack.models.presets import preset_config
from kvpack.tools.bench_common import LenRange, format_table, parse_format_list, parse_len_range, random_prompts

_spec = importlib.util.spec_from_file_location(
    "summarize_step_log", os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "summarize_step_log.py"))
summarize_step_log = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summarize_step_log)
_spec = importlib.util.spec_from_file_location(
    "simulate_schedule", os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "simulate_schedule.py"))
simulate_schedule = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(simulate_schedule)
_spec = importlib.util.spec_from_file_location(
    "plot_kv_budget", os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "plot_kv_budget.py"))
plot_kv_budget = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot_kv_budget)


def _run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---- capacity -----------------------------------------------------------------------------------

def test_capacity_json_matches_format_definition(tmp_path, capsys):
    path = tmp_path / "cap.json"
    rc, out, _ = _run(capsys, ["bench", "capacity", "--model", "llama-3.1-8b", "--kv-cache-memory", "8GiB",
                               "--kv-cache-dtype", "bfloat16,int8,int4,fp8,int4/int8", "--json", str(path)])
    assert rc == 0 and "KV cache tokens" in out and "int4" in out
    rows = json.loads(path.read_text())
    assert isinstance(rows, list) and [r["kv_cache_dtype"] for r in rows] == [
        "bfloat16", "int8", "int4", "fp8_e4m3", "int4/int8"]
    mc = preset_config("llama-3.1-8b")
    budget = 8 * 2**30
    for r in rows:
        assert {"kv_cache_dtype", "tokens", "bytes_per_token", "capacity_vs_bf16"} <= set(r)
        k, _, v = r["kv_cache_dtype"].partition("/")
        cc = CacheConfig(kv_cache_dtype=k, v_cache_dtype=v or None)
        bpt = kv_bytes_per_token(mc, *resolve_kv_formats(mc, cc, torch.bfloat16))
        assert r["bytes_per_token"] == bpt
        assert r["tokens"] == budget // (bpt * 16) * 16
    by = {r["kv_cache_dtype"]: r for r in rows}
    hand = {"bfloat16": 32 * 8 * 2 * 256, "int8": 32 * 8 * 2 * 130, "int4": 32 * 8 * 2 * 80}
    for name, bpt in hand.items():
        assert by[name]["bytes_per_token"] == bpt
    assert by["bfloat16"]["capacity_vs_bf16"] == 1.0
    assert by["int8"]["capacity_vs_bf16"] == pytest.approx(256 / 130, rel=0.01)
    assert by["int4"]["capacity_vs_bf16"] == pytest.approx(3.2, rel=0.01)


def test_capacity_int4_one_group_per_head(tmp_path, capsys):
    """--int4-group-size 128 at head_dim 128: 64 code bytes + one fp16 scale and zero = 68 bytes per
    token and head, 256 / 68 = 3.765x bf16."""
    rc, out, _ = _run(capsys, ["bench", "capacity", "--model", "llama-3.1-8b", "--kv-cache-memory", "8GiB",
                               "--kv-cache-dtype", "bfloat16,int4", "--int4-group-size", "128", "--json"])
    rows = json.loads(out)
    assert rc == 0 and rows[1]["bytes_per_token"] == 32 * 8 * 2 * 68
    assert rows[1]["capacity_vs_bf16"] == pytest.approx(256 / 68, rel=0.01)
    with pytest.raises(SystemExit):
        main(["bench", "capacity", "--int4-group-size", "16"])
    with pytest.raises(ConfigError, match="group size"):
        CacheConfig(int4_group_size=16)


def test_capacity_from_hf_config_and_stdout_json(tmp_path, capsys):
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 640,
           "intermediate_size": 1280, "num_hidden_layers": 3, "num_attention_heads": 8,
           "num_key_value_heads": 2, "max_position_embeddings": 1024}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc, out, _ = _run(capsys, ["bench", "capacity", "--model", str(tmp_path), "--kv-cache-memory", "1MiB",
                               "--kv-cache-dtype", "bf16,int4", "--json"])
    rows = json.loads(out)
    assert rc == 0 and rows[0]["bytes_per_token"] == 3 * 2 * 2 * 80 * 2  # head_dim 80
    # int4 at head_dim 80: groups of 16 -> 40 code bytes + 5 groups * (scale + zero) 4 bytes
    assert rows[1]["bytes_per_token"] == 3 * 2 * 2 * (40 + 5 * 4)
    assert rows[1]["tokens"] == 2**20 // (rows[1]["bytes_per_token"] * 16) * 16


def test_capacity_bad_input(capsys):
    rc, _, err = _run(capsys, ["bench", "capacity", "--kv-cache-dtype", "int9"])
    assert rc == 2 and "int9" in err
    for mode in ("capacity", "throughput"):  # the usage error says what a memory size looks like
        with pytest.raises(SystemExit):
            main(["bench", mode, "--kv-cache-memory", "lots"])
        err = capsys.readouterr().err
        assert "--kv-cache-memory: bad memory size 'lots'" in err and "8GiB" in err, err


# ---- helpers ------------------------------------------------------------------------------------

def test_len_range_and_formats():
    assert parse_len_range("128") == LenRange(128, 128)
    assert parse_len_range("2048:8192") == LenRange(2048, 8192)
    for bad in ("0", "9:3", "a:b", "1:2:3"):
        with pytest.raises(Exception):
            parse_len_range(bad)
    assert parse_format_list("bf16, int8,int4/fp8") == ["bfloat16", "int8", "int4/fp8_e4m3"]
    w = random_prompts(50, LenRange(5, 9), LenRange(2, 3), 512, seed=1)
    assert w == random_prompts(50, LenRange(5, 9), LenRange(2, 3), 512, seed=1)
    assert {len(ids) for ids, _ in w} <= set(range(5, 10)) and {o for _, o in w} == {2, 3}
    table = format_table([{"a": 1, "b": 2.5}], [("a", "A", "d"), ("b", "B", ".1f")])
    assert table.splitlines()[2] == "| 1 | 2.5 |"


# ---- throughput and latency on a tiny preset ------------------------------------------------------

def test_throughput_tiny_with_preemption(tmp_path, capsys):
    path = tmp_path / "tp.json"
    argv = ["bench", "throughput", "--model", "tiny-llama", "--dtype", "float32", "--device", "cpu",
            "--num-prompts", "6", "--input-len", "30:32", "--output-len", "4:6", "--num-blocks", "8",
            "--kv-cache-dtype", "bfloat16,int8", "--warmup-requests", "1", "--seed", "3",
            "--output-json", str(path), "--step-log", str(tmp_path / "logs" / "steps")]
    rc, out, _ = _run(capsys, argv)
    assert rc == 0
    assert "output tok/s" in out and "| bfloat16 |" in out and "|     int8 |" in out
    payload = json.loads(path.read_text())
    assert payload["bench"] == "throughput" and payload["env"]["torch"] == torch.__version__
    workload = random_prompts(6, LenRange(30, 32), LenRange(4, 6), 512, seed=3)
    n_in, n_out = sum(len(i) for i, _ in workload), sum(o for _, o in workload)
    for r in payload["results"]:
        assert r["num_requests"] == 6 and r["input_tokens"] == n_in and r["output_tokens"] == n_out
        assert r["output_tok_s"] * r["elapsed_s"] == pytest.approx(n_out)
        assert r["total_tok_s"] * r["elapsed_s"] == pytest.approx(n_in + n_out)
        assert r["all_blocks_free"] is True and r["kv_cache_tokens"] == 8 * 16
        assert r["preemptions"] > 0  # 4 of 6 prompts fill 8 blocks; decoding past 32 tokens evicts one
        assert 0 < r["peak_kv_usage"] <= 1 and r["mean_ttft_ms"] > 0 and r["mean_tpot_ms"] > 0
        assert 0 < r["decode_tokens"] < n_out and r["decode_s"] < r["elapsed_s"]  # first tokens come from prefill
        # the step log (--step-log): one row per timed step, agreeing with the run's own totals
        lines = (tmp_path / "logs" / f"steps_{r['kv_cache_dtype']}.tsv").read_text().splitlines()
        cols = lines[0].split("\t")
        rows = [dict(zip(cols, map(float, line.split("\t")))) for line in lines[1:]]
        assert len(rows) == r["steps"] and [x["step"] for x in rows] == list(range(r["steps"]))
        assert sum(x["generated"] for x in rows) == n_out and sum(x["computed"] for x in rows) >= n_in
        pure = [x for x in rows if x["pure_decode"]]
        assert len(pure) == r["decode_steps"] and sum(x["generated"] for x in pure) == r["decode_tokens"]
        # pure decode: the waited batch decode-only, and the launched one too (or none)
        assert all(x["computed"] == x["generated"] > 0 and x["next_tokens"] == x["next_seqs"] for x in pure)
        assert not any(x["computed"] == x["generated"] > 0 and x["next_tokens"] == x["next_seqs"]
                       for x in rows if not x["pure_decode"])
        assert sum(x["ms"] for x in pure) == pytest.approx(1000 * r["decode_s"], rel=1e-3, abs=0.05)
        assert rows[-1]["next_tokens"] == 0 and rows[-1]["running"] == 0 and rows[-1]["waiting"] == 0
        assert all(x["replays"] == 0 for x in rows)  # CPU: no CUDA graphs, every batch eager
        # step kinds in the JSON == the log's, as benchmarks/summarize_step_log.py reads it
        kinds = r["step_kinds"]
        assert sum(k["steps"] for k in kinds.values()) == r["steps"]
        assert sum(k["generated"] for k in kinds.values()) == n_out
        assert kinds["decode->decode"]["steps"] + kinds["decode->none"]["steps"] == r["decode_steps"]
        summary = summarize_step_log.summarize(str(tmp_path / "logs" / f"steps_{r['kv_cache_dtype']}.tsv"))
        assert summary["replays"] == 0
        for name, k in summary["kinds"].items():
            assert (k["steps"], k["generated"]) == (kinds[name]["steps"], kinds[name]["generated"])
            assert k["seconds"] == pytest.approx(kinds[name]["seconds"], abs=1e-3 * k["steps"] + 1e-6)
    assert payload["results"][0]["output_tok_s_vs_bf16"] == 1.0 and payload["complete"] is True
    logs = sorted(str(p) for p in (tmp_path / "logs").glob("steps_*.tsv"))
    png = tmp_path / "steps.png"
    assert summarize_step_log.main([*logs, "--plot", str(png), "--labels", ",".join(map(str, range(len(logs))))]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        summarize_step_log.main([*logs, "--plot", str(png), "--labels", ",".join(["x"] * (len(logs) + 1))])


def test_throughput_repeats(tmp_path, capsys):
    """--repeats 3: three runs on different prompts (seed, seed+1, seed+2); the row is the median run
    by output tok/s and carries every run's rate and the spread."""
    path = tmp_path / "tp.json"
    argv = ["bench", "throughput", "--model", "tiny-llama", "--dtype", "float32", "--device", "cpu",
            "--num-prompts", "3", "--input-len", "8:12", "--output-len", "3", "--num-blocks", "32",
            "--kv-cache-dtype", "int8", "--repeats", "3", "--seed", "5", "--output-json", str(path)]
    rc, out, _ = _run(capsys, argv)
    assert rc == 0 and "spread" in out
    payload = json.loads(path.read_text())
    r = payload["results"][0]
    runs = r["runs_output_tok_s"]
    assert len(runs) == 3 and r["output_tok_s"] == sorted(runs)[1] and len(r["runs_decode_tok_s"]) == 3
    assert r["output_tok_s_spread"] == pytest.approx((max(runs) - min(runs)) / sorted(runs)[1])
    median_seed = 5 + runs.index(sorted(runs)[1])
    n_in = sum(len(i) for i, _ in random_prompts(3, LenRange(8, 12), LenRange(3, 3), 512, seed=median_seed))
    assert r["input_tokens"] == n_in and r["all_blocks_free"] is True and payload["config"]["repeats"] == 3
    rc, _, err = _run(capsys, argv[:-2] + ["--repeats", "0"])
    assert rc == 2 and "--repeats" in err


def test_kv_budget_table(tmp_path, capsys):
    """benchmarks/plot_kv_budget.py over `bench throughput` JSONs at two budgets: each format's ratio is
    its output tok/s and KV tokens over bf16's at the same budget and workload, as the JSONs hold them;
    the int4 group comes from the command; a budget without bf16 gets no ratio."""
    runs = tmp_path / "runs"
    for budget in ("40KiB", "80KiB"):  # tiny-llama: 1 KiB of bf16 KV a token, so 40 / 80 tokens
        argv = ["bench", "throughput", "--model", "tiny-llama", "--dtype", "float32", "--device", "cpu",
                "--num-prompts", "4", "--input-len", "10:14", "--output-len", "3", "--kv-cache-memory", budget,
                "--kv-cache-dtype", "bfloat16,int8,int4", "--int4-group-size", "64", "--warmup-requests", "0",
                "--output-json", str(runs / f"{budget}.json")]
        assert _run(capsys, argv)[0] == 0
    argv[argv.index("80KiB")] = "120KiB"  # int8 alone at a third budget
    argv[argv.index("bfloat16,int8,int4")] = "int8"
    argv[-1] = str(runs / "120KiB_int8.json")
    assert _run(capsys, argv)[0] == 0
    (runs / "cut.json").write_text("{")  # a run cut by its cap may leave a broken file: skipped
    out = tmp_path / "out"
    assert plot_kv_budget.main([str(runs), "--out", str(out)]) == 0
    rows = json.loads((out / "kv_budget.json").read_text())
    rows_key = [(40, "bfloat16"), (40, "int8"), (40, "int4 g64"), (80, "bfloat16"), (80, "int8"), (80, "int4 g64"),
                (120, "int8")]
    assert [(r["budget_gib"] * 2**30 / 1024, r["format"]) for r in rows] == rows_key
    for budget in ("40KiB", "80KiB"):
        res = {r["kv_cache_dtype"]: r for r in json.loads((runs / f"{budget}.json").read_text())["results"]}
        mine = [r for r in rows if r["file"] == f"{budget}.json"]
        for r, fmt in zip(mine, ("bfloat16", "int8", "int4")):
            assert r["output_tok_s"] == res[fmt]["output_tok_s"]
            assert r["output_vs_bf16"] == pytest.approx(res[fmt]["output_tok_s"] / res["bfloat16"]["output_tok_s"])
            assert r["capacity_vs_bf16"] == pytest.approx(res[fmt]["kv_cache_tokens"] / res["bfloat16"]["kv_cache_tokens"])
        assert mine[2]["capacity_vs_bf16"] > mine[1]["capacity_vs_bf16"] > 1  # a few blocks: rounding moves them
    assert rows[-1]["output_vs_bf16"] is None and rows[-1]["capacity_vs_bf16"] is None
    md = (out / "kv_budget.md").read_text()
    assert md.count("\n") == 2 + len(rows) and "| 40 KiB | int4 g64 |" in md and "| 120 KiB | int8 |" in md
    assert md.splitlines()[-1].count("-") >= 3  # int8 alone at 120 KiB: no ratios
    assert (out / "kv_budget.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_kv_budget.main([str(tmp_path / "none")]) == 1
    # JSON files named one by one (another session's bf16 beside these runs): those files only, in the file's folder
    assert plot_kv_budget.main([str(runs / "120KiB_int8.json"), str(runs / "40KiB.json")]) == 0
    rows2 = json.loads((runs / "kv_budget.json").read_text())
    assert [(r["budget_gib"] * 2**30 / 1024, r["format"]) for r in rows2] == rows_key[:3] + rows_key[-1:]
    commit = json.loads((runs / "40KiB.json").read_text())["env"]["commit"]
    assert all(line.endswith(f"| {(commit or '-')[:7]} |") for line in (runs / "kv_budget.md").read_text().splitlines()[2:])


def test_simulate_schedule_matches_engine(tmp_path, capsys):
    """benchmarks/simulate_schedule.py against the engine on the same seeded workload (synchronous
    scheduling, as the simulation schedules): the same steps, preemptions and computed tokens (the step
    log's sum); with room for everything, the hand count: no preemption, nothing recomputed."""
    wl = random_prompts(6, LenRange(30, 32), LenRange(4, 6), 512, seed=3)
    for blocks in (8, 12):
        argv = ["bench", "throughput", "--model", "tiny-llama", "--dtype", "float32", "--device", "cpu",
                "--num-prompts", "6", "--input-len", "30:32", "--output-len", "4:6", "--num-blocks", str(blocks),
                "--kv-cache-dtype", "bfloat16", "--warmup-requests", "0", "--seed", "3", "--no-async-scheduling",
                "--output-json", str(tmp_path / "tp.json"), "--step-log", str(tmp_path / f"s{blocks}")]
        assert _run(capsys, argv)[0] == 0
        r = json.loads((tmp_path / "tp.json").read_text())["results"][0]
        sim = simulate_schedule.simulate(wl, blocks, 16, max_num_seqs=64, max_num_batched_tokens=2048)
        assert (sim["steps"], sim["preemptions"]) == (r["steps"], r["preemptions"]) and sim["preemptions"] > 0
        lines = (tmp_path / f"s{blocks}_bfloat16.tsv").read_text().splitlines()
        col = lines[0].split("\t").index("computed")
        assert sim["computed_tokens"] == sum(int(float(x.split("\t")[col])) for x in lines[1:])
        assert sim["recomputed_tokens"] == sim["computed_tokens"] - sum(len(p) + o - 1 for p, o in wl) > 0
    wl = [([1] * 10, 3)] * 4  # 4 prompts in one step (each samples its first token), then 2 decode steps of 4
    assert simulate_schedule.simulate(wl, 100) == {
        "steps": 3, "decode_steps": 2, "mean_decode_batch": 4.0, "preemptions": 0, "computed_tokens": 48,
        "recomputed_tokens": 0, "recomputed_vs_prompts": 0.0}
    with pytest.raises(RuntimeError, match="cannot hold one request"):
        simulate_schedule.simulate([([1] * 40, 3)], 2)
    assert simulate_schedule.main(["--kv-cache-memory", "1GiB", "--num-prompts", "8",
                                   "--kv-cache-dtype", "bfloat16,int8", "--json", str(tmp_path / "sim.json")]) == 0
    rows = json.loads((tmp_path / "sim.json").read_text())
    assert [r["kv_cache_dtype"] for r in rows] == ["bfloat16", "int8"] and rows[1]["tokens"] > 1.9 * rows[0]["tokens"]


def test_engine_tables():
    """`bench_attention.engine_tables` (probe_varlen_decode.py --tables engine): each sequence gets its
    blocks, all distinct; the prompt's are consecutive, the decode blocks of a lockstep batch follow
    at a stride of the batch size, and a shorter sequence drops out of the rotation."""
    from benchmarks.bench_attention import engine_tables

    t = engine_tables([600] * 4, 16, 512)
    assert [len(x) for x in t] == [38] * 4 and len({b for x in t for b in x}) == 4 * 38
    assert t[1][:32] == list(range(32, 64)) and t[1][32:35] == [129, 133, 137]
    assert engine_tables([40, 70, 33], 16, 32) == [[0, 1, 6], [2, 3, 7, 9, 10], [4, 5, 8]]


def test_bench_attention_write_only_reports(tmp_path):
    """`bench_attention.py --write-only` results (no decode rows): the reports hold the write table,
    ratios against the copy, and no plot (nothing to draw)."""
    from benchmarks.bench_attention import write_reports

    env = {"gpu": "G", "driver": "d", "torch": "t", "triton": "x", "cuda": "c", "commit": "abc", "time": "now",
           "command": "bench_attention.py --write-only"}
    results = {"env": env, "decode": [], "sdpa": {}, "vllm_us": {},
               "write": [{"format": "torch copy (ceiling)", "tokens": 64, "us": 8.0, "input_TBps": 0.5},
                         {"format": "int4", "tokens": 64, "slots": "blocks", "us": 6.0, "input_TBps": 0.6}]}
    write_reports(results, str(tmp_path))
    md = (tmp_path / "bench_attention.md").read_text()
    assert "| int4 | 64 | blocks | 6.0 | 0.60 | 0.75 |" in md and not (tmp_path / "bench_attention.png").exists()
    assert json.loads((tmp_path / "bench_attention.json").read_text())["write"][1]["us"] == 6.0


@pytest.mark.parametrize("tokens", [1, 16, 37, 256])
def test_bench_attention_write_slots(tokens):
    """The cache write's slot mappings: distinct slots inside the pool; "blocks" puts consecutive tokens
    in consecutive slots inside each block, and whole blocks in a random order; a bad name is an error."""
    from benchmarks.bench_attention import write_slots

    bs = 16
    pool = (tokens // bs + 1) * bs
    for pattern in ("random", "blocks"):
        s = write_slots(pattern, tokens, bs, torch.device("cpu"))
        assert s.shape == (tokens,) and len(set(s.tolist())) == tokens and 0 <= s.min() and s.max() < pool
    s = write_slots("blocks", tokens, bs, torch.device("cpu"))
    for t in range(tokens):
        assert s[t] % bs == t % bs and (t % bs == 0 or s[t] == s[t - 1] + 1)
    with pytest.raises(ValueError, match="unknown slot pattern 'sorted'"):
        write_slots("sorted", tokens, bs, torch.device("cpu"))


def test_bench_attention_bad_write_slots_fail_first(capsys):
    """A misspelled `--write-slots` stops `bench_attention.py` at once (before any GPU work), naming it."""
    from benchmarks.bench_attention import main as bench_main

    with pytest.raises(SystemExit) as e:
        bench_main(["--write-only", "--write-slots", "random,sorted"])
    assert e.value.code == 2 and "unknown slot mapping sorted" in capsys.readouterr().err


def test_throughput_profile_steps(tmp_path, capsys):
    """--profile-steps A:B profiles timed steps A..B-1 of the run (torch.profiler, `kvpack_step` ranges)
    into PREFIX_<format>_profile.json: one "per step" row (wall time; on CPU no GPU events, busy 0) and
    the kernel rows; it needs --step-log, and B > A."""
    prefix = str(tmp_path / "steps")
    argv = ["bench", "throughput", "--model", "tiny-llama", "--dtype", "float32", "--device", "cpu",
            "--num-prompts", "3", "--input-len", "8", "--output-len", "6", "--num-blocks", "32",
            "--kv-cache-dtype", "int8", "--step-log", prefix, "--profile-steps", "2:5"]
    rc, out, _ = _run(capsys, argv)
    assert rc == 0 and "steps 2:5 profiled" in out
    prof = json.loads((tmp_path / "steps_int8_profile.json").read_text())
    per_step = prof["rows"][0]
    assert prof["steps"] == "2:5" and per_step["name"] == "per step"
    assert per_step["wall_us"] > 0 and per_step["busy_us"] == 0 and per_step["idle_us"] == per_step["wall_us"]
    rc, _, err = _run(capsys, argv[:-4] + ["--profile-steps", "2:5"])
    assert rc == 2 and "--profile-steps needs --step-log" in err
    rc, _, err = _run(capsys, argv[:-1] + ["3:3"])
    assert rc == 2 and "B must be larger than A" in err


def test_throughput_step_log_directory_checked_first(tmp_path, capsys, monkeypatch):
    """--step-log into a directory that cannot be made fails before any format runs (session 15: a
    missing directory failed a KV-bound run after its first format's 99 s), naming the flag."""
    import kvpack.tools.bench_throughput as bt

    ran = []
    monkeypatch.setattr(bt, "bench_format", lambda *a: ran.append(a))
    (tmp_path / "file").write_text("")
    argv = ["bench", "throughput", "--model", "tiny-llama", "--dtype", "float32", "--device", "cpu",
            "--num-prompts", "2", "--input-len", "8", "--output-len", "2", "--num-blocks", "16",
            "--kv-cache-dtype", "bfloat16", "--step-log", str(tmp_path / "file" / "sub" / "steps")]
    rc, _, err = _run(capsys, argv)
    assert rc == 2 and "--step-log" in err and "is a file, not a folder" in err and ran == []
    # --output-json alike (the JSON was written only at the end of the run)
    argv[-2:] = ["--output-json", str(tmp_path / "file" / "out.json")]
    rc, _, err = _run(capsys, argv)
    assert rc == 2 and "--output-json" in err and "is a file, not a folder" in err and ran == []


def test_throughput_keeps_finished_formats_when_cut(tmp_path, capsys, monkeypatch):
    """A run cut after its first format (a time cap, a crash) leaves that format's row on disk."""
    import kvpack.tools.bench_throughput as bt

    real = bt.bench_format
    calls = []

    def second_fails(args, item, max_model_len):
        calls.append(item)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what `timeout --signal=INT` delivers
        return real(args, item, max_model_len)

    monkeypatch.setattr(bt, "bench_format", second_fails)
    path = tmp_path / "tp.json"
    argv = ["bench", "throughput", "--model", "tiny-llama", "--dtype", "float32", "--device", "cpu",
            "--num-prompts", "2", "--input-len", "8", "--output-len", "2", "--num-blocks", "16",
            "--kv-cache-dtype", "bfloat16,int8", "--output-json", str(path)]
    assert main(argv) != 0  # the CLI reports "kvpack: interrupted"
    assert "interrupted" in capsys.readouterr().err
    payload = json.loads(path.read_text())
    assert payload["complete"] is False and [r["kv_cache_dtype"] for r in payload["results"]] == ["bfloat16"]


def test_latency_tiny(tmp_path, capsys):
    path = tmp_path / "lat.json"
    rc, out, _ = _run(capsys, ["bench", "latency", "--model", "tiny-llama", "--dtype", "float32",
                               "--device", "cpu", "--context", "40", "--batch-size", "2", "--output-len", "5",
                               "--num-iters", "2", "--kv-cache-dtype", "bfloat16", "--output-json", str(path)])
    assert rc == 0 and "ms/token" in out
    r = json.loads(path.read_text())["results"][0]
    assert r["timed_steps"] == 4  # 5 outputs: 1 from the (cached) prefill step + 4 decode steps
    assert r["median_ms"] > 0 and r["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 2  # layers, kv heads, K+V, head_dim, bf16
    assert r["all_blocks_free"] is True


def test_triton_compile_log_listener():
    """`TritonCompileLog` installs Triton's compilation listener for the block and restores the one
    before; cache misses are counted and timed per kernel, hits only counted."""
    from types import SimpleNamespace

    from triton import knobs

    from kvpack.tools.bench_common import TritonCompileLog

    before = knobs.compilation.listener
    with TritonCompileLog() as log:
        assert knobs.compilation.listener is not before
        lis = knobs.compilation.listener
        lis(src=None, metadata={"name": "_decode_kernel"}, metadata_group={}, times=SimpleNamespace(total=1_500_000),
            cache_hit=False)
        lis(src=None, metadata={"name": "_decode_kernel"}, metadata_group={}, times=SimpleNamespace(total=500_000),
            cache_hit=False)
        lis(src=None, metadata={"name": "_rope_kernel"}, metadata_group={}, times=None, cache_hit=True)
    assert knobs.compilation.listener is before
    s = log.summary()
    assert s["count"] == 2 and s["cache_hits"] == 1 and abs(s["seconds"] - 2.0) < 1e-9
    assert s["by_kernel"] == {"_decode_kernel": [2, 2.0]}
    assert [d["kernel"] for d in s["specializations"]] == ["_decode_kernel"] * 2 and s["specializations"][0]["seconds"] == 1.5


def test_triton_compile_log_names_the_specialization():
    """A compile's record names its constexprs and specialized arguments (what a warm-up must launch),
    from a real Triton 3.6 source object; a source without them gives no details."""
    import triton
    import triton.language as tl
    from triton.compiler.compiler import ASTSource

    from kvpack.tools.bench_common import TritonCompileLog, specialization

    @triton.jit
    def kern(x_ptr, n, SPLITS_PAD: tl.constexpr, PDL: tl.constexpr = False):
        pass

    src = ASTSource(kern, {"x_ptr": "*fp32", "n": "i32", "SPLITS_PAD": "constexpr", "PDL": "constexpr"},
                    constexprs={"SPLITS_PAD": 16, "PDL": True}, attrs={(1,): [["tt.divisibility", 16]]})
    assert specialization(src) == {"constexprs": {"SPLITS_PAD": 16, "PDL": True},
                                   "specialized": {"n": "[['tt.divisibility', 16]]"},
                                   "types": {"x_ptr": "*fp32", "n": "i32"}}
    assert specialization(None) == {}
    with TritonCompileLog() as log:
        from triton import knobs
        knobs.compilation.listener(src=src, metadata={"name": "kern"}, metadata_group={}, times=None, cache_hit=False)
    (d,) = log.summary()["specializations"]
    assert d["kernel"] == "kern" and d["constexprs"] == {"SPLITS_PAD": 16, "PDL": True}
    json.dumps(log.summary())  # the benchmark writes it as JSON


def test_sass_loop_mix_counts_each_loop_body():
    # nvdisasm's format: an outer loop (L_x_0 .. its branch) holding an inner one (L_x_1); a forward branch
    # is no loop. Counts are by full opcode, so load widths stay apart.
    from benchmarks.sass_all_variants import loop_mixes_of

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDG.E.U16 R2, desc[UR4][R4.64] ;
.L_x_1:
        /*0020*/                   HMMA.16816.F32 R8, R12, R16, R8 ;
        /*0030*/                   LDG.E.128 R20, desc[UR4][R6.64] ;
        /*0040*/               @P0 BRA `(.L_x_1) ;
        /*0050*/                   LDG.E.U16 R3, desc[UR4][R4.64+0x2] ;
        /*0060*/              @!P1 BRA `(.L_x_2) ;
        /*0070*/                   BRA `(.L_x_0) ;
.L_x_2:
        /*0080*/                   EXIT ;
"""
    mixes = loop_mixes_of(sass)
    assert [span for span, _ in mixes] == [(0x10, 0x70), (0x20, 0x40)]
    outer, inner = (mix for _, mix in mixes)
    assert inner == {"HMMA.16816.F32": 1, "LDG.E.128": 1, "BRA": 1}
    assert outer["LDG.E.U16"] == 2 and outer["BRA"] == 3 and sum(outer.values()) == 7


def test_plot_latency_context(tmp_path):
    """`plot_latency_context.py`: latency and bytes a step against bf16's at the same context, one row per
    (context, format), from `bench latency` JSON files; an input without a bf16 row is an error."""
    from benchmarks.plot_latency_context import main as plot_main

    def run(ctx, rows):
        p = tmp_path / f"lat_{ctx}.json"
        p.write_text(json.dumps({"env": {"commit": "abc", "gpu": "G"}, "results": [
            {"kv_cache_dtype": f, "context": ctx, "batch_size": 1, "median_ms": ms, "bytes_per_step": b}
            for f, ms, b in rows]}))
        return str(p)

    paths = [run(65536, [("int8", 6.0, 24.0), ("bfloat16", 8.0, 32.0)]), run(32768, [("bfloat16", 5.0, 20.0)])]
    assert plot_main(paths + ["--out", str(tmp_path / "o")]) == 0
    rows = json.loads((tmp_path / "o" / "latency_context.json").read_text())
    assert [(r["context"], r["format"]) for r in rows] == [(32768, "bfloat16"), (65536, "bfloat16"), (65536, "int8")]
    assert rows[2]["vs_bf16"] == 0.75 and rows[2]["bytes_vs_bf16"] == 0.75
    assert "| 65,536 | 1 | int8 | 6.000 | 0.75 | 0.75 |" in (tmp_path / "o" / "latency_context.md").read_text()
    with pytest.raises(SystemExit, match="no bfloat16 row"):
        plot_main([run(1024, [("int8", 1.0, 1.0)]), "--out", str(tmp_path / "o2")])


def test_decode_timeline_summary(tmp_path):
    """`probe_decode_timeline.summarize` on made-up stamps (ns): two programs a call, the second call with a
    merge; every quantity of its doc from the stamps, and the plot from a raw file."""
    from benchmarks.probe_decode_timeline import SLOTS, granularity, plot_timeline, summarize

    def prog(entry, q, first, loop_end, exit_, sm):
        return [entry, q, first, loop_end, exit_, 0, 2 * (exit_ - entry), sm]

    call1 = [prog(1000, 2000, 0, 9000, 10000, 0), prog(1500, 2500, 0, 11000, 12000, 1)]
    call2 = [prog(13000, 14000, 15000, 20000, 21000, 0), prog(13000, 15000, 16000, 22000, 24000, 0)]
    merge2 = [[20000, 24500, 0, 0, 25500, 0, 0, 3]]
    rows = summarize([(call1, None), (call2, merge2)], [False, True])
    assert rows[0]["gap_us"] is None and rows[0]["call_us"] == 11.0 and rows[0]["start_spread_us"] == 0.5
    assert rows[0]["first_tile_p50_us"] is None and rows[0]["ghz"] == 2.0 and rows[0]["sms"] == 2
    r = rows[1]
    assert r["gap_us"] == 1.0  # the previous call's last exit (12000) to this one's first entry (13000)
    assert r["prologue_p50_us"] == 1.5 and r["prologue_max_us"] == 2.0 and r["first_tile_p50_us"] == 1.0
    assert r["stream_min_us"] == 6.0 and r["stream_max_us"] == 7.0 and r["epilogue_max_us"] == 2.0
    assert r["exit_max_us"] == 11.0 and r["exit_p50_us"] == 9.5 and r["tail_us"] == 1.5 and r["start_spread_us"] == 0
    assert r["merge_after_decode_us"] == 1.5 and r["merge_wait_done_first_us"] == 0.5 and r["call_us"] == 12.5
    assert len(call1[0]) == SLOTS and granularity([(call1, None), (call2, merge2)]) == 500
    raw = {"s/f": [(torch.tensor(call1), None), (torch.tensor(call2), torch.tensor(merge2))]}
    plot_timeline(raw, ["s/f"], str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").stat().st_size > 0


def test_read_floor_kernel_and_bytes():
    """`probe_read_floor.py`: its streaming kernel adds up every word (CPU interpreter, programs striding over
    uneven chunks), and the bytes it reads per format are bench_attention's `kv_bytes`."""
    from benchmarks.bench_attention import SHAPES, kv_bytes, make_cache
    from benchmarks.probe_read_floor import _read_kernel, kv_bytes_of

    x = torch.randint(-1000, 1000, (1000,), dtype=torch.int32)
    out = torch.zeros(3, dtype=torch.int32)
    _read_kernel[(3,)](x, x.numel(), out, BLOCK=16, UNROLL=2)
    assert int(out.sum()) == int(x.sum())
    shape = SHAPES[0]
    for fmt in ("bf16", "int8", "int4", "fp8_e4m3"):
        assert kv_bytes_of(fmt, shape) == kv_bytes(make_cache(fmt, shape, 1, "cpu"), shape)


def test_benchmark_format_names():
    """bench_attention's and bench_prefill's format names: int4 groups ("int4-g128": one scale and zero a token and
    head at head dim 128, 68 bytes against group 32's 80), static scales, and a clear error for anything else."""
    from benchmarks.bench_attention import SHAPES, make_cache
    from benchmarks.bench_prefill import build_layer

    shape = SHAPES[0]
    for name, group, nbytes in (("int4", 32, 80), ("int4-g64", 64, 72), ("int4-g128", 128, 68), ("int8-static", 128, 128)):
        lc = make_cache(name, shape, 2, "cpu")
        assert (lc.k.fmt.group_size, lc.v.fmt.bytes_per_token_head) == (group, nbytes), name
    assert make_cache("int8-static", shape, 2, "cpu").k.fmt.scale_mode == "static"
    k = torch.randn(16, 2, 64)
    slots = torch.arange(16)
    assert build_layer("int4-g64", k, k, 2, 16, slots, torch.float32).v.fmt.group_size == 64
    for bad in ("int4-x", "int8-g64", "bf16-static2"):
        with pytest.raises(ValueError, match="unknown"):
            make_cache(bad, shape, 2, "cpu")
        with pytest.raises(ValueError, match="unknown"):
            build_layer(bad, k, k, 2, 16, slots, torch.float32)
