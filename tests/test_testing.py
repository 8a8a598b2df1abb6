"""castlab.testing (issue 54): proven bounds, kernel checks, inputs, the pytest plugin and
`castlab bounds`, checked against PyTorch, NumPy and ml_dtypes computed here."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import castlab as cl
from castlab import cli
from castlab.testing import (
    KernelMismatch,
    _bounds,
    assert_kernel_matches,
    bounds,
    cache_dir,
    inputs,
)
from castlab.testing._kernel import _chunk_clean
from castlab.testing._space import elementwise_space, rope_space

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CASTLAB_BOUNDS_DIR", str(tmp_path / "bounds"))


# ------------------------------------------------------------------------------ inputs

@pytest.mark.parametrize("dt,n_finite", [("bfloat16", 65280), ("float16", 63488)])
def test_inputs_all_and_finite(dt, n_finite):
    a = inputs(dt, "all", as_="numpy")
    assert a.dtype == NP[dt] and len(a) == 65536
    assert np.array_equal(a.view(np.uint16), np.arange(65536, dtype=np.uint16))
    f = inputs(dt, "finite", as_="numpy")
    assert len(f) == n_finite and np.isfinite(f.astype(np.float64)).all()
    t = inputs(dt, "finite")
    assert isinstance(t, torch.Tensor) and t.dtype == TORCH[dt] and t.numel() == n_finite
    c = inputs(dt, "all", as_="castlab")
    assert isinstance(c, cl.Tensor) and c.numel() == 65536


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
def test_inputs_specials(dt):
    v = inputs(dt, "specials", as_="numpy").astype(np.float64)
    assert len(v) == 22
    fi = ml_dtypes.finfo(NP.get(dt, np.float32))
    for want in (0.0, 1.0, -1.0, 2.0, float(fi.max), -float(fi.max), float(fi.smallest_normal),
                 float(fi.smallest_subnormal), np.inf, -np.inf):
        assert (v == want).any(), want
    assert np.isnan(v).sum() == 2
    assert np.signbit(v[v == 0]).tolist() == [False, True]   # +0 and -0, sorted by bits


def test_inputs_sample_and_bad():
    s = inputs("float32", "sample", n=1000, seed=3, as_="numpy")
    assert len(np.unique(s.view(np.uint32))) == 1000 and np.isfinite(s).all()
    assert np.array_equal(s, inputs("float32", "sample", n=1000, seed=3, as_="numpy"))
    with pytest.raises(ValueError, match="kind='sample'"):
        inputs("float32", "all")
    with pytest.raises(ValueError, match="kind must be one of"):
        inputs("bfloat16", "every")
    with pytest.raises(ValueError, match="dtype must be one of"):
        inputs("float64")
    with pytest.raises(ValueError, match="as_ must be"):
        inputs("bfloat16", as_="jax")


# ------------------------------------------------------------------------------ spaces

def test_space_walks_the_cross_product_last_fastest():
    E = cl.numerics.Enumeration
    sp = elementwise_space(("a", "b"), cl.bfloat16,
                           inputs=[E.bits(cl.bfloat16, 0x3F80, 0x3F83),
                                   E.of(cl.tensor([2.0, 4.0], dtype=cl.bfloat16))])
    assert sp.size == 6 and not sp.exhaustive      # a range and two values: not every input
    assert elementwise_space(("a", "b"), cl.float16,
                             inputs=[E.all(cl.float16), E.finite(cl.float16)]).exhaustive
    a, b = sp.chunk_bits(0, 6)
    assert a.tolist() == [0x3F80, 0x3F80, 0x3F81, 0x3F81, 0x3F82, 0x3F82]
    assert b.tolist() == [0x4000, 0x4080] * 3
    assert sp.inputs_at(3) == {"a": (1.0078125, "0x3F81"), "b": (4.0, "0x4080")}
    x = sp.chunk(2, 5, "cpu")
    assert [t.tolist() for t in x] == [[1.0078125, 1.0078125, 1.015625], [2.0, 4.0, 2.0]]


def test_default_spaces():
    sp = elementwise_space(("a", "b"), cl.bfloat16, budget=1 << 32)
    assert sp.size == 1 << 32 and sp.exhaustive
    sp = elementwise_space(("a", "b"), cl.float16, budget=1 << 20)
    assert sp.size == 65536 * 16 and not sp.exhaustive and "16 sampled float16" in sp.description
    sp = elementwise_space(("dc", "a", "b"), cl.bfloat16, budget=1 << 22, first=1)
    assert [len(e) for e in sp.enums] == [8, 65536, 8]
    sp = rope_space(("x", "c", "s"), cl.bfloat16, budget=1 << 20)
    assert [len(e) for e in sp.enums] == [65536, 4, 4] and sp.outputs_per_input == 2


# ------------------------------------------------------------------------------ bounds

def _silu_torch(x):
    return torch.nn.functional.silu(x)


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_bounds_of_a_unary_op_against_torch_and_fp64(dt):
    b = bounds("silu", dt, cache=False)
    assert b.exhaustive and b.inputs == 65536
    x = inputs(dt, "all")
    y = _silu_torch(x).double().numpy()
    xd = x.double().numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        exact = (xd / (1.0 + np.exp(-xd))).astype(NP[dt]).astype(np.float64)
    differ = ~((y == exact) | (np.isnan(y) & np.isnan(exact)))
    assert b.rows["fp64"]["differ"] == int(differ.sum())
    assert b.rows["torch_eager"]["differ"] == 0 and b.rows["torch_eager"]["max_ulp"] == 0
    assert b.rows["fp64"]["max_ulp"] > 0.5      # eager silu is not correctly rounded
    assert b.rows["fp64"]["nan_mismatches"] == 0


def test_bounds_against_configurations_agree_with_a_torch_brute_force():
    # liger's SwiGLU against torch.compile's formula (fp32, one rounding), on a space small
    # enough to brute-force: every bf16 gate value times 16 sampled up values
    b = bounds(cl.library("liger")["swiglu"], "bfloat16", ["inductor", "torch_eager"],
               sample=1 << 20, cache=False)
    sp = elementwise_space(("a", "b"), cl.bfloat16, budget=1 << 20)
    a, bb = (torch.from_dlpack(t) for t in sp.chunk(0, sp.size, "cpu"))
    eager = _silu_torch(a) * bb
    fused = cl.jit(lambda a, b: cl.silu(a) * b).run(cl.from_dlpack(a), cl.from_dlpack(bb),
                                                    policy="fused", math="inductor")
    fused = torch.from_dlpack(fused)
    same = (eager == fused) | (eager.isnan() & fused.isnan())
    assert b.rows["inductor"]["differ"] == int((~same).sum()) > 0
    assert b.rows["torch_eager"]["differ"] == 0
    w = b.rows["inductor"]["worst_inputs"]
    assert set(w) == {"a", "b"}


def test_bounds_rope_and_backward_run_every_library():
    for lib in cl.libraries():
        for op in ("rope", "swiglu_backward", "rope_interleaved"):
            if op not in cl.library(lib).presets:
                continue
            b = bounds(cl.library(lib)[op], "float16", sample=1 << 16, cache=False)
            assert set(b.rows) == {"fp64", "torch_eager", "inductor"}
            assert b.rows["fp64"]["elements"] == b.inputs * (2 if op.startswith("rope") else
                                                             2 if op.endswith("backward") else 1)
            if lib == "torch_eager":
                assert b.rows["torch_eager"]["differ"] == 0


@pytest.mark.parametrize("subject,dt", [("silu", "float16"), ("liger:swiglu", "bfloat16"),
                                        ("liger:rope", "bfloat16"),
                                        ("transformer_engine:rope", "float16")])
def test_bounds_the_gpu_way_equal_the_host_way(subject, dt, monkeypatch):
    # inputs made with PyTorch from their indices and statistics reduced with PyTorch (what
    # a GPU runs), here on the CPU: the same rows as NumPy's
    host = bounds(subject, dt, sample=1 << 18, cache=False)
    monkeypatch.setattr(_bounds, "ON_DEVICE", True)
    dev = bounds(subject, dt, sample=1 << 18, cache=False)
    assert dev.rows == host.rows


def test_bounds_cache(tmp_path, monkeypatch):
    b1 = bounds("exp", "bfloat16", ["fp64"])
    assert not b1.cached and os.listdir(cache_dir())
    b2 = bounds("exp", "bfloat16", ["fp64"])
    assert b2.cached and b2.rows == json.loads(json.dumps(b1.rows))
    assert not bounds("exp", "bfloat16", ["fp64"], values="finite").cached
    assert not bounds("exp", "float16", ["fp64"]).cached
    assert str(b2).startswith("castlab bounds: exp in bfloat16")
    assert oct(os.stat(cache_dir()).st_mode & 0o777) == "0o700"
    monkeypatch.setenv("CASTLAB_BOUNDS_DIR", "")          # set but empty: no disk cache
    assert cache_dir() is None and not bounds("exp", "bfloat16", ["fp64"]).cached


@pytest.mark.parametrize("subj", ["rms_norm", "liger:rms_norm_gemma", "vllm:fused_add_rms_norm"])
def test_row_ops_are_refused_with_the_reason(subj):
    sub = cl.library(subj.partition(":")[0])[subj.partition(":")[2]] if ":" in subj else subj
    for call in (lambda: bounds(sub, cache=False),
                 lambda: assert_kernel_matches(lambda x, w: x, sub, mode="sample",
                                               device="cpu")):
        with pytest.raises(ValueError, match="reduces whole rows"):
            call()


def test_bounds_bad_input():
    with pytest.raises(ValueError, match="unknown chain or preset"):
        bounds("swiglo")
    with pytest.raises(ValueError, match="unknown reference"):
        bounds("silu", against=["fp65"])
    with pytest.raises(ValueError, match="dtype must be one of"):
        bounds("silu", "float64")
    with pytest.raises(ValueError, match="a library is a reference for a library preset"):
        bounds("silu", against=["liger"])
    with pytest.raises(ValueError, match="sample must be a positive int"):
        bounds("swiglu", sample=0)
    with pytest.raises(ValueError, match="twice"):
        bounds("silu", against=["fp64", "fp64"])
    if not cl.cuda.is_available():
        with pytest.raises(RuntimeError, match="no usable GPU"):
            bounds("silu", device="cuda")
        with pytest.raises(RuntimeError, match="no usable GPU"):
            assert_kernel_matches(lambda a, b: a * b, "swiglu", device="cuda")


def test_bounds_of_a_users_chain_under_a_policy():
    b = bounds(lambda x: cl.exp(x) * x, "bfloat16", ["fp64", "eager/torch_eager"],
               policy="fused", math="inductor", cache=False)
    assert b.rows["fp64"]["max_ulp"] <= 0.5 + 1e-9 or b.rows["fp64"]["differ"] < 100
    assert b.rows["eager/torch_eager"]["differ"] > 0


# ------------------------------------------------------------------ assert_kernel_matches

def _swiglu_fp32(a, b):
    return (_silu_torch(a.float()) * b.float()).to(a.dtype)


def test_kernel_matches_bit_for_bit():
    r = assert_kernel_matches(lambda a, b: _silu_torch(a) * b, "swiglu", mode="sample",
                              sample=1 << 20, device="cpu")
    assert r.passed and r.differ == 0 and r.elements == 1 << 20
    assert r.seconds_kernel > 0 and r.seconds_castlab > 0
    r = assert_kernel_matches(_swiglu_fp32, "swiglu", mode="sample", sample=1 << 18,
                              device="cpu", policy="fused", math="inductor")
    assert r.passed


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_kernel_mismatch_count_equals_a_brute_force_count(dt):
    sp = elementwise_space(("a", "b"), cl.as_dtype(dt), budget=1 << 20)
    a, b = (torch.from_dlpack(t) for t in sp.chunk(0, sp.size, "cpu"))
    want = _silu_torch(a) * b
    got = _swiglu_fp32(a, b)
    brute = int((~((want == got) | (want.isnan() & got.isnan()))).sum())
    with pytest.raises(KernelMismatch) as e:
        assert_kernel_matches(_swiglu_fp32, "swiglu", dtype=dt, mode="sample", sample=1 << 20,
                              device="cpu")
    rep = e.value.report
    assert rep.differ == brute > 0 and not rep.passed
    assert rep.closer_to_fp64 > rep.farther_from_fp64     # fp32, one rounding, is closer
    assert len(rep.first) == 5 and all("why" in f for f in rep.first)
    assert "differ from the reference" in str(e.value)
    # within a bound
    ok = assert_kernel_matches(_swiglu_fp32, "swiglu", dtype=dt, mode="sample",
                               sample=1 << 20, device="cpu", max_ulp=rep.max_ulp)
    assert ok.passed and ok.differ == brute
    with pytest.raises(KernelMismatch, match="more than max_ulp"):
        assert_kernel_matches(_swiglu_fp32, "swiglu", dtype=dt, mode="sample",
                              sample=1 << 20, device="cpu", max_ulp=rep.max_ulp - 1)


def test_kernel_check_the_gpu_way(monkeypatch):
    # the GPU's way (inputs made with PyTorch from their indices), here on the CPU
    host = None
    for on in (False, True):
        monkeypatch.setattr(_bounds, "ON_DEVICE", on)
        with pytest.raises(KernelMismatch) as e:
            assert_kernel_matches(_swiglu_fp32, "swiglu", mode="sample", sample=1 << 18,
                                  device="cpu")
        r = e.value.report
        got = (r.differ, r.max_ulp, r.closer_to_fp64, [f["inputs"] for f in r.first])
        host = host or got
        assert got == host


def test_perturbed_kernel_fails_with_the_right_count():
    def exp2_swiglu(a, b):   # sigmoid through exp2, rounded to bf16 before the product
        s = (1.0 / (1.0 + torch.exp2(-a.float() * 1.4426950408889634))).to(a.dtype)
        return (a * s) * b

    sp = elementwise_space(("a", "b"), cl.bfloat16, budget=1 << 18)
    a, b = (torch.from_dlpack(t) for t in sp.chunk(0, sp.size, "cpu"))
    want, got = _silu_torch(a) * b, exp2_swiglu(a, b)
    brute = int((~((want == got) | (want.isnan() & got.isnan()))).sum())
    with pytest.raises(KernelMismatch) as e:
        assert_kernel_matches(exp2_swiglu, "swiglu", mode="sample", sample=1 << 18,
                              device="cpu")
    assert e.value.report.differ == brute > 0


def test_kernel_exhaustive_over_every_pair_of_a_range():
    E = cl.numerics.Enumeration
    ins = [E.bits(cl.bfloat16, 0x3E00, 0x4100), E.bits(cl.bfloat16, 0xBF00, 0xC000)]
    r = assert_kernel_matches(lambda a, b: _silu_torch(a) * b, "swiglu", inputs=ins,
                              device="cpu")
    assert r.inputs == 0x300 * 0x100 and r.passed


def test_kernel_exhaustive_refuses_spaces_it_cannot_visit():
    with pytest.raises(ValueError, match="mode='sample'"):
        assert_kernel_matches(lambda *a: a[0], cl.library("liger")["rope"], device="cpu")
    with pytest.raises(ValueError, match="2\\*\\*48 tuples"):
        assert_kernel_matches(lambda *a: a, cl.library("liger")["swiglu_backward"],
                              device="cpu")
    with pytest.raises(ValueError, match="mode must be one of"):
        assert_kernel_matches(lambda a, b: a, "swiglu", mode="all", device="cpu")


@pytest.mark.parametrize("kernel,msg", [
    (lambda a, b: a.add_(1.0) * b, "changed its input 'a' in place"),
    (lambda a, b: (a * b)[:-1], "has shape"),
    (lambda a, b: (a * b).float(), "has dtype torch.float32"),
    (lambda a, b: (a * b).tolist(), "returned a list holding float, not a torch.Tensor"),
    (lambda a, b: (_ for _ in ()).throw(RuntimeError("boom")), "raised RuntimeError: boom"),
    (lambda a, b: torch.where(a == 1.0, float("nan"), _silu_torch(a) * b),
     "NaN where the reference does not"),
    (lambda a, b: (_silu_torch(a) * b, a), "returned 2 tensor"),
    (lambda a, b: (_silu_torch(a) * b).to("meta"), "is on meta, its inputs on cpu"),
])
@pytest.mark.parametrize("gpu_way", [False, True])
def test_bad_kernels_are_reported_never_passed(kernel, msg, gpu_way, monkeypatch):
    # gpu_way: the inputs made from indices with PyTorch, and the in-place check against
    # the space's broadcast views instead of a copy (what a GPU runs), here on the CPU
    monkeypatch.setattr(_bounds, "ON_DEVICE", gpu_way)
    with pytest.raises(KernelMismatch, match=msg) as e:
        assert_kernel_matches(kernel, "swiglu", mode="sample", sample=1 << 16, device="cpu")
    assert not e.value.report.passed


def test_in_place_change_of_one_value_found_the_gpu_way(monkeypatch):
    # one element of b, in the last chunk, changed in place: the broadcast-view check finds
    # it and names its input
    monkeypatch.setattr(_bounds, "ON_DEVICE", True)
    monkeypatch.setitem(_bounds._CHUNK, "cpu", 1 << 16)

    def sneaky(a, b):
        out = _silu_torch(a) * b
        if bool((a == -2.0).any()):
            b[int(torch.nonzero(a == -2.0)[3])] = 7.0
        return out

    with pytest.raises(KernelMismatch, match="changed its input 'b' in place \\(1 elements; "
                       "the first at a=-2.0") as e:
        assert_kernel_matches(sneaky, "swiglu", mode="sample", sample=1 << 18, device="cpu")
    assert not e.value.report.passed


@pytest.mark.parametrize("one_wait", [False, True])
def test_chunk_clean_both_ways(one_wait):
    a = torch.arange(12, dtype=torch.float32).to(torch.bfloat16)
    view = a.clone().view(3, 4)
    out = torch.tensor([0.0, -0.0, float("nan")], dtype=torch.bfloat16)
    assert _chunk_clean(torch, [a], [view], out, out.clone(), one_wait) == (True, True)
    neg = out.clone()
    neg[0] = -0.0                                   # +0 against -0: bits differ
    assert _chunk_clean(torch, [a], [view], out, neg, one_wait) == (True, False)
    b = a.clone()
    b[7] = 100.0
    assert _chunk_clean(torch, [b], [view], out, out.clone(), one_wait) == (False, True)


def test_space_views_equal_its_chunks():
    sp = elementwise_space(("a", "b"), cl.bfloat16, budget=1 << 20)
    inner = sp.size // len(sp.enums[0])
    for lo, hi in ((0, sp.size), (inner * 5, inner * 9)):
        a, b = (torch.from_dlpack(t) for t in sp.chunk(lo, hi, "cpu"))
        va, vb = sp.views(lo, hi, "cpu")
        assert va.stride()[0] == 1 and vb.stride()[0] == 0
        assert torch.equal(a.view(torch.int16), va.reshape(-1).view(torch.int16))
        assert torch.equal(b.view(torch.int16), vb.reshape(-1).view(torch.int16))
        g = sp.chunk(lo, hi, "cpu", on_device=True)
        assert torch.equal(torch.from_dlpack(g[1]).view(torch.int16), b.view(torch.int16))
    assert sp.views(1, inner, "cpu") is None


def test_kernel_matches_rope_and_backward():
    def rope_hf(x, c, s):
        x1, x2 = x[..., :1], x[..., 1:]
        return x * c + torch.cat([-x2, x1], dim=-1) * s

    r = assert_kernel_matches(rope_hf, "rope", mode="sample", sample=1 << 18, device="cpu")
    assert r.passed and r.elements == 2 * r.inputs

    def swiglu_bwd(dc, a, b):
        a_, b_ = a.detach().requires_grad_(), b.detach().requires_grad_()
        (_silu_torch(a_) * b_).backward(dc)
        return a_.grad, b_.grad

    r = assert_kernel_matches(swiglu_bwd, "swiglu_backward", mode="sample", sample=1 << 16,
                              device="cpu", values="finite")
    assert r.passed and r.elements == 2 * r.inputs


# ------------------------------------------------------------------------ CLI and plugin

def test_cli_bounds(tmp_path, capsys):
    out = tmp_path / "b"
    assert cli.main(["bounds", "silu", "swiglu", "--dtype", "fp16", "--libraries",
                     "torch_eager", "liger", "--sample", "65536", "--out", str(out)]) == 0
    rows = json.loads((out / "bounds.json").read_text())
    assert [r["subject"] for r in rows] == ["silu", "torch_eager:swiglu", "liger:swiglu"]
    assert (out / "bounds.csv").read_text().startswith("subject,dtype,against,max ulp")
    assert json.loads((out / "run.json").read_text())["command"] == "bounds"
    assert "castlab bounds: silu in float16" in capsys.readouterr().out
    assert cli.main(["bounds", "silu", "--out", str(out)]) == 2       # holds results
    assert cli.main(["bounds", "swiglo", "--out", str(tmp_path / "c")]) == 2
    assert cli.main(["bounds", "rope", "--against", "fp65", "--out", str(tmp_path / "d")]) == 2
    assert "unknown reference 'fp65'" in capsys.readouterr().err


def test_pytest_plugin_fixtures(tmp_path):
    test = tmp_path / "test_kernel_repo.py"
    test.write_text(textwrap.dedent("""
        import castlab as cl
        from castlab.testing import assert_kernel_matches

        def test_fixtures(castlab_bounds, castlab_inputs):
            x = castlab_inputs("bfloat16", kind="specials")
            assert x.numel() == 22
            b = castlab_bounds("silu", "bfloat16", against=["torch_eager"])
            assert b.rows["torch_eager"]["differ"] == 0
    """))
    env = dict(os.environ, CASTLAB_BOUNDS_DIR=str(tmp_path / "bounds"))
    # an installed castlab registers the plugin itself (entry point pytest11); a checkout
    # on PYTHONPATH names it
    installed = any(ep.value == "castlab.testing.plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    plug = [] if installed else ["-p", "castlab.testing.plugin"]
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        *plug, str(test)], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


def test_plugin_entry_point_is_declared():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        py = tomllib.load(f)
    assert py["project"]["entry-points"]["pytest11"] == {"castlab": "castlab.testing.plugin"}
