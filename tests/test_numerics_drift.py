"""drift() and near_ties() at scale: castlab's compare kernels (numerics/_metrics.py
drift_kernel, what drift() runs), the chunked, threaded NumPy scan (drift_scan, for more
combinations than the kernels take) and numerics/_ties.py equal the plain NumPy
definitions they replace, bit for bit, on random data with NaN, inf, subnormals, signed
zeros, rounding ties and overflow."""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest

import castlab as cl
import castlab.cuda as clcuda
import castlab.numerics as nm
from castlab.numerics import _metrics
from castlab.numerics._explain import (
    _VIEWS,
    Divergence,
    _as_jit,
    _bind_args,
    _combos,
    _node_expr,
    _node_names,
)
from castlab.numerics._formats import (
    _float_val,
    _fmt,
    _rmse,
    _round_np,
    _ulp_diff_np,
    _ulp_error_np,
    _ulp_np,
    _val,
)

# ---------------------------------------------------------------- the previous code


def _old_metrics(x64, r64, dt):
    """drift()'s per-node metrics as computed before the chunked scan."""
    f = _fmt(dt)
    ue = _ulp_error_np(x64, r64, f)
    with np.errstate(all="ignore"):
        rms = float(np.sqrt(np.mean(np.square(r64)))) if r64.size else 0.0
    e = _rmse(x64, r64)
    crr = _round_np(r64, f)
    cx = _round_np(x64, f)
    ok = (crr == cx) | (np.isnan(crr) & np.isnan(cx))
    return (float(np.max(ue)) if ue.size else 0.0, float(np.mean(ue)) if ue.size else 0.0,
            e / rms if rms else (0.0 if e == 0 else math.inf), float(ok.mean()) if ok.size else 1.0)


def _old_drift(fn, args, policies=("eager", "fused"), maths=("torch_eager",),
               ref_math="torch_eager"):
    """drift() as it was: every node's values of every run held as float64 arrays."""
    jf = _as_jit(fn)
    args = _bind_args(args)
    combos = _combos(policies, maths)
    tr = jf.graph(*args)
    ref_pol, ref_m = cl.policy.as_policy("fp64"), cl.policy.as_math(ref_math)
    ref = {id(n): t for n, t in jf.node_values(*args, policy=ref_pol, math=ref_m)}
    ref_out = jf.run(*args, policy=ref_pol, math=ref_m)
    ref_outs = list(ref_out) if isinstance(ref_out, (tuple, list)) else [ref_out]
    per, outs = [], []
    for _label, pol, mth in combos:
        per.append({id(n): t for n, t in jf.node_values(*args, policy=pol, math=mth)})
        o = jf.run(*args, policy=pol, math=mth)
        outs.append(list(o) if isinstance(o, (tuple, list)) else [o])
    names = _node_names(tr)
    rows, labels, first = [], [], None

    def add(label, op, idx, dt, xs, r64):
        nonlocal first
        labels.append(label)
        for (clabel, _, _), x64 in zip(combos, xs):
            mx, mean, rr, crf = _old_metrics(x64, r64, dt)
            rows.append({"node": label, "index": idx, "op": op, "dtype": dt.name, "combo": clabel,
                         "max_ulp": mx, "mean_ulp": mean, "rel_rmse": rr, "correctly_rounded": crf})
        if first is None and len(xs) > 1:
            diff = np.zeros(xs[0].shape, dtype=bool)
            who = []
            for (clabel, _, _), x in zip(combos[1:], xs[1:]):
                d = ~((x == xs[0]) | (np.isnan(x) & np.isnan(xs[0])))
                if d.any():
                    who.append(clabel)
                diff |= d
            if diff.any():
                first = Divergence(idx, op, label, int(diff.sum()), int(diff.size), tuple(who))

    for n in tr.nodes:
        if n.op in _VIEWS or n.op == "scalar" or not n.dtype.is_floating_point:
            continue
        add(_node_expr(n, names), n.op, n.index, n.dtype, [_val(p[id(n)]).f64 for p in per],
            _val(ref[id(n)]).f64)
    for k, on in enumerate(tr.outputs):
        xs = [_val(o[k]) for o in outs]
        add(f"output{k if len(tr.outputs) > 1 else ''} ({names.get(id(on), '?')} rounded)",
            "output", -1, xs[0].dt, [x.f64 for x in xs], _val(ref_outs[k]).f64)
    return rows, first, labels


def _old_near_ties(ref, dtype, within=0.01):
    v = _float_val(ref, "ref")
    f = _fmt(dtype)
    r = v.f64
    a = np.abs(r)
    with np.errstate(all="ignore"):
        u = _ulp_np(a, f)
        s = a / u
        t = s - np.floor(s)
        dist = t - 0.5
        ok = np.isfinite(a) & (a <= f.max)
        mask = ok & (np.abs(dist) <= within) & (t != 0)
    dist = np.where(ok, dist, np.nan)
    return mask, dist


# ---------------------------------------------------------------- helpers


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and type(a) is type(b))
    return a == b and type(a) is type(b)


def _nasty_ref(rng, n, f):
    """fp64 values around `f`'s range: normal, near its midpoints (exact ties and one fp64
    ulp off), subnormal in f and in fp64, near the overflow threshold, +-0, NaN, +-inf."""
    r = rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))
    k = rng.random(n)
    u = _ulp_np(r, f)
    lo = np.floor(r / u) * u
    mid = lo + u / 2                                      # exact midpoints of f
    sel = k < 0.1
    r[sel] = mid[sel]
    sel = (k >= 0.1) & (k < 0.15)
    r[sel] = np.nextafter(mid[sel], np.inf if rng.random() < 0.5 else -np.inf)
    tiny = math.ldexp(1.0, f.emin - f.p)
    sel = (k >= 0.15) & (k < 0.2)
    r[sel] = rng.standard_normal(int(sel.sum())) * tiny * rng.integers(1, 9, int(sel.sum()))
    sel = (k >= 0.2) & (k < 0.21)
    if f.bits < 64:
        umax = math.ldexp(1.0, f.emax - f.p)
        r[sel] = (f.max + umax * rng.choice([-1.0, 0.0, 0.5, 0.499, 0.501, 1.0, 4.0], int(sel.sum()))) \
            * rng.choice([-1.0, 1.0], int(sel.sum()))
    sel = (k >= 0.21) & (k < 0.215)
    r[sel] = rng.choice([0.0, -0.0, 5e-324, -1e-310], int(sel.sum()))
    return r


def _sprinkle(rng, a, p):
    sp = np.flatnonzero(rng.random(a.size) < p)
    a.reshape(-1)[sp] = rng.choice([np.nan, np.inf, -np.inf], sp.size)
    return a


FMTS = ["bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # building the data: overflow
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n, special", [(3 * (1 << 15) * 5 + 13, True), (1 << 17, False),
                                        (1000, True), (7, True), (0, False)])
def test_drift_scan_equals_plain_definitions(fmt, n, special):
    rng = np.random.default_rng(n + len(fmt))
    f = _fmt(getattr(cl, fmt))
    r = _nasty_ref(rng, n, f)
    xs = []
    # the register values: fp32 (r rounded to fp32, perturbed by an fp32 ulp or so)
    x32 = r.astype(np.float32)
    bump = rng.random(n) < 0.3
    x32[bump] = np.nextafter(x32[bump], np.float32(np.inf))
    xs.append(x32)
    xs.append(x32.copy())                                 # identical to the first
    x2 = x32.copy()
    x2[rng.random(n) < 0.05] *= np.float32(1.001)
    xs.append(x2)
    xs.append(r.copy())                                   # fp64 registers
    if f.bits < 64:
        xs.append(_round_np(r, f).astype(f.dt.numpy))     # the node's own dtype
    if special:
        r = r.copy()
        r[rng.integers(0, n, 3)] = [np.nan, np.inf, -np.inf]
        for x in xs[2:]:
            _sprinkle(rng, x, 0.002)
        xs[2][rng.integers(0, n, 2)] = -0.0
    shape = (n,) if n % 7 else (n // 7, 7)
    xs = [x.reshape(shape) for x in xs]
    r = r.reshape(shape)
    got = _metrics.drift_scan(xs, r, f, True)
    # castlab's compare kernels (what drift() runs): the same bits
    kern = _metrics.drift_kernel([cl.from_numpy(np.ascontiguousarray(x)) for x in xs],
                                 cl.from_numpy(np.ascontiguousarray(r)), f, True)
    assert kern["mismatches"] == got["mismatches"] and kern["differs"] == got["differs"]
    for k in range(len(xs)):
        assert all(_same(a, b) for a, b in zip(kern["rows"][k], got["rows"][k])), \
            (k, kern["rows"][k], got["rows"][k])
    for k, x in enumerate(xs):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = _old_metrics(x.astype(np.float64), r, f.dt)
        for g, w, what in zip(got["rows"][k], want, ("max", "mean", "rel_rmse", "cr")):
            assert _same(g, w), (k, what, g, w)
    x0 = xs[0].astype(np.float64)
    diff = np.zeros(shape, dtype=bool)
    for k, x in enumerate(xs[1:]):
        x = x.astype(np.float64)
        d = ~((x == x0) | (np.isnan(x) & np.isnan(x0)))
        assert got["differs"][k] == bool(d.any()), k
        diff |= d
    assert got["mismatches"] == int(diff.sum())


def test_round_ieee_is_castlabs_conversion():
    rng = np.random.default_rng(5)
    for name in ("bfloat16", "float16", "float32"):
        f = _fmt(getattr(cl, name))
        # every fp64 bit pattern class: random bits, then the nasty values
        bits = rng.integers(0, 2**63, 200000, dtype=np.uint64) | (
            rng.integers(0, 2, 200000, dtype=np.uint64) << np.uint64(63))
        r = np.concatenate([bits.view(np.float64), _nasty_ref(rng, 200000, f)])
        r = r[np.isfinite(r)]
        with np.errstate(all="ignore"):
            got = _metrics._round_ieee(r, _ulp_np(r, f), f)
        want = _round_np(r, f)
        assert np.array_equal(got, want), name


def _nasty_input(rng, shape, dt, p=0.003):
    f = _fmt(dt)
    r = _nasty_ref(rng, int(np.prod(shape)), f) if f.bits < 32 else \
        rng.standard_normal(int(np.prod(shape)))
    a = _round_np(r, f).astype(dt.numpy)
    _sprinkle(rng, a, p)
    return cl.from_numpy(a.reshape(shape))


@cl.jit
def _rope_like(x, c, s):
    """A RoPE-like chain with a second output, for drift."""
    a, b = cl.chunk(x, 2, dim=-1)
    y = x * c + cl.cat([-b, a], dim=-1) * s
    return cl.silu(y) * cl.exp(y) / (c + s), y * y


def _nasty_args(rng, shape, dt):
    return (_nasty_input(rng, shape, dt), _nasty_input(rng, shape[-2:], dt),
            _nasty_input(rng, shape[-2:], dt))


@pytest.mark.slow  # ~2.5 s a dtype
@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
def test_drift_equals_previous_implementation(dt):
    dt = getattr(cl, dt)
    rng = np.random.default_rng(11)

    chain = _rope_like
    args = _nasty_args(rng, (2, 3, 1400, 64), dt)   # > 4 chunks of 2**15: the threaded path
    pols = ("eager", "fused", cl.Policy(name="custom", round_after=(1, 3)))
    d = nm.drift(chain, args, policies=pols, maths=("torch_eager", "inductor"))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rows, first, labels = _old_drift(chain, args, policies=pols,
                                         maths=("torch_eager", "inductor"))
    assert d.node_labels == labels
    assert len(d.rows) == len(rows)
    for g, w in zip(d.rows, rows):
        assert g.keys() == w.keys()
        for k in w:
            assert _same(g[k], w[k]), (g["node"], g["combo"], k, g[k], w[k])
    assert d.first_divergence == first
    assert first is not None
    assert dt is cl.float32 or any(math.isnan(r["max_ulp"]) for r in rows)


def test_drift_beyond_the_kernels_results_takes_the_scan():
    """More combinations than the compare kernels take at once (9 > CMP_MAX_RESULTS):
    the NumPy scan, with the previous implementation's rows."""
    assert 9 > cl._C.CMP_MAX_RESULTS
    rng = np.random.default_rng(4)
    args = _nasty_args(rng, (2, 40, 64), cl.bfloat16)
    pols = ("eager", "fused", cl.Policy(name="custom", round_after=(1, 3)))
    maths = ("torch_eager", "inductor", "portable")
    d = nm.drift(_rope_like, args, policies=pols, maths=maths)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rows, first, labels = _old_drift(_rope_like, args, policies=pols, maths=maths)
    assert len(d.combos) == 9 and d.node_labels == labels and d.first_divergence == first
    for g, w in zip(d.rows, rows):
        assert all(_same(g[k], w[k]) for k in w), (g, w)


def test_drift_small_and_without_divergence():
    sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    for x in (cl.randn(32, 32, seed=0, dtype=cl.bfloat16), cl.randn(1, 2, seed=1, dtype=cl.float16)):
        for pols in (("eager", "fused"), ("eager",), ("fused", "fp64")):
            d = nm.drift(sw, (x,), policies=pols)
            rows, first, labels = _old_drift(sw, (x,), policies=pols)
            assert d.node_labels == labels and d.first_divergence == first
            for g, w in zip(d.rows, rows):
                assert all(_same(g[k], w[k]) for k in w), (g, w)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("n", [3 * (1 << 15) * 5 + 13, 1000, 1, 0])
@pytest.mark.parametrize("fmt", FMTS[:3] + FMTS[4:])
def test_near_ties_equals_previous_implementation(n, fmt):
    rng = np.random.default_rng(n + 7)
    dt = getattr(cl, fmt)
    f = _fmt(dt)
    r = _nasty_ref(rng, n, f)
    if n > 10:
        r[rng.integers(0, n, 3)] = [np.nan, np.inf, -np.inf]
    shape = (n // 5, 5) if n % 5 == 0 and n else (n,)
    for ref in (r.reshape(shape), r.reshape(shape).astype(np.float32) if f.bits < 32 else None):
        if ref is None:
            continue
        for within in (0.0, 0.01, 0.25, 0.4999):
            nt = nm.near_ties(ref, dt, within=within)
            mask, dist = _old_near_ties(ref, dt, within)
            assert np.array_equal(nt.mask.numpy(), mask)
            assert np.array_equal(nt.distance.numpy(), dist, equal_nan=True)
            assert nt.distance.numpy().tobytes() == dist.tobytes()
            assert nt.count == int(mask.sum())
    # mismatch_rate: NaN vs NaN equal, +-0 equal
    a = _round_np(r, f).astype(dt.numpy).reshape(shape)
    b = a.copy()
    bf = b.reshape(-1)
    bf[rng.random(n) < 0.2] = np.float64(2.0)
    if n > 3:
        bf[:3] = [np.nan, -0.0, 0.0]
    split = nt.mismatch_rate(a, b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    mism = ~((x == y) | (np.isnan(x) & np.isnan(y)))
    m = nt.mask.numpy()
    assert split == nm.TieSplit(int((mism & m).sum()), int(m.sum()), int((mism & ~m).sum()),
                                int((~m).sum()))
    assert ml_dtypes is not None


def _ulp_case(rng, fmt, n):
    """(dtype, format, reference, x = the reference rounded with NaN/inf sprinkled, y = x
    with 30% of its encodings one step up)."""
    dt = getattr(cl, fmt)
    f = _fmt(dt)
    r = _nasty_ref(rng, n, f)
    r[rng.integers(0, n, 3)] = [np.nan, np.inf, -np.inf]
    x = _sprinkle(rng, _round_np(r, f).astype(dt.numpy), 0.01)
    y = x.copy()
    y.view(f.uint)[rng.random(n) < 0.3] += np.array(1, dtype=f.uint)
    return dt, f, r, x, y


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("fmt", FMTS)
def test_ulp_error_and_ulp_diff_equal_the_numpy_definitions(fmt):
    """ulp_error and ulp_diff (castlab's code on the operands' device) give the NumPy
    definitions' values on NaN/inf/subnormal/overflow data, with a dtype override and
    broadcast operands too."""
    dt, f, r, x, y = _ulp_case(np.random.default_rng(21 + len(fmt)), fmt, 40_000)
    y[:4] = np.array([np.nan, -0.0, 0.0, np.inf]).astype(dt.numpy)
    got = nm.ulp_error(cl.from_numpy(x), cl.from_numpy(r)).numpy()
    assert np.array_equal(got, _ulp_error_np(x.astype(np.float64), r, f), equal_nan=True)
    x32 = r.astype(np.float32)
    if f.bits < 32:   # fp32 registers measured in the node's ulps
        got = nm.ulp_error(cl.from_numpy(x32), cl.from_numpy(r), dtype=dt).numpy()
        assert np.array_equal(got, _ulp_error_np(x32.astype(np.float64), r, f), equal_nan=True)
    d, m = nm.ulp_diff(cl.from_numpy(x), cl.from_numpy(y), return_nan_mask=True)
    wd, wm = _ulp_diff_np(_val(x), _val(y))
    assert np.array_equal(d.numpy(), wd) and np.array_equal(m.numpy(), wm)
    # broadcast: a row against a matrix
    row, mat = cl.from_numpy(x[:50]), cl.from_numpy(y[:200].reshape(4, 50))
    assert np.array_equal(nm.ulp_diff(row, mat).numpy(),
                          _ulp_diff_np(_val(x[:50]), _val(y[:200].reshape(4, 50)))[0])


# ---------------------------------------------------------------- on the GPU

needs_gpu = [pytest.mark.cuda,
             pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("_g", [pytest.param(0, marks=needs_gpu)])
def test_drift_kernel_on_the_gpu_equals_the_scan(fmt, _g):
    """drift's metrics on the GPU (castlab's compare kernels, only the totals copied back)
    equal the NumPy scan's on the same values, bit for bit."""
    n = 3 * (1 << 15) * 5 + 13
    rng = np.random.default_rng(3 + len(fmt))
    f = _fmt(getattr(cl, fmt))
    r = _nasty_ref(rng, n, f)
    x32 = r.astype(np.float32)
    x32[rng.random(n) < 0.3] *= np.float32(1.0001)
    xs = [x32, _sprinkle(rng, x32.copy(), 0.002), r.copy()]
    if f.bits < 64:
        xs.append(_round_np(r, f).astype(f.dt.numpy))
    r[rng.integers(0, n, 3)] = [np.nan, np.inf, -np.inf]
    want = _metrics.drift_scan(xs, r, f, True)
    got = _metrics.drift_kernel([cl.from_numpy(x).to("cuda") for x in xs],
                                cl.from_numpy(r).to("cuda"), f, True)
    assert got["mismatches"] == want["mismatches"] and got["differs"] == want["differs"]
    for g, w in zip(got["rows"], want["rows"]):
        assert all(_same(a, b) for a, b in zip(g, w)), (g, w)


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("_g", [pytest.param(0, marks=needs_gpu)])
def test_drift_on_the_gpu_equals_the_cpu(dt, _g):
    """nm.drift of CUDA tensors gives the CPU's rows, bit for bit, on a chain with NaN,
    inf and subnormal inputs."""
    dt = getattr(cl, dt)
    rng = np.random.default_rng(17)

    chain = _rope_like
    args = _nasty_args(rng, (2, 3, 700, 64), dt)
    pols = ("eager", "fused")
    cpu = nm.drift(chain, args, policies=pols, maths=("portable",), ref_math="portable")
    gpu = nm.drift(chain, tuple(a.to("cuda") for a in args), policies=pols,
                   maths=("portable",), ref_math="portable")
    assert gpu.node_labels == cpu.node_labels and gpu.first_divergence == cpu.first_divergence
    for g, w in zip(gpu.rows, cpu.rows):
        assert all(_same(g[k], w[k]) for k in w), (g, w)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "float32", "float8_e4m3fn"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("_g", [pytest.param(0, marks=needs_gpu)])
def test_near_ties_on_the_gpu_equals_the_cpu(fmt, _g):
    """near_ties of a CUDA reference runs on the GPU (mask and distances stay there) and
    gives the CPU's bits; mismatch_rate of CUDA results the CPU's counts."""
    n = 3 * (1 << 15) * 5 + 13
    rng = np.random.default_rng(9)
    dt = getattr(cl, fmt)
    f = _fmt(dt)
    r = _nasty_ref(rng, n, f)
    r[rng.integers(0, n, 3)] = [np.nan, np.inf, -np.inf]
    ref = cl.from_numpy(r)
    for within in (0.0, 0.01, 0.4999):
        cpu = nm.near_ties(ref, dt, within=within)
        gpu = nm.near_ties(ref.to("cuda"), dt, within=within)
        assert gpu.mask.device.type == "cuda" and gpu.count == cpu.count
        assert np.array_equal(gpu.mask.cpu().numpy(), cpu.mask.numpy())
        assert gpu.distance.cpu().numpy().tobytes() == cpu.distance.numpy().tobytes()
    a = _round_np(r, f).astype(dt.numpy)
    b = a.copy()
    b[rng.random(n) < 0.2] = np.float64(2.0)
    b[:3] = [np.nan, -0.0, 0.0]
    ta, tb = cl.from_numpy(a), cl.from_numpy(b)
    assert gpu.mismatch_rate(ta.to("cuda"), tb.to("cuda")) == cpu.mismatch_rate(ta, tb)
    with pytest.raises(ValueError, match="different devices"):
        gpu.mismatch_rate(ta, tb)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "float32", "float64", "float8_e5m2"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("_g", [pytest.param(0, marks=needs_gpu)])
def test_ulp_error_and_ulp_diff_on_the_gpu_equal_the_cpu(fmt, _g):
    """ulp_error and ulp_diff of CUDA tensors stay on the GPU and give the CPU's bits."""
    _, _, r, x, y = _ulp_case(np.random.default_rng(23), fmt, 100_003)
    tx, ty, tr = cl.from_numpy(x), cl.from_numpy(y), cl.from_numpy(r)
    cpu = nm.ulp_error(tx, tr).numpy()
    gpu = nm.ulp_error(tx.to("cuda"), tr.to("cuda"))
    assert gpu.device.type == "cuda"
    assert gpu.cpu().numpy().tobytes() == cpu.tobytes()
    d, m = nm.ulp_diff(tx.to("cuda"), ty.to("cuda"), return_nan_mask=True)
    wd, wm = nm.ulp_diff(tx, ty, return_nan_mask=True)
    assert np.array_equal(d.cpu().numpy(), wd.numpy()) and np.array_equal(m.cpu().numpy(),
                                                                          wm.numpy())
