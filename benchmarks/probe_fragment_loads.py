"""Compile-only probe (no GPU): the int8 K side of a decode tile with codes loaded straight into the
MMA operand layout (Triton's Gluon dialect), against the Triton decode kernel's main loop.

    python benchmarks/probe_fragment_loads.py [--arch 90]

The Triton language cannot choose a load's layout, so the decode kernel converts each K and V tile
to fp16 in a load layout and stages it through shared memory into the layout of the MMA's operands
(STS + LDSM per tile). With explicit layouts each lane can load exactly the codes of its own B
fragments: for mma.m16n8k16 a lane holds, per 8-token n-tile, channels {16 j + 8 h + 2 t + e} of
token lane / 4 (t = lane % 4). Permuting the head dimension (q and K alike, so q . k is unchanged)
puts those 32 channels at bytes 32 t .. 32 t + 31 of the row: two 16-byte loads per token, no
shared memory, and `convert_layout(..., assert_trivial=True)` proves the hand-over moves no data.

Prints the SASS of both main loops (instructions per 64-token tile by opcode, registers, shared
memory). The probe covers QK only (no softmax, no V, no paging); it is a measurement of what the
staging costs, not a kernel. Not run by the tests.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

from kvpack.kernels.quant import _ASM_INT8_F16  # noqa: E402

MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
A_OP = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
B_OP = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
# the physical K tile as [i 8, nl 8, t 4, b 32]: token 8 i + nl, byte 32 t + b; lane = 4 nl + t, and the
# 8 x 32 codes of (i, b) in its registers (16-byte loads)
LOAD = gl.BlockedLayout(size_per_thread=[8, 1, 1, 32], threads_per_warp=[1, 8, 4, 1],
                        warps_per_cta=[1, 1, 1, 1], order=[3, 2, 1, 0])
ASM_INT8_F16 = gl.constexpr(_ASM_INT8_F16.value)


@gluon.jit
def _qk_fragment_probe(k_ptr, q_ptr, o_ptr, n_tiles):
    i = gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LOAD))))
    nl = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, LOAD))))
    t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LOAD))))
    b = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LOAD))))
    off = ((i * 8)[:, None, None, None] + nl[None, :, None, None]) * 128 + (t * 32)[None, None, :, None] \
        + b[None, None, None, :]
    # q in the logical channel order: logical k = 16 j + 8 h + 2 t + e is physical 32 t + 4 j + 2 h + e
    qm = gl.arange(0, 16, layout=gl.SliceLayout(1, A_OP))
    qk = gl.arange(0, 128, layout=gl.SliceLayout(0, A_OP))
    phys = ((qk >> 1) & 3) * 32 + (qk >> 4) * 4 + ((qk >> 3) & 1) * 2 + (qk & 1)
    q = gl.load(q_ptr + qm[:, None] * 128 + phys[None, :])
    acc = gl.full([16, 64], 0.0, gl.float32, layout=MMA)
    for it in range(n_tiles):
        c = gl.load(k_ptr + it * 8192 + off)
        x = gl.inline_asm_elementwise(ASM_INT8_F16, "=r,=r,r", [c], dtype=gl.float16, is_pure=True, pack=4)
        x = gl.permute(gl.reshape(x, [8, 8, 4, 8, 2, 2]), [3, 4, 2, 5, 0, 1])  # (j, h, t, e, i, nl)
        kb = gl.convert_layout(gl.reshape(x, [128, 64]), B_OP, assert_trivial=True)
        acc = mma_v2(q, kb, acc)
    om = gl.arange(0, 16, layout=gl.SliceLayout(1, MMA))
    on = gl.arange(0, 64, layout=gl.SliceLayout(0, MMA))
    gl.store(o_ptr + om[:, None] * 64 + on[None, :], acc)


def _sass_loop(cubin: bytes) -> tuple[int, collections.Counter, int]:
    """(instructions in the first backward-branch loop, their opcodes, registers) of a cubin: the decode
    kernel's whole-tile loop (its second loop is the masked last tile)."""
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
        res = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = [(int(t.group(1), 16), a) for a, text in ins if "BRA" in text
             for t in [re.search(r"0x([0-9a-f]+)", text)] if t and int(t.group(1), 16) < a]
    lo, hi = min(loops)
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
                              for a, text in ins if lo <= a <= hi)
    return sum(ops.values()), ops, int(re.search(r"REG:(\d+)", res).group(1))


def _triton_decode_cubin(arch: int) -> tuple[bytes, int]:
    """The Triton decode kernel's default int8 variant (D 128, GQA 4), compiled as tests/test_kernels_aot."""
    from kvpack.attention import AttentionMetadata, LayerKVCache
    from kvpack.kernels.decode_attention import plan_decode
    from tests.test_kernels_aot import signature
    from tests.test_kernels_write import make_pool

    lc = LayerKVCache(make_pool("int8", 128, 64, 8, 16, "cpu"), make_pool("int8", 128, 64, 8, 16, "cpu"))
    meta = AttentionMetadata.build([1, 1], [400, 900], [list(range(25)), list(range(25, 82))], 16)
    plan = plan_decode(torch.randn(2, 32, 128, dtype=torch.bfloat16), lc, meta, 0.1, num_splits=1)
    sig, consts, attrs = signature(plan.kernel, plan.args)
    ck = triton.compile(triton.compiler.ASTSource(plan.kernel, sig, consts, attrs),
                        target=GPUTarget("cuda", arch, 32), options=plan.options)
    return ck.asm["cubin"], ck.metadata.shared


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 86, 90")
    args = ap.parse_args()
    div16 = [["tt.divisibility", 16]]
    src = gluon._runtime.GluonASTSource(
        _qk_fragment_probe, {"k_ptr": "*i8", "q_ptr": "*fp16", "o_ptr": "*fp32", "n_tiles": "i32"}, {},
        {(0,): div16, (1,): div16, (2,): div16})
    probe = triton.compile(src, target=GPUTarget("cuda", args.arch, 32), options={"num_warps": 1})
    cubin, shared = _triton_decode_cubin(args.arch)
    for name, (binary, smem) in {"gluon probe, K side only (QK)": (probe.asm["cubin"], probe.metadata.shared),
                                 "triton decode kernel, int8 (QK + softmax + PV)": (cubin, shared)}.items():
        n, ops, regs = _sass_loop(binary)
        print(f"sm_{args.arch} {name}: {n} instructions per 64-token tile, {regs} registers, "
              f"{smem} bytes shared memory")
        print("   ", ", ".join(f"{op} {k}" for op, k in ops.most_common(12)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
