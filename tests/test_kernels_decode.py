"""Tier (b): the Triton decode attention kernel equals the PyTorch reference within a stated tolerance.

The cache is filled by the reference write (so both sides read the same codes); q is fp16 in the
interpreter tests (the Triton 3.6 CPU interpreter mishandles bf16 dots). Tolerance: 2e-3 absolute
on outputs of magnitude ~1: the kernel uses fp16 dot operands (q, dequantized K/V tiles and the
probabilities are rounded to fp16, ~5e-4 relative each), the reference is float32 throughout,
and both outputs are rounded to fp16 (one ulp is 9.8e-4 at magnitude 1-2): |out - ref| <= ATOL + RTOL|ref|.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import triton
import triton.language as tl

from kvpack.attention import AttentionMetadata, LayerKVCache
from kvpack.attention import reference
from kvpack.formats import fp8_decode
from kvpack.kernels.quant import (
    K_FMT_FP8E4M3, K_FMT_FP8E5M2, fp8_decode_f16, int4_to_f16, int8_to_f16, split_q_int8,
)
from tests.test_kernels_write import make_pool

ATOL = 2e-3
RTOL = 2e-3


def build_case(k_name, v_name, seq_lens, Hq, Hkv, D, block_size, dtype=torch.float16, seed=0,
               device="cpu", group_size=32, shuffle=True):
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [(s + block_size - 1) // block_size for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 4
    ids = torch.randperm(num_blocks, generator=gen).tolist() if shuffle else list(range(num_blocks))
    tables, at = [], 0
    for n in blocks_per_seq:
        tables.append(ids[at: at + n])
        at += n
    lc = LayerKVCache(make_pool(k_name, D, num_blocks, Hkv, block_size, "cpu", group_size, gen),
                      make_pool(v_name, D, num_blocks, Hkv, block_size, "cpu", group_size, gen))
    # fill every sequence's context through the reference write (prefill metadata)
    fill = AttentionMetadata.build(seq_lens, seq_lens, tables, block_size)
    T = sum(seq_lens)
    k = torch.randn(T, Hkv, D, generator=gen)
    v = torch.randn(T, Hkv, D, generator=gen)
    k[:, :, 1] *= 6  # an outlier channel
    reference.write_kv(k.to(dtype), v.to(dtype), lc, fill.slot_mapping)
    if device != "cpu":
        lc = LayerKVCache(*(type(p)(p.codes.to(device), None if p.scales is None else p.scales.to(device),
                                    None if p.zeros is None else p.zeros.to(device),
                                    None if p.static_scale is None else p.static_scale.to(device), p.fmt)
                            for p in (lc.k, lc.v)))
    meta = AttentionMetadata.build([1] * len(seq_lens), seq_lens, tables, block_size, device=device)
    q = torch.randn(len(seq_lens), Hq, D, generator=gen).to(dtype).to(device)
    return q, lc, meta


def check(k_name, v_name, seq_lens, Hq=4, Hkv=2, D=64, block_size=16, num_splits=None, atol=ATOL,
          dtype=torch.float16, device="cpu", rtol=RTOL, variant=None, **kw):
    q, lc, meta = build_case(k_name, v_name, seq_lens, Hq, Hkv, D, block_size, dtype=dtype, device=device, **kw)
    scale = D ** -0.5
    ref = reference.paged_attention(q, lc, meta, scale).float()
    from kvpack.kernels import paged_attention
    from kvpack.kernels.decode_attention import decode_paged_attention

    out = decode_paged_attention(q, lc, meta, scale, num_splits=num_splits, variant=variant) \
        if num_splits or variant else paged_attention(q, lc, meta, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    err = ((out.float() - ref).abs() - rtol * ref.abs()).max().item()
    assert err <= atol, f"{k_name}/{v_name} D={D} bs={block_size} splits={num_splits}: max(|err| - rtol|ref|) {err:.2e}"
    return err


FORMATS = ["float16", "float32", "int8", "int8-static", "int4", "fp8_e4m3", "fp8_e5m2-static", "fp8_e5m2"]


@pytest.mark.parametrize("name", FORMATS)
def test_decode_each_format(name):
    check(name, name, [37, 1, 70], num_splits=1)


@pytest.mark.parametrize("v_name", ["int8", "int8-static", "int4", "fp8_e4m3", "float16"])
@pytest.mark.parametrize("k_name", ["int8", "int8-static"])
def test_imma_each_v_format(k_name, v_name):
    """The "imma" variant (int8 K codes in an int8 MMA, q as two int8 parts): the dot variant's
    tolerance, one and two splits, a masked last tile."""
    from kvpack.kernels.decode_attention import plan_decode

    q, lc, meta = build_case(k_name, v_name, [37, 1, 70], 4, 2, 64, 16)
    assert plan_decode(q, lc, meta, 0.1, variant="imma").variant == "imma"
    assert plan_decode(q, lc, meta, 0.1).variant == "imma"  # the default for int8 K
    for splits in (1, 2):
        check(k_name, v_name, [37, 1, 70], num_splits=splits, variant="imma")


def test_imma_q_split_error_bound():
    """q with an outlier channel 60x the others (the int8 split's step is the row's absmax / 32258):
    still within the dot variant's tolerance; and "imma" on a K format other than int8 is "dot"."""
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    q, lc, meta = build_case("int8", "int8", [70, 33], 4, 2, 64, 16)
    q[:, :, 5] *= 60
    ref = reference.paged_attention(q, lc, meta, 0.125).float()
    out = decode_paged_attention(q, lc, meta, 0.125, num_splits=1, variant="imma").float()
    assert ((out - ref).abs() - RTOL * ref.abs()).max().item() <= ATOL
    q2, lc2, meta2 = build_case("fp8_e4m3", "int8", [9], 4, 2, 64, 16)
    assert plan_decode(q2, lc2, meta2, 0.1, variant="imma").variant == "dot"


@triton.jit
def _split_q_kernel(q_ptr, hi_ptr, lo_ptr, st_ptr, R: tl.constexpr, D: tl.constexpr):
    r = tl.arange(0, R)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + r[:, None] * D + d[None, :])
    hi, lo, st = split_q_int8(q)
    tl.store(hi_ptr + r[:, None] * D + d[None, :], hi)
    tl.store(lo_ptr + r[:, None] * D + d[None, :], lo)
    tl.store(st_ptr + r, st)


def test_split_q_int8_exact_parts():
    """`split_q_int8`: hi, lo in -127..127 and |q - (hi 254 + lo) step| <= step (1/2 + 2**-8) per
    row (2**-8: float32 rounding of q / step, |q / step| <= 32258 < 2**15, half an ulp 2**-9, twice),
    on rows with zeros, an outlier and an all-zero row."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(16, 64, generator=gen)
    q[1, 7] = 300.0
    q[2] = 0.0
    q[3, ::2] = 0.0
    hi = torch.empty(16, 64, dtype=torch.int8)
    lo = torch.empty(16, 64, dtype=torch.int8)
    st = torch.empty(16)
    _split_q_kernel[(1,)](q, hi, lo, st, 16, 64)
    assert hi.abs().max() <= 127 and lo.abs().max() <= 127
    back = (hi.int() * 254 + lo.int()).double() * st.double()[:, None]
    assert ((back - q.double()).abs() <= st.double()[:, None] * (0.5 + 2**-8)).all()
    assert (st[2] > 0) and (back[2] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("v_name", ["int8", "int8-static", "int4", "fp8_e4m3", "bfloat16"])
@pytest.mark.parametrize("k_name", ["int8", "int8-static"])
def test_imma_gpu(k_name, v_name, D):
    """"imma" on the GPU (Llama-8B heads, random block tables, odd lengths, 1 and 3 splits)."""
    for splits in (1, 3):
        check(k_name, v_name, [1, 17, 1000, 4099, 257], Hq=32, Hkv=8, D=D, device="cuda", variant="imma",
              num_splits=splits)


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_imma_gpu_block_sizes_default_splits(block_size):
    check("int8", "int8", [1, 33000, 300], Hq=32, Hkv=8, D=128, device="cuda", variant="imma",
          block_size=block_size)


@pytest.mark.parametrize("name", ["int8", "int4", "float16"])
def test_decode_int64_indexing_matches(name, monkeypatch):
    """Pools whose element offsets can pass 2**31 index in int64 (`_needs_idx64`); small pools in
    int32. Forcing the int64 path on a small pool gives the same output bit for bit, and it checks
    against the reference like the int32 path."""
    import kvpack.kernels.decode_attention as da

    q, lc, meta = build_case(name, name, [37, 1, 70], 4, 2, 64, 16)
    scale = 64 ** -0.5
    assert not da._needs_idx64(lc.k, lc.v)
    out32 = da.decode_paged_attention(q, lc, meta, scale, num_splits=2)
    monkeypatch.setattr(da, "_needs_idx64", lambda *pools: True)
    out64 = da.decode_paged_attention(q, lc, meta, scale, num_splits=2)
    assert torch.equal(out32, out64)
    ref = reference.paged_attention(q, lc, meta, scale).float()
    assert ((out64.float() - ref).abs() - RTOL * ref.abs()).max().item() <= ATOL


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name,D", [("int8", "int8", 128), ("int4", "int4", 128), ("fp8_e4m3", "fp8_e4m3", 64),
                                              ("bfloat16", "bfloat16", 256), ("int8-static", "int4", 96),
                                              ("fp8_e5m2", "bfloat16", 80)])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_prefetch_gpu(k_name, v_name, D, splits):
    """The L2 prefetch is a hint: every distance gives the no-prefetch output bit for bit (odd
    lengths, so prefetched rows are clamped to the split's last token), which matches the reference."""
    from kvpack.kernels.decode_attention import decode_paged_attention

    bf16 = "bfloat16" in (k_name, v_name)
    q, lc, meta = build_case(k_name, v_name, [1, 17, 1000, 4099, 257], 32, 8, D, 16, device="cuda",
                             dtype=torch.bfloat16 if bf16 else torch.float16)
    scale = D ** -0.5
    outs = [decode_paged_attention(q, lc, meta, scale, num_splits=splits, prefetch=pf) for pf in (0, 1, 2, 4)]
    for out in outs[1:]:
        assert torch.equal(outs[0], out)
    ref = reference.paged_attention(q, lc, meta, scale).float()
    tol = 1e-2 if bf16 else ATOL
    assert ((outs[0].float() - ref).abs() - tol * ref.abs()).max().item() <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name", [("int8", "int8"), ("int8-static", "int8-static"), ("fp8_e4m3", "fp8_e4m3"),
                                            ("fp8_e5m2", "fp8_e5m2"), ("int8", "fp8_e4m3"), ("fp8_e5m2-static", "int8")])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_decode_frag_gpu(k_name, v_name, block_size, splits):
    """The "frag" experiment (codes loaded in the MMA fragment layout, Gluon) against the reference:
    odd lengths (partial tiles, a 1-token sequence), random block tables, split-K and not."""
    from kvpack.kernels.decode_attention import plan_decode

    q, lc, meta = build_case(k_name, v_name, [1, 17, 1000, 4099, 257], 32, 8, 128, block_size, device="cuda")
    assert plan_decode(q, lc, meta, 0.1, num_splits=splits, variant="frag").variant == "frag"
    check(k_name, v_name, [1, 17, 1000, 4099, 257], Hq=32, Hkv=8, D=128, block_size=block_size, device="cuda",
          num_splits=splits, variant="frag")


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name,group_size", [("int4", "int4", 32), ("int4", "int4", 16), ("int4", "int4", 64),
                                                       ("int4", "int8", 32), ("fp8_e4m3", "int4", 32)])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("prefetch", [0, 1])
def test_decode_frag_int4_gpu(k_name, v_name, group_size, block_size, splits, prefetch):
    """int4 in "frag" (codes dequantized in the MMA fragment layout; channels permuted for q and the
    output) against the reference, with the same tolerance as "dot": group sizes 16 / 32 / 64, int4 on
    one side only, odd lengths, random block tables, split-K, with and without the L2 prefetch."""
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    lens = [1, 17, 64, 1000, 4099, 257]
    q, lc, meta = build_case(k_name, v_name, lens, 32, 8, 128, block_size, device="cuda", group_size=group_size)
    scale = 128 ** -0.5
    plan = plan_decode(q, lc, meta, scale, num_splits=splits, variant="frag", prefetch=prefetch)
    assert plan.variant == "frag" and plan.args[plan.kernel.arg_names.index("PREFETCH")] == prefetch
    out = decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant="frag", prefetch=prefetch)
    ref = reference.paged_attention(q, lc, meta, scale).float()
    err = ((out.float() - ref).abs() - RTOL * ref.abs()).max().item()
    assert err <= ATOL, f"{k_name}/{v_name} g{group_size} bs{block_size} splits {splits}: {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [16, 32, 64])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("splits,merge", [(None, "auto"), (1, "auto"), (3, "separate"), (3, "fused")])
@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize("Hq,Hkv", [(32, 8), (24, 8), (8, 8), (16, 2)])
def test_decode_fragt_int4_gpu(group_size, block_size, splits, merge, prefetch, Hq, Hkv):
    """int4 with both products transposed ("fragt": scores K @ q^T, output V^T @ P^T, the query heads as
    the MMA's n = 8) against the reference, with "dot"'s tolerance: group sizes 16 / 32 / 64, GQA groups
    of 4, 3, 1 and 8, odd lengths, random block tables, split-K with either merge, with and without the
    L2 prefetch."""
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    lens = [1, 17, 64, 1000, 4099, 257]
    q, lc, meta = build_case("int4", "int4", lens, Hq, Hkv, 128, block_size, device="cuda", group_size=group_size)
    scale = 128 ** -0.5
    kw = dict(num_splits=splits, variant="fragt", prefetch=prefetch, merge=merge)
    plan = plan_decode(q, lc, meta, scale, **kw)
    assert plan.variant == "fragt" and plan.args[plan.kernel.arg_names.index("PREFETCH")] == prefetch
    out = decode_paged_attention(q, lc, meta, scale, **kw)
    ref = reference.paged_attention(q, lc, meta, scale).float()
    err = ((out.float() - ref).abs() - RTOL * ref.abs()).max().item()
    assert err <= ATOL, f"g{group_size} bs{block_size} splits {splits} {merge} pf{prefetch} {Hq}/{Hkv}: {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name", [("int8", "int8"), ("int8-static", "int8-static"), ("fp8_e4m3", "fp8_e4m3"),
                                            ("fp8_e5m2", "fp8_e5m2"), ("int8", "fp8_e4m3"), ("fp8_e5m2-static", "int8")])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("Hq,Hkv", [(32, 8), (24, 8), (8, 8)])
def test_decode_fragt_8bit_gpu(k_name, v_name, block_size, splits, Hq, Hkv):
    """8-bit codes with both products transposed ("fragt" asked for: int8 K through int8 MMAs, per-token
    scales on the scores' rows and folded into P^T, static scales) against the reference: odd lengths,
    random block tables, split-K, GQA groups of 4, 3 and 1."""
    from kvpack.kernels.decode_attention import plan_decode

    q, lc, meta = build_case(k_name, v_name, [1, 17, 1000, 4099, 257], Hq, Hkv, 128, block_size, device="cuda")
    assert plan_decode(q, lc, meta, 0.1, num_splits=splits, variant="fragt").variant == "fragt"
    check(k_name, v_name, [1, 17, 1000, 4099, 257], Hq=Hq, Hkv=Hkv, D=128, block_size=block_size, device="cuda",
          num_splits=splits, variant="fragt")


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [16, 32, 64])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("splits,prefetch", [(None, None), (1, 0), (1, 1), (3, 0), (3, 1)])
@pytest.mark.parametrize("Hq,Hkv", [(9, 3), (32, 8), (8, 8)])
def test_decode_fragt_int4_head64_gpu(group_size, block_size, splits, prefetch, Hq, Hkv, monkeypatch):
    """int4 K and V at head dim 64 in "fragt" (session 41: a lane's 8 K bytes and 4 V bytes a token, `K4_LOAD64`,
    `V4_LOAD64`) against the reference with "dot"'s tolerance, the plan's own choice ("auto") included: group sizes
    16 / 32 / 64 (4, 2 or 1 a head), odd lengths, random block tables, split-K (with the rotation in the merge) and
    one split (in the kernel's epilogue), with and without the L2 prefetch (a hint: the same bits); groups of 32 with
    their parameters loaded as words (P_WORDS) and as 2-byte values, V converted by token pairs (V_PAIRS) and by channel
    pairs: the same bits."""
    import kvpack.kernels.decode_attention as da
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    lens = [1, 17, 64, 1000, 4099, 257]
    q, lc, meta = build_case("int4", "int4", lens, Hq, Hkv, 64, block_size, device="cuda", group_size=group_size)
    scale = 64 ** -0.5
    ref = reference.paged_attention(q, lc, meta, scale).float()
    outs = []
    for variant in ("fragt", None):
        plan = plan_decode(q, lc, meta, scale, num_splits=splits, variant=variant, prefetch=prefetch)
        assert plan.variant == "fragt" and plan.args[plan.kernel.arg_names.index("D")] == 64
        out = decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant=variant, prefetch=prefetch)
        err = ((out.float() - ref).abs() - RTOL * ref.abs()).max().item()
        assert err <= ATOL, f"g{group_size} bs{block_size} splits {splits} pf{prefetch} {Hq}/{Hkv}: {err:.2e}"
        outs.append(out)
    if prefetch == 1:
        plain = decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant="fragt", prefetch=0)
        torch.cuda.synchronize()
        assert torch.equal(outs[0], plain)
    words = plan_decode(q, lc, meta, scale, num_splits=splits, variant="fragt", prefetch=prefetch)
    assert words.options.get("P_WORDS", False) == (group_size == 32)
    if group_size == 32:  # uncapped on grids of <= FRAGT_HEAD64_INT4_UNCAPPED_PER_SM programs an SM, else capped
        from kvpack.kernels.decode_plan import _sm_count

        thin = words.grid[0] * words.grid[1] * words.grid[2] <= da.FRAGT_HEAD64_INT4_UNCAPPED_PER_SM * _sm_count(q.device)
        assert words.options.get("maxnreg") == (None if thin else da.FRAGT_HEAD64_MAXNREG), (words.grid, words.options)
        for cap in (128, 255):  # under the cap (spilling) and not: the same bits
            other = decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant="fragt", prefetch=prefetch,
                                           maxnreg=cap)
            torch.cuda.synchronize()
            assert torch.equal(outs[0], other), cap
        # V by token pairs where capped (session 42), and each tile's V into L2 where no next tile is; forced both
        # ways here: the same bits (every V scale here is >= 2^-10)
        assert words.options.get("V_PAIRS", False) == (not thin)
        assert words.options.get("V_PF0", False) == (words.args[words.kernel.arg_names.index("PREFETCH")] == 0)
        for pairs, vpf0 in ((True, True), (False, False), (True, False)):
            monkeypatch.setattr(da, "FRAGT_HEAD64_INT4_UNCAPPED_PER_SM", 0 if pairs else 10 ** 6)
            monkeypatch.setattr(da, "FRAGT_HEAD64_VPF0", vpf0)
            other = plan_decode(q, lc, meta, scale, num_splits=splits, variant="fragt", prefetch=prefetch)
            assert other.options.get("V_PAIRS", False) == pairs and other.options.get("V_PF0", False) == vpf0
            other = decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant="fragt", prefetch=prefetch,
                                           maxnreg=128)
            torch.cuda.synchronize()
            assert torch.equal(outs[0], other), (pairs, vpf0)
        monkeypatch.setattr(da, "FRAGT_HEAD64_INT4_VPAIRS", False)
        assert "V_PAIRS" not in plan_decode(q, lc, meta, scale, num_splits=splits, variant="fragt").options
        monkeypatch.setattr(da, "FRAGT_HEAD64_INT4_WORDS", False)
        assert "P_WORDS" not in plan_decode(q, lc, meta, scale, num_splits=splits, variant="fragt").options
        halves = decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant="fragt", prefetch=prefetch)
        torch.cuda.synchronize()
        assert torch.equal(outs[0], halves)


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name", [("int8", "int8"), ("int8-static", "int8-static"), ("fp8_e4m3", "fp8_e4m3"),
                                            ("fp8_e5m2", "fp8_e5m2"), ("int8", "fp8_e4m3"), ("fp8_e5m2-static", "int8")])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("Hq,Hkv", [(9, 3), (32, 8), (8, 8)])
def test_decode_fragt_8bit_head64_gpu(k_name, v_name, block_size, splits, Hq, Hkv):
    """8-bit codes at head dim 64 in "fragt" (int4's layouts at head dim 128: a lane's 16 K bytes and 8 V bytes a
    token) against the reference, the plan's own choice ("auto") included: odd lengths, random block tables,
    split-K, SmolLM2's GQA group of 3, 4 and 1."""
    from kvpack.kernels.decode_attention import plan_decode

    q, lc, meta = build_case(k_name, v_name, [1, 17, 1000, 4099, 257], Hq, Hkv, 64, block_size, device="cuda")
    for variant in ("fragt", None):
        assert plan_decode(q, lc, meta, 0.1, num_splits=splits, variant=variant).variant == "fragt"
        check(k_name, v_name, [1, 17, 1000, 4099, 257], Hq=Hq, Hkv=Hkv, D=64, block_size=block_size, device="cuda",
              num_splits=splits, variant=variant or "auto")


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name", [("int8", "int8"), ("int8-static", "int8-static"), ("fp8_e4m3", "fp8_e5m2")])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_decode_fragt_head64_prefetch_gpu(k_name, v_name, block_size, splits):
    """Head dim 64's L2 prefetch (`decode_frag._prefetch_tile`, STEP 2, 1 or 2 tiles ahead, and the first tiles before q's
    loads) is a hint: the same output bits as without it, splits past a sequence's end (no tokens) included."""
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    lens = [1, 17, 1000, 4099, 257, 64, 130]
    q, lc, meta = build_case(k_name, v_name, lens, 9, 3, 64, block_size, device="cuda")
    outs = []
    for pf in (0, 1, 2):
        plan = plan_decode(q, lc, meta, 0.125, num_splits=splits, prefetch=pf)
        assert plan.variant == "fragt" and plan.args[plan.kernel.arg_names.index("PREFETCH")] == pf
        outs.append(decode_paged_attention(q, lc, meta, 0.125, num_splits=splits, prefetch=pf))
    torch.cuda.synchronize()
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])
    check(k_name, v_name, lens, Hq=9, Hkv=3, D=64, block_size=block_size, device="cuda", num_splits=splits)


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name", [("int8", "int8"), ("int8-static", "int8-static"), ("fp8_e4m3", "fp8_e5m2"),
                                           ("fp8_e4m3-static", "int8")])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("ring", [1, 2])
def test_decode_fragt_head64_ring8_gpu(k_name, v_name, block_size, splits, ring, monkeypatch):
    """8-bit codes at head dim 64 through "fragt"'s cp.async ring (RING8, session 42: `decode_frag._r4_issue` with a
    token's scale, `_fragt_tile8` reading the slot; 1 or 2 tiles ahead): the same output bits as the direct loads (the
    same codes, scales and operations), and within "dot"'s tolerance of the reference; blocks of 8 keep the direct
    loads (`ring8_ok`); odd lengths (the masked last tile loads directly), splits without whole tiles."""
    import kvpack.kernels.decode_attention as da
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    lens = [1, 17, 1000, 4099, 257, 64, 130]
    q, lc, meta = build_case(k_name, v_name, lens, 9, 3, 64, block_size, device="cuda")
    direct = decode_paged_attention(q, lc, meta, 0.125, num_splits=splits, prefetch=0)
    assert "RING8" not in plan_decode(q, lc, meta, 0.125, num_splits=splits, prefetch=0).options
    monkeypatch.setattr(da, "FRAGT_HEAD64_RING8", ring)
    plan = plan_decode(q, lc, meta, 0.125, num_splits=splits)
    assert plan.variant == "fragt" and plan.options.get("RING8") == (ring if block_size >= 16 else None)
    out = decode_paged_attention(q, lc, meta, 0.125, num_splits=splits)
    torch.cuda.synchronize()
    assert torch.equal(out, direct)
    check(k_name, v_name, lens, Hq=9, Hkv=3, D=64, block_size=block_size, device="cuda", num_splits=splits)


def test_fragt_head64_prefetch_plan(monkeypatch):
    """The L2 prefetch distance of "fragt" on 8-bit codes: FRAGT_HEAD64_PREFETCH by default at head dim 64 where the
    grid has <= FRAGT_HEAD64_PREFETCH_PER_SM programs a multiprocessor, else none; the asked one where asked (also at
    128), none by default at 128. CPU, planned as on an H200 (132 multiprocessors)."""
    import kvpack.kernels.decode_attention as da

    import kvpack.kernels.decode_plan as dp

    monkeypatch.setattr(da, "INTERPRET", False)
    monkeypatch.setattr(da, "_sm_count", lambda dev: 132)  # the prefetch rule
    monkeypatch.setattr(dp, "_sm_count", lambda dev: 132)  # the split counts
    # the cp.async ring (RING8, session 42) takes the thin grids' place by default: 1 x 32768 (384 programs, <= 8 an SM)
    # with blocks of 16, not with blocks of 8, nor where a prefetch is asked for, nor on 8 x 8192
    for lens, bs, asked, want in (([32768], 16, None, 1), ([32768], 8, None, 0), ([32768], 16, 0, 0),
                                  ([8192] * 8, 16, None, 0)):
        q, lc, meta = build_case("int8", "fp8_e4m3", lens, 9, 3, 64, bs)
        plan = da.plan_decode(q, lc, meta, 0.1, prefetch=asked)
        assert plan.variant == "fragt" and plan.options.get("RING8", 0) == want, (lens[:1], bs, asked, plan.options)
        if want:
            assert plan.args[plan.kernel.arg_names.index("PREFETCH")] == 0
    monkeypatch.setattr(da, "FRAGT_HEAD64_RING8", 0)  # without it, the L2 prefetch there
    for default in (1, 2):
        monkeypatch.setattr(da, "FRAGT_HEAD64_PREFETCH", default)
        # SmolLM2's 3 kv heads: 1 x 32768 plans 128 splits (384 programs, thin), 8 x 8192 64 (1536, not)
        for D, lens, splits, asked, want in ((64, [32768], 128, None, default), (64, [8192] * 8, 64, None, 0),
                                             (64, [8192] * 8, 64, 1, 1), (64, [32768], 128, 0, 0),
                                             (128, [32768], None, None, 0), (128, [3000, 9], None, 1, 1)):
            q, lc, meta = build_case("int8", "fp8_e4m3", lens, 9, 3, D, 16)
            plan = da.plan_decode(q, lc, meta, 0.1, variant="fragt", prefetch=asked)
            assert plan.variant == "fragt"
            if splits:
                assert plan.grid[2] == splits, plan.grid
            assert plan.args[plan.kernel.arg_names.index("PREFETCH")] == want, (D, lens[:1], asked, default)


@pytest.mark.parametrize("batch,ctx,Hq,Hkv,splits,want,want_g64", [
    (32, 4096, 9, 3, 22, 0, 0), (8, 8192, 9, 3, 64, 0, 0), (1, 32768, 9, 3, 128, 1, 1), (32, 4096, 32, 8, 8, 0, 1),
    (8, 8192, 32, 8, 32, 0, 1)])
def test_fragt_int4_head64_prefetch_plan(batch, ctx, Hq, Hkv, splits, want, want_g64, monkeypatch):
    """int4 at head dim 64 ("fragt"): the L2 prefetch where the grid is thin, as 8-bit codes take it (SmolLM2's
    1 x 32768), and, where the group parameters load as 2-byte values (groups of 64 here; not P_WORDS), also where a
    split has >= FRAGT_HEAD64_INT4_PF_TOKENS tokens (Llama-3.2-1B's 32 x 4096 and 8 x 8192: 8 and 4 tiles a split;
    results/int4_h64_s41 call1 and call4); no ring; FRAGT_HEAD64_MAXNREG registers, none with P_WORDS on grids of
    <= FRAGT_HEAD64_INT4_UNCAPPED_PER_SM programs an SM (call6). CPU, planned as on an H200."""
    import kvpack.kernels.decode_attention as da
    import kvpack.kernels.decode_plan as dp

    monkeypatch.setattr(da, "INTERPRET", False)
    monkeypatch.setattr(da, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(dp, "_sm_count", lambda dev: 132)
    nb = ctx // 16
    lc = LayerKVCache(make_pool("int4", 64, batch * nb, Hkv, 16, "cpu"), make_pool("int4", 64, batch * nb, Hkv, 16, "cpu"))
    meta = AttentionMetadata.build([1] * batch, [ctx] * batch, [list(range(i * nb, (i + 1) * nb)) for i in range(batch)], 16)
    plan = da.plan_decode(torch.zeros(batch, Hq, 64, dtype=torch.float16), lc, meta, 0.1)
    assert plan.variant == "fragt" and plan.grid[2] == splits, (plan.variant, plan.grid)
    assert plan.args[plan.kernel.arg_names.index("PREFETCH")] == want
    assert "RING4" not in plan.options
    assert plan.options["P_WORDS"]  # groups of 32: a token's parameters as words, uncapped on grids of <= 6 an SM
    thin = batch * Hkv * splits <= 6 * 132
    assert plan.options.get("maxnreg") == (None if thin else da.FRAGT_HEAD64_MAXNREG), (plan.options, thin)
    # session 42 (results/int4_vpairs_s42): V by token pairs where capped, each tile's V into L2 where no next tile is
    assert plan.options.get("V_PAIRS", False) == (not thin) and plan.options.get("V_PF0", False) == (not want)
    lc = LayerKVCache(make_pool("int4", 64, batch * nb, Hkv, 16, "cpu", group_size=64),
                      make_pool("int4", 64, batch * nb, Hkv, 16, "cpu", group_size=64))
    plan = da.plan_decode(torch.zeros(batch, Hq, 64, dtype=torch.float16), lc, meta, 0.1)
    assert plan.args[plan.kernel.arg_names.index("PREFETCH")] == want_g64 and "P_WORDS" not in plan.options


def test_int4_words_ok():
    """P_WORDS (int4 at head dim 64, a token's two group scales / zero-points as one 32-bit word each) only for groups
    of 32 on both sides with every pair 4-byte aligned: not groups of 16 or 64, not head dim 128, not a scale tensor
    whose base or token stride is odd (two-byte aligned: the kernel would fault)."""
    import dataclasses

    import kvpack.kernels.decode_attention as da

    kp, vp = make_pool("int4", 64, 4, 2, 16, "cpu"), make_pool("int4", 64, 4, 2, 16, "cpu")
    assert da.int4_words_ok(kp, vp)
    assert not da.int4_words_ok(make_pool("int4", 64, 4, 2, 16, "cpu", group_size=64), vp)
    assert not da.int4_words_ok(kp, make_pool("int4", 64, 4, 2, 16, "cpu", group_size=16))
    assert not da.int4_words_ok(make_pool("int4", 128, 4, 2, 16, "cpu", group_size=64),
                                make_pool("int4", 128, 4, 2, 16, "cpu", group_size=64))
    assert not da.int4_words_ok(kp, make_pool("int8", 64, 4, 2, 16, "cpu"))
    buf = torch.zeros(kp.scales.numel() + 1, dtype=torch.float16)
    odd_base = dataclasses.replace(kp, scales=buf[1:].view(kp.scales.shape))
    assert odd_base.scales.data_ptr() % 4 == 2 and not da.int4_words_ok(odd_base, vp)
    wide = torch.zeros(*kp.zeros.shape[:-1], 3, dtype=torch.float16)[..., :2]  # token stride 3
    assert not da.int4_words_ok(kp, dataclasses.replace(vp, zeros=wide))


@pytest.mark.parametrize("value,ok", [("0", True), ("2", True), (" 1 ", True), ("x", False), ("-1", False), ("9", False)])
def test_fragt_head64_prefetch_env(value, ok):
    """KVPACK_FRAGT_HEAD64_PREFETCH takes 0-4; anything else stops the import with an error that names it."""
    import subprocess
    import sys

    env = dict(os.environ, KVPACK_FRAGT_HEAD64_PREFETCH=value)
    r = subprocess.run([sys.executable, "-c", "import kvpack.kernels.decode_attention as d; print(d.FRAGT_HEAD64_PREFETCH)"],
                       env=env, capture_output=True, text=True)
    if ok:
        assert r.returncode == 0 and r.stdout.strip() == value.strip(), r.stderr[-500:]
    else:
        assert r.returncode != 0 and "KVPACK_FRAGT_HEAD64_PREFETCH" in r.stderr and "0 (none) or 1-4" in r.stderr


@pytest.mark.parametrize("k_name,D,lens,want", [
    ("int4", 64, [8192] * 8, 1), ("int4", 64, [32768], 1), ("int4", 128, [4096] * 32, 1), ("int4", 256, [4096], 0),
    ("bfloat16", 64, [32768], 1), ("bfloat16", 64, [8192], 1), ("bfloat16", 64, [4096] * 32, 0),
    ("bfloat16", 64, [8192] * 8, 0), ("bfloat16", 128, [32768], 0), ("float32", 64, [32768], 0),
    ("int8", 64, [32768], 0)])
def test_dot_prefetch_plan(k_name, D, lens, want, monkeypatch):
    """"dot"'s L2 prefetch (`default_prefetch`): int4 K and V at head dims 64-128; 16-bit caches at head dim <= 64 where
    the grid has <= FLOAT_PREFETCH_PER_SM programs a multiprocessor (SmolLM2's 3 kv heads: 1 x 32768 and 1 x 8192, not
    32 x 4096 or 8 x 8192); never int8 there ("fragt" off) nor float32. CPU, planned as on an H200 (132 multiprocessors)."""
    import kvpack.kernels.decode_attention as da
    import kvpack.kernels.decode_plan as dp

    monkeypatch.setattr(da, "INTERPRET", False)
    monkeypatch.setattr(da, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(dp, "_sm_count", lambda dev: 132)
    q, lc, meta = build_case(k_name, k_name, lens, 9, 3, D, 16)
    plan = da.plan_decode(q, lc, meta, 0.1, variant="dot")
    assert plan.variant == "dot", plan.variant
    assert plan.args[plan.kernel.arg_names.index("PREFETCH")] == want, (plan.grid,)


@pytest.mark.gpu
@pytest.mark.parametrize("v_name", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_decode_fragt_head64_int8_mma_gpu(v_name, splits, monkeypatch):
    """int8 K at head dim 64 through int8 MMAs with q's two int8 parts (FRAGT_HEAD64_K8_F16 off; the plan's default
    converts K to fp16), with and without the register cap, against the reference."""
    import kvpack.kernels.decode_attention as da

    monkeypatch.setattr(da, "FRAGT_HEAD64_K8_F16", False)
    for cap in (0, 128):
        monkeypatch.setattr(da, "FRAGT_HEAD64_MAXNREG", cap)
        q, lc, meta = build_case("int8", v_name, [1, 17, 1000, 4099, 257], 9, 3, 64, 16, device="cuda")
        plan = da.plan_decode(q, lc, meta, 0.1, num_splits=splits)
        assert plan.variant == "fragt" and "K8_F16" not in plan.options
        check("int8", v_name, [1, 17, 1000, 4099, 257], Hq=9, Hkv=3, D=64, block_size=16, device="cuda",
              num_splits=splits, variant="auto")


@pytest.mark.parametrize("k_name,v_name,Hq,asked,auto_on,want", [
    ("int8", "int8", 9, None, True, "fragt"), ("fp8_e4m3", "fp8_e5m2", 32, None, True, "fragt"),
    ("int8", "int8", 9, "fragt", False, "fragt"), ("int8", "int8", 9, None, False, "imma"),
    ("fp8_e4m3", "fp8_e4m3", 9, None, False, "dot"), ("int8", "int8", 72, None, True, "imma"),
    ("int8", "int8", 72, "fragt", True, "imma"), ("int4", "int4", 9, "fragt", True, "fragt"),
    ("int4", "int4", 9, None, True, "fragt"), ("int4", "int4", 72, None, True, "dot"), ("int4", "int8", 9, None, True, "dot"),
    ("int8", "int8", 9, "frag", True, "imma"), ("int8", "bfloat16", 9, None, True, "imma")])
def test_fragt_head64_scope(k_name, v_name, Hq, asked, auto_on, want, monkeypatch):
    """Head dim 64: "fragt" takes 8-bit K and V at GQA groups <= 8, asked for or by "auto" (FRAGT_HEAD64_AUTO),
    and int4 K and V (FRAGT_HEAD64_INT4; off: "dot"), not int4 beside another format, nor "frag" (its layouts are
    head dim 128's). Its merge is separate (the fused merge is written for 128); its programs take
    FRAGT_HEAD64_MAXNREG registers, and int8 K goes to fp16 MMAs (K8_F16)."""
    import kvpack.kernels.decode_attention as da

    monkeypatch.setattr(da, "INTERPRET", False)  # plan as on a GPU (nothing launches)
    monkeypatch.setattr(da, "FRAGT_HEAD64_AUTO", auto_on)
    q, lc, meta = build_case(k_name, v_name, [3000, 9], Hq, 3 if Hq == 9 else 8, 64, 16)
    plan = da.plan_decode(q, lc, meta, 0.1, variant=asked)
    assert plan.variant == want
    if want == "fragt":
        assert plan.grid[2] > 1 and plan.merge_grid is not None  # split, merged separately
        assert plan.options["maxnreg"] == da.FRAGT_HEAD64_MAXNREG
        assert plan.options.get("K8_F16", False) == (k_name == "int8")
        assert plan.args[plan.kernel.arg_names.index("D")] == 64
        fused = da.plan_decode(q, lc, meta, 0.1, variant=asked, merge="fused", num_splits=2)
        assert fused.merge_grid is not None
    if k_name == v_name == "int4" and want == "fragt":
        assert "RING4" not in plan.options  # the ring's layouts are head dim 128's
        monkeypatch.setattr(da, "FRAGT_HEAD64_INT4", False)
        assert da.plan_decode(q, lc, meta, 0.1, variant=asked).variant == "dot"


@pytest.mark.parametrize("batch,ctx,Hq,Hkv,want,want4", [(8, 8192, 9, 3, 64, 32), (32, 4096, 9, 3, 22, 16),
                                                         (8, 8192, 32, 8, 32, 32), (32, 4096, 32, 8, 8, 8)])
def test_fragt_head64_splits(batch, ctx, Hq, Hkv, want, want4, monkeypatch):
    """"fragt" at head dim 64 splits down to 2 tiles a split (FRAGT_HEAD64_MIN_TILES), other kernels to 4: on an
    H200's 132 multiprocessors, SmolLM2's 8 x 8192 gets 64 splits instead of 32 and its 32 x 4096 22 instead of 16
    (the split counts measured in results/head64_s33/call3/h64_splits.json); Llama-3.2-1B's shapes keep theirs."""
    import kvpack.kernels.decode_attention as da
    import kvpack.kernels.decode_plan as dp

    monkeypatch.setattr(da, "INTERPRET", False)  # plan as on a GPU (nothing launches)
    monkeypatch.setattr(dp, "_sm_count", lambda device: 132)
    nb = ctx // 16
    lc = LayerKVCache(make_pool("int8", 64, batch * nb, Hkv, 16, "cpu"), make_pool("int8", 64, batch * nb, Hkv, 16, "cpu"))
    meta = AttentionMetadata.build([1] * batch, [ctx] * batch, [list(range(i * nb, (i + 1) * nb)) for i in range(batch)], 16)
    q = torch.zeros(batch, Hq, 64, dtype=torch.float16)
    plan = da.plan_decode(q, lc, meta, 0.1)
    assert plan.variant == "fragt" and plan.grid[2] == want
    monkeypatch.setattr(da, "FRAGT_HEAD64_MIN_TILES", 4)
    assert da.plan_decode(q, lc, meta, 0.1).grid[2] == want4


@pytest.mark.parametrize("k_name,v_name,Hq,want", [("int4", "int4", 32, "fragt"), ("int4", "int4", 64, "fragt"),
                                                   ("int4", "int4", 72, "dot"), ("int8", "int4", 32, "imma"),
                                                   ("fp8_e4m3", "fp8_e4m3", 32, "fragt"), ("int8", "int8", 72, "imma"),
                                                   ("bfloat16", "bfloat16", 32, "dot")])
def test_fragt_scope(k_name, v_name, Hq, want, monkeypatch):
    """"fragt" takes int4 K and V, or 8-bit codes on both sides, at GQA groups <= 8 (the MMA's n = 8),
    else the fallback; PREFETCH an L2 prefetch distance there, the asked one (int4 without its ring; 8-bit codes,
    which load directly: no cp.async ring)."""
    import kvpack.kernels.decode_attention as da

    monkeypatch.setattr(da, "INTERPRET", False)  # plan as on a GPU (nothing launches)
    q, lc, meta = build_case(k_name, v_name, [300, 9], Hq, 8, 128, 16)
    plan = da.plan_decode(q, lc, meta, 0.1, variant="fragt", prefetch=1)
    assert plan.variant == want
    if want == "fragt":
        assert plan.args[plan.kernel.arg_names.index("PREFETCH")] == 1


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name", [("int8", "int8"), ("int8-static", "int8-static"), ("fp8_e4m3", "fp8_e4m3"),
                                            ("int8", "fp8_e4m3"), ("fp8_e5m2-static", "int8")])
@pytest.mark.parametrize("block_size", [8, 16, 64])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_frag_ring_gpu(k_name, v_name, block_size, splits):
    """"frag" with whole tiles copied ahead through a cp.async ring (prefetch 1 and 2): the same bits
    as direct loads (same codes, same operations), and the reference's values; lengths below one
    tile, exactly one and two tiles, partial last tiles, random block tables."""
    from kvpack.kernels.decode_attention import decode_paged_attention

    lens = [1, 17, 64, 128, 1000, 4099, 257]
    q, lc, meta = build_case(k_name, v_name, lens, 32, 8, 128, block_size, device="cuda")
    scale = 128 ** -0.5
    outs = [decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant="frag", prefetch=pf)
            for pf in (0, 1, 2)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    ref = reference.paged_attention(q, lc, meta, scale).float()
    assert ((outs[1].float() - ref).abs() - RTOL * ref.abs()).max().item() <= ATOL


@pytest.mark.parametrize("k_name,v_name,group,block_size,want", [
    ("int4", "int4", 32, 16, True), ("int4", "int4", 32, 64, True), ("int4", "int4", 16, 16, False),
    ("int4", "int4", 64, 16, True), ("int4", "int4", 128, 16, True), ("int4", "int4", 32, 8, False),
    ("int8", "int8", 32, 16, False)])
def test_int4_ring_scope(k_name, v_name, group, block_size, want, monkeypatch):
    """"fragt"'s int4 cp.async ring (ring4 / KVPACK_INT4_RING): only int4 K and V in groups of 32, 64 or 128 (an
    8-token group's parameters in 16-byte copies; 16-channel groups would need a lane's K bytes split) and blocks
    of >= 16 tokens; by default (KVPACK_INT4_RING unset) distance 1 where a multiprocessor holds >= 6 ring programs
    (CPU plans: as an H200, 10), not where it holds 4 (sm_86 / sm_89: ~100 KB); KVPACK_INT4_RING=0 turns it off;
    its register cap only with it."""
    import kvpack.kernels.decode_attention as da
    import kvpack.kernels.decode_plan as dp

    monkeypatch.setattr(da, "INTERPRET", False)  # plan as on a GPU (nothing launches)
    q, lc, meta = build_case(k_name, v_name, [300, 9], 32, 8, 128, block_size, group_size=group)
    variant = "fragt" if k_name == "int4" else "frag"
    monkeypatch.setattr(da, "INT4_RING", None)  # KVPACK_INT4_RING unset
    assert dp._smem_programs_per_sm(q.device, dp.INT4_RING_SMEM_BYTES) == 10  # 227 KB a block, 20 + 1 KB a program
    assert da.plan_decode(q, lc, meta, 0.1, variant=variant).options.get("RING4") == (1 if want else None)
    monkeypatch.setattr(dp, "_smem_programs_per_sm", lambda dev, nbytes: (101376 + 1024) // (nbytes + 1024))  # sm_86
    assert "RING4" not in da.plan_decode(q, lc, meta, 0.1, variant=variant).options
    monkeypatch.undo()
    monkeypatch.setattr(da, "INTERPRET", False)
    monkeypatch.setattr(da, "INT4_RING", 0)  # KVPACK_INT4_RING=0
    assert "RING4" not in da.plan_decode(q, lc, meta, 0.1, variant=variant).options
    plan = da.plan_decode(q, lc, meta, 0.1, variant=variant, ring4=2)
    assert plan.options.get("RING4") == (2 if want else None), plan.options
    monkeypatch.setattr(da, "INT4_RING", 1)
    monkeypatch.setattr(da, "INT4_RING_MAXNREG", 128)  # the ring's own register cap (KVPACK_INT4_RING_MAXNREG)
    options = da.plan_decode(q, lc, meta, 0.1, variant=variant).options
    assert (options.get("RING4"), options.get("maxnreg")) == ((1, 128) if want else (None, None))
    assert options.get("RING4_VPAIRS") is (True if want else None)  # V converted by token pairs (default)


def test_int4_ring_env_checked():
    """A KVPACK_INT4_RING that is not 0, 1, 2 or unset stops the import with a message naming it."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", "import kvpack.kernels.decode_attention"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "KVPACK_INT4_RING": "on"})
    assert p.returncode != 0 and "KVPACK_INT4_RING='on'" in p.stderr, p.stderr[-500:]


def test_v8_pairs_scope(monkeypatch):
    """8-bit V by token pairs (V8_PAIRS, session 44): by default int8 V in "frag" and "fragt" and FP8 V in "frag" where
    the conversion instruction decodes it; never int4, 16-bit or the other variants; forced on / off by the setting."""
    import kvpack.kernels.decode_attention as da

    monkeypatch.setattr(da, "V8_PAIRS", None)
    assert da.v8_pairs("frag", "int8", False) and da.v8_pairs("fragt", "int8", False)
    assert da.v8_pairs("frag", "fp8_e4m3", True) and da.v8_pairs("frag", "fp8_e5m2", True)
    assert not da.v8_pairs("frag", "fp8_e4m3", False)  # the software decode keeps its channel pairs
    assert not da.v8_pairs("fragt", "fp8_e4m3", True)  # measured 0.99-1.01x there
    for variant, kind in (("dot", "int8"), ("imma", "int8"), ("frag", "int4"), ("fragt", "int4"), ("frag", "float")):
        assert not da.v8_pairs(variant, kind, True), (variant, kind)
    monkeypatch.setattr(da, "V8_PAIRS", True)
    assert da.v8_pairs("fragt", "fp8_e5m2", True) and not da.v8_pairs("fragt", "fp8_e5m2", False)
    assert not da.v8_pairs("frag", "int4", True)
    monkeypatch.setattr(da, "V8_PAIRS", False)
    assert not da.v8_pairs("frag", "int8", False)
    monkeypatch.setattr(da, "V8_PAIRS", None)
    q, lc, meta = build_case("int8", "int8", [300, 9], 32, 8, 128, 16)
    assert "V8_PAIRS" not in da.plan_decode(q, lc, meta, 0.1, num_splits=2, variant="dot").options
    # (a "frag" plan passes it: the AOT variants, planned without the interpreter, assert so)


def test_v8_pairs_env_checked():
    """A KVPACK_V8_PAIRS that is not auto, 0 or 1 stops the import with a message naming it."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", "import kvpack.kernels.decode_attention"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "KVPACK_V8_PAIRS": "yes"})
    assert p.returncode != 0 and "KVPACK_V8_PAIRS='yes'" in p.stderr, p.stderr[-500:]


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("splits,merge", [(1, "auto"), (3, "separate"), (3, "fused")])
@pytest.mark.parametrize("Hq", [32, 16])
def test_decode_fragt_int4_ring_gpu(group_size, block_size, splits, merge, Hq):
    """"fragt" on int4 with whole tiles copied ahead through the cp.async ring (ring4 1 and 2): the same bits as
    its direct loads (same codes and parameters, same operations), and the reference's values; lengths below
    one tile, exactly one and two tiles, partial last tiles, random block tables, GQA groups 4 and 2, split-K
    with either merge, groups of 32, 64 and 128 channels."""
    from kvpack.kernels.decode_attention import decode_paged_attention

    lens = [1, 17, 64, 128, 1000, 4099, 257]
    q, lc, meta = build_case("int4", "int4", lens, Hq, 8, 128, block_size, device="cuda", group_size=group_size)
    scale = 128 ** -0.5
    outs = [decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant="fragt", merge=merge, ring4=r)
            for r in (0, 1, 2)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    ref = reference.paged_attention(q, lc, meta, scale).float()
    assert ((outs[1].float() - ref).abs() - RTOL * ref.abs()).max().item() <= ATOL


def test_pdl_mode_setting(monkeypatch):
    """KVPACK_DECODE_PDL: 0 | start | end, anything else named in the error; never off a CUDA device."""
    from kvpack.config import ConfigError
    from kvpack.kernels.decode_plan import pdl_mode

    cuda = torch.device("cuda", 0)
    monkeypatch.setenv("KVPACK_DECODE_PDL", "sometimes")
    with pytest.raises(ConfigError, match="KVPACK_DECODE_PDL='sometimes'"):
        pdl_mode("frag", "int8", "int8", cuda)
    assert pdl_mode("frag", "int8", "int8", torch.device("cpu")) == 0
    monkeypatch.setenv("KVPACK_DECODE_PDL", "0")
    assert pdl_mode("frag", "int8", "int8", cuda) == 0


def test_pdl_mode_defaults(monkeypatch):
    """Which separate merges launch early by default (an sm_90 device assumed): "frag" and 16-bit "dot" always,
    "fragt" only while its merge has at most FRAGT_PDL_MAX_MERGE programs (up to 8 sequences of Llama-3.1-8B's
    32 query heads), every variant at head dims <= 64 (PDL_MAX_HEAD_DIM), the others never."""
    import kvpack.kernels.decode_plan as dp

    monkeypatch.delenv("KVPACK_DECODE_PDL", raising=False)
    monkeypatch.setitem(dp._PDL_OK, 0, True)
    cuda = torch.device("cuda", 0)
    assert dp.pdl_mode("frag", "int8", "int8", cuda, 1024) == 1
    assert dp.pdl_mode("dot", "float", "float", cuda, 1024) == 1
    assert dp.pdl_mode("dot", "fp8_e4m3", "fp8_e4m3", cuda, 32) == 0
    assert dp.pdl_mode("imma", "int8", "int8", cuda, 32) == 0
    assert dp.pdl_mode("fragt", "int4", "int4", cuda, dp.FRAGT_PDL_MAX_MERGE) == 1
    assert dp.pdl_mode("fragt", "int4", "int4", cuda, dp.FRAGT_PDL_MAX_MERGE + 1) == 0
    assert dp.pdl_mode("fragt", "int4", "int4", cuda) == 0
    for variant, kind in (("dot", "int4"), ("dot", "fp8_e4m3"), ("imma", "int8"), ("fragt", "int8")):
        assert dp.pdl_mode(variant, kind, kind, cuda, 288, 64) == 1, variant  # SmolLM2's 32 x 4096
        assert dp.pdl_mode(variant, kind, kind, cuda, 288, 80) == 0, variant
    monkeypatch.setenv("KVPACK_DECODE_PDL", "0")
    assert dp.pdl_mode("dot", "int4", "int4", cuda, 288, 64) == 0
    monkeypatch.setenv("KVPACK_DECODE_PDL", "end")
    assert dp.pdl_mode("fragt", "int4", "int4", cuda, 4096) == 2


def test_merge_warps():
    """The separate merge's warps follow its partials (~128 fp32 a thread, 1-4 warps), and the plan launches it
    with them."""
    from kvpack.kernels.decode_attention import plan_decode
    from kvpack.kernels.decode_plan import merge_warps

    assert [merge_warps(s, 128) for s in (2, 8, 16, 32, 64, 128)] == [1, 1, 1, 1, 2, 4]
    assert [merge_warps(s, 64) for s in (16, 32, 128)] == [1, 1, 2]
    q, lc, meta = build_case("int8", "int8", [9000, 1300], 8, 2, 128, 16)
    for splits, warps in ((2, 1), (64, 2)):
        plan = plan_decode(q, lc, meta, 128 ** -0.5, num_splits=splits, merge="separate")
        assert plan.merge_options["num_warps"] == warps, (plan.grid, plan.merge_options)  # 2 or 33-64 splits


@pytest.mark.gpu
@pytest.mark.parametrize("name,variant,lens,D", [
    ("bfloat16", "dot", [8192, 3001, 1, 4096], 128), ("int8", "imma", [8192, 3001, 1, 4096], 128),
    ("int8", "frag", [8192, 3001, 1, 4096], 128), ("int4", "fragt", [8192, 3001, 1, 4096], 128),
    ("int4", "fragt", [8192, 3001, 1, 4096] * 3, 128), ("fp8_e4m3", "dot", [8192, 3001, 1, 4096], 128),
    ("fp8_e4m3", "frag", [8192, 3001, 1, 4096], 128), ("int4", "dot", [8192, 3001, 1, 4096], 64),
    ("int8", "fragt", [8192, 3001, 1, 4096] * 3, 64), ("fp8_e5m2", "fragt", [4096, 17, 1, 3001], 64)])
def test_decode_pdl_merge_gpu(name, variant, lens, D, monkeypatch):
    """The separate split merge as a programmatic dependent launch (`decode_plan.pdl_mode`, sm_90+, the
    variants of `pdl_variant`, "fragt" with a merge of <= FRAGT_PDL_MAX_MERGE programs, every variant at head dim 64):
    the same bits as a plain launch, eager and replayed from a CUDA graph (the merge waits for the decode grid)."""
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode
    from kvpack.kernels.decode_plan import pdl_mode

    q, lc, meta = build_case(name, name, lens, 32, 8, D, 16, device="cuda")
    scale = D ** -0.5
    kw = dict(num_splits=16, variant=variant, merge="separate")
    plan = plan_decode(q, lc, meta, scale, **kw)
    assert plan.merge_grid is not None and plan.variant == variant
    pdl = pdl_mode(variant, lc.k.fmt.kind, lc.v.fmt.kind, q.device, len(lens) * 32, D)
    assert ("PDL" in plan.merge_options) == (pdl > 0)
    early = (variant == "frag" or variant == "dot" and name == "bfloat16" or variant == "fragt" and len(lens) <= 8
             or D == 64)
    assert (pdl > 0) == early
    with_pdl = decode_paged_attention(q, lc, meta, scale, **kw)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            graphed = decode_paged_attention(q, lc, meta, scale, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    monkeypatch.setenv("KVPACK_DECODE_PDL", "0")
    assert "PDL" not in plan_decode(q, lc, meta, scale, **kw).merge_options
    plain = decode_paged_attention(q, lc, meta, scale, **kw)
    assert torch.equal(with_pdl, plain) and torch.equal(graphed, plain)


def test_hw_fp8_decode_setting(monkeypatch):
    """The Gluon kernels decode e4m3 with the conversion instruction (the plan's factor 1 instead of 256) only
    where `hw_fp8_decode` says so: CUDA devices of sm >= 89 unless KVPACK_SOFT_FP8_DECODE=1; CPU plans (the
    AOT builds for Ampere) keep the software decode; the Triton variants and e5m2 are never touched."""
    import kvpack.kernels.decode_attention as da
    from kvpack.kernels.decode_plan import hw_fp8_decode

    assert not hw_fp8_decode(torch.device("cpu"))
    monkeypatch.setenv("KVPACK_SOFT_FP8_DECODE", "1")
    assert not hw_fp8_decode(torch.device("cuda", 0))  # (decided before any device query)
    monkeypatch.setattr(da, "INTERPRET", False)  # plan as on a GPU (nothing launches)
    q, lc, meta = build_case("fp8_e4m3", "fp8_e5m2", [300, 9], 32, 8, 128, 16)

    def factors(variant):
        plan = da.plan_decode(q, lc, meta, 0.1, variant=variant, num_splits=2)
        names = plan.kernel.arg_names
        return plan.variant, plan.args[names.index("K_FACTOR")], plan.args[names.index("V_FACTOR")]

    assert factors("frag") == ("frag", 256.0, 1.0)
    monkeypatch.setattr(da, "hw_fp8_decode", lambda device: True)
    assert factors("frag") == ("frag", 1.0, 1.0)
    assert factors("fragt") == ("fragt", 1.0, 1.0)
    assert factors("dot") == ("dot", 256.0, 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name,variant,splits,prefetch", [
    ("fp8_e4m3", "fp8_e4m3", "frag", 8, None), ("fp8_e4m3", "fp8_e4m3", "frag", 3, 0),
    ("fp8_e4m3", "fp8_e4m3", "frag", 1, 0), ("fp8_e4m3-static", "fp8_e4m3-static", "frag", 8, None),
    ("int8", "fp8_e4m3", "frag", 8, None), ("fp8_e4m3", "fp8_e5m2", "frag", 4, 0),
    ("fp8_e4m3", "fp8_e4m3", "fragt", 3, 0), ("fp8_e4m3", "int8", "fragt", 1, 0)])
def test_decode_hw_fp8_gpu(k_name, v_name, variant, splits, prefetch, monkeypatch):
    """e4m3 decoded by the conversion instruction (sm >= 89, factor 1: `decode_plan.hw_fp8_decode`) gives the
    same bits as the software decode (factor 256: both exact, and the factors are powers of two), with the
    ring, direct loads, one split and "fragt"; and it is what the plan chose."""
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 conversion instruction before sm_89")
    q, lc, meta = build_case(k_name, v_name, [4099, 1, 777, 2048], 32, 8, 128, 16, device="cuda")
    scale = 128 ** -0.5
    kw = dict(num_splits=splits, variant=variant, prefetch=prefetch)
    plan = plan_decode(q, lc, meta, scale, **kw)
    names = plan.kernel.arg_names
    assert plan.variant == variant
    assert plan.args[names.index("K_FACTOR")] == plan.args[names.index("V_FACTOR")] == 1.0  # e4m3's too
    hw = decode_paged_attention(q, lc, meta, scale, **kw)
    monkeypatch.setenv("KVPACK_SOFT_FP8_DECODE", "1")
    assert plan_decode(q, lc, meta, scale, **kw).args[names.index("K_FACTOR")] == (
        256.0 if k_name.startswith("fp8_e4m3") else 1.0)
    soft = decode_paged_attention(q, lc, meta, scale, **kw)
    assert torch.equal(hw, soft)
    ref = reference.paged_attention(q, lc, meta, scale).float()
    assert ((hw.float() - ref).abs() - RTOL * ref.abs()).max().item() <= ATOL


def test_e5m2_hw_decode_setting(monkeypatch):
    """e5m2 takes the conversion instruction (the kernels' E5M2_HW) only where e4m3 does (`hw_fp8_decode`), in the
    Gluon variants, with an e5m2 side, and as KVPACK_E5M2_HW (0 / 1) or the default says ("fragt" only: at head dim
    64 it was 5 % faster, in "frag" 0.8 % slower at 128 x 1024); anything else in the setting is refused by name."""
    import kvpack.kernels.decode_attention as da
    from kvpack.kernels import decode_plan

    monkeypatch.setattr(da, "INTERPRET", False)  # plan as on a GPU (nothing launches)
    q, lc, meta = build_case("fp8_e4m3", "fp8_e5m2", [300, 9], 32, 8, 128, 16)
    q4, lc4, meta4 = build_case("fp8_e4m3", "fp8_e4m3", [300, 9], 32, 8, 128, 16)

    def hw(variant, case=(q, lc, meta)):
        return da.plan_decode(case[0], case[1], case[2], 0.1, variant=variant, num_splits=2).options.get("E5M2_HW", False)

    assert not hw("frag")  # a CPU device: no conversion instruction
    monkeypatch.setattr(da, "hw_fp8_decode", lambda device: True)
    assert (hw("frag"), hw("fragt"), hw("dot")) == ("frag" in decode_plan.E5M2_HW_VARIANTS, True, False)
    for env, want in (("1", True), ("0", False)):
        monkeypatch.setenv("KVPACK_E5M2_HW", env)
        assert (hw("frag"), hw("fragt"), hw("dot"), hw("frag", (q4, lc4, meta4))) == (want, want, False, False)
    monkeypatch.setenv("KVPACK_E5M2_HW", "yes")
    with pytest.raises(ValueError, match="KVPACK_E5M2_HW='yes': expected 0 or 1"):
        hw("frag")


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name,variant,splits,prefetch,shape", [
    ("fp8_e5m2", "fp8_e5m2", "frag", 8, None, (32, 8, 128)), ("fp8_e5m2", "fp8_e5m2", "frag", 3, 0, (32, 8, 128)),
    ("fp8_e5m2", "fp8_e5m2", "frag", 1, 0, (32, 8, 128)), ("fp8_e5m2-static", "fp8_e5m2", "frag", 8, None, (32, 8, 128)),
    ("fp8_e4m3", "fp8_e5m2", "frag", 4, None, (32, 8, 128)), ("fp8_e5m2", "int8", "frag", 4, 0, (32, 8, 128)),
    ("fp8_e5m2", "fp8_e5m2", "fragt", 3, 0, (32, 8, 128)), ("fp8_e5m2", "fp8_e5m2", "fragt", 16, 0, (9, 3, 64)),
    ("fp8_e5m2", "fp8_e4m3", "fragt", 1, 0, (9, 3, 64)), ("int8", "fp8_e5m2-static", "fragt", 4, 0, (9, 3, 64))])
def test_decode_e5m2_hw_gpu(k_name, v_name, variant, splits, prefetch, shape, monkeypatch):
    """e5m2 decoded by the conversion instruction (KVPACK_E5M2_HW=1) gives the same bits as its byte permute
    (both exact), with the ring, direct loads, one split, "fragt" at head dims 128 and 64 (SmolLM2's heads), static
    scales and beside other formats; within the tolerance of the reference."""
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 conversion instruction before sm_89")
    Hq, Hkv, D = shape
    q, lc, meta = build_case(k_name, v_name, [4099, 1, 777, 2048], Hq, Hkv, D, 16, device="cuda")
    scale = D ** -0.5
    kw = dict(num_splits=splits, variant=variant, prefetch=prefetch)
    out = {}
    for env in ("1", "0"):
        monkeypatch.setenv("KVPACK_E5M2_HW", env)
        plan = plan_decode(q, lc, meta, scale, **kw)
        assert plan.variant == variant and plan.options.get("E5M2_HW", False) == (env == "1")
        out[env] = decode_paged_attention(q, lc, meta, scale, **kw)
    assert torch.equal(out["1"], out["0"])
    ref = reference.paged_attention(q, lc, meta, scale).float()
    assert ((out["1"].float() - ref).abs() - RTOL * ref.abs()).max().item() <= ATOL


@pytest.mark.gpu
@pytest.mark.parametrize("Hq,Hkv", [(8, 8), (16, 1), (12, 4)])
def test_decode_frag_gpu_group_sizes(Hq, Hkv):
    """GQA groups of 1, 16 and 3 (padded to the MMA's 16 rows) in the "frag" kernel."""
    check("int8", "int8", [5, 700, 64], Hq=Hq, Hkv=Hkv, D=128, device="cuda", variant="frag")


@pytest.mark.parametrize("k_name,v_name,D,Hq,bs,want", [
    ("int8", "int8", 128, 4, 16, "frag"), ("fp8_e4m3", "int8-static", 128, 32, 8, "frag"),
    ("int4", "int4", 128, 4, 16, "frag"), ("int4", "int8", 128, 4, 16, "frag"), ("int8", "int4", 128, 4, 16, "imma"),
    ("int8", "bfloat16", 128, 4, 16, "imma"), ("int8", "int8", 64, 4, 16, "imma"),
    ("int8", "int8", 128, 34, 16, "imma"), ("int8", "int8", 128, 4, 4, "imma"), ("fp8_e5m2", "fp8_e4m3", 64, 4, 16, "dot")])
def test_frag_scope(k_name, v_name, D, Hq, bs, want, monkeypatch):
    """"frag" covers 8-bit codes on both sides, head_dim 128, GQA groups <= 16 and blocks >= 8 when
    compiled for a GPU; the plan falls back elsewhere, and always in the CPU interpreter: to "imma"
    for int8 K (session 7), else "dot"."""
    import kvpack.kernels.decode_attention as da

    q, lc, meta = build_case(k_name, v_name, [3, 40], Hq, 2, D, bs)
    monkeypatch.setattr(da, "INTERPRET", False)  # plan as for a GPU (planning launches nothing)
    assert da.plan_decode(q, lc, meta, 0.1, variant="frag").variant == want
    monkeypatch.setattr(da, "INTERPRET", True)
    fallback = "imma" if k_name == "int8" else "dot"
    assert da.plan_decode(q, lc, meta, 0.1, variant="frag").variant == fallback


@pytest.mark.parametrize("group_size,want", [(8, "dot"), (16, "frag"), (64, "frag")])
def test_frag_int4_scope(group_size, want, monkeypatch):
    """int4 in "frag" needs groups of >= 16 channels (a lane's 16 K code bytes share one); "auto" on int4
    K and V takes "fragt" (session 18) within the same scope, else "dot"; the L2 prefetch (PREFETCH 1) is
    the default, never the ring."""
    import kvpack.kernels.decode_attention as da

    monkeypatch.delenv("KVPACK_DECODE_VARIANT", raising=False)
    q, lc, meta = build_case("int4", "int4", [3, 4000], 32, 8, 128, 16, group_size=group_size)
    monkeypatch.setattr(da, "INTERPRET", False)
    plan = da.plan_decode(q, lc, meta, 0.1, variant="frag")
    assert plan.variant == want
    if want == "frag":
        assert plan.args[plan.kernel.arg_names.index("PREFETCH")] == 1
    auto = da.plan_decode(q, lc, meta, 0.1)
    assert auto.variant == want.replace("frag", "fragt")
    if want == "frag":
        assert auto.args[auto.kernel.arg_names.index("PREFETCH")] == 1


@pytest.mark.parametrize("kinds", [("fp8_e4m3", "fp8_e5m2"), ("int8", "int8"), ("int8-static", "int8")])
@pytest.mark.parametrize("lens,splits,long", [([4096] * 64, None, True), ([2048] * 2, 1, True),
                                               ([32768], None, True), ([32768], 128, False), ([900], 1, False)])
def test_auto_frag_on_long_splits(kinds, lens, splits, long, monkeypatch):
    """"auto" on 8-bit K and V: "frag" where a program covers >= FRAG_MIN_TOKENS tokens (few long
    splits), or >= RING_MIN_TOKENS with the cp.async ring (1 x 32768: 64 ring splits of 512); on many short
    splits (measured slower there) and always in the interpreter, the fallback: "imma" for int8 K, "dot"
    for FP8 K."""
    import kvpack.kernels.decode_attention as da

    monkeypatch.delenv("KVPACK_DECODE_VARIANT", raising=False)
    import kvpack.kernels.decode_plan as dp

    monkeypatch.setattr(dp, "_sm_count", lambda dev: 132)
    q, lc, meta = build_case(*kinds, [5] * len(lens), 32, 8, 128, 16)
    meta = dataclasses.replace(meta, max_seq_len=max(lens))
    fallback = "imma" if kinds[0].startswith("int8") else "dot"
    monkeypatch.setattr(da, "INTERPRET", False)
    assert da.plan_decode(q, lc, meta, 0.1, num_splits=splits).variant == ("frag" if long else fallback)
    monkeypatch.setattr(da, "INTERPRET", True)
    assert da.plan_decode(q, lc, meta, 0.1, num_splits=splits).variant == fallback


@pytest.mark.parametrize("batch,ctx,bs,want", [(32, 4096, 16, (2, 1)), (64, 2048, 16, (1, 1)), (8, 8192, 16, (8, 1)),
                                                (128, 1024, 16, (1, 0)), (32, 4096, 8, (4, 0)), (1, 32768, 16, (64, 1)),
                                                (1, 8192, 16, None), (2, 16384, 16, (32, 1)),
                                                (41, 8704, 16, (8, 1)), (47, 5414, 16, (5, 1)), (41, 2500, 16, (2, 1))])
def test_frag_ring_plan(batch, ctx, bs, want, monkeypatch):
    """"auto" on int8 K and V, as planned for an H200 (132 SMs): the cp.async ring (PREFETCH 1) with
    about 4 programs per SM where the grid allows (`choose_ring_splits`), none with a larger grid or
    8-token blocks (plain "frag", its own split rule), and no "frag" where its splits would be short
    (< RING_MIN_TOKENS with the ring: 1 x 8192 would take 64 splits of 128 tokens).
    Long contexts (the KV-bound workload's 41 x 8704 bucket) cut splits of more than RING_LONG_SPLIT
    tokens into pieces of >= 1024 tokens (still "frag")."""
    import kvpack.kernels.decode_attention as da
    import kvpack.kernels.decode_plan as dp

    monkeypatch.delenv("KVPACK_DECODE_VARIANT", raising=False)
    monkeypatch.setattr(dp, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(da, "INTERPRET", False)
    q, lc, meta = build_case("int8", "int8", [5] * batch, 32, 8, 128, bs)
    meta = dataclasses.replace(meta, max_seq_len=ctx)
    plan = da.plan_decode(q, lc, meta, 0.1)
    if want is None:
        assert plan.variant == "imma"
        return
    assert plan.variant == "frag"
    assert (plan.grid[2], plan.args[plan.kernel.arg_names.index("PREFETCH")]) == want
    # a GPU whose multiprocessors hold only 2 ring programs (~100 KB of shared memory): direct loads
    monkeypatch.setattr(dp, "_ring_programs_per_sm", lambda dev: 2)
    plan = da.plan_decode(q, lc, meta, 0.1)
    assert plan.args[plan.kernel.arg_names.index("PREFETCH")] == 0
    assert plan.grid[2] == dp.choose_num_splits(batch, 8, ctx, 64, q.device, 1, 128)


@pytest.mark.parametrize("name,want", [("bfloat16", 16), ("float16", 16), ("int8", 22), ("int4", 22), ("fp8_e4m3", 22)])
def test_head_dim_64_splits(name, want, monkeypatch):
    """SmolLM2's decode shape (32 sequences of 4096, 3 kv heads of 64), planned for an H200: the quantized
    one-warp programs fill 16 an SM (22 splits), a 16-bit cache 12 (16 splits: 0.99x the time of 11, 22 1.10x,
    session 37)."""
    import kvpack.kernels.decode_attention as da
    import kvpack.kernels.decode_plan as dp

    monkeypatch.delenv("KVPACK_DECODE_VARIANT", raising=False)
    monkeypatch.setattr(dp, "_sm_count", lambda dev: 132)
    q, lc, meta = build_case(name, name, [5] * 32, 9, 3, 64, 16)
    meta = dataclasses.replace(meta, max_seq_len=4096)
    assert da.plan_decode(q, lc, meta, 0.1).grid == (32, 3, want)


def test_needs_idx64_reads_strides():
    """int64 indexing when any element offset of a pool tensor (strided views too) reaches 2**31."""
    from types import SimpleNamespace

    from kvpack.kernels.decode_attention import _needs_idx64

    base = torch.empty(2**31 + 16, dtype=torch.uint8, device="meta")
    pool = lambda codes, scales=None: SimpleNamespace(codes=codes, scales=scales, zeros=None)  # noqa: E731
    assert not _needs_idx64(pool(base[:4096]))
    assert not _needs_idx64(pool(base.as_strided((2, 8), (2**30, 1))))  # last offset 2**30 + 7
    assert _needs_idx64(pool(base.as_strided((3, 8), (2**30, 1))))  # a view reaching past 2**31
    assert _needs_idx64(pool(base[:4096], base[: 2**31 + 1]))  # the scales decide too


@pytest.mark.parametrize("name", ["int8", "int4", "fp8_e4m3-static", "float16"])
def test_decode_split_k(name):
    check(name, name, [150, 17, 3], num_splits=3)


@pytest.mark.parametrize("k_name,v_name", [("int8", "int4"), ("int4", "fp8_e5m2"), ("fp8_e4m3", "float16"),
                                           ("int4-norot", "int8-static")])
def test_decode_mixed_formats(k_name, v_name):
    check(k_name, v_name, [45, 33], num_splits=2)


@pytest.mark.parametrize("k_name,v_name,D", [("fp8_e4m3", "fp8_e4m3", 64), ("int8", "int8", 64),
                                             ("int4", "fp8_e5m2", 80), ("bfloat16", "int4", 64)])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_and_prefill_with_layer_means(k_name, v_name, D, splits):
    """A layer cache with K and V means (centered sides): the Triton paths return what the reference
    returns (V rotated back and its mean added, each kv head's mean broadcast over its query heads),
    decode (split or not) and the mixed prefill kernel."""
    _check_layer_means(k_name, v_name, D, splits, [37, 1, 70], 4, 2, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name,D", [("fp8_e4m3", "fp8_e4m3", 128), ("int8", "int4", 128),
                                             ("int4", "fp8_e5m2", 80), ("fp8_e4m3", "fp8_e4m3", 256)])
def test_layer_means_gpu(k_name, v_name, D):
    _check_layer_means(k_name, v_name, D, None, [1, 17, 1000, 4099, 257], 32, 8, "cuda")


def _check_layer_means(k_name, v_name, D, splits, seq_lens, Hq, Hkv, device):
    import dataclasses

    from kvpack.kernels import paged_attention
    from kvpack.kernels.decode_attention import decode_paged_attention
    from kvpack.kernels.prefill_attention import prefill_paged_attention

    q, lc, meta = build_case(k_name, v_name, seq_lens, Hq, Hkv, D, 16, device=device)
    gen = torch.Generator().manual_seed(7)
    lc = dataclasses.replace(lc, k_mean=torch.randn(Hkv, D, generator=gen).to(device),
                             v_mean=(torch.randn(Hkv, D, generator=gen) * 3).to(device))
    ref = reference.paged_attention(q, lc, meta, D ** -0.5).float()
    plain = reference.paged_attention(q, dataclasses.replace(lc, v_mean=None), meta, D ** -0.5).float()
    assert (ref - plain).abs().max() > 1.0  # the mean matters at this tolerance
    for out in (decode_paged_attention(q, lc, meta, D ** -0.5, num_splits=splits),
                prefill_paged_attention(q, lc, meta, D ** -0.5), paged_attention(q, lc, meta, D ** -0.5)):
        assert out.dtype == q.dtype
        err = ((out.float() - ref).abs() - RTOL * ref.abs()).max().item()
        assert err <= ATOL, (k_name, v_name, D, splits, err)


@pytest.mark.parametrize("k_name,v_name,D,splits,means,dtype", [
    ("int4", "int4", 128, 1, False, torch.float16),      # q rotated and split into halves in the kernel; halves joined
    ("int4", "int4", 128, 3, True, torch.bfloat16),      # ... out @ R + mean in the merge, bf16 output
    ("int4", "int4", 80, 1, False, torch.float16),       # head dim 80: rotate_heads on both sides
    ("int4", "int4", 96, 3, True, torch.float16),        # q by rotate_heads, the merge does the output
    ("fp8_e4m3", "fp8_e5m2", 64, 1, True, torch.bfloat16),  # epilogue: out @ R + mean, bf16 rounded
    ("int8", "int8", 64, 1, True, torch.float16),        # centered, not rotated: the mean alone
    ("int8", "fp8_e4m3", 80, 2, False, torch.float16),   # int8 K (no q rotation), rotated V in the merge
])
def test_decode_rotation_placement(k_name, v_name, D, splits, means, dtype):
    """Where q @ R and out @ R + V mean run (`plan_decode`: in the kernel / the merge, `rotate_heads`
    only for int4 halves at head dims that are not powers of two) and that every placement returns
    the reference's output (bf16: the tolerance of test_decode_bf16)."""
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    q, lc, meta = build_case(k_name, v_name, [37, 1, 70], 4, 2, D, 16, dtype=dtype)
    if means:
        gen = torch.Generator().manual_seed(7)
        lc = dataclasses.replace(lc, k_mean=torch.randn(2, D, generator=gen),
                                 v_mean=torch.randn(2, D, generator=gen) * 3)
    plan = plan_decode(q, lc, meta, D ** -0.5, num_splits=splits, variant="dot")
    pow2 = D & (D - 1) == 0
    assert plan.rotate_q == (lc.k.fmt.rotate and lc.k.fmt.kind == "int4" and not pow2)  # by rotate_heads
    external_post = (lc.v.fmt.rotate or means) and splits == 1 and lc.v.fmt.kind == "int4" and not pow2
    assert (plan.post is not None) == bool(external_post)
    assert plan.out.dtype == (torch.float32 if external_post else dtype)
    ref = reference.paged_attention(q, lc, meta, D ** -0.5).float()
    out = decode_paged_attention(q, lc, meta, D ** -0.5, num_splits=splits, variant="dot")
    assert out.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else ATOL
    err = ((out.float() - ref).abs() - tol * ref.abs()).max().item()
    assert err <= tol, (k_name, v_name, D, splits, err)


@pytest.mark.parametrize("variant,k_name,v_name", [("frag", "fp8_e4m3", "fp8_e4m3"), ("frag", "int4", "int4"),
                                                    ("fragt", "int4", "int4"), ("fragt", "fp8_e5m2", "int8"),
                                                    ("frag", "int8", "fp8_e4m3")])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("gluon_rot", [True, False])
@pytest.mark.parametrize("one_split,epilogue", [(True, True), (True, False), (False, True)])
def test_gluon_rotation_placement(variant, k_name, v_name, splits, gluon_rot, one_split, epilogue, monkeypatch):
    """"fragt" rotates q as it loads it and, with one split, forms out @ R + V mean in its epilogue
    (`decode_frag._q_rot`, `_store_out_rot`; session 19): no `rotate_heads` around it, the output in q's
    dtype. "frag" rotates q itself with 8-bit codes only (with int4 its code spilled), and leaves out @ R + V mean
    to the merge kernel with split-K; with one split where FRAG_ROT_ONE_SPLIT it forms them in its own epilogue
    (FRAG_ROT_EPILOGUE, session 35) or stores its output as a split's partial for the merge kernel (session 22),
    else leaves them to `rotate_heads`. KVPACK_GLUON_ROT_Q=0 (`GLUON_ROT_Q`) puts both back in `rotate_heads`."""
    import kvpack.kernels.decode_attention as da

    monkeypatch.setattr(da, "INTERPRET", False)  # plan as on a GPU (nothing launches)
    monkeypatch.setattr(da, "GLUON_ROT_Q", gluon_rot)
    monkeypatch.setattr(da, "FRAG_ROT_ONE_SPLIT", one_split)
    monkeypatch.setattr(da, "FRAG_ROT_EPILOGUE", epilogue)
    q, lc, meta = build_case(k_name, v_name, [300, 9], 32, 8, 128, 16)
    lc = dataclasses.replace(lc, v_mean=torch.zeros(8, 128))
    plan = da.plan_decode(q, lc, meta, 0.1, num_splits=splits, variant=variant, merge="separate")
    assert plan.variant == variant
    arg = lambda name: plan.args[plan.kernel.arg_names.index(name)]  # noqa: E731
    # "frag": 8-bit codes only (with int4 the rotation made it spill), with one split where FRAG_ROT_ONE_SPLIT
    in_kernel = gluon_rot and (variant == "fragt" or (splits > 1 or one_split) and "int4" not in (k_name, v_name))
    assert arg("ROT_Q") == (in_kernel and lc.k.fmt.rotate)
    assert plan.rotate_q == (not in_kernel and lc.k.fmt.rotate)
    in_epilogue = in_kernel and splits == 1 and (variant == "fragt" or epilogue)
    in_merge = splits > 1 or in_kernel and not in_epilogue  # ("frag" with one split: its output as a partial)
    assert (arg("ROT_OUT"), arg("OUT_MEAN")) == ((lc.v.fmt.rotate, True) if in_epilogue else (False, False))
    assert arg("SPLIT") == in_merge and (plan.merge_grid is not None) == in_merge
    assert (plan.post is None) == (in_epilogue or in_merge)  # else out @ R + mean by `rotate_heads`
    assert plan.out.dtype == (q.dtype if plan.post is None else torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("variant,k_name,v_name", [("frag", "fp8_e4m3", "fp8_e4m3"), ("frag", "int4", "int4"),
                                                    ("fragt", "int4", "int4"), ("fragt", "fp8_e5m2", "fp8_e4m3"),
                                                    ("frag", "int8", "fp8_e5m2"), ("frag", "fp8_e5m2-static", "int8")])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("means", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("one_split,epilogue", [(True, True), (True, False), (False, True)])
def test_gluon_rotation_gpu(variant, k_name, v_name, splits, means, dtype, one_split, epilogue, monkeypatch):
    """q @ R in the Gluon kernels' prologue and out @ R + V mean in the one-split epilogues ("fragt": session 19;
    "frag": FRAG_ROT_EPILOGUE, session 35) against the reference, and against the same kernels with both rotations
    by `rotate_heads` (GLUON_ROT_Q off): both within the reference tolerance (bf16: test_decode_bf16's)."""
    import kvpack.kernels.decode_attention as da

    lens = [1, 17, 64, 1000, 257]
    q, lc, meta = merge_case(k_name, v_name, 128, lens, 32, 8, dtype, means, device="cuda")
    scale = 128 ** -0.5
    ref = reference.paged_attention(q, lc, meta, scale).float()
    tol = 1e-2 if dtype == torch.bfloat16 else ATOL
    monkeypatch.setattr(da, "FRAG_ROT_ONE_SPLIT", one_split)
    monkeypatch.setattr(da, "FRAG_ROT_EPILOGUE", epilogue)
    for on in (True, False):
        monkeypatch.setattr(da, "GLUON_ROT_Q", on)
        plan = da.plan_decode(q, lc, meta, scale, num_splits=splits, variant=variant)
        in_kernel = on and (variant == "fragt" or (splits > 1 or one_split) and "int4" not in (k_name, v_name))
        assert plan.variant == variant and plan.rotate_q == (not in_kernel and lc.k.fmt.rotate)
        out = da.decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant=variant)
        assert out.dtype == dtype
        err = ((out.float() - ref).abs() - tol * ref.abs()).max().item()
        assert err <= tol, (variant, k_name, v_name, splits, means, dtype, on, err)


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name", [("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2"), ("int8", "fp8_e4m3"),
                                           ("fp8_e4m3-static", "fp8_e5m2-static"), ("fp8_e5m2", "int8"),
                                           ("int8", "int8")])
@pytest.mark.parametrize("means", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group", [4, 1, 7])
def test_frag_rot_epilogue_bits_gpu(k_name, v_name, means, dtype, group, monkeypatch):
    """"frag" with one split forms out @ R + V mean in its epilogue, in the MMA accumulator layout, its butterfly
    stages in the order of the output channel's bits (`decode_frag._frag_hadamard_mma`, session 35): the same bits
    as its output stored as a partial and rotated by the merge kernel (`_store_out`), which it replaces; and
    within the reference tolerance. Odd lengths, a sequence without a query, random block tables; a group of 7
    leaves padding rows in the accumulator. float32 outputs too (session 44): rounded to 16 bits, the outputs had
    hidden that ptxas fused the epilogue's o = acc / l + V mean into one fma where the merge rounds the quotient
    first (582 of 20,480 float32 values of the fp8_e5m2 / int8 case differed in their last bits; with V8_PAIRS one
    bf16 value did too: results/decode_s44, call 3); the epilogue now adds the mean with `_add_rn`. That alone failed
    14 cases (session 45, f8bf596: the rotated FP8 V with means, float32 at every group, and int8 / fp8_e4m3 in
    float16), since the merge kernel fused o @ R's * NORM with its plain add of the mean; every mean add is now an
    add of its own (`quant.add_rn`; results/decode_s45)."""
    import kvpack.kernels.decode_attention as da

    lens = [1, 17, 64, 1000, 257, 4099]
    hkv = 8 if group != 7 else 2
    q, lc, meta = merge_case(k_name, v_name, 128, lens, hkv * group, hkv, dtype, means, device="cuda")
    # sequence 2 without a query token (its rows of q dropped), sequence 4 a graph's padding row (length 0)
    qsl = torch.tensor([0, 1, 2, 2, 3, 4, 5], dtype=torch.int32, device="cuda")
    seq_lens = meta.seq_lens.clone()
    seq_lens[4] = 0
    meta = dataclasses.replace(meta, query_start_loc=qsl, seq_lens=seq_lens)
    q = torch.cat([q[:2], q[3:]]).contiguous()
    scale = 128 ** -0.5
    outs = {}
    for epilogue in (True, False):
        monkeypatch.setattr(da, "FRAG_ROT_EPILOGUE", epilogue)
        plan = da.plan_decode(q, lc, meta, scale, num_splits=1, variant="frag")
        assert plan.variant == "frag" and plan.post is None
        rotated = lc.v.fmt.rotate or lc.v_mean is not None
        assert (plan.merge_grid is None) == (epilogue or not rotated), (epilogue, rotated)
        outs[epilogue] = da.decode_paged_attention(q, lc, meta, scale, num_splits=1, variant="frag")
    assert torch.equal(outs[True], outs[False])
    ref = reference.paged_attention(q, lc, meta, scale).float()
    tol = 1e-2 if dtype == torch.bfloat16 else ATOL
    err = ((outs[True].float() - ref).abs() - tol * ref.abs()).max().item()
    assert err <= tol, (k_name, v_name, means, dtype, group, err)
    assert outs[True].shape == q.shape and torch.isfinite(outs[True]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name,D,variant,splits,merge", [
    ("int8", "int8", 128, "frag", 1, "auto"),                 # the one-split loop that carried the predicate
    ("fp8_e4m3", "fp8_e4m3", 128, "frag", 1, "auto"),         # out @ R + V mean in the one-split epilogue
    ("int8-static", "int8-static", 128, "frag", 1, "auto"),
    ("fp8_e5m2", "int8", 128, "frag", 3, "separate"),
    ("int8", "int8", 128, "frag", 3, "fused"),                # the fused merge's store
    ("int4", "int4", 128, "fragt", 1, "auto"),
    ("int4", "int4", 128, "fragt", 3, "fused"),
    ("int8", "int8", 64, "fragt", 1, "auto"),
    ("fp8_e4m3", "fp8_e5m2", 64, "fragt", 3, "separate"),
    ("bfloat16", "bfloat16", 64, "dot", 11, "auto"),          # `_decode_kernel`: SmolLM2's bf16 plan
    ("bfloat16", "bfloat16", 128, "dot", 1, "auto"),
    ("int4", "int4", 64, "dot", 3, "separate"),
    ("fp8_e5m2", "fp8_e5m2", 128, "dot", 1, "auto"),
    ("int8", "int8", 128, "imma", 1, "auto"),
    ("int8-static", "int8", 128, "imma", 3, "fused"),
])
def test_decode_all_q_bits_gpu(k_name, v_name, D, variant, splits, merge, monkeypatch):
    """A batch whose every sequence has its query token (T == B) runs the decode kernels with ALL_Q (q's row is the
    sequence's, no "has a query" predicate through the tile loop; planned for "fragt", "dot" and "imma", asked for
    here for "frag" too):
    the same bits as without it, and within the reference tolerance. Odd lengths, random block tables, a graph's
    padding row (length 0), V means."""
    import kvpack.kernels.decode_attention as da

    lens = [1, 17, 64, 1000, 5, 257, 4099]
    q, lc, meta = merge_case(k_name, v_name, D, lens, 32, 8, torch.bfloat16, True, device="cuda")
    seq_lens = meta.seq_lens.clone()
    seq_lens[4] = 0  # a CUDA graph's padding row: a query, no context
    meta = dataclasses.replace(meta, seq_lens=seq_lens)
    scale = D ** -0.5
    outs = {}
    for all_q in (True, False):
        monkeypatch.setattr(da, "ALL_Q_VARIANTS", ("frag", "fragt", "dot", "imma") if all_q else ())
        plan = da.plan_decode(q, lc, meta, scale, num_splits=splits, variant=variant, merge=merge)
        assert plan.variant == variant and plan.options.get("ALL_Q", False) == all_q, (plan.variant, plan.options)
        outs[all_q] = da.decode_paged_attention(q, lc, meta, scale, num_splits=splits, variant=variant, merge=merge)
    assert torch.equal(outs[True], outs[False])
    ref = reference.paged_attention(q, lc, meta, scale).float()
    err = ((outs[True].float() - ref).abs() - 1e-2 * ref.abs()).max().item()
    assert err <= 1e-2, (k_name, v_name, D, variant, splits, err)
    assert torch.isfinite(outs[True]).all()


def test_decode_all_q_plan(monkeypatch):
    """ALL_Q is planned for "fragt", "dot" and "imma" where every sequence has its query token (T == B); not where
    one has none (T < B), and for "frag" only where listed (`ALL_Q_VARIANTS`, KVPACK_DECODE_ALL_Q=all)."""
    import kvpack.kernels.decode_attention as da

    q, lc, meta = build_case("int8", "int8", [300, 9, 70], 8, 2, 128, 16)
    monkeypatch.setattr(da, "INTERPRET", False)  # plan as for a GPU (planning launches nothing)
    assert da.ALL_Q_VARIANTS == ("fragt", "dot", "imma")
    for variant in ("fragt", "dot", "imma"):
        assert da.plan_decode(q, lc, meta, 0.1, variant=variant).options.get("ALL_Q") is True, variant
    assert "ALL_Q" not in da.plan_decode(q, lc, meta, 0.1, variant="frag").options
    skip = dataclasses.replace(meta, query_start_loc=torch.tensor([0, 1, 1, 2], dtype=torch.int32))
    for variant in ("fragt", "dot", "imma"):
        assert "ALL_Q" not in da.plan_decode(torch.cat([q[:1], q[2:]]), lc, skip, 0.1, variant=variant).options
    monkeypatch.setattr(da, "ALL_Q_VARIANTS", ("frag", "fragt", "dot", "imma"))
    for variant in ("frag", "dot", "imma"):
        assert da.plan_decode(q, lc, meta, 0.1, variant=variant).options.get("ALL_Q") is True, variant
    monkeypatch.setattr(da, "ALL_Q_VARIANTS", ())
    assert "ALL_Q" not in da.plan_decode(q, lc, meta, 0.1, variant="fragt").options


@pytest.mark.parametrize("k_name,v_name,D,splits,merge", [
    ("bfloat16", "bfloat16", 64, 1, "auto"), ("int8", "int4", 64, 3, "fused"), ("fp8_e4m3", "int8-static", 64, 3, "separate"),
    ("int4", "int4", 128, 1, "auto"), ("int8", "int8", 80, 2, "separate"),
])
def test_decode_all_q_dot(k_name, v_name, D, splits, merge, monkeypatch):
    """"dot" with ALL_Q (`_decode_kernel`: q's row is the sequence's, no query_start_loc load; planned where T == B)
    gives the same bits as without it, through the CPU interpreter: one split and split-K
    with either merge, rotated and centered sides, a CUDA graph's padding row (length 0)."""
    import kvpack.kernels.decode_attention as da

    lens = [1, 40, 0, 130]
    q, lc, meta = merge_case(k_name, v_name, D, [n or 3 for n in lens], 8, 2, torch.float16, True)
    meta = dataclasses.replace(meta, seq_lens=torch.tensor(lens, dtype=torch.int32))
    outs = {}
    for all_q in (True, False):
        monkeypatch.setattr(da, "ALL_Q_VARIANTS", ("dot",) if all_q else ())
        plan = da.plan_decode(q, lc, meta, D ** -0.5, num_splits=splits, variant="dot", merge=merge)
        assert plan.variant == "dot" and plan.options.get("ALL_Q", False) == all_q, plan.options
        outs[all_q] = da.decode_paged_attention(q, lc, meta, D ** -0.5, num_splits=splits, variant="dot", merge=merge)
    assert torch.equal(outs[True], outs[False])
    ref = reference.paged_attention(q, lc, meta, D ** -0.5).float()
    tol = 1e-2 if "bfloat16" in (k_name, v_name) else ATOL  # a bf16 cache: bf16 dot operands
    assert ((outs[True].float() - ref).abs() - tol * ref.abs()).max().item() <= tol


def merge_case(k_name, v_name, D, lens, Hq, Hkv, dtype, means, device="cpu"):
    q, lc, meta = build_case(k_name, v_name, lens, Hq, Hkv, D, 16, dtype=dtype, device=device)
    if means:
        gen = torch.Generator().manual_seed(7)
        lc = dataclasses.replace(lc, k_mean=torch.randn(Hkv, D, generator=gen).to(device),
                                 v_mean=(torch.randn(Hkv, D, generator=gen) * 3).to(device))
    return q, lc, meta


def check_fused_merge(q, lc, meta, splits, variant, tol, prefetch=None):
    """The fused merge (the last split program merges) against `_merge_kernel` and the reference:
    the merge runs where planned, the counters are back to 0 afterwards, a second call returns the same
    bits (the counters were reset), and fused and separate outputs differ by at most one rounding of
    the output dtype (the same partials, summed in another order)."""
    from kvpack.kernels import decode_plan as dp
    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    D = q.shape[-1]
    kw = dict(num_splits=splits, variant=variant, prefetch=prefetch)
    fused_plan = plan_decode(q, lc, meta, D ** -0.5, merge="fused", **kw)
    assert fused_plan.merge_grid is None and fused_plan.args[-1] > 0, "the merge is not fused"
    kw["block_n"] = fused_plan.args[fused_plan.kernel.arg_names.index("BLOCK_N")]  # the same tiles (int4's differ)
    assert plan_decode(q, lc, meta, D ** -0.5, merge="separate", **kw).merge_grid is not None
    fused = decode_paged_attention(q, lc, meta, D ** -0.5, merge="fused", **kw)
    cnt = dp.merge_counters(q.device, 0)
    assert int(cnt.abs().sum()) == 0, "a counter was not put back to 0"
    again = decode_paged_attention(q, lc, meta, D ** -0.5, merge="fused", **kw)
    assert torch.equal(fused, again)
    separate = decode_paged_attention(q, lc, meta, D ** -0.5, merge="separate", **kw)
    ulp = torch.finfo(q.dtype).eps
    assert ((fused.float() - separate.float()).abs() - ulp * separate.float().abs()).max().item() <= 1e-6
    ref = reference.paged_attention(q, lc, meta, D ** -0.5).float()
    err = ((fused.float() - ref).abs() - tol * ref.abs()).max().item()
    assert err <= tol, (splits, variant, err)


@pytest.mark.parametrize("k_name,v_name,D,means,dtype", [
    ("float16", "float16", 64, False, torch.float16),
    ("int8", "int8", 64, True, torch.float16),           # + V mean in the fused merge
    ("int4", "int4", 128, True, torch.bfloat16),         # out @ R + mean in the fused merge, bf16 output
    ("int4", "int4", 96, False, torch.float16),          # head dim 96: padded rows, rotated
    ("fp8_e4m3", "int8", 64, False, torch.float16),
])
@pytest.mark.parametrize("splits,lane_budget", [(2, None), (5, None), (5, 1)])
def test_decode_fused_merge(k_name, v_name, D, means, dtype, splits, lane_budget, monkeypatch):
    """Fused split merge in the interpreter (the programs run one after another: the last split
    merges): GQA group 3 (padded to 4 merge rows), a 1-token sequence (its other splits are empty);
    lane_budget 1 reads one split per chunk (the online rescale across chunks)."""
    from kvpack.kernels import decode_plan as dp

    if lane_budget:
        monkeypatch.setattr(dp, "MERGE_ELEMS_PER_LANE", lane_budget)
        assert dp.merge_chunk(3, D, splits, 1)[1] == 1
    q, lc, meta = merge_case(k_name, v_name, D, [1, 300, 70], 6, 2, dtype, means)
    check_fused_merge(q, lc, meta, splits, "dot", 1e-2 if dtype == torch.bfloat16 else ATOL)


def test_decode_merge_choice(monkeypatch):
    """`choose_merge`: "auto" fuses 2 .. FUSED_MERGE_MAX_SPLITS splits of "dot" / "imma", never "frag"
    (measured no gain) nor one split; the environment variable, and a bad name (a clear error);
    `merge_chunk` keeps a power of two within the lane budget."""
    from kvpack.config import ConfigError
    from kvpack.kernels import decode_plan as dp

    assert not dp.choose_merge(1, "dot", "fused")
    for variant in ("dot", "imma"):
        assert dp.choose_merge(2, variant) and dp.choose_merge(dp.FUSED_MERGE_MAX_SPLITS, variant)
        assert not dp.choose_merge(dp.FUSED_MERGE_MAX_SPLITS + 1, variant)
    assert not dp.choose_merge(2, "frag") and dp.choose_merge(2, "frag", "fused")
    assert dp.choose_merge(100, "dot", "fused") and not dp.choose_merge(2, "dot", "separate")
    monkeypatch.setenv("KVPACK_DECODE_MERGE", "separate")
    assert not dp.choose_merge(2, "dot")
    monkeypatch.setenv("KVPACK_DECODE_MERGE", "fuse")
    with pytest.raises(ConfigError, match="decode merge 'fuse'.*auto, fused, separate"):
        dp.choose_merge(2, "dot")
    assert dp.merge_chunk(4, 128, 16, 1) == (4, 2)  # 32 fp32 a lane: 4 heads x 2 splits x 128 / 32
    assert dp.merge_chunk(3, 128, 2, 1) == (4, 2)  # no more than the splits
    assert dp.merge_chunk(16, 256, 8, 1) == (16, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("k_name,v_name,variant,prefetch", [
    ("bfloat16", "bfloat16", "dot", None), ("int8", "int8", "imma", None), ("int4", "int4", "dot", None),
    ("int8", "int8", "frag", 0), ("int8", "int8", "frag", 1), ("fp8_e4m3", "fp8_e4m3", "frag", 1),
    ("fp8_e5m2", "int8", "dot", None), ("int4", "int4", "fragt", 1), ("int8", "int8", "fragt", 0),
    ("fp8_e4m3", "fp8_e4m3", "fragt", 0)])
@pytest.mark.parametrize("splits", [2, 7, 16, 40])
def test_decode_fused_merge_gpu(k_name, v_name, variant, prefetch, splits):
    """The fused merge on the GPU, where programs race to the counter: Llama-3.1-8B heads, odd lengths,
    a V mean; each variant (frag with and without the ring) against the separate merge and the
    reference, twice in a row (the counters reset), and replayed from a CUDA graph."""
    from kvpack.kernels.decode_attention import decode_paged_attention

    bf16 = k_name == "bfloat16"
    dtype = torch.bfloat16 if bf16 else torch.float16
    q, lc, meta = merge_case(k_name, v_name, 128, [1, 17, 1000, 4099, 257, 8192], 32, 8, dtype,
                             not bf16, device="cuda")
    tol = 1e-2 if bf16 else ATOL
    check_fused_merge(q, lc, meta, splits, variant, tol, prefetch)
    run = lambda: decode_paged_attention(q, lc, meta, 128 ** -0.5, num_splits=splits, variant=variant,
                                         prefetch=prefetch, merge="fused")
    eager = run()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        out = run()
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@pytest.mark.parametrize("k_name,v_name,group_size,capped", [
    ("int4", "int4", 64, True), ("int4", "int4", 32, True), ("int4", "fp8_e4m3", 32, True), ("int8", "int8", 32, True),
    ("bfloat16", "bfloat16", 32, False)])
def test_small_head_register_cap(k_name, v_name, group_size, capped):
    """One-warp "dot" / "imma" programs of a quantized cache at head dim 64 are capped at the registers that let an
    SM hold the SMALL_HEAD_PER_SM programs `choose_num_splits` fills it with (SmolLM2's int4 with one group a head had
    compiled to 140 registers: 14 an SM, 1.4x the time, session 30); 16-bit caches and an explicit cap keep theirs."""
    from kvpack.kernels.decode_attention import SMALL_HEAD_MAXNREG, plan_decode
    from kvpack.kernels.decode_plan import SMALL_HEAD_PER_SM

    assert SMALL_HEAD_MAXNREG * 32 * SMALL_HEAD_PER_SM == 65536
    q, lc, meta = build_case(k_name, v_name, [70, 33], 9, 3, 64, 16, group_size=group_size)
    plan = plan_decode(q, lc, meta, 0.125)
    assert plan.options["num_warps"] == 1
    assert plan.options.get("maxnreg") == (SMALL_HEAD_MAXNREG if capped else None), plan.options
    assert plan_decode(q, lc, meta, 0.125, maxnreg=200).options["maxnreg"] == 200
    if capped:  # head dim 128 keeps the compiler's choice
        q, lc, meta = build_case(k_name, v_name, [70, 33], 8, 2, 128, 16, group_size=group_size)
        assert "maxnreg" not in plan_decode(q, lc, meta, 0.125, variant="dot").options


@pytest.mark.parametrize("D,group_size", [(128, 128), (64, 64)])
def test_decode_int4_one_group_per_head(D, group_size):
    """--int4-group-size 128: one group covers both nibble halves, split or not; its parameters are
    broadcast to each half (`int4_group_path` "broadcast"), not gathered per channel (SmolLM2's head dim 64: 2.2x the time of
    groups of 32 while they were, session 30)."""
    from kvpack.kernels.decode_plan import INT4_GROUP_PATHS, _side_args

    for k_name, v_name, splits in (("int4", "int4", 1), ("int8", "int4", 3)):
        q, lc, meta = build_case(k_name, v_name, [37, 1, 70], 9, 3, D, 16, group_size=group_size)
        assert _side_args(lc.v)[1][3] == INT4_GROUP_PATHS.index("broadcast"), "one group a head: broadcast"
        check(k_name, v_name, [37, 1, 70], D=D, group_size=group_size, num_splits=splits)
    q, lc, meta = build_case("int4", "int4", [5], 9, 3, 96, 16, group_size=32)
    assert _side_args(lc.v)[1][3] == INT4_GROUP_PATHS.index("chunk"), "head dim 96: groups of 32 straddle the halves"


@pytest.mark.parametrize("group,Hkv", [(1, 2), (3, 1), (8, 1)])
def test_decode_gqa_ratios(group, Hkv):
    check("int8", "int4", [29, 64], Hq=group * Hkv, Hkv=Hkv)


@pytest.mark.parametrize("D,block_size", [(80, 16), (128, 32), (96, 32)])
def test_decode_head_dims(D, block_size):
    check("int4", "fp8_e4m3", [40, 5], D=D, block_size=block_size, num_splits=2)


@pytest.mark.parametrize("D,group_size", [(80, 16), (96, 32), (96, 16)])
def test_decode_int4_chunks(D, group_size):
    """Head dims 80 and 96: groups straddle the nibble halves, and each half's chunks take their group's parameters
    (`int4_group_path` "chunk"); head dim 80's 40-byte code rows load 8 bytes at a time; each half's first 32
    channels and the rest of both halves as a third tile (`int4_parts`). Odd lengths (masked last tiles), 1 and 3
    splits, int4 on both sides and beside int8, the default 64-token tiles and 32."""
    from kvpack.kernels.decode_plan import INT4_GROUP_PATHS, _side_args

    from kvpack.kernels.decode_attention import decode_paged_attention, plan_decode

    scale = D ** -0.5
    for k_name, v_name, splits, block_n in (("int4", "int4", 1, None), ("int4", "int4", 3, 32), ("int8", "int4", 3, None)):
        q, lc, meta = build_case(k_name, v_name, [77, 1, 130], 4, 2, D, 16, group_size=group_size)
        assert _side_args(lc.v)[1][3] == INT4_GROUP_PATHS.index("chunk")
        plan = plan_decode(q, lc, meta, scale, num_splits=splits, block_n=block_n)
        assert plan.args[plan.kernel.arg_names.index("BLOCK_N")] == (block_n or 64)
        # in parts: 40 = 32 + 8 channels a half (a 16-wide third tile), 48 = 32 + 16 (32 wide)
        assert plan.options["V4P"] == 2 * (D // 2 - 32) and plan.options.get("K4P", 0) == (
            plan.options["V4P"] if k_name == "int4" else 0), plan.options
        ref = reference.paged_attention(q, lc, meta, scale).float()
        out = decode_paged_attention(q, lc, meta, scale, num_splits=splits, block_n=block_n).float()
        err = ((out - ref).abs() - RTOL * ref.abs()).max().item()
        assert err <= ATOL, (k_name, v_name, splits, block_n, err)


@pytest.mark.parametrize("D", [80, 96])
def test_decode_two_part_head(D):
    """Head dims 80 and 96 with 8-bit codes: "dot" takes the head as 64 + 16 / 32 channels instead of padding it to
    128 (`two_part_head`), also for int8 K where "auto" would have taken "imma" (padded), with rotated FP8 sides (q
    and the output rotated per part: whole Hadamard blocks), a V mean (centering), one split (the kernel's epilogue
    rotates) and three (the merge does), fused or not; and against the same plan padded (KVPACK_DECODE_TWO_PART=0)."""
    import kvpack.kernels.decode_attention as da

    scale = D ** -0.5
    cases = (("int8", "int8", None), ("int8-static", "fp8_e4m3", None), ("fp8_e4m3", "fp8_e5m2", None),
             ("fp8_e5m2", "bfloat16", None), ("int8", "fp8_e4m3", "v"))
    for k_name, v_name, center in cases:
        q, lc, meta = build_case(k_name, v_name, [77, 1, 130], 8, 2, D, 16)
        if center:  # a V mean, added to the output (the epilogue or the merge)
            gen = torch.Generator().manual_seed(7)
            lc = dataclasses.replace(lc, v_mean=torch.randn(2, D, generator=gen) * 3)
        for splits, merge in ((1, None), (3, "fused"), (3, "separate")):
            plan = da.plan_decode(q, lc, meta, scale, num_splits=splits, merge=merge)
            assert plan.variant == "dot" and plan.options["D_B"] == D - 64, (k_name, v_name, plan.variant)
            ref = reference.paged_attention(q, lc, meta, scale).float()
            out = da.decode_paged_attention(q, lc, meta, scale, num_splits=splits, merge=merge).float()
            err = ((out - ref).abs() - RTOL * ref.abs()).max().item()
            assert err <= ATOL, (k_name, v_name, splits, merge, err)
    assert da.two_part_head("imma", lc.k, lc.v) == 0 and da.two_part_head("dot", lc.k, lc.v) == D - 64
    q, lc, meta = build_case("int4", "int8", [9], 8, 2, D, 16)
    assert da.two_part_head("dot", lc.k, lc.v) == 0  # int4 keeps its halves
    q, lc, meta = build_case("bfloat16", "bfloat16", [9], 8, 2, D, 16)
    # 16-bit: 96 = 64 + 32 (H200, bf16, 8 x 4096: 114.4 -> 104.3 us a layer), 80 padded (32 x 2048: 169.7 -> 181.0)
    assert da.two_part_head("dot", lc.k, lc.v) == (32 if D == 96 else 0)


@pytest.mark.parametrize("k_name,v_name", [("bfloat16", "bfloat16"), ("int4", "bfloat16")])
def test_decode_bf16(k_name, v_name):
    """bf16 q and bf16 caches: outputs round to bf16 (one ulp is 7.8e-3 at magnitude 1-2), and the
    interpreter truncates fp32 -> bf16 (p), hence 1e-2 absolute + 1e-2 relative."""
    check(k_name, v_name, [70, 9], dtype=torch.bfloat16, atol=1e-2, rtol=1e-2, num_splits=2)


def test_decode_heuristic_splits_and_one_token():
    check("int8", "int8", [1])
    check("fp8_e5m2", "int4", [300, 1, 2], num_splits=None)


def test_decode_detects_wrong_cache():
    """The comparison can fail: corrupt one K code and the check must trip."""
    q, lc, meta = build_case("int8", "int8", [20], 4, 2, 64, 16)
    from kvpack.kernels.decode_attention import decode_paged_attention

    ref = reference.paged_attention(q, lc, meta, 0.125).float()
    blk = int(meta.block_tables[0, 0])
    lc.k.codes[blk, :, 3] = 127
    out = decode_paged_attention(q, lc, meta, 0.125, num_splits=1).float()
    assert (out - ref).abs().max().item() > ATOL


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("name", ["bfloat16", "float16", "int8", "int8-static", "int4", "fp8_e4m3",
                                  "fp8_e4m3-static", "fp8_e5m2"])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_decode_gpu_large(name, D, block_size):
    _decode_gpu_large(name, D, block_size)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_decode_gpu_int4_group_128(D):
    _decode_gpu_large("int4", D, 16, group_size=128)


def _decode_gpu_large(name, D, block_size, **kw):
    bf16 = name == "bfloat16"
    check(name, name, [1, 17, 1000, 4099, 257], Hq=32, Hkv=8, D=D, block_size=block_size, device="cuda",
          dtype=torch.bfloat16 if bf16 else torch.float16, atol=1e-2 if bf16 else ATOL,
          rtol=1e-2 if bf16 else RTOL, **kw)


@triton.jit
def _conv_kernel(c_ptr, o_ptr):
    i = tl.arange(0, 256)
    c = tl.load(c_ptr + i)
    tl.store(o_ptr + i, int8_to_f16(c.to(tl.int8, bitcast=True)))
    lo, hi = int4_to_f16(c)
    tl.store(o_ptr + 256 + i, lo)
    tl.store(o_ptr + 512 + i, hi)
    tl.store(o_ptr + 768 + i, fp8_decode_f16(c, K_FMT_FP8E4M3))
    tl.store(o_ptr + 1024 + i, fp8_decode_f16(c, K_FMT_FP8E5M2))


def test_f16_conversions_every_code():
    """quant.int8_to_f16 / int4_to_f16 / fp8_decode_f16 on all 256 byte values against torch
    (the interpreter runs the plain-Triton fallbacks, the GPU the PTX byte-permute versions)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(dev)
    out = torch.empty(5 * 256, dtype=torch.float16, device=dev)
    _conv_kernel[(1,)](codes, out)
    out = out.float().cpu()
    c = torch.arange(256)
    assert torch.equal(out[:256], c.to(torch.uint8).view(torch.int8).float())
    assert torch.equal(out[256:512], (c & 15).float())
    assert torch.equal(out[512:768], (c >> 4).float())
    for k, name in ((3, "fp8_e4m3"), (4, "fp8_e5m2")):
        ref = fp8_decode(c.to(torch.uint8), name)
        got = out[256 * k: 256 * (k + 1)] * (256.0 if name == "fp8_e4m3" else 1.0)
        finite = ref.isfinite()
        assert torch.equal(got[finite], ref[finite]), name
        assert torch.equal(torch.signbit(got[finite]), torch.signbit(ref[finite])), name


def _run_ptx(asm: str, word: int) -> list[int]:
    """Emulate the few PTX instructions the e4m3 decode uses (mov, prmt default mode with sign
    replication, shl, shr, and, or) on one 32-bit input word: the outputs $0, $1."""
    import re

    regs, mask = {"$2": word}, 0xFFFFFFFF
    val = lambda t: int(t, 16) if t.startswith("0x") else (int(t) if t.isdigit() else regs[t])  # noqa: E731
    for op, args in re.findall(r"^(\w+)\.b32 ([^;]+);", asm, re.M):
        d, *src = [a.strip() for a in args.split(",")]
        x = [val(a) for a in src]
        if op == "mov":
            regs[d] = x[0]
        elif op == "prmt":
            by = [(x[0] >> 8 * i) & 255 for i in range(4)] + [(x[1] >> 8 * i) & 255 for i in range(4)]
            out = 0
            for i in range(4):
                sel = (x[2] >> 4 * i) & 15
                b = by[sel & 7]
                out |= ((255 if b & 128 else 0) if sel & 8 else b) << 8 * i
            regs[d] = out
        elif op in ("shl", "shr"):
            regs[d] = ((x[0] << x[1]) if op == "shl" else (x[0] >> x[1])) & mask
        elif op == "and":
            regs[d] = x[0] & x[1]
        elif op == "or":
            regs[d] = x[0] | x[1]
        else:
            raise AssertionError(f"unemulated PTX op {op}")
    return [regs["$0"], regs["$1"]]


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_f16_asm_bits_every_code(name):
    """The fp8 -> fp16 inline PTX (run on GPUs only) emulated on the CPU: every code in every byte of
    the input register gives the fp16 bits of decode(code) / factor (fp8_decode as the oracle; e4m3
    NaN codes excepted: documented to decode to finite values there)."""
    from kvpack.kernels.quant import _ASM_E4M3_F16, _ASM_E5M2_F16

    asm = (_ASM_E4M3_F16 if name == "fp8_e4m3" else _ASM_E5M2_F16).value
    codes = torch.arange(256)
    factor = 256 if name == "fp8_e4m3" else 1
    value = fp8_decode(codes.to(torch.uint8), name)
    want = (value / factor).half().view(torch.int16).int() & 0xFFFF
    nan = value.isnan()  # e4m3: decoded finite by the PTX (documented); e5m2: any fp16 NaN pattern
    for pos in range(4):
        for c in range(256):
            word = (0xA5C35A17 & ~(0xFF << 8 * pos)) | c << 8 * pos
            out = _run_ptx(asm, word)
            got = (out[pos // 2] >> 16 * (pos % 2)) & 0xFFFF
            if not nan[c]:
                assert got == want[c].item(), (pos, c, hex(got), hex(want[c].item()))
            elif name == "fp8_e5m2":
                assert got & 0x7C00 == 0x7C00 and got & 0x3FF, (pos, c, hex(got))


# ---- variant selection -----------------------------------------------------------------------
def test_variant_selection(monkeypatch):
    from kvpack.config import ConfigError
    from kvpack.kernels.decode_attention import _decode_kernel, choose_variant, plan_decode

    monkeypatch.delenv("KVPACK_DECODE_VARIANT", raising=False)
    assert choose_variant("int8", "int4") == "imma"  # "auto" (measured: results/attention_tune_s6)
    assert choose_variant("int8", "float") == "imma"
    assert choose_variant("int4", "int8") == "dot"
    assert choose_variant("int4", "int4") == "fragt"  # session 18 (results/attention_s18)
    assert choose_variant("int4", "int4", "fragt") == "fragt"
    assert choose_variant("int8", "int8", "fragt") == "fragt"  # 8-bit codes too, when asked for
    assert choose_variant("int8", "int4", "fragt") == "frag"  # not int4 on one side only
    assert choose_variant("fp8_e4m3", "fp8_e5m2") == "frag?"  # plan_decode decides on the split length
    assert choose_variant("fp8_e4m3", "int8") == "frag?"  # 8-bit codes on both sides
    assert choose_variant("int8", "int8") == "frag?"  # session 7: frag-int8 faster on long splits
    assert choose_variant("fp8_e4m3", "int4") == "dot"
    assert choose_variant("int4", "int4", "imma") == "dot"  # imma needs int8 K
    assert choose_variant("float", "int8", "frag") == "dot"  # frag needs 8-bit or int4 codes on both sides
    assert choose_variant("float", "int4", "frag") == "dot"
    assert choose_variant("int8", "float", "frag") == "imma"  # ... else the fallback
    assert choose_variant("int8", "int4", "frag") == "frag"  # int4 (session 16): when asked for
    monkeypatch.setenv("KVPACK_DECODE_VARIANT", "dot")
    assert choose_variant("int8", "fp8_e5m2") == "dot"
    assert choose_variant("int8", "int8", "imma") == "imma"  # an explicit argument wins
    q, lc, meta = build_case("int8", "int4", [20], 4, 2, 64, 16)
    assert plan_decode(q, lc, meta, 0.1).variant == "dot"
    assert plan_decode(q, lc, meta, 0.1, variant="imma").kernel is _decode_kernel
    for gone in ("fast", "fma", "dott"):  # the last two: removed in session 6
        monkeypatch.setenv("KVPACK_DECODE_VARIANT", gone)
        with pytest.raises(ConfigError, match="KVPACK_DECODE_VARIANT"):
            choose_variant("int8", "int8")


@pytest.mark.parametrize("variant", ["dot", "imma"])
def test_decode_empty_batch(variant):
    from kvpack.kernels.decode_attention import decode_paged_attention

    q, lc, _ = build_case("int8", "int4", [5], 4, 2, 64, 16)
    out = decode_paged_attention(q[:0], lc, AttentionMetadata.build([], [], [], 16), 0.1, variant=variant)
    assert out.shape == (0, 4, 64) and out.dtype == q.dtype


def test_int4_tile_plan():
    """int4 K and V at head_dim 128 plan 32-token tiles (the 64-token tile spilled), except where the
    merge is fused (2-4 splits: 64 measured faster there); other formats and head dims keep theirs; a
    block_n given by the caller is kept."""
    from kvpack.kernels.decode_attention import plan_decode

    def tile(name, D, lens, splits, **kw):
        q, lc, meta = build_case(name, name, lens, 8, 2, D, 16)
        plan = plan_decode(q, lc, meta, 0.1, num_splits=splits, **kw)
        return plan.args[plan.kernel.arg_names.index("BLOCK_N")], plan.merge_grid is None and plan.grid[2] > 1

    assert tile("int4", 128, [700, 9], 1) == (32, False)
    assert tile("int4", 128, [700, 9], 3) == (64, True)
    assert tile("int4", 128, [700, 9], 3, merge="separate") == (32, False)
    assert tile("int4", 128, [700, 9], 8) == (32, False)
    assert tile("int4", 128, [700, 9], 3, block_n=32) == (32, True)
    assert tile("int4", 64, [700, 9], 3) == (32, True)
    assert tile("int8", 128, [700, 9], 1) == (64, False)


def test_int4_group_path():
    """`decode_plan.int4_group_path` (what `_side_args` plans for `_load_int4`) per head dim and group."""
    from kvpack.formats import resolve_format
    from kvpack.kernels.decode_plan import int4_group_path

    want = {(64, 32): "broadcast", (64, 64): "broadcast", (128, 128): "broadcast", (256, 32): "broadcast",
            (96, 32): "chunk", (96, 16): "chunk", (80, 16): "chunk", (80, 32): "chunk"}
    for (d, g), path in want.items():
        fmt = resolve_format("int4", head_dim=d, int4_group_size=g)
        assert int4_group_path(fmt) == path, (d, g, fmt.group_size)
    assert int4_group_path(resolve_format("int8", head_dim=80)) is None
