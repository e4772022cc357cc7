import os, sys, re, collections, subprocess, tempfile, json
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.getcwd())  # run from the repository root
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import _runtime as gr
from tests.test_kernels_aot import disassemble, signature, split_options
from kvpack.attention import AttentionMetadata, LayerKVCache
from kvpack.kernels.decode_attention import plan_decode
from tests.test_kernels_write import make_pool
cob = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
B = 8; nb = 4096 // 16
meta = AttentionMetadata.build([1] * B, [4096] * B, [list(range(i * nb, (i + 1) * nb)) for i in range(B)], 16)
for d, hq, hkv in ((64, 32, 8), (80, 32, 32), (96, 32, 32), (128, 32, 8), (256, 16, 8)):
    for f in ("bfloat16", "int8", "int8-static", "int4", "fp8_e4m3", "fp8_e5m2"):
        lc = LayerKVCache(make_pool(f, d, B * nb, hkv, 16, "cpu"), make_pool(f, d, B * nb, hkv, 16, "cpu"))
        for splits in (1, 8):
            try:
                plan = plan_decode(torch.randn(B, hq, d, dtype=torch.bfloat16), lc, meta, d ** -0.5, num_splits=splits)
                own, opts = split_options(plan.kernel, plan.options)
                sig, consts, attrs = signature(plan.kernel, plan.args, own)
                src = gr.GluonASTSource if isinstance(plan.kernel, gr.GluonJITFunction) else triton.compiler.ASTSource
                ck = triton.compile(src(plan.kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
            except Exception as e:
                print(d, f, splits, "ERR", str(e)[:100]); continue
            ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", disassemble(ck.asm["cubin"]), re.M))
            with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
                fh.write(ck.asm["cubin"]); fh.flush()
                u = subprocess.run([cob, "-res-usage", fh.name], capture_output=True, text=True).stdout
            regs = re.search(r"REG:(\d+)", u).group(1)
            bn = plan.args[plan.kernel.arg_names.index("BLOCK_N")] if "BLOCK_N" in plan.kernel.arg_names else "?"
            sp = sum(v for k, v in ops.items() if k.startswith(("LDL", "STL")))
            small = sum(v for k, v in ops.items() if k in ("LDG.E.U16", "LDG.E.U8", "LDG.E.S8", "LDG.E.S16"))
            print(f"D{d} {hq}/{hkv} {f:12s} s{splits} {plan.variant:6s} bn={bn} w={opts.get('num_warps')} regs={regs} n={sum(ops.values())} spills={sp} smallLDG={small} STS={sum(v for k,v in ops.items() if k.startswith('STS'))} smem={ck.metadata.shared}", flush=True)
