"""End to end (tier g) on a tiny random model in float32, CPU reference attention.

Oracles: (1) the cache-free forward pass over the whole sequence (no paging, no batching): the
engine's greedy tokens must be its argmax at every step; (2) running each prompt alone: greedy
outputs must be identical with any batching, prefix caching, chunked prefill or preemption,
for float and quantized KV formats. After every run every block is free again.

The preset's N(0, 0.02) weights give near-uniform attention, under which a wrong block table
would go unnoticed; the weights are redrawn with a larger spread so attention is sharp.
"""

from __future__ import annotations

import random

import pytest
import torch

from kvpack.config import ConfigError
from kvpack.engine.llm_engine import LLMEngine, RequestError
from kvpack.models import load_model
from kvpack.sampling_params import SamplingParams

MODEL = "dummy:tiny-llama"
VOCAB = 512
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded():
    lm = load_model(MODEL, "float32", "cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in sorted(lm.model.named_parameters()):
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    return lm


def make_engine(loaded, **kw) -> LLMEngine:
    args = dict(max_model_len=128, num_blocks=256, block_size=8, log_stats=False)
    args.update(kw)
    return LLMEngine.from_args(MODEL, loaded=loaded, **args)


def run(engine: LLMEngine, prompts, params=GREEDY) -> list:
    params = params if isinstance(params, list) else [params] * len(prompts)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, sp)
    done = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        steps += 1
        assert steps < 5000
    assert engine.num_free_blocks == engine.num_total_blocks
    engine.block_manager.check_invariants()
    return [done[str(i)] for i in range(len(prompts))]


def one_at_a_time(engine: LLMEngine, prompts, params=GREEDY) -> list[list[int]]:
    return [run(engine, [p], params)[0].token_ids for p in prompts]


def make_prompts(n=16, seed=0, shared=True) -> list[list[int]]:
    rng = random.Random(seed)
    base = [rng.randrange(VOCAB) for _ in range(24)]
    out = []
    for i in range(n):
        head = base[: rng.randrange(0, 25)] if shared and i % 2 else []
        out.append(head + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 30))])
    return out


@torch.no_grad()
def cache_free_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        t = torch.tensor(ids)
        logits = model.compute_logits(model(t, torch.arange(len(ids)), None, None))
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def prompts():
    return make_prompts()


@pytest.fixture(scope="module")
def reference(loaded, prompts):
    engine = make_engine(loaded, enable_prefix_caching=False)
    return one_at_a_time(engine, prompts)


def test_greedy_equals_cache_free_forward(loaded, prompts, reference):
    for p, got in list(zip(prompts, reference))[:6]:
        assert got == cache_free_greedy(loaded.model, p, len(got))
    assert len({tuple(r) for r in reference}) > 8  # outputs depend on the prompt


@pytest.mark.parametrize("kw", [
    dict(),
    dict(enable_prefix_caching=False),
    dict(max_num_batched_tokens=7),
    dict(max_num_seqs=3),
    dict(num_blocks=12, max_model_len=64),
    dict(num_blocks=10, max_model_len=64, max_num_batched_tokens=24, enable_prefix_caching=False),
], ids=["batched", "no-prefix-cache", "chunked", "max-seqs-3", "preempt", "preempt-chunked-nocache"])
def test_together_equals_alone(loaded, prompts, reference, kw):
    engine = make_engine(loaded, **kw)
    outs = run(engine, prompts)
    assert [o.token_ids for o in outs] == reference
    stats = engine.stats()
    if "num_blocks" in kw:
        assert stats["num_preemptions"] > 0
    if kw.get("max_num_batched_tokens"):
        assert stats["steps"] > 16
    if not kw:  # same engine again: prompts now come from the prefix cache, same outputs
        hits = stats["prefix_hit_tokens"]
        outs = run(engine, prompts)
        assert [o.token_ids for o in outs] == reference
        assert engine.stats()["prefix_hit_tokens"] > hits + 100


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8_e4m3"])
def test_quantized_cache_together_equals_alone(loaded, prompts, fmt):
    some = prompts[:6]
    alone = one_at_a_time(make_engine(loaded, kv_cache_dtype=fmt, enable_prefix_caching=False), some)
    engine = make_engine(loaded, kv_cache_dtype=fmt, num_blocks=14, max_model_len=64,
                         max_num_batched_tokens=16)
    outs = run(engine, some)
    assert [o.token_ids for o in outs] == alone
    assert engine.kv_bytes_per_token < make_engine(loaded).kv_bytes_per_token


def test_prefix_cache_hits_skip_compute(loaded):
    rng = random.Random(5)
    system = [rng.randrange(VOCAB) for _ in range(40)]
    prompts = [system + [rng.randrange(VOCAB) for _ in range(5)] for _ in range(4)]
    cold = make_engine(loaded, enable_prefix_caching=False)
    want = one_at_a_time(cold, prompts)
    warm = make_engine(loaded)
    got = one_at_a_time(warm, prompts)
    assert got == want
    s = warm.stats()
    assert s["prefix_hit_tokens"] == 3 * 40  # the first run fills the cache, 40 = 5 blocks of 8
    assert s["computed_tokens"] < cold.stats()["computed_tokens"]


def test_stop_token_min_tokens_and_max_tokens(loaded, prompts, reference):
    p, ref = prompts[0], reference[0]
    engine = make_engine(loaded)
    out = run(engine, [p], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert out.token_ids == ref[:3] and out.finish_reason == "length"
    stop = ref[2]
    k = ref.index(stop)
    out = run(engine, [p], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop]))[0]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.token_ids == ref[: k + 1]
    # min_tokens bans the stop token for the first tokens: the output changes and gets longer.
    out = run(engine, [p], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop],
                                          min_tokens=k + 1, ignore_eos=True))[0]
    assert stop not in out.token_ids[: k + 1] and len(out.token_ids) > k + 1


def test_eos_stops_unless_ignored(loaded, prompts, reference):
    # Pretend the reference's third token is EOS.
    engine = make_engine(loaded)
    eos = reference[0][2]
    engine.eos_token_ids = (eos,)
    engine.model_runner.eos_token_ids = (eos,)
    k = reference[0].index(eos)
    n = len(reference[0])
    out = run(engine, [prompts[0]], SamplingParams(temperature=0, max_tokens=n))[0]
    assert out.finish_reason == "stop" and out.token_ids == reference[0][: k + 1]
    out = run(engine, [prompts[0]], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]
    assert out.token_ids == reference[0]


def test_stop_string_cuts_text_and_streams_monotonically(loaded):
    engine = make_engine(loaded)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    text = run(engine, ["Hello"], sp)[0].text
    printable = [i for i in range(1, len(text) - 2) if text[i:i + 2].isprintable() and text[i:i + 2].strip()]
    assert printable, text
    i = printable[len(printable) // 2]
    stop = text[i:i + 2]
    first = text.index(stop)
    engine.add_request("s", "Hello", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop, "\x00never"]))
    seen = ""
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.text.startswith(seen)  # cumulative text only grows
            seen = out.text
    assert seen == text[:first] and out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert engine.num_free_blocks == engine.num_total_blocks


def test_seeded_sampling_is_reproducible_and_batch_independent(loaded, prompts):
    engine = make_engine(loaded)
    sp = SamplingParams(temperature=1.0, top_k=50, max_tokens=8, seed=7, ignore_eos=True)
    alone = run(engine, [prompts[3]], sp)[0].token_ids
    others = SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True)
    outs = run(engine, prompts[:6], [others, others, others, sp, others, others])
    assert outs[3].token_ids == alone
    assert alone != reference_greedy(engine, prompts[3])
    n3 = run(engine, [prompts[3]], SamplingParams(n=3, temperature=1.0, top_k=50, max_tokens=8, seed=7,
                                                  ignore_eos=True))[0]
    assert len(n3.outputs) == 3 and n3.outputs[0].token_ids == alone
    assert len({tuple(o.token_ids) for o in n3.outputs}) == 3


def reference_greedy(engine, prompt):
    return run(engine, [prompt])[0].token_ids


def test_logprobs_match_the_cache_free_model(loaded, prompts, reference):
    engine = make_engine(loaded)
    out = run(engine, [prompts[1]], SamplingParams(temperature=0, max_tokens=4, logprobs=3, ignore_eos=True))[0]
    ids = list(prompts[1]) + out.token_ids
    with torch.no_grad():
        logp = loaded.model.compute_logits(loaded.model(torch.tensor(ids), torch.arange(len(ids)))).log_softmax(-1)
    n = len(prompts[1])
    assert len(out.logprobs) == 4
    for j, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        row = logp[n - 1 + j]
        assert tok in lp and set(row.topk(3).indices.tolist()) <= set(lp)
        for t, v in lp.items():
            assert v == pytest.approx(row[t].item(), abs=1e-4)


def test_abort_frees_blocks(loaded, prompts):
    engine = make_engine(loaded)
    for i, p in enumerate(prompts[:4]):
        engine.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.num_free_blocks < engine.num_total_blocks
    out = engine.abort_request("2")
    assert out.finished and out.finish_reason == "abort"
    assert engine.abort_request("2") is None
    for rid in ("0", "1", "3"):
        engine.abort_request(rid)
    assert not engine.has_unfinished_requests()
    assert engine.num_free_blocks == engine.num_total_blocks


def test_final_only_outputs(loaded, prompts):
    """output_kind="final_only": a request yields no output until it finishes, then the same output as
    "cumulative" (tokens, text, finish reason); cumulative requests in the same batch still report every
    step; an unknown kind is a ConfigError naming the choices."""
    import dataclasses

    want = run(make_engine(loaded), prompts[:4])
    engine = make_engine(loaded)
    params = [dataclasses.replace(GREEDY, output_kind="final_only" if i % 2 == 0 else "cumulative") for i in range(4)]
    for i, (p, sp) in enumerate(zip(prompts[:4], params)):
        engine.add_request(str(i), p, sp)
    seen, done = {str(i): 0 for i in range(4)}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id] += 1
            assert out.finished or int(out.request_id) % 2 == 1, "a final_only request reported before its end"
            if out.finished:
                done[out.request_id] = out
    assert [seen[str(i)] for i in (0, 2)] == [1, 1] and all(seen[str(i)] > 1 for i in (1, 3))
    for i, w in enumerate(want):
        got = done[str(i)]
        assert (got.token_ids, got.outputs[0].text, got.finish_reason) == (w.token_ids, w.outputs[0].text, w.finish_reason)
    with pytest.raises(ConfigError, match="output_kind must be one of cumulative, final_only"):
        SamplingParams(output_kind="delta")


def test_request_validation(loaded):
    engine = make_engine(loaded, max_model_len=32)
    with pytest.raises(RequestError, match="prompt has 32 tokens but max_model_len is 32"):
        engine.add_request("a", list(range(32)))
    engine.add_request("ok", list(range(31)), SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    with pytest.raises(RequestError, match="already in use"):
        engine.add_request("ok", [1])
    with pytest.raises(RequestError, match="empty"):
        engine.add_request("b", [])
    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine.add_request("c", [VOCAB])
    (out,) = run_rest(engine)
    assert out.finish_reason == "length" and len(out.token_ids) == 1  # capped by max_model_len


def run_rest(engine):
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    return done


def test_pool_smaller_than_max_model_len_is_an_error(loaded):
    from kvpack.config import ConfigError

    with pytest.raises(ConfigError, match="fewer than --max-model-len 128"):
        make_engine(loaded, num_blocks=4, max_model_len=128)
    engine = make_engine(loaded, num_blocks=4, max_model_len=None)  # defaulted: lowered to fit
    assert engine.max_model_len == 32


def _outputs_of(outs) -> list:
    """Tokens, text, finish and stop reasons (exact), and logprobs, for `_assert_same_outputs`."""
    return [[(o.token_ids, o.text, o.finish_reason, o.stop_reason, o.logprobs) for o in r.outputs] for r in outs]


def _assert_same_outputs(got, want) -> None:
    """Equal but for logprobs, which match to 1e-5 with the same token ids: a step's batch can
    differ between the modes (a float32 matmul over other rows may move the last bits)."""
    assert [[c[:4] for c in r] for r in got] == [[c[:4] for c in r] for r in want]
    for gr, wr in zip(got, want):
        for g, w in zip(gr, wr):
            assert (g[4] is None) == (w[4] is None)
            for gd, wd in zip(g[4] or [], w[4] or []):
                assert gd.keys() == wd.keys() and gd == pytest.approx(wd, abs=1e-5)


@pytest.mark.parametrize("mode", [dict(async_scheduling=False), dict()], ids=["async-output", "async-scheduling"])
def test_async_output_proc_equals_sync(loaded, prompts, monkeypatch, mode):
    """Async output processing (the next step launched before this step's text work), alone or with
    async scheduling (launched before this step's tokens are back, its inputs for them read on the
    device), gives the outputs of the synchronous engine: stop strings (ending sequences whose next
    step is already launched, also while preemption is frequent), stop token ids (with async
    scheduling: ending sequences already in the next step), min / max tokens, n = 2 seeded
    sampling, logprobs; every block free at the end."""
    sync = make_engine(loaded, disable_async_output_proc=True)
    texts = [o.text for o in run(sync, ["Hello", "The cat", "Once"],
                                 SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))]
    stops = [t[len(t) // 2: len(t) // 2 + 2] for t in texts]
    assert all(s.strip() for s in stops), texts
    ref_tokens = reference_greedy(sync, prompts[4])
    params = [
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stops[0]]),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stops[1], "\x00never"]),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stops[2]], min_tokens=3),
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, stop_token_ids=[ref_tokens[3]]),
        SamplingParams(n=2, temperature=1.0, top_p=0.9, seed=3, max_tokens=7, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=0),
    ]
    reqs = ["Hello", "The cat", "Once", prompts[4], prompts[5], prompts[6]]
    late = []
    real_finish_late = LLMEngine._finish_late

    def finish_late(self, seq, reason):
        late.append(self._inflight is not None and seq in self._inflight[0].seqs)
        real_finish_late(self, seq, reason)

    monkeypatch.setattr(LLMEngine, "_finish_late", finish_late)
    for kw in ({}, {"num_blocks": 12, "max_model_len": 64}):  # 12 blocks of 8 tokens: preemption
        sync = make_engine(loaded, disable_async_output_proc=True, **kw)
        want = _outputs_of(run(sync, reqs, params))
        n_sync = len(late)
        assert not any(late)  # synchronous: nothing is in flight when a stop string is found
        engine = make_engine(loaded, **kw, **mode)
        assert engine.async_output_proc and engine.async_scheduling == (mode == {})
        got = _outputs_of(run(engine, reqs, params))
        _assert_same_outputs(got, want)
        # the token a launched step sampled for a sequence that had ended is dropped, not counted
        assert engine.counters["generation_tokens"] == sync.counters["generation_tokens"]
        assert any(late[n_sync:])  # some stop string ended a sequence whose next step was launched
        assert [r[0][2] for r in got[:3]] == ["stop"] * 3 and got[3][0][3] == ref_tokens[3]
        assert (engine.scheduler.num_preemptions > 0) == bool(kw)
        late.clear()


def test_async_output_proc_overlaps_text_with_the_next_step(loaded, prompts, monkeypatch):
    """With async output processing the text work of a step runs while the next step is launched
    (and not yet waited for); without it, never."""
    seen = {}
    real = LLMEngine._process_text

    def process_text(self, seq):
        seen.setdefault(self.async_output_proc, []).append(self._inflight is not None)
        real(self, seq)

    monkeypatch.setattr(LLMEngine, "_process_text", process_text)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for flag in (False, True):
        run(make_engine(loaded, disable_async_output_proc=not flag), prompts[:3], sp)
    assert not any(seen[False])
    assert sum(seen[True]) >= 3 * 5  # all but each sequence's last token


def test_async_scheduling_launches_before_waiting(loaded, prompts, monkeypatch):
    """With async scheduling two steps are in flight at the sampler's host sync (the next one was
    launched before this one's tokens were read), one without; sequences whose pending token is
    their last by length are not scheduled again, so without stop tokens or strings the same
    tokens are computed as by the synchronous engine."""
    from kvpack.engine import model_runner

    state = {"in_flight": 0, "max": 0}
    launch, result = model_runner.ModelRunner.launch, model_runner.PendingRunnerOutput.result

    def counted_launch(self, *a, **kw):
        state["in_flight"] += 1
        return launch(self, *a, **kw)

    def counted_result(self):
        state["max"] = max(state["max"], state["in_flight"])
        state["in_flight"] -= 1
        return result(self)

    monkeypatch.setattr(model_runner.ModelRunner, "launch", counted_launch)
    monkeypatch.setattr(model_runner.PendingRunnerOutput, "result", counted_result)
    sp = [SamplingParams(temperature=0, max_tokens=1 + i % 5, ignore_eos=True) for i in range(8)]
    computed, peaks = {}, {}
    for name, kw in [("sync", dict(disable_async_output_proc=True)), ("async", dict())]:
        state.update(in_flight=0, max=0)
        engine = make_engine(loaded, **kw)
        outs = run(engine, prompts[:8], sp)
        assert [len(o.token_ids) for o in outs] == [1 + i % 5 for i in range(8)]
        computed[name], peaks[name] = engine.counters["computed_tokens"], state["max"]
    assert peaks == {"sync": 1, "async": 2}
    assert computed["async"] == computed["sync"]
