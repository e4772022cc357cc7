"""kvpack: LLM inference with an 8-bit and 4-bit paged KV cache."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # Lazy: `import kvpack` stays cheap for the CLI's --help and for the kernels' tests.
    if name == "LLM":
        from kvpack.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from kvpack.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
