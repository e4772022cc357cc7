"""Tier (b): the Triton prefill/mixed-batch paged attention kernel equals the PyTorch reference.

Oracle: `kvpack.attention.reference.paged_attention` on the same cache, computed in float32 from
the same (fp16/fp32) q. Tolerances: fp32 operands (input_precision="ieee") 2e-5 abs (summation
order only); fp16 operands 3e-3 abs + 3e-3 rel (p, the dequantized K/V and the output are rounded
to fp16, 2^-11 relative, against values of magnitude <= ~4); bf16 (GPU only) 2e-2 abs + 2e-2 rel
(the same roundings at 2^-9). Unused cache slots are filled with
NaN (float caches) or random codes and NaN scales, so a read outside the causal window shows.
CPU runs go through the Triton interpreter (tests/conftest.py) on small shapes.
"""

from __future__ import annotations

import random

import pytest
import torch

from kvpack.attention import reference
from kvpack.attention.kv_cache import LayerKVCache, allocate_pool
from kvpack.attention.metadata import AttentionMetadata
from kvpack.config import KVPackError
from kvpack.formats import hadamard_transform, resolve_format
from kvpack.kernels.prefill_attention import TileConfig, build_tile_map, prefill_paged_attention

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=2e-5, rtol=0), torch.float16: dict(atol=3e-3, rtol=3e-3),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _fill_garbage(pool) -> None:
    if pool.codes.dtype.is_floating_point:
        pool.codes.fill_(float("nan"))
    else:
        pool.codes.copy_(torch.randint(0, 100, pool.codes.shape, dtype=torch.uint8).view(pool.codes.dtype)
                         if pool.codes.dtype == torch.uint8 else torch.randint(-100, 100, pool.codes.shape,
                                                                             dtype=torch.int8))
    for t in (pool.scales, pool.zeros):
        if t is not None:
            t.fill_(float("nan"))


def run_case(k_name, v_name, *, q_lens, seq_lens, head_dim=64, hq=4, hkv=2, block_size=16,
             dtype=torch.float16, static=False, rotate=True, config=None, seed=0, device=DEV,
             attention=None, q_scale=1.0, int4_group_size=32, workspace=False, means=False):
    """Build a shuffled paged cache, write every position with the reference, attend with both.
    workspace: the prefill workspace (`AttentionMetadata.build`'s argument: False never, True
    always, None its rule); means: centered K and V. Returns (kernel output, reference output), both float32 [T, Hq, D]."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    fk = resolve_format(k_name, head_dim=head_dim, static=static, rotate=rotate, model_dtype=dtype,
                        int4_group_size=int4_group_size)
    fv = resolve_format(v_name, head_dim=head_dim, static=static, rotate=rotate, model_dtype=dtype,
                        int4_group_size=int4_group_size)
    nblk = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(nblk) + 3
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    tables, i = [], 0
    for n in nblk:
        tables.append(ids[i:i + n])
        i += n

    def static_scale(f):
        if f.scale_mode != "static":
            return None
        return (torch.rand(hkv, generator=gen) + 0.5) * 4.0 / f.qmax  # absmax ~ 2..6 over qmax

    kp = allocate_pool(fk, num_blocks, hkv, block_size, device, static_scale(fk))
    vp = allocate_pool(fv, num_blocks, hkv, block_size, device, static_scale(fv))
    _fill_garbage(kp)
    _fill_garbage(vp)
    layer = LayerKVCache(kp, vp)
    if means:  # centered K and V (the layer's means, subtracted before quantization)
        layer = LayerKVCache(kp, vp, torch.randn(hkv, head_dim, generator=gen).to(device),
                             torch.randn(hkv, head_dim, generator=gen).to(device))
    every = AttentionMetadata.build(list(seq_lens), list(seq_lens), tables, block_size, device)
    k = torch.randn(sum(seq_lens), hkv, head_dim, generator=gen).to(device)
    v = torch.randn(sum(seq_lens), hkv, head_dim, generator=gen).to(device)
    reference.write_kv(k, v, layer, every.slot_mapping)
    meta = AttentionMetadata.build(list(q_lens), list(seq_lens), tables, block_size, device, workspace=workspace)
    assert (meta.workspace is not None) == bool(workspace) or workspace is None
    q = (torch.randn(sum(q_lens), hq, head_dim, generator=gen) * q_scale).to(device=device, dtype=dtype)
    scale = head_dim ** -0.5
    ref = reference.paged_attention(q.float(), layer, meta, scale)
    if attention is not None:
        out = attention(q, layer, meta, scale).float()
    else:
        out = prefill_paged_attention(q, layer, meta, scale, config=config).float()
    return out, ref


# A mixed batch: a chunk over a cached prefix, decodes, a whole prompt from 0, a one-token prompt.
MIXED = dict(q_lens=(21, 1, 9, 1, 1), seq_lens=(50, 37, 9, 1, 17))


FORMATS = [
    ("float32", "float32", False), ("int8", "int8", False), ("int8", "int8", True),
    ("int4", "int4", False), ("fp8_e4m3", "fp8_e4m3", False), ("fp8_e5m2", "fp8_e5m2", False),
    ("fp8_e4m3", "fp8_e5m2", True), ("int4", "fp8_e4m3", False), ("int8", "int4", False),
    ("fp8_e5m2", "float32", False), ("float32", "int4", False),
]


@pytest.mark.parametrize("k_name,v_name,static", FORMATS)
def test_formats_fp32_operands(k_name, v_name, static):
    """fp32 operands: the dequantization, paging and masking logic matches to rounding order."""
    out, ref = run_case(k_name, v_name, static=static, dtype=torch.float32, **MIXED)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


@pytest.mark.parametrize("k_name,v_name,static", FORMATS[1:] + [("float16", "float16", False)])
def test_formats_fp16_operands(k_name, v_name, static):
    out, ref = run_case(k_name, v_name, static=static, dtype=torch.float16, seed=1, **MIXED)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])


@pytest.mark.parametrize("k_name,v_name", [("int8", "int4"), ("fp8_e4m3", "fp8_e5m2"), ("int4", "int8")])
def test_bf16_q_with_quantized_cache(k_name, v_name):
    """bf16 models: quantized sides use fp16 operands (q converted in-kernel, exactly scaled by a
    power of two); the output is rounded to bf16 (2^-9 relative)."""
    out, ref = run_case(k_name, v_name, dtype=torch.bfloat16, seed=3, **MIXED)
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)


def test_q_beyond_fp16_range():
    """|q| up to ~4e5 (bf16 holds it, fp16 does not): the power-of-two rescale keeps it finite."""
    out, ref = run_case("int8", "int8", dtype=torch.bfloat16, q_scale=4e4, seed=4, **MIXED)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("head_dim,group", [(128, 128), (64, 64)])
def test_int4_one_group_per_head(head_dim, group):
    """--int4-group-size 128 (one scale/zero per token and head at head_dim 128): one group covers both
    nibble halves, its parameters broadcast to each (`_tile_scales`)."""
    out, ref = run_case("int4", "int4", dtype=torch.float16, head_dim=head_dim, int4_group_size=group, **MIXED)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])


def test_int4_without_rotation():
    out, ref = run_case("int4", "int4", rotate=False, dtype=torch.float16, **MIXED)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])


@pytest.mark.parametrize("hq,hkv", [(3, 3), (6, 2), (8, 2), (8, 1)])  # GQA 1, 3, 4, 8
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_gqa_and_head_dims(hq, hkv, head_dim):
    k_name, v_name = ("int4", "int8") if head_dim != 128 else ("fp8_e4m3", "int4")
    out, ref = run_case(k_name, v_name, hq=hq, hkv=hkv, head_dim=head_dim, dtype=torch.float16,
                        q_lens=(13, 1, 1), seq_lens=(40, 23, 2), seed=head_dim + hq)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])


@pytest.mark.parametrize("head_dim", [80, 96, 48])
@pytest.mark.parametrize("k_name,v_name,dtype,workspace", [
    ("float16", "float16", torch.float16, False), ("float32", "float32", torch.float32, False),
    ("fp8_e4m3", "int8", torch.bfloat16, False), ("int8", "int4", torch.float16, True),
    ("int4", "fp8_e5m2", torch.bfloat16, True)])
def test_two_part_head(k_name, v_name, dtype, workspace, head_dim):
    """Head dims that are not powers of two: channels [0, D_PAD / 2) and the rest padded to D_B, two dots and two
    accumulators (`prefill_launch.two_part_head`), on 16-bit caches, 8-bit sides dequantized in the kernel (bf16
    q: the power-of-two rescale over both parts), and workspaces (int4 included: its sides are 16-bit there);
    the mixed batch (masked diagonal tiles, decodes, a chunk on a prefix) against the reference."""
    from kvpack.kernels.prefill_launch import two_part_head
    from kvpack.formats.base import FMT_FLOAT, FMT_INT8, FMT_INT4

    d_b = two_part_head(head_dim, FMT_FLOAT, FMT_FLOAT, False)
    assert d_b == {80: 16, 96: 32, 48: 16}[head_dim]
    assert two_part_head(head_dim, FMT_INT4, FMT_FLOAT, False) == 0 and two_part_head(head_dim, FMT_INT8, FMT_FLOAT, True) == 0
    assert two_part_head(64, FMT_FLOAT, FMT_FLOAT, False) == 0 and two_part_head(128, FMT_INT8, FMT_INT8, False) == 0
    out, ref = run_case(k_name, v_name, head_dim=head_dim, dtype=dtype, workspace=workspace, hq=6, hkv=2,
                        q_scale=3e4 if dtype == torch.bfloat16 else 1.0, seed=head_dim, **MIXED)
    tol = TOL[dtype] if dtype != torch.bfloat16 else dict(atol=1e-2, rtol=1e-2)
    if dtype == torch.bfloat16:  # |q| ~ 1e5: scores of ~1e5, a near one-hot softmax
        assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **tol)


def test_tile_config_two_part_heads(monkeypatch):
    """Hopper's tiles: 16-bit sides at head dims 80 / 96 (two parts) take 64 rows, 4 warps and carried block ids
    (H200 sweep, session 32: 0.57-0.70x the time of the 128-row tile); 128, 64 and quantized sides keep theirs."""
    import kvpack.kernels.prefill_launch as pl

    monkeypatch.setattr(pl, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda = torch.device("cuda")
    for d in (80, 96):
        assert pl.pick_tile_config(d, cuda) == TileConfig(64, 64, 4, 3, True)
        assert pl.pick_tile_config(d, cuda, quantized=True) == TileConfig(128, 64, 8, 3)
    for d in (64, 128):
        assert pl.pick_tile_config(d, cuda) == TileConfig(128, 64, 8, 3)
    monkeypatch.setattr(pl, "TWO_PART", False)
    assert pl.pick_tile_config(80, cuda) == TileConfig(128, 64, 8, 3)


def test_head_dim_256_int4_rotation_outside_the_kernel():
    out, ref = run_case("int4", "int4", head_dim=256, hq=2, hkv=1, dtype=torch.bfloat16,
                        q_lens=(9, 1), seq_lens=(30, 17))
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("cfg", [TileConfig(16, 16, 4, 1, carry_block_ids=True), TileConfig(32, 32, 4, 1),
                                 TileConfig(64, 16, 4, 1, carry_block_ids=False)])
def test_tilings_and_block_sizes(block_size, cfg):
    """KV tiles smaller than, equal to and larger than a cache block; several q tiles per sequence."""
    out, ref = run_case("int8", "fp8_e5m2", block_size=block_size, config=cfg, dtype=torch.float32,
                        q_lens=(45, 1, 33), seq_lens=(77, 64, 33), hq=8, hkv=2, seed=block_size)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


def test_causal_boundaries_every_offset():
    """Chunks and decodes whose first position takes every residue modulo BLOCK_N: the split
    between the unmasked and the masked (diagonal) KV tiles is right at every offset."""
    seq_lens = tuple(range(11, 28)) + tuple(range(1, 18))
    q_lens = (5,) * 17 + (1,) * 17
    out, ref = run_case("int8", "float32", q_lens=q_lens, seq_lens=seq_lens, hq=2, hkv=1, dtype=torch.float32,
                        config=TileConfig(16, 16, 4, 1, carry_block_ids=True))
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


def test_float16_cache_long_prefix():
    out, ref = run_case("float16", "float16", q_lens=(7, 1), seq_lens=(130, 97), dtype=torch.float16,
                        config=TileConfig(32, 32, 4, 1))
    torch.testing.assert_close(out, ref, **TOL[torch.float16])


def test_public_launcher_dispatches_mixed_batches_here():
    from kvpack.kernels import paged_attention

    out, ref = run_case("int4", "int4", dtype=torch.float16, attention=paged_attention, **MIXED)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])


# The engine's mixed batches: the running sequences' decodes first, then prefill chunks.
DECODES_FIRST = dict(q_lens=(1, 1, 1, 21, 9, 1), seq_lens=(37, 1, 64, 50, 9, 17))


@pytest.mark.parametrize("workspace", [False, True])
@pytest.mark.parametrize("k_name,v_name,static", [("float16", "float16", False), ("int8", "int8", False),
                                                  ("int4", "int4", False), ("fp8_e4m3", "fp8_e5m2", True)])
def test_mixed_batch_decodes_first_split(k_name, v_name, static, workspace):
    """A batch that starts with decode rows goes through the decode kernel for those and the prefill
    kernel (with its own workspace) for the rest: equal to the reference."""
    from kvpack.kernels import paged_attention

    seen = []

    def attention(q, layer, meta, scale):
        dec, rest = meta.decode_split
        seen.append((dec.num_seqs, dec.max_query_len, rest.num_seqs, rest.workspace is not None))
        return paged_attention(q, layer, meta, scale)

    out, ref = run_case(k_name, v_name, static=static, dtype=torch.float16, attention=attention,
                        workspace=workspace, **DECODES_FIRST)
    assert seen == [(3, 1, 3, workspace)]
    torch.testing.assert_close(out, ref, **TOL[torch.float16])


def test_decode_split_only_for_leading_decodes():
    from kvpack.engine.model_runner import build_metadata

    t = [[i] for i in range(4)]
    assert AttentionMetadata.build([1, 1], [5, 9], t[:2], 16).decode_split is None  # pure decode
    assert AttentionMetadata.build([3, 1, 1], [5, 9, 2], t[:3], 16).decode_split is None  # a chunk first
    for md in (AttentionMetadata.build([1, 1, 4, 1], [5, 9, 4, 2], t, 16),
               build_metadata([1, 1, 4, 1], [5, 9, 4, 2], t, 16)[0]):
        dec, rest = md.decode_split
        assert dec.seq_lens.tolist() == [5, 9] and dec.max_query_len == 1 and dec.decode_split is None
        assert rest.seq_lens.tolist() == [4, 2] and rest.query_start_loc.tolist() == [0, 4, 5]
        assert rest.slot_mapping.tolist() == md.slot_mapping[2:].tolist()


def test_tile_map_enumerates_every_tile_once():
    q_lens = [5, 1, 0, 17, 8]
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    seq, start = build_tile_map(qsl, 4, sum(q_lens))
    got = sorted((s, t) for s, t in zip(seq.tolist(), start.tolist()) if s >= 0)
    want = sorted((b, t) for b, n in enumerate(q_lens) for t in range(0, n, 4))
    assert got == want
    assert seq.numel() == sum(q_lens) // 4 + len(q_lens)
    # within a sequence the tile with the most keys comes first
    s3 = [t for s, t in zip(seq.tolist(), start.tolist()) if s == 3]
    assert s3 == sorted(s3, reverse=True)


def test_bad_inputs_raise():
    fmt = resolve_format("float16", head_dim=64, model_dtype=torch.float16)
    pool = allocate_pool(fmt, 4, 2, 16, DEV)
    layer = LayerKVCache(pool, pool)
    meta = AttentionMetadata.build([3], [3], [[0]], 16, DEV)
    with pytest.raises(KVPackError, match="head dim"):
        prefill_paged_attention(torch.zeros(3, 4, 32, dtype=torch.float16, device=DEV), layer, meta, 1.0)
    with pytest.raises(KVPackError, match="kv heads"):
        prefill_paged_attention(torch.zeros(3, 3, 64, dtype=torch.float16, device=DEV), layer, meta, 1.0)
    with pytest.raises(KVPackError, match="q must be"):
        prefill_paged_attention(torch.zeros(3, 4, 64, dtype=torch.int32, device=DEV), layer, meta, 1.0)


# ---- GPU: large shapes (the lead runs these on the H200) -------------------------------------
GPU_FORMATS = ["bfloat16", "int8", "int4", "fp8_e4m3", "fp8_e5m2"]


@pytest.mark.parametrize("qk8", ["0", "1"])
@pytest.mark.parametrize("v_name,static", [("int8", False), ("int4", False), ("float16", False),
                                           ("int8", True), ("fp8_e5m2", True), ("float16", True)])
def test_int8_k_int8_mma_both_ways(v_name, static, qk8, monkeypatch):
    """int8 K scores by int8 MMAs (q in two int8 parts; the default) and by fp16 MMAs: both within
    the fp16-operand tolerance, bf16 q too; KV tiles of 16 tokens over blocks of 16 (the dynamic
    scales' gather path) and over blocks of 32 (per-token scale loads)."""
    from kvpack.kernels.prefill_launch import _use_qk8

    monkeypatch.setenv("KVPACK_PREFILL_QK8", qk8)
    assert _use_qk8(1, 2 if static else 1, torch.float16) == (qk8 == "1")
    out, ref = run_case("int8", v_name, static=static, dtype=torch.float16, seed=5, **MIXED)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])
    out, ref = run_case("int8", v_name, static=static, dtype=torch.bfloat16, seed=6, **MIXED)
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)
    out, ref = run_case("int8", v_name, static=static, dtype=torch.float16, seed=7, block_size=32, **MIXED)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])


def test_qk8_default_scope(monkeypatch):
    from kvpack.kernels.prefill_launch import _use_qk8

    monkeypatch.delenv("KVPACK_PREFILL_QK8", raising=False)
    assert _use_qk8(1, 2, torch.bfloat16) and _use_qk8(1, 1, torch.bfloat16, 64, 16)
    assert not _use_qk8(1, 1, torch.bfloat16, 16, 32) and _use_qk8(1, 2, torch.bfloat16, 16, 32)
    assert not _use_qk8(1, 2, torch.float32) and not _use_qk8(3, 2, torch.bfloat16)


# ---- prefill workspace (quantized caches dequantized once into float16) ---------------------
WS_FORMATS = [("int8", "int8", False), ("int8", "int8", True), ("int4", "int4", False),
              ("fp8_e4m3", "fp8_e4m3", False), ("fp8_e5m2", "fp8_e5m2", True), ("int4", "fp8_e4m3", False),
              ("bfloat16", "int4", False), ("int8", "float32", False)]


@pytest.mark.parametrize("k_name,v_name,static", WS_FORMATS)
def test_workspace_matches_reference(k_name, v_name, static):
    """The workspace path (dequantize the batch's blocks, then the float-cache kernel) against the
    reference at the operand tolerance, on the mixed batch (decodes, a chunk on a prefix)."""
    for head_dim in (64, 80):
        out, ref = run_case(k_name, v_name, static=static, head_dim=head_dim, workspace=True, **MIXED)
        # a bf16 cache side takes bf16 operands (q rounded to bf16 for it): the bf16 tolerance
        tol = TOL[torch.bfloat16 if "bfloat16" in (k_name, v_name) else torch.float16]
        torch.testing.assert_close(out, ref, **tol)


@pytest.mark.parametrize("k_name,v_name", [("int4", "fp8_e4m3"), ("fp8_e5m2", "int4"), ("int8", "fp8_e5m2")])
@pytest.mark.parametrize("head_dim", [64, 80])
def test_workspace_centered_and_rotated(k_name, v_name, head_dim):
    """Centered, rotated sides: the workspace undoes the rotation (and adds V's mean back), against the
    reference."""
    from kvpack.kernels.prefill_workspace import can_unrotate

    out, ref = run_case(k_name, v_name, head_dim=head_dim, workspace=True, means=True, **MIXED)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])
    assert can_unrotate(resolve_format("int4", head_dim=head_dim))  # 80: groups of 16 tile 128 (session 32)
    assert can_unrotate(resolve_format("fp8_e4m3", head_dim=head_dim))
    assert not can_unrotate(resolve_format("int8", head_dim=head_dim))  # nothing to undo


def test_workspace_bf16_q_and_gqa():
    """bf16 q (fp16 operands, output rounded to bf16: 2^-9), GQA 4, as test_bf16_q_with_quantized_cache."""
    out, ref = run_case("int4", "int8", hq=8, hkv=2, dtype=torch.bfloat16, workspace=True, **MIXED)
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("ws_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,static", [("int8", False), ("int8", True), ("int4", False), ("fp8_e4m3", False),
                                         ("fp8_e4m3", True), ("fp8_e5m2", False), ("bfloat16", False)])
def test_workspace_values(name, static, ws_dtype):
    """Workspace values: the format's own dequantization (`KVFormat.dequantize`, float32) rounded
    once to the workspace dtype (int8 / FP8: exact products; int4: code * s + m in float16
    arithmetic, then rounded: within the two roundings' bound), block src_blocks[i] at index i;
    float sides copied bit for bit."""
    from kvpack.kernels.prefill_workspace import dequantize_to_workspace

    gen = torch.Generator().manual_seed(3)
    hkv, bs, d = 2, 16, 80
    fmt = resolve_format(name, head_dim=d, static=static, model_dtype=torch.bfloat16)
    st = (torch.rand(hkv, generator=gen) + 0.5) * 4.0 / fmt.qmax if static else None
    pool = allocate_pool(fmt, 6, hkv, bs, DEV, st)
    x = (torch.randn(6 * bs, hkv, d, generator=gen) * 3).to(DEV)
    slots = torch.arange(6 * bs, device=DEV)
    reference.write_kv(x, x, LayerKVCache(pool, pool), slots)
    src = torch.tensor([4, 0, 5], dtype=torch.int32)
    k_ws, v_ws = dequantize_to_workspace(pool, pool, src.to(DEV), 3, ws_dtype)
    assert k_ws.codes.shape == (3, hkv, bs, d) and k_ws.fmt.kind == "float"
    assert k_ws.codes.dtype == (pool.codes.dtype if fmt.kind == "float" else ws_dtype)
    flat = lambda t: None if t is None else t.flatten(0, 1)  # noqa: E731  [blocks * bs ...] rows
    want = fmt.dequantize(pool.codes.permute(0, 2, 1, 3).flatten(0, 1),
                          flat(pool.scales.permute(0, 2, 1, 3)) if pool.scales is not None else None,
                          flat(pool.zeros.permute(0, 2, 1, 3)) if pool.zeros is not None else None,
                          pool.static_scale)  # [blocks * bs, H, D] float32
    want = want.reshape(6, bs, hkv, d).permute(0, 2, 1, 3)[src.long()]
    got = k_ws.codes.float()
    if fmt.kind == "float":
        assert k_ws.codes.dtype == pool.codes.dtype and torch.equal(k_ws.codes, pool.codes[src.long()])
    elif fmt.kind == "int4":  # float16 roundings of code * s and of + m, then the workspace's
        m = pool.zeros.float()[src.long()].repeat_interleave(fmt.group_size, dim=-1)
        ulp = 2.0 ** -11 if ws_dtype == torch.float16 else 2.0 ** -8
        bound = 2.0 ** -11 * ((want - m).abs() + want.abs()) + ulp * want.abs() + 2.0 ** -24
        assert ((got - want).abs() <= bound).all()
    else:
        assert torch.equal(got, want.to(ws_dtype).float())
    assert torch.equal(v_ws.codes, k_ws.codes)
    if fmt.rotate and fmt.kind != "int4":  # (int4 un-rotated: test_workspace_unrotated_values)
        mean = torch.randn(hkv, d, generator=gen).to(DEV)
        k_un, v_un = dequantize_to_workspace(pool, pool, src.to(DEV), 3, ws_dtype, unrotate_k=True,
                                             unrotate_v=True, v_mean=mean)
        want_k = hadamard_transform(want.cpu().permute(0, 2, 1, 3)).permute(0, 2, 1, 3)  # x @ R: R @ R = I
        want_v = want_k + mean.cpu()[None, :, None, :]
        for got_ws, w in ((k_un, want_k), (v_un, want_v)):
            torch.testing.assert_close(got_ws.codes.float().cpu(), w.to(ws_dtype).float(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("ws_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,head_dim,group,bs", [("int4", 32, 32, 16), ("int4", 64, 32, 16), ("int4", 128, 32, 16),
                                                    ("int4", 128, 128, 32), ("int4", 256, 64, 16),
                                                    ("int4", 80, 16, 16), ("int4", 96, 32, 16), ("int4", 96, 16, 32),
                                                    ("fp8_e4m3", 128, 32, 16), ("fp8_e5m2", 80, 32, 16)])
def test_workspace_unrotated_values(name, head_dim, group, bs, ws_dtype):
    """Rotated sides un-rotated in the workspace (the path prefill takes: int4 at power-of-two head
    dims and at 80 / 96, padded to 128 there, FP8 at any), bit for bit: the reference's float32 dequantization
    (int4: code * s + m, groups of 16 to 128 channels, 1 to 6 a head), its Hadamard butterflies (`hadamard_transform`: x @ R,
    R @ R = I), V's mean added, one rounding to the workspace dtype."""
    from kvpack.kernels.prefill_workspace import can_unrotate, dequantize_to_workspace

    gen = torch.Generator().manual_seed(5)
    hkv, d = 2, head_dim
    fmt = resolve_format(name, head_dim=d, model_dtype=torch.bfloat16, int4_group_size=group)
    assert can_unrotate(fmt) and (fmt.kind != "int4" or fmt.group_size == group)
    pool = allocate_pool(fmt, 5, hkv, bs, DEV)
    x = torch.randn(5 * bs, hkv, d, generator=gen) * 3
    x[:, :, 7] += 20.0  # an outlier channel
    x = x.to(DEV)
    reference.write_kv(x, x, LayerKVCache(pool, pool), torch.arange(5 * bs, device=DEV))
    src = torch.tensor([3, 0, 4, 1], dtype=torch.int32)
    mean = torch.randn(hkv, d, generator=gen)
    k_ws, v_ws = dequantize_to_workspace(pool, pool, src.to(DEV), 4, ws_dtype, unrotate_k=True,
                                         unrotate_v=True, v_mean=mean.to(DEV))
    flat = lambda t: None if t is None else t.permute(0, 2, 1, 3).flatten(0, 1).cpu()  # noqa: E731
    deq = fmt.dequantize(flat(pool.codes), flat(pool.scales), flat(pool.zeros))  # float32, rotated
    want = hadamard_transform(deq).reshape(5, bs, hkv, d).permute(0, 2, 1, 3)[src.long()]
    assert torch.equal(k_ws.codes.cpu(), want.to(ws_dtype))
    assert torch.equal(v_ws.codes.cpu(), (want + mean[None, :, None, :]).to(ws_dtype))


def test_workspace_plan_rule(monkeypatch):
    """`PrefillWorkspace.plan`: blocks in sequence order, renumbered tables, the reuse rule, the cap,
    the forcing argument and $KVPACK_PREFILL_WORKSPACE / _TOKENS."""
    import numpy as np

    from kvpack.attention import metadata as md

    monkeypatch.delenv(md.WORKSPACE_ENV, raising=False)
    monkeypatch.delenv(md.WORKSPACE_TOKENS_ENV, raising=False)
    tables = np.array([[7, 3, 9, 0], [2, 0, 0, 0], [5, 6, 8, 1]], dtype=np.int32)
    plan = md.PrefillWorkspace.plan([40, 1, 33], [40, 5, 64], tables, 16, "cpu", force=True)
    assert plan.num_blocks == 3 + 1 + 4
    assert plan.src_blocks.tolist() == [7, 3, 9, 2, 5, 6, 8, 1]
    assert plan.block_tables.tolist() == [[0, 1, 2, 0], [3, 0, 0, 0], [4, 5, 6, 7]]
    # the rule: sum(query tiles x blocks) >= 8 x blocks; a 2048-token chunk on an 8k prefix passes,
    # decodes (one tile each) and short chunks do not
    long = np.arange(640, dtype=np.int32)[None, :]
    assert md.PrefillWorkspace.plan([2048], [10240], long, 16, "cpu") is not None
    assert md.PrefillWorkspace.plan([200], [10240], long, 16, "cpu") is None
    many = np.tile(long, (40, 1))
    assert md.PrefillWorkspace.plan([2048] + [1] * 39, [2048] + [640] * 39, many, 16, "cpu") is None
    assert md.PrefillWorkspace.plan([200], [10240], long, 16, "cpu", force=False) is None
    # the cap (tokens of whole blocks)
    assert md.PrefillWorkspace.plan([2048] * 4, [10240] * 4, np.tile(long, (4, 1)), 16, "cpu") is None
    monkeypatch.setenv(md.WORKSPACE_TOKENS_ENV, "50000")
    assert md.PrefillWorkspace.plan([2048] * 4, [10240] * 4, np.tile(long, (4, 1)), 16, "cpu") is not None
    monkeypatch.setenv(md.WORKSPACE_TOKENS_ENV, "lots")
    with pytest.raises(ValueError, match="KVPACK_PREFILL_WORKSPACE_TOKENS"):
        md.PrefillWorkspace.plan([2048], [10240], long, 16, "cpu")
    monkeypatch.delenv(md.WORKSPACE_TOKENS_ENV)
    monkeypatch.setenv(md.WORKSPACE_ENV, "0")
    assert md.PrefillWorkspace.plan([2048], [10240], long, 16, "cpu") is None
    monkeypatch.setenv(md.WORKSPACE_ENV, "1")
    assert md.PrefillWorkspace.plan([200], [10240], long, 16, "cpu") is not None
    # decode-only batches never get one; AttentionMetadata.build and the engine's builder agree
    from kvpack.engine.model_runner import build_metadata

    monkeypatch.delenv(md.WORKSPACE_ENV)
    tl = [list(range(640))]
    assert AttentionMetadata.build([1], [10240], tl, 16).workspace is None
    a = AttentionMetadata.build([2048], [10240], tl, 16).workspace
    b = build_metadata([2048], [10240], tl, 16)[0].workspace
    assert torch.equal(a.src_blocks, b.src_blocks) and torch.equal(a.block_tables, b.block_tables)


@pytest.mark.gpu
@pytest.mark.parametrize("workspace", [False, True])
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("fmt", GPU_FORMATS + ["int8-static", "fp8_e4m3-static", "fp8_e5m2-static"])
def test_gpu_large(fmt, head_dim, workspace):
    static = fmt.endswith("-static")
    name = fmt.removesuffix("-static")
    block_size = {64: 16, 80: 32, 96: 64, 128: 16, 256: 32}[head_dim]
    out, ref = run_case(name, name, static=static, head_dim=head_dim, hq=32, hkv=8, block_size=block_size,
                        dtype=torch.bfloat16, q_lens=(700, 1, 1, 300, 129), seq_lens=(1900, 800, 3, 300, 1153),
                        workspace=workspace)
    torch.testing.assert_close(out, ref, **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bfloat16", "int8", "int4", "fp8_e4m3", "fp8_e5m2-static"])
def test_gpu_mixed_decodes_first(fmt):
    """Decode rows of long contexts first, then chunks, as the engine batches them (split between the
    decode and prefill kernels; the chunks' workspace by its rule)."""
    from kvpack.kernels import paged_attention

    static = fmt.endswith("-static")
    name = fmt.removesuffix("-static")
    out, ref = run_case(name, name, static=static, head_dim=128, hq=32, hkv=8, block_size=16,
                        dtype=torch.bfloat16, q_lens=(1, 1, 1, 1, 700, 300), seq_lens=(5000, 800, 3, 2049, 1500, 300),
                        workspace=None, attention=paged_attention)
    torch.testing.assert_close(out, ref, **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("k_name,v_name", [("float16", "float16"), ("int4", "fp8_e5m2"), ("fp8_e4m3", "int8")])
@pytest.mark.parametrize("workspace", [False, True])
def test_gpu_fp16_block_sizes(k_name, v_name, block_size, workspace):
    out, ref = run_case(k_name, v_name, head_dim=128, hq=28, hkv=4, block_size=block_size, dtype=torch.float16,
                        q_lens=(513, 1, 64), seq_lens=(2500, 77, 64), workspace=workspace)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])


@pytest.mark.gpu
def test_gpu_fp32_operands():
    out, ref = run_case("int4", "int8", head_dim=128, hq=8, hkv=2, dtype=torch.float32,
                        q_lens=(200, 1), seq_lens=(450, 31))
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_tile_map_built_once_per_step(monkeypatch):
    """Every layer of a step launches the prefill kernel on the same metadata: the tile map is built
    for the first and reused (`AttentionMetadata.derived`); a new step's metadata builds its own.
    Outputs as without the reuse."""
    import kvpack.kernels.prefill_launch as pl

    calls = []
    real = pl.build_tile_map
    monkeypatch.setattr(pl, "build_tile_map", lambda *a: calls.append(a[1:]) or real(*a))
    layers = []

    def two_layers(q, layer, meta, scale):
        layers.append(prefill_paged_attention(q, layer, meta, scale).float())
        return prefill_paged_attention(q, layer, meta, scale)

    out, ref = run_case("int8", "int8", dtype=torch.float16, attention=two_layers, **MIXED)
    assert len(calls) == 1
    torch.testing.assert_close(out, layers[0], rtol=0, atol=0)
    torch.testing.assert_close(out, ref, **TOL[torch.float16])
    run_case("int8", "int8", dtype=torch.float16, attention=two_layers, **MIXED)
    assert len(calls) == 2
