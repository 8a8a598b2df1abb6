"""var and layer_norm under the torch orders: PyTorch's Welford kernels, bit for bit, on
the CPU against torch's own CPU kernels (ops/scalar/moments.h; docs/torch_reductions.md
§4.4). The GPU side (the torch_cuda orders against torch CUDA) is in
test_reduce_cuda.py; the CPU runs the torch_cuda orders too (test_reduce.py's row-fusion
test holds their fused and unfused runs equal).

Equal means equal bits, except that NaN equals NaN whatever its sign: which NaN operand
an x86 instruction propagates is not something castlab reproduces."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import warnings

import pytest

import castlab as cl

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def C(t):
    return cl.from_dlpack(t.contiguous() if t.stride() == () else t)


def T(x):
    return torch.from_dlpack(x)


def bad(got, want) -> int:
    """Elements whose bits differ (NaN vs NaN of either sign counts as equal)."""
    g = T(got) if not isinstance(got, torch.Tensor) else got
    assert g.dtype == want.dtype and g.shape == want.shape, (g.dtype, g.shape, want.shape)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[want.dtype.itemsize]
    diff = g.contiguous().view(ints) != want.contiguous().view(ints)
    both_nan = torch.isnan(g.double()) & torch.isnan(want.double())
    return int((diff & ~both_nan).sum())


def data(shape, dt, seed, specials=True):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 2.5 + 0.75).to(dt)
    if specials and x.dim() == 2 and x.shape[0] > 3:
        x[1, 0] = float("nan")
        x[2, x.shape[1] // 2] = float("inf")
        x[3, :] = -0.0
    return x


# ---------------------------------------------------------------- var

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [1, 5, 129, 896, 3584, 4097])
def test_var_rows_equal_torch_cpu(dt, n):
    x = data((40, n), dt, seed=n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # correction >= n: torch warns, both give inf/NaN
        for corr in (0, 1, 2, 0.5):
            assert bad(cl.var(C(x), -1, correction=corr), x.var(-1, correction=corr)) == 0, corr


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "permuted"])
def test_var_dims_and_layouts_equal_torch_cpu(dt, layout):
    base = data((6, 40, 130), dt, seed=3, specials=False)
    x = {"contiguous": base, "transposed": base.transpose(1, 2),
         "sliced": base[:, ::2, 1:129], "permuted": base.permute(2, 0, 1)}[layout]
    for dim in (-1, 0, 1, (0, 1), (1, 2), None):
        for keepdim in (False, True):
            if dim is None and keepdim:
                continue
            got = cl.var(C(x), dim, correction=1, keepdim=keepdim)
            want = x.var(dim, keepdim=keepdim) if dim is not None else x.var()
            assert bad(got, want) == 0, (dim, keepdim)


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_var_of_everything_equals_torch_cpu(dt):
    # one output: fp32/fp64 take std_var_all_cpu (two passes in double), 16-bit types the
    # Welford kernel; above 32768 elements torch splits the work over its threads, so
    # compare with one thread (the order castlab reproduces)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for n in (1000, 40000):
            x = data((n,), dt, seed=n)
            for corr in (0, 1):
                assert bad(cl.var(C(x), correction=corr), x.var(correction=corr)) == 0
            y = x.reshape(1, n)
            assert bad(cl.var(C(y), -1, keepdim=True), y.var(-1, keepdim=True)) == 0
    finally:
        torch.set_num_threads(threads)


def test_var_pairwise_keeps_two_passes():
    # castlab's own orders are unchanged: two passes, within an ulp or two of torch
    x = data((64, 896), torch.float32, seed=1, specials=False)
    with cl.use_math(cl.Math(reduction="pairwise")):
        got = T(cl.var(C(x), -1))
    torch.testing.assert_close(got, x.var(-1), rtol=1e-6, atol=0)


# ---------------------------------------------------------------- layer_norm

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [1, 5, 15, 17, 129, 896, 1000, 3584, 4096])
def test_layer_norm_equals_torch_cpu(dt, n):
    rows = 3000 if n == 896 and dt is torch.float32 else 24
    x = data((rows, n), dt, seed=n)
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(n, generator=g) * 0.5 + 1).to(dt)
    b = (torch.randn(n, generator=g) * 0.2).to(dt)
    for ww, bb in ((None, None), (w, None), (None, b), (w, b)):
        for eps in (1e-5, 1e-6):
            got = cl.layer_norm(C(x), n, None if ww is None else C(ww),
                                None if bb is None else C(bb), eps)
            want = F.layer_norm(x, (n,), ww, bb, eps)
            assert bad(got, want) == 0, (ww is not None, bb is not None, eps)


@pytest.mark.parametrize("dt", DTYPES)
def test_layer_norm_shapes_layouts_and_params_equal_torch_cpu(dt):
    base = data((6, 40, 130), dt, seed=11, specials=False)
    for x in (base, base.transpose(1, 2), base[:, ::2, 1:129]):
        for ns in (tuple(x.shape[-1:]), tuple(x.shape[-2:])):
            w = (torch.randn(ns) * 0.5 + 1).to(dt)
            b = (torch.randn(ns) * 0.2).to(dt)
            assert bad(cl.layer_norm(C(x), ns, C(w), C(b)), F.layer_norm(x, ns, w, b)) == 0
    if dt in (torch.bfloat16, torch.float16):  # fp32 weight and bias (the mixed kernel)
        n = base.shape[-1]
        w, b = torch.randn(n) * 0.5 + 1, torch.randn(n) * 0.2
        assert bad(cl.layer_norm(C(base), n, C(w), C(b)), F.layer_norm(base, (n,), w, b)) == 0


def test_layer_norm_traced_fused_and_eager_agree():
    x = data((16, 896), torch.bfloat16, seed=5)
    w = torch.randn(896).to(torch.bfloat16)
    want = F.layer_norm(x, (896,), w, None)
    f = cl.jit(lambda x, w: cl.layer_norm(x, 896, w))
    for policy in ("eager", "fused"):
        assert bad(f.run(C(x), C(w), policy=policy), want) == 0, policy


def test_cpu_isa_names_the_build():
    # the DEFAULT build has no fma: different bits, and Math says which it follows
    assert cl.Math(cpu_isa="avx2").torch_cpu_fma() and not cl.Math(cpu_isa="default").torch_cpu_fma()
    with pytest.raises(ValueError):
        cl.Math(cpu_isa="avx512f")
    x = data((64, 896), torch.float32, seed=2, specials=False)
    ys = []
    for isa in ("avx2", "default"):
        with cl.use_math(dataclasses.replace(cl.Math.preset("torch_eager"), cpu_isa=isa)):
            ys.append(T(cl.layer_norm(C(x), 896)))
    assert not torch.equal(ys[0], ys[1])


_DEFAULT_BUILD = r"""
import torch, castlab as cl
assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
F = torch.nn.functional
g = torch.Generator().manual_seed(0)
for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
    for n in (5, 100, 896):
        x = (torch.randn(64, n, generator=g) * 2 + 0.5).to(dt)
        w = (torch.randn(n, generator=g) + 1).to(dt)
        b = torch.randn(n, generator=g).to(dt)
        for ww, bb in ((None, None), (w, None), (None, b), (w, b)):
            y = torch.from_dlpack(cl.layer_norm(cl.from_dlpack(x), n,
                                  None if ww is None else cl.from_dlpack(ww),
                                  None if bb is None else cl.from_dlpack(bb)))
            assert torch.equal(y, F.layer_norm(x, (n,), ww, bb)), (dt, n)
print("ok")
"""


def test_layer_norm_equals_torch_default_build():
    # ATEN_CPU_CAPABILITY is read once per process: a fresh one; Math.cpu_isa="auto"
    # resolves to "default" from torch.backends.cpu.get_cpu_capability()
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    r = subprocess.run([sys.executable, "-c", _DEFAULT_BUILD], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
