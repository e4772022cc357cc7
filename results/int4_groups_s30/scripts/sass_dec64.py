import os, sys, collections, re
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.getcwd())
if os.environ.get("OLD"): sys.path.insert(0, os.path.join(os.getcwd(), "_ab", "old"))
import torch, triton
from triton.backends.compiler import GPUTarget
from tests.test_kernels_aot import disassemble, signature, split_options
from kvpack.attention import AttentionMetadata, LayerKVCache
from kvpack.kernels.decode_attention import plan_decode
from tests.test_kernels_write import make_pool
Hq, Hkv, D = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
groups = [(a.split(":")[0], int(a.split(":")[1])) if ":" in a else ("int4", int(a)) for a in sys.argv[4].split(",")]
B, S = int(os.environ.get("B", 4)), 4096
nb = S // 16
meta = AttentionMetadata.build([1] * B, [S] * B, [list(range(i * nb, (i + 1) * nb)) for i in range(B)], 16)
q = torch.randn(B, Hq, D, dtype=torch.bfloat16)
for fname, g in groups:
    kn, _, vn = fname.partition("/")
    vn = vn or kn
    lc = LayerKVCache(make_pool(kn, D, B * nb, Hkv, 16, "cpu", g), make_pool(vn, D, B * nb, Hkv, 16, "cpu", g))
    plan = plan_decode(q, lc, meta, D ** -0.5, num_splits=int(os.environ.get("SPLITS", 2)), maxnreg=int(os.environ.get("MAXNREG", 0)) or None)
    an = plan.kernel.arg_names
    cons = {k: plan.args[an.index(k)] for k in an if k in ("BLOCK_N", "K_G", "K_ALIGNED", "GROUP_PAD", "NUM_STAGES")}
    own, opts = split_options(plan.kernel, plan.options)
    sig, consts, attrs = signature(plan.kernel, plan.args, own)
    ck = triton.compile(triton.compiler.ASTSource(plan.kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    sass = disassemble(ck.asm["cubin"])
    import subprocess, tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"]); f.flush()
        cob = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        print("   ", [l.strip() for l in subprocess.run([cob, "-res-usage", f.name], capture_output=True, text=True).stdout.splitlines() if "REG" in l])
    mix = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"^\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*);", line)
        if m:
            mix[m.group(2)] += 1
    print(f"{fname} g{g} {plan.variant} {cons} opts={plan.options} shared={ck.metadata.shared} n={sum(mix.values())}")
    print("   ", ", ".join(f"{k} {v}" for k, v in mix.most_common(25)))
    print("   LD:", sorted((k, v) for k, v in mix.items() if k.startswith(("LDG", "CCTL", "ST", "LDL", "BAR", "MEMBAR", "RED", "ATOM"))))
