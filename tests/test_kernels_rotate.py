"""`kernels.rotate.rotate_heads` (q / output rotation around the attention kernels) against the
reference rotation `formats.hadamard_transform` (same butterfly order: bit-exact in float32) and
plain torch for the mean add. Interpreter on CPU; the gpu test repeats it on large shapes."""

from __future__ import annotations

import pytest
import torch

from kvpack.formats import hadamard, hadamard_transform
from kvpack.kernels.rotate import rotate_heads

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _mean_per_q_head(mean: torch.Tensor, hq: int) -> torch.Tensor:
    return mean.repeat_interleave(hq // mean.shape[0], 0)  # [Hq, D]: kv head h serves q heads h*G..


@pytest.mark.parametrize("D", [64, 80, 96, 128, 256])
def test_rotate_equals_the_storage_rotation(D):
    g = torch.Generator().manual_seed(D)
    x = torch.randn(7, 6, D, generator=g).to(DEV)
    y = rotate_heads(x, torch.float32)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.equal(y.cpu(), hadamard_transform(x.cpu()))
    assert (y.cpu() - x.cpu() @ hadamard(D)).abs().max() <= 1e-5 * x.abs().max().item()


def test_strided_input_out_buffer_mean_and_bf16():
    """q sliced out of a fused qkv row (token stride larger than Hq * D), the result written into a
    given buffer, each kv head's mean broadcast over its query heads, bf16 rounded to nearest even."""
    g = torch.Generator().manual_seed(1)
    T, hq, hkv, D = 5, 8, 2, 64
    qkv = torch.randn(T, (hq + 2 * hkv) * D, generator=g).to(DEV)
    q = qkv[:, : hq * D].view(T, hq, D)
    assert not q.is_contiguous()
    mean = torch.randn(hkv, D, generator=g).to(DEV)
    out = torch.empty(T, hq, D, dtype=torch.bfloat16, device=DEV)
    got = rotate_heads(q, torch.bfloat16, mean=mean, out=out)
    assert got is out
    want = (hadamard_transform(q.cpu()) + _mean_per_q_head(mean.cpu(), hq)).to(torch.bfloat16)
    assert torch.equal(got.cpu(), want)
    plain = rotate_heads(q, torch.float32, rotate=False, mean=mean)  # centered V without rotation
    assert torch.equal(plain.cpu(), q.cpu() + _mean_per_q_head(mean.cpu(), hq))


def test_empty_and_shape_errors():
    assert rotate_heads(torch.zeros(0, 4, 64, device=DEV), torch.float32).shape == (0, 4, 64)
    with pytest.raises(AssertionError):
        rotate_heads(torch.zeros(2, 6, 64, device=DEV), torch.float32, mean=torch.zeros(4, 64, device=DEV))


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_rotate_gpu_large(D):
    x = torch.randn(4096, 32, D, device="cuda", dtype=torch.bfloat16)
    mean = torch.randn(8, D, device="cuda")
    y = rotate_heads(x, torch.float32, mean=mean)
    want = hadamard_transform(x.float()) + _mean_per_q_head(mean, 32)
    assert torch.equal(y, want)
