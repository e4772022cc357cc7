"""Tier (b): the Triton cache-write kernel equals the PyTorch reference bit for bit.

Runs under TRITON_INTERPRET=1 on CPU (tests/conftest.py), small shapes; `gpu` tests repeat it
on large shapes. Codes, scales and zeros must be identical; cache slots not written must stay
untouched (the pools start filled with a poison pattern).
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest
import torch

from kvpack.attention import LayerKVCache, allocate_pool
from kvpack.attention import reference
from kvpack.formats import FP8_SPECS, resolve_format

FORMATS = ["bfloat16", "float16", "float32", "int8", "int8-static", "int4", "int4-norot",
           "fp8_e4m3", "fp8_e4m3-static", "fp8_e5m2", "fp8_e5m2-static"]


def make_pool(name: str, head_dim: int, num_blocks: int, num_kv_heads: int, block_size: int,
              device, group_size: int = 32, gen: torch.Generator | None = None):
    base, _, variant = name.partition("-")
    fmt = resolve_format(base, head_dim=head_dim, static=variant == "static",
                         rotate=variant != "norot", int4_group_size=group_size)
    static = None
    if fmt.scale_mode == "static":
        static = (torch.rand(num_kv_heads, generator=gen) * 0.05 + 0.01).float()
    pool = allocate_pool(fmt, num_blocks, num_kv_heads, block_size, device, static)
    # poison: distinct random bytes, so untouched slots are recognisable
    for t in (pool.codes, pool.scales, pool.zeros):
        if t is not None:
            t.view(torch.uint8).copy_(torch.randint(0, 256, t.view(torch.uint8).shape, generator=gen,
                                                    dtype=torch.uint8).to(t.device))
    return pool


def clone_cache(lc: LayerKVCache) -> LayerKVCache:
    def c(p):
        return type(p)(p.codes.clone(), None if p.scales is None else p.scales.clone(),
                       None if p.zeros is None else p.zeros.clone(), p.static_scale, p.fmt)
    return LayerKVCache(c(lc.k), c(lc.v), lc.k_mean, lc.v_mean)


def assert_same_cache(a: LayerKVCache, b: LayerKVCache) -> None:
    for side in ("k", "v"):
        pa, pb = getattr(a, side), getattr(b, side)
        for name in ("codes", "scales", "zeros"):
            ta, tb = getattr(pa, name), getattr(pb, name)
            if ta is None:
                assert tb is None
                continue
            ba, bb = ta.view(torch.uint8), tb.view(torch.uint8)
            bad = (ba != bb).nonzero()
            assert bad.numel() == 0, f"{side}.{name} ({pa.fmt.name}): {bad.shape[0]} bytes differ, first at {bad[0].tolist()}"


def make_inputs(T: int, H: int, D: int, dtype, gen, outliers: bool = True, exact_rotation: bool = False):
    if exact_rotation:  # small multiples of 1/4: x @ R is exact in any summation order (D = 64, 80)
        k = torch.randint(-24, 25, (T, H, D), generator=gen) / 4.0
        v = torch.randint(-24, 25, (T, H, D), generator=gen) / 4.0
    else:
        k = torch.randn(T, H, D, generator=gen)
        v = torch.randn(T, H, D, generator=gen)
    if outliers:  # a few large channels, some exact zeros, an all-zero token, a tie-heavy row
        k[:, :, 3] *= 20
        v[:, :, D - 1] *= 8
        k[0, 0] = 0
        if T > 2:
            v[1, H - 1] = torch.arange(D) * 0.5 - D / 4
    return k.to(dtype), v.to(dtype)


def to_device(lc: LayerKVCache, device) -> LayerKVCache:
    def mv(p):
        return type(p)(p.codes.to(device), None if p.scales is None else p.scales.to(device),
                       None if p.zeros is None else p.zeros.to(device),
                       None if p.static_scale is None else p.static_scale.to(device), p.fmt)
    mean = lambda m: None if m is None else m.to(device)  # noqa: E731
    return LayerKVCache(mv(lc.k), mv(lc.v), mean(lc.k_mean), mean(lc.v_mean))


def reference_write_cpu(k, v, lc: LayerKVCache, slots) -> LayerKVCache:
    """The reference on CPU (the float32 arithmetic the format defines, which torch's CPU kernels do
    exactly). Each side's storage input (centering and the butterfly rotation: float32 adds,
    subtracts and one multiply, the same values on any device) is formed by
    `reference.storage_input`, then goes through the reference quantizer of the same format
    without rotation or mean."""
    def side(x, pool, mean):
        x = reference.storage_input(x, pool, None if mean is None else mean.to(x.device))
        pool = type(pool)(pool.codes, pool.scales, pool.zeros, pool.static_scale,
                          dataclasses.replace(pool.fmt, rotate=False))
        return x.cpu(), pool
    ref = clone_cache(to_device(lc, "cpu"))
    (kx, kp), (vx, vp) = side(k, ref.k, lc.k_mean), side(v, ref.v, lc.v_mean)
    reference.write_kv(kx, vx, LayerKVCache(kp, vp), slots.cpu())
    return ref


def run_write(k_name, v_name, T=37, H=2, D=64, block_size=16, dtype=torch.float16, group_size=32,
              drop=True, seed=0, device="cpu", exact_rotation=False, centered=False):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = (T + block_size - 1) // block_size + 3
    lc = LayerKVCache(make_pool(k_name, D, num_blocks, H, block_size, "cpu", group_size, gen),
                      make_pool(v_name, D, num_blocks, H, block_size, "cpu", group_size, gen))
    k, v = make_inputs(T, H, D, dtype, gen, exact_rotation=exact_rotation)
    if centered:  # per-(head, channel) means, with the outlier channel's offset
        lc = dataclasses.replace(lc, k_mean=torch.randn(H, D, generator=gen) + k.float().mean(0),
                                 v_mean=torch.randn(H, D, generator=gen) * 0.5)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:T]
    if drop:
        slots[torch.randperm(T, generator=gen)[: max(1, T // 5)]] = -1
    k, v, slots = k.to(device), v.to(device), slots.to(device)
    if device == "cpu":
        ref = clone_cache(lc)
        reference.write_kv(k, v, ref, slots)
    else:
        ref = reference_write_cpu(k, v, lc, slots)
        lc = to_device(lc, device)
    from kvpack.kernels import write_kv

    write_kv(k, v, lc, slots)
    assert_same_cache(to_device(lc, "cpu"), ref)


@pytest.mark.parametrize("name", FORMATS)
def test_write_each_format(name):
    run_write(name, name)


@pytest.mark.parametrize("k_name,v_name", [("int8", "int4"), ("fp8_e5m2", "bfloat16"), ("int4", "fp8_e4m3-static")])
def test_write_mixed_k_v_formats(k_name, v_name):
    run_write(k_name, v_name, T=21, dtype=torch.bfloat16)


@pytest.mark.parametrize("D,group", [(80, 32), (128, 64), (96, 32), (128, 128), (64, 128)])
@pytest.mark.parametrize("name", ["int4", "int8", "fp8_e4m3"])
def test_write_head_dims(name, D, group):
    run_write(name, name, T=9, H=3, D=D, block_size=32, group_size=group, dtype=torch.float32)


@pytest.mark.parametrize("D", [64, 80])
@pytest.mark.parametrize("name", ["int4", "int8", "fp8_e4m3", "fp8_e5m2-static", "bfloat16"])
def test_write_centered(name, D):
    """Layer means on both sides: the kernel subtracts them (before rotating) as the reference does.
    D=80 int4 takes the launcher path (Hadamard blocks straddle the nibble halves)."""
    run_write(name, name, T=19, H=2, D=D, dtype=torch.bfloat16, centered=True)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["int4", "int4-norot", "int8", "fp8_e4m3", "fp8_e5m2-static", "bfloat16"])
def test_write_row_layout(name, D, monkeypatch):
    """The row layout (`cache_write.row_layout`: a quarter of a row per thread, loaded and stored
    through a 4-D or 5-D pointer tensor) on every side that takes it, here at a few tokens (the launcher's
    default takes it from ROW_MIN_TOKENS): codes, scales and zeros still equal the reference's bits,
    with the layer means subtracted too. Head dim 128 in both layouts: lanes on channel bits 4-5 (the
    default) and 3-4 (`KVPACK_WRITE_LANE_BIT=3`)."""
    from kvpack.kernels import cache_write

    monkeypatch.setattr(cache_write, "ROW_MIN_TOKENS", 1)
    for lane_bit in ((None, "3") if D == 128 else (None,)):
        if lane_bit:
            monkeypatch.setenv("KVPACK_WRITE_LANE_BIT", lane_bit)
        _row_layout_cases(name, D)


def _row_layout_cases(name, D):
    run_write(name, name, T=37, H=2, D=D, dtype=torch.bfloat16, centered=name != "bfloat16")
    run_write(name, "int4", T=21, H=3, D=D, dtype=torch.float32)
    if name.startswith("int4") and D == 128:  # groups over several lanes' chunks
        for group in (64, 128):
            run_write(name, name, T=19, H=2, D=D, dtype=torch.bfloat16, group_size=group)


def test_write_row_layout_is_taken():
    """The launcher's rule: rotated or int4 sides at head dims 64 / 128, from ROW_MIN_TOKENS
    tokens (lanes on channel bits 4-5 at 128, 3-4 at 64); the rest (and every side of a short write)
    keep the plain layout (0)."""
    from kvpack.kernels.cache_write import ROW_MIN_TOKENS, plan_write

    def rows(name, D, T):
        lc = LayerKVCache(make_pool(name, D, 4, 2, 16, "cpu"), make_pool("bfloat16", D, 4, 2, 16, "cpu"))
        k = torch.zeros(T, 2, D)
        return plan_write(k, k, lc, torch.zeros(T, dtype=torch.long))[1][-3:-1]

    T = ROW_MIN_TOKENS
    assert rows("int4", 128, T) == [4, 0] and rows("int4", 128, T - 1) == [0, 0]
    assert rows("fp8_e4m3", 128, T) == [4, 0] and rows("int4-norot", 128, T) == [4, 0]
    assert rows("fp8_e4m3", 64, T) == [3, 0] and rows("int4-norot", 64, T) == [3, 0]
    assert rows("int8", 128, T) == [0, 0] and rows("int4", 80, T) == [0, 0]
    assert rows("int4", 32, T) == [0, 0] and rows("fp8_e4m3", 256, T) == [0, 0]


def test_write_lane_bit_setting_is_checked(monkeypatch):
    """KVPACK_WRITE_LANE_BIT takes 3 or 4 only; anything else is refused by name at plan time."""
    from kvpack.kernels.cache_write import row_layout

    pool = make_pool("int4", 128, 4, 2, 16, "cpu")
    monkeypatch.setenv("KVPACK_WRITE_LANE_BIT", "3")
    assert row_layout(pool, True) == 3
    monkeypatch.setenv("KVPACK_WRITE_LANE_BIT", "5")
    with pytest.raises(ValueError, match="KVPACK_WRITE_LANE_BIT='5'"):
        row_layout(pool, True)


def test_write_single_token_and_all_dropped():
    run_write("int4", "int8", T=1, drop=False)
    run_write("int8", "int8", T=3, drop=False, seed=1)


def test_write_extreme_values():
    """Huge, tiny, subnormal-scale inputs: saturation and the s == 0 -> 1 rule."""
    gen = torch.Generator().manual_seed(5)
    for name in ("int8", "fp8_e4m3", "fp8_e5m2", "int4", "fp8_e4m3-static", "int8-static"):
        D, H, bs = 64, 2, 16
        lc = LayerKVCache(make_pool(name, D, 2, H, bs, "cpu", gen=gen), make_pool(name, D, 2, H, bs, "cpu", gen=gen))
        k = torch.randn(4, H, D, generator=gen)
        k[0] *= 1e-6
        k[1] *= 3e4
        k[2] = 1e-30
        k[3, 0, 5] = 1e9
        v = k.flip(0).clone()
        slots = torch.tensor([0, 5, 17, 31])
        ref = clone_cache(lc)
        reference.write_kv(k, v, ref, slots)
        from kvpack.kernels import write_kv

        write_kv(k, v, lc, slots)
        assert_same_cache(lc, ref)


def test_write_divides_exactly():
    """The kernel divides like the format (IEEE x / s): static int8 scale 0.640625 on a value where
    x / s rounds to code 3 and a plain multiply by 1/s would give 2; fp8 (rotated) kernel against
    reference."""
    from kvpack.kernels import write_kv

    for name in ("int8-static", "fp8_e4m3-static"):
        lc = LayerKVCache(make_pool(name, 64, 2, 2, 16, "cpu"), make_pool(name, 64, 2, 2, 16, "cpu"))
        for p in (lc.k, lc.v):
            p.static_scale.fill_(0.640625)
        k = torch.full((3, 2, 64), 1.6015626192092896)
        ref = clone_cache(lc)
        reference.write_kv(k, k, ref, torch.tensor([0, 1, 2]))
        write_kv(k, k, lc, torch.tensor([0, 1, 2]))
        assert_same_cache(lc, ref)
        if name == "int8-static":
            assert (lc.k.codes[0, :, :3] == 3).all()


def _rn32(v):
    """An exact rational rounded to the nearest float32 (ties to even; normal range)."""
    from fractions import Fraction

    if v == 0:
        return np.float32(0.0)
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    scaled = a / Fraction(2) ** (e - 23)
    n = scaled.numerator // scaled.denominator
    rem = scaled - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    return np.float32((1 if v > 0 else -1) * float(n * Fraction(2) ** (e - 23)))


def test_div_by_scale_is_the_ieee_quotient():
    """The GPU path of `quant.div_by_scale` (q = x * r, r = 1/s correctly rounded; e = fma(q, s, -x);
    fma(-e, r, q)), emulated with exact rational fused multiply-adds, equals numpy's IEEE x / s for
    fp16 scales across the whole range (normal and subnormal) and quotients at, next to and between
    the rounding ties, and keeps the sign of a zero x (-0 is its own FP8 code); a plain x * r misses
    ~10 % of the exact ties (the check sees that)."""
    from fractions import Fraction

    def fma(a, b, c):
        exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
        if exact != 0:
            return _rn32(exact)
        # IEEE 754 exact zero sums: -0 only when both addends are -0 (a product of zeros carries the
        # product's sign); any other exact cancellation is +0 under round-to-nearest
        prod_neg = (np.signbit(np.float32(a)) != np.signbit(np.float32(b))) and float(a) * float(b) == 0
        return np.float32(-0.0) if prod_neg and np.signbit(np.float32(c)) else np.float32(0.0)

    def gpu_div(x, s, r):
        q = np.float32(x * r)
        return fma(-fma(q, s, -x), r, q)

    for s in (np.float32(1.0), np.float32(0.007), np.float32(3.5)):
        for z in (np.float32(0.0), np.float32(-0.0)):
            got = gpu_div(z, s, np.float32(1) / s)
            assert got == 0 and np.signbit(got) == np.signbit(z), (z, s, got)
    # the previous form, fma(fma(-q, s, x), r, q), turned -0 into +0 (seen on the H200 as a wrong
    # fp8_e4m3 code): the emulation tells the two apart
    q = np.float32(-0.0)
    assert not np.signbit(fma(fma(-q, np.float32(1), np.float32(-0.0)), np.float32(1), q))

    rng = np.random.default_rng(0)
    every = np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)  # positive finite fp16
    # KVPACK_FULL_DIV_CHECK=1: every scale (~25 s) instead of 400 of them
    scales = every if os.environ.get("KVPACK_FULL_DIV_CHECK") == "1" else rng.choice(every, 400, replace=False)
    checked = plain_wrong = 0
    for s in scales:
        r = np.float32(1) / s
        ties = [np.float32((np.float32(k) + np.float32(0.5)) * s) for k in rng.integers(-130, 130, 4)]
        xs = ties + [np.nextafter(t, np.float32(np.inf)) for t in ties] + [np.nextafter(t, -np.float32(np.inf))
                                                                          for t in ties]
        xs += list((rng.standard_normal(4) * 60 * s).astype(np.float32))
        for x in xs:
            want = np.float32(x / s)
            if x == 0 or not np.isfinite(want) or abs(want) < 1.2e-38:
                continue
            q = np.float32(x * r)
            assert gpu_div(x, s, r) == want, (x, s)
            checked += 1
            plain_wrong += q != want
    assert checked > 4000 and plain_wrong > 50, (checked, plain_wrong)


def test_recip_f16_is_the_ieee_reciprocal():
    """`quant.recip_f16`'s GPU path (r0 = rcp.approx(s), any value within 1 ulp of 1/s; e = fma(-s, r0,
    1); fma(r0, e, r0)), emulated with exact rational fused multiply-adds, equals numpy's IEEE 1 / s
    for fp16 scales across the whole range, subnormal ones included, whichever r0 the hardware gives;
    KVPACK_FULL_DIV_CHECK=1: every positive finite fp16 instead of 1628 (the 64 smallest, the 64 largest
    and 1500 drawn). A plain r0
    (no Newton step) misses, so the check can fail."""
    from fractions import Fraction

    def fma(a, b, c):
        return _rn32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))

    every = np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    rng = np.random.default_rng(1)
    scales = every if os.environ.get("KVPACK_FULL_DIV_CHECK") == "1" else np.concatenate(
        [every[:64], every[-64:], rng.choice(every, 1500, replace=False)])
    one = np.float32(1.0)
    checked = off_by_one = 0
    for s in scales:
        want = one / s
        for r0 in (np.nextafter(want, np.float32(0)), want, np.nextafter(want, np.float32(np.inf))):
            got = fma(r0, fma(-s, r0, one), r0)
            assert got == want, (s, r0, got, want)
            checked += 1
            off_by_one += r0 != want
    assert checked >= 3 * len(scales) and off_by_one == 2 * len(scales)


@pytest.mark.gpu
def test_recip_f16_gpu_every_fp16():
    """On the GPU, `quant.recip_f16` equals `div_rn(1, s)` bit for bit for every positive fp16 s (and
    +inf -> 0): the hardware's own rcp.approx, not an emulation."""
    import triton
    import triton.language as tl

    from kvpack.kernels.quant import recip_f16

    @triton.jit
    def kernel(s_ptr, got_ptr, want_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        s = tl.load(s_ptr + i, mask=i < n, other=1.0)
        tl.store(got_ptr + i, recip_f16(s), mask=i < n)
        tl.store(want_ptr + i, tl.math.div_rn(1.0, s), mask=i < n)

    s = torch.arange(1, 0x7C01, dtype=torch.int16).view(torch.float16).float().cuda()  # up to +inf
    got, want = torch.empty_like(s), torch.empty_like(s)
    kernel[(triton.cdiv(s.numel(), 1024),)](s, got, want, s.numel(), BLOCK=1024)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert got[-1] == 0 and torch.isinf(s[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("c", [15.0, 127.0, 448.0, 57344.0])
def test_div_by_const_gpu_every_float32(c):
    """On the GPU, `quant.div_by_const(x, C)` (the dynamic scales' absmax / QMAX and int4's
    range / 15) equals `div_rn(x, C)` bit for bit for every one of the 2**32 float32 x, except NaN
    payloads (NaN both ways) and quotients below 2**-126, which must round to the same fp16 (the
    only use of these quotients). Counted on the device."""
    import triton
    import triton.language as tl

    from kvpack.kernels.quant import div_by_const

    @triton.jit
    def kernel(bad_ptr, C: tl.constexpr, PER: tl.constexpr, BLOCK: tl.constexpr):
        base = tl.program_id(0).to(tl.int64) * PER
        bad = tl.zeros((BLOCK,), tl.int32)
        for j in range(0, PER, BLOCK):
            bits = (base + j + tl.arange(0, BLOCK)).to(tl.uint32)
            x = bits.to(tl.float32, bitcast=True)
            got = div_by_const(x, C)
            want = tl.math.div_rn(x, C)
            same = got.to(tl.int32, bitcast=True) == want.to(tl.int32, bitcast=True)
            same = same | ((got != got) & (want != want))
            tiny = tl.abs(want) < 1.1754943508222875e-38
            same = same | (tiny & (got.to(tl.float16) == want.to(tl.float16)))
            bad += tl.where(same, 0, 1)
        tl.atomic_add(bad_ptr, tl.sum(bad))

    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    per = 1 << 16
    kernel[((1 << 32) // per,)](bad, C=c, PER=per, BLOCK=1024)
    assert bad.item() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int8", "int8-static", "int4", "fp8_e4m3", "fp8_e5m2-static"])
def test_write_gpu_division_ties(name):
    """On the GPU (`div_by_scale`'s fused multiply-adds) codes equal the reference's IEEE division
    where x / s lands on or next to a rounding tie (int8; the other formats' scales do not line up
    with the ties, a general check), over scales from 2**-20 to 2**10."""
    from kvpack.kernels import write_kv

    gen = torch.Generator().manual_seed(7)
    D, H, bs, T = 64, 2, 16, 512
    lc = LayerKVCache(make_pool(name + ("" if "static" in name else "-norot"), D, T // bs + 1, H, bs, "cpu", gen=gen),
                      make_pool(name + ("" if "static" in name else "-norot"), D, T // bs + 1, H, bs, "cpu", gen=gen))
    scale = torch.exp2(torch.randint(-20, 11, (T, H, 1), generator=gen).float()) \
        * (1 + torch.rand(T, H, 1, generator=gen)).half().float()
    if "static" in name:  # one scale per head
        scale = scale[:1].expand(T, H, 1).clone()
    k = ((torch.randint(-120, 120, (T, H, D), generator=gen) + 0.5) * scale).float()
    k = k + torch.randint(-1, 2, k.shape, generator=gen) * k.abs() * 2**-23  # next to the ties too
    k[:, :, 0] = 127 * scale[:, :, 0] * 1.0001  # the row maximum: the dynamic scale is ~`scale`
    if "static" in name:
        for p in (lc.k, lc.v):
            p.static_scale.copy_(scale[0, :, 0])
    v = k.flip(0).contiguous()
    slots = torch.randperm((T // bs + 1) * bs, generator=gen)[:T]
    ref = reference_write_cpu(k, v, lc, slots)
    got = to_device(lc, "cuda")
    write_kv(k.cuda(), v.cuda(), got, slots.cuda())
    assert_same_cache(to_device(got, "cpu"), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("block_size", [16, 64])
def test_write_gpu_large(name, D, block_size):
    run_write(name, name, T=3000, H=8, D=D, block_size=block_size, dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 80, 128])
@pytest.mark.parametrize("name", ["int4", "int8", "fp8_e4m3", "fp8_e5m2"])
def test_write_gpu_centered(name, D):
    run_write(name, name, T=2000, H=8, D=D, dtype=torch.bfloat16, device="cuda", centered=True)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_write_gpu_int4_group_128(D):
    run_write("int4", "int4", T=2000, H=8, D=D, dtype=torch.bfloat16, device="cuda", group_size=128)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("static", [False, True])
def test_write_gpu_fp8_special_values(kind, static, monkeypatch):
    """The sm >= 89 instruction encoder and the software encoder write the reference's codes on every
    FP8 value, the midpoints between neighbours (ties), their float32 neighbours, +-0, +-inf, values
    past the largest finite code and (static scale: no absmax over them) NaNs of both signs.
    Unrotated pools, so the values reach the encoder as they are. NaN codes compare without their
    sign: x / s, before either encoder, gives NaNs the platform's sign (measured: every other code
    equal)."""
    from kvpack.formats import fp8_decode
    from kvpack.kernels import write_kv

    vals = fp8_decode(torch.arange(256, dtype=torch.int32).to(torch.uint8), kind).float()
    vals = vals[torch.isfinite(vals)].unique()
    mids = (vals[1:] + vals[:-1]) / 2
    big = vals.max().item()
    extra = [0.0, -0.0, float("inf"), -float("inf"), 1e30, -1e30, big * 1.03, -big * 1.07, 1e-12, -1e-12]
    if static:
        extra += [float("nan"), -float("nan")]
    x = torch.cat([vals, mids, torch.nextafter(mids, torch.full_like(mids, float("inf"))),
                   torch.nextafter(mids, torch.full_like(mids, -float("inf"))), torch.tensor(extra)])
    D, H, bs = 128, 2, 16
    T = -(-x.numel() // (H * D))
    k = torch.zeros(T * H * D)
    k[: x.numel()] = x
    k = k.view(T, H, D)
    if not static:  # the largest finite value in every row: the dynamic scale is then ~1
        k[:, :, 0] = big
    v = k.flip(0).contiguous()
    nb = -(-T // bs) + 1
    fmt = resolve_format(kind, head_dim=D, static=static, rotate=False)
    one = torch.ones(H) if static else None
    lc = LayerKVCache(allocate_pool(fmt, nb, H, bs, "cpu", one), allocate_pool(fmt, nb, H, bs, "cpu", one))
    slots = torch.randperm(nb * bs, generator=torch.Generator().manual_seed(0))[:T]
    ref = reference_write_cpu(k, v, lc, slots)
    nan_code = FP8_SPECS[kind].nan_code

    def nan_sign_dropped(p):  # a NaN's sign after a division is the platform's (x86: -, CUDA: +)
        c = p.codes.view(torch.uint8)
        c = torch.where(c & 0x7F == nan_code, torch.full_like(c, nan_code), c)
        return type(p)(c, p.scales, p.zeros, p.static_scale, p.fmt)

    ref = LayerKVCache(nan_sign_dropped(ref.k), nan_sign_dropped(ref.v))
    for soft in ("0", "1"):
        monkeypatch.setenv("KVPACK_SOFT_FP8_ENCODE", soft)
        got = to_device(lc, "cuda")
        write_kv(k.cuda(), v.cuda(), got, slots.cuda())
        got = to_device(got, "cpu")
        assert_same_cache(LayerKVCache(nan_sign_dropped(got.k), nan_sign_dropped(got.v)), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("name,rotate", [("int8", False), ("fp8_e4m3", False), ("fp8_e4m3", True), ("fp8_e5m2", True),
                                         ("int4", False), ("int4", True)])
def test_write_gpu_dynamic_scale_extreme_rows(name, rotate):
    """A dynamic scale's quotient without the per-element NaN guard (`quant.div_by_scale_rows`, int4:
    one guard per group, `quant.int4_encode`): rows whose scale overflows fp16 to inf (absmax 1e30,
    1e5 * QMAX), int4 groups whose min is below -65504 (zero -inf), rows of +-0 and subnormal-scale rows,
    beside ordinary ones, rotated or not (the row layout where it rotates), 1200 and 40 tokens: the
    reference's codes and scales."""
    from kvpack.kernels import write_kv

    gen = torch.Generator().manual_seed(11)
    D, H, bs, T = 128, 2, 16, 1200
    k = torch.randn(T, H, D, generator=gen)
    k[0::7] *= 1e30  # s = inf: every code 0
    k[1::7] *= 1e5  # int8: s = fp16(absmax / 127) overflows too; FP8 e4m3 / e5m2 near their edge
    k[2::7] = 0.0
    k[3::7, :, ::2] = -0.0
    k[4::7] *= 1e-9  # s rounds to an fp16 subnormal or 0 (-> 1)
    v = k.flip(0).contiguous()
    fmt = resolve_format(name, head_dim=D, rotate=rotate)
    lc = LayerKVCache(allocate_pool(fmt, T // bs + 2, H, bs, "cpu"), allocate_pool(fmt, T // bs + 2, H, bs, "cpu"))
    for n in (T, 40):  # >= ROW_MIN_TOKENS (the row layout where the format takes it) and a decode-sized write
        slots = torch.randperm((T // bs + 2) * bs, generator=gen)[:n]
        ref = reference_write_cpu(k[:n], v[:n], lc, slots)
        got = to_device(lc, "cuda")
        write_kv(k[:n].cuda(), v[:n].cuda(), got, slots.cuda())
        assert_same_cache(to_device(got, "cpu"), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("T,D", [(2048, 128), (40, 128), (2048, 80), (40, 64)])
def test_write_gpu_int4_clamp_and_nan_groups(T, D):
    """int4 codes where the clamp decides them, and groups holding a NaN. Groups of values offset by c from a
    range r, |c| / r log-uniform over 1-4000: the fp16 zero point's rounding then pushes (x - m) / s past -0.5
    or 15.5 in some groups (asserted: the reference clamps), beside groups that need no clamp. Groups holding
    a NaN: NaN scale and zero and codes 0, as the reference's amin gives (`quant.min_nan`; compared as NaN,
    whatever its sign). Unrotated, so the values reach the encoder as they are; the row layout (2048 tokens),
    the plain one (40) and head dim 80's padded halves (groups of 16)."""
    from kvpack.formats import int4_params
    from kvpack.kernels import write_kv

    gen = torch.Generator().manual_seed(5)
    fmt = resolve_format("int4", head_dim=D, rotate=False)
    H, bs, G = 2, 16, fmt.group_size
    r = torch.exp2(torch.randint(-6, 6, (T, H, D // G, 1), generator=gen).float())
    ratio = torch.exp(torch.rand(T, H, D // G, 1, generator=gen) * math.log(4000.0))
    c = ratio * r * torch.where(torch.rand(T, H, D // G, 1, generator=gen) < 0.5, -1.0, 1.0)
    u = torch.rand(T, H, D // G, G, generator=gen)
    u[..., 0], u[..., 1] = 0.0, 1.0  # the group's min and max
    k = (c + r * u).reshape(T, H, D)
    k[T - 7, 1, 40] = float("nan")
    k[T - 3, 0, 0] = float("nan")
    v = k.flip(0).contiguous()
    s, m = int4_params(k, G)
    q = torch.round((k.view(T, H, D // G, G) - m.float()[..., None]) * (1.0 / s.float()[..., None]))
    assert ((q < 0) | (q > 15)).any()
    nb = T // bs + 2
    lc = LayerKVCache(allocate_pool(fmt, nb, H, bs, "cpu"), allocate_pool(fmt, nb, H, bs, "cpu"))
    slots = torch.randperm(nb * bs, generator=gen)[:T]
    ref = reference_write_cpu(k, v, lc, slots)
    got = to_device(lc, "cuda")
    write_kv(k.cuda(), v.cuda(), got, slots.cuda())
    got = to_device(got, "cpu")

    def nan_canonical(p):  # a NaN scale / zero as one bit pattern (x86 and CUDA give NaNs different signs)
        fix = lambda t: torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)  # noqa: E731
        return type(p)(p.codes, fix(p.scales), fix(p.zeros), p.static_scale, p.fmt)

    written = lambda t: t[slots // bs, :, slots % bs]  # noqa: E731  ([T, H, groups])
    for side in (ref.k, ref.v):
        assert torch.isnan(written(side.scales)).sum() == 2 and torch.isnan(written(side.zeros)).sum() == 2
    assert_same_cache(LayerKVCache(nan_canonical(got.k), nan_canonical(got.v)),
                      LayerKVCache(nan_canonical(ref.k), nan_canonical(ref.v)))


def test_reference_cpu_path_matches_reference():
    """The helper the GPU tests use (CPU reference on pre-rotated input) equals the plain reference."""
    gen = torch.Generator().manual_seed(3)
    lc = LayerKVCache(make_pool("int4", 64, 4, 2, 16, "cpu", gen=gen), make_pool("int8", 64, 4, 2, 16, "cpu", gen=gen))
    k, v = make_inputs(20, 2, 64, torch.float32, gen)
    slots = torch.randperm(64, generator=gen)[:20]
    slots[3] = -1
    ref = clone_cache(lc)
    reference.write_kv(k, v, ref, slots)
    assert_same_cache(reference_write_cpu(k, v, lc, slots), ref)


def test_write_tile_arguments_are_checked():
    """`plan_write`'s tile arguments: a row-layout tile with more threads than quarter rows (16
    tokens on 4 warps, 32 on 8: the threads repeat each other's rows, 4-7x slower on the H200) and
    tiles or warp counts that are not powers of two are refused by name; the largest valid ones and
    every default plan pass."""
    from kvpack.kernels.cache_write import ROW_MIN_TOKENS, plan_write

    lc = LayerKVCache(make_pool("int4", 128, 80, 2, 16, "cpu"), make_pool("int8", 128, 80, 2, 16, "cpu"))
    T = ROW_MIN_TOKENS
    k = torch.zeros(T, 2, 128)
    slots = torch.arange(T)
    for bt, nw in ((16, 4), (32, 8), (8, 2)):
        with pytest.raises(ValueError, match=f"block_t={bt} tokens have {4 * bt} quarter rows.*{32 * nw} threads"):
            plan_write(k, k, lc, slots, block_t=bt, num_warps=nw)
        plan_write(k, k, lc, slots, block_t=bt, num_warps=nw, rows=False)  # the plain layout takes it
    for bt, nw in ((32, 4), (64, 8), (8, 1)):
        assert plan_write(k, k, lc, slots, block_t=bt, num_warps=nw)[0] == (T // bt, 2)
    for bt, nw in ((24, 4), (32, 3), (0, 4)):
        with pytest.raises(ValueError, match="powers of two"):
            plan_write(k, k, lc, slots, block_t=bt, num_warps=nw)
    # default plans: forced rows on a short write, and 8 warps, get a tile the layout fills
    assert plan_write(k[:5], k[:5], lc, slots[:5], rows=True)[0] == (1, 2)
    assert plan_write(k, k, lc, slots, num_warps=8)[0] == (T // 64, 2)
