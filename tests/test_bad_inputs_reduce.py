"""Issue 50, reductions: hostile inputs against torch CPU eager, bit for bit (NaN-aware,
signed zeros count). Each test names the item it reproduces."""

from __future__ import annotations

import numpy as np
import pytest

import castlab as cl

torch = pytest.importorskip("torch")

DT = {"bfloat16": (cl.bfloat16, torch.bfloat16), "float16": (cl.float16, torch.float16),
      "float32": (cl.float32, torch.float32), "float64": (cl.float64, torch.float64)}


@pytest.fixture
def threads():
    """Set torch's intra-op thread count for one test, restored after."""
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


def mismatches(got, want) -> int:
    """Elements of `got` (castlab) whose value differs from `want` (torch): -0 and +0
    differ, NaNs match."""
    g = torch.from_dlpack(got)
    assert g.dtype == want.dtype, (g.dtype, want.dtype)
    assert g.shape == want.shape, (g.shape, want.shape)
    g, w = g.double(), want.double()
    both_nan = torch.isnan(g) & torch.isnan(w)  # (any NaN matches a NaN)
    eq = ((g == w) & (torch.signbit(g) == torch.signbit(w))) | both_nan
    return int((~eq).sum())


def trand(shape, dt, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, dtype=torch.float64, generator=g) * scale).to(DT[dt][1])


def view(t, how):
    if how == "contig":
        return t
    if how == "slice":
        return t[..., ::2]
    return t.permute(how)


# ------------------------------------------- item 1: dims that do not coalesce into one

def test_item1_exact_reproducer():
    x = cl.randn(30, 40, 50, seed=1)
    t = torch.from_dlpack(x)
    assert mismatches(cl.sum(x, (0, 2)), t.sum((0, 2))) == 0  # was 33 of 40
    assert mismatches(cl.mean(x, (0, 2)), t.mean((0, 2))) == 0  # was 33 of 40


SPLIT_CASES = [
    ((30, 40, 50), (0, 2), "contig"),
    ((4, 5, 6, 7, 3, 2), (1, 3), "contig"),            # fp64 6-d (1, 3): was 587 of 840
    ((3, 4, 5, 6, 7, 2), (0, 2, 4), (5, 3, 1, 0, 2, 4)),  # permuted 6-d: was 165 of 210
    ((30, 40, 50), (0, 2), (2, 0, 1)),                 # permuted: the dims coalesce in memory
    ((8, 9, 10, 11), (1, 3), "contig"),
    ((8, 9, 10, 11), (0, 1, 3), "contig"),
    ((6, 7, 300), (0, 2), "contig"),                   # long rows: the vectorized cascade
    ((200, 3, 100), (0, 2), "contig"),
    ((2, 70, 3, 90), (1, 3), "contig"),
    ((5, 6, 7), (0, 1, 2), (1, 2, 0)),                 # a full sum of a permuted view
    ((40, 50), (0, 1), (1, 0)),
    ((40, 50, 30), (0, 2), "slice"),                   # a strided view
    ((30, 20, 9), (0, 1), "slice"),
]


@pytest.mark.parametrize("dt", list(DT))
@pytest.mark.parametrize("shape,dims,how", SPLIT_CASES)
def test_item1_sum_mean_over_dims_that_do_not_coalesce(dt, shape, dims, how):
    t = view(trand(shape, dt, seed=len(shape) + shape[0]), how)
    x = cl.from_dlpack(t)
    assert mismatches(cl.sum(x, dims), t.sum(dims)) == 0
    assert mismatches(cl.mean(x, dims), t.mean(dims)) == 0
    assert mismatches(cl.sum(x, dims, keepdim=True), t.sum(dims, keepdim=True)) == 0


@pytest.mark.parametrize("nthreads", [1, 2, 4])
@pytest.mark.parametrize("shape,dims,how", [((64, 40, 30), (0, 2), "contig"),
                                            ((100, 20, 40), (0, 2), (2, 1, 0)),
                                            ((40, 50, 30), (0, 2), "slice")])
def test_item1_thread_counts(threads, nthreads, shape, dims, how):
    threads(nthreads)
    for dt in ("float32", "bfloat16"):
        t = view(trand(shape, dt, seed=7), how)
        x = cl.from_dlpack(t)
        assert mismatches(cl.sum(x, dims), t.sum(dims)) == 0, dt


def test_item1_traced_graph_and_trace():
    x = cl.randn(30, 40, 50, seed=1)
    t = torch.from_dlpack(x)
    f = cl.jit(lambda x: cl.sum(x * 2.0, (0, 2)))
    assert mismatches(f(x), (t * 2.0).sum((0, 2))) == 0
    assert "TensorIterator's dims 50r x 30r x 40" in f.trace(x)


@pytest.mark.parametrize("nthreads", [1, 2, 4, 8])
@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(333, 301), (1001, 129)])
def test_item1_two_pass_of_a_strided_full_sum(threads, nthreads, dt, shape):
    """A sum to ONE value of >= 32768 elements whose dims do not coalesce, on several
    torch threads: ATen's two-pass split cuts the iterator's rows at its chunks."""
    threads(nthreads)
    t = trand(shape, dt, seed=nthreads)[:, ::2]
    x = cl.from_dlpack(t)
    assert mismatches(cl.sum(x), t.sum()) == 0
    t2 = trand(shape, dt, seed=9).T[::2]
    assert mismatches(cl.sum(cl.from_dlpack(t2)), t2.sum()) == 0
    f = cl.jit(lambda x: cl.sum(x))
    assert mismatches(f(x), t.sum()) == 0
    if dt == "float32":  # (a bf16 view's float copy is contiguous: one iterator dim)
        assert "two-pass split, the rows cut at its chunks" in f.trace(x)


@pytest.mark.parametrize("nthreads", [2, 8, 16])
@pytest.mark.parametrize("dt", list(DT))
def test_item1_strided_1d_full_sum_two_pass_buffer(threads, nthreads, dt):
    """The two-pass buffer is contiguous: its slots are summed with the dtype's vectors even
    when the input's row is strided (fp32 at 8 threads: 5 of 10 differed)."""
    threads(nthreads)
    for seed in range(3):
        t = trand((300000,), dt, seed=seed)[::2]
        assert mismatches(cl.sum(cl.from_dlpack(t)), t.sum()) == 0


@pytest.mark.parametrize("shape,dim", [((3, 1), 1), ((3, 1), None), ((4, 5, 6), (0, 2)),
                                       ((40000,), None), ((1,), 0)])
def test_item1_sums_of_negative_zeros(shape, dim):
    """The output is zero-filled and the row sums added into it: +0, as torch."""
    t = torch.full(shape, -0.0)
    x = cl.from_dlpack(t)
    for fn in ("sum", "mean"):
        want = getattr(torch, fn)(t, dim) if dim is not None else getattr(torch, fn)(t)
        assert mismatches(getattr(cl, fn)(x, dim), want) == 0, fn


# ------------------------------------------------ item 2: dtype= converts the input first

def test_item2_exact_reproducer():
    t = torch.tensor([7e4, -7e4, 1.0])
    x = cl.tensor([7e4, -7e4, 1.0])
    got = cl.sum(x, dtype=cl.float16)
    assert mismatches(got, torch.sum(t, dtype=torch.float16)) == 0  # NaN, was 1.0
    f = cl.jit(lambda x: cl.sum(x, dtype=cl.float16))
    assert mismatches(f(x), torch.sum(t, dtype=torch.float16)) == 0


@pytest.mark.parametrize("src,dst", [("float32", "float16"), ("float32", "bfloat16"),
                                     ("float16", "bfloat16"), ("float64", "bfloat16"),
                                     ("bfloat16", "float32"), ("float16", "float64")])
@pytest.mark.parametrize("dim", [-1, 0, (0, 1)])
def test_item2_sum_with_dtype(src, dst, dim):
    t = trand((256, 300), src, seed=1, scale=3000.0)
    x = cl.from_dlpack(t)
    got = cl.sum(x, dim, dtype=DT[dst][0])
    assert mismatches(got, t.sum(dim, dtype=DT[dst][1])) == 0  # fp32 -> fp16: was 101 of 256


@pytest.mark.parametrize("src,dst", [("float32", "float16"), ("float64", "bfloat16"),
                                     ("float16", "bfloat16"), ("float64", "float32"),
                                     ("bfloat16", "float32"), ("float16", "float32")])
@pytest.mark.parametrize("how", ["slice", "T", "T3"])
@pytest.mark.parametrize("dim", [-1, 0, (0, 1)])
def test_item2_sum_with_dtype_of_views(src, dst, how, dim):
    """``self.to(dtype)`` keeps a dense view's strides (a non-dense one becomes
    contiguous), and a 16-bit sum through sum_out's float buffer reads the call's own input
    (fp64 -> fp32 over a permuted 3-d view: 1401 of 2400 differed)."""
    base = trand((64, 300), src, seed=0)
    t = {"slice": base[:, ::2], "T": base.T,
         "T3": base.reshape(8, 8, 300).permute(2, 0, 1)}[how]
    got = cl.sum(cl.from_dlpack(t), dim, dtype=DT[dst][0])
    assert mismatches(got, t.sum(dim, dtype=DT[dst][1])) == 0


@pytest.mark.parametrize("dt", list(DT))
@pytest.mark.parametrize("dim", [-1, 0, 1, (0, 1), (1, 2)])
def test_item1_permuted_kept_dims(dt, dim):
    """TensorIterator orders the kept dims by the output's strides: a permuted input's
    contiguous kept dim is not the second iterator dim (then scalar_inner_sum, not
    vectorized_outer_sum)."""
    t = trand((64, 300), dt, seed=4).reshape(8, 8, 300).permute(2, 0, 1)
    x = cl.from_dlpack(t)
    assert mismatches(cl.sum(x, dim), t.sum(dim)) == 0
    assert mismatches(cl.mean(x, dim), t.mean(dim)) == 0


@pytest.mark.parametrize("src,dst", [("float32", "float16"), ("float64", "bfloat16"),
                                     ("float16", "float32"), ("float64", "float32")])
def test_item2_mean_softmax_log_softmax_with_dtype(src, dst):
    t = trand((64, 200), src, seed=2, scale=3.0)
    x = cl.from_dlpack(t)
    d, td = DT[dst]
    assert mismatches(cl.mean(x, -1, dtype=d), t.mean(-1, dtype=td)) == 0
    assert mismatches(cl.softmax(x, -1, dtype=d), torch.softmax(t, -1, dtype=td)) == 0
    assert mismatches(cl.log_softmax(x, 0, dtype=d), torch.log_softmax(t, 0, dtype=td)) == 0


# ---------------------------------------- item 3: a full sum of >= 32768 elements, threads

@pytest.mark.parametrize("nthreads", [1, 2, 4, 8])
@pytest.mark.parametrize("dt", list(DT))
def test_item3_full_sum_on_torch_threads(threads, nthreads, dt):
    threads(nthreads)
    for shape, seed in (((40000,), 0), ((70001,), 1), ((300, 250), 2)):
        t = trand(shape, dt, seed=seed)
        x = cl.from_dlpack(t)
        assert mismatches(cl.sum(x), t.sum()) == 0, shape
        assert mismatches(cl.mean(x), t.mean()) == 0, shape
    t = trand((250, 300), dt, seed=3).T  # a dense permuted view: memory order
    assert mismatches(cl.sum(cl.from_dlpack(t)), t.sum()) == 0


@pytest.mark.parametrize("nthreads", [1, 2, 8])
def test_item3_outer_and_inner_sums_on_threads(threads, nthreads):
    threads(nthreads)
    for shape, dim in (((200, 400), 0), ((400, 200), 1), ((50, 1000), 0), ((1000, 70), 0)):
        t = trand(shape, "float32", seed=shape[0])
        assert mismatches(cl.sum(cl.from_dlpack(t), dim), t.sum(dim)) == 0, (shape, dim)


# --------------------------------------------------- item 19: empty reductions

EMPTY = [(0,), (3, 0), (0, 4), (2, 0, 3)]


@pytest.mark.parametrize("shape", EMPTY)
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_item19_softmax_of_empty(shape, fn):
    t = torch.zeros(*shape)
    x = cl.zeros(*shape)
    for d in range(len(shape)):
        got = getattr(cl, fn)(x, d)
        want = getattr(torch, fn)(t, d)
        assert mismatches(got, want) == 0
    got = getattr(cl, fn)(cl.zeros(*shape, dtype=cl.bfloat16), -1, dtype=cl.float32)
    assert tuple(got.shape) == shape and got.dtype == cl.float32


@pytest.mark.parametrize("shape", EMPTY)
def test_item19_sum_mean_var_of_empty(shape):
    t = torch.zeros(*shape)
    x = cl.zeros(*shape)
    assert mismatches(cl.sum(x), t.sum()) == 0                 # 0
    assert mismatches(cl.mean(x), t.mean()) == 0               # nan
    for d in range(len(shape)):
        assert mismatches(cl.sum(x, d), t.sum(d)) == 0
        assert mismatches(cl.mean(x, d), t.mean(d)) == 0
        with np.errstate(all="ignore"):
            assert mismatches(cl.var(x, d), t.var(d)) == 0


@pytest.mark.parametrize("shape", EMPTY)
@pytest.mark.parametrize("fn", ["amax", "amin"])
def test_item19_amax_amin_of_empty(shape, fn):
    t = torch.zeros(*shape)
    x = cl.zeros(*shape)
    for d in [*range(len(shape)), None]:
        try:
            want = getattr(torch, fn)(t, d) if d is not None else getattr(torch, fn)(t)
        except (IndexError, RuntimeError):
            with pytest.raises(IndexError, match="non-zero size"):
                getattr(cl, fn)(x, d) if d is not None else getattr(cl, fn)(x)
            continue
        got = getattr(cl, fn)(x, d)
        assert mismatches(got, want) == 0


def test_item19_softmax_of_empty_in_a_traced_graph():
    f = cl.jit(lambda x: cl.softmax(x * 2.0, -1))
    y = f(cl.zeros(3, 0))
    assert tuple(y.shape) == (3, 0)


# ------------------------------------------------------- item 22: integer-like dims

@pytest.mark.parametrize("dim", [np.int64(0), (np.int64(0),), [np.int32(1)],
                                 (np.int16(0), np.uint8(1)), (np.int64(-1),), np.int8(-2)])
def test_item22_integer_like_dims_accepted(dim):
    t = trand((3, 4), "float32")
    x = cl.from_dlpack(t)
    tdim = tuple(int(d) for d in dim) if isinstance(dim, (tuple, list)) else int(dim)
    assert mismatches(cl.sum(x, dim), t.sum(tdim)) == 0
    assert mismatches(cl.mean(x, dim), t.mean(tdim)) == 0
    assert mismatches(cl.amax(x, dim), t.amax(tdim)) == 0
    assert mismatches(cl.amin(x, dim), t.amin(tdim)) == 0
    assert mismatches(cl.var(x, dim), t.var(tdim)) == 0


@pytest.mark.parametrize("dim", [np.int64(1), np.int32(0), np.int64(-1)])
def test_item22_softmax_integer_like_dim(dim):
    t = trand((3, 4), "float32")
    x = cl.from_dlpack(t)
    assert mismatches(cl.softmax(x, dim), torch.softmax(t, int(dim))) == 0
    assert mismatches(cl.log_softmax(x, dim), torch.log_softmax(t, int(dim))) == 0


@pytest.mark.parametrize("dim,what", [((0.0,), "float"), ((True,), "bool"), (1.0, "float"),
                                      ((np.bool_(False),), "bool"), (True, "bool"),
                                      ((0, 1.5), "float"), ("0", "str")])
@pytest.mark.parametrize("fn", ["sum", "mean", "amax", "var"])
def test_item22_bools_and_floats_refused(dim, what, fn):
    x = cl.zeros(3, 4)
    with pytest.raises(TypeError, match=what):
        getattr(cl, fn)(x, dim)


# ------------------------------------------------ item 11: the sign of a zero max / min

def test_item11_exact_reproducer():
    t = torch.tensor([-0.0, 0.0, -0.0])
    x = cl.tensor([-0.0, 0.0, -0.0])
    assert mismatches(cl.amax(x), torch.amax(t)) == 0  # -0, was +0
    assert mismatches(cl.amin(x), torch.amin(t)) == 0


def _signed_zeros(shape, fn, seed):
    """Zeros of random signs among values that lose (negative for amax, positive for
    amin), so that most results are a zero whose sign the kernel's loops decide."""
    rng = np.random.default_rng(seed)
    b = rng.choice([0.0, -0.0, 1.0], size=shape, p=[0.35, 0.35, 0.3])
    b[b == 1.0] = -2.0 if fn == "amax" else 2.0
    return b


ZERO_CASES = [((n,), None, "contig") for n in (1, 2, 3, 8, 17, 31, 32, 33, 64, 65, 130, 1000)] + [
    ((7, 40), 1, "contig"), ((40, 7), 0, "contig"), ((300, 40), 0, "contig"),
    ((300, 70), 0, "contig"), ((33, 130), 0, "contig"), ((20, 64), 1, "slice"),
    ((64, 20), 0, "slice"), ((30, 40, 50), (0, 2), "contig"), ((10, 20, 30), None, (2, 1, 0)),
    ((30, 40, 50), (0, 2), (2, 1, 0)), ((64, 3, 96), (0, 2), "contig")]


@pytest.mark.parametrize("dt", list(DT))
@pytest.mark.parametrize("shape,dim,how", ZERO_CASES)
def test_item11_zero_sign_of_amax_amin(dt, shape, dim, how):
    for fn in ("amax", "amin"):
        for seed in range(3):
            s = shape[:-1] + (2 * shape[-1],) if how == "slice" else shape
            t = view(torch.tensor(_signed_zeros(s, fn, seed), dtype=DT[dt][1]), how)
            x = cl.from_dlpack(t)
            got = getattr(cl, fn)(x, dim) if dim is not None else getattr(cl, fn)(x)
            want = getattr(torch, fn)(t, dim) if dim is not None else getattr(torch, fn)(t)
            assert mismatches(got, want) == 0, (fn, seed)


@pytest.mark.parametrize("nthreads", [1, 2, 4])
@pytest.mark.parametrize("n", [40000, 70001])
def test_item11_zero_sign_on_torch_threads(threads, nthreads, n):
    """A max of >= 32768 elements to one value on several threads: ATen's two-pass split,
    each chunk's winner into its slot, then the slots."""
    threads(nthreads)
    for fn in ("amax", "amin"):
        for pos in (0, 19992, 20000, 39992, n - 1):
            for z in (0.0, -0.0):
                t = torch.full((n,), -z)
                t[pos] = z
                got = getattr(cl, fn)(cl.from_dlpack(t))
                assert mismatches(got, getattr(torch, fn)(t)) == 0, (fn, pos, z)


def test_item11_traced_and_fused_rows():
    t = torch.tensor(_signed_zeros((33, 130), "amax", 1), dtype=torch.float32)
    x = cl.from_dlpack(t)
    f = cl.jit(lambda x: cl.amax(x * 1.0, -1))
    assert mismatches(f(x), torch.amax(t * 1.0, -1)) == 0
    assert "decides a zero's sign" in f.trace(x)
    g = cl.jit(lambda x: x - cl.amax(x, -1, keepdim=True))
    assert mismatches(g(x), t - torch.amax(t, -1, keepdim=True)) == 0
