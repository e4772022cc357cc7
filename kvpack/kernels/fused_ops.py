"""Fused cheap ops of the Llama block, each a Triton kernel with a PyTorch twin (`*_ref`).

    rms_norm(x, weight, eps)                    x: [T, H] -> [T, H]
    fused_add_rms_norm(x, residual, weight, eps) -> (rms_norm(x + residual), x + residual)
    silu_and_mul(x)                             x: [T, 2I] (gate | up) -> silu(gate) * up: [T, I]
    rotary_embedding(positions, q, k, table)    rotate-half RoPE of q [T, Hq, D] and k [T, Hkv, D]

The twins are transformers' arithmetic, rounding where it rounds (so fused and unfused models give
the same logits): RMSNorm normalizes in float32, casts to x's dtype, then multiplies by the weight;
the residual add rounds to x's dtype; silu is rounded before the multiply; RoPE casts cos/sin to x's
dtype and rounds each product and the sum. The kernels compute in float32 and round at the same
points (round-to-nearest-even, also under the CPU interpreter). Each public function runs the kernel
on CUDA tensors (or when `force_triton`, e.g. under TRITON_INTERPRET=1) and the twin otherwise;
KVPACK_FUSED_OPS=0 forces the twins. Every launch is CUDA-graph safe (sizes from shapes only).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kvpack.kernels.quant import cdiv, f32_round_f16, f32_to_bf16_rne, next_pow2


def fused_ops_enabled(x: torch.Tensor, force_triton: bool = False) -> bool:
    if force_triton:
        return True
    return x.is_cuda and os.environ.get("KVPACK_FUSED_OPS", "1") != "0"


# ---- PyTorch twins ------------------------------------------------------------------------------

def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    h = x + residual
    return rms_norm_ref(h, weight, eps), h


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_embedding_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cs = table[positions].to(q.dtype)  # [T, 2, D/2]
    cos = torch.cat([cs[:, 0], cs[:, 0]], dim=-1)[:, None, :]
    sin = torch.cat([cs[:, 1], cs[:, 1]], dim=-1)[:, None, :]

    def rot(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    return rot(q), rot(k)


# ---- kernels ------------------------------------------------------------------------------------

@triton.jit
def _round(x, OUT_BF16: tl.constexpr, OUT_DT: tl.constexpr):
    """float32 -> the activation dtype (nearest even) -> float32."""
    if OUT_BF16:
        y = f32_to_bf16_rne(x).to(tl.float32)
    elif OUT_DT == tl.float16:
        y = f32_round_f16(x)
    else:
        y = x.to(OUT_DT).to(tl.float32)
    return y


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr, sx, sr, so, sro, H, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr, OUT_BF16: tl.constexpr,
                     OUT_DT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    m = c < H
    x = tl.load(x_ptr + row * sx + c, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        x = _round(x + tl.load(r_ptr + row * sr + c, mask=m, other=0.0).to(tl.float32), OUT_BF16, OUT_DT)
        tl.store(res_out_ptr + row * sro + c, x.to(res_out_ptr.dtype.element_ty), mask=m)
    var = tl.sum(x * x, axis=0) / H
    h = _round(x * (1.0 / tl.sqrt_rn(var + eps)), OUT_BF16, OUT_DT)
    w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * so + c, _round(h * w, OUT_BF16, OUT_DT).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, sx, so, I, BLOCK: tl.constexpr, OUT_BF16: tl.constexpr,
                         OUT_DT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < I
    g = tl.load(x_ptr + row * sx + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * sx + I + c, mask=m, other=0.0).to(tl.float32)
    s = _round(g / (1.0 + tl.exp(-g)), OUT_BF16, OUT_DT)
    tl.store(out_ptr + row * so + c, _round(s * u, OUT_BF16, OUT_DT).to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rope_one(x_ptr, o_ptr, sxt, sxh, sot, soh, t, cos, sin, H, HALF: tl.constexpr,
              H_PAD: tl.constexpr, HALF_PAD: tl.constexpr, OUT_BF16: tl.constexpr, OUT_DT: tl.constexpr):
    h = tl.arange(0, H_PAD)
    j = tl.arange(0, HALF_PAD)
    m = (h < H)[:, None] & (j < HALF)[None, :]
    xp = x_ptr + t * sxt + h[:, None] * sxh + j[None, :]
    x1 = tl.load(xp, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(xp + HALF, mask=m, other=0.0).to(tl.float32)
    o1 = _round(x1 * cos, OUT_BF16, OUT_DT) + _round(-x2 * sin, OUT_BF16, OUT_DT)
    o2 = _round(x2 * cos, OUT_BF16, OUT_DT) + _round(x1 * sin, OUT_BF16, OUT_DT)
    op = o_ptr + t * sot + h[:, None] * soh + j[None, :]
    tl.store(op, _round(o1, OUT_BF16, OUT_DT).to(o_ptr.dtype.element_ty), mask=m)
    tl.store(op + HALF, _round(o2, OUT_BF16, OUT_DT).to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rope_kernel(pos_ptr, table_ptr, q_ptr, k_ptr, qo_ptr, ko_ptr, sqt, sqh, skt, skh, sot, soh, skot, skoh,
                 HQ, HK, HALF: tl.constexpr, HQ_PAD: tl.constexpr, HK_PAD: tl.constexpr,
                 HALF_PAD: tl.constexpr, OUT_BF16: tl.constexpr, OUT_DT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, HALF_PAD)
    jm = j < HALF
    cos = _round(tl.load(table_ptr + p * 2 * HALF + j, mask=jm, other=0.0), OUT_BF16, OUT_DT)[None, :]
    sin = _round(tl.load(table_ptr + p * 2 * HALF + HALF + j, mask=jm, other=0.0), OUT_BF16, OUT_DT)[None, :]
    _rope_one(q_ptr, qo_ptr, sqt, sqh, sot, soh, t, cos, sin, HQ, HALF, HQ_PAD, HALF_PAD, OUT_BF16, OUT_DT)
    _rope_one(k_ptr, ko_ptr, skt, skh, skot, skoh, t, cos, sin, HK, HALF, HK_PAD, HALF_PAD, OUT_BF16, OUT_DT)


# ---- launchers ----------------------------------------------------------------------------------

_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def _dt(x: torch.Tensor) -> tuple[bool, object]:
    assert x.dtype in _TL, f"unsupported dtype {x.dtype}"
    return x.dtype == torch.bfloat16, _TL[x.dtype]


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, force_triton: bool = False) -> torch.Tensor:
    """x: [..., H] float; weight: [H] (same dtype) -> [..., H] in x's dtype."""
    if not fused_ops_enabled(x, force_triton):
        return rms_norm_ref(x, weight, eps)
    x2 = _rows(x)
    out = torch.empty_like(x2)
    _launch_norm(x2, None, weight, out, None, eps)
    return out.reshape(x.shape)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       force_triton: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), both [..., H] in x's dtype; inputs are not modified."""
    if not fused_ops_enabled(x, force_triton):
        return fused_add_rms_norm_ref(x, residual, weight, eps)
    assert residual.shape == x.shape and residual.dtype == x.dtype
    x2, r2 = _rows(x), _rows(residual)
    out, res_out = torch.empty_like(x2), torch.empty_like(x2)
    _launch_norm(x2, r2, weight, out, res_out, eps)
    return out.reshape(x.shape), res_out.reshape(x.shape)


def _launch_norm(x, r, weight, out, res_out, eps: float) -> None:
    T, H = x.shape
    assert weight.shape == (H,) and weight.is_contiguous()
    if T == 0:
        return
    bf16, dt = _dt(x)
    block = next_pow2(H)
    has_res = r is not None
    r, res_out = (r, res_out) if has_res else (x, out)
    _rms_norm_kernel[(T,)](x, r, weight, out, res_out, x.stride(0), r.stride(0), out.stride(0),
                           res_out.stride(0), H, float(eps), has_res, block, bf16, dt,
                           num_warps=min(16, max(1, block // 256)))


def silu_and_mul(x: torch.Tensor, force_triton: bool = False) -> torch.Tensor:
    """x: [..., 2I] (gate then up) -> silu(gate) * up: [..., I] in x's dtype."""
    if not fused_ops_enabled(x, force_triton):
        return silu_and_mul_ref(x)
    x2 = _rows(x)
    T, I2 = x2.shape
    assert I2 % 2 == 0
    out = torch.empty(T, I2 // 2, dtype=x.dtype, device=x.device)
    if T:
        bf16, dt = _dt(x)
        block = min(1024, next_pow2(I2 // 2))
        _silu_and_mul_kernel[(T, cdiv(I2 // 2, block))](x2, out, x2.stride(0), out.stride(0), I2 // 2,
                                                                block, bf16, dt, num_warps=4)
    return out.reshape(*x.shape[:-1], I2 // 2)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, table: torch.Tensor,
                     force_triton: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [T] int64; q: [T, Hq, D], k: [T, Hkv, D] (any strides, last dim contiguous);
    table: [P, 2, D // 2] float32 (cos, sin). Returns new contiguous (q, k) in their dtype."""
    if not fused_ops_enabled(q, force_triton):
        return rotary_embedding_ref(positions, q, k, table)
    T, Hq, D = q.shape
    Hk = k.shape[1]
    assert k.shape == (T, Hk, D) and k.dtype == q.dtype and D % 2 == 0
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and table.is_contiguous() and table.shape[1:] == (2, D // 2)
    qo = torch.empty(T, Hq, D, dtype=q.dtype, device=q.device)
    ko = torch.empty(T, Hk, D, dtype=k.dtype, device=k.device)
    if T:
        bf16, dt = _dt(q)
        _rope_kernel[(T,)](positions, table, q, k, qo, ko, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                           qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1), Hq, Hk, D // 2,
                           next_pow2(Hq), next_pow2(Hk),
                           next_pow2(D // 2), bf16, dt, num_warps=4)
    return qo, ko
