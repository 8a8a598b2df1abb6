"""Issue 14 items 5, 6, 15: policies/math are what they say; jit guards on captured
values; the jit cache is bounded and keeps no argument tensors."""

import gc
import weakref

import numpy as np
import pytest

import castlab as cl


def _f(x):
    return cl.silu(x) * x


def _bits(t):
    return t.numpy().view(np.uint16)


# ------------------------------------------------------------------ item 5

@pytest.mark.parametrize("name", ["eager", "fused", "fp64"])
def test_named_policy_constructor_is_the_named_policy(name):
    p = cl.Policy(name)
    q = getattr(cl.Policy, name)()
    assert p == q and hash(p) == hash(q)
    x = cl.randn(64, 64, seed=0, dtype=cl.bfloat16)
    f = cl.jit(_f)
    a, b = f.run(x, policy=p), f.run(x, policy=name)
    assert np.array_equal(a.numpy().view(np.uint8), b.numpy().view(np.uint8))
    assert f"policy={name}" in str(f.trace(x, policy=p))


def test_named_policy_modifiers_kept():
    p = cl.Policy("eager", rounding="stochastic", seed=3)
    assert p == cl.Policy.eager(rounding="stochastic", seed=3) and p.round_after == "all"
    assert cl.Policy.fp64(seed=1).compute is cl.float64


@pytest.mark.parametrize("kw", [
    dict(name="eager", round_after="none"),
    dict(name="fused", round_after="all"),
    dict(name="fp64", compute="float32"),
    dict(name="fp64", round_casts=True),
    dict(name="eager", round_after=("silu",)),
])
def test_reserved_name_with_conflicting_fields_refused(kw):
    with pytest.raises(ValueError, match="reserved.*custom"):
        cl.Policy(**kw)


@pytest.mark.parametrize("ra", [True, 1.0, (1.5,), (False,), [None], object()])
def test_round_after_wrong_type(ra):
    with pytest.raises(TypeError, match="round_after"):
        cl.Policy("custom", round_after=ra)


@pytest.mark.parametrize("ra", [("slu",), "slu", (-1,), ("all",), ("silu", "none")])
def test_round_after_bad_value(ra):
    with pytest.raises(ValueError, match="round_after"):
        cl.Policy("custom", round_after=ra)


def test_round_after_normalised():
    assert cl.Policy("custom", round_after="silu").round_after == ("silu",)
    assert cl.Policy("custom", round_after=np.int64(2)).round_after == (2,)
    assert cl.Policy("custom", round_after=["mul", 1, "mul"]).round_after == ("mul", 1)
    assert cl.Policy("custom", round_after=()) == cl.Policy("custom")


def test_selectors_checked_against_graph():
    f = cl.jit(_f)
    x = cl.randn(4, 8, seed=0, dtype=cl.bfloat16)
    with pytest.raises(ValueError, match=r"unknown op 'exp' \(ops in this graph: silu, mul; "
                                         r"node indices 0-1\)"):
        f.run(x, policy=cl.Policy("custom", round_after=("exp",)))
    with pytest.raises(ValueError, match=r"node index 99 .*node indices 0-1"):
        f.trace(x, policy=cl.Policy("custom", round_after=(99,)))
    with pytest.raises(ValueError, match="node index 2"):
        f.node_values(x, policy=cl.Policy("custom", round_after=(2,)))
    f.run(x, policy=cl.Policy("custom", round_after=("silu", 1)))  # valid


@pytest.mark.parametrize("kw,exc", [
    (dict(rounding="up"), ValueError), (dict(rounding=0), TypeError),
    (dict(seed=-1), ValueError), (dict(seed=2**64), ValueError), (dict(seed=1.0), TypeError),
    (dict(seed=True), TypeError), (dict(saturate=1), TypeError),
    (dict(saturate="no"), TypeError), (dict(round_casts=0), TypeError),
    (dict(compute="float16"), ValueError), (dict(compute="nosuch"), ValueError),
    (dict(compute=3), TypeError), (dict(output="int32"), ValueError),
    (dict(name=3), TypeError), (dict(name=""), ValueError), (dict(name="Eager"), ValueError),
])
def test_policy_fields_checked(kw, exc):
    with pytest.raises(exc, match="Policy"):
        cl.Policy(**{"name": "custom", **kw})


def test_rounding_alias_normalised_once():
    p = cl.Policy("custom", rounding="nearest_even")
    assert p.rounding == "nearest" and p == cl.Policy("custom")
    f = cl.jit(_f)
    x = cl.randn(4, 8, seed=0, dtype=cl.bfloat16)
    assert "round to nearest even" in str(f.trace(x, policy=cl.Policy("custom", round_after="all",
                                                                      rounding="nearest_even")))
    assert cl.Policy("custom", seed=np.uint64(2**64 - 1)).seed == 2**64 - 1


@pytest.mark.parametrize("kw,exc", [
    (dict(fma="no"), TypeError), (dict(fma=1), TypeError), (dict(cuda_kernels="yes"), TypeError),
    (dict(impl="nosuch"), ValueError), (dict(impl=1), TypeError), (dict(silu="x"), ValueError),
    (dict(sigmoid=None), TypeError), (dict(division="fast"), ValueError), (dict(name=1), TypeError),
])
def test_math_fields_checked(kw, exc):
    with pytest.raises(exc, match="Math"):
        cl.Math(**kw)


def test_policy_math_hashable_cache_keys():
    d = {cl.Policy("custom", round_after=("silu", 0)): 1, cl.Math(fma=True): 2}
    assert d[cl.Policy("custom", round_after=["silu", 0])] == 1 and d[cl.Math(fma=True)] == 2


def test_describe_shows_output():
    assert "output=bf16" in cl.Policy("custom", output="bfloat16").describe()


# ------------------------------------------------------------------ item 6

def test_closure_scalar_guard():
    k = 2.0
    f = cl.jit(lambda x: x * k)
    x = cl.ones(3)
    assert f(x).tolist() == [2.0] * 3
    k = 3.0
    assert f(x).tolist() == [3.0] * 3
    assert f.run(x).tolist() == [3.0] * 3
    k = 2.0
    assert f(x).tolist() == [2.0] * 3
    assert len(f._cache) == 2
    k = -0.0
    assert np.signbit(f(x).numpy()).all()
    k = 2  # int vs float: another trace
    assert f(x).tolist() == [2.0] * 3


G_SCALE = 2.0


def _helper(x):
    return x * G_SCALE


def test_global_scalar_guard_and_nested_function():
    global G_SCALE
    f = cl.jit(lambda x: _helper(x) + 0.0)
    x = cl.ones(2)
    try:
        assert f(x).tolist() == [2.0, 2.0]
        G_SCALE = 5.0
        assert f(x).tolist() == [5.0, 5.0]
    finally:
        G_SCALE = 2.0


def test_closure_tensor_rebound_and_mutated():
    w = cl.ones(3) * 2.0
    f = cl.jit(lambda x: x * w)
    x = cl.ones(3)
    assert f(x).tolist() == [2.0] * 3
    w = cl.ones(3) * 4.0           # same signature: the new tensor is used
    assert f(x).tolist() == [4.0] * 3
    w = cl.ones(2) * 4.0           # another shape: retraced, and the trace sees it
    with pytest.raises(ValueError, match="broadcast"):
        f(x)
    w = cl.ones(1) * 7.0
    assert f(x).tolist() == [7.0] * 3


def test_constant_tensor_made_inside_function_still_correct():
    f = cl.jit(lambda x: x + cl.ones(3) * 2.0)
    x = cl.ones(3)
    assert f(x).tolist() == [3.0] * 3
    gc.collect()
    assert f(x).tolist() == [3.0] * 3


# ------------------------------------------------------------------ item 15

def test_cache_bounded_lru():
    f = cl.jit(lambda x: x + 1.0, cache_size=64)
    for n in range(1, 301):
        f(cl.ones(n))
    assert len(f._cache) == 64
    g = cl.jit(lambda x: x + 1.0)
    assert g.cache_size == cl.jit.__globals__["DEFAULT_CACHE_SIZE"] == 256
    # LRU: a recently used entry survives
    h = cl.jit(lambda x: x + 1.0, cache_size=2)
    a, b, c = cl.ones(1), cl.ones(2), cl.ones(3)
    h(a); h(b); h(a); h(c)
    sizes = {tr.inputs[0].shape for tr in h._cache.values()}
    assert sizes == {(1,), (3,)}


@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                     (True, TypeError), ("8", TypeError)])
def test_cache_size_checked(bad, exc):
    with pytest.raises(exc, match="cache_size"):
        cl.jit(lambda x: x, cache_size=bad)


def test_cache_keeps_no_numpy_input():
    f = cl.jit(lambda x: cl.silu(x) * 2.0)
    arr = np.ones(1 << 20)
    ref = weakref.ref(arr)
    f(arr)
    f.run(arr, policy="eager")
    f.trace(arr)
    f.node_values(arr)
    f.graph(arr)
    del arr
    gc.collect()
    assert ref() is None
    assert f(np.ones(1 << 20)).tolist()[:1] == [pytest.approx(2 * 0.7310585786300049)]


def test_cache_keeps_no_castlab_input():
    f = cl.jit(lambda x: x * 3.0)
    arr = np.ones(1000)
    ref = weakref.ref(arr)
    t = cl.from_numpy(arr)
    del arr
    f(t)
    f(t)
    del t
    gc.collect()
    assert ref() is None


def test_eager_cache_keeps_no_tensors():
    arr = np.ones(12345)
    ref = weakref.ref(arr)
    cl.exp(arr)
    cl.from_numpy(arr) * 2.0
    del arr
    gc.collect()
    assert ref() is None


def test_rebound_input_offsets_correct():
    # same signature, different storage offsets: the plan binds the call's tensors
    f = cl.jit(lambda x: x + 1.0)
    base = np.arange(20.0)
    a = cl.from_numpy(base)[0:5]
    b = cl.from_numpy(base)[10:15]
    assert f(a).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert f(b).tolist() == [11.0, 12.0, 13.0, 14.0, 15.0]


def test_one_policy_serves_chains_with_different_ops():
    # round_after names silu and mul: RoPE has no silu, and the policy still applies there
    # (the GPU test test_portable_chains_gpu_equals_cpu_every_policy uses it on both).
    pol = cl.Policy("custom", round_after=("silu", "mul"))
    x = cl.randn(4, 8, dtype=cl.bfloat16)
    rope_like = cl.jit(lambda x: x * 2.0 + x)
    assert rope_like.run(x, policy=pol).dtype == cl.bfloat16
