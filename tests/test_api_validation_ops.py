"""Argument validation of the shape ops (castlab.ops) and castlab.numerics: a wrong type
raises TypeError, a bad value ValueError, each naming the function/argument; valid
integer-likes (NumPy integers, 0-d integer tensors) keep working."""

from __future__ import annotations

import numpy as np
import pytest

import castlab as cl
import castlab.numerics as nm


@pytest.fixture
def x():
    return cl.zeros(3, 4)


# ---------------------------------------------------------------- shape ops

@pytest.mark.parametrize("shape", [(2.0, 6), ("a",), (2, None), ((2.5, 6),)])
def test_reshape_rejects_non_int_sizes(x, shape):
    with pytest.raises(TypeError, match=r"reshape.*int"):
        x.reshape(*shape)


@pytest.mark.parametrize("fn, args", [
    ("view", (2.0, 6)), ("expand", (3.0, 4)), ("permute", (1.0, 0)),
])
def test_other_views_reject_float_sizes(x, fn, args):
    with pytest.raises(TypeError, match=fn):
        getattr(x, fn)(*args)


def test_reshape_accepts_integer_likes(x):
    assert x.reshape(np.int64(2), 6).shape == (2, 6)
    assert x.reshape(cl.tensor(6), 2).shape == (6, 2)
    assert x.reshape([np.int32(12)]).shape == (12,)
    assert x.view(np.int64(12)).shape == (12,)
    assert x.permute(np.int64(1), 0).shape == (4, 3)


def test_reshape_traced_rejects_float():
    f = cl.jit(lambda a: a.reshape(2.0, 6))
    with pytest.raises(TypeError, match=r"reshape.*int"):
        f(cl.zeros(3, 4))


@pytest.mark.parametrize("arg", [1.5, "2", None])
def test_split_rejects_non_int(x, arg):
    with pytest.raises(TypeError, match=r"split.*int"):
        cl.split(x, arg)


def test_split_rejects_float_sections(x):
    with pytest.raises(TypeError, match=r"split.*int"):
        cl.split(x, [1.5, 1.5])


def test_split_accepts_numpy_ints(x):
    assert [t.shape for t in cl.split(x, np.int64(2))] == [(2, 4), (1, 4)]
    assert [t.shape for t in cl.split(x, (np.int64(1), 2))] == [(1, 4), (2, 4)]
    assert [t.shape for t in cl.split(x, range(1, 3))] == [(1, 4), (2, 4)]
    with pytest.raises(ValueError, match="add up"):
        cl.split(x, [1, 1])


@pytest.mark.parametrize("fn", [cl.cat, cl.stack])
def test_cat_stack_reject_a_tensor_instead_of_a_sequence(x, fn):
    with pytest.raises(TypeError, match=r"sequence.*tensors"):
        fn(x)
    with pytest.raises(TypeError, match=r"sequence"):
        fn(5)
    with pytest.raises(TypeError, match=r"sequence"):
        fn("ab")


@pytest.mark.parametrize("fn", [cl.cat, cl.stack])
@pytest.mark.parametrize("bad", [None, 1.0, "x", [1.0, 2.0]])
def test_cat_stack_reject_non_tensor_elements(x, fn, bad):
    with pytest.raises(TypeError, match=r"element 1 is"):
        fn([x, bad])


def test_cat_stack_still_work(x):
    assert cl.cat((x, x)).shape == (6, 4)
    assert cl.cat(t for t in (x, x)).shape == (6, 4)  # any iterable of tensors
    assert cl.stack([x, x], dim=1).shape == (3, 2, 4)
    with pytest.raises(ValueError, match="non-empty"):
        cl.cat([])


@pytest.mark.parametrize("fn", [cl.contiguous, cl.clone])
@pytest.mark.parametrize("bad", [None, "x", 1.0, [1.0]])
def test_contiguous_clone_reject_non_tensors(fn, bad):
    with pytest.raises(TypeError, match=rf"{fn.__name__}: expected a castlab Tensor, not "
                                        rf"{type(bad).__name__}"):
        fn(bad)


def test_contiguous_clone_still_work(x):
    assert cl.contiguous(x) is x
    t = x.t()
    assert cl.contiguous(t).is_contiguous()
    assert cl.clone(x).tolist() == x.tolist()


# ---------------------------------------------------------------- numerics

@pytest.fixture
def ref():
    return cl.tensor([1.0, 2.0, 3.0], dtype=cl.float64)


@pytest.mark.parametrize("tol", [-1, -1e-9, float("nan")])
def test_compare_and_same_reject_bad_tol(ref, tol):
    v = ref.astype(cl.bfloat16)
    with pytest.raises(ValueError, match="compare: tol"):
        nm.compare(v, ref=ref, tol=tol)
    with pytest.raises(ValueError, match="same: tol"):
        nm.same(v, v, tol=tol)


@pytest.mark.parametrize("tol", ["a", None, True])
def test_compare_rejects_non_number_tol(ref, tol):
    with pytest.raises(TypeError, match="compare: tol"):
        nm.compare(ref.astype(cl.bfloat16), ref=ref, tol=tol)


def test_compare_accepts_valid_tol(ref):
    v = ref.astype(cl.bfloat16)
    for tol in (0, 1e-3, np.float32(1e-2), float("inf")):
        assert nm.compare(v, ref=ref, tol=tol) is not None
    assert bool(nm.same(v, v, tol=0))


@pytest.mark.parametrize("sat", ["yes", 1, 0.0])
def test_round_to_rejects_non_bool_saturate(ref, sat):
    with pytest.raises(TypeError, match="saturate"):
        nm.round_to(ref, cl.float8_e4m3fn, saturate=sat)


def test_round_to_accepts_bool_saturate():
    big = cl.tensor([1e10], dtype=cl.float64)
    for sat in (None, True, False, np.bool_(True)):
        nm.round_to(big, cl.float8_e5m2, saturate=sat)
    assert nm.round_to(big, cl.float8_e5m2, saturate=False).astype(cl.float64).item() == float("inf")


@pytest.mark.parametrize("within", ["a", None, [0.1]])
def test_near_ties_rejects_non_number_within(ref, within):
    with pytest.raises(TypeError, match="within"):
        nm.near_ties(ref, cl.bfloat16, within=within)


def test_near_ties_bad_within_value(ref):
    for w in (-1, 0.5, float("nan")):
        with pytest.raises(ValueError, match="within"):
            nm.near_ties(ref, cl.bfloat16, within=w)
    assert nm.near_ties(ref, cl.bfloat16, within=np.float64(0.01)) is not None


def test_drift_explain_reject_empty_policies_or_maths():
    x = cl.rand(4, seed=0, dtype=cl.bfloat16)

    def f(a):
        return cl.silu(a) * a
    for kw in ({"policies": []}, {"policies": ()}):
        with pytest.raises(ValueError, match="policies"):
            nm.drift(f, (x,), **kw)
        with pytest.raises(ValueError, match="policies"):
            nm.explain(f, (x,), (0,), **kw)
    with pytest.raises(ValueError, match="maths"):
        nm.drift(f, (x,), maths=[])
