"""CUDA graphs for decode: `CUDAGraphModelRunner` replays one captured forward pass per batch size.

Prefill and mixed batches run eagerly. A pure-decode batch of B sequences (one token each) is
padded to the next captured size `bs >= B` and replayed from static input buffers:

    input_ids, positions: [N] int64          slot_mapping: [N] int64 (padding rows -1: write nothing)
    query_start_loc: [N + 1] int32 = arange  seq_lens: [N] int32 (padding rows 0: attend to nothing)
    block_tables: [N, ceil(max_model_len / block_size)] int32      hidden: [N, hidden_size] model dtype

with N the largest captured size. The decode kernel's launch (its split-K grid) is sized from the
batch's `max_seq_len`, so each graph is captured for a context bucket and covers every length up to
it (kernels read the real lengths from `seq_lens` on the device): batches too small to fill the GPU
without splitting (bs * num_kv_heads < SMs) get one graph per power-of-two bucket from 1024 up to
max_model_len, larger batches (one split) a single graph at max_model_len.

What this needs from the attention backend: no host syncs and no allocations whose size depends on
tensor data (checked for kvpack.kernels: the cache write and decode launchers size everything from
shapes and Python ints; rotation matrices and SM counts are cached by the eager warm-up passes).
The PyTorch reference backend is not capturable (it reads lengths on the host): graphs are off with it.

Sizes: 1, 2, 4, 8, then every 8 up to 64 and every 16 up to min(max_num_seqs, max_num_batched_tokens,
512); and every size from 1 to the largest batch whose decode splits across the SMs even with 4-warp
programs (bs * num_kv_heads < SMs; at most `MAX_EVERY_SIZE`). One-warp decode programs still split up to
~8x that batch, hence the denser sizes up to 64 (int8 steps of 33 sequences, padded to 48, took 6.99 ms
against 6.43 for 32 in their own graph: results/kv_budget_s23's 16 GiB run). The split-K grid is
planned for the graph's batch size, so a batch padded to a larger graph gets fewer splits than its own plan: too few programs an SM to hide their latency (session 24,
results/kv_budget_s24: on an H200, Llama-3.1-8B at 2 GiB of KV, int4 decode steps of 9 sequences took
6.83 ms in the 16-sequence graph against 5.99 for 8 in their own; int8 5.83 ms for 5 in the 8-graph
against 5.41 for 4; one layer of int4 at 9 sequences, `probe_varlen_decode.py`: 51.7 us at its own plan's
14 splits, 68.1 at the 8 a 16-sequence plan gives). With every splitting size in its own graphs (session 25,
results/kv_budget_s25) those int4 steps took 6.05 ms at a mean batch of 9, and the run 2.45x bf16's output
tokens/s (2.33x before). Capture cost on the H200, Llama-3.1-8B: 98 graphs (max_model_len 8704) 0.28 GiB,
146 graphs (131072) 0.59 GiB in 13 s.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from kvpack.attention.metadata import AttentionMetadata, block_table_width
from kvpack.engine.model_runner import ModelRunner, register_model_runner

logger = logging.getLogger("kvpack")
MAX_CAPTURE_SIZE = 512
MIN_CONTEXT_BUCKET = 1024
MAX_EVERY_SIZE = 32  # batches up to this many sequences may each get their own graphs (see the module doc)


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, limit: int = MAX_CAPTURE_SIZE,
                  every_up_to: int = 0) -> list[int]:
    """Batch sizes to capture, ascending: every size up to `every_up_to`, and 1, 2, 4, 8, 16, 24, ..., 64, 80,
    96, ... up to the cap (always included)."""
    cap = max(1, min(max_num_seqs, max_num_batched_tokens, limit))
    sizes = {s for s in (1, 2, 4) if s <= cap} | set(range(8, min(64, cap) + 1, 8)) | set(range(16, cap + 1, 16))
    sizes |= {cap}
    return sorted(sizes | set(range(1, min(every_up_to, cap) + 1)))


def split_batches(num_kv_heads: int, sms: int, most: int = MAX_EVERY_SIZE) -> int:
    """The largest batch whose decode still splits across the SMs (bs * num_kv_heads < sms), at most `most`:
    the sizes that get their own graphs."""
    return min(most, max(0, (sms - 1) // max(1, num_kv_heads)))


def padded_size(batch: int, sizes: list[int]) -> int | None:
    """The smallest captured size >= batch, or None when the batch is larger than every graph."""
    for s in sizes:
        if s >= batch:
            return s
    return None


def context_buckets(max_model_len: int, split: bool, lowest: int = MIN_CONTEXT_BUCKET) -> list[int]:
    """Context lengths graphs are captured for, ascending: powers of two from `lowest` below
    max_model_len, then max_model_len; only [max_model_len] when the batch needs no split-K."""
    out = []
    c = lowest
    while split and c < max_model_len:
        out.append(c)
        c *= 2
    return out + [max_model_len]


@dataclass
class GraphBuffers:
    """Static inputs and output shared by every captured graph (views [:bs] per graph)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    hidden: torch.Tensor

    @classmethod
    def allocate(cls, n: int, max_blocks: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device) -> "GraphBuffers":
        i64, i32 = dict(dtype=torch.int64, device=device), dict(dtype=torch.int32, device=device)
        return cls(
            input_ids=torch.zeros(n, **i64), positions=torch.zeros(n, **i64),
            slot_mapping=torch.full((n,), -1, **i64), query_start_loc=torch.arange(n + 1, **i32),
            seq_lens=torch.zeros(n, **i32), block_tables=torch.zeros(n, max_blocks, **i32),
            hidden=torch.zeros(n, hidden_size, dtype=dtype, device=device))

    def metadata(self, bs: int, max_seq_len: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slot_mapping[:bs], query_start_loc=self.query_start_loc[:bs + 1],
                                 seq_lens=self.seq_lens[:bs], block_tables=self.block_tables[:bs],
                                 max_query_len=1, max_seq_len=max_seq_len)

    def load(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata, bs: int) -> None:
        """Copy a B-sequence decode batch in (device to device) and neutralize rows B..bs."""
        b = input_ids.shape[0]
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(positions)
        self.slot_mapping[:b].copy_(md.slot_mapping)
        self.seq_lens[:b].copy_(md.seq_lens)
        self.block_tables[:b, : md.block_tables.shape[1]].copy_(md.block_tables)
        if bs > b:
            self.slot_mapping[b:bs].fill_(-1)
            self.seq_lens[b:bs].zero_()


class CUDAGraphModelRunner(ModelRunner):
    """`ModelRunner` whose pure-decode forward passes replay CUDA graphs (see the module doc).

    Extra keyword: max_model_len (graphs cover contexts up to it; default: the model's
    max_position_embeddings)."""

    def __init__(self, *args, max_model_len: int | None = None, **kwargs) -> None:
        super().__init__(*args, max_model_len=max_model_len, **kwargs)
        cfg = getattr(self.model, "config", None)
        self.max_model_len = int(max_model_len or getattr(cfg, "max_position_embeddings", 4096))
        self.sizes: list[int] = []
        self.buckets: dict[int, list[int]] = {}  # batch size -> context buckets
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.buffers: GraphBuffers | None = None
        self.num_replays = 0

    @property
    def graphs_enabled(self) -> bool:
        return bool(self.graphs)

    def _capturable(self) -> str | None:
        """Why graphs cannot be used here, or None."""
        if self.device.type != "cuda" or not torch.cuda.is_available():
            return "not on a CUDA device"
        from kvpack.attention.backend import get_attention_backend

        name = get_attention_backend(self.device).name
        if name != "triton":
            return f"the {name!r} attention backend is not capturable"
        return None

    @torch.inference_mode()
    def warmup(self) -> None:
        self.warmup_eager()  # prefill and mixed steps run eagerly: their kernels compile here too
        why = self._capturable()
        if why is not None:
            logger.info("CUDA graphs off: %s", why)
            return
        t0 = time.perf_counter()
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        kv_heads = self.kv_cache.layers[0].k.num_kv_heads
        self.sizes = capture_sizes(self.max_num_seqs, self.max_num_batched_tokens,
                                   every_up_to=split_batches(kv_heads, sms))
        n = self.sizes[-1]
        max_blocks = block_table_width(-(-self.max_model_len // self.block_size))  # as build_metadata pads
        hidden_size = self.model.config.hidden_size
        self.buffers = GraphBuffers.allocate(n, max_blocks, hidden_size, self.model.dtype, self.device)
        self.buckets = {bs: context_buckets(self.max_model_len, bs * kv_heads < sms) for bs in self.sizes}
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        pool = None
        # captured with CUDAGraph.capture_begin / capture_end, not `torch.cuda.graph`, which empties the
        # allocator's cache before every capture: here the cache is emptied once, before and after, so each
        # warm-up pass reuses the last one's memory and the figure logged is the graphs' own (through
        # session 24 it read negative: the first capture released the warm-ups' cache)
        stream = torch.cuda.Stream(self.device)
        for bs in reversed(self.sizes):  # largest first: smaller graphs reuse its pool memory
            for ctx in reversed(self.buckets[bs]):
                pool = self._capture(bs, ctx, pool, stream)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        used = free_before - torch.cuda.mem_get_info(self.device)[0]
        logger.info("captured %d CUDA graphs for decode batches of 1..%d up to %d tokens of context "
                    "in %.1f s, %.2f GiB", len(self.graphs), n, self.max_model_len, time.perf_counter() - t0,
                    used / 2**30)

    def _capture(self, bs: int, ctx: int, pool, stream: torch.cuda.Stream):
        buf = self.buffers
        md = buf.metadata(bs, ctx)
        # one eager pass compiles every kernel variant and fills the caches outside the capture
        buf.hidden[:bs] = self.model(buf.input_ids[:bs], buf.positions[:bs], self.kv_cache, md)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=pool)
            try:
                buf.hidden[:bs] = self.model(buf.input_ids[:bs], buf.positions[:bs], self.kv_cache, md)
            finally:
                graph.capture_end()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graphs[(bs, ctx)] = graph
        return graph.pool() if pool is None else pool

    def graph_key(self, input_ids: torch.Tensor, metadata: AttentionMetadata) -> tuple[int, int] | None:
        """(padded batch size, context bucket) of the graph this batch replays, or None: run eagerly."""
        if not self.graphs or not metadata.is_pure_decode:
            return None
        b = metadata.num_seqs
        if input_ids.shape[0] != b or metadata.max_seq_len > self.max_model_len:
            return None
        if self.buffers is None or metadata.block_tables.shape[1] > self.buffers.block_tables.shape[1]:
            return None
        bs = padded_size(b, self.sizes)
        if bs is None:
            return None
        ctx = next(c for c in self.buckets[bs] if c >= metadata.max_seq_len)
        return bs, ctx

    @torch.inference_mode()
    def run_model(self, input_ids: torch.Tensor, positions: torch.Tensor,
                  metadata: AttentionMetadata) -> torch.Tensor:
        key = self.graph_key(input_ids, metadata)
        if key is None:
            return super().run_model(input_ids, positions, metadata)
        self.buffers.load(input_ids, positions, metadata, key[0])
        self.graphs[key].replay()
        self.num_replays += 1
        return self.buffers.hidden[: input_ids.shape[0]]


def _applies(device: torch.device, enforce_eager: bool) -> bool:
    return device.type == "cuda" and not enforce_eager


register_model_runner(_applies, CUDAGraphModelRunner)
