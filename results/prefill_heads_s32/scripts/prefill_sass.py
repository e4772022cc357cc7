"""sm_90 SASS hashes of prefill kernels (no GPU): python results/prefill_heads_s32/scripts/prefill_sass.py [old]
(old: the kvpack of _ab/old, e.g. `git archive 108b642 kvpack | tar x -C _ab/old`)."""
import os, sys, hashlib, collections, re
os.environ["TRITON_INTERPRET"] = "0"
if len(sys.argv) > 1 and sys.argv[1] == "old":
    sys.path.insert(0, os.path.join(os.getcwd(), "_ab", "old"))
sys.path.insert(1, os.getcwd())
import torch, triton
import kvpack
from triton.backends.compiler import GPUTarget
from tests.test_kernels_aot import captured_launches, disassemble, signature, split_options
from kvpack.attention import AttentionMetadata, LayerKVCache
from kvpack.kernels.prefill_launch import prefill_paged_attention, TileConfig
from tests.test_kernels_write import make_pool
print(kvpack.__file__)
for D in (128, 64, 80, 96):
    for name in ("bfloat16", "int8", "fp8_e4m3", "int4"):
        lc = LayerKVCache(make_pool(name, D, 8, 2, 16, "cpu"), make_pool(name, D, 8, 2, 16, "cpu"))
        pq = torch.randn(21, 8, D, dtype=torch.bfloat16)
        for ws in (False, True):
            if ws and name == "bfloat16":
                continue
            meta = AttentionMetadata.build([20, 1], [40, 9], [[0, 1, 2], [3]], 16, workspace=ws)
            cfg = TileConfig(128, 64, 8, 3) if (ws or name == "bfloat16") else TileConfig(128, 64, 8, 3)
            for fn, args, opts in captured_launches(lambda: prefill_paged_attention(pq, lc, meta, 0.1, config=cfg)):
                if fn.__name__ != "_prefill_attn_kernel":
                    continue
                own, o = split_options(fn, opts)
                sig, consts, attrs = signature(fn, args, own)
                ck = triton.compile(triton.compiler.ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=o)
                sass = disassemble(ck.asm["cubin"])
                body = "\n".join(l.split("*/")[-1] for l in sass.splitlines() if "/*" in l)
                n = sum(1 for l in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l))
                print(f"D{D} {name:9s} ws={int(ws)} D_B={own.get('D_B', consts.get('D_B'))} n={n} "
                      f"sha={hashlib.sha1(body.encode()).hexdigest()[:10]}", flush=True)
