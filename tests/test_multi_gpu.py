"""castlab on two GPUs: everything that runs on cuda:0 runs on cuda:1 too, with the same
bits, including the cached paths (eager plans, jit plans, kernel memos), copies between
devices and DLPack in both directions.

Marked ``cuda``; skipped unless castlab sees at least two GPUs.
"""

from __future__ import annotations

import numpy as np
import pytest

import castlab as cl
import castlab.cuda as clcuda

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(clcuda.device_count() < 2,
                                 reason="needs at least two CUDA GPUs for castlab")]

D0, D1 = "cuda:0", "cuda:1"


def _bits(t) -> np.ndarray:
    a = t.cpu().numpy()
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _same_bits(a, b) -> None:
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
    np.testing.assert_array_equal(_bits(a), _bits(b))


# ---------------------------------------------------------------- creation

CREATORS = {
    "empty": lambda dev: cl.empty(3, 4, device=dev),
    "zeros": lambda dev: cl.zeros(3, 4, dtype=cl.bfloat16, device=dev),
    "ones": lambda dev: cl.ones(3, 4, dtype=cl.float16, device=dev),
    "full": lambda dev: cl.full((3, 4), 0.1, dtype=cl.bfloat16, device=dev),
    "arange": lambda dev: cl.arange(12, device=dev),
    "arange_float": lambda dev: cl.arange(0.0, 1.0, 0.125, device=dev),
    "rand": lambda dev: cl.rand(3, 4, seed=3, dtype=cl.bfloat16, device=dev),
    "randn": lambda dev: cl.randn(3, 4, seed=3, device=dev),
    "tensor": lambda dev: cl.tensor([[1.0, 2.5], [3.0, -4.0]], dtype=cl.bfloat16, device=dev),
    "tensor_from_tensor": lambda dev: cl.tensor(cl.ones(2, 2), device=dev),
    "asarray": lambda dev: cl.asarray(np.arange(6, dtype=np.float32), device=dev),
    "empty_like": lambda dev: cl.empty_like(cl.ones(2, 3, device=dev)),
    "zeros_like": lambda dev: cl.zeros_like(cl.ones(2, 3, device=dev)),
    "ones_like": lambda dev: cl.ones_like(cl.zeros(2, 3, device=dev)),
    "full_like": lambda dev: cl.full_like(cl.zeros(2, 3, device=dev), 7.0),
}


@pytest.mark.parametrize("name", list(CREATORS))
def test_creation_on_cuda1(name):
    t = CREATORS[name](D1)
    assert t.device == cl.device(D1) and t.device.index == 1 and t._device_str == D1
    if name != "empty" and name != "empty_like":
        _same_bits(t, CREATORS[name](D0))


@pytest.mark.parametrize("spec", [D1, ("cuda", 1), cl.device("cuda", 1), cl.device("cuda:1")])
def test_device_forms(spec):
    assert cl.zeros(2, device=spec).device == cl.device("cuda:1")


def test_torch_device_accepted():
    torch = pytest.importorskip("torch")
    assert cl.zeros(2, device=torch.device("cuda", 1)).device == cl.device("cuda:1")


# ---------------------------------------------------------------- eager ops (cached path)

def test_eager_unary_and_binary_twice_on_cuda1():
    for _ in range(2):  # the second call runs the cached plan
        x = cl.randn(64, 33, seed=1, dtype=cl.bfloat16, device=D1)
        y = cl.randn(64, 33, seed=2, dtype=cl.bfloat16, device=D1)
        u = cl.exp(x)
        b = x * y
        s = cl.silu(x[:, 1:]) * y[:, :-1]       # strided views
        assert u.device == D1 and b.device == D1 and s.device == D1
        x0, y0 = x.to(D0), y.to(D0)
        _same_bits(u, cl.exp(x0))
        _same_bits(b, x0 * y0)
        _same_bits(s, cl.silu(x0[:, 1:]) * y0[:, :-1])


def test_eager_alternating_devices():
    x0 = cl.randn(1000, seed=5, device=D0)
    x1 = x0.to(D1)
    for _ in range(3):
        _same_bits(cl.sigmoid(x1), cl.sigmoid(x0))
        _same_bits(x1 + 1.5, x0 + 1.5)


# ---------------------------------------------------------------- jit (cached path)

@cl.jit
def _swiglu(a, b):
    return cl.silu(a) * b


@cl.jit
def _with_temp(x):
    # a concatenation of computed values: the lowering materializes temporaries
    y = cl.cat([cl.exp(x), cl.sin(x)], dim=-1)
    return y.reshape(-1) * 2


def test_jit_twice_on_cuda1_and_once_on_cuda0():
    a = cl.randn(128, 64, seed=1, dtype=cl.bfloat16, device=D1)
    b = cl.randn(128, 64, seed=2, dtype=cl.bfloat16, device=D1)
    r1 = _swiglu(a, b)
    r2 = _swiglu(a, b)                       # cached plan on cuda:1
    r0 = _swiglu(a.to(D0), b.to(D0))         # same shapes on cuda:0
    assert r1.device == D1 and r2.device == D1 and r0.device == D0
    _same_bits(r1, r2)
    _same_bits(r1, r0)
    for pol in ("eager", "fp64"):
        _same_bits(_swiglu.run(a, b, policy=pol), _swiglu.run(a.to(D0), b.to(D0), policy=pol))


def test_jit_with_temporaries_on_cuda1():
    x = cl.randn(16, 8, seed=4, device=D1)
    r1 = _with_temp(x)
    r2 = _with_temp(x)
    assert r1.device == D1 and r2.device == D1
    _same_bits(r1, _with_temp(x.to(D0)))
    _same_bits(r1, r2)


# ---------------------------------------------------------------- copies

def test_to_between_devices():
    c = cl.randn(5, 7, seed=9, dtype=cl.bfloat16)
    g1 = c.to("cuda:1")
    assert g1.device == D1
    _same_bits(g1, c)
    g0 = c.to("cuda:0")
    g01 = g0.to("cuda:1")
    assert g01.device == D1
    _same_bits(g01, c)
    back = g01.to("cuda:0")
    assert back.device == D0
    _same_bits(back, c)
    assert g1.cpu().device == "cpu"
    _same_bits(g1.cpu(), c)
    assert c.cuda(1).device == D1
    assert c.cuda().device == D0
    nc = g0.t()                                # non-contiguous source
    _same_bits(nc.to(D1), c.t())
    assert g1.to(D1) is g1


# ---------------------------------------------------------------- DLPack

def test_from_dlpack_torch_cuda1_with_current_device_0():
    torch = pytest.importorskip("torch")
    torch.cuda.set_device(0)
    t = torch.randn(64, 32, device="cuda:1").to(torch.bfloat16)
    x = cl.from_dlpack(t)
    assert torch.cuda.current_device() == 0          # left as it was
    assert x.device == D1 and x.data_ptr() == t.data_ptr()
    y = cl.exp(x)
    ref = cl.exp(cl.from_dlpack(t.to("cuda:0")))
    _same_bits(y, ref)
    assert cl.asarray(t).device == D1
    assert cl.tensor(t, device=D1).device == D1


def test_torch_from_dlpack_of_castlab_cuda1():
    torch = pytest.importorskip("torch")
    torch.cuda.set_device(0)
    x = cl.randn(32, 16, seed=3, dtype=cl.bfloat16, device=D1)
    y = cl.silu(x)                                  # pending work on castlab's stream
    t = torch.from_dlpack(y)
    assert t.device == torch.device("cuda", 1)
    assert t.data_ptr() == y.data_ptr()             # zero-copy
    back = cl.from_dlpack(t)
    assert back.data_ptr() == y.data_ptr() and back.device == D1
    _same_bits(back, y)
    assert y.__dlpack_device__() == (2, 1)


# ---------------------------------------------------------------- mixing devices

def test_mixing_devices_raises():
    a = cl.ones(4, device=D0)
    b = cl.ones(4, device=D1)
    with pytest.raises(ValueError, match="same device"):
        a + b
    with pytest.raises(ValueError, match="same device"):
        cl.cat([a, b])
    with pytest.raises(ValueError):
        _swiglu(a, b)
    # assignment copies across devices, as PyTorch's copy_ (the values arrive)
    c = cl.zeros(4)
    c[:] = b * 3.0
    assert c.tolist() == [3.0] * 4


def test_memory_and_sync_per_device():
    cl.ones(1 << 20, device=D1)
    clcuda.synchronize(1)
    clcuda.synchronize("cuda:1")
    assert clcuda.memory_stats(1)["num_allocs"] >= 1
    assert clcuda.current_stream_ptr(1) != clcuda.current_stream_ptr(0)
