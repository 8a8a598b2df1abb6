"""castlab gradients on the GPU, checked against torch.autograd on the same inputs.

``cl.jit(fn).backward_fn()`` under the eager policy (default math "torch_eager") must give
PyTorch eager autograd's bits; the fused policy with math "inductor" is compared with the
backward torch.compile generates; math "portable" must give the same bits on GPU and CPU;
the fp64 policy is compared with torch's fp64 autograd; a second GPU must repeat cuda:0.

Mismatches are counted on the raw bit patterns (so -0 vs +0 differ); two NaNs are equal
whatever their payloads. Every test is marked ``cuda`` and skipped when castlab finds no
GPU. Set CASTLAB_GPU_REPORT=path to append the measured counts (JSON lines) there.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import castlab as cl
import castlab.cuda as clcuda

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")]

torch = pytest.importorskip("torch")
F = torch.nn.functional
from castlab.torch._aten import torch_pairs  # noqa: E402

if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("torch has no CUDA", allow_module_level=True)

_TDT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
        "float64": torch.float64}
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def report(**kw):
    path = os.environ.get("CASTLAB_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(kw) + "\n")


# ---------------------------------------------------------------- tensors and comparisons

def to_cl(t, device=None):
    """torch -> castlab (DLPack, zero copy on the GPU); `device` moves it afterwards."""
    x = cl.from_dlpack(t.detach().contiguous())
    return x if device is None else x.to(device)


def to_t(x):
    """castlab -> torch on cuda:0 (DLPack; a CPU or cuda:1 tensor is copied to cuda:0)."""
    return torch.from_dlpack(x).to("cuda:0")


def _diff_mask(got, want):
    """Elements whose bit patterns differ (NaN == NaN whatever the payload), as a flat
    bool tensor on the GPU. got/want: castlab or torch tensors of one dtype and shape."""
    g = to_t(got) if isinstance(got, cl.Tensor) else got
    w = to_t(want) if isinstance(want, cl.Tensor) else want
    assert g.dtype == w.dtype and tuple(g.shape) == tuple(w.shape), (g.dtype, w.dtype,
                                                                     g.shape, w.shape)
    g, w = g.contiguous().reshape(-1), w.contiguous().reshape(-1)
    it = _BITS[g.element_size()]
    return (g.view(it) != w.view(it)) & ~(torch.isnan(g) & torch.isnan(w))


def mismatches(got, want) -> int:
    return int(_diff_mask(got, want).sum())


def first_diffs(got, want, inputs: dict, k=5) -> list:
    """The first k differing elements: index, castlab's and torch's value (and bits), and
    the inputs at that index (inputs: name -> tensor of the same shape)."""
    idx = torch.nonzero(_diff_mask(got, want)).reshape(-1)[:k].tolist()
    g = (to_t(got) if isinstance(got, cl.Tensor) else got).reshape(-1)
    w = (to_t(want) if isinstance(want, cl.Tensor) else want).reshape(-1)
    it = _BITS[g.element_size()]
    out = []
    for i in idx:
        row = {"index": i, "castlab": float(g[i]), "torch": float(w[i]),
               "castlab_bits": hex(int(g[i:i + 1].view(it)) & ((1 << 8 * g.element_size()) - 1)),
               "torch_bits": hex(int(w[i:i + 1].view(it)) & ((1 << 8 * w.element_size()) - 1))}
        for name, t in inputs.items():
            t = to_t(t) if isinstance(t, cl.Tensor) else t
            row[name] = float(t.reshape(-1)[i])
        out.append(row)
    return out


def _ordered(t):
    """fp64 bits as integers ordered like the values (for ULP distances)."""
    i = t.contiguous().reshape(-1).view(torch.int64)
    return torch.where(i < 0, -(i & 0x7FFFFFFFFFFFFFFF), i)


def ulp_stats(got, want) -> dict:
    """fp64: max ULP distance, count of differing elements, max abs error (NaN == NaN)."""
    g = to_t(got) if isinstance(got, cl.Tensor) else got
    assert g.dtype == torch.float64 and want.dtype == torch.float64
    gn, wn = torch.isnan(g.reshape(-1)), torch.isnan(want.reshape(-1))
    both = gn & wn
    d = (_ordered(g) - _ordered(want)).abs()
    d = torch.where(both, torch.zeros_like(d), d)
    fin = torch.isfinite(g.reshape(-1)) & torch.isfinite(want.reshape(-1))
    err = torch.where(fin, (g.reshape(-1) - want.reshape(-1)).abs(), torch.zeros_like(g.reshape(-1)))
    return {"max_ulp": int(d.max()), "differ": int((d != 0).sum()),
            "nan_mismatch": int((gn ^ wn).sum()), "max_abs_err": float(err.max()),
            "max_abs": float(torch.where(fin, want.reshape(-1).abs(), 0).max())}


def torch_grads(fn, inputs: list, cots: list, argnums: tuple) -> tuple:
    """torch.autograd.grad of fn(*inputs) (one output or a tuple) w.r.t. inputs[argnums]."""
    xs = [t.detach().requires_grad_(i in argnums) for i, t in enumerate(inputs)]
    outs = fn(*xs)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    return torch.autograd.grad(outs, [xs[i] for i in argnums], cots)


def cl_grads(fn, inputs: list, cots: list, argnums: tuple, policy="eager", math=None,
             device=None) -> tuple:
    """castlab's gradients of the same function: backward_fn(...).run(*primals, *cots)."""
    bwd = cl.jit(fn).backward_fn(len(inputs), argnums)
    args = [to_cl(t, device) for t in [*inputs, *cots]]
    return bwd.run(*args, policy=policy, math=math)


def _randn(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(_TDT[dtype]).cuda()


_SPECIALS = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-42, 65504.0,
             1e30, -1e-8, 3.0, -3.0, 1e-310]


def _random_with_specials(n, dtype, seed):
    t = _randn(n, dtype, seed, scale=3.0)
    t[: len(_SPECIALS)] = torch.tensor(_SPECIALS, dtype=torch.float64).to(_TDT[dtype]).cuda()
    return t


def _all_patterns(dtype):
    u = np.arange(65536, dtype=np.uint16).view(np.int16).copy()
    return torch.from_numpy(u).view(_TDT[dtype]).cuda()


# ---------------------------------------------------------------- a) unary ops

# Every unary op with an ATen op (the op table's aten column).
UNARY = torch_pairs("unary_float", "unary_signed", castlab_first=True)


def _one_arg(f):
    return lambda x: f(x)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_grad_eager_vs_torch(op, dtype):
    """Every unary op with a derivative rule: all 65,536 bf16/fp16 patterns, 1M random
    fp32/fp64 (randn*3 with specials first); random cotangents."""
    if dtype in ("bfloat16", "float16"):
        x = _all_patterns(dtype)
    else:
        x = _random_with_specials(1 << 20, dtype, seed=11)
    dy = _randn(x.shape, dtype, seed=12)
    f_cl, f_t = UNARY[op]
    (want,) = torch_grads(f_t, [x], [dy], (0,))
    (got,) = cl_grads(_one_arg(f_cl), [x], [dy], (0,))
    n = mismatches(got, want)
    rec = dict(test="grad_unary_eager", op=op, dtype=dtype, mismatches=n, total=x.numel())
    if n:
        rec["first"] = first_diffs(got, want, {"x": x, "dy": dy})
    report(**rec)
    assert n == 0, f"d{op} {dtype}: {n} of {x.numel()} differ from torch eager autograd: {rec.get('first')}"


# ---------------------------------------------------------------- b) binary ops

def _where_cl(a, b, c):
    return cl.where(c > 0, a, b)


def _where_t(a, b, c):
    return torch.where(c > 0, a, b)


BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / b, lambda a, b: a / b),
    "maximum": (lambda a, b: cl.maximum(a, b), torch.maximum),
    "minimum": (lambda a, b: cl.minimum(a, b), torch.minimum),
    "pow": (lambda a, b: a ** b, lambda a, b: a ** b),
    "where": (_where_cl, _where_t),   # the gradients of the two value operands
}


def _binary_inputs(op, dtype, n=1 << 20):
    if op == "pow":   # positive bases
        a = torch.exp(_randn(n, "float64", seed=21)).to(_TDT[dtype])
        b = _randn(n, dtype, seed=22, scale=2.0)
    else:
        a = _random_with_specials(n, dtype, seed=21)
        b = _randn(n, dtype, seed=22, scale=3.0)
        b[1::7] = a[1::7]   # ties: maximum/minimum split the gradient
    extra = [_randn(n, dtype, seed=23)] if op == "where" else []
    return [a, b, *extra]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_grad_eager_vs_torch(op, dtype):
    inputs = _binary_inputs(op, dtype)
    dy = _randn(inputs[0].shape, dtype, seed=24)
    f_cl, f_t = BINARY[op]
    want = torch_grads(f_t, inputs, [dy], (0, 1))
    got = cl_grads(f_cl, inputs, [dy], (0, 1))
    ns = [mismatches(g, w) for g, w in zip(got, want)]
    rec = dict(test="grad_binary_eager", op=op, dtype=dtype, mismatches_da=ns[0],
               mismatches_db=ns[1], total=inputs[0].numel())
    for k, name in enumerate(("da", "db")):
        if ns[k]:
            rec[f"first_{name}"] = first_diffs(got[k], want[k],
                                               {"a": inputs[0], "b": inputs[1], "dy": dy})
    report(**rec)
    assert ns == [0, 0], f"d({op}) {dtype}: {ns} differ from torch eager autograd: {rec}"


# ---------------------------------------------------------------- c) SwiGLU and RoPE

def swiglu_cl(a, b):
    return cl.silu(a) * b


def swiglu_t(a, b):
    return F.silu(a) * b


def _rope_cl1(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + cl.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def _rope_t1(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def rope_cl(q, k, cos, sin):
    """HF apply_rotary_pos_emb: q and k [B, H, S, D], cos/sin [B, 1, S, D] (broadcast)."""
    return _rope_cl1(q, cos, sin), _rope_cl1(k, cos, sin)


def rope_t(q, k, cos, sin):
    return _rope_t1(q, cos, sin), _rope_t1(k, cos, sin)


def swiglu_case(dtype, n=1 << 22, seed=1):
    """(inputs, cotangents, argnums): a = randn*4, b = randn, dy = randn, n each."""
    return [_randn(n, dtype, seed, 4.0), _randn(n, dtype, seed + 1)], \
        [_randn(n, dtype, seed + 2)], (0, 1)


def rope_case(dtype, batch=4, heads=28, kv_heads=4, seq=1024, dim=128, seed=3):
    """HF layout: q [B,28,S,D], k [B,4,S,D], cos/sin [B,1,S,D] computed in fp32 from the
    positions and cast to dtype; cotangents for both outputs; grads w.r.t. q and k."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    fr = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat([fr, fr], dim=-1)
    cos = emb.cos().to(_TDT[dtype]).cuda().expand(batch, 1, seq, dim).contiguous()
    sin = emb.sin().to(_TDT[dtype]).cuda().expand(batch, 1, seq, dim).contiguous()
    q = _randn((batch, heads, seq, dim), dtype, seed)
    k = _randn((batch, kv_heads, seq, dim), dtype, seed + 1)
    dq = _randn(q.shape, dtype, seed + 2)
    dk = _randn(k.shape, dtype, seed + 3)
    return [q, k, cos, sin], [dq, dk], (0, 1)


def rope_case_cos_sin(dtype):
    """rope_case, also differentiating the broadcast cos/sin: their gradients are sums over
    the heads (autograd's sum_to: a CUDA outer reduction, castlab's torch_cuda order)."""
    inputs, cots, _ = rope_case(dtype, batch=2, seq=512)
    return inputs, cots, (0, 1, 2, 3)


CHAINS = {"swiglu": (swiglu_cl, swiglu_t, swiglu_case),
          "rope": (rope_cl, rope_t, rope_case)}
EAGER_CHAINS = {**CHAINS, "rope_cos_sin": (rope_cl, rope_t, rope_case_cos_sin)}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("chain", list(EAGER_CHAINS))
def test_chain_grad_eager_vs_torch(chain, dtype):
    f_cl, f_t, case = EAGER_CHAINS[chain]
    inputs, cots, argnums = case(dtype)
    want = torch_grads(f_t, inputs, cots, argnums)
    got = cl_grads(f_cl, inputs, cots, argnums)
    ns = [mismatches(g, w) for g, w in zip(got, want)]
    rec = dict(test="grad_chain_eager", chain=chain, dtype=dtype, mismatches=ns,
               totals=[w.numel() for w in want])
    for k, n in enumerate(ns):
        if n:
            rec[f"first_{k}"] = first_diffs(got[k], want[k], {"x": inputs[argnums[k]],
                                                              "dy": cots[min(k, len(cots) - 1)]})
    report(**rec)
    assert ns == [0] * len(ns), f"{chain} {dtype} eager backward: {ns} differ: {rec}"


# ---------------------------------------------------------------- d) fused vs torch.compile

@pytest.mark.parametrize("chain", list(CHAINS))
def test_chain_grad_fused_inductor_vs_torch_compile(chain):
    """The fused policy with math "inductor" vs the backward torch.compile (default
    config, dynamic=False) generates through AOTAutograd; counts reported, rate < 1e-3."""
    torch._dynamo.reset()
    f_cl, f_t, case = CHAINS[chain]
    inputs, cots, argnums = case("bfloat16")
    want = torch_grads(torch.compile(f_t, dynamic=False), inputs, cots, argnums)
    got = cl_grads(f_cl, inputs, cots, argnums, policy="fused", math="inductor")
    ns = [mismatches(g, w) for g, w in zip(got, want)]
    total = sum(w.numel() for w in want)
    rate = sum(ns) / total
    rec = dict(test="grad_fused_inductor_vs_compile", chain=chain, dtype="bfloat16",
               mismatches=ns, totals=[w.numel() for w in want], rate=rate)
    names = {"swiglu": ["a", "b"], "rope": ["q", "k"]}[chain]
    for k, n in enumerate(ns):
        if n:
            ins = {nm: t for nm, t in zip(names, inputs) if t.shape == want[k].shape}
            if chain == "rope":   # the broadcast cos/sin at the element's (b, s, d)
                ins = {names[k]: inputs[k], "dy": cots[k],
                       "cos": inputs[2].expand_as(want[k]), "sin": inputs[3].expand_as(want[k])}
            else:
                ins["dy"] = cots[0]
            rec[f"first_d{names[k]}"] = first_diffs(got[k], want[k], ins)
    report(**rec)
    print(rec)
    assert rate < 1e-3, rec


# ---------------------------------------------------------------- e) portable: GPU == CPU

SMALL = {"swiglu": lambda dt: swiglu_case(dt, n=1 << 20),
         "rope": lambda dt: rope_case(dt, batch=2, heads=8, kv_heads=2, seq=256)}


@pytest.mark.parametrize("policy", ["eager", "fused", "fp64"])
@pytest.mark.parametrize("chain", list(CHAINS))
def test_chain_grad_portable_gpu_equals_cpu(chain, policy):
    f_cl = CHAINS[chain][0]
    inputs, cots, argnums = SMALL[chain]("bfloat16")
    got = cl_grads(f_cl, inputs, cots, argnums, policy=policy, math="portable")
    cpu = cl_grads(f_cl, inputs, cots, argnums, policy=policy, math="portable", device="cpu")
    assert all(not c.is_cuda for c in cpu) and all(g.is_cuda for g in got)
    ns = [mismatches(g, c) for g, c in zip(got, cpu)]
    report(test="grad_portable_gpu_vs_cpu", chain=chain, policy=policy, mismatches=ns,
           totals=[g.numel() for g in got])
    assert ns == [0] * len(ns), f"{chain} {policy}: GPU and CPU backward differ in {ns}"


# ---------------------------------------------------------------- f) fp64 policy vs torch fp64

@pytest.mark.parametrize("chain", list(CHAINS))
def test_chain_grad_fp64_policy_vs_torch_fp64(chain):
    """castlab's fp64 policy on bf16 inputs vs torch fp64 autograd on the same values
    (widened exactly): max ULP distance reported (expected 0 or tiny)."""
    f_cl, f_t, case = CHAINS[chain]
    inputs, cots, argnums = case("bfloat16")
    want = torch_grads(f_t, [t.double() for t in inputs], [c.double() for c in cots], argnums)
    got = cl_grads(f_cl, inputs, cots, argnums, policy="fp64")
    stats = [ulp_stats(g, w) for g, w in zip(got, want)]
    report(test="grad_fp64_policy_vs_torch_fp64", chain=chain, stats=stats)
    print(chain, stats)
    for s in stats:
        assert s["nan_mismatch"] == 0, stats
        assert s["max_abs_err"] <= 1e-12 * max(s["max_abs"], 1.0), stats


# ---------------------------------------------------------------- g) a second GPU

@pytest.mark.skipif(clcuda.device_count() < 2, reason="needs two CUDA GPUs for castlab")
@pytest.mark.parametrize("policy", ["eager", "fused"])
def test_swiglu_grad_cuda1_equals_cuda0(policy):
    inputs, cots, argnums = swiglu_case("bfloat16")
    g0 = cl_grads(swiglu_cl, inputs, cots, argnums, policy=policy, math="inductor")
    g1 = cl_grads(swiglu_cl, inputs, cots, argnums, policy=policy, math="inductor",
                  device="cuda:1")
    assert all(g._device_str == "cuda:1" for g in g1)
    ns = [mismatches(a, b) for a, b in zip(g1, g0)]
    report(test="grad_cuda1_vs_cuda0", policy=policy, mismatches=ns)
    assert ns == [0, 0]
