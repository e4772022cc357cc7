"""Tier (a): format resolution, bytes per token, int8/int4 packing and quantization, rotation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvpack.config import ConfigError, ModelConfig
from kvpack.formats import (
    FMT_FLOAT, FMT_FP8E4M3, FMT_FP8E5M2, FMT_INT4, FMT_INT8, FORMAT_NAMES, KVFormat, fp8_decode,
    hadamard, hadamard_block_size, hadamard_norm, hadamard_transform, kv_bytes_per_token, pack_int4,
    resolve_format, unpack_int4,
)

TORCH_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def rand_fp16(shape, lo, hi, g):
    """Random positive float16 values, log-uniform in [lo, hi]."""
    return torch.exp(torch.empty(shape).uniform_(torch.log(torch.tensor(lo)).item(),
                                                 torch.log(torch.tensor(hi)).item(), generator=g)).half()


# ---- resolution ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,canon,kind,kid,storage", [
    ("bfloat16", "bfloat16", "float", FMT_FLOAT, torch.bfloat16),
    ("bf16", "bfloat16", "float", FMT_FLOAT, torch.bfloat16),
    ("fp16", "float16", "float", FMT_FLOAT, torch.float16),
    ("half", "float16", "float", FMT_FLOAT, torch.float16),
    ("float32", "float32", "float", FMT_FLOAT, torch.float32),
    ("int8", "int8", "int8", FMT_INT8, torch.int8),
    ("int4", "int4", "int4", FMT_INT4, torch.uint8),
    ("fp8", "fp8_e4m3", "fp8_e4m3", FMT_FP8E4M3, torch.uint8),
    ("fp8_e4m3fn", "fp8_e4m3", "fp8_e4m3", FMT_FP8E4M3, torch.uint8),
    ("FP8_E5M2", "fp8_e5m2", "fp8_e5m2", FMT_FP8E5M2, torch.uint8),
])
def test_resolve_names(name, canon, kind, kid, storage):
    f = resolve_format(name, head_dim=128)
    assert (f.name, f.kind, f.kernel_id, f.storage_dtype) == (canon, kind, kid, storage)
    assert f.rotate == (kind in ("int4", "fp8_e4m3", "fp8_e5m2")) and f.has_zero == (kind == "int4")


def test_kernel_ids_are_the_contract():
    assert (FMT_FLOAT, FMT_INT8, FMT_INT4, FMT_FP8E4M3, FMT_FP8E5M2) == (0, 1, 2, 3, 4)


def test_auto_follows_model_dtype():
    assert resolve_format("auto", head_dim=64).storage_dtype == torch.bfloat16
    assert resolve_format("auto", head_dim=64, model_dtype=torch.float16).name == "float16"
    assert resolve_format("auto", head_dim=64, model_dtype=torch.float32).name == "float32"


def test_static_modes():
    assert resolve_format("int8", head_dim=64, static=True).scale_mode == "static"
    assert resolve_format("fp8", head_dim=64, static=True).scale_mode == "static"
    assert resolve_format("int8", head_dim=64).scale_mode == "token"
    assert resolve_format("bf16", head_dim=64, static=True).scale_mode == "none"  # ignored
    with pytest.raises(ConfigError, match="int4 has no static"):
        resolve_format("int4", head_dim=64, static=True)
    assert not resolve_format("int4", head_dim=64, rotate=False).rotate
    assert not resolve_format("int8", head_dim=64, rotate=True).rotate  # rotation is int4 only


def test_errors():
    with pytest.raises(ConfigError) as e:
        resolve_format("int3", head_dim=128)
    msg = str(e.value)
    assert "'int3'" in msg and all(n in msg for n in FORMAT_NAMES) and "\n" not in msg
    with pytest.raises(ConfigError, match="int4 cannot handle head_dim 63"):
        resolve_format("int4", head_dim=63)
    with pytest.raises(ConfigError, match="int4 cannot handle head_dim 12"):
        resolve_format("int4", head_dim=12)
    resolve_format("int8", head_dim=63)  # fine: only int4 packs pairs


@pytest.mark.parametrize("head_dim,group,expect", [
    (128, 32, 32), (128, 64, 64), (64, 64, 64), (80, 32, 16), (96, 32, 32), (96, 64, 32),
    (16, 32, 16), (256, 32, 32), (72, 32, 8), (128, 128, 128), (64, 128, 64), (256, 128, 128),
])
def test_int4_group_size(head_dim, group, expect):
    f = resolve_format("int4", head_dim=head_dim, int4_group_size=group)
    assert f.group_size == expect and f.num_groups == head_dim // expect


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolve_format("int8", head_dim=64).head_dim = 32


# ---- bytes per token -----------------------------------------------------------------------

@pytest.mark.parametrize("head_dim,name,kw,expect", [
    (128, "bf16", {}, 256), (128, "int8", {}, 130), (128, "int8", {"static": True}, 128),
    (128, "int4", {}, 80), (128, "int4", {"int4_group_size": 64}, 72), (128, "fp8", {}, 130),
    (128, "fp8_e5m2", {"static": True}, 128), (128, "float32", {}, 512),
    (64, "bf16", {}, 128), (64, "int8", {}, 66), (64, "int8", {"static": True}, 64),
    (64, "int4", {}, 40), (64, "fp8", {}, 66), (64, "fp8_e5m2", {}, 66),
])
def test_bytes_per_token_head(head_dim, name, kw, expect):
    assert resolve_format(name, head_dim=head_dim, **kw).bytes_per_token_head == expect


def test_kv_bytes_per_token():
    mc = ModelConfig("LlamaForCausalLM", 100, 512, 1024, num_layers=3, num_heads=8, num_kv_heads=2,
                     head_dim=64)
    k, v = resolve_format("int8", head_dim=64), resolve_format("int4", head_dim=64)
    assert kv_bytes_per_token(mc, k, v) == 3 * 2 * (66 + 40)
    bf = resolve_format("bf16", head_dim=64)
    assert kv_bytes_per_token(mc, bf, bf) == 3 * 2 * 2 * 64 * 2


def test_quantized_shapes_match_bytes():
    for name in ("int8", "int4", "fp8", "fp8_e5m2", "bf16"):
        f = resolve_format(name, head_dim=96)
        codes, scales, zeros = f.quantize(torch.randn(5, 3, 96))
        assert codes.shape == (5, 3, f.code_width) and codes.dtype == f.storage_dtype
        nbytes = codes[0, 0].numel() * codes.element_size()
        for t in (scales, zeros):
            if t is not None:
                assert t.shape == (5, 3, f.num_groups) and t.dtype == torch.float16
                nbytes += t[0, 0].numel() * 2
        assert nbytes == f.bytes_per_token_head


# ---- int8 ----------------------------------------------------------------------------------

def test_int8_codes_dequant_requant_bit_exact():
    g = torch.Generator().manual_seed(0)
    f = resolve_format("int8", head_dim=64)
    codes = torch.randint(-127, 128, (200, 4, 64), generator=g, dtype=torch.int8)
    codes[..., 5] = 127 * (1 - 2 * torch.randint(0, 2, (200, 4), generator=g)).to(torch.int8)  # absmax row
    scales = rand_fp16((200, 4, 1), 1e-4, 1e3, g)
    x = f.dequantize(codes, scales)
    assert torch.equal(x, codes.float() * scales.float())
    c2, s2, z2 = f.quantize(x)
    assert torch.equal(c2, codes) and torch.equal(s2, scales) and z2 is None


def test_int8_rounding_and_scale_rules():
    f = resolve_format("int8", head_dim=8)
    x = torch.tensor([[[0.5, 1.5, 2.5, -0.5, -2.5, 126.5, 127.0, 3.49]]])  # absmax 127 -> s = 1
    codes, s, _ = f.quantize(x)
    assert s.item() == 1.0
    assert codes.flatten().tolist() == [0, 2, 2, 0, -2, 126, 127, 3]  # half to even
    codes, s, _ = f.quantize(torch.zeros(1, 1, 8))  # all zero: s = 1, codes 0
    assert s.item() == 1.0 and codes.abs().sum() == 0
    x = torch.randn(64, 2, 8) * 10
    codes, s, _ = f.quantize(x)
    s_ref = (x.abs().amax(-1, keepdim=True) / 127).half()
    assert torch.equal(s, s_ref)
    assert torch.equal(codes, torch.clamp(torch.round(x / s_ref.float()), -127, 127).to(torch.int8))


def test_quantizers_divide_exactly():
    """The format divides by a scale (IEEE float32): here x / s rounds to 2.5000002 -> code 3, where
    a multiply by the rounded 1/s gives 2.4999998 -> 2 (the kernels divide: `quant.div_by_scale`)."""
    x, s = 1.6015626192092896, 0.640625
    assert round(float(torch.tensor(x) * (1 / torch.tensor(s)))) == 2
    f = resolve_format("int8", head_dim=8, static=True)
    codes, _, _ = f.quantize(torch.full((1, 1, 8), x), static_scale=torch.tensor([s]))
    assert codes.flatten().tolist() == [3] * 8


def test_int8_static():
    f = resolve_format("int8", head_dim=16, static=True)
    ss = torch.tensor([0.01, 0.5, 2.0])
    x = torch.randn(7, 3, 16) * 3
    codes, scales, zeros = f.quantize(x, static_scale=ss)
    assert scales is None and zeros is None
    ref = torch.clamp(torch.round(x / ss[None, :, None]), -127, 127).to(torch.int8)
    assert torch.equal(codes, ref) and (codes[:, 0].abs() == 127).any()  # head 0 clamps
    assert torch.equal(f.dequantize(codes, static_scale=ss), ref.float() * ss[None, :, None])
    with pytest.raises(ValueError):
        f.quantize(x)


# ---- int4 ----------------------------------------------------------------------------------

def test_int4_nibble_order_hand_example():
    f = resolve_format("int4", head_dim=16)  # one group of 16
    x = torch.arange(16, dtype=torch.float32).view(1, 1, 16)  # min 0, max 15 -> m 0, s 1, code = channel
    codes, s, m = f.quantize(x)
    assert s.item() == 1.0 and m.item() == 0.0
    assert codes.flatten().tolist() == [0x80, 0x91, 0xA2, 0xB3, 0xC4, 0xD5, 0xE6, 0xF7]
    assert torch.equal(f.dequantize(codes, s, m), x)
    assert pack_int4(torch.tensor([1, 2, 3, 4])).tolist() == [0x31, 0x42]
    assert unpack_int4(torch.tensor([0x31, 0x42], dtype=torch.uint8)).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("head_dim,group", [(64, 32), (128, 64), (80, 32), (96, 32)])
def test_int4_codes_dequant_requant_bit_exact(head_dim, group):
    g = torch.Generator().manual_seed(head_dim + group)
    f = resolve_format("int4", head_dim=head_dim, int4_group_size=group)
    n, h, gs, ng = 100, 3, f.group_size, f.num_groups
    q = torch.randint(0, 16, (n, h, ng, gs), generator=g)
    q[..., 0], q[..., -1] = 0, 15  # each group spans the full code range
    q = q[..., torch.randperm(gs, generator=g)].reshape(n, h, head_dim)
    scales = rand_fp16((n, h, ng), 1e-3, 10.0, g)
    zeros = (torch.randn(n, h, ng, generator=g) * scales.float() * 8).half()
    packed = pack_int4(q)
    assert torch.equal(unpack_int4(packed), q.to(torch.uint8))
    x = f.dequantize(packed, scales, zeros)
    c2, s2, z2 = f.quantize(x)
    assert torch.equal(c2, packed) and torch.equal(s2, scales) and torch.equal(z2, zeros)


@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_int4_error_bound(head_dim):
    g = torch.Generator().manual_seed(3)
    f = resolve_format("int4", head_dim=head_dim)
    x = torch.randn(300, 2, head_dim, generator=g) * torch.rand(300, 2, 1, generator=g) * 4
    x[0, 0] = 0.0  # all-zero group: s = 1, exact
    codes, s, m = f.quantize(x)
    xh = f.dequantize(codes, s, m)
    gs = f.group_size
    xg = x.view(300, 2, -1, gs)
    mn, mx = xg.amin(-1), xg.amax(-1)
    s32, m32 = s.float(), m.float()
    eps = (m32 - mn).abs() + 15 * (s32 - (mx - mn) / 15).abs() + 1e-6 * (1 + xg.abs().amax(-1))
    eps = torch.where(mx == mn, (m32 - mn).abs() + 1e-6, eps)
    err = (x - xh).abs().view(300, 2, -1, gs)
    assert (err <= (s32 / 2 + eps)[..., None]).all()
    assert torch.equal(xh[0, 0], torch.zeros(head_dim))
    # the definition: fl(x - m) times the float32 reciprocal of s, rounded half to even, clamped
    ref = torch.clamp(torch.round((xg - m32[..., None]) * (1.0 / s32[..., None])), 0, 15)
    got = unpack_int4(codes).float().view(300, 2, -1, gs)
    assert torch.equal(got, ref)
    # within ~1e-6 of the nearest level to the exact quotient (float64) wherever that is in range
    quot = (xg.double() - m32[..., None].double()) / s32[..., None].double()
    inside = (quot >= 0) & (quot <= 15)
    assert ((got.double() - quot).abs()[inside] <= 0.5 + 2e-6).all()


def test_int4_code_near_half_levels():
    """Quotients (x - m) / s a hair off k + 0.5 (x = m + (k + 0.5 +- 2**-12) s): the code is the
    nearer level, as the exact quotient's; exact ties k + 0.5 may take either neighbour (fl(1 / s) is
    inexact for most s), never another code."""
    f = resolve_format("int4", head_dim=32, rotate=False)  # one group of 32
    s = torch.tensor([0.1, 0.3, 1.0 / 3.0, 0.7, 3.0]).half().float()
    k = torch.arange(15).float()
    for d, want in ((2.0 ** -12, k + 1), (-(2.0 ** -12), k), (0.0, None)):
        for sv in s:
            x = torch.zeros(1, 1, 32)  # min 0
            x[0, 0, :15] = (k + 0.5 + d) * sv
            x[0, 0, 15] = 15 * sv  # max 15 s: m = 0 and the scale s itself
            codes, sc, m = f.quantize(x)
            assert sc.float().item() == sv.item() and m.item() == 0.0
            got = unpack_int4(codes).float().flatten()[:15]
            if want is None:
                assert ((got == k) | (got == k + 1)).all()
            else:
                assert torch.equal(got, want), (sv.item(), d, got, want)


# ---- fp8 through KVFormat ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_format_matches_torch(name):
    torch.manual_seed(11)
    f = resolve_format(name, head_dim=64)
    x = torch.randn(50, 4, 64) * torch.exp2(torch.randint(-12, 12, (50, 4, 1)).float())
    x[0, 0] = 1e-3 * x[0, 0] / x[0, 0].abs().max()  # e5m2: absmax / 57344 underflows fp16
    codes, s, z = f.quantize(x)
    s_ref = (x.abs().amax(-1, keepdim=True) / f.qmax).half()
    s_ref[s_ref == 0] = 1.0  # fp16 underflow (e5m2: absmax < ~3.4e-3) -> 1
    assert torch.equal(s, s_ref) and z is None
    y = x / s_ref.float()
    ref = torch.clamp(y, -f.qmax, f.qmax).to(TORCH_FP8[name]).view(torch.uint8)
    assert torch.equal(codes, ref)
    assert torch.equal(f.dequantize(codes, s), fp8_decode(codes, name) * s.float())
    fs = resolve_format(name, head_dim=64, static=True)
    ss = torch.tensor([0.5, 1.0, 0.001, 3.0])
    codes, s, _ = fs.quantize(x, static_scale=ss)
    assert s is None
    y = x / ss[None, :, None]
    assert torch.equal(codes, torch.clamp(y, -f.qmax, f.qmax).to(TORCH_FP8[name]).view(torch.uint8))


# ---- rotation ------------------------------------------------------------------------------

def _popcount_hadamard(n: int) -> torch.Tensor:
    i = torch.arange(n)
    and_ = i[:, None] & i[None, :]
    parity = torch.zeros_like(and_)
    for b in range(n.bit_length()):
        parity ^= (and_ >> b) & 1
    return (1 - 2 * parity).double() / n ** 0.5


@pytest.mark.parametrize("head_dim,block", [(64, 64), (128, 128), (256, 256), (80, 16), (96, 32)])
def test_hadamard(head_dim, block):
    r = hadamard(head_dim)
    assert r.shape == (head_dim, head_dim) and r.dtype == torch.float32
    assert torch.equal(r, r.T)
    assert (r @ r - torch.eye(head_dim)).abs().max() <= 1e-6
    ref = torch.block_diag(*[_popcount_hadamard(block)] * (head_dim // block)).float()
    assert torch.equal(r, ref)  # independent construction: H[i, j] = (-1)^popcount(i & j) / sqrt(n)
    assert hadamard(head_dim) is r  # cached per (head_dim, device)
    x = torch.randn(100, 4, head_dim)
    assert ((x @ r) @ r - x).abs().max() <= 1e-6 * max(1.0, x.abs().max().item())
    f = resolve_format("int4", head_dim=head_dim)
    assert f.rotation("cpu") is r and resolve_format("int8", head_dim=head_dim).rotation() is None


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_hadamard_transform(head_dim):
    """The storage rotation (butterflies, then one multiply) is x @ R: to float32 rounding on random
    input; bit for bit `fp32(exact sum) * hadamard_norm(b)` on input whose partial sums are all exact
    (multiples of 1/4 below 10), so nothing but the final multiply rounds."""
    r = hadamard(head_dim)
    b = hadamard_block_size(head_dim)
    gen = torch.Generator().manual_seed(head_dim)
    x = torch.randn(50, 3, head_dim, generator=gen) * 10
    got = hadamard_transform(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert (got - x @ r).abs().max() <= 1e-6 * x.abs().max() * head_dim ** 0.5
    q = torch.randint(-40, 41, (20, head_dim), generator=gen) / 4.0
    signs = (r.double() * b ** 0.5).round()  # the +-1 (block-diagonal) Hadamard matrix
    want = (q.double() @ signs).float() * hadamard_norm(b)
    assert torch.equal(hadamard_transform(q), want)
    assert hadamard_norm(b) == float(torch.tensor(b ** -0.5, dtype=torch.float32))


@pytest.mark.parametrize("name", ["bf16", "int8", "int4", "fp8", "fp8_e5m2"])
def test_noncontiguous_and_empty_inputs(name):
    f = resolve_format(name, head_dim=64)
    x = torch.randn(3, 64, 5).transpose(1, 2)  # [3, 5, 64], non-contiguous
    ref = f.quantize(x.contiguous())
    got = f.quantize(x)
    for a, b in zip(got, ref):
        assert (a is None and b is None) or torch.equal(a, b)
    codes, scales, zeros = f.quantize(torch.zeros(0, 5, 64))
    assert codes.shape == (0, 5, f.code_width)
    assert f.dequantize(codes, scales, zeros).shape == (0, 5, 64)
