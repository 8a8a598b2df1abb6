"""Integer and bool tensors are exact in every op that accepts them (issue 14, item 3):
loads, stores, copies, comparisons, where and casts go through int64 registers, and
float -> integer casts of NaN, infinities and out-of-range values give PyTorch's result."""

import numpy as np
import pytest
import torch

import castlab as cl

BIG = [2**62 + 1, 2**62 + 3, -(2**62) - 1, 2**63 - 1, -(2**63), 2**53 + 1, 7, 0]
TORCH = {"int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
         "float32": torch.float32, "float64": torch.float64}


def test_creation_is_exact():
    assert cl.tensor([2**24 + 1], dtype=cl.int32).tolist() == [2**24 + 1]
    assert cl.tensor([2**62 + 1]).tolist() == [2**62 + 1]
    assert cl.tensor(BIG).tolist() == BIG
    assert cl.tensor(np.array(BIG)).tolist() == BIG
    assert cl.full((2,), 2**62 + 1).tolist() == [2**62 + 1] * 2
    assert cl.full((1,), 2**31 - 1, dtype=cl.int32).tolist() == [2**31 - 1]
    assert cl.full((1,), 2.7, dtype=cl.int32).tolist() == [2]
    assert cl.arange(2**62, 2**62 + 3).tolist() == [2**62, 2**62 + 1, 2**62 + 2]
    assert cl.arange(2**31 - 3, 2**31, dtype=cl.int32).tolist() == list(range(2**31 - 3, 2**31))


@pytest.mark.parametrize("make", [
    lambda: cl.tensor([2**63]),
    lambda: cl.tensor([-(2**63) - 1]),
    lambda: cl.tensor([2**70]),
    lambda: cl.tensor([2**31], dtype=cl.int32),
    lambda: cl.tensor([float("nan")], dtype=cl.int32),
    lambda: cl.tensor([1e10], dtype=cl.int32),
    lambda: cl.full((2,), 2**40, dtype=cl.int32),
    lambda: cl.full((2,), 2**63),
    lambda: cl.full((2,), float("inf"), dtype=cl.int64),
    lambda: cl.arange(2**31 - 2, 2**31 + 2, dtype=cl.int32),
])
def test_creation_out_of_range_raises(make):
    with pytest.raises(ValueError, match="cannot be converted"):
        make()


def test_assignment_out_of_range_raises():
    x = cl.zeros(3, dtype=cl.int32)
    with pytest.raises(ValueError, match="int32"):
        x[...] = 2**40


DTS = ["int32", "int64", "bool", "float32", "float64"]
VALUES = [0, 1, -1, 2**24 + 1, -(2**31), 2**31 - 1, 2**53 + 1, 2**62 + 1, -(2**63), 2**63 - 1]


@pytest.mark.parametrize("src", DTS)
@pytest.mark.parametrize("dst", DTS)
def test_astype_matches_torch(src, dst):
    t = torch.tensor(VALUES, dtype=torch.int64).to(TORCH[src])
    x = cl.from_dlpack(t.clone()) if src != "bool" else cl.tensor(t.numpy())
    got = x.astype(getattr(cl, dst))
    want = t.to(TORCH[dst])
    assert got.tolist() == want.tolist(), (src, dst)


SPECIALS = [float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 1e10, -1e10, 3e9,
            2147483648.0, -2147483649.0, -2147483648.0, 2147483647.0, 9.3e18, -9.3e18,
            2.0**63, -(2.0**63), 2.5, -2.7, 0.0, -0.0, 1e-30]


@pytest.mark.parametrize("src", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("dst", ["int32", "int64", "bool"])
def test_float_to_int_specials_match_torch(src, dst):
    """NaN, infinities and out-of-range values: PyTorch's x86-64 results (the format's
    minimum), with no undefined behaviour in C++."""
    t = torch.tensor(SPECIALS, dtype=torch.float64).to(getattr(torch, src))
    x = cl.tensor(t.to(torch.float64).numpy()).astype(getattr(cl, src))
    want = t.to(TORCH[dst]).tolist()
    got = x.astype(getattr(cl, dst)).tolist()
    assert got == want
    f = cl.jit(lambda v: v.astype(getattr(cl, dst)))
    assert f(x).tolist() == want


def test_contiguous_and_clone_of_strided_int_views():
    a = np.array(BIG * 3, dtype=np.int64).reshape(4, 6)
    x = cl.tensor(a)
    for v, ref in ((x.T, a.T), (x[:, ::2], a[:, ::2]), (x[1:, 1], a[1:, 1])):
        assert v.contiguous().tolist() == ref.tolist()
        assert v.clone().tolist() == ref.tolist()
    b = np.array([2**24 + 1, 2**31 - 1, -(2**31), 5], dtype=np.int32)
    assert cl.from_numpy(b[::-1].copy()).clone().tolist() == b[::-1].tolist()
    assert cl.tensor(b)[::2].contiguous().tolist() == b[::2].tolist()


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_compare_int64_near_2_62(op):
    a = np.array([2**62, 2**62 + 1, 2**62 + 2, -(2**62) - 1, 2**63 - 1], dtype=np.int64)
    b = np.array([2**62 + 1, 2**62 + 1, 2**62 + 1, -(2**62), 2**63 - 2], dtype=np.int64)
    want = getattr(np, {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
                        "gt": "greater", "ge": "greater_equal"}[op])(a, b).tolist()
    x, y = cl.tensor(a), cl.tensor(b)
    assert getattr(cl, op)(x, y).tolist() == want
    assert getattr(cl, op)(x, 2**62 + 1).tolist() == getattr(np, {
        "eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
        "gt": "greater", "ge": "greater_equal"}[op])(a, 2**62 + 1).tolist()
    f = cl.jit(lambda u, v: getattr(cl, op)(u, v))
    assert f(x, y).tolist() == want
    # int32 against int64, and bool against int
    c = cl.tensor([2**31 - 1, -5], dtype=cl.int32)
    d = cl.tensor([2**31 - 1 + 2**32, -5])
    assert (c == d).tolist() == [False, True]
    assert (cl.tensor([True, False]) == cl.tensor([1, 2])).tolist() == [True, False]


def test_compare_with_float_keeps_float_semantics():
    x = cl.tensor([1, 2, 3])
    assert (x < 2.5).tolist() == [True, True, False]
    assert (x == 2.0).tolist() == [False, True, False]


def test_compare_scalar_out_of_int64_raises():
    with pytest.raises(ValueError, match="int64"):
        _ = cl.tensor([1, 2]) == 2**64


def test_where_int64_exact():
    a = np.array(BIG, dtype=np.int64)
    b = a[::-1].copy()
    c = np.array([i % 3 == 0 for i in range(len(BIG))])
    want = np.where(c, a, b).tolist()
    x, y, m = cl.tensor(a), cl.tensor(b), cl.tensor(c)
    assert cl.where(m, x, y).tolist() == want
    assert cl.where(m, x, 2**62 + 5).tolist() == np.where(c, a, 2**62 + 5).tolist()
    f = cl.jit(lambda m, u, v: cl.where(m, u, v))
    assert f(m, x, y).tolist() == want
    # the condition from a comparison of floats, selecting integers
    g = cl.jit(lambda u, v, w: cl.where(w > 0.5, u, v))
    w = cl.tensor([0.0, 1.0] * 4)
    assert g(x, y, w).tolist() == np.where(np.array([0.0, 1.0] * 4) > 0.5, a, b).tolist()


def test_cat_and_stack_of_int_tensors():
    a = cl.tensor([2**62 + 1, 2**62 + 3])
    b = cl.tensor([2**24 + 1, -7], dtype=cl.int32)
    assert cl.cat([a, b]).tolist() == [2**62 + 1, 2**62 + 3, 2**24 + 1, -7]
    assert cl.stack([a, a]).tolist() == [[2**62 + 1, 2**62 + 3]] * 2
    assert cl.cat([b, b]).dtype == cl.int32
    assert cl.cat([b, b]).tolist() == [2**24 + 1, -7] * 2
    f = cl.jit(lambda u, v: cl.cat([u, v.astype(cl.int64)]))
    assert f(a, b).tolist() == [2**62 + 1, 2**62 + 3, 2**24 + 1, -7]


def test_jit_chain_narrows_like_torch():
    """int64 -> int32 wraps at the cast (as PyTorch), also inside one fused kernel."""
    t = torch.tensor([2**32 + 1, 2**31, -(2**31) - 1, 5])
    x = cl.tensor(t.numpy())
    f = cl.jit(lambda v: v.astype(cl.int32) == 1)
    assert f(x).tolist() == (t.to(torch.int32) == 1).tolist()
    g = cl.jit(lambda v: v.astype(cl.int32).astype(cl.int64))
    assert g(x).tolist() == t.to(torch.int32).to(torch.int64).tolist()
    h = cl.jit(lambda v: v.astype(cl.bool).astype(cl.int32))
    assert h(x).tolist() == t.to(torch.bool).to(torch.int32).tolist()


def test_int_to_float_rounds_once():
    t = torch.tensor([2**62 + 1, 2**24 + 1, 2**53 + 1, -(2**63)])
    x = cl.tensor(t.numpy())
    assert x.astype(cl.float32).tolist() == t.to(torch.float32).tolist()
    assert x.astype(cl.float64).tolist() == t.to(torch.float64).tolist()
    assert cl.exp(cl.tensor([1, 2], dtype=cl.int32)).dtype == cl.float32


def test_program_checks_register_types():
    from castlab import _C
    from castlab._optable import I64, instr, output
    with pytest.raises(ValueError, match="int64"):
        _C.Program([instr("load", I64, 0, dtype=cl.float32.code),], 1, [output(0)], 0)
    with pytest.raises(ValueError, match="int64 registers"):
        _C.Program([instr("const", I64, 0), instr("exp", I64, 1, 0)], 2, [output(1)], 0)
    with pytest.raises(ValueError, match="operand"):
        _C.Program([instr("const", I64, 0), instr("exp", 0, 1, 0)], 2, [output(1)], 0)
