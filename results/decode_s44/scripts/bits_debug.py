"""Session 44: test_frag_rot_epilogue_bits_gpu's failing case (fp8_e5m2 K, int8 V, group 4, bf16, V means) with V8_PAIRS
on and off: each path run 3 times (determinism), and epilogue against merge (elements that differ, largest difference)."""
import dataclasses, sys, os
sys.path.insert(0, os.getcwd())
import torch
import kvpack.kernels.decode_attention as da
from tests.test_kernels_decode import merge_case

for k_name, v_name in (("fp8_e5m2", "int8"), ("int8", "int8")):
    for v8p in (False, True):
        for group in (4, 1, 7):
            da.V8_PAIRS = v8p
            lens = [1, 17, 64, 1000, 257, 4099]
            hkv = 8 if group != 7 else 2
            q, lc, meta = merge_case(k_name, v_name, 128, lens, hkv * group, hkv, torch.bfloat16, True, device="cuda")
            qsl = torch.tensor([0, 1, 2, 2, 3, 4, 5], dtype=torch.int32, device="cuda")
            seq_lens = meta.seq_lens.clone()
            seq_lens[4] = 0
            meta = dataclasses.replace(meta, query_start_loc=qsl, seq_lens=seq_lens)
            q = torch.cat([q[:2], q[3:]]).contiguous()
            outs = {}
            for ep in (True, False):
                da.FRAG_ROT_EPILOGUE = ep
                runs = [da.decode_paged_attention(q, lc, meta, 128 ** -0.5, num_splits=1, variant="frag") for _ in range(3)]
                det = all(torch.equal(runs[0], r) for r in runs[1:])
                outs[ep] = runs[0]
                print(f"{k_name}/{v_name} v8p={v8p} group={group} epilogue={ep} deterministic={det}")
            d = (outs[True].float() - outs[False].float()).abs()
            print(f"  epilogue vs merge: {int((d > 0).sum())} of {d.numel()} differ, max {d.max().item():.3g}", flush=True)
da.FRAG_ROT_EPILOGUE = True
