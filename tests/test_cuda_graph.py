"""CUDA-graph decode runner: size selection and padding on CPU; replay == eager on the GPU.

CPU: capture sizes, padding to the next size, static-buffer loading (padding rows write nothing and
attend to nothing), and the runner skipping capture cleanly without CUDA (eager results unchanged).
GPU: for every KV format, replaying a padded graph gives the eager pass's hidden states (within the
split-K reduction-order tolerance) and writes bit-identical cache codes, touching no other slot.
"""

from __future__ import annotations

import pytest
import torch

from kvpack.attention.kv_cache import allocate_kv_cache
from kvpack.attention.metadata import AttentionMetadata, block_table_width
from kvpack.config import CacheConfig
from kvpack.engine.cuda_graph import (
    CUDAGraphModelRunner, GraphBuffers, capture_sizes, context_buckets, padded_size, split_batches,
)
from kvpack.engine.model_runner import get_model_runner_cls
from kvpack.engine.sampler import Sampler
from kvpack.models import load_model

FORMATS = ["bfloat16", "float16", "int8", "int4", "fp8_e4m3", "fp8_e5m2"]


@pytest.mark.parametrize("seqs,tokens,expected", [
    (256, 8192, [1, 2, 4] + list(range(8, 65, 8)) + list(range(80, 257, 16))),
    (5, 8192, [1, 2, 4, 5]),
    (100, 50, [1, 2, 4, 8, 16, 24, 32, 40, 48, 50]),
    (1, 1, [1]),
    (4096, 100000, [1, 2, 4] + list(range(8, 65, 8)) + list(range(80, 513, 16))),
])
def test_capture_sizes(seqs, tokens, expected):
    assert capture_sizes(seqs, tokens) == expected


def test_capture_sizes_every_split_batch():
    # Llama-3.1-8B on an H200: 8 kv heads, 132 SMs -> batches 1..16 still split, each gets its own graphs
    assert split_batches(8, 132) == 16
    assert capture_sizes(256, 8192, every_up_to=split_batches(8, 132)) == \
        list(range(1, 17)) + [24, 32, 40, 48, 56, 64] + list(range(80, 257, 16))
    assert split_batches(3, 132) == 32 and split_batches(2, 132, most=64) == 64 and split_batches(64, 132) == 2
    assert split_batches(256, 132) == 0  # no batch splits: the usual sizes
    assert capture_sizes(5, 8192, every_up_to=16) == [1, 2, 3, 4, 5]
    assert capture_sizes(100, 50, every_up_to=0) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 50]


def test_padded_size():
    sizes = [1, 2, 4, 8, 16, 32]
    assert [padded_size(b, sizes) for b in (1, 2, 3, 5, 8, 9, 17, 32, 33)] == [1, 2, 4, 8, 8, 16, 32, 32, None]


def test_context_buckets():
    assert context_buckets(8704, True) == [1024, 2048, 4096, 8192, 8704]
    assert context_buckets(32768, True) == [1024, 2048, 4096, 8192, 16384, 32768]
    assert context_buckets(500, True) == [500]
    assert context_buckets(131072, False) == [131072]


def test_buffers_padding_rows():
    buf = GraphBuffers.allocate(8, block_table_width(6), 4, torch.float32, torch.device("cpu"))  # as the runner does
    big = AttentionMetadata.build([1] * 8, [5] * 8, [[7, 8]] * 8, 4)
    buf.load(torch.arange(8), torch.full((8,), 4), big, 8)  # a previous, larger batch
    md = AttentionMetadata.build([1, 1, 1], [3, 9, 1], [[2], [4, 5, 6], [9]], 4)
    buf.load(torch.tensor([11, 12, 13]), torch.tensor([2, 8, 0]), md, 4)
    assert buf.input_ids[:3].tolist() == [11, 12, 13] and buf.positions[:3].tolist() == [2, 8, 0]
    assert buf.slot_mapping[:4].tolist() == [2 * 4 + 2, 6 * 4 + 0, 9 * 4 + 0, -1]
    assert buf.seq_lens[:4].tolist() == [3, 9, 1, 0]
    assert buf.block_tables[1, :3].tolist() == [4, 5, 6]
    assert buf.query_start_loc.tolist() == list(range(9))
    gmd = buf.metadata(4, 24)
    assert gmd.num_seqs == 4 and gmd.is_pure_decode and gmd.max_seq_len == 24
    assert gmd.block_tables.shape == (4, 16)


def test_runner_selection_and_cpu_fallback():
    assert get_model_runner_cls(torch.device("cuda"), False) is CUDAGraphModelRunner
    assert get_model_runner_cls(torch.device("cuda"), True) is not CUDAGraphModelRunner
    assert get_model_runner_cls(torch.device("cpu"), False) is not CUDAGraphModelRunner
    loaded = load_model("tiny-llama", dtype="float32", device="cpu")
    kv = allocate_kv_cache(loaded.model_config, CacheConfig(), 16, "cpu", torch.float32)
    runner = CUDAGraphModelRunner(loaded.model, kv, "cpu", Sampler(), (), max_num_seqs=8,
                                  max_num_batched_tokens=64, max_model_len=128)
    runner.warmup()  # no CUDA: logs and captures nothing
    assert not runner.graphs_enabled and runner.buffers is None
    md = AttentionMetadata.build([3], [3], [[0]], 16)
    ids, pos = torch.tensor([5, 6, 7]), torch.arange(3)
    hidden = runner.run_model(ids, pos, md)
    torch.testing.assert_close(hidden, loaded.model(ids, pos, kv, md), rtol=0, atol=0)
    assert runner.num_replays == 0


@pytest.mark.parametrize("fmt", ["bfloat16", "int8", "int4"])
def test_warmup_eager_writes_nothing(fmt):
    """`warmup_eager` (run before serving on CUDA) runs its dummy prefill and mixed batches through the
    model, decode rows split off, and leaves every byte of the cache as it was (slot -1). On CPU a
    plain `warmup()` runs none of them."""
    loaded = load_model("tiny-llama", dtype="float32", device="cpu")
    kv = allocate_kv_cache(loaded.model_config, CacheConfig(kv_cache_dtype=fmt), 12, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(0)
    for layer in kv.layers:
        for pool in (layer.k, layer.v):
            for t in (pool.codes, pool.scales, pool.zeros):
                if t is not None:
                    t.copy_(torch.randint(0, 100, t.shape, generator=gen).to(t.dtype))
    before = [t.clone() for layer in kv.layers for pool in (layer.k, layer.v)
              for t in (pool.codes, pool.scales, pool.zeros) if t is not None]
    runner = CUDAGraphModelRunner(loaded.model, kv, "cpu", Sampler(), (), max_num_seqs=8,
                                  max_num_batched_tokens=64, max_model_len=300)
    seen = []
    real = loaded.model.forward

    def spy(ids, pos, cache, md):
        seen.append((ids.shape[0], md.max_query_len, md.max_seq_len, md.decode_split is not None))
        return real(ids, pos, cache, md)

    loaded.model.forward = spy
    try:
        runner.warmup()  # CPU: nothing
        assert seen == []
        assert runner.warmup_eager(force=True) == 4
    finally:
        del loaded.model.forward
    # context min(max_model_len, 4096) = 300; chunks min(2048, 64 - 4 decodes) = 60 and 60; no batch
    # of >= ROW_MIN_TOKENS (1024) tokens fits in 64
    assert seen == [(60, 60, 300, False), (60, 60, 300, False), (64, 60, 300, True), (64, 60, 300, True)]
    # with room for 2048 tokens a step, the chunks (300) still miss the write's row layout: four whole
    # prompts of 256 tokens add up to it
    seen.clear()
    runner = CUDAGraphModelRunner(loaded.model, kv, "cpu", Sampler(), (), max_num_seqs=8,
                                  max_num_batched_tokens=2048, max_model_len=300)
    loaded.model.forward = spy
    try:
        assert runner.warmup_eager(force=True) == 5
    finally:
        del loaded.model.forward
    assert seen[-1] == (1024, 256, 256, False) and all(s[0] < 1024 for s in seen[:-1])
    after = [t for layer in kv.layers for pool in (layer.k, layer.v)
             for t in (pool.codes, pool.scales, pool.zeros) if t is not None]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


# ---- GPU ------------------------------------------------------------------------------------------

def _prefill(model, kv, lens, tables, block_size, gen):
    ids = torch.randint(0, 500, (sum(lens),), generator=gen).cuda()
    pos = torch.cat([torch.arange(n) for n in lens]).cuda()
    md = AttentionMetadata.build(lens, lens, tables, block_size, "cuda")
    model(ids, pos, kv, md)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@torch.inference_mode()
def test_graph_replay_equals_eager(fmt):
    torch.manual_seed(0)
    loaded = load_model("tiny-llama", dtype="bfloat16", device="cuda", seed=1)
    model, bs_ = loaded.model, 16
    kv = allocate_kv_cache(loaded.model_config, CacheConfig(kv_cache_dtype=fmt, block_size=bs_), 40,
                           "cuda", torch.bfloat16)
    for layer in kv.layers:
        for pool in (layer.k, layer.v):
            for t in (pool.codes, pool.scales, pool.zeros):
                if t is not None:
                    t.zero_()
    runner = CUDAGraphModelRunner(model, kv, "cuda", Sampler(), (), max_num_seqs=8,
                                  max_num_batched_tokens=256, max_model_len=2048)  # split-K grid for 2048
    runner.warmup()
    # 2 kv heads: every batch up to max_num_seqs splits, so each size has its own graphs
    assert runner.sizes == list(range(1, 9)) and runner.graphs_enabled
    assert set(runner.graphs) == {(b, c) for b in range(1, 9) for c in (1024, 2048)}
    gen = torch.Generator().manual_seed(0)
    lens = [5, 17, 33, 64, 1, 100, 48]
    tables, nxt = [], 1
    for n in lens:
        need = -(-(n + 1) // bs_)
        tables.append(list(range(nxt, nxt + need))[::-1])  # reversed: non-monotone block tables
        nxt += need
    _prefill(model, kv, lens, tables, bs_, gen)
    for batch in ([0, 1, 2], [3], list(range(7)), [5, 6]):  # padded to 4, 1, 8, 2
        b_lens = [lens[i] + 1 for i in batch]
        md = AttentionMetadata.build([1] * len(batch), b_lens, [tables[i] for i in batch], bs_, "cuda")
        ids = torch.randint(0, 500, (len(batch),), generator=gen).cuda()
        pos = torch.tensor([lens[i] for i in batch]).cuda()
        before = [(lc.k.codes.clone(), lc.v.codes.clone()) for lc in kv.layers]
        replays = runner.num_replays
        h_graph = runner.run_model(ids, pos, md).clone()
        assert runner.num_replays == replays + 1
        after_graph = [(lc.k.codes.clone(), lc.v.codes.clone()) for lc in kv.layers]
        h_eager = model(ids, pos, kv, md)
        torch.testing.assert_close(h_graph.float(), h_eager.float(), rtol=2e-2, atol=2e-2)
        for (kg, vg), lc, (k0, v0) in zip(after_graph, kv.layers, before):
            assert torch.equal(kg, lc.k.codes) and torch.equal(vg, lc.v.codes)  # same writes
            changed = (kg != k0).flatten(1).any(dim=1).nonzero().flatten().tolist()
            own = {tables[i][p // bs_] for i, p in zip(batch, pos.tolist())}
            assert set(changed) <= own  # padding rows wrote nothing
    # a prefill-shaped batch runs eagerly
    md = AttentionMetadata.build([2], [lens[0] + 2], [tables[0]], bs_, "cuda")
    assert runner.graph_key(torch.zeros(2, dtype=torch.long), md) is None
    md = AttentionMetadata.build([1], [1500], [list(range(94))], bs_, "cuda")
    assert runner.graph_key(torch.zeros(1, dtype=torch.long), md) == (1, 2048)
