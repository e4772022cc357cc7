"""sm_90 SASS instruction mix of the int4 row-layout write at groups 32 / 64 / 128 (no GPU)."""
import os, sys, collections
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.getcwd())
import torch, triton
from triton.backends.compiler import GPUTarget
from tests.test_kernels_aot import disassemble, signature, split_options
from kvpack.attention import LayerKVCache
from kvpack.kernels.cache_write import ROW_MIN_TOKENS, _cache_write_kernel, plan_write
from tests.test_kernels_write import make_pool
import re
D = 128
for name, g in [(n, int(x)) for n, x in (a.split(":") for a in sys.argv[1].split(","))]:
    kl = torch.zeros(ROW_MIN_TOKENS, 2, D, dtype=torch.bfloat16)
    lcl = LayerKVCache(make_pool(name, D, ROW_MIN_TOKENS // 16, 2, 16, "cpu", g), make_pool(name, D, ROW_MIN_TOKENS // 16, 2, 16, "cpu", g))
    grid, args, opts = plan_write(kl, kl, lcl, torch.arange(ROW_MIN_TOKENS))
    own, opts = split_options(_cache_write_kernel, opts)
    sig, consts, attrs = signature(_cache_write_kernel, args, own)
    ck = triton.compile(triton.compiler.ASTSource(_cache_write_kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    sass = disassemble(ck.asm["cubin"])
    mix = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"^\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*);", line)
        if m:
            mix[m.group(2).split(".")[0]] += 1
    bt = ROW_MIN_TOKENS // grid[0]
    n = sum(mix.values())
    per = bt * D * 2 / (opts.get("num_warps", 4) * 32)
    print(f"{name} g{g}: bt={bt} {n} instr, {n/per:.2f} / element;", ", ".join(f"{k} {v}" for k, v in mix.most_common(30)))
    if len(sys.argv) > 2:
        open(f"_ab/sass_{name}_g{g}.txt", "w").write(sass)
