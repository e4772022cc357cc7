"""Per-step attention metadata: how the flattened batch maps onto the paged KV cache.

A step's batch is a flat run of `T` new tokens from `B` sequences, each sequence contributing
a prefill chunk (any length) or one decode token. Sequence `b` owns query tokens
`query_start_loc[b]:query_start_loc[b+1]`; after this step it holds `seq_lens[b]` tokens in
the cache (the cached prefix plus its new tokens). Query token `i` of sequence `b` sits at
position `seq_lens[b] - q_len[b] + i` and attends causally to cache positions `0..position`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

# Prefill workspace (`PrefillWorkspace`): quantized caches are dequantized once per step into a
# float16 scratch copy of the batch's blocks when the prefill kernel would otherwise dequantize
# each KV tile for many query tiles (compute-bound prefill; measured in results/prefill_s7).
WORKSPACE_ENV = "KVPACK_PREFILL_WORKSPACE"  # "0": never, "1": whenever it fits, else the reuse rule
WORKSPACE_TOKENS_ENV = "KVPACK_PREFILL_WORKSPACE_TOKENS"
WORKSPACE_MAX_TOKENS = 32768  # cap on the workspace (tokens of one layer's K and V, all kv heads)
WORKSPACE_TILE_TOKENS = 32  # query tokens per prefill program (128 rows at GQA 4)
WORKSPACE_MIN_REUSE = 8  # query tiles per KV block, on average, for the workspace to pay off
BLOCK_TABLE_ALIGN = 16  # block-table columns padded to a multiple of this (see `block_table_width`)


def block_table_width(max_blocks: int) -> int:
    """Columns of a batch's block table: its longest table, padded with zeros to a multiple of
    BLOCK_TABLE_ALIGN. Triton specializes a kernel on whether an integer argument is a multiple of 16;
    the tables' row stride, left to vary with the batch, made the attention kernels compile again in
    the middle of a run (`benchmarks/probe_specializations.py`)."""
    return -(-max(int(max_blocks), 1) // BLOCK_TABLE_ALIGN) * BLOCK_TABLE_ALIGN


def workspace_max_tokens() -> int:
    """The workspace cap in tokens: $KVPACK_PREFILL_WORKSPACE_TOKENS, else WORKSPACE_MAX_TOKENS
    (0 when $KVPACK_PREFILL_WORKSPACE is "0")."""
    if os.environ.get(WORKSPACE_ENV, "") == "0":
        return 0
    raw = os.environ.get(WORKSPACE_TOKENS_ENV, "")
    try:
        return max(0, int(raw)) if raw else WORKSPACE_MAX_TOKENS
    except ValueError:
        raise ValueError(f"{WORKSPACE_TOKENS_ENV}={raw!r} is not a whole number of tokens") from None


@dataclass
class PrefillWorkspace:
    """Where the prefill kernel reads a dequantized copy of the batch's KV blocks (quantized caches).

    src_blocks:   [N] int32, the physical block behind each workspace block (every block of every
                  sequence of the batch, in order).
    block_tables: [B, max_blocks] int32, the batch's block tables renumbered into the workspace.
    num_blocks:   N (a Python int: the workspace is [N, Hkv, block_size, D] float16 per side).
    """

    src_blocks: torch.Tensor
    block_tables: torch.Tensor
    num_blocks: int

    @staticmethod
    def plan(query_lens, seq_lens, tables: np.ndarray, block_size: int, device,
             force: bool | None = None) -> "PrefillWorkspace | None":
        """The workspace for one step, or None where the fused kernel is the better choice.

        tables: [B, max_blocks] int32 block tables. Rule: a workspace costs one pass over the
        batch's blocks (read the codes, write float16) plus float16 reads in the kernel, the fused
        kernel one dequantization per KV tile per query tile (WORKSPACE_TILE_TOKENS query tokens)
        that reads it; so the workspace is planned when the blocks are read by >= WORKSPACE_MIN_REUSE
        query tiles on average and hold <= `workspace_max_tokens()` tokens. force=True plans it
        whenever it fits the cap, force=False never ($KVPACK_PREFILL_WORKSPACE "1" / "0" likewise)."""
        env = os.environ.get(WORKSPACE_ENV, "")
        if force is None and env in ("0", "1"):
            force = env == "1"
        if force is False or len(seq_lens) == 0:
            return None
        q = np.asarray(query_lens, dtype=np.int64)
        nblk = (np.asarray(seq_lens, dtype=np.int64) + block_size - 1) // block_size
        total = int(nblk.sum())
        if total == 0 or total * block_size > workspace_max_tokens():
            return None
        tiles = (q + WORKSPACE_TILE_TOKENS - 1) // WORKSPACE_TILE_TOKENS
        if not force and int((tiles * nblk).sum()) < WORKSPACE_MIN_REUSE * total:
            return None
        cols = np.arange(tables.shape[1])[None, :]
        used = cols < nblk[:, None]
        starts = np.cumsum(nblk) - nblk
        ws_tables = np.where(used, starts[:, None] + cols, 0).astype(np.int32)
        src = np.ascontiguousarray(tables[used], dtype=np.int32)  # row-major: sequence by sequence
        if src.size != total:  # a table shorter than its sequence: leave it to the kernel's checks
            return None

        def dev(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(x).to(device, non_blocking=True)

        return PrefillWorkspace(dev(src), dev(ws_tables), total)

    def to(self, device: torch.device | str) -> "PrefillWorkspace":
        return PrefillWorkspace(self.src_blocks.to(device), self.block_tables.to(device), self.num_blocks)


@dataclass
class AttentionMetadata:
    """Tensors live on the model's device.

    slot_mapping:    [T] int64, cache slot of each new token (block_id * block_size + offset);
                     -1 means "write nothing" (padding tokens, e.g. in CUDA graphs).
    query_start_loc: [B + 1] int32, cumulative query lengths, query_start_loc[0] == 0.
    seq_lens:        [B] int32, context length of each sequence after this step.
    block_tables:    [B, W] int32, physical block ids, padded with 0 to W = `block_table_width` (a multiple of 16).
    max_query_len / max_seq_len: Python ints, the maxima of the above (for kernel grids).
    workspace:       a `PrefillWorkspace` (the prefill kernel then reads quantized caches through a
                     float16 copy), or None.
    decode_split:    for a batch that starts with one-token rows (decodes) and has longer ones, the
                     metadata of those leading rows and of the rest, each built alone (the rest with
                     its own workspace): `kernels.paged_attention` runs the first through the decode
                     kernel and the second through the prefill kernel; None otherwise. The engine's
                     builder (`model_runner.build_metadata`) then plans no workspace for the whole.
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_query_len: int
    max_seq_len: int
    workspace: PrefillWorkspace | None = None
    decode_split: "tuple[AttentionMetadata, AttentionMetadata] | None" = None
    _derived: dict = field(default_factory=dict, repr=False, compare=False)

    def derived(self, key: Any, make: Callable[[], Any]) -> Any:
        """What a kernel launcher computes from this step's metadata alone, made once (`make()`) and
        reused by every layer of the step (e.g. the prefill kernel's tile map: ~10 device ops a
        layer of host work otherwise). `key` names it and everything it depends on besides the
        metadata."""
        value = self._derived.get(key)
        if value is None:
            value = self._derived[key] = make()
        return value

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1

    def to(self, device: torch.device | str) -> "AttentionMetadata":
        return AttentionMetadata(
            slot_mapping=self.slot_mapping.to(device),
            query_start_loc=self.query_start_loc.to(device),
            seq_lens=self.seq_lens.to(device),
            block_tables=self.block_tables.to(device),
            max_query_len=self.max_query_len,
            max_seq_len=self.max_seq_len,
            workspace=self.workspace.to(device) if self.workspace is not None else None,
            decode_split=(None if self.decode_split is None
                          else (self.decode_split[0].to(device), self.decode_split[1].to(device))),
        )

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str = "cpu",
        workspace: bool | None = None,
    ) -> "AttentionMetadata":
        """Build metadata from Python lists (the engine's and the tests' common path). Batches
        with a prefill get a `PrefillWorkspace` where its rule says so (workspace=None), always
        when it fits (True), or never (False)."""
        assert len(query_lens) == len(seq_lens) == len(block_tables)
        slots: list[int] = []
        for q, s, table in zip(query_lens, seq_lens, block_tables):
            assert 0 < q <= s, (q, s)
            for pos in range(s - q, s):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        max_blocks = block_table_width(max((len(t) for t in block_tables), default=1))
        bt = torch.zeros(len(block_tables), max_blocks, dtype=torch.int32)
        for i, t in enumerate(block_tables):
            if t:
                bt[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        qsl = [0]
        for q in query_lens:
            qsl.append(qsl[-1] + q)
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=bt.to(device),
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
            workspace=(PrefillWorkspace.plan(query_lens, seq_lens, bt.numpy(), block_size, device, workspace)
                       if max(query_lens, default=0) > 1 else None),
            decode_split=split_leading_decodes(query_lens, seq_lens, block_tables,
                                               lambda *a: cls.build(*a, block_size, device, workspace)),
        )


def num_leading_decodes(query_lens) -> int:
    """How many rows at the head of the batch have one query token (the scheduler puts decodes first)."""
    n = 0
    for q in query_lens:
        if q != 1:
            break
        n += 1
    return n


def split_leading_decodes(query_lens, seq_lens, block_tables, build):
    """(metadata of the leading one-token rows, metadata of the rest) for a batch that has both, else
    None. The decode kernel reads long contexts split-K and GQA-packed, where the prefill kernel gives a
    one-token row a whole query tile; and the rest's workspace then covers its own blocks only, so
    decode rows' contexts no longer push it past its cap (H200, Llama-8B heads, an 8192-token chunk next
    to 26-82 rows of 5k context: 5-29 % less attention time, results/engine_s11/probe_mixed_step_*.log)."""
    nd = num_leading_decodes(query_lens)
    if nd == 0 or nd == len(query_lens):
        return None
    q, s, t = list(query_lens), list(seq_lens), list(block_tables)
    return build(q[:nd], s[:nd], t[:nd]), build(q[nd:], s[nd:], t[nd:])
