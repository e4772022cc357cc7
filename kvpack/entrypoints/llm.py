"""`LLM`: offline batched generation, the vLLM way.

    from kvpack import LLM, SamplingParams
    llm = LLM(kv_cache_dtype="int4")                 # default model: SmolLM2-135M-Instruct (GGUF)
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
    print(outs[0].outputs[0].text)                   # or outs[0].text

All prompts are queued at once and run with continuous batching; outputs come back in input order.
"""

from __future__ import annotations

import dataclasses

import itertools
import sys
from typing import Any, Sequence as Seq

from kvpack.config import KVPackError
from kvpack.engine.llm_engine import LLMEngine
from kvpack.engine.outputs import RequestOutput
from kvpack.sampling_params import SamplingParams

Prompt = str | list[int]
Message = dict[str, Any]


class LLM:
    def __init__(
        self,
        model: str | None = None,
        dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        k_cache_dtype: str | None = None,
        v_cache_dtype: str | None = None,
        kv_scales: str | None = None,
        kv_rotation: bool = True,
        kv_centering: bool = True,
        block_size: int = 16,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        num_blocks: int | None = None,
        kv_cache_memory: int | str | None = None,
        gpu_memory_utilization: float = 0.9,
        device: str | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        self.llm_engine = LLMEngine.from_args(
            model, dtype=dtype, kv_cache_dtype=kv_cache_dtype, k_cache_dtype=k_cache_dtype,
            v_cache_dtype=v_cache_dtype, kv_scales=kv_scales, kv_rotation=kv_rotation,
            kv_centering=kv_centering,
            block_size=block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching, num_blocks=num_blocks,
            kv_cache_memory=kv_cache_memory, gpu_memory_utilization=gpu_memory_utilization,
            device=device, seed=seed, enforce_eager=enforce_eager, **engine_kwargs,
        )
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """prompts: a string, a list of strings, one list of token ids, or a list of such lists.
        sampling_params: one for all prompts, or one per prompt (default `SamplingParams()`)."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        return self._run(prompts, params, use_tqdm)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """messages: one conversation ([{"role": ..., "content": ...}, ...]) or a list of them,
        rendered with the tokenizer's chat template."""
        tok = self.llm_engine.tokenizer
        if tok is None:
            raise KVPackError("this model has no tokenizer, so no chat template")
        if messages and isinstance(messages[0], dict):
            conversations = [messages]
        else:
            conversations = list(messages)
        prompts: list[Prompt] = []
        for conv in conversations:
            text = tok.apply_chat_template(conv, add_generation_prompt=add_generation_prompt)
            prompts.append(tok.encode(text, add_special_tokens=False))  # the template has them
        params = _as_params_list(sampling_params, len(prompts))
        return self._run(prompts, params, use_tqdm)

    def _run(
        self, prompts: list[Prompt], params: list[SamplingParams], use_tqdm: bool
    ) -> list[RequestOutput]:
        engine = self.llm_engine
        ids = [f"llm-{next(self._ids)}" for _ in prompts]
        params = [dataclasses.replace(p, output_kind="final_only") for p in params]  # only final outputs are read
        try:
            for rid, prompt, p in zip(ids, prompts, params):
                engine.add_request(rid, prompt, p)
        except Exception:
            for rid in ids:
                engine.abort_request(rid)
            raise
        results: dict[str, RequestOutput] = {}
        wanted = set(ids)
        bar = _progress(len(prompts), use_tqdm)
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id in wanted:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            for rid in ids:
                engine.abort_request(rid)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[rid] for rid in ids]


def _progress(total: int, use_tqdm: bool):
    if not use_tqdm or total <= 1 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="Processed prompts", unit="req", dynamic_ncols=True)


def _as_prompt_list(prompts: Prompt | Seq[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise KVPackError("no prompts given")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [prompts]  # one tokenized prompt
    for p in prompts:
        if not isinstance(p, (str, list, tuple)):
            raise KVPackError(f"a prompt must be a string or a list of token ids, got {type(p).__name__}")
    return [p if isinstance(p, str) else list(p) for p in prompts]


def _as_params_list(params: SamplingParams | Seq[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise KVPackError(f"got {len(params)} sampling params for {n} prompts")
    return params
