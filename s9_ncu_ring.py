import sys, torch
sys.path.insert(0, ".")
from benchmarks.bench_attention import SHAPES, make_case
from kvpack.kernels.decode_attention import decode_paged_attention
pf, sp = int(sys.argv[1]), int(sys.argv[2])
shape = next(s for s in SHAPES if s.name == "llama8b-32x4096")
lc, meta, q = make_case("int8", shape, torch.device("cuda"), torch.Generator().manual_seed(0))
for _ in range(2):
    decode_paged_attention(q, lc, meta, shape.head_dim ** -0.5, variant="frag", prefetch=pf, num_splits=sp)
torch.cuda.synchronize()
