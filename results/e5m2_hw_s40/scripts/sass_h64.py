# sm_90 SASS histogram of the decode kernel planned for SmolLM2 32 x 4096 (3 kv heads, head dim 64) per format, as on
# an sm >= 89 GPU (no GPU needed): python results/e5m2_hw_s40/scripts/sass_h64.py fp8_e4m3 fp8_e5m2 [KVPACK_E5M2_HW=1]
import os, sys, re, collections, subprocess, tempfile
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.getcwd())
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import _runtime as gr
from tests.test_kernels_aot import disassemble, signature, split_options
from kvpack.attention import AttentionMetadata, LayerKVCache
import kvpack.kernels.decode_attention as da
from tests.test_kernels_write import make_pool
cob = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
da.hw_fp8_decode = lambda dev: True
B = 32; L = 4096; nb = L // 16
meta = AttentionMetadata.build([1] * B, [L] * B, [list(range(i * nb, (i + 1) * nb)) for i in range(B)], 16)
for f in sys.argv[1:]:
    lc = LayerKVCache(make_pool(f, 64, B * nb, 3, 16, "cpu"), make_pool(f, 64, B * nb, 3, 16, "cpu"))
    plan = da.plan_decode(torch.randn(B, 9, 64, dtype=torch.bfloat16), lc, meta, 0.125, num_splits=22)
    own, opts = split_options(plan.kernel, plan.options)
    sig, consts, attrs = signature(plan.kernel, plan.args, own)
    src = gr.GluonASTSource if isinstance(plan.kernel, gr.GluonJITFunction) else triton.compiler.ASTSource
    ck = triton.compile(src(plan.kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    sass = disassemble(ck.asm["cubin"])
    pass
    ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, re.M))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(ck.asm["cubin"]); fh.flush()
        u = subprocess.run([cob, "-res-usage", fh.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", u).group(1)
    names = plan.kernel.arg_names
    print(f, plan.variant, plan.grid, {k: v for k, v in plan.options.items() if k != "claim_ptr"}, "K_FACTOR", plan.args[names.index("K_FACTOR")],
          "regs", regs, "n", sum(ops.values()), ops.most_common(14), flush=True)
