"""The Hadamard rotation in Triton: the storage order (`_hadamard`, shared with the cache write) and
one small kernel that rotates whole head vectors around the attention kernels.

`_hadamard` repeats `kvpack.formats.hadamard_transform` operation by operation (float32 butterflies
(a, c) -> (a + c, a - c) on channel pairs (i, i + h), h = 1, 2, ..., b/2, then one multiply by the
rounded 1/sqrt(b)), so a kernel that stores rotated values stores the reference's bits (with
`enable_fp_fusion=False` at launch, so no multiply is fused into a following add).

`rotate_heads(x, out_dtype, mean=None)` is the query / output side where an attention kernel does not
rotate itself: q @ R before it (K rotated), out @ R (+ the V mean of centered V, broadcast over each
kv head's query heads) after it, one launch each (prefill, the Gluon decode kernel; `_decode_kernel`
and its split merge call `_hadamard` on q and on the output themselves).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpack.formats import hadamard_block_size, hadamard_norm
from kvpack.kernels.quant import _INTERPRET_C, add_rn, cdiv, f32_to_bf16_rne, next_pow2


@triton.jit
def _butterfly(x, BT: tl.constexpr, DP: tl.constexpr, H: tl.constexpr, FMA: tl.constexpr):
    """One Hadamard stage on x [BT, DP]: channels (i, i + H) of every 2H-chunk -> (a + c, a - c).

    In the view [BT, DP / 2H, 2, H] the pair is axis 2. Each element gets its partner's bits from a
    reduction over that axis, (a + c) - own as int32 (wrapping: exact; one shuffle when the pair sits
    in two lanes, and the compiler folds the subtraction away), then a + c = partner + a and
    a - c = partner + (-c): the reference's IEEE additions. No permute, split or join, which made the
    compiler move every stage through shared memory. (An xor reduction gives the same bits and code,
    but the CPU interpreter runs non-sum reductions element by element in Python.)"""
    y = tl.reshape(x, (BT, DP // (2 * H), 2, H))
    bits = y.to(tl.int32, bitcast=True)
    partner = (tl.sum(bits, 2, keep_dims=True) - bits).to(tl.float32, bitcast=True)
    sgn = (1 - 2 * tl.arange(0, 2)).to(tl.float32)[None, None, :, None]  # +1 for a, -1 for c
    if _INTERPRET_C or not FMA:
        out = partner + y * sgn
    else:  # y * sgn is exact, so one fma rounds as partner + y * sgn does: one instruction, not two
        # where the pair spans lanes (inline, so the write's no-contraction check still sees none)
        out = tl.inline_asm_elementwise("fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f", [y, sgn, partner],
                                        dtype=tl.float32, is_pure=True, pack=1)
    return tl.reshape(out, (BT, DP))


@triton.jit
def _hadamard(x, BT: tl.constexpr, DP: tl.constexpr, HB: tl.constexpr, NORM: tl.constexpr,
              FMA: tl.constexpr = False):
    """x @ R for x [BT, DP] float32 (padding channels 0): stages H = 1, 2, ..., HB/2, then * NORM.
    FMA: stages as one inline fma each (the cache write and `rotate_heads`: fewer instructions where
    pairs span lanes); the decode kernels' q / output rotations measured fewer SASS instructions
    without (sm_90, fp8_e4m3 4440 -> 4328 per program: the compiler folds the +-1 in-thread)."""
    for s in tl.static_range(HB.bit_length() - 1):  # HB a power of two: log2(HB) stages
        x = _butterfly(x, BT, DP, 1 << s, FMA)
    return x * NORM


@triton.jit
def _rotate_heads_kernel(x_ptr, y_ptr, mean_ptr, n_rows, H, group, sx_t, sx_h, sy_t, sy_h,
                         D: tl.constexpr, D_PAD: tl.constexpr, ROWS: tl.constexpr, ROTATE: tl.constexpr,
                         ADD: tl.constexpr, HB: tl.constexpr, NORM: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # row = token * H + head
    rm = r < n_rows
    t = (r // H).to(tl.int64)
    h = r % H
    d = tl.arange(0, D_PAD)
    m = rm[:, None] & (d < D)[None, :]
    x = tl.load(x_ptr + t[:, None] * sx_t + h[:, None] * sx_h + d[None, :], mask=m, other=0.0).to(tl.float32)
    if ROTATE:
        x = _hadamard(x, ROWS, D_PAD, HB, NORM, True)
    if ADD:  # mean [H // group, D] float32 of the row's kv head
        x = add_rn(x, tl.load(mean_ptr + (h // group)[:, None] * D + d[None, :], mask=m, other=0.0))
    y_ptrs = y_ptr + t[:, None] * sy_t + h[:, None] * sy_h + d[None, :]
    if y_ptr.dtype.element_ty == tl.bfloat16:  # round to nearest even on the interpreter too
        tl.store(y_ptrs, f32_to_bf16_rne(x), mask=m)
    else:
        tl.store(y_ptrs, x.to(y_ptr.dtype.element_ty), mask=m)


def rotate_heads(x: torch.Tensor, out_dtype: torch.dtype, rotate: bool = True,
                 mean: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ R (if `rotate`) + mean[h // (H / Hkv)] (if given), as out_dtype.

    x: [T, H, D] any float dtype, last dim contiguous; mean: [Hkv, D] float32 with H % Hkv == 0.
    Returns `out` (given: [T, H, D] of out_dtype, last dim contiguous) or a new tensor; float32 math,
    R = `formats.hadamard(D)`."""
    T, H, D = x.shape
    y = torch.empty((T, H, D), dtype=out_dtype, device=x.device) if out is None else out
    assert y.shape == x.shape and y.dtype == out_dtype and y.stride(-1) == 1, (y.shape, y.dtype)
    if T == 0:
        return y
    if x.stride(-1) != 1:
        x = x.contiguous()
    if mean is not None:
        assert mean.dim() == 2 and mean.shape[1] == D and H % mean.shape[0] == 0, (mean.shape, x.shape)
        mean = mean.to(device=x.device, dtype=torch.float32).contiguous()
    d_pad = next_pow2(D)
    rows = max(1, min(16, 2048 // d_pad, next_pow2(T * H)))
    hb = hadamard_block_size(D)
    group = H // mean.shape[0] if mean is not None else 1
    _rotate_heads_kernel[(cdiv(T * H, rows),)](
        x, y, mean if mean is not None else x, T * H, H, group, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        D=D, D_PAD=d_pad, ROWS=rows, ROTATE=rotate, ADD=mean is not None, HB=hb, NORM=hadamard_norm(hb),
        num_warps=4, enable_fp_fusion=False)
    return y
