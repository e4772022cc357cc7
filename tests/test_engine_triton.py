"""The engine's batches through the Triton kernels (interpreted on CPU, native on GPU) give the
same greedy tokens as through the PyTorch reference: mixed prefill-chunk + decode batches,
prefix-cache hits and several block-table shapes, for a float and the quantized formats."""

from __future__ import annotations

import pytest
import torch

from kvpack.engine.llm_engine import LLMEngine
from kvpack.models import load_model
from kvpack.sampling_params import SamplingParams

pytest.importorskip("triton")

PROMPTS = [list(range(1, 21)), [30, 31, 32], list(range(1, 17)) + [99, 98], [7]]
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lm = load_model("dummy:tiny-llama", "float32", device)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in sorted(lm.model.named_parameters()):
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    return lm


def generate(loaded, fmt: str) -> list[list[int]]:
    engine = LLMEngine.from_args("dummy:tiny-llama", loaded=loaded, kv_cache_dtype=fmt, max_model_len=64,
                                 num_blocks=32, block_size=8, max_num_batched_tokens=16,
                                 enforce_eager=True, log_stats=False)
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, PARAMS)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    assert engine.stats()["prefix_hit_tokens"] > 0
    assert engine.num_free_blocks == engine.num_total_blocks
    return [done[str(i)] for i in range(len(PROMPTS))]


@pytest.mark.parametrize("fmt", ["auto", "int8", "int4", "fp8_e4m3"])
def test_triton_backend_matches_reference(loaded, fmt, monkeypatch):
    monkeypatch.setenv("KVPACK_ATTENTION_BACKEND", "reference")
    want = generate(loaded, fmt)
    monkeypatch.setenv("KVPACK_ATTENTION_BACKEND", "triton")
    assert generate(loaded, fmt) == want
