"""castlab.torch's recognised regions (issue 52, the foundation of stacks): a captured
model lists its SwiGLU/GeGLU, RoPE, RMSNorm, attention and matmul instances, and a run
puts a kernel-library preset in place of every instance of a kind.

References that castlab's plumbing does not write: the Hugging Face model itself, and the
same model with its MLP, apply_rotary_pos_emb and RMSNorm patched to call the preset's
own ``cl.jit`` through DLPack (PyTorch runs everything else), the way a library's kernel
patch replaces them."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _tiny_models import KW, MODELS, logits, tiny_model  # noqa: E402

import castlab as cl  # noqa: E402
import castlab.torch as ct  # noqa: E402
from castlab._presets_norm import hf_rms_norm  # noqa: E402
from castlab.presets import OpPreset  # noqa: E402

F = torch.nn.functional
_model, _logits = tiny_model, logits


# ---------------------------------------------------------------- an rms_norm preset
# Hugging Face's Llama RMSNorm (castlab's preset formula) under a policy of the test's
# choosing: a kernel that rounds once (fused) or after every op (eager)

def _rms_preset(policy: str) -> OpPreset:
    return OpPreset("test_hf", "rms_norm", hf_rms_norm, cl.Policy(policy),
                    cl.Math.preset("torch_eager"), "HF RMSNorm", "test", ("x", "weight"))


# ---------------------------------------------------------------- recognition

@pytest.mark.parametrize("name", list(MODELS))
def test_regions_of_hugging_face_models(name):
    m, ids, cm = _model(name)
    rs = cm.regions()
    glu = "geglu" if name == "gemma" else "swiglu"
    assert rs.kinds == {glu: 2, "rope": 2, "rms_norm": 5, "attention": 2, "matmul": 15}
    norms = rs.of("rms_norm")
    assert [r.module for r in norms] == [
        "model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm",
        "model.norm"]
    assert {r.params["offset"] for r in norms} == {1.0 if name == "gemma" else 0.0}
    assert {r.params["eps"] for r in norms} == {m.config.rms_norm_eps}
    assert [r.module for r in rs.of(glu)] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    for r in rs.of("rope"):  # one per apply_rotary_pos_emb call: q and k, one call each
        assert r.module.endswith("self_attn") and len(r.calls) == 2
        assert r.source.startswith(f"modeling_{name}.py:")  # not the hub wrapper's line
        assert [len(c.inputs) for c in r.calls] == [3, 3]
    for r in rs:
        assert r.source.split(":")[0] in (f"modeling_{name}.py", "activations.py"), r
    att = rs.of("attention")
    assert all(r.params.get("is_causal") for r in att)
    assert rs.of("matmul")[-1].module == "lm_head"
    assert "rms_norm" in str(rs) and rs.inert({"rope": "liger", "swiglu": None}) == []


def test_regions_fp32_llama():
    _, _, cm = _model("llama", torch.float32)
    assert cm.regions().kinds == {"swiglu": 2, "rope": 2, "rms_norm": 5, "attention": 2,
                                  "matmul": 15}


def test_regions_by_dataflow_not_module_names():
    """Plain functions, no modules: the same dataflow is found; a pattern whose inner
    value is read elsewhere is not (a kernel could not replace it)."""
    g, u = torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16()
    cm = ct.capture(lambda g, u: F.silu(g) * u, g, u)
    assert [(r.kind, r.inputs, r.outputs) for r in cm.regions()] == [
        ("swiglu", ("a_0", "a_1"), ("mul",))]  # (a function's inputs: a_0, a_1, ...)
    both = ct.capture(lambda g, u: (F.silu(g) * u, F.silu(g) + 1), g, u)
    assert "swiglu" in both.regions().kinds  # two silu nodes: the first is its own
    shared = ct.capture(lambda g, u: (lambda s: (s * u, s + 1))(F.silu(g)), g, u)
    assert "swiglu" not in shared.regions().kinds
    geglu = ct.capture(lambda g, u: F.gelu(g, approximate="tanh") * u, g, u)
    assert geglu.regions().kinds == {"geglu": 1}
    assert ct.capture(lambda g, u: F.gelu(g) * u, g, u).regions().kinds == {}


def _partial_rope(q, cos, sin):
    """Hugging Face's partial rotary (Phi, StableLM): the first R dims rotated."""
    rd = cos.shape[-1]
    q_rot, q_pass = q[..., :rd], q[..., rd:]
    rot = torch.cat((-q_rot[..., rd // 2:], q_rot[..., :rd // 2]), dim=-1)
    return torch.cat((q_rot * cos + rot * sin, q_pass), dim=-1)


def test_partial_rotary_is_one_call_on_the_whole_head():
    torch.manual_seed(1)
    q = torch.randn(1, 2, 8, 16).bfloat16()
    cos, sin = torch.randn(8, 8).bfloat16(), torch.randn(8, 8).bfloat16()
    cm = ct.capture(_partial_rope, q, cos, sin)
    (r,) = cm.regions()
    assert (r.kind, r.inputs, len(r.calls)) == ("rope", ("a_0", "a_1", "a_2"), 1)
    assert r.outputs == ("cat_1",) and "slice_3" in r.nodes  # q[..., R:] passed through
    eager = cm.run(q, cos, sin, policy="eager")
    assert torch.equal(eager, _partial_rope(q, cos, sin))
    got = cm.run(q, cos, sin, policy="eager", kernels={"rope": "torch_eager"})
    assert torch.equal(got, eager)
    liger = cm.run(q, cos, sin, policy="eager", kernels={"rope": "liger"})
    want = cl.library("liger")["rope"].jit()(*(cl.from_dlpack(t) for t in (q, cos, sin)))
    assert torch.equal(liger, torch.from_dlpack(want))


# ---------------------------------------------------------------- kernels in a run

@pytest.mark.parametrize("name,dtype", [("llama", torch.bfloat16), ("qwen2", torch.bfloat16),
                                        ("gemma", torch.bfloat16), ("llama", torch.float32)],
                         ids=["llama", "qwen2", "gemma", "llama-fp32"])
def test_torch_eager_kernels_are_the_eager_run(name, dtype):
    """PyTorch eager's formulas as kernels: every instance cut out of its castlab region
    and run as a kernel gives the logits of the plain eager run and of the model."""
    m, ids, cm = _model(name, dtype)
    ref = _logits(m, ids)
    plain = cm.run(ids, kwargs=KW, policy="eager").logits
    kernels = {"rope": "torch_eager", "rms_norm": "torch_eager"}  # Gemma's: rms_norm_gemma
    if name != "gemma":
        kernels["swiglu"] = "torch_eager"
    got = cm.run(ids, kwargs=KW, policy="eager", kernels=kernels).logits
    assert torch.equal(plain, ref)
    assert torch.equal(got, ref), f"{int((got != ref).sum())} of {ref.numel()} differ"
    segs = ct._regions.run_segments(cm, kernels, cl.Policy("eager"))
    n = 2 * 2 + 5 + (2 if name != "gemma" else 0)  # rope: q and k per layer
    assert sum(s.kind == "kernel" for s in segs) == n


def test_runs_without_kernels_are_unchanged():
    """No kernel chosen: the capture's own segments, the same bits before and after a
    run with kernels (fused splits no region: its roundings stay where they were)."""
    m, ids, cm = _model("llama")
    before = [cm.run(ids, kwargs=KW, policy=p).logits for p in ("eager", "fused")]
    segs = list(cm.segments)
    cm.run(ids, kwargs=KW, policy="fused", kernels={"swiglu": "liger", "rope": "liger",
                                                     "rms_norm": "liger"})
    for p, b in zip(("eager", "fused"), before):
        assert torch.equal(cm.run(ids, kwargs=KW, policy=p).logits, b)
        assert torch.equal(cm.run(ids, kwargs=KW, policy=p, kernels={}).logits, b)
        assert torch.equal(cm.run(ids, kwargs=KW, policy=p, kernels={"rope": None}).logits, b)
    assert cm.segments == segs and all(s.kind != "kernel" for s in cm.segments)


def _as_cl(*ts):
    return [cl.from_dlpack(t.contiguous() if t.is_neg() else t) for t in ts]


@contextlib.contextmanager
def _patched(name: str, kernels: dict):
    """The HF model's MLP activation, apply_rotary_pos_emb and RMSNorm calling the
    presets' own jit functions through DLPack (as a library's model patch does)."""
    _, _, mod, prefix = MODELS[name]
    saved = []

    def put(owner, attr, value):
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    for glu in ("swiglu", "geglu"):
        if glu in kernels:
            act = kernels[glu].jit()

            def mlp(self, x, act=act):
                y = act(*_as_cl(self.gate_proj(x), self.up_proj(x)))
                return self.down_proj(torch.from_dlpack(y))
            put(getattr(mod, prefix + "MLP"), "forward", mlp)
    if "rope" in kernels:
        rope = kernels["rope"].jit()

        def apply(q, k, cos, sin, unsqueeze_dim=1):
            c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            return tuple(torch.from_dlpack(rope(*_as_cl(t, c, s))) for t in (q, k))
        put(mod, "apply_rotary_pos_emb", apply)
    if "rms_norm" in kernels:
        p = kernels["rms_norm"]

        def rms(self, x):
            eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
            norm = cl.jit(lambda x, w: p.fn(x, w, eps=eps), policy=p.policy, math=p.math)
            return torch.from_dlpack(norm(*_as_cl(x, self.weight.detach())))
        put(getattr(mod, prefix + "RMSNorm"), "forward", rms)
    try:
        yield
    finally:
        for owner, attr, v in reversed(saved):
            setattr(owner, attr, v)


@pytest.mark.parametrize("name", list(MODELS))
def test_liger_kernels_equal_the_patched_model(name):
    """Liger's SwiGLU (Gemma: GeGLU) and RoPE (and a fused RMSNorm): the captured run with kernels
    equals PyTorch running the HF model patched to call the same presets, and differs
    from the eager model where the presets round otherwise."""
    m, ids, cm = _model(name)
    lib = cl.library("liger")
    kernels = {"rope": lib["rope"],
               "rms_norm": lib["rms_norm_gemma" if name == "gemma" else "rms_norm"]}
    kernels["geglu" if name == "gemma" else "swiglu"] = lib["geglu" if name == "gemma" else "swiglu"]
    got = cm.run(ids, kwargs=KW, policy="eager", kernels=kernels).logits
    with _patched(name, kernels):
        want = _logits(m, ids)
    assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} differ"
    assert not torch.equal(got, _logits(m, ids))
    for kind in kernels:  # each kind alone, too
        one = {kind: kernels[kind]}
        got = cm.run(ids, kwargs=KW, policy="eager", kernels=one).logits
        with _patched(name, one):
            assert torch.equal(got, _logits(m, ids)), kind


def test_a_residual_add_in_the_norms_region_is_split_off():
    """The residual add and the RMSNorm after it are one castlab region; a kernel for
    the norm splits it there (the add becomes a region output, in storage dtype)."""
    torch.manual_seed(2)
    x, r = torch.randn(4, 64).bfloat16(), torch.randn(4, 64).bfloat16()
    norm = transformers.models.llama.modeling_llama.LlamaRMSNorm(64).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))

    def block(x, r):
        h = x + r
        return norm(h) * 2, h

    cm = ct.capture(block, x, r)
    assert [s.kind for s in cm.segments] == ["region"]
    assert cm.regions().kinds == {"rms_norm": 1}
    for pol in ("eager", "fused"):
        got = cm.run(x, r, policy="eager", kernels={"rms_norm": _rms_preset(pol)})
        h = x + r
        y = torch.from_dlpack(cl.jit(lambda a, w: hf_rms_norm(a, w, eps=1e-6), policy=pol)(
            *_as_cl(h, norm.weight.detach())))
        assert torch.equal(got[0], y * 2) and torch.equal(got[1], h)
    with torch.no_grad():
        assert torch.equal(cm.run(x, r, policy="eager", kernels={
            "rms_norm": _rms_preset("eager")})[0], block(x, r)[0])


def test_fp64_ignores_kernels():
    m, ids, cm = _model("qwen2")
    ref = cm.run(ids, kwargs=KW, policy="fp64").logits
    got = cm.run(ids, kwargs=KW, policy="fp64", kernels={"swiglu": "liger"}).logits
    assert got.dtype == torch.float64 and torch.equal(got, ref)


# ---------------------------------------------------------------- bad choices

def test_bad_kernel_choices_are_clear_errors():
    m, ids, cm = _model("gemma")
    run = lambda k: cm.run(ids, kwargs=KW, policy="eager", kernels=k)  # noqa: E731
    with pytest.raises(ValueError, match=r"'swigloo' is not a region kind.*swiglu.*rms_norm"):
        run({"swigloo": "liger"})
    with pytest.raises(ValueError, match="runs in PyTorch"):
        run({"attention": "flash_attn"})
    with pytest.raises(ValueError, match=r"inert.*geglu x2"):  # Gemma has GeGLU, no SwiGLU
        run({"swiglu": "liger"})
    with pytest.raises(ValueError, match="liger's swiglu preset; rope regions take a rope"):
        run({"rope": cl.library("liger")["swiglu"]})
    with pytest.raises(ValueError, match="unknown kernel library 'ligr'"):
        run({"rope": "ligr"})
    with pytest.raises(ValueError, match="flash_attn has no swiglu"):
        _model("llama")[2].run(ids, kwargs=KW, kernels={"swiglu": "flash_attn"})
    with pytest.raises(ValueError, match="takes \\('x', 'freqs'\\)"):
        run({"rope": "transformer_engine"})
    with pytest.raises(ValueError, match="liger's rms_norm preset; rms_norm regions take a "
                       "rms_norm_gemma preset"):   # Gemma's 1 + w
        run({"rms_norm": cl.library("liger")["rms_norm"]})
    no_eps = OpPreset("test", "rms_norm_gemma", lambda x, weight: weight * x,
                      cl.Policy("eager"), cl.Math.preset("torch_eager"), "", "")
    with pytest.raises(ValueError, match=r"no 'eps' argument.*eps=1e-06"):
        run({"rms_norm": no_eps})
    with pytest.raises(TypeError, match="must be an OpPreset"):
        run({"rope": 3})
    with pytest.raises(TypeError, match="kernels must be a dict"):
        run(["rope"])
    g = torch.ones(2, 4, dtype=torch.bfloat16)
    small = ct.capture(lambda g, u: F.silu(g) * u, g, g)
    assert small.regions().inert({"rope": "liger", "swiglu": "liger"}) == ["rope"]
    with pytest.raises(ValueError, match="rope, which this model has no instance of"):
        small.run(g, g, kernels={"rope": "liger"})


def test_gradients_refuse_kernels():
    """vjp and backward run castlab's autodiff through every region; a library kernel's
    backward is its own kernel, not substituted yet: refused, not ignored."""
    g = torch.randn(2, 4)
    cm = ct.capture(lambda g, u: F.silu(g) * u, g, g)
    with pytest.raises(NotImplementedError, match="kernels= is not supported"):
        cm.vjp(g, g, kernels={"swiglu": "liger"})
    with pytest.raises(NotImplementedError, match="forward only"):
        cm.backward(g, g, grad_outputs=torch.ones(2, 4), kernels={"swiglu": "liger"})
