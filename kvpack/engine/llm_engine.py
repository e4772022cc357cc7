"""`LLMEngine`: requests in, `RequestOutput`s out, one scheduler step at a time.

`from_args(...)` loads the model, sizes the paged KV pool (`num_blocks`, else `kv_cache_memory`,
else on GPU what `gpu_memory_utilization` leaves after the weights and a profiled forward pass,
else on CPU room for `max_num_seqs * max_model_len` tokens capped at 2 GiB) and logs the KV
format and capacity. `step()` schedules a batch, runs it, samples, detokenizes, applies stop
conditions and returns the outputs of the requests whose sequences produced a token.

The host's work overlaps the device's in two ways, both on by default:
- async scheduling (`async_scheduling=False` / `--no-async-scheduling` turns it off): the step in
  flight is advanced with a PLACEHOLDER for each token it samples (`Scheduler.advance`), the next
  step is scheduled and launched at once, reading those tokens on the device, and only then are
  this step's tokens waited for and put in place (`Scheduler.fill`). A sequence whose pending
  token is its last by length is not scheduled again; one that its token ends (EOS, stop token
  id) is already in the launched step, whose token for it is dropped.
- async output processing (`disable_async_output_proc=True` turns both off, as vLLM's
  `--disable-async-output-proc`): detokenization, stop strings and the `RequestOutput`s of a step
  are made after the next step is launched. A sequence a stop string ends finishes at once (same
  output) and the launched step's token for it is dropped.
Blocks freed while a step is in flight are written by it only where no prefix-cache entry
points (the last, unregistered block of a sequence), and steps run in order on one stream, so a
later step that reuses such a block overwrites what it reads.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kvpack.attention.kv_cache import allocate_kv_cache, resolve_kv_formats
from kvpack.config import DEFAULT_WATERMARK, CacheConfig, ConfigError, EngineConfig, KVPackError, SchedulerConfig
from kvpack.engine.block_manager import BlockManager
from kvpack.engine.model_runner import ModelRunner, PendingRunnerOutput, get_model_runner_cls
from kvpack.engine.outputs import CompletionOutput, RequestOutput, completion_of
from kvpack.engine.sampler import Sampler
from kvpack.engine.scheduler import ScheduledBatch, Scheduler
from kvpack.engine.sequence import Sequence
from kvpack.sampling_params import SamplingParams

__all__ = ["LLMEngine", "RequestOutput", "CompletionOutput", "RequestError"]

logger = logging.getLogger("kvpack")
GiB = 1 << 30
CPU_DEFAULT_MAX_MODEL_LEN = 4096


class RequestError(KVPackError, ValueError):
    """A request the engine cannot serve (bad prompt, too long, duplicate id)."""


def init_logging() -> None:
    """INFO messages of the `kvpack` logger go to stderr unless the application configured logging."""
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s kvpack: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    arrival_time: float = field(default_factory=time.time)
    first_token_time: float | None = None

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def output(self) -> RequestOutput:
        metrics = {"arrival_time": self.arrival_time}
        if self.first_token_time is not None:
            metrics["first_token_time"] = self.first_token_time
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[completion_of(s) for s in self.seqs],
            finished=self.finished,
            num_cached_tokens=self.seqs[0].num_cached_tokens,
            metrics=metrics,
        )


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: Any, num_blocks: int) -> None:
        """Use `from_args`; `loaded` is a `kvpack.models.LoadedModel` already on `config.device`."""
        self.config = config
        self.model_config = loaded.model_config
        self.tokenizer = loaded.tokenizer
        self.device = torch.device(config.device)
        cc, sc = config.cache_config, config.scheduler_config
        self.max_model_len = sc.max_model_len
        self.eos_token_ids = tuple(self.model_config.eos_token_ids)
        if self.tokenizer is not None:
            self.eos_token_ids = tuple(dict.fromkeys((*self.eos_token_ids, *self.tokenizer.eos_token_ids)))
        model_dtype = loaded.model.dtype
        from kvpack.engine.centering import kv_means  # lazy: it imports the scoring tools

        means = kv_means(loaded, cc)  # None: nothing centered (off, no centered side, or no probe)
        self.k_format, self.v_format = resolve_kv_formats(self.model_config, cc, model_dtype,
                                                          centered=means is not None)
        self.kv_cache = allocate_kv_cache(self.model_config, cc, num_blocks, self.device, model_dtype,
                                          means=means)
        self.block_manager = BlockManager(num_blocks, cc.block_size, cc.enable_prefix_caching)
        self.scheduler = Scheduler(sc, self.block_manager)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(config.seed)
        runner_cls = get_model_runner_cls(self.device, config.enforce_eager)
        self.model_runner: ModelRunner = runner_cls(
            loaded.model, self.kv_cache, self.device, Sampler(gen), self.eos_token_ids,
            max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens,
            max_model_len=sc.max_model_len)
        self.model_runner.warmup()
        self.kv_plan = None  # the memory planner's KVCachePlan, when built by from_args
        self.requests: dict[str, _Request] = {}
        self._seq_to_request: dict[int, _Request] = {}
        self._arrival = itertools.count()
        self.counters = dict(num_requests=0, prompt_tokens=0, generation_tokens=0,
                             computed_tokens=0, steps=0)
        self.async_output_proc = not config.disable_async_output_proc
        self.async_scheduling = self.async_output_proc and config.async_scheduling
        self._inflight: tuple[ScheduledBatch, PendingRunnerOutput] | None = None  # launched, not yet waited for

    # ---- construction --------------------------------------------------------------------------

    @classmethod
    def from_args(
        cls,
        model: str | None = None,
        *,
        dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        k_cache_dtype: str | None = None,
        v_cache_dtype: str | None = None,
        kv_scales: str | None = None,
        kv_scales_path: str | None = None,
        kv_rotation: bool = True,
        kv_centering: bool = True,
        int4_group_size: int = 32,
        block_size: int = 16,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
        watermark: float = DEFAULT_WATERMARK,
        enable_prefix_caching: bool = True,
        num_blocks: int | None = None,
        kv_cache_memory: int | str | None = None,
        gpu_memory_utilization: float = 0.9,
        device: str | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
        disable_async_output_proc: bool = False,
        async_scheduling: bool = True,
        log_stats: bool = True,
        loaded: Any = None,
    ) -> "LLMEngine":
        """Build an engine; `loaded` (a `LoadedModel` on `device`) skips loading `model`."""
        from kvpack.engine.memory_planner import parse_bytes, plan_kv_cache
        from kvpack.models import load_model

        init_logging()
        if isinstance(kv_cache_memory, str):
            kv_cache_memory = parse_bytes(kv_cache_memory)
        if device is None and loaded is not None:
            device = str(next(loaded.model.parameters()).device)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        cache_config = CacheConfig(
            block_size=block_size, kv_cache_dtype=kv_cache_dtype, k_cache_dtype=k_cache_dtype,
            v_cache_dtype=v_cache_dtype, kv_scales_path=kv_scales or kv_scales_path,
            kv_rotation=kv_rotation, kv_centering=kv_centering,
            int4_group_size=int4_group_size, num_blocks=num_blocks, kv_cache_memory=kv_cache_memory,
            gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=enable_prefix_caching,
        )
        if max_model_len is not None and max_model_len <= 0:
            raise ConfigError(f"--max-model-len must be positive, got {max_model_len}")
        t0 = time.perf_counter()
        if loaded is None:
            loaded = load_model(model, dtype, device, seed=seed)
        mc = loaded.model_config
        if log_stats:
            logger.info("loaded %s (%s, %s) in %.1f s", mc.name or model,
                        str(loaded.model.dtype).removeprefix("torch."), device, time.perf_counter() - t0)
        if max_model_len is not None and max_model_len > mc.max_position_embeddings:
            raise ConfigError(f"--max-model-len {max_model_len} exceeds the model's maximum of "
                              f"{mc.max_position_embeddings} positions")
        is_cpu = torch.device(device).type == "cpu"
        max_num_seqs = max_num_seqs or (64 if is_cpu else 256)
        user_len = max_model_len
        model_max = mc.max_position_embeddings
        max_model_len = max_model_len or (min(model_max, CPU_DEFAULT_MAX_MODEL_LEN) if is_cpu else model_max)
        max_num_batched_tokens = max_num_batched_tokens or (2048 if is_cpu else 8192)
        plan = plan_kv_cache(loaded, cache_config, device, max_num_seqs, max_model_len,
                             max_num_batched_tokens)
        pool_tokens = plan.num_blocks * block_size
        if pool_tokens < max_model_len:
            if user_len is not None:
                raise ConfigError(
                    f"the KV cache holds {pool_tokens} tokens ({plan.num_blocks} blocks), fewer than "
                    f"--max-model-len {user_len}; lower --max-model-len or give the cache more memory")
            max_model_len = pool_tokens
            logger.warning("max_model_len lowered to %d, what the KV cache holds", max_model_len)
        scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs,
                                           max_num_batched_tokens=max_num_batched_tokens,
                                           max_model_len=max_model_len, watermark=watermark)
        config = EngineConfig(model=model or "default", model_config=mc, cache_config=cache_config,
                              scheduler_config=scheduler_config, device=device, seed=seed,
                              dtype=dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch."),
                              enforce_eager=enforce_eager, disable_async_output_proc=disable_async_output_proc,
                              async_scheduling=async_scheduling)
        engine = cls(config, loaded, plan.num_blocks)
        engine.kv_plan = plan
        if log_stats:
            for line in plan.log_lines(max_model_len):
                logger.info("%s", line)
        return engine

    def kv_cache_info(self) -> dict[str, Any]:
        """The KV format and pool size in use (for start-up logs, /metrics, benchmarks)."""
        bpt = self.kv_bytes_per_token
        n, bs = self.block_manager.num_blocks, self.block_manager.block_size
        return {
            "k_format": self.k_format.name, "v_format": self.v_format.name, "block_size": bs,
            "num_blocks": n, "num_tokens": n * bs, "bytes_per_token": bpt,
            "gib": bpt * n * bs / GiB, "max_model_len": self.max_model_len,
            "max_concurrency": n * bs / self.max_model_len,
        }

    @property
    def kv_format_name(self) -> str:
        k, v = self.k_format.name, self.v_format.name
        return k if k == v else f"K {k} / V {v}"

    @property
    def kv_bytes_per_token(self) -> int:
        from kvpack.formats import kv_bytes_per_token

        return kv_bytes_per_token(self.model_config, self.k_format, self.v_format)

    # ---- requests ------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request: a text prompt (tokenized with special tokens) or prompt token ids."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        text, ids = self._tokenize(prompt)
        if len(ids) + 1 > self.max_model_len:
            raise RequestError(
                f"prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}: the prompt "
                "plus at least one generated token must fit (raise --max-model-len or shorten the prompt)")
        seqs = []
        arrival = next(self._arrival)
        for i in range(params.n):
            gen = None
            if params.seed is not None:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(params.seed + i)
            seq = Sequence(request_id, ids, params, index=i, arrival=arrival, generator=gen)
            if self.tokenizer is not None:
                from kvpack.models import Detokenizer

                seq.detokenizer = Detokenizer(self.tokenizer, ids, params.skip_special_tokens)
            seqs.append(seq)
        req = _Request(request_id, text, ids, seqs, arrival_time or time.time())
        self.requests[request_id] = req
        for seq in seqs:
            self._seq_to_request[seq.seq_id] = req
            self.scheduler.add(seq)
        self.counters["num_requests"] += 1
        self.counters["prompt_tokens"] += len(ids)

    def _tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this model has no tokenizer; pass prompt token ids")
            ids = self.tokenizer.encode(prompt)
            text = prompt
        else:
            ids, text = list(prompt), None
            vocab = self.model_config.vocab_size
            bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
            if bad:
                raise RequestError(f"prompt token id {bad[0]!r} is outside the vocabulary [0, {vocab})")
        if not ids:
            raise RequestError("the prompt is empty")
        return text, ids

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its blocks; returns its final output, or None if unknown."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.abort(request_id)
        for seq in req.seqs:
            self._seq_to_request.pop(seq.seq_id, None)
            if not seq.is_finished:
                seq.finish("abort")
        return req.output()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ---- the step ------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self._inflight is None:
            self._inflight = self._launch_next()
            if self._inflight is None:
                if self.scheduler.has_unfinished():
                    raise KVPackError("the scheduler cannot make progress: a waiting request does not fit "
                                      "in the KV cache (raise --num-blocks or lower --max-model-len)")
                return []
        batch, pending = self._inflight
        self._inflight = None
        if self.async_scheduling:  # the next step goes to the device before this one's tokens are back
            awaiting = self.scheduler.advance(batch)
            self._inflight = self._launch_next(pending)
            result = pending.result()
            advanced = self.scheduler.fill(awaiting, result.token_ids, result.logprobs)
        else:
            result = pending.result()  # waits for the device
            advanced = self.scheduler.update(batch, result.token_ids, result.logprobs)
        self.counters["steps"] += 1
        self.counters["computed_tokens"] += batch.num_tokens
        for seq in advanced:
            self._check_token_stop(seq)
        if self.async_output_proc and not self.async_scheduling:
            self._inflight = self._launch_next()  # runs on the device while the text work below runs here
        touched: dict[str, _Request] = {}
        now = time.time()
        for seq in advanced:
            req = self._seq_to_request.get(seq.seq_id)
            if req is None:  # aborted meanwhile
                continue
            if req.first_token_time is None:
                req.first_token_time = now
            self._process_text(seq)
            touched[req.request_id] = req
        self.counters["generation_tokens"] += len(advanced)
        outputs = []
        for req in touched.values():
            if req.seqs[0].params.output_kind == "final_only" and not req.finished:
                continue  # no output until it finishes: building one copies every token so far
            out = req.output()
            if out.finished:
                out.metrics["finished_time"] = now
                del self.requests[req.request_id]
                for seq in req.seqs:
                    self._seq_to_request.pop(seq.seq_id, None)
            outputs.append(out)
        return outputs

    def _launch_next(self, prev: PendingRunnerOutput | None = None) -> tuple[ScheduledBatch, PendingRunnerOutput] | None:
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return None
        return batch, self.model_runner.launch(batch, prev)

    def _check_token_stop(self, seq: Sequence) -> None:
        """The stops the newest token decides alone (stop token, max_tokens, max_model_len), applied as
        soon as the token is back: before the next step is scheduled, or with async scheduling after
        (that step's token for the sequence is then dropped). Text and stop strings: `_process_text`."""
        p = seq.params
        token = seq.token_ids[-1]
        stop_token = seq.num_output_tokens > p.min_tokens and (
            token in p.stop_ids or (not p.ignore_eos and token in self.eos_token_ids))
        if stop_token:  # its text is not part of the output
            seq.stop_reason = token if token in p.stop_ids else None
            self.scheduler.finish(seq, "stop")
        elif seq.num_output_tokens >= p.max_tokens or len(seq) >= self.max_model_len:
            self.scheduler.finish(seq, "length")

    def _process_text(self, seq: Sequence) -> None:
        """Detokenize the newest token of `seq` and look for stop strings in the new text."""
        detok = seq.detokenizer
        if detok is None:
            return
        p = seq.params
        if seq.finish_reason == "stop":  # by a stop token (`_check_token_stop`), whose text is left out
            seq.add_text(detok.flush())
            return
        seq.add_text(detok.add([seq.token_ids[-1]]))
        if seq.num_output_tokens >= p.min_tokens and seq.find_stop_string():
            self._finish_late(seq, "stop")
            return
        if seq.finish_reason == "length":
            seq.add_text(detok.flush())
            if p.stop_strings and seq.find_stop_string():
                seq.finish("stop")

    def _finish_late(self, seq: Sequence, reason: str) -> None:
        """Finish a sequence a stop string ended; it may be in the step already launched, or
        preempted by its scheduling."""
        if seq.is_finished:  # ended by length at the same token: the stop string decides the reason
            seq.finish(reason)
        else:
            self.scheduler.finish(seq, reason)

    # ---- introspection -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.block_manager.num_blocks

    def stats(self) -> dict[str, Any]:
        bm = self.block_manager
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_usage": bm.usage,
            "num_blocks": bm.num_blocks,
            "num_free_blocks": bm.num_free_blocks,
            "block_size": bm.block_size,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "k_format": self.k_format.name,
            "v_format": self.v_format.name,
            "prefix_hit_rate": bm.prefix_hit_rate,
            "prefix_hit_tokens": bm.num_hit_tokens,
            "prefix_queried_tokens": bm.num_queried_tokens,
            "num_preemptions": self.scheduler.num_preemptions,
            **self.counters,
        }
