"""Paged KV block allocation with reference counts and prefix caching.

Every physical block is either in use (`ref_count > 0`) or on the free queue. A FULL block whose
K/V has been computed is registered under a chained hash `h_i = H(h_{i-1}, tokens of block i)`,
so equal prefixes (same tokens from position 0) map to the same blocks. A freed block keeps its
registration while it waits on the free queue: a later prompt with that prefix takes it back
without recomputing it (a prefix-cache hit). New blocks are taken from the head of the free queue,
evicting the least recently freed cached block first (LRU). The KV format is fixed per engine, so
it is not part of the hash.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict

from kvpack.engine.sequence import Sequence


def hash_block(parent: int, token_ids: list[int] | tuple[int, ...]) -> int:
    """64-bit chained hash of one full block: depends on every token since position 0."""
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<Q", parent))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return int.from_bytes(h.digest(), "little")


_ROOT_HASH = 0


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None  # set while registered in the prefix cache
        self.token_ids: tuple[int, ...] = ()  # the tokens behind `hash` (guards hash collisions)

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, hash={self.hash})"


class BlockManager:
    """Allocates blocks to sequences; `num_blocks` physical blocks of `block_size` tokens each."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free queue in eviction order: head = least recently freed. Values unused.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # hash -> block id
        # Prefix-cache counters (tokens).
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    # ---- queries -------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any sequence (including freed blocks still in the prefix cache)."""
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def prefix_hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- allocation ----------------------------------------------------------------------------

    def _lookup_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Cached blocks (and their hashes) covering the longest computed prefix of `seq`.

        At most `len(seq) - 1` tokens can hit: the last token must run through the model to
        produce the logits of the next one.
        """
        if not self.enable_prefix_caching:
            return [], []
        ids, bs = seq.token_ids, self.block_size
        hits, hashes, parent = [], [], _ROOT_HASH
        for i in range((len(ids) - 1) // bs):
            tokens = tuple(ids[i * bs:(i + 1) * bs])
            h = hash_block(parent, tokens)
            block_id = self.cached.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
            hashes.append(h)
            parent = h
        return hits, hashes

    def cached_prefix_len(self, seq: Sequence) -> int:
        """Tokens of `seq` that the prefix cache would serve now (no side effects)."""
        return len(self._lookup_prefix(seq)[0]) * self.block_size

    def can_allocate(self, seq: Sequence, reserve: int = 0) -> bool:
        hits, _ = self._lookup_prefix(seq)
        return self._fits(seq, hits, reserve)

    def _fits(self, seq: Sequence, hits: list[int], reserve: int) -> bool:
        # A hit on a free (cached) block still takes it off the free queue.
        in_use_hits = sum(1 for b in hits if self.blocks[b].ref_count > 0)
        return self.blocks_needed(len(seq)) - in_use_hits + reserve <= len(self.free_queue)

    def allocate(self, seq: Sequence, reserve: int = 0) -> bool:
        """Give `seq` (with an empty block table) blocks for all its tokens; False if they do not fit
        with `reserve` blocks still free after them.

        Leading full blocks found in the prefix cache are shared, and `seq.num_computed_tokens`
        (= `seq.num_cached_tokens`) skips them.
        """
        assert not seq.block_table, f"{seq} already holds blocks"
        hits, hashes = self._lookup_prefix(seq)
        if not self._fits(seq, hits, reserve):
            return False
        for block_id in hits:
            self._take(block_id)
        table = list(hits)
        for _ in range(self.blocks_needed(len(seq)) - len(hits)):
            table.append(self._pop_free())
        seq.block_table = table
        seq.block_hashes = list(hashes)
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        if self.enable_prefix_caching:
            self.num_queried_tokens += len(seq)
            self.num_hit_tokens += seq.num_cached_tokens
        return True

    def can_append_slot(self, seq: Sequence) -> bool:
        return self.blocks_needed(len(seq)) - len(seq.block_table) <= len(self.free_queue)

    def append_slot(self, seq: Sequence) -> bool:
        """Grow the block table to cover every token of `seq` (after decoding); False if no room."""
        need = self.blocks_needed(len(seq)) - len(seq.block_table)
        if need > len(self.free_queue):
            return False
        for _ in range(need):
            seq.block_table.append(self._pop_free())
        return True

    def free(self, seq: Sequence) -> None:
        """Release `seq`'s blocks. Its tail is queued first, so it is evicted before its prefix."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            assert block.ref_count > 0, block
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the full blocks of `seq` whose K/V is now computed (call after each step)."""
        if not self.enable_prefix_caching:
            return
        bs, ids = self.block_size, seq.token_ids
        parent = seq.block_hashes[-1] if seq.block_hashes else _ROOT_HASH
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            tokens = tuple(ids[i * bs:(i + 1) * bs])
            h = hash_block(parent, tokens)
            seq.block_hashes.append(h)
            parent = h
            block = self.blocks[seq.block_table[i]]
            if h not in self.cached:  # else an equal block exists already; this copy stays private
                self.cached[h] = block.block_id
                block.hash, block.token_ids = h, tokens

    # ---- internals -----------------------------------------------------------------------------

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_queue[block_id]
        block.ref_count += 1

    def _pop_free(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        assert block.ref_count == 0, block
        if block.hash is not None:  # evict from the prefix cache
            if self.cached.get(block.hash) == block_id:
                del self.cached[block.hash]
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id

    def check_invariants(self) -> None:
        """Consistency checks for tests: ref counts, free queue and hash map agree."""
        for b in self.blocks:
            assert b.ref_count >= 0, b
            assert (b.ref_count == 0) == (b.block_id in self.free_queue), b
        for h, block_id in self.cached.items():
            assert self.blocks[block_id].hash == h
