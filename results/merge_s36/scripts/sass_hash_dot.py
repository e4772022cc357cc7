"""sm_90 SASS hash of every Triton decode / merge variant the AOT test plans, ALL_Q variants left out (run from a
tree's root): python sass_hash_dot.py out.json. Session 36: the same 29 hashes at 9c29326 and after ALL_Q."""
import os, sys, hashlib, json
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.getcwd())
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import _runtime as gr
from tests.test_kernels_aot import variants, signature, split_options, disassemble
out = {}
for name, fn, args, opts in variants():
    if isinstance(fn, gr.GluonJITFunction) or not name.startswith(("decode/", "decode-imma", "merge/")) or "allq" in name:
        continue
    own, o = split_options(fn, opts)
    sig, consts, attrs = signature(fn, args, own)
    ck = triton.compile(triton.compiler.ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=o)
    out[name] = hashlib.sha1(disassemble(ck.asm["cubin"]).encode()).hexdigest()[:12]
json.dump(out, open(sys.argv[1], "w"), indent=1)
