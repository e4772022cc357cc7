"""Sampler (tier f): greedy = argmax, top-k / top-p masks against a brute-force oracle, sampled
frequencies against the target distribution, seeded draws independent of the batch."""

from __future__ import annotations

import math

import pytest
import torch

from kvpack.engine.sampler import Sampler, SamplingBatch, apply_top_k_top_p
from kvpack.sampling_params import SamplingParams


def batch_of(params, gens=None, banned=None):
    return SamplingBatch(params=params, generators=gens or [None] * len(params), banned_ids=banned)


def test_greedy_is_argmax():
    torch.manual_seed(0)
    logits = torch.randn(7, 300)
    out = Sampler()(logits, batch_of([SamplingParams(temperature=0.0)] * 7))
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 7


def oracle_keep(logits: list[float], k: int, p: float) -> set[int]:
    """Brute force: top-k = logits >= the k-th largest; then, in descending order of probability
    (renormalized over the survivors), keep tokens while the mass before them is < p."""
    idx = list(range(len(logits)))
    if 0 < k < len(logits):
        kth = sorted(logits, reverse=True)[k - 1]
        idx = [i for i in idx if logits[i] >= kth]
    z = sum(math.exp(logits[i]) for i in idx)
    idx.sort(key=lambda i: -logits[i])
    keep, mass = set(), 0.0
    for i in idx:
        if p < 1.0 and mass >= p:
            break
        keep.add(i)
        mass += math.exp(logits[i]) / z
    return keep


@pytest.mark.parametrize("seed", range(5))
def test_top_k_top_p_mask_matches_oracle(seed):
    g = torch.Generator().manual_seed(seed)
    B, V = 12, 40
    logits = torch.randn(B, V, generator=g, dtype=torch.float64).float() * 2
    ks = [0, 1, 3, 7, 40, 100, 5, 0, 2, 39, 10, 0]
    ps = [1.0, 1.0, 0.5, 0.9, 0.3, 0.99, 1.0, 0.05, 0.7, 0.5, 0.8, 0.6]
    masked = apply_top_k_top_p(logits, ks, ps)
    for i in range(B):
        kept = set(torch.nonzero(torch.isfinite(masked[i])).flatten().tolist())
        want = oracle_keep(logits[i].double().tolist(), ks[i], ps[i])
        assert kept == want, (i, ks[i], ps[i])
        fin = torch.isfinite(masked[i])
        assert torch.equal(masked[i][fin], logits[i][fin])  # survivors untouched


def test_sampled_frequencies_match_the_distribution():
    """Chi-square-ish check: 20k draws of a 6-token distribution with temperature, top-k, top-p."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.2, -1.0, -3.0]])
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9)
    masked = apply_top_k_top_p(logits / 0.7, [5], [0.9])
    target = masked.softmax(-1)[0]
    n = 20000
    sampler = Sampler(torch.Generator().manual_seed(0))
    out = sampler(logits.expand(n, -1).contiguous(), batch_of([params] * n))
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=6).double()
    freq = counts / n
    assert counts[4] == 0 and counts[5] == 0  # removed by top-p / top-k
    sd = (target * (1 - target) / n).sqrt()
    assert torch.all((freq - target).abs() <= 5 * sd + 1e-9), (freq, target)


def test_seeded_rows_do_not_depend_on_the_batch():
    torch.manual_seed(1)
    V = 500
    row = torch.randn(1, V)
    sp = SamplingParams(temperature=1.0, seed=1234)

    def draw(others: int, pos: int, steps: int = 8) -> list[int]:
        gen = torch.Generator().manual_seed(sp.seed)
        sampler = Sampler(torch.Generator().manual_seed(others))  # the shared generator differs
        toks = []
        for _ in range(steps):
            logits = torch.randn(others + 1, V)
            logits[pos] = row[0]
            params = [SamplingParams(temperature=0.9)] * (others + 1)
            params[pos] = sp
            gens: list = [None] * (others + 1)
            gens[pos] = gen
            toks.append(sampler(logits, batch_of(params, gens)).token_ids[pos])
        return toks

    alone = draw(0, 0)
    assert draw(5, 3) == alone and draw(2, 0) == alone
    assert len(set(alone)) > 1  # actually random
    other_seed = SamplingParams(temperature=1.0, seed=99)
    gen = torch.Generator().manual_seed(other_seed.seed)
    toks = [Sampler()(row, batch_of([other_seed], [gen])).token_ids[0] for _ in range(8)]
    assert toks != alone


def test_mixed_greedy_and_random_rows():
    torch.manual_seed(2)
    logits = torch.randn(4, 100)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=1)]
    out = Sampler()(logits, batch_of(params))
    am = logits.argmax(-1).tolist()
    assert out.token_ids[0] == am[0] and out.token_ids[2] == am[2]
    assert out.token_ids[3] == am[3]  # top-k 1 is greedy


def test_banned_ids_are_never_sampled():
    logits = torch.zeros(3, 10)
    logits[:, 4] = 10.0
    params = [SamplingParams(temperature=0), SamplingParams(temperature=2.0), SamplingParams(temperature=0)]
    out = Sampler()(logits, batch_of(params, banned=[[4], [4, 5], []]))
    assert out.token_ids[0] != 4 and out.token_ids[1] not in (4, 5) and out.token_ids[2] == 4
    assert logits[:, 4].eq(10.0).all() and logits.sum() == 30.0  # the caller's logits are left alone


def test_banned_ids_greedy_takes_the_best_allowed():
    """Greedy rows with banned ids take the argmax of the rest (each row its own ids; the oracle masks
    row by row)."""
    torch.manual_seed(0)
    logits = torch.randn(5, 40)
    banned = [[int(logits[0].argmax())], [], logits[2].topk(3).indices.tolist(), [0, 1, 2], [39]]
    ref = logits.clone()
    for i, ids in enumerate(banned):
        ref[i, ids] = float("-inf")
    out = Sampler()(logits, batch_of([SamplingParams(temperature=0)] * 5, banned=banned))
    assert out.token_ids == ref.argmax(-1).tolist()


def test_logprobs_of_chosen_and_top_n():
    torch.manual_seed(3)
    logits = torch.randn(3, 50)
    params = [SamplingParams(temperature=0, logprobs=3), SamplingParams(temperature=0),
              SamplingParams(temperature=5.0, logprobs=0, seed=1)]
    gens = [None, None, torch.Generator().manual_seed(1)]
    out = Sampler()(logits, batch_of(params, gens))
    ref = logits.log_softmax(-1)
    lp0 = out.logprobs[0]
    top3 = ref[0].topk(3)
    assert set(lp0) == set(top3.indices.tolist())
    for t, v in lp0.items():
        assert v == pytest.approx(ref[0, t].item(), abs=1e-6)
    assert out.logprobs[1] is None
    t2 = out.token_ids[2]
    assert list(out.logprobs[2]) == [t2]
    assert out.logprobs[2][t2] == pytest.approx(ref[2, t2].item(), abs=1e-6)


def test_params_validation():
    from kvpack.config import ConfigError

    for kw, field in [(dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"),
                      (dict(top_p=1.5), "top_p"), (dict(max_tokens=0), "max_tokens"),
                      (dict(top_k=-2), "top_k"), (dict(logprobs=21), "logprobs"),
                      (dict(logprobs=-1), "logprobs"), (dict(n=0), "n"),
                      (dict(min_tokens=5, max_tokens=2), "min_tokens"),
                      (dict(stop=[1]), "stop"), (dict(temperature=float("nan")), "temperature")]:
        with pytest.raises(ConfigError, match=field):
            SamplingParams(**kw)
    sp = SamplingParams(stop="x", stop_token_ids=[3, 4], top_k=0)
    assert sp.stop_strings == ("x",) and sp.stop_ids == frozenset({3, 4}) and not sp.top_k_enabled
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy
