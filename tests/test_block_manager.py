"""Block manager (tier f): reference counts, prefix-cache hits, LRU eviction, no leaks."""

from __future__ import annotations

import random

import pytest

from kvpack.engine.block_manager import BlockManager, hash_block
from kvpack.engine.sequence import Sequence
from kvpack.sampling_params import SamplingParams

BS = 4


def make_seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams())


def compute_all(bm: BlockManager, seq: Sequence, store: dict | None = None) -> None:
    """Pretend the model ran over every uncomputed token except none: all tokens get K/V."""
    if store is not None:
        write_fake_kv(bm, seq, seq.num_computed_tokens, len(seq), store)
    seq.num_computed_tokens = len(seq)
    bm.cache_computed_blocks(seq)


def write_fake_kv(bm: BlockManager, seq: Sequence, start: int, end: int, store: dict) -> None:
    # The "K/V" of position p is a function of the whole prefix, as real K/V is.
    for p in range(start, end):
        slot = seq.block_table[p // bm.block_size] * bm.block_size + p % bm.block_size
        store[slot] = tuple(seq.token_ids[: p + 1])


def test_allocate_free_refcounts():
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = make_seq(list(range(9)))  # 3 blocks (4 + 4 + 1)
    assert bm.can_allocate(a) and bm.allocate(a)
    assert len(a.block_table) == 3 and len(set(a.block_table)) == 3
    assert bm.num_free_blocks == 7
    assert all(bm.blocks[b].ref_count == 1 for b in a.block_table)
    # Decoding to 12 tokens fits in the third block; the 13th needs a fourth.
    a.token_ids += [100, 101, 102]
    assert bm.append_slot(a) and len(a.block_table) == 3
    a.token_ids.append(103)
    assert bm.append_slot(a) and len(a.block_table) == 4
    bm.free(a)
    assert bm.num_free_blocks == 10 and a.block_table == []
    bm.check_invariants()


def test_allocate_fails_when_full_and_takes_nothing():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = make_seq(list(range(8)))
    assert bm.allocate(a)
    b = make_seq(list(range(50, 59)))  # needs 3 blocks, 1 free
    assert not bm.can_allocate(b) and not bm.allocate(b)
    assert bm.num_free_blocks == 1 and b.block_table == []
    a.token_ids += [1, 2, 3, 4, 5]  # needs blocks 3 and 4: only one free
    assert not bm.append_slot(a)
    assert len(a.block_table) == 2
    bm.free(a)
    assert bm.num_free_blocks == 3


def test_prefix_hit_shares_blocks_and_skips_compute():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = make_seq(list(range(10)))
    bm.allocate(a)
    compute_all(bm, a)
    b = make_seq(list(range(8)) + [77, 78, 79])  # same first two full blocks
    assert bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] not in a.block_table
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert [bm.blocks[i].ref_count for i in b.block_table[:2]] == [2, 2]
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 16
    assert bm.num_hit_tokens == 8 and bm.num_queried_tokens == 10 + 11
    bm.check_invariants()


def test_hit_after_free_comes_back_from_free_queue():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq(list(range(13)))
    bm.allocate(a)
    compute_all(bm, a)
    first3 = a.block_table[:3]
    bm.free(a)
    assert bm.num_free_blocks == 8
    b = make_seq(list(range(13)))
    bm.allocate(b)
    assert b.block_table[:3] == first3 and b.num_computed_tokens == 12
    assert bm.num_free_blocks == 8 - 4
    bm.free(b)
    bm.check_invariants()


def test_last_token_never_hits():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq(list(range(8)))
    bm.allocate(a)
    compute_all(bm, a)
    b = make_seq(list(range(8)))  # identical, block aligned: only the first block may hit
    bm.allocate(b)
    assert b.num_computed_tokens == 4
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_hash_is_chained_on_the_prefix():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(a)
    compute_all(bm, a)
    b = make_seq([0, 2, 3, 4, 5, 6, 7, 8, 9])  # second block equal, first differs
    bm.allocate(b)
    assert b.num_computed_tokens == 0 and not set(b.block_table) & set(a.block_table)
    assert hash_block(0, [1, 2]) != hash_block(1, [1, 2]) != hash_block(0, [2, 1])


def test_uncomputed_blocks_are_not_hit():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq(list(range(10)))
    bm.allocate(a)
    a.num_computed_tokens = 4  # one chunk of prefill done
    bm.cache_computed_blocks(a)
    b = make_seq(list(range(10)))
    bm.allocate(b)
    assert b.num_computed_tokens == 4  # only the computed block


def test_prefix_caching_disabled():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = make_seq(list(range(10)))
    bm.allocate(a)
    compute_all(bm, a)
    b = make_seq(list(range(10)))
    bm.allocate(b)
    assert b.num_computed_tokens == 0 and not bm.cached
    assert bm.prefix_hit_rate == 0.0


def test_lru_eviction_order():
    """Freed cached blocks are evicted least recently freed first, a sequence's tail before its head."""
    bm = BlockManager(num_blocks=6, block_size=BS)
    prompts = [[base + i for i in range(8)] for base in (0, 100, 200)]
    for p in prompts:  # computed and freed in this order
        s = make_seq(p)
        bm.allocate(s)
        compute_all(bm, s)
        bm.free(s)
    assert len(bm.cached) == 6 and bm.num_free_blocks == 6
    probes = [make_seq(p + [1]) for p in prompts]  # each could hit both its blocks
    assert [bm.cached_prefix_len(s) for s in probes] == [8, 8, 8]
    y = make_seq([999] * 4)  # one fresh block: evicts prompt 0's tail block
    bm.allocate(y)
    assert [bm.cached_prefix_len(s) for s in probes] == [4, 8, 8]
    x = make_seq([555] * 8)  # two more: prompt 0's head, then prompt 1's tail
    bm.allocate(x)
    assert [bm.cached_prefix_len(s) for s in probes] == [0, 4, 8]
    bm.free(x)  # x's blocks go to the back of the queue; prompt 1's head is next to go
    z = make_seq([777] * 4)
    bm.allocate(z)
    assert [bm.cached_prefix_len(s) for s in probes] == [0, 0, 8]
    for s in (y, z):
        bm.free(s)
    bm.check_invariants()
    assert bm.num_free_blocks == 6


def test_evicted_block_is_unregistered():
    bm = BlockManager(num_blocks=2, block_size=BS)
    a = make_seq(list(range(5)))
    bm.allocate(a)
    compute_all(bm, a)
    bm.free(a)
    assert len(bm.cached) == 1
    b = make_seq(list(range(50, 58)))  # takes both blocks, evicting a's cached block
    bm.allocate(b)
    assert bm.num_free_blocks == 0 and not bm.cached
    bm.free(b)
    c = make_seq(list(range(5)))
    bm.allocate(c)
    assert c.num_computed_tokens == 0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("caching", [True, False])
def test_random_workload_no_leaks_and_hits_are_correct(seed, caching):
    """Random admit/decode/free with shared prefixes; a fake KV store checks that every hit block
    holds exactly the K/V of the new sequence's prefix, and nothing leaks."""
    rng = random.Random(seed)
    bm = BlockManager(num_blocks=40, block_size=BS, enable_prefix_caching=caching)
    store: dict[int, tuple] = {}
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 14))] for _ in range(4)]
    live: list[Sequence] = []
    hits = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.4:
            tokens = list(rng.choice(prefixes)) + [rng.randrange(50) for _ in range(rng.randrange(0, 6))]
            if not tokens:
                continue
            s = make_seq(tokens)
            if bm.allocate(s):
                for p in range(s.num_computed_tokens):  # hit blocks hold this prefix's K/V
                    slot = s.block_table[p // BS] * BS + p % BS
                    assert store[slot] == tuple(s.token_ids[: p + 1])
                hits += s.num_computed_tokens
                # Compute in one or two chunks.
                mid = rng.randrange(s.num_computed_tokens, len(s) + 1)
                write_fake_kv(bm, s, s.num_computed_tokens, mid, store)
                s.num_computed_tokens = mid
                bm.cache_computed_blocks(s)
                compute_all(bm, s, store)
                live.append(s)
        elif op < 0.8 and live:
            s = rng.choice(live)  # decode one token
            s.token_ids.append(rng.randrange(50))
            if bm.append_slot(s):
                compute_all(bm, s, store)
            else:
                s.token_ids.pop()
        elif live:
            bm.free(live.pop(rng.randrange(len(live))))
        bm.check_invariants()
        held = sum(len(s.block_table) for s in live)
        assert bm.num_used_blocks <= held  # shared blocks counted once
    for s in live:
        bm.free(s)
    bm.check_invariants()
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert (hits > 0) == caching
