"""Arguments and loading shared by the tool subcommands (calibrate, eval)."""

from __future__ import annotations

import argparse

import torch


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="HF folder, .gguf file or preset (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32",
                   help="weights and activations: auto, float32, bfloat16, float16 (default float32)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size (default 16)")


def load_for_tool(args: argparse.Namespace):
    """Load the model and tokenize args.text: (LoadedModel, token ids)."""
    from kvpack.config import KVPackError
    from kvpack.models.loader import load_model
    from kvpack.tools.scoring import read_text

    text = read_text(args.text)  # fail on a bad path before loading the model
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = load_model(args.model, dtype=args.dtype, device=device)
    if loaded.tokenizer is None:
        raise KVPackError(f"model {args.model!r} has no tokenizer; cannot tokenize --text")
    return loaded, loaded.tokenizer.encode(text, add_special_tokens=False)
