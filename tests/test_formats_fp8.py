"""Tier (a): the software FP8 codec equals torch's own float8 conversion, bit for bit.

Oracle: `torch.clamp(x, -MAX, MAX).to(torch.float8_*).view(torch.uint8)` for encoding and
`codes.view(torch.float8_*).float()` for decoding (the exact contract of `formats/fp8.py`).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from kvpack.formats import FP8_SPECS, fp8_decode, fp8_encode
from kvpack.formats import fp8 as fp8_mod

TORCH_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FMTS = list(TORCH_DTYPES)
ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)


def torch_encode(x: torch.Tensor, fmt: str) -> torch.Tensor:
    m = FP8_SPECS[fmt].max_finite
    return torch.clamp(x, -m, m).to(TORCH_DTYPES[fmt]).view(torch.uint8)


def bits_f32(b: torch.Tensor) -> torch.Tensor:
    return b.to(torch.int64).to(torch.int32).view(torch.float32)  # wraps for b >= 2^31


def assert_codes_equal(x: torch.Tensor, fmt: str) -> None:
    got, ref = fp8_encode(x, fmt), torch_encode(x, fmt)
    assert got.dtype == torch.uint8 and got.shape == x.shape
    bad = (got != ref).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise AssertionError(
            f"{fmt}: {bad.numel()} mismatches; first x={x[i].item()!r} "
            f"(bits {hex(int(x[i:i+1].view(torch.int32)) & 0xFFFFFFFF)}): "
            f"got {hex(int(got[i]))}, torch {hex(int(ref[i]))}"
        )


def finite_values(fmt: str) -> torch.Tensor:
    """All non-negative finite fp8 values, ascending (codes 0x00..max_code)."""
    return fp8_decode(ALL_CODES[: FP8_SPECS[fmt].max_code + 1], fmt)


@pytest.mark.parametrize("fmt", FMTS)
def test_decode_all_256_codes(fmt):
    ref = ALL_CODES.view(TORCH_DTYPES[fmt]).float()
    got = fp8_decode(ALL_CODES, fmt)
    assert got.dtype == torch.float32
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    ok = ~torch.isnan(ref)  # compare bits: catches the sign of zero and +-inf
    assert torch.equal(got[ok].view(torch.int32), ref[ok].view(torch.int32))


@pytest.mark.parametrize("fmt", FMTS)
def test_decode_known_values(fmt):
    # The published Ampere encoder bug decoded a stored zero as 2^-7 and halved [256, 448].
    d = fp8_decode(torch.tensor([0x00, 0x80, 0x01], dtype=torch.uint8), fmt)
    assert d[0].item() == 0.0 and not torch.signbit(d[0])
    assert d[1].item() == 0.0 and torch.signbit(d[1])
    sp = FP8_SPECS[fmt]
    assert d[2].item() == 2.0 ** (1 - sp.bias - sp.man_bits)  # smallest subnormal
    assert fp8_decode(torch.tensor([sp.max_code], dtype=torch.uint8), fmt).item() == sp.max_finite
    if fmt == "fp8_e4m3":
        top = fp8_decode(torch.arange(0x78, 0x7F, dtype=torch.int32).to(torch.uint8), fmt)
        assert top.tolist() == [256.0, 288.0, 320.0, 352.0, 384.0, 416.0, 448.0]


@pytest.mark.parametrize("fmt", FMTS)
def test_encode_random_bits_all_binades(fmt):
    g = torch.Generator().manual_seed(1234 + len(fmt))
    n = 1 << 19  # 2 x 2^19 > 1e6 values per format
    sign = torch.randint(0, 2, (2 * n,), generator=g, dtype=torch.int64)
    mant = torch.randint(0, 1 << 23, (2 * n,), generator=g, dtype=torch.int64)
    exp_all = torch.randint(0, 256, (n,), generator=g, dtype=torch.int64)  # every binade (incl. 0, 255)
    exp_near = torch.randint(127 - 30, 127 + 20, (n,), generator=g, dtype=torch.int64)  # fp8's range
    exp = torch.cat([exp_all, exp_near])
    x = bits_f32((sign << 31) | (exp << 23) | mant)
    assert_codes_equal(x, fmt)


@pytest.mark.parametrize("fmt", FMTS)
def test_encode_halfway_cases_tie_to_even(fmt):
    v = finite_values(fmt)
    lo, hi = v[:-1], v[1:]
    mid = (lo + hi) / 2  # exact in float32: fp8 values have <= 4 significant bits
    assert torch.equal(mid * 2, lo + hi)
    codes = torch.arange(len(lo), dtype=torch.int32)
    expect = torch.where(codes % 2 == 0, codes, codes + 1).to(torch.uint8)  # ties go to the even code
    assert torch.equal(fp8_encode(mid, fmt), expect)
    assert torch.equal(fp8_encode(-mid, fmt), expect | 0x80)
    # both tie directions were exercised: some ties round down, some round up
    assert (expect.int() == codes).any() and (expect.int() == codes + 1).any()
    up = torch.nextafter(mid, torch.full_like(mid, float("inf")))
    down = torch.nextafter(mid, torch.zeros_like(mid))
    for x in (mid, up, down, v, torch.nextafter(v, v + 1), torch.nextafter(v, v - 1)):
        assert_codes_equal(torch.cat([x, -x]), fmt)
    assert torch.equal(fp8_encode(up, fmt).int(), codes + 1)
    assert torch.equal(fp8_encode(down, fmt).int(), codes)


@pytest.mark.parametrize("fmt", FMTS)
def test_encode_top_binade_and_saturation(fmt):
    sp = FP8_SPECS[fmt]
    top = 2.0 ** (sp.max_finite.__floor__().bit_length() - 1)  # 256 (e4m3), 32768 (e5m2)
    x = torch.linspace(top, sp.max_finite * 1.2, 20001)  # [256, 537.6] for e4m3
    assert_codes_equal(torch.cat([x, -x]), fmt)
    codes = fp8_encode(torch.tensor([sp.max_finite, sp.max_finite * 1.01, 1e30, 3.4e38,
                                     float("inf"), -float("inf"), -1e30]), fmt)
    mc = sp.max_code
    assert codes.tolist() == [mc, mc, mc, mc, mc, mc | 0x80, mc | 0x80]
    if fmt == "fp8_e4m3":  # each value of the top binade encodes to itself (not at half size)
        vals = torch.tensor([256.0, 288.0, 320.0, 352.0, 384.0, 416.0, 448.0])
        assert fp8_encode(vals, fmt).tolist() == list(range(0x78, 0x7F))


@pytest.mark.parametrize("fmt", FMTS)
def test_encode_specials_and_subnormals(fmt):
    sp = FP8_SPECS[fmt]
    nan_bits = torch.tensor([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFC00000, 0xFF800001, 0xFFFFFFFF])
    nans = bits_f32(nan_bits)
    assert fp8_encode(nans, fmt).tolist() == [sp.nan_code] * 3 + [sp.nan_code | 0x80] * 3
    assert_codes_equal(nans, fmt)
    z = torch.tensor([0.0, -0.0])
    assert fp8_encode(z, fmt).tolist() == [0x00, 0x80]
    # float32 subnormals, fp8 subnormals, and the boundary between subnormal and normal fp8
    f32_sub = bits_f32(torch.tensor([1, 2, 0x7FFFFF, 0x400000, 0x80000001, 0x807FFFFF]))
    tiny = 2.0 ** (1 - sp.bias - sp.man_bits)
    x = torch.cat([f32_sub, torch.linspace(0, 2 ** (2 - sp.bias), 50001), torch.tensor([tiny / 2, tiny / 2 * 1.0001])])
    assert_codes_equal(torch.cat([x, -x]), fmt)
    assert fp8_encode(torch.tensor([tiny / 2, tiny / 2 * 1.0001]), fmt).tolist() == [0, 1]


@pytest.mark.parametrize("fmt", FMTS)
def test_round_trip_all_codes(fmt):
    d = fp8_decode(ALL_CODES, fmt)
    ok = ~torch.isnan(d) & ~torch.isinf(d)
    assert torch.equal(fp8_encode(d[ok], fmt), ALL_CODES[ok])
    if fmt == "fp8_e5m2":  # +-inf codes decode to +-inf, which the encoder saturates to +-max
        assert fp8_encode(d[torch.isinf(d)], fmt).tolist() == [0x7B, 0xFB]


def test_codec_uses_no_float8_dtype():
    for fn in (fp8_mod.fp8_encode, fp8_mod.fp8_decode):
        assert "float8" not in inspect.getsource(fn)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_codec_matches_cuda_conversion(fmt):
    g = torch.Generator().manual_seed(7)
    n = 1 << 20
    exp = torch.randint(127 - 30, 127 + 20, (n,), generator=g, dtype=torch.int64)
    bits = (torch.randint(0, 2, (n,), generator=g) << 31) | (exp << 23) | torch.randint(0, 1 << 23, (n,), generator=g)
    x = torch.cat([bits_f32(bits), finite_values(fmt), -finite_values(fmt)]).cuda()
    assert torch.equal(fp8_encode(x, fmt), torch_encode(x, fmt))
    ref = ALL_CODES.cuda().view(TORCH_DTYPES[fmt]).float()
    got = fp8_decode(ALL_CODES.cuda(), fmt)
    ok = ~torch.isnan(ref)
    assert torch.equal(got[ok].view(torch.int32), ref[ok].view(torch.int32))
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
