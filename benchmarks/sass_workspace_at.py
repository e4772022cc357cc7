"""`sass_workspace.py` for an older tree: the prefill workspace's dequantize kernel of a checkout at
ROOT (e.g. `git worktree add --detach /tmp/wt COMMIT`), compiled for sm_90 with that tree's own
kernels and helpers (planned by this tree's `tests/test_kernels_aot.workspace_sass`), and its SASS
shared-memory traffic counted.

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
    # this tree's counter (`tests.test_kernels_aot.workspace_sass`), loaded by path: once the other
    # tree leads sys.path, the kvpack it imports when called is that tree's
    spec = importlib.util.spec_from_file_location("aot_here", os.path.join(HERE, "tests", "test_kernels_aot.py"))
    here = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(here)
    sys.path.insert(0, root)
    for name in [m for m in list(sys.modules) if m == "kvpack" or m.startswith("kvpack.")]:
        del sys.modules[name]
    import kvpack
    from kvpack.kernels import prefill_workspace

    assert kvpack.__file__.startswith(root), f"kvpack came from {kvpack.__file__}, not {root}"
    for name, c in here.workspace_sass(("int4", "fp8_e4m3"), 90, prefill_workspace).items():
        ops = sum(v for k, v in c.items() if k not in ("shared", "unrotated"))
        print(f"{name:9s} un-rotated={c['unrotated']!s:5s} instructions={ops:5d} LDS={c.get('LDS', 0)} "
              f"STS={c.get('STS', 0)} BAR={c.get('BAR', 0)} SHFL={c.get('SHFL', 0)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
