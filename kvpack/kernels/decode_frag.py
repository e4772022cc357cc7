"""Decode attention with the 8-bit codes loaded straight into the MMA's fragment layout (Gluon).

Variant "frag" (`plan_decode` picks it for FP8 K and V at head_dim 128 when a program has >= 1024
tokens: measured 5-13 % faster than "dot" there, 3-15 % slower at 256-512): the "dot" kernel is written in
the Triton language, which cannot choose a load's layout, so every K and V tile is converted to
fp16 in a load layout and staged through shared memory into the MMA operand layout (STS + LDSM per
tile). Triton's Gluon dialect states layouts explicitly; here each lane loads exactly the codes of
its own mma.m16n8k16 fragments and converts them in registers:

- K (B operand of q @ K^T, [k = channel, n = token]): a lane holds, per 8-token n-tile, channels
  {16 j + 8 h + 2 t + e} of token lane / 4 (t = lane % 4). The head dimension is permuted, for q and
  K alike (q . k does not change): logical channel 16 j + 8 h + 2 t + e is byte 32 t + 4 j + 2 h + e
  of the code row, so a lane reads 32 contiguous bytes per token (two 16-byte loads).
- V (B operand of P @ V, [k = token, n = channel]): a lane holds tokens {16 s + 8 h + 2 t + e} of
  channels {8 m + lane / 4}; output channels are permuted instead (logical 8 m + nl is byte
  16 nl + m: 16 contiguous bytes per token, stored back to channel 16 nl + m), and the token pairs
  that share a 32-bit fragment register are interleaved in registers.
`convert_layout(..., assert_trivial=True)` makes the compiler prove that neither hand-over moves
data between lanes.
- int8 K (since session 6; on the H200 since session 7, results/attention_tune_s7): the codes feed mma.m16n8k32.s8 as they are loaded
  (no conversion), with q split per row into two int8 parts as in the "imma" variant
  (`quant.split_q_int8`); the same 32-byte loads per lane, read as logical channel
  32 j + 16 h + 4 t + e = code byte 32 t + 8 j + 4 h + e. q's parts reach the MMA operand layout
  through shared memory once per program (2 KB at most); the tiles use none. sm_90 SASS per
  64-token tile: int8 1312 instructions (fp16 MMAs here: 1633; "imma": 1252), int8-static 992
  (1345; 1037).

- e4m3 on sm >= 89 (session 22, `decode_plan.hw_fp8_decode`): the codes become fp16 by the conversion
  instruction (`cvt.rn.f16x2.e4m3x2`, one per two codes, their values exactly) instead of three integer
  operations per two (value / 256), and the plan passes the factor 1 instead of 256 (power-of-two factors:
  the same output bits, gpu-marked test). sm_90 SASS of the ring's loop: 1755 -> 1242 instructions a tile.
  H200, per layer (results/attention_s22): fp8_e4m3 0.90-0.92x its time (32 x 4096 80.9 -> 73.5 us), level
  with fp8_e5m2, whose byte move is already one instruction. Ampere builds keep the software decode.
  e5m2 (session 40, `decode_plan.e5m2_hw_decode`): in "fragt" its codes take the conversion instruction too
  (`cvt.rn.f16x2.e5m2x2`, F2FP in place of a PRMT, the same bits): SmolLM2's 32 x 4096 21.1 -> 20.0 us per layer,
  level with e4m3; "frag" keeps the permute (0.999-1.008x there; results/e5m2_hw_s40).

- PREFETCH > 0 (session 9): the whole tiles are copied PREFETCH tiles ahead with cp.async (Ampere's
  asynchronous copy; no registers held while the bytes travel) into a ring of PREFETCH + 1 slots in
  shared memory (16.6 KB a slot with per-token scales). A warp copies whole 128-byte rows (coalesced)
  into a buffer with its 16-byte chunks swizzled (chunk ^ row), then, after the wait and a barrier,
  each lane reads its fragment bytes (`K_RING`, `V_RING`: the hand-over to `K_LOAD` / `V_LOAD` is
  again proven a register renaming); both sides are free of bank conflicts. Same operations on the
  same codes: the outputs equal PREFETCH = 0 bit for bit (gpu-marked test). The last, partial tile
  still loads directly. Blocks of >= 16 tokens only (the scale copies need 4-byte alignment). The first
  copies go out before q's loads and split (session 21: the first KV request was the ~550th instruction,
  behind three dependent global loads, and is now the ~190th; H200, `probe_fixed_cost.py`: the fixed cost
  of a call, int8 9.5 -> 8.3 us, fp8_e4m3 10.1 -> 9.5).

- int4 (session 16, only when asked for: variant="frag"): K and V codes are dequantized in registers
  (code * s + m, one fp16 fma per pair after an exact nibble -> fp16 conversion, `_ASM_INT4_DEQ`) and
  go to fp16 MMAs. Byte j of a code row holds channels j and j + 64. K: lane t reads bytes 16 t .. 16 t
  + 15 of a token (one 16-byte load): channels 16 t + b (low nibbles) and 64 + 16 t + b (high), two
  groups a lane; logical channel 16 j + 8 h + 2 t + e is channel 64 (j // 4) + 16 t + 4 (j % 4) + 2 e + h
  (q permuted alike; session 29: K's registers convert bytes (0, 2) and (1, 3) as pairs, `_ASM_INT4_DEQ_K`,
  13 instructions a register of codes against 15: before, 2 h + e). V: lane 4 nl + t reads bytes 8 nl ..
  8 nl + 7 of its tokens; logical output channel 8 m + nl is channel 64 (m // 8) + 8 nl + m % 8. PREFETCH is an L2 prefetch distance there
  (`prefetch.global.L2` of the tile PREFETCH ahead; default 1), not the ring. Measured on an H200
  (results/attention_s16): 0.96-1.00x the time of "dot" at batch >= 8 and 1.07x at 1 x 32768, so
  "auto" keeps "dot"; both sit at ~1.85 TB/s with ~250 registers (8 one-warp programs per SM).
  Group sizes >= 16 (a lane's 16 K bytes share a group); not int8 K with int4 V (it spills).

- "fragt" (session 18; `_fragt_decode_kernel`, "auto" for int4 K and V at GQA groups <= 8): the int4
  kernel with both products transposed, so that the query heads are the MMA's n dimension (8) instead of
  its m (16, a group of 4 padded to 16): scores S^T [64 tokens, 8 heads] = K @ q^T with K as the A
  operand, the online softmax down the token axis, O^T [128, 8] += V^T @ P^T with V^T as the A operand.
  The lanes hold the same K and V bytes as in "frag" (the A layouts of K [64, 128] and V^T [128, 64]
  cover the same tokens and channels per lane as the B layouts of K^T and V), so the loads, the
  dequantization and the channel orders are frag's and the hand-overs are again proven register
  renamings; P^T moves from the scores' accumulator layout to the B operand within the warp (shuffles),
  q^T (softmax scale folded in, fp16) goes to its operand once per program through 2 KB of shared
  memory. Per 64-token tile: 64 m16n8k16 MMAs instead of 128, a quarter of the padded softmax work,
  an output accumulator of 32 registers a lane instead of 64 (sm_90 SASS of the whole kernel, both
  phases: 4,424 instructions against 4,976; still ~250 registers; with the fused merge its epilogue
  spills 52 / 57 words once per program, and still measured faster than the separate merge at 2-4
  splits). H200 (results/attention_s18): 0.84-0.99x the time of "dot" (int4 79 us at 32 x 4096, 0.57x
  kvpack bf16; 1 x 32768 unchanged). Doing each product by halves of the head dimension (one nibble at
  a time, to shorten live ranges) was no faster, nor with V's loads after the scores (3-6 % slower),
  and a 168-register cap spilled (11-18 % slower): e49d610, results/attention_s18/probe_halves.log.
  8-bit codes on both sides also run "fragt" when asked for (`_fragt_tile8`, session 18): frag's loads and
  conversions (int8 K through int8 MMAs with q^T's two int8 parts, per-token K scales on the score rows,
  the per-token V scale folded into P^T), direct loads only (no ring). sm_90 SASS against "frag" (both
  loop phases, 2 splits): int8 3,464 / 3,512 instructions, 206 / 246 registers; fp8_e4m3 3,472 / 4,136,
  190 / 242; int8-static 3,216 / 2,872, 168 / 240. H200 (session 19, results/attention_s19/probe_fragt8.log,
  each at its plan's splits): no faster than "auto" (frag / imma): int8 0.99-1.11x its time, int8-static
  0.99-1.04x, fp8_e4m3 0.98-1.09x, and with a 168-register cap 0.99-1.15x; so "auto" does not take it. Fewer
  registers did not buy time: both kernels wait on their loads, not on issue slots.

- int4 cp.async ring ("fragt", RING4 > 0; session 25, `decode_attention.INT4_RING` / KVPACK_INT4_RING; the
  default since session 26 where `decode_plan.int4_ring_default`: H200, per layer, 0.75-0.87x the direct loads'
  time, bit-equal, results/int4_ring_s26): int4 K and V in groups of 32 (also 64 and 128: 2 or 1 parameters a
  token, every lane then reading the same groups; sm_90 tile loop 1,602 / 1,378 instructions against 1,838 /
  1,778 with direct loads) copy whole tiles RING4 tiles ahead
  (`_r4_issue`) into a ring of RING4 + 1 slots of 10 KB: the codes as [32 token pairs, 128 bytes] (a pair's
  two rows are adjacent in a block; 32-byte units swizzled by pair % 4, so that K's 16-byte and V's 8-byte
  fragment reads are free of bank conflicts) and the group scales and zero-points as [8 groups of 8 tokens,
  8 NG] (16-byte copies). Each lane then reads its own code bytes (`K4_RING`, `V4_RING`: register renamings of
  K4_LOAD / V4_LOAD) and its two groups' parameters, loaded once per lane pair (K) or lane quad (V) and
  broadcast along the lane bits that share them (`_r4_k_params`, `_r4_v_params`). Same codes, parameters and
  operations as the direct loads: the gpu-marked test expects the same bits. sm_90 SASS of the tile loop, 2
  splits: 1,938 -> 1,652 instructions (the 96 two-byte global loads and their ~300 address instructions
  become 96 LDS.U16, 20 LDGSTS.128 and 24 LDS of codes); ~253 registers either way; 20 KB of shared memory
  a program at RING4 = 1, so an sm_86 multiprocessor (100 KB) holds 4 such programs. With the ring V also
  converts by token pairs (RING4_VPAIRS, `_v4_dequant_pairs`): V^T's A operand pairs consecutive tokens, the
  direct path's conversion pairs consecutive channels and then swaps halves (~128 PRMT a tile); here each
  register comes out as (even token, odd token) of one channel: one prmt per byte pair, one lop3 per nibble
  (the high nibble in place, its group scale / 16), the same sub and fma: 1,652 -> 1,497 instructions a tile
  (1,440 with K by `_ASM_INT4_DEQ_K`, session 29).
  Bit-equal to the direct path while every V group scale is >= 2^-10 (s / 16 a normal fp16; below, at most
  ~1 ulp of a value). Under a 128-register cap (KVPACK_INT4_RING_MAXNREG) the tile loop compiles without
  spills (1,501); the masked last tile spills.

- Rotated formats (session 19): q @ R is formed in the kernel as q loads (`_q_rot`: q is loaded in the
  kernel's bit-permuted channel order, and a 128-point Sylvester Hadamard is unchanged by a permutation of
  index bits, so the butterflies over the permuted index give the permuted q @ R), by "fragt" always and by
  "frag" with split-K on 8-bit codes (with int4 its sm_90 code spilled); "fragt" with one split also forms
  out @ R + V mean in its epilogue
  (`_store_out_rot`). That saves `rotate_heads`' launches (1.9-4.8 us a call on the H200). Measured per
  layer (bench_attention, results/attention_s19/rot): int4 "fragt" 0.5-5 % faster at every shape, FP8 "frag"
  4-6 % faster at 8 x 8192 and 32 x 4096 (split-K) and 3-7 % slower at 64 x 2048 and 128 x 1024 (one split,
  both rotations in the kernel). Since session 22 "frag" with one split rotates q in the kernel and stores its
  output as a split's partial, and `_merge_kernel` (a dependent launch) forms out @ R + V mean, instead of
  `rotate_heads` before and after (`decode_attention.FRAG_ROT_ONE_SPLIT`; in its own epilogue the rotation made
  the loop spill, 22 STL / 22 LDL a tile): FP8 per layer 79.0 -> 75.8 us at 64 x 2048, 84.8 -> 82.3-83.5 at
  128 x 1024 (results/attention_s22). Since session 35 "frag" with one split forms out @ R + V mean in its own
  epilogue again, in the MMA accumulator layout where acc lies (`_frag_hadamard_mma`: five butterfly stages in a
  thread's registers, two across lanes, none through shared memory; sm_90 SASS: no spills, the tile loops as the
  split path's), stage by stage in the order of the output channel's bits, so that it stores the merge kernel's
  bits (`decode_attention.FRAG_ROT_EPILOGUE`). H200, per layer, side by side (results/frag_epilogue_s35): fp8_e4m3
  64 x 2048 74.8 -> 72.3 us (0.576 -> 0.556x bf16), 128 x 1024 80.4 -> 76.7 (0.631 -> 0.602x); fp8_e5m2 75.0 ->
  72.5, 81.6 -> 76.1 (0.640 -> 0.598x).

- Head dim 64 (session 33; "fragt" on 8-bit K and V, "auto" at GQA groups <= 8: `decode_attention.FRAGT_HEAD64_AUTO`):
  a token's 64 code bytes take the layouts int4 has at head dim 128 (also 64 bytes a token): K in K4_LOAD (a lane
  reads 16 bytes of each of its 8 tokens: byte 16 t + 4 j + 2 h + e is channel 16 j + 8 h + 2 t + e, j < 4), V in
  V4_LOAD (bytes 8 nl .. 8 nl + 7 of 16 tokens: output channel 8 m + nl is byte 8 nl + m); `_k8_load`, `_v8_load`,
  `_k8_operand`, `_v8_operand`, `_q_phys` take D. A rotated side rotates q in the kernel (a 64-wide Hadamard is also
  unchanged by a permutation of index bits) and out @ R + V mean in the one-split epilogue or the separate merge
  (the fused merge, `_frag_merge_last`, is head dim 128's only). int8 K goes to fp16 MMAs (K8_F16: `int8_to_f16`, q
  in fp16) rather than int8 MMAs with q's two int8 parts, under a 128-register cap (`FRAGT_HEAD64_MAXNREG`): with
  int8 MMAs the kernel took 166 registers (capped at 128: 101 local loads / stores). H200, per layer, against the former "imma" /
  "dot" (results/head64_s33): SmolLM2 (9 / 3 heads) 32 x 4096 int8 24.3 -> 21.4 us, int8-static 22.2 -> 20.0,
  fp8_e4m3 28.1 -> 21.2; Llama-3.2-1B (32 / 8 heads) 32 x 4096 int8 50.2 -> 47.8, int8-static 45.3 -> 40.4, fp8_e4m3
  59.7 -> 44.4; faster at each of the five shapes measured. Session 34 (`_prefetch_tile`, PREFETCH > 0): each tile
  asks L2 for the tile PREFETCH ahead before its own loads (one address a lane: tokens 2 lane and 2 lane + 1 share a
  128-byte line), and the first PREFETCH tiles before q's loads; `plan_decode` takes one tile where the grid has <= 8
  programs a multiprocessor (`decode_attention.FRAGT_HEAD64_PREFETCH_PER_SM`; H200, per layer, results/head64_s34:
  0.76-0.97x the time there, SmolLM2 1 x 32768 int8 15.5 -> 11.8 us; 1.04-1.16x on fuller grids). The same output bits.
  Session 42 (RING8, results/int4_vpairs_s42): the codes and per-token scales can come through int4's cp.async ring
  instead (`_r4_issue` with NG 1 and no zero-points: a token pair's 128 code bytes, an 8-token group's 16 scale bytes;
  `_fragt_tile8` with RING reads the slot in K4_RING / V4_RING, register renamings of K4_LOAD / V4_LOAD), whole tiles
  RING8 ahead, the masked last tile loading directly. The same output bits. `plan_decode` takes it where the L2
  prefetch was (<= 8 programs an SM): H200, per layer, 0.91-1.00x the prefetch's time at nine grids; on fuller grids
  a program's 16.5 KB of shared memory (13 an SM) cost 1.06-1.26x.

- ALL_Q (session 36): a batch whose every sequence has its query token (T == B) tells the kernels so as a constant:
  q's row is the sequence index and the "has a query" predicate (masking the output store) is not kept through the
  tile loop, where with one split ptxas had juggled it (73 PLOP3 a tile of "frag" int8: 1,437 instructions against
  1,358). `plan_decode` passes it to "fragt" (`decode_attention.ALL_Q_VARIANTS`; H200, per layer, results/merge_s36:
  int4 0.98-1.00x the time, SmolLM2 int8 0.98x, fp8_e4m3 0.95x), not to "frag" (0.99-1.03x). The same output bits.

- int4 at head dim 64 (session 41; "fragt", "auto" for int4 K and V there: `decode_attention.FRAGT_HEAD64_INT4`): a
  token's 32 code bytes (byte j: channels j and j + 32). K in `K4_LOAD64` (a lane reads bytes 8 t .. 8 t + 7 of each of
  its 8 tokens: channels 8 t + b and 32 + 8 t + b; logical 16 j + 8 h + 2 t + e is channel 32 (j // 2) + 8 t + 4 (j % 2)
  + 2 e + h), V in `V4_LOAD64` (bytes 4 nl .. 4 nl + 3 of its 16 tokens: output channel 8 m + nl is 32 (m // 4) + 4 nl
  + m % 4, `_int4_v_channel`); head dim 128's conversions (`_ASM_INT4_DEQ_K`, `_ASM_INT4_DEQ`), direct loads, the L2
  prefetch as 8-bit codes take it, q @ R and out @ R + V mean in the kernel (one split) or the separate merge, 128
  registers. In groups of 32 (P_WORDS) a token's two scales and two zero-points load as one 32-bit word each and the
  conversion picks the halves (`_int4_dequant_words`): sm_90 SASS at SmolLM2's 32 x 4096, 142 -> 63 local loads /
  stores under the cap (161 registers uncapped, against 220), the same bits. H200, per layer, against "dot"
  (results/int4_h64_s41, call4): SmolLM2 32 x 4096 20.7 -> 18.6 us (0.70 -> 0.63x bf16), 8 x 8192 13.9 -> 12.6,
  1 x 32768 15.2 -> 13.2; Llama-3.2-1B 32 x 4096 45.8 -> 39.4, 8 x 8192 25.9 -> 22.9. On grids of <= 6 programs an
  SM it runs without the cap (`decode_attention.FRAGT_HEAD64_INT4_UNCAPPED_PER_SM`; call6: 0.94-0.97x at SmolLM2's
  thin shapes). Session 42 (results/int4_vpairs_s42): under the cap, V in groups of 32 converts by token pairs
  (V_PAIRS, `_v4_dequant_pairs64`: each register comes out as one channel's (even token, odd token), the MMA operand's
  pairs, instead of channel pairs swapped afterwards: 496 -> 240 PRMT in the kernel), and every group size without
  the next tile's prefetch asks L2 for the tile's own V rows as its K loads go out (V_PF0: in the sm_90 SASS, ptxas
  issues V's loads only after the scores' MMAs, 8-bit codes' alike). SmolLM2's 32 x 4096 plan: 2,888 -> 2,752
  instructions, 63 -> 39 spilled words; H200, per layer, 18.50 -> 17.45 us (0.62 -> 0.59x bf16), Llama-3.2-1B's
  32 x 4096 39.45 -> 37.74. The same bits while every V group scale is >= 2^-10 (as the ring's pairs).

- V8_PAIRS (session 44, `_v8_pairs`, `decode_attention.v8_pairs`): 8-bit V converted by token pairs. The MMA operand of
  P @ V (and of V^T @ P^T) holds one channel's (even token, odd token) fp16 pair in a register; `_to_f16` made pairs of
  channels, which the compiler then swapped between two tokens' registers (one prmt a register more). Now one prmt
  picks the pair from the two tokens' loaded registers. int8: one lop3 then makes each byte c the fp16 subnormal
  (c + 128) * 2^-24, exact (the MMA takes subnormal fp16 inputs); the product is scaled by 2^24, and 128 times each
  row's sum of P, as the MMA took it (P @ ones, 4 more MMAs a tile, kept per head in `lb` across the tiles, rescaled
  with the accumulator), is taken off once a program (`_v8_offset`). 1 instruction a code against 1.75. FP8 (sm >= 89):
  two prmt interleave the two tokens' bytes and the conversion instruction makes each pair, the values themselves
  (the same output bits). sm_90 SASS of the tile loops: "frag" int8 1,312 -> 1,131, its ring 1,359 -> 1,178, int8-static's
  ring 1,105 -> 949; "fragt" at head dim 64 int8 904 -> 833, int8-static 760 -> 659. H200, per layer, side by side
  (results/decode_s44, call 1): 0.97-1.00x the time for int8 (SmolLM2 32 x 4096 19.56 -> 19.06 us, Llama-3.1-8B
  32 x 4096 73.31 -> 72.84), FP8 in "frag" 0.98-1.00x, FP8 in "fragt" at head dim 64 0.99-1.01x (so not there).

Scope: int8, FP8 (per-token or static scales) and int4 codes, head_dim 128 ("fragt" also 64), one warp,
64-token tiles, GQA groups up to 16, block sizes >= 8; `plan_decode` routes everything else to "dot". Same
arguments, grid, split partials and merge as `_decode_kernel`. Gluon has no CPU interpreter: CI
compiles it ahead of time (tests/test_kernels_aot.py); the gpu-marked tests compare it with the
PyTorch reference.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from kvpack.kernels.quant import (
    K_FMT_FP8E4M3, K_FMT_FP8E5M2, K_FMT_INT4, K_FMT_INT8, fp8_decode_f16, fp8_decode_f16_hw, int8_to_f16, prefetch_l2,
    probe_entry, probe_exit, probe_stamp, split_q_int8,
)

MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
A_OP = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
B_OP = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
# int8 MMA operands (mma.m16n8k32.s8: four consecutive k per 32-bit register)
A_OP8 = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
B_OP8 = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=4)
Q_LOAD = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[1, 1], order=[1, 0])
ROWS = gl.SliceLayout(1, MMA)  # [GROUP_PAD] per-head vectors (m_i, l_i)
COLS = gl.SliceLayout(0, MMA)  # [64] per-token vectors (scales, masks)
# COLS as [8 groups of 8 tokens, 8]: a lane holds tokens 8 j + 2 (lane % 4) + {0, 1} (same elements)
COLS8 = gl.DistributedLinearLayout(reg_bases=[[0, 1], [1, 0], [2, 0], [4, 0]],
                                   lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
                                   warp_bases=[], block_bases=[], shape=[8, 8])
# K tile as [i 8, nl 8, t 4, b 32]: token 8 i + nl, code byte 32 t + b; lane 4 nl + t
K_LOAD = gl.BlockedLayout(size_per_thread=[8, 1, 1, 32], threads_per_warp=[1, 8, 4, 1],
                          warps_per_cta=[1, 1, 1, 1], order=[3, 2, 1, 0])
# V tile as [s 4, h 2, t 4, e 2, nl 8, m 16]: token 16 s + 8 h + 2 t + e, code byte 16 nl + m; lane 4 nl + t
V_LOAD = gl.BlockedLayout(size_per_thread=[4, 2, 1, 2, 1, 16], threads_per_warp=[1, 1, 4, 1, 8, 1],
                          warps_per_cta=[1, 1, 1, 1, 1, 1], order=[5, 3, 1, 0, 2, 4])
# int4 (two codes a byte, split-half nibbles; see the module doc):
# K tile as [i 8, nl 8, t 4, b 16]: token 8 i + nl, code byte 16 t + b; lane 4 nl + t
K4_LOAD = gl.BlockedLayout(size_per_thread=[8, 1, 1, 16], threads_per_warp=[1, 8, 4, 1],
                           warps_per_cta=[1, 1, 1, 1], order=[3, 2, 1, 0])
# V tile as [s 4, h 2, t 4, e 2, nl 8, m 8]: token 16 s + 8 h + 2 t + e, code byte 8 nl + m; lane 4 nl + t
V4_LOAD = gl.BlockedLayout(size_per_thread=[4, 2, 1, 2, 1, 8], threads_per_warp=[1, 1, 4, 1, 8, 1],
                           warps_per_cta=[1, 1, 1, 1, 1, 1], order=[5, 3, 1, 0, 2, 4])
PF_TOK = gl.BlockedLayout(size_per_thread=[2], threads_per_warp=[32], warps_per_cta=[1], order=[0])  # [64] tokens
PF_TOK32 = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[1], order=[0])  # [32]
K4_S = gl.SliceLayout(3, K4_LOAD)  # [i, nl, t]: a lane's group parameters per token
V4_S = gl.SliceLayout(5, V4_LOAD)  # [s, h, t, e, nl]


# cp.async ring (PREFETCH > 0): a tile's K (or V) codes as [8 groups of 8 tokens, 8 rows, 128 bytes]
# in shared memory, 16-byte chunks swizzled (chunk ^ row), so that the coalesced copies (a warp
# writes 4 whole rows) and the fragment-layout reads (a lane reads its 32 or 16 bytes) are both free of
# bank conflicts; the reads cross lanes (a barrier after the wait).
RING_COPY = gl.BlockedLayout(size_per_thread=[1, 1, 16], threads_per_warp=[1, 4, 8], warps_per_cta=[1, 1, 1],
                             order=[2, 1, 0])
RING_SMEM = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[2, 1, 0])
S_SMEM = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])  # scales [slot, 8, 8]
# K_LOAD and V_LOAD over [group, row, byte] (token 8 group + row): the same registers and lanes
K_RING = gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    lane_bases=[[0, 0, 32], [0, 0, 64], [0, 1, 0], [0, 2, 0], [0, 4, 0]], warp_bases=[], block_bases=[],
    shape=[8, 8, 128])
V_RING = gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 1, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    lane_bases=[[0, 2, 0], [0, 4, 0], [0, 0, 16], [0, 0, 32], [0, 0, 64]], warp_bases=[], block_bases=[],
    shape=[8, 8, 128])


@gluon.constexpr_function
def _dims(layout, rank: int, *keep: int):
    """The layout of dimensions `keep` of a rank-`rank` layout (nested slices)."""
    for d in reversed(range(rank)):
        if d not in keep:
            layout = gl.SliceLayout(d, layout)
    return layout


COLS8_G = gl.SliceLayout(1, COLS8)
RC_G, RC_R, RC_B = (_dims(RING_COPY, 3, d) for d in range(3))
# 8-bit codes at head dim 64 ("fragt", session 33): a token's 64 code bytes take int4's layouts at head dim 128 (also
# 64 bytes a token), K in K4_LOAD [i 8, nl 8, t 4, b 16] (a lane: 16 bytes of each of its tokens), V in V4_LOAD
# [s 4, h 2, t 4, e 2, nl 8, m 8] (a lane: bytes 8 nl .. 8 nl + 7 of its 16 tokens)
QT8_LOAD64 = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[8, 4], warps_per_cta=[1, 1], order=[1, 0])
QT_LOAD64 = gl.BlockedLayout(size_per_thread=[2, 8], threads_per_warp=[32, 1], warps_per_cta=[1, 1], order=[0, 1])


# int4 at head dim 64 ("fragt", session 41): a token's 32 code bytes (byte j: channel j in the low nibble, j + 32 in
# the high), K as [i 8, nl 8, t 4, b 8] (a lane: bytes 8 t .. 8 t + 7 of each of its 8 tokens, channels 8 t + b and
# 32 + 8 t + b), V as [s 4, h 2, t 4, e 2, nl 8, m 4] (a lane: bytes 4 nl .. 4 nl + 3 of its 16 tokens)
K4_LOAD64 = gl.BlockedLayout(size_per_thread=[8, 1, 1, 8], threads_per_warp=[1, 8, 4, 1],
                             warps_per_cta=[1, 1, 1, 1], order=[3, 2, 1, 0])
V4_LOAD64 = gl.BlockedLayout(size_per_thread=[4, 2, 1, 2, 1, 4], threads_per_warp=[1, 1, 4, 1, 8, 1],
                             warps_per_cta=[1, 1, 1, 1, 1, 1], order=[5, 3, 1, 0, 2, 4])


@gluon.constexpr_function
def _k4_layout(d: int):
    """The layout of an int4 K tile's code bytes at head dim d: [i 8, nl 8, t 4, d / 8 bytes]."""
    return K4_LOAD64 if d == 64 else K4_LOAD


@gluon.constexpr_function
def _k4s_layout(d: int):
    """`_k4_layout`'s per-lane group parameters [i, nl, t]."""
    return gl.SliceLayout(3, _k4_layout(d))


@gluon.constexpr_function
def _v4_layout(d: int):
    """The layout of an int4 V tile's code bytes at head dim d: [s 4, h 2, t 4, e 2, nl 8, d / 16 bytes]."""
    return V4_LOAD64 if d == 64 else V4_LOAD


@gluon.constexpr_function
def _v4s_layout(d: int):
    """`_v4_layout`'s per-lane group parameters [s, h, t, e, nl]."""
    return gl.SliceLayout(5, _v4_layout(d))


@gluon.constexpr_function
def _k8_layout(d: int):
    """The layout of an 8-bit K tile's codes at head dim d: [i 8, nl 8, t 4, d / 4 bytes]."""
    return K4_LOAD if d == 64 else K_LOAD


@gluon.constexpr_function
def _v8_layout(d: int):
    """The layout of an 8-bit V tile's codes at head dim d: [s 4, h 2, t 4, e 2, nl 8, d / 8 bytes]."""
    return V4_LOAD if d == 64 else V_LOAD

# int4 cp.async ring ("fragt", RING4 > 0; group size 32): a tile's K (or V) codes as [32 token pairs, 128 bytes]
# (tokens 2 p and 2 p + 1 of the tile, 64 bytes each), 32-byte units swizzled (unit ^ (p % 4)): the copies write
# whole 128-byte rows, K's fragment reads (a lane: 16 bytes of token 8 i + lane / 4) cover each row once per
# 8 lanes, and V's (a lane: 8 bytes of tokens 2 t + e, t = lane % 4, four tokens two pairs apart) land in four
# different units; all free of bank conflicts. The group scales and zero-points (4 fp16 a token) as
# [8 groups of 8 tokens, 32], unswizzled (a lane reads 2-byte values, many lanes the same word).
R4_SMEM = gl.SwizzledSharedLayout(vec=32, per_phase=1, max_phase=4, order=[1, 0])
R4P_SMEM = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
R4_COPY = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[1, 1], order=[1, 0])
R4P_COPY = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[8, 4], warps_per_cta=[1, 1], order=[1, 0])
# groups of 64 / 128 (2 / 1 parameters a token: rows of 16 / 8): the spare lanes copy the same 16 bytes again
R4P_COPY2 = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[16, 2], warps_per_cta=[1, 1], order=[1, 0])
R4P_COPY1 = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32, 1], warps_per_cta=[1, 1], order=[1, 0])
R4C_P, R4C_B = (_dims(R4_COPY, 2, d) for d in range(2))
R4P_G, R4P_C = (_dims(R4P_COPY, 2, d) for d in range(2))
R4P2_G, R4P2_C = (_dims(R4P_COPY2, 2, d) for d in range(2))
R4P1_G, R4P1_C = (_dims(R4P_COPY1, 2, d) for d in range(2))
# K4_LOAD and V4_LOAD over [pair, byte]: the same registers and lanes (token 8 i + nl = 2 p + byte // 64)
K4_RING = gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [4, 0], [8, 0], [16, 0]],
    lane_bases=[[0, 16], [0, 32], [0, 64], [1, 0], [2, 0]], warp_bases=[], block_bases=[], shape=[32, 128])
V4_RING = gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [0, 64], [4, 0], [8, 0], [16, 0]],
    lane_bases=[[1, 0], [2, 0], [0, 8], [0, 16], [0, 32]], warp_bases=[], block_bases=[], shape=[32, 128])
# K's group parameters as [i 8, nl 8, hi 2, t1 2, t0 2]: lane 4 nl + t holds token 8 i + nl's groups t // 2 (low
# nibbles, hi 0) and 2 + t // 2 (high nibbles, hi 1); loaded from the ring as [i, nl, hi, t1] in the slice at t0
# (the lanes t0 = 0 and 1 read the same values), then broadcast along t0
K4P = gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1, 0, 0], [1, 0, 0, 0, 0], [2, 0, 0, 0, 0], [4, 0, 0, 0, 0]],
    lane_bases=[[0, 0, 0, 0, 1], [0, 0, 0, 1, 0], [0, 1, 0, 0, 0], [0, 2, 0, 0, 0], [0, 4, 0, 0, 0]],
    warp_bases=[], block_bases=[], shape=[8, 8, 2, 2, 2])
# V's as [s 4, h 2, t 4, e 2, hi 2, nl2 2, nl1 2, nl0 2]: lane 4 nl + t holds tokens 16 s + 8 h + 2 t + e's groups
# nl // 4 (hi 0) and 2 + nl // 4 (hi 1); loaded as [s, h, t, e, hi, nl2] in the slice at nl1 and nl0
V4P = gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0],
               [1, 0, 0, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0, 0, 0]],
    lane_bases=[[0, 0, 1, 0, 0, 0, 0, 0], [0, 0, 2, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1],
                [0, 0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1, 0, 0]],
    warp_bases=[], block_bases=[], shape=[4, 2, 4, 2, 2, 2, 2, 2])
# V4_S with the token parity last, in registers ([s, h, t, nl, e]: e, h, s in registers, lane 4 nl + t)
VP_E = gl.BlockedLayout(size_per_thread=[4, 2, 1, 1, 2], threads_per_warp=[1, 1, 4, 8, 1], warps_per_cta=[1, 1, 1, 1, 1],
                        order=[4, 1, 0, 2, 3])
# V4_LOAD's codes of one token parity [s, h, t, nl, m]: m, h, s in registers (m fastest), lane 4 nl + t
VP_C = gl.BlockedLayout(size_per_thread=[4, 2, 1, 1, 8], threads_per_warp=[1, 1, 4, 8, 1], warps_per_cta=[1, 1, 1, 1, 1],
                        order=[4, 1, 0, 2, 3])
# groups of 32 load [i, nl, hi, t1] (K) / [s, h, t, e, hi, nl2] (V); of 64 (the same group for every lane)
# [i, nl, hi] / [s, h, t, e, hi]; of 128 (one group: hi 0 and 1 the same) [i, nl] / [s, h, t, e]
# int4 V at head dim 64 by token pairs (P_WORDS, session 42): V4_LOAD64's codes of one token parity [s, h, t, nl, m 4]
# (m, h, s in registers, m fastest; lane 4 nl + t), and a token parity's parameter words [s, h, t, nl] (VP_E's slice)
VP_C64 = gl.BlockedLayout(size_per_thread=[4, 2, 1, 1, 4], threads_per_warp=[1, 1, 4, 8, 1],
                          warps_per_cta=[1, 1, 1, 1, 1], order=[4, 1, 0, 2, 3])
K4P_4 = gl.SliceLayout(4, K4P)
K4P_3 = gl.SliceLayout(3, K4P_4)
K4P_2 = gl.SliceLayout(2, K4P_3)
V4P_7 = gl.SliceLayout(7, V4P)
V4P_6 = gl.SliceLayout(6, V4P_7)
V4P_5 = gl.SliceLayout(5, V4P_6)
V4P_4 = gl.SliceLayout(4, V4P_5)

# packed int4 bytes (4 a register) -> code * s + m as float16 pairs, low nibbles ($0, $1) and high ($2, $3):
# each nibble becomes the fp16 1024 + code (0x64 high byte), 1024 is subtracted (exact), then one fp16 fma
# with the group's (s, s) and (m, m) pairs, as "dot"'s `code * s + m` (fp16, contracted to an fma)
_ASM_INT4_DEQ = gl.constexpr("""{
.reg .b32 t, u, m, k, a0, a1, a2, a3;
mov.b32 m, 0x64646464;
mov.b32 k, 0x64006400;
and.b32 t, $4, 0x0F0F0F0F;
shr.b32 u, $4, 4;
and.b32 u, u, 0x0F0F0F0F;
prmt.b32 a0, t, m, 0x4140;
prmt.b32 a1, t, m, 0x4342;
prmt.b32 a2, u, m, 0x4140;
prmt.b32 a3, u, m, 0x4342;
sub.f16x2 a0, a0, k;
sub.f16x2 a1, a1, k;
sub.f16x2 a2, a2, k;
sub.f16x2 a3, a3, k;
fma.rn.f16x2 $0, a0, $5, $7;
fma.rn.f16x2 $1, a1, $6, $8;
fma.rn.f16x2 $2, a2, $9, $11;
fma.rn.f16x2 $3, a3, $10, $12;
}""")


# K's bytes (session 29): one packed register of 4 code bytes [B0 B1 B2 B3] ($4) -> the fp16 pairs (B0, B2) and (B1,
# B3) of the low nibbles ($0, $1) and of the high nibbles ($2, $3), each nibble masked into 0x64 by one lop3 (as
# V's pairs below: the odd bytes after one shift, the high nibbles in place as 1024 + 16 code, their group scale
# / 16 in $9, $10), 1024 subtracted (exact), one fma with (s, s) and (z, z): 13 instructions a register against
# `_ASM_INT4_DEQ`'s 15. The pairs take bytes two apart, so K's logical channel order differs from `_ASM_INT4_DEQ`'s
# in two index bits (`_q_phys`).
def _deq_k_asm() -> str:
    """`_ASM_INT4_DEQ_K`'s text."""
    body = [".reg .b32 y, a, k;", "mov.b32 k, 0x64006400;", "shr.b32 y, $4, 8;"]
    for out, src, mask, s, z in ((0, "$4", "0x000F000F", 5, 7), (1, "y", "0x000F000F", 6, 8),
                                 (2, "$4", "0x00F000F0", 9, 11), (3, "y", "0x00F000F0", 10, 12)):
        body += [f"lop3.b32 a, {src}, {mask}, 0x64006400, 0xEA;", "sub.f16x2 a, a, k;",
                 f"fma.rn.f16x2 ${out}, a, ${s}, ${z};"]
    return "{\n" + "\n".join(body) + "\n}"


_ASM_INT4_DEQ_K = gl.constexpr(_deq_k_asm())


# int4 at head dim 64 in groups of 32 (P_WORDS, session 41): a token's two groups are the low nibbles' (group 0) and the
# high nibbles' (group 1) for every lane, and its two scales (two zero-points) are one 32-bit word ($5: scales, $9:
# zero-points; pack 4 repeats each word in $5-$8, $9-$12), so a lane keeps one register per token and parameter kind
# instead of two. The conversion forms the (group 0, group 0) and (group 1, group 1) pairs itself (prmt), K's high
# scale times 1 / 16 (exact for normal fp16 values; as `_int4_dequant_k`), then runs `_ASM_INT4_DEQ` (V) or
# `_ASM_INT4_DEQ_K` (K) with them: the same values.
def _deq_words_asm(k: bool) -> str:
    """`_ASM_INT4_DEQ_WORDS` (k False: V's conversion) / `_ASM_INT4_DEQ_K_WORDS` (k True)."""
    body = [".reg .b32 sl, sh, zl, zh, y, a, k, m, t, u, a0, a1, a2, a3;", "mov.b32 k, 0x64006400;",
            "prmt.b32 sl, $5, $5, 0x1010;", "prmt.b32 sh, $5, $5, 0x3232;",
            "prmt.b32 zl, $9, $9, 0x1010;", "prmt.b32 zh, $9, $9, 0x3232;"]
    if k:
        body += ["mov.b32 m, 0x2C002C00;", "mul.rn.f16x2 sh, sh, m;", "shr.b32 y, $4, 8;"]
        for out, src, mask, sc, z in ((0, "$4", "0x000F000F", "sl", "zl"), (1, "y", "0x000F000F", "sl", "zl"),
                                      (2, "$4", "0x00F000F0", "sh", "zh"), (3, "y", "0x00F000F0", "sh", "zh")):
            body += [f"lop3.b32 a, {src}, {mask}, 0x64006400, 0xEA;", "sub.f16x2 a, a, k;",
                     f"fma.rn.f16x2 ${out}, a, {sc}, {z};"]
    else:
        body += ["mov.b32 m, 0x64646464;", "and.b32 t, $4, 0x0F0F0F0F;", "shr.b32 u, $4, 4;",
                 "and.b32 u, u, 0x0F0F0F0F;"]
        for i, (src, sel) in enumerate((("t", "0x4140"), ("t", "0x4342"), ("u", "0x4140"), ("u", "0x4342"))):
            body += [f"prmt.b32 a{i}, {src}, m, {sel};", f"sub.f16x2 a{i}, a{i}, k;"]
        for i, (sc, z) in enumerate((("sl", "zl"), ("sl", "zl"), ("sh", "zh"), ("sh", "zh"))):
            body.append(f"fma.rn.f16x2 ${i}, a{i}, {sc}, {z};")
    return "{\n" + "\n".join(body) + "\n}"


_ASM_INT4_DEQ_WORDS = gl.constexpr(_deq_words_asm(False))
_ASM_INT4_DEQ_K_WORDS = gl.constexpr(_deq_words_asm(True))


# V's token pairs (the RING4 path): two tokens' packed int4 bytes, the same 4 channel bytes each ($8: the even
# token's register, $9: the odd's) -> for each byte, one fp16 pair (even token, odd token) of its low nibble and
# one of its high nibble: the pairs the A operand of V^T @ P^T holds (consecutive tokens), so no halves move
# after the conversion. A byte pair is picked once (prmt), each nibble masked into 0x64 by one lop3 ((x & mask) |
# 0x64006400, lut 0xEA: fp16 1024 + code; the
# high nibble in place: 1024 + 16 code), 1024 subtracted (exact), then one fma with the two tokens' packed
# (scale, scale) and (zero, zero) pairs ($10-$13, $14-$17; $18-$21 the high group's scales / 16, $22-$25 its
# zeros: 16 code * (s / 16) is code * s exactly while s / 16 is a normal fp16, s >= 2^-10).
# Outputs: $0 = low nibble of byte 0, $1 = of byte 1, $2, $3 of bytes 2, 3; $4-$7 the high nibbles.
def _deq_pairs_asm() -> str:
    """`_ASM_INT4_DEQ_PAIRS`'s text: the same seven instructions for each of the 4 bytes."""
    body = [".reg .b32 x, a, k;", "mov.b32 k, 0x64006400;"]
    for b in range(4):
        body.append(f"prmt.b32 x, $8, $9, 0x0{4 + b}0{b};")  # byte b of the even and of the odd token
        for mask, out, s, z in (("0x000F000F", b, 10, 14), ("0x00F000F0", 4 + b, 18, 22)):
            body += [f"lop3.b32 a, x, {mask}, 0x64006400, 0xEA;", "sub.f16x2 a, a, k;",
                     f"fma.rn.f16x2 ${out}, a, ${s}, ${z};"]
    return "{\n" + "\n".join(body) + "\n}"


_ASM_INT4_DEQ_PAIRS = gl.constexpr(_deq_pairs_asm())


_ASM_INT4_DEQ_PAIRS_CONSTRAINTS = gl.constexpr("=r," * 8 + "r,r," + ",".join(["r"] * 16))


@gluon.jit
def _pack_pair(a, b):
    """Two fp16 tensors -> one int32 tensor of (a, b) pairs (a in the low half)."""
    return gl.inline_asm_elementwise("mov.b32 $0, {$1, $2};", "=r,h,h", [a, b], dtype=gl.int32, is_pure=True,
                                     pack=1)


@gluon.jit
def _param_pairs(x, like, SIXTEENTH: gl.constexpr):
    """V's group parameters [s, h, t, e, nl] (V4_S) -> (even token's, odd token's) packed pairs [s, h, t, nl],
    broadcast to `like` [s, h, t, nl, m] (SIXTEENTH: times 1 / 16, exact for normal fp16 values)."""
    xa, xb = gl.split(gl.convert_layout(gl.permute(x, [0, 1, 2, 4, 3]), VP_E))  # [s, h, t, nl]
    if SIXTEENTH:
        xa = xa * 0.0625
        xb = xb * 0.0625
    pair = gl.convert_layout(_pack_pair(xa, xb), gl.SliceLayout(4, like.type.layout))  # (the same lanes)
    return gl.broadcast(gl.expand_dims(pair, 4), like)[0]


@gluon.jit
def _v4_dequant_pairs(vc, s_lo, z_lo, s_hi, z_hi):
    """`_v4_dequant` (AS_A) converting token pairs (`_ASM_INT4_DEQ_PAIRS`): vc [s, h, t, e, nl, m] (V4_LOAD), the
    parameters [s, h, t, e, nl] (V4_S); the same values, as the A operand [128, 64] of V^T @ P^T."""
    ca, cb = gl.split(gl.permute(vc, [0, 1, 2, 4, 5, 3]))  # [s, h, t, nl, m]: the even and the odd token
    # the asm takes 4 consecutive registers of each operand and its outputs are read as bytes m = 4 w + 0..3
    # below: the compiler proves m the fastest register dimension (a trivial conversion to VP_C)
    ca = gl.convert_layout(ca, VP_C, assert_trivial=True)
    cb = gl.convert_layout(cb, VP_C, assert_trivial=True)
    o = gl.inline_asm_elementwise(_ASM_INT4_DEQ_PAIRS, _ASM_INT4_DEQ_PAIRS_CONSTRAINTS,
                                  [ca, cb, _param_pairs(s_lo, ca, False), _param_pairs(z_lo, ca, False),
                                   _param_pairs(s_hi, ca, True), _param_pairs(z_hi, ca, False)],
                                  dtype=(gl.float16, gl.float16, gl.float16, gl.float16), is_pure=True, pack=4)
    # o[0]: per 4-byte word (m = 4 w + mm), elements mm = 2 c + e: byte 2 c's low nibble, token e; o[1]: bytes 2 + c
    lo = gl.join(gl.reshape(o[0], [4, 2, 4, 8, 2, 2, 2]), gl.reshape(o[1], [4, 2, 4, 8, 2, 2, 2]))  # s h t nl w c e q
    hi = gl.join(gl.reshape(o[2], [4, 2, 4, 8, 2, 2, 2]), gl.reshape(o[3], [4, 2, 4, 8, 2, 2, 2]))
    v = gl.join(lo, hi)  # [s, h, t, nl, w, c, e, q, W]: byte 8 nl + 4 w + 2 q + c, nibble W, token 16 s + 8 h + 2 t + e
    v = gl.permute(v, [0, 1, 2, 6, 8, 4, 7, 5, 3])  # s h t e W w q c nl
    # token 16 s + 8 h + 2 t + e; column (8 W + m) * 8 + nl with m = 4 w + 2 q + c: `_v4_dequant`'s order
    return _v_operand(gl.reshape(v, [64, 128]), True)


# V's token pairs at head dim 64 in groups of 32 (P_WORDS, session 42): `_ASM_INT4_DEQ_PAIRS` with each token's two
# group scales (zero-points) as one word ($10: the even token's scale word, $14: the odd's; $18, $22: the zero-point
# words; each operand packs 4 copies). The (even, odd) pairs of the low groups' and of the high groups' parameters come
# from two prmt each, the high scales times 1 / 16 (exact for normal fp16 values, as `_int4_dequant_k`); then the same
# seven instructions a byte. Outputs as `_ASM_INT4_DEQ_PAIRS`'s.
def _deq_pairs_words_asm() -> str:
    """`_ASM_INT4_DEQ_PAIRS_WORDS`'s text."""
    body = [".reg .b32 x, a, k, m, sl, sh, zl, zh;", "mov.b32 k, 0x64006400;", "mov.b32 m, 0x2C002C00;",
            "prmt.b32 sl, $10, $14, 0x5410;", "prmt.b32 sh, $10, $14, 0x7632;", "mul.rn.f16x2 sh, sh, m;",
            "prmt.b32 zl, $18, $22, 0x5410;", "prmt.b32 zh, $18, $22, 0x7632;"]
    for b in range(4):
        body.append(f"prmt.b32 x, $8, $9, 0x0{4 + b}0{b};")  # byte b of the even and of the odd token
        for mask, out, sc, z in (("0x000F000F", b, "sl", "zl"), ("0x00F000F0", 4 + b, "sh", "zh")):
            body += [f"lop3.b32 a, x, {mask}, 0x64006400, 0xEA;", "sub.f16x2 a, a, k;",
                     f"fma.rn.f16x2 ${out}, a, {sc}, {z};"]
    return "{\n" + "\n".join(body) + "\n}"


_ASM_INT4_DEQ_PAIRS_WORDS = gl.constexpr(_deq_pairs_words_asm())


@gluon.jit
def _word_pairs(w, like):
    """A token's parameter words [s, h, t, e, 1, 1] (`_v4_load`'s with WORDS at D 64: every lane of a token the same)
    -> the even and the odd token's, broadcast to `like` [s, h, t, nl, m] (VP_C64)."""
    x = gl.permute(gl.reshape(w, [4, 2, 4, 2, 1]), [0, 1, 2, 4, 3])  # [s, h, t, 1, e]
    wa, wb = gl.split(gl.convert_layout(x, VP_E))  # [s, h, t, 1]: the even and the odd token's
    wa = gl.expand_dims(gl.convert_layout(wa, gl.SliceLayout(4, VP_C64)), 4)
    wb = gl.expand_dims(gl.convert_layout(wb, gl.SliceLayout(4, VP_C64)), 4)
    return gl.broadcast(wa, like)[0], gl.broadcast(wb, like)[0]


@gluon.jit
def _v4_dequant_pairs64(vc, sw, zw):
    """`_v4_dequant` (AS_A, D 64, WORDS) converting token pairs (`_ASM_INT4_DEQ_PAIRS_WORDS`): vc [s, h, t, e, nl, m 4]
    (V4_LOAD64), the parameter words [s, h, t, e, nl, 1]; the same values (while every V group scale is >= 2^-10), as
    the A operand [64, 64] of V^T @ P^T, each register a channel's (even token, odd token) pair as the MMA takes it."""
    ca, cb = gl.split(gl.permute(vc, [0, 1, 2, 4, 5, 3]))  # [s, h, t, nl, m]: the even and the odd token
    ca = gl.convert_layout(ca, VP_C64, assert_trivial=True)
    cb = gl.convert_layout(cb, VP_C64, assert_trivial=True)
    swa, swb = _word_pairs(sw, ca)
    zwa, zwb = _word_pairs(zw, ca)
    o = gl.inline_asm_elementwise(_ASM_INT4_DEQ_PAIRS_WORDS, _ASM_INT4_DEQ_PAIRS_CONSTRAINTS,
                                  [ca, cb, swa, swb, zwa, zwb],
                                  dtype=(gl.float16, gl.float16, gl.float16, gl.float16), is_pure=True, pack=4)
    # o[0]: elements m = 2 c + e: byte c's low nibble, token e; o[1]: bytes 2 + c; o[2], o[3]: the high nibbles
    lo = gl.join(gl.reshape(o[0], [4, 2, 4, 8, 2, 2]), gl.reshape(o[1], [4, 2, 4, 8, 2, 2]))  # s h t nl c e q
    hi = gl.join(gl.reshape(o[2], [4, 2, 4, 8, 2, 2]), gl.reshape(o[3], [4, 2, 4, 8, 2, 2]))
    v = gl.join(lo, hi)  # [s, h, t, nl, c, e, q, W]: byte 2 q + c, nibble W, token 16 s + 8 h + 2 t + e
    v = gl.permute(v, [0, 1, 2, 5, 7, 6, 4, 3])  # s h t e W q c nl
    # token 16 s + 8 h + 2 t + e; column (4 W + m) * 8 + nl with m = 2 q + c: `_v4_dequant`'s order at D 64
    return _v_operand(gl.reshape(v, [64, 64]), True)


@gluon.jit
def _add_rn(a, b):
    """a + b (float32) rounded as an add of its own: `add.rn` is never fused with the multiply before it (a plain PTX
    add may be: ptxas had fused "frag"'s one-split epilogue o = acc / l + V mean into one fma, where the merge kernel
    rounds the quotient first, so the two differed in the last bit of ~3 % of float32 outputs; session 44). Every
    place that adds the V mean uses it (`quant.add_rn` in the Triton kernels): with a rotated V the merge kernel had
    fused o @ R's * NORM with the plain add that this epilogue no longer fused (session 45)."""
    return gl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _pdl_trigger():
    """`griddepcontrol.launch_dependents` (sm_90+): the separate merge may launch (`decode_plan.pdl_mode`)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _to_f16(c, FMT: gl.constexpr, FACTOR: gl.constexpr, E5M2_HW: gl.constexpr = False):
    """8-bit codes -> float16 (int8: the value; e4m3: value / FACTOR; e5m2: the value), PTX byte moves; e4m3
    with FACTOR 1 (sm >= 89: `decode_plan.hw_fp8_decode`) and e5m2 with E5M2_HW by the conversion instruction."""
    if FMT == K_FMT_INT8:
        out = int8_to_f16(c)
    elif FMT == K_FMT_FP8E4M3 and FACTOR == 1.0:
        out = fp8_decode_f16_hw(c)
    elif FMT == K_FMT_FP8E5M2 and E5M2_HW:
        out = fp8_decode_f16_hw(c, True)
    else:
        out = fp8_decode_f16(c, FMT)
    return out


@gluon.jit
def _int4_dequant(c, s_lo, z_lo, s_hi, z_hi):
    """Packed int4 bytes c -> (low, high nibble) float16 values code * s + m, each side with its own
    group's scale and zero-point (broadcast over c's bytes)."""
    return gl.inline_asm_elementwise(_ASM_INT4_DEQ, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r", [c, s_lo, z_lo, s_hi, z_hi],
                                     dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@gluon.jit
def _int4_dequant_words(c, sw, zw, K: gl.constexpr):
    """`_int4_dequant` (K: `_int4_dequant_k`) with each token's two group scales and zero-points as 32-bit words sw, zw
    (P_WORDS; broadcast over c's bytes): the same (low, high nibble) float16 values."""
    return gl.inline_asm_elementwise(_ASM_INT4_DEQ_K_WORDS if K else _ASM_INT4_DEQ_WORDS,
                                     "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r", [c, sw, zw],
                                     dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@gluon.jit
def _int4_dequant_k(c, s_lo, z_lo, s_hi, z_hi):
    """`_int4_dequant` for K (`_ASM_INT4_DEQ_K`): the same values, each 4-byte register's in the order bytes 0, 2,
    1, 3 (low nibbles, then high). s_hi / 16 is exact while s_hi >= 2^-10 (a normal fp16 after the division);
    below, a value may differ from `_int4_dequant`'s by an ulp."""
    s16 = (s_hi.to(gl.float32) * 0.0625).to(gl.float16)
    return gl.inline_asm_elementwise(_ASM_INT4_DEQ_K, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r", [c, s_lo, z_lo, s16, z_hi],
                                     dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@gluon.jit
def _prefetch_tile(n0, end, h, bt_row, kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                   vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                   BLOCK_SIZE: gl.constexpr, IDX64: gl.constexpr, K_STATIC: gl.constexpr, V_STATIC: gl.constexpr,
                   KI4: gl.constexpr, VI4: gl.constexpr, STEP: gl.constexpr = 1, MASK_END: gl.constexpr = False,
                   K_TOO: gl.constexpr = True):
    """L2 prefetch (`prefetch.global.L2`: no registers, no wait) of the 64-token tile at n0 (tokens
    clamped to end - 1): each token's code row, and its scale (and int4 zero-point) row. STEP 2: every other
    token only (8-bit codes at head dim 64: rows of 64 bytes, so tokens 2 i and 2 i + 1 share a 128-byte line where
    the rows are contiguous in a block). MASK_END: a split without tokens (end <= n0) reads block 0, which every pool
    has, from the block table."""
    if STEP == 1:
        tok = gl.minimum(n0 + gl.arange(0, 64, layout=PF_TOK), end - 1)
    else:
        tok = gl.minimum(n0 + gl.arange(0, 64 // STEP, layout=PF_TOK32) * STEP, end - 1)
    if MASK_END:
        tok = gl.maximum(tok, 0)
        blk = gl.load(bt_row + (tok.to(gl.uint32) // BLOCK_SIZE).to(gl.int32), mask=tok < end, other=0)
    else:
        blk = gl.load(bt_row + (tok.to(gl.uint32) // BLOCK_SIZE).to(gl.int32))
    if IDX64:
        blk = blk.to(gl.int64)
    off = tok & (BLOCK_SIZE - 1)
    if K_TOO:
        prefetch_l2(kc_ptr + blk * k_cs0 + h * k_cs1 + off * k_cs2)
    prefetch_l2(vc_ptr + blk * v_cs0 + h * v_cs1 + off * v_cs2)
    if not K_STATIC and K_TOO:
        prefetch_l2(ks_ptr + blk * k_ss0 + h * k_ss1 + off * k_ss2)
        if KI4:
            prefetch_l2(kz_ptr + blk * k_ss0 + h * k_ss1 + off * k_ss2)
    if not V_STATIC:
        prefetch_l2(vs_ptr + blk * v_ss0 + h * v_ss1 + off * v_ss2)
        if VI4:
            prefetch_l2(vz_ptr + blk * v_ss0 + h * v_ss1 + off * v_ss2)


@gluon.jit
def _k4_tile(n0, end, h, bt_row, kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
             BLOCK_SIZE: gl.constexpr, G: gl.constexpr, IDX64: gl.constexpr, MASKED: gl.constexpr,
             AS_A: gl.constexpr = False, D: gl.constexpr = 128, WORDS: gl.constexpr = False):
    """A 64-token int4 K tile at n0 as the B operand [D, 64] of q @ K^T (AS_A: the A operand [64, D]
    of K @ q^T; channels in the int4 K order of the module doc), dequantized in registers; also the
    tile's (first token, block, offset) of each 8-token group [8] for the per-token vectors. Head dim D 128 or
    64 ("fragt" only: a lane's 8 bytes a token, `K4_LOAD64`; WORDS: groups of 32, each token's two scales and two
    zero-points loaded as one 32-bit word each, `_int4_dequant_words`)."""
    KL: gl.constexpr = _k4_layout(D)
    KS: gl.constexpr = _k4s_layout(D)
    BW: gl.constexpr = D // 8  # code bytes a lane reads of each of its tokens
    g0 = n0 + gl.arange(0, 8, layout=_dims(KL, 4, 0)) * 8
    blk = _ld(bt_row + (g0.to(gl.uint32) // BLOCK_SIZE).to(gl.int32), g0 < end, MASKED)
    if IDX64:
        blk = blk.to(gl.int64)
    goff = g0 & (BLOCK_SIZE - 1)
    knl = gl.arange(0, 8, layout=_dims(KL, 4, 1))[None, :, None, None]
    krow = (blk * k_cs0 + h * k_cs1 + goff * k_cs2)[:, None, None, None] + knl * k_cs2
    kt = gl.arange(0, 4, layout=_dims(KL, 4, 2))[None, None, :, None]
    kb = gl.arange(0, BW, layout=_dims(KL, 4, 3))[None, None, None, :]
    kc = _ld(kc_ptr + krow + kt * BW + kb, g0[:, None, None, None] + knl < end, MASKED)
    # the lane's groups: bytes BW t .. BW t + BW - 1 hold channels BW t + b (low) and D / 2 + BW t + b (high)
    snl = gl.arange(0, 8, layout=_dims(KS, 3, 1))[None, :, None]
    st = gl.arange(0, 4, layout=_dims(KS, 3, 2))[None, None, :]
    KSI: gl.constexpr = _dims(KS, 3, 0)
    srow = (gl.convert_layout(blk, KSI, assert_trivial=True) * k_ss0 + h * k_ss1
            + gl.convert_layout(goff, KSI, assert_trivial=True) * k_ss2)[:, None, None] + snl * k_ss2
    smask = gl.convert_layout(g0, KSI, assert_trivial=True)[:, None, None] + snl < end
    if WORDS:
        sw = _ld((ks_ptr + srow).to(gl.pointer_type(gl.int32)), smask, MASKED)[:, :, :, None]
        zw = _ld((kz_ptr + srow).to(gl.pointer_type(gl.int32)), smask, MASKED)[:, :, :, None]
        k = _k4_operand(kc, sw, zw, sw, zw, AS_A, D, True)
    else:
        g_lo = st * BW // G
        g_hi = (st * BW + D // 2) // G
        s_lo = _ld(ks_ptr + srow + g_lo, smask, MASKED)[:, :, :, None]
        z_lo = _ld(kz_ptr + srow + g_lo, smask, MASKED)[:, :, :, None]
        s_hi = _ld(ks_ptr + srow + g_hi, smask, MASKED)[:, :, :, None]
        z_hi = _ld(kz_ptr + srow + g_hi, smask, MASKED)[:, :, :, None]
        k = _k4_operand(kc, s_lo, z_lo, s_hi, z_hi, AS_A, D)
    return g0, blk, goff, k


@gluon.jit
def _k4_operand(kc, s_lo, z_lo, s_hi, z_hi, AS_A: gl.constexpr, D: gl.constexpr = 128, WORDS: gl.constexpr = False):
    """A 64-token int4 K tile's codes [i, nl, t, b] (`_k4_layout`) and the lane's group parameters [i, nl, t, 1],
    dequantized, as the B operand [D, 64] of q @ K^T (AS_A: the A operand [64, D] of K @ q^T). WORDS: s_lo, z_lo
    are the tokens' scale and zero-point words (`_int4_dequant_words`; s_hi, z_hi unused)."""
    if WORDS:
        lo, hi = _int4_dequant_words(kc, s_lo, z_lo, True)
    else:
        lo, hi = _int4_dequant_k(kc, s_lo, z_lo, s_hi, z_hi)
    # [i, nl, t, w, b] (b < D / 8): value D / 8 w + b of the lane is channel D / 2 w + D / 8 t + 4 (b // 4)
    # + 2 (b % 2) + (b // 2) % 2 (`_ASM_INT4_DEQ_K`'s byte order 0, 2, 1, 3) = logical 16 j + 8 h + 2 t + e with
    # D / 8 w + b = 4 j + 2 h + e
    k = gl.reshape(gl.permute(gl.join(lo, hi), [0, 1, 2, 4, 3]), [8, 8, 4, D // 16, 2, 2])  # i nl t j h e
    if AS_A:  # the A operand [64, D] of K @ q^T ("fragt")
        k = gl.permute(k, [0, 1, 3, 4, 2, 5])  # i nl j h t e
        k = gl.convert_layout(gl.reshape(k, [64, D]), A_OP, assert_trivial=True)
    else:
        k = gl.permute(k, [3, 4, 2, 5, 0, 1])  # j h t e i nl
        k = gl.convert_layout(gl.reshape(k, [D, 64]), B_OP, assert_trivial=True)
    return k


@gluon.jit
def _v4_load(g0, blk, goff, end, h, vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
             G: gl.constexpr, MASKED: gl.constexpr, D: gl.constexpr = 128, WORDS: gl.constexpr = False):
    """The tile's int4 V codes and the lane's group parameters (`_v4_dequant` makes the MMA operand);
    g0, blk, goff: the 8-token groups' first token, block and offset [8] (any layout holding all 8 in
    each lane). Head dim D 128 or 64 ("fragt" only: a lane's 4 bytes a token, `V4_LOAD64`; WORDS: as `_k4_tile`'s,
    the scale and zero-point words returned twice)."""
    VL: gl.constexpr = _v4_layout(D)
    VS: gl.constexpr = _v4s_layout(D)
    BW: gl.constexpr = D // 16  # code bytes a lane reads of each of its tokens
    vw = (gl.arange(0, 4, layout=_dims(VS, 5, 2)) * 2)[None, None, :, None, None] \
        + gl.arange(0, 2, layout=_dims(VS, 5, 3))[None, None, None, :, None]
    SH: gl.constexpr = _dims(VS, 5, 0, 1)
    vmask = gl.convert_layout(gl.reshape(g0, [4, 2]), SH, assert_trivial=True)[:, :, None, None, None] + vw < end
    vblk = gl.convert_layout(gl.reshape(blk, [4, 2]), SH, assert_trivial=True)[:, :, None, None, None]
    voff = gl.convert_layout(gl.reshape(goff, [4, 2]), SH, assert_trivial=True)[:, :, None, None, None] + vw
    vnl = gl.arange(0, 8, layout=_dims(VS, 5, 4))[None, None, None, None, :]
    vrow = vblk * v_cs0 + h * v_cs1 + voff * v_cs2 + vnl * BW  # [s, h, t, e, nl]
    vm = gl.arange(0, BW, layout=_dims(VL, 6, 5))[None, None, None, None, None, :]
    vc = _ld(vc_ptr + vrow[:, :, :, :, :, None] + vm, vmask[:, :, :, :, :, None], MASKED)
    # the lane's groups: bytes BW nl .. BW nl + BW - 1 hold channels BW nl + m (low) and D / 2 + BW nl + m (high)
    srow = vblk * v_ss0 + h * v_ss1 + voff * v_ss2
    if WORDS:
        s_lo = _ld((vs_ptr + srow).to(gl.pointer_type(gl.int32)), vmask, MASKED)[:, :, :, :, :, None]
        z_lo = _ld((vz_ptr + srow).to(gl.pointer_type(gl.int32)), vmask, MASKED)[:, :, :, :, :, None]
        s_hi = s_lo
        z_hi = z_lo
    else:
        g_lo = vnl * BW // G
        g_hi = (vnl * BW + D // 2) // G
        s_lo = _ld(vs_ptr + srow + g_lo, vmask, MASKED)[:, :, :, :, :, None]
        z_lo = _ld(vz_ptr + srow + g_lo, vmask, MASKED)[:, :, :, :, :, None]
        s_hi = _ld(vs_ptr + srow + g_hi, vmask, MASKED)[:, :, :, :, :, None]
        z_hi = _ld(vz_ptr + srow + g_hi, vmask, MASKED)[:, :, :, :, :, None]
    return vc, s_lo, z_lo, s_hi, z_hi


@gluon.jit
def _v_operand(v, AS_A: gl.constexpr):
    """A dequantized V tile [64 tokens, 128] as the B operand of P @ V, or transposed as the A operand
    [128, 64] of V^T @ P^T ("fragt")."""
    if AS_A:
        out = gl.convert_layout(gl.permute(v, [1, 0]), A_OP, assert_trivial=True)
    else:
        out = gl.convert_layout(v, B_OP, assert_trivial=True)
    return out


@gluon.jit
def _v4_dequant(vc, s_lo, z_lo, s_hi, z_hi, AS_A: gl.constexpr = False, D: gl.constexpr = 128,
                WORDS: gl.constexpr = False):
    """`_v4_load`'s codes as the B operand [64, D] of P @ V (AS_A: the A operand [D, 64] of
    V^T @ P^T; output channels in the int4 V order of the module doc), dequantized in registers."""
    if WORDS:
        lo, hi = _int4_dequant_words(vc, s_lo, z_lo, False)
    else:
        lo, hi = _int4_dequant(vc, s_lo, z_lo, s_hi, z_hi)
    # value D / 16 w + m of lane nl is channel D / 2 w + D / 16 nl + m = logical 8 (D / 16 w + m) + nl
    v = gl.reshape(gl.permute(gl.join(lo, hi), [0, 1, 2, 3, 4, 6, 5]), [64, 8, D // 8])  # token, nl, D / 16 w + m
    v = gl.reshape(gl.permute(v, [0, 2, 1]), [64, D])  # token, D / 16 w + m, nl
    return _v_operand(v, AS_A)


@gluon.jit
def _ld(ptrs, mask, MASKED: gl.constexpr):
    """gl.load, masked (0 where masked off) only in the split's last, partial tile."""
    if MASKED:
        out = gl.load(ptrs, mask=mask, other=0)
    else:
        out = gl.load(ptrs)
    return out


@gluon.jit
def _tile_scales(sbuf, slot, s_ptr, nblk, noff, nmask, h, ss0, ss1, ss2, MASKED: gl.constexpr, RING: gl.constexpr):
    """A tile's per-token scales [64] in the scores' column layout, float32: from ring slot `slot`, or
    loaded (nblk, noff: [8 groups, 8] block indices and offsets in COLS8)."""
    if RING:
        out = gl.convert_layout(gl.reshape(sbuf.index(slot).load(COLS8), [64]), COLS, assert_trivial=True)
    else:
        sr = gl.convert_layout(gl.reshape(nblk * ss0 + h * ss1 + noff * ss2, [64]), COLS, assert_trivial=True)
        out = _ld(s_ptr + sr, nmask, MASKED)
    return out.to(gl.float32)


@gluon.jit
def _frag_issue(n0, valid, h, bt_row, kbuf, vbuf, ksbuf, vsbuf, slot,
                kc_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                vc_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                BLOCK_SIZE: gl.constexpr, K_STATIC: gl.constexpr, V_STATIC: gl.constexpr, IDX64: gl.constexpr):
    """cp.async of the whole 64-token tile at n0 (codes, and per-token scales) into ring slot `slot`;
    nothing is read where not `valid` (the slot fills with zeros). The caller commits the group."""
    # K and V codes [group, row, byte] of token 8 group + row: a warp copies 4 whole rows per instruction
    g0 = n0 + gl.arange(0, 8, layout=RC_G) * 8
    blk = gl.load(bt_row + (g0.to(gl.uint32) // BLOCK_SIZE).to(gl.int32), mask=(g0 >= 0) & valid, other=0)
    if IDX64:
        blk = blk.to(gl.int64)
    tok = (g0 & (BLOCK_SIZE - 1))[:, None, None] + gl.arange(0, 8, layout=RC_R)[None, :, None]
    col = gl.arange(0, 128, layout=RC_B)[None, None, :]
    cmask = (col >= 0) & valid
    async_copy.async_copy_global_to_shared(
        kbuf.index(slot), kc_ptr + (blk * k_cs0 + h * k_cs1)[:, None, None] + tok * k_cs2 + col, mask=cmask)
    async_copy.async_copy_global_to_shared(
        vbuf.index(slot), vc_ptr + (blk * v_cs0 + h * v_cs1)[:, None, None] + tok * v_cs2 + col, mask=cmask)
    if not (K_STATIC and V_STATIC):  # per-token scales [8 groups, 8] in the COLS8 layout
        LOG2_BS: gl.constexpr = BLOCK_SIZE.bit_length() - 1
        sg = n0 + gl.arange(0, 8, layout=COLS8_G) * 8
        sblk = gl.load(bt_row + (sg.to(gl.uint32) // BLOCK_SIZE).to(gl.int32), mask=(sg >= 0) & valid, other=0)
        if IDX64:
            sblk = sblk.to(gl.int64)
        nw = gl.arange(0, 8, layout=gl.SliceLayout(0, COLS8))[None, :]
        soff = (sg - (sg >> LOG2_BS) * BLOCK_SIZE)[:, None] + nw  # (an & loses the divisibility: 2-byte copies)
        if not K_STATIC:
            ksp = ks_ptr + (sblk * k_ss0 + h * k_ss1)[:, None] + soff * k_ss2
            async_copy.async_copy_global_to_shared(ksbuf.index(slot), ksp, mask=(nw >= 0) & valid)
        if not V_STATIC:
            vsp = vs_ptr + (sblk * v_ss0 + h * v_ss1)[:, None] + soff * v_ss2
            async_copy.async_copy_global_to_shared(vsbuf.index(slot), vsp, mask=(nw >= 0) & valid)


@gluon.jit
def _k8_load(n0, end, h, bt_row, kc_ptr, k_cs0, k_cs1, k_cs2, BLOCK_SIZE: gl.constexpr, IDX64: gl.constexpr,
             MASKED: gl.constexpr, D: gl.constexpr = 128):
    """A 64-token tile's 8-bit K codes in K_LOAD (a lane's 32 bytes of each of its tokens; head dim D 64: in
    K4_LOAD, 16 bytes), and the tile's (first token, block, offset) of each 8-token group [8]."""
    KL: gl.constexpr = _k8_layout(D)
    g0 = n0 + gl.arange(0, 8, layout=_dims(KL, 4, 0)) * 8  # the first token of each 8-token group
    blk = _ld(bt_row + (g0.to(gl.uint32) // BLOCK_SIZE).to(gl.int32), g0 < end, MASKED)
    if IDX64:
        blk = blk.to(gl.int64)
    goff = g0 & (BLOCK_SIZE - 1)
    knl = gl.arange(0, 8, layout=_dims(KL, 4, 1))[None, :, None, None]
    kmask = g0[:, None, None, None] + knl < end
    krow = (blk * k_cs0 + h * k_cs1 + goff * k_cs2)[:, None, None, None] + knl * k_cs2
    kt = gl.arange(0, 4, layout=_dims(KL, 4, 2))
    kb = gl.arange(0, D // 4, layout=_dims(KL, 4, 3))
    kc = _ld(kc_ptr + krow + (kt * (D // 4))[None, None, :, None] + kb[None, None, None, :], kmask, MASKED)
    return g0, blk, goff, kc


@gluon.jit
def _v8_load(g0, blk, goff, end, h, vc_ptr, v_cs0, v_cs1, v_cs2, MASKED: gl.constexpr, D: gl.constexpr = 128):
    """The tile's 8-bit V codes in V_LOAD (a lane's 16 bytes of each of its tokens; head dim D 64: in V4_LOAD,
    8 bytes); g0, blk, goff as `_k8_load` returns them."""
    VL: gl.constexpr = _v8_layout(D)
    vw = (gl.arange(0, 4, layout=_dims(VL, 6, 2)) * 2)[None, None, :, None, None, None] \
        + gl.arange(0, 2, layout=_dims(VL, 6, 3))[None, None, None, :, None, None]
    sh: gl.constexpr = _dims(VL, 6, 0, 1)
    vmask = gl.convert_layout(gl.reshape(g0, [4, 2]), sh, assert_trivial=True)[:, :, None, None, None, None] \
        + vw < end
    vblk = gl.convert_layout(gl.reshape(blk, [4, 2]), sh, assert_trivial=True)[:, :, None, None, None, None]
    voff = gl.convert_layout(gl.reshape(goff, [4, 2]), sh, assert_trivial=True)[:, :, None, None, None, None] + vw
    vrow = vblk * v_cs0 + h * v_cs1 + voff * v_cs2
    vnl = gl.arange(0, 8, layout=_dims(VL, 6, 4))
    vm = gl.arange(0, D // 8, layout=_dims(VL, 6, 5))
    return _ld(vc_ptr + vrow + (vnl * (D // 8))[None, None, None, None, :, None]
               + vm[None, None, None, None, None, :], vmask, MASKED)


@gluon.jit
def _k8_operand(kc, K_FMT: gl.constexpr, QK8: gl.constexpr, AS_A: gl.constexpr, K_FACTOR: gl.constexpr,
                D: gl.constexpr = 128, E5M2_HW: gl.constexpr = False):
    """`_k8_load`'s codes [i 8, nl 8, t 4, b D / 4] as the B operand [D, 64] of q @ K^T (AS_A: the A operand
    [64, D] of K @ q^T, "fragt"): int8 codes as they are for int8 MMAs (QK8; byte D / 4 t + 8 j + 4 h + e of a
    token is channel 32 j + 16 h + 4 t + e), else float16 (`_to_f16`; byte D / 4 t + 4 j + 2 h + e is channel
    16 j + 8 h + 2 t + e); see the module doc."""
    if QK8:
        k = gl.reshape(kc, [8, 8, 4, D // 32, 2, 4])  # i nl t j h e
    else:
        k = gl.reshape(_to_f16(kc, K_FMT, K_FACTOR, E5M2_HW), [8, 8, 4, D // 16, 2, 2])  # i nl t j h e
    if AS_A:
        out = gl.convert_layout(gl.reshape(gl.permute(k, [0, 1, 3, 4, 2, 5]), [64, D]), A_OP8 if QK8 else A_OP,
                                assert_trivial=True)
    else:
        out = gl.convert_layout(gl.reshape(gl.permute(k, [3, 4, 2, 5, 0, 1]), [D, 64]), B_OP8 if QK8 else B_OP,
                                assert_trivial=True)
    return out


@gluon.jit
def _v8_operand(vc, V_FMT: gl.constexpr, AS_A: gl.constexpr, V_FACTOR: gl.constexpr, D: gl.constexpr = 128,
                E5M2_HW: gl.constexpr = False):
    """`_v8_load`'s codes as float16, the B operand [64, D] of P @ V (AS_A: the A operand [D, 64] of
    V^T @ P^T); output channel 8 m + nl of the operand is channel D / 8 nl + m (module doc)."""
    v = gl.reshape(_to_f16(vc, V_FMT, V_FACTOR, E5M2_HW), [64, 8, D // 8])
    v = gl.reshape(gl.permute(v, [0, 2, 1]), [64, D])  # token, m, nl
    return _v_operand(v, AS_A)


# 8-bit V by token pairs (V8_PAIRS, session 44): the MMA operand of P @ V (V^T @ P^T in "fragt") holds in each register
# one channel's (even token, odd token) fp16 pair, while a loaded register holds four channels of one token. The
# conversion `_to_f16` made channel pairs and the compiler then swapped halves between two tokens' registers (one prmt a
# register more). Here each pair is picked from the two tokens' registers at once ($4: the even token's 4 bytes, $5:
# the odd's; one prmt), and then:
# - int8: one lop3 ((x & 0x00FF00FF) ^ 0x00800080) makes each byte c the fp16 subnormal (c + 128) * 2^-24, exactly.
#   The kernel multiplies the product by 2^24 and subtracts 128 times the tile's sum of P (P @ ones on the tensor
#   cores, kept per head across the tiles and subtracted once at the end): 1 instruction a code against 1.75.
# - e4m3 / e5m2 (sm >= 89): two prmt interleave the two tokens' bytes, then one conversion instruction per pair, the
#   values themselves: 0.75 instructions a code against 1.
# Outputs: $0 the pair of byte 0, $1 of byte 1, $2, $3 of bytes 2, 3 (as fp16 elements: 2 c + e, token e).
def _v8_pairs_asm(kind: str) -> str:
    """The pairs' conversion text for int8 or an FP8 kind ("e4m3", "e5m2"): `_v8_pairs_text`."""
    if kind == "int8":
        body = [".reg .b32 x;"]
        for b in range(4):
            body += [f"prmt.b32 x, $4, $5, 0x0{4 + b}0{b};", f"lop3.b32 ${b}, x, 0x00FF00FF, 0x00800080, 0x6A;"]
    else:
        body = [".reg .b32 x, y;", ".reg .b16 l, h;", "prmt.b32 x, $4, $5, 0x5140;", "prmt.b32 y, $4, $5, 0x7362;",
                "mov.b32 {l, h}, x;", f"cvt.rn.f16x2.{kind}x2 $0, l;", f"cvt.rn.f16x2.{kind}x2 $1, h;",
                "mov.b32 {l, h}, y;", f"cvt.rn.f16x2.{kind}x2 $2, l;", f"cvt.rn.f16x2.{kind}x2 $3, h;"]
    return "{\n" + "\n".join(body) + "\n}"


_V8_PAIRS_ASM = {K_FMT_INT8.value: _v8_pairs_asm("int8"), K_FMT_FP8E4M3.value: _v8_pairs_asm("e4m3"),
                 K_FMT_FP8E5M2.value: _v8_pairs_asm("e5m2")}


@gluon.constexpr_function
def _v8_pairs_text(fmt):
    """`_v8_pairs_asm`'s text for a V format (K_FMT_*)."""
    return _V8_PAIRS_ASM[fmt]


V8_BIAS = gl.constexpr(128.0)  # int8 pairs: the code's offset, in units of 2^-24
_V8_UNIT = 16777216.0  # 2^24
V8_UNIT = gl.constexpr(_V8_UNIT)
# V_LOAD's codes of one token parity [s, h, t, nl, m 16] (m, h, s in registers, m fastest; lane 4 nl + t)
VP_C16 = gl.BlockedLayout(size_per_thread=[4, 2, 1, 1, 16], threads_per_warp=[1, 1, 4, 8, 1],
                          warps_per_cta=[1, 1, 1, 1, 1], order=[4, 1, 0, 2, 3])


@gluon.jit
def _v8_pairs(vc, V_FMT: gl.constexpr, AS_A: gl.constexpr, D: gl.constexpr = 128):
    """`_v8_operand` converting token pairs (`_v8_pairs_asm`): vc [s, h, t, e, nl, m] (`_v8_load`'s), the B operand
    [64, D] of P @ V (AS_A: the A operand [D, 64] of V^T @ P^T), channels in `_v8_operand`'s order; int8 as
    (c + 128) * 2^-24, FP8 the values (the conversion instruction: sm >= 89)."""
    ca, cb = gl.split(gl.permute(vc, [0, 1, 2, 4, 5, 3]))  # [s, h, t, nl, m]: the even and the odd token
    PL: gl.constexpr = VP_C16 if D == 128 else VP_C
    ca = gl.convert_layout(ca, PL, assert_trivial=True)
    cb = gl.convert_layout(cb, PL, assert_trivial=True)
    o = gl.inline_asm_elementwise(_v8_pairs_text(V_FMT), "=r,=r,=r,=r,r,r", [ca, cb], dtype=(gl.float16, gl.float16),
                                  is_pure=True, pack=4)
    W: gl.constexpr = D // 32
    lo = gl.reshape(o[0], [4, 2, 4, 8, W, 2, 2])  # s h t nl w c e: byte 4 w + c of the word
    hi = gl.reshape(o[1], [4, 2, 4, 8, W, 2, 2])  # byte 4 w + 2 + c
    v = gl.join(lo, hi)  # [s, h, t, nl, w, c, e, q]: code byte D / 8 nl + 4 w + 2 q + c, token 16 s + 8 h + 2 t + e
    v = gl.permute(v, [0, 1, 2, 6, 4, 7, 5, 3])  # s h t e w q c nl: column 8 m + nl, m = 4 w + 2 q + c
    return _v_operand(gl.reshape(v, [64, D]), AS_A)


@gluon.jit
def _q_phys(kk, K_FMT: gl.constexpr, D: gl.constexpr = 128):
    """The code byte (int4: the channel) that logical channel kk of q meets in the K fragments (module doc; 8-bit
    codes at head dim D 64: a lane's 16 bytes a token instead of 32)."""
    if D == 64 and K_FMT == K_FMT_INT4:  # logical 16 j + 8 h + 2 t + e is channel 32 (j // 2) + 8 t + 4 (j % 2) + 2 e + h
        p = (kk >> 5) * 32 + ((kk >> 1) & 3) * 8 + ((kk >> 4) & 1) * 4 + (kk & 1) * 2 + ((kk >> 3) & 1)
    elif D == 64 and K_FMT == K_FMT_INT8:  # logical 32 j + 16 h + 4 t + e is code byte 16 t + 8 j + 4 h + e
        p = ((kk >> 2) & 3) * 16 + (kk >> 5) * 8 + ((kk >> 4) & 1) * 4 + (kk & 3)
    elif D == 64:  # logical 16 j + 8 h + 2 t + e is code byte 16 t + 4 j + 2 h + e
        p = ((kk >> 1) & 3) * 16 + (kk >> 4) * 4 + ((kk >> 3) & 1) * 2 + (kk & 1)
    elif K_FMT == K_FMT_INT4:  # logical 16 j + 8 h + 2 t + e is channel 64 (j // 4) + 16 t + 4 (j % 4) + 2 e + h
        p = (kk >> 6) * 64 + ((kk >> 1) & 3) * 16 + ((kk >> 4) & 3) * 4 + (kk & 1) * 2 + ((kk >> 3) & 1)
    elif K_FMT == K_FMT_INT8:  # int8 MMAs: logical 32 j + 16 h + 4 t + e is code byte 32 t + 8 j + 4 h + e
        p = ((kk >> 2) & 3) * 32 + (kk >> 5) * 8 + ((kk >> 4) & 1) * 4 + (kk & 3)
    else:  # logical 16 j + 8 h + 2 t + e is code byte 32 t + 4 j + 2 h + e
        p = ((kk >> 1) & 3) * 32 + (kk >> 4) * 4 + ((kk >> 3) & 1) * 2 + (kk & 1)
    return p


@gluon.jit
def _q_rows(q_ptr, q_row, sq_t, sq_h, h, GROUP: gl.constexpr, ROWS: gl.constexpr, K_FMT: gl.constexpr,
            A_OPERAND: gl.constexpr = False, D: gl.constexpr = 128):
    """The query rows of kv head h, [ROWS (the group, padded: 16 or 8), 128] float32, channels in K's order
    (`_q_phys`): in a blocked layout (Q_LOAD; QT8_LOAD for 8 rows), or A_OPERAND: A_OP's."""
    if A_OPERAND:
        g = gl.arange(0, ROWS, layout=gl.SliceLayout(1, A_OP))
        kk = gl.arange(0, 128, layout=gl.SliceLayout(0, A_OP))
    elif ROWS == 16:
        g = gl.arange(0, ROWS, layout=gl.SliceLayout(1, Q_LOAD))
        kk = gl.arange(0, 128, layout=gl.SliceLayout(0, Q_LOAD))
    elif D == 64:
        g = gl.arange(0, ROWS, layout=gl.SliceLayout(1, QT8_LOAD64))
        kk = gl.arange(0, 64, layout=gl.SliceLayout(0, QT8_LOAD64))
    else:
        g = gl.arange(0, ROWS, layout=gl.SliceLayout(1, QT8_LOAD))
        kk = gl.arange(0, 128, layout=gl.SliceLayout(0, QT8_LOAD))
    q_base = q_ptr + q_row.to(gl.int64) * sq_t + (h * GROUP + g)[:, None] * sq_h
    return gl.load(q_base + _q_phys(kk, K_FMT, D)[None, :], mask=(g < GROUP)[:, None], other=0.0).to(gl.float32)


@gluon.jit
def _v8_offset(acc, lb, V8B: gl.constexpr, V_STATIC: gl.constexpr, AXIS: gl.constexpr):
    """V8_PAIRS with int8 V (`_v8_pairs`): acc less 128 times the sums of P in lb (every column, AXIS 1, or row, AXIS
    0, of lb the same); with static V scales acc and lb are in units of 2^-24 (`_v_unit`)."""
    if V8B:
        lbr = gl.max(lb, axis=AXIS)
        if V_STATIC:
            w = lbr * (V8_BIAS / V8_UNIT)
        else:
            w = lbr * V8_BIAS
        if AXIS == 1:
            acc = acc - w[:, None]
        else:
            acc = acc - w[None, :]
    return acc


@gluon.constexpr_function
def _v_unit(factor, v8b):
    """The static V scale's factor: V_FACTOR, times 2^24 for V8_PAIRS' int8 codes."""
    return factor * _V8_UNIT if v8b else factor


@gluon.jit
def _frag_tile(n0, end, h, bt_row, q, q_lo, q_s, qk_scale, m_i, l_i, acc,
               kc_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
               vc_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
               BLOCK_SIZE: gl.constexpr, K_FMT: gl.constexpr, K_STATIC: gl.constexpr,
               V_FMT: gl.constexpr, V_STATIC: gl.constexpr, V_FACTOR: gl.constexpr,
               IDX64: gl.constexpr, MASKED: gl.constexpr, QK8: gl.constexpr,
               RING: gl.constexpr = False, kbuf=None, vbuf=None, ksbuf=None, vsbuf=None, slot=0,
               kz_ptr=None, vz_ptr=None, K_G: gl.constexpr = 32, V_G: gl.constexpr = 32, L2PF: gl.constexpr = 0,
               K_FACTOR: gl.constexpr = 256.0, E5M2_HW: gl.constexpr = False,  # the FP8 decode's (`_to_f16`)
               V8P: gl.constexpr = False, lb=None):
    """One 64-token tile: scores, online-softmax update, P @ V (as `_attend_tile` of "dot"). QK8 (int8
    K): q, q_lo are q's int8 parts, q_s its per-row step times the softmax scale, and the codes feed
    int8 MMAs straight from the load (no conversion); else q is fp16 and the codes become fp16 (int4:
    code * s + m with the group parameters K_G / V_G channels wide, zero-points at kz_ptr / vz_ptr). V8P: V's
    codes by token pairs (`_v8_pairs`); int8 then adds each row's sum of P (times the V scale factor) to lb [16, 8]
    (every column the same), for the kernel to subtract the codes' offset once at the end. Returns m, l, acc, lb."""
    KI4: gl.constexpr = K_FMT == K_FMT_INT4
    VI4: gl.constexpr = V_FMT == K_FMT_INT4
    # ---- K codes in fragment order, scores [16, 64] ----
    if KI4:  # int4: dequantized in registers (the scales are in the values)
        g0, blk, goff, k = _k4_tile(n0, end, h, bt_row, kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2,
                                    k_ss0, k_ss1, k_ss2, BLOCK_SIZE, K_G, IDX64, MASKED)
    elif RING:  # a whole tile, landed in ring slot `slot` (`_frag_issue`): the lane's own bytes back
        kc = gl.convert_layout(gl.reshape(kbuf.index(slot).load(K_RING), [8, 8, 4, 32]), K_LOAD,
                               assert_trivial=True)
    else:
        g0, blk, goff, kc = _k8_load(n0, end, h, bt_row, kc_ptr, k_cs0, k_cs1, k_cs2, BLOCK_SIZE, IDX64, MASKED)
    if VI4:  # V's loads issued with K's (else compiled after q @ K^T's MMAs: 1-5 % slower, session 16)
        v4 = _v4_load(g0, blk, goff, end, h, vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                      V_G, MASKED)
    if L2PF > 0:  # the tile L2PF ahead into L2 while this one computes
        _prefetch_tile(n0 + L2PF * 64, end, h, bt_row, kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1,
                       k_ss2, vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                       BLOCK_SIZE, IDX64, K_STATIC, V_STATIC, KI4, VI4)
    if KI4:
        s = mma_v2(q, k, gl.full([16, 64], 0.0, gl.float32, layout=MMA))
    elif QK8:
        k = _k8_operand(kc, K_FMT, True, False, K_FACTOR, E5M2_HW=E5M2_HW)
        si = mma_v2(q, k, gl.full([16, 64], 0, gl.int32, layout=MMA)) * 254
        s = mma_v2(q_lo, k, si).to(gl.float32)
    else:
        s = mma_v2(q, _k8_operand(kc, K_FMT, False, False, K_FACTOR, E5M2_HW=E5M2_HW), gl.full([16, 64], 0.0, gl.float32, layout=MMA))
    # per-token vectors (K and V scales, masks) in the scores' column layout, built as [8 groups, 8]
    # (the group values move by register renaming, before any stride multiplies: the strides'
    # divisibility, which the load vectorization needs, survives)
    nw = gl.arange(0, 8, layout=gl.SliceLayout(0, COLS8))[None, :]
    nblk = 0  # (RING: the scales come from the ring slot)
    noff = 0
    nmask = 0
    if not RING:
        ng = gl.convert_layout(g0, COLS8_G, assert_trivial=True)[:, None]
        nblk = gl.convert_layout(blk, COLS8_G, assert_trivial=True)[:, None]
        noff = gl.convert_layout(goff, COLS8_G, assert_trivial=True)[:, None] + nw
        nmask = gl.convert_layout(gl.reshape(ng + nw < end, [64]), COLS, assert_trivial=True)
    VTOK: gl.constexpr = not V_STATIC and not VI4
    if not K_STATIC and not KI4:
        ks = _tile_scales(ksbuf, slot, ks_ptr, nblk, noff, nmask, h, k_ss0, k_ss1, k_ss2, MASKED, RING)
        if QK8:  # the softmax scale is in q_s
            s = s * ks[None, :]
        else:
            s = s * (ks * qk_scale)[None, :]
    elif not QK8:
        s = s * qk_scale
    if MASKED:
        s = gl.where(nmask[None, :], s, -float("inf"))
    # ---- online softmax (base 2) ----
    if QK8:  # scores s * q_s (q_s > 0 per row): it scales the row maximum and joins the exponent
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * q_s)
        p = gl.exp2(s * q_s[:, None] - m_new[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        p = gl.exp2(s - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    # ---- V codes in fragment order, P @ V [16, 128] (channel 8 m + nl) ----
    if VI4:
        v = _v4_dequant(v4[0], v4[1], v4[2], v4[3], v4[4])
    elif RING:
        vc = gl.convert_layout(gl.reshape(vbuf.index(slot).load(V_RING), [4, 2, 4, 2, 8, 16]), V_LOAD,
                               assert_trivial=True)
    else:
        vc = _v8_load(g0, blk, goff, end, h, vc_ptr, v_cs0, v_cs1, v_cs2, MASKED)
    if V8P:
        v = _v8_pairs(vc, V_FMT, False)
    elif not VI4:
        v = _v8_operand(vc, V_FMT, False, V_FACTOR, E5M2_HW=E5M2_HW)
    if VTOK:  # the per-token V scale folds into p, normalised by the tile's largest (as in "dot")
        vsc = _tile_scales(vsbuf, slot, vs_ptr, nblk, noff, nmask, h, v_ss0, v_ss1, v_ss2, MASKED, RING)
        vmax = gl.max(vsc, axis=0)
        vmax = gl.where(vmax > 0, vmax, 1.0)
        p = p * (vsc * (1.0 / vmax))[None, :]
    pa = gl.convert_layout(p.to(gl.float16), A_OP)
    pv = mma_v2(pa, v, gl.full([16, 128], 0.0, gl.float32, layout=MMA))
    V8B: gl.constexpr = V8P and V_FMT == K_FMT_INT8  # codes (c + 128) * 2^-24
    if VTOK:
        if V8B:
            pv = pv * (vmax * (V_FACTOR * V8_UNIT))
        else:
            pv = pv * (vmax * V_FACTOR)
    if V8B:  # each row's sum of P as the MMA took it (P @ ones), for the offset
        sp = mma_v2(pa, gl.full([64, 8], 1.0, gl.float16, layout=B_OP), gl.full([16, 8], 0.0, gl.float32, layout=MMA))
        if VTOK:
            sp = sp * (vmax * V_FACTOR)
        lb = lb * alpha[:, None] + sp
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc, lb


@gluon.jit
def _gl_butterfly(x, ROWS: gl.constexpr, H: gl.constexpr):
    """`rotate._butterfly` (without its fma option) in Gluon for x [ROWS, W] float32 (W 128 or 64): the same bit
    trick for the partner (a sum of int32 bits over the pair's axis), the same IEEE additions; the
    compiler infers each reshape's layout."""
    W: gl.constexpr = x.shape[1]
    y = gl.reshape(x, [ROWS, W // (2 * H), 2, H])
    L: gl.constexpr = y.type.layout
    bits = y.to(gl.int32, bitcast=True)
    partner = (gl.sum(bits, 2, keep_dims=True) - bits).to(gl.float32, bitcast=True)
    i = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, L))))
    sgn = gl.expand_dims(gl.expand_dims(gl.expand_dims(1 - 2 * i, 0), 1), 3).to(gl.float32)
    return gl.reshape(partner + y * sgn, [ROWS, W])


@gluon.jit
def _gl_hadamard(x, ROWS: gl.constexpr, HB: gl.constexpr, NORM: gl.constexpr):
    """`rotate._hadamard` in Gluon: x @ R for x [ROWS, W] float32 (stages H = 1 ... HB / 2, * NORM)."""
    for s in gl.static_range(HB.bit_length() - 1):
        x = _gl_butterfly(x, ROWS, 1 << s)
    return x * NORM


@gluon.jit
def _q_rot(qf, ROWS: gl.constexpr, ROT: gl.constexpr, HB: gl.constexpr, NORM: gl.constexpr):
    """q rows [ROWS, D] float32 (a blocked layout), loaded in a kernel's bit-permuted channel order:
    with ROT, q @ R in that same order, in the same layout. For head_dim D 128 (or 64) with one D-wide Hadamard
    block (HB == D, the launcher's rule): R[i, j] = (-1)^popcount(i & j) / sqrt(D) does not change when
    the same permutation of index bits acts on i and j, so the butterflies over the permuted index give
    the permuted q @ R (the sums in another order: not the bits of `rotate_heads`)."""
    if ROT:
        qf = gl.convert_layout(_gl_hadamard(qf, ROWS, HB, NORM), qf.type.layout)
    return qf


@gluon.jit
def _frag_hadamard_mma(o, NORM: gl.constexpr):
    """out @ R for "frag"'s one-split output o [16, 128] float32 in the MMA accumulator layout, its channel c
    being output channel c_out = 16 (c % 8) + c // 8 (8-bit V): the 128-point Hadamard on c's bits, stage by
    stage in the order of c_out's bits (H = 1, 2, ..., 64 on c_out: c's bits 3-6, then 0-2), so that every
    addition is the one `decode_attention._store_out` makes on the merge kernel's unpermuted row (the same bits).
    In the accumulator layout bits 0 and 3-6 of c are a thread's registers and bits 1-2 its lane's: five stages
    add in registers, two take a shuffle, and o never moves through shared memory (`_store_out_rot` converts to
    a blocked layout first: there the rotation made the loop spill, session 22)."""
    for hs in gl.static_range(7):
        o = _gl_butterfly(o, 16, 1 << ((hs + 3) % 7))
    return gl.convert_layout(o, MMA) * NORM


@gluon.jit
def _int4_v_channel(c, D: gl.constexpr):
    """The output channel of row c of int4's V^T operand (`_v4_dequant`): D / 2 (c // (D / 2)) + D / 16 (c % 8)
    + (c // 8) % (D / 16) (D 128: 64 (c // 64) + 8 (c % 8) + (c // 8) % 8), a permutation of c's bits."""
    return (c // (D // 2)) * (D // 2) + (c & 7) * (D // 16) + ((c >> 3) & (D // 16 - 1))


@gluon.jit
def _store_out_rot(o, out_ptr, so_t, so_h, q_row, has_q, h, vmean_ptr, ROWS: gl.constexpr, GROUP: gl.constexpr,
                   VI4: gl.constexpr, ROT_HB: gl.constexpr, ROT_NORM: gl.constexpr, ROT_OUT: gl.constexpr,
                   OUT_MEAN: gl.constexpr, D: gl.constexpr = 128):
    """One split's normalized output o [ROWS heads, D] float32 (any layout; channel c in the kernel's V
    order: output channel c_out(c), a permutation of c's bits) stored as `_frag_merge_last` stores: out @ R
    (ROT_OUT; the butterflies over the permuted index give the permuted out @ R, as in `_q_rot`), + V mean
    (OUT_MEAN), bf16 rounded to nearest even."""
    OL: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32], warps_per_cta=[1, 1],
                                        order=[1, 0])
    o = gl.convert_layout(o, OL)
    if ROT_OUT:
        o = gl.convert_layout(_gl_hadamard(o, ROWS, ROT_HB, ROT_NORM), OL)
    go = gl.arange(0, ROWS, layout=gl.SliceLayout(1, OL))
    c = gl.arange(0, D, layout=gl.SliceLayout(0, OL))
    if VI4:
        d = _int4_v_channel(c, D)
    else:
        d = (c & 7) * (D // 8) + (c >> 3)
    if OUT_MEAN:
        o = _add_rn(o, gl.load(vmean_ptr + h * D + d)[None, :])
    om = ((go < GROUP) & has_q)[:, None] & (d < D)[None, :]
    o_ptr = out_ptr + q_row.to(gl.int64) * so_t + (h * GROUP + go)[:, None] * so_h + d[None, :]
    if out_ptr.dtype.element_ty == gl.bfloat16:
        gl.store(o_ptr, o.to(gl.bfloat16, fp_downcast_rounding="rtne"), mask=om)
    else:
        gl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=om)


@gluon.jit
def _frag_merge_last(po_ptr, pml_ptr, cnt_ptr, out_ptr, so_t, so_h, q_row, has_q, b, h, vmean_ptr,
                     GROUP: gl.constexpr, MG: gl.constexpr, CH: gl.constexpr, ROT_HB: gl.constexpr,
                     ROT_NORM: gl.constexpr, ROT_OUT: gl.constexpr, OUT_MEAN: gl.constexpr):
    """`decode_attention._merge_last` in Gluon (same counter, order and arithmetic, out @ R and + V
    mean as `_store_out`): partials [MG heads, CH splits, 128] in a blocked layout, 4 channels a lane."""
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[1, 1, 32],
                                        warps_per_cta=[1, 1, 1], order=[2, 1, 0])
    ML: gl.constexpr = gl.SliceLayout(2, L3)  # [MG, CH]
    OL: gl.constexpr = gl.SliceLayout(1, L3)  # [MG, 128]
    n_splits = gl.num_programs(2)
    cnt = cnt_ptr + b * gl.num_programs(1) + h
    gl.thread_barrier()  # every lane's partial stores before the (one lane's) releasing atomic
    if gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == n_splits - 1:
        gl.store(cnt, 0)
        g = gl.arange(0, MG, layout=gl.SliceLayout(1, ML))
        sp = gl.arange(0, CH, layout=gl.SliceLayout(0, ML))
        d3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 128, layout=gl.SliceLayout(0, OL)), 0), 1)  # [1, 1, 128]
        base = (b * (GROUP * gl.num_programs(1)) + h * GROUP + g).to(gl.int64) * n_splits
        m_run = gl.full([MG], -float("inf"), gl.float32, layout=gl.SliceLayout(1, ML))
        l_run = gl.full([MG], 0.0, gl.float32, layout=gl.SliceLayout(1, ML))
        o = gl.full([MG, 128], 0.0, gl.float32, layout=OL)
        for s0 in range(0, n_splits, CH):
            sm = (g < GROUP)[:, None] & ((s0 + sp) < n_splits)[None, :]
            ph = base[:, None] + s0 + sp[None, :]
            m = gl.load(pml_ptr + ph * 2, mask=sm, other=-float("inf"), cache_modifier=".cg")
            l = gl.load(pml_ptr + ph * 2 + 1, mask=sm, other=0.0, cache_modifier=".cg")
            a = gl.load(po_ptr + gl.expand_dims(ph, 2) * 128 + d3, mask=gl.expand_dims(sm, 2) & (d3 < 128),
                        other=0.0, cache_modifier=".cg")
            m_new = gl.maximum(m_run, gl.max(m, axis=1))
            m_ref = gl.where(m_new > -float("inf"), m_new, 0.0)  # rows without tokens so far: weights 0
            alpha = gl.exp2(m_run - m_ref)
            w = gl.exp2(m - m_ref[:, None])
            l_run = l_run * alpha + gl.sum(w * l, axis=1)
            alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, OL))
            o = o * alpha_o[:, None] + gl.sum(a * gl.expand_dims(w, 2), axis=1)
            m_run = m_new
        l_o = gl.convert_layout(gl.where(l_run > 0, l_run, 1.0), gl.SliceLayout(1, OL))
        o = o / l_o[:, None]
        if ROT_OUT:
            o = gl.convert_layout(_gl_hadamard(o, MG, ROT_HB, ROT_NORM), OL)
        go = gl.arange(0, MG, layout=gl.SliceLayout(1, OL))
        d = gl.arange(0, 128, layout=gl.SliceLayout(0, OL))
        if OUT_MEAN:
            o = _add_rn(o, gl.load(vmean_ptr + h * 128 + d)[None, :])
        om = ((go < GROUP) & has_q)[:, None] & (d < 128)[None, :]
        o_ptr = out_ptr + q_row.to(gl.int64) * so_t + (h * GROUP + go)[:, None] * so_h + d[None, :]
        if out_ptr.dtype.element_ty == gl.bfloat16:  # as `_store_out`: round to nearest even
            gl.store(o_ptr, o.to(gl.bfloat16, fp_downcast_rounding="rtne"), mask=om)
        else:
            gl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=om)


@gluon.jit
def _frag_decode_kernel(
    q_ptr, sq_t, sq_h, qsl_ptr, seq_lens_ptr, bt_ptr, s_bt,
    kc_ptr, ks_ptr, kz_ptr, kst_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
    vc_ptr, vs_ptr, vz_ptr, vst_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
    out_ptr, so_t, so_h, po_ptr, pml_ptr, qk_scale, tokens_per_split,
    GROUP: gl.constexpr, GROUP_PAD: gl.constexpr, D: gl.constexpr, D_PAD: gl.constexpr,
    HALF_PAD: gl.constexpr, BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr,
    K_FMT: gl.constexpr, K_STATIC: gl.constexpr, K_G: gl.constexpr, K_GPATH: gl.constexpr,
    K_FACTOR: gl.constexpr, K_DT: gl.constexpr,
    V_FMT: gl.constexpr, V_STATIC: gl.constexpr, V_G: gl.constexpr, V_GPATH: gl.constexpr,
    V_FACTOR: gl.constexpr, V_DT: gl.constexpr, INTERPRET: gl.constexpr, FAST: gl.constexpr,
    IDX64: gl.constexpr = True, PREFETCH: gl.constexpr = 0,
    QK8: gl.constexpr = False, vmean_ptr=None, ROT_HB: gl.constexpr = 1, ROT_NORM: gl.constexpr = 1.0,
    ROT_Q: gl.constexpr = False, ROT_OUT: gl.constexpr = False, OUT_MEAN: gl.constexpr = False,
    cnt_ptr=None, MERGE_G: gl.constexpr = 1, MERGE_CH: gl.constexpr = 0, PDL: gl.constexpr = 0,
    times_ptr=None, ALL_Q: gl.constexpr = False, E5M2_HW: gl.constexpr = False, V8_PAIRS: gl.constexpr = False,
):
    """`_decode_kernel`'s arguments (zeros, dtypes, QK8 unused: an int8 K always takes int8 MMAs here;
    PREFETCH: the cp.async ring's distance in tiles, 0 for direct loads; out @ R and + V mean in the fused
    merge or with one split (8-bit V: `_frag_hadamard_mma`), else by `rotate_heads` or `_merge_kernel`); D == 128,
    BLOCK_N == 64. ALL_Q: every sequence has one query token (T == B), so q's row is b and no sequence is skipped."""
    if times_ptr is not None:  # the timeline probe (`quant.probe_stamp`)
        t_ptr = probe_entry(times_ptr)
    if PDL == 1:  # the separate merge may launch now (it waits for this grid before reading: `pdl_mode`)
        _pdl_trigger()
    b = gl.program_id(0)
    h = gl.program_id(1)
    split = gl.program_id(2)
    if ALL_Q:  # every sequence has its query token: row b, no predicate kept through the loop (`plan_decode`)
        q_row = b
        has_q = True
        seq_len = gl.load(seq_lens_ptr + b)
    else:
        q_row = gl.load(qsl_ptr + b)
        has_q = gl.load(qsl_ptr + b + 1) > q_row
        seq_len = gl.load(seq_lens_ptr + b) * has_q.to(gl.int32)
    start = split * tokens_per_split
    end = gl.minimum(seq_len, start + tokens_per_split)
    bt_row = bt_ptr + b.to(gl.int64) * s_bt
    full_end = start + gl.maximum(end - start, 0) // 64 * 64
    ANY4: gl.constexpr = K_FMT == K_FMT_INT4 or V_FMT == K_FMT_INT4
    RING: gl.constexpr = PREFETCH > 0 and not ANY4  # int4: PREFETCH is an L2 prefetch distance instead
    L2PF: gl.constexpr = PREFETCH if ANY4 else 0
    FIRST: gl.constexpr = 1 if RING else 0  # the ring takes the whole tiles
    if RING:  # whole tiles through a cp.async ring of PREFETCH + 1 slots, PREFETCH tiles ahead; the first
        # copies go out before q's loads and split (the KV bytes' latency then hides theirs: session 21)
        NSLOT: gl.constexpr = PREFETCH + 1
        kbuf = gl.allocate_shared_memory(kc_ptr.dtype.element_ty, [NSLOT, 8, 8, 128], RING_SMEM)
        vbuf = gl.allocate_shared_memory(vc_ptr.dtype.element_ty, [NSLOT, 8, 8, 128], RING_SMEM)
        ksbuf = gl.allocate_shared_memory(ks_ptr.dtype.element_ty, [NSLOT, 8, 8], S_SMEM)
        vsbuf = gl.allocate_shared_memory(vs_ptr.dtype.element_ty, [NSLOT, 8, 8], S_SMEM)
        n_full = (full_end - start) // 64
        for t in gl.static_range(PREFETCH):
            _frag_issue(start + t * 64, t < n_full, h, bt_row, kbuf, vbuf, ksbuf, vsbuf, t,
                        kc_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                        vc_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                        BLOCK_SIZE, K_STATIC, V_STATIC, IDX64)
            async_copy.commit_group()

    if K_STATIC:
        qk_scale = qk_scale * gl.load(kst_ptr + h)
    qk_scale = qk_scale * K_FACTOR
    KI8: gl.constexpr = K_FMT == K_FMT_INT8
    if KI8:
        # q [16, 128] in two int8 parts, hi * 254 + lo steps of |q|max / 32258 per row
        # (`quant.split_q_int8`), channels in the int8 K fragments' order; split in a blocked layout, then
        # moved to the A operand
        qf = _q_rot(_q_rows(q_ptr, q_row, sq_t, sq_h, h, GROUP, 16, K_FMT), 16, ROT_Q, ROT_HB, ROT_NORM)
        hi, lo, step = split_q_int8(qf)
        q = gl.convert_layout(hi, A_OP8)
        q_lo = gl.convert_layout(lo, A_OP8)
        q_s = gl.convert_layout(step, ROWS) * qk_scale
    else:
        # q [16, 128] as the A operand, channels in the K fragments' order (see the module doc)
        g = gl.arange(0, 16, layout=gl.SliceLayout(1, A_OP))
        kk = gl.arange(0, 128, layout=gl.SliceLayout(0, A_OP))
        if K_FMT == K_FMT_INT4:  # logical 16 j + 8 h + 2 t + e is channel 64 (j // 4) + 16 t + 4 (j % 4) + 2 e + h
            phys = (kk >> 6) * 64 + ((kk >> 1) & 3) * 16 + ((kk >> 4) & 3) * 4 + (kk & 1) * 2 + ((kk >> 3) & 1)
        else:
            phys = ((kk >> 1) & 3) * 32 + (kk >> 4) * 4 + ((kk >> 3) & 1) * 2 + (kk & 1)
        q_base = q_ptr + q_row.to(gl.int64) * sq_t + (h * GROUP + g)[:, None] * sq_h
        if ROT_Q:  # rotated in a blocked layout, then to the A operand (once per program)
            gb = gl.arange(0, 16, layout=gl.SliceLayout(1, Q_LOAD))
            kb = gl.arange(0, 128, layout=gl.SliceLayout(0, Q_LOAD))
            if K_FMT == K_FMT_INT4:
                pb = (kb >> 6) * 64 + ((kb >> 1) & 3) * 16 + ((kb >> 4) & 3) * 4 + (kb & 1) * 2 + ((kb >> 3) & 1)
            else:
                pb = ((kb >> 1) & 3) * 32 + (kb >> 4) * 4 + ((kb >> 3) & 1) * 2 + (kb & 1)
            qb = q_ptr + q_row.to(gl.int64) * sq_t + (h * GROUP + gb)[:, None] * sq_h
            qf = gl.load(qb + pb[None, :], mask=(gb < GROUP)[:, None], other=0.0).to(gl.float32)
            q = gl.convert_layout(_q_rot(qf, 16, True, ROT_HB, ROT_NORM).to(gl.float16), A_OP)
        else:
            q = gl.load(q_base + phys[None, :], mask=(g < GROUP)[:, None], other=0.0).to(gl.float32).to(gl.float16)
        q_lo = q
        q_s = gl.full([16], 1.0, gl.float32, layout=ROWS)

    m_i = gl.full([16], -float("inf"), gl.float32, layout=ROWS)
    l_i = gl.full([16], 0.0, gl.float32, layout=ROWS)
    acc = gl.full([16, 128], 0.0, gl.float32, layout=MMA)
    lb = gl.full([16, 8], 0.0, gl.float32, layout=MMA)  # V8_PAIRS int8: sums of P (`_frag_tile`)
    if times_ptr is not None:
        probe_stamp(t_ptr + 1, 0)
    if RING:
        for i in range(0, n_full):
            _frag_issue(start + (i + PREFETCH) * 64, i + PREFETCH < n_full, h, bt_row, kbuf, vbuf, ksbuf, vsbuf,
                        (i + PREFETCH) % NSLOT,
                        kc_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                        vc_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                        BLOCK_SIZE, K_STATIC, V_STATIC, IDX64)
            async_copy.commit_group()
            async_copy.wait_group(PREFETCH)  # tile i has landed
            gl.thread_barrier()  # the reads cross lanes
            m_i, l_i, acc, lb = _frag_tile(start + i * 64, end, h, bt_row, q, q_lo, q_s, qk_scale, m_i, l_i, acc,
                                       kc_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                                       vc_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                                       BLOCK_SIZE, K_FMT, K_STATIC, V_FMT, V_STATIC, V_FACTOR, IDX64, False,
                                       KI8, True, kbuf, vbuf, ksbuf, vsbuf, i % NSLOT, kz_ptr, vz_ptr, K_G, V_G,
                                       K_FACTOR=K_FACTOR, E5M2_HW=E5M2_HW, V8P=V8_PAIRS, lb=lb)
            if times_ptr is not None:
                if i == 0:
                    probe_stamp(t_ptr + 2, 0)
        async_copy.wait_group(0)
    for phase in gl.static_range(FIRST, 2):  # 0: whole tiles, unmasked; 1: the last, partial tile (if any)
        lo = start + (full_end - start) * phase
        hi = full_end + (end - full_end) * phase
        for n0 in range(lo, hi, 64):
            m_i, l_i, acc, lb = _frag_tile(n0, end, h, bt_row, q, q_lo, q_s, qk_scale, m_i, l_i, acc,
                                       kc_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                                       vc_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                                       BLOCK_SIZE, K_FMT, K_STATIC, V_FMT, V_STATIC, V_FACTOR, IDX64, phase == 1,
                                       KI8, False, None, None, None, None, 0, kz_ptr, vz_ptr, K_G, V_G, L2PF, K_FACTOR,
                                       E5M2_HW, V8_PAIRS, lb)
    if times_ptr is not None:
        probe_stamp(t_ptr + 3, 0)
    if PDL == 2:  # the tiles are done: the separate merge may launch
        _pdl_trigger()
    acc = _v8_offset(acc, lb, V8_PAIRS and V_FMT == K_FMT_INT8, V_STATIC, 1)
    if V_STATIC:
        acc = acc * (gl.load(vst_ptr + h) * _v_unit(V_FACTOR, V8_PAIRS and V_FMT == K_FMT_INT8))

    # channel 8 m + nl of acc is channel 16 nl + m of the output (int4: 64 (m // 8) + 8 nl + m % 8; see the
    # module doc)
    rg = gl.arange(0, 16, layout=ROWS)
    c = gl.arange(0, 128, layout=COLS)
    if V_FMT == K_FMT_INT4:
        c_out = (c >> 6) * 64 + (c & 7) * 8 + ((c >> 3) & 7)
    else:
        c_out = (c & 7) * 16 + (c >> 3)
    heads = h * GROUP + rg
    cm = (rg < GROUP)[:, None] & (c_out < 128)[None, :]
    if not SPLIT:
        l_safe = gl.where(l_i > 0, l_i, 1.0)[:, None]
        o = acc / l_safe
        if ROT_OUT:  # out @ R where acc lies (`_frag_hadamard_mma`: no layout change, the merge kernel's bits)
            o = _frag_hadamard_mma(o, ROT_NORM)
        if OUT_MEAN:
            o = _add_rn(o, gl.load(vmean_ptr + h * 128 + c_out)[None, :])
        o_ptr = out_ptr + q_row.to(gl.int64) * so_t + heads[:, None] * so_h + c_out[None, :]
        if (ROT_OUT or OUT_MEAN) and out_ptr.dtype.element_ty == gl.bfloat16:  # as `_store_out`: nearest even
            gl.store(o_ptr, o.to(gl.bfloat16, fp_downcast_rounding="rtne"), mask=cm & has_q)
        else:
            gl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=cm & has_q)
    else:
        ph = (b * (GROUP * gl.num_programs(1)) + heads).to(gl.int64) * gl.num_programs(2) + split
        gl.store(po_ptr + ph[:, None] * 128 + c_out[None, :], acc, mask=cm)
        gl.store(pml_ptr + ph * 2, m_i, mask=rg < GROUP)
        gl.store(pml_ptr + ph * 2 + 1, l_i, mask=rg < GROUP)
        if MERGE_CH > 0:  # the split merge fused: the last of this (sequence, kv head)'s programs merges
            _frag_merge_last(po_ptr, pml_ptr, cnt_ptr, out_ptr, so_t, so_h, q_row, has_q, b, h, vmean_ptr,
                             GROUP, MERGE_G, MERGE_CH, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN)
    if times_ptr is not None:
        probe_exit(t_ptr)


# "fragt" (int4 K and V, GQA groups <= 8): both products transposed, so that the 8 (padded) query heads
# are the MMA's n dimension (mma.m16n8k16: n = 8) rather than its m (16: a group of 4 padded to 16)
QT_LOAD = gl.BlockedLayout(size_per_thread=[4, 8], threads_per_warp=[32, 1], warps_per_cta=[1, 1], order=[0, 1])
T_ROWS = gl.SliceLayout(1, MMA)  # per-token [64] (scores) or per-channel [128] (output) vectors
T_HEADS = gl.SliceLayout(0, MMA)  # per-head [8] vectors (m_i, l_i)
# T_ROWS over 64 tokens as [8 groups of 8 tokens, 8]: a lane holds tokens 8 i + lane / 4 (as K_LOAD's i, nl)
ROWS8 = gl.DistributedLinearLayout(reg_bases=[[1, 0], [2, 0], [4, 0]],
                                   lane_bases=[[0, 0], [0, 0], [0, 1], [0, 2], [0, 4]],
                                   warp_bases=[], block_bases=[], shape=[8, 8])
ROWS8_G = gl.SliceLayout(1, ROWS8)
QT8_LOAD = gl.BlockedLayout(size_per_thread=[1, 32], threads_per_warp=[8, 4], warps_per_cta=[1, 1], order=[1, 0])


@gluon.jit
def _t_softmax(s, m_i, l_i):
    """The online softmax (base 2) of a transposed tile's scores S^T [64 tokens, 8 heads] down the tokens:
    (new running max, P^T, the old accumulator's factor, new running sum)."""
    m_new = gl.maximum(m_i, gl.max(s, axis=0))
    p = gl.exp2(s - m_new[None, :])
    alpha = gl.exp2(m_i - m_new)
    return m_new, p, alpha, l_i * alpha + gl.sum(p, axis=0)


@gluon.jit
def _fragt_tile(n0, end, h, bt_row, q, m_i, l_i, acc,
                kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                BLOCK_SIZE: gl.constexpr, K_G: gl.constexpr, V_G: gl.constexpr, IDX64: gl.constexpr,
                MASKED: gl.constexpr, L2PF: gl.constexpr, D: gl.constexpr = 128, WORDS: gl.constexpr = False,
                V_PAIRS: gl.constexpr = False, V_PF0: gl.constexpr = False):
    """One 64-token int4 tile, transposed: scores S^T [64 tokens, 8 heads] = K @ q^T (q carries the softmax
    scale), the online softmax down the token axis, O^T [D, 8] += V^T @ P^T. P^T goes from the scores'
    accumulator layout to the B operand within the warp (`convert_layout`). Head dim D 128 or 64 (session 41: a
    token's 32 code bytes; the L2 prefetch asks once a token pair, as 8-bit codes at 64 do)."""
    g0, blk, goff, k = _k4_tile(n0, end, h, bt_row, kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2,
                                k_ss0, k_ss1, k_ss2, BLOCK_SIZE, K_G, IDX64, MASKED, True, D, WORDS)
    if V_PF0:  # the tile's own V rows into L2 as its K loads go out (ptxas issues V's loads after the scores)
        _prefetch_tile(n0, end, h, bt_row, kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                       vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                       BLOCK_SIZE, IDX64, False, False, True, True, 128 // D, False, False)
    v4 = _v4_load(g0, blk, goff, end, h, vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                  V_G, MASKED, D, WORDS)
    if L2PF > 0:
        _prefetch_tile(n0 + L2PF * 64, end, h, bt_row, kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1,
                       k_ss2, vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                       BLOCK_SIZE, IDX64, False, False, True, True, 128 // D)
    s = mma_v2(k, q, gl.full([64, 8], 0.0, gl.float32, layout=MMA))
    if MASKED:
        tok = n0 + gl.arange(0, 64, layout=T_ROWS)
        s = gl.where((tok < end)[:, None], s, -float("inf"))
    m_new, p, alpha, l_i = _t_softmax(s, m_i, l_i)
    if V_PAIRS:  # head dim 64, P_WORDS: V by token pairs
        v = _v4_dequant_pairs64(v4[0], v4[1], v4[2])
    else:
        v = _v4_dequant(v4[0], v4[1], v4[2], v4[3], v4[4], True, D, WORDS)
    acc = mma_v2(v, gl.convert_layout(p.to(gl.float16), B_OP), acc * alpha[None, :])
    return m_new, l_i, acc


@gluon.jit
def _r4_issue(n0, valid, h, bt_row, kbuf, vbuf, ksbuf, kzbuf, vsbuf, vzbuf, slot,
              kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1,
              vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1,
              BLOCK_SIZE: gl.constexpr, IDX64: gl.constexpr, NG: gl.constexpr = 4, K_P: gl.constexpr = True,
              V_P: gl.constexpr = True, ZP: gl.constexpr = True):
    """cp.async of the whole 64-token int4 tile at n0 into ring slot `slot` (RING4): K and V codes as [32 token
    pairs, 128 bytes] (a pair's two 64-byte rows are adjacent in a block), the group scales and zero-points as
    [8 groups of 8 tokens, 8 NG] (NG = 128 / group size a token, adjacent in a block). Nothing is read where not
    `valid` (the slot fills with zeros). The caller commits the group. 8-bit codes at head dim 64 (RING8, session 42):
    the same 64-byte rows, NG 1 (a token's scale), no zero-points (ZP False), no scales on a static side (K_P, V_P)."""
    pr = gl.arange(0, 32, layout=R4C_P)
    tok = n0 + pr * 2
    blk = gl.load(bt_row + (tok.to(gl.uint32) // BLOCK_SIZE).to(gl.int32), mask=(pr >= 0) & valid, other=0)
    if IDX64:
        blk = blk.to(gl.int64)
    off = tok & (BLOCK_SIZE - 1)
    col = gl.arange(0, 128, layout=R4C_B)[None, :]
    cmask = (col >= 0) & valid
    async_copy.async_copy_global_to_shared(
        kbuf.index(slot), kc_ptr + (blk * k_cs0 + h * k_cs1 + off * k_cs2)[:, None] + col, mask=cmask)
    async_copy.async_copy_global_to_shared(
        vbuf.index(slot), vc_ptr + (blk * v_cs0 + h * v_cs1 + off * v_cs2)[:, None] + col, mask=cmask)
    if NG == 4:
        gg = gl.arange(0, 8, layout=R4P_G)
        pc = gl.arange(0, 32, layout=R4P_C)[None, :]
    elif NG == 2:
        gg = gl.arange(0, 8, layout=R4P2_G)
        pc = gl.arange(0, 16, layout=R4P2_C)[None, :]
    else:
        gg = gl.arange(0, 8, layout=R4P1_G)
        pc = gl.arange(0, 8, layout=R4P1_C)[None, :]
    g0 = n0 + gg * 8
    pblk = gl.load(bt_row + (g0.to(gl.uint32) // BLOCK_SIZE).to(gl.int32), mask=(gg >= 0) & valid, other=0)
    if IDX64:
        pblk = pblk.to(gl.int64)
    poff = ((g0 >> 3) & (BLOCK_SIZE // 8 - 1)) * (8 * NG)  # (a multiple of 8 elements: 16-byte copies)
    pmask = (pc >= 0) & valid
    if K_P:
        krow = (pblk * k_ss0 + h * k_ss1 + poff)[:, None] + pc
        async_copy.async_copy_global_to_shared(ksbuf.index(slot), ks_ptr + krow, mask=pmask)
        if ZP:
            async_copy.async_copy_global_to_shared(kzbuf.index(slot), kz_ptr + krow, mask=pmask)
    if V_P:
        vrow = (pblk * v_ss0 + h * v_ss1 + poff)[:, None] + pc
        async_copy.async_copy_global_to_shared(vsbuf.index(slot), vs_ptr + vrow, mask=pmask)
        if ZP:
            async_copy.async_copy_global_to_shared(vzbuf.index(slot), vz_ptr + vrow, mask=pmask)


@gluon.jit
def _r4_k_params(buf, slot, NG: gl.constexpr = 4):
    """K's group parameters of ring slot `slot` for the lanes of K4_LOAD: ([i, nl, t, 1] low nibbles' group,
    the same for the high nibbles'), each lane's own values (groups of 32: t // 2 and 2 + t // 2 of its token;
    of 64: 0 and 1; of 128: 0 twice)."""
    if NG == 4:
        x = buf.index(slot).reshape([8, 8, 2, 2]).load(K4P_4)  # [i, nl, hi, t1]: group 2 hi + t1 of token 8 i + nl
    else:
        if NG == 2:
            x = buf.index(slot).reshape([8, 8, 2]).load(K4P_3)  # [i, nl, hi]
        else:
            x = buf.index(slot).load(K4P_2)  # [i, nl]
            x, _ = gl.broadcast(gl.expand_dims(x, 2), gl.full([8, 8, 2], 0, x.dtype, layout=K4P_3))  # hi
        x, _ = gl.broadcast(gl.expand_dims(x, 3), gl.full([8, 8, 2, 2], 0, x.dtype, layout=K4P_4))  # along t1
    x, _ = gl.broadcast(gl.expand_dims(x, 4), gl.full([8, 8, 2, 2, 2], 0, x.dtype, layout=K4P))  # along t0
    lo, hi = gl.split(gl.reshape(gl.permute(x, [0, 1, 3, 4, 2]), [8, 8, 4, 2]))  # [i, nl, t, hi]
    return (gl.convert_layout(lo, K4_S, assert_trivial=True)[:, :, :, None],
            gl.convert_layout(hi, K4_S, assert_trivial=True)[:, :, :, None])


@gluon.jit
def _r4_v_params(buf, slot, NG: gl.constexpr = 4):
    """V's group parameters of ring slot `slot` for the lanes of V4_LOAD: [s, h, t, e, nl] (groups of 32:
    nl // 4 and 2 + nl // 4 of token 16 s + 8 h + 2 t + e; of 64: 0 and 1; of 128: 0 twice)."""
    if NG == 4:
        x = buf.index(slot).reshape([4, 2, 4, 2, 2, 2]).load(V4P_6)  # [s, h, t, e, hi, nl2]
    else:
        if NG == 2:
            x = buf.index(slot).reshape([4, 2, 4, 2, 2]).load(V4P_5)  # [s, h, t, e, hi]
        else:
            x = buf.index(slot).reshape([4, 2, 4, 2]).load(V4P_4)  # [s, h, t, e]
            x, _ = gl.broadcast(gl.expand_dims(x, 4), gl.full([4, 2, 4, 2, 2], 0, x.dtype, layout=V4P_5))  # hi
        x, _ = gl.broadcast(gl.expand_dims(x, 5), gl.full([4, 2, 4, 2, 2, 2], 0, x.dtype, layout=V4P_6))  # nl2
    x, _ = gl.broadcast(gl.expand_dims(x, 6), gl.full([4, 2, 4, 2, 2, 2, 2], 0, x.dtype, layout=V4P_7))
    x, _ = gl.broadcast(gl.expand_dims(x, 7), gl.full([4, 2, 4, 2, 2, 2, 2, 2], 0, x.dtype, layout=V4P))
    lo, hi = gl.split(gl.reshape(gl.permute(x, [0, 1, 2, 3, 5, 6, 7, 4]), [4, 2, 4, 2, 8, 2]))
    return gl.convert_layout(lo, V4_S, assert_trivial=True), gl.convert_layout(hi, V4_S, assert_trivial=True)


@gluon.jit
def _fragt_tile_ring(q, m_i, l_i, acc, kbuf, vbuf, ksbuf, kzbuf, vsbuf, vzbuf, slot, V_PAIRS: gl.constexpr = False,
                     NG: gl.constexpr = 4):
    """`_fragt_tile` on a whole tile landed in ring slot `slot` (`_r4_issue`): the lane's own bytes and group
    parameters from shared memory, the same products and softmax."""
    kc = gl.convert_layout(gl.reshape(kbuf.index(slot).load(K4_RING), [8, 8, 4, 16]), K4_LOAD, assert_trivial=True)
    ks_lo, ks_hi = _r4_k_params(ksbuf, slot, NG)
    kz_lo, kz_hi = _r4_k_params(kzbuf, slot, NG)
    k = _k4_operand(kc, ks_lo, kz_lo, ks_hi, kz_hi, True)
    m_new, p, alpha, l_i = _t_softmax(mma_v2(k, q, gl.full([64, 8], 0.0, gl.float32, layout=MMA)), m_i, l_i)
    vc = gl.convert_layout(gl.reshape(vbuf.index(slot).load(V4_RING), [4, 2, 4, 2, 8, 8]), V4_LOAD,
                           assert_trivial=True)
    vs_lo, vs_hi = _r4_v_params(vsbuf, slot, NG)
    vz_lo, vz_hi = _r4_v_params(vzbuf, slot, NG)
    if V_PAIRS:
        v = _v4_dequant_pairs(vc, vs_lo, vz_lo, vs_hi, vz_hi)
    else:
        v = _v4_dequant(vc, vs_lo[:, :, :, :, :, None], vz_lo[:, :, :, :, :, None], vs_hi[:, :, :, :, :, None],
                        vz_hi[:, :, :, :, :, None], True)
    acc = mma_v2(v, gl.convert_layout(p.to(gl.float16), B_OP), acc * alpha[None, :])
    return m_new, l_i, acc


@gluon.jit
def _t_row_vec(ptr, nblk, noff, nmask, h, ss0, ss1, ss2, MASKED: gl.constexpr):
    """A tile's per-token values (scales) [64] in the transposed scores' row layout, float32; nblk, noff
    [8 groups, 8] in ROWS8."""
    sr = gl.convert_layout(gl.reshape(nblk * ss0 + h * ss1 + noff * ss2, [64]), T_ROWS, assert_trivial=True)
    return _ld(ptr + sr, nmask, MASKED).to(gl.float32)


@gluon.jit
def _ring_row_vec(buf, slot):
    """A tile's per-token scales [64] from ring slot `slot` ([8 groups of 8 tokens, 8], `_r4_issue` with NG 1) in the
    transposed scores' row layout, float32."""
    return gl.convert_layout(gl.reshape(buf.index(slot).load(ROWS8), [64]), T_ROWS, assert_trivial=True).to(gl.float32)


@gluon.jit
def _fragt_tile8(n0, end, h, bt_row, q, q_lo, q_s, qk_scale, m_i, l_i, acc,
                 kc_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                 vc_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                 BLOCK_SIZE: gl.constexpr, K_FMT: gl.constexpr, K_STATIC: gl.constexpr,
                 V_FMT: gl.constexpr, V_STATIC: gl.constexpr, V_FACTOR: gl.constexpr,
                 IDX64: gl.constexpr, MASKED: gl.constexpr, QK8: gl.constexpr, K_FACTOR: gl.constexpr,
                 D: gl.constexpr = 128, L2PF: gl.constexpr = 0, E5M2_HW: gl.constexpr = False,
                 RING: gl.constexpr = False, kbuf=None, vbuf=None, ksbuf=None, vsbuf=None, slot=0,
                 V8P: gl.constexpr = False, lb=None):
    """`_frag_tile` (8-bit codes, direct loads) transposed: S^T [64, 8] = K @ q^T (int8 K: int8 MMAs with
    q's two int8 parts, q_s per head), per-token K scales on the rows, the online softmax down the token
    axis, the per-token V scale folded into P^T (normalised by the tile's largest, as in "frag"),
    O^T [D, 8] += V^T @ P^T (head dim D 128 or 64). L2PF > 0: the tile L2PF ahead is prefetched into L2
    (`_prefetch_tile`) before this tile's loads are issued (its addresses dead before the codes arrive). RING (head
    dim 64, a whole tile; session 42): the codes and scales from ring slot `slot` (`_r4_issue`), read in the same
    layouts (K4_RING / V4_RING are register renamings of K4_LOAD / V4_LOAD), the same operations. V8P: as
    `_frag_tile`'s, lb [16, 8] with every row the same. Returns m, l, acc, lb."""
    if L2PF > 0:
        _prefetch_tile(n0 + L2PF * 64, end, h, bt_row, kc_ptr, ks_ptr, kc_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                       vc_ptr, vs_ptr, vc_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                       BLOCK_SIZE, IDX64, K_STATIC, V_STATIC, False, False, 128 // D, True)
    if RING:  # a whole tile, landed in the ring (MASKED is False)
        kc = gl.convert_layout(gl.reshape(kbuf.index(slot).load(K4_RING), [8, 8, 4, 16]), K4_LOAD, assert_trivial=True)
        vc = gl.convert_layout(gl.reshape(vbuf.index(slot).load(V4_RING), [4, 2, 4, 2, 8, 8]), V4_LOAD,
                               assert_trivial=True)
        nmask = gl.full([64], 1, gl.int1, layout=T_ROWS)
        nblk = 0
        noff = 0
    else:
        g0, blk, goff, kc = _k8_load(n0, end, h, bt_row, kc_ptr, k_cs0, k_cs1, k_cs2, BLOCK_SIZE, IDX64, MASKED, D)
        vc = _v8_load(g0, blk, goff, end, h, vc_ptr, v_cs0, v_cs1, v_cs2, MASKED, D)
        # per-token vectors in the rows' layout, built as [8 groups, 8] (see ROWS8)
        nw = gl.arange(0, 8, layout=gl.SliceLayout(0, ROWS8))[None, :]
        ng = gl.convert_layout(g0, ROWS8_G, assert_trivial=True)[:, None]
        nblk = gl.convert_layout(blk, ROWS8_G, assert_trivial=True)[:, None]
        noff = gl.convert_layout(goff, ROWS8_G, assert_trivial=True)[:, None] + nw
        nmask = gl.convert_layout(gl.reshape(ng + nw < end, [64]), T_ROWS, assert_trivial=True)
    # ---- scores S^T [64, 8] ----
    if QK8:
        k = _k8_operand(kc, K_FMT, True, True, K_FACTOR, D, E5M2_HW)
        si = mma_v2(k, q, gl.full([64, 8], 0, gl.int32, layout=MMA)) * 254
        s = mma_v2(k, q_lo, si).to(gl.float32)
    else:
        s = mma_v2(_k8_operand(kc, K_FMT, False, True, K_FACTOR, D, E5M2_HW), q, gl.full([64, 8], 0.0, gl.float32, layout=MMA))
    if not K_STATIC:
        if RING:
            ks = _ring_row_vec(ksbuf, slot)
        else:
            ks = _t_row_vec(ks_ptr, nblk, noff, nmask, h, k_ss0, k_ss1, k_ss2, MASKED)
        if QK8:  # the softmax scale is in q_s
            s = s * ks[:, None]
        else:
            s = s * (ks * qk_scale)[:, None]
    elif not QK8:
        s = s * qk_scale
    if MASKED:
        s = gl.where(nmask[:, None], s, -float("inf"))
    # ---- online softmax (base 2) down the tokens ----
    if QK8:
        m_new = gl.maximum(m_i, gl.max(s, axis=0) * q_s)
        p = gl.exp2(s * q_s[None, :] - m_new[None, :])
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        p = gl.exp2(s - m_new[None, :])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=0)
    # ---- O^T [D, 8] += V^T @ P^T (row 8 m + nl: output channel D / 8 nl + m) ----
    V8B: gl.constexpr = V8P and V_FMT == K_FMT_INT8  # codes (c + 128) * 2^-24 (`_v8_pairs`)
    if V8P:
        v = _v8_pairs(vc, V_FMT, True, D)
    else:
        v = _v8_operand(vc, V_FMT, True, V_FACTOR, D, E5M2_HW)
    if not V_STATIC:  # the per-token V scale folds into p, normalised by the tile's largest (as in "frag")
        if RING:
            vsc = _ring_row_vec(vsbuf, slot)
        else:
            vsc = _t_row_vec(vs_ptr, nblk, noff, nmask, h, v_ss0, v_ss1, v_ss2, MASKED)
        vmax = gl.max(vsc, axis=0)
        vmax = gl.where(vmax > 0, vmax, 1.0)
        p = p * (vsc * (1.0 / vmax))[:, None]
        pt = gl.convert_layout(p.to(gl.float16), B_OP)
        pv = mma_v2(v, pt, gl.full([D, 8], 0.0, gl.float32, layout=MMA))
        if V8B:
            acc = acc * alpha[None, :] + pv * (vmax * (V_FACTOR * V8_UNIT))
        else:
            acc = acc * alpha[None, :] + pv * (vmax * V_FACTOR)
    else:
        pt = gl.convert_layout(p.to(gl.float16), B_OP)
        acc = mma_v2(v, pt, acc * alpha[None, :])
    if V8B:  # each head's sum of P as the MMA took it (ones @ P^T), for the offset
        sp = mma_v2(gl.full([16, 64], 1.0, gl.float16, layout=A_OP), pt, gl.full([16, 8], 0.0, gl.float32, layout=MMA))
        if not V_STATIC:
            sp = sp * (vmax * V_FACTOR)
        lb = lb * alpha[None, :] + sp
    return m_new, l_i, acc, lb


@gluon.jit
def _fragt_decode_kernel(
    q_ptr, sq_t, sq_h, qsl_ptr, seq_lens_ptr, bt_ptr, s_bt,
    kc_ptr, ks_ptr, kz_ptr, kst_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
    vc_ptr, vs_ptr, vz_ptr, vst_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
    out_ptr, so_t, so_h, po_ptr, pml_ptr, qk_scale, tokens_per_split,
    GROUP: gl.constexpr, GROUP_PAD: gl.constexpr, D: gl.constexpr, D_PAD: gl.constexpr,
    HALF_PAD: gl.constexpr, BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr,
    K_FMT: gl.constexpr, K_STATIC: gl.constexpr, K_G: gl.constexpr, K_GPATH: gl.constexpr,
    K_FACTOR: gl.constexpr, K_DT: gl.constexpr,
    V_FMT: gl.constexpr, V_STATIC: gl.constexpr, V_G: gl.constexpr, V_GPATH: gl.constexpr,
    V_FACTOR: gl.constexpr, V_DT: gl.constexpr, INTERPRET: gl.constexpr, FAST: gl.constexpr,
    IDX64: gl.constexpr = True, PREFETCH: gl.constexpr = 0,
    QK8: gl.constexpr = False, vmean_ptr=None, ROT_HB: gl.constexpr = 1, ROT_NORM: gl.constexpr = 1.0,
    ROT_Q: gl.constexpr = False, ROT_OUT: gl.constexpr = False, OUT_MEAN: gl.constexpr = False,
    cnt_ptr=None, MERGE_G: gl.constexpr = 1, MERGE_CH: gl.constexpr = 0, PDL: gl.constexpr = 0,
    RING4: gl.constexpr = 0, RING4_VPAIRS: gl.constexpr = False, times_ptr=None, K8_F16: gl.constexpr = False,
    ALL_Q: gl.constexpr = False, E5M2_HW: gl.constexpr = False, P_WORDS: gl.constexpr = False,
    V_PAIRS: gl.constexpr = False, V_PF0: gl.constexpr = False, RING8: gl.constexpr = 0,
    V8_PAIRS: gl.constexpr = False,
):
    """`_frag_decode_kernel` for int4 K and V with the products transposed (variant "fragt"): the same
    arguments, loads, dequantization, partials and merge; GROUP <= 8, D == 128 (8-bit codes also 64), BLOCK_N == 64,
    PREFETCH an L2 prefetch distance (int4 without the ring, and 8-bit codes). Per 64-token tile it issues half the
    MMAs (32 + 32 m16n8k16 against 64 + 64) and keeps a quarter of the padded softmax work; the output accumulator is
    [128, 8] (32 registers a lane, against [16, 128]'s 64). ALL_Q: as `_frag_decode_kernel`'s."""
    if times_ptr is not None:  # the timeline probe (`quant.probe_stamp`)
        t_ptr = probe_entry(times_ptr)
    if PDL == 1:  # the separate merge may launch now (it waits for this grid before reading: `pdl_mode`)
        _pdl_trigger()
    b = gl.program_id(0)
    h = gl.program_id(1)
    split = gl.program_id(2)
    if ALL_Q:  # every sequence has its query token: row b, no predicate kept through the loop (`plan_decode`)
        q_row = b
        has_q = True
        seq_len = gl.load(seq_lens_ptr + b)
    else:
        q_row = gl.load(qsl_ptr + b)
        has_q = gl.load(qsl_ptr + b + 1) > q_row
        seq_len = gl.load(seq_lens_ptr + b) * has_q.to(gl.int32)
    start = split * tokens_per_split
    end = gl.minimum(seq_len, start + tokens_per_split)

    KI4: gl.constexpr = K_FMT == K_FMT_INT4
    KI8: gl.constexpr = K_FMT == K_FMT_INT8 and not K8_F16  # int8 K through int8 MMAs (K8_F16: as fp16, fp16 MMAs)
    bt_row = bt_ptr + b.to(gl.int64) * s_bt
    if (not KI4 or D == 64) and PREFETCH > 0:  # 8-bit codes (and int4 at head dim 64): the first PREFETCH tiles
        for t in gl.static_range(PREFETCH):  # into L2 before q's loads (`_prefetch_tile`)
            _prefetch_tile(start + t * 64, end, h, bt_row, kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1,
                           k_ss2, vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                           BLOCK_SIZE, IDX64, K_STATIC, V_STATIC, KI4, KI4, 128 // D, True)
    Q_FMT: gl.constexpr = K_FMT_FP8E4M3 if K8_F16 else K_FMT  # the channel order q takes (`_q_phys`)
    if K_STATIC:
        qk_scale = qk_scale * gl.load(kst_ptr + h)
    qk_scale = qk_scale * K_FACTOR
    if KI8:  # q [8, D] split in two int8 parts per head (as "frag"), then q^T as the int8 B operand
        qf = _q_rot(_q_rows(q_ptr, q_row, sq_t, sq_h, h, GROUP, 8, K_FMT, False, D), 8, ROT_Q, ROT_HB, ROT_NORM)
        qhi, qlo, step = split_q_int8(qf)
        q = gl.convert_layout(gl.permute(qhi, [1, 0]), B_OP8)
        q_lo = gl.convert_layout(gl.permute(qlo, [1, 0]), B_OP8)
        q_s = gl.convert_layout(step, T_HEADS) * qk_scale
    else:  # q^T [128, 8] fp16 as the B operand (int4: times the softmax scale), channels in K's order
        if ROT_Q:  # q [8, 128] rotated in a blocked layout, then transposed
            qr = _q_rot(_q_rows(q_ptr, q_row, sq_t, sq_h, h, GROUP, 8, Q_FMT, False, D), 8, True, ROT_HB, ROT_NORM)
            if KI4:
                qr = qr * qk_scale
            q = gl.convert_layout(gl.permute(qr.to(gl.float16), [1, 0]), B_OP)
        else:  # loaded transposed
            QTL: gl.constexpr = QT_LOAD64 if D == 64 else QT_LOAD
            kk = gl.arange(0, D, layout=gl.SliceLayout(1, QTL))
            g = gl.arange(0, 8, layout=gl.SliceLayout(0, QTL))
            q_base = q_ptr + q_row.to(gl.int64) * sq_t + (h * GROUP + g)[None, :] * sq_h
            qf = gl.load(q_base + _q_phys(kk, Q_FMT, D)[:, None], mask=(g < GROUP)[None, :], other=0.0).to(gl.float32)
            if KI4:
                qf = qf * qk_scale
            q = gl.convert_layout(qf.to(gl.float16), B_OP)
        q_lo = q
        q_s = gl.full([8], 1.0, gl.float32, layout=T_HEADS)

    m_i = gl.full([8], -float("inf"), gl.float32, layout=T_HEADS)
    l_i = gl.full([8], 0.0, gl.float32, layout=T_HEADS)
    full_end = start + gl.maximum(end - start, 0) // 64 * 64
    acc = gl.full([D, 8], 0.0, gl.float32, layout=MMA)
    lb = gl.full([16, 8], 0.0, gl.float32, layout=MMA)  # V8_PAIRS int8: sums of P (`_fragt_tile8`)
    if times_ptr is not None:
        probe_stamp(t_ptr + 1, 0)
    FIRST: gl.constexpr = 1 if RING4 > 0 or RING8 > 0 else 0  # the ring takes the whole tiles
    if RING4 > 0:  # int4 K and V (groups of 32, 64 or 128): whole tiles through a cp.async ring of RING4 + 1 slots
        NSLOT: gl.constexpr = RING4 + 1
        NG: gl.constexpr = 128 // K_G  # group parameters a token (K_G == V_G: `int4_ring_ok`)
        kbuf = gl.allocate_shared_memory(kc_ptr.dtype.element_ty, [NSLOT, 32, 128], R4_SMEM)
        vbuf = gl.allocate_shared_memory(vc_ptr.dtype.element_ty, [NSLOT, 32, 128], R4_SMEM)
        ksbuf = gl.allocate_shared_memory(ks_ptr.dtype.element_ty, [NSLOT, 8, 8 * NG], R4P_SMEM)
        kzbuf = gl.allocate_shared_memory(kz_ptr.dtype.element_ty, [NSLOT, 8, 8 * NG], R4P_SMEM)
        vsbuf = gl.allocate_shared_memory(vs_ptr.dtype.element_ty, [NSLOT, 8, 8 * NG], R4P_SMEM)
        vzbuf = gl.allocate_shared_memory(vz_ptr.dtype.element_ty, [NSLOT, 8, 8 * NG], R4P_SMEM)
        n_full = (full_end - start) // 64
        for t in gl.static_range(RING4):
            _r4_issue(start + t * 64, t < n_full, h, bt_row, kbuf, vbuf, ksbuf, kzbuf, vsbuf, vzbuf, t,
                      kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1,
                      vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, BLOCK_SIZE, IDX64, NG)
            async_copy.commit_group()
        for i in range(0, n_full):
            _r4_issue(start + (i + RING4) * 64, i + RING4 < n_full, h, bt_row, kbuf, vbuf, ksbuf, kzbuf, vsbuf,
                      vzbuf, (i + RING4) % NSLOT,
                      kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1,
                      vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, BLOCK_SIZE, IDX64, NG)
            async_copy.commit_group()
            async_copy.wait_group(RING4)  # tile i has landed
            gl.thread_barrier()  # the reads cross lanes
            m_i, l_i, acc = _fragt_tile_ring(q, m_i, l_i, acc, kbuf, vbuf, ksbuf, kzbuf, vsbuf, vzbuf, i % NSLOT,
                                             RING4_VPAIRS, NG)
            if times_ptr is not None:
                if i == 0:
                    probe_stamp(t_ptr + 2, 0)
        async_copy.wait_group(0)
    if RING8 > 0:  # 8-bit K and V at head dim 64 (session 42): whole tiles through a cp.async ring of RING8 + 1 slots
        NSLOT8: gl.constexpr = RING8 + 1
        kbuf = gl.allocate_shared_memory(kc_ptr.dtype.element_ty, [NSLOT8, 32, 128], R4_SMEM)
        vbuf = gl.allocate_shared_memory(vc_ptr.dtype.element_ty, [NSLOT8, 32, 128], R4_SMEM)
        ksbuf = gl.allocate_shared_memory(ks_ptr.dtype.element_ty, [NSLOT8, 8, 8], R4P_SMEM)
        vsbuf = gl.allocate_shared_memory(vs_ptr.dtype.element_ty, [NSLOT8, 8, 8], R4P_SMEM)
        n_full = (full_end - start) // 64
        for t in gl.static_range(RING8):
            _r4_issue(start + t * 64, t < n_full, h, bt_row, kbuf, vbuf, ksbuf, ksbuf, vsbuf, vsbuf, t,
                      kc_ptr, ks_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1,
                      vc_ptr, vs_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, BLOCK_SIZE, IDX64, 1,
                      not K_STATIC, not V_STATIC, False)
            async_copy.commit_group()
        for i in range(0, n_full):
            _r4_issue(start + (i + RING8) * 64, i + RING8 < n_full, h, bt_row, kbuf, vbuf, ksbuf, ksbuf, vsbuf,
                      vsbuf, (i + RING8) % NSLOT8,
                      kc_ptr, ks_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1,
                      vc_ptr, vs_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, BLOCK_SIZE, IDX64, 1,
                      not K_STATIC, not V_STATIC, False)
            async_copy.commit_group()
            async_copy.wait_group(RING8)  # tile i has landed
            gl.thread_barrier()  # the reads cross lanes
            # (n0 0: unused, every byte of the tile comes from the slot)
            m_i, l_i, acc, lb = _fragt_tile8(0, end, h, bt_row, q, q_lo, q_s, qk_scale, m_i, l_i, acc,
                                         kc_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                                         vc_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                                         BLOCK_SIZE, K_FMT, K_STATIC, V_FMT, V_STATIC, V_FACTOR, IDX64,
                                         False, KI8, K_FACTOR, D, 0, E5M2_HW, True, kbuf, vbuf, ksbuf, vsbuf,
                                         i % NSLOT8, V8_PAIRS, lb)
        async_copy.wait_group(0)
    for phase in gl.static_range(FIRST, 2):  # 0: whole tiles, unmasked; 1: the last, partial tile (if any)
        lo = start + (full_end - start) * phase
        hi = full_end + (end - full_end) * phase
        for n0 in range(lo, hi, 64):
            if KI4:
                m_i, l_i, acc = _fragt_tile(n0, end, h, bt_row, q, m_i, l_i, acc,
                                            kc_ptr, ks_ptr, kz_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                                            vc_ptr, vs_ptr, vz_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                                            BLOCK_SIZE, K_G, V_G, IDX64, phase == 1, PREFETCH, D, P_WORDS,
                                            V_PAIRS and P_WORDS and D == 64, V_PF0 and D == 64)
            else:
                m_i, l_i, acc, lb = _fragt_tile8(n0, end, h, bt_row, q, q_lo, q_s, qk_scale, m_i, l_i, acc,
                                             kc_ptr, ks_ptr, k_cs0, k_cs1, k_cs2, k_ss0, k_ss1, k_ss2,
                                             vc_ptr, vs_ptr, v_cs0, v_cs1, v_cs2, v_ss0, v_ss1, v_ss2,
                                             BLOCK_SIZE, K_FMT, K_STATIC, V_FMT, V_STATIC, V_FACTOR, IDX64,
                                             phase == 1, KI8, K_FACTOR, D, PREFETCH if phase == 0 else 0, E5M2_HW,
                                             V8P=V8_PAIRS, lb=lb)
    if times_ptr is not None:
        probe_stamp(t_ptr + 3, 0)
    if PDL == 2:  # the tiles are done: the separate merge may launch
        _pdl_trigger()
    acc = _v8_offset(acc, lb, V8_PAIRS and V_FMT == K_FMT_INT8, V_STATIC, 0)
    if V_STATIC:
        acc = acc * (gl.load(vst_ptr + h) * _v_unit(V_FACTOR, V8_PAIRS and V_FMT == K_FMT_INT8))

    # row 8 m + nl of acc is output channel D / 8 nl + m (int4: `_int4_v_channel`; the module doc)
    c = gl.arange(0, D, layout=T_ROWS)
    if KI4:
        c_out = _int4_v_channel(c, D)
    else:
        c_out = (c & 7) * (D // 8) + (c >> 3)
    rg = gl.arange(0, 8, layout=T_HEADS)
    heads = h * GROUP + rg
    cm = (c_out < D)[:, None] & (rg < GROUP)[None, :]
    if not SPLIT and (ROT_OUT or OUT_MEAN):
        l_safe = gl.where(l_i > 0, l_i, 1.0)[None, :]
        _store_out_rot(gl.permute(acc / l_safe, [1, 0]), out_ptr, so_t, so_h, q_row, has_q, h, vmean_ptr, 8, GROUP,
                       KI4, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN, D)
    elif not SPLIT:
        l_safe = gl.where(l_i > 0, l_i, 1.0)[None, :]
        o_ptr = out_ptr + q_row.to(gl.int64) * so_t + heads[None, :] * so_h + c_out[:, None]
        gl.store(o_ptr, (acc / l_safe).to(out_ptr.dtype.element_ty), mask=cm & has_q)
    else:
        ph = (b * (GROUP * gl.num_programs(1)) + heads).to(gl.int64) * gl.num_programs(2) + split
        gl.store(po_ptr + ph[None, :] * D + c_out[:, None], acc, mask=cm)
        gl.store(pml_ptr + ph * 2, m_i, mask=rg < GROUP)
        gl.store(pml_ptr + ph * 2 + 1, l_i, mask=rg < GROUP)
        if MERGE_CH > 0:  # the split merge fused: the last of this (sequence, kv head)'s programs merges
            _frag_merge_last(po_ptr, pml_ptr, cnt_ptr, out_ptr, so_t, so_h, q_row, has_q, b, h, vmean_ptr,
                             GROUP, MERGE_G, MERGE_CH, ROT_HB, ROT_NORM, ROT_OUT, OUT_MEAN)
    if times_ptr is not None:
        probe_exit(t_ptr)
