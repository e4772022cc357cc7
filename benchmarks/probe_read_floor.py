"""What reading a decode call's bytes costs at the least (H200): per layer (a CUDA graph of `--layers` calls, each
on its own buffer, L2 flushed before each replay, as bench_attention's "us / layer"), the time of a kernel that
only reads the bytes of each format's KV cache at #4's shapes and adds them up: a Triton streamer (programs
striding over 16-byte vectors, a few per SM or one pass; `--readers`: warps, words a load, loads in flight) and
torch's own sum, the fastest counted. Its time against the bf16
cache's is the ratio no decode kernel can beat at that shape: the launch, the ramp and the tail are in it,
the attention's arithmetic and the split merge are not.

    python benchmarks/probe_read_floor.py [--shapes llama8b-1x32768,...] [--out read_floor.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_attention import SHAPES, environment, make_cache, time_graph  # noqa: E402

FORMATS = ["bf16", "int8", "int4", "fp8_e4m3"]


@triton.jit
def _read_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """Sum n int32 words in chunks of BLOCK * UNROLL, programs striding over the chunks; one int32 a program."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    step = tl.num_programs(0) * BLOCK * UNROLL
    base = pid * BLOCK * UNROLL
    while base < n:  # (a while loop: the CPU interpreter cannot range over tensor bounds)
        for u in tl.static_range(UNROLL):
            offs = base + u * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
        base += step
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def kv_bytes_of(fmt: str, shape) -> int:
    """Codes + scales (+ zero-points) a decode call reads: the pools' bytes per token and head, as bench_attention."""
    lc = make_cache(fmt, shape, 1, "cpu")
    per_token = (lc.k.fmt.bytes_per_token_head + lc.v.fmt.bytes_per_token_head) * shape.hkv
    return per_token * shape.batch * shape.context


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="llama8b-1x32768,llama8b-8x8192,llama8b-32x4096,smollm2-32x4096")
    ap.add_argument("--readers", default="4x512x4,8x1024x4",
                    help="the streamer's configurations, warps x words a load x loads in flight a loop")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rep-ms", type=int, default=20)
    ap.add_argument("--programs-per-sm", default="2,4,8",
                    help="programs an SM (0: one program per chunk, a single pass over the buffer)")
    ap.add_argument("--out", default="read_floor.json")
    args = ap.parse_args()
    try:
        readers = [tuple(int(v) for v in r.split("x")) for r in args.readers.split(",")]
    except ValueError:
        readers = []
    if not readers or any(len(r) != 3 or min(r) < 1 or r[1] & (r[1] - 1) for r in readers):
        ap.error(f"--readers {args.readers!r}: expected WARPSxWORDSxLOADS,... of positive integers, WORDS a power of "
                 "two, e.g. 8x1024x4")
    dev = torch.device("cuda")
    env = environment(sys.argv)
    print(json.dumps(env), flush=True)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    shapes = {s.name: s for s in SHAPES}
    rows = []
    for sname in args.shapes.split(","):
        shape = shapes[sname]
        base = None
        for fmt in args.formats.split(","):
            nbytes = kv_bytes_of(fmt, shape)
            bufs = [torch.ones(nbytes // 4, dtype=torch.int32, device=dev) for _ in range(args.layers)]
            best = {}
            for per_sm in (int(x) for x in args.programs_per_sm.split(",")):
                for warps, block, unroll in readers:
                    grid = (per_sm * sms if per_sm else triton.cdiv(nbytes // 4, block * unroll),)
                    out = torch.empty(grid[0], dtype=torch.int32, device=dev)  # one word a program

                    def step(g=grid, w=warps, b=block, u=unroll, xs=bufs, o=out):
                        for x in xs:
                            _read_kernel[g](x, x.numel(), o, BLOCK=b, UNROLL=u, num_warps=w)
                    name = f"triton/{per_sm or 'pass'}x{warps}w/{block}x{unroll}"
                    best[name] = time_graph(step, args.rep_ms) / args.layers
            sums = [torch.empty((), dtype=torch.int64, device=dev) for _ in bufs]
            best["torch.sum"] = time_graph(lambda: [torch.sum(x, dim=0, out=s) for x, s in zip(bufs, sums)],
                                           args.rep_ms) / args.layers
            name, us = min(best.items(), key=lambda kv: kv[1])
            row = {"shape": sname, "format": fmt, "bytes": nbytes, "us_layer": us, "best": name,
                   "TBps": nbytes / us / 1e6, "all": best}
            if fmt == "bf16":
                base = us
            row["vs_bf16"] = us / base if base else None
            rows.append(row)
            print(json.dumps(row), flush=True)
            bufs = sums = out = None
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
