"""cross_entropy and nll_loss against torch (the CPU here, CUDA on a GPU machine), bit for
bit, forward and backward: every reduction, weights, ignore_index, label smoothing,
probability targets, 1-D and N-D inputs, vocabulary-sized rows; PyTorch's errors."""

from __future__ import annotations

import pytest

import castlab as cl

torch = pytest.importorskip("torch")
F = torch.nn.functional

# the GPU case carries the cuda mark, so `pytest -m cuda` (scripts/gpu_check.sh) runs it
DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)]
                     if cl.cuda.is_available() and torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
EAGER = dict(policy="eager", math="torch_eager")


def _bad(got, want) -> int:
    g = torch.from_dlpack(got) if not isinstance(got, torch.Tensor) else got
    g, w = g.cpu(), want.cpu()
    assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
    gd, wd = g.double(), w.double()
    same = (gd == wd) & (gd.signbit() == wd.signbit()) | (gd.isnan() & wd.isnan())
    return int((~same).sum())


def _case(n, c, dt, device, seed=0, ignore=True):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, c, generator=g) * 3).to(dt).to(device)
    t = torch.randint(0, c, (n,), generator=g)
    if ignore:
        t[::5] = -100
    w = (torch.rand(c, generator=g) + 0.5).to(dt).to(device)
    return x, t.to(device), w


def _cl(*ts):
    return [cl.from_dlpack(t) for t in ts]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 7), (7, 11), (100, 50), (2047, 1000), (4, 32000),
                                   (3, 151936)])
def test_cross_entropy_and_nll_equal_torch(device, dt, shape):
    x, t, w = _case(*shape, dt, device)
    X, T, W = _cl(x, t, w)
    lp = torch.log_softmax(x, -1)
    LP = cl.from_dlpack(lp)
    for red in ("mean", "sum", "none"):
        for weighted in (False, True):
            kw = dict(weight=W if weighted else None, reduction=red)
            tkw = dict(weight=w if weighted else None, reduction=red)
            assert _bad(cl.cross_entropy(X, T, **kw), F.cross_entropy(x, t, **tkw)) == 0, \
                (red, weighted)
            assert _bad(cl.nll_loss(LP, T, **kw), F.nll_loss(lp, t, **tkw)) == 0, (red, weighted)
    # every target ignored: mean is 0 / 0
    ti = torch.full_like(t, -100)
    assert _bad(cl.cross_entropy(X, cl.from_dlpack(ti)), F.cross_entropy(x, ti)) == 0
    # another ignore_index, and a jit under the eager policy
    t3 = torch.where(t == -100, 3, t)
    f = cl.jit(lambda x, t: cl.cross_entropy(x, t, ignore_index=3))
    assert _bad(f.run(X, cl.from_dlpack(t3), **EAGER), F.cross_entropy(x, t3, ignore_index=3)) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
def test_label_smoothing_and_probability_targets(device, dt):
    x, t, w = _case(300, 1000, dt, device, seed=1)
    X, T, W = _cl(x, t, w)
    for eps in (0.1, 0.9, 1.0):
        for red in ("mean", "sum", "none"):
            for weighted in (False, True):
                kw = dict(weight=W if weighted else None, reduction=red, label_smoothing=eps)
                tkw = dict(weight=w if weighted else None, reduction=red, label_smoothing=eps)
                assert _bad(cl.cross_entropy(X, T, **kw), F.cross_entropy(x, t, **tkw)) == 0, \
                    (eps, red, weighted)
    # weighted mean with label smoothing in a trace: exact when no target is ignored (the
    # documented exception: the kept weights are summed in place, not compacted)
    x2, t2, w2 = _case(300, 1000, dt, device, seed=2, ignore=False)
    X2, T2, W2 = _cl(x2, t2, w2)
    f = cl.jit(lambda x, t, w: cl.cross_entropy(x, t, weight=w, label_smoothing=0.1))
    assert _bad(f.run(X2, T2, W2, **EAGER),
                F.cross_entropy(x2, t2, weight=w2, label_smoothing=0.1)) == 0
    p = torch.softmax(torch.randn(300, 1000, generator=torch.Generator().manual_seed(3)), -1)
    p = p.to(dt).to(device)
    for red in ("mean", "sum", "none"):
        for eps in (0.0, 0.2):
            assert _bad(cl.cross_entropy(X, cl.from_dlpack(p), reduction=red,
                                         label_smoothing=eps),
                        F.cross_entropy(x, p, reduction=red, label_smoothing=eps)) == 0, red


@pytest.mark.parametrize("device", DEVICES)
def test_one_d_and_n_d_inputs(device):
    g = torch.Generator().manual_seed(4)
    x1 = torch.randn(9, generator=g).to(device)
    for tv in (4, -100):
        t1 = torch.tensor(tv).to(device)
        for red in ("mean", "sum", "none"):
            assert _bad(cl.cross_entropy(cl.from_dlpack(x1), cl.from_dlpack(t1), reduction=red),
                        F.cross_entropy(x1, t1, reduction=red)) == 0, (tv, red)
    x3 = torch.randn(4, 10, 6, generator=g).to(device)
    t3 = torch.randint(0, 10, (4, 6), generator=g).to(device)
    if device == "cpu":  # nll_loss2d on CUDA adds its blocks with atomics (not modelled)
        for red in ("mean", "sum"):
            assert _bad(cl.cross_entropy(cl.from_dlpack(x3), cl.from_dlpack(t3), reduction=red),
                        F.cross_entropy(x3, t3, reduction=red)) == 0, red
    assert _bad(cl.cross_entropy(cl.from_dlpack(x3), cl.from_dlpack(t3), reduction="none"),
                F.cross_entropy(x3, t3, reduction="none")) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(7, 11), (64, 1000), (16, 3000), (4, 32000)])
def test_gradients_equal_torch_autograd(device, dt, shape):
    """cross_entropy's gradient (nll_loss_backward, then PyTorch's log_softmax backward
    kernel: ``g - exp(y) * sum(g)`` in op-math, one rounding) and log_softmax's own."""
    x, t, w = _case(*shape, dt, device, seed=5)
    X, T, W = _cl(x, t, w)
    for red in ("mean", "sum", "none"):
        for weighted in (False, True):
            xr = x.clone().requires_grad_()
            out = F.cross_entropy(xr, t, weight=w if weighted else None, reduction=red)
            cot = (torch.ones_like(out) if red != "none" else
                   torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(dt)
                   .to(device))
            out.backward(cot)
            f = cl.jit(lambda x, t, ww=(W if weighted else None), r=red:
                       cl.cross_entropy(x, t, weight=ww, reduction=r))
            (dx,) = f.vjp(X, T, argnums=0, **EAGER)[1](cl.from_dlpack(cot))
            assert _bad(dx, xr.grad) == 0, (red, weighted)
    g = (torch.randn(*shape, generator=torch.Generator().manual_seed(7)) * 0.01).to(dt).to(device)
    xr = x.clone().requires_grad_()
    torch.log_softmax(xr, -1).backward(g)
    f = cl.jit(lambda x: cl.log_softmax(x, -1))
    (dx,) = f.vjp(X, **EAGER)[1](cl.from_dlpack(g))
    assert _bad(dx, xr.grad) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input(device):
    X = cl.randn(4, 5, seed=0).to(device)
    T = cl.tensor([0, 1, 2, 3]).to(device)
    for bad in (5, -1, -101):
        with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
            cl.cross_entropy(X, cl.tensor([0, bad, 1, 2]).to(device))
    with pytest.raises(ValueError, match="label_smoothing must be between 0.0 and 1.0"):
        cl.cross_entropy(X, T, label_smoothing=1.5)
    # PyTorch checks only the upper bound: a NaN or negative label_smoothing smooths nothing
    for eps in (float("nan"), -0.5):
        assert _bad(cl.cross_entropy(X, T, label_smoothing=eps),
                    torch.from_dlpack(cl.cross_entropy(X, T))) == 0
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        cl.cross_entropy(X, T, reduction="avg")
    with pytest.raises(TypeError, match="floating-point"):
        cl.cross_entropy(cl.tensor([[1, 2]]).to(device), cl.tensor([0]).to(device))
    with pytest.raises(TypeError, match="expected scalar type Long"):
        cl.cross_entropy(X, T.astype(cl.int32))
    with pytest.raises(ValueError, match="batch_size"):
        cl.cross_entropy(X, cl.tensor([0, 1]).to(device))
    with pytest.raises(ValueError, match="weight tensor should be defined"):
        cl.cross_entropy(X, T, weight=cl.ones(4).to(device))
    # a class dim of 1, NaN logits and rows of -inf: PyTorch's results
    one = torch.zeros(3, 1, device=device)
    assert _bad(cl.cross_entropy(cl.from_dlpack(one), cl.tensor([0, 0, 0]).to(device)),
                F.cross_entropy(one, torch.zeros(3, dtype=torch.long, device=device))) == 0
    xs = torch.randn(3, 4, device=device)
    xs[0, 1] = float("nan")
    xs[1, :] = float("-inf")
    ts = torch.tensor([1, 2, 3], device=device)
    for red in ("mean", "none"):
        assert _bad(cl.cross_entropy(cl.from_dlpack(xs), cl.from_dlpack(ts), reduction=red),
                    F.cross_entropy(xs, ts, reduction=red)) == 0
