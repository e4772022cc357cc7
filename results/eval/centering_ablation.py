"""Ablation run before centering existed in kvpack (kept for the record; results/eval/centering.md).
It monkeypatches the reference write to subtract K/V means measured on calibration text (or on
another text: MU_TEXT=file, MU_SRC=a:b token range) and scores 10 jargon windows from token 200,000.
Usage: python results/eval/centering_ablation.py CAL_TOKENS WINDOWS fp8nu,fp8rot,int4mu,int4nu,int8nu
Today the same choices are flags: kvpack eval --no-kv-centering / --no-kv-rotation."""
import sys, json, time, torch, torch.nn.functional as F
from dataclasses import replace
sys.path.insert(0, "/work/main")
from kvpack.models.loader import load_model
from kvpack.tools.scoring import PagedScorer, read_text, token_windows
from kvpack.config import CacheConfig
from kvpack.attention.layer import Attention
import kvpack.attention.reference as ref
from kvpack.tools.calibrate import _percentile
from kvpack.formats.scales import derive_scales
torch.set_num_threads(2)
GGUF = __import__("kvpack.models.loader", fromlist=["x"]).default_model_path()
loaded = load_model(GGUF, dtype="float32", device="cpu")
ids = loaded.tokenizer.encode(read_text("/tmp/jargon.txt"), add_special_tokens=False)
layers = [m for m in loaded.model.modules() if isinstance(m, Attention)]
CUR = [0]
for i, m in enumerate(layers):
    m.register_forward_pre_hook(lambda mod, a, i=i: CUR.__setitem__(0, i))
NCAL = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
NW = int(sys.argv[2]) if len(sys.argv) > 2 else 10
# calibration: store k, v per layer
ks = [[] for _ in layers]; vs = [[] for _ in layers]
orig_write = ref.write_kv
def rec_write(k, v, lc, sm):
    ks[CUR[0]].append(k.float().clone()); vs[CUR[0]].append(v.float().clone())
    return orig_write(k, v, lc, sm)
ref.write_kv = rec_write
import kvpack.attention.backend as be; be._cache.clear()
sc = PagedScorer(loaded, CacheConfig(block_size=16, kv_cache_dtype="bfloat16"), 1024, 256)
for w in token_windows(ids, 1024, NCAL):
    sc.logits(w, want_logits=False)
ref.write_kv = orig_write; be._cache.clear()
K = [torch.cat(x) for x in ks]; V = [torch.cat(x) for x in vs]
mu = torch.stack([k.mean(0) for k in K])  # [L, H, D]
nu = torch.stack([v.mean(0) for v in V])
import os
if os.environ.get("MU_TEXT"):
    pids = loaded.tokenizer.encode(open(os.environ["MU_TEXT"]).read(), add_special_tokens=False)
    ks2 = [[] for _ in layers]; vs2 = [[] for _ in layers]
    def rec2(k, v, lc, sm):
        ks2[CUR[0]].append(k.float().clone()); vs2[CUR[0]].append(v.float().clone()); return orig_write(k, v, lc, sm)
    ref.write_kv = rec2; be._cache.clear()
    sc2 = PagedScorer(loaded, CacheConfig(block_size=16, kv_cache_dtype="bfloat16"), 1024, 256)
    sc2.logits(pids[:1024], want_logits=False)
    ref.write_kv = orig_write; be._cache.clear()
    mu2 = torch.stack([torch.cat(x).mean(0) for x in ks2]); nu2 = torch.stack([torch.cat(x).mean(0) for x in vs2])
    print("probe mu rel diff", ((mu2 - mu).norm() / mu.norm()).item(), "nu", ((nu2 - nu).norm() / nu.norm()).item())
    mu, nu = mu2, nu2
if os.environ.get("MU_SRC"):
    a, b = map(int, os.environ["MU_SRC"].split(":"))
    ks2 = [[] for _ in layers]
    def rec2(k, v, lc, sm):
        ks2[CUR[0]].append(k.float().clone()); return orig_write(k, v, lc, sm)
    ref.write_kv = rec2; be._cache.clear()
    sc2 = PagedScorer(loaded, CacheConfig(block_size=16, kv_cache_dtype="bfloat16"), 1024, 256)
    for w in token_windows(ids[a:b], 1024, None):
        sc2.logits(w, want_logits=False)
    ref.write_kv = orig_write; be._cache.clear()
    mu2 = torch.stack([torch.cat(x).mean(0) for x in ks2])
    print("mu from", a, b, "rel diff", ((mu2 - mu).norm() / mu.norm()).item())
    mu = mu2
def stat(xs, p=99.9):
    return torch.stack([_percentile(x.abs().amax(-1), p) for x in xs])
k_stat, v_stat = stat(K), stat(V)
kc_stat = stat([k - mu[i] for i, k in enumerate(K)])
print("k absmax p99.9 mean", k_stat.mean().item(), "centered", kc_stat.mean().item(), flush=True)
del ks, vs, K, V
USE_MU = [False]
USE_NU = [False]
def bias_write(k, v, lc, sm):
    if USE_MU[0]:
        k = k.float() - mu[CUR[0]]
    if USE_NU[0]:
        v = v.float() - nu[CUR[0]]
    return orig_write(k, v, lc, sm)
orig_pa = ref.paged_attention
def pa(q, lc, md, scale):
    out = orig_pa(q, lc, md, scale)
    if USE_NU[0]:
        g = q.shape[1] // nu.shape[1]
        out = out + nu[CUR[0]].repeat_interleave(g, 0).to(out.dtype)
    return out
ref.paged_attention = pa
ref.write_kv = bias_write; be._cache.clear()
wins = token_windows(ids[200000:], 1024, NW * 1024)
def run(name, cc, use_mu, ss=None, use_nu=False):
    USE_MU[0] = use_mu; USE_NU[0] = use_nu
    s = PagedScorer(loaded, cc, 1024, 256, static_scales=ss)
    nll = kl = agree = n = 0
    for w, r in zip(wins, REF):
        lp = F.log_softmax(s.logits(w)[:-1], -1); t = torch.tensor(w[1:])
        nll -= float(lp.gather(1, t[:, None]).sum()); kl += float((r.exp() * (r - lp)).sum())
        agree += int((lp.argmax(-1) == r.argmax(-1)).sum()); n += t.numel()
    import math
    ppl = math.exp(nll / n)
    print(f"{name:28s} dppl {100*(ppl/BPPL-1):+.3f}%  kl {kl/n:.5f}  top1 {agree/n:.4f}", flush=True)
USE_MU[0] = False
b = PagedScorer(loaded, CacheConfig(block_size=16, kv_cache_dtype="bfloat16"), 1024, 256)
REF = [F.log_softmax(b.logits(w)[:-1], -1) for w in wins]
import math
BPPL = math.exp(-sum(float(r.gather(1, torch.tensor(w[1:])[:, None]).sum()) for r, w in zip(REF, wins)) / sum(len(w) - 1 for w in wins))
base = CacheConfig(block_size=16)
which = sys.argv[3].split(",")
from kvpack.formats import base as fb
fp8 = replace(base, kv_cache_dtype="fp8_e4m3", k_cache_dtype="fp8_e4m3", v_cache_dtype="fp8_e4m3")
i4 = replace(base, kv_cache_dtype="int4", k_cache_dtype="int4", v_cache_dtype="int4")
if "fp8nu" in which:
    run("fp8 dyn + kmu + vnu", fp8, True, None, True)
if "fp8rot" in which:
    orig_rf = fb.resolve_format
    def rf(*a, **k):
        f = orig_rf(*a, **k)
        return replace(f, rotate=True) if f.kind.startswith("fp8") else f
    import kvpack.attention.kv_cache as kvc
    for mod in (fb, kvc):
        if hasattr(mod, "resolve_format"): mod.resolve_format = rf
    import kvpack.formats as ff; ff.resolve_format = rf
    run("fp8 dyn rot + kmu + vnu", fp8, True, None, True)
if "int4mu" in which:
    run("int4 + kmu", i4, True)
if "int8nu" in which:
    run("int8 dyn", replace(base, kv_cache_dtype="int8", k_cache_dtype="int8", v_cache_dtype="int8"), False)
    run("int8 dyn + kmu + vnu", replace(base, kv_cache_dtype="int8", k_cache_dtype="int8", v_cache_dtype="int8"), True, None, True)
if "int4nu" in which:
    run("int4 + kmu + vnu", i4, True, None, True)
