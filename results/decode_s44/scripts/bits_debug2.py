"""Session 44: where "frag"'s one-split epilogue and the merge kernel's output differ with V8_PAIRS (fp8_e5m2 K, int8
V, group 4, V means): the differing elements' positions and values, with the merge path's partials (acc, m, l)."""
import dataclasses, sys, os
sys.path.insert(0, os.getcwd())
import torch
import kvpack.kernels.decode_attention as da
from tests.test_kernels_decode import merge_case

for dtype in (torch.bfloat16, torch.float32):
    for v8p in (False, True):
        da.V8_PAIRS = v8p
        lens = [1, 17, 64, 1000, 257, 4099]
        q, lc, meta = merge_case("fp8_e5m2", "int8", 128, lens, 32, 8, torch.bfloat16, True, device="cuda")
        qsl = torch.tensor([0, 1, 2, 2, 3, 4, 5], dtype=torch.int32, device="cuda")
        seq_lens = meta.seq_lens.clone()
        seq_lens[4] = 0
        meta = dataclasses.replace(meta, query_start_loc=qsl, seq_lens=seq_lens)
        q = torch.cat([q[:2], q[3:]]).contiguous().to(dtype)
        outs, plans = {}, {}
        for ep in (True, False):
            da.FRAG_ROT_EPILOGUE = ep
            plans[ep] = da.plan_decode(q, lc, meta, 128 ** -0.5, num_splits=1, variant="frag")
            outs[ep] = da.decode_paged_attention(q, lc, meta, 128 ** -0.5, num_splits=1, variant="frag").float()
        d = (outs[True] - outs[False]).abs()
        idx = (d > 0).nonzero().tolist()
        print(f"dtype={dtype} v8p={v8p}: {len(idx)} of {d.numel()} differ, max {d.max().item():.3g}; options "
              f"{plans[True].options} / {plans[False].options}", flush=True)
        for t, hq, c in idx[:6]:
            print(f"   t={t} hq={hq} c={c}: epilogue {outs[True][t, hq, c].item()!r} merge {outs[False][t, hq, c].item()!r}")
da.FRAG_ROT_EPILOGUE = True
