"""IEEE special values, exhaustively, against PyTorch (issue 14, item 4).

Every binary op of the op table (arity 2, category binary/compare) on the cross product of a
set of special values, every unary op on every special value, plus fma and where, in fp32,
fp64, bf16 and fp16. The special values: +-0, +-1, +-0.5, +-2, +-3, +-inf, nan, the
smallest subnormal, the largest finite value, +-2**60, +-(2**53+1), -1.5 and 1e-30 (each
rounded to the dtype, so 2**60 is inf in fp16 and 1e-30 is 0).

How results are compared (NaN equals NaN whatever its payload and sign):
  * exact ops (add, ..., maximum, compares, neg, sqrt, ...): bit for bit against torch CPU.
  * ops whose ordinary values are designed to differ from torch CPU: the transcendentals
    (exp, log, sigmoid, silu, tanh, gelu, cos, sin, erf) use castlab's portable math, which
    may be an ulp or more (gelu's cancellation near -3) from torch's SLEEF kernels; pow
    evaluates exp(y*log|x|) in double (not bit exact with torch's pow on ordinary values:
    issue 22). For these, a result that either side gives as NaN, +-inf, +-0 or +-1 must be
    identical (bits, NaN any payload); any other result must be finite with torch's sign
    (its value is checked by tests/test_ops.py and tests/test_math_portable.py).
  * where torch CPU itself is off for a special input (REF64 below lists the cases), castlab
    may instead give the correctly rounded float64 reference.
  * maximum/minimum of -0 and +0: IEEE 754-2019 (+0 and -0 in either order), as torch CUDA;
    torch CPU's answer depends on the tensor's length (ieee_signed_zero_ties).
  * fma: torch has no fused multiply-add, so the reference is the exact a*b+c rounded once
    to the op-math type (Fractions, IEEE zero-sign and overflow rules), then to the dtype.
  * sqrt in fp32: torch 2.13 CPU's vectorised fp32 sqrt is not correctly rounded (see
    tests/test_ops.py); NumPy's IEEE sqrt is the reference there.
  * pow with a Python-number exponent (pow_tensor_scalar) is checked against torch with the
    same Python number: x ** 0.5 is sqrt(x) there, so (-0) ** 0.5 = -0, unlike C pow.

The GPU version runs the same cases against torch CUDA.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import castlab as cl
import castlab.cuda as clcuda
from castlab import _optable

torch = pytest.importorskip("torch")
F = torch.nn.functional
from castlab.torch._aten import TORCH_OPS, castlab_fn  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DTYPES = ["float32", "float64", "bfloat16", "float16"]
TD = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
      "float16": torch.float16}
NP = {"float32": np.float32, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16,
      "float16": np.float16}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SINT = {2: torch.int16, 4: torch.int32, 8: torch.int64}

BINARY = _optable.names("binary", "compare")
UNARY = tuple(o.name for o in _optable.OPS.values() if o.arity == 1)
# Ordinary results designed to differ from torch CPU (module docstring); specials exact.
CLASS_ONLY = {"exp", "log", "sigmoid", "silu", "tanh", "gelu", "gelu_tanh", "cos", "sin",
              "erf", "pow"}
# On the GPU also rsqrt (the device's rsqrt instruction or 1/sqrt, as the math variant says)
# and hardswish (x*c/6 or x*c*(1/6)): their ordinary values are tests/test_cuda.py's concern.
CLASS_ONLY_CUDA = CLASS_ONLY | {"rsqrt", "hardswish"}


def special_values(dtype: str) -> np.ndarray:
    fi = torch.finfo(TD[dtype])
    tiny_sub = {"float32": 2.0 ** -149, "float64": 2.0 ** -1074, "bfloat16": 2.0 ** -133,
                "float16": 2.0 ** -24}[dtype]
    vals = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, math.inf, -math.inf,
            math.nan, tiny_sub, -tiny_sub, fi.max, -fi.max, 2.0 ** 60, -(2.0 ** 60),
            float(2 ** 53 + 1), -float(2 ** 53 + 1), -1.5, 1e-30,
            -float(2 ** 53 - 1)]  # the largest odd float64 integer (pow's sign rule)
    return to_numpy(torch.tensor(vals, dtype=torch.float64).to(TD[dtype]))


def to_numpy(t) -> np.ndarray:
    """torch tensor (any device) -> NumPy array with the same bits."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bool:
        return t.numpy()
    name = str(t.dtype).removeprefix("torch.")
    return t.view(SINT[t.element_size()]).numpy().view(NP[name])


def to_torch(a: np.ndarray, device: str = "cpu"):
    a = np.ascontiguousarray(a)
    if a.dtype == np.bool_:
        return torch.from_numpy(a.copy()).to(device)
    name = {np.dtype(v): k for k, v in NP.items()}[a.dtype]
    raw = torch.from_numpy(a.view({2: np.int16, 4: np.int32, 8: np.int64}[a.itemsize]).copy())
    return raw.view(TD[name]).to(device)


def to_cl(a: np.ndarray, device: str = "cpu"):
    x = cl.from_numpy(np.ascontiguousarray(a))
    return x if device == "cpu" else x.to(device)


def cl_numpy(x) -> np.ndarray:
    return np.ascontiguousarray(x.cpu().numpy())


# ------------------------------------------------------------------ the ops, both sides

def cl_fn(name: str):
    return castlab_fn(name)


def torch_fn(name: str):
    return TORCH_OPS[name]  # the op table's aten column


# float64 references (math/NumPy, correctly rounded for these inputs) for the unary ops
# where torch CPU's result for a special input is off: erf of bf16/fp16 subnormals and of
# 1e-30 is 0 (SLEEF flushes), fp32/bf16 gelu(inf) is NaN and gelu(max) is inf, bf16
# rsqrt(max) is 1 ulp off. castlab must then give the correctly rounded value.
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gelu_tanh(x):
    with np.errstate(all="ignore"):
        inner = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)
        return np.where(np.isinf(x), np.where(x > 0, x, -0.0), 0.5 * x * (1.0 + np.tanh(inner)))


REF64 = {
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "cos": np.cos, "sin": np.sin, "erf": _erf,
    "sigmoid": _sigmoid, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "silu": lambda x: np.where(x == -np.inf, -0.0, x * _sigmoid(x)),
    "gelu": lambda x: np.where(x == -np.inf, -0.0, x * 0.5 * (1.0 + _erf(x / np.sqrt(2.0)))),
    "gelu_tanh": _gelu_tanh,
}


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    return to_numpy(torch.from_numpy(np.asarray(x, np.float64)).to(TD[dtype]))


# ------------------------------------------------------------------ comparison

def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(UINT[a.itemsize]) if a.dtype != np.bool_ else a


def _ordered(a: np.ndarray) -> np.ndarray:
    b = _bits(a).astype(np.uint64)
    w = 8 * a.itemsize
    mag = (b & np.uint64((1 << (w - 1)) - 1)).astype(np.int64)
    return np.where((b >> np.uint64(w - 1)) != 0, -mag, mag)


def _special_class(a: np.ndarray) -> np.ndarray:
    f = a.astype(np.float64)
    return np.isnan(f) | np.isinf(f) | (f == 0) | (np.abs(f) == 1)


def mismatch_mask(got: np.ndarray, want: np.ndarray, class_only: bool) -> np.ndarray:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
    if got.dtype == np.bool_:
        return got != want
    gn, wn = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
    exact_bad = (gn != wn) | (~wn & (_bits(got) != _bits(want)))
    if not class_only:
        return exact_bad
    # any other result: finite, with torch's sign (its value is not compared: see above)
    special = _special_class(got) | _special_class(want)
    same_sign = np.signbit(got.astype(np.float64)) == np.signbit(want.astype(np.float64))
    return np.where(special, exact_bad, ~same_sign)


def report(what: str, got, want, bad, inputs) -> str:
    idx = np.flatnonzero(bad.ravel())
    rows = [f"{what}: {idx.size}/{bad.size} differ"]
    for i in idx[:12]:
        ins = ", ".join(repr(float(x.ravel()[i])) for x in inputs)
        rows.append(f"  ({ins}) -> got {got.ravel()[i]!r}, torch {want.ravel()[i]!r}")
    return "\n".join(rows)


def pairs(dtype: str):
    s = special_values(dtype)
    a, b = (np.array(v, dtype=s.dtype) for v in zip(*itertools.product(s, s)))
    return a, b


# ------------------------------------------------------------------ fma reference

def _round_f64_to_odd(q: Fraction) -> float:
    """q rounded to double with round-to-odd, so a second rounding to float32 is correct."""
    try:
        d = float(q)
    except OverflowError:
        return math.inf if q > 0 else -math.inf
    if math.isinf(d) or Fraction(d) == q:
        return d
    if np.float64(d).view(np.uint64) & np.uint64(1) == 0:  # even: step toward q
        d = float(np.nextafter(d, math.inf if Fraction(d) < q else -math.inf))
    return d


def fma_reference(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The exact a*b+c rounded once to op-math (float64 for fp64, float32 otherwise), then
    to the dtype: castlab's fma (and CUDA's) in IEEE terms."""
    f64 = a.dtype == np.float64
    out = np.empty(a.shape, np.float64)
    for i, (x, y, z) in enumerate(zip(a.astype(np.float64), b.astype(np.float64),
                                        c.astype(np.float64))):
        if not (math.isfinite(x) and math.isfinite(y)):
            out[i] = x * y + z  # an infinite or NaN product: inf/nan rules, no rounding
            continue
        if not math.isfinite(z):
            out[i] = z  # a finite exact product never overflows inside an fma
            continue
        q = Fraction(x) * Fraction(y) + Fraction(z)
        if q == 0:
            p_neg = math.copysign(1, x) * math.copysign(1, y) < 0
            if Fraction(x) * Fraction(y) == 0:  # exact zeros: -0 only if both are -0
                out[i] = -0.0 if (p_neg and math.copysign(1, z) < 0) else 0.0
            else:
                out[i] = 0.0
            continue
        if f64:
            try:
                out[i] = float(q)
            except OverflowError:
                out[i] = math.inf if q > 0 else -math.inf
        else:
            out[i] = np.float32(_round_f64_to_odd(q))
    if f64:
        return out
    t = torch.from_numpy(out.astype(np.float32)).to(TD[{np.dtype(v): k for k, v in NP.items()}
                                                       [a.dtype]])
    return to_numpy(t)


# ------------------------------------------------------------------ the checks

def ieee_signed_zero_ties(op: str, a: np.ndarray, b: np.ndarray, want: np.ndarray):
    """maximum/minimum of -0 and +0 (either order) by IEEE 754-2019: +0 and -0. torch CPU
    is not consistent on these ties (its vectorised loop returns the second argument, its
    scalar tail loop the first, so the answer depends on the tensor's length); castlab
    follows IEEE 754-2019, as torch CUDA does."""
    if op not in ("maximum", "minimum"):
        return want
    tie = (a.astype(np.float64) == 0) & (b.astype(np.float64) == 0)
    want = want.copy()
    want[tie] = a.dtype.type(0.0 if op == "maximum" else -0.0)
    want[tie & ~np.signbit(a) & ~np.signbit(b)] = a.dtype.type(0.0)
    want[tie & np.signbit(a) & np.signbit(b)] = a.dtype.type(-0.0)
    return want


def check_binary(op: str, dtype: str, device: str = "cpu") -> tuple[int, str]:
    a, b = pairs(dtype)
    got = cl_numpy(cl_fn(op)(to_cl(a, device), to_cl(b, device)))
    want = to_numpy(torch_fn(op)(to_torch(a, device), to_torch(b, device)))
    if device == "cpu":
        want = ieee_signed_zero_ties(op, a, b, want)
    class_only = op in (CLASS_ONLY if device == "cpu" else CLASS_ONLY_CUDA)
    bad = mismatch_mask(got, want, class_only)
    return int(bad.sum()), report(f"{op} {dtype} {device}", got, want, bad, (a, b))


def check_unary(op: str, dtype: str, device: str = "cpu") -> tuple[int, str]:
    a = special_values(dtype)
    got = cl_numpy(cl_fn(op)(to_cl(a, device)))
    if op == "sqrt" and dtype == "float32" and device == "cpu":
        want = np.sqrt(a)  # torch CPU's vectorised fp32 sqrt is not correctly rounded
    else:
        want = to_numpy(torch_fn(op)(to_torch(a, device)))
    class_only = op in (CLASS_ONLY if device == "cpu" else CLASS_ONLY_CUDA)
    bad = mismatch_mask(got, want, class_only)
    if op in REF64 and device == "cpu":
        # where torch CPU is off, castlab may instead give the correctly rounded result
        ref = round_to(REF64[op](a.astype(np.float64)), dtype)
        bad &= mismatch_mask(got, ref, class_only)
    return int(bad.sum()), report(f"{op} {dtype} {device}", got, want, bad, (a,))


def triples(dtype: str):
    s = special_values(dtype)
    return tuple(np.array(v, dtype=s.dtype) for v in zip(*itertools.product(s, s, s)))


def check_fma(dtype: str, device: str = "cpu") -> tuple[int, str]:
    a, b, c = triples(dtype)
    got = cl_numpy(cl.fma(to_cl(a, device), to_cl(b, device), to_cl(c, device)))
    want = fma_reference(a, b, c)
    bad = mismatch_mask(got, want, False)
    return int(bad.sum()), report(f"fma {dtype} {device}", got, want, bad, (a, b, c))


def check_where(dtype: str, device: str = "cpu") -> tuple[int, str]:
    c, a, b = triples(dtype)
    cond = c.astype(np.float64) != 0
    got = cl_numpy(cl.where(to_cl(cond, device), to_cl(a, device), to_cl(b, device)))
    want = to_numpy(torch.where(to_torch(cond, device), to_torch(a, device),
                                to_torch(b, device)))
    bad = mismatch_mask(got, want, False)
    return int(bad.sum()), report(f"where {dtype} {device}", got, want, bad, (c, a, b))


def test_the_op_table_is_covered():
    assert {"add", "maximum", "minimum", "pow", "eq"} <= set(BINARY)
    assert {"neg", "exp", "sqrt", "hardswish"} <= set(UNARY)
    # div_add is emitted only by the CUDA lowering (Triton's division contracted into an
    # add): tests/test_cuda.py checks it, special values included, against Triton
    assert {o.name for o in _optable.OPS.values()} == (set(BINARY) | set(UNARY)
                                                       | {"fma", "where", "div_add"})
    for dtype in DTYPES:
        s = special_values(dtype)
        assert np.isnan(s.astype(np.float64)).sum() == 1 and np.signbit(s[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", BINARY)
def test_binary_special_pairs_vs_torch(op, dtype):
    n, msg = check_binary(op, dtype)
    assert n == 0, msg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", UNARY)
def test_unary_specials_vs_torch(op, dtype):
    n, msg = check_unary(op, dtype)
    assert n == 0, msg


@pytest.mark.parametrize("dtype", DTYPES)
def test_fma_special_triples(dtype):
    n, msg = check_fma(dtype)
    assert n == 0, msg


@pytest.mark.parametrize("dtype", DTYPES)
def test_where_special_triples_vs_torch(dtype):
    n, msg = check_where(dtype)
    assert n == 0, msg


POW_REPRODUCERS = [(1.0, math.nan), (1.0, math.inf), (1.0, -math.inf), (-1.0, math.inf),
                   (-1.0, -math.inf), (-1.0, 2.0 ** 60), (math.nan, 0.0), (math.nan, -0.0),
                   (-2.0, math.inf), (0.5, -math.inf), (-0.5, math.inf), (-math.inf, 3.0),
                   (-math.inf, -3.0), (-0.0, -3.0), (-8.0, 1.0 / 3.0), (-math.inf, 0.5),
                   (-0.0, 0.5), (-0.0, -0.5), (-math.inf, -0.5)]


@pytest.mark.parametrize("x, y", POW_REPRODUCERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pow_issue_reproducers(x, y, dtype):
    """The reproducers of issue 14 item 4: tensor exponents against C pow's value (what
    torch.pow(tensor, tensor) gives), Python-number exponents against torch with the same
    number (pow_tensor_scalar: x ** 0.5 is sqrt(x), so (-0) ** 0.5 = -0 there)."""
    a = np.array([x], NP[dtype])
    b = np.array([y], NP[dtype])
    want = to_numpy(torch.pow(to_torch(a), to_torch(b)))
    got = cl_numpy(cl.pow(to_cl(a), to_cl(b)))
    assert not mismatch_mask(got, want, False).any(), (x, y, got, want)
    try:
        want_s = to_numpy(torch_pow_scalar(to_torch(a), y))
    except RuntimeError:  # torch: "value cannot be converted to type c10::Half"
        return
    for got in (cl.pow(to_cl(a), y), to_cl(a) ** y):
        got = cl_numpy(got)
        assert not mismatch_mask(got, want_s, True).any(), (x, y, got, want_s)


@pytest.mark.parametrize("dtype", DTYPES)
def torch_pow_scalar(t, y):
    """torch.pow(t, y) for a Python number y. torch CPU computes float16 x ** +-0.5 with C pow
    ((-0) ** 0.5 = +0, (-inf) ** 0.5 = +inf), unlike its float32/float64/bfloat16 kernels
    and torch CUDA (sqrt: -0, NaN); castlab's torch_eager math on the CPU (torch_cpu) does
    as torch CPU does, so torch itself is the reference."""
    return torch.pow(t, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pow_python_exponent_specials_vs_torch(dtype):
    """pow(special tensor, Python number) for special and fast-path exponents."""
    a = special_values(dtype)
    for y in (0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, 0.5, -0.5, math.inf, -math.inf, math.nan,
              2.0 ** 60, -3.0, 1.0 / 3.0, 2, -1, 0):
        try:
            want = to_numpy(torch_pow_scalar(to_torch(a), y))
        except RuntimeError:  # torch refuses a Python number beyond the dtype's range
            continue
        got = cl_numpy(cl.pow(to_cl(a), y))
        bad = mismatch_mask(got, want, True)
        assert not bad.any(), report(f"pow(x, {y!r}) {dtype}", got, want, bad, (a,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_maximum_minimum_signed_zeros(dtype):
    """IEEE 754-2019 (and torch CUDA): maximum(-0, +0) = +0, minimum(-0, +0) = -0, in either
    argument order (torch CPU returns the first or the second argument depending on the
    tensor's length: see ieee_signed_zero_ties)."""
    z = np.array([-0.0, 0.0], NP[dtype])
    for a, b in [(z[:1], z[1:]), (z[1:], z[:1])]:
        for n in (1, 64, 1000):  # the vectorised loop and its scalar tail
            A, B = to_cl(np.repeat(a, n)), to_cl(np.repeat(b, n))
            assert not np.signbit(cl_numpy(cl.maximum(A, B))).any(), (a, b, n)
            assert np.signbit(cl_numpy(cl.minimum(A, B))).all(), (a, b, n)
    for op, v in (("maximum", 0.0), ("minimum", -0.0)):  # ties of equal zeros keep their sign
        for w in (0.0, -0.0):
            got = cl_numpy(cl_fn(op)(to_cl(np.array([w], NP[dtype])),
                                     to_cl(np.array([w], NP[dtype]))))
            assert np.signbit(got[0]) == np.signbit(w), (op, w, v)


# ------------------------------------------------------------------ the same on the GPU

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", BINARY)
@pytest.mark.cuda
@pytest.mark.skipif(not clcuda.is_available() or not torch.cuda.is_available(),
                    reason="needs a CUDA GPU for castlab and torch")
def test_cuda_binary_special_pairs_vs_torch(op, dtype):
    n, msg = check_binary(op, dtype, "cuda")
    assert n == 0, msg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", UNARY)
@pytest.mark.cuda
@pytest.mark.skipif(not clcuda.is_available() or not torch.cuda.is_available(),
                    reason="needs a CUDA GPU for castlab and torch")
def test_cuda_unary_specials_vs_torch(op, dtype):
    n, msg = check_unary(op, dtype, "cuda")
    assert n == 0, msg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.cuda
@pytest.mark.skipif(not clcuda.is_available() or not torch.cuda.is_available(),
                    reason="needs a CUDA GPU for castlab and torch")
def test_cuda_fma_and_where_special_triples(dtype):
    for n, msg in (check_fma(dtype, "cuda"), check_where(dtype, "cuda")):
        assert n == 0, msg


def summary(device: str = "cpu") -> dict:
    """Mismatch counts per (op, dtype): python -c 'from test_special_values import summary'."""
    out = {}
    for dtype in DTYPES:
        for op in BINARY:
            out[op, dtype] = check_binary(op, dtype, device)[0]
        for op in UNARY:
            out[op, dtype] = check_unary(op, dtype, device)[0]
        out["fma", dtype] = check_fma(dtype, device)[0]
        out["where", dtype] = check_where(dtype, device)[0]
    return out
