"""Continuous batching with chunked prefill and preemption by recompute.

Every step builds one flat batch under a token budget (`max_num_batched_tokens`):

1. running sequences that decode (one token each), oldest first. A decode that needs a new block
   when none is free preempts the most recently arrived running sequence (possibly itself): its
   blocks are freed and it goes back to the FRONT of the waiting queue, to be recomputed later
   (its full blocks usually come back from the prefix cache);
2. running sequences in the middle of a chunked prefill, each taking up to the remaining budget;
3. waiting sequences, first come first served, while `max_num_seqs` and the budget allow and their
   blocks fit with `watermark` of the pool still free after them: each is allocated blocks for all
   its tokens (prefix-cache hits skip compute) and takes a prefill chunk of up to the remaining
   budget. The watermark (vLLM's block manager keeps the same 1 %) leaves the running sequences
   room to grow, so fewer of them are preempted and recomputed when the pool is full.

After the model ran, `update` advances each scheduled sequence, registers its newly computed
full blocks in the prefix cache and appends the sampled token where the chunk ended a prompt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvpack.config import SchedulerConfig
from kvpack.engine.block_manager import BlockManager
from kvpack.engine.sequence import PLACEHOLDER, Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """One step's work: sequence `i` runs its tokens `[num_computed, num_computed + num_new[i])`."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_preempted: int = 0

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_decode_seqs(self) -> int:
        return sum(1 for n in self.num_new_tokens if n == 1)

    def needs_sample(self, i: int) -> bool:
        """Does sequence `i` reach its last token this step (so its next token gets sampled)?"""
        seq = self.seqs[i]
        return seq.num_computed_tokens + self.num_new_tokens[i] == len(seq)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0
        self.watermark_blocks = int(config.watermark * block_manager.num_blocks)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> list[Sequence]:
        """Drop every sequence of `request_id`, freeing its blocks; returns them."""
        dropped = [s for s in self.waiting if s.request_id == request_id]
        self.waiting = deque(s for s in self.waiting if s.request_id != request_id)
        for s in [s for s in self.running if s.request_id == request_id]:
            self.running.remove(s)
            self.block_manager.free(s)
            dropped.append(s)
        return dropped

    # ---- scheduling ----------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        scheduled: set[int] = set()

        # 1. Decodes, oldest first.
        for seq in sorted((s for s in self.running if not s.in_prefill), key=lambda s: s.arrival):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or seq.finishes_at_length:
                continue  # preempted earlier in this loop, or its pending token is its last
            while not self.block_manager.append_slot(seq):
                victim = self._pick_victim(scheduled)
                self._preempt(victim)
                batch.num_preempted += 1
                if victim is seq:
                    break
            if seq.status is SequenceStatus.RUNNING:
                batch.seqs.append(seq)
                batch.num_new_tokens.append(1)
                scheduled.add(seq.seq_id)
                budget -= 1

        # 2. Chunked prefills already under way.
        for seq in self.running:
            if budget == 0:
                break
            if seq.seq_id in scheduled or not seq.in_prefill:
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            scheduled.add(seq.seq_id)
            budget -= n

        # 3. Admit waiting sequences (FCFS; a sequence that does not fit blocks those behind it).
        # Not right after a preemption: the freed blocks go to the running sequences first.
        while (self.waiting and budget > 0 and batch.num_preempted == 0
               and len(self.running) < self.config.max_num_seqs):
            seq = self.waiting[0]
            # With nothing running, admit whatever fits: the watermark must not stall an empty pool.
            reserve = self.watermark_blocks if self.running else 0
            if not self.block_manager.allocate(seq, reserve):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            scheduled.add(seq.seq_id)
            budget -= n
        return batch

    def _pick_victim(self, scheduled: set[int]) -> Sequence:
        # Last come, first preempted, among those not yet in this step's batch (the sequence
        # asking for a block is one of them).
        candidates = [s for s in self.running if s.seq_id not in scheduled]
        return max(candidates, key=lambda s: s.arrival)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # ---- after the model ran -------------------------------------------------------------------

    def update(
        self,
        batch: ScheduledBatch,
        sampled: dict[int, int],
        logprobs: dict[int, dict[int, float]] | None = None,
    ) -> list[Sequence]:
        """Advance the batch. `sampled` maps seq_id -> new token for the sequences that sampled,
        `logprobs` seq_id -> {token id: logprob} for those that asked for logprobs.

        Returns the sequences that sampled a token (the caller checks stop conditions and calls
        `finish` on those that are done).
        """
        advanced = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if seq.is_finished:  # ended (stop string, abort) while the step ran: its result is dropped
                continue
            seq.num_computed_tokens += n
            self.block_manager.cache_computed_blocks(seq)
            token = sampled.get(seq.seq_id)
            if token is not None:
                seq.append_token(token, logprobs.get(seq.seq_id) if logprobs else None)
                advanced.append(seq)
        return advanced

    def advance(self, batch: ScheduledBatch) -> list[Sequence]:
        """Async scheduling: `batch` is launched but its tokens are not back. Advance it as `update`
        will, with a PLACEHOLDER for each token to be sampled, so the next step can be scheduled
        now (its input for that token is read on the device). Returns the sequences awaiting a
        token, for `fill`; marks those whose token will be their last by length."""
        waiting_for = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            if seq.is_finished:  # ended while the step was launched: nothing to advance
                continue
            samples = seq.num_computed_tokens + n == len(seq)
            seq.num_computed_tokens += n
            self.block_manager.cache_computed_blocks(seq)
            if samples:
                seq.append_token(PLACEHOLDER)
                seq.finishes_at_length = (seq.num_output_tokens >= seq.params.max_tokens
                                          or len(seq) >= self.config.max_model_len)
                waiting_for.append(seq)
        return waiting_for

    def fill(
        self,
        seqs: list[Sequence],
        sampled: dict[int, int],
        logprobs: dict[int, dict[int, float]] | None = None,
    ) -> list[Sequence]:
        """Async scheduling: put the sampled tokens of `advance`'s sequences in place. Returns
        those that take one (not ended, e.g. aborted, while the step ran)."""
        advanced = []
        for seq in seqs:
            if seq.is_finished:
                continue
            seq.fill_placeholder(sampled[seq.seq_id], logprobs.get(seq.seq_id) if logprobs else None)
            advanced.append(seq)
        return advanced

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark a sequence finished and release its blocks (a waiting one, preempted, has none)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.finish(reason)
