"""Static SASS counts of the prefill workspace's dequantize kernel (no GPU): where its rows go through
shared memory.

Compiles `_dequant_blocks_kernel` ahead of time (Triton's compiler, sm_90 by default) for the engine's
launch at Llama-3.1-8B's shape (8 kv heads, head_dim 128, block 16, bf16 workspace, K and V un-rotated,
V's mean added), disassembles the cubin with the nvdisasm that Triton ships, and prints per format the
shared memory and the counts of the instructions that tell layout conversions (LDS / STS / BAR) from
the work (global loads and stores, shuffles, float math). `--module FILE` compiles another copy of
`kvpack/kernels/prefill_workspace.py` (e.g. an older commit's, from `git show`) instead.

Session 14 found the int4 path 11x slower than FP8's on an H200 (370 against 33 us a layer for 10k
tokens) with a per-channel gather of its group scales: 156 LDS / 161 STS / 25 BAR against FP8's
8 / 4 / 5 (results/engine_s14).

    python benchmarks/sass_workspace.py [--formats int4,fp8_e4m3,int8] [--arch 90] [--module FILE]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # before triton loads: compile, do not interpret
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

OPS = ("LDG", "STG", "LDS", "STS", "BAR", "SHFL", "LDL", "STL", "FADD", "FFMA", "FMUL", "PRMT", "LOP3", "I2F")


def sass_counts(cubin: bytes) -> collections.Counter:
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    pat = r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)"
    return collections.Counter(m.group(1).split(".")[0] for m in re.finditer(pat, sass, re.M))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="int4,fp8_e4m3,int8")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--module", default=None, help="a copy of kvpack/kernels/prefill_workspace.py to compile")
    args = ap.parse_args()
    from triton.backends.compiler import GPUTarget

    from kvpack.attention.kv_cache import allocate_pool
    from kvpack.formats import resolve_format
    from tests.test_kernels_aot import captured_launches, signature

    if args.module:
        spec = importlib.util.spec_from_file_location("prefill_workspace_copy", args.module)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        from kvpack.kernels import prefill_workspace as mod
    for name in args.formats.split(","):
        fmt = resolve_format(name, head_dim=128, model_dtype=torch.bfloat16)
        pool = allocate_pool(fmt, 64, 8, 16, "cpu")
        unrot = mod.can_unrotate(fmt)
        launches = captured_launches(lambda: mod.dequantize_to_workspace(
            pool, pool, torch.arange(32, dtype=torch.int32), 32, torch.bfloat16, unrotate_k=unrot,
            unrotate_v=unrot, v_mean=torch.zeros(8, 128)))
        fn, fargs, opts = launches[0]
        sig, consts, attrs = signature(fn, fargs)
        ck = triton.compile(triton.compiler.ASTSource(fn, sig, consts, attrs),
                            target=GPUTarget("cuda", args.arch, 32), options=opts)
        ops = sass_counts(ck.asm["cubin"])
        print(f"{name:9s} un-rotated={unrot!s:5s} sm_{args.arch} shared={ck.metadata.shared:5d} B "
              f"instructions={sum(ops.values()):5d} " + " ".join(f"{k}={ops[k]}" for k in OPS), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
