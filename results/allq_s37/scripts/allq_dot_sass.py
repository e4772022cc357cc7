"""Session 37: sm_90 SASS of the production decode plans ("dot" / "imma") with and without ALL_Q (CPU, no GPU):
instructions in all, in the first loops, PLOP3s, local stores. python allq_dot_sass.py from the repository root."""
import os, sys, re
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.getcwd())
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import _runtime as gr
from tests.test_kernels_aot import disassemble, signature, split_options
from benchmarks.sass_all_variants import loop_mixes_of
from kvpack.attention import AttentionMetadata, LayerKVCache
import kvpack.kernels.decode_plan as dp
import kvpack.kernels.decode_attention as da
from tests.test_kernels_write import make_pool
da.hw_fp8_decode = lambda d: True
dp._sm_count = lambda d: 132
da._sm_count = lambda d: 132
da.INTERPRET = False
def run(B, ctx, f, hq=32, hkv=8, d=128):
    nb = ctx // 16
    meta = AttentionMetadata.build([1] * B, [ctx] * B, [list(range(i * nb, (i + 1) * nb)) for i in range(B)], 16)
    lc = LayerKVCache(make_pool(f, d, B * nb, hkv, 16, "cpu"), make_pool(f, d, B * nb, hkv, 16, "cpu"))
    q = torch.randn(B, hq, d, dtype=torch.bfloat16)
    for allq in (False, True):
        da.ALL_Q_VARIANTS = ("fragt", "dot", "imma") if allq else ("fragt",)
        plan = da.plan_decode(q, lc, meta, d ** -0.5)
        own, opts = split_options(plan.kernel, plan.options)
        sig, consts, attrs = signature(plan.kernel, plan.args, own)
        src = gr.GluonASTSource if isinstance(plan.kernel, gr.GluonJITFunction) else triton.compiler.ASTSource
        ck = triton.compile(src(plan.kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
        sass = disassemble(ck.asm["cubin"])
        n = len(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+\S", sass, re.M))
        loops = loop_mixes_of(sass)
        print(B, ctx, f, plan.variant, plan.grid, "ALL_Q", allq, "total", n, "loops", [sum(c.values()) for _, c in loops][:3], "PLOP3", [c["PLOP3.LUT"] for _, c in loops][:2], "spills", sass.count("STL"), flush=True)
for B, ctx, f in [(64, 2048, "bf16"), (8, 8192, "bf16"), (1, 32768, "bf16")]:
    run(B, ctx, f)
for f in ("bf16", "int4"):
    run(32, 4096, f, 9, 3, 64)
