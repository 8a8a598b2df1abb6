"""castlab on the GPU, checked against PyTorch CUDA on the same inputs (issues 5 and 6).

Every test is marked ``cuda`` and skipped when castlab finds no GPU (CI, laptops).
Set CASTLAB_GPU_REPORT=path to append measured mismatch counts (JSON lines) there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import castlab as cl
import castlab.cuda as clcuda

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")]

torch = pytest.importorskip("torch")
F = torch.nn.functional
from castlab.torch._aten import torch_pairs  # noqa: E402

if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("torch has no CUDA", allow_module_level=True)

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_TINT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_TORCH_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
             "float64": torch.float64, "bool": torch.bool, "int32": torch.int32,
             "int64": torch.int64}
_NP_DT = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32,
          "float64": np.float64, "bool": np.bool_, "int32": np.int32, "int64": np.int64}


def report(**kw):
    path = os.environ.get("CASTLAB_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(kw) + "\n")


# ---------------------------------------------------------------- conversions (bit-exact)

def to_torch(x):
    """castlab -> torch on the same device (through the host; bits unchanged)."""
    name = x.dtype.name
    a = np.ascontiguousarray(x.cpu().numpy())
    t = torch.from_numpy(a.view(_UINT[a.dtype.itemsize]).view(
        {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]).copy())
    t = t.view(_TORCH_DT[name]) if name != "bool" else t.view(torch.bool)
    return t.cuda() if x.is_cuda else t


def from_torch(t, device="cuda"):
    """torch -> castlab on `device` (through the host; bits unchanged)."""
    name = str(t.dtype).replace("torch.", "")
    c = t.detach().cpu().contiguous()
    raw = c.view(_TINT[c.element_size()]) if name != "bool" else c.view(torch.uint8)
    a = raw.numpy().view(_NP_DT[name]).copy()
    return cl.from_numpy(a).to(device)


def bits_np(x):
    """Raw bits of a castlab tensor or torch tensor as a flat unsigned NumPy array."""
    if isinstance(x, torch.Tensor):
        c = x.detach().cpu().contiguous()
        raw = c.view(_TINT[c.element_size()]) if c.dtype != torch.bool else c.view(torch.uint8)
        return raw.numpy().reshape(-1).view(_UINT[c.element_size()])
    a = np.ascontiguousarray(x.cpu().numpy())
    return a.reshape(-1).view(_UINT[a.dtype.itemsize])


def isnan_np(x):
    if isinstance(x, torch.Tensor):
        if not x.dtype.is_floating_point:
            return np.zeros(x.numel(), bool)
        return torch.isnan(x.detach().float().cpu()).numpy().reshape(-1)
    a = np.ascontiguousarray(x.cpu().numpy()).reshape(-1)
    if a.dtype.kind in "biu":
        return np.zeros(a.size, bool)
    return np.isnan(a.astype(np.float64))


def mismatches(got, want) -> int:
    g, w = bits_np(got), bits_np(want)
    assert g.shape == w.shape, (g.shape, w.shape)
    bad = (g != w) & ~(isnan_np(got) & isnan_np(want))
    return int(bad.sum())


def all_patterns(dtype: str):
    u = np.arange(65536, dtype=np.uint16)
    a = u.view(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)
    t = torch.from_numpy(u.view(np.int16).copy()).view(_TORCH_DT[dtype]).cuda()
    return cl.from_numpy(a.copy()).cuda(), t


def random_pair(n, dtype, seed, specials=True):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g, dtype=torch.float32) * 3
    if specials:
        sp = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-42,
                           65504.0, 1e30, -1e-8], dtype=torch.float32)
        t[: sp.numel()] = sp
    t = t.to(_TORCH_DT[dtype]).cuda()
    return from_torch(t), t


# ---------------------------------------------------------------- basics

def test_info_and_devices():
    assert clcuda.device_count() >= 1
    info = clcuda.info()
    assert info["available"]
    d = info["devices"][0]
    assert d["name"] and len(d["compute_capability"]) == 2 and d["total_memory"] > 0
    assert info.get("nvrtc_version"), info
    report(test="info", info={k: v for k, v in info.items() if k != "devices"}, device=d)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
                                   "float8_e5m2", "bool", "int32", "int64"])
def test_round_trip_bits(dtype):
    x = cl.randn(1000, seed=3, dtype="float32").astype(dtype)
    y = x.cuda()
    assert y.is_cuda and y._device_str == "cuda:0"
    assert np.array_equal(bits_np(y.cpu()), bits_np(x))
    z = y.to("cuda:0")
    assert z is y


def test_strided_copy_and_views():
    x = cl.randn(64, 48, seed=1, dtype=cl.bfloat16)
    y = x.cuda()
    assert np.array_equal(bits_np(y.t().cpu()), bits_np(x.t().contiguous()))
    assert np.array_equal(bits_np(y[3:, 5::2].cpu()), bits_np(x[3:, 5::2].contiguous()))


def test_creation_on_device_and_random_same_bits():
    for fn in (cl.rand, cl.randn):
        a = fn(1000, 33, seed=5, dtype=cl.float32)
        b = fn(1000, 33, seed=5, dtype=cl.float32, device="cuda")
        assert mismatches(b, a) == 0
    z = cl.zeros(5, 7, dtype=cl.bfloat16, device="cuda")
    assert z.cpu().tolist() == [[0.0] * 7] * 5
    f = cl.full((3,), 2.5, device="cuda")
    assert f.tolist() == [2.5, 2.5, 2.5]


# ---------------------------------------------------------------- eager vs torch eager

# Every unary op with an ATen op (the op table's aten column), then pow and scalar forms.
UNARY = {
    **torch_pairs("unary_float", "unary_signed", castlab_first=True),
    "pow2": (lambda x: x ** 2, lambda t: t ** 2),
    "pow3": (lambda x: x ** 3, lambda t: t ** 3),
    "pow0.5": (lambda x: x ** 0.5, lambda t: t ** 0.5),
    "pow-1": (lambda x: x ** -1, lambda t: t ** -1),
    "pow-2": (lambda x: x ** -2, lambda t: t ** -2),
    "mul_scalar": (lambda x: x * 0.1, lambda t: t * 0.1),
    "add_scalar": (lambda x: x + 1.3, lambda t: t + 1.3),
    "rsub_scalar": (lambda x: 1.0 - x, lambda t: 1.0 - t),
    "div_scalar": (lambda x: x / 3.0, lambda t: t / 3.0),
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_exhaustive_vs_torch(op, dtype):
    x, t = all_patterns(dtype)
    f_cl, f_t = UNARY[op]
    got = f_cl(x)
    want = f_t(t)
    n = mismatches(got, want)
    report(test="unary_exhaustive", op=op, dtype=dtype, mismatches=n, total=65536)
    assert n == 0, f"{op} {dtype}: {n} of 65536 differ from torch eager"


@pytest.mark.parametrize("op", list(UNARY))
def test_unary_fp32_random_vs_torch(op):
    x, t = random_pair(1 << 20, "float32", seed=11)
    f_cl, f_t = UNARY[op]
    n = mismatches(f_cl(x), f_t(t))
    report(test="unary_fp32", op=op, mismatches=n, total=1 << 20)
    assert n == 0, f"{op} fp32: {n} of {1 << 20} differ from torch eager"


BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / b, lambda a, b: a / b),
    "maximum": torch_pairs(castlab_first=True)["maximum"],
    "minimum": torch_pairs(castlab_first=True)["minimum"],
    "eq": (lambda a, b: a == b, lambda a, b: a == b),
    "ne": (lambda a, b: a != b, lambda a, b: a != b),
    "lt": (lambda a, b: a < b, lambda a, b: a < b),
    "le": (lambda a, b: a <= b, lambda a, b: a <= b),
    "gt": (lambda a, b: a > b, lambda a, b: a > b),
    "ge": (lambda a, b: a >= b, lambda a, b: a >= b),
    "where": (lambda a, b: cl.where(a > b, a, b), lambda a, b: torch.where(a > b, a, b)),
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_random_vs_torch(op, dtype):
    a, ta = random_pair(1 << 20, dtype, seed=21)
    b, tb = random_pair(1 << 20, dtype, seed=22, specials=False)
    f_cl, f_t = BINARY[op]
    n = mismatches(f_cl(a, b), f_t(ta, tb))
    report(test="binary", op=op, dtype=dtype, mismatches=n, total=1 << 20)
    assert n == 0, f"{op} {dtype}: {n} differ from torch eager"


def test_broadcast_strided_and_misaligned_inputs_vs_torch():
    a, ta = random_pair(1000 * 96, "bfloat16", seed=31, specials=False)
    a, ta = a.reshape(1000, 96), ta.reshape(1000, 96)
    b, tb = random_pair(96, "bfloat16", seed=32, specials=False)
    cases = [
        (lambda: cl.silu(a) * b, lambda: F.silu(ta) * tb),                      # broadcast row
        (lambda: a.t() * 2.0, lambda: ta.t() * 2.0),                            # transposed
        (lambda: cl.silu(a[1:, 3:]), lambda: F.silu(ta[1:, 3:])),               # misaligned
        (lambda: a[:, ::3] + b[::3], lambda: ta[:, ::3] + tb[::3]),             # strided
        (lambda: cl.exp(a.reshape(-1)[1:]), lambda: torch.exp(ta.reshape(-1)[1:])),
        (lambda: a[:, :1] * b, lambda: ta[:, :1] * tb),                         # inner stride 0
        # contiguous kernels with two vectors per lane (heavy ops): one element per vector
        # (misaligned), and ends that stop inside a lane's vectors
        (lambda: cl.log(a.reshape(-1)[1:]), lambda: torch.log(ta.reshape(-1)[1:])),
        (lambda: cl.tanh(a.reshape(-1)[:95997]), lambda: torch.tanh(ta.reshape(-1)[:95997])),
        (lambda: cl.silu(a.astype(cl.float16).reshape(-1)[:94211]),
         lambda: F.silu(ta.half().reshape(-1)[:94211])),
    ]
    for k, (fc, ft) in enumerate(cases):
        assert mismatches(fc(), ft()) == 0, f"case {k}"


def _rope_inputs(dtype="bfloat16", shape=(4, 8, 512, 128), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(_TORCH_DT[dtype]).cuda()
    seq, dim = shape[-2], shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    fr = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat([fr, fr], dim=-1)
    cos = emb.cos().to(_TORCH_DT[dtype]).cuda()
    sin = emb.sin().to(_TORCH_DT[dtype]).cuda()
    return x, cos, sin


def rope_torch(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rope_cl(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return x * cos + cl.cat([-x2, x1], dim=-1) * sin


def swiglu_cl(a, b):
    return cl.silu(a) * b


def _swiglu_inputs(dtype="bfloat16", n=1 << 22, seed=1):
    g = torch.Generator().manual_seed(seed)
    ta = (torch.randn(n, generator=g) * 4).to(_TORCH_DT[dtype]).cuda()
    tb = torch.randn(n, generator=g).to(_TORCH_DT[dtype]).cuda()
    return ta, tb


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_swiglu_and_rope_eager_bit_exact_vs_torch(dtype):
    ta, tb = _swiglu_inputs(dtype)
    a, b = from_torch(ta), from_torch(tb)
    n1 = mismatches(swiglu_cl(a, b), F.silu(ta) * tb)
    n2 = mismatches(cl.jit(swiglu_cl).run(a, b, policy="eager"), F.silu(ta) * tb)
    tx, tc, ts = _rope_inputs(dtype)
    x, c, s = from_torch(tx), from_torch(tc), from_torch(ts)
    want = rope_torch(tx, tc, ts)
    n3 = mismatches(rope_cl(x, c, s), want)
    n4 = mismatches(cl.jit(rope_cl).run(x, c, s, policy="eager"), want)
    report(test="chains_eager", dtype=dtype, swiglu=n1, swiglu_traced=n2, rope=n3, rope_traced=n4,
           total_swiglu=ta.numel(), total_rope=tx.numel())
    assert (n1, n2, n3, n4) == (0, 0, 0, 0)


def test_runtime_layout_kernels_odd_extents_and_small_grids_vs_torch():
    """n-D kernels below the static-layout size divide by each extent with a multiply-high
    and a shift (magic numbers), and small n-D grids take half-width vectors: extents that
    are primes, 1 and near 2^16, broadcasts in five dimensions, and RoPE on 64K elements
    (its halves a 32-block grid at full width) and on 512K (halves of 2^18: a static
    layout), each against PyTorch eager CUDA bit for bit, and the fused RoPE against
    castlab's CPU under portable math."""
    g = torch.Generator().manual_seed(5)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype).cuda()

    x = rnd(17, 14_983)  # 254,711 elements: the runtime layout (below 2^18)
    a5, b5 = rnd(5, 1, 7, 1, 32), rnd(1, 11, 1, 13, 32)
    y = rnd(3, 65_521, dtype=torch.float32)
    z = rnd(1, 1, 9973)
    cases = [
        (lambda t: t.t() * 2.0, (x,)),
        (lambda t: t[:, 1::3] + 1.0, (x,)),
        (lambda p, q: p + q, (a5, b5)),
        (lambda p, q: F.silu(p) * q, (a5, b5)),
        (lambda t: t.t() - 0.5, (y,)),
        (lambda t: t.expand(3, 5, 9973) * 3.0, (z,)),
    ]
    cl_ops = [
        lambda t: t.t() * 2.0,
        lambda t: t[:, 1::3] + 1.0,
        lambda p, q: p + q,
        lambda p, q: cl.silu(p) * q,
        lambda t: t.t() - 0.5,
        lambda t: cl.broadcast_to(t, (3, 5, 9973)) * 3.0,
    ]
    for k, ((ft, targs), fc) in enumerate(zip(cases, cl_ops)):
        got = fc(*(from_torch(t) for t in targs))
        assert mismatches(got, ft(*targs)) == 0, f"case {k}"
    for shape in ((1, 32, 16, 128), (2, 3, 5, 128), (1, 7, 9, 64), (1, 32, 128, 128)):
        tx, tc, ts = _rope_inputs("bfloat16", shape=shape)
        x, c, s = from_torch(tx), from_torch(tc), from_torch(ts)
        assert mismatches(rope_cl(x, c, s), rope_torch(tx, tc, ts)) == 0, shape
        fused = cl.jit(rope_cl, policy="fused", math="portable")
        assert mismatches(fused(x, c, s), fused(x.cpu(), c.cpu(), s.cpu())) == 0, shape


def test_small_nd_launches_specialise_after_repeated_calls():
    """An n-D launch below the static-layout size gets a kernel specialised to its layout
    on its Program's 16th launch with that layout (executor.cpp, kStaticAfter): exactly
    one more kernel compiled then, none before or after, and every call's bits equal
    PyTorch's (the runtime-shape kernel's and the specialised one's), for a transposed
    view, RoPE on 64K elements and a stochastic program (its random stream unchanged:
    castlab's CPU)."""
    g = torch.Generator().manual_seed(21)
    tx = torch.randn(33, 1001, generator=g).to(torch.bfloat16).cuda()
    rx, rc, rs = _rope_inputs("bfloat16", shape=(1, 32, 16, 128), seed=6)
    sr = cl.Policy("custom", round_after="all", rounding="stochastic", seed=5)
    x = from_torch(tx)
    # (constants no other test uses: their kernels are new to this process)
    rope = cl.jit(lambda a, b, c: rope_cl(a, b, c) * 0.8125, policy="fused", math="portable")
    trans = cl.jit(lambda t: t.t() * 3.0625 + 1.5, policy="eager")
    srf = cl.jit(lambda t: cl.exp(t.t()) * 1.375, policy=sr)
    r_args = (from_torch(rx), from_torch(rc), from_torch(rs))
    want_rope = rope(*(a.cpu() for a in r_args))
    want_sr = srf(x.cpu())
    want_t = tx.t() * 3.0625 + 1.5
    for f, args, want in ((trans, (x,), want_t), (rope, r_args, want_rope), (srf, (x,), want_sr)):
        compiles = []
        for k in range(20):
            assert mismatches(f(*args), want) == 0, (f, k)
            clcuda.synchronize()
            st = clcuda.kernel_cache_stats()
            compiles.append(st["compiles"] + st["disk_hits"])
        steps = [b - a for a, b in zip(compiles[1:], compiles[2:])]
        # calls 3..20: one new kernel, at the 16th launch (index 15)
        assert sum(steps) == 1 and steps[15 - 2] == 1, (f, compiles)


def test_rope_broadcast_walk_vs_torch_and_cpu():
    """Large broadcast inputs (cos/sin over the heads) make the n-D kernel walk the heads
    innermost (executor.cpp, order_for_broadcast): 4096, 4104 and 4097 positions, a
    batch that is not broadcast (Hugging Face's cos [b, 1, s, d]), fp32, and
    stochastic rounding (its random stream follows the output offset, not the walk):
    PyTorch eager CUDA bit for bit, and the fused and stochastic programs against
    castlab's CPU."""
    sr = cl.Policy("custom", round_after="all", rounding="stochastic", seed=11)
    shapes = [((1, 4, 4096, 128), "bfloat16"), ((2, 3, 4104, 128), "bfloat16"),
              ((1, 4, 4097, 128), "bfloat16"), ((1, 2, 4096, 128), "float32")]
    for shape, dt in shapes:
        tx, tc, ts = _rope_inputs(dt, shape=shape, seed=3)
        x, c, s = from_torch(tx), from_torch(tc), from_torch(ts)
        assert mismatches(rope_cl(x, c, s), rope_torch(tx, tc, ts)) == 0, shape
        f = cl.jit(rope_cl)
        for pol in ("fused", sr):
            got = f.run(x, c, s, policy=pol, math="portable")
            want = f.run(x.cpu(), c.cpu(), s.cpu(), policy=pol, math="portable")
            assert mismatches(got, want) == 0, (shape, pol)
    # Hugging Face's layout: cos/sin [b, 1, s, d], the batch walked outside the heads
    tx, _, _ = _rope_inputs("bfloat16", shape=(2, 6, 4096, 128), seed=4)
    g = torch.Generator().manual_seed(9)
    tc = torch.randn(2, 1, 4096, 128, generator=g).to(torch.bfloat16).cuda()
    ts = torch.randn(2, 1, 4096, 128, generator=g).to(torch.bfloat16).cuda()
    x, c, s = from_torch(tx), from_torch(tc), from_torch(ts)
    assert mismatches(rope_cl(x, c, s), rope_torch(tx, tc, ts)) == 0
    got = cl.jit(rope_cl, policy="fused", math="portable")(x, c, s)
    assert mismatches(got, cl.jit(rope_cl, policy="fused", math="portable")(
        x.cpu(), c.cpu(), s.cpu())) == 0


def test_rope_between_one_and_two_l2_sizes_vs_torch_and_cpu():
    """RoPE whose operands exceed the L2 but fit in twice its size (16M elements on an
    H200): the static kernels load x evict-first (executor.cpp, evict_first_reads), the
    eager ops and the fused program alike. PyTorch eager bit for bit, the fused program
    against castlab's CPU, and again from the cached kernels with fresh inputs."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    seq = max(64, int(1.5 * l2 / (2 * 32 * 128 * 2)) // 8 * 8)
    f = cl.jit(rope_cl, policy="fused", math="portable")
    for seed in (5, 6):
        tx, tc, ts = _rope_inputs("bfloat16", shape=(1, 32, seq, 128), seed=seed)
        x, c, s = from_torch(tx), from_torch(tc), from_torch(ts)
        assert mismatches(rope_cl(x, c, s), rope_torch(tx, tc, ts)) == 0, seed
        assert mismatches(f(x, c, s), f(x.cpu(), c.cpu(), s.cpu())) == 0, seed


def test_rope_tiled_walk_over_two_l2_sizes_vs_torch_and_cpu():
    """RoPE whose operands exceed twice the L2 walks in tiles (executor.cpp,
    tile_for_locality: positions split by a power of two, heads by the divisor nearest
    8): 32 heads (tiles of 8), Hugging Face's batched cos/sin with 28 heads (7) and a
    position count divisible by 8 only, 12 heads in fp32 (6), and stochastic rounding,
    whose random stream follows the output offset and not the walk. PyTorch eager CUDA
    bit for bit, the fused and stochastic programs against castlab's CPU."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sr = cl.Policy("custom", round_after="all", rounding="stochastic", seed=13)

    def seq_for(batch, heads, itemsize):  # x alone 1.5 L2: x and the output over 2 L2
        return int(1.5 * l2 / (batch * heads * 128 * itemsize)) // 1024 * 1024

    cases = [(1, 32, seq_for(1, 32, 2), "bfloat16", False),
             (2, 28, seq_for(2, 28, 2) + 8, "bfloat16", True),
             (1, 12, seq_for(1, 12, 4), "float32", False)]
    for batch, heads, seq, dt, batched in cases:
        tx, tc, ts = _rope_inputs(dt, shape=(batch, heads, seq, 128), seed=heads)
        if batched:  # cos/sin [b, 1, s, d], different per batch row
            tc = torch.stack([tc, tc.flip(0)]).unsqueeze(1)
            ts = torch.stack([ts, -ts]).unsqueeze(1)
        x, c, s = from_torch(tx), from_torch(tc), from_torch(ts)
        case = (batch, heads, seq, dt)
        assert mismatches(rope_cl(x, c, s), rope_torch(tx, tc, ts)) == 0, case
        f = cl.jit(rope_cl)
        xc, cc, sc = x.cpu(), c.cpu(), s.cpu()
        pols = ("fused", sr) if heads == 32 else ("fused",)
        for pol in pols:
            got = f.run(x, c, s, policy=pol, math="portable")
            want = f.run(xc, cc, sc, policy=pol, math="portable")
            assert mismatches(got, want) == 0, (case, pol)
        del tx, tc, ts, x, c, s, xc, cc, sc


# ---------------------------------------------------------------- portable: GPU == CPU

@pytest.mark.parametrize("op", list(UNARY))
def test_portable_unary_gpu_equals_cpu(op):
    f_cl, _ = UNARY[op]
    x, _t = all_patterns("bfloat16")
    xh, _t = all_patterns("float16")
    xf, _ = random_pair(1 << 16, "float32", seed=41)
    xd = xf.astype(cl.float64)
    with cl.use_math("portable"):
        for inp in (x, xh, xf, xd):
            got = f_cl(inp)
            want = f_cl(inp.cpu())
            n = mismatches(got, want)
            assert n == 0, f"{op} {inp.dtype}: GPU and CPU differ in {n} elements"
            if inp.dtype in (cl.bfloat16, cl.float16) and got.dtype == inp.dtype:
                # 16-bit stores: NaN bits too. The GPU's paired conversion turns the
                # hardware's canonical NaN into castlab's: bf16 0x7FC0, fp16 sign|0x7E00.
                # The fp16 NaN sign is the float NaN's, and float arithmetic gives NaNs of
                # different signs on the two devices (x86: -x flips it, sqrt(-1) is
                # negative; the GPU returns its positive canonical NaN), so it is ignored.
                g, w = bits_np(got), bits_np(want)
                if inp.dtype == cl.float16:
                    nan = isnan_np(want)
                    assert np.array_equal(nan, isnan_np(got))
                    g, w = np.where(nan, g & 0x7FFF, g), np.where(nan, w & 0x7FFF, w)
                assert np.array_equal(g, w), (
                    f"{op} {inp.dtype}: {(g != w).sum()} bit patterns differ; CPU NaNs "
                    f"{sorted(hex(b) for b in set(w[isnan_np(want)].tolist()))}")


POLICIES = {
    "eager": "eager",
    "fused": "fused",
    "fp64": "fp64",
    "custom_sr": cl.Policy("custom", round_after=("silu", "mul"), rounding="stochastic", seed=7),
    "custom_f64_tz": cl.Policy("custom", round_after="all", compute="float64",
                               rounding="toward_zero"),
    "custom_fp8": cl.Policy("custom", round_after="all", output="float8_e4m3fn",
                            rounding="stochastic", seed=3),
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_portable_chains_gpu_equals_cpu_every_policy(policy):
    pol = POLICIES[policy]
    ta, tb = _swiglu_inputs("bfloat16", n=1 << 20)
    a, b = from_torch(ta), from_torch(tb)
    f = cl.jit(swiglu_cl)
    g = f.run(a, b, policy=pol, math="portable")
    c = f.run(a.cpu(), b.cpu(), policy=pol, math="portable")
    assert mismatches(g, c) == 0
    tx, tc, ts = _rope_inputs("bfloat16", shape=(2, 4, 256, 128))
    x, co, si = from_torch(tx), from_torch(tc), from_torch(ts)
    r = cl.jit(rope_cl)
    g = r.run(x, co, si, policy=pol, math="portable")
    c = r.run(x.cpu(), co.cpu(), si.cpu(), policy=pol, math="portable")
    assert mismatches(g, c) == 0


# ---------------------------------------------------------------- fused vs torch.compile

@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_inductor_preset_vs_torch_compile(dtype):
    torch._dynamo.reset()
    ta, tb = _swiglu_inputs(dtype)
    a, b = from_torch(ta), from_torch(tb)
    sw_t = torch.compile(lambda p, q: F.silu(p) * q, dynamic=False)
    want = sw_t(ta, tb)
    got = cl.jit(swiglu_cl, policy="fused", math="inductor")(a, b)
    n_sw = mismatches(got, want)
    tx, tc, ts = _rope_inputs(dtype)
    x, c, s = from_torch(tx), from_torch(tc), from_torch(ts)
    ro_t = torch.compile(rope_torch, dynamic=False)
    want_r = ro_t(tx, tc, ts)
    got_r = cl.jit(rope_cl, policy="fused", math="inductor")(x, c, s)
    n_ro = mismatches(got_r, want_r)
    # and the same graphs under the eager policy equal torch eager
    report(test="inductor_vs_compile", dtype=dtype, swiglu=n_sw, rope=n_ro,
           total_swiglu=ta.numel(), total_rope=tx.numel())
    assert n_sw <= ta.numel() * 1e-6 and n_ro <= tx.numel() * 1e-6, (n_sw, n_ro)


# ---------------------------------------------------------------- DLPack

def test_dlpack_torch_zero_copy_both_ways():
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    x = cl.from_dlpack(t)
    assert x.is_cuda and x.data_ptr() == t.data_ptr()
    x[:4] = 7.0                     # castlab writes, torch sees
    clcuda.synchronize()
    assert t[:4].tolist() == [7.0] * 4
    y = cl.exp(cl.full((1 << 20,), 0.5, device="cuda"))
    u = torch.from_dlpack(y)
    assert u.data_ptr() == y.data_ptr() and u.device.type == "cuda"
    torch.cuda.synchronize()
    assert float(u[123]) == float(np.exp(np.float32(0.5)))
    u.fill_(3.0)                    # torch writes, castlab sees
    torch.cuda.synchronize()
    assert y[:2].tolist() == [3.0, 3.0]


def test_dlpack_stream_semantics_without_host_sync():
    # castlab queues a long kernel; the consumer stream must wait for it via an event.
    n = 1 << 27
    big = cl.full((n,), 1.0, dtype=cl.float32, device="cuda")
    for _ in range(4):
        big = cl.exp(big * 0.0)     # queued work, ends with all ones
    s = torch.cuda.Stream()
    clcuda.producer_sync(big, s.cuda_stream)
    u = torch.from_dlpack(cl._C.to_dlpack(big, False))  # a capsule: no stream handshake
    with torch.cuda.stream(s):
        total = u.sum()
    s.synchronize()
    assert float(total) == float(n)
    # the hooks' argument rules
    clcuda.producer_sync(big, None)
    clcuda.producer_sync(big, -1)
    with pytest.raises(ValueError):
        clcuda.producer_sync(big, 0)
    assert clcuda.consumer_stream(0) == clcuda.current_stream_ptr(0) != 0
    # consumer side: castlab's stream waits for torch's pending work
    ts = torch.cuda.Stream()
    with torch.cuda.stream(ts):
        src = torch.ones(n, device="cuda") * 2.0
    clcuda.wait_on_stream(ts.cuda_stream, 0)
    x = cl.from_dlpack(src)
    assert float(cl.jit(lambda v: v * 1.0)(x)[n - 1].item()) == 2.0


def test_dlpack_cupy_zero_copy_both_ways():
    cupy = pytest.importorskip("cupy")
    a = cupy.arange(1000, dtype=cupy.float32)
    x = cl.from_dlpack(a)
    assert x.data_ptr() == a.data.ptr
    x[:3] = -1.0
    clcuda.synchronize()
    assert a[:3].tolist() == [-1.0] * 3
    y = cl.full((100,), 4.0, device="cuda")
    b = cupy.from_dlpack(y)
    assert b.data.ptr == y.data_ptr()
    assert float(b.sum()) == 400.0
    b[:] = 5.0
    cupy.cuda.runtime.deviceSynchronize()
    assert y.tolist()[:2] == [5.0, 5.0]


# ---------------------------------------------------------------- faults

def test_out_of_memory_raises_and_castlab_keeps_working():
    with pytest.raises(RuntimeError, match="out of memory"):
        cl.empty(1 << 40, dtype=cl.float32, device="cuda")   # 4 TiB
    st = clcuda.memory_stats()
    assert st["num_ooms"] >= 1
    x = cl.full((1000,), 2.0, device="cuda")
    assert cl.sqrt(x * 2.0).tolist()[:2] == [2.0, 2.0]


def test_mixing_devices_raises():
    a = cl.ones(10)
    b = cl.ones(10, device="cuda")
    with pytest.raises((ValueError, RuntimeError), match="device"):
        a + b
    with pytest.raises((ValueError, RuntimeError)):
        cl.jit(lambda p, q: p * q)(a, b)


def test_allocator_reuses_blocks_and_empty_cache():
    clcuda.synchronize()
    s0 = clcuda.memory_stats()
    for _ in range(20):
        t = cl.empty(1 << 20, dtype=cl.float32, device="cuda")
        del t
    s1 = clcuda.memory_stats()
    assert s1["cache_hits"] - s0["cache_hits"] >= 19
    clcuda.empty_cache()
    s2 = clcuda.memory_stats()
    assert s2["reserved_bytes"] <= s1["reserved_bytes"]


def _run_child(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(env_extra)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(cl.__file__)))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)


_CHILD = """
import json, castlab as cl, castlab.cuda as cc
x = cl.full((4096,), 1.25, device="cuda")
y = cl.jit(lambda v: cl.silu(v) * 3.0625 + 0.0078125)(x)
print(json.dumps({"y": y[:2].tolist(), "stats": cc.kernel_cache_stats()}))
"""


def test_kernel_disk_cache_second_process_and_corrupt_file(tmp_path):
    env = {"CASTLAB_CACHE_DIR": str(tmp_path)}
    r1 = _run_child(_CHILD, env)
    assert r1.returncode == 0, r1.stderr
    o1 = json.loads(r1.stdout.strip().splitlines()[-1])
    assert o1["stats"]["compiles"] >= 1
    files = [p for p in tmp_path.iterdir() if p.suffix == ".bin"]
    assert files
    r2 = _run_child(_CHILD, env)
    o2 = json.loads(r2.stdout.strip().splitlines()[-1])
    assert o2["stats"]["compiles"] == 0 and o2["stats"]["disk_hits"] >= 1
    assert o2["y"] == o1["y"]
    for p in files:                            # truncate / corrupt every entry
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
    r3 = _run_child(_CHILD, env)
    assert r3.returncode == 0, r3.stderr
    o3 = json.loads(r3.stdout.strip().splitlines()[-1])
    assert o3["stats"]["compiles"] >= 1 and o3["stats"]["disk_rejects"] >= 1
    assert o3["y"] == o1["y"]
    report(test="disk_cache", first=o1["stats"], second=o2["stats"], corrupt=o3["stats"])


def test_async_error_names_kernel_at_sync():
    code = """
    import castlab as cl, castlab.cuda as cc
    bad = cl._C.from_pointer(0x10, [1 << 20], [1], "float32", None, False, "cuda:0")
    y = cl.exp(bad)          # launches; the fault shows up later
    try:
        cc.synchronize()
        print("NO ERROR")
    except RuntimeError as e:
        print("ERR", e)
    """
    r = _run_child(code, {})
    assert "ERR" in r.stdout and "castlab_k" in r.stdout, r.stdout + r.stderr


def test_approx_division_equals_the_div_full_instruction():
    """Math(division="approx") (the inductor preset: Triton's fp32 `/`) writes out PTX's
    div.full.f32 as ptxas expands it, so that a divisor shared by many quotients is scaled
    and inverted once. Its bits equal the instruction's (compiled by CuPy, not castlab),
    exactly, for every bf16 pattern and random fp32 bits as dividends over divisors at
    and around the expansion's thresholds (2^-126, 2^126), zeros, subnormals, infinities
    and NaN; divisors along a row (broadcast) and one per element."""
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(21)
    a = np.concatenate([np.arange(65536, dtype=np.uint32) << 16,
                        rng.integers(0, 2**32, 65536, dtype=np.uint64).astype(np.uint32)])
    edge = np.array([0x00800000, 0x7E800000, 0x7F000000], dtype=np.uint32)  # 2^-126, 2^126, 2^127
    b = np.concatenate([
        edge, edge - 1, edge + 1, [0, 1, 2, 0x007FFFFF, 0x00400000, 0x3F800000, 0x40400000,
                                   0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x7FA00001, 0x34000000],
        rng.integers(0, 2**32, 40, dtype=np.uint64).astype(np.uint32)]).astype(np.uint32)
    b = np.concatenate([b, b | 0x80000000])  # both signs
    af = a.view(np.float32)[:, None]
    bf = b.view(np.float32)[None, :]
    k = cupy.RawKernel(r"""
    extern "C" __global__ void div_full(const float* a, const float* b, float* c, long long n,
                                         int m, int per_row) {
      const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
      if (i >= n) return;
      float r;
      asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a[i / m]), "f"(b[per_row ? i % m : i]));
      c[i] = r;
    }""", "div_full")
    f = cl.jit(lambda x, y: x / y, policy="fused", math="inductor")
    full_b = np.ascontiguousarray(np.broadcast_to(bf, (af.shape[0], bf.shape[1])))
    for per_row, bb in ((1, bf), (0, full_b)):
        ga, gb = cupy.asarray(af.ravel()), cupy.asarray(bb.ravel())
        n = af.shape[0] * bf.shape[1]
        want = cupy.empty(n, dtype=cupy.float32)
        k(((n + 255) // 256,), (256,), (ga, gb, want, np.int64(n), np.int32(bf.shape[1]),
                                        np.int32(per_row)))
        got = f(cl.from_numpy(af).cuda(), cl.from_numpy(np.ascontiguousarray(bb)).cuda())
        w = cupy.asnumpy(want).view(np.uint32)
        g = bits_np(got)
        bad = np.flatnonzero(g != w)
        assert bad.size == 0, (per_row, bad.size, [(hex(a[i // bf.shape[1]]),
                                                    hex(b[i % bf.shape[1]]), hex(g[i]), hex(w[i]))
                                                   for i in bad[:5]])


def test_approx_division_contracts_into_the_add_as_triton_does():
    """Triton's fp32 ``/`` is div.full.f32, which ptxas expands into a product by the
    divisor's reciprocal and contracts into an add that uses the quotient once (Liger's
    RMSNorm: ``sum / n_cols + eps``): castlab's ``div_add`` under Math(division="approx",
    fma=True) equals a Triton kernel for a/b + c, a/b - c and c - a/b, each in its own
    kernel, with random fp32 operands, divisors at the expansion's thresholds, zeros,
    infinities and NaN. A quotient used twice (q = a/b; q + c and q - c in one kernel):
    castlab contracts neither; ptxas contracted one of the two (H200, 2026-12-05:
    186,652 of 2 x 2^20 elements differed, one output's worth). Not modelled: that
    count is reported, not asserted."""
    pytest.importorskip("triton")
    import triton
    import triton.language as tl

    @triton.jit
    def k(A, B, C, O1, O2, N, MODE: tl.constexpr, BLOCK: tl.constexpr):
        off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = off < N
        a = tl.load(A + off, mask=m)
        b = tl.load(B + off, mask=m)
        c = tl.load(C + off, mask=m)
        if MODE == 0:
            tl.store(O1 + off, a / b + c, mask=m)
        elif MODE == 1:
            tl.store(O1 + off, a / b - c, mask=m)
        elif MODE == 2:
            tl.store(O1 + off, c - a / b, mask=m)
        else:
            q = a / b
            tl.store(O1 + off, q + c, mask=m)
            tl.store(O2 + off, q - c, mask=m)

    rng = np.random.default_rng(33)
    n = 1 << 20
    a = rng.standard_normal(n).astype(np.float32) * np.float32(1000)
    b = rng.uniform(1, 9000, n).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32)
    special = np.array([0, -0.0, np.inf, -np.inf, np.nan, 2.0**-126, 2.0**126, 2.0**127,
                        1e-40, 3.0, 896.0, 1000.0], dtype=np.float32)
    a[:special.size], b[special.size:2 * special.size], c[:special.size] = special, special, special
    ta, tb, tc = (torch.from_numpy(v).cuda() for v in (a, b, c))
    xs = [cl.from_dlpack(t) for t in (ta, tb, tc)]
    fns = (lambda x, y, z: x / y + z, lambda x, y, z: x / y - z, lambda x, y, z: z - x / y,
           lambda x, y, z: (lambda q: (q + z, q - z))(x / y))
    counts = {}
    for mode, fn in enumerate(fns):
        o1, o2 = torch.empty_like(ta), torch.empty_like(ta)
        k[(n // 1024,)](ta, tb, tc, o1, o2, n, MODE=mode, BLOCK=1024)
        f = cl.jit(fn, policy="fused", math="inductor")
        got = f(*xs)
        pairs = zip(got, (o1, o2)) if mode == 3 else [(got, o1)]
        counts[mode] = 0
        for g, want in pairs:
            g = torch.from_dlpack(g)
            same = (g.view(torch.int32) == want.view(torch.int32)) | (g.isnan() & want.isnan())
            counts[mode] += int((~same).sum())
        if mode < 3:
            assert "kept exact for the fma of t" in str(f.trace(*xs))
    report(test="approx_division_contraction", differ=counts)
    assert (counts[0], counts[1], counts[2]) == (0, 0, 0), counts
    # the two-rounding form differs somewhere: the check can fail
    o1 = torch.empty_like(ta)
    k[(n // 1024,)](ta, tb, tc, o1, o1, n, MODE=0, BLOCK=1024)
    two = (ta / tb) + tc
    assert int((two.view(torch.int32) != o1.view(torch.int32)).sum()) > 0


def test_cuda_fast_math_variant_uses_intrinsics():
    """impl="cuda_fast" computes exp with CUDA's __expf: not the precise expf, but within
    the programming guide's bound (2 + floor(|1.173 x|) ulp)."""
    rng = np.random.default_rng(5)
    xs = rng.uniform(-10, 10, 1 << 20).astype(np.float32)
    x = cl.from_numpy(xs).cuda()
    precise = cl.exp(x).cpu().numpy()
    with cl.use_math(cl.Math(impl="cuda_fast")):
        fast = cl.exp(x).cpu().numpy()
    clcuda.synchronize()
    diff = np.abs(fast.view(np.int32).astype(np.int64) - precise.view(np.int32).astype(np.int64))
    assert (diff > 0).sum() > 1000, "cuda_fast should differ from the precise expf"
    assert diff.max() <= 2 + int(1.173 * 10) + 2  # vs the precise expf (itself <= 2 ulp)


# ---------------------------------------------------------------- programmatic dependent launch

def test_programmatic_launch_on_sm90_and_its_switch():
    """Elementwise kernels launch with programmatic stream serialization on sm_90+ (they
    are scheduled before the kernel ahead of them has completed, and wait for it in their
    first instruction); CASTLAB_CUDA_PDL=0 launches them plainly."""
    major = torch.cuda.get_device_capability(0)[0]
    assert cl._C._cuda_pdl(0) is (major >= 9)
    r = _run_child("import castlab as cl; print(cl._C._cuda_pdl(0))", {"CASTLAB_CUDA_PDL": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


@pytest.mark.parametrize("n", [1000, 1 << 16, 1 << 22])
def test_back_to_back_kernels_see_each_others_writes(n):
    """A chain of dependent kernels queued back to back: each reads what the one before
    wrote, and the allocator hands each output the block the step before last freed, so
    a kernel that started early (programmatic launch) and did not wait would read stale
    values or overwrite a buffer still being read. 200 steps, bits equal to PyTorch
    running the same fp32 ops (each op rounds once, on both)."""
    rng = np.random.default_rng(n)
    x0 = rng.uniform(-2, 2, n).astype(np.float32)
    c, t = cl.from_numpy(x0).cuda(), torch.from_numpy(x0).cuda()
    for i in range(200):
        s = 0.5 + (i % 7) * 0.125
        c = c * s + 0.25 if i % 3 else (c - 1.0) * s
        t = t * s + 0.25 if i % 3 else (t - 1.0) * s
    got = c.cpu().numpy().view(np.uint32)
    want = t.cpu().numpy().view(np.uint32)
    assert np.array_equal(got, want), int((got != want).sum())


def test_programmatic_launch_after_torch_work_and_other_streams():
    """castlab's kernels after a torch kernel on another stream (castlab.torch's handoff
    waits on an event, which programmatic launch must not skip) and torch reading
    castlab's output after it: every value is the producer's."""
    n = 1 << 20
    for _ in range(20):
        t = torch.full((n,), 3.0, device="cuda")
        torch.cuda._sleep(200_000)  # the producer is still running when castlab queues
        t.mul_(2.0)
        c = cl.from_dlpack(t)  # castlab's stream waits for torch's work so far
        y = c * 0.5 + 1.0
        back = torch.from_dlpack(y)
        assert torch.equal(back, torch.full((n,), 4.0, device="cuda"))


def test_inductor_neg_equals_torch_compile():
    """torch.compile's neg is Triton's unary minus, 0 - x: +0 stays +0 where PyTorch's
    eager neg gives -0. Math("inductor") computes it so (neg="zero_minus"): its bits
    equal torch.compile's for every bf16 and fp16 pattern, random fp32 bits and fp64
    specials, in a chain (rotate_half's -x2 times a factor) and alone."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    cases = [np.arange(65536, dtype=np.uint16).view(np.float16),
             rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(
                 np.float32),
             np.array([0.0, -0.0, 1.5, -np.inf, np.inf, 5e-324], dtype=np.float64)]
    bf = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    for fn, tfn in ((lambda x: -x, lambda x: -x), (lambda x: -x * 2.0, lambda x: -x * 2.0)):
        f = cl.jit(fn, policy="fused", math="inductor")
        tc = torch.compile(tfn, dynamic=False)
        for t in [torch.from_numpy(a).cuda() for a in cases] + [bf.cuda()]:
            want = tc(t)
            got = torch.from_dlpack(f(cl.from_dlpack(t)))
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
            same = got.view(bits) == want.view(bits)
            same |= got.isnan() & want.isnan()
            assert bool(same.all()), (t.dtype, int((~same).sum()))
        z = torch.zeros(4, device="cuda")
        assert not torch.signbit(torch.from_dlpack(f(cl.from_dlpack(z)))).any()


def test_inductor_rsqrt_equals_torch_compile():
    """torch.compile's rsqrt is Triton's libdevice.rsqrt: rsqrt.approx.ftz.f32 for fp32
    (an approximation that flushes a subnormal input to zero), the device's rsqrt for
    fp64. Math("inductor") computes it so (rsqrt="approx_ftz"): its bits equal
    torch.compile's for every bf16 pattern widened to fp32, random fp32 bits, every
    subnormal class, zeros, infinities and NaN; and for random fp64. (1 / sqrt(x), which the
    preset computed before, differed from torch.compile in about a third of RMSNorm's row
    scales: H100, 2026-12-07.)"""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    u = np.concatenate([np.arange(65536, dtype=np.uint32) << 16,
                        rng.integers(0, 2**32, 1 << 18, dtype=np.uint64).astype(np.uint32),
                        np.array([0, 1, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000,
                                  0x7FC00000, 0x3F800000], dtype=np.uint32)])
    u = np.concatenate([u, u | 0x80000000])
    f = cl.jit(lambda x: cl.rsqrt(x), policy="fused", math="inductor")
    tc = torch.compile(torch.rsqrt, dynamic=False)
    for arr in (u.view(np.float32), rng.standard_normal(1 << 16) * 10.0 ** rng.integers(
            -300, 300, 1 << 16)):
        t = torch.from_numpy(np.ascontiguousarray(arr)).cuda()
        want = tc(t).cpu().numpy()
        got = f(cl.from_numpy(np.ascontiguousarray(arr)).cuda())
        w = want.view(np.uint32 if arr.dtype == np.float32 else np.uint64)
        g = bits_np(got)
        bad = np.flatnonzero(g != w)
        assert bad.size == 0, (arr.dtype, bad.size, [(arr[i], got[i:i + 1], want[i])
                                                     for i in bad[:5]])
