"""The tensor core: views vs NumPy (hypothesis), creation, seeded random numbers, NumPy
interop without copies, printing, and clear errors on bad input."""

from __future__ import annotations

import ast
import inspect
import pathlib
import types

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import castlab as cl
from castlab import _tensor, ops
from castlab._graph import Proxy
from castlab._optable import OPS

torch = pytest.importorskip("torch")

NPD = {cl.float64: np.float64, cl.float32: np.float32, cl.float16: np.float16,
       cl.bfloat16: ml_dtypes.bfloat16, cl.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
       cl.float8_e5m2: ml_dtypes.float8_e5m2, cl.bool: np.bool_, cl.int32: np.int32,
       cl.int64: np.int64}
ALL = list(NPD)


def same(t, a):
    """castlab tensor t has exactly NumPy array a's shape, dtype and values (bitwise)."""
    got = t.numpy()
    assert got.shape == a.shape, (got.shape, a.shape)
    assert got.dtype == a.dtype, (got.dtype, a.dtype)
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize]
    assert np.array_equal(np.ascontiguousarray(got).view(u), np.ascontiguousarray(a).view(u))


def shares_memory(t, base) -> bool:
    return np.shares_memory(t.numpy(), base.numpy() if not isinstance(base, np.ndarray) else base)


# ----------------------------------------------------------------------------- hypothesis views

@st.composite
def array_and_key(draw):
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=nd, max_size=nd)))
    key = []
    dims_left = nd
    for d in shape:
        kind = draw(st.sampled_from(["slice", "slice", "int", "full"]))
        if kind == "int":
            key.append(draw(st.integers(-d, d - 1)))
        elif kind == "slice":
            start = draw(st.one_of(st.none(), st.integers(-d - 2, d + 2)))
            stop = draw(st.one_of(st.none(), st.integers(-d - 2, d + 2)))
            step = draw(st.one_of(st.none(), st.integers(1, 3)))
            key.append(slice(start, stop, step))
        else:
            key.append(slice(None))
        dims_left -= 1
    if draw(st.booleans()) and len(key) > 1:
        key = [Ellipsis] + key[1:]
    if draw(st.booleans()):
        key.insert(draw(st.integers(0, len(key))), None)
    return shape, tuple(key)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(array_and_key(), st.sampled_from([cl.float32, cl.bfloat16, cl.float16, cl.float64]))
def test_hyp_indexing_vs_numpy(sk, dt):
    shape, key = sk
    a = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape).astype(NPD[dt])
    t = cl.from_numpy(a)
    v = t[key]
    same(v, a[key])
    if v.numel():
        assert shares_memory(v, a)  # a view, never a copy


@st.composite
def shape_and_perm(draw):
    nd = draw(st.integers(1, 5))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=nd, max_size=nd)))
    perm = tuple(draw(st.permutations(range(nd))))
    return shape, perm


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape_and_perm(), st.integers(-1, 4), st.data())
def test_hyp_view_ops_vs_numpy(sp, k, data):
    shape, perm = sp
    nd = len(shape)
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    t = cl.from_numpy(a)
    same(t.permute(*perm), a.transpose(perm))
    d0, d1 = data.draw(st.integers(-nd, nd - 1)), data.draw(st.integers(-nd, nd - 1))
    same(t.transpose(d0, d1), np.swapaxes(a, d0, d1))
    u = data.draw(st.integers(-nd - 1, nd))
    same(t.unsqueeze(u), np.expand_dims(a, u))
    same(t.unsqueeze(u).squeeze(), np.squeeze(np.expand_dims(a, u)))
    sq = data.draw(st.integers(-nd, nd - 1))
    exp_sq = np.squeeze(a, sq) if a.shape[sq] == 1 else a  # torch: no-op if size != 1
    same(t.squeeze(sq), exp_sq)
    # expand/broadcast_to: a leading dim and size-1 dims
    b = a[(slice(None),) * (nd - 1) + (slice(0, 1),)]
    tgt = (3,) + b.shape[:-1] + (4,)
    same(cl.from_numpy(b).expand(*tgt), np.broadcast_to(b, tgt))
    same(cl.from_numpy(b).broadcast_to(tgt), np.broadcast_to(b, tgt))
    # chunk / split along a random dim
    dim = data.draw(st.integers(-nd, nd - 1))
    n = data.draw(st.integers(1, 4))
    ch = t.chunk(n, dim)
    th = torch.from_numpy(a).chunk(n, dim)
    assert len(ch) == len(th)
    for c, r in zip(ch, th):
        same(c, r.numpy())
    for c, r in zip(t.split(2, dim), torch.from_numpy(a).split(2, dim)):
        same(c, r.numpy())
    # contiguous / clone of a permuted view
    pv = t.permute(*perm)
    c = pv.contiguous()
    assert c.is_contiguous()
    same(c, np.ascontiguousarray(a.transpose(perm)))
    cl_ = t.clone()
    assert cl_.data_ptr() != t.data_ptr()
    same(cl_, a)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape_and_perm(), st.data())
def test_hyp_reshape_view_like_torch(sp, data):
    shape, perm = sp
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    base_t, base_th = cl.from_numpy(a), torch.from_numpy(a)
    sl = tuple(slice(0, None, data.draw(st.integers(1, 2))) for _ in shape)
    t = base_t.permute(*perm)[sl]
    th = base_th.permute(*perm)[sl]
    n = th.numel()
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    d = data.draw(st.sampled_from(divisors))
    new = (d, -1) if data.draw(st.booleans()) else (n // d, d)
    try:
        tv = th.view(*new)
        torch_ok = True
    except RuntimeError:
        torch_ok = False
    if torch_ok:
        v = t.view(*new)
        same(v, tv.numpy())
        assert v.numel() == 0 or shares_memory(v, a)
    else:
        with pytest.raises(ValueError, match="reshape"):
            t.view(*new)
    r = t.reshape(*new)
    same(r, th.reshape(*new).numpy())
    # reshape copies exactly when view is impossible (as PyTorch)
    if r.numel() > 1:
        assert shares_memory(r, a) == torch_ok


def test_tolist_item():
    a = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    t = cl.from_numpy(a)
    assert t.tolist() == a.tolist()
    assert t[1, 2].item() == 1.25 and isinstance(t[1, 2].item(), float)
    assert cl.tensor([1, 2], dtype=cl.int64).tolist() == [1, 2]
    assert cl.tensor([True, False]).tolist() == [True, False]
    assert cl.tensor(2.5, dtype=cl.bfloat16).item() == 2.5
    assert cl.tensor(3.0).shape == ()  # 0-d, as torch.tensor(3.0)
    assert cl.tensor([1.0, 2.0], dtype=cl.float8_e4m3fn).tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="one element"):
        t.item()


@pytest.mark.parametrize("data", [[1.0, 2.0], [[1.5, 2.25], [3.0, -4.0]], [0.1, -2.5], [7.0],
                                  [[0.0]], []])
@pytest.mark.parametrize("dt", [cl.float32, cl.bfloat16, cl.float16, cl.float64])
def test_repr_like_torch(data, dt):
    t = cl.tensor(data, dtype=dt)
    th = torch.tensor(data, dtype=getattr(torch, dt.name))
    assert repr(t) == repr(th).replace("torch.", "castlab."), (repr(t), repr(th))
    assert str(t) == repr(t)


def test_repr_other_dtypes():
    assert repr(cl.tensor([1, 2])) == "tensor([1, 2])"
    assert repr(cl.tensor([1, 2], dtype=cl.int32)) == "tensor([1, 2], dtype=castlab.int32)"
    assert repr(cl.bfloat16) == "castlab.bfloat16"
    r = repr(cl.zeros(2, 3, dtype=cl.float8_e5m2))
    assert r.startswith("tensor([[0., 0., 0.],") and r.endswith("dtype=castlab.float8_e5m2)")


# ----------------------------------------------------------------------------- creation

@pytest.mark.parametrize("dt", [cl.float64, cl.float32, cl.float16, cl.bfloat16,
                                cl.float8_e4m3fn, cl.float8_e5m2, cl.int32, cl.int64, cl.bool])
def test_creation_functions(dt):
    z = cl.zeros(2, 3, dtype=dt)
    assert z.shape == (2, 3) and z.dtype is dt
    same(z, np.zeros((2, 3), NPD[dt]))
    same(cl.ones(4, dtype=dt), np.ones(4, NPD[dt]))
    same(cl.full((2,), 1, dtype=dt), np.full(2, 1, NPD[dt]))
    assert cl.empty(3, 0, dtype=dt).shape == (3, 0)
    if dt.is_floating_point:
        # one rounding from the double 0.1 (conversions: tests/test_conversions.py)
        same(cl.full((3,), 0.1, dtype=dt), cl.from_numpy(np.full(3, 0.1)).astype(dt).numpy())
    same(cl.zeros_like(z), np.zeros((2, 3), NPD[dt]))


def test_full_rounds_once_from_double():
    v = 1 + 2**-8 + 2**-30  # double rounding through fp32 would give 1.0
    assert cl.full((1,), v, dtype=cl.bfloat16).tolist() == [1.0078125]
    assert cl.tensor([v], dtype=cl.bfloat16).tolist() == [1.0078125]


def test_arange_like_torch():
    for args, kw in [((5,), {}), ((2, 9, 3), {}), ((0.0, 1.0, 0.125), {}), ((1, 4), {"dtype": cl.bfloat16}),
                     ((-3.5, 2.0, 0.5), {"dtype": cl.float64})]:
        t = cl.arange(*args, **kw)
        tk = {"dtype": getattr(torch, kw["dtype"].name)} if kw else {}
        th = torch.arange(*args, **tk)
        assert t.dtype.name == str(th.dtype).removeprefix("torch.")
        assert t.tolist() == th.tolist()
    with pytest.raises(ValueError):
        cl.arange(0, 5, 0)


@pytest.mark.parametrize("dt", [cl.float32, cl.bfloat16, cl.float16, cl.float64])
def test_rand_randn_deterministic_and_thread_independent(dt):
    nt = cl._C.get_num_threads() if hasattr(cl._C, "get_num_threads") else 2
    try:
        cl._C.set_num_threads(1)
        a1, n1 = cl.rand(300_001, seed=7, dtype=dt), cl.randn(300_001, seed=7, dtype=dt)
        cl._C.set_num_threads(2)
        a2, n2 = cl.rand(300_001, seed=7, dtype=dt), cl.randn(300_001, seed=7, dtype=dt)
    finally:
        cl._C.set_num_threads(nt)
    same(a1, a2.numpy())
    same(n1, n2.numpy())
    same(cl.rand(1000, seed=7, dtype=dt), cl.rand(1000, seed=7, dtype=dt).numpy())
    assert not np.array_equal(cl.rand(1000, seed=8, dtype=dt).numpy(), a1.numpy()[:1000])
    u = a1.numpy().astype(np.float64)
    assert u.min() >= 0 and u.max() < 1
    n = len(u)
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n) + 2**-9
    assert abs(u.std() - np.sqrt(1 / 12)) < 0.005
    g = n1.numpy().astype(np.float64)
    assert abs(g.mean()) < 5 / np.sqrt(n) + 2**-8
    assert abs(g.std() - 1) < 0.01
    # a prefix of a bigger draw is the same stream (counter-based)
    same(cl.rand(10, seed=7, dtype=dt), a1.numpy()[:10])


def test_randn_shape_and_seed_validation():
    assert cl.randn(2, 3, seed=0).shape == (2, 3)
    with pytest.raises(ValueError):
        cl.rand(3, seed=-1)
    with pytest.raises(TypeError):
        cl.rand(3, dtype=cl.int32)


# ----------------------------------------------------------------------------- NumPy interop

@pytest.mark.parametrize("dt", ALL, ids=lambda d: d.name)
def test_numpy_zero_copy_every_dtype(dt):
    a = (np.arange(24).reshape(4, 6) % 5).astype(np.float64)
    a = a.astype(NPD[dt]) if dt is not cl.bool else (a > 2)
    t = cl.from_numpy(a)
    assert t.dtype is dt and t.data_ptr() == a.ctypes.data
    b = t.numpy()
    assert b.dtype == a.dtype and b.ctypes.data == a.ctypes.data
    assert np.asarray(t).ctypes.data == a.ctypes.data
    # mutation both ways
    one = np.array(1, NPD[dt]) if dt is not cl.bool else np.True_
    a[0, 0] = one
    assert t[0, 0].item() == one.item()
    b[1, 1] = one
    assert a[1, 1] == one
    t[2, 2] = 1
    assert a[2, 2] == one
    # strided / offset views keep sharing
    v = t[1:, ::2]
    av = a[1:, ::2]
    assert v.data_ptr() == av.ctypes.data
    same(v, av)
    w = v.numpy()
    assert w.ctypes.data == av.ctypes.data and w.strides == av.strides
    # numpy strided view -> castlab
    tv = cl.from_numpy(a[::2, 1::3])
    assert tv.data_ptr() == a[::2, 1::3].ctypes.data
    same(tv, a[::2, 1::3])
    assert cl.from_numpy(a.T).stride() == tuple(s // a.itemsize for s in a.T.strides)


def test_numpy_lifetime():
    a = np.arange(10, dtype=np.float32)
    t = cl.from_numpy(a)
    del a
    assert t.tolist() == list(map(float, range(10)))
    t2 = cl.arange(5, dtype=cl.float32)
    n = t2.numpy()
    del t2
    assert n.tolist() == [0, 1, 2, 3, 4]


def test_readonly_numpy():
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    t = cl.from_numpy(a)
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 5.0
    assert not t.numpy().flags.writeable
    with pytest.raises(ValueError):
        t.numpy()[0] = 1.0
    assert a[0] == 0
    # a writable copy is fine
    c = t.clone()
    c[0] = 5.0
    assert c.tolist()[0] == 5.0 and a[0] == 0


def test_torch_dlpack_roundtrip_bf16_views():
    th = torch.arange(32, dtype=torch.float32).reshape(4, 8).to(torch.bfloat16)[1:, ::2]
    t = cl.from_dlpack(th)
    assert t.data_ptr() == th.data_ptr() and t.shape == tuple(th.shape)
    back = torch.from_dlpack(t)
    assert back.data_ptr() == th.data_ptr()
    th[0, 0] = 99
    assert t[0, 0].item() == 99


# ----------------------------------------------------------------------------- bad input

def test_bad_input_clear_errors():
    t = cl.arange(24, dtype=cl.float32).reshape(2, 3, 4)
    cases = [
        (TypeError, "unsupported dtype", lambda: cl.zeros(2, dtype=np.complex64)),
        (TypeError, "unsupported dtype", lambda: cl.zeros(2, dtype=np.int8)),
        (TypeError, "unsupported dtype", lambda: cl.from_numpy(np.zeros(2, np.int8))),
        (TypeError, "unsupported dtype", lambda: cl.from_numpy(np.zeros(2, np.complex128))),
        (TypeError, "unsupported dtype", lambda: cl.as_dtype("float8_e4m3fnuz")),
        (TypeError, None, lambda: cl.tensor(["a", "b"])),
        (IndexError, "out of", lambda: t[2]),
        (IndexError, "out of", lambda: t[-3]),
        (IndexError, "out of", lambda: t[0, 3]),
        (IndexError, "too many", lambda: t[0, 0, 0, 0]),
        (IndexError, "single ellipsis", lambda: t[..., ...]),
        (ValueError, "step", lambda: t[::-1]),
        (ValueError, "step", lambda: t[::0]),
        (TypeError, None, lambda: t[[0, 1]]),
        (TypeError, None, lambda: t["a"]),
        (ValueError, "invalid", lambda: t.reshape(5)),
        (ValueError, "-1", lambda: t.reshape(-1, -1)),
        (ValueError, None, lambda: t.view(7, -1)),
        (ValueError, "match", lambda: t.expand(3, 3, 4)),
        (ValueError, None, lambda: t.expand(3, 4)),
        (ValueError, None, lambda: t.broadcast_to((2, 4, 4))),
        (ValueError, None, lambda: t.permute(0, 1)),
        (ValueError, None, lambda: t.permute(0, 1, 1)),
        (IndexError, "out of range", lambda: t.squeeze(7)),
        (IndexError, "out of range", lambda: t.unsqueeze(5)),
        (IndexError, "out of range", lambda: t.transpose(0, 3)),
        (IndexError, "out of range", lambda: t.chunk(2, 3)),
        (ValueError, None, lambda: t.chunk(0)),
        (ValueError, None, lambda: t.split([1, 1], 1)),
        (ValueError, "negative", lambda: cl.zeros(-1)),
        (TypeError, None, lambda: cl.zeros(2.5)),
        (ValueError, None, lambda: cl.zeros(2, device="tpu")),
    ]
    for exc, msg, fn in cases:
        with pytest.raises(exc) as ei:
            fn()
        if msg:
            assert msg in str(ei.value), (msg, str(ei.value))
        assert len(str(ei.value)) > 10 or exc is TypeError


def test_write_to_readonly_dlpack_tensor_raises():
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    t = cl.asarray(a)
    with pytest.raises(ValueError, match="read-only"):
        t[1:] = 0.0
    assert a.tolist() == [0, 1, 2, 3]


def test_full_integers_exact():
    assert cl.full((1,), 2**24 + 1, dtype=cl.int32).tolist() == [2**24 + 1]
    assert cl.full((1,), 2**31 - 1, dtype=cl.int32).tolist() == [2**31 - 1]
    assert cl.full((1,), 2**40 + 1, dtype=cl.int64).tolist() == [2**40 + 1]


# ---------------------------------------------------------------- where the methods live

_STUB = pathlib.Path(cl.__file__).parent / "_C.pyi"
# The class bodies whose methods each tensor class has (castlab._tensor copies the
# mixins' attributes onto both classes at import).
_BODIES = {"Tensor": (_tensor.TensorMethods, _tensor.ConcreteTensorMethods),
           "Proxy": (_tensor.TensorMethods, Proxy)}


def _python_function(v):
    """The Python function behind a class attribute (a property's getter), else None."""
    if isinstance(v, property):
        v = v.fget
    return v if isinstance(v, types.FunctionType) else None


@pytest.mark.parametrize("cls", [cl.Tensor, Proxy], ids=["Tensor", "Proxy"])
def test_every_python_method_has_one_home(cls):
    """Each method, property and operator written in Python is the very function of one
    class body (what "go to definition", help() and type checkers find), defined in no
    other body the class takes methods from: nothing is assembled at import."""
    bodies = {b.__name__: b for b in _BODIES[cls.__name__]}
    n = 0
    for name in dir(cls):
        f = _python_function(inspect.getattr_static(cls, name))
        if f is None:
            continue  # C++ bindings, object's slots, plain values
        n += 1
        home = f.__qualname__.rsplit(".", 1)[0]
        assert home in bodies, f"{cls.__name__}.{name} is {f.__qualname__}: not a method body"
        assert _python_function(vars(bodies[home]).get(name)) is f, (name, f.__qualname__)
        written = [b for b, body in bodies.items()  # (Proxy's dict also holds the copies)
                   if getattr(_python_function(vars(body).get(name)), "__qualname__",
                              "").startswith(b + ".")]
        assert written == [home], name
        assert inspect.getsourcefile(f) == inspect.getsourcefile(bodies[home])
        if not name.startswith("_"):
            assert f.__doc__, f"{home}.{name} has no docstring"
    assert n >= (80 if cls is cl.Tensor else 60)


def test_methods_take_their_functions_arguments():
    """A method form (``x.sum(...)``) takes exactly the arguments of its function
    (``cl.sum(x, ...)``), and every elementwise op of one or two operands that is a method
    of torch.Tensor has one (castlab's other op methods are checked too)."""
    fns = {n: f for n, f in ops.ELEMENTWISE_FUNCTIONS.items() if OPS[n].arity <= 2 and (
        hasattr(torch.Tensor, n) or vars(_tensor.TensorMethods).get(n) is not None)}
    fns.update({n: getattr(ops, n) for n in (
        "astype", "reshape", "view", "permute", "transpose", "unsqueeze", "squeeze", "expand",
        "broadcast_to", "chunk", "split", "contiguous", "clone", "select")})
    fns.update({n: getattr(cl, n) for n in (
        "sum", "mean", "amax", "amin", "var", "softmax", "log_softmax", "gather",
        "take_along_dim")})

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    for name, fn in fns.items():
        method = vars(_tensor.TensorMethods).get(name)
        assert method is not None, f"TensorMethods has no method {name} (castlab.{name})"
        assert params(method)[1:] == params(fn)[1:], name


def test_stub_declares_every_member():
    """_C.pyi declares Tensor as the mixin's subclass with each member bound in C++, so
    that static tools see every public attribute of castlab.Tensor."""
    tree = ast.parse(_STUB.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor"]
    assert [ast.unparse(b) for b in node.bases] == ["ConcreteTensorMethods"]
    declared = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    from_python = set(dir(_tensor.ConcreteTensorMethods))
    # pybind11's own: no constructor (tensors come from castlab's functions), the
    # attribute dict of py::dynamic_attr, and its cross-module conduit
    machinery = {"__init__", "__dict__", "__module__", "__doc__", "_pybind11_conduit_v1_"}
    from_cpp = set(vars(cl.Tensor)) - from_python - machinery
    assert declared == from_cpp
    public = {n for n in dir(cl.Tensor) if not n.startswith("_")}
    assert public <= declared | from_python, public - declared - from_python
