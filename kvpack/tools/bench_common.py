"""Shared pieces of `kvpack bench throughput | latency | capacity`: engine arguments, format lists,
length ranges, config-only model lookup, workloads, the table printer and the JSON record (with the
GPU, driver, torch, triton, commit and command, as every benchmark result should carry)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from kvpack.config import ConfigError, KVPackError, ModelConfig, add_int4_group_size_arg, add_watermark_arg
from kvpack.engine.memory_planner import parse_bytes

DEFAULT_BENCH_MODEL = "dummy:llama-3.1-8b"
BASELINE = "bfloat16"


# ---- arguments ------------------------------------------------------------------------------------

def bytes_arg(text: str) -> int:
    """argparse type for a memory size ('16GiB', '8GB', '4096'): parse_bytes, its message in the usage error."""
    try:
        return parse_bytes(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_engine_args(p: argparse.ArgumentParser, *, default_formats: str = "bfloat16,int8,int4",
                    default_model: str = DEFAULT_BENCH_MODEL) -> None:
    """The engine flags every bench mode shares (vLLM's names)."""
    p.add_argument("--model", default=default_model,
                   help=f"preset (dummy weights), HF folder or .gguf (default {default_model})")
    p.add_argument("--dtype", default="auto", help="weights/activations: auto, bfloat16, float16, float32")
    p.add_argument("--kv-cache-dtype", default=default_formats,
                   help="comma list of KV formats to compare in one run; FORMAT or KFORMAT/VFORMAT "
                        f"(default {default_formats})")
    p.add_argument("--kv-scales", default=None, help="scales file for static int8/fp8 scales")
    add_int4_group_size_arg(p)
    p.add_argument("--no-kv-rotation", action="store_true", help="int4 / fp8 without the Hadamard rotation")
    p.add_argument("--no-kv-centering", action="store_true",
                   help="no per-channel K (fp8: and V) mean subtraction (needs a tokenizer or --kv-scales means)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    add_watermark_arg(p)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-memory", type=bytes_arg, default=None,
                   help="fixed KV budget, the same for every format (e.g. 16GiB, 8GB)")
    p.add_argument("--num-blocks", type=int, default=None, help="fixed number of KV blocks")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--disable-async-output-proc", action="store_true",
                   help="process each step's output text before launching the next step (default: the next step runs on the device meanwhile)")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="launch each step only after the previous step's tokens are back (default: launch it first, its inputs for those tokens read on the device)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None, help="write the results here (JSON)")


def parse_format_list(text: str) -> list[str]:
    """'bf16, int8,int4/fp8' -> ['bfloat16', 'int8', 'int4/fp8_e4m3'] (validated, canonical names)."""
    from kvpack.formats import canonical_name

    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ConfigError("--kv-cache-dtype needs at least one format")
    out = []
    for item in items:
        parts = item.split("/")
        if len(parts) > 2 or not all(parts):
            raise ConfigError(f"bad --kv-cache-dtype item {item!r}: use FORMAT or KFORMAT/VFORMAT")
        out.append("/".join(canonical_name(part) for part in parts))  # ConfigError lists valid names
    return out


def split_format(item: str) -> tuple[str, str | None, str | None]:
    """'int8' -> (kv_cache_dtype='int8', None, None); 'int4/int8' -> ('auto', 'int4', 'int8')."""
    if "/" in item:
        k, v = item.split("/")
        return "auto", k, v
    return item, None, None


@dataclass(frozen=True)
class LenRange:
    """A fixed length (lo == hi) or a uniform integer range [lo, hi] (`--input-len 2048:8192`)."""

    lo: int
    hi: int

    def sample(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


def parse_len_range(text: str) -> LenRange:
    try:
        parts = [int(x) for x in str(text).split(":")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad length {text!r}: use N or LO:HI") from None
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or parts[0] < 1 or parts[1] < parts[0]:
        raise argparse.ArgumentTypeError(f"bad length {text!r}: use N or LO:HI with 1 <= LO <= HI")
    return LenRange(*parts)


def engine_kwargs(args: argparse.Namespace, item: str, **overrides: Any) -> dict[str, Any]:
    """`LLMEngine.from_args` keywords for one format item of the comma list."""
    kv, k, v = split_format(item)
    kw = dict(dtype=args.dtype, kv_cache_dtype=kv, k_cache_dtype=k, v_cache_dtype=v,
              kv_scales=args.kv_scales, kv_rotation=not args.no_kv_rotation,
              kv_centering=not args.no_kv_centering,
              int4_group_size=args.int4_group_size, block_size=args.block_size,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=args.max_model_len, watermark=args.watermark,
              enable_prefix_caching=not args.no_prefix_caching,
              num_blocks=args.num_blocks, kv_cache_memory=args.kv_cache_memory,
              gpu_memory_utilization=args.gpu_memory_utilization, device=args.device, seed=args.seed,
              enforce_eager=args.enforce_eager,
              disable_async_output_proc=getattr(args, "disable_async_output_proc", False),
              async_scheduling=not getattr(args, "no_async_scheduling", False))
    kw.update(overrides)
    return kw


_LOADED: dict[tuple, Any] = {}


def load_once(args: argparse.Namespace) -> Any:
    """The model of `args`, loaded once per process and shared by every format's engine."""
    from kvpack.models import load_model

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    key = (args.model, args.dtype, device, args.seed)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_model(args.model, args.dtype, device, seed=args.seed)
    return _LOADED[key]


def build_engine(args: argparse.Namespace, item: str, **overrides: Any):
    import kvpack.engine.cuda_graph  # noqa: F401  (registers the CUDA-graph decode runner)
    from kvpack.engine.llm_engine import LLMEngine

    kw = engine_kwargs(args, item, **overrides)
    return LLMEngine.from_args(args.model, loaded=load_once(args), **kw)


def release(engine: Any) -> None:
    """Drop an engine and give its GPU memory back before the next format is built."""
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def sync(device: Any = None) -> None:
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


# ---- models without weights -----------------------------------------------------------------------

def model_config_only(model: str) -> ModelConfig:
    """The ModelConfig of a preset, HF folder (config.json) or .gguf, without loading any weights."""
    from kvpack.models.presets import PRESETS, preset_config

    cfg = preset_config(model)
    if cfg is not None:
        return cfg
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ConfigError(f"{path} is not a model folder (no config.json)")
        with open(cfg_path) as f:
            return ModelConfig.from_hf_config(json.load(f), name=os.path.basename(path.rstrip("/")))
    if os.path.isfile(path):
        from kvpack.models.gguf_loader import GGUFFile

        return GGUFFile(path).model_config()
    raise ConfigError(f"model {model!r} not found: not a preset ({', '.join(PRESETS)}), folder or .gguf")


# ---- workloads ------------------------------------------------------------------------------------

def random_prompts(num: int, input_len: LenRange, output_len: LenRange, vocab_size: int,
                   seed: int) -> list[tuple[list[int], int]]:
    """`num` (prompt token ids, output length) pairs; token ids uniform in [0, min(vocab, 32000))
    from `seed`, so every format and every framework sees the same workload."""
    rng = random.Random(seed)
    hi = max(1, min(vocab_size, 32000)) - 1
    out = []
    for _ in range(num):
        n = input_len.sample(rng)
        out.append(([rng.randint(0, hi) for _ in range(n)], output_len.sample(rng)))
    return out


def text_prompts(path: str, tokenizer: Any, num: int, output_len: LenRange, max_len: int | None,
                 seed: int) -> list[tuple[list[int], int]]:
    """One prompt per non-empty line of a text file (cycled up to `num`), tokenized."""
    if tokenizer is None:
        raise KVPackError("this model has no tokenizer; --dataset needs one")
    with open(path, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    if not lines:
        raise KVPackError(f"{path} has no non-empty lines")
    rng = random.Random(seed)
    out = []
    for i in range(num):
        ids = tokenizer.encode(lines[i % len(lines)])[: max_len or None]
        out.append((ids or [0], output_len.sample(rng)))
    return out


# ---- output ---------------------------------------------------------------------------------------

def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """columns: (key, header, format spec such as ',d' or '.2f'); a markdown-compatible table."""
    head = [h for _, h, _ in columns]
    body = [[_fmt(r.get(k), spec) for k, _, spec in columns] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(b) for b in body)])


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and spec:
        return format(value, spec)
    return str(value)


def add_ratios(rows: list[dict[str, Any]], key: str, out_key: str) -> None:
    """rows[i][out_key] = rows[i][key] / (the bf16 row's, else the first row's) value."""
    if not rows:
        return
    base = next((r for r in rows if r.get("kv_cache_dtype") == BASELINE), rows[0])
    for r in rows:
        b = base.get(key)
        r[out_key] = (r[key] / b) if b and r.get(key) is not None else None


def env_info() -> dict[str, Any]:
    """Where and how a result was measured."""
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        info["cuda"] = torch.version.cuda
        info["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    else:
        info["gpu"] = None
        info["cpu"] = platform.processor() or platform.machine()
    # KVPACK_COMMIT first: a copied tree (the GPU box) may carry a stale .git
    info["commit"] = os.environ.get("KVPACK_COMMIT") or _run(["git", "rev-parse", "--short", "HEAD"],
                                                             cwd=os.path.dirname(os.path.abspath(__file__)))
    return info


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def write_json(path: str | None, payload: Any) -> None:
    if not path:
        return
    if path == "-":
        json.dump(payload, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")


def mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


class TritonCompileLog:
    """Triton compilations while the block runs (`triton.knobs.compilation.listener`): JIT compiles
    in the middle of a timed run are time the benchmark would charge to the workload. `summary()`:
    {"count", "seconds", "by_kernel": {name: [count, seconds]}, "specializations": [...]} of the
    compiles that missed Triton's cache (hits load a binary: counted as "cache_hits"). Each
    specialization names the kernel, its seconds, its constexpr values and the arguments Triton
    specialized (`specialization`): what a warm-up must launch to compile it before the timed run.
    Nothing is recorded where the listener is not available (an older Triton) or nothing compiles (the
    CPU interpreter)."""

    def __init__(self) -> None:
        self.details: list[dict[str, Any]] = []  # one per cache miss: kernel, seconds, specialization
        self.hits = 0
        self._knobs = None
        self._prev = None

    def _listener(self, src=None, metadata=None, metadata_group=None, times=None, cache_hit=False, **_):
        if cache_hit:
            self.hits += 1
            return
        name = (metadata or {}).get("name") or getattr(getattr(src, "fn", None), "__name__", "?")
        self.details.append({"kernel": str(name), "seconds": getattr(times, "total", 0) / 1e6, **specialization(src)})

    @property
    def misses(self) -> list[tuple[str, float]]:
        return [(d["kernel"], d["seconds"]) for d in self.details]

    def __enter__(self) -> "TritonCompileLog":
        try:
            from triton import knobs
            self._knobs = knobs.compilation if hasattr(knobs.compilation, "listener") else None
        except ImportError:
            self._knobs = None
        if self._knobs is not None:
            self._prev = self._knobs.listener
            self._knobs.listener = self._listener
        return self

    def __exit__(self, *exc) -> None:
        if self._knobs is not None:
            self._knobs.listener = self._prev

    def summary(self) -> dict[str, Any]:
        by: dict[str, list] = {}
        misses = self.misses
        for name, sec in misses:
            e = by.setdefault(name, [0, 0.0])
            e[0] += 1
            e[1] += sec
        return {"count": len(misses), "seconds": sum(s for _, s in misses), "cache_hits": self.hits,
                "by_kernel": by, "specializations": self.details}


def specialization(src: Any) -> dict[str, Any]:
    """A compiled source's specialization by argument name (Triton 3.6's `ASTSource`: `constants`
    keyed by argument index paths, `attrs` such as 16-divisibility, `signature` types): {"constexprs":
    {name: value}, "specialized": {name: attributes}, "types": {name: type}} with values as text
    where JSON has no type for them; {} for a source without them."""
    fn = getattr(src, "fn", None)
    names = list(getattr(fn, "arg_names", None) or [])
    if not names:
        return {}

    def arg(path: Any) -> str:
        i = path[0] if isinstance(path, tuple) and path else path
        return names[i] if isinstance(i, int) and 0 <= i < len(names) else str(path)

    def plain(v: Any) -> Any:
        return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)

    consts = {arg(k): plain(v) for k, v in (getattr(src, "constants", None) or {}).items()}
    spec = {arg(k): plain(v) for k, v in (getattr(src, "attrs", None) or {}).items()}
    types = {str(k): plain(v) for k, v in (getattr(src, "signature", None) or {}).items() if v != "constexpr"}
    return {"constexprs": consts, "specialized": spec, "types": types}


def percentile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    i = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[i]


# ---- profiling ------------------------------------------------------------------------------------

def profile_timeline(prof, steps: int) -> list[dict]:
    """Under CUDA graphs, over the profiled steps (from the first step's start to the last one's
    end): wall time, GPU busy time (the union of kernel and copy intervals) and GPU idle time, per
    step; the idle time before each kernel name; the kernels' time per step by name. The steps are the
    profiler's `kvpack_step` ranges (torch.profiler.record_function); without GPU events (a CPU run)
    the busy time is 0."""
    evs = prof.events()
    cpu, gpu = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    marks = sorted((e.time_range.start, e.time_range.end) for e in evs
                   if e.name == "kvpack_step" and e.device_type == cpu)
    if not marks:
        return []
    t0, t1 = marks[0][0], marks[-1][1]
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in evs
                     if e.device_type == gpu and e.name != "kvpack_step" and e.time_range.end > e.time_range.start
                     and t0 <= e.time_range.start < t1)
    busy, end, gaps_by_name = 0.0, None, {}
    for a, b, name in kernels:
        if end is not None and a > end:
            gaps_by_name[name[:60]] = gaps_by_name.get(name[:60], 0.0) + (a - end) / steps
        busy += max(0.0, b - max(a, end or a))
        end = b if end is None else max(end, b)
    rows = [{"name": "per step", "wall_us": (t1 - t0) / steps, "busy_us": busy / steps,
             "idle_us": (t1 - t0 - busy) / steps, "kernels": len(kernels) / steps}]
    top = sorted(gaps_by_name.items(), key=lambda kv: -kv[1])[:25]
    rows += [{"name": f"idle before {n}", "us_per_step": g} for n, g in top]
    per_name: dict[str, list[float]] = {}
    for a, b, name in kernels:
        t = per_name.setdefault(name[:90], [0.0, 0])
        t[0] += (b - a) / steps
        t[1] += 1 / steps
    rows += [{"name": f"kernel {n}", "us_per_step": t, "calls_per_step": c}
             for n, (t, c) in sorted(per_name.items(), key=lambda kv: -kv[1][0])[:25]]
    return rows
