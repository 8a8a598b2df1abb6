"""Inductor's online softmax (the triton order's kRedOnline, ops/scalar/reduce.h): the sum of
exp(x - max x) over a row of several tiles, as a running (max, sum) per tile position,
against an independent reference written here from docs/inductor_wide_rows.md 4.5 (each
fused multiply-add rounded once, in exact rationals; castlab's portable expf for the
exponentials), and the lowering that picks it (castlab._lower_reduce._online_softmax)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import castlab as cl
from castlab import _C

F32 = np.float32
# (fma: Triton's fp fusion on, as Inductor compiles by default)
PORTABLE = cl.Math("p", impl="portable", reduction="triton", fma=True)
_EXP = cl.jit(lambda a: cl.exp(a))
_LOG = cl.jit(lambda a: cl.log(a))


def _exp(v) -> np.ndarray:
    """castlab's portable expf (the MathImpl the reduce is given: 0) of float32 values."""
    v = np.ascontiguousarray(v, dtype=F32)
    return np.asarray(_EXP.run(cl.tensor(v), policy="eager", math=PORTABLE)).astype(F32)


def _round32(q: Fraction) -> F32:
    """The float32 nearest the rational q (ties to an even significand)."""
    f = F32(float(q))
    best = None
    for c in (np.nextafter(f, F32(-np.inf)), f, np.nextafter(f, F32(np.inf))):
        if not np.isfinite(c):
            continue
        d = abs(Fraction(float(c)) - q)
        if best is None or d < best[0] or (d == best[0] and int(c.view(np.uint32)) % 2 == 0):
            best = (d, c)
    return F32(best[1])


def _fma(a, b, c) -> F32:
    """a * b + c rounded once to float32."""
    if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)):
        return F32(np.float64(a) * np.float64(b) + np.float64(c))  # inf / NaN: one answer
    return _round32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def _maximum(a, b):
    """Inductor's triton_helpers.maximum: a where a > b or a is NaN, else b."""
    return np.where((a > b) | np.isnan(a), a, b)


def _tree(vals: list, lanes: int, warps: int, op) -> F32:
    """Triton's combine of its threads' values: a butterfly over each warp's lanes, then
    over the warps' lane-0 values (lane 0's dependencies, in place)."""
    p = list(vals)
    for w in range(warps):
        off = lanes // 2
        while off:
            for lane in range(off):
                p[w * lanes + lane] = op(p[w * lanes + lane], p[w * lanes + lane + off])
            off //= 2
    off = warps // 2
    while off:
        for w in range(off):
            p[w * lanes] = op(p[w * lanes], p[(w + off) * lanes])
        off //= 2
    return F32(p[0])


def _madd(a, b, c, fused: bool) -> F32:
    """a * b + c: fused (one rounding) or the product rounded first (Triton without fp
    fusion)."""
    return _fma(a, b, c) if fused else F32(F32(a * b) + F32(c))


def _online_sum(x: np.ndarray, r: int, per: int, lanes: int, warps: int,
                fused: bool = True) -> F32:
    """The row's sum as Inductor's looped online softmax computes it (`fused`: Triton's fp
    fusion on, its default; off under Inductor's emulate_precision_casts)."""
    m = np.full(r, -np.inf, F32)
    s = np.zeros(r, F32)
    with np.errstate(invalid="ignore"):
        for k in range(0, len(x), r):
            xs = x[k:k + r]
            n = len(xs)
            mm, m2 = m[:n], _maximum(m[:n], xs)
            flat = m2 == -np.inf
            a = np.where(flat, F32(1), _exp(np.where(flat, F32(0), mm - m2)))
            b = np.where(flat, F32(1), _exp(np.where(flat, F32(0), xs - m2)))
            s[:n] = [_madd(s[i], a[i], b[i], fused) for i in range(n)]
            m[:n] = m2
        nt = lanes * warps
        tile = per * nt
        regs = [[rep * tile + t * per + k for rep in range(r // tile) for k in range(per)]
                for t in range(nt)]
        firsts = []
        for c in regs:  # each thread's maxima in register order
            acc = m[c[0]]
            for j in c[1:]:
                acc = _maximum(acc, m[j])
            firsts.append(F32(acc))
        big = _tree(firsts, lanes, warps, lambda u, v: _maximum(u, v))
        e = _exp(np.where(big == -np.inf, F32(0), m - big))
    sums = []
    for c in regs:
        if len(c) == 1:
            sums.append(F32(s[c[0]] * e[c[0]]))
            continue
        acc = _madd(s[c[0]], e[c[0]], F32(s[c[1]] * e[c[1]]), fused)
        for j in c[2:]:
            acc = _madd(s[j], e[j], acc, fused)
        sums.append(acc)
    return _tree(sums, lanes, warps, lambda u, v: F32(u + v))


def _rows(n: int, rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * 3).astype(F32)
    x[1, ::7] = -np.inf          # masked logits
    x[2, :] = -np.inf            # a row of -inf only
    x[2, n // 2] = 1.5
    x[3, :n // 3] -= 100.0       # exponentials that underflow, then a later maximum
    x[4, :] = 0.0                # equal values: every exponential 1
    x[4, 5] = -0.0
    x[5, 17] = np.nan            # a NaN
    x[6, :] = np.linspace(-80.0, 80.0, n, dtype=F32)  # the maximum moves every tile
    return x


@pytest.mark.parametrize("fused", [True, False], ids=["fp_fusion", "no_fp_fusion"])
@pytest.mark.parametrize("tile", [(256, 2, 32, 4), (512, 2, 32, 4), (64, 4, 8, 2),
                                  (2048, 4, 32, 16)], ids=str)
@pytest.mark.parametrize("n", [700, 2049, 4096])
def test_online_sum_equals_inductors_arithmetic(tile, n, fused):
    """kRedOnline over rows of several tiles (a partial last tile, several tiles a thread's
    positions repeat in, -inf rows, underflow, a NaN, a maximum that moves) gives the
    bits of the reference: every running sum's fma rounded once, the positions' sums
    fused on the first pair's left product, Triton's butterflies; without fp fusion
    (spec p5 = 1) every product rounded before its addition."""
    r, per, lanes, warps = tile
    if n <= r:
        pytest.skip("one tile")
    x = _rows(n, 8, n)
    dst = _C.empty([8], "float32", "cpu")
    _C.reduce_rows(cl.tensor(x), dst, 6, 9, r, per, lanes, warps, 0, 0 if fused else 1)
    got = np.asarray(dst)
    for i in range(8):
        want = _online_sum(x[i], r, per, lanes, warps, fused)
        assert got[i].view(np.uint32) == want.view(np.uint32) or (
            np.isnan(got[i]) and np.isnan(want)), (i, got[i], want)


def test_online_sum_plan_and_bad_specs():
    """The plan says what it computes; the online sum takes only the triton order and a
    MathImpl in 0-3."""
    d = _C.describe_reduce((6, 9, 2048, 4, 32, 16, 0, 0), 32000, 512)
    assert d.startswith("online softmax sum triton looped (R0_BLOCK 2048: 4 per thread")
    assert "fma(s, exp(m - m')" in d
    assert "rounded twice (no fp fusion)" in _C.describe_reduce((6, 9, 2048, 4, 32, 16, 0, 1),
                                                                 32000, 512)
    x, dst = cl.tensor(np.ones((2, 5000), F32)), _C.empty([2], "float32", "cpu")
    for bad in [(6, 0, 0, 0, 0, 0, 0, 0), (6, 9, 2048, 4, 32, 16, 7, 0),
                (6, 9, 2048, 4, 32, 16, 0, 2)]:
        with pytest.raises(ValueError, match="online softmax sum takes the triton order"):
            _C.reduce_rows(x, dst, *bad)
    _C.reduce_rows(x, dst, 6, 9, 2048, 4, 32, 16, 0, 0)
    assert np.asarray(dst).tolist() == [5000.0, 5000.0]


def _plan_text(fn, x, policy="fused") -> str:
    return cl.jit(fn).trace(x, policy=policy, math=PORTABLE)


def test_softmax_under_the_triton_order_takes_the_online_sum_where_inductor_does():
    """Inductor's tiles of 2,048 from 4,097 elements: rows of several tiles take the online
    sum (softmax, log_softmax, cross-entropy); one tile, a dim other than the last, and
    rows Inductor splits (over 8,192 elements in fewer than 264 rows) the plain sum."""
    sm = lambda x: cl.softmax(x, -1)  # noqa: E731
    assert "online softmax sum" in _plan_text(sm, cl.randn(300, 5000, seed=1))
    assert "online softmax sum" in _plan_text(lambda x: cl.log_softmax(x, -1),
                                               cl.randn(4, 8192, seed=1, dtype="bfloat16"))
    t = cl.tensor(np.arange(300, dtype=np.int64) % 7)
    ce = cl.jit(lambda x, t: cl.cross_entropy(x, t)).trace(
        cl.randn(300, 5000, seed=1, dtype="bfloat16"), t, policy="fused", math=PORTABLE)
    assert "online softmax sum" in ce
    for text in (_plan_text(sm, cl.randn(300, 4096, seed=1)),        # one tile
                 _plan_text(sm, cl.randn(3, 10000, seed=1)),         # split by Inductor
                 _plan_text(lambda x: cl.softmax(x, 0), cl.randn(5000, 3, seed=1))):
        assert "online softmax sum" not in text
    # other orders never
    assert "online softmax sum" not in cl.jit(sm).trace(cl.randn(300, 5000, seed=1), policy="fused",
                                                         math="torch_eager")


def test_online_softmax_follows_math_and_inductors_config(monkeypatch):
    """Math(online_softmax=False) (Inductor's config.online_softmax off) keeps the plain
    sum of the two loops where the online sum would apply; the torch_compile stack takes
    the flag from the process's Inductor config; a non-bool is refused."""
    import dataclasses

    sm = lambda x: cl.softmax(x, -1)  # noqa: E731
    x = cl.randn(300, 5000, seed=1)
    off = dataclasses.replace(PORTABLE, online_softmax=False)
    text = cl.jit(sm).trace(x, policy="fused", math=off)
    assert "online softmax sum" not in text and "sum triton looped (R0_BLOCK 2048" in text
    assert cl.Math.preset("inductor").online_softmax is True
    # without contraction (Math fma=False: Inductor's emulate_precision_casts turns Triton's
    # fp fusion off) the running sums round their products first
    unfused = cl.jit(sm).trace(x, policy="fused", math=dataclasses.replace(PORTABLE, fma=False))
    assert "online softmax sum" in unfused and "no fp fusion" in unfused
    assert "no fp fusion" not in cl.jit(sm).trace(x, policy="fused", math=PORTABLE)
    with pytest.raises(TypeError, match="online_softmax"):
        cl.Math("p", online_softmax="yes")
    pytest.importorskip("torch")
    from torch._inductor import config as iconfig

    from castlab.torch import _stacks

    ind = cl.Math.preset("inductor")
    monkeypatch.setattr(iconfig, "online_softmax", False)
    assert _stacks.inductor_math(ind).online_softmax is False
    monkeypatch.setattr(iconfig, "online_softmax", True)
    assert _stacks.inductor_math(ind) is ind


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_log_softmax_over_the_online_sum(dt):
    """log_softmax under the triton order at 5,000 elements (three tiles of 2,048): each
    row is (x - M) - log(S) with S the reference online sum, rounded once; as one fused
    row step and as separate steps alike."""
    from castlab import _lower

    x = cl.tensor(_rows(5000, 300, 3)[:, :]).astype(dt)
    xf = np.asarray(x.astype("float32"))
    f = cl.jit(lambda x: cl.log_softmax(x, -1))
    outs = []
    for fuse in (True, False):
        old = _lower.FUSE_ROWS
        _lower.FUSE_ROWS = fuse
        try:
            outs.append(np.asarray(f.run(x, policy="fused", math=PORTABLE).astype("float32")))
        finally:
            _lower.FUSE_ROWS = old
    assert outs[0].tobytes() == outs[1].tobytes()
    for i in (0, 1, 3, 4, 6, 7):
        row = xf[i]
        s = _online_sum(row, 2048, 4, 32, 16)
        big = F32(np.max(row))
        ls = np.asarray(_LOG.run(cl.tensor(np.array([s], F32)), policy="eager",
                                 math=PORTABLE))[0]
        with np.errstate(invalid="ignore"):
            want = ((row - big) - ls).astype(F32)
        if dt == "bfloat16":
            want = np.asarray(cl.tensor(want).astype("bfloat16").astype("float32"))
        got = outs[0][i]
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (i, int((~same).sum()))
