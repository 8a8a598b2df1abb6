"""compare() by castlab's own code (ops/scalar/compare.h: the GPU path, also compiled for
the host): the same rows, worst elements and same() verdicts as the NumPy scan, bit for
bit, on data with NaN, inf, signed zeros and subnormals, every float dtype, broadcast and
strided operands; on the GPU, the same numbers from CUDA tensors (castlab and torch)."""

from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest

import castlab as cl
import castlab.cuda as clcuda
import castlab.numerics as nm
from castlab import _C
from castlab.numerics._formats import _DevVal, _fmt, _round_np

_PW = 128   # NumPy's pairwise block


def _nasty(rng, n, dt, ref, p_special=0.01):
    """`ref` rounded to dt, perturbed: one-ulp steps, NaN, +-inf, +-0 and subnormals."""
    f = _fmt(dt)
    a = _round_np(ref, f, saturate=True).astype(dt.numpy)
    u = a.view(f.uint)
    bump = rng.random(n) < 0.3
    u[bump] += np.array(1, dtype=u.dtype)
    sp = np.flatnonzero(rng.random(n) < p_special)
    tiny = float(ml_dtypes.finfo(dt.numpy).smallest_subnormal)
    choices = [np.nan, np.inf, -np.inf, 0.0, -0.0, tiny, -3 * tiny]
    if dt is cl.float8_e4m3fn:
        choices = [np.nan, 0.0, -0.0, tiny, -3 * tiny]
    with np.errstate(all="ignore"):
        a[sp] = np.array(choices, dtype=np.float64)[rng.integers(0, len(choices), sp.size)].astype(dt.numpy)
    return a


def _ref(rng, n, special=True):
    ref = rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))
    ref[rng.random(n) < 0.01] = 0.0
    ref[: min(n, 3)] = [1e-42, -0.0, 3e-39][: min(n, 3)]
    if special and n > 8:
        k = rng.integers(0, n, 3)
        ref[k[0]] = np.nan
        ref[k[1]] = np.inf
        ref[k[2]] = -np.inf
    return ref


def _same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b and type(a) is type(b)


def _assert_same_comparison(got, want):
    assert got.names == want.names
    for rg, rw in zip(got.rows, want.rows):
        assert set(rg) == set(rw)
        for key in rw:
            if key == "same":
                assert repr(rg[key]) == repr(rw[key]), (key, rg[key], rw[key])
            else:
                assert _same_value(rg[key], rw[key]), (key, rg[key], rw[key])


def _both_paths(xs, ref, tol=1e-4):
    names = [f"r{i}" for i in range(len(xs))]
    want = nm.compare(*xs, ref=ref, names=names, tol=tol)   # NumPy arrays: the scan
    ts = [cl.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x for x in xs]
    rt = None if ref is None else (cl.from_numpy(np.ascontiguousarray(ref))
                                   if isinstance(ref, np.ndarray) else ref)
    got = nm.compare(*ts, ref=rt, names=names, tol=tol)
    assert all(isinstance(v, _DevVal) for v in got._vals)    # it took the kernels' path
    return got, want


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 15, 16, 127, 128, 129, 136, 1000, 4099, 100_003])
@pytest.mark.parametrize("with_ref", ["special", "finite", None])
def test_kernel_metrics_equal_the_numpy_scan(n, with_ref):
    rng = np.random.default_rng(n)
    ref = _ref(rng, n, special=with_ref == "special")
    bf = cl.bfloat16
    p = 0.01 if with_ref != "finite" else 0.0     # finite: the sums are numbers, not NaN
    xs = [_nasty(rng, n, bf, ref, p) for _ in range(3)]
    xs.append(xs[0].copy())                                          # identical to the first
    xs.append(_round_np(ref, _fmt(cl.float16)).astype(np.float16))  # other dtypes
    xs.append(_nasty(rng, n, cl.float32, ref, p))
    xs.append(_nasty(rng, n, cl.float8_e5m2, ref, p))
    xs.append(_nasty(rng, n, cl.float8_e4m3fn, ref, p))
    got, want = _both_paths(xs, ref if with_ref else None)
    if with_ref == "finite" and n > 1:
        assert all(math.isfinite(r["rmse"]) for r in want.rows[:5]), "the sums were not tested"
    _assert_same_comparison(got, want)
    if with_ref:
        for k in range(len(xs)):
            assert repr(got.worst(k)) == repr(want.worst(k))             # NaN-safe


@pytest.mark.parametrize("dt", [cl.bfloat16, cl.float16, cl.float32, cl.float64,
                                cl.float8_e4m3fn, cl.float8_e5m2])
def test_kernel_metrics_every_dtype_and_same_verdicts(dt):
    rng = np.random.default_rng(7)
    n = 5003
    ref = _ref(rng, n, special=False)
    base = _round_np(ref, _fmt(dt), saturate=True).astype(dt.numpy)
    close = base.copy()
    close.view(_fmt(dt).uint)[rng.random(n) < 0.2] += np.array(1, dtype=_fmt(dt).uint)
    far = _nasty(rng, n, dt, ref, p_special=0.0)
    far.view(_fmt(dt).uint)[rng.random(n) < 0.05] += np.array(40, dtype=_fmt(dt).uint)
    nan = base.copy()
    if dt is not cl.float8_e4m3fn:
        nan[17] = np.nan
    for tol in (1e-4, 1e-2, 0.1):
        got, want = _both_paths([base, close, far, nan], ref, tol)
        _assert_same_comparison(got, want)
    # an fp32 reference for 16-bit results
    if dt.itemsize <= 2:
        got, want = _both_paths([base, close], ref.astype(np.float32))
        _assert_same_comparison(got, want)


def test_kernel_metrics_of_broadcast_and_strided_operands():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((64, 1, 33))
    x = _round_np(ref, _fmt(cl.bfloat16)).astype(ml_dtypes.bfloat16)
    full = np.broadcast_to(x, (64, 5, 33)).copy()
    full.view(np.uint16)[..., ::3] += np.uint16(1)
    t_full = cl.from_numpy(full)
    strided = cl.transpose(cl.from_numpy(np.ascontiguousarray(full.transpose(2, 1, 0))), 0, 2)
    assert not strided.is_contiguous()
    names = ["b", "full", "strided"]
    want = nm.compare(x, full, full, ref=ref, names=names)
    got = nm.compare(cl.from_numpy(x), t_full, strided, ref=cl.from_numpy(ref), names=names)
    _assert_same_comparison(got, want)
    assert repr(got.worst(1)) == repr(want.worst(1))


def test_kernel_tree_is_numpys_pairwise_split():
    for n in (1, 128, 129, 1000, 1 << 20, 12_345_677):
        lo, left, right, level_end = _C._compare_tree(n)
        assert lo[0] == 0 and lo[-1] == n and all(b - a <= _PW for a, b in zip(lo, lo[1:]))
        nleaves = len(lo) - 1
        assert len(left) == len(right) == nleaves - 1 and (not level_end or level_end[-1] == nleaves - 1)
        # children are numbered before their parents, and the root covers everything
        span = {k: (lo[k], lo[k + 1]) for k in range(nleaves)}
        for i, (a, b) in enumerate(zip(left, right)):
            assert a in span and b in span and span[a][1] == span[b][0]
            span[nleaves + i] = (span[a][0], span[b][1])
        assert span[nleaves + len(left) - 1 if left else 0] == (0, n)
    # the sums are np.add.reduce's on the whole array
    rng = np.random.default_rng(0)
    for n in (9, 1000, 99_999):
        v = rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))
        ref, (r,) = _C._compare([cl.from_numpy(v)], cl.from_numpy(np.zeros(n)), 1e-4)
        assert r["sq_sum"] == np.add.reduce(v * v)      # the squared error against 0
        assert ref["r_sq"] == 0.0


def test_kernel_rejects_bad_operands():
    a = cl.zeros(4)
    with pytest.raises(ValueError, match="another size"):
        _C._compare([a, cl.zeros(5)], None, 1e-4)
    with pytest.raises(ValueError, match="results"):
        _C._compare([a] * (int(_C.CMP_MAX_RESULTS) + 1), None, 1e-4)
    with pytest.raises(ValueError, match="not a float"):
        _C._compare([a, cl.zeros(4, dtype=cl.int32)], None, 1e-4)
    with pytest.raises(ValueError, match="not contiguous"):
        _C._compare([cl.zeros(4, 4), cl.transpose(cl.zeros(4, 4), 0, 1)], None, 1e-4)


@pytest.mark.slow  # NVRTC: ~25 s
def test_compare_kernels_compile_with_nvrtc():
    arch = os.environ.get("CASTLAB_NVRTC_ARCH", "sm_90")
    try:
        _C._nvrtc_info()
    except RuntimeError as e:
        pytest.skip(f"NVRTC not found: {e}")
    src = _C._compare_cuda_source()
    # one program holds every kernel: one compile checks them all (the name only labels it)
    for name in ("cl_compare_leaves", "cl_compare_tree", "cl_near_ties", "cl_tie_split",
                 "cl_ulp_error", "cl_ulp_diff"):
        assert f'extern "C" __global__ void {name}(' in src, name
    ok, log = _C._nvrtc_compile_check(src, arch, "cl_compare")
    assert ok, log


# ---------------------------------------------------------------- on the GPU

needs_gpu = [pytest.mark.cuda,
             pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")]


@pytest.mark.parametrize("n", [1, 129, 100_003, 3 * (1 << 20) + 5])
@pytest.mark.parametrize("with_ref", [True, False])
@needs_gpu[0]
@needs_gpu[1]
def test_gpu_compare_equals_the_host(n, with_ref):
    rng = np.random.default_rng(n)
    ref = _ref(rng, n)
    xs = [_nasty(rng, n, cl.bfloat16, ref) for _ in range(3)]
    xs.append(_nasty(rng, n, cl.float16, ref))
    xs.append(_nasty(rng, n, cl.float32, ref))
    xs.append(_nasty(rng, n, cl.float8_e4m3fn, ref))
    names = [f"r{i}" for i in range(len(xs))]
    want = nm.compare(*xs, ref=ref if with_ref else None, names=names)
    ts = [cl.from_numpy(x).to("cuda") for x in xs]
    rt = cl.from_numpy(ref).to("cuda") if with_ref else None
    got = nm.compare(*ts, ref=rt, names=names)
    assert all(v._a is None for v in got._vals), "the GPU path copied a result to the host"
    _assert_same_comparison(got, want)
    if with_ref:
        assert repr(got.worst(2)) == repr(want.worst(2))            # NaN-safe
        assert got._vals[2]._a is None and got._ref._a is None   # worst() read one element
    assert repr(got.values["r1"].tolist()) == repr(want.values["r1"].tolist())


@needs_gpu[0]
@needs_gpu[1]
def test_gpu_compare_of_torch_tensors_broadcast_and_second_device():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((8, 1, 300))
    x = torch.from_numpy(ref).to(torch.bfloat16)
    y = x.expand(8, 4, 300).clone()
    y.view(torch.int16)[..., ::5] += 1
    for dev in range(min(torch.cuda.device_count(), 2)):
        d = f"cuda:{dev}"
        got = nm.compare(x.to(d), y.to(d).transpose(0, 2).contiguous().transpose(0, 2),
                         ref=torch.from_numpy(ref).to(d), names=["x", "y"])
        want = nm.compare(x, y, ref=torch.from_numpy(ref), names=["x", "y"])
        _assert_same_comparison(got, want)
    with pytest.raises(ValueError, match="different devices"):
        nm.compare(x.cuda(), y, names=["x", "y"])
