"""`kvpack generate`: offline generation for prompts given as arguments or on stdin.

Completions go to stdout (one per prompt, separated by a blank line when there are several);
the start-up log and a summary line (requests, tokens, tok/s, KV format, blocks, bytes/token)
go to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

from kvpack.config import CACHE_DTYPE_HELP, KVPackError, add_int4_group_size_arg, add_watermark_arg


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "generate", help="generate completions for prompts (offline, continuous batching)",
        description="Generate completions for PROMPTs with the paged (optionally 8-/4-bit) KV cache. "
                    "Completions print to stdout, one per prompt; logs and a summary go to stderr.")
    p.add_argument("prompts", nargs="*", metavar="PROMPT",
                   help="prompt text; '-' or none reads one prompt per line from stdin")
    m = p.add_argument_group("model")
    m.add_argument("--model", default=None,
                   help="HF folder, .gguf file or preset such as dummy:tiny-llama "
                        "(default: the embedded SmolLM2-135M-Instruct GGUF)")
    m.add_argument("--dtype", default="auto",
                   help="weights and activations: auto (float32 on CPU, the checkpoint's 16-bit "
                        "type on GPU), float32, bfloat16, float16")
    m.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    m.add_argument("--seed", type=int, default=0,
                   help="seed of the sampling generator and of random preset weights (default 0)")
    c = p.add_argument_group("KV cache")
    c.add_argument("--kv-cache-dtype", default="auto", help=f"K and V cache format: {CACHE_DTYPE_HELP} (default auto: the model dtype)")
    c.add_argument("--k-cache-dtype", default=None, help="K cache format (overrides --kv-cache-dtype)")
    c.add_argument("--v-cache-dtype", default=None, help="V cache format (overrides --kv-cache-dtype)")
    c.add_argument("--kv-scales", default=None, metavar="FILE",
                   help="scales file from `kvpack calibrate`: static per-(layer, head) scales for "
                        "int8 / fp8 instead of per-token scales")
    c.add_argument("--no-kv-rotation", dest="kv_rotation", action="store_false",
                   help="int4 / fp8: store K/V without the Hadamard rotation")
    add_int4_group_size_arg(c)
    c.add_argument("--no-kv-centering", dest="kv_centering", action="store_false",
                   help="store quantized K (and fp8 V) without subtracting their per-channel means "
                        "(from --kv-scales, else from a probe text run at start)")
    c.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block: 8, 16, 32, 64, 128 (default 16)")
    c.add_argument("--num-blocks", type=int, default=None,
                   help="fixed number of KV blocks (default: from the memory budget)")
    c.add_argument("--kv-cache-memory", default=None, metavar="BYTES",
                   help="memory for the KV pools, e.g. 8GiB or 512MiB (default: from "
                        "--gpu-memory-utilization on GPU, at most 2 GiB on CPU)")
    c.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory kvpack may use in all (default 0.9)")
    c.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="do not reuse the KV blocks of shared prompt prefixes")
    s = p.add_argument_group("scheduler")
    s.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output in tokens (default: the model's, at most 4096 on CPU)")
    s.add_argument("--max-num-seqs", type=int, default=None,
                   help="sequences per batch (default 64 on CPU, 256 on GPU)")
    add_watermark_arg(s)
    s.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode")
    s.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false",
                   help="launch each step only after the previous step's tokens are back (default: launch it first, its inputs for those tokens read on the device)")
    s.add_argument("--disable-async-output-proc", action="store_true",
                   help="process each step's output text before launching the next step (default: the next step runs on the device meanwhile)")
    s.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per step; longer prompts are prefilled in chunks (default 2048 on "
                        "CPU, 8192 on GPU)")
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt at most (default 128)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 = greedy, the CLI's default (vLLM's Python default is 1)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the most likely tokens up to this mass, in (0, 1] (default 1: off)")
    g.add_argument("--top-k", type=int, default=-1, help="sample among the k most likely tokens (default -1: off; 0 is off too)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    g.add_argument("--chat", action="store_true",
                   help="wrap each prompt as a user message in the model's chat template")
    g.add_argument("--system", default=None, help="with --chat: a system message")
    return p


def run(args: argparse.Namespace) -> int:
    from kvpack.sampling_params import SamplingParams

    # Validate everything cheap before loading the model.
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, ignore_eos=args.ignore_eos)
    for flag in ("block_size", "num_blocks", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise KVPackError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    prompts = _read_prompts(args.prompts)

    from kvpack.entrypoints.llm import LLM

    llm = LLM(model=args.model, dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
              k_cache_dtype=args.k_cache_dtype, v_cache_dtype=args.v_cache_dtype,
              kv_scales=args.kv_scales, kv_rotation=args.kv_rotation, kv_centering=args.kv_centering,
              int4_group_size=args.int4_group_size, block_size=args.block_size,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=args.max_model_len, watermark=args.watermark,
              enable_prefix_caching=args.enable_prefix_caching,
              num_blocks=args.num_blocks, kv_cache_memory=args.kv_cache_memory,
              gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
              disable_async_output_proc=args.disable_async_output_proc, async_scheduling=args.async_scheduling,
              device=args.device, seed=args.seed)
    t0 = time.perf_counter()
    if args.chat:
        head = [{"role": "system", "content": args.system}] if args.system else []
        outputs = llm.chat([head + [{"role": "user", "content": p}] for p in prompts], params)
    else:
        outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    for i, out in enumerate(outputs):
        if i:
            sys.stdout.write("\n")
        sys.stdout.write(out.text + "\n")
    sys.stdout.flush()
    engine = llm.llm_engine
    info = engine.kv_cache_info()
    n_prompt = sum(len(o.prompt_token_ids) for o in outputs)
    n_gen = sum(len(o.token_ids) for o in outputs)
    print(f"kvpack: {len(outputs)} request(s), {n_prompt} prompt + {n_gen} generated tokens in "
          f"{elapsed:.2f} s ({n_gen / max(elapsed, 1e-9):.1f} tok/s generated); KV cache "
          f"{engine.kv_format_name}, {info['num_blocks']} blocks x {info['block_size']}, "
          f"{info['bytes_per_token']} bytes/token", file=sys.stderr)
    return 0


def _read_prompts(given: list[str]) -> list[str]:
    if not given or given == ["-"]:
        if sys.stdin.isatty():
            print("kvpack: reading prompts from stdin, one per line (Ctrl-D to end)", file=sys.stderr)
        prompts = [line.rstrip("\n") for line in sys.stdin]
        prompts = [p for p in prompts if p.strip()]
    else:
        prompts = [sys.stdin.read().rstrip("\n") if p == "-" else p for p in given]
    if not prompts:
        raise KVPackError("no prompts given (pass PROMPT arguments or lines on stdin)")
    return prompts
