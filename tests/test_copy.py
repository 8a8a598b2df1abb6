"""Assignment (``x[key] = v``, ``copy_``) into views, and copies whose source and
destination overlap (issue 14, items 1 and 2), checked against NumPy doing the same.

Every view castlab makes (steps, select, transpose/permute, unsqueeze, reshape views,
0-d), castlab-owned, NumPy-backed and DLPack-imported (torch) destinations, scalar,
same-dtype, other-dtype and broadcast sources; overlap by memory range, also across two
imports of one buffer. GPU variants are marked ``cuda``."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import castlab as cl
import castlab.cuda as clcuda

NP = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
      "bfloat16": ml_dtypes.bfloat16, "int32": np.int32, "int64": np.int64}


def _np(t) -> np.ndarray:
    return np.asarray(t.cpu().numpy()).copy()


# ---------------------------------------------------------------- the issue's reproducers

def test_select_column_assignment():
    x = cl.zeros(4, 6)
    x[:, 1] = 5.0
    ref = np.zeros((4, 6), np.float32)
    ref[:, 1] = 5.0
    np.testing.assert_array_equal(_np(x), ref)


def test_transpose_assignment():
    c = cl.zeros(3, 4)
    v = cl.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    c.T[...] = v
    np.testing.assert_array_equal(_np(c), np.arange(12, dtype=np.float32).reshape(4, 3).T)


def test_numpy_backed_step_assignment():
    a = np.zeros((3, 8), np.float32)
    t = cl.from_numpy(a)
    t[:, ::2] = 1
    ref = np.zeros((3, 8), np.float32)
    ref[:, ::2] = 1
    np.testing.assert_array_equal(a, ref)


def test_overlapping_numpy_imports():
    a = np.arange(5000.0)
    cl.from_numpy(a[1:])[...] = cl.from_numpy(a[:-1])
    ref = np.arange(5000.0)
    ref[1:] = ref[:-1].copy()
    np.testing.assert_array_equal(a, ref)


def test_inplace_op_on_shifted_view():
    x = cl.tensor(np.arange(2000, dtype=np.float32))
    x[1:] = x[:-1] * 2
    ref = np.arange(2000, dtype=np.float32)
    ref[1:] = ref[:-1] * 2
    np.testing.assert_array_equal(_np(x), ref)


# ---------------------------------------------------------------- views, exhaustively-ish

@st.composite
def views(draw, max_dims=3):
    """A base shape and a chain of view ops castlab and NumPy both express."""
    nd = draw(st.integers(0, max_dims))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=nd, max_size=nd)))
    ops = []
    cur = list(shape)
    for _ in range(draw(st.integers(0, 4))):
        kinds = ["unsqueeze"]
        if cur:
            kinds += ["slice", "select", "permute"]
        if len(cur) >= 2:
            kinds += ["merge"]
        if cur and cur[-1] % 2 == 0 and cur[-1] > 0:
            kinds += ["split"]
        k = draw(st.sampled_from(kinds))
        if k == "slice":
            d = draw(st.integers(0, len(cur) - 1))
            n = cur[d]
            start = draw(st.integers(-n - 1, n + 1))
            stop = draw(st.integers(-n - 1, n + 1))
            step = draw(st.integers(1, 3))
            ops.append(("slice", d, start, stop, step))
            cur[d] = len(range(*slice(start, stop, step).indices(n)))
        elif k == "select":
            cand = [d for d in range(len(cur)) if cur[d] > 0]
            if not cand:
                continue
            d = draw(st.sampled_from(cand))
            i = draw(st.integers(-cur[d], cur[d] - 1))
            ops.append(("select", d, i))
            del cur[d]
        elif k == "permute":
            perm = draw(st.permutations(range(len(cur))))
            ops.append(("permute", tuple(perm)))
            cur = [cur[p] for p in perm]
        elif k == "unsqueeze":
            d = draw(st.integers(0, len(cur)))
            ops.append(("unsqueeze", d))
            cur.insert(d, 1)
        elif k == "merge":  # reshape: a view when the two dims are mergeable, else skipped
            ops.append(("merge",))
            cur = cur[:-2] + [cur[-2] * cur[-1]]
        elif k == "split":
            ops.append(("split",))
            cur = cur[:-1] + [2, cur[-1] // 2]
    return shape, ops


def _apply(x, ops, is_np: bool):
    """Apply a view chain to a NumPy array or a castlab tensor; None when castlab's reshape
    would copy (not a view: assignment through it would not reach the base)."""
    for op in ops:
        k = op[0]
        if k == "slice":
            key = (slice(None),) * op[1] + (slice(op[2], op[3], op[4]),)
            x = x[key]
        elif k == "select":
            key = (slice(None),) * op[1] + (op[2], Ellipsis)  # NumPy: a 0-d view, not a scalar
            x = x[key]
        elif k == "permute":
            x = x.transpose(op[1]) if is_np else x.permute(op[1])
        elif k == "unsqueeze":
            x = np.expand_dims(x, op[1]) if is_np else x.unsqueeze(op[1])
        elif k in ("merge", "split"):
            s = tuple(x.shape)
            new = s[:-2] + (s[-2] * s[-1],) if k == "merge" else s[:-1] + (2, s[-1] // 2)
            if is_np:
                v = x.view()
                try:
                    v.shape = new  # raises when no view exists
                except AttributeError:
                    return None
                x = v
            else:
                x = x._view_or_none(list(new))
                if x is None:
                    return None
    return x


_PAIRS = [("float32", "float32"), ("float32", "float64"), ("bfloat16", "float32"),
          ("float16", "float64"), ("float64", "float32"), ("int32", "int64"),
          ("int64", "int32"), ("float32", "int32"), ("bfloat16", "bfloat16")]


@st.composite
def sources(draw, shape, src_dtype):
    """A source for a destination of `shape`: a scalar, or an array broadcastable to it."""
    kind = draw(st.sampled_from(["scalar", "full", "broadcast"]))
    is_int = src_dtype.startswith("int")
    if kind == "scalar":
        if is_int:
            return draw(st.integers(-1000, 1000))
        return draw(st.sampled_from([1.5, -3.25, 0.0, -0.0, 7.0, 0.1, 1e30, float("inf")]))
    if kind == "full":
        sshape = tuple(shape)
    else:  # drop leading dims and set some dims to 1
        cut = draw(st.integers(0, len(shape)))
        sshape = tuple(1 if draw(st.booleans()) else n for n in shape[cut:])
    n = int(np.prod(sshape, dtype=np.int64))
    if is_int:
        vals = np.array(draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n)))
    else:
        vals = np.array(draw(st.lists(st.floats(-1e4, 1e4, width=32), min_size=n, max_size=n)))
    return vals.reshape(sshape).astype(NP[src_dtype])


def _reference(base: np.ndarray, ops, src):
    ref = base.copy()
    v = _apply(ref, ops, True)
    if isinstance(src, float) and ref.dtype == ml_dtypes.bfloat16:
        src = np.float64(src)
    with np.errstate(over="ignore"):  # 1e30 into float16 is inf, as in castlab
        v[...] = src
    return ref


def _check_assignment(data, device: str, holder: str):
    shape, ops = data.draw(views())
    dst_dt, src_dt = data.draw(st.sampled_from(_PAIRS))
    base_np = (np.arange(int(np.prod(shape, dtype=np.int64))) % 97 - 40).reshape(shape)
    base_np = base_np.astype(NP[dst_dt])
    vnp = _apply(base_np.copy(), ops, True)
    if vnp is None:
        return
    src = data.draw(sources(vnp.shape, src_dt))
    if isinstance(src, float) and dst_dt.startswith("int"):
        src = int(src) if np.isfinite(src) and abs(src) < 1e6 else 3
    if holder == "castlab":
        base = cl.tensor(base_np, device=device)
    elif holder == "numpy":
        keep = base_np.copy()
        base = cl.from_numpy(keep)
    else:
        keep = torch.from_numpy(base_np.view(np.int16).copy()).view(torch.bfloat16) \
            if dst_dt == "bfloat16" else torch.from_numpy(base_np.copy())
        keep = keep.to(device)
        base = cl.from_dlpack(keep)
    view = _apply(base, ops, False)
    if view is None:
        return
    assert tuple(view.shape) == vnp.shape
    if isinstance(src, np.ndarray):
        view[...] = cl.tensor(src, device=device)
    else:
        view[...] = src
    expected = _reference(base_np, ops, src)
    got = _np(base)
    if holder == "numpy":
        np.testing.assert_array_equal(keep, expected)
    elif holder == "torch":
        k = keep.cpu()
        k = k.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if dst_dt == "bfloat16" else k.numpy()
        np.testing.assert_array_equal(k, expected)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("holder", ["castlab", "numpy", "torch"])
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_assignment_matches_numpy(holder, data):
    _check_assignment(data, "cpu", holder)


@pytest.mark.parametrize("holder", ["castlab", "torch"])
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
@pytest.mark.cuda
@pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")
def test_assignment_matches_numpy_cuda(holder, data):
    _check_assignment(data, "cuda", holder)


def test_assignment_views_by_hand():
    """One of each view kind, including 0-d and a negative-stride NumPy destination."""
    x = cl.zeros(3, 4, 5)
    ref = np.zeros((3, 4, 5), np.float32)
    x[1] = 1.0
    ref[1] = 1.0
    x[:, 2, ::2] = 2.0
    ref[:, 2, ::2] = 2.0
    x.permute(2, 0, 1)[3] = cl.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    ref.transpose(2, 0, 1)[3] = np.arange(12, dtype=np.float32).reshape(3, 4)
    x[0, 0, 0] = -7.0
    ref[0, 0, 0] = -7.0
    x[None, 2, :, None, 4] = 9.0
    ref[None, 2, :, None, 4] = 9.0
    x[2].reshape(20)[5:] = cl.arange(15, dtype=cl.float32)
    ref[2].reshape(20)[5:] = np.arange(15)
    x[:, 1:3] = cl.tensor([10.0, 11.0, 12.0, 13.0, 14.0])  # broadcast source
    ref[:, 1:3] = [10.0, 11.0, 12.0, 13.0, 14.0]
    np.testing.assert_array_equal(_np(x), ref)
    z = cl.zeros(())
    z[...] = 3.5
    assert z.item() == 3.5
    a = np.zeros(10, np.float32)
    r = cl.from_numpy(a[::-1])  # NumPy's negative strides
    r[::3] = cl.tensor([1.0, 2.0, 3.0, 4.0])
    ref = np.zeros(10, np.float32)
    ref[::-1][::3] = [1.0, 2.0, 3.0, 4.0]
    np.testing.assert_array_equal(a, ref)


def test_assignment_conversion_rounds_once():
    x = cl.zeros(4, 4, dtype=cl.bfloat16)
    v = np.array([1 + 2.0**-9 + 2.0**-30, 1 + 3 * 2.0**-9, -(1 + 2.0**-8), 0.1])
    x[:, 2] = cl.tensor(v, dtype=cl.float64)
    col = _np(x)[:, 2].astype(np.float64)
    np.testing.assert_array_equal(col, torch.tensor(v).to(torch.bfloat16).double().numpy())
    assert (_np(x)[:, [0, 1, 3]] == 0).all()
    i = cl.zeros(2, 3, dtype=cl.int32)
    i.T[1] = cl.tensor([2.75, -2.75])
    assert i.tolist() == [[0, 2, 0], [0, -2, 0]]


def test_leading_ones_and_bad_broadcast():
    x = cl.zeros(2, 3)
    x[0] = cl.ones(1, 3)
    assert x.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"shape \[2\].*\[3\]"):
        x[0] = cl.ones(2)
    with pytest.raises(ValueError, match="broadcast"):
        x[:, 0] = cl.ones(3)
    with pytest.raises(ValueError, match="broadcast"):
        x[...] = cl.ones(2, 2, 3)


def test_expanded_destination_is_refused():
    x = cl.zeros(3)
    with pytest.raises(ValueError, match="share one memory location"):
        x.expand(2, 3)[...] = cl.ones(2, 3)
    assert x.tolist() == [0.0, 0.0, 0.0]
    cl.zeros(1).expand(1, 1)[...] = 2.0  # one element: no repetition
    x.expand(0, 3)[...] = 1.0  # empty: nothing to write
    assert x.tolist() == [0.0, 0.0, 0.0]


def test_read_only_destination_is_refused():
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        cl.from_numpy(a)[1:] = 1.0


def test_plan_refuses_outputs_of_another_layout():
    x = cl.ones(4, 6)
    y = cl.exp(x)
    plan = next(iter(cl.ops._eager_cache.values()))
    bad = cl.zeros(6, 4).T
    with pytest.raises(ValueError, match="strides"):
        plan.run([x], [bad])
    assert bad.tolist() == cl.zeros(4, 6).tolist()
    del y


# ---------------------------------------------------------------- overlap

def test_may_overlap_by_address():
    a = np.arange(100.0)
    t1, t2 = cl.from_numpy(a[1:]), cl.from_numpy(a[:-1])
    assert not t1._same_storage(t2)
    assert cl._C.may_overlap(t1, t2)
    assert not cl._C.may_overlap(cl.from_numpy(a[:50]), cl.from_numpy(a[50:]))
    assert cl._C.same_elements(cl.from_numpy(a), cl.from_numpy(a))
    assert not cl._C.same_elements(t1, t2)
    x = cl.zeros(4, 4)
    assert cl._C.may_overlap(x[0], x[:, 0])
    assert not cl._C.may_overlap(x[0], x[1])
    assert not cl._C.may_overlap(x, cl.zeros(4, 4))
    assert not cl._C.may_overlap(x[:0], x)
    assert cl._C.has_internal_overlap(x[0].expand(3, 4))
    assert not cl._C.has_internal_overlap(x.T[::2])


_SHIFTS = [(slice(1, None), slice(None, -1)), (slice(None, -1), slice(1, None)),
           (slice(3, None), slice(None, -3)), (slice(None, -513), slice(513, None)),
           (slice(513, None), slice(None, -513)), (slice(2, None, 2), slice(None, -2, 2)),
           (slice(None, -2, 2), slice(2, None, 2)), (slice(1, None, 3), slice(None, -1, 3)),
           (slice(None, -5, 3), slice(5, None, 3)), (slice(4, None), slice(None, -4)),
           (slice(None, 2000), slice(1000, 3000)), (slice(1000, 3000), slice(None, 2000))]


@pytest.mark.parametrize("holder", ["castlab", "numpy"])
@pytest.mark.parametrize("dst_key,src_key", _SHIFTS)
def test_overlapping_shifts_1d(holder, dst_key, src_key):
    n = 5000
    ref = np.arange(n, dtype=np.float64)
    ref[dst_key] = ref[src_key]  # NumPy copies through a temporary when they overlap
    if holder == "numpy":
        a = np.arange(n, dtype=np.float64)
        cl.from_numpy(a[dst_key])[...] = cl.from_numpy(a[src_key])
        np.testing.assert_array_equal(a, ref)
    else:
        t = cl.arange(n, dtype=cl.float64)
        t[dst_key] = t[src_key]
        np.testing.assert_array_equal(_np(t), ref)


def _overlap_cases_2d():
    return [
        ((slice(1, None),), (slice(None, -1),)),
        ((slice(None, -1),), (slice(1, None),)),
        ((slice(None), slice(1, None)), (slice(None), slice(None, -1))),
        ((slice(None), slice(None, -1)), (slice(None), slice(1, None))),
        ((slice(1, None), slice(1, None)), (slice(None, -1), slice(None, -1))),
        ((slice(None, None, 2), slice(1, None)), (slice(1, None, 2), slice(None, -1))),
        ((0,), (slice(None), 0)),
        ((slice(None), 0), (1,)),
    ]


@pytest.mark.parametrize("holder", ["castlab", "numpy"])
@pytest.mark.parametrize("dst_key,src_key", _overlap_cases_2d())
def test_overlapping_2d(holder, dst_key, src_key):
    ref = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    ref[dst_key] = ref[src_key].copy()
    if holder == "numpy":
        a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
        cl.from_numpy(a[dst_key])[...] = cl.from_numpy(a[src_key])
        np.testing.assert_array_equal(a, ref)
    else:
        t = cl.tensor(np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
        t[dst_key] = t[src_key]
        np.testing.assert_array_equal(_np(t), ref)


def test_overlapping_transpose_and_conversion():
    t = cl.tensor(np.arange(40 * 40, dtype=np.float32).reshape(40, 40))
    t[...] = t.T
    np.testing.assert_array_equal(_np(t), np.arange(1600, dtype=np.float32).reshape(40, 40).T)
    # the same bytes seen as two dtypes (two NumPy imports of one buffer)
    a = np.arange(2000, dtype=np.int32)
    ref = a.copy()
    ref.view(np.float32)[1:] = ref[:-1]
    cl.from_numpy(a.view(np.float32)[1:])[...] = cl.from_numpy(a[:-1])
    np.testing.assert_array_equal(a, ref)
    # elementwise-identical: no temporary needed, same result
    x = cl.arange(1000, dtype=cl.float32)
    x[...] = x
    x[::2] = x[::2] * 2
    ref = np.arange(1000, dtype=np.float32)
    ref[::2] *= 2
    np.testing.assert_array_equal(_np(x), ref)


def test_overlapping_torch_imports():
    base = torch.arange(3000, dtype=torch.float32)
    cl.from_dlpack(base[2:])[...] = cl.from_dlpack(base[:-2])
    ref = torch.arange(3000, dtype=torch.float32)
    ref[2:] = ref[:-2].clone()
    assert torch.equal(base, ref)


@pytest.mark.cuda
@pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")
@pytest.mark.parametrize("dst_key,src_key", _SHIFTS)
def test_overlapping_shifts_cuda(dst_key, src_key):
    n = 5000
    ref = np.arange(n, dtype=np.float32)
    ref[dst_key] = ref[src_key]
    t = cl.arange(n, dtype=cl.float32, device="cuda")
    t[dst_key] = t[src_key]
    np.testing.assert_array_equal(_np(t), ref)
    base = torch.arange(n, dtype=torch.float32, device="cuda")
    cl.from_dlpack(base[dst_key])[...] = cl.from_dlpack(base[src_key])
    np.testing.assert_array_equal(base.cpu().numpy(), ref)


@pytest.mark.cuda
@pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")
@pytest.mark.parametrize("dst_key,src_key", _overlap_cases_2d())
def test_overlapping_2d_cuda(dst_key, src_key):
    ref = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    ref[dst_key] = ref[src_key].copy()
    t = cl.tensor(np.arange(64 * 64, dtype=np.float32).reshape(64, 64), device="cuda")
    t[dst_key] = t[src_key]
    np.testing.assert_array_equal(_np(t), ref)


@pytest.mark.cuda
@pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")
def test_issue_reproducers_cuda():
    x = cl.zeros(4, 6, device="cuda")
    x[:, 1] = 5.0
    ref = np.zeros((4, 6), np.float32)
    ref[:, 1] = 5.0
    np.testing.assert_array_equal(_np(x), ref)
    c = cl.zeros(3, 4, device="cuda")
    c.T[...] = cl.tensor(np.arange(12, dtype=np.float32).reshape(4, 3), device="cuda")
    np.testing.assert_array_equal(_np(c), np.arange(12, dtype=np.float32).reshape(4, 3).T)
    t = cl.zeros(3, 8, device="cuda")
    t[:, ::2] = cl.ones(3, 4)  # a CPU source is moved to the destination's device
    ref = np.zeros((3, 8), np.float32)
    ref[:, ::2] = 1
    np.testing.assert_array_equal(_np(t), ref)
