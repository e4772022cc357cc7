"""Llama-family models, their loaders (HF folder, GGUF, random-weight presets) and the tokenizer."""

from __future__ import annotations

from kvpack.models.llama import LlamaForCausalLM
from kvpack.models.loader import (
    MODEL_REGISTRY,
    LoadedModel,
    build_model,
    default_model_path,
    load_model,
    resolve_dtype,
)
from kvpack.models.presets import PRESETS
from kvpack.models.tokenizer import Detokenizer, Tokenizer, byte_tokenizer

__all__ = [
    "MODEL_REGISTRY",
    "PRESETS",
    "Detokenizer",
    "LlamaForCausalLM",
    "LoadedModel",
    "Tokenizer",
    "build_model",
    "byte_tokenizer",
    "default_model_path",
    "load_model",
    "resolve_dtype",
]
