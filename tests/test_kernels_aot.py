"""Ahead-of-time compile of every kernel variant for Ampere (sm_80, sm_86): no GPU needed.

Each variant is planned by the real launchers (`plan_write`, `plan_decode`, the prefill launcher with
and without its workspace) on CPU tensors, its
argument list turned into a Triton signature, and compiled with `triton.compile(ASTSource(...),
target=GPUTarget("cuda", cc, 32))` down to a cubin (ptxas included). The PTX of the quantized
variants must hold no hardware FP8 conversion (`cvt...e4m3` / `cvt...e5m2`: Ampere has none).

The compile runs in a subprocess with TRITON_INTERPRET=0 (conftest enables the interpreter on
CPU-only machines, which replaces @triton.jit functions by interpreted ones).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys

import pytest
import torch

FORMATS = ["bfloat16", "int8", "int8-static", "int4", "fp8_e4m3", "fp8_e5m2-static", "fp8_e5m2"]
FP8_CVT = re.compile(r"cvt[.\w]*\.(e4m3|e5m2)")
_TY = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int8: "i8",
       torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}


def split_options(fn, options: dict) -> tuple[dict, dict]:
    """A plan's launch options as (the kernel's own constexpr keyword arguments, e.g. "fragt"'s RING4; the
    compile options: num_warps, ...)."""
    own = {k: v for k, v in options.items() if k in fn.arg_names}
    return own, {k: v for k, v in options.items() if k not in own}


def signature(fn, args: list, kwargs: dict | None = None) -> tuple[dict, dict, dict]:
    """Triton signature, constexprs and attrs of a launch's positional args (and constexpr keyword
    arguments `kwargs`; the other parameters at their defaults). Like the JIT, integers
    equal to 1 become constexprs (a unit stride: the contiguity the vectorizer needs), pointers
    aligned to 16 bytes and integers divisible by 16 carry tt.divisibility=16 (it enables vector
    loads, so the AOT code is the code that runs); integers the kernel marks do_not_specialize stay plain."""
    sig, consts, attrs = {}, {}, {}
    for param in fn.params[len(args):]:
        if kwargs and param.name in kwargs:
            sig[param.name], consts[param.name] = "constexpr", kwargs[param.name]
        elif param.is_constexpr and param.default is not inspect.Parameter.empty:
            sig[param.name], consts[param.name] = "constexpr", param.default
        elif param.default is None:  # an optional pointer left out (`times_ptr`): the JIT's None constexpr
            sig[param.name], consts[param.name] = "constexpr", None
    plain = set(getattr(fn, "do_not_specialize", None) or ())  # names (or indices) the JIT leaves as they are
    for i, (name, a) in enumerate(zip(fn.arg_names, args)):
        if (name in plain or i in plain) and type(a) is int:
            sig[name] = "i32" if -2**31 <= a < 2**31 else "i64"
            continue
        if i in fn.constexprs or a is None or (type(a) is int and a == 1):
            # None and integers equal to 1: the JIT specializes them as constexprs too
            sig[name], consts[name] = "constexpr", a
            continue
        if isinstance(a, torch.Tensor):
            sig[name] = "*" + _TY[a.dtype]
            aligned = a.data_ptr() % 16 == 0
        elif isinstance(a, bool):
            sig[name], aligned = "i1", False
        elif isinstance(a, int):
            sig[name] = "i32" if -2**31 <= a < 2**31 else "i64"
            aligned = a % 16 == 0
        else:
            sig[name], aligned = "fp32", False
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


def captured_launches(launch) -> list:
    """Run `launch()` with every Triton kernel launch recorded instead of run (CPU tensors, no GPU):
    [(jit fn, positional args, options)]. For launchers without a separate plan function."""
    from triton.runtime.jit import JITFunction

    got = []
    orig = JITFunction.run

    def record(self, *args, grid, warmup, **kw):
        named = dict(zip(self.arg_names, args))
        named.update({k: v for k, v in kw.items() if k in self.arg_names})
        opts = {k: v for k, v in kw.items() if k not in self.arg_names}
        got.append((self, [named[n] for n in self.arg_names], opts))

    JITFunction.run = record
    try:
        launch()
    finally:
        JITFunction.run = orig
    return got


def variants():
    """(name, jit fn, args, options) for every kernel variant the launchers produce."""
    from kvpack.attention import AttentionMetadata, LayerKVCache
    from kvpack.kernels.cache_write import ROW_MIN_TOKENS, _cache_write_kernel, plan_write
    from kvpack.kernels.decode_attention import _decode_kernel, _merge_kernel, plan_decode
    from kvpack.kernels.prefill_launch import prefill_paged_attention
    from tests.test_kernels_write import make_pool

    out = []
    for name in FORMATS:
        for D in (128, 80):
            if D == 80 and name not in ("bfloat16", "int4", "fp8_e4m3"):
                continue  # non-power-of-two head dims: masked/gather paths, once per code path
            lc = LayerKVCache(make_pool(name, D, 8, 2, 16, "cpu"), make_pool(name, D, 8, 2, 16, "cpu"))
            k = torch.randn(5, 2, D, dtype=torch.bfloat16)
            grid, args, opts = plan_write(k, k, lc, torch.arange(5))
            out.append((f"write/{name}/D{D}", _cache_write_kernel, args, opts))
            # the row layout (`cache_write.row_layout`), taken by long writes: planned as for one
            kl = torch.zeros(ROW_MIN_TOKENS, 2, D, dtype=torch.bfloat16)
            lcl = LayerKVCache(make_pool(name, D, ROW_MIN_TOKENS // 16, 2, 16, "cpu"),
                               make_pool(name, D, ROW_MIN_TOKENS // 16, 2, 16, "cpu"))
            grid, args, opts = plan_write(kl, kl, lcl, torch.arange(ROW_MIN_TOKENS))
            if any(args[-3:-1]):
                out.append((f"write-rows/{name}/D{D}", _cache_write_kernel, args, opts))
            if name in ("int8", "int4", "fp8_e4m3"):  # centered K and V: the mean subtract in the kernel
                mean = torch.zeros(2, D)
                grid, args, opts = plan_write(k, k, dataclasses.replace(lc, k_mean=mean, v_mean=mean), torch.arange(5))
                out.append((f"write-centered/{name}/D{D}", _cache_write_kernel, args, opts))
            q = torch.randn(2, 8, D, dtype=torch.bfloat16)
            meta = AttentionMetadata.build([1, 1], [40, 9], [[0, 1, 2], [3]], 16)
            # two splits need >= 2 tiles of context: 300 tokens (the tables are never read: no launch)
            meta2 = AttentionMetadata.build([1, 1], [300, 9], [list(range(19)), [3]], 16)
            for splits, merge in ((1, "auto"), (2, "separate"), (2, "fused")):
                if splits == 2 and (D == 80 or name not in ("int8", "int4", "fp8_e4m3")):
                    continue
                for v_mean in ((None, torch.zeros(2, D)) if name in ("int8", "int4") and D == 128 else (None,)):
                    clc = dataclasses.replace(lc, v_mean=v_mean)  # centered V: + mean in the epilogue / merge
                    plan = plan_decode(q, clc, meta if splits == 1 else meta2, 0.1, num_splits=splits, variant="dot",
                                       merge=merge)
                    assert (plan.merge_args is not None) == (merge == "separate"), (name, D, splits)
                    tag = f"{name}/D{D}/splits{splits}/{merge}" + ("/centered" if v_mean is not None else "")
                    out.append((f"decode/{tag}", _decode_kernel, plan.args, plan.options))
                    if plan.merge_args is not None:  # rotated V: the merge forms out @ R
                        out.append((f"merge/{tag}", _merge_kernel, plan.merge_args, {}))
            if name in ("int8", "int8-static"):  # int8 K codes straight into an int8 MMA
                plan = plan_decode(q, lc, meta, 0.1, num_splits=2, variant="imma")
                assert plan.variant == "imma", plan.variant
                out.append((f"decode-imma/{name}/D{D}", plan.kernel, plan.args, plan.options))
            if D == 128 and name in ("int8", "int8-static", "fp8_e4m3", "fp8_e5m2-static", "int4"):  # Gluon, fragment layout
                # split-K and its fused merge (q @ R in the kernel for rotated formats; the merge's out @ R for
                # rotated V): the fused merge's epilogue for an int8 (centered below) and an FP8 (rotated) V
                cases = ((1, "auto"), (2, "separate")) + (((2, "fused"),) if name in ("int8", "fp8_e4m3") else ())
                for splits, merge in cases:
                    plan = plan_decode(q, lc, meta if splits == 1 else meta2, 0.1, num_splits=splits, variant="frag",
                                       prefetch=0, merge=merge)
                    assert plan.variant == "frag" and plan.grid[2] == splits, (plan.variant, plan.grid)
                    out.append((f"decode-frag/{name}/D{D}/splits{splits}/{merge}", plan.kernel, plan.args,
                                plan.options))
                if name == "int8":  # the fused merge adding a V mean
                    clc = dataclasses.replace(lc, v_mean=torch.zeros(2, D))
                    plan = plan_decode(q, clc, meta2, 0.1, num_splits=2, variant="frag", prefetch=0, merge="fused")
                    out.append((f"decode-frag/{name}/D{D}/splits2/fused/centered", plan.kernel, plan.args,
                                plan.options))
                    # ... and one split, the mean added in its own epilogue (`decode_frag._add_rn`)
                    plan = plan_decode(q, clc, meta, 0.1, num_splits=1, variant="frag", prefetch=0)
                    assert plan.args[plan.kernel.arg_names.index("OUT_MEAN")], "the mean is not in the epilogue"
                    out.append((f"decode-frag/{name}/D{D}/splits1/centered", plan.kernel, plan.args, plan.options))
                # whole tiles through a cp.async ring (Ampere's cp.async: no TMA); int4: an L2 prefetch instead
                plan = plan_decode(q, lc, meta2, 0.1, num_splits=2, variant="frag", prefetch=1)
                out.append((f"decode-{'frag-pf' if name == 'int4' else 'ring'}/{name}/D{D}", plan.kernel, plan.args,
                            plan.options))
                if name == "int8":  # V by channel pairs, as before V8_PAIRS (KVPACK_V8_PAIRS=0)
                    assert plan.options.get("V8_PAIRS"), plan.options
                    out.append((f"decode-ring/{name}/D{D}/channel-pairs", plan.kernel, plan.args,
                                {**plan.options, "V8_PAIRS": False}))
                if name in ("int4", "int8", "fp8_e4m3", "fp8_e5m2-static"):  # both products transposed ("fragt")
                    cases = ((1, "auto", 0), (2, "separate", 1), (2, "fused", 1)) if name == "int4" else \
                        ((2, "separate", 0),)
                    for splits, merge, pf in cases:
                        plan = plan_decode(q, lc, meta2, 0.1, num_splits=splits, variant="fragt", prefetch=pf,
                                           merge=merge, ring4=0)  # int4: direct loads (the ring's below)
                        assert plan.variant == "fragt", plan.variant
                        out.append((f"decode-t4/{name}/D{D}/splits{splits}/{merge}/pf{pf}", plan.kernel, plan.args,
                                    plan.options))
                if name == "int4":  # whole tiles through the int4 cp.async ring (`decode_frag._r4_issue`)
                    for splits, merge in ((1, "auto"), (2, "separate")):
                        plan = plan_decode(q, lc, meta2, 0.1, num_splits=splits, variant="fragt", merge=merge, ring4=1)
                        assert plan.options.get("RING4") == 1, plan.options
                        out.append((f"decode-t4ring/{name}/D{D}/splits{splits}/{merge}", plan.kernel, plan.args,
                                    plan.options))
                    lc128 = LayerKVCache(make_pool(name, D, 8, 2, 16, "cpu", 128), make_pool(name, D, 8, 2, 16, "cpu", 128))
                    plan = plan_decode(q, lc128, meta2, 0.1, num_splits=2, variant="fragt", merge="separate", ring4=1)
                    assert plan.options.get("RING4") == 1, plan.options  # one group a token
                    out.append((f"decode-t4ring-g128/{name}/D{D}/splits2/separate", plan.kernel, plan.args,
                                plan.options))
                if name == "int4":  # a sequence without its query token: "fragt" without ALL_Q (the other
                    # "fragt" variants are planned with every query present), its "has a query" predicate
                    skip = dataclasses.replace(meta, query_start_loc=torch.tensor([0, 1, 1], dtype=torch.int32))
                    plan = plan_decode(q[:1], lc, skip, 0.1, num_splits=1, variant="fragt")
                    assert plan.variant == "fragt" and "ALL_Q" not in plan.options, (plan.variant, plan.options)
                    out.append((f"decode-t4ring/{name}/D{D}/splits1/skipq", plan.kernel, plan.args, plan.options))
                if name == "int8":  # "frag" with ALL_Q (not planned by default: KVPACK_DECODE_ALL_Q=all); "dot"
                    # without it (planned with it where every sequence has its query: a sequence without)
                    plan = plan_decode(q, lc, meta, 0.1, num_splits=1, variant="frag", prefetch=0)
                    out.append((f"decode-frag/{name}/D{D}/splits1/allq", plan.kernel, plan.args,
                                {**plan.options, "ALL_Q": True}))
                    skip = dataclasses.replace(meta, query_start_loc=torch.tensor([0, 1, 1], dtype=torch.int32))
                    plan = plan_decode(q[:1], lc, skip, 0.1, num_splits=1, variant="dot")
                    assert plan.variant == "dot" and "ALL_Q" not in plan.options, (plan.variant, plan.options)
                    out.append((f"decode/{name}/D{D}/splits1/skipq", plan.kernel, plan.args, plan.options))
            # mixed prefill + decode attention
            pmeta = AttentionMetadata.build([20, 1], [40, 9], [[0, 1, 2], [3]], 16)
            pq = torch.randn(21, 8, D, dtype=torch.bfloat16)
            for fn, args, opts in captured_launches(lambda: prefill_paged_attention(pq, lc, pmeta, 0.1)):
                out.append((f"prefill/{name}/D{D}", fn, args, opts))
            if name != "bfloat16":  # the prefill workspace: dequantize the blocks, then the float-cache kernel
                wmeta = AttentionMetadata.build([20, 1], [40, 9], [[0, 1, 2], [3]], 16, workspace=True)
                for fn, args, opts in captured_launches(lambda: prefill_paged_attention(pq, lc, wmeta, 0.1)):
                    out.append((f"prefill-ws/{name}/D{D}/{fn.__name__}", fn, args, opts))
    # 8-bit codes at head dim 64 in "fragt" (`decode_frag`: int4's code layouts at head dim 128), one split and two,
    # through the cp.async ring (RING8, the plan's choice on thin grids) and with direct loads (and two with the L2
    # prefetch);
    # (FP8 is rotated: q @ R in the kernel; with one split out @ R in its epilogue, with two in the merge)
    q = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    meta = AttentionMetadata.build([1, 1], [40, 9], [[0, 1, 2], [3]], 16)
    meta2 = AttentionMetadata.build([1, 1], [300, 9], [list(range(19)), [3]], 16)
    for name in ("int8", "int8-static", "fp8_e4m3", "fp8_e5m2-static"):
        lc = LayerKVCache(make_pool(name, 64, 8, 2, 16, "cpu"), make_pool(name, 64, 8, 2, 16, "cpu"))
        for splits in (1, 2):
            plan = plan_decode(q, lc, meta if splits == 1 else meta2, 0.1, num_splits=splits, variant="fragt")
            assert plan.variant == "fragt" and plan.options.get("RING8") == 1, (plan.variant, plan.options)
            out.append((f"decode-t8h64/{name}/D64/splits{splits}/ring8", plan.kernel, plan.args, plan.options))
            # the direct loads (fuller grids; here asked for with prefetch 0)
            plan = plan_decode(q, lc, meta if splits == 1 else meta2, 0.1, num_splits=splits, variant="fragt",
                               prefetch=0)
            assert plan.variant == "fragt" and "RING8" not in plan.options, (plan.variant, plan.options)
            out.append((f"decode-t8h64/{name}/D64/splits{splits}", plan.kernel, plan.args, plan.options))
        if name in ("int8", "fp8_e4m3"):  # with the L2 prefetch (`decode_frag._prefetch_tile`, STEP 2)
            plan = plan_decode(q, lc, meta2, 0.1, num_splits=2, variant="fragt", prefetch=1)
            out.append((f"decode-t8h64/{name}/D64/splits2/pf1", plan.kernel, plan.args, plan.options))
    # int4 K and V at head dim 64 in "fragt" (session 41: `decode_frag.K4_LOAD64` / `V4_LOAD64`), groups of 16, 32
    # and 64, one split (q @ R and out @ R in the kernel) and two (out @ R in the merge), and with the L2 prefetch
    for g in (16, 32, 64):
        lc = LayerKVCache(make_pool("int4", 64, 24, 2, 16, "cpu", g), make_pool("int4", 64, 24, 2, 16, "cpu", g))
        for splits, pf in ((1, 0), (2, 0), (2, 1)):
            plan = plan_decode(q, lc, meta if splits == 1 else meta2, 0.1, num_splits=splits, variant="fragt",
                               prefetch=pf)
            assert plan.variant == "fragt", plan.variant
            out.append((f"decode-t4h64/int4-g{g}/D64/splits{splits}/pf{pf}", plan.kernel, plan.args, plan.options))
            if g == 32 and pf == 0:  # V by token pairs (V_PAIRS: the plan's choice on grids under the register cap)
                out.append((f"decode-t4h64/int4-g{g}/D64/splits{splits}/pf0/vpairs", plan.kernel, plan.args,
                            {**plan.options, "V_PAIRS": True, "maxnreg": 128}))
    # the q / output rotation around the attention kernels (rotated formats, centered V)
    from kvpack.kernels.rotate import rotate_heads

    for D in (128, 80):
        x = torch.randn(3, 8, D, dtype=torch.bfloat16)
        for fn, args, opts in captured_launches(lambda: rotate_heads(x, torch.float32)):
            out.append((f"rotate/q/D{D}", fn, args, opts))
        for fn, args, opts in captured_launches(lambda: rotate_heads(x.float(), torch.bfloat16, True, torch.zeros(2, D))):
            out.append((f"rotate/out+mean/D{D}", fn, args, opts))
    # the fused model ops (RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE), bf16 and fp16
    from kvpack.kernels.fused_ops import fused_add_rms_norm, rms_norm, rotary_embedding, silu_and_mul

    for dt in (torch.bfloat16, torch.float16):
        x = torch.randn(4, 256, dtype=dt)
        w = torch.ones(256, dtype=dt)
        table = torch.randn(64, 2, 32)
        qq, kk = torch.randn(4, 8, 64, dtype=dt), torch.randn(4, 2, 64, dtype=dt)
        launches = [lambda: rms_norm(x, w, 1e-5, force_triton=True),
                    lambda: fused_add_rms_norm(x, x, w, 1e-5, force_triton=True),
                    lambda: silu_and_mul(x, force_triton=True),
                    lambda: rotary_embedding(torch.arange(4), qq, kk, table, force_triton=True)]
        for launch in launches:
            for fn, args, opts in captured_launches(launch):
                out.append((f"fused/{fn.__name__}/{_TY[dt]}", fn, args, opts))
    return out


INLINE_ASM = re.compile(r"// begin inline asm.*?// end inline asm", re.S)  # the PTX that inline_asm put there


def compile_all(archs=(80, 86), shard: int = 0, shards: int = 1) -> list[dict]:
    """Compile every variant (or those whose index is `shard` modulo `shards`) for each arch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import _runtime as gluon_runtime

    results = []
    # the Gluon variants (the longest compiles) first, then dealt round-robin: the shards get even shares
    todo = sorted(variants(), key=lambda v: not isinstance(v[1], gluon_runtime.GluonJITFunction))
    for i, (name, fn, args, opts) in enumerate(todo):
        if i % shards != shard:
            continue
        own, opts = split_options(fn, opts)
        sig, consts, attrs = signature(fn, args, own)
        source = gluon_runtime.GluonASTSource if isinstance(fn, gluon_runtime.GluonJITFunction) \
            else triton.compiler.ASTSource
        for cc in archs:
            res = {"variant": name, "arch": f"sm_{cc}"}
            try:
                ck = triton.compile(source(fn, sig, consts, attrs), target=GPUTarget("cuda", cc, 32), options=opts)
                ptx = ck.asm["ptx"]
                # fused multiply-adds the compiler made (inline PTX ones, e.g. `quant.div_by_scale`, aside); adds
                # of their own that the kernels asked for inline (`quant.add_rn`)
                inline = INLINE_ASM.findall(ptx)
                res.update(ok=True, cubin_bytes=len(ck.asm.get("cubin", b"")),
                           f32_fma=INLINE_ASM.sub("", ptx).count("fma.rn.f32"),
                           add_rn=sum(b.count("add.rn.f32") for b in inline),
                           shared=ck.metadata.shared,
                           fp8_cvt=sorted(set(m.group(0) for m in FP8_CVT.finditer(ptx))),
                           target_line=next((ln for ln in ptx.splitlines() if ln.startswith(".target")), ""))
            except Exception as e:  # reported, and the test fails on it
                res.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
            results.append(res)
    return results


@pytest.fixture(scope="module")
def aot_results():
    """Every variant compiled in fresh processes (no interpreter), one shard of the variants per CPU core
    (up to 4): compiling them all in one process took ~9 minutes of a 2-core CI run (empty Triton cache).
    `make test` runs pytest-xdist with --dist loadfile (and this file collected first, conftest): this
    file's tests share one worker, so this runs once, from the start, while the other workers run the other
    files (xdist 3.8's loadgroup did not group under pytest
    9.2: its `xdist_group` suffix never reached the node ids)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    n = max(1, min(4, os.cpu_count() or 1))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.test_kernels_aot", "shard", f"{k}/{n}"], cwd=root,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(n)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        results += json.loads(out.strip().splitlines()[-1])
    return results


def test_every_variant_compiles_for_ampere(aot_results):
    failed = [r for r in aot_results if not r["ok"]]
    assert not failed, failed[:3]
    assert {r["arch"] for r in aot_results} == {"sm_80", "sm_86"}
    assert all(r["cubin_bytes"] > 0 for r in aot_results)
    for r in aot_results:
        assert r["target_line"].startswith(".target " + r["arch"]), r


def test_no_hardware_fp8_conversions(aot_results):
    bad = [(r["variant"], r["arch"], r["fp8_cvt"]) for r in aot_results if r["fp8_cvt"]]
    assert not bad, bad


def test_cache_write_has_no_fused_multiply_add(aot_results):
    """The write must round like the reference (x * NORM, then x - m): no mul+add contraction (its
    intended fused multiply-adds, `quant.div_by_scale`, are inline PTX and not counted)."""
    writes = [r for r in aot_results if r["variant"].startswith("write")]
    assert writes and all(r["f32_fma"] == 0 for r in writes), [(r["variant"], r["f32_fma"]) for r in writes]
    assert any(r["f32_fma"] > 0 for r in aot_results)  # the count would see one: decode kernels fuse


def test_v_mean_added_on_its_own(aot_results):
    """Every kernel that adds the V mean to the output (one-split epilogues, merges, `rotate_heads`) adds it as an
    inline `add.rn.f32` of its own (`quant.add_rn`, `decode_frag._add_rn`), which ptxas cannot fuse with the multiply
    before it: "frag"'s epilogue and the merge kernel then round o (or o @ R) first alike, so they give the same
    bits (`test_frag_rot_epilogue_bits_gpu`; session 45's gpu run: 14 failures where only one of them fused). No
    other kernel has one inline (the compiler's own `add.rn`, e.g. the prefill workspace's, are not counted)."""
    def adds_mean(name):  # a split decode kernel with a separate merge stores partials: its merge adds
        if name.startswith("rotate/out+mean"):
            return True
        return "centered" in name and not name.startswith("write") and not (
            name.startswith("decode/") and "/separate/" in name)

    got = {r["variant"]: r["add_rn"] for r in aot_results}
    want = {v for v in got if adds_mean(v)}
    assert len(want) == 10, sorted(want)
    wrong = sorted((v, n) for v, n in got.items() if (n > 0) != (v in want))
    assert not wrong, wrong


def test_frag_decode_uses_no_shared_memory(aot_results):
    """The "frag" kernel with direct loads (PREFETCH 0) loads codes in the MMA fragment layout: no
    shared-memory staging (the "dot" kernel stages each tile, 20 KB; the ring variant holds two
    tiles by design), and its hand-overs compiled as register renamings
    (`convert_layout(..., assert_trivial=True)` fails the compile otherwise). With int8 K, q's two
    int8 parts move once per program from a blocked layout to the MMA operand through shared memory
    (at most 16 x 128 bytes; one 64-token tile staged would need >= 8 KB); so does q rotated in the kernel
    (rotated 8-bit formats, the FP8 ones here: with split-K since session 19, with one split too since session 22
    (`FRAG_ROT_ONE_SPLIT`): 1 KB at sm_80)."""
    frag = [r for r in aot_results if r["variant"].startswith("decode-frag")]
    dot = [r for r in aot_results if r["variant"] == "decode/int8/D128/splits1/auto"]
    assert len(frag) == 32, [r["variant"] for r in frag]
    for r in frag:  # int8 q parts, or q @ R (rotated 8-bit codes: FP8, or any with split-K: "splits2")
        staged_q = "/int8" in r["variant"] or "/fp8" in r["variant"] or "/splits2/" in r["variant"]
        assert r["shared"] <= (2048 if staged_q else 0), (r["variant"], r["shared"])
    assert any(r["shared"] == 0 for r in frag)  # (the bound is not always 2048)
    ring = [r for r in aot_results if r["variant"].startswith("decode-ring")]  # (its cp.async ring: 2 tiles)
    assert ring and all(r["shared"] >= 2 * 16384 for r in ring), [(r["variant"], r["shared"]) for r in ring]
    ring4 = [r for r in aot_results if r["variant"].startswith("decode-t4ring")]  # int4's ring: 2 slots of 8.5-10 KB
    assert ring4 and all(r["shared"] >= 2 * 8704 for r in ring4), [(r["variant"], r["shared"]) for r in ring4]
    ring8 = [r for r in aot_results if r["variant"].startswith("decode-t8h64") and r["variant"].endswith("/ring8")]  # x 2 archs
    assert len(ring8) == 16 and all(r["shared"] >= 2 * 8192 for r in ring8), [(r["variant"], r["shared"]) for r in ring8]
    direct8 = [r for r in aot_results if r["variant"].startswith("decode-t8h64") and "/ring8" not in r["variant"]]
    assert direct8 and all(r["shared"] <= 2048 for r in direct8), [(r["variant"], r["shared"]) for r in direct8]
    assert dot and all(r["shared"] > 8192 for r in dot)  # the check would see staging


def test_fp8_pattern_would_match():
    """The PTX check can fail: it matches the instruction a hardware conversion would emit."""
    assert FP8_CVT.search("cvt.rn.satfinite.e4m3x2.f32 %rs1, %f2, %f1;")
    assert FP8_CVT.search("cvt.rn.f16x2.e5m2x2 %r1, %rs1;")
    assert not FP8_CVT.search("cvt.rn.f16.f32 %rs1, %f1;")


def hopper_fp8_write_ptx() -> dict:
    """PTX of the fp8 cache writes planned as on an sm >= 89 GPU (HW_FP8, the last argument, True)
    and compiled for sm_90: {format: sorted FP8 conversion instructions}."""
    import triton
    from triton.backends.compiler import GPUTarget

    from kvpack.attention import LayerKVCache
    from kvpack.kernels.cache_write import _cache_write_kernel, plan_write
    from tests.test_kernels_write import make_pool

    found = {}
    for name in ("fp8_e4m3", "fp8_e5m2-static"):
        lc = LayerKVCache(make_pool(name, 128, 8, 2, 16, "cpu"), make_pool(name, 128, 8, 2, 16, "cpu"))
        k = torch.randn(5, 2, 128, dtype=torch.bfloat16)
        _, args, opts = plan_write(k, k, lc, torch.arange(5))
        assert args[-1] is False  # CPU tensors plan the software encoder
        sig, consts, attrs = signature(_cache_write_kernel, args[:-1] + [True])
        ck = triton.compile(triton.compiler.ASTSource(_cache_write_kernel, sig, consts, attrs),
                            target=GPUTarget("cuda", 90, 32), options=opts)
        found[name] = sorted(set(m.group(0) for m in FP8_CVT.finditer(ck.asm["ptx"])))
    return found


def aot_subprocess(mode: str, timeout: int = 600):
    """`python -m tests.test_kernels_aot <mode>` in a fresh process (no interpreter: it compiles for the GPU
    targets), its last line's JSON."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "tests.test_kernels_aot", mode], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

def test_hopper_write_uses_fp8_instructions():
    """On sm >= 89 the cache write encodes FP8 with the conversion instruction (its codes are
    checked against the reference by the gpu-marked write tests); Ampere builds keep the software
    encoder (test_no_hardware_fp8_conversions)."""
    found = aot_subprocess("hopper-fp8-write")
    assert found == {"fp8_e4m3": ["cvt.rn.satfinite.e4m3"], "fp8_e5m2-static": ["cvt.rn.satfinite.e5m2"]}, found


def hopper_fp8_decode_ptx() -> dict:
    """PTX of the "frag" decode (cp.async ring) on e4m3 K and V (and on e5m2) planned as on an sm >= 89 GPU
    (`decode_plan.hw_fp8_decode` true: factor 1, the conversion instruction) and compiled for sm_90:
    {format: sorted FP8 conversion instructions}."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import _runtime as gr

    import kvpack.kernels.decode_attention as da
    from kvpack.attention import AttentionMetadata, LayerKVCache
    from tests.test_kernels_write import make_pool

    da.hw_fp8_decode = lambda device: True
    meta = AttentionMetadata.build([1, 1], [1300, 9], [list(range(82)), [3]], 16)
    found = {}
    for name, e5m2_hw, v8p in (("fp8_e4m3", "0", None), ("fp8_e5m2", "0", None), ("fp8_e5m2", "1", None),
                               ("fp8_e5m2", "0", False)):
        os.environ["KVPACK_E5M2_HW"] = e5m2_hw  # (a subprocess of its own)
        da.V8_PAIRS = v8p
        lc = LayerKVCache(make_pool(name, 128, 90, 8, 16, "cpu"), make_pool(name, 128, 90, 8, 16, "cpu"))
        q = torch.randn(2, 32, 128, dtype=torch.bfloat16)
        plan = da.plan_decode(q, lc, meta, 0.1, num_splits=2, variant="frag", merge="separate", prefetch=1)
        assert plan.variant == "frag", plan.variant
        own, opts = split_options(plan.kernel, plan.options)
        sig, consts, attrs = signature(plan.kernel, plan.args, own)
        ck = triton.compile(gr.GluonASTSource(plan.kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                            options=opts)
        key = name + ("-hw" if own.get("E5M2_HW") else "") + ("" if own.get("V8_PAIRS") else "-channel-pairs")
        found[key] = sorted(set(m.group(0) for m in FP8_CVT.finditer(ck.asm["ptx"])))
    return found


def test_hopper_decode_uses_fp8_instructions():
    """On sm >= 89 "frag" decodes e4m3 with the conversion instruction (one per two codes; the gpu-marked
    test_decode_hw_fp8_gpu checks its outputs equal the software decode's bit for bit); e5m2 K by its one byte move,
    or with KVPACK_E5M2_HW=1 the conversion instruction too (test_decode_e5m2_hw_gpu: the same bits); e5m2 V by the
    conversion instruction, on token pairs (V8_PAIRS, session 44), or by the byte move without them. Ampere builds
    keep the software decode (test_no_hardware_fp8_conversions)."""
    found = aot_subprocess("hopper-fp8-decode", timeout=900)
    assert found == {"fp8_e4m3": ["cvt.rn.f16x2.e4m3"], "fp8_e5m2": ["cvt.rn.f16x2.e5m2"],
                     "fp8_e5m2-hw": ["cvt.rn.f16x2.e5m2"], "fp8_e5m2-channel-pairs": []}, found


SASS_OPS = ("LDG", "STG", "LDS", "STS", "BAR", "SHFL", "LDL", "STL", "FADD", "FFMA", "FMUL", "PRMT", "LOP3", "I2F")


def disassemble(cubin: bytes) -> str:
    """A cubin's SASS text, by the nvdisasm Triton ships."""
    import tempfile

    import triton

    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout


def sass_counts(cubin: bytes, modifiers: bool = False) -> dict:
    """Instruction counts by opcode (without modifiers, or with them: LDG.E.U16) of a cubin, by the nvdisasm Triton
    ships."""
    import collections

    sass = disassemble(cubin)
    pat = r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)"
    return dict(collections.Counter(m.group(1) if modifiers else m.group(1).split(".")[0]
                                    for m in re.finditer(pat, sass, re.M)))


def workspace_sass(formats=("int4", "fp8_e4m3", "int8"), arch: int = 90, module=None) -> dict:
    """The prefill workspace's dequantize kernel as the engine launches it at Llama-3.1-8B's shape (8 kv
    heads, head_dim 128, block 16, bf16 workspace, rotated sides un-rotated, V's mean added), compiled
    for sm_`arch`: {format: {"shared": bytes, "unrotated": bool, SASS opcode: count}}. `module`: another
    copy of `kvpack.kernels.prefill_workspace` (benchmarks/sass_workspace.py)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from kvpack.attention.kv_cache import allocate_pool
    from kvpack.formats import resolve_format

    if module is None:
        from kvpack.kernels import prefill_workspace as module
    out = {}
    for name in formats:
        fmt = resolve_format(name, head_dim=128, model_dtype=torch.bfloat16)
        pool = allocate_pool(fmt, 64, 8, 16, "cpu")
        unrot = module.can_unrotate(fmt)
        (fn, args, opts), = captured_launches(lambda: module.dequantize_to_workspace(
            pool, pool, torch.arange(32, dtype=torch.int32), 32, torch.bfloat16, unrotate_k=unrot,
            unrotate_v=unrot, v_mean=torch.zeros(8, 128)))
        sig, consts, attrs = signature(fn, args)
        ck = triton.compile(triton.compiler.ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", arch, 32),
                            options=opts)
        out[name] = {"shared": ck.metadata.shared, "unrotated": unrot, **sass_counts(ck.asm["cubin"])}
    return out


def sass_in_subprocess(mode: str):
    """`python -m tests.test_kernels_aot <mode>` compiled in a fresh process (no interpreter), its JSON;
    skips where Triton ships no nvdisasm."""
    import triton

    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")):
        pytest.skip("this Triton ships no nvdisasm")
    return aot_subprocess(mode)


def test_workspace_unrotation_stays_in_registers():
    """int4's un-rotating dequantize moves its rows through shared memory no more than FP8's (the
    same butterflies on rows of the same shape). Session 14: int4's group scales gathered per channel
    made the compiler stage every row (sm_90: 156 LDS / 161 STS / 25 BAR against FP8's 8 / 4 / 5),
    and the kernel ran 11x FP8's time on an H200 (374 against 33 us a layer for 10k tokens), which
    made int4 prefill 1.30x bf16's. A static check (no GPU): SASS of the sm_90 compile."""
    got = sass_in_subprocess("workspace-sass")
    i4, f8 = got["int4"], got["fp8_e4m3"]
    assert i4["unrotated"] and f8["unrotated"]
    staged = lambda c: c.get("LDS", 0) + c.get("STS", 0)  # noqa: E731
    assert staged(i4) <= staged(f8) + 8 and i4.get("BAR", 0) <= f8.get("BAR", 0) + 2, got
    assert f8.get("SHFL", 0) > 0 and staged(f8) > 0  # the counts see the butterflies' shuffles and staging


def write_sass(formats=("int4", "fp8_e4m3"), arch: int = 90) -> dict:
    """The cache write at Llama-3.1-8B's shape (8 kv heads, head_dim 128; and 64, block 16, bf16 K and
    V, 4096 tokens: the row layout, 32-token tiles) and in the plain layout (rows=False) at 16-token tiles, the
    plain layout's tile below ROW_MIN_TOKENS and at head dim 128 (a long write at head dim 64 gives it 32 since
    session 39, where FP8's plain SASS matches the row layout's: 21.25 against 21.75 instructions an element), compiled
    for sm_`arch` (the FP8 encode as sm_90 runs it): {"format/Dd": {"rows" | "plain": {"shared":
    bytes, "elements": per thread, SASS opcode: count}}}."""
    import triton
    from triton.backends.compiler import GPUTarget

    from kvpack.attention import LayerKVCache
    from kvpack.attention.kv_cache import allocate_pool
    from kvpack.formats import resolve_format
    from kvpack.kernels.cache_write import _cache_write_kernel, plan_write

    out = {}
    for name, d in ((n, d) for n in formats for d in (64, 128)):
        fmt = resolve_format(name, head_dim=d, model_dtype=torch.bfloat16)
        lc = LayerKVCache(allocate_pool(fmt, 256, 8, 16, "cpu"), allocate_pool(fmt, 256, 8, 16, "cpu"))
        k = torch.zeros(4096, 8, d, dtype=torch.bfloat16)
        name = f"{name}/D{d}"
        out[name] = {}
        for layout, rows in (("rows", True), ("plain", False)):
            grid, args, opts = plan_write(k, k, lc, torch.arange(4096), rows=rows, block_t=None if rows else 16)
            block_t = 4096 // grid[0]
            args[-1] = arch >= 89  # HW_FP8
            sig, consts, attrs = signature(_cache_write_kernel, args)
            ck = triton.compile(triton.compiler.ASTSource(_cache_write_kernel, sig, consts, attrs),
                                target=GPUTarget("cuda", arch, 32), options=opts)
            out[name][layout] = {"shared": ck.metadata.shared, "rows_taken": args[-3:-1],
                                 "elements": block_t * 2 * d // (32 * opts["num_warps"]),
                                 **sass_counts(ck.asm["cubin"])}
    return out


def test_write_row_layout_keeps_rows_in_registers():
    """The cache write of rotated and int4 sides is bound by instruction issue (session 15: int4 took
    218 us for 65536 tokens of Llama-8B against 134 us for torch's copy of the input, at ~90 % of the
    H200's issue rate by its SASS count). In the row layout each thread holds 32 channels of a row
    (8 consecutive ones in each 32), so 5 of the 7 Hadamard stages and most of each int4 group
    reduction run in registers: fewer shuffles, no shared memory, fewer instructions an element than
    the plain layout (sm_90, no GPU needed; session 20: int4 27.6 against 39.0, FP8 20.4 against 24.0)."""
    got = sass_in_subprocess("write-sass")
    for name, c in got.items():
        rows, plain = c["rows"], c["plain"]
        assert all(rows["rows_taken"]) and plain["rows_taken"] == [0, 0], (name, c)
        per_elem = lambda x: sum(v for k, v in x.items() if k.isupper()) / x["elements"]  # noqa: E731
        assert rows.get("LDS", 0) + rows.get("STS", 0) == 0 and rows.get("BAR", 0) == 0, (name, rows)
        # the two cross-lane Hadamard stages (+ int4's nibble pairing) against five in the plain layout
        assert rows["SHFL"] / rows["elements"] <= 2.6 < plain["SHFL"] / plain["elements"], (name, c)
        # (sm_90, session 15: int4 32.1 against 45.0, FP8 22.8 against 28.5)
        assert per_elem(rows) <= 0.85 * per_elem(plain), (name, per_elem(rows), per_elem(plain))


def int4_decode_sass(arch: int = 90) -> dict:
    """The "dot" decode kernel (every head dim but 128 runs it on int4) planned as on an H200 at 8 sequences x 4096
    tokens, 8 splits, 32-token tiles, compiled for sm_`arch`: {"Hq/Hkv/D/gG": {"regs": registers a thread (cuobjdump),
    the full opcodes LDG.E.U16 (the two-byte group parameter loads), LDG.E.U8 (code bytes loaded one by one), LDL /
    STL (spills)}}."""
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget

    from kvpack.attention import AttentionMetadata, LayerKVCache
    from kvpack.kernels.decode_attention import plan_decode
    from tests.test_kernels_write import make_pool

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    out = {}
    for hq, hkv, d, g in ((9, 3, 64, 32), (9, 3, 64, 64), (32, 32, 80, 16), (32, 32, 96, 32), (32, 8, 128, 128)):
        nb = 4096 // 16
        meta = AttentionMetadata.build([1] * 8, [4096] * 8, [list(range(i * nb, (i + 1) * nb)) for i in range(8)], 16)
        lc = LayerKVCache(make_pool("int4", d, 8 * nb, hkv, 16, "cpu", g), make_pool("int4", d, 8 * nb, hkv, 16, "cpu", g))
        plan = plan_decode(torch.randn(8, hq, d, dtype=torch.bfloat16), lc, meta, d ** -0.5, num_splits=8, variant="dot",
                           block_n=32)
        own, opts = split_options(plan.kernel, plan.options)
        sig, consts, attrs = signature(plan.kernel, plan.args, own)
        ck = triton.compile(triton.compiler.ASTSource(plan.kernel, sig, consts, attrs),
                            target=GPUTarget("cuda", arch, 32), options=opts)
        ops = sass_counts(ck.asm["cubin"], modifiers=True)
        regs = None
        if os.path.exists(cuobjdump):
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(ck.asm["cubin"])
                f.flush()
                usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
            m = re.search(r"REG:(\d+)", usage)
            regs = int(m.group(1)) if m else None
        out[f"{hq}/{hkv}/{d}/g{g}"] = {
            "regs": regs, "block_n": plan.args[plan.kernel.arg_names.index("BLOCK_N")],
            "params": ops.get("LDG.E.U16", 0), "bytes": ops.get("LDG.E.U8", 0),
            "spills": sum(v for k, v in ops.items() if k.startswith(("LDL", "STL")))}
    return out


def test_int4_decode_loads_group_parameters_once_a_token():
    """int4 decode on the "dot" kernel (head dims 64, 80 and 96 here): each group's scale and zero load once a token
    (head dim 80: once an 8-channel chunk), not once a channel, code rows load in words, not bytes, and one-warp
    programs at head dim 64 fit the 128 registers that `choose_num_splits` assumes (16 an SM). Sessions 30 and 31
    found each broken on the H200: one group a head (SmolLM2's head dim 64 with --int4-group-size 64) gathered per
    channel (1.8x bf16's time), head dims 96 and 80 gathered per channel and spilled (2.8x, 4.7x; head dim 80's
    40-byte code rows also loaded byte by byte), and the one-group kernel compiled to 140 registers (1.4x). A
    static check (sm_90 SASS)."""
    got = sass_in_subprocess("int4-decode-sass")
    for name, c in got.items():
        # a 32-token tile of one warp: one two-byte load a token, group parameter and side per lane (x2: the
        # loop's peeled first tile); head dim 80 one per 8-channel chunk: 4 a half in the halves' first 32
        # channels and 2 in the third tile (`int4_parts`), 68 in all; the per-channel gathers had issued 344-800
        assert c["block_n"] == 32 and c["params"] <= (72 if "/80/" in name else 64), (name, c)
        assert c["bytes"] == 0, (name, c)  # head dim 80, before session 31: 256
        assert c["spills"] <= 16, (name, c)  # (one group a head at 128 registers: 10; the gathers: ~1,000)
        if name.endswith(("/64/g32", "/64/g64")) and c["regs"] is not None:
            assert c["regs"] <= 128, (name, c)


if __name__ == "__main__":
    mode = sys.argv[1:]
    if mode == ["hopper-fp8-write"]:
        print(json.dumps(hopper_fp8_write_ptx()))
    elif mode == ["hopper-fp8-decode"]:
        print(json.dumps(hopper_fp8_decode_ptx()))
    elif mode == ["workspace-sass"]:
        print(json.dumps(workspace_sass()))
    elif mode == ["write-sass"]:
        print(json.dumps(write_sass()))
    elif mode == ["int4-decode-sass"]:
        print(json.dumps(int4_decode_sass()))
    elif len(mode) == 2 and mode[0] == "shard":  # "shard k/n": the variants whose index is k modulo n
        k, n = map(int, mode[1].split("/"))
        print(json.dumps(compile_all(shard=k, shards=n)))
    else:
        print(json.dumps(compile_all()))
