"""sm_90 SASS stats of decode plans: python _ab/sass_probe.py D HQ HKV FMT [path] [block_n] [warps] [stages] [splits]"""
import os, sys, re, collections, subprocess, tempfile
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.getcwd())
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import _runtime as gr
from tests.test_kernels_aot import disassemble, signature, split_options
from kvpack.attention import AttentionMetadata, LayerKVCache
import kvpack.kernels.decode_plan as dp
from kvpack.kernels.decode_attention import plan_decode
from tests.test_kernels_write import make_pool
cob = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
B = 8; nb = 4096 // 16
meta = AttentionMetadata.build([1] * B, [4096] * B, [list(range(i * nb, (i + 1) * nb)) for i in range(B)], 16)

def stats(d, hq, hkv, f, path=None, bn=None, w=None, st=None, splits=8, maxnreg=None, variant=None):
    orig = dp.int4_group_path
    if path:
        dp.int4_group_path = lambda fmt: (path if fmt.kind == "int4" else None)
    try:
        lc = LayerKVCache(make_pool(f, d, B * nb, hkv, 16, "cpu"), make_pool(f, d, B * nb, hkv, 16, "cpu"))
        plan = plan_decode(torch.randn(B, hq, d, dtype=torch.bfloat16), lc, meta, d ** -0.5, num_splits=splits,
                           block_n=bn, num_warps=w, num_stages=st, maxnreg=maxnreg, variant=variant)
    finally:
        dp.int4_group_path = orig
    own, opts = split_options(plan.kernel, plan.options)
    sig, consts, attrs = signature(plan.kernel, plan.args, own)
    src = gr.GluonASTSource if isinstance(plan.kernel, gr.GluonJITFunction) else triton.compiler.ASTSource
    ck = triton.compile(src(plan.kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    sass = disassemble(ck.asm["cubin"])
    ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, re.M))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(ck.asm["cubin"]); fh.flush()
        u = subprocess.run([cob, "-res-usage", fh.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", u).group(1)
    bn = plan.args[plan.kernel.arg_names.index("BLOCK_N")]
    sp = sum(v for k, v in ops.items() if k.startswith(("LDL", "STL")))
    small = sum(v for k, v in ops.items() if k in ("LDG.E.U16", "LDG.E.U8", "LDG.E.S8", "LDG.E.S16"))
    ldg = {k: v for k, v in ops.items() if k.startswith("LDG")}
    return (f"D{d} {hq}/{hkv} {f:10s} path={path} {plan.variant} bn={bn} w={opts.get('num_warps')} st={opts.get('num_stages')} "
            f"regs={regs} n={sum(ops.values())} spills={sp} smallLDG={small} STS={sum(v for k,v in ops.items() if k.startswith('STS'))} "
            f"LDS={sum(v for k,v in ops.items() if k.startswith('LDS'))} LDG={ldg}")

if __name__ == "__main__":
    a = sys.argv[1:]
    conv = lambda x: None if x in (None, "-", "") else int(x)
    print(stats(int(a[0]), int(a[1]), int(a[2]), a[3], (a[4] if len(a) > 4 and a[4] != "-" else None),
                *(conv(x) for x in a[5:9])), flush=True)
