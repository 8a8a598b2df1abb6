"""The inductor_cpu math preset against torch.compile on the CPU (Inductor's generated C++,
a reference castlab did not write): RMSNorm, softmax, log_softmax, a row sum and SwiGLU's
product, fused with one rounding and casts dropped as Inductor's default does, for rows of
the widths users run (56 to Qwen2's vocabulary), bf16 and fp32, under the ISA torch
runs here (Inductor follows ATEN_CPU_CAPABILITY as torch does).

torch's thread count is pinned to 1: with few rows and several threads Inductor splits a
row's reduction over threads (per-thread partial lanes added in thread order), which
castlab does not model yet.
"""

from __future__ import annotations

import numpy as np
import pytest

import castlab as cl

torch = pytest.importorskip("torch")

POL = cl.Policy("fused", round_casts=False)


def _torch_f(x, w):
    h = x.float()
    rms = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
    return (rms, torch.softmax(x, -1), torch.log_softmax(h, -1), h.sum(-1),
            torch.nn.functional.silu(x) * w, x.amax(-1))


def _castlab_f(x, w):
    h = x.astype("float32")
    return (cl.rms_norm(x, x.shape[-1], w, 1e-6, cast="hf"), cl.softmax(x, -1),
            cl.log_softmax(h, -1), cl.sum(h, -1), cl.silu(x) * w, cl.amax(x, -1))


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.inductor
@pytest.mark.parametrize("dt", ["bfloat16", "float32"])
@pytest.mark.parametrize("n", [56, 4100, 151936])
def test_fused_inductor_cpu_equals_torch_compile(dt, n, one_thread):
    """56: one vector tail; 4100: full vectors and a 4-element masked tail, a float sum of
    over 4096 elements (CascadeSumHelper, one chunk); 151936 (Qwen2's vocabulary): each
    lane's sum in three chunks of 4096 vectors, paired by the cascade."""
    g = torch.Generator().manual_seed(n)
    td = getattr(torch, dt)
    x = (torch.randn(16, n, generator=g) * 3).to(td)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(td)
    x[0, :8] = 0.0
    x[1, 3] = -30.0
    torch._dynamo.reset()
    want = torch.compile(_torch_f, dynamic=False)(x, w)
    torch._dynamo.reset()
    got = cl.jit(_castlab_f).run(cl.from_dlpack(x), cl.from_dlpack(w), policy=POL,
                                 math="inductor_cpu")
    names = ("rms_norm", "softmax", "log_softmax", "sum", "silu_mul", "amax")
    bad = {k: int((torch.from_dlpack(a) != b).sum()) for k, a, b in zip(names, got, want)}
    assert not any(bad.values()), bad


def test_inductor_cpp_order_lanes_and_cascade_against_numpy():
    """The inductor_cpp order as a NumPy emulation of the generated C++ computes it: L
    lanes from zero over the full vectors (each lane's values in chunks of 4096 vectors
    paired by CascadeSumHelper's binary counter), plus the masked tail vector, then
    vec_reduce_all's butterfly (offsets L/2 .. 1) and 0 + the result. 40,000 elements in
    fp32 under AVX2 (L = 8: 5000 vectors, two chunks) and 140,003 (17,500 vectors: five
    chunks, three levels, and a 3-element tail), 2 rows."""
    m = cl.Math("c", impl="portable", reduction="inductor_cpp", cpu_isa="avx2")
    for n in (40000, 140003):
        x = cl.randn(2, n, seed=n, dtype=cl.float32)
        xn = np.asarray(x.numpy(), np.float32)
        got = cl.jit(lambda x: cl.sum(x, -1)).run(x, policy="fused", math=m).numpy()
        want = np.array([_emulate(row, 8, 4096) for row in xn], np.float32)
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), (n, got, want)


def _emulate(row, lanes: int, chunk: int) -> np.float32:
    f = np.float32
    n = row.size
    k = n // lanes
    m = -(-k // chunk)
    depth = 0
    while (1 << depth) < m:
        depth += 1
    stk = np.zeros((max(depth, 1), lanes), f)
    index = chunks = 0
    for i in range(k):
        stk[0] = (stk[0] + row[i * lanes:(i + 1) * lanes]).astype(f)
        if depth > 0:
            index += 1
            if index == chunk:
                chunks += 1
                index = 0
                mask, j = chunks, 1
                while j < depth and (mask & 1) == 0:
                    stk[j] = (stk[j] + stk[j - 1]).astype(f)
                    stk[j - 1] = 0
                    mask >>= 1
                    j += 1
    acc = stk[0].copy()
    for j in range(1, depth):
        acc = (acc + stk[j]).astype(f)
    tail = np.zeros(lanes, f)
    tail[:n - k * lanes] = row[k * lanes:]
    acc = (acc + tail).astype(f)
    off = lanes // 2
    while off:
        acc = (acc[:off] + acc[off:2 * off]).astype(f)
        off //= 2
    return f(f(0) + acc[0])


def test_inductor_cpu_preset_and_stack_math():
    """The preset computes as Inductor's C++ does (no contraction, IEEE division, the
    torch_cpu functions as steps of a fused kernel: never MKL VML), and the torch_compile
    stack runs it on CPU inputs, the GPU's inductor preset elsewhere."""
    from castlab.torch import _stacks

    m = cl.Math.preset("inductor_cpu")
    assert (m.fma, m.division, m.reduction, m.impl) == (False, "ieee", "inductor_cpp",
                                                        "inductor_cpp")
    assert m.impl_on(False) == "torch_cpu" and m.impl_on(True) == "portable"
    assert not m.aten_cpu(False) and cl.Math.preset("torch_eager").aten_cpu(False)
    assert m.torch_cpu_tail("silu", "float32") == 0
    ind = cl.Math.preset("inductor")
    assert _stacks.device_math(ind, [torch.zeros(1)]) == m
    assert _stacks.device_math(ind, [torch.zeros(1, device="meta")]) == ind
    custom = cl.Math("inductor", impl="cuda", fma=False)  # not the preset: kept
    assert _stacks.device_math(custom, [torch.zeros(1)]) == custom
    assert "inductor_cpu" not in _stacks._describe_choice("math", custom)
    assert "inductor_cpu" in _stacks._describe_choice("math", ind)
    x = cl.randn(4, 4100, seed=0, dtype=cl.bfloat16)
    tr = cl.jit(lambda x: cl.sum(x.astype("float32"), -1)).trace(x, policy="fused",
                                                                  math="inductor_cpu")
    assert "vector lanes" in tr and "cascade" in tr, tr
