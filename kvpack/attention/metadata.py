"""Per-step attention metadata: how the flattened batch maps onto the paged KV cache.

A step's batch is a flat run of `T` new tokens from `B` sequences, each sequence contributing
a prefill chunk (any length) or one decode token. Sequence `b` owns query tokens
`query_start_loc[b]:query_start_loc[b+1]`; after this step it holds `seq_lens[b]` tokens in
the cache (the cached prefix plus its new tokens). Query token `i` of sequence `b` sits at
position `seq_lens[b] - q_len[b] + i` and attends causally to cache positions `0..position`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Tensors live on the model's device.

    slot_mapping:    [T] int64, cache slot of each new token (block_id * block_size + offset);
                     -1 means "write nothing" (padding tokens, e.g. in CUDA graphs).
    query_start_loc: [B + 1] int32, cumulative query lengths, query_start_loc[0] == 0.
    seq_lens:        [B] int32, context length of each sequence after this step.
    block_tables:    [B, max_blocks_per_seq] int32, physical block ids, padded with 0.
    max_query_len / max_seq_len: Python ints, the maxima of the above (for kernel grids).
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_query_len: int
    max_seq_len: int

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
        )

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> "AttentionMetadata":
        """Build metadata from Python lists (the engine's and the tests' common path)."""
        assert len(query_lens) == len(seq_lens) == len(block_tables)
        slots: list[int] = []
        for q, s, table in zip(query_lens, seq_lens, block_tables):
            assert 0 < q <= s, (q, s)
            for pos in range(s - q, s):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        max_blocks = max((len(t) for t in block_tables), default=1) or 1
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
        )
