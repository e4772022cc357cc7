"""The KV scales file: per-(layer, kv head) statistics and static scales (`--kv-scales`).

Written by `kvpack calibrate` (`save_scales`), read by the engine (`load_scales`). Format
(versioned JSON; see docs/scales_format.md):

    {"format": "kvpack-kv-scales", "version": 2,
     "model": {"architecture", "num_layers", "num_kv_heads", "head_dim", "fingerprint", "weights_hash"},
     "statistic": "absmax" | "percentile:99.9", "num_tokens": N, "rotation": false,
     "k": {"absmax": [[per head] per layer], "mean": [[[per channel] per head] per layer]},
     "v": {"absmax": ..., "mean": ...},
     "scales": {"int8": {"k": [[...]], "v": [[...]], "k_center": true, "k_rotate": false,
                         "v_center": false, "v_rotate": false}, "fp8_e4m3": {...}, "fp8_e5m2": {...}}}

Derived scale = statistic / QMAX[kind] in float32 (0 -> 1, as for dynamic scales), the statistic taken
of K / V as that kind stores them (centered by the file's means and/or rotated, as the flags say).
"absmax" and "rotation" at the top are of the raw vectors. Version 1 files (no means, no flags: raw
statistics) still load; formats that center or rotate then refuse their scales.
Every problem with a file raises `ConfigError` with one line naming the file and the problem.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field

import torch

from kvpack.config import ConfigError, KVPackError, ModelConfig
from kvpack.formats.base import QMAX, STATIC_KINDS, KVFormat

SCALES_FORMAT = "kvpack-kv-scales"
SCALES_VERSION = 2
READABLE_VERSIONS = (1, 2)
_SHAPE_KEYS = ("num_layers", "num_kv_heads", "head_dim")


def model_fingerprint(model_config: ModelConfig, weights_hash: str | None = None) -> str:
    """sha256 hex over the architecture and shapes (and the weights hash, when known)."""
    mc = model_config
    ident = {
        "architecture": mc.architecture, "num_layers": mc.num_layers, "num_heads": mc.num_heads,
        "num_kv_heads": mc.num_kv_heads, "head_dim": mc.head_dim, "hidden_size": mc.hidden_size,
        "intermediate_size": mc.intermediate_size, "vocab_size": mc.vocab_size,
        "weights_hash": weights_hash,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def derive_scales(stat: torch.Tensor, kind: str) -> torch.Tensor:
    """Static scale for `kind` from a [L, H] statistic: stat / QMAX (float32), 0 -> 1."""
    s = stat.float() / float(QMAX[kind])
    return torch.where(s == 0, torch.ones_like(s), s)


def _check_statistic(stat: object) -> bool:
    if stat == "absmax":
        return True
    if isinstance(stat, str) and stat.startswith("percentile:"):
        try:
            p = float(stat.split(":", 1)[1])
        except ValueError:
            return False
        return 0.0 < p <= 100.0
    return False


@dataclass(frozen=True)
class KVScales:
    """A loaded scales file. absmax and scales: [num_layers, num_kv_heads] float32."""

    path: str
    statistic: str
    num_tokens: int
    rotation: bool
    k_absmax: torch.Tensor
    v_absmax: torch.Tensor
    scales: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    fingerprint: str = ""
    weights_hash: str | None = None
    k_mean: torch.Tensor | None = None  # [L, H, D] float32 (version 2)
    v_mean: torch.Tensor | None = None
    # kind -> {"k_center", "k_rotate", "v_center", "v_rotate"}: how each kind's statistic was taken
    transforms: dict[str, dict[str, bool]] = field(default_factory=dict)

    def for_format(self, kind: str | KVFormat, side: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) static scales [L, H] float32 for an int8 / fp8 kind (or a KVFormat). With a KVFormat
        and its `side` ("k" or "v"), the file must have measured that side as the format stores it
        (centered / rotated), else a ConfigError says to re-run `kvpack calibrate`."""
        fmt = kind if isinstance(kind, KVFormat) else None
        kind = fmt.kind if fmt is not None else kind
        if kind not in STATIC_KINDS:
            raise ConfigError(f"static KV scales apply to {', '.join(STATIC_KINDS)}, not {kind!r}")
        if fmt is not None and side is not None:
            t = self.transforms.get(kind, {})
            for what, want in (("center", fmt.center), ("rotate", fmt.rotate)):
                have = bool(t.get(f"{side}_{what}", False))
                if have != want:
                    raise ConfigError(
                        f"KV scales file {self.path}: {kind} {side.upper()} scales were calibrated "
                        f"{'with' if have else 'without'} {'centering' if what == 'center' else 'rotation'} "
                        f"but the cache stores {side.upper()} {'with' if want else 'without'} it; re-run "
                        f"kvpack calibrate with the same --no-kv-centering / --no-kv-rotation choices")
        if kind in self.scales:
            return self.scales[kind]
        return derive_scales(self.k_absmax, kind), derive_scales(self.v_absmax, kind)


def save_scales(
    path: str | os.PathLike,
    model_config: ModelConfig,
    *,
    k_absmax: torch.Tensor,
    v_absmax: torch.Tensor,
    num_tokens: int,
    statistic: str = "absmax",
    rotation: bool = False,
    weights_hash: str | None = None,
    means: tuple[torch.Tensor, torch.Tensor] | None = None,
    per_kind: dict[str, tuple[torch.Tensor, torch.Tensor, dict[str, bool]]] | None = None,
) -> dict:
    """Write a scales file (atomically) and return its JSON dict.

    k_absmax, v_absmax: [num_layers, num_kv_heads], the calibration statistic per (layer, kv head)
    of K and V as they enter the cache (after RoPE; after the rotation when `rotation`).
    means: optional (k_mean, v_mean) [num_layers, num_kv_heads, head_dim] (the centering means).
    per_kind: optional {kind: (k_stat, v_stat, transforms)}: the statistic of K / V as that kind
    stores them (transforms: k_center, k_rotate, v_center, v_rotate); kinds not named derive their
    scales from k_absmax / v_absmax (raw vectors).
    """
    mc = model_config
    shape = (mc.num_layers, mc.num_kv_heads)
    for side, t in (("k", k_absmax), ("v", v_absmax)):
        t = torch.as_tensor(t)
        if tuple(t.shape) != shape:
            raise KVPackError(f"save_scales: {side}_absmax has shape {list(t.shape)}, expected {list(shape)}")
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise KVPackError(f"save_scales: {side}_absmax has negative or non-finite values")
    if not _check_statistic(statistic):
        raise KVPackError(f"save_scales: statistic must be 'absmax' or 'percentile:P', got {statistic!r}")
    k = torch.as_tensor(k_absmax).float().cpu()
    v = torch.as_tensor(v_absmax).float().cpu()
    data = {
        "format": SCALES_FORMAT,
        "version": SCALES_VERSION,
        "model": {
            "architecture": mc.architecture, "num_layers": mc.num_layers,
            "num_kv_heads": mc.num_kv_heads, "head_dim": mc.head_dim,
            "fingerprint": model_fingerprint(mc, weights_hash), "weights_hash": weights_hash,
        },
        "statistic": statistic,
        "num_tokens": int(num_tokens),
        "rotation": bool(rotation),
        "k": {"absmax": k.tolist()},
        "v": {"absmax": v.tolist()},
        "scales": {},
    }
    for kind in STATIC_KINDS:
        ks, vs, flags = (per_kind or {}).get(kind, (k, v, {}))
        flags = {f"{side}_{what}": bool(flags.get(f"{side}_{what}", False))
                 for side in "kv" for what in ("center", "rotate")}
        data["scales"][kind] = {"k": derive_scales(torch.as_tensor(ks).float().cpu(), kind).tolist(),
                                "v": derive_scales(torch.as_tensor(vs).float().cpu(), kind).tolist(), **flags}
    if means is not None:
        for side, m in zip("kv", means):
            m = torch.as_tensor(m).float().cpu()
            if tuple(m.shape) != (*shape, mc.head_dim) or not bool(torch.isfinite(m).all()):
                raise KVPackError(f"save_scales: {side} mean must be finite with shape {[*shape, mc.head_dim]}")
            data[side]["mean"] = m.tolist()
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)
    return data


def read_scales_file(path: str | os.PathLike) -> dict:
    """A scales file's JSON, checked as far as it can be without the model: it exists, parses, and names
    this format and a readable version (`CacheConfig` calls it before a model loads)."""
    path = os.fspath(path)

    def bad(msg: str) -> ConfigError:
        return ConfigError(f"KV scales file {path}: {msg}")

    if not os.path.isfile(path):
        raise ConfigError(f"KV scales file not found: {path}")
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise bad(f"not valid JSON ({e.msg} at line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise bad(f"cannot be read ({e})") from None
    if not isinstance(data, dict) or data.get("format") != SCALES_FORMAT:
        raise bad(f"not a kvpack KV scales file (expected \"format\": \"{SCALES_FORMAT}\")")
    if data.get("version") not in READABLE_VERSIONS:
        raise bad(f"unsupported version {data.get('version')!r}; this kvpack reads versions "
                  + ", ".join(map(str, READABLE_VERSIONS)))
    return data


def load_scales(
    path: str | os.PathLike, model_config: ModelConfig, *, weights_hash: str | None = None
) -> KVScales:
    """Read and validate a scales file against the model it will be used with."""
    path = os.fspath(path)

    def bad(msg: str) -> ConfigError:
        return ConfigError(f"KV scales file {path}: {msg}")

    data = read_scales_file(path)
    model = data.get("model")
    if not isinstance(model, dict):
        raise bad("missing the \"model\" object")
    _check_model(model, model_config, weights_hash, bad)
    statistic = data.get("statistic")
    if not _check_statistic(statistic):
        raise bad(f"statistic must be \"absmax\" or \"percentile:P\" (0 < P <= 100), got {statistic!r}")
    num_tokens = data.get("num_tokens")
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens <= 0:
        raise bad(f"num_tokens must be a positive integer, got {num_tokens!r}")
    rotation = data.get("rotation", False)
    if not isinstance(rotation, bool):
        raise bad(f"rotation must be true or false, got {rotation!r}")
    shape = (model_config.num_layers, model_config.num_kv_heads)
    absmax, means = {}, {}
    for side in ("k", "v"):
        obj = data.get(side)
        if not isinstance(obj, dict) or "absmax" not in obj:
            raise bad(f"missing \"{side}\": {{\"absmax\": ...}}")
        absmax[side] = _matrix(obj["absmax"], f"{side}.absmax", shape, bad, positive=False)
        if "mean" in obj:
            means[side] = _means(obj["mean"], f"{side}.mean", (*shape, model_config.head_dim), bad)
    if len(means) == 1:
        raise bad("holds a mean for one of K and V only")
    scales, transforms = {}, {}
    derived = data.get("scales", {})
    if not isinstance(derived, dict):
        raise bad("\"scales\" must be an object")
    for kind, obj in derived.items():
        if kind not in STATIC_KINDS:
            raise bad(f"scales for unknown format {kind!r} (valid: {', '.join(STATIC_KINDS)})")
        if not isinstance(obj, dict) or "k" not in obj or "v" not in obj:
            raise bad(f"scales.{kind} must hold \"k\" and \"v\"")
        scales[kind] = tuple(_matrix(obj[s], f"scales.{kind}.{s}", shape, bad, positive=True) for s in "kv")
        flags = {}
        for key in ("k_center", "k_rotate", "v_center", "v_rotate"):
            val = obj.get(key, rotation if key.endswith("rotate") else False)
            if not isinstance(val, bool):
                raise bad(f"scales.{kind}.{key} must be true or false, got {val!r}")
            flags[key] = val
        if (flags["k_center"] or flags["v_center"]) and not means:
            raise bad(f"scales.{kind} says centered but the file holds no k/v means")
        transforms[kind] = flags
    return KVScales(path, statistic, num_tokens, rotation, absmax["k"], absmax["v"], scales,
                    model.get("fingerprint", ""), model.get("weights_hash"), means.get("k"), means.get("v"),
                    transforms)


def _means(obj, where: str, shape: tuple[int, int, int], bad) -> torch.Tensor:
    try:
        t = torch.tensor(obj, dtype=torch.float32)
    except (TypeError, ValueError):
        raise bad(f"{where} must be a [{shape[0]}][{shape[1]}][{shape[2]}] list of numbers "
                  "(layers x kv heads x head_dim)") from None
    if tuple(t.shape) != shape:
        raise bad(f"{where} has shape {list(t.shape)}, expected {list(shape)} (layers x kv heads x head_dim)")
    if not bool(torch.isfinite(t).all()):
        raise bad(f"{where} holds values that are not finite")
    return t


def _check_model(model: dict, mc: ModelConfig, weights_hash: str | None, bad) -> None:
    for key in _SHAPE_KEYS:
        if key not in model:
            raise bad(f"missing model.{key}")
        if model[key] != getattr(mc, key):
            raise bad(f"calibrated for a different model: {key} {model[key]!r} != {getattr(mc, key)} "
                      f"(model {mc.name or mc.architecture})")
    file_hash = model.get("weights_hash")
    if weights_hash is not None and file_hash is not None and file_hash != weights_hash:
        raise bad("calibrated on different weights (weights_hash differs)")
    fp = model.get("fingerprint")
    if fp is None:
        raise bad("missing model.fingerprint")
    if fp != model_fingerprint(mc, file_hash):
        raise bad(f"calibrated for a different model (fingerprint mismatch; file says architecture "
                  f"{model.get('architecture')!r}, model is {mc.architecture!r})")


def _matrix(obj, where: str, shape: tuple[int, int], bad, *, positive: bool) -> torch.Tensor:
    ok = isinstance(obj, list) and len(obj) == shape[0] and all(
        isinstance(row, list) and len(row) == shape[1]
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in row)
        for row in obj
    )
    if not ok:
        got = _shape_of(obj)
        raise bad(f"{where} must be a [{shape[0]}][{shape[1]}] list of numbers (layers x kv heads), got {got}")
    flat = [float(x) for row in obj for x in row]
    if any(not math.isfinite(x) or x < 0 or (positive and x == 0) for x in flat):
        kind = "positive" if positive else "non-negative"
        raise bad(f"{where} holds values that are not finite and {kind}")
    return torch.tensor(obj, dtype=torch.float32)


def _shape_of(obj) -> str:
    if not isinstance(obj, list):
        return type(obj).__name__
    inner = {len(r) if isinstance(r, list) else type(r).__name__ for r in obj}
    return f"[{len(obj)}][{'/'.join(map(str, sorted(inner, key=str)))}]"
