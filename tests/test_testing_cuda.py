"""castlab.testing on the GPU (issue 54): every 2**32 bf16 pair of a user's kernel,
checked through DLPack on the device, against counts made by PyTorch on the same GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

import castlab as cl
import castlab.cuda as clcuda
from castlab.testing import KernelMismatch, assert_kernel_matches, bounds

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")]
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA", allow_module_level=True)


def _eager(a, b):
    return torch.nn.functional.silu(a) * b


def _fused(a, b):
    return (torch.nn.functional.silu(a.float()) * b.float()).to(a.dtype)


def _all_pairs_count(kernel, ref, step=1 << 26):
    """Brute force in PyTorch: every bf16 pair, in chunks, elements where kernel and ref
    differ (NaN = NaN). Chunks of 2^26 (about 2.5 GB of temporaries at the peak; 2^28 took
    four times that) and the cache emptied after: the CUDA suite runs 15 workers on one GPU,
    and a worker's allocator keeps what it reserved, which made other workers run out."""
    n = 0
    for lo in range(0, 1 << 32, step):
        i = torch.arange(lo, lo + step, device="cuda", dtype=torch.int64)
        a = ((i >> 16) - ((i >> 16) >= 32768) * 65536).to(torch.int16).view(torch.bfloat16)
        b = ((i & 0xFFFF) - ((i & 0xFFFF) >= 32768) * 65536).to(torch.int16).view(torch.bfloat16)
        x, y = kernel(a, b), ref(a, b)
        n += int((~((x == y) | (x.isnan() & y.isnan()))).sum())
        del i, a, b, x, y
    torch.cuda.empty_cache()
    return n


def test_eager_kernel_passes_on_every_pair():
    r = assert_kernel_matches(_eager, "swiglu", device="cuda")
    assert r.passed and r.inputs == 1 << 32 and r.elements == 1 << 32
    print(r)


def test_fused_kernel_count_equals_the_brute_force():
    with pytest.raises(KernelMismatch) as e:
        assert_kernel_matches(_fused, "swiglu", device="cuda")
    assert e.value.report.differ == _all_pairs_count(_fused, _eager) > 0
    # silu in fp32 then * b, rounded once: castlab's fused policy with PyTorch's eager
    # formulas (math="inductor" would be torch.compile's ex2.approx and div.approx)
    assert assert_kernel_matches(_fused, "swiglu", device="cuda", policy="fused",
                                 math="torch_eager").passed


def test_bounds_on_the_gpu_every_pair():
    b = bounds(cl.library("liger")["swiglu"], "bfloat16", device="cuda", cache=False)
    assert b.exhaustive and b.inputs == 1 << 32
    assert b.rows["torch_eager"]["differ"] == 0 and b.rows["inductor"]["differ"] > 0


def test_bounds_gpu_and_cpu_agree_on_a_unary_op():
    g = bounds("silu", "bfloat16", device="cuda", cache=False)
    c = bounds("silu", "bfloat16", device="cpu", cache=False)
    assert g.rows["fp64"]["max_ulp"] == pytest.approx(c.rows["fp64"]["max_ulp"])
    assert g.rows["torch_eager"]["differ"] == 0


def _triton_swiglu():
    pytest.importorskip("triton")
    from _triton_swiglu import triton_swiglu

    return triton_swiglu


def test_a_triton_kernel_against_liger_on_every_pair():
    sw = _triton_swiglu()
    r = assert_kernel_matches(sw, cl.library("liger")["swiglu"], device="cuda")
    assert r.passed
    print(r)


def test_liger_kernel_itself_on_every_pair():
    liger = pytest.importorskip("liger_kernel.ops.swiglu")

    def liger_swiglu(a, b):  # Liger's kernel takes rows of at most 65,536
        cols = math.gcd(a.numel(), 1 << 16)
        return liger.LigerSiLUMulFunction.apply(a.view(-1, cols), b.view(-1, cols)).view(-1)

    r = assert_kernel_matches(liger_swiglu, cl.library("liger")["swiglu"], device="cuda")
    assert r.passed
    n_eager = _all_pairs_count(liger_swiglu, _eager)
    if n_eager:
        with pytest.raises(KernelMismatch) as e:
            assert_kernel_matches(liger_swiglu, "swiglu", device="cuda")
        assert e.value.report.differ == n_eager
    else:
        assert assert_kernel_matches(liger_swiglu, "swiglu", device="cuda").passed
    with pytest.raises(KernelMismatch) as e:
        assert_kernel_matches(liger_swiglu, "swiglu", device="cuda", policy="fused",
                              math="torch_eager")
    assert e.value.report.differ == _all_pairs_count(liger_swiglu, _fused)


def test_a_perturbed_kernel_fails_with_the_brute_force_count():
    """Sigmoid through exp2 with log2(e) cut to 5 digits: castlab's count against Liger's
    preset equals PyTorch's count against a Triton kernel that passes that preset."""
    sw = _triton_swiglu()

    def perturbed(a, b):
        af = a.float()
        return (af / (1.0 + torch.exp2(af * -1.4427))).to(a.dtype) * b

    with pytest.raises(KernelMismatch) as e:
        assert_kernel_matches(perturbed, cl.library("liger")["swiglu"], device="cuda")
    assert e.value.report.differ == _all_pairs_count(perturbed, sw) > 0
    print(e.value.report)


def test_inputs_on_the_gpu():
    from castlab.testing import inputs

    x = inputs("bfloat16", "all", device="cuda")
    assert x.is_cuda and x.numel() == 65536
    assert np.array_equal(x.cpu().view(torch.int16).numpy().view(np.uint16),
                          np.arange(65536, dtype=np.uint16))
