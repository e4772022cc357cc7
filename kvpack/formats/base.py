"""The KV format definition: `KVFormat`, the format registry, `resolve_format`, bytes per token.

This module is the single source of the format constants that the PyTorch reference, the Triton
kernels, the calibrator and the memory planner read:

- kernel ids `FMT_FLOAT=0, FMT_INT8=1, FMT_INT4=2, FMT_FP8E4M3=3, FMT_FP8E5M2=4` (a `tl.constexpr`);
- `QMAX[kind]`: the code range a dynamic or static scale maps the absmax onto
  (int8 127, int4 15, fp8_e4m3 448, fp8_e5m2 57344);
- `SCALE_DTYPE = torch.float16`: per-token scales and int4 zero-points are stored as float16.

The bit-level codecs live next door (`integer.py`: int8/int4, `fp8.py`: software FP8,
`rotation.py`: Hadamard); each registers its quantize/dequantize pair here under its `kind`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from kvpack.config import ConfigError, ModelConfig

# ---- kernel ids (Triton constexpr) ---------------------------------------------------------
FMT_FLOAT = 0
FMT_INT8 = 1
FMT_INT4 = 2
FMT_FP8E4M3 = 3
FMT_FP8E5M2 = 4

KINDS = ("float", "int8", "int4", "fp8_e4m3", "fp8_e5m2")
KERNEL_IDS = {"float": FMT_FLOAT, "int8": FMT_INT8, "int4": FMT_INT4,
              "fp8_e4m3": FMT_FP8E4M3, "fp8_e5m2": FMT_FP8E5M2}

# ---- code ranges and scale storage ---------------------------------------------------------
QMAX_INT8 = 127
QMAX_INT4 = 15
QMAX_FP8E4M3 = 448.0
QMAX_FP8E5M2 = 57344.0
QMAX = {"int8": QMAX_INT8, "int4": QMAX_INT4, "fp8_e4m3": QMAX_FP8E4M3, "fp8_e5m2": QMAX_FP8E5M2}
SCALE_DTYPE = torch.float16  # per-token scales and int4 zero-points
STATIC_SCALE_DTYPE = torch.float32  # per-(layer, kv head) scales from a scales file
STATIC_KINDS = ("int8", "fp8_e4m3", "fp8_e5m2")  # kinds that accept static scales

INT4_GROUP_SIZES = (32, 64, 128)  # 128: one group per head at head_dim >= 128 (the most capacity)
INT4_MIN_GROUP = 8

# ---- user-facing names ---------------------------------------------------------------------
FORMAT_NAMES = ("auto", "bfloat16", "float16", "float32", "int8", "int4", "fp8_e4m3", "fp8_e5m2")
_ALIASES = {
    "bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
    "float": "float32", "fp8": "fp8_e4m3", "fp8_e4m3fn": "fp8_e4m3",
}
_FLOAT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_STORAGE = {"int8": torch.int8, "int4": torch.uint8, "fp8_e4m3": torch.uint8, "fp8_e5m2": torch.uint8}


def dynamic_scale(absmax: torch.Tensor, qmax: float) -> torch.Tensor:
    """fp16(absmax / qmax), with 0 -> 1 (all-zero rows, or underflow). absmax: float32, any shape."""
    # Divide by a tensor: torch turns a division by a Python scalar into a multiplication by its
    # reciprocal on CUDA, which is not the IEEE division the format (and the kernels) define.
    absmax = absmax.float()
    s = (absmax / torch.full_like(absmax, float(qmax))).to(SCALE_DTYPE)
    return torch.where(s == 0, torch.ones_like(s), s)


class Codec(NamedTuple):
    """quantize(fmt, x, static_scale) -> (codes, scales, zeros);
    dequantize(fmt, codes, scales, zeros, static_scale) -> x."""

    quantize: Callable
    dequantize: Callable


_CODECS: dict[str, Codec] = {}


def register_codec(kind: str, codec: Codec) -> None:
    assert kind in KINDS, kind
    _CODECS[kind] = codec


@dataclass(frozen=True)
class KVFormat:
    """How one side (K or V) of one (token, kv head) is stored in the cache.

    kind:          "float" | "int8" | "int4" | "fp8_e4m3" | "fp8_e5m2"
    storage_dtype: bf16/fp16/fp32 (float), int8 (int8), uint8 (int4 packed pairs, fp8 codes)
    scale_mode:    "none" (float), "token" (a float16 scale per (token, head[, group]) in the
                   cache), "static" (a float32 scale per (layer, kv head) from a scales file)
    group_size:    int4: channels per scale/zero group; other kinds: head_dim
    rotate:        int4 and fp8: K/V are stored as `x @ R` (`rotation(device)`); see ROTATE_KINDS
    center:        the side is stored minus a per-(layer, kv head, channel) mean (before the rotation):
                   for K attention is unchanged (every score of a query shifts by the same q . mean),
                   for V the mean is added back to the attention output (probabilities sum to 1).
                   See CENTER_KINDS; the means come from a scales file or a probe run at start.
    """

    name: str
    kind: str
    kernel_id: int
    storage_dtype: torch.dtype
    scale_mode: str
    head_dim: int
    group_size: int
    rotate: bool = False
    has_zero: bool = False
    center: bool = False

    @property
    def is_quantized(self) -> bool:
        return self.kind != "float"

    @property
    def qmax(self) -> float | None:
        return QMAX.get(self.kind)

    @property
    def code_width(self) -> int:
        """Elements of `storage_dtype` per (token, head)."""
        return self.head_dim // 2 if self.kind == "int4" else self.head_dim

    @property
    def num_groups(self) -> int:
        """Scale (and zero) entries per (token, head) stored in the cache."""
        return self.head_dim // self.group_size if self.scale_mode == "token" else 0

    @property
    def bytes_per_token_head(self) -> int:
        code_bytes = self.code_width * self.storage_dtype.itemsize
        scale_bytes = self.num_groups * SCALE_DTYPE.itemsize
        zero_bytes = scale_bytes if self.has_zero else 0
        return code_bytes + scale_bytes + zero_bytes

    def quantize(
        self, x: torch.Tensor, static_scale: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """x: [N, H, D] float32 (already rotated if `rotate`); static_scale: [H] float32.

        Returns codes [N, H, code_width] storage_dtype and scales, zeros [N, H, num_groups]
        float16 (or None when the format stores none).
        """
        if x.dim() != 3 or x.shape[-1] != self.head_dim:
            raise ValueError(f"{self.name}: expected x of shape [N, H, {self.head_dim}], got {tuple(x.shape)}")
        self._check_static(static_scale, x.shape[1])
        return _CODECS[self.kind].quantize(self, x.float(), static_scale)

    def dequantize(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor | None = None,
        zeros: torch.Tensor | None = None,
        static_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Inverse of `quantize`: returns [N, H, D] float32 (still rotated if `rotate`)."""
        if codes.dim() != 3 or codes.shape[-1] != self.code_width:
            raise ValueError(
                f"{self.name}: expected codes of shape [N, H, {self.code_width}], got {tuple(codes.shape)}"
            )
        self._check_static(static_scale, codes.shape[1])
        return _CODECS[self.kind].dequantize(self, codes, scales, zeros, static_scale)

    def rotation(self, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """[D, D] float32 orthogonal symmetric R (R @ R = I), or None when not rotating."""
        if not self.rotate:
            return None
        from kvpack.formats.rotation import hadamard

        return hadamard(self.head_dim, device)

    def _check_static(self, static_scale: torch.Tensor | None, num_heads: int) -> None:
        if self.scale_mode == "static":
            if static_scale is None or tuple(static_scale.shape) != (num_heads,):
                got = None if static_scale is None else tuple(static_scale.shape)
                raise ValueError(f"{self.name} (static): needs static_scale of shape [{num_heads}], got {got}")
        elif static_scale is not None:
            raise ValueError(f"{self.name}: static_scale given but scale_mode is {self.scale_mode!r}")


def canonical_name(name: str) -> str:
    """Map an alias (bf16, fp8, ...) to its canonical format name; ConfigError if unknown."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in FORMAT_NAMES:
        raise ConfigError(
            f"unknown KV cache dtype {name!r}; valid: " + ", ".join(FORMAT_NAMES)
            + " (aliases: " + ", ".join(f"{a}={c}" for a, c in _ALIASES.items()) + ")"
        )
    return key


def resolve_int4_group(head_dim: int, group_size: int = 32) -> int:
    """Channels per int4 scale/zero group for this head dim (see the format definition)."""
    if head_dim <= 0 or head_dim % 2:
        raise ConfigError(f"int4 cannot handle head_dim {head_dim}: it must be even (two channels per byte)")
    if group_size < INT4_MIN_GROUP or group_size & (group_size - 1):
        raise ConfigError(f"int4 group size must be a power of two >= {INT4_MIN_GROUP}, got {group_size}")
    if head_dim % group_size == 0:
        return group_size
    g = group_size
    while g >= INT4_MIN_GROUP and head_dim % g:
        g //= 2
    if g < INT4_MIN_GROUP:
        raise ConfigError(
            f"int4 cannot handle head_dim {head_dim}: no power-of-two group of {INT4_MIN_GROUP}.."
            f"{group_size} channels divides it"
        )
    return g


# Which quantized kinds rotate the head dimension (Hadamard) and which sides are mean-centered, chosen by
# measured accuracy (SmolLM2-135M on jargon.txt, results/eval/centering.md): the rotation helps int4
# (keys with outlier channels) and fp8 (top-1 agreement 0.947 -> 0.953 per token); centering K helps
# every integer and fp8 kind (keys carry large stable per-channel offsets); centering V helps fp8 but
# costs int4 accuracy, and int8 V does not need it.
ROTATE_KINDS = ("int4", "fp8_e4m3", "fp8_e5m2")
CENTER_KINDS = {"k": ("int8", "int4", "fp8_e4m3", "fp8_e5m2"), "v": ("fp8_e4m3", "fp8_e5m2")}


def _dtype_name(dtype: torch.dtype) -> str:
    for n, d in _FLOAT_DTYPES.items():
        if d == dtype:
            return n
    raise ConfigError(f"model dtype {dtype} has no KV cache format; use bfloat16, float16 or float32")


def resolve_format(
    name: str,
    *,
    head_dim: int,
    static: bool = False,
    rotate: bool = True,
    int4_group_size: int = 32,
    model_dtype: torch.dtype = torch.bfloat16,
    side: str | None = None,
    center: bool = False,
) -> KVFormat:
    """Resolve a `--kv-cache-dtype` value to a `KVFormat` for one side (K or V).

    `static` switches int8/fp8 to per-(layer, kv head) scales (ignored for float formats; an
    error for int4). `rotate` applies to ROTATE_KINDS only. `center` (with `side` "k" or "v")
    centers the kinds CENTER_KINDS[side]. `auto` is the model's activation dtype.
    """
    canon = canonical_name(name)
    if canon == "auto":
        canon = _dtype_name(model_dtype)
    if head_dim <= 0:
        raise ConfigError(f"head_dim must be positive, got {head_dim}")
    if canon in _FLOAT_DTYPES:
        return KVFormat(canon, "float", FMT_FLOAT, _FLOAT_DTYPES[canon], "none", head_dim, head_dim)
    kind = canon
    if side not in (None, "k", "v"):
        raise ValueError(f"side must be 'k' or 'v', got {side!r}")
    centered = bool(center) and side is not None and kind in CENTER_KINDS[side]
    if kind == "int4":
        if static:
            raise ConfigError("int4 has no static-scale mode (its scales and zero-points are per token); "
                              "use int8 or fp8 with --kv-scales")
        g = resolve_int4_group(head_dim, int4_group_size)
        return KVFormat(canon, kind, KERNEL_IDS[kind], _STORAGE[kind], "token", head_dim, g,
                        rotate=bool(rotate), has_zero=True, center=centered)
    mode = "static" if static else "token"
    return KVFormat(canon, kind, KERNEL_IDS[kind], _STORAGE[kind], mode, head_dim, head_dim,
                    rotate=bool(rotate) and kind in ROTATE_KINDS, center=centered)


def _quantize_float(fmt: KVFormat, x: torch.Tensor, static_scale: torch.Tensor | None):
    return x.to(fmt.storage_dtype), None, None


def _dequantize_float(fmt: KVFormat, codes, scales, zeros, static_scale) -> torch.Tensor:
    return codes.float()


register_codec("float", Codec(_quantize_float, _dequantize_float))


def kv_bytes_per_token(model_config: ModelConfig, k_fmt: KVFormat, v_fmt: KVFormat) -> int:
    """Cache bytes one token occupies over all layers, K and V (codes + scales + zeros)."""
    per_head = k_fmt.bytes_per_token_head + v_fmt.bytes_per_token_head
    return model_config.num_layers * model_config.num_kv_heads * per_head
