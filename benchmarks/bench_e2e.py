"""kvpack vs Hugging Face transformers, end to end, on the same dummy weights and workloads.

    python benchmarks/bench_e2e.py [--model llama-3.1-8b] [--kv-cache-memory 16GiB] [--out results/gpu]

Workloads (seeded random token ids, EOS ignored, greedy): `short` (256 requests, 128 in, 128 out)
and `kv-bound` (inputs 2048:8192, outputs 256:512; fewer requests by default than the throughput
criterion's 256, since transformers needs minutes for them). transformers runs its batched
`generate` (SDPA attention, left padding, requests sorted by length to cut padding, dynamic cache or
`--hf-cache static`), with batches as large as the same KV budget allows at the padded length; its
output tokens/s counts only the tokens each request asked for. kvpack runs every format of
`--kv-cache-dtype` with that budget (`--kv-cache-memory`). The transformers model shares kvpack's
weight tensors (q/k/v and gate/up are row views of the fused matrices), so nothing is copied.
Writes e2e.json and e2e.md to --out and prints the table: output tok/s and the ratio to transformers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvpack.config import DEFAULT_WATERMARK  # noqa: E402
from kvpack.engine.memory_planner import parse_bytes  # noqa: E402
from kvpack.tools.bench_common import (  # noqa: E402
    LenRange, build_engine, env_info, format_table, load_once, parse_format_list, parse_len_range,
    random_prompts, release, write_json,
)
from kvpack.tools.bench_throughput import run_requests  # noqa: E402


def hf_model_from_kvpack(loaded) -> torch.nn.Module:
    """A transformers LlamaForCausalLM whose parameters are views of kvpack's (no copy)."""
    import transformers

    mc, model = loaded.model_config, loaded.model
    rope = {"rope_type": "default", "rope_theta": mc.rope_theta}
    if mc.rope_scaling:
        rope = {**mc.rope_scaling, "rope_theta": mc.rope_theta}
    cfg = transformers.LlamaConfig(
        vocab_size=mc.vocab_size, hidden_size=mc.hidden_size, intermediate_size=mc.intermediate_size,
        num_hidden_layers=mc.num_layers, num_attention_heads=mc.num_heads, num_key_value_heads=mc.num_kv_heads,
        head_dim=mc.head_dim, rms_norm_eps=mc.rms_norm_eps, max_position_embeddings=mc.max_position_embeddings,
        tie_word_embeddings=mc.tie_word_embeddings, rope_parameters=rope, bos_token_id=None, eos_token_id=None,
        pad_token_id=0, attention_bias=mc.attention_bias)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(cfg)
    q, kv, inter = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim, mc.intermediate_size
    sd = {}
    for name, p in model.named_parameters():
        if ".qkv_proj." in name:
            base = name.replace(".qkv_proj.", ".{}.")
            sd[base.format("q_proj")], sd[base.format("k_proj")], sd[base.format("v_proj")] = (
                p[:q], p[q:q + kv], p[q + kv:])
        elif ".gate_up_proj." in name:
            base = name.replace(".gate_up_proj.", ".{}.")
            sd[base.format("gate_proj")], sd[base.format("up_proj")] = p[:inter], p[inter:]
        else:
            sd[name] = p
    if mc.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    hf.load_state_dict(sd, strict=not mc.tie_word_embeddings, assign=True)
    if mc.tie_word_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    device = model.model.embed_tokens.weight.device
    rotary_cls = type(hf.model.rotary_emb)
    with torch.device("cpu"):  # its buffers were on meta: recompute (float32), then move
        hf.model.rotary_emb = rotary_cls(cfg).to(device)
    return hf.eval().requires_grad_(False)


@torch.inference_mode()
def run_hf(hf, workload, budget_bytes: int, bytes_per_token: int, cache: str, device) -> dict:
    """Batched greedy generate over the workload (sorted by length); useful tokens per second."""
    from transformers import GenerationConfig

    order = sorted(range(len(workload)), key=lambda i: -len(workload[i][0]))
    batches, i = [], 0
    while i < len(order):
        longest = len(workload[order[i]][0]) + max(workload[j][1] for j in order[i:])
        size = max(1, min(len(order) - i, budget_bytes // (bytes_per_token * longest)))
        batches.append(order[i:i + size])
        i += size
    n_out = sum(o for _, o in workload)
    _sync(device)
    t0 = time.perf_counter()
    for batch in batches:
        prompts = [workload[j][0] for j in batch]
        new = max(workload[j][1] for j in batch)
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for r, p in enumerate(prompts):  # left padding
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        gen = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                               eos_token_id=None, cache_implementation=None if cache == "dynamic" else cache)
        out = hf.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gen)
        assert out.shape[1] == width + new, out.shape
    _sync(device)
    elapsed = time.perf_counter() - t0
    dtype = str(next(hf.parameters()).dtype).removeprefix("torch.")
    return {"engine": "transformers", "kv_cache_dtype": dtype, "num_requests": len(workload),
            "output_tokens": n_out, "elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
            "batches": len(batches), "max_batch": max(len(b) for b in batches)}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="dummy:llama-3.1-8b")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default=None)
    p.add_argument("--kv-cache-dtype", default="bfloat16,int8,int4")
    p.add_argument("--kv-cache-memory", type=parse_bytes, default=parse_bytes("16GiB"))
    p.add_argument("--short-requests", type=int, default=256)
    p.add_argument("--short-input-len", type=parse_len_range, default=LenRange(128, 128))
    p.add_argument("--short-output-len", type=parse_len_range, default=LenRange(128, 128))
    p.add_argument("--kv-requests", type=int, default=32, help="requests of the KV-bound workload (default 32)")
    p.add_argument("--kv-input-len", type=parse_len_range, default=LenRange(2048, 8192))
    p.add_argument("--kv-output-len", type=parse_len_range, default=LenRange(256, 512))
    p.add_argument("--workloads", default="short,kv-bound")
    p.add_argument("--hf-cache", default="dynamic", choices=("dynamic", "static"))
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.environ.get("OUT", "results/gpu"))
    args = p.parse_args(argv)
    formats = parse_format_list(args.kv_cache_dtype)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine_args = argparse.Namespace(
        model=args.model, dtype=args.dtype, kv_scales=None, no_kv_rotation=False, no_kv_centering=False, int4_group_size=32,
        block_size=16, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=None, max_model_len=None,
        watermark=DEFAULT_WATERMARK,
        no_prefix_caching=False, num_blocks=None, kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=0.9, enforce_eager=False, device=device, seed=args.seed)
    loaded = load_once(engine_args)
    hf = hf_model_from_kvpack(loaded)
    bpt_bf16 = 2 * 2 * loaded.model_config.num_layers * loaded.model_config.num_kv_heads * loaded.model_config.head_dim
    specs = {"short": (args.short_requests, args.short_input_len, args.short_output_len),
             "kv-bound": (args.kv_requests, args.kv_input_len, args.kv_output_len)}
    rows = []
    for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        n, inp, outp = specs[name]
        workload = random_prompts(n, inp, outp, loaded.model_config.vocab_size, args.seed)
        max_len = inp.hi + outp.hi
        hf_row = {"workload": name, **run_hf(hf, workload, args.kv_cache_memory, bpt_bf16, args.hf_cache, device)}
        print(f"[{name}] transformers: {hf_row['output_tok_s']:,.0f} output tok/s "
              f"({hf_row['batches']} batches of <= {hf_row['max_batch']})", flush=True)
        for item in formats:
            engine = build_engine(engine_args, item, max_model_len=max_len)
            try:
                warm = random_prompts(2, LenRange(min(16, inp.lo), min(256, inp.hi)),
                                      LenRange(min(4, outp.lo), min(4, outp.lo)), loaded.model_config.vocab_size,
                                      args.seed + 1)
                run_requests(engine, warm, prefix="warmup", progress=False)
                r = run_requests(engine, workload)
                rows.append({"workload": name, "engine": "kvpack", "kv_cache_dtype": item,
                             "kv_cache_tokens": engine.kv_cache_info()["num_tokens"], **r,
                             "vs_transformers": r["output_tok_s"] / hf_row["output_tok_s"]})
            finally:
                release(engine)
            print(f"[{name}] kvpack {item}: {rows[-1]['output_tok_s']:,.0f} output tok/s, "
                  f"{rows[-1]['vs_transformers']:.2f}x transformers", flush=True)
        rows.append({**hf_row, "vs_transformers": 1.0})
    cols = [("workload", "workload", ""), ("engine", "engine", ""), ("kv_cache_dtype", "KV format", ""),
            ("num_requests", "requests", "d"), ("output_tok_s", "output tok/s", ",.0f"),
            ("vs_transformers", "vs transformers", ".2f"), ("elapsed_s", "seconds", ".1f")]
    table = format_table(rows, cols)
    head = (f"kvpack vs transformers {getattr(__import__('transformers'), '__version__', '?')}: {args.model} "
            f"{args.dtype}, KV budget {args.kv_cache_memory / 2**30:.1f} GiB, greedy, EOS ignored")
    print("\n" + head + "\n" + table)
    os.makedirs(args.out, exist_ok=True)
    config = {k: str(v) if isinstance(v, LenRange) else v for k, v in vars(args).items()}
    write_json(os.path.join(args.out, "e2e.json"), {"bench": "e2e", "env": env_info(),
                                                    "config": {**config, "kv_cache_dtype": formats}, "results": rows})
    with open(os.path.join(args.out, "e2e.md"), "w") as f:
        f.write(head + "\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
