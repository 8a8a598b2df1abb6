"""gather and take_along_dim against torch (CPU, and the GPU where there is one), their
gradient (scatter_add), the push-down through elementwise ops, and bad indices."""

from __future__ import annotations

import numpy as np
import pytest

import castlab as cl

torch = pytest.importorskip("torch")

# the GPU case carries the cuda mark, so `pytest -m cuda` (scripts/gpu_check.sh) runs it
DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)]
                     if cl.cuda.is_available() and torch.cuda.is_available() else [])
DTYPES = [(cl.float32, torch.float32), (cl.bfloat16, torch.bfloat16),
          (cl.float16, torch.float16), (cl.float64, torch.float64)]


def _t(x):
    return torch.from_dlpack(x).cpu()


def _same(a, b) -> bool:
    a, b = _t(a), b.cpu()
    return a.dtype == b.dtype and a.shape == b.shape and bool(
        (a.double().view(-1).isnan() & b.double().view(-1).isnan()
         | (a.view(-1) == b.view(-1))).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d[0].name if hasattr(d[0], "name") else "")
def test_gather_equals_torch(device, dt):
    cdt, tdt = dt
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 7, 3, generator=g) * 4).to(tdt)
    x[0, 0, 0] = float("nan")
    x[1, 1, 1] = -0.0
    X = cl.from_dlpack(x).to(device)
    for dim in (0, 1, 2, -1):
        d = dim % 3
        shp = [5, 7, 3]
        shp[d] = 11  # more indices than elements along dim: allowed
        shp[(d + 1) % 3] -= 1  # fewer rows: allowed
        idx = torch.randint(0, x.shape[d], shp, generator=g)
        got = cl.gather(X, dim, cl.from_dlpack(idx).to(device))
        assert str(got.device).startswith(device)
        assert _same(got, torch.gather(x, dim, idx)), dim
    # a strided input and a strided index
    xt = x.transpose(0, 1)
    idx = torch.randint(0, 5, (3, 7), generator=g).t()
    got = cl.gather(cl.from_dlpack(xt).to(device), 1, cl.from_dlpack(idx).to(device)[:, :, None]
                    .expand(7, 3, 3))
    assert _same(got, torch.gather(xt, 1, idx[:, :, None].expand(7, 3, 3)))


@pytest.mark.parametrize("device", DEVICES)
def test_take_along_dim_and_int32(device):
    x = torch.arange(24.0).view(2, 3, 4)
    X = cl.from_dlpack(x).to(device)
    i = torch.tensor([[[-1, 0]], [[3, -4]]])
    assert _same(cl.take_along_dim(X, cl.from_dlpack(i).to(device), 2),
                 torch.take_along_dim(x, i, 2))
    i2 = torch.tensor([0, 23, 7])
    assert _same(cl.take_along_dim(X, cl.from_dlpack(i2).to(device)),
                 torch.take_along_dim(x, i2))
    i5 = torch.tensor([[[-9, 5, 4, -4, 7]]])  # taken modulo 4, as torch's indices % size
    assert _same(cl.take_along_dim(X, cl.from_dlpack(i5).to(device), 2),
                 torch.take_along_dim(x, i5, 2))
    i3 = torch.tensor([[[1]], [[2]]], dtype=torch.int32)
    assert _same(cl.gather(X, 1, cl.from_dlpack(i3).to(device)), torch.gather(x, 1, i3))
    # broadcast of input and indices apart from dim
    i4 = torch.tensor([[[1, 3]]])
    assert _same(cl.take_along_dim(X, cl.from_dlpack(i4).to(device), 2),
                 torch.take_along_dim(x, i4, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_gather_pushed_through_log_softmax(device):
    """gather(log_softmax(x)) computes only the gathered values: one index step on x,
    the rows' max and sum read as they are, and the same bits as gathering the whole
    result, under every policy."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 1000, generator=g) * 3).to(torch.bfloat16)
    t = torch.randint(0, 1000, (6, 1), generator=g)
    X, T = cl.from_dlpack(x).to(device), cl.from_dlpack(t).to(device)
    f = cl.jit(lambda x, t: cl.gather(cl.log_softmax(x, -1), 1, t))
    full = cl.jit(lambda x: cl.log_softmax(x, -1))
    for policy in ("eager", "fused", "fp64"):
        want = np.take_along_axis(np.asarray(_t(full.run(X, policy=policy)).float()),
                                  t.numpy(), 1)
        got = np.asarray(_t(f.run(X, T, policy=policy)).float())
        assert np.array_equal(got, want), policy
    want = torch.gather(torch.log_softmax(x, -1), 1, t)
    if device == "cpu":
        assert _same(f.run(X, T, policy="eager", math="torch_eager"), want)
    assert "gather(" in f.trace(X, T)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_gradient_equals_torch(device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 9, generator=g)
    idx = torch.tensor([[1, 1, 3], [0, 8, 0], [2, 2, 2], [5, 4, 3]])  # repeated indices add
    cot = torch.randn(4, 3, generator=g)
    xr = x.clone().requires_grad_()
    torch.gather(xr, 1, idx).backward(cot)
    X, Ix, C = (cl.from_dlpack(a).to(device) for a in (x, idx, cot))
    (dx,) = cl.vjp(lambda x: cl.gather(x, 1, Ix), X)[1](C)
    assert _same(dx, xr.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_one_position_gradient_is_elementwise(device):
    """The gradient of a gather of one position along dim (cross-entropy's: a [rows, 1]
    index) is computed elementwise where the position equals the index, not scattered into
    a temporary: no scatter step in the plan, the same bits as torch (a -0 cotangent added
    to zeros is +0, a take_along_dim index wraps), and an index out of range in a
    gradient-only call still raises."""
    from castlab._lower_steps import IndexStep

    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 37, generator=g).to(torch.bfloat16)
    idx = torch.tensor([[0], [36], [5], [5], [-1], [-37]])
    cot = torch.randn(6, 1, generator=g).to(torch.bfloat16)
    cot[2, 0] = -0.0
    cot[3, 0] = float("nan")
    xr = x.clone().requires_grad_()
    torch.take_along_dim(xr, idx, 1).backward(cot)
    X, Ix, C = (cl.from_dlpack(a).to(device) for a in (x, idx, cot))
    fb = cl.jit(lambda x, i: cl.take_along_dim(x, i, 1)).backward_fn(argnums=0)
    for pol in ({}, {"policy": "fused", "math": "inductor"}, {"policy": "fused"}):
        (dx,) = fb.run(X, Ix, C, **pol)
        assert _same(dx, xr.grad), pol
        tr, _ = fb._traced(fb._bind((X, Ix, C)))
        scatters = [st for p in tr.plans.values() for st in p.steps
                    if isinstance(st, IndexStep) and st.spec[0] == 1]
        assert scatters == [], pol
    # a target out of range, in a call that computes only the gradient (no loss)
    t = cl.tensor([0, 1, 37, 2, 3, 4]).to(device)
    def ce(red):
        return lambda x, t: cl.cross_entropy(x, t, reduction=red)

    for red in ("sum", "none"):
        f = cl.jit(ce(red)).backward_fn(argnums=0)
        dy = cl.ones((6,) if red == "none" else (), dtype=cl.bfloat16).to(device)
        with pytest.raises(IndexError, match="Target 37 is out of bounds"):
            f.run(X, t, dy)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_indices(device):
    X = cl.randn(3, 4, seed=0).to(device)
    for bad in (4, -1, 1 << 40):
        idx = cl.tensor([[0], [bad], [1]], dtype=cl.int64).to(device)
        with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension 1 "
                                             "with size 4"):
            cl.gather(X, 1, idx)
    with pytest.raises(IndexError, match="-1 is out of bounds"):
        cl.take_along_dim(X.reshape(-1), cl.tensor([-1]).to(device))  # dim=None: as gather
    with pytest.raises(TypeError, match="int64"):
        cl.gather(X, 1, cl.tensor([[0.0]]).to(device))
    with pytest.raises(ValueError, match="same number of dimensions"):
        cl.gather(X, 1, cl.tensor([0]).to(device))
    with pytest.raises(ValueError, match="no larger than self"):
        cl.gather(X, 1, cl.zeros((5, 1), dtype=cl.int64).to(device))
    with pytest.raises(IndexError, match="Dimension out of range"):
        cl.gather(X, 2, cl.zeros((3, 1), dtype=cl.int64).to(device))
    # a gather whose values need no index step (the input broadcast along dim) still
    # checks its indices
    B = cl.randn(3, 1, seed=0).to(device)
    f = cl.jit(lambda b, i: cl.gather(cl.expand(b, (3, 4)) * 2, 1, i))
    with pytest.raises(IndexError, match="index 4 is out of bounds"):
        f(B, cl.tensor([[0], [4], [1]]).to(device))
    # and an empty index is fine
    assert tuple(cl.gather(X, 1, cl.zeros((3, 0), dtype=cl.int64).to(device)).shape) == (3, 0)
