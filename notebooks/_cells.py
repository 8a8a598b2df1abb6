"""Cell sources of the notebooks (see _build.py)."""

NB03 = [
    ("md", """
# 03 · Zero-copy interop with PyTorch and NumPy

castlab tensors share memory with NumPy arrays (through NumPy's array interface; bf16 and
fp8 appear as `ml_dtypes` dtypes) and with PyTorch/CuPy tensors (through DLPack). Nothing
is copied: the pointers are the same and a write on one side is seen on the other.
"""),
    ("code", """
import numpy as np
import torch

import castlab as cl

try:
    HAS_GPU = cl.cuda.is_available()
except AttributeError:
    HAS_GPU = False
print(cl.__version__, "GPU:", HAS_GPU)
"""),
    ("md", "## NumPy: the same memory, both ways"),
    ("code", """
a = np.arange(6, dtype=np.float32).reshape(2, 3)
t = cl.from_numpy(a)
print(hex(a.ctypes.data), hex(t.data_ptr()))
a[0, 0] = 42.0          # write through NumPy ...
t[1, 2] = -1.0          # ... and through castlab
print(t)
print(a)
assert t.data_ptr() == a.ctypes.data
assert t[0, 0].item() == 42.0 and a[1, 2] == -1.0
"""),
    ("code", """
# bf16 tensors show up in NumPy as ml_dtypes.bfloat16, still without a copy
x = cl.randn(2, 4, seed=0, dtype=cl.bfloat16)
n = x.numpy()
print(n.dtype, hex(n.ctypes.data) == hex(x.data_ptr()))
n[0, 0] = 0.1           # NumPy rounds 0.1 to bf16: 0.10009765625
print(x[0, 0].item())
assert x[0, 0].item() == 0.10009765625
"""),
    ("md", "## PyTorch: DLPack both ways, strided views included"),
    ("code", """
xt = torch.randn(4, 8).to(torch.bfloat16)
xc = cl.from_dlpack(xt)                 # or cl.asarray(xt)
print("same pointer:", xc.data_ptr() == xt.data_ptr())
xt[0, 0] = 3.0
print("castlab sees torch's write:", xc[0, 0].item())
view = torch.from_dlpack(xc[1:, ::2])   # a strided castlab view, back into torch
print(view.shape, view.stride(), view.data_ptr() == xt[1:, ::2].data_ptr())
xc[1, 0] = -2.0
assert view[0, 0].item() == -2.0 and xc[0, 0].item() == 3.0
"""),
    ("md", """
## castlab policies on torch tensors

A `cl.jit` function takes torch tensors directly (zero-copy). Under the `eager` policy it
reproduces PyTorch eager bit for bit; `fused` rounds once; `fp64` is the golden reference.
"""),
    ("code", """
@cl.jit
def swiglu(x):
    a, b = cl.chunk(x, 2, dim=-1)
    return cl.silu(a) * b

torch.manual_seed(0)
x = torch.randn(256, 512).to(torch.bfloat16)
y_torch = torch.nn.functional.silu(x[:, :256]) * x[:, 256:]
y_eager = torch.from_dlpack(swiglu.run(x, policy="eager"))
y_fused = torch.from_dlpack(swiglu(x))
mism_eager = (y_eager.view(torch.int16) != y_torch.view(torch.int16)).sum().item()
mism_fused = (y_fused.view(torch.int16) != y_torch.view(torch.int16)).sum().item()
print(f"castlab eager vs torch eager: {mism_eager} of {y_torch.numel()} differ")
print(f"castlab fused vs torch eager: {mism_fused} of {y_torch.numel()} differ")
assert mism_eager == 0
assert mism_fused > 0
"""),
    ("md", """
## On a GPU: castlab vs torch eager and torch.compile

With a GPU, castlab's eager kernels (`torch_eager` preset) are compared with torch eager
CUDA and its fused kernels (`inductor` preset) with `torch.compile`, bit for bit.
"""),
    ("code", """
if HAS_GPU:
    xg = x.cuda()
    ref_eager = torch.nn.functional.silu(xg[:, :256]) * xg[:, 256:]
    compiled = torch.compile(lambda v: torch.nn.functional.silu(v[:, :256]) * v[:, 256:],
                             dynamic=False)
    ref_comp = compiled(xg)
    ce = torch.from_dlpack(swiglu.run(xg, policy="eager"))
    cf = torch.from_dlpack(swiglu.run(xg, policy="fused", math="inductor"))
    torch.cuda.synchronize()
    print("eager vs torch eager:", (ce.view(torch.int16) != ref_eager.view(torch.int16)).sum().item())
    print("fused/inductor vs torch.compile:", (cf.view(torch.int16) != ref_comp.view(torch.int16)).sum().item())
else:
    print("no GPU here: the GPU comparison is skipped")
"""),
]



NB01 = [
    ("md", """
# 01 · bf16, round-to-nearest-even, ties and ulps

bfloat16 keeps float32's 8 exponent bits and only 7 mantissa bits: between 1 and 2 the
representable values are 1/128 apart. Every conversion rounds to the nearest value; an
exact tie goes to the one whose last mantissa bit is 0 (*to even*).
"""),
    ("code", """
import numpy as np
import torch

import castlab as cl
import castlab.numerics as nm

x = cl.tensor([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20], dtype=cl.float64)
b = x.astype(cl.bfloat16)
for v, r in zip(x.tolist(), b.tolist()):
    print(f"{v!r:>24} -> {r!r:<12} ulp at it: {nm.ulp(cl.tensor([r], dtype=cl.float64), cl.bfloat16).tolist()[0]}")
# 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: the tie goes to even (1.0);
# 1 + 3*2^-8 is halfway between 1.0078125 and 1.015625: to even is up.
assert b.tolist() == [1.0, 1.0, 1.015625, 1.0078125]
"""),
    ("code", """
# Rounding directly matters: fp64 -> bf16 in one step vs through fp32 (double rounding)
v = cl.tensor([1 + 2**-8 + 2**-30], dtype=cl.float64)
direct = v.astype(cl.bfloat16).tolist()[0]
via_fp32 = v.astype(cl.float32).astype(cl.bfloat16).tolist()[0]
print("direct:", direct, " via fp32:", via_fp32)
assert (direct, via_fp32) == (1.0078125, 1.0)
"""),
    ("md", """
## The formula-order case

A hand-written SwiGLU `x * y / (1 + exp(-x))` (PyTorch's jiterator and Inductor order the
silu as `x / (1 + exp(-x))`) and TransformerEngine's `(x * sigmoid(x)) * y`, both computed
in fp32 and rounded once to bf16, differ in exactly one element of a seed-1234
`torch.rand(512, 256)` input. castlab finds it with `compare` and explains it.
"""),
    ("code", """
@cl.jit
def swiglu(x):
    a, b = cl.chunk(x, 2, dim=-1)
    return cl.silu(a) * b

torch.manual_seed(1234)
x = cl.from_dlpack(torch.rand(512, 256).to(torch.bfloat16))
y_ind = swiglu.run(x, policy="fused", math="inductor")
y_te = swiglu.run(x, policy="fused", math="transformer_engine")
ref = swiglu.run(x, policy="fp64")
cmp = nm.compare(y_ind, y_te, ref=ref, names=["inductor order", "TransformerEngine order"])
cmp
"""),
    ("code", """
d = cmp.to_dict()
diff = np.argwhere(y_ind.numpy() != y_te.numpy())
print("differing elements:", diff.tolist())
assert d["TransformerEngine order"]["mismatches"] == 1
assert diff.tolist() == [[456, 127]]
i, j = diff[0]
print("inductor:", y_ind[i, j].item(), " TE:", y_te[i, j].item(), " exact:", ref[i, j].item())
assert (y_ind[i, j].item(), y_te[i, j].item()) == (0.470703125, 0.46875)
"""),
    ("code", """
e = nm.explain(swiglu, (x,), (456, 127), policies=("fused",), maths=("inductor", "transformer_engine"))
print(e)
"""),
    ("md", """
The exact value lies 2.6e-5 ulp above the bf16 midpoint 0.4697265625. Inductor's fp32
value lands just above the midpoint and rounds up (correctly); TransformerEngine's lands
*exactly on* the midpoint, and the tie rounds to even, down. Differences like this live
only where the exact value is a near tie:
"""),
    ("code", """
nt = nm.near_ties(ref, cl.bfloat16, within=0.001)
print(nt)
split = nt.mismatch_rate(y_ind, y_te)
print(split)
assert split.inside_mismatches == 1 and split.outside_mismatches == 0
"""),
    ("code", """
import matplotlib.pyplot as plt

dist = nt.distance.numpy()
fig, ax = plt.subplots(figsize=(6, 3))
ax.hist(dist.ravel(), bins=200, range=(-0.5, 0.5))
ax.axvline(dist[456, 127], color="red", lw=1, label="element [456, 127]")
ax.set_xlabel("distance of the exact value from the nearest bf16 midpoint (ulp)")
ax.set_ylabel("elements")
ax.legend()
fig.tight_layout()
"""),
]

NB02 = [
    ("md", """
# 02 · Eager vs fused: the Qwen2-under-Thunder story

HF Qwen2 gives a slightly different loss under Thunder (or torch.compile) than eager. The
drift comes from SwiGLU (`silu(a) * b`) and RoPE (`q*cos + rotate_half(q)*sin`): eager
rounds every intermediate to bf16, the fusers round once. Which one is right? Compare
both with an fp64 reference.
"""),
    ("code", """
import castlab as cl
import castlab.numerics as nm
import castlab.plot as cplot
from castlab.study import CHAINS

device = "cuda" if cl.cuda.is_available() else "cpu"
swiglu = cl.jit(CHAINS["swiglu"].fn)
rope = cl.jit(CHAINS["rope"].fn)
x = cl.randn(1024, 2048, seed=0, dtype=cl.bfloat16, device=device)
q, cos, sin = CHAINS["rope"].make_inputs((1, 8, 256, 128), cl.bfloat16, 0, "normal", 1.0, device)
print(swiglu.trace(x, policy="eager"))
print(swiglu.trace(x, policy="fused"))
"""),
    ("code", """
res = {}
for name, fn, args in [("swiglu", swiglu, (x,)), ("rope", rope, (q, cos, sin))]:
    eager = fn.run(*args, policy="eager")
    fused = fn.run(*args, policy="fused")
    ref = fn.run(*args, policy="fp64")
    res[name] = nm.compare(eager, fused, ref=ref, names=["eager", "fused"])
res["swiglu"]
"""),
    ("code", "res['rope']"),
    ("code", """
for name, c in res.items():
    d = c.to_dict()
    print(f"{name}: correctly rounded eager {100 * d['eager']['correctly_rounded']:.2f}%, "
          f"fused {100 * d['fused']['correctly_rounded']:.4f}%; rel RMSE eager "
          f"{d['eager']['rel_rmse']:.3e}, fused {d['fused']['rel_rmse']:.3e}; "
          f"PyTorch same(eager, fused, fp64): {d['fused']['same']}")
    assert d["fused"]["correctly_rounded"] > 0.999 > 0.8 > d["eager"]["correctly_rounded"]
    assert d["fused"]["rel_rmse"] < d["eager"]["rel_rmse"]
    assert d["fused"]["same"]
"""),
    ("md", """
PyTorch's own accuracy gate (`torch._dynamo.utils.same`, RMSE to fp64 at most 3x the
baseline's for bf16) accepts the fused result: it is *closer* to fp64 than eager.

## Where does the drift start?
`drift` evaluates every node of the trace under each policy and compares it with the
fp64 graph.
"""),
    ("code", """
dr = nm.drift(swiglu, (x,), policies=("eager", "fused"))
print(dr)
print("drift starts at:", dr.first_divergence)
assert dr.first_divergence is not None and dr.first_divergence.op == "silu"
"""),
    ("code", "cplot.drift_chart(dr)"),
    ("code", "cplot.ulp_histogram(res['swiglu'])"),
    ("code", "cplot.ulp_histogram(res['rope'])"),
]

NB04 = [
    ("md", """
# 04 · A scripted A/B study

`castlab.study.run` sweeps chains, dtypes, policies, math presets, rounding modes and
input scales, and returns one DataFrame row per configuration, each compared with the
fp64 reference.
"""),
    ("code", """
import matplotlib.pyplot as plt
import pandas as pd

import castlab as cl
from castlab import study

device = "cuda" if cl.cuda.is_available() else "cpu"
rows = []
for scale in [0.01, 1.0, 100.0]:
    df = study.run(chains=["swiglu", "rope"], dtypes=["bfloat16", "float16"], quick=True,
                   policies=["eager", "fused"], presets=["torch_eager"], scale=scale,
                   extra_presets={"swiglu": ["transformer_engine"]}, device=device)
    rows.append(df)
sweep = pd.concat(rows, ignore_index=True)
sweep[["chain", "dtype", "scale", "math", "policy", "correctly_rounded", "rel_rmse", "max_ulp"]]
"""),
    ("code", """
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for (chain, dt), g in sweep.groupby(["chain", "dtype"]):
    for pol, gp in g[g.math == "torch_eager"].groupby("policy"):
        axes[0].plot(gp.scale, gp.correctly_rounded, marker="o", label=f"{chain} {dt} {pol}")
        axes[1].plot(gp.scale, gp.rel_rmse, marker="o", label=f"{chain} {dt} {pol}")
for ax, t in zip(axes, ["correctly rounded fraction", "relative RMSE vs fp64"]):
    ax.set_xscale("log"); ax.set_xlabel("input scale"); ax.set_title(t)
axes[1].set_yscale("log")
axes[0].legend(fontsize=7)
fig.tight_layout()
"""),
    ("code", """
moderate = sweep[(sweep.scale <= 1.0) & (sweep.dtype == "bfloat16")]
fused = moderate[(moderate.policy == "fused") & (moderate.math == "torch_eager")]
eager = moderate[moderate.policy == "eager"]
print("bf16, scale <= 1: fused correctly rounded (min):", fused.correctly_rounded.min())
print("bf16, scale <= 1: eager correctly rounded (max):", eager.correctly_rounded.max())
assert fused.correctly_rounded.min() > 0.999
assert eager.correctly_rounded.max() < 0.9
"""),
    ("md", """
At scale 100 fused SwiGLU is no longer almost always correctly rounded, and its max error
is hundreds of ulps, like eager's. The cause is not rounding but range: for a ≈ -100,
`exp(-a)` overflows fp32 (`exp(88.7)` is already the largest float), so
`a / (1 + exp(-a))` becomes -0 while the exact result, about -4e-40 · b, is a bf16
subnormal. `explain` on one such element shows it:
"""),
    ("code", """
import numpy as np

import castlab.numerics as nm

sw = cl.jit(study.CHAINS["swiglu"].fn)
xs = (cl.randn(256, 512, seed=0, dtype=cl.float64, device=device) * 100.0).astype(cl.bfloat16)
yf = sw(xs)
ref = sw.run(xs, policy="fp64")
err = nm.ulp_error(yf, ref).numpy()
worst = np.unravel_index(np.argmax(err), err.shape)
print(nm.explain(sw, (xs,), tuple(int(i) for i in worst), policies=("eager", "fused")))
big = sweep[(sweep.scale == 100.0) & (sweep.chain == "swiglu") & (sweep.dtype == "bfloat16")]
assert (big.max_ulp > 100).all()
"""),
    ("md", """
## Stochastic rounding and fp8

Stochastic rounding (seeded, the same bits on every device) rounds up with probability
equal to the discarded fraction: unbiased on average, so its RMSE is larger than
nearest-even's but its errors do not accumulate in one direction. fp8 (e4m3fn) shows how
much precision a chain loses with 3 mantissa bits.
"""),
    ("code", """
sr = study.run(chains=["swiglu"], dtypes=["bfloat16", "float8_e4m3fn"], quick=True,
               policies=["eager", "fused"], rounding=["nearest", "stochastic"],
               extra_presets={}, device=device)
sr[["dtype", "policy", "rounding", "correctly_rounded", "rel_rmse", "max_ulp"]]
"""),
    ("code", """
again = study.run(chains=["swiglu"], dtypes=["bfloat16", "float8_e4m3fn"], quick=True,
                  policies=["eager", "fused"], rounding=["nearest", "stochastic"],
                  extra_presets={}, device=device)
pd.testing.assert_frame_equal(sr, again)   # reproducible, stochastic rows included
bf = sr[sr.dtype == "bfloat16"]
near = bf[(bf.policy == "fused") & (bf.rounding == "nearest")].iloc[0]
sto = bf[(bf.policy == "fused") & (bf.rounding == "stochastic")].iloc[0]
print(f"fused bf16: nearest rel RMSE {near.rel_rmse:.3e}, stochastic {sto.rel_rmse:.3e}")
assert sto.rel_rmse > near.rel_rmse
f8 = sr[sr.dtype == "float8_e4m3fn"]
assert (f8.rel_rmse > bf.rel_rmse.max()).all()
"""),
    ("code", """
fig, ax = plt.subplots(figsize=(7, 3))
lab = sr.dtype + " " + sr.policy + " " + sr.rounding
ax.barh(lab, sr.rel_rmse)
ax.set_xscale("log"); ax.set_xlabel("relative RMSE vs fp64")
fig.tight_layout()
"""),
]

NOTEBOOKS = {
    "01_bf16_rounding.ipynb": NB01,
    "02_eager_vs_fused.ipynb": NB02,
    "03_torch_interop.ipynb": NB03,
    "04_ab_study.ipynb": NB04,
}
