"""Gradients on the CPU, checked against torch.autograd (CPU) on the same inputs.

castlab's eager policy is PyTorch eager autograd: saved activations and every backward
op rounded to the storage dtype, PyTorch's fused backward kernels (silu_backward, ...)
where PyTorch has them, gradient accumulation in autograd's order. The GPU contract
(every op, all 65,536 bf16/fp16 patterns, torch CUDA autograd) is tests/test_grad_cuda.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import castlab as cl

torch = pytest.importorskip("torch")
F = torch.nn.functional
from castlab.torch._aten import torch_pairs  # noqa: E402

TDT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
       "float64": torch.float64}
IDT = {"bfloat16": torch.int16, "float16": torch.int16, "float32": torch.int32,
       "float64": torch.int64}


def to_cl(t):
    return cl.from_dlpack(t.detach().contiguous())


def to_t(x):
    return torch.from_dlpack(x)


def mismatches(got, want) -> int:
    """Elements whose bits differ (NaN equals NaN; -0 differs from +0)."""
    got = to_t(got) if not isinstance(got, torch.Tensor) else got
    assert got.dtype == want.dtype and got.shape == want.shape
    idt = IDT[str(want.dtype).split(".")[1]]
    same = (got.view(idt) == want.view(idt)) | (got.isnan() & want.isnan())
    return int((~same).sum())


def all_patterns(dt: str):
    bits = np.arange(65536, dtype=np.uint16).view(np.int16).copy()
    return torch.from_numpy(bits).view(TDT[dt])


def randn(shape, dt, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(TDT[dt])


def torch_grads(fn, args, dy, argnums):
    ts = [a.detach().clone().requires_grad_(i in argnums) for i, a in enumerate(args)]
    out = fn(*ts)
    return torch.autograd.grad(out, [ts[i] for i in argnums], dy)


def cl_grads(fn, args, dy, argnums, policy="eager", math=None):
    f = cl.jit(fn)
    dys = dy if isinstance(dy, (tuple, list)) else (dy,)
    return f.backward(*[to_cl(a) for a in args], grad_outputs=tuple(to_cl(d) for d in dys),
                      argnums=tuple(argnums), policy=policy, math=math)


# ---------------------------------------------------------------- unary ops, exhaustively

# Every unary op with an ATen op (the op table's aten column); gelu, gelu_tanh and rsqrt
# differ on the CPU (CPU_EXEMPT's residual test and the correctly-rounded test below).
UNARY = torch_pairs("unary_float", "unary_signed", exclude=("gelu", "gelu_tanh", "rsqrt"))
# A CPU-only kernel detail castlab does not reproduce: hardswish_backward's CPU vector path
# returns NaN at x = NaN (its CUDA kernel returns g).
CPU_EXEMPT = {("hardswish", "bfloat16"), ("hardswish", "float16")}


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_backward_every_pattern_matches_torch_cpu(op, dt):
    if (op, dt) in CPU_EXEMPT:
        pytest.skip("a CPU forward/kernel difference: see test_unary_backward_cpu_residuals")
    x = all_patterns(dt)
    dy = randn(x.shape, dt, seed=1)
    tfn, cfn = UNARY[op]
    (want,) = torch_grads(tfn, [x], dy, [0])
    (got,) = cl_grads(cfn, [x], dy, [0])
    assert mismatches(got, want) == 0


@pytest.mark.parametrize("op,dt", sorted(CPU_EXEMPT))
def test_unary_backward_cpu_residuals_are_rare(op, dt):
    """Forward differences on the CPU (libm/SLEEF vs castlab's math) carry into the
    gradient; they stay rare and at most one ulp-level flip of the forward."""
    x = all_patterns(dt)
    dy = randn(x.shape, dt, seed=1)
    if op == "gelu_tanh":
        tfn, cfn = (lambda t: F.gelu(t, approximate="tanh")), (lambda t: cl.gelu(t, approximate="tanh"))
    elif op == "gelu":
        tfn, cfn = F.gelu, cl.gelu
    elif op == "rsqrt":
        tfn, cfn = torch.rsqrt, cl.rsqrt
    else:
        tfn, cfn = UNARY[op]
    (want,) = torch_grads(tfn, [x], dy, [0])
    (got,) = cl_grads(cfn, [x], dy, [0])
    assert mismatches(got, want) < 0.07 * x.numel()


@pytest.mark.parametrize("op", ["neg", "abs", "reciprocal", "square", "hardswish", "rsqrt"])
def test_unary_backward_fp32_fp64_correctly_rounded_ops(op):
    tfn, cfn = UNARY.get(op, (torch.rsqrt, cl.rsqrt))
    for dt in ("float32", "float64"):
        x = randn(200_000, dt, seed=2, scale=3.0)
        if op == "rsqrt":
            x = x.abs()
        dy = randn(x.shape, dt, seed=3)
        (want,) = torch_grads(tfn, [x], dy, [0])
        (got,) = cl_grads(cfn, [x], dy, [0])
        assert mismatches(got, want) == 0, dt


def test_unary_backward_special_values():
    vals = [0.0, -0.0, 1.0, -1.0, 3.0, -3.0, float("inf"), float("-inf"), 1e-40, 65504.0]
    for dt in ("bfloat16", "float32"):
        x = torch.tensor(vals, dtype=TDT[dt])
        dy = torch.tensor([1.0, -1.0, 2.0, -0.0, 0.0, 3.0, -2.0, float("inf"), 5.0, 1.0],
                          dtype=TDT[dt])
        for op in ("neg", "abs", "exp", "sigmoid", "silu", "tanh", "sqrt", "reciprocal",
                   "square", "hardswish"):
            tfn, cfn = UNARY[op]
            (want,) = torch_grads(tfn, [x], dy, [0])
            (got,) = cl_grads(cfn, [x], dy, [0])
            assert mismatches(got, want) == 0, (op, dt, to_t(got), want)


# ---------------------------------------------------------------- binary and ternary ops

BINARY = torch_pairs("binary")  # every arithmetic op with an ATen op


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_backward_matches_torch_cpu(op, dt):
    n = 100_000
    a = randn(n, dt, seed=4, scale=2.0)
    b = randn(n, dt, seed=5, scale=2.0)
    if op in ("maximum", "minimum"):
        b[::7] = a[::7]  # ties: each side gets g/2
    if op == "pow":
        a = a.abs() + 0.25
        b = b / 2
        if dt in ("float32", "float64"):
            pytest.skip("fp32/fp64 pow on the CPU is the CPU-fidelity issue (SLEEF pow)")
    dy = randn(n, dt, seed=6)
    tfn, cfn = BINARY[op]
    want = torch_grads(tfn, [a, b], dy, [0, 1])
    got = cl_grads(cfn, [a, b], dy, [0, 1])
    assert [mismatches(g, w) for g, w in zip(got, want)] == [0, 0]


def test_where_and_scalar_operands_backward():
    a = randn(5000, "bfloat16", seed=7)
    b = randn(5000, "bfloat16", seed=8)
    dy = randn(5000, "bfloat16", seed=9)

    def tf(a, b):
        return torch.where(a > b, a * 3.0, 2.0 - b) / 0.75

    def cf(a, b):
        return cl.where(a > b, a * 3.0, 2.0 - b) / 0.75

    want = torch_grads(tf, [a, b], dy, [0, 1])
    got = cl_grads(cf, [a, b], dy, [0, 1])
    assert [mismatches(g, w) for g, w in zip(got, want)] == [0, 0]


def test_pow_with_a_python_number_base():
    """d/db of base ** b for a Python-number base, including 0 (log 0 = -inf, masked
    where b >= 0) and a negative base (log = NaN), as torch's pow_backward_exponent."""
    b = torch.tensor([-1.0, 0.0, 2.0, 0.5, float("inf"), -3.0])
    dy = torch.tensor([1.0, 2.0, -1.0, 0.5, 1.0, float("inf")])
    for base in (0.0, 2.0, -2.0, 0.5):
        (want,) = torch_grads(lambda t, base=base: torch.pow(base, t), [b], dy, [0])
        (got,) = cl_grads(lambda t, base=base: base ** t, [b], dy, [0])
        assert mismatches(got, want) == 0, (base, to_t(got), want)


def test_mixed_dtypes_cast_gradients_back():
    a = randn(4000, "bfloat16", seed=10)
    b = randn(4000, "float32", seed=11)
    dy = randn(4000, "float32", seed=12)
    want = torch_grads(lambda a, b: torch.exp(a.float()) * b + a, [a, b], dy, [0, 1])
    got = cl_grads(lambda a, b: cl.exp(a.astype(cl.float32)) * b + a, [a, b], dy, [0, 1])
    assert to_t(got[0]).dtype == torch.bfloat16
    assert mismatches(got[1], want[1]) < 40  # fp32 exp: SLEEF on the CPU
    assert mismatches(got[0], want[0]) < 10


# ---------------------------------------------------------------- chains

def swiglu_t(a, b):
    return F.silu(a) * b


def swiglu_c(a, b):
    return cl.silu(a) * b


def rope_t(q, k, cos, sin):
    def rh(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return q * cos + rh(q) * sin, k * cos + rh(k) * sin


def rope_c(q, k, cos, sin):
    def rh(x):
        h = x.shape[-1] // 2
        return cl.cat([-x[..., h:], x[..., :h]], dim=-1)
    return q * cos + rh(q) * sin, k * cos + rh(k) * sin


def _rope_inputs(dt, seed=20):
    q = randn((2, 4, 64, 32), dt, seed)
    k = randn((2, 2, 64, 32), dt, seed + 1)
    pos = torch.arange(64, dtype=torch.float64)[:, None]
    inv = 1.0 / (10000 ** (torch.arange(0, 32, 2, dtype=torch.float64) / 32))
    ang = torch.cat([pos * inv, pos * inv], dim=-1)[None, None]  # [1, 1, 64, 32]
    ang = ang.expand(2, 1, 64, 32).contiguous()
    return q, k, ang.cos().to(TDT[dt]), ang.sin().to(TDT[dt])


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
def test_swiglu_backward_eager_matches_torch_cpu(dt):
    a = randn(1 << 16, dt, seed=13, scale=2.0)
    b = randn(1 << 16, dt, seed=14)
    dy = randn(1 << 16, dt, seed=15)
    want = torch_grads(swiglu_t, [a, b], dy, [0, 1])
    got = cl_grads(swiglu_c, [a, b], dy, [0, 1])
    # silu_backward's exp: SLEEF's in the vector body, glibc's in the scalar tails
    assert [mismatches(g, w) for g, w in zip(got, want)] == [0, 0]


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
def test_rope_backward_eager_matches_torch_cpu(dt):
    q, k, cos, sin = _rope_inputs(dt)
    dq = randn(q.shape, dt, seed=30)
    dk = randn(k.shape, dt, seed=31)
    want = torch_grads(rope_t, [q, k, cos, sin], (dq, dk), [0, 1])
    got = cl_grads(rope_c, [q, k, cos, sin], (dq, dk), [0, 1])
    assert [mismatches(g, w) for g, w in zip(got, want)] == [0, 0]


def test_rope_broadcast_cos_sin_over_heads():
    q, k, cos, sin = _rope_inputs("bfloat16")
    dq = randn(q.shape, "bfloat16", seed=32)
    dk = randn(k.shape, "bfloat16", seed=33)
    want = torch_grads(rope_t, [q, k, cos, sin], (dq, dk), [0, 1])
    got = cl_grads(rope_c, [q, k, cos, sin], (dq, dk), [0, 1])
    assert [mismatches(g, w) for g, w in zip(got, want)] == [0, 0]
    # cos/sin [2, 1, 64, 32] broadcast over heads: their gradients sum over dim 1
    want = torch_grads(rope_t, [q, k, cos, sin], (dq, dk), [2, 3])
    got = cl_grads(rope_c, [q, k, cos, sin], (dq, dk), [2, 3])
    assert [mismatches(g, w) for g, w in zip(got, want)] == [0, 0]


def test_accumulation_order_is_autograd_order():
    """x used three times: contributions added newest consumer first, in bf16."""
    x = randn(20000, "bfloat16", seed=40)
    dy = randn(20000, "bfloat16", seed=41)

    def tf(x):
        return x * 1.0078125 + (x * 3.0) * 0.3 + torch.exp(x)

    def cf(x):
        return x * 1.0078125 + (x * 3.0) * 0.3 + cl.exp(x)

    (want,) = torch_grads(tf, [x], dy, [0])
    (got,) = cl_grads(cf, [x], dy, [0])
    assert mismatches(got, want) == 0
    # a different order would differ: the test can fail
    f = cl.jit(cf)
    fwd = f.backward_fn()
    text = fwd.trace(to_cl(x), to_cl(dy), policy="eager")
    assert text.count("add(") >= 3


def test_view_ops_backward():
    x = randn((4, 6, 8), "bfloat16", seed=50)

    def tf(x):
        y = x[:, 1:5:2].permute(2, 0, 1) * 2.0
        z = x.select(1, 3)[:2].unsqueeze(0) + x[1:3, ::3, 1:].reshape(1, 2, -1)[..., :8]
        return y, z.squeeze(0), x.transpose(0, 2)

    def cf(x):
        y = x[:, 1:5:2].permute(2, 0, 1) * 2.0
        z = cl.unsqueeze(x.select(1, 3)[:2], 0) + x[1:3, ::3, 1:].reshape(1, 2, -1)[..., :8]
        return y, z.squeeze(0), x.transpose(0, 2)

    ts = x.clone().requires_grad_()
    outs = tf(ts)
    dys = [randn(o.shape, "bfloat16", seed=60 + i) for i, o in enumerate(outs)]
    (want,) = torch.autograd.grad(outs, [ts], dys)
    (got,) = cl.jit(cf).backward(to_cl(x), grad_outputs=tuple(to_cl(d) for d in dys),
                                 policy="eager")
    assert mismatches(got, want) == 0


def test_chunk_backward_concatenates_and_keeps_negative_zero():
    """torch's SplitBackward concatenates the pieces' gradients: a -0 stays -0 (a
    zero-padded sum per slice would make it +0); plain slices pad and add, as torch."""
    xt = torch.tensor([[0.0, -1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    dy = torch.tensor([[-1.0, 1.0]], dtype=torch.bfloat16)

    def tf(x):
        a, b = x.chunk(2, -1)
        return F.silu(a) * b

    def cf(x):
        a, b = cl.chunk(x, 2, -1)
        return cl.silu(a) * b

    (want,) = torch_grads(tf, [xt], dy, [0])
    (got,) = cl_grads(cf, [xt], dy, [0])
    assert mismatches(got, want) == 0 and str(to_t(got)[0, 2].item()) == "-0.0"
    for fns in ((lambda x: x[..., :2] * x[..., 2:], lambda x: x[..., :2] * x[..., 2:]),):
        (want,) = torch_grads(fns[0], [xt], dy, [0])
        (got,) = cl_grads(fns[1], [xt], dy, [0])
        assert mismatches(got, want) == 0


def test_cat_with_promotion_and_chunk():
    a = randn((3, 4), "bfloat16", seed=70)
    b = randn((3, 2), "float32", seed=71)
    dy = randn((3, 6), "float32", seed=72)
    want = torch_grads(lambda a, b: torch.cat([a, b], 1) * 1.5, [a, b], dy, [0, 1])
    got = cl_grads(lambda a, b: cl.cat([a, b], 1) * 1.5, [a, b], dy, [0, 1])
    assert [mismatches(g, w) for g, w in zip(got, want)] == [0, 0]
    x = randn((4, 8), "bfloat16", seed=73)
    dy2 = randn((4, 4), "bfloat16", seed=74)
    want = torch_grads(lambda x: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1], [x], dy2, [0])
    got = cl_grads(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1], [x], dy2, [0])
    assert mismatches(got[0], want[0]) == 0


# ---------------------------------------------------------------- policies

def test_fp64_policy_matches_torch_fp64_autograd():
    a = randn(1 << 14, "bfloat16", seed=80, scale=2.0)
    b = randn(1 << 14, "bfloat16", seed=81)
    dy = randn(1 << 14, "bfloat16", seed=82)
    want = torch_grads(swiglu_t, [a.double(), b.double()], dy.double(), [0, 1])
    got = cl_grads(swiglu_c, [a, b], dy, [0, 1], policy="fp64")
    for g, w in zip(got, want):
        g = to_t(g)
        assert g.dtype == torch.float64
        ulp = (g - w).abs() / torch.finfo(torch.float64).eps / w.abs().clamp_min(1e-300)
        assert float(ulp.max()) <= 8  # exp: castlab's vs SLEEF's, each within an ulp
    q, k, cos, sin = _rope_inputs("bfloat16")
    dq, dk = randn(q.shape, "bfloat16", seed=83), randn(k.shape, "bfloat16", seed=84)
    want = torch_grads(rope_t, [t.double() for t in (q, k, cos, sin)], (dq.double(), dk.double()),
                       [0, 1])
    got = cl_grads(rope_c, [q, k, cos, sin], (dq, dk), [0, 1], policy="fp64")
    assert [mismatches(g, w) for g, w in zip(got, want)] == [0, 0]


def test_policies_order_against_fp64():
    """eager, fused and 'saved activations in fp32' all run; each is a valid rounding of
    the fp64 gradient to within a few ulps, and the fused one is at least as close."""
    a = randn(1 << 16, "bfloat16", seed=90, scale=2.0)
    b = randn(1 << 16, "bfloat16", seed=91)
    dy = randn(1 << 16, "bfloat16", seed=92)
    ref = [to_t(g) for g in cl_grads(swiglu_c, [a, b], dy, [0, 1], policy="fp64")]
    saved32 = cl.Policy("saved_fp32", round_after=("backward",))
    err = {}
    for name, pol in (("eager", "eager"), ("fused", "fused"), ("saved32", saved32)):
        got = cl_grads(swiglu_c, [a, b], dy, [0, 1], policy=pol)
        err[name] = sum(float(((to_t(g).double() - r) ** 2).sum()) for g, r in zip(got, ref))
    assert err["fused"] <= err["eager"]
    assert err["saved32"] <= err["eager"]
    assert len({round(v, 12) for v in err.values()}) == 3  # three different placements


def test_trace_shows_phases_kernels_and_roundings():
    f = cl.jit(swiglu_c)
    a = cl.randn(8, seed=0, dtype=cl.bfloat16)
    b = cl.randn(8, seed=1, dtype=cl.bfloat16)
    dy = cl.randn(8, seed=2, dtype=cl.bfloat16)
    t = f.backward_fn().trace(a, b, dy, policy="eager")
    assert "# forward" in t and "# backward" in t
    assert "in silu_backward#1 (one PyTorch kernel, not rounded)" in t
    assert "silu_backward#1 result" in t
    assert t.count("round to nearest even") == 4  # silu(a) saved, dy*b, da, db
    tf = f.backward_fn().trace(a, b, dy, policy="fused")
    assert tf.count("round to nearest even") == 2  # only the two gradients


def test_vjp_grad_and_pullback_api():
    f = cl.jit(swiglu_c)
    a = cl.randn(16, seed=0)
    b = cl.randn(16, seed=1)
    y, pullback = f.vjp(a, b)
    assert y.shape == (16,)
    da, db = pullback(cl.ones(16))
    da2 = f.backward(a, b, grad_outputs=cl.ones(16), argnums=0)
    assert da.tolist() == da2.tolist()
    y2, pb2 = cl.vjp(swiglu_c, a, b, argnums=1)
    (db2,) = pb2(cl.ones(16))
    assert db2.tolist() == db.tolist()
    g = cl.grad(lambda x: cl.sin(x) * x)(cl.tensor(0.5))
    assert g.shape == ()
    import math
    assert abs(float(g) - (math.sin(0.5) + 0.5 * math.cos(0.5))) < 1e-6
    gx, gy = cl.grad(lambda x, y: x * y, argnums=(0, 1))(cl.tensor(2.0), cl.tensor(3.0))
    assert (float(gx), float(gy)) == (3.0, 2.0)
    # backward_fn is cached per (nargs, argnums)
    assert f.backward_fn() is f.backward_fn(2, (0, 1))


def test_unused_input_gets_zeros_and_identity():
    f = cl.jit(lambda a, b: a * 2.0)
    a, b = cl.ones(3), cl.ones(3)
    da, db = f.backward(a, b, grad_outputs=cl.ones(3))
    assert da.tolist() == [2.0] * 3 and db.tolist() == [0.0] * 3
    (dx,) = cl.jit(lambda x: x).backward(a, grad_outputs=cl.full((3,), 5.0))
    assert dx.tolist() == [5.0] * 3


# ---------------------------------------------------------------- bad input

def test_bad_inputs_give_clear_errors():
    f = cl.jit(swiglu_c)
    a, b = cl.ones(4, dtype=cl.bfloat16), cl.ones(4, dtype=cl.bfloat16)
    with pytest.raises(ValueError, match="cotangent dy has shape"):
        f.backward(a, b, grad_outputs=cl.ones(5, dtype=cl.bfloat16))
    with pytest.raises(ValueError, match="cotangent dy has dtype float32"):
        f.backward(a, b, grad_outputs=cl.ones(4))
    with pytest.raises(ValueError, match="1 output.*2 cotangent"):
        f.backward(a, b, grad_outputs=(cl.ones(4, dtype=cl.bfloat16),) * 2)
    with pytest.raises(ValueError, match="only floating-point outputs"):
        cl.jit(lambda x: x > 0).backward(a, grad_outputs=cl.ones(4, dtype=cl.bfloat16))
    with pytest.raises(ValueError, match="argument i has dtype int64"):
        cl.jit(lambda x, i: x * i).backward(a, cl.ones(4, dtype=cl.int64),
                                            grad_outputs=cl.ones(4, dtype=cl.bfloat16))
    with pytest.raises(ValueError, match="no output depends differentiably"):
        cl.jit(lambda x: cl.where(x > 0, 1.0, 2.0).astype(cl.bfloat16)).backward(
            a, grad_outputs=cl.ones(4, dtype=cl.bfloat16))
    with pytest.raises(ValueError, match="grad needs a scalar"):
        cl.grad(lambda x: x * 2.0)(cl.ones(3))
    with pytest.raises(ValueError, match="out of range"):
        f.backward_fn(argnums=2)
    with pytest.raises(ValueError, match="listed twice"):
        f.backward_fn(argnums=(0, 0))
    with pytest.raises(TypeError, match="argnums must be"):
        f.backward_fn(argnums="a")
    with pytest.raises(TypeError, match="nargs"):
        cl.jit(lambda *xs: xs[0]).backward_fn()
    with pytest.raises(ValueError, match="phases of a gradient graph"):
        cl.Policy("p", round_after=("backwards",))


# ---------------------------------------------------------------- broadcast inputs

def _rope_c(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + cl.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def _rope_t(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
def test_broadcast_input_grads_equal_torch_cpu(dt):
    """The gradient of a broadcast input is autograd's sum_to: a sum over the broadcast dims
    in the cotangent's dtype, in torch CPU's order (castlab's torch_cpu reduction order)."""
    cdt = getattr(cl, dt)
    tdt = getattr(torch, dt)
    x = cl.randn(2, 4, 64, 32, seed=0, dtype=cdt)
    cos, sin = cl.randn(64, 32, seed=1, dtype=cdt), cl.randn(1, 1, 64, 32, seed=2, dtype=cdt)
    w = cl.randn(32, seed=4, dtype=cdt)
    dy = cl.randn(2, 4, 64, 32, seed=3, dtype=cdt)
    cases = [(_rope_c, _rope_t, (x, cos, sin)),
             (lambda x, w: (x * x) * w + w, lambda x, w: (x * x) * w + w, (x, w)),
             (lambda x, w: x * w.expand(2, 4, 64, 32), lambda x, w: x * w.expand(2, 4, 64, 32),
              (x, w))]
    for fc, ft, args in cases:
        f = cl.jit(fc)
        got = f.backward(*args, grad_outputs=dy, argnums=tuple(range(len(args))), policy="eager")
        ts = [torch.from_dlpack(a).clone().requires_grad_() for a in args]
        ft(*ts).backward(torch.from_dlpack(dy))
        for g, t in zip(got, ts):
            assert g.shape == tuple(t.shape) and g.dtype == cdt
            assert int((torch.from_dlpack(g) != t.grad).sum()) == 0
            assert t.grad.dtype == tdt
        # fused: one rounding per gradient; close to the fp64 reference
        g64 = f.backward(*args, grad_outputs=dy, argnums=(1,), policy="fp64")[0]
        gf = f.backward(*args, grad_outputs=dy, argnums=(1,), policy="fused")[0]
        d = (torch.from_dlpack(gf).double() - torch.from_dlpack(g64).double()).abs()
        assert float(d.max()) <= 0.02 * float(torch.from_dlpack(g64).double().abs().max()) + 1e-6


# ---- reductions: sum, mean, amax/amin, softmax, rms_norm -------------------------------

def _torch_grads(fn, xs, g):
    ts = [torch.from_dlpack(x).clone().requires_grad_(True) for x in xs]
    return torch.autograd.grad(fn(*ts), ts, torch.from_dlpack(g))


@pytest.mark.parametrize("dt", [cl.float32, cl.bfloat16])
def test_reduction_backward_matches_torch_autograd(dt):
    """sum and mean broadcast the gradient back (mean divides by n, in the gradient's
    dtype); amax/amin split it evenly among tied maxima (autograd's scale_grad_by_count):
    bit for bit against torch CPU autograd, keepdim or not, one dim or several."""
    x = cl.randn(6, 10, 8, seed=0, dtype=dt)
    t = torch.from_dlpack(x)
    t[0, 0, :3] = 2.5  # ties for amax over the last dim
    t[1, :, 0] = -3.0  # ties for amin over dim 1
    cases = [(lambda x: cl.sum(x, -1), lambda x: x.sum(-1)),
             (lambda x: cl.mean(x, (0, 2), keepdim=True), lambda x: x.mean((0, 2), keepdim=True)),
             (lambda x: cl.mean(x), lambda x: x.mean()),
             (lambda x: cl.amax(x, -1), lambda x: x.amax(-1)),
             (lambda x: cl.amin(x, 1, keepdim=True), lambda x: x.amin(1, keepdim=True))]
    for k, (cf, tf) in enumerate(cases):
        f = cl.jit(cf)
        y = f.run(x, policy="eager")
        g = cl.randn(*y.shape, seed=k, dtype=dt)
        _, pullback = f.vjp(x, policy="eager")
        (dx,) = pullback(g)
        (want,) = _torch_grads(tf, [x], g)
        assert torch.equal(torch.from_dlpack(dx), want), k


def test_softmax_and_rms_norm_backward_close_to_torch_autograd():
    """softmax, log_softmax and both RMSNorm casts differentiate (castlab's rules for
    their steps: the max softmax subtracts gets no gradient, as in PyTorch's formula);
    fp32 gradients agree with torch autograd to a few ulps."""
    x = cl.randn(5, 64, seed=1)
    w = cl.rand(64, seed=2) + 0.5
    g = cl.randn(5, 64, seed=3)

    def hf(x, w):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h
    cases = [(lambda x, w: cl.softmax(x * w, -1), lambda x, w: torch.softmax(x * w, -1)),
             (lambda x, w: cl.log_softmax(x, -1) * w, lambda x, w: torch.log_softmax(x, -1) * w),
             (lambda x, w: cl.rms_norm(x, 64, w, 1e-6, cast="hf"), hf),
             (lambda x, w: cl.rms_norm(x, 64, w, 1e-6, cast="te"), hf)]
    for k, (cf, tf) in enumerate(cases):
        dx, dw = cl.jit(cf).backward(x, w, grad_outputs=g, policy="eager")
        tx, tw = _torch_grads(tf, [x, w], g)
        assert torch.allclose(torch.from_dlpack(dx), tx, rtol=1e-5, atol=1e-6), k
        assert torch.allclose(torch.from_dlpack(dw), tw, rtol=1e-5, atol=1e-5), k
    from castlab._autodiff import GradError
    with pytest.raises(GradError, match="cast='hf' or 'te'"):
        cl.jit(lambda x, w: cl.rms_norm(x, 64, w)).backward(x, w, grad_outputs=g)
