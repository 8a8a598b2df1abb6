"""Eager ops against references nobody here wrote: torch 2.13 CPU eager (bit-exact where its
kernel is correctly rounded), NumPy float64 / scipy / Python math (fp64 references), and
NumPy for broadcasting and strided views (hypothesis)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import castlab as cl

torch = pytest.importorskip("torch")
special = pytest.importorskip("scipy.special")
from castlab.torch._aten import TORCH_OPS, castlab_fn, torch_pairs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

NP = {cl.bfloat16: ml_dtypes.bfloat16, cl.float16: np.float16, cl.float32: np.float32,
      cl.float64: np.float64, cl.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
      cl.float8_e5m2: ml_dtypes.float8_e5m2, cl.bool: np.bool_, cl.int32: np.int32,
      cl.int64: np.int64}
TD = {cl.bfloat16: torch.bfloat16, cl.float16: torch.float16, cl.float32: torch.float32,
      cl.float64: torch.float64, cl.float8_e4m3fn: torch.float8_e4m3fn,
      cl.float8_e5m2: torch.float8_e5m2, cl.bool: torch.bool, cl.int32: torch.int32,
      cl.int64: torch.int64}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SINT = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
FLOATS = [cl.bfloat16, cl.float16, cl.float32]


# ----------------------------------------------------------------------------- helpers

def to_torch(a: np.ndarray):
    a = np.ascontiguousarray(a)
    dt = cl.as_dtype(a.dtype)
    if a.dtype.kind in "fbiu" and a.dtype in (np.float16, np.float32, np.float64, np.bool_,
                                                np.int32, np.int64):
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(SINT[a.itemsize])).view(TD[dt])


def from_torch(t) -> np.ndarray:
    dt = cl.as_dtype(t.dtype)
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        ib = {1: torch.uint8, 2: torch.int16}[t.element_size()]
        return t.contiguous().view(ib).numpy().view(UINT[t.element_size()]).view(NP[dt])
    return t.numpy()


def C(a: np.ndarray):
    return cl.from_numpy(np.asarray(a, order="C"))


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(UINT[a.itemsize]) if a.dtype != np.bool_ else a


def isnan(a):
    return np.isnan(a.astype(np.float64)) if a.dtype != np.bool_ else np.zeros(a.shape, bool)


def assert_same(got: np.ndarray, exp: np.ndarray, what: str = "", inputs=()):
    got, exp = np.asarray(got), np.asarray(exp)
    assert got.dtype == exp.dtype, (what, got.dtype, exp.dtype)
    assert got.shape == exp.shape, (what, got.shape, exp.shape)
    gn, en = isnan(got), isnan(exp)
    bad = (gn != en) | (~en & (bits(got) != bits(exp)))
    if bad.any():
        idx = np.flatnonzero(bad.ravel())[:6]
        rows = []
        for i in idx:
            ins = ", ".join(repr(np.broadcast_to(x, got.shape).ravel()[i]) for x in inputs)
            rows.append(f"  [{i}] ({ins}) got {got.ravel()[i]!r} expected {exp.ravel()[i]!r}")
        raise AssertionError(f"{what}: {int(bad.sum())}/{bad.size} differ\n" + "\n".join(rows))


def ordered(a: np.ndarray) -> np.ndarray:
    b = bits(a)
    w = 8 * a.itemsize
    mag = (b & b.dtype.type((1 << (w - 1)) - 1)).astype(np.int64)
    return np.where((b >> b.dtype.type(w - 1)) != 0, -mag, mag)


def ulp_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(ordered(a) - ordered(b))


ALL_BF16 = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16)


def random_operand(dt, n: int, seed: int) -> np.ndarray:
    """Half random bit patterns (NaN, Inf, subnormals included), half 'ordinary' values."""
    rng = np.random.default_rng(seed)
    nb = dt.itemsize
    raw = rng.integers(0, 2 ** (8 * nb), size=n // 2, dtype=np.uint64).astype(UINT[nb]).view(NP[dt])
    ordinary = (rng.standard_normal(n - n // 2) * 10).astype(np.float32).astype(NP[dt])
    out = np.concatenate([raw, ordinary])
    rng.shuffle(out)
    return out


def operand_sets(dt):
    """(a, b) pairs: for bf16, every bit pattern against a shuffled copy and against
    ordinary values; for fp16/fp32, a million random operands (plus every fp16 pattern)."""
    if dt is cl.bfloat16:
        rng = np.random.default_rng(1)
        yield ALL_BF16, rng.permutation(ALL_BF16)
        yield ALL_BF16, random_operand(dt, 65536, 2)
        yield random_operand(dt, 65536, 3), ALL_BF16
    else:
        n = 1_000_000
        yield random_operand(dt, n, 4), random_operand(dt, n, 5)
        if dt is cl.float16:
            yield np.arange(65536, dtype=np.uint16).view(np.float16), random_operand(dt, 65536, 6)


# ----------------------------------------------------------------------------- exact binary ops

# Every binary op with an ATen op but pow (correctly rounded in no library).
BINARY = torch_pairs("binary", "compare", exclude=("pow",), castlab_first=True)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_bit_exact_vs_torch(op, dt):
    cf, tf = BINARY[op]
    for a, b in operand_sets(dt):
        got = cf(C(a), C(b)).numpy()
        exp = from_torch(tf(to_torch(a), to_torch(b)))
        assert_same(got, exp, f"{op} {dt.name}", (a, b))


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_operators_match_functions(dt):
    a, b = next(operand_sets(dt))
    A, B = C(a), C(b)
    for got, ref in [(A + B, cl.add(A, B)), (A - B, cl.sub(A, B)), (A * B, cl.mul(A, B)),
                     (A / B, cl.div(A, B)), (-A, cl.neg(A)), (A < B, cl.lt(A, B)),
                     (A == B, cl.eq(A, B)), (A ** 2, cl.square(A))]:
        assert_same(got.numpy(), ref.numpy(), "operator")


UNARY_EXACT = {  # the correctly rounded unary ops
    **{n: torch_pairs(castlab_first=True)[n] for n in ("neg", "abs", "sqrt", "square", "reciprocal")},
    "pow2": (lambda x: cl.pow(x, 2), lambda x: torch.pow(x, 2)),
    "pow_op2": (lambda x: x ** 2, lambda x: x ** 2),
}


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", list(UNARY_EXACT))
def test_unary_exact_vs_torch(op, dt):
    cf, tf = UNARY_EXACT[op]
    for a, _ in operand_sets(dt):
        exp = from_torch(tf(to_torch(a)))
        assert_same(cf(C(a)).numpy(), exp, f"{op} {dt.name}", (a,))
        if op == "sqrt" and dt is cl.float32:
            # torch 2.13 CPU's fp32 sqrt is MKL VML's, NOT correctly rounded (8.6% of these
            # samples differ by 1 ulp, e.g. sqrt(18.93106f) = 4.3509836 vs IEEE 4.350984):
            # the default torch_eager math calls the same MKL function (torch is loaded
            # here); portable math is IEEE, as NumPy's float32 sqrt.
            with cl.use_math("portable"):
                assert_same(cf(C(a)).numpy(), np.sqrt(a), "portable sqrt float32", (a,))


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_where_vs_torch(dt):
    for a, b in operand_sets(dt):
        cond = np.random.default_rng(0).random(a.shape) < 0.5
        assert_same(cl.where(C(cond), C(a), C(b)).numpy(),
                    from_torch(torch.where(to_torch(cond), to_torch(a), to_torch(b))), "where")
        # scalar branch, as torch: where(x > 0, x, 0.0)
        got = cl.where(C(a) > 0, C(a), 0.0).numpy()
        ta = to_torch(a)
        assert_same(got, from_torch(torch.where(ta > 0, ta, 0.0)), "where scalar")


@pytest.mark.parametrize("src", FLOATS + [cl.float8_e4m3fn, cl.float8_e5m2], ids=lambda d: d.name)
@pytest.mark.parametrize("dst", FLOATS + [cl.float64], ids=lambda d: d.name)
def test_astype_vs_torch(src, dst):
    if src.itemsize == 1:
        a = np.arange(256, dtype=np.uint8).view(NP[src])
    else:
        a = next(operand_sets(src))[0]
    assert_same(C(a).astype(dst).numpy(), from_torch(to_torch(a).to(TD[dst])),
                f"{src.name}->{dst.name}", (a,))


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_cat_stack_vs_torch(dt):
    rng = np.random.default_rng(0)
    a = random_operand(dt, 6 * 5 * 4, 1).reshape(6, 5, 4)
    b = random_operand(dt, 6 * 3 * 4, 2).reshape(6, 3, 4)
    assert_same(cl.cat([C(a), C(b)], dim=1).numpy(),
                from_torch(torch.cat([to_torch(a), to_torch(b)], dim=1)), "cat")
    assert_same(cl.cat([C(a)[:, :, ::2], C(a)[:, :, 1::2]], dim=-1).numpy(),
                np.concatenate([a[:, :, ::2], a[:, :, 1::2]], axis=-1), "cat of views")
    c = random_operand(dt, 6 * 5 * 4, 3).reshape(6, 5, 4)
    assert_same(cl.stack([C(a), C(c)], dim=2).numpy(),
                from_torch(torch.stack([to_torch(a), to_torch(c)], dim=2)), "stack")
    _ = rng


def test_cat_promotes_like_torch():
    a = np.ones((2, 2), ml_dtypes.bfloat16)
    b = np.full((1, 2), 0.1, np.float16)
    got = cl.cat([C(a), C(b)])
    exp = torch.cat([to_torch(a), to_torch(b)])
    assert got.dtype.name == str(exp.dtype).removeprefix("torch.")
    assert_same(got.numpy(), from_torch(exp), "cat promotion")


# ----------------------------------------------------------------------------- broadcasting, scalars

@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "lt"])
def test_broadcasting_vs_torch(op, dt):
    cf, tf = BINARY[op]
    a = random_operand(dt, 64 * 1 * 32, 1).reshape(64, 1, 32)
    b = random_operand(dt, 7 * 32, 2).reshape(7, 32)
    c = random_operand(dt, 1, 3).reshape(())
    for x, y in [(a, b), (b, a), (a, c), (c, b), (a[:, :, :1], b[:1])]:
        assert_same(cf(C(x), C(y)).numpy(), from_torch(tf(to_torch(x), to_torch(y))),
                    f"{op} broadcast {x.shape} {y.shape}")


SCALARS = [0.5, 0.1, 2, -3, 1e-3, 3.0e38, 1 / 3, True]


def _f32_ref(a: np.ndarray, s, f, dt) -> np.ndarray:
    """The weak-scalar semantics of the design (PyTorch CUDA's): the tensor widened to
    fp32, the scalar held in fp32, one IEEE fp32 op (NumPy float32), rounded once to dt."""
    with np.errstate(all="ignore"):
        r = f(a.astype(np.float32), np.float32(s))
    return cl.from_numpy(np.asarray(r, np.float32)).astype(dt).numpy()


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("s", SCALARS, ids=repr)
def test_python_scalars_are_weak(dt, s):
    a = next(operand_sets(dt))[0]
    A, T = C(a), to_torch(a)
    cases = {
        "x*s": (A * s, lambda u, v: u * v, lambda: T * s),
        "s*x": (s * A, lambda u, v: v * u, lambda: s * T),
        "x+s": (A + s, lambda u, v: u + v, lambda: T + s), "x-s": (A - s, lambda u, v: u - v, None),
        "s-x": (s - A, lambda u, v: v - u, None), "x/s": (A / s, lambda u, v: u / v, lambda: T / s),
        "s/x": (s / A, lambda u, v: v / u, None),
        "max": (cl.maximum(A, s), np.maximum, lambda: torch.clamp_min(T, s)),
    }
    # ATen's CPU add and sub (ufunc kernels) read the Python number as the tensor's dtype
    # (to float, then rounded); castlab's torch_cpu implementation (the default math on
    # the CPU) does too, where mul, div and clamp keep it in fp32
    s16 = float(np.float32(s).astype(NP[dt])) if dt.bits == 16 else s
    for k, (g, f, tref) in cases.items():
        assert g.dtype is dt, (k, g.dtype)
        ref_s = s16 if k in ("x+s", "x-s", "s-x") else s
        with np.errstate(over="ignore"):
            want = _f32_ref(a, ref_s, f, dt)
        assert_same(g.numpy(), want, f"{k} with s={s!r} vs fp32 reference", (a,))
        # torch CPU agrees (s / x is reciprocal(x) * s there: two roundings, not compared)
        if tref is not None:
            try:
                tr = tref()
            except RuntimeError:  # torch refuses scalars out of fp16's range
                continue
            assert_same(g.numpy(), from_torch(tr), f"{k} with s={s!r} vs torch", (a,))


def test_weak_scalar_bf16_times_half():
    x = cl.tensor([1.0, 3.0, 2**-133], dtype=cl.bfloat16)
    y = x * 0.5
    assert y.dtype is cl.bfloat16
    assert y.tolist() == [0.5, 1.5, 0.0]  # 2^-134 ties to even: 0


def test_int_tensor_float_scalar_promotes_to_float32():
    x = cl.tensor([1, 2, 3], dtype=cl.int32)
    assert (x * 0.5).dtype is cl.float32
    assert (x * 0.5).tolist() == [0.5, 1.0, 1.5]


# ----------------------------------------------------------------------------- type promotion

ALL_DT = [cl.float64, cl.float32, cl.float16, cl.bfloat16, cl.float8_e4m3fn, cl.float8_e5m2,
          cl.bool, cl.int32, cl.int64]


@pytest.mark.parametrize("a", ALL_DT, ids=lambda d: d.name)
@pytest.mark.parametrize("b", ALL_DT, ids=lambda d: d.name)
def test_promotion_table_vs_torch(a, b):
    ta, tb = torch.zeros(2, dtype=TD[a]), torch.zeros(2, dtype=TD[b])
    try:
        exp = torch.result_type(ta, tb)
    except RuntimeError:
        exp = None
    if exp is None:
        with pytest.raises(TypeError, match="float8|promotion"):
            cl.promote_types(a, b)
        with pytest.raises(TypeError):
            cl.add(cl.zeros(2, dtype=a), cl.zeros(2, dtype=b))
        return
    assert cl.promote_types(a, b).name == str(exp).removeprefix("torch.")
    if a.is_floating_point or b.is_floating_point:
        got = cl.add(cl.zeros(2, dtype=a), cl.zeros(2, dtype=b))
        assert got.dtype.name == str(exp).removeprefix("torch."), (a, b, got.dtype, exp)
        assert cl.lt(cl.zeros(2, dtype=a), cl.zeros(2, dtype=b)).dtype is cl.bool


# ----------------------------------------------------------------------------- transcendentals

REF64 = {
    "exp": np.exp, "log": np.log, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "silu": lambda x: x / (1 + np.exp(-x)), "tanh": np.tanh,
    "gelu": lambda x: 0.5 * x * (1 + special.erf(x / np.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "rsqrt": lambda x: 1 / np.sqrt(x), "reciprocal": lambda x: 1 / x, "cos": np.cos,
    "sin": np.sin, "erf": special.erf,
}
CLF = {k: castlab_fn(k) for k in REF64}
TF = {k: TORCH_OPS[k] for k in REF64}  # the op table's aten column

# Exact-match rates (%) measured on this machine (x86-64, glibc libm, torch 2.13 CPU) over:
# bf16 = all 65,536 patterns; f16/f32 = 1M samples of N(0, 4^2) (fixed seed); each as
# (vs torch CPU eager, vs the fp64 reference rounded once to the dtype), over finite
# inputs with finite references. The asserted bound is measured - max(0.005, 5% of the
# miss rate), i.e. "a bit below". Notes on the low ones:
# - f32 sigmoid/silu/rsqrt vs fp64: the PyTorch formulas round 2-3 times in fp32, so only
#   ~65-72% land on the correctly rounded value (torch agrees bit-for-bit on rsqrt).
# - gelu (both forms) f32: x*0.5*(1+erf(x/sqrt2)) cancels for x < 0, so one ulp of erf
#   becomes many ulps of the result; torch's vectorised erf differs from glibc's erff.
# - gelu (erf form) torch_eager f32/bf16: PyTorch's oneDNN kernel, which castlab follows;
#   its accuracy depends on oneDNN's form for the CPU (vs fp64: f32 43.51% minimax on AVX512
#   cores, 32.75% Abramowitz & Stegun on AVX2; bf16 98.83% on avx512_bf16, 99.82% where
#   bf16 stays on Gelu.h): the lower of each is listed.
# - erf bf16, portable vs torch: 56%: torch CPU's bf16 erf is not the correctly rounded one
#   (portable matches the fp64 reference on 100% of bf16 inputs).
# - torch_eager on the CPU is the torch_cpu implementation (SLEEF, ATen's A&S erf): equal to
#   torch wherever PyTorch's kernel is reproduced. fp32 sigmoid/silu/gelu_tanh and fp16
#   gelu/gelu_tanh are exact in PyTorch's vector body, but the scalar tail of each thread
#   chunk calls glibc (where it falls depends on the thread count and ISA), so they are
#   entered as 99.99. fp32 exp/log/sin/cos/tanh/erf call MKL VML from torch's own
#   libtorch_cpu.so (torch is imported here), as PyTorch does: 100% equal to torch, and
#   MKL's HA functions are not correctly rounded, hence the fp64-reference rates (portable
#   math's rates against torch, mirrored). fp32/bf16 gelu (oneDNN) is not reproduced:
#   castlab's portable erf stands in. bf16 erf is ATen's A&S polynomial, hence 56% against
#   the fp64 reference.
# - portable sin/cos bf16: 100% over all patterns, huge arguments included (an earlier
#   math_portable.h did not reduce |x| >= 2^50 and scored 69.4%; see
#   test_portable_sincos_huge_arguments).
MEASURED = {
    # op: {math: {dtype: (vs torch, vs fp64 ref)}}
    "exp": {"torch_eager": {"bf16": (100, 100), "f16": (100, 99.9997), "f32": (100, 98.9906)},
            "portable": {"bf16": (100, 100), "f16": (100, 99.9997), "f32": (98.9889, 99.9635)}},
    "log": {"torch_eager": {"bf16": (100, 100), "f16": (100, 100), "f32": (100, 92.0266)},
            "portable": {"bf16": (100, 100), "f16": (100, 100), "f32": (92.0264, 99.9998)}},
    "sigmoid": {"torch_eager": {"bf16": (100, 99.9877), "f16": (100, 99.9989), "f32": (99.99, 64.8613)},
                "portable": {"bf16": (100, 99.9877), "f16": (100, 99.9989), "f32": (95.9879, 65.2126)}},
    "silu": {"torch_eager": {"bf16": (100, 99.9740), "f16": (100, 100), "f32": (99.99, 69.5522)},
             "portable": {"bf16": (100, 99.9740), "f16": (100, 100), "f32": (95.8448, 69.9123)}},
    "tanh": {"torch_eager": {"bf16": (100, 100), "f16": (100, 100), "f32": (100, 99.8696)},
             "portable": {"bf16": (100, 100), "f16": (100, 100), "f32": (99.8602, 99.9878)}},
    "gelu": {"torch_eager": {"bf16": (100, 98.8281), "f16": (99.99, 92.5580), "f32": (100, 32.7535)},
             "portable": {"bf16": (99.9954, 99.8254), "f16": (96.8033, 94.3079), "f32": (48.4136, 50.1493)}},
    "gelu_tanh": {"torch_eager": {"bf16": (100, 99.8591), "f16": (99.99, 95.2050), "f32": (99.99, 51.7239)},
                  "portable": {"bf16": (99.9939, 99.8591), "f16": (99.5715, 95.2223), "f32": (99.1244, 51.7110)}},
    "rsqrt": {"torch_eager": {"bf16": (100, 100), "f16": (100, 100), "f32": (100, 72.5011)},
              "portable": {"bf16": (100, 100), "f16": (100, 100), "f32": (100, 72.5011)}},
    "reciprocal": {"torch_eager": {"bf16": (100, 100), "f16": (100, 100), "f32": (100, 100)},
                   "portable": {"bf16": (100, 100), "f16": (100, 100), "f32": (100, 100)}},
    "cos": {"torch_eager": {"bf16": (100, 100), "f16": (100, 99.9996), "f32": (100, 95.0190)},
            "portable": {"bf16": (100, 100), "f16": (100, 99.9996), "f32": (95.0197, 99.9987)}},
    "sin": {"torch_eager": {"bf16": (100, 100), "f16": (100, 99.9974), "f32": (100, 95.0757)},
            "portable": {"bf16": (100, 100), "f16": (100, 99.9974), "f32": (95.0764, 99.9987)}},
    "erf": {"torch_eager": {"bf16": (100, 56.0509), "f16": (100, 99.9679), "f32": (100, 98.8999)},
            "portable": {"bf16": (56.0509, 100), "f16": (99.9679, 100), "f32": (98.8998, 99.9581)}},
}


# fp32 ops whose PyTorch kernel is MKL VML, which torch_eager math calls from torch's library
_MKL_OPS = ("exp", "log", "sin", "cos", "tanh", "erf")


def _bound(measured: float) -> float:
    return measured - max(0.005, 0.05 * (100 - measured))


def _torch_bound(measured: float) -> float:
    """castlab's agreement with torch CPU: exact claims (100%) hold everywhere; other rates
    depend on which kernel torch's CPU dispatch picks on this machine's ISA (gelu bf16:
    99.9954% on one x86-64 machine, 98.99% on an AMD EPYC), so they get a margin that no
    ISA-dependent difference should exceed. castlab's own accuracy (the fp64 reference
    rate) is asserted without that margin: it does not depend on the CPU."""
    return 100.0 if measured == 100 else measured - max(1.5, 0.5 * (100 - measured))


_SAMPLES = {}


def _samples(dt):
    if dt not in _SAMPLES:
        if dt is cl.bfloat16:
            _SAMPLES[dt] = ALL_BF16
        else:
            rng = np.random.default_rng(0)
            x = rng.standard_normal(2_000_000) * 4
            _SAMPLES[dt] = (x[:1_000_000] if dt is cl.float32 else x[1_000_000:]).astype(NP[dt])
    return _SAMPLES[dt]


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("mathv", ["torch_eager", "portable"])
@pytest.mark.parametrize("op", list(REF64))
def test_transcendental_exact_match_rates(op, mathv, dt):
    x = _samples(dt)
    with cl.use_math(mathv):
        y = CLF[op](C(x)).numpy()
    assert y.dtype == x.dtype
    yt = from_torch(TF[op](to_torch(x)))
    r64 = REF64[op](x.astype(np.float64))
    yr = cl.from_numpy(r64).astype(dt).numpy()  # one rounding from fp64 (test_conversions)
    fin = np.isfinite(x.astype(np.float64)) & np.isfinite(r64)
    # NaN results only where the reference is NaN
    assert not np.isnan(y.astype(np.float64))[fin].any()
    rate_t = 100 * (ulp_dist(y[fin], yt[fin]) == 0).mean()
    rate_r = 100 * (ulp_dist(y[fin], yr[fin]) == 0).mean()
    mt, mr = MEASURED[op][mathv][dt.short]
    if (mathv == "torch_eager" and dt is cl.float32 and op in _MKL_OPS
            and cl._torch_vml.unavailable() is not None):
        mt, mr = MEASURED[op]["portable"][dt.short]  # MKL VML not callable: the stand-in
    # Where PyTorch's CPU kernel is a library that picks its code path from the CPU (MKL
    # VML's fp32 functions, oneDNN's gelu), that library's accuracy is the CPU's: castlab
    # under torch_eager calls or rebuilds the same path, so its rate against the fp64
    # reference is torch's own on this CPU (the measured rates are one AMD EPYC's), and
    # portable math's agreement with torch is not a property of castlab.
    library = ((dt is cl.float32 and op in _MKL_OPS and cl._torch_vml.unavailable() is None)
               or (op == "gelu" and cl._onednn.gelu_calls_onednn(dt.name)
                   and bool(cl.Math.preset("torch_eager")._onednn_gelu(op, dt.name, False))))
    if library and mathv == "torch_eager":
        rate_tr = 100 * (ulp_dist(yt[fin], yr[fin]) == 0).mean()
        assert rate_t == 100, f"{op}/{mathv}/{dt.short}: {rate_t:.4f}% == torch"
        assert rate_r == rate_tr, (op, mathv, dt.short, rate_r, rate_tr)
        return
    if not (library and mathv == "portable"):
        assert rate_t >= _torch_bound(mt), (
            f"{op}/{mathv}/{dt.short}: {rate_t:.4f}% == torch (measured {mt})")
    assert rate_r >= _bound(mr), f"{op}/{mathv}/{dt.short}: {rate_r:.4f}% == fp64 ref (measured {mr})"


@pytest.mark.parametrize("mathv", ["torch_eager", "portable"])
@pytest.mark.parametrize("op", ["exp", "log", "tanh", "sin", "cos", "erf"])
def test_transcendental_f32_within_2ulp_of_fp64(op, mathv):
    # single-function ops: at most 2 ulp from the correctly rounded value (issue 3)
    x = _samples(cl.float32)
    with cl.use_math(mathv):
        y = CLF[op](C(x)).numpy()
    r = REF64[op](x.astype(np.float64)).astype(np.float32)
    fin = np.isfinite(r)
    assert ulp_dist(y[fin], r[fin]).max() <= 2


def test_portable_sincos_huge_arguments():
    x = np.array([1e20, 1e30, 3e38, 2.0**60], np.float32)
    with cl.use_math("portable"):
        s = cl.sin(C(x)).numpy().astype(np.float64)
        c = cl.cos(C(x)).numpy().astype(np.float64)
    assert np.allclose(s, np.sin(x.astype(np.float64)), atol=1e-6)
    assert np.allclose(c, np.cos(x.astype(np.float64)), atol=1e-6)


def test_special_values():
    x = C(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0], np.float32))
    for mathv in ("torch_eager", "portable"):
        with cl.use_math(mathv):
            e = cl.exp(x).numpy()
            lg = cl.log(x).numpy()
            sg = cl.sigmoid(x).numpy()
            th = cl.tanh(x).numpy()
        assert e[:4].tolist() == [1, 1, np.inf, 0] and np.isnan(e[4])
        assert lg[:3].tolist() == [-np.inf, -np.inf, np.inf] and np.isnan(lg[3:]).all()
        assert sg[:4].tolist() == [0.5, 0.5, 1, 0] and np.isnan(sg[4])
        assert th[:4].tolist() == [0, 0, 1, -1] and np.signbit(th[1]) and np.isnan(th[4])


# ----------------------------------------------------------------------------- fp64 vs math

FP64_MATH = {"exp": math.exp, "log": math.log, "sin": math.sin, "cos": math.cos,
             "tanh": math.tanh, "erf": math.erf, "sqrt": math.sqrt}


@pytest.mark.parametrize("op", list(FP64_MATH))
def test_fp64_vs_python_math(op):
    rng = np.random.default_rng(42)
    x = np.concatenate([rng.standard_normal(3000) * 5, rng.uniform(-700, 700, 1000)])
    if op in ("log", "sqrt"):
        x = np.concatenate([np.abs(x), np.exp(rng.uniform(-700, 700, 1000))])
    if op in ("sin", "cos"):
        x = np.concatenate([x, rng.uniform(-1e6, 1e6, 1000)])
    exp = np.array([FP64_MATH[op](float(v)) for v in x])
    # The libm variant on the CPU is the C library, which Python's math calls too:
    # bit-exact (sqrt is IEEE everywhere).
    with cl.use_math(cl.Math(impl="libm")):
        y = CLF[op](C(x)).numpy() if op != "sqrt" else cl.sqrt(C(x)).numpy()
    assert_same(y, exp, f"fp64 {op} (libm)", (x,))
    if op != "sqrt":
        with cl.use_math("portable"):
            yp = CLF[op](C(x)).numpy()
        d = ulp_dist(yp, exp)
        assert d.max() <= 2, f"portable fp64 {op}: max {d.max()} ulp"


def test_fp64_arithmetic_vs_python():
    rng = np.random.default_rng(5)
    a = rng.standard_normal(2000) * np.exp2(rng.integers(-60, 60, 2000))
    b = rng.standard_normal(2000) * np.exp2(rng.integers(-60, 60, 2000))
    A, B = C(a), C(b)
    for got, f in [(A + B, lambda u, v: u + v), (A - B, lambda u, v: u - v),
                   (A * B, lambda u, v: u * v), (A / B, lambda u, v: u / v),
                   (cl.fma(A, B, A), lambda u, v: math.fma(u, v, u) if hasattr(math, "fma") else None)]:
        exp = [f(float(u), float(v)) for u, v in zip(a, b)]
        if exp[0] is None:
            continue
        assert_same(got.numpy(), np.array(exp), "fp64 arithmetic")


def test_fma_single_rounding_f32():
    # fma(a, b, c) in op-math with one rounding: a*b exact in fp64 for fp32 inputs, so the
    # fp64 product + c rounded once is the reference when it is exact in fp64.
    rng = np.random.default_rng(9)
    a = rng.standard_normal(100000).astype(np.float32)
    b = rng.standard_normal(100000).astype(np.float32)
    c = (rng.standard_normal(100000) * 1e-3).astype(np.float32)
    from fractions import Fraction

    got = cl.fma(C(a), C(b), C(c)).numpy()
    for i in range(0, 100000, 97):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        # correctly rounded: no fp32 neighbour of the result is closer to the exact value
        g = Fraction(float(got[i]))
        lo = np.nextafter(got[i], np.float32(-np.inf))
        hi = np.nextafter(got[i], np.float32(np.inf))
        assert abs(g - exact) <= abs(Fraction(float(lo)) - exact)
        assert abs(g - exact) <= abs(Fraction(float(hi)) - exact)


# ----------------------------------------------------------------------------- hypothesis: views

@st.composite
def broadcast_pair(draw):
    nd = draw(st.integers(0, 4))
    shape = draw(st.lists(st.integers(1, 5), min_size=nd, max_size=nd))
    def sub(s):
        k = draw(st.integers(0, len(s)))
        s = s[len(s) - k:]
        return [1 if draw(st.booleans()) else d for d in s]
    return tuple(sub(shape)), tuple(sub(shape))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(broadcast_pair(), st.sampled_from(["add", "sub", "mul", "div", "maximum", "minimum"]),
       st.integers(0, 2**31))
def test_hyp_broadcasting_fp64_vs_numpy(shapes, op, seed):
    sa, sb = shapes
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb) + 3
    npf = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "maximum": np.maximum, "minimum": np.minimum}[op]
    got = getattr(cl, op)(C(a), C(b)).numpy()
    assert_same(got, npf(a, b), op)


@st.composite
def strided_view(draw):
    nd = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 7), min_size=nd, max_size=nd))
    key = []
    for d in shape:
        start = draw(st.integers(-d, d - 1))
        stop = draw(st.one_of(st.none(), st.integers(-d, d)))
        step = draw(st.integers(1, 3))
        key.append(slice(start, stop, step))
    perm = draw(st.permutations(list(range(nd))))
    return tuple(shape), tuple(key), tuple(perm)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(strided_view(), strided_view(), st.sampled_from(["add", "mul", "div", "sub"]),
       st.sampled_from(["exp", "neg", "sqrt", "tanh", "abs"]), st.integers(0, 2**31))
def test_hyp_strided_offset_views_fp64(v1, v2, op, uop, seed):
    rng = np.random.default_rng(seed)
    shape, key, perm = v1
    base = rng.uniform(0.5, 2.0, shape)
    A = C(base)[key].permute(*perm)
    a = base[key].transpose(perm)
    assert A.shape == a.shape
    un = {"exp": np.exp, "neg": np.negative, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs}[uop]
    # portable math: the default (torch_eager) takes torch CPU's fp64 sqrt, MKL's and not
    # correctly rounded, once any test of the process has imported torch
    with cl.use_math("portable"):
        got = getattr(cl, uop)(A).numpy()
        # the view gives the same bits as the same op on a contiguous copy ...
        assert_same(got, getattr(cl, uop)(C(np.ascontiguousarray(a))).numpy(), uop)
    if uop in ("neg", "sqrt", "abs"):  # ... and as NumPy (exact ops: bit for bit; NumPy's
        assert_same(got, un(a), uop)    # exp/tanh are its own SIMD code, not the C library)
    else:
        np.testing.assert_allclose(got, un(a), rtol=4e-16, atol=0)
    # binary with a second strided operand broadcast onto it (reversed dims of size 1 where
    # needed): b's last dims = a's last dims
    shape2, key2, perm2 = v2
    base2 = rng.uniform(0.5, 2.0, shape2)
    b = base2[key2].transpose(perm2)
    B = C(base2)[key2].permute(*perm2)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        b = b.reshape(-1)[:1].reshape(()) if b.size else np.float64(1.0).reshape(())
        B = C(np.ascontiguousarray(b))
    npf = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]
    assert_same(getattr(cl, op)(A, B).numpy(), npf(a, b), op)


# ----------------------------------------------------------------------------- bad input

def test_bad_inputs_raise_clearly():
    with pytest.raises(ValueError, match="broadcast"):
        cl.add(cl.zeros(3), cl.zeros(4))
    with pytest.raises(ValueError, match="broadcast"):
        cl.zeros(2, 3) * cl.zeros(3, 2)
    with pytest.raises(TypeError, match="bool"):
        cl.sin(cl.tensor([True, False]))
    # integer input to a float op promotes to the default float, as torch
    assert cl.exp(cl.tensor([1, 2], dtype=cl.int32)).dtype is cl.float32
    with pytest.raises(TypeError):
        cl.add(cl.tensor([1, 2], dtype=cl.int32), 1)  # integer arithmetic: not castlab's job
    with pytest.raises(ValueError, match="cat"):
        cl.cat([cl.zeros(2, 3), cl.zeros(2, 4)])
    with pytest.raises(ValueError):
        cl.cat([cl.zeros(2, 3), cl.zeros(2, 3, 1)], dim=0)
    with pytest.raises(ValueError):
        cl.cat([])
    with pytest.raises(IndexError, match="out of range"):
        cl.cat([cl.zeros(2), cl.zeros(2)], dim=1)
    with pytest.raises(IndexError, match="out of range"):
        cl.zeros(2, 3).transpose(0, 5)
    with pytest.raises(IndexError, match="out of range"):
        cl.chunk(cl.zeros(2, 3), 2, dim=2)
    with pytest.raises((IndexError, ValueError)):
        cl.stack([cl.zeros(2), cl.zeros(2)], dim=3)
    with pytest.raises(ValueError, match="approximate"):
        cl.gelu(cl.zeros(2), approximate="fast")
    with pytest.raises(TypeError, match="float8|promotion"):
        cl.zeros(2, dtype=cl.float8_e4m3fn) + cl.zeros(2, dtype=cl.float8_e5m2)
    with pytest.raises(ValueError, match="unknown math preset"):
        with cl.use_math("nope"):
            pass


@pytest.mark.parametrize("policy", ["eager", "fused"])
def test_zero_constants_keep_their_sign_in_one_program(policy):
    """0.0 and -0.0 are equal as Python floats but not as constants: a program holding
    both gives each its own register (where(x > 0, 0.0, -0.0) is -0.0 where x <= 0)."""
    x = cl.tensor([1.0, -1.0, 0.0])
    cases = [(lambda a: cl.where(a > 0, 0.0, -0.0), [False, True, True]),
             (lambda a: cl.where(a > 0, -0.0, 0.0), [True, False, False])]
    for f, want in cases:
        got = np.signbit(np.asarray(cl.jit(f).run(x, policy=policy).tolist())).tolist()
        assert got == want, (got, want)
