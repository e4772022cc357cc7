"""The KV cache format definition (see docs/structures.md, "KV format definition").

One place defines bit layouts, packing order, scale and zero-point granularity and dtype,
rounding, clamping and rotation; the attention reference, the Triton kernels, the calibrator
and the memory planner import it from here.
"""

from __future__ import annotations

from kvpack.formats.base import (
    FMT_FLOAT, FMT_FP8E4M3, FMT_FP8E5M2, FMT_INT4, FMT_INT8, FORMAT_NAMES, INT4_GROUP_SIZES,
    KERNEL_IDS, KINDS, QMAX, QMAX_FP8E4M3, QMAX_FP8E5M2, QMAX_INT4, QMAX_INT8, SCALE_DTYPE,
    STATIC_KINDS, STATIC_SCALE_DTYPE, KVFormat, canonical_name, dynamic_scale, kv_bytes_per_token,
    resolve_format, resolve_int4_group,
)
from kvpack.formats.fp8 import (
    FP8_E4M3, FP8_E5M2, FP8_SPECS, FP8E4M3_BIAS, FP8E4M3_EXP_BITS, FP8E4M3_MAN_BITS, FP8E4M3_MAX,
    FP8E4M3_MAX_CODE, FP8E4M3_NAN_CODE, FP8E5M2_BIAS, FP8E5M2_EXP_BITS, FP8E5M2_INF_CODE,
    FP8E5M2_MAN_BITS, FP8E5M2_MAX, FP8E5M2_MAX_CODE, FP8E5M2_NAN_CODE, FP8Spec, fp8_decode,
    fp8_encode,
)
from kvpack.formats.integer import (
    INT4_HI_SHIFT, INT4_LO_SHIFT, INT4_NIBBLE_MASK, INT4_NIBBLE_ORDER, int4_params, pack_int4,
    unpack_int4,
)
from kvpack.formats.rotation import hadamard, hadamard_block_size, hadamard_norm, hadamard_transform, rotate
from kvpack.formats.scales import (
    SCALES_FORMAT, SCALES_VERSION, KVScales, derive_scales, load_scales, model_fingerprint,
    save_scales,
)

__all__ = [
    "KVFormat", "resolve_format", "FORMAT_NAMES", "kv_bytes_per_token", "canonical_name",
    "resolve_int4_group", "dynamic_scale", "KINDS", "KERNEL_IDS", "STATIC_KINDS",
    "FMT_FLOAT", "FMT_INT8", "FMT_INT4", "FMT_FP8E4M3", "FMT_FP8E5M2",
    "QMAX", "QMAX_INT8", "QMAX_INT4", "QMAX_FP8E4M3", "QMAX_FP8E5M2", "SCALE_DTYPE",
    "STATIC_SCALE_DTYPE", "INT4_GROUP_SIZES",
    "FP8Spec", "FP8_E4M3", "FP8_E5M2", "FP8_SPECS", "fp8_encode", "fp8_decode",
    "FP8E4M3_EXP_BITS", "FP8E4M3_MAN_BITS", "FP8E4M3_BIAS", "FP8E4M3_MAX", "FP8E4M3_MAX_CODE",
    "FP8E4M3_NAN_CODE", "FP8E5M2_EXP_BITS", "FP8E5M2_MAN_BITS", "FP8E5M2_BIAS", "FP8E5M2_MAX",
    "FP8E5M2_MAX_CODE", "FP8E5M2_NAN_CODE", "FP8E5M2_INF_CODE",
    "INT4_NIBBLE_ORDER", "INT4_LO_SHIFT", "INT4_HI_SHIFT", "INT4_NIBBLE_MASK",
    "pack_int4", "unpack_int4", "int4_params", "hadamard", "hadamard_block_size", "hadamard_norm",
    "hadamard_transform", "rotate",
    "KVScales", "load_scales", "save_scales", "model_fingerprint", "derive_scales",
    "SCALES_FORMAT", "SCALES_VERSION",
]
