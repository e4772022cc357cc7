"""int4 per layer (graph of 8 calls) with the kvpack package at sys.argv[1]; prints JSON lines."""
import json, os, sys
root = sys.argv[1]
sys.path.insert(0, root)
sys.path.insert(1, os.getcwd())
import torch
import kvpack
from benchmarks.bench_attention import SHAPES, make_case, time_graph
from kvpack.kernels.decode_attention import decode_paged_attention
assert kvpack.__file__.startswith(os.path.abspath(root)), kvpack.__file__
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
shapes = {s.name: s for s in SHAPES}
L = 8
for sname in ("llama8b-1x32768", "llama8b-8x8192", "llama8b-32x4096", "llama8b-64x2048", "llama8b-128x1024"):
    shape = shapes[sname]
    scale = shape.head_dim ** -0.5
    cases = [make_case("int4", shape, dev, gen) for _ in range(L)]

    def step():
        for lc, meta, q in cases:
            decode_paged_attention(q, lc, meta, scale)
    us = time_graph(step, 30) / L
    print(json.dumps(dict(tree=sys.argv[2], shape=sname, us_layer=round(us, 2))), flush=True)
    del cases
    torch.cuda.empty_cache()
