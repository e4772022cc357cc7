"""sm_90 SASS hash of every Gluon decode variant the AOT test plans at head dim 128 (run from a tree's root):
python sass_hash.py out.json [--all]; --all (session 34): every head dim."""
import os, sys, hashlib, json
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, os.getcwd())
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import _runtime as gr
from tests.test_kernels_aot import variants, signature, split_options, disassemble
out = {}
for name, fn, args, opts in variants():
    if not isinstance(fn, gr.GluonJITFunction) or ("D128" not in name and "--all" not in sys.argv):
        continue
    own, o = split_options(fn, opts)
    sig, consts, attrs = signature(fn, args, own)
    ck = triton.compile(gr.GluonASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=o)
    out[name] = hashlib.sha1(disassemble(ck.asm["cubin"]).encode()).hexdigest()[:12]
    print(name, out[name], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
