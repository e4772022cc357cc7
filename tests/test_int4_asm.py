"""The int4 -> fp16 inline PTX of the Gluon decode kernels (`decode_frag._ASM_INT4_DEQ`, `_ASM_INT4_DEQ_PAIRS`),
executed on the CPU by a small interpreter of the instructions they use, against code * s + z computed as one
fp16 fma (float64 then one rounding: exact for fp16 operands) from the nibbles themselves. Gluon has no CPU
interpreter, so without this the asm's byte selectors, masks and lookup tables would first meet an oracle on a
GPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

decode_frag = pytest.importorskip("kvpack.kernels.decode_frag")


def _imm(tok: str) -> int:
    return int(tok, 0) & 0xFFFFFFFF


def _f16x2(x: int) -> tuple[np.float16, np.float16]:
    return tuple(np.array([x & 0xFFFF, x >> 16], dtype=np.uint16).view(np.float16))


def _pack(lo, hi) -> int:
    u = np.array([lo, hi], dtype=np.float16).view(np.uint16)
    return int(u[0]) | (int(u[1]) << 16)


def _fma16(a, b, c) -> np.float16:
    return np.float16(np.float64(a) * np.float64(b) + np.float64(c))  # exact, then one round to nearest even


def _prmt(a: int, b: int, sel: int) -> int:
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        s = (sel >> (4 * i)) & 0xF
        assert s < 8, "sign-replicating selectors are not used"
        out |= src[s] << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        i = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> i) & 1) << bit  # lut = f(0xF0, 0xCC, 0xAA): index a b c as bits 2 1 0
    return out


def run_ptx(asm: str, operands: dict[int, int]) -> dict[int, int]:
    """Executes the asm (the instructions the kernels' int4 conversions use) on 32-bit values; operands: $N -> value
    for the inputs; returns every $N afterwards (the outputs among them)."""
    regs: dict[str, int] = {f"${k}": v for k, v in operands.items()}

    def val(tok: str) -> int:
        return regs[tok] if tok in regs else _imm(tok)

    for line in asm.strip().strip("{}").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [t.strip() for t in rest.split(",")]
        d, src = args[0], args[1:]
        if op == "mov.b32":
            r = val(src[0])
        elif op == "and.b32":
            r = val(src[0]) & val(src[1])
        elif op == "or.b32":
            r = val(src[0]) | val(src[1])
        elif op == "shr.b32":
            r = val(src[0]) >> val(src[1])
        elif op == "prmt.b32":
            r = _prmt(val(src[0]), val(src[1]), val(src[2]))
        elif op == "lop3.b32":
            r = _lop3(val(src[0]), val(src[1]), val(src[2]), val(src[3]))
        elif op == "sub.f16x2":
            (a0, a1), (b0, b1) = _f16x2(val(src[0])), _f16x2(val(src[1]))
            r = _pack(np.float16(a0 - b0), np.float16(a1 - b1))
        elif op == "fma.rn.f16x2":
            (a0, a1), (b0, b1), (c0, c1) = (_f16x2(val(s)) for s in src)
            r = _pack(_fma16(a0, b0, c0), _fma16(a1, b1, c1))
        else:
            raise AssertionError(f"instruction {op!r} not interpreted")
        regs[d] = r & 0xFFFFFFFF
    return {int(k[1:]): v for k, v in regs.items() if re.fullmatch(r"\$\d+", k)}


def _params(gen, n):
    """fp16 group scales (>= 2^-10: s / 16 stays a normal fp16) and zero-points, as the int4 write makes them."""
    s = (gen.uniform(2.0 ** -10, 4.0, n)).astype(np.float16)
    z = gen.uniform(-8.0, 8.0, n).astype(np.float16)
    return s, z


def test_int4_deq_pairs_matches_fma():
    """`_ASM_INT4_DEQ_PAIRS` ($8 even token's 4 bytes, $9 odd token's; params packed (even, odd)): output b is
    (even, odd) of byte b's low nibble, output 4 + b of its high nibble, each code * s + z in one fp16 fma. Every
    byte value of both tokens at every byte position, with random group parameters."""
    asm = decode_frag._ASM_INT4_DEQ_PAIRS.value
    gen = np.random.default_rng(0)
    for pos in range(4):
        for even in range(256):
            odd = gen.integers(0, 256, 4)
            odd[pos] = np.arange(256)[(even * 7) % 256]  # every odd byte value too, across the sweep
            ev = gen.integers(0, 256, 4)
            ev[pos] = even
            a = int(sum(int(v) << (8 * i) for i, v in enumerate(ev)))
            b = int(sum(int(v) << (8 * i) for i, v in enumerate(odd)))
            (s_lo_e, s_lo_o, s_hi_e, s_hi_o), (z_lo_e, z_lo_o, z_hi_e, z_hi_o) = _params(gen, 4)
            s16 = [np.float16(s_hi_e * np.float16(0.0625)), np.float16(s_hi_o * np.float16(0.0625))]
            ops = {8: a, 9: b}
            for base, pair in ((10, (s_lo_e, s_lo_o)), (14, (z_lo_e, z_lo_o)), (18, tuple(s16)), (22, (z_hi_e, z_hi_o))):
                for k in range(4):  # the kernel passes each packed pair as 4 equal registers (pack = 4)
                    ops[base + k] = _pack(*pair)
            out = run_ptx(asm, ops)
            for byte in range(4):
                e_code, o_code = int(ev[byte]), int(odd[byte])
                want_lo = (_fma16(e_code & 15, s_lo_e, z_lo_e), _fma16(o_code & 15, s_lo_o, z_lo_o))
                want_hi = (_fma16(e_code >> 4, s_hi_e, z_hi_e), _fma16(o_code >> 4, s_hi_o, z_hi_o))
                assert out[byte] == _pack(*want_lo), (pos, even, byte)
                assert out[4 + byte] == _pack(*want_hi), (pos, even, byte)


def test_int4_deq_matches_fma():
    """`_ASM_INT4_DEQ` ($4: one token's 4 bytes; $5 / $6 the low group's (s, s), $7 / $8 its (z, z), $9-$12 the
    high group's): $0, $1 the low nibbles of bytes (0, 1), (2, 3); $2, $3 the high nibbles; every byte value."""
    asm = decode_frag._ASM_INT4_DEQ.value
    gen = np.random.default_rng(1)
    for value in range(256):
        by = gen.integers(0, 256, 4)
        by[value % 4] = value
        c = int(sum(int(v) << (8 * i) for i, v in enumerate(by)))
        (s_lo, s_hi), (z_lo, z_hi) = _params(gen, 2)
        ops = {4: c, 5: _pack(s_lo, s_lo), 6: _pack(s_lo, s_lo), 7: _pack(z_lo, z_lo), 8: _pack(z_lo, z_lo),
               9: _pack(s_hi, s_hi), 10: _pack(s_hi, s_hi), 11: _pack(z_hi, z_hi), 12: _pack(z_hi, z_hi)}
        out = run_ptx(asm, ops)
        lo = [_fma16(int(v) & 15, s_lo, z_lo) for v in by]
        hi = [_fma16(int(v) >> 4, s_hi, z_hi) for v in by]
        assert [out[0], out[1], out[2], out[3]] == [_pack(lo[0], lo[1]), _pack(lo[2], lo[3]),
                                                    _pack(hi[0], hi[1]), _pack(hi[2], hi[3])], value


def test_interpreter_can_fail():
    """The oracle sees a wrong selector: byte 1 instead of byte 0 changes the outputs."""
    asm = decode_frag._ASM_INT4_DEQ_PAIRS.value.replace("0x0400", "0x0501", 1)
    ops = {8: 0x000000F1, 9: 0x00000000}
    for base in (10, 14, 18, 22):
        for k in range(4):
            ops[base + k] = _pack(np.float16(1.0), np.float16(1.0)) if base != 14 and base != 22 else 0
    good = run_ptx(decode_frag._ASM_INT4_DEQ_PAIRS.value, ops)
    assert good[0] == _pack(np.float16(1.0), np.float16(0.0))  # byte 0's low nibble, 1 * 1 + 0
    assert run_ptx(asm, ops)[0] != good[0]
