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


def prepare_output(path: str | None, flag: str) -> None:
    """Before a long run: make the folder of the output file `path` (as `kvpack bench`'s JSON outputs do), or
    fail now naming the flag, rather than after the run has been computed."""
    import os

    from kvpack.config import KVPackError

    if not path or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    up = folder
    while not os.path.exists(up):  # the nearest existing ancestor: a file there blocks the folder
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise KVPackError(f"{flag} {path}: {up} is a file, not a folder")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise KVPackError(f"{flag} {path}: cannot make its folder {folder}: {e.strerror or e}") from None
    if os.path.isdir(path):
        raise KVPackError(f"{flag} {path} is a folder; give a file name")
    if not os.access(folder, os.W_OK):
        raise KVPackError(f"{flag} {path}: folder {folder} is not writable")


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
