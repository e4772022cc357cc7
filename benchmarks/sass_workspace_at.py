"""`sass_workspace.py` for an older tree: the prefill workspace's dequantize kernel of a checkout at
ROOT (e.g. `git worktree add --detach /tmp/wt COMMIT`), compiled for sm_90 with that tree's own
kernels, helpers and AOT test signature code, and its SASS shared-memory traffic counted.

Session 14 bisected int4's regression with it: 8db1c8d (int4 prefill measured 1.03x bf16) int4
LDS / STS / BAR 18 / 24 / 37, FP8 18 / 16 / 21; 6361b4f (the shuffle butterfly) and every commit up to
3eb0db3: int4 148 / 161 / 25, FP8 8 / 4 / 5 (results/engine_s14).

    python benchmarks/sass_workspace_at.py ROOT
"""

import importlib.util
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before triton loads: compile, do not interpret
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    root = os.path.abspath(sys.argv[1])
    # this tree's SASS counter, loaded by path: `tests` on sys.path is the other tree's
    spec = importlib.util.spec_from_file_location("aot_here", os.path.join(HERE, "tests", "test_kernels_aot.py"))
    here = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(here)
    sys.path.insert(0, root)  # that tree's kvpack and tests, before this one's
    for name in [m for m in list(sys.modules) if m == "kvpack" or m.startswith(("kvpack.", "tests"))]:
        del sys.modules[name]
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    import kvpack
    from kvpack.attention.kv_cache import allocate_pool
    from kvpack.formats import resolve_format
    from kvpack.kernels import prefill_workspace as module
    from tests.test_kernels_aot import captured_launches, signature

    assert kvpack.__file__.startswith(root), f"kvpack came from {kvpack.__file__}, not {root}"
    for name in ("int4", "fp8_e4m3"):
        fmt = resolve_format(name, head_dim=128, model_dtype=torch.bfloat16)
        pool = allocate_pool(fmt, 64, 8, 16, "cpu")
        unrot = module.can_unrotate(fmt)
        (fn, args, opts), = captured_launches(lambda: module.dequantize_to_workspace(
            pool, pool, torch.arange(32, dtype=torch.int32), 32, torch.bfloat16, unrotate_k=unrot, unrotate_v=unrot,
            v_mean=torch.zeros(8, 128)))
        sig, consts, attrs = signature(fn, args)
        ck = triton.compile(triton.compiler.ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                            options=opts)
        c = here.sass_counts(ck.asm["cubin"])
        print(f"{name:9s} un-rotated={unrot!s:5s} instructions={sum(c.values()):5d} LDS={c.get('LDS', 0)} "
              f"STS={c.get('STS', 0)} BAR={c.get('BAR', 0)} SHFL={c.get('SHFL', 0)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
