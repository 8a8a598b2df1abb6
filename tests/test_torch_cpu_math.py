"""castlab's torch_cpu math (ops/scalar/math_torch_cpu.h) against PyTorch's CPU build.

Two levels:
- the functions themselves against the Sleef_* symbols libtorch_cpu.so exports (called
  through a small C shim compiled here, since they take AVX2 vectors), over 10M random
  float and 1M double inputs plus special values;
- castlab's eager ops under the torch_eager preset against torch CPU eager: every unary
  op over all 65,536 bf16 and fp16 patterns (contiguous and strided), the SLEEF-path
  fp32/fp64 ops on random and special inputs, and SwiGLU/GELU-gated chains.

- gelu (erf form) on contiguous fp32 (and bf16 where oneDNN takes bf16), which PyTorch
  computes with oneDNN's JIT eltwise_gelu_erf: castlab's re-implementation of it
  (ops/scalar/math_onednn.h) over 16M random and special inputs, every length 1..100 at
  several offsets, 1 and 2 torch threads, oneDNN's AVX2 and AVX512 forms and bf16 stores;
- fp32/fp64 exp, log, sin, cos, tanh, erf and sqrt, which PyTorch computes with MKL VML:
  castlab calls the same functions from libtorch_cpu.so (skipped where they cannot be
  borrowed), and the scalar tails of cpu_kernel_vec loops (every length 1..160, and an odd
  size over several thread chunks with 1 and 2 torch threads).

PyTorch runs its AVX2 (or AVX512) kernels only on such CPUs; with the DEFAULT capability
its loops call the C library everywhere, so these tests are skipped there. torch's thread
count is 1 unless a test says otherwise (docs/torch_cpu_kernels.md).
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess

import numpy as np
import pytest

import castlab as cl
from castlab import _optable

torch = pytest.importorskip("torch")
from castlab.torch._aten import castlab_fn, torch_pairs  # noqa: E402

_CAP = torch.backends.cpu.get_cpu_capability() if platform.machine() in ("x86_64", "AMD64") else ""
pytestmark = pytest.mark.skipif(
    _CAP not in ("AVX2", "AVX512"),
    reason="needs an x86-64 CPU where PyTorch dispatches its AVX2/AVX512 kernels (capability "
           f"{_CAP or platform.machine()!r}): without them PyTorch's loops call glibc for every "
           "element, which torch_cpu math does not model")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _to_cl(t):
    return cl.from_dlpack(t)


def _to_torch(x):
    return torch.from_dlpack(x)


def _mismatches(a, b) -> int:
    """Bitwise differences, NaN equal to NaN (payloads differ between PyTorch's vector and
    scalar conversions, and castlab canonicalises them)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    ia = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    same = a.contiguous().view(ia) == b.contiguous().view(ia)
    nan = torch.isnan(a) & torch.isnan(b)
    return int((~(same | nan)).sum())


# ------------------------------------------------------------------ the functions

_SHIM = r"""
#include <dlfcn.h>
#include <immintrin.h>
typedef __m256 (*F1)(__m256);
typedef __m256 (*F2)(__m256, __m256);
typedef __m256d (*D1)(__m256d);
typedef __m256d (*D2)(__m256d, __m256d);
static void* lib;
int shim_open(const char* path) { lib = dlopen(path, RTLD_NOW | RTLD_LOCAL); return lib != 0; }
int shim_f1(const char* name, const float* x, float* y, long n) {
  F1 f = (F1)dlsym(lib, name); if (!f) return 0;
  for (long i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
  return 1;
}
int shim_f2(const char* name, const float* x, const float* z, float* y, long n) {
  F2 f = (F2)dlsym(lib, name); if (!f) return 0;
  for (long i = 0; i < n; i += 8)
    _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i), _mm256_loadu_ps(z + i)));
  return 1;
}
int shim_d1(const char* name, const double* x, double* y, long n) {
  D1 f = (D1)dlsym(lib, name); if (!f) return 0;
  for (long i = 0; i < n; i += 4) _mm256_storeu_pd(y + i, f(_mm256_loadu_pd(x + i)));
  return 1;
}
int shim_d2(const char* name, const double* x, const double* z, double* y, long n) {
  D2 f = (D2)dlsym(lib, name); if (!f) return 0;
  for (long i = 0; i < n; i += 4)
    _mm256_storeu_pd(y + i, f(_mm256_loadu_pd(x + i), _mm256_loadu_pd(z + i)));
  return 1;
}
/* Vectorized<float>::erf of ATen's vec256_float.h (A&S 7.1.26), with Sleef_expf8_u10. */
int shim_erf_as(const float* x, float* y, long n) {
  F1 ex = (F1)dlsym(lib, "Sleef_expf8_u10avx2"); if (!ex) return 0;
  const __m256 nz = _mm256_set1_ps(-0.f), one = _mm256_set1_ps(1.0f);
  for (long i = 0; i < n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256 sign = _mm256_and_ps(nz, v), a = _mm256_xor_ps(sign, v);
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
    __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(1.061405429f), t, _mm256_set1_ps(-1.453152027f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(1.421413741f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-0.284496736f));
    r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(0.254829592f));
    __m256 e = ex(_mm256_xor_ps(nz, _mm256_mul_ps(v, v)));
    __m256 u = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_xor_ps(nz, e), t), r, one);
    _mm256_storeu_ps(y + i, _mm256_xor_ps(sign, u));
  }
  return 1;
}
"""


@pytest.fixture(scope="module")
def sleef(tmp_path_factory):
    """ctypes access to libtorch_cpu.so's Sleef_* AVX2 functions over arrays."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the shim that calls SLEEF's vector functions")
    d = tmp_path_factory.mktemp("sleef_shim")
    src, so = d / "shim.c", d / "shim.so"
    src.write_text(_SHIM)
    r = subprocess.run([cc, "-O2", "-mavx2", "-mfma", "-shared", "-fPIC", str(src), "-o", str(so),
                        "-ldl"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"could not build the SLEEF shim: {r.stderr[-300:]}")
    lib = ctypes.CDLL(str(so))
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    if not lib.shim_open(path.encode()):
        pytest.skip(f"cannot dlopen {path}")
    return lib


def _ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def _call(lib, kind, name, *arrays):
    out = np.empty_like(arrays[0])
    args = [_ptr(a) for a in arrays] + [_ptr(out), ctypes.c_long(out.size)]
    fn = getattr(lib, "shim_" + kind)
    ok = fn(*args) if name is None else fn(name.encode(), *args)
    assert ok, f"{name} not exported by libtorch_cpu.so"
    return out


_F32_SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 2.0, 1e-45, -1e-45, 1.17549435e-38,
     -1.17549435e-38, 3.4028235e38, -3.4028235e38, 88.72283, 88.72284, 100.0, 100.00001,
     -103.97208, -104.0, -104.00001, 124.99999, 125.0, 38999.996, 39000.0, 8.664339742,
     -8.664339742, 0.7, 16777216.0, 16777217.0, 1e10, 2.0 ** 31, -(2.0 ** 31), 1e-10],
    dtype=np.float32)


def _f32_inputs(n: int, seed: int) -> np.ndarray:
    """Random bit patterns, N(0, 8^2) values and the specials, in shuffled groups of 8 (so
    sin/cos see vectors whose lanes need different reductions); n a multiple of 8."""
    rng = np.random.default_rng(seed)
    q = n // 4
    x = np.concatenate([
        rng.integers(0, 2**32, size=2 * q, dtype=np.uint64).astype(np.uint32).view(np.float32),
        (rng.standard_normal(q) * 8).astype(np.float32),
        rng.uniform(-200, 200, size=n - 3 * q - _F32_SPECIALS.size).astype(np.float32),
        _F32_SPECIALS])
    return x[rng.permutation(x.size)].reshape(-1)[:n].copy()


def _cl_f32(op: str, x: np.ndarray) -> np.ndarray:
    """castlab's torch_cpu function `op` on fp32 inputs. PyTorch's fp32 exp/log/sin/... are
    MKL calls, so torch_cpu picks SLEEF only for a bf16/fp16 node; a bf16 cast the policy
    does not round (round_casts=False) reaches the fp32 SLEEF function with the fp32 value."""
    fn = cl.jit(lambda a: getattr(cl, op)(a.astype(cl.bfloat16)))
    pol = cl.Policy("fused", round_casts=False, output=cl.float32)
    return fn.run(cl.from_numpy(x), policy=pol, math="torch_eager").numpy()


_N32 = 10_000_000


@pytest.mark.parametrize("op,sym", [("exp", "Sleef_expf8_u10avx2"), ("log", "Sleef_logf8_u10avx2"),
                                    ("tanh", "Sleef_tanhf8_u10avx2"), ("sin", "Sleef_sinf8_u35avx2"),
                                    ("cos", "Sleef_cosf8_u35avx2"), ("erf", None)])
def test_float_functions_equal_sleef(sleef, op, sym):
    x = _f32_inputs(_N32, seed=len(op))
    ref = _call(sleef, "erf_as", None, x) if sym is None else _call(sleef, "f1", sym, x)
    got = _cl_f32(op, x)
    assert _mismatches(torch.from_numpy(got), torch.from_numpy(ref)) == 0


def _pow_pairs_f32(n: int, seed: int):
    rng = np.random.default_rng(seed)
    q = n // 4
    u = rng.integers(0, 2**32, size=(2, q), dtype=np.uint64).astype(np.uint32).view(np.float32)
    a = np.concatenate([u[0], rng.uniform(0, 10, q), -rng.integers(0, 20, q),
                        np.ldexp(rng.uniform(1, 2, n - 3 * q), rng.integers(-30, 30, n - 3 * q))])
    b = np.concatenate([u[1], rng.standard_normal(q) * 10, rng.integers(-30, 30, q),
                        rng.uniform(-30, 30, n - 3 * q)])
    sp = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, 2.0, 3.0, -2.5], np.float32)
    ga, gb = np.meshgrid(sp, sp)
    a[:ga.size], b[:gb.size] = ga.ravel(), gb.ravel()
    return a.astype(np.float32), b.astype(np.float32)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
def test_powf_equals_sleef_and_torch(sleef):
    a, b = _pow_pairs_f32(2_000_000, seed=5)
    ref = _call(sleef, "f2", "Sleef_powf8_u10avx2", a, b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    got = _to_torch(cl.pow(_to_cl(ta), _to_cl(tb)))
    assert _mismatches(got, torch.from_numpy(ref)) == 0
    assert _mismatches(got, torch.pow(ta, tb)) == 0  # pow_tensor_tensor's vector body


def _f64_inputs(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    q = n // 3
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 709.78, 709.79, -1000.0,
                   -1000.1, 2.5, 2.5000000000000004, 6.0, 1e-8, 1e-9, 18.714973875, 5e-324,
                   2.2250738585072014e-308, 1.7976931348623157e308])
    x = np.concatenate([rng.integers(0, 2**64, size=q, dtype=np.uint64).view(np.float64),
                        rng.standard_normal(q) * 8, rng.uniform(-30, 30, n - 2 * q - sp.size), sp])
    return x[rng.permutation(x.size)]


@pytest.mark.parametrize("op,sym", [("exp", "Sleef_expd4_u10avx2"), ("tanh", "Sleef_tanhd4_u10avx2"),
                                    ("erf", "Sleef_erfd4_u10avx2"), ("log", "Sleef_logd4_u10avx2")])
def test_double_functions_equal_sleef(sleef, op, sym):
    # fp64 exp/log/tanh/erf alone are MKL calls in PyTorch; SLEEF's run inside fp64 sigmoid,
    # silu, gelu_tanh, gelu and log_softmax. Reached here as in _cl_f32, with a policy
    # computing in fp64.
    x = _f64_inputs(1_000_000, seed=len(op))
    ref = _call(sleef, "d1", sym, x)
    fn = cl.jit(lambda a: getattr(cl, op)(a.astype(cl.bfloat16)))
    pol = cl.Policy("custom", round_casts=False, compute=cl.float64, output=cl.float64)
    got = fn.run(cl.from_numpy(x), policy=pol, math="torch_eager").numpy()
    assert _mismatches(torch.from_numpy(got), torch.from_numpy(ref)) == 0


def test_pow_double_equals_sleef_and_torch(sleef):
    rng = np.random.default_rng(7)
    n = 1_000_000
    a = np.concatenate([rng.integers(0, 2**64, size=n // 2, dtype=np.uint64).view(np.float64),
                        np.abs(rng.standard_normal(n // 2)) * 8])
    b = np.concatenate([rng.integers(0, 2**64, size=n // 2, dtype=np.uint64).view(np.float64),
                        rng.integers(-400, 400, n // 2) / 8.0])
    ref = _call(sleef, "d2", "Sleef_powd4_u10avx2", a, b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    got = _to_torch(cl.pow(_to_cl(ta), _to_cl(tb)))
    assert _mismatches(got, torch.from_numpy(ref)) == 0
    assert _mismatches(got, torch.pow(ta, tb)) == 0


# ------------------------------------------------------------------ castlab ops vs torch

def _all_patterns(dt):
    return torch.arange(-32768, 32768, dtype=torch.int16).view(dt)


# Every unary op with an ATen op (the op table's aten column) -> its torch function.
_UNARY = {n: tf for n, (tf, _) in torch_pairs("unary_float", "unary_signed").items()}


def _cl_unary(op):
    return castlab_fn(op)


def _gelu_modelled_or_skip(op, dt):
    """Skip gelu (erf form) where PyTorch calls a oneDNN path castlab does not model
    (below AVX2, or bf16 on an AVX2-only oneDNN: castlab._onednn)."""
    name = str(dt).removeprefix("torch.")
    m = cl.Math.preset("torch_eager")
    if op == "gelu" and cl._onednn.gelu_calls_onednn(name) and not m._onednn_gelu("gelu", name,
                                                                                  cuda=False):
        pytest.skip(f"oneDNN's gelu path for {name} on this CPU ({cl._onednn.gelu_path()}) "
                    "is not modelled")


# (Strided bf16/fp16 rsqrt is reproduced: PyTorch's scalar lambda `1 / std::sqrt(x)` rounds
# sqrt to the 16-bit type first, and castlab does so where it sees a non-unit stride.)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("op", list(_UNARY))
def test_unary_all_16bit_patterns_equal_torch(op, dt, layout):
    x = _all_patterns(dt)
    if layout == "strided":  # every pattern once, at stride 2: PyTorch's scalar loops
        buf = torch.zeros(2 * x.numel(), dtype=dt)
        buf[::2] = x
        x = buf[::2]
        assert x.stride() == (2,)
    _gelu_modelled_or_skip(op, dt)
    ref = _UNARY[op](x)
    with cl.use_math("torch_eager"):
        got = _to_torch(_cl_unary(op)(_to_cl(x)))
    bad = _mismatches(got, ref)
    assert bad == 0, f"{op} {dt} {layout}: {bad} of 65536 differ"


@pytest.mark.parametrize("dt", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", ["sigmoid", "silu", "gelu_tanh", "gelu"])
def test_sleef_body_ops_equal_torch(op, dt):
    """fp32/fp64 ops whose PyTorch kernel is a SLEEF vector body (cpu_kernel_vec; fp32 gelu:
    oneDNN), over random and special values; contiguous (SLEEF) and strided (glibc, the
    scalar lambda)."""
    _gelu_modelled_or_skip(op, dt)
    n = 1 << 20
    x = torch.from_numpy(_f32_inputs(n, seed=11)).to(dt) if dt == torch.float32 else \
        torch.from_numpy(_f64_inputs(n, seed=11)[:n].copy())
    with cl.use_math("torch_eager"):
        got = _to_torch(_cl_unary(op)(_to_cl(x)))
        assert _mismatches(got, _UNARY[op](x)) == 0
        xs = torch.stack([x, x], 1)[:, 0]  # stride 2
        assert _mismatches(_to_torch(_cl_unary(op)(_to_cl(xs))), _UNARY[op](xs)) == 0


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16, torch.float32, torch.float64],
                         ids=["bf16", "f16", "f32", "f64"])
@pytest.mark.parametrize("op", list(_UNARY) + ["pow", "mul"])
def test_permuted_views_equal_torch_in_bits_and_layout(op, dt):
    """A transposed or permuted (dense) input: PyTorch runs the op in memory order and
    returns the same layout (TensorIterator); its SLEEF body and glibc tail, and whether
    gelu takes oneDNN (only for an input contiguous as given), follow that. castlab does the
    same: same bits, same strides. 1,024,000 elements in three permutations."""
    _gelu_modelled_or_skip(op, dt)
    g = torch.Generator().manual_seed(5)
    base = (torch.randn(8, 128, 1000, generator=g) * 4).to(dt)
    if op in ("log", "sqrt", "rsqrt"):
        base = base.abs()
    other = (torch.rand(8, 128, 1000, generator=g) * 3).to(dt)
    for perm in ((2, 0, 1), (1, 0, 2), (2, 1, 0)):
        x = base.permute(perm)
        with cl.use_math("torch_eager"):
            if op in ("pow", "mul"):
                y = other.permute(perm)
                ref = getattr(torch, op)(x.abs(), y)
                got = _to_torch(getattr(cl, op)(_to_cl(x.abs()), _to_cl(y)))
            else:
                ref = _UNARY[op](x)
                got = _to_torch(_cl_unary(op)(_to_cl(x)))
        assert got.stride() == ref.stride(), (op, perm)
        bad = _mismatches(got, ref)
        assert bad == 0, f"{op} {dt} permute{perm}: {bad} of {ref.numel()} differ"


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16, torch.float32, torch.float64],
                         ids=["bf16", "f16", "f32", "f64"])
def test_gated_chains_equal_torch(dt):
    """SwiGLU (silu(a) * b) and GELU-gated (gelu(a) * b, both forms) in eager mode."""
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(512, 256, generator=g) * 3).to(dt)
    b = torch.randn(512, 256, generator=g).to(dt)
    F = torch.nn.functional
    chains = {
        "swiglu": (lambda p, q: F.silu(p) * q, lambda p, q: cl.silu(p) * q),
        "geglu_tanh": (lambda p, q: F.gelu(p, approximate="tanh") * q,
                       lambda p, q: cl.gelu(p, approximate="tanh") * q),
    }
    _gelu_modelled_or_skip("gelu", dt)
    chains["geglu"] = (lambda p, q: F.gelu(p) * q, lambda p, q: cl.gelu(p) * q)
    with cl.use_math("torch_eager"):
        for name, (tf, cf) in chains.items():
            got = _to_torch(cf(_to_cl(a), _to_cl(b)))
            assert _mismatches(got, tf(a, b)) == 0, name


_POW = {"x**3": 3, "x**-2": -2, "x**0.5": 0.5, "x**-0.5": -0.5, "x**2.5": 2.5}


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", list(_POW))
def test_pow_python_exponent_all_16bit_patterns_equal_torch(name, dt, layout):
    """PowKernel.cpp on the CPU: bf16 x**3 and x**-2 round x*x to bf16 (scalar_t = BFloat16),
    bf16 x**-0.5 is rsqrt_kernel (so its strided scalar loop rounds sqrt to bf16), fp16
    takes the std::pow / Vec::pow branch (x**0.5 is pow, not sqrt: pow(-0, 0.5) = +0)."""
    x = _all_patterns(dt)
    if layout == "strided":
        x = torch.stack([x, x], 1)[:, 0]
    e = _POW[name]
    with cl.use_math("torch_eager"):
        got = _to_torch(_to_cl(x) ** e)
    bad = _mismatches(got, x ** e)
    assert bad == 0, f"{name} {dt} {layout}: {bad} of 65536 differ"


def _vml_or_skip():
    why = cl._torch_vml.unavailable()
    if why is not None:
        pytest.skip(f"PyTorch's MKL VML functions cannot be called here: {why}")


_VML_OPS = ["exp", "log", "sin", "cos", "tanh", "erf", "sqrt"]


@pytest.fixture(scope="module")
def vml_inputs():
    n = 1 << 20
    return {torch.float32: torch.from_numpy(_f32_inputs(n, seed=23)),
            torch.float64: torch.from_numpy(_f64_inputs(n, seed=23)[:n].copy())}


@pytest.mark.parametrize("dt", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", _VML_OPS)
def test_mkl_vml_ops_equal_torch(op, dt, vml_inputs):
    """fp32/fp64 exp, log, sin, cos, tanh, erf and sqrt: PyTorch calls MKL VML HA
    (vml.h); castlab calls the same functions from libtorch_cpu.so. 1M random bit patterns,
    normals, uniforms and specials; contiguous, and strided (PyTorch copies strided input
    into a buffer for VML; castlab's registers are that buffer)."""
    _vml_or_skip()
    x = vml_inputs[dt]
    tf, cf = getattr(torch, op), getattr(cl, op)
    with cl.use_math("torch_eager"):
        assert _mismatches(_to_torch(cf(_to_cl(x))), tf(x)) == 0
        xs = torch.stack([x, x], 1)[:, 0]
        assert _mismatches(_to_torch(cf(_to_cl(xs))), tf(xs)) == 0
        # fused: a program of several VML ops calls VML per op, as eager does
        f = cl.jit(lambda a: cf(a) * 2.0, math="torch_eager")
        assert _mismatches(_to_torch(f(_to_cl(x))), tf(x) * 2.0) == 0


@pytest.mark.parametrize("dt", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_mkl_vml_bits_do_not_depend_on_length_or_alignment(dt):
    """VML is elementwise: the bits do not depend on the call's length or the pointers'
    alignment (lengths 1..40 at element offsets 0..4 of an aligned buffer)."""
    _vml_or_skip()
    g = torch.Generator().manual_seed(4)
    big = torch.randn(4096, generator=g, dtype=dt) * 10
    with cl.use_math("torch_eager"):
        for op in _VML_OPS:
            tf, cf = getattr(torch, op), getattr(cl, op)
            for n in range(1, 41):
                for off in range(5):
                    v = big[off:off + n]
                    bad = _mismatches(_to_torch(cf(_to_cl(v))), tf(v))
                    assert bad == 0, f"{op} n={n} offset={off}: {bad} differ"


def test_trace_says_where_mkl_vml_runs():
    _vml_or_skip()
    x = cl.ones(4, dtype=cl.float32)
    text = str(cl.jit(lambda a: cl.exp(a)).trace(x, math="torch_eager"))
    assert "MKL VML from libtorch_cpu.so" in text
    text = str(cl.jit(lambda a: cl.gelu(a)).trace(x, math="torch_eager"))
    if cl._onednn.gelu_path().form:
        assert "oneDNN's JIT gelu_erf" in text and "not bit-exact" not in text
    else:
        assert "oneDNN" in text and "not bit-exact" in text
    text = str(cl.jit(lambda a: cl.exp(a)).trace(x.astype(cl.bfloat16), math="torch_eager"))
    assert "impl=torch_cpu" in text and "MKL" not in text
    # on a GPU the preset keeps CUDA's precise functions (the "libm" code there)
    assert cl.Math.preset("torch_eager").impl_on(cuda=True) == "libm"


def test_without_torch_the_trace_says_mkl_vml_is_unavailable():
    """castlab never imports torch: before it is imported the portable functions stand in."""
    code = ("import castlab as cl, sys\n"
            "x = cl.from_numpy(__import__('numpy').linspace(-3, 3, 64, dtype='float32'))\n"
            "t = str(cl.jit(lambda a: cl.exp(a)).trace(x, math='torch_eager'))\n"
            "y = cl.exp(x).numpy()\n"
            "assert 'torch' not in sys.modules\n"
            "print(t)\n")
    r = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           p for p in [os.path.dirname(os.path.dirname(cl.__file__)),
                                       os.environ.get("PYTHONPATH", "")] if p)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "MKL VML unavailable (torch not loaded): portable stand-in, not bit-exact" in r.stdout


# The ops whose factors include torch_tail (a scalar lambda in PyTorch's CPU loop).
_TAIL_OPS = {n: (tf, castlab_fn(n)) for n, tf in _UNARY.items()
             if _optable.OPS[n].factors & _optable.BITS["torch_tail"]}
_TAIL_OPS["pow"] = (lambda x: torch.pow(x.abs(), x / 4), lambda x: cl.pow(cl.abs(x), x / 4))


def _tail_cases():
    for op in _TAIL_OPS:
        for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            yield op, dt


@pytest.mark.parametrize("op,dt", list(_tail_cases()),
                         ids=[f"{o}-{str(d)[6:]}" for o, d in _tail_cases()])
def test_scalar_tails_equal_torch_at_every_length(op, dt):
    """cpu_kernel_vec's last (n mod 2*Vec::size()) elements run the scalar lambda (glibc;
    for bf16/fp16 rsqrt, sqrt rounded to 16 bits first): contiguous lengths 1..160, one
    call each, so every tail length of every ISA's vector width occurs."""
    _vml_or_skip()  # the tail geometry needs torch's library (thread count)
    _gelu_modelled_or_skip(op, dt)  # fp32/bf16 gelu: oneDNN from 2 elements, Gelu.h for 1
    g = torch.Generator().manual_seed(2)
    a = (torch.randn(161 * 160, generator=g, dtype=torch.float64) * 4).to(dt)
    if op == "rsqrt":
        a = a.abs()
    tf, cf = _TAIL_OPS[op]
    bad = 0
    with cl.use_math("torch_eager"):
        for n in range(1, 161):
            x = a[n * 160:n * 160 + n]
            bad += _mismatches(_to_torch(cf(_to_cl(x))), tf(x))
    assert bad == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_scalar_tails_follow_torch_thread_chunks(threads):
    """An odd size over 32768 elements: at::parallel_for gives each of torch's threads a
    chunk with its own scalar tail; castlab reads torch's thread count when it runs."""
    _vml_or_skip()
    torch.set_num_threads(threads)  # the autouse fixture restores it
    g = torch.Generator().manual_seed(0)
    base = torch.randn(2_097_147, generator=g, dtype=torch.float64) * 4
    with cl.use_math("torch_eager"):
        for op, dt in [("silu", torch.float32), ("sigmoid", torch.float32),
                       ("gelu_tanh", torch.float32), ("gelu_tanh", torch.float64),
                       ("gelu", torch.float16), ("rsqrt", torch.float16), ("pow", torch.float32)]:
            x = base.to(dt).abs() if op == "rsqrt" else base.to(dt)
            tf, cf = _TAIL_OPS[op]
            bad = _mismatches(_to_torch(cf(_to_cl(x))), tf(x))
            assert bad == 0, f"{op} {dt} on {threads} torch threads: {bad} differ"


@pytest.mark.parametrize("dt", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_pow_python_exponent_float_equals_torch(dt):
    """fp32/fp64 x**y with a Python number y: pow_tensor_scalar's shortcuts, SLEEF's pow in
    the vector body and, for fp32, the scalar lambda's std::pow(float, double) (pow in
    double with y's double value: 1.1 is not 1.1f) in tails and on strided input."""
    _vml_or_skip()
    x = torch.from_numpy(_f32_inputs(262_152, seed=8)).to(dt)[:262_147]  # odd: tails
    xs = torch.stack([x, x], 1)[:, 0]
    with cl.use_math("torch_eager"):
        for e in (2.5, 1.1, -3.7, 7, 3, -2, 0.5, -0.5, -1, 2, 1, 0):
            for v in (x, xs):
                bad = _mismatches(_to_torch(_to_cl(v) ** e), v ** e)
                assert bad == 0, f"x**{e} {dt} stride {v.stride()}: {bad} differ"


# ------------------------------------------------------------------ oneDNN's gelu (erf form)

def _onednn_or_skip():
    if not cl._onednn.gelu_path().form:
        pytest.skip(f"oneDNN's gelu path on this CPU is not modelled ({cl._onednn.gelu_path()})")


def _gelu_f32_inputs(n: int, seed: int) -> torch.Tensor:
    """Random bit patterns, N(0, 3^2) values (where erf bends), subnormals, every boundary
    of oneDNN's polynomial pieces (|x| bits 0x3de00001 + k * 2^21) and of its bound
    0x40b15cee within +-3 ulps, huge values and the specials, shuffled."""
    rng = np.random.default_rng(seed)
    edges = np.array([0x3de00001 + (k << 21) for k in range(-2, 34)] + [0x40b15cee], np.int64)
    edges = (edges[:, None] + np.arange(-3, 4)).reshape(-1)
    edges = edges[(edges > 0) & (edges < 0x7f800000)].astype(np.uint32)
    edges = np.concatenate([edges, edges | 0x80000000]).view(np.float32)
    q = n // 4
    sub = rng.integers(1, 0x800000, size=q // 2, dtype=np.uint32)
    sub |= rng.integers(0, 2, size=sub.size, dtype=np.uint32) << 31
    fixed = np.concatenate([edges, _F32_SPECIALS, np.array([3.4e38, -3.4e38, 1e-45, -1e-45],
                                                           np.float32)])
    x = np.concatenate([
        rng.integers(0, 2**32, size=2 * q, dtype=np.uint64).astype(np.uint32).view(np.float32),
        (rng.standard_normal(q) * 3).astype(np.float32),
        sub.view(np.float32),
        rng.uniform(-8, 8, size=n - 3 * q - sub.size - fixed.size).astype(np.float32),
        fixed])
    return torch.from_numpy(x[rng.permutation(x.size)].copy())


@pytest.mark.parametrize("threads", [1, 2])
def test_onednn_gelu_f32_equals_torch(threads):
    """Contiguous fp32 gelu (erf form): PyTorch calls oneDNN's JIT eltwise_gelu_erf;
    castlab computes its instruction sequence (ops/scalar/math_onednn.h). 16M inputs; the
    same values at stride 2 take PyTorch's Gelu.h loop (glibc erff), and castlab's too."""
    _onednn_or_skip()
    torch.set_num_threads(threads)  # the autouse fixture restores it
    x = _gelu_f32_inputs(1 << 24, seed=31 + threads)
    F = torch.nn.functional
    with cl.use_math("torch_eager"):
        assert _mismatches(_to_torch(cl.gelu(_to_cl(x))), F.gelu(x)) == 0
        xs = torch.stack([x[:1 << 20], x[:1 << 20]], 1)[:, 0]
        assert _mismatches(_to_torch(cl.gelu(_to_cl(xs))), F.gelu(xs)) == 0


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_onednn_gelu_every_length_offset_and_layout(dt):
    """PyTorch calls oneDNN only for a contiguous tensor of 2 or more elements
    (Activation.cpp use_mkldnn): lengths 1..100 at element offsets 0..4 (1 element: Gelu.h's
    scalar lambda), and layouts that are not contiguous (strided, rows of a wider matrix,
    a broadcast) or are (a column of one), with 1 and 2 torch threads. (A transposed input
    is not here: PyTorch's Gelu.h loop runs it vectorised in memory order, castlab's
    executor as strided input; docs/torch_cpu_kernels.md, layouts castlab iterates
    differently.)"""
    _onednn_or_skip()
    _gelu_modelled_or_skip("gelu", dt)
    _vml_or_skip()  # Gelu.h's tails need torch's thread count
    x = _gelu_f32_inputs(1 << 16, seed=5).to(dt)
    F = torch.nn.functional
    g = torch.Generator().manual_seed(6)
    m = (torch.randn(96, 160, generator=g) * 3).to(dt)
    layouts = {"strided": m.view(-1)[::3], "rows": m[:, :100], "broadcast": m[:1, :7].expand(9, 7),
               "column": m[:, :1].contiguous(), "2d": m}
    bad = {}
    with cl.use_math("torch_eager"):
        for n in range(1, 101):
            for off in range(5):
                v = x[off * 1000:off * 1000 + n]
                bad[f"n={n} offset={off}"] = _mismatches(_to_torch(cl.gelu(_to_cl(v))), F.gelu(v))
        for threads in (1, 2):
            torch.set_num_threads(threads)  # the autouse fixture restores it
            for name, v in layouts.items():
                bad[f"{name} {threads} threads"] = _mismatches(_to_torch(cl.gelu(_to_cl(v))),
                                                               F.gelu(v))
    assert {k: v for k, v in bad.items() if v} == {}


def test_onednn_gelu_follows_torch_mkldnn_flag():
    """With torch.backends.mkldnn disabled PyTorch's gelu is Gelu.h's loop on every layout;
    castlab's eager gelu follows the flag from one call to the next."""
    _onednn_or_skip()
    _vml_or_skip()
    x = _gelu_f32_inputs(1 << 18, seed=9)[:262_147]  # odd: Gelu.h's scalar tails
    F = torch.nn.functional
    with cl.use_math("torch_eager"):
        for dt in (torch.float32, torch.bfloat16):
            v = x.to(dt)
            was, torch.backends.mkldnn.enabled = torch.backends.mkldnn.enabled, False
            try:
                assert _mismatches(_to_torch(cl.gelu(_to_cl(v))), F.gelu(v)) == 0
            finally:
                torch.backends.mkldnn.enabled = was
            _gelu_modelled_or_skip("gelu", dt)
            assert _mismatches(_to_torch(cl.gelu(_to_cl(v))), F.gelu(v)) == 0


_GELU_ISA_CHECK = r"""
import numpy as np, torch, castlab as cl
F = torch.nn.functional
rng = np.random.default_rng(3)
x = torch.from_numpy(np.concatenate([
    rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32),
    (rng.standard_normal(1 << 20) * 3).astype(np.float32)]))
b = torch.arange(-32768, 32768, dtype=torch.int16).view(torch.bfloat16)
out = [str(cl._onednn.gelu_path())]
with cl.use_math("torch_eager"):
    for v in (x, b):
        ref, got = F.gelu(v), torch.from_dlpack(cl.gelu(cl.from_dlpack(v)))
        ia = torch.int32 if v.dtype == torch.float32 else torch.int16
        nan = torch.isnan(ref) & torch.isnan(got)
        out.append(int(((ref.view(ia) != got.view(ia)) & ~nan).sum()))
print(*out)
"""


@pytest.mark.slow  # a torch subprocess per ISA: ~2.5 s
@pytest.mark.parametrize("cap,form,bf16_store", [("AVX2", "avx2", "rne"),
                                                 ("AVX512_CORE", "avx512", "rne")])
def test_onednn_gelu_follows_onednn_isa_cap(cap, form, bf16_store):
    """oneDNN's other code paths, reached on this CPU with ONEDNN_MAX_CPU_ISA: below AVX512
    its gelu is Abramowitz & Stegun with its own exp (and PyTorch keeps bf16 away from it);
    on AVX512 cores without avx512_bf16 the bf16 store is an emulated round to nearest even
    (no flush of subnormals). 2M fp32 inputs and all 65,536 bf16 patterns, in a subprocess
    (oneDNN reads the cap once)."""
    need = ("avx2", "fma") if form == "avx2" else ("avx512f", "avx512bw", "avx512vl", "avx512dq")
    if not all(cl._C.cpu_has(f) for f in need):
        pytest.skip(f"the CPU lacks {need}")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": cap, "PYTHONPATH": os.pathsep.join(
        p for p in [os.path.dirname(os.path.dirname(cl.__file__)),
                    os.environ.get("PYTHONPATH", "")] if p)}
    env.pop("DNNL_MAX_CPU_ISA", None)
    r = subprocess.run([os.sys.executable, "-c", _GELU_ISA_CHECK], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [f"GeluPath(form='{form}',", f"bf16_store='{bf16_store}')",
                                "0", "0"]
