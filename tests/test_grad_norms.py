"""var and layer_norm gradients (issue 50 item 14), checked against torch CPU autograd bit
for bit (NaN equals NaN, -0 differs from +0) under the eager policy.

var's backward is autograd's composite var_backward, op for op. layer_norm's is PyTorch's
CPU kernel, layer_norm_kernel.cpp LayerNormBackwardKernelImpl: its row sums (vec::
map2/map3_reduce_all over 8 float lanes, 16-bit rows as two float halves), where GCC fuses
multiply-adds, and dgamma/dbeta accumulated per thread of torch's (a bf16/fp16 buffer for
16-bit input) and then added. Widths cover whole vectors and tails (8 ... 4097); each
build of PyTorch's CPU kernels (ATEN_CPU_CAPABILITY) runs in a child process. The fused
policy differentiates both in fp32 and rounds once (torch.compile's decomposition).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import castlab as cl

torch = pytest.importorskip("torch")
F = torch.nn.functional

TDT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
       "float64": torch.float64}
IDT = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
       torch.float64: torch.int64}


def mismatches(got, want) -> int:
    """Elements whose bits differ (NaN equals NaN; -0 differs from +0)."""
    got = torch.from_dlpack(got) if not isinstance(got, torch.Tensor) else got
    assert got.dtype == want.dtype and got.shape == want.shape
    same = (got.view(IDT[got.dtype]) == want.view(IDT[want.dtype])) | (got.isnan() & want.isnan())
    return int((~same).sum())


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def ln_case(dt, shape, ns, affine, seed, wdt=None):
    """(x, weight or None, bias or None, dy) for a layer_norm over the trailing `ns`."""
    g = _gen(seed)
    wdt = wdt or dt
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(dt)
    w = (torch.rand(ns, generator=g, dtype=torch.float64) + 0.5).to(wdt) if "w" in affine else None
    b = torch.randn(ns, generator=g, dtype=torch.float64).to(wdt) if "b" in affine else None
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dt)
    return x, w, b, dy


def ln_mismatches(x, w, b, dy, ns, policy="eager") -> list:
    """Bit mismatches of castlab's (dx[, dweight][, dbias]) against torch autograd."""
    args = [a for a in (x, w, b) if a is not None]
    ts = [a.clone().requires_grad_() for a in args]
    it = iter(ts[1:])
    tw = next(it) if w is not None else None
    tb = next(it) if b is not None else None
    want = torch.autograd.grad(F.layer_norm(ts[0], ns, tw, tb, 1e-5), ts, dy)

    def f(*a):
        it = iter(a[1:])
        cw = next(it) if w is not None else None
        cb = next(it) if b is not None else None
        return cl.layer_norm(a[0], ns, cw, cb, 1e-5)
    _, pullback = cl.vjp(f, *[cl.from_dlpack(a) for a in args], policy=policy)
    got = pullback(cl.from_dlpack(dy))
    return [mismatches(gg, ww) for gg, ww in zip(got, want)]


AFFINE = ("wb", "w", "b", "")
WIDTHS = (8, 64, 896, 1000, 4096, 4097, 17)


# ---------------------------------------------------------------- the issue's reproducer

def test_issue_reproducer_differentiates():
    x = cl.randn(4, 8, seed=0)
    g = cl.randn(4, 8, seed=1)
    (dx,) = cl.vjp(lambda x: cl.layer_norm(x, 8), x)[1](g)  # was KeyError: 'vop'
    assert dx.shape == (4, 8)
    (dv,) = cl.vjp(lambda x: cl.var(x, 1), x)[1](cl.randn(4, seed=2))
    assert dv.shape == (4, 8)
    # and under eager it is torch's gradient
    (dx,) = cl.vjp(lambda x: cl.layer_norm(x, 8), x, policy="eager")[1](g)
    xt = torch.from_dlpack(x).clone().requires_grad_()
    (want,) = torch.autograd.grad(F.layer_norm(xt, (8,)), xt, torch.from_dlpack(g))
    assert mismatches(dx, want) == 0


# ---------------------------------------------------------------- layer_norm, eager

@pytest.mark.parametrize("dt", ["float32", "bfloat16", "float16"])
def test_layer_norm_grads_bit_exact_widths_and_affine(dt):
    """dx, dweight, dbias for weight+bias, weight only, bias only and none, at widths of
    whole 8-lane (16-bit: 16-element) vectors, tails and short rows; 5 rows (two of torch's
    threads take 3 and 2)."""
    bad = {}
    for n in WIDTHS:
        for affine in AFFINE:
            ms = ln_mismatches(*ln_case(TDT[dt], (5, n), (n,), affine, seed=n + len(affine)),
                               (n,))
            if any(ms):
                bad[(n, affine)] = ms
    assert not bad


@pytest.mark.parametrize("dt", ["float32", "bfloat16", "float16", "float64"])
def test_layer_norm_grads_shapes_rows_and_two_normalized_dims(dt):
    cases = [((1, 64), (64,)), ((2, 17), (17,)), ((33, 40), (40,)), ((4, 6, 16), (6, 16)),
             ((2, 3, 5, 7), (5, 7)), ((5, 8), (5, 8))]
    bad = {}
    for k, (shape, ns) in enumerate(cases):
        for affine in ("wb", ""):
            ms = ln_mismatches(*ln_case(TDT[dt], shape, ns, affine, seed=100 + k), ns)
            if any(ms):
                bad[(shape, affine)] = ms
    assert not bad


def test_layer_norm_grads_special_values_and_transposed_input():
    """A constant row (var = 0), NaN and inf in rows, -0 cotangents (dbias sums from +0),
    and an input that is a transposed view (torch makes it contiguous)."""
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        x, w, b, dy = ln_case(dt, (6, 24), (24,), "wb", seed=7)
        x[0] = 3.0
        x[1, 3] = float("nan")
        x[2, 5] = float("inf")
        x[3] = 0.0
        dy[4] = -0.0
        dy[:, 7] = -0.0
        assert ln_mismatches(x, w, b, dy, (24,)) == [0, 0, 0], dt
        xt = torch.randn(24, 6, generator=_gen(8)).to(dt)
        ts = [xt.clone().requires_grad_(), w.clone().requires_grad_()]
        want = torch.autograd.grad(F.layer_norm(ts[0].t(), (24,), ts[1]), ts, dy)
        f = cl.jit(lambda a, w: cl.layer_norm(cl.permute(a, (1, 0)), 24, w))
        got = f.backward(cl.from_dlpack(xt), cl.from_dlpack(w), grad_outputs=cl.from_dlpack(dy),
                         policy="eager")
        assert [mismatches(g, t) for g, t in zip(got, want)] == [0, 0], dt


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_layer_norm_grads_mixed_types(dt):
    """A 16-bit input with float32 weight and bias: the kernel's float frame (mean and rstd
    saved in float, short rows' lanes by the butterfly)."""
    bad = {}
    for n in (*range(2, 18), 64, 1000, 4097):
        for affine in ("wb", "w"):
            x, w, b, dy = ln_case(TDT[dt], (24, n), (n,), affine, seed=n, wdt=torch.float32)
            ms = ln_mismatches(x, w, b, dy, (n,))
            if any(ms):
                bad[(n, affine)] = ms
    assert not bad


@pytest.mark.parametrize("threads", [1, 3])
def test_layer_norm_weight_grads_follow_torch_thread_count(threads):
    """dgamma/dbeta: one buffer per thread of at::parallel_for's row chunks, then added."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dt in (torch.float32, torch.bfloat16):
            ms = ln_mismatches(*ln_case(dt, (11, 100), (100,), "wb", seed=threads), (100,))
            assert ms == [0, 0, 0], (threads, dt)
    finally:
        torch.set_num_threads(old)


def test_layer_norm_weight_grads_many_rows():
    """Many rows: the per-thread buffers are sequential dots (a bf16/fp16 accumulator
    rounds after every row), not one node per row (that recursed past Python's limit)."""
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        ms = ln_mismatches(*ln_case(dt, (1500, 40), (40,), "wb", seed=9), (40,))
        assert ms == [0, 0, 0], dt


_CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_grad_norms import ln_case, ln_mismatches, var_mismatches
    bad = []
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for n in (8, 64, 1000, 4097, 17):
            for affine in ("wb", ""):
                ms = ln_mismatches(*ln_case(dt, (5, n), (n,), affine, seed=n), (n,))
                if any(ms):
                    bad.append((str(dt), n, affine, ms))
        x, w, b, dy = ln_case(dt, (6, 40), (40,), "wb", seed=3, wdt=torch.float32)
        if dt is not torch.float32 and any(ln_mismatches(x, w, b, dy, (40,))):
            bad.append((str(dt), "mixed"))
        if var_mismatches(dt, (6, 33), 1, 1, False):
            bad.append((str(dt), "var"))
    print(torch.backends.cpu.get_cpu_capability(), "BAD", bad)
""")


@pytest.mark.slow  # ~11 s a build (a torch subprocess)
@pytest.mark.parametrize("isa", ["default", "avx2", "avx512"])
def test_grads_bit_exact_under_each_cpu_capability(isa):
    """Each build of PyTorch's CPU kernels (torch reads ATEN_CPU_CAPABILITY at import, so
    a child process each); castlab's Math.cpu_isa "auto" follows it. layer_norm's
    backward is registered without AVX512: the avx512 build runs the AVX2 kernel."""
    import importlib.util
    import pathlib
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "cpu_isa_report.py"
    spec = importlib.util.spec_from_file_location("cpu_isa_report", script)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    why = report.supported_isas()[isa]
    if why is not None:
        pytest.skip(f"ATEN_CPU_CAPABILITY={isa}: {why}")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=isa)
    code = _CHILD.format(tests=str(pathlib.Path(__file__).resolve().parent))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if " BAD " in ln][-1]
    assert line.split()[0] == {"default": "DEFAULT", "avx2": "AVX2", "avx512": "AVX512"}[isa]
    assert line.endswith("BAD []"), line


# ---------------------------------------------------------------- var

def var_mismatches(dt, shape, dim, correction, keepdim, seed=0) -> int:
    g = _gen(seed + len(shape) + correction)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dt)
    xt = x.clone().requires_grad_()
    if dim is None:
        y = torch.var(xt, correction=correction)
    else:
        y = torch.var(xt, dim=dim, correction=correction, keepdim=keepdim)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(dt)
    (want,) = torch.autograd.grad(y, xt, dy)
    _, pullback = cl.vjp(lambda a: cl.var(a, dim, correction=correction, keepdim=keepdim),
                         cl.from_dlpack(x), policy="eager")
    (got,) = pullback(cl.from_dlpack(dy))
    return mismatches(got, want)


VAR_CASES = [((6, 10), None), ((6, 10), 1), ((6, 10), 0), ((3, 5, 7), (1, 2)),
             ((3, 5, 7), (0, 1, 2)), ((9,), 0), ((9,), None), ((4, 33), -1), ((2, 3), None)]


@pytest.mark.parametrize("dt", ["float32", "bfloat16", "float16"])
def test_var_grads_bit_exact(dt):
    """autograd's var_backward, op for op: (2 / (N - correction)) * grad * (x - mean),
    dim None / int / tuple, correction 0, 1, 2 (dim=None with N - correction <= 0: NaN
    where x equals the mean, inf elsewhere), keepdim or not."""
    import warnings
    bad = {}
    # non-adjacent dims too (the forward's mean follows TensorIterator: issue 50 item 1)
    cases = list(VAR_CASES) + [((3, 5, 7), (0, 2)), ((4, 3, 5, 6), (1, 3))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "degrees of freedom is <= 0"
        for shape, dim in cases:
            for corr in (0, 1, 2):
                for keep in ((False,) if dim is None else (False, True)):
                    m = var_mismatches(TDT[dt], shape, dim, corr, keep)
                    if m:
                        bad[(shape, dim, corr, keep)] = m
        # N - correction <= 0: 2 / 0 is inf (dim given); NaN / inf for dim=None
        for shape, dim, corr in (((1,), None, 1), ((3,), None, 5), ((2, 1), 1, 1)):
            m = var_mismatches(TDT[dt], shape, dim, corr, False)
            if m:
                bad[(shape, dim, corr)] = m
    assert not bad


# ---------------------------------------------------------------- fused

def test_fused_policy_differentiates_in_fp32_and_rounds_once():
    """policy="fused": the decomposition torch.compile differentiates, in fp32, one
    rounding per gradient: closer to the fp64 gradient than eager for 16-bit inputs."""
    for dt in (cl.bfloat16, cl.float16):
        x = cl.randn(16, 1000, seed=0, dtype=dt)
        w = (cl.rand(1000, seed=2) + 0.5).astype(dt)
        b = cl.randn(1000, seed=3, dtype=dt)
        g = cl.randn(16, 1000, seed=1, dtype=dt)
        f = cl.jit(lambda x, w, b: cl.layer_norm(x, 1000, w, b))
        res = {p: [torch.from_dlpack(t).double() for t in
                   f.backward(x, w, b, grad_outputs=g, policy=p)] for p in ("eager", "fused", "fp64")}
        for k in range(3):
            err = {p: float(((res[p][k] - res["fp64"][k]) ** 2).sum()) for p in ("eager", "fused")}
            assert err["fused"] < err["eager"], (dt, k, err)
            scale = float(res["fp64"][k].abs().max())
            assert float((res["fused"][k] - res["fp64"][k]).abs().max()) <= 0.01 * scale
        t = f.backward_fn().trace(x, w, b, g, policy="fused")
        assert t.count("round to nearest even") == 3  # only the three gradients
        fv = cl.jit(lambda x: cl.var(x, -1))
        gv = cl.randn(16, seed=4, dtype=dt)
        d32 = torch.from_dlpack(fv.backward(x, grad_outputs=gv, policy="fused")[0]).double()
        d64 = torch.from_dlpack(fv.backward(x, grad_outputs=gv, policy="fp64")[0]).double()
        assert float((d32 - d64).abs().max()) <= 0.01 * float(d64.abs().max())


# ---------------------------------------------------------------- devices, CLI

def test_cpu_eager_does_not_raise_the_gpu_message():
    x = cl.randn(3, 16, seed=0, dtype=cl.bfloat16)
    w = cl.ones(16, dtype=cl.bfloat16)
    f = cl.jit(lambda x, w: cl.layer_norm(x, 16, w))
    dx, dw = f.backward(x, w, grad_outputs=cl.ones(3, 16, dtype=cl.bfloat16), policy="eager")
    assert dx.shape == (3, 16) and dw.shape == (16,)


@pytest.mark.cuda
def test_cuda_layer_norm_eager_grad_says_not_implemented_and_fused_runs():
    if not cl.cuda.is_available():
        pytest.skip("no CUDA GPU")
    x = cl.randn(3, 16, seed=0, dtype=cl.bfloat16).to("cuda")
    g = cl.randn(3, 16, seed=1, dtype=cl.bfloat16).to("cuda")
    f = cl.jit(lambda x: cl.layer_norm(x, 16))
    with pytest.raises(NotImplementedError, match="layer_norm's gradient"):
        f.backward(x, grad_outputs=g, policy="eager")
    (dx,) = f.backward(x, grad_outputs=g, policy="fused")
    assert dx.shape == (3, 16)


@pytest.mark.cuda
def test_cuda_var_grad_is_torch_autograd():
    if not cl.cuda.is_available():
        pytest.skip("no CUDA GPU")
    xt = torch.randn(6, 33, device="cuda").bfloat16()
    dy = torch.randn(6, device="cuda").bfloat16()
    t = xt.clone().requires_grad_()
    (want,) = torch.autograd.grad(torch.var(t, 1), t, dy)
    (got,) = cl.vjp(lambda a: cl.var(a, 1), cl.from_dlpack(xt), policy="eager")[1](
        cl.from_dlpack(dy))
    assert mismatches(got, want) == 0


def test_cli_study_grad_with_layer_norm(tmp_path):
    """`castlab study --grad` over a user chain that uses layer_norm and var (it printed
    "castlab: error: 'vop'")."""
    (tmp_path / "norms.py").write_text(
        "import castlab as cl\n\n\n"
        "def ln(x):\n"
        "    return cl.layer_norm(x, 64) * (cl.var(x, -1, keepdim=True) + 1.0)\n")
    chain = f"{tmp_path / 'norms.py'}:ln"
    r = subprocess.run([sys.executable, "-m", "castlab", "study", "--grad", "--device", "cpu",
                        "--dtypes", "bfloat16", "--chains", chain, "--shape", f"{chain}=8x64",
                        "--out", str(tmp_path / "out"), "--no-progress", "--no-plots"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "vop" not in r.stderr
    import pandas as pd
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert (df["pass"] == "backward").any()
