"""Eager composites (softmax, log_softmax, the reductions, the norms, the losses, gather):
the plan of a call is cached by the body's code and the values it closes over, the
inputs' signature (dtypes, shapes, strides, devices, alignment), the math and what of
PyTorch is loaded. A cached plan must give the bits a fresh trace gives, for every
parameter a user changes, and keep no input alive."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest

import castlab as cl
from castlab import _composite as _reduce

torch = pytest.importorskip("torch")


def _bits(t) -> np.ndarray:
    a = torch.from_dlpack(t) if not isinstance(t, torch.Tensor) else t
    a = a.detach().cpu()
    if a.dtype == torch.bfloat16:
        return a.view(torch.int16).numpy()
    return np.atleast_1d(a.numpy()).view(np.uint8)


def _x(shape, dt=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dt)


T = torch.tensor([1, 2, -100, 4, 0, 63])
W = torch.rand(64, generator=torch.Generator().manual_seed(3)) + 0.5

CASES = {
    "softmax -1": (lambda x: cl.softmax(x, -1), lambda x: torch.softmax(x, -1)),
    "softmax 0": (lambda x: cl.softmax(x, 0), lambda x: torch.softmax(x, 0)),
    "log_softmax -1": (lambda x: cl.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1)),
    "log_softmax fp32 out": (lambda x: cl.log_softmax(x, -1, dtype=cl.float32),
                             lambda x: torch.log_softmax(x, -1, dtype=torch.float32)),
    "sum -1": (lambda x: cl.sum(x, -1), lambda x: torch.sum(x, -1)),
    "sum 0 keepdim": (lambda x: cl.sum(x, 0, keepdim=True), lambda x: torch.sum(x, 0, True)),
    "mean": (lambda x: cl.mean(x, -1), lambda x: torch.mean(x, -1)),
    "amax": (lambda x: cl.amax(x, -1), lambda x: torch.amax(x, -1)),
    "var": (lambda x: cl.var(x, -1), lambda x: torch.var(x, -1)),
    "var correction 0": (lambda x: cl.var(x, -1, correction=0),
                         lambda x: torch.var(x, -1, correction=0)),
    "layer_norm": (lambda x: cl.layer_norm(x, (64,)),
                   lambda x: torch.nn.functional.layer_norm(x, (64,))),
    "layer_norm eps": (lambda x: cl.layer_norm(x, (64,), eps=0.5),
                       lambda x: torch.nn.functional.layer_norm(x, (64,), eps=0.5)),
    "cross_entropy": (lambda x: cl.cross_entropy(x, cl.from_dlpack(T)),
                      lambda x: torch.nn.functional.cross_entropy(x, T)),
    "cross_entropy sum": (lambda x: cl.cross_entropy(x, cl.from_dlpack(T), reduction="sum"),
                          lambda x: torch.nn.functional.cross_entropy(x, T, reduction="sum")),
    "cross_entropy none": (
        lambda x: cl.cross_entropy(x, cl.from_dlpack(T), reduction="none"),
        lambda x: torch.nn.functional.cross_entropy(x, T, reduction="none")),
    "cross_entropy ignore 2": (
        lambda x: cl.cross_entropy(x, cl.from_dlpack(T.clamp(0)), ignore_index=2),
        lambda x: torch.nn.functional.cross_entropy(x, T.clamp(0), ignore_index=2)),
    "cross_entropy smoothing 0.1": (
        lambda x: cl.cross_entropy(x, cl.from_dlpack(T), label_smoothing=0.1),
        lambda x: torch.nn.functional.cross_entropy(x, T, label_smoothing=0.1)),
    "cross_entropy smoothing 0.2": (
        lambda x: cl.cross_entropy(x, cl.from_dlpack(T), label_smoothing=0.2),
        lambda x: torch.nn.functional.cross_entropy(x, T, label_smoothing=0.2)),
    "cross_entropy weight": (
        lambda x: cl.cross_entropy(x, cl.from_dlpack(T), cl.from_dlpack(
            W.to(torch.bfloat16 if x.dtype == cl.bfloat16 else torch.float32))),
        lambda x: torch.nn.functional.cross_entropy(x, T, W.to(x.dtype))),
    "nll_loss": (lambda x: cl.nll_loss(x, cl.from_dlpack(T)),
                 lambda x: torch.nn.functional.nll_loss(x, T)),
    "gather": (lambda x: cl.gather(x, 1, cl.from_dlpack(T.clamp(0)[:, None])),
               lambda x: torch.gather(x, 1, T.clamp(0)[:, None])),
}


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
def test_every_call_of_a_cached_composite_equals_torch(dt):
    """Each case, called in turn three times over: the first call traces and caches, the
    later ones run the cached plan. Every call equals torch eager, bit for bit, although
    the cases share their bodies' code and differ only in what the bodies close over."""
    _reduce._composite_cache.clear()
    x = _x((6, 64), dt)
    X = cl.from_dlpack(x)
    for _ in range(3):
        for name, (f, ref) in CASES.items():
            got, want = _bits(f(X)), _bits(ref(x))
            assert got.shape == want.shape and np.array_equal(got, want), name
    assert len(_reduce._composite_cache) >= len(CASES) - 1


def test_a_cached_call_runs_no_trace(monkeypatch):
    """A second call with the same parameters and input signature neither traces nor
    lowers; a changed parameter does."""
    x = cl.from_dlpack(_x((6, 64)))
    cl.log_softmax(x, -1)
    cl.cross_entropy(x, cl.from_dlpack(T), label_smoothing=0.1)
    lowered = []
    real = _reduce.lower
    monkeypatch.setattr(_reduce, "lower", lambda *a, **k: lowered.append(1) or real(*a, **k))
    cl.log_softmax(x, -1)
    cl.cross_entropy(x, cl.from_dlpack(T), label_smoothing=0.1)
    assert lowered == []
    cl.log_softmax(x, 0)
    assert lowered == [1]
    cl.cross_entropy(x, cl.from_dlpack(T), label_smoothing=0.30000000000000004)
    assert lowered == [1, 1]


def test_views_and_alignment_take_their_own_plans():
    """A view of another layout or start (an offset row: another 16-byte alignment, which
    PyTorch's CUDA kernels choose their order by) is another signature: equal to torch."""
    x = _x((6, 72))
    for v in (x[:, :64], x[:, 1:65], x[:, 8:72], x.t()[:64, :6].t()):
        got = cl.log_softmax(cl.from_dlpack(v), -1)
        assert np.array_equal(_bits(got), _bits(torch.log_softmax(v, -1)))


def test_closed_over_values_are_keyed_exactly():
    """-0.0 and 0.0, 1 and True and 1.0, NaN and NaN, dtypes, nested containers and
    functions; an object or tensor makes the call uncached rather than guessed."""
    k = _reduce._closed_key
    assert k(0.0, 0) != k(-0.0, 0)
    assert len({k(1, 0), k(True, 0), k(1.0, 0)}) == 3
    assert k(math.nan, 0) == k(math.nan, 0)
    assert k((1, "a", cl.bfloat16), 0) != k((1, "a", cl.float16), 0)
    assert k({"a": 1}, 0) != k({"a": 2}, 0)
    assert k(object(), 0) is _reduce._UNCACHED
    assert k([1, cl.ones(2)], 0) is _reduce._UNCACHED

    def outer(v):
        return lambda p: p * v
    assert _reduce._body_key(outer(2)) == _reduce._body_key(outer(2))
    assert _reduce._body_key(outer(2)) != _reduce._body_key(outer(3))
    assert _reduce._body_key(outer(cl.ones(2))) is _reduce._UNCACHED


def test_a_cached_plan_keeps_no_input_alive():
    """The cache holds the plan, not the tensors of the call that made it: a torch tensor
    shared through DLPack goes when its last holder does."""
    import weakref

    x = _x((6, 64))
    ref = weakref.ref(x)
    X = cl.from_dlpack(x)
    del x
    cl.softmax(X, -1)
    cl.cross_entropy(X, cl.from_dlpack(T))
    del X
    gc.collect()
    assert ref() is None


def test_the_math_is_part_of_the_key():
    """The same call under another math runs that math's plan: portable's softmax and
    torch_cpu's differ somewhere on a wide row, and each equals its own fresh trace."""
    x = cl.from_dlpack(_x((8, 4096), torch.float32))
    with cl.use_math("portable"):
        a1 = _bits(cl.log_softmax(x, -1))
    b1 = _bits(cl.log_softmax(x, -1))
    with cl.use_math("portable"):
        a2 = _bits(cl.log_softmax(x, -1))
    b2 = _bits(cl.log_softmax(x, -1))
    assert np.array_equal(a1, a2) and np.array_equal(b1, b2)
    assert not np.array_equal(a1, b1)
    _reduce._composite_cache.clear()
    with cl.use_math("portable"):
        assert np.array_equal(_bits(cl.log_softmax(x, -1)), a1)
