"""Triton kernels for the paged, quantized KV cache (a leaf: imports torch, triton, formats).

`write_kv(k, v, layer_cache, slot_mapping)` and `paged_attention(q, layer_cache, metadata, scale)`
have the signatures and semantics of `kvpack.attention.reference` (the oracle the tests compare
against). `paged_attention` runs the split-K decode kernel for pure-decode batches
(`metadata.max_query_len == 1`) and the mixed prefill/decode kernel otherwise.
"""

from __future__ import annotations

import torch

from kvpack.kernels.cache_write import write_kv
from kvpack.kernels.decode_attention import decode_paged_attention


def paged_attention(q: torch.Tensor, layer_cache, metadata, scale: float) -> torch.Tensor:
    """q: [T, Hq, D] -> [T, Hq, D] in q's dtype; causal paged attention over the cache (see reference)."""
    if metadata.max_query_len == 1:
        return decode_paged_attention(q, layer_cache, metadata, scale)
    from kvpack.kernels.prefill_attention import prefill_paged_attention  # lazy: another module's kernel

    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if metadata.decode_split is not None:  # leading decode rows: the decode kernel; the rest: prefill
        dec, rest = metadata.decode_split
        nd = dec.num_seqs
        out[:nd] = decode_paged_attention(q[:nd], layer_cache, dec, scale)
        res = prefill_paged_attention(q[nd:], layer_cache, rest, scale, out[nd:])
        if res is not None:
            out[nd:] = res
        return out
    res = prefill_paged_attention(q, layer_cache, metadata, scale, out)
    return out if res is None else res


__all__ = ["write_kv", "paged_attention", "decode_paged_attention"]
