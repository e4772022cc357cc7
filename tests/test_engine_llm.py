"""The `LLM` entry point (vLLM's shapes) and the output/stop-string plumbing of `Sequence`."""

from __future__ import annotations

import pytest
import torch

from kvpack import LLM, SamplingParams
from kvpack.config import KVPackError
from kvpack.engine.outputs import completion_of
from kvpack.engine.sequence import Sequence

GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("dummy:tiny-llama", dtype="float32", device="cpu", max_model_len=256, num_blocks=128)


def test_generate_shapes_and_order(llm):
    prompts = ["a much longer prompt than the others, to finish later", "hi", "mid-size prompt"]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    tok = llm.get_tokenizer()
    for o, p in zip(outs, prompts):
        assert o.prompt_token_ids == tok.encode(p)
        assert o.finished and o.finish_reason == "length" and len(o.token_ids) == 5
        assert o.outputs[0].text == o.text and o.outputs[0].token_ids == o.token_ids
    single = llm.generate(prompts[1], GREEDY)
    assert len(single) == 1 and single[0].token_ids == outs[1].token_ids
    by_ids = llm.generate([tok.encode(p) for p in prompts], GREEDY)
    assert [o.token_ids for o in by_ids] == [o.token_ids for o in outs]
    one_ids = llm.generate(tok.encode(prompts[2]), GREEDY)
    assert len(one_ids) == 1 and one_ids[0].token_ids == outs[2].token_ids
    assert llm.llm_engine.num_free_blocks == llm.llm_engine.num_total_blocks


def test_per_prompt_params(llm):
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (1, 3, 2)]
    outs = llm.generate(["x", "y", "z"], params)
    assert [len(o.token_ids) for o in outs] == [1, 3, 2]
    with pytest.raises(KVPackError, match="2 sampling params for 3 prompts"):
        llm.generate(["x", "y", "z"], params[:2])
    assert not llm.llm_engine.has_unfinished_requests()


def test_bad_prompt_leaves_engine_clean(llm):
    with pytest.raises(KVPackError, match="prompt has"):
        llm.generate(["ok", "w" * 400], GREEDY)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.num_free_blocks == llm.llm_engine.num_total_blocks


def test_chat_uses_the_template(llm):
    messages = [{"role": "user", "content": "Hello"}]
    out = llm.chat(messages, GREEDY)[0]
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert "<|im_start|>assistant" in text
    assert out.prompt_token_ids == tok.encode(text, add_special_tokens=False)
    assert out.token_ids == llm.generate([out.prompt_token_ids], GREEDY)[0].token_ids
    two = llm.chat([messages, messages + [{"role": "assistant", "content": "Hi"}]], GREEDY)
    assert len(two) == 2 and two[0].token_ids == out.token_ids


def test_default_sampling_params_are_vllms(llm):
    outs = llm.generate(["abc"], SamplingParams(ignore_eos=True, seed=3))
    assert len(outs[0].token_ids) == 16  # max_tokens 16, temperature 1


def _seq(stop):
    return Sequence("r", [1, 2, 3], SamplingParams(stop=stop))


def test_stop_string_found_across_chunks_and_held_back():
    s = _seq(["STOP", "xyz"])
    for chunk in ["hello S", "TO", "P and more"]:
        s.add_text(chunk)
        if s.find_stop_string():
            break
        # While running, the last len("STOP") - 1 characters are held back from the output.
        assert completion_of(s).text == s.output_text[: len(s.output_text) - 3]
    assert s.output_text == "hello " and s.stop_reason == "STOP"


def test_earliest_stop_string_wins():
    s = _seq(["bb", "a"])
    s.add_text("xxbba")
    assert s.find_stop_string() and s.output_text == "xx" and s.stop_reason == "bb"


def test_fast_metadata_equals_the_reference_build():
    import random

    from kvpack.attention.metadata import AttentionMetadata
    from kvpack.engine.model_runner import build_metadata

    rng = random.Random(0)
    for _ in range(50):
        bs = rng.choice([8, 16])
        b = rng.randrange(1, 9)
        seq_lens = [rng.randrange(1, 100) for _ in range(b)]
        query_lens = [rng.choice([1, rng.randrange(1, s + 1)]) for s in seq_lens]
        tables = [rng.sample(range(500), -(-s // bs) + rng.randrange(0, 3)) for s in seq_lens]
        want = AttentionMetadata.build(query_lens, seq_lens, tables, bs)
        got, positions = build_metadata(query_lens, seq_lens, tables, bs)
        for f in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
            a, w = getattr(got, f), getattr(want, f)
            assert a.dtype == w.dtype and torch.equal(a, w), f
        assert (got.max_query_len, got.max_seq_len) == (want.max_query_len, want.max_seq_len)
        assert positions.dtype == torch.int64
        assert positions.tolist() == [p for q, s in zip(query_lens, seq_lens) for p in range(s - q, s)]


def test_block_tables_padded_to_16_columns():
    """Block tables are padded with zeros to a multiple of 16 columns (both builders), so their row
    stride never changes Triton's specialization of the attention kernels between steps; the CUDA
    graph buffers take the padded width for the longest context."""
    from kvpack.attention.metadata import AttentionMetadata, block_table_width
    from kvpack.engine.model_runner import build_metadata

    assert [block_table_width(n) for n in (0, 1, 15, 16, 17, 544, 545)] == [16, 16, 16, 16, 32, 544, 560]
    tables = [list(range(3)), list(range(10, 30))]
    for md in (AttentionMetadata.build([1, 5], [40, 300], tables, 16),
               build_metadata([1, 5], [40, 300], tables, 16)[0]):
        assert md.block_tables.shape == (2, 32) and md.block_tables.stride(0) % 16 == 0
        assert md.block_tables[0, :3].tolist() == [0, 1, 2] and md.block_tables[0, 3:].eq(0).all()
        assert md.block_tables[1, :20].tolist() == list(range(10, 30)) and md.block_tables[1, 20:].eq(0).all()
