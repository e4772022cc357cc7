"""Decode per layer (graph of 8 calls, each on its own cache, L2 flushed), 32 q / 32 kv heads at head dims 80 / 96:
int4 in parts (`int4_parts`) against each nibble half padded, side by side (FMTS=bf16,int4): session 31's
hd_tune2.py with two more int4 runs (32-token tiles) and int4's third-tile width in each row."""
import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "results", "head_dims_s31", "scripts"))
from hd_tune2 import RUNS, main  # noqa: E402

main({**RUNS, "int4": RUNS["int4"] + [("parts bn32", True, {"block_n": 32}), ("padded bn32", False, {"block_n": 32})]},
     "hd_int4.json", v4p=True)
