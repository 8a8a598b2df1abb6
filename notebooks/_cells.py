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
print("same pointer:", t.data_ptr() == a.ctypes.data)
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
# 02 · Eager vs fused: the Qwen2 story

HF Qwen2 gives a slightly different loss under Thunder (or torch.compile) than eager. The
drift comes from SwiGLU (`act_fn(gate_proj(x)) * up_proj(x)` in the MLP) and RoPE
(`q*cos + rotate_half(q)*sin`): eager rounds every intermediate to bf16, the fusers round
once. Which one is right?

This notebook starts from a PyTorch module, takes the activations that feed those two
functions, hands them to castlab without a copy, and compares eager and fused with an fp64
reference.
"""),
    ("md", """
## A Qwen2-like block in plain PyTorch

The parts of a Qwen2 decoder layer that matter here, written as Hugging Face writes them:
the MLP (`gate_proj`, `up_proj`, `down_proj`, SiLU), the rotary embedding
(`Qwen2RotaryEmbedding`: fp32 inverse frequencies and angles, cos/sin cast to the
activations' dtype) and the query projection it rotates. Sizes of Qwen2-0.5B (hidden 896,
14 heads of 64, intermediate 4864, `rope_theta` 1e6); random weights, bf16.
"""),
    ("code", """
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import castlab as cl
import castlab.numerics as nm
import castlab.plot as cplot


class Qwen2MLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Qwen2RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=1000000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv_freq @ position_ids[:, None, :].float()).transpose(1, 2)  # positions x inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)                 # fp32, then bf16


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class Qwen2Block(nn.Module):
    \"\"\"RoPE on the query projection and the SwiGLU MLP (attention and norms left out).\"\"\"

    def __init__(self, hidden_size=896, num_heads=14, intermediate_size=4864):
        super().__init__()
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=True)
        self.rotary_emb = Qwen2RotaryEmbedding(self.head_dim)
        self.mlp = Qwen2MLP(hidden_size, intermediate_size)

    def forward(self, hidden_states, position_ids):
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q_embed = (q * cos) + (rotate_half(q) * sin)           # HF apply_rotary_pos_emb
        return q_embed, self.mlp(hidden_states)
"""),
    ("md", """
Run it on seeded random hidden states and keep, with forward hooks, the activations that
feed SwiGLU (`gate`, `up`) and RoPE (`q`, `cos`, `sin`), shaped as the module uses them.
"""),
    ("code", """
device = "cuda" if torch.cuda.is_available() and cl.cuda.is_available() else "cpu"
torch.manual_seed(0)
block = Qwen2Block().to(torch.bfloat16).eval()
hidden_states = torch.randn(1, 256, 896).to(torch.bfloat16)    # drawn on the CPU
block, hidden_states = block.to(device), hidden_states.to(device)
position_ids = torch.arange(hidden_states.shape[1], device=device)[None]

acts = {}
for name in ("q_proj", "rotary_emb", "mlp.gate_proj", "mlp.up_proj"):
    block.get_submodule(name).register_forward_hook(
        lambda mod, inp, out, name=name: acts.__setitem__(name, out))
with torch.no_grad():
    q_embed_torch, mlp_out = block(hidden_states, position_ids)

b, s, _ = hidden_states.shape
gate, up = acts["mlp.gate_proj"], acts["mlp.up_proj"]                       # [batch, seq, 4864]
q = acts["q_proj"].view(b, s, -1, block.head_dim).transpose(1, 2)           # [batch, heads, seq, head_dim]
cos, sin = (t.unsqueeze(1) for t in acts["rotary_emb"])                     # [batch, 1, seq, head_dim]
with torch.no_grad():
    swiglu_torch = F.silu(gate) * up                                        # what the MLP computes
print("device:", device)
for k, t in {"gate": gate, "up": up, "q": q, "cos": cos, "sin": sin}.items():
    print(f"{k:4} {str(list(t.shape)):20} {t.dtype}  stride {t.stride()}")
"""),
    ("md", """
## Into castlab, zero-copy

`cl.from_dlpack` wraps the torch tensors: same memory, same strides (`q` stays the
transposed view of the projection's output). The two functions are written with public
castlab ops only: `cl.silu`, `cl.cat` and slicing.
"""),
    ("code", """
torch_args = {"gate": gate, "up": up, "q": q, "cos": cos, "sin": sin}
x = {k: cl.from_dlpack(t) for k, t in torch_args.items()}
for k, t in torch_args.items():
    same = x[k].data_ptr() == t.data_ptr()
    print(f"{k:4} castlab {x[k].dtype.name} {list(x[k].shape)} stride {x[k].stride()}  same pointer as torch: {same}")
    assert same and x[k].stride() == t.stride()


@cl.jit
def swiglu(gate, up):
    return cl.silu(gate) * up


def cl_rotate_half(x):
    half = x.shape[-1] // 2
    return cl.cat([-x[..., half:], x[..., :half]], dim=-1)


@cl.jit
def rope(q, cos, sin):
    return q * cos + cl_rotate_half(q) * sin


swiglu_args, rope_args = (x["gate"], x["up"]), (x["q"], x["cos"], x["sin"])
print(swiglu.trace(*swiglu_args, policy="eager"))
print(swiglu.trace(*swiglu_args, policy="fused"))
"""),
    ("md", """
castlab's `eager` policy is PyTorch eager: on the same tensors it gives the same bits as
torch's `F.silu(gate) * up` and as the block's own `q*cos + rotate_half(q)*sin`.
"""),
    ("code", """
out = {name: {pol: fn.run(*args, policy=pol) for pol in ("eager", "fused", "fp64")}
       for name, fn, args in [("swiglu", swiglu, swiglu_args), ("rope", rope, rope_args)]}
torch_eager = {"swiglu": swiglu_torch, "rope": q_embed_torch}
for name, t in torch_eager.items():
    e = torch.from_dlpack(out[name]["eager"])
    f = torch.from_dlpack(out[name]["fused"])
    n_eager = (e.view(torch.int16) != t.view(torch.int16)).sum().item()
    n_fused = (f.view(torch.int16) != t.view(torch.int16)).sum().item()
    print(f"{name}: castlab eager vs torch eager: {n_eager} of {t.numel()} differ; "
          f"castlab fused vs torch eager: {n_fused} differ")
    assert n_eager == 0 and n_fused > 0
"""),
    ("md", "## Eager vs fused vs fp64"),
    ("code", """
res = {name: nm.compare(o["eager"], o["fused"], ref=o["fp64"], names=["eager", "fused"])
       for name, o in out.items()}
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
    assert d["fused"]["correctly_rounded"] > 0.999 > 0.9 > d["eager"]["correctly_rounded"]
    assert d["fused"]["rel_rmse"] < d["eager"]["rel_rmse"]
    assert d["fused"]["same"]
"""),
    ("md", """
PyTorch's own accuracy gate (`torch._dynamo.utils.same`, RMSE to fp64 at most 3x the
baseline's for bf16) accepts the fused result: it is *closer* to fp64 than eager. Fused
is correctly rounded almost everywhere; eager is not, and RoPE eager has elements that
are far off.

## RoPE eager's worst element
"""),
    ("code", """
u = res["rope"].ulp_errors["eager"]                  # per element: |eager - fp64| in ulps
worst = tuple(int(i) for i in np.unravel_index(np.argmax(u), u.shape))
print(f"worst element {worst}: eager is {u[worst]:.0f} ulps from fp64, "
      f"fused {res['rope'].ulp_errors['fused'][worst]:.2f}")
assert u[worst] > 100 and res["rope"].ulp_errors["fused"][worst] <= 0.5
e = nm.explain(rope, rope_args, worst)
print(e)
"""),
    ("md", """
**Why so many ulps: cancellation.** At this element `q*cos` and `rotate_half(q)*sin` are
two numbers of about the same size and opposite sign, so their sum is tiny. Eager rounds
each product to bf16 first: each rounding can move a product by up to half an ulp *of the
product* (a bf16 ulp is 2^-9, about 0.002, for a product near 0.3). Those errors survive
the sum, but the sum's ulp is that of the tiny exact result, hundreds or thousands of times
smaller. The error is small
in absolute terms (a few thousandths) and huge relative to the result. Fused keeps the
products in fp32 and rounds the sum once: correctly rounded. The cell below checks this
with the element's numbers.
"""),
    ("code", """
def bf16(v):
    return torch.tensor(v, dtype=torch.float64).to(torch.bfloat16).double().item()


def ulp_bf16(v):
    return nm.ulp(cl.tensor([v], dtype=cl.float64), cl.bfloat16).tolist()[0]


with torch.no_grad():
    p_cos = (q.double() * cos.double())[worst].item()              # exact products (fp64)
    p_sin = (rotate_half(q.double()) * sin.double())[worst].item()
exact = p_cos + p_sin
eager_value = bf16(bf16(p_cos) + bf16(p_sin))       # each product rounded, then the sum
print(f"q*cos               = {p_cos:+.10f}  -> bf16 {bf16(p_cos):+.10f}  (ulp {ulp_bf16(p_cos):.2e})")
print(f"rotate_half(q)*sin  = {p_sin:+.10f}  -> bf16 {bf16(p_sin):+.10f}  (ulp {ulp_bf16(p_sin):.2e})")
print(f"exact sum           = {exact:+.10f}  (ulp {ulp_bf16(exact):.2e}); "
      f"cancellation factor (|a|+|b|)/|a+b| = {(abs(p_cos) + abs(p_sin)) / abs(exact):.0f}")
print(f"eager sum           = {eager_value:+.10f}: off by {abs(eager_value - exact):.2e} "
      f"= {abs(eager_value - exact) / ulp_bf16(exact):.0f} ulps of the exact sum")
assert np.sign(p_cos) != np.sign(p_sin) and abs(exact) < abs(p_cos) / 100
assert eager_value == out["rope"]["eager"][worst].item() == q_embed_torch[worst].item()
assert abs(eager_value - exact) / ulp_bf16(exact) == u[worst]
assert abs(eager_value - exact) <= (ulp_bf16(p_cos) + ulp_bf16(p_sin)) / 2
"""),
    ("md", """
The same holds for every element. Each product's rounding errs by at most half an ulp of
the product, at most `|a|` (or `|b|`) times 2^-8, and an ulp of the result is more than
`|a+b|` times 2^-8; so eager's error, in ulps of the result, stays below the cancellation
factor `(|a|+|b|)/|a+b|` plus one (for the final rounding). Large errors need cancellation.
"""),
    ("code", """
import matplotlib.pyplot as plt

with torch.no_grad():
    a64, b64 = q.double() * cos.double(), rotate_half(q.double()) * sin.double()
    factor = ((a64.abs() + b64.abs()) / (a64 + b64).abs()).cpu().numpy()
big = u > 4
print(f"{big.sum()} elements with eager error > 4 ulps; smallest cancellation factor among "
      f"them: {factor[big].min():.1f}; largest eager error where the factor is < 2: "
      f"{u[factor < 2].max():.2f} ulps; largest (error - factor): {np.nanmax(u - factor):.2f}")
assert not np.any(u > factor + 1)          # NaN factor (0/0): both products 0, error 0
assert factor[big].min() > 3 and u[factor < 2].max() < 3

fig, ax = plt.subplots(figsize=(6, 3.5))
ok = np.isfinite(factor) & (u > 0)
ax.loglog(factor[ok], u[ok], ",", alpha=0.5)
ax.plot(factor[worst], u[worst], "o", mfc="none", color="red", label=f"worst element {worst}")
ax.set_xlabel("cancellation factor (|a|+|b|) / |a+b|")
ax.set_ylabel("eager error vs fp64 (ulps)")
ax.set_title("RoPE eager: q*cos + rotate_half(q)*sin")
ax.legend()
fig.tight_layout()
"""),
    ("md", """
## Where does the drift start?
`drift` evaluates every node of the trace under each policy and compares it with the
fp64 graph.
"""),
    ("code", """
dr = nm.drift(swiglu, swiglu_args, policies=("eager", "fused"))
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

NB05 = [
    ("md", """
# 05 · Training: where the gradients are rounded

A training step runs the backward too. PyTorch **eager** autograd saves the forward's
activations in bf16 and rounds the result of every backward op to bf16 (its fused
backward kernels such as `silu_backward` compute in fp32 and round once);
**torch.compile** (AOTAutograd + Inductor, castlab's `fused`) recomputes what the backward
needs in fp32 and rounds each gradient once. A third placement keeps the saved
activations in fp32 but still rounds every backward op:
`cl.Policy("saved_fp32", round_after=("backward",))`. Which placement gives gradients
closest to fp64? SwiGLU and RoPE in bf16, on the CPU.
"""),
    ("code", """
import numpy as np
import torch
import torch.nn.functional as F

import castlab as cl
import castlab.numerics as nm
import castlab.plot as cplot
from castlab.study import CHAINS


@cl.jit
def swiglu(a, b):
    return cl.silu(a) * b


rope = cl.jit(CHAINS["rope"].fn)          # x*cos + cat(-x2, x1)*sin, cos/sin broadcast
a = cl.randn(1024, 1024, seed=0, dtype=cl.bfloat16)
b = cl.randn(1024, 1024, seed=1, dtype=cl.bfloat16)
dy = cl.randn(1024, 1024, seed=2, dtype=cl.bfloat16)           # the incoming gradient
q, cos, sin = CHAINS["rope"].make_inputs((1, 8, 256, 128), cl.bfloat16, 0, "normal", 1.0, "cpu")
dout = cl.randn(1, 8, 256, 128, seed=3, dtype=cl.bfloat16)

swiglu_bwd = swiglu.backward_fn()             # (a, b, dy) -> (da, db)
rope_bwd = rope.backward_fn(argnums=0)        # (q, cos, sin, dout) -> (dq,): not cos/sin
saved_fp32 = cl.Policy("saved_fp32", round_after=("backward",))
POLICIES = {"eager": "eager", "fused": "fused", "saved_fp32": saved_fp32}
"""),
    ("md", """
## The backward under eager, op by op

The trace shows the forward phase (the activations the backward reads) and then the
backward. Under eager the saved `silu(a)` is rounded to bf16 (`t0_bf16`) and `db = dy *
silu(a)` reads that rounded value; `dy * b` is rounded before it enters `silu_backward`,
whose inner ops (`neg exp add div sub mul`) are one PyTorch kernel computing in fp32 and
rounding only its result (`silu_backward#1 result`, then one convert to bf16).
"""),
    ("code", """
tr = swiglu_bwd.trace(a, b, dy, policy="eager")
print(tr)
assert "t0_bf16 = convert(t0, bf16)" in tr and "silu_backward#1 result" in tr
"""),
    ("md", "Under `fused` nothing is rounded before the two gradients:"),
    ("code", """
print(swiglu_bwd.trace(a, b, dy, policy="fused"))
"""),
    ("md", """
## Each gradient against fp64

Run the three placements and the fp64 reference, and compare each gradient with the
fp64 gradient (`ref=`).
"""),
    ("code", """
grads = {}
for name, pol in POLICIES.items():
    da, db = swiglu_bwd.run(a, b, dy, policy=pol)
    (dq,) = rope_bwd.run(q, cos, sin, dout, policy=pol)
    grads[name] = {"da": da, "db": db, "dq": dq}
da64, db64 = swiglu_bwd.run(a, b, dy, policy="fp64")
(dq64,) = rope_bwd.run(q, cos, sin, dout, policy="fp64")
ref = {"da": da64, "db": db64, "dq": dq64}
cmp = {g: nm.compare({p: grads[p][g] for p in POLICIES}, ref=ref[g]) for g in ref}
cmp["da"]
"""),
    ("code", """
cmp["db"]
"""),
    ("code", """
cmp["dq"]
"""),
    ("md", """
## Eager is PyTorch eager autograd, bit for bit

`torch.autograd.grad` on the CPU, in bf16, with the same inputs and incoming gradients:
"""),
    ("code", """
at = torch.from_dlpack(a).clone().requires_grad_()
bt = torch.from_dlpack(b).clone().requires_grad_()
t_da, t_db = torch.autograd.grad(F.silu(at) * bt, (at, bt), torch.from_dlpack(dy))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


qt = torch.from_dlpack(q).clone().requires_grad_()
ct, st = torch.from_dlpack(cos), torch.from_dlpack(sin)
(t_dq,) = torch.autograd.grad(qt * ct + rotate_half(qt) * st, (qt,), torch.from_dlpack(dout))

mismatches = {}
for g, t in [("da", t_da), ("db", t_db), ("dq", t_dq)]:
    mine = torch.from_dlpack(grads["eager"][g])
    mismatches[g] = int((mine.view(torch.int16) != t.view(torch.int16)).sum())
print("bits differing from torch.autograd (eager):", mismatches)
assert mismatches == {"da": 0, "db": 0, "dq": 0}
"""),
    ("md", """
## One element where eager and fused disagree

The first element of `da` where the eager and fused gradients differ, explained: the exact
value, the two bf16 neighbours, and each placement's value before its last rounding.
"""),
    ("code", """
e, f = grads["eager"]["da"].numpy(), grads["fused"]["da"].numpy()
idx = tuple(int(i) for i in np.argwhere(e != f)[0])
print("first differing index of da:", idx)
ex = nm.explain(swiglu_bwd, (a, b, dy), idx, policies=tuple(POLICIES.values()), output=0)
print(ex)
assert all(o.consistent for o in ex.outcomes)
"""),
    ("md", "## How far each placement is from fp64"),
    ("code", """
summary = {}
for g, c in cmp.items():
    d = c.to_dict()
    summary[g] = {p: (d[p]["correctly_rounded"], d[p]["rel_rmse"], d[p]["mismatch_fraction"])
                  for p in POLICIES}
    print(g + ":  " + ";  ".join(
        f"{p} {100 * cr:.4f}% correctly rounded, rel RMSE {rr:.3e}, "
        f"{100 * mm:.2f}% differ from eager" for p, (cr, rr, mm) in summary[g].items()))
for g in summary:
    assert summary[g]["fused"][0] > 0.999 > 0.8 > summary[g]["eager"][0]
    assert summary[g]["fused"][1] < summary[g]["eager"][1]
# keeping the saved activations in fp32 changes only db (= dy * silu(a)): da and dq
# never read a saved activation that eager rounds
assert summary["db"]["saved_fp32"][:2] == summary["db"]["fused"][:2]
assert summary["da"]["saved_fp32"][2] == 0.0 and summary["dq"]["saved_fp32"][2] == 0.0
"""),
    ("code", """
cplot.ulp_histogram(cmp["da"])
"""),
    ("code", """
cplot.ulp_histogram(cmp["dq"])
"""),
    ("md", """
## Conclusion

- **fused** (torch.compile-style: recompute in fp32, round each gradient once) is the
  placement closest to fp64 for every gradient: 99.998% of `da`, 99.999% of `db` and
  100% of `dq` correctly rounded, with a relative RMSE of 1.65e-3 to 1.66e-3 (one bf16
  rounding), against 72.4% to 74.3% and 2.27e-3 to 2.41e-3 for **eager**. Eager is exactly
  PyTorch eager autograd (0 differing bits in `da`, `db`, `dq`).
- **saved activations in fp32** only fixes `db = dy * silu(a)`, the one gradient that
  reads a saved activation eager rounds: its `db` is the fused `db`, while its `da` and
  `dq` are bit-identical to eager's (0% differ from eager). The error in `da` comes from
  `dy * b` rounded to bf16 before `silu_backward` (in the explained element, `t2 = mul(dy,
  b)` is 1.8125 under eager instead of 1.815673828125), and in
  `dq` from rounding `dout * cos`, `dout * sin` and their sum; storing activations in
  fp32 does not touch those roundings. Only fusing the backward (one rounding per
  gradient) removes them.
"""),
]

NB06 = [
    ("md", """
# 06 · Attribution: which factor flipped each bit

Two configurations of one graph give different bits. Between them only named factors
change: after which nodes the policy rounds (or, in fp32, where a kernel ends), and the
math variant's fields (silu formula, FMA contraction, ...). `nm.attribute(fn, args, a=,
b=)` switches those factors from A's setting to B's, alone, then in pairs and triples,
and gives every differing element the smallest set whose switch reproduces B's bits,
with the fp64 verdict: did B move **toward** the exact value, **away** from it, or is it
a **tie** (A and B are the two neighbours of an exact value on their midpoint)?

The stories of notebooks 01, 02 and 05, attributed. Everything runs on the CPU.
"""),
    ("code", """
import torch

import castlab as cl
import castlab.numerics as nm
from castlab.study import CHAINS

swiglu = cl.jit(CHAINS["swiglu"].fn)      # a, b = chunk(x, 2, -1); silu(a) * b
rope = cl.jit(CHAINS["rope"].fn)          # x*cos + cat(-x2, x1)*sin (HF rotate_half)
"""),
    ("md", """
## 1 · The formula-order tie: inductor vs transformer_engine

Inductor computes `silu(a) = a / (1 + exp(-a))`, Transformer Engine `a * sigmoid(a)`.
On this input the two fused SwiGLUs differ in exactly one bf16 element:
"""),
    ("code", """
torch.manual_seed(1234)
x = cl.from_dlpack(torch.rand(512, 256).to(torch.bfloat16))
att = nm.attribute(swiglu, (x,), a=("fused", "inductor"), b=("fused", "transformer_engine"))
att
"""),
    ("code", """
print(att)
e = att.element(0)
print(e)
assert len(att.indices) == 1 and att.unexplained == 0
assert e["index"] == (456, 127) and e["factors"] == "math silu" and e["verdict"] == "tie"
"""),
    ("md", """
The math fields `sigmoid` and `division` differ too, but only on the GPU (fast `ex2`,
approximate division): on the CPU they are listed as having no effect. `explain(0)`
shows the element itself: the exact value lies 2.6e-5 ulp above the bf16 midpoint;
Inductor's fp32 value lands just above it and rounds up, Transformer Engine's lands *on*
it and the tie rounds to even, down. Neither formula is wrong: this is a tie.
"""),
    ("code", """
ex = att.explain(0)
print(ex)
assert str(ex).splitlines()[1] == "attribution: math silu (tie)"
"""),
    ("md", """
## 2 · The Qwen2 story: eager vs fused in bf16

SwiGLU `[256, 2*1024]` and HF RoPE `[1, 4, 256, 64]` (batch, heads, sequence, head
dim; cos/sin the fp32 tables HF builds, stored in bf16), eager vs fused:
"""),
    ("code", """
(xs,) = CHAINS["swiglu"].make_inputs((256, 2 * 1024), cl.bfloat16, 0, "normal", 1.0, "cpu")
q, cos, sin = CHAINS["rope"].make_inputs((1, 4, 256, 64), cl.bfloat16, 0, "normal", 1.0, "cpu")
att_sw = nm.attribute(swiglu, (xs,), a="eager", b="fused")
att_rope = nm.attribute(rope, (q, cos, sin), a="eager", b="fused")
print(att_sw.verdict)
att_sw.summary()
"""),
    ("code", """
print(att_rope.verdict)
att_rope.summary()
"""),
    ("md", """
Only one factor acts in SwiGLU: eager's rounding of `silu(a)` to bf16 before the
product. In RoPE it is the rounding of the two products `x*cos` (t2) and
`rotate_half(x)*sin` (t5); some elements need both removed. The rounding after `neg`
is a factor too (eager rounds it, fused does not) but never explains anything: negation
is exact.
"""),
    ("code", """
for a_ in (att_sw, att_rope):
    assert a_.unexplained == 0
    names = {a_.set_name(s) for s, _ in a_._groups()}
    print(f"{a_.fn_name}: factor sets {sorted(names)}")
assert {att_sw.set_name(s) for s, _ in att_sw._groups()} == {"rounding after silu (t2)"}
assert all("rounding after mul" in att_rope.set_name(s) and "neg" not in att_rope.set_name(s)
           for s, _ in att_rope._groups())
for a_ in (att_sw, att_rope):
    t, n = int((a_.verdicts == "toward").sum()), len(a_.indices)
    print(f"{a_.fn_name}: fused moves toward fp64 in {t:,} of {n:,} differing elements "
          f"({100 * t / n:.2f}%), ties {int((a_.verdicts == 'tie').sum())}, "
          f"away {int((a_.verdicts == 'away').sum())}")
    assert t > 0.99 * n and not (a_.verdicts == "away").any()
"""),
    ("code", """
att_rope.plot()
"""),
    ("md", """
## 3 · RoPE in fp32: a pair of factors

In fp32 there is nothing to round between ops (the op-math is fp32), so eager and fused
give the same bits. Inductor's math contracts `x*cos + r` into one FMA (the product is
kept exact). Attribute eager against fused+inductor:
"""),
    ("code", """
q32, cos32, sin32 = CHAINS["rope"].make_inputs((1, 4, 256, 64), cl.float32, 0, "normal", 1.0,
                                               "cpu")
args32 = (q32, cos32, sin32)
att32 = nm.attribute(rope, args32, a=("eager", "torch_eager"), b=("fused", "inductor"))
print(att32)
(s32, g32), = att32._groups()
assert att32.unexplained == 0
assert {att32.factors[i].name for i in s32} == {"kernel boundary after mul (t2)", "math fma"}
"""),
    ("md", """
Every differing element needs **both** factors: the kernel boundary after `x*cos` (t2)
*and* the FMA contraction. Each alone changes no bit. Fusing without the FMA removes a
store of an fp32 product to fp32 memory, which rounds nothing. Turning the FMA on under
the eager placement contracts nothing: `x*cos` is its own kernel, so the add reads the
product back from memory, already rounded. Only in one kernel, with contraction on, is
the product kept exact inside `fma(x, cos, r)`. (The boundary after `rotate_half(x)*sin`,
t5, is not needed: that product is the FMA's addend, rounded either way.)
"""),
    ("code", """
for a_, b_ in [(("eager", "torch_eager"), ("fused", "torch_eager")),
               (("eager", "torch_eager"), ("eager", "inductor"))]:
    v = nm.attribute(rope, args32, a=a_, b=b_)
    print(v.verdict)
    assert len(v.indices) == 0
print(rope.trace(*args32, policy="fused", math="inductor"))
"""),
    ("md", """
One rounding fewer is not always closer here: `x*cos + r` cancels where the two terms
are nearly opposite, and there the FMA's single rounding can land farther from fp64 than
the two roundings of eager. The verdict counts them:
"""),
    ("code", """
print(f"toward {g32['toward']:,}, away {g32['away']:,}, suspicious {g32['suspicious']:,} "
      f"of {g32['n']:,} differing elements ({100 * g32['n'] / att32.total:.1f}% of the output)")
assert g32["toward"] > g32["away"] > 0
"""),
    ("md", """
## 4 · A gradient

`backward_fn()` is a graph too. The SwiGLU backward `(a, b, dy) -> (da, db)` in bf16,
eager (PyTorch autograd, bit for bit: notebook 05) vs fused, for `da` (`output=0`):
"""),
    ("code", """
@cl.jit
def swiglu2(a, b):
    return cl.silu(a) * b


bwd = swiglu2.backward_fn()
a = cl.randn(256, 1024, seed=0, dtype=cl.bfloat16)
b = cl.randn(256, 1024, seed=1, dtype=cl.bfloat16)
dy = cl.randn(256, 1024, seed=2, dtype=cl.bfloat16)
att_da = nm.attribute(bwd, (a, b, dy), a="eager", b="fused", output=0)
print(att_da)
(s_da, g_da), = att_da._groups()
assert att_da.unexplained == 0 and att_da.set_name(s_da) == "rounding after mul (t2)"
"""),
    ("md", """
The one factor is the rounding of `dy * b` (t2 in the backward trace) before it enters
`silu_backward`. The other two differ between the placements but explain nothing in `da`:
the saved `silu(a)` (t0) is read only by `db = dy * silu(a)`, and the forward product
(t1) is not even computed.
"""),
    ("code", """
print(bwd.trace(a, b, dy, policy="eager"))
att_da.plot()
"""),
    ("md", "## Conclusion"),
    ("code", """
n1 = len(att.indices)
print(f"1. inductor vs transformer_engine: {n1} element, {att.element(0)['index']}, "
      f"by {att.element(0)['factors']}, verdict {att.element(0)['verdict']}")
for a_ in (att_sw, att_rope, att_da):
    t, n = int((a_.verdicts == "toward").sum()), len(a_.indices)
    print(f"2/4. {a_.fn_name} eager vs fused: {n:,} of {a_.total:,} differ; toward fp64 "
          f"{100 * t / n:.2f}%, ties {int((a_.verdicts == 'tie').sum())}, away "
          f"{int((a_.verdicts == 'away').sum())}, unexplained {a_.unexplained}")
print(f"3. rope fp32 eager vs fused+inductor: {g32['n']:,} differ, all by "
      f"{att32.set_name(s32)}; toward {g32['toward']:,}, away {g32['away']:,}")
assert n1 == 1
assert all(a_.unexplained == 0 for a_ in (att, att_sw, att_rope, att32, att_da))
"""),
    ("md", """
- **The tie** (1): the single differing element of inductor vs transformer_engine,
  `[456, 127]`, is attributed to the silu formula alone (`math silu`: `div` vs
  `mul_sigmoid`), and it is a tie at a midpoint: neither preset is more accurate.
- **Eager vs fused in bf16** (2): every differing element is explained by eager's
  intermediate roundings: after `silu` in SwiGLU (72,082 of 262,144 elements), after the
  two products in RoPE (17,761 of 65,536). Fused moves toward fp64 for 99.97% and 99.75%
  of them; the rest are ties at midpoints (25 and 44), none moves away. The same holds
  for the gradient `da` (4): 67,550 elements, all by the rounding of `dy * b`, 99.99%
  toward fp64, 9 ties.
- **FMA in fp32** (3): a difference can need two factors together. RoPE's FMA acts only
  where the kernel boundary after `x*cos` is gone; of the 16,538 elements it changes it
  moves 13,652 toward fp64 and 2,886, where the sum cancels, away.
- No element in any of these attributions is unexplained.
"""),
]

NB07 = [
    ("md", """
# 07 · Proof by exhaustion

Random samples say "fused SwiGLU is correctly rounded for 99.99% of these elements".
`cl.numerics.exhaustive` says it for *every* input: it enumerates the cross product of
the inputs' bit patterns by index, runs each configuration (policy x math) -- the very
Programs `cl.jit` lowers the chain to -- and the fp64 reference on them, and reduces the
results to counts: exact / correctly rounded / 1 ulp / >1 ulp / NaN mismatch, a histogram
of ulp errors, the worst input, and for each pair of configurations the inputs where they
differ and how far those lie from a rounding midpoint.

This notebook runs on the CPU (2 cores in CI), so the binary chain below enumerates a
stated part of the 2**32 bf16 pairs; `castlab exhaustive swiglu --allow-long` does all.
"""),
    ("code", """
import matplotlib.pyplot as plt
import numpy as np

import castlab as cl
from castlab import numerics as nm
from castlab.numerics import Enumeration
"""),
    ("md", "## 1 · Every bf16 input of a unary chain"),
    ("code", """
configs = [("eager", "torch_eager"), ("fused", "torch_eager"), ("eager", "portable"),
           ("fused", "portable")]
silu_x = nm.exhaustive(lambda x: cl.silu(x) * x, [cl.bfloat16], configs)
print(silu_x)
rows = silu_x.rows
assert silu_x.n == 65536
assert rows["fused/torch_eager"]["correctly_rounded"] > rows["eager/torch_eager"]["correctly_rounded"]
assert all(sum(r[k] for k in ("correctly_rounded", "one_ulp", "over_one_ulp", "nan_mismatch"))
           == 65536 for r in rows.values())
assert all(r["over_one_ulp"] == 25 and r["max_error_inputs"] == (2.0 ** 64,) for r in rows.values())
"""),
    ("md", """
The 25 inputs `>1 ulp` away are x = -89 ... -101: there `exp(-x)` overflows fp32 (and
bf16), so `x / (1 + exp(-x))` gives -0, while the exact `x * silu(x)` (about 1e-35) is a
normal bf16 value; every policy shares them, since the overflow happens in fp32. The
infinite maximum is a correctly rounded result: for x = 2**64, `x * x` = 2**128 is finite
in fp64 but rounds to inf in bf16, and inf is infinitely many ulps from the finite
reference. The worst input shown is the smallest index with the largest error.
"""),
    ("md", """
## 2 · SwiGLU: Inductor vs TransformerEngine, pair by pair

Inductor computes `silu(a) * b` as `a / (1 + exp(-a)) * b`, TransformerEngine as
`(a * sigmoid(a)) * b`; both in fp32, rounded once. In how many bf16 pairs do they
disagree, and are those midpoint ties? Enumerated here: every finite bf16 `a`
(65,280 values) times every `b` in [0.5, 1) (bit patterns 0x3F00..0x3F7F: 128 values),
8,355,840 pairs.
"""),
    ("code", """
swiglu = lambda a, b: cl.silu(a) * b
pairs = nm.exhaustive(swiglu, [Enumeration.finite(cl.bfloat16), Enumeration.bits(cl.bfloat16, 0x3F00, 0x3F80)],
                      [("fused", "inductor"), ("fused", "transformer_engine"), ("fused", "torch_eager"),
                       ("eager", "torch_eager")])
print(pairs)
"""),
    ("code", """
ind_te = pairs.pairs[("fused/inductor", "fused/transformer_engine")]
print(ind_te)
for d in pairs.differing("fused/inductor", "fused/transformer_engine"):
    print(d)
assert pairs.n == 65280 * 128
assert ind_te["differ"] == 1 and ind_te["differ_at_ties"] == 0
assert ind_te["max_tie_distance"] < 2 ** -15
assert pairs.differing("fused/inductor", "fused/transformer_engine")[0]["bits"] == ["0x3F49", "0x3F5F"]
"""),
    ("md", """
One pair in 8.4 million: `a = 0.78515625, b = 0.87109375`, the element of the formula-order
investigation in DESIGN.md. Its exact value is not on a midpoint (`differ_at_ties` 0) but
within 2.6e-5 ulps of one (`max_tie_distance`): close enough that the last bit of the two
fp32 formulas decides the rounding. Every disagreement of the two presets is a near tie,
so neither is more accurate than the other.

All 2**32 pairs, measured once outside this notebook (`castlab exhaustive swiglu --math
inductor,transformer_engine --policy fused --allow-long`, 437 s on 2 CPU cores): the two
formulas differ in 608 pairs, none with the exact value on a midpoint, all within
2.6e-5 ulps of one; fused/inductor is correctly rounded for 4,288,444,938 pairs (99.85%),
fused/transformer_engine for 4,288,444,530.

On the CPU, the `inductor` and `transformer_engine` presets use castlab's portable `expf`
as a stand-in for CUDA's and IEEE division (the approximate division is GPU-only; the
traces say so), so these counts describe the formulas, not the GPU kernels; the GPU run
of the same call gives the GPU's.
"""),
    ("md", """
How far to trust the labels: the reference is computed in fp64 with castlab's portable
functions, which are within 2 fp64 ulps but not correctly rounded, so the reference can be
a few fp64 ulps off the exact value. That matters only where it lies within that distance
of a bf16 midpoint: `near_ties` counts those inputs (within 256 fp64 ulps, exact midpoints
included); for every other input the labels hold against the exact value. Here the exact
midpoints are mostly pairs with large `a`, where `1 + exp(-a)` is 1 in fp64, so the fp64
reference is the exact product `a * b` of two bf16 values while the exact value is a hair
smaller in magnitude.
"""),
    ("code", """
print(f"{pairs.ties:,} references exactly on a midpoint, {pairs.near_ties:,} within 256 fp64 ulps "
      f"of one: the labels of {100 * pairs.near_ties / pairs.n:.2f}% of the pairs are not certified")
assert pairs.ties <= pairs.near_ties < pairs.n // 50
"""),
    ("md", "## 3 · Where the errors are"),
    ("code", """
edges = nm.HIST_EDGES
labels = ["0", "<2^-8"] + [f"2^{int(np.log2(e))}" for e in edges[2:]]
fig, ax = plt.subplots(figsize=(9, 3.2))
for k, r in pairs.rows.items():
    h = np.array(r["hist"], dtype=float)
    ax.step(np.arange(len(h)), np.maximum(h, 0.5), where="mid", label=k)
ax.set_yscale("log")
ax.set_xticks(np.arange(0, len(labels), 4), labels[::4], rotation=45)
ax.set_xlabel("ulp error |x - r| / ulp(r) (bin lower edge)")
ax.set_ylabel("pairs")
ax.legend(fontsize=8)
ax.set_title("SwiGLU, every finite bf16 a x b in [0.5, 1)")
plt.tight_layout()
fused = pairs.rows["fused/torch_eager"]["hist"]
eager = pairs.rows["eager/torch_eager"]["hist"]
# fused errors stop at half an ulp except where fp32 itself fails (exp overflow)
assert sum(fused[2 + 7 + 1:]) < sum(eager[2 + 7 + 1:])
"""),
    ("md", """
## 4 · Testing your own kernel

`castlab.testing` turns the same enumeration into a test for a kernel you wrote:
`assert_kernel_matches` calls your kernel (any callable on torch tensors: a Triton
launcher, a CUDA extension, a torch function) on every input, chunk by chunk, through
DLPack without copies, and fails with a report unless it equals the reference bit for bit
(or within `max_ulp`). On a GPU `mode="exhaustive"` visits all 2**32 bf16 pairs; on this
CPU a stated sample: every gate value `a` times 64 sampled up values `b`.

The kernel below is a fused SwiGLU in PyTorch: fp32 inside, one rounding. It is
torch.compile's formula, so it passes against the `fused/inductor` configuration of
PyTorch's SwiGLU, and fails against Liger's kernel, which rounds `silu(a)` first.
"""),
    ("code", """
import torch

from castlab.testing import KernelMismatch, assert_kernel_matches, bounds


def my_swiglu(a, b):   # fp32 inside, one rounding
    return (torch.nn.functional.silu(a.float()) * b.float()).to(a.dtype)


device = "cuda" if cl.cuda.is_available() else "cpu"
mode = "exhaustive" if device == "cuda" else "sample"
ok = assert_kernel_matches(my_swiglu, "swiglu", mode=mode, device=device,
                           policy="fused", math="inductor")
print(ok)
try:
    assert_kernel_matches(my_swiglu, cl.library("liger")["swiglu"], mode=mode, device=device)
    raise AssertionError("expected a mismatch")
except KernelMismatch as e:
    print(e.report)
    liger = e.report
assert ok.passed and liger.differ > 0 and liger.closer_to_fp64 > liger.farther_from_fp64
"""),
    ("md", """
The report names how many elements differ, the first inputs (with each node of Liger's
chain against the exact value: here `silu(a)` of a subnormal `a` rounds to 0 before the
product), and whether the kernel is closer to the exact value than the reference: the
one-rounding kernel is, in all but a handful of the differing elements.

`bounds` gives the proven worst case of a preset against fp64, PyTorch eager and
torch.compile over the same space, cached on disk (`castlab bounds` on the command line;
the pytest plugin's `castlab_bounds` fixture in a kernel repository's own tests):
"""),
    ("code", """
b = bounds(cl.library("liger")["swiglu"], "bfloat16", device=device)
print(b)
assert b.rows["torch_eager"]["differ"] == 0      # Liger's forward rounds where eager does
assert b.rows["inductor"]["differ"] == liger.differ
"""),
]

NB08 = [
    ("md", """
# 08 · A whole model: HF Qwen2, eager vs compiled, judged by fp64

The report this retells: HF Qwen2 under Thunder/torch.compile gave a loss of
0.7004587650299072 instead of eager's 0.7005462646484375, and it took days of bisection
(layer by layer, then module by module) to land on the MLP's SwiGLU and
`apply_rotary_pos_emb`, and a separate fp64 run to learn that the compiled result was the
more accurate one.

`castlab.torch` does that walk in one call on the model itself. `capture` takes the ATen
graph `torch.export` gives; castlab computes the norms, RoPE, SwiGLU and casts itself
(regions a policy rounds), and runs the matmuls, attention and mask arithmetic as
*external* PyTorch nodes, shared without copies (in float64 under the `fp64` policy, so
the whole model has an fp64 reference). Everything here runs on the CPU.
"""),
    ("code", """
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # (tqdm, via transformers)
"""),
    ("code", """
import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging

import castlab.torch as ct

logging.set_verbosity_error()
torch.manual_seed(0)
cfg = Qwen2Config(hidden_size=56, num_attention_heads=28, num_key_value_heads=4,
                  intermediate_size=112, vocab_size=2, max_position_embeddings=32,
                  num_hidden_layers=1)     # the report's config, random init
cfg._attn_implementation = "sdpa"
model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
ids = torch.randint(0, 2, (1, 32))
labels = torch.randint(0, 2, (1, 32))
KW = {"use_cache": False}

m = ct.capture(model, ids, kwargs=KW)
m
"""),
    ("md", """
## 1 · The captured program

The listing shows each castlab region as castlab's own trace (every rounding the policy
makes is a `convert`) and each external node with its ATen op, module and source line.
The first lines of the program under `eager`:
"""),
    ("code", """
listing = m.trace(ids, kwargs=KW, policy="eager")
print("\\n".join(line for line in listing.splitlines() if "external" in line)[:1500])
"""),
    ("code", """
lines = listing.splitlines()
k = next(i for i, line in enumerate(lines) if "silu(" in line)
print("\\n".join(lines[k - 3:k + 5]))      # the SwiGLU region under eager
"""),
    ("md", """
## 2 · Eager, compiled and fp64 logits

Under `policy="eager"` with the `torch_eager` preset castlab rounds after every op as
PyTorch does, and the captured model gives PyTorch's logits bit for bit. `fused` with the
`inductor` preset rounds once per region, as torch.compile's kernels do; `fp64` is the
reference.
"""),
    ("code", """
with torch.no_grad():
    torch_eager = model(ids, **KW).logits
eager = m.run(ids, kwargs=KW, policy="eager").logits
fused = m.run(ids, kwargs=KW, policy="fused", math="inductor").logits
ref = m.run(ids, kwargs=KW, policy="fp64").logits


def loss(logits):
    return F.cross_entropy(logits.double().reshape(-1, 2), labels.reshape(-1)).item()


def rel_rmse(x):
    return ((x.double() - ref).square().mean().sqrt() / ref.square().mean().sqrt()).item()


print("castlab eager == PyTorch eager, bit for bit:", torch.equal(eager, torch_eager))
print("logits that differ, eager vs fused:", int((eager != fused).sum()), "of", eager.numel())
print(f"loss   eager {loss(eager):.16f}   fused {loss(fused):.16f}   fp64 {loss(ref):.16f}")
print(f"logits rel. RMSE vs fp64:  eager {rel_rmse(eager):.3g}   fused {rel_rmse(fused):.3g}")
assert torch.equal(eager, torch_eager)
assert rel_rmse(fused) < rel_rmse(eager)
"""),
    ("md", """
Like the report, eager and compiled disagree; unlike the report, fp64 is right here to
judge: the fused logits are closer to it. (One scalar loss of a random 2-token model is
a noisy judge: on this seed it happens to land nearer eager's; the logits, 64 values,
are the steadier measure.)

## 3 · `drift`: where it starts, who is closer, who contributes

One call: every captured node's error against fp64 under both configurations, the first
node where they differ, a verdict per node, and each node's share of the output error
(the eager run repeated with that node's rounding left out).
"""),
    ("code", """
d = ct.drift(model, (ids,), a="eager", b="fused", kwargs=KW)
print("\\n".join(str(d).splitlines()[:4]))
"""),
    ("code", """
df = d.to_frame()
df[df.mismatches > 0][["node", "op", "module", "line", "a_mean_ulp", "b_mean_ulp",
                       "mismatches", "closer", "a_contribution"]].head(12)
"""),
    ("code", """
start = d.start
rope = df[(df.module == "model.layers.0.self_attn") & (df.line == start["line"])]
mlp = df[df.module.str.endswith("mlp") | df.module.str.endswith("act_fn")]
print("drift starts at", start["node"], start["op"], "in", start["module"], start["line"])
print("RoPE nodes on that line:", list(rope.node))
print(mlp[["node", "op", "closer", "mismatches", "a_contribution"]].to_string(index=False))
# RoPE's q*cos + rotate_half(q)*sin: the add is where eager and fused first differ
assert start["op"] == "aten.add.Tensor" and start["module"].endswith("self_attn")
# SwiGLU: eager's rounding of silu's result is among the largest contributors, and the
# MLP's product is closer to fp64 when fused
assert "silu" in [r["node"] for r in d.top(3, "a")]
assert mlp.set_index("node").loc["mul_11", "closer"] == "b"
assert d.output_error[1] < d.output_error[0]      # fp64's verdict: fused is closer
"""),
    ("code", """
ax = d.plot()
"""),
    ("md", """
## 4 · From inside PyTorch: `torch.compile(backend=castlab.torch.backend(...))`

The same program behind `torch.compile`: outputs are PyTorch tensors, so it drops into
an existing script. (A graph castlab refuses, e.g. one autograd records, runs in PyTorch
with one warning.)
"""),
    ("code", """
be = ct.backend(policy="eager", math="torch_eager")
compiled = torch.compile(model, backend=be, dynamic=False)
with torch.no_grad():
    out = compiled(ids, **KW).logits
print(type(out).__name__, out.dtype, "== PyTorch eager:", torch.equal(out, torch_eager))
assert torch.equal(out, torch_eager)
"""),
]

NB09 = [
    ("md", """
# 09 · Two stacks, one model: the RL log-probability gap, and the switches that close it

RL post-training of a language model usually runs two stacks over the same weights. An
inference engine (vLLM, SGLang) samples the rollouts and reports each sampled token's
log-probability; a training stack (Hugging Face Transformers with Liger or Unsloth
kernels, under FSDP) recomputes the log-probabilities of the same tokens and takes the
policy gradient. In exact arithmetic the two numbers are equal. In bf16 they are not:
each stack rounds in other places, and the importance ratio `exp(lp_train - lp_rollout)`
that should be 1 on-policy is not, which biases the gradient.

Teams find the differences by hand, one kernel at a time. Some public threads:

- [prime-rl #1167](https://github.com/PrimeIntellect-ai/prime-rl/pull/1167) changes the
  trainer to sit closer to vLLM: the two RoPE implementations matched, residual sums in
  fp32, and Liger's RMSNorm kernel dropped; vLLM's fused residual-add + RMSNorm is listed
  as the next thing to check.
- [lmdeploy #4133](https://github.com/InternLM/lmdeploy/pull/4133) fixes two kernels that
  disagreed with Transformers: its RMSNorm multiplied the weight in fp32 where
  Transformers multiplies in bf16, and Triton contracted RoPE's `q*cos - q'*sin` into
  fused multiply-adds. Its authors note the fused version is the more precise one, yet
  they changed it to match.
- [vLLM #1334](https://github.com/vllm-project/vllm/issues/1334) is an early report of
  vLLM and HF outputs for the same model that do not line up.
- verl corrects for the gap instead of removing it: truncated importance sampling on the
  rollout log-probabilities
  ([verl #2953](https://github.com/verl-project/verl/pull/2953); see also
  [verl #2656](https://github.com/verl-project/verl/issues/2656)).

castlab's stacks (`castlab.torch`, [docs/stacks.md](../docs/stacks.md)) make that list of
changes a computation: name each stack's choices, run one captured model under both and
under fp64, report the per-token log-probability gap, and search for the smallest set of
switches that makes the two stacks' logits equal bit for bit, each with fp64's verdict.
Everything below runs on the CPU, on a small Llama-shaped model with random weights.
"""),
    ("code", """
%matplotlib inline
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # (tqdm, via transformers)
"""),
    ("code", """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging

import castlab.torch as ct

logging.set_verbosity_error()
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                  num_attention_heads=14, num_key_value_heads=2, vocab_size=4096,
                  max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)
cfg._attn_implementation = "sdpa"
model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()   # Qwen2.5-0.5B's widths, 2 layers
ids = torch.randint(0, cfg.vocab_size, (2, 32))            # 2 sequences of 32 tokens
KW = {"use_cache": False}

m = ct.capture(model, ids, kwargs=KW)
with torch.no_grad():
    hf = model(ids, **KW).logits
same = torch.equal(m.run(ids, kwargs=KW, stack="hf_eager").logits, hf)
print("hf_eager stack == the Hugging Face model, bit for bit:", same)
assert same
m
"""),
    ("md", """
## 1 · The built-in stacks

A stack is a named set of choices over the captured model: the rounding policy and math
of castlab's regions, a kernel-library preset per region kind (SwiGLU, RoPE, RMSNorm),
the SDPA backend, and the CUDA matmul flags. `describe()` lists each choice with the
library file and lines it follows and its status: *verified against the library on the
H200*, or *from source, not run*.
"""),
    ("code", """
print(ct.stacks())
for name in ("liger", "vllm"):
    print()
    print(ct.Stack(name).describe())
"""),
    ("code", """
def status(name):
    lines = ct.Stack(name).describe().splitlines()
    return {ln.split()[0]: ("verified on the H200" if "verified against the library" in ln
                            else "from source, not run" if "from source, not run" in ln
                            else "-")
            for ln in lines[1:] if ln.startswith("  ") and ln.split()[0] in
            ("swiglu", "rope", "rms_norm")}


for name in ("liger", "vllm"):
    print(f"{name:6s}", status(name))
assert status("liger")["rope"] == "verified on the H200"
assert set(status("vllm").values()) == {"from source, not run"}
"""),
    ("md", """
Liger's SwiGLU and RoPE presets were checked bit for bit against liger-kernel 0.8.5 on an
H200; its RMSNorm preset, and every vLLM preset, are read from the libraries' source and
not yet run against them. The `vllm` stack's attention is PyTorch's flash SDPA backend
standing in for vLLM's flash-attn kernel.

## 2 · Trainer (liger) against rollout engine (vllm)

`compare_stacks` runs both stacks and the fp64 reference and scores the next input id at
every position, with `log_softmax` in fp64 of each stack's logits. With `align=True` it
also runs the alignment search of section 3; the comparison comes first.
"""),
    ("code", """
r = ct.compare_stacks(m, ids, a="liger", b="vllm", kwargs=KW, align=True)
print(str(r).split("\\nalignment of")[0])     # the comparison; the alignment in section 3
s = r.summary
assert s["logits_differ"] > 0 and s["mean_kl"] > 0
assert r.first["kind"] == "rms_norm" and r.first["module"].endswith("input_layernorm")
"""),
    ("code", """
tok = r.to_frame()
print(f"|lp_liger - lp_vllm| per token: median {tok.delta.abs().median():.2e}, "
      f"max {tok.delta.abs().max():.2e}; tokens where the two differ: "
      f"{int((tok.delta != 0).sum())} of {len(tok)}")
print(f"importance ratio exp(lp_liger - lp_vllm): "
      f"{tok.delta.apply(lambda d: 2.718281828459045 ** d).agg(['min', 'max']).round(5).to_dict()}")
print(f"top-1 flips: {int(tok.flip.sum())}")
tok.reindex(tok.delta.abs().sort_values(ascending=False).index).head(6)[
    ["index", "label", "lp_a", "lp_b", "lp_ref", "delta", "kl", "flip"]]
"""),
    ("md", """
The first value where the two stacks differ is inside layer 0's input RMSNorm, and every
layer after it differs. Which stack is closer to fp64 depends on the token: the summary
line above gives the mean `|lp - lp_fp64|` of each stack and the per-token count.
Two layers show no relative error against fp64 ("-" above, gaps in the plot): both end
in an RMSNorm that the `vllm` stack runs as its fused add+RMSNorm, and the report has no
fp64 value there to compare with (the hf_eager/torch_compile table in section 4 has them).
"""),
    ("code", """
r.plot_layers()
"""),
    ("code", """
r.plot_logprob_hist()
"""),
    ("md", """
## 3 · `align=True`: the smallest set of switches, proven

The search switches B's choices to A's, single choices first, then pairs, then triples,
and keeps the smallest sets after which B's logits equal A's **bit for bit**. Each choice
also gets its share of the KL (switched alone, and all others switched) and fp64's
verdict: does switching it alone move B toward or away from the exact answer?
"""),
    ("code", """
al = r.alignment
print(al)
assert al.sets, "no set of up to three choices aligns the stacks"
assert set(al.sets[0]) == {"rope", "rms_norm"}
"""),
    ("md", """
The proof, outside the search: build the switched stack by hand and run it.
"""),
    ("code", """
import warnings

warnings.filterwarnings("ignore", message="stack liger .*geglu inert")  # listed above
liger = ct.Stack("liger")
fixed = ct.Stack("vllm").replace(**{f: getattr(liger, f) for f in al.sets[0]})
la = m.run(ids, kwargs=KW, stack="liger").logits
lb = m.run(ids, kwargs=KW, stack="vllm").logits
lf = m.run(ids, kwargs=KW, stack=fixed).logits
print(fixed.name)
print("vllm  == liger:", torch.equal(lb, la), f"({int((lb != la).sum()):,} logits differ)")
print("fixed == liger:", torch.equal(lf, la))
for e in al.effects:
    print(f"  {e.field:9s} alone: KL share {e.share_alone:+.3f}, {e.verdict}")
assert torch.equal(lf, la) and not torch.equal(lb, la)
"""),
    ("md", """
On this model the list an RL team would write by hand is short: vLLM's RoPE and its
RMSNorm (fused residual add, then `(x * scale)` rounded before the weight multiply,
against Liger's Triton reduction) account for every differing logit; SwiGLU and the
attention backend (flash is already PyTorch's CPU choice here) change nothing. And fp64's
verdict cuts both ways: aligning the trainer to the engine is a choice of *agreement*,
not of accuracy; the table says, per switch, which one you give up.

## 4 · Seed 001's question: eager against compiled

The same machinery on `hf_eager` against the `torch_compile` stack: castlab's model of
Inductor under its default settings (fp32 inside a kernel, explicit casts dropped, Triton's
division and exp, FMA contraction), rounded where Inductor's kernels store, read from this
model's compiled program (`stores="inductor"`: torch.compile runs once, in PyTorch).
"""),
    ("code", """
rc = ct.compare_stacks(m, ids, a="hf_eager", b="torch_compile", kwargs=KW, align=True)
print(rc)
ac = rc.alignment
fixed_c = ct.Stack("torch_compile").replace(
    **{f: getattr(ct.Stack("hf_eager"), f) for f in ac.sets[0]})
equal = torch.equal(m.run(ids, kwargs=KW, stack=fixed_c).logits, hf)
print(fixed_c.name, "== the Hugging Face model, bit for bit:", equal)
assert ac.sets and equal
assert rc.summary["mean_err_b"] < rc.summary["mean_err_a"]   # compiled: closer to fp64
"""),
    ("md", """
The compiled stack's log-probabilities are the closer ones to fp64 here, and the
alignment names the switches that give eager's bits back. The `stores` choice is where
Inductor keeps values: cos/sin and the residual sums are recomputed in fp32 inside the
kernels that read them, never rounded to bf16 (`castlab.torch._inductor`). On the CPU the
`torch_compile` stack's logits equal `torch.compile`'s for a two-layer Qwen2 (castlab's
tests); the GPU has not run it yet.

## 5 · What this does not yet show

- **No GPU verification of the `vllm` and `transformer_engine` stacks.** Their presets
  follow the libraries' source (files and lines in `describe()`); they were not run
  against vLLM or TransformerEngine. Liger's RMSNorm preset is also from source.
- **Attention is PyTorch's.** The `vllm` stack's flash attention is PyTorch's flash SDPA
  backend, not vLLM's flash-attn. On the CPU, PyTorch's SDPA already picks its flash
  kernel for these calls, so the attention switch is a no-op here; the `efficient` and
  `cudnn` backends do not exist on the CPU, and the CUDA matmul flags change nothing.
- **Inductor's default placement** of stores and recomputes, above.
- Random weights, 2 layers, 64 tokens: real checkpoints and longer sequences move the
  numbers, and other CPUs can change the bf16 GEMMs' bits (never the conclusions the
  cells assert).
"""),
]


NOTEBOOKS = {
    "01_bf16_rounding.ipynb": NB01,
    "02_eager_vs_fused.ipynb": NB02,
    "03_torch_interop.ipynb": NB03,
    "04_ab_study.ipynb": NB04,
    "05_training_gradients.ipynb": NB05,
    "06_attribution.ipynb": NB06,
    "07_exhaustive.ipynb": NB07,
    "08_qwen2_drift.ipynb": NB08,
    "09_stacks.ipynb": NB09,
}
