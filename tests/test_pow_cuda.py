"""pow on the GPU equals PyTorch's CUDA pow bit for bit (torch_eager math): tensor
exponents go to CUDA's powf/pow as pow_tensor_tensor does; Python-number exponents take
pow_tensor_scalar's shortcuts or, otherwise, the exponent in the tensor's dtype."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import castlab as cl
import castlab.cuda as clcuda

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")]
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("torch has no CUDA", allow_module_level=True)

TDT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
       "float64": torch.float64}
IDT = {"bfloat16": torch.int16, "float16": torch.int16, "float32": torch.int32,
       "float64": torch.int64}
SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, 1e-3, 1e3, float("inf"),
           float("-inf"), float("nan"), 1e-40, 7.0, -7.0]


def report(**kw):
    path = os.environ.get("CASTLAB_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(kw) + "\n")


def mismatches(got, want) -> int:
    g = torch.from_dlpack(got)
    idt = IDT[str(want.dtype).split(".")[1]]
    same = (g.view(idt) == want.view(idt)) | (g.isnan() & want.isnan())
    return int((~same).sum())


def _pairs(dt):
    g = torch.Generator(device="cuda").manual_seed(7)
    n = 1 << 20
    a = torch.exp(torch.randn(n, device="cuda", generator=g, dtype=torch.float64) * 2)
    a[::3] *= -1  # negative bases: NaN unless the exponent is an integer
    b = torch.randn(n, device="cuda", generator=g, dtype=torch.float64) * 4
    b[::5] = torch.round(b[::5])  # integer exponents
    s = torch.tensor(SPECIAL, dtype=torch.float64, device="cuda")
    sa, sb = torch.meshgrid(s, s, indexing="ij")
    a = torch.cat([a, sa.reshape(-1)]).to(TDT[dt])
    b = torch.cat([b, sb.reshape(-1)]).to(TDT[dt])
    return a, b


@pytest.mark.parametrize("dt", list(TDT))
def test_pow_tensor_exponent_equals_torch_cuda(dt):
    a, b = _pairs(dt)
    want = torch.pow(a, b)
    got = cl.pow(cl.from_dlpack(a), cl.from_dlpack(b))
    n = mismatches(got, want)
    f = cl.jit(lambda x, y: x ** y)
    n2 = mismatches(f.run(cl.from_dlpack(a), cl.from_dlpack(b), policy="eager"), want)
    report(test="pow_tensor_exponent", dtype=dt, mismatches=n, traced=n2, total=a.numel())
    # float64: CUDA's double pow is linked from a --fmad=true build, as PyTorch's nvcc build
    # has it (without it, 8 of 1,048,900 differed by an ulp)
    assert (n, n2) == (0, 0)
    # scalar base, tensor exponent (torch: a wrapped number: pow_tensor_tensor)
    want = torch.pow(2.5, b)
    n3 = mismatches(cl.pow(2.5, cl.from_dlpack(b)), want)
    assert n3 == 0, n3


@pytest.mark.parametrize("dt", list(TDT))
def test_pow_python_exponent_equals_torch_cuda(dt):
    a, _ = _pairs(dt)
    bad = {}
    for y in (2.7, 1.5, -3.3, 4.0, 0.25, -1.5, 10.0, 0.1, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0,
              1.0, 0.0):
        want = a ** y
        got = cl.from_dlpack(a) ** y
        n = mismatches(got, want)
        if n:
            bad[y] = n
    report(test="pow_python_exponent", dtype=dt, mismatches=bad, total=a.numel())
    assert not bad, bad


def test_pow_on_the_cpu_keeps_castlab_semantics():
    """The device bits are a GPU detail: the CPU lowering never sets them."""
    x = cl.tensor([2.0, -2.0, 0.5])
    f = cl.jit(lambda x: x ** 2.7)
    assert "CUDA powf" not in str(f.trace(x))
    assert np.isnan(float((x ** 2.7)[1]))
