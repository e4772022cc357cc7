"""`ModelRunner`: turns a `ScheduledBatch` into model inputs, runs the model, samples.

`execute(batch)` = `prepare_inputs` (flat input_ids / positions / `AttentionMetadata` and which
rows need logits) -> `run_model` (the forward pass) -> `compute_logits` (only the last token of
each sequence that samples this step; a prefill chunk that does not end its prompt needs none)
-> the `Sampler`. `launch(batch)` queues the same work and returns a `PendingRunnerOutput` whose
`result()` waits for it, so the host can do other work while the device runs (the engine's
async output processing). Everything here is device-generic.

Seam for device-specific runners (e.g. CUDA graphs, kept in their own module): subclass and
override `run_model(input_ids, positions, metadata) -> hidden` (e.g. replay a captured graph for
pure-decode batches, `metadata.is_pure_decode`, padding with slot -1) and `warmup()` (capture),
then register the class with `register_model_runner`; `LLMEngine` picks it through
`get_model_runner_cls(device, enforce_eager)`.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from kvpack.attention.kv_cache import KVCache
from kvpack.attention.metadata import (
    AttentionMetadata, PrefillWorkspace, block_table_width, split_leading_decodes,
)
from kvpack.engine.sampler import PendingSample, Sampler, SamplerOutput, SamplingBatch
from kvpack.engine.scheduler import ScheduledBatch
from kvpack.engine.sequence import PLACEHOLDER

# `ModelRunner.warmup_eager`: its dummy batches' context, chunk lengths and decode rows
EAGER_WARMUP_CONTEXT = 4096
EAGER_WARMUP_LONG_CHUNK = 2048
EAGER_WARMUP_SHORT_CHUNK = 64
EAGER_WARMUP_DECODES = 4


@dataclass
class ModelInputs:
    """input_ids, positions: [T] int64 on the device; metadata on the device;
    logits_indices: [S] int64, the rows of the hidden states whose logits are sampled;
    sample_rows: the S batch indices (into batch.seqs) that sample, in the same order."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    logits_indices: torch.Tensor
    sample_rows: list[int]


@dataclass
class RunnerOutput:
    """Per sampling sequence (by seq_id): the new token, and its logprobs when asked for."""

    token_ids: dict[int, int]
    logprobs: dict[int, dict[int, float]]


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        kv_cache: KVCache,
        device: torch.device | str,
        sampler: Sampler,
        eos_token_ids: tuple[int, ...] = (),
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        max_model_len: int | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = torch.device(device)
        self.sampler = sampler
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        cfg = getattr(model, "config", None)
        self.max_model_len = int(max_model_len or getattr(cfg, "max_position_embeddings", 4096))

    def warmup(self) -> None:
        """Before serving: compile the eager steps' kernels (`warmup_eager`). Subclasses add to it
        (e.g. CUDA graph capture)."""
        self.warmup_eager()

    @torch.inference_mode()
    def warmup_eager(self, force: bool = False) -> int:
        """Run the model once on each of a few dummy prefill and mixed batches that write nothing
        (slot -1), so that the Triton kernel variants they take are compiled now, not in the middle
        of a request (2-3 s each on an H200: a timed KV-bound run met three, `bench throughput`'s
        `triton_compiles`). The batches: a long chunk on a cached prefix (quantized caches read it
        through the prefill workspace), a short chunk on a long prefix (they dequantize in the
        kernel), and each beside decode rows (the decode kernel on the leading rows). When those
        chunks are shorter than the cache write's row layout needs (`ROW_MIN_TOKENS`: max_model_len
        below it), one more batch of whole prompts adds up to that many tokens, as a prefill step of
        many short prompts does (FP8's first such step compiled the write there: 0.53 s,
        results/gpu_suite_s17/fp8_first_run). Only on CUDA (`force`: anywhere, for tests); the tables
        point at any blocks, whose contents are not read into anything kept. Returns the number of
        batches run."""
        if self.device.type != "cuda" and not force:
            return 0
        from kvpack.kernels.cache_write import ROW_MIN_TOKENS

        bs, nblocks = self.block_size, self.kv_cache.num_blocks
        ctx = min(self.max_model_len, EAGER_WARMUP_CONTEXT)
        long_q = max(2, min(EAGER_WARMUP_LONG_CHUNK, self.max_num_batched_tokens - EAGER_WARMUP_DECODES, ctx))
        short_q = max(2, min(EAGER_WARMUP_SHORT_CHUNK, long_q))
        batches = [([long_q], [ctx]), ([short_q], [ctx]),
                   ([1] * EAGER_WARMUP_DECODES + [short_q], [ctx] * (EAGER_WARMUP_DECODES + 1)),
                   ([1] * EAGER_WARMUP_DECODES + [long_q], [ctx] * (EAGER_WARMUP_DECODES + 1))]
        if long_q < ROW_MIN_TOKENS:
            k = -(-ROW_MIN_TOKENS // min(ctx, ROW_MIN_TOKENS))  # prompts of at most ctx tokens
            per = -(-ROW_MIN_TOKENS // k)
            if k <= self.max_num_seqs and k * per <= self.max_num_batched_tokens:
                batches.append(([per] * k, [per] * k))
        for query_lens, seq_lens in batches:
            tables = dummy_block_tables(seq_lens, bs, nblocks)
            metadata, positions = build_metadata(query_lens, seq_lens, tables, bs, self.device)
            for md in (metadata, *(metadata.decode_split or ())):
                md.slot_mapping.fill_(-1)  # write nothing
            ids = torch.zeros(sum(query_lens), dtype=torch.int64, device=self.device)
            self.model(ids, positions, self.kv_cache, metadata)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return len(batches)

    def prepare_inputs(self, batch: ScheduledBatch, prev: "PendingRunnerOutput | None" = None) -> ModelInputs:
        """`prev`: the step launched before this one, whose sampled tokens are this step's inputs
        where a sequence holds a PLACEHOLDER (async scheduling); they are read on the device."""
        input_ids: list[int] = []
        query_lens, seq_lens, tables, logits_indices, sample_rows = [], [], [], [], []
        pending_pos, pending_rows = [], []
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start = seq.num_computed_tokens
            ids = seq.token_ids[start:start + n]
            if ids[-1] == PLACEHOLDER:  # only ever the newest token
                assert prev is not None, f"{seq} waits for a token but no step is in flight"
                pending_pos.append(len(input_ids) + n - 1)
                pending_rows.append(prev.row_of[seq.seq_id])
                ids = ids[:-1] + [0]
            input_ids.extend(ids)
            query_lens.append(n)
            seq_lens.append(start + n)
            tables.append(seq.block_table)
            if batch.needs_sample(i):
                logits_indices.append(len(input_ids) - 1)
                sample_rows.append(i)
        metadata, positions = build_metadata(query_lens, seq_lens, tables, self.block_size, self.device)
        ids_t = torch.tensor(input_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        if pending_pos:
            where = torch.tensor(pending_pos, dtype=torch.int64).to(self.device, non_blocking=True)
            rows = torch.tensor(pending_rows, dtype=torch.int64).to(self.device, non_blocking=True)
            ids_t.index_copy_(0, where, prev.device_ids.index_select(0, rows))
        return ModelInputs(
            input_ids=ids_t,
            positions=positions,
            metadata=metadata,
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64).to(self.device, non_blocking=True),
            sample_rows=sample_rows,
        )

    def run_model(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """The forward pass: [T] ids -> [T, hidden] hidden states (the K/V land in the cache)."""
        return self.model(input_ids, positions, self.kv_cache, metadata)

    def compute_logits(self, hidden: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [S, vocab] float32 for the S sampled rows only."""
        return self.model.compute_logits(hidden.index_select(0, logits_indices))

    def sampling_batch(self, batch: ScheduledBatch, rows: list[int]) -> SamplingBatch:
        params, gens, banned = [], [], []
        for i in rows:
            seq = batch.seqs[i]
            p = seq.params
            params.append(p)
            gens.append(seq.generator)
            ban: list[int] = []
            if seq.num_output_tokens < p.min_tokens:  # neither EOS nor stop tokens yet
                ban = sorted(set(p.stop_ids) | (set() if p.ignore_eos else set(self.eos_token_ids)))
            banned.append(ban)
        return SamplingBatch(params=params, generators=gens, banned_ids=banned)

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        return self.launch(batch).result()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, prev: "PendingRunnerOutput | None" = None) -> "PendingRunnerOutput":
        """Queue the batch's forward pass and sampling on the device; nothing waits for them.
        `prev`: the step in flight whose tokens this batch's PLACEHOLDERs stand for."""
        inputs = self.prepare_inputs(batch, prev)
        hidden = self.run_model(inputs.input_ids, inputs.positions, inputs.metadata)
        ids = [batch.seqs[i].seq_id for i in inputs.sample_rows]
        if not inputs.sample_rows:
            return PendingRunnerOutput(ids, None)
        logits = self.compute_logits(hidden, inputs.logits_indices)
        return PendingRunnerOutput(ids, self.sampler.launch(logits, self.sampling_batch(batch, inputs.sample_rows)))


class PendingRunnerOutput:
    """A launched step: `result()` waits for its sampled tokens and returns the `RunnerOutput`;
    `device_ids` [S] are the same tokens on the device, row `row_of[seq_id]` (read by the next
    step before they reach the host)."""

    def __init__(self, seq_ids: list[int], sample: PendingSample | None) -> None:
        self.seq_ids = seq_ids
        self.sample = sample
        self.device_ids = sample.device_ids if sample is not None else None

    @functools.cached_property
    def row_of(self) -> dict[int, int]:  # asked for by the next step under async scheduling only
        return {sid: i for i, sid in enumerate(self.seq_ids)}

    def result(self) -> RunnerOutput:
        if self.sample is None:
            return RunnerOutput({}, {})
        out: SamplerOutput = self.sample.result()
        logprobs = {sid: lp for sid, lp in zip(self.seq_ids, out.logprobs) if lp is not None}
        return RunnerOutput(dict(zip(self.seq_ids, out.token_ids)), logprobs)


def dummy_block_tables(seq_lens: list[int], block_size: int, num_blocks: int) -> list[list[int]]:
    """Block tables for dummy batches (warm-ups, probes): consecutive block ids, wrapping around a pool
    of `num_blocks`, enough for each sequence's length."""
    tables, first = [], 0
    for n in seq_lens:
        k = -(-n // block_size)
        tables.append([(first + j) % num_blocks for j in range(k)])
        first += k
    return tables


def build_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
) -> tuple[AttentionMetadata, torch.Tensor]:
    """`AttentionMetadata.build` (same result) vectorized with numpy, plus the positions [T] int64.

    About 10x faster than the per-token Python loop for large decode batches (256 sequences of 4k
    tokens: ~2 ms instead of ~17 ms per step)."""
    b = len(query_lens)
    lens = np.fromiter((len(t) for t in block_tables), dtype=np.int64, count=b)
    max_blocks = block_table_width(lens.max(initial=0))
    flat = np.fromiter(itertools.chain.from_iterable(block_tables), dtype=np.int32, count=int(lens.sum()))
    tables = np.zeros((b, max_blocks), dtype=np.int32)
    tables[np.arange(max_blocks)[None, :] < lens[:, None]] = flat  # row-major, like the lists
    q = np.asarray(query_lens, dtype=np.int64)
    s = np.asarray(seq_lens, dtype=np.int64)
    assert np.all((0 < q) & (q <= s)), (query_lens, seq_lens)
    qsl = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(q, out=qsl[1:])
    seq_of = np.repeat(np.arange(b), q)  # [T] which sequence each token belongs to
    positions = np.arange(int(qsl[-1])) - qsl[:-1][seq_of] + (s - q)[seq_of]
    slots = tables[seq_of, positions // block_size].astype(np.int64) * block_size + positions % block_size

    def dev(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(device, non_blocking=True)

    max_q = int(q.max(initial=0))
    decode_split = workspace = None
    if max_q > 1:
        decode_split = split_leading_decodes(query_lens, seq_lens, block_tables,
                                             lambda *a: build_metadata(*a, block_size, device)[0])
        if decode_split is None:  # split: only the rest's workspace is read (the engine calls paged_attention)
            workspace = PrefillWorkspace.plan(q, s, tables, block_size, device)
    metadata = AttentionMetadata(
        slot_mapping=dev(slots),
        query_start_loc=dev(qsl.astype(np.int32)),
        seq_lens=dev(s.astype(np.int32)),
        block_tables=dev(tables),
        max_query_len=max_q,
        max_seq_len=int(s.max(initial=0)),
        workspace=workspace,
        decode_split=decode_split,
    )
    return metadata, dev(positions)


# ---- runner selection --------------------------------------------------------------------------

_RUNNERS: list[tuple[Callable[[torch.device, bool], bool], type[ModelRunner]]] = []


def register_model_runner(applies: Callable[[torch.device, bool], bool], cls: type[ModelRunner]) -> None:
    """Use `cls` when `applies(device, enforce_eager)`; later registrations win."""
    _RUNNERS.append((applies, cls))


def get_model_runner_cls(device: torch.device | str, enforce_eager: bool) -> type[ModelRunner]:
    dev = torch.device(device)
    if dev.type == "cuda" and not enforce_eager:
        try:  # the CUDA graph runner registers itself on import, if it exists
            import kvpack.engine.cuda_graph  # noqa: F401
        except ModuleNotFoundError as e:
            if e.name != "kvpack.engine.cuda_graph":
                raise
    for applies, cls in reversed(_RUNNERS):
        if applies(dev, enforce_eager):
            return cls
    return ModelRunner
