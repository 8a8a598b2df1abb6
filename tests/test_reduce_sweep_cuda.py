"""Every reduced length, bit for bit against torch eager CUDA (issue 49).

A dense sweep of row lengths from 1 to 262,144 (every length up to 64, each power of two
and its neighbours, the kernel boundaries of SoftMax.cu, every vocabulary size in use) for
softmax, log_softmax, sum, mean, amax, var, HF RMSNorm and layer_norm under the eager
policy and torch_eager math, in bf16, fp16 and fp32: the last dim, an inner dim, a strided
view and a contiguous view that starts inside a 16-byte word. Each case is PyTorch's own
result on the same GPU; the counts go to $CASTLAB_GPU_REPORT (JSON lines) when it is set.
"""

from __future__ import annotations

import json
import os

import pytest

import castlab as cl

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not (cl.cuda.is_available() and torch.cuda.is_available()),
                                 reason="needs a CUDA GPU and torch with CUDA")]

DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EAGER = dict(policy="eager", math="torch_eager")
VOCAB = (32000, 32064, 50257, 100352, 128256, 151936, 152064, 256000)
# SoftMax.cu's boundaries: the warp softmax up to 2048 (8 KiB), the register kernel below
# 10 elements a thread (10240), the shared-memory kernel below 48 KiB (12256 fp32, 24512
# 16-bit elements)
EDGES = (1000, 1023, 1025, 2047, 2049, 3584, 4095, 4097, 9216, 9217, 10239, 10240, 10241,
         12255, 12256, 12260, 24511, 24512, 24520, 30000)


def _lengths() -> list[int]:
    ns = set(range(1, 65))
    for k in range(6, 19):
        p = 1 << k
        ns.update((p - 1, p, p + 1, p + p // 2 + 3))
    ns.update(EDGES)
    ns.update(VOCAB)
    return sorted(n for n in ns if n <= 262144 or n in VOCAB)


LENGTHS = _lengths()
QUICK = [n for n in LENGTHS if n in (1, 7, 33, 100, 2049, 10241, 32000, 151936)]


def _rows(n: int) -> int:
    """Rows per case: about a million elements, at least 3 and at most 96 rows (Reduce.cuh
    picks its block by the row count too, so it varies with the length)."""
    return max(3, min(96, (1 << 20) // n))


def _input(shape, td, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.randn(*shape, device="cuda", generator=g) * 3.0
    return t.to(td)


def _bad(got, want) -> int:
    g = torch.from_dlpack(got) if not isinstance(got, torch.Tensor) else got
    assert g.dtype == want.dtype and g.shape == want.shape, (g.dtype, g.shape, want.shape)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[want.dtype.itemsize]
    diff = g.contiguous().view(ints) != want.contiguous().view(ints)
    return int((diff & ~(g.double().isnan() & want.double().isnan())).sum())


def _report(op: str, dt: str, results: list) -> None:
    path = os.environ.get("CASTLAB_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            for n, rows, variant, bad, total in results:
                f.write(json.dumps({"test": "reduce_sweep", "op": op, "dtype": dt, "n": n,
                                    "rows": rows, "variant": variant, "mismatches": bad,
                                    "elements": total}) + "\n")


def _views(t):
    """(name, view) of a [rows, n] tensor: contiguous, strided (every other column of a
    wider tensor: PyTorch copies it) and contiguous from 1 element past a 16-byte word."""
    rows, n = t.shape
    wide = torch.empty(rows, 2 * n, dtype=t.dtype, device=t.device)
    wide[:, ::2] = t
    flat = torch.empty(rows * n + 8, dtype=t.dtype, device=t.device)
    off = flat[1:1 + rows * n].view(rows, n)
    off.copy_(t)
    return [("contiguous", t), ("strided", wide[:, ::2]), ("offset", off)]


def _cases(n: int, dt: str, views: bool, inner: bool) -> list:
    rows = _rows(n)
    t = _input((rows, n), DT[dt], n)
    if n > 2:
        t[0, 1] = float("-inf")
        t[1, 2] = 30.0
    cases = _views(t) if views else [("contiguous", t)]
    if inner:
        k = 3
        ti = _input((max(1, rows // k), n, k), DT[dt], n + 1)
        cases = [("inner", ti)]
    return [(n, rows, variant, tv) for variant, tv in cases]


# Lengths whose kernels compile together (castlab._jit.warm, on cl.cuda.compile_threads()
# threads) before their cases run one by one: every length and layout is a kernel of its
# own, which compiled one after another made the fused sweep (CASTLAB_FUSE_ROWS=1)
# outlast a device call.
_BATCH = 48


def _sweep(op: str, dt: str, fn_cl, fn_torch, lengths, views=True, inner=False):
    from castlab._jit import warm
    from castlab.policy import as_math, as_policy

    fails, results = [], []
    f = cl.jit(fn_cl)
    pol, math = as_policy(EAGER["policy"]), as_math(EAGER["math"])
    for b in range(0, len(lengths), _BATCH):
        batch = [c for n in lengths[b:b + _BATCH] for c in _cases(n, dt, views, inner)]
        warm([(f, (cl.from_dlpack(tv),), pol, math) for *_, tv in batch])
        for n, rows, variant, tv in batch:
            got = f.run(cl.from_dlpack(tv), **EAGER)
            want = fn_torch(tv)
            bad = _bad(got, want)
            results.append((n, rows, variant, bad, want.numel()))
            if bad:
                fails.append((n, variant, bad))
    _report(op, dt, results)
    assert not fails, f"{op} {dt}: (length, view, mismatches) {fails[:20]}"


def _hf_rms(t):
    n = t.shape[-1]
    w = (torch.arange(n, device="cuda") % 7 * 0.125 + 0.5).to(t.dtype)
    h = t.to(torch.float32)
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(t.dtype), w


@pytest.mark.parametrize("dt", list(DT))
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_every_length(op, dt):
    _sweep(op, dt, lambda x: getattr(cl, op)(x, -1), lambda t: getattr(torch, op)(t, -1),
           LENGTHS)


@pytest.mark.parametrize("dt", list(DT))
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "sum", "mean", "amax"])
def test_inner_dim_every_length(op, dt):
    """Over dim 1 of [rows, n, 3]: SoftMax.cu's spatial kernel, Reduce.cuh's outer
    reduction."""
    lengths = [n for n in LENGTHS if n <= 65536 or n in (151936,)]
    _sweep(op + "_inner", dt, lambda x: getattr(cl, op)(x, 1),
           lambda t: getattr(torch, op)(t, 1), lengths, inner=True)


@pytest.mark.parametrize("dt", list(DT))
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "var"])
def test_row_reductions_every_length(op, dt):
    _sweep(op, dt, lambda x: getattr(cl, op)(x, -1), lambda t: getattr(torch, op)(t, -1),
           LENGTHS)


@pytest.mark.parametrize("dt", list(DT))
def test_hf_rmsnorm_every_length(dt):
    lengths = [n for n in LENGTHS if n >= 8]
    fails, results = [], []
    f = cl.jit(lambda x, w: cl.rms_norm(x, x.shape[-1], w, 1e-6, cast="hf"))
    for n in lengths:
        rows = _rows(n)
        t = _input((rows, n), DT[dt], n) / 3
        want, w = _hf_rms(t)
        bad = _bad(f.run(cl.from_dlpack(t), cl.from_dlpack(w), **EAGER), want)
        results.append((n, rows, "contiguous", bad, want.numel()))
        if bad:
            fails.append((n, bad))
    _report("hf_rms_norm", dt, results)
    assert not fails, fails[:20]


@pytest.mark.parametrize("dt", list(DT))
def test_layer_norm_every_length(dt):
    fails, results = [], []
    f = cl.jit(lambda x, w, b: cl.layer_norm(x, x.shape[-1], w, b, 1e-5))
    for n in LENGTHS:
        rows = _rows(n)
        t = _input((rows, n), DT[dt], n) / 3 + 0.25
        w = (torch.arange(n, device="cuda") % 5 * 0.25 + 0.5).to(t.dtype)
        b = (torch.arange(n, device="cuda") % 3 * 0.125).to(t.dtype)
        for variant, tv in _views(t):
            want = torch.nn.functional.layer_norm(tv, (n,), w, b, 1e-5)
            bad = _bad(f.run(cl.from_dlpack(tv), cl.from_dlpack(w), cl.from_dlpack(b), **EAGER),
                       want)
            results.append((n, rows, variant, bad, want.numel()))
            if bad:
                fails.append((n, variant, bad))
    _report("layer_norm", dt, results)
    assert not fails, fails[:20]


@pytest.mark.parametrize("dt", list(DT))
def test_default_eager_calls(dt):
    """The calls users make without a jit (castlab's default math) at vocabulary widths."""
    for n in (32000, 50257, 151936):
        t = _input((4, n), DT[dt], n)
        x = cl.from_dlpack(t)
        assert _bad(cl.softmax(x, -1), torch.softmax(t, -1)) == 0, n
        assert _bad(cl.log_softmax(x, -1), torch.log_softmax(t, -1)) == 0, n
        assert _bad(cl.sum(x, -1), t.sum(-1)) == 0, n


def test_half_to_float():
    """fp16 in, fp32 out: PyTorch's CUDA softmax reads the fp16 row in one kernel (no
    register kernel, 8-element vectors)."""
    for n in (100, 3000, 9000, 20000, 32000, 50257):
        t = _input((6, n), torch.float16, n)
        x = cl.from_dlpack(t)
        for op in ("softmax", "log_softmax"):
            f = cl.jit(lambda x, op=op: getattr(cl, op)(x, -1, dtype=cl.float32))
            want = getattr(torch, op)(t, -1, dtype=torch.float32)
            assert _bad(f.run(x, **EAGER), want) == 0, (op, n)


# Backward lengths: SoftMax.cu's backward boundaries (the warp kernel up to 1024, then
# host_softmax_backward's block kernel) and the vocabulary.
BWD_LENGTHS = sorted({1, 2, 7, 31, 32, 33, 100, 511, 512, 513, 1023, 1024, 1025, 2047, 2048,
                      2049, 4096, 4097, 10241, 24512, 30000, 65536, 65537} | set(VOCAB[:6]))


@pytest.mark.parametrize("fuse", ["auto", True], ids=["default", "fused_rows"])
@pytest.mark.parametrize("dt", list(DT))
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_backward_every_length(op, dt, fuse, monkeypatch):
    """The gradient of softmax / log_softmax (eager, torch_eager math: SoftMax.cu's
    backward kernels) equals torch autograd on the GPU for every backward boundary and
    vocabulary size, contiguous and inner-dim, with the rows run as separate steps or as
    one row kernel (FUSE_ROWS True)."""
    from castlab import _lower

    monkeypatch.setattr(_lower, "FUSE_ROWS", fuse)
    fb = {d: cl.jit(lambda x, d=d: getattr(cl, op)(x, d)).backward_fn(nargs=1, argnums=0)
          for d in (-1, 1)}
    fails, results = [], []
    for n in BWD_LENGTHS:
        rows = max(3, min(64, (1 << 19) // n))
        for variant, shape, d in (("contiguous", (rows, n), -1),
                                  ("inner", (max(1, rows // 3), n, 3), 1)):
            if variant == "inner" and n > 65537:
                continue
            t = _input(shape, DT[dt], n)
            dy = _input(shape, DT[dt], n + 7)
            if n > 2 and variant == "contiguous":
                t[0, 1] = float("-inf")
            tt = t.detach().requires_grad_()
            (want,) = torch.autograd.grad(getattr(torch, op)(tt, d), tt, dy)
            (got,) = fb[d].run(cl.from_dlpack(t), cl.from_dlpack(dy), **EAGER)
            bad = _bad(got, want)
            results.append((n, rows, variant, bad, want.numel()))
            if bad:
                fails.append((n, variant, bad))
    _report(op + "_backward" + ("_fused" if fuse is True else ""), dt, results)
    assert not fails, f"{op} backward {dt}: (length, view, mismatches) {fails[:20]}"
