"""Paged prefill attention: kvpack's Triton kernel per KV format vs kvpack bf16 vs torch SDPA (flash).

Workload (defaults: Llama-3.1-8B attention, 32 q / 8 kv heads, head_dim 128): one sequence whose
`--chunk` new tokens (2048) attend causally to a cached prefix of `--prefixes` tokens (0, 2048, 8192)
plus themselves, i.e. the query is the last `chunk` of `prefix + chunk` keys. kvpack reads the paged
cache (shuffled block table, `--block-size`) through `prefill_paged_attention` (rotation of int4
included). The baseline is PyTorch's FlashAttention-2 forward on contiguous bf16 tensors
(`aten._scaled_dot_product_flash_attention` with is_causal, which this op aligns bottom-right: the
same mask as `causal_lower_right(chunk, prefix + chunk)`; K/V have 8 heads when the op accepts GQA,
else they are expanded, which the JSON records).

Metadata is built as the engine builds it, so quantized formats go through the prefill workspace
(`attention.metadata.PrefillWorkspace`: the batch's blocks dequantized once into float16, then the
float-cache kernel) where its rule plans one (a 2048-token chunk does); `--compare-fused` also
times them without it (rows '<format>/fused': every KV tile dequantized in registers per query tile).

Reports the median time per call (triton.testing.do_bench over CUDA-graph replays: GPU time;
`--eager` times plain calls, whose host-side launch work bounds the short cases: the prefix-0 rows
of session 2 measured that), TFLOP/s of the causal work
(4 * Hq * D * visible (query, key) pairs), the ratio to kvpack bf16 and to SDPA, and the max abs
difference of each output to kvpack bf16 (SDPA vs kvpack bf16 checks the baseline's mask).
Writes results/prefill/prefill{tag}.json and .md (and a .png when matplotlib is installed).
`--sweep` times the candidate tilings (SWEEP) instead, to retune `pick_tile_config` on a new GPU.

    python benchmarks/bench_prefill.py [--formats bfloat16,int8,...] [--prefixes 0,2048,8192]
    python benchmarks/bench_prefill.py --sweep --formats bfloat16,int8,int4,fp8_e4m3 --prefixes 8192
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FORMATS = ["bfloat16", "int8", "int8-static", "int4", "fp8_e4m3", "fp8_e4m3-static", "fp8_e5m2"]
# --sweep: (BLOCK_M, BLOCK_N, num_warps, num_stages, carry_block_ids) around the heuristic table
# (carry None: the launcher's choice; True/False force the block-id prefetch, see _attend)
SWEEP = [(128, 64, 8, 3, None), (128, 64, 8, 3, True), (128, 64, 8, 3, False), (128, 64, 8, 2, None),
         (128, 128, 8, 2, None), (128, 32, 8, 3, None), (64, 64, 4, 3, None), (64, 64, 4, 3, True),
         (128, 64, 4, 3, None), (64, 32, 8, 2, None)]


def env_info(argv: list[str], dev: torch.device) -> dict:
    import triton

    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "unknown"

    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (interpreter smoke run)",
        "capability": list(torch.cuda.get_device_capability(dev)) if dev.type == "cuda" else None,
        "driver": sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).split("\n")[0],
        "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
        "commit": os.environ.get("KVPACK_COMMIT") or (sh(["git", "rev-parse", "--short", "HEAD"]) + ("-dirty" if dirty else "")),
        "command": " ".join([os.path.basename(sys.executable)] + argv),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def build_layer(name: str, k, v, num_blocks: int, block_size: int, slots, dtype):
    from kvpack.attention.kv_cache import LayerKVCache, allocate_pool
    from kvpack.formats import resolve_format
    from kvpack.kernels import write_kv

    from benchmarks.bench_attention import format_spec

    base, static, group = format_spec(name)  # "-static": static scales; "int4-g128": int4 with groups of 128
    hkv, d = k.shape[1], k.shape[2]
    pools = []
    for x in (k, v):
        fmt = resolve_format(base, head_dim=d, static=static, model_dtype=dtype, int4_group_size=group)
        ss = None
        if static:  # per-head absmax over the data, as a calibrated scales file would give
            ss = x.float().abs().amax(dim=(0, 2)) / fmt.qmax
        pools.append(allocate_pool(fmt, num_blocks, hkv, block_size, k.device, ss))
    layer = LayerKVCache(*pools)
    write_kv(k, v, layer, slots)
    return layer


def sdpa_flash(q, k, v, scale):
    """q: [1, Hq, Lq, D]; k, v: [1, Hkv, Lk, D] -> (callable, gqa mode)."""
    if q.device.type != "cuda":  # smoke run: the math backend with the same bottom-right mask
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(q.shape[2], k.shape[2])
        g = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        return (lambda: torch.nn.functional.scaled_dot_product_attention(q, ke, ve, mask, scale=scale)), "math"
    op = torch.ops.aten._scaled_dot_product_flash_attention

    def call(kk, vv):
        return op(q, kk, vv, 0.0, is_causal=True, return_debug_mask=False, scale=scale)[0]

    try:
        call(k, v)
        return (lambda: call(k, v)), "native"
    except RuntimeError:
        g = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(g, 1).contiguous(), v.repeat_interleave(g, 1).contiguous()
        return (lambda: call(ke, ve)), "expanded"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--prefixes", default="0,2048,8192")
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--num-heads", type=int, default=32)
    ap.add_argument("--num-kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench measuring time per point")
    ap.add_argument("--eager", action="store_true",
                    help="time eager calls (host launch overhead included) instead of CUDA-graph replays")
    ap.add_argument("--compare-fused", action="store_true",
                    help="also time each quantized format without the prefill workspace (rows '<format>/fused': "
                         "the kernel dequantizes every KV tile in registers, once per query tile)")
    ap.add_argument("--out", default="results/prefill")
    ap.add_argument("--tag", default="")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1 (tiny shapes)")
    ap.add_argument("--sweep", action="store_true",
                    help="time the SWEEP tile configs per format and prefix instead (prefill_sweep*.json/md)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("bench_prefill: needs a CUDA GPU (or --device cpu with TRITON_INTERPRET=1 for a smoke run)",
              file=sys.stderr)
        return 2
    import triton

    from kvpack.attention.metadata import AttentionMetadata
    from kvpack.kernels.prefill_attention import TileConfig, pick_tile_config, prefill_paged_attention

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    formats = args.formats.split(",")
    prefixes = [int(p) for p in args.prefixes.split(",")]
    hq, hkv, d, bs, chunk = args.num_heads, args.num_kv_heads, args.head_dim, args.block_size, args.chunk
    scale = d ** -0.5
    max_len = max(prefixes) + chunk
    num_blocks = triton.cdiv(max_len, bs)
    table = torch.randperm(num_blocks).tolist()  # shuffled: physical blocks are scattered
    slots = (torch.tensor(table, device=dev)[:, None] * bs + torch.arange(bs, device=dev)).flatten()[:max_len]
    k = torch.randn(max_len, hkv, d, device=dev, dtype=dtype)
    v = torch.randn(max_len, hkv, d, device=dev, dtype=dtype)
    q = torch.randn(chunk, hq, d, device=dev, dtype=dtype)
    layers = {f: build_layer(f, k, v, num_blocks, bs, slots, dtype) for f in formats}

    def bench(fn):
        if dev.type != "cuda":  # smoke run: one timed call
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e6
        if args.eager:
            return triton.testing.do_bench(fn, warmup=25, rep=args.rep_ms, return_mode="median") * 1e3
        from benchmarks.bench_attention import time_graph  # GPU time: one CUDA-graph replay

        return time_graph(fn, args.rep_ms)

    if args.sweep:
        rows = []
        for prefix in prefixes:
            seq_len = prefix + chunk
            meta = AttentionMetadata.build([chunk], [seq_len], [table[: triton.cdiv(seq_len, bs)]], bs, dev)
            flops = 4 * hq * d * (chunk * prefix + chunk * (chunk + 1) // 2)
            for f in formats:
                default = pick_tile_config(d, dev, dtype, not f.startswith(("bfloat16", "float")))
                ref = prefill_paged_attention(q, layers[f], meta, scale, config=default).float()
                for c in SWEEP:
                    cfg = TileConfig(*c)
                    fn = lambda: prefill_paged_attention(q, layers[f], meta, scale, config=cfg)  # noqa: E731
                    try:
                        diff = (fn().float() - ref).abs().max().item()
                        us = bench(fn)
                    except Exception as e:  # out of shared memory / registers on this GPU
                        print(f"prefix {prefix} {f} {c}: {type(e).__name__}: {str(e)[:120]}")
                        continue
                    rows.append({"prefix": prefix, "format": f, "config": list(c), "us": us,
                                 "tflops": flops / us * 1e-6, "default": cfg == default,
                                 "max_abs_diff_vs_default": diff})
                    print(f"prefix {prefix:5d} {f:16s} {str(c):26s} {us:9.1f} us {flops / us * 1e-6:6.1f} TFLOP/s "
                          f"{'(default)' if cfg == default else ''} diff {diff:.1e}", flush=True)
        result = {"env": env_info(["benchmarks/bench_prefill.py"] + argv, dev),
                  "config": vars(args), "sweep": rows}
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"prefill_sweep{args.tag}")
        with open(stem + ".json", "w") as fh:
            json.dump(result, fh, indent=1)
        with open(stem + ".md", "w") as fh:
            fh.write(f"# Prefill tile sweep ({result['env']['gpu']}, commit {result['env']['commit']})\n\n"
                     "| prefix | format | BLOCK_M, BLOCK_N, warps, stages, carry | us | TFLOP/s | default |\n"
                     "|---:|---|---|---:|---:|---|\n")
            for r in rows:
                fh.write(f"| {r['prefix']} | {r['format']} | {r['config']} | {r['us']:.1f} | {r['tflops']:.1f} | "
                         f"{'yes' if r['default'] else ''} |\n")
        return 0

    rows, sdpa_rows = [], []
    for prefix in prefixes:
        seq_len = prefix + chunk
        tables = [table[: triton.cdiv(seq_len, bs)]]
        meta = AttentionMetadata.build([chunk], [seq_len], tables, bs, dev)  # as the engine builds it
        fused = AttentionMetadata.build([chunk], [seq_len], tables, bs, dev, workspace=False)
        flops = 4 * hq * d * (chunk * prefix + chunk * (chunk + 1) // 2)
        out = torch.empty_like(q)
        outs, times = {}, {}
        runs = [(f, f, meta) for f in formats]
        if args.compare_fused:
            runs += [(f + "/fused", f, fused) for f in formats if not f.startswith(("bfloat16", "float"))]
        for name, f, m in runs:
            fn = lambda f=f, m=m: prefill_paged_attention(q, layers[f], m, scale, out=out)  # noqa: E731
            outs[name] = fn().clone()
            times[name] = bench(fn)
        qs = q.transpose(0, 1).unsqueeze(0).contiguous()  # [1, Hq, chunk, D]
        ks = k[:seq_len].transpose(0, 1).unsqueeze(0).contiguous()
        vs = v[:seq_len].transpose(0, 1).unsqueeze(0).contiguous()
        sfn, gqa = sdpa_flash(qs, ks, vs, scale)
        s_out = sfn()[0].transpose(0, 1)
        s_us = bench(sfn)
        base = "bfloat16" if "bfloat16" in outs else formats[0]
        sdpa_rows.append({"prefix": prefix, "us": s_us, "tflops": flops / s_us * 1e-6, "gqa": gqa,
                          "max_abs_diff_vs_kvpack_" + base: (s_out.float() - outs[base].float()).abs().max().item()})
        for f in times:
            rows.append({
                "prefix": prefix, "format": f, "workspace": meta.workspace is not None and "/" not in f
                and not f.startswith(("bfloat16", "float")), "us": times[f], "tflops": flops / times[f] * 1e-6,
                "vs_kvpack_bf16": times[f] / times[base], "vs_sdpa_flash": times[f] / s_us,
                "max_abs_diff_vs_kvpack_bf16": (outs[f].float() - outs[base].float()).abs().max().item(),
            })
            r = rows[-1]
            print(f"prefix {prefix:5d} {f:16s} {r['us']:9.1f} us {r['tflops']:6.1f} TFLOP/s "
                  f"x{r['vs_kvpack_bf16']:.3f} bf16 x{r['vs_sdpa_flash']:.3f} sdpa", flush=True)
        print(f"prefix {prefix:5d} {'sdpa flash':16s} {s_us:9.1f} us {flops / s_us * 1e-6:6.1f} TFLOP/s ({gqa} GQA)")

    result = {"env": env_info(["benchmarks/bench_prefill.py"] + argv, dev),
              "config": {**vars(args), "max_len": max_len, "batch": 1, "q_dtype": args.dtype},
              "kvpack": rows, "sdpa_flash": sdpa_rows}
    write_outputs(result, args.out, args.tag)
    return 0


def write_outputs(result: dict, out_dir: str, tag: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"prefill{tag}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    e, c = result["env"], result["config"]
    lines = [
        f"# Paged prefill attention ({e['gpu']})", "",
        f"{c['chunk']}-token chunk onto a cached prefix; {c['num_heads']} q / {c['num_kv_heads']} kv heads, "
        f"head_dim {c['head_dim']}, block size {c['block_size']}, q {c['q_dtype']}; median of do_bench over "
        f"{'eager calls (host launch overhead included)' if c.get('eager') else 'CUDA-graph replays (GPU time)'}. "
        f"Targets: bf16 <= 1.3x SDPA flash, quantized <= 1.15x kvpack bf16.", "",
        f"driver {e['driver']}, CUDA {e['cuda']}, torch {e['torch']}, triton {e['triton']}, "
        f"commit {e['commit']}, `{e['command']}`", "",
        "| prefix | format | us | TFLOP/s | vs kvpack bf16 | vs SDPA flash | max abs diff vs bf16 |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for s in result["sdpa_flash"]:
        lines.append(f"| {s['prefix']} | SDPA flash ({s['gqa']} GQA) | {s['us']:.1f} | {s['tflops']:.1f} | | 1.000 | "
                     f"{next(v for k, v in s.items() if k.startswith('max_abs')):.2e} |")
        for r in (r for r in result["kvpack"] if r["prefix"] == s["prefix"]):
            lines.append(f"| {r['prefix']} | {r['format']} | {r['us']:.1f} | {r['tflops']:.1f} | "
                         f"{r['vs_kvpack_bf16']:.3f} | {r['vs_sdpa_flash']:.3f} | {r['max_abs_diff_vs_kvpack_bf16']:.2e} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fmts = list(dict.fromkeys(r["format"] for r in result["kvpack"]))
    pre = [s["prefix"] for s in result["sdpa_flash"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.8 / (len(fmts) + 1)
    for i, name in enumerate(["SDPA flash"] + fmts):
        ys = [s["tflops"] for s in result["sdpa_flash"]] if i == 0 else \
             [r["tflops"] for p in pre for r in result["kvpack"] if r["prefix"] == p and r["format"] == name]
        ax.bar([j + i * w for j in range(len(pre))], ys, w, label=name)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(pre))], [f"prefix {p}" for p in pre])
    ax.set_ylabel("TFLOP/s (causal)")
    ax.set_title(f"Paged prefill, {e['gpu']}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
