"""castlab.numerics.attribute: the factor behind every differing bit, and its fp64 verdict."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import castlab as cl
import castlab.numerics as nm
from castlab import study

torch = pytest.importorskip("torch")


def swiglu_x(x):
    a, b = cl.chunk(x, 2, dim=-1)
    return cl.silu(a) * b


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + cl.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def _rope_inputs(dt, seed=0):
    x = cl.randn(2, 4, 64, 32, seed=seed, dtype=dt)
    ang = cl.rand(1, 1, 64, 32, seed=seed + 1, dtype=cl.float64) * 6.0
    return x, cl.cos(ang).astype(dt), cl.sin(ang).astype(dt)


def test_tie_case_inductor_vs_transformer_engine_is_the_silu_formula():
    torch.manual_seed(1234)
    x = cl.from_dlpack(torch.rand(512, 256).to(torch.bfloat16))
    att = nm.attribute(cl.jit(swiglu_x), (x,), a=("fused", "inductor"),
                       b=("fused", "transformer_engine"))
    assert len(att.indices) == 1
    e = att.element(0)
    assert e["index"] == (456, 127)
    assert e["factors"] == "math silu"
    assert e["verdict"] == "tie"
    assert "1 of 65,536 elements: 1 by math silu, 1 tie at a midpoint" in att.verdict
    # the factor names the node it acts on: the silu node
    f = att.factors[0]
    assert (f.a, f.b) == ("div", "mul_sigmoid") and [att.node_labels[k].split()[1]
                                                      for k in f.nodes] == ["silu"]
    # inductor's GPU-only factors have no effect on the CPU and are said to be inert, as are
    # the RMSNorm cast placement and the reduction order (no rms_norm, no sum in SwiGLU)
    if str(x.device) == "cpu":
        assert {g.key for g in att.inert} == {"sigmoid", "division", "rsqrt", "neg",
                                            "rms_norm", "reduction", "pow"}
    assert "attribution: math silu (tie)" in str(att.explain(0))


def test_swiglu_eager_vs_fused_is_the_rounding_after_silu():
    x = cl.randn(256, 512, seed=3, dtype=cl.bfloat16)
    att = nm.attribute(cl.jit(swiglu_x), (x,), a="eager", b="fused")
    assert att.unexplained == 0 and len(att.indices) > 1000
    (s, g), = att._groups()
    assert att.set_name(s) == "rounding after silu (t2)"
    assert g["toward"] > 0.95 * g["n"]  # fused closer for the large majority
    rest = g["n"] - g["toward"]
    assert rest > 0 and (f"{g['away']:,} away from fp64" in att.verdict
                         or f"{g['tie']:,} tie" in att.verdict)
    df = att.summary()
    assert list(df["elements"]) == [len(att.indices)]
    assert "<table" in att._repr_html_()


def test_rope_bf16_is_rounding_after_the_products():
    x, c, s = _rope_inputs(cl.bfloat16)
    att = nm.attribute(cl.jit(rope), (x, c, s), a="eager", b="fused")
    assert att.unexplained == 0
    names = {att.set_name(s) for s, _ in att._groups()}
    assert all("rounding after mul" in n for n in names), names
    # neg is exact: it never explains anything
    assert not any("neg" in n for n in names)


def test_rope_fp32_eager_vs_inductor_is_fma_contraction():
    """In fp32 the eager policy's rounding after mul is a no-op, but it ends the kernel
    and so prevents the contraction: the pair is the minimal set."""
    x, c, s = _rope_inputs(cl.float32)
    att = nm.attribute(cl.jit(rope), (x, c, s), a=("eager", "torch_eager"),
                       b=("fused", "inductor"))
    assert att.unexplained == 0 and len(att.indices) > 0
    for s_, _ in att._groups():
        name = att.set_name(s_)
        assert "math fma" in name and "kernel boundary after mul" in name, name


def test_interacting_factors_are_reported_as_a_pair():
    a = cl.randn(1 << 14, seed=5)
    b = cl.randn(1 << 14, seed=6)
    c = cl.randn(1 << 14, seed=7)
    f = cl.jit(lambda a, b, c: a * b + c)
    att = nm.attribute(f, (a, b, c), a=("eager", "torch_eager"), b=("fused", "inductor"))
    assert len(att.indices) > 0 and att.unexplained == 0
    (s, g), = att._groups()
    keys = {att.factors[i].key for i in s}
    assert keys == {"fma", 0}  # fma and the kernel boundary after t0 = mul: neither alone


def _assert_every_pair_explained(name, dt, device):
    """Every pair of {eager, fused} x {four presets}: no element left unexplained."""
    ch = study.CHAINS[name]
    fn = cl.jit(ch.fn)
    args = ch.make_inputs(ch.quick_shape, dt, 1, "normal", 1.0, device)
    configs = [(p, m) for p in ("eager", "fused")
               for m in ("torch_eager", "inductor", "transformer_engine", "portable")]
    for ca, cb in itertools.combinations(configs, 2):
        try:
            att = nm.attribute(fn, args, a=ca, b=cb)
        except ValueError as e:
            assert "differ in no factor" in str(e)
            continue
        assert att.unexplained == 0, (name, dt, ca, cb, att.verdict)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "logprobs"
                                  else n for n in sorted(study.CHAINS)])  # logprobs: ~11 s
def test_every_study_chain_and_pair_is_explained(name):
    for dt in (cl.bfloat16, cl.float32):
        _assert_every_pair_explained(name, dt, "cpu")


def test_stochastic_rounding_is_explained():
    """An explicit stochastic rounding after the output node and the output store's draw
    different random streams: that rounding is a factor of its own there."""
    sw = cl.jit(lambda a, b: cl.silu(a) * b)
    a = cl.randn(4096, seed=0, dtype=cl.bfloat16)
    b = cl.randn(4096, seed=1, dtype=cl.bfloat16)
    e = cl.Policy("eager", rounding="stochastic", seed=0)
    f = cl.Policy("fused", rounding="stochastic", seed=0)
    att = nm.attribute(sw, (a, b), a=e, b=f)
    assert len(att.indices) > 0 and att.unexplained == 0
    assert any("after mul (t1)" in str(x) for x in att.factors)


def test_bad_inputs():
    x = cl.randn(8, 8, seed=0, dtype=cl.bfloat16)
    f = cl.jit(swiglu_x)
    with pytest.raises(ValueError, match="differ in no factor"):
        nm.attribute(f, (x,), a="eager", b="eager")
    with pytest.raises(ValueError, match="float64"):
        nm.attribute(f, (x,), a="eager", b="fused", ref=cl.zeros(8, 4, dtype=cl.float32))
    with pytest.raises(ValueError, match="shape"):
        nm.attribute(f, (x,), a="eager", b="fused", ref=cl.zeros(8, 5, dtype=cl.float64))
    with pytest.raises(ValueError, match="ref must be"):
        nm.attribute(f, (x,), a="eager", b="fused", ref="fp32")
    with pytest.raises(ValueError, match="one dtype"):
        nm.attribute(f, (x,), a="eager", b="fp64")
    with pytest.raises(IndexError):
        nm.attribute(f, (x,), a="eager", b="fused", output=3)


def test_gradient_graphs_attribute_too():
    sw = cl.jit(lambda a, b: cl.silu(a) * b)
    a = cl.randn(4096, seed=0, dtype=cl.bfloat16)
    b = cl.randn(4096, seed=1, dtype=cl.bfloat16)
    dy = cl.randn(4096, seed=2, dtype=cl.bfloat16)
    att = nm.attribute(sw.backward_fn(), (a, b, dy), a="eager", b="fused", output=0)
    assert att.unexplained == 0 and len(att.indices) > 0
    names = " ".join(att.set_name(s) for s, _ in att._groups())
    assert "rounding after mul" in names  # dy * b rounded before silu_backward
    assert np.all(att.set_id >= 0)


# ---------------------------------------------------------------- on the GPU

cuda = pytest.mark.skipif(not cl.cuda.is_available(), reason="no CUDA GPU for castlab")


def _report(**kw):
    import json
    import os

    path = os.environ.get("CASTLAB_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(kw) + "\n")


@pytest.mark.cuda
@cuda
def test_gpu_rope_fp32_eager_vs_inductor_is_fma_and_bf16_is_rounding():
    x, c, s = (t.to("cuda") for t in _rope_inputs(cl.float32))
    att = nm.attribute(cl.jit(rope), (x, c, s), a=("eager", "torch_eager"),
                       b=("fused", "inductor"))
    names = [att.set_name(s_) for s_, _ in att._groups()]
    _report(test="attribution_rope_fp32_gpu", verdict=att.verdict, sets=names)
    assert att.unexplained == 0 and len(att.indices) > 0
    assert all("math fma" in n for n in names), names
    xb, cb, sb = (t.astype(cl.bfloat16) for t in (x, c, s))
    att = nm.attribute(cl.jit(rope), (xb, cb, sb), a="eager", b="fused")
    names = [att.set_name(s_) for s_, _ in att._groups()]
    _report(test="attribution_rope_bf16_gpu", verdict=att.verdict, sets=names)
    assert att.unexplained == 0 and all("rounding after mul" in n for n in names), names


@pytest.mark.cuda
@cuda
def test_gpu_tie_case_and_every_preset_pair_explained():
    torch.manual_seed(1234)
    x = cl.from_dlpack(torch.rand(512, 256).to(torch.bfloat16)).to("cuda")
    att = nm.attribute(cl.jit(swiglu_x), (x,), a=("fused", "inductor"),
                       b=("fused", "transformer_engine"))
    _report(test="attribution_tie_gpu", verdict=att.verdict,
            elements=[att.element(k) for k in range(min(5, len(att.indices)))])
    assert att.unexplained == 0
    assert (456, 127) in [att.element(k)["index"] for k in range(len(att.indices))]
    for name in sorted(study.CHAINS):
        _assert_every_pair_explained(name, cl.bfloat16, "cuda")
