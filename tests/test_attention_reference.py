"""The reference paged attention against dense oracles.

Tiers (STYLE.md): (c) quantized paged attention == dense attention on dequantize(quantize(x)),
for every format; (d) quantized attention within a measured tolerance of full precision.
The dense oracle is torch SDPA with an explicit boolean causal mask, in float32, on the whole
sequence's K/V held contiguously (no paging), GQA by repeating kv heads.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kvpack.attention import Attention, AttentionMetadata, LayerKVCache, allocate_pool
from kvpack.attention import reference as ref
from kvpack.formats import hadamard_transform, resolve_format

# (num_kv_heads, gqa group, head_dim, block_size): GQA 1, 3, 4, 8; head dims 64, 80, 128; blocks 16, 32
SHAPES = [(2, 1, 64, 16), (1, 3, 80, 32), (2, 4, 128, 16), (1, 8, 64, 32), (2, 3, 128, 32), (3, 4, 80, 16)]
# (cached prefix, new tokens) per sequence: chunked prefill over a prefix, whole prefills, decodes,
# one-token sequences, lengths off the block size
BATCH = [(21, 13), (0, 37), (40, 1), (0, 1), (16, 1), (5, 27), (63, 1)]
FORMATS = ["float32", "bfloat16", "float16", "int8", "int4", "fp8_e4m3", "fp8_e5m2"]


def sdpa_oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [Q, Hq, D]; k, v: [S, Hkv, D] float32, query i at position S - Q + i -> [Q, Hq, D]."""
    nq, hq, _ = q.shape
    s, hkv, _ = k.shape
    k = k.repeat_interleave(hq // hkv, dim=1)  # q head h reads kv head h // group
    v = v.repeat_interleave(hq // hkv, dim=1)
    mask = torch.arange(s)[None, :] <= torch.arange(s - nq, s)[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


def roundtrip(fmt, x: torch.Tensor, static_scale=None) -> torch.Tensor:
    """What the cache gives back for x, rotated back to the original basis: [S, H, D] float32."""
    r = fmt.rotation("cpu")
    xr = hadamard_transform(x) if r is not None else x  # the storage rotation (bit-exact order)
    y = fmt.dequantize(*fmt.quantize(xr, static_scale), static_scale)
    return y @ r if r is not None else y


def make_batch(spec, hkv, group, d, bs, seed):
    """Random per-sequence q/k/v and a shuffled, disjoint block table per sequence."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for prefix, new in spec:
        s = prefix + new
        seqs.append(dict(prefix=prefix, new=new,
                         q=torch.randn(new, hkv * group, d, generator=g),
                         k=torch.randn(s, hkv, d, generator=g),
                         v=torch.randn(s, hkv, d, generator=g)))
    need = sum(math.ceil((x["prefix"] + x["new"]) / bs) for x in seqs)
    num_blocks = need + 5
    perm = torch.randperm(num_blocks, generator=g).tolist()
    for x in seqs:
        n = math.ceil((x["prefix"] + x["new"]) / bs)
        x["table"], perm = perm[:n], perm[n:]
    return seqs, num_blocks


def make_cache(k_fmt, v_fmt, num_blocks, hkv, bs, static=(None, None)):
    return LayerKVCache(k=allocate_pool(k_fmt, num_blocks, hkv, bs, "cpu", static[0]),
                        v=allocate_pool(v_fmt, num_blocks, hkv, bs, "cpu", static[1]))


def run_paged(seqs, cache, bs, scale, q_dtype=torch.float32):
    """Write each cached prefix in two earlier calls (two chunks), then run one mixed step:
    write the new tokens, paged-attend. Returns the step's output [T, Hq, D]."""
    for lo, hi in ((0, 0.5), (0.5, 1.0)):
        part = [(x, int(x["prefix"] * lo), int(x["prefix"] * hi)) for x in seqs]
        part = [(x, a, b) for x, a, b in part if b > a]
        if part:
            md = AttentionMetadata.build([b - a for _, a, b in part], [b for _, _, b in part],
                                         [x["table"] for x, _, _ in part], bs)
            ref.write_kv(torch.cat([x["k"][a:b] for x, a, b in part]),
                         torch.cat([x["v"][a:b] for x, a, b in part]), cache, md.slot_mapping)
    md = AttentionMetadata.build([x["new"] for x in seqs], [x["prefix"] + x["new"] for x in seqs],
                                 [x["table"] for x in seqs], bs)
    ref.write_kv(torch.cat([x["k"][x["prefix"]:] for x in seqs]),
                 torch.cat([x["v"][x["prefix"]:] for x in seqs]), cache, md.slot_mapping)
    return ref.paged_attention(torch.cat([x["q"] for x in seqs]).to(q_dtype), cache, md, scale)


def oracle(seqs, scale, kmap=lambda k: k, vmap=lambda v: v):
    return torch.cat([sdpa_oracle(x["q"], kmap(x["k"]), vmap(x["v"]), scale) for x in seqs])


@pytest.mark.parametrize("hkv,group,d,bs", SHAPES)
def test_paged_float32_equals_dense(hkv, group, d, bs):
    seqs, nb = make_batch(BATCH, hkv, group, d, bs, seed=d + bs + group)
    fmt = resolve_format("float32", head_dim=d)
    cache = make_cache(fmt, fmt, nb, hkv, bs)
    scale = d ** -0.5
    out = run_paged(seqs, cache, bs, scale)
    assert out.dtype == torch.float32 and out.shape == (sum(n for _, n in BATCH), hkv * group, d)
    torch.testing.assert_close(out, oracle(seqs, scale), atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt_name", FORMATS)
@pytest.mark.parametrize("hkv,group,d,bs", [SHAPES[1], SHAPES[2]])
def test_quantized_equals_dequantize_then_attend(fmt_name, hkv, group, d, bs):
    seqs, nb = make_batch(BATCH, hkv, group, d, bs, seed=7)
    fmt = resolve_format(fmt_name, head_dim=d)
    cache = make_cache(fmt, fmt, nb, hkv, bs)
    scale = d ** -0.5
    out = run_paged(seqs, cache, bs, scale)
    want = oracle(seqs, scale, lambda k: roundtrip(fmt, k), lambda v: roundtrip(fmt, v))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("k_name,v_name", [("int4", "int8"), ("fp8_e4m3", "int4"), ("int8", "bfloat16"),
                                           ("fp8_e5m2", "float16")])
def test_k_and_v_in_different_formats(k_name, v_name):
    hkv, group, d, bs = SHAPES[0]
    seqs, nb = make_batch(BATCH, hkv, group, d, bs, seed=11)
    k_fmt, v_fmt = resolve_format(k_name, head_dim=d), resolve_format(v_name, head_dim=d)
    cache = make_cache(k_fmt, v_fmt, nb, hkv, bs)
    out = run_paged(seqs, cache, bs, 0.1)
    want = oracle(seqs, 0.1, lambda k: roundtrip(k_fmt, k), lambda v: roundtrip(v_fmt, v))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt_name", ["int8", "fp8_e4m3", "fp8_e5m2"])
def test_static_scales(fmt_name):
    """Static per-head scales at 0.8x the absmax, so the largest values clamp/saturate."""
    hkv, group, d, bs = SHAPES[5]
    seqs, nb = make_batch(BATCH, hkv, group, d, bs, seed=3)
    fmt = resolve_format(fmt_name, head_dim=d, static=True)
    assert fmt.scale_mode == "static"
    ks, vs = (0.8 * torch.cat([x[n] for x in seqs]).abs().amax(dim=(0, 2)) / fmt.qmax for n in "kv")
    cache = make_cache(fmt, fmt, nb, hkv, bs, (ks, vs))
    assert cache.k.scales is None and cache.k.zeros is None
    out = run_paged(seqs, cache, bs, d ** -0.5)
    want = oracle(seqs, d ** -0.5, lambda k: roundtrip(fmt, k, ks), lambda v: roundtrip(fmt, v, vs))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("d", [64, 80])
def test_int4_rotation_matches_explicitly_rotated_oracle(d):
    """The cache holds x @ R; an oracle that attends in the rotated basis (q @ R, out @ R)
    must give the paged result, and R must be orthogonal and symmetric."""
    hkv, group, bs = 2, 4, 16
    seqs, nb = make_batch(BATCH, hkv, group, d, bs, seed=d)
    fmt = resolve_format("int4", head_dim=d, rotate=True)
    r = fmt.rotation("cpu")
    torch.testing.assert_close(r @ r, torch.eye(d), atol=1e-6, rtol=0)
    torch.testing.assert_close(r, r.T, atol=0, rtol=0)
    cache = make_cache(fmt, fmt, nb, hkv, bs)
    out = run_paged(seqs, cache, bs, d ** -0.5)

    def stored(x):  # what the cache holds, dequantized, in the rotated basis
        return fmt.dequantize(*fmt.quantize(hadamard_transform(x)))  # x @ r, in the storage order

    want = torch.cat([sdpa_oracle(x["q"] @ r, stored(x["k"]), stored(x["v"]), d ** -0.5) @ r for x in seqs])
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    # Rotation off is a different format with a different (worse) error, same contract.
    plain = resolve_format("int4", head_dim=d, rotate=False)
    assert plain.rotation("cpu") is None
    out_plain = run_paged(seqs, make_cache(plain, plain, nb, hkv, bs), bs, d ** -0.5)
    want_plain = oracle(seqs, d ** -0.5, lambda k: roundtrip(plain, k), lambda v: roundtrip(plain, v))
    torch.testing.assert_close(out_plain, want_plain, atol=1e-5, rtol=0)


# Bounds on the relative L2 error of the attention output vs float32 (random normal q/k/v,
# head_dim 128, GQA 4, the BATCH mix), about 2x what was measured; see the docstring below.
REL_TOL = {"bfloat16": 4e-3, "float16": 5e-4, "int8": 1.5e-2, "fp8_e4m3": 6e-2, "fp8_e5m2": 1.2e-1,
           "int4": 2e-1}


def rel_error_vs_float32(fmt_name, seed, outliers=False, rotate=True):
    hkv, group, d, bs = SHAPES[2]
    seqs, nb = make_batch(BATCH, hkv, group, d, bs, seed=seed)
    if outliers:  # one K channel and one V channel 20x larger, as real K caches have
        for x in seqs:
            x["k"][..., 3] *= 20
            x["v"][..., 70] *= 20
    full = resolve_format("float32", head_dim=d)
    fmt = resolve_format(fmt_name, head_dim=d, rotate=rotate)
    base = run_paged(seqs, make_cache(full, full, nb, hkv, bs), bs, d ** -0.5)
    out = run_paged(seqs, make_cache(fmt, fmt, nb, hkv, bs), bs, d ** -0.5)
    return ((out - base).norm() / base.norm()).item()


@pytest.mark.parametrize("fmt_name", list(REL_TOL))
def test_quantized_close_to_full_precision(fmt_name):
    """||out_fmt - out_fp32|| / ||out_fp32|| on random normal data (D=128, GQA 4, block 16).

    Measured over seeds 5, 6, 7 (torch 2.13 CPU): bfloat16 2.0e-3, float16 2.6e-4, int8 7.8e-3..8.0e-3,
    fp8_e4m3 3.1e-2..3.2e-2, fp8_e5m2 6.3e-2..6.4e-2, int4 (rotated, group 32) 9.6e-2..9.8e-2.
    """
    rel = rel_error_vs_float32(fmt_name, seed=5)
    assert 0 < rel < REL_TOL[fmt_name], rel


def test_int4_rotation_reduces_error_with_outlier_channels():
    """With a 20x outlier channel in K and in V, measured (seeds 5, 6, 7): int4 rotated
    1.09e-1..1.18e-1, int4 unrotated 1.93e-1..2.10e-1 (int8: 4.0e-2..4.6e-2)."""
    rotated = rel_error_vs_float32("int4", seed=6, outliers=True)
    plain = rel_error_vs_float32("int4", seed=6, outliers=True, rotate=False)
    assert rotated < 0.15 and rotated < 0.7 * plain, (rotated, plain)


def test_output_in_q_dtype_and_layer_paths_agree():
    """bf16 q -> bf16 out; the Attention layer with a cache == without a cache (whole prefills),
    accepting [T, H*D] inputs."""
    hkv, group, d, bs = 2, 3, 64, 16
    spec = [(0, 20), (0, 1), (0, 33)]
    seqs, nb = make_batch(spec, hkv, group, d, bs, seed=1)
    fmt = resolve_format("float32", head_dim=d)
    out = run_paged(seqs, make_cache(fmt, fmt, nb, hkv, bs), bs, 0.125, q_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    md = AttentionMetadata.build([n for _, n in spec], [n for _, n in spec], [x["table"] for x in seqs], bs)
    q, k, v = (torch.cat([x[n] for x in seqs]) for n in "qkv")
    t = q.shape[0]
    layer = Attention(hkv * group, hkv, d, 0.125)
    with_cache = layer(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1),
                       make_cache(fmt, fmt, nb, hkv, bs), md)
    without = layer(q, k, v, None, md)
    assert with_cache.shape == (t, hkv * group * d)
    torch.testing.assert_close(with_cache, without, atol=1e-5, rtol=0)
    torch.testing.assert_close(without, oracle(seqs, 0.125).reshape(t, -1), atol=1e-5, rtol=0)
    chunked = AttentionMetadata.build([5], [20], [seqs[0]["table"]], bs)
    with pytest.raises(Exception, match="whole sequences"):
        layer(q[:5], k[:5], v[:5], None, chunked)
