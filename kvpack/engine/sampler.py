"""Token sampling: greedy, temperature, top-k, top-p, with per-request seeded generators.

Rows with temperature 0 take the argmax. Others: logits / temperature, then top-k (keep the
tokens whose logit is >= the k-th largest), then top-p (keep the smallest set of most likely
tokens whose probability reaches p; the most likely token always stays), then a draw by the
exponential race `argmax(p_i / E_i)`, `E_i ~ Exp(1)` (the same distribution as a categorical draw).
A row with a seed draws its `E` from its own `torch.Generator`, so its tokens depend only on
its seed, never on what else is in the batch. Unseeded rows share the engine's generator.
Logprobs are log-softmax of the raw logits (before temperature, top-k and top-p), as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpack.sampling_params import SamplingParams


@dataclass
class SamplingBatch:
    """Per-row sampling state for one step (B rows)."""

    params: list[SamplingParams]
    generators: list[torch.Generator | None]
    banned_ids: list[list[int]] | None = None  # e.g. EOS before min_tokens; None = none banned


@dataclass
class SamplerOutput:
    """token_ids: [B] int64 on the CPU. logprobs[i]: {token id: logprob} with the chosen token and
    the top-N (N = params.logprobs), or None when row i did not ask for logprobs."""

    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


class PendingSample:
    """A sampling step launched on the device: `result()` waits for it (the only host sync) and
    returns the `SamplerOutput`. The chosen ids (and logprob tensors) are copied to the host
    asynchronously at launch, so a caller can queue more device work before asking."""

    def __init__(self, chosen: torch.Tensor, logprob_parts: tuple | None, want: list[int | None]) -> None:
        self._want = want
        self._event = None
        self.device_ids = chosen  # [B] int64 where the logits are
        host = lambda t: t.to("cpu", non_blocking=True)  # noqa: E731  (pinned on CUDA)
        self._chosen = host(chosen)
        self._lp = None if logprob_parts is None else tuple(None if t is None else host(t) for t in logprob_parts)
        if chosen.is_cuda:
            self._event = torch.cuda.Event()
            self._event.record()

    def result(self) -> SamplerOutput:
        if self._event is not None:
            self._event.synchronize()
        ids = self._chosen.tolist()
        lp_out: list[dict[int, float] | None] = [None] * len(ids)
        if self._lp is not None:
            lp_out = _logprob_dicts(ids, *self._lp, self._want)
        return SamplerOutput(token_ids=ids, logprobs=lp_out)


class Sampler:
    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator  # for unseeded rows; None = torch's default generator

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """logits: [B, V] float32 on any device."""
        return self.launch(logits, batch).result()

    @torch.inference_mode()
    def launch(self, logits: torch.Tensor, batch: SamplingBatch) -> PendingSample:
        """Queue the sampling of logits [B, V] (any float dtype, any device) without waiting."""
        B, V = logits.shape
        params = batch.params
        assert len(params) == B == len(batch.generators)
        logits = logits.float()
        if batch.banned_ids and any(batch.banned_ids):  # one scatter for the batch (each row's own ids)
            rows = [i for i, ids in enumerate(batch.banned_ids) for _ in ids]
            cols = [t for ids in batch.banned_ids for t in ids]
            where = torch.tensor([rows, cols], dtype=torch.int64)
            if logits.is_cuda:
                where = where.pin_memory().to(logits.device, non_blocking=True)
            logits = logits.index_put((where[0], where[1]), torch.tensor(float("-inf"), device=logits.device))

        greedy = [p.greedy for p in params]
        if all(greedy):
            chosen = logits.argmax(dim=-1)
        else:
            chosen = self._sample(logits, params, batch.generators, greedy)

        want = [p.logprobs for p in params]
        parts = _logprob_tensors(logits, chosen, want) if any(w is not None for w in want) else None
        return PendingSample(chosen, parts, want)

    def _sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        greedy: list[bool],
    ) -> torch.Tensor:
        device = logits.device
        temps = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)],
                             dtype=torch.float32, device=device)
        scaled = logits / temps[:, None]
        top_k = [p.top_k if p.top_k_enabled else 0 for p in params]
        top_p = [p.top_p for p in params]
        if any(top_k) or any(p < 1.0 for p in top_p):
            scaled = apply_top_k_top_p(scaled, top_k, top_p)
        probs = scaled.softmax(dim=-1)
        noise = torch.empty_like(probs)
        noise.exponential_(generator=self.generator)
        for i, g in enumerate(generators):
            if g is not None:
                noise[i].exponential_(generator=g)
        sampled = (probs / noise).argmax(dim=-1)
        greedy_t = torch.tensor(greedy, dtype=torch.bool, device=device)
        return torch.where(greedy_t, logits.argmax(dim=-1), sampled)


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask (to -inf) what top-k then top-p remove. logits: [B, V] float32; top_k[i] <= 0 = off."""
    B, V = logits.shape
    device = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.tensor([kk if 0 < kk < V else V for kk in top_k], dtype=torch.long, device=device)
    kth = sorted_logits.gather(1, (k - 1)[:, None])  # [B, 1] the k-th largest logit
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    # top_p == 1 is off: rounding in the cumulative sum must not cut the tail.
    p = torch.tensor([pp if pp < 1.0 else 2.0 for pp in top_p], dtype=torch.float32, device=device)
    probs = sorted_logits.softmax(dim=-1)
    # Drop token j when the tokens before it already reach p (the first token is always kept).
    before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(before >= p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)


def _logprob_tensors(logits: torch.Tensor, chosen: torch.Tensor,
                     want: list[int | None]) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """On the device: the chosen tokens' logprobs [B] and the top-N values and ids [B, N] (None
    when no row asks for top tokens)."""
    logp = logits.log_softmax(dim=-1)
    n = max(w or 0 for w in want)
    chosen_lp = logp.gather(1, chosen[:, None])[:, 0]
    if not n:
        return chosen_lp, None, None
    values, indices = logp.topk(n, dim=-1)
    return chosen_lp, values, indices


def _logprob_dicts(chosen_ids: list[int], chosen_lp: torch.Tensor, top_lp: torch.Tensor | None,
                   top_ids: torch.Tensor | None, want: list[int | None]) -> list[dict[int, float] | None]:
    chosen_lp = chosen_lp.tolist()
    top_lp = top_lp.tolist() if top_lp is not None else []
    top_ids = top_ids.tolist() if top_ids is not None else []
    out: list[dict[int, float] | None] = []
    for i, w in enumerate(want):
        if w is None:
            out.append(None)
            continue
        d = dict(zip(top_ids[i][:w], top_lp[i][:w])) if w else {}
        d[chosen_ids[i]] = chosen_lp[i]
        out.append(d)
    return out
