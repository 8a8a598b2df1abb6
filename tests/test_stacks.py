"""Stacks (issue 52): named sets of choices over a captured model, their comparison
against each other and fp64, and their alignment.

References castlab's plumbing does not write: the Hugging Face model run by PyTorch (the
hf_eager stack), PyTorch running the captured graph under ``sdpa_kernel`` (attention
backends), and reruns of stack B with the switches alignment reports (its claims)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _tiny_models import KW, logits, tiny_model  # noqa: E402

import castlab as cl  # noqa: E402
import castlab.torch as ct  # noqa: E402
from castlab.torch import _stacks  # noqa: E402
from castlab.torch._align import _switched  # noqa: E402

F = torch.nn.functional
_model, _logits = tiny_model, logits


def _mlp():
    """A captured plain MLP function: a SwiGLU and matmuls, no RoPE, norm or SDPA."""
    torch.manual_seed(3)
    w1, w2 = torch.randn(16, 32).bfloat16(), torch.randn(16, 32).bfloat16()
    x = torch.randn(4, 16).bfloat16()
    return ct.capture(lambda x: F.silu(x @ w1) * (x @ w2), x), x


# ---------------------------------------------------------------- the stacks themselves

def test_builtin_stacks_describe_every_choice_with_its_source():
    assert ct.stacks() == ["hf_eager", "torch_compile", "torch_compile_emulate", "liger", "unsloth", "vllm",
                           "transformer_engine"]
    for name in ct.stacks():
        s = ct.Stack(name)
        text = s.describe()
        assert text.splitlines()[0] == f"stack {name}"
        for f in _stacks.FIELDS:
            assert f"  {f} " in text, (name, f)
        for kind in _stacks.KERNEL_KINDS:
            if getattr(s, kind) is not None:  # every preset: the library's file and lines
                line = next(t for t in text.splitlines() if t.startswith(f"  {kind} "))
                assert "[source: https://github.com/" in line and "#L" in line, line
    assert "verified against the library on the H200" in ct.Stack("liger").describe()
    for name in ("vllm", "transformer_engine"):
        assert "from source, not run" in ct.Stack(name).describe()
    tc = ct.Stack("torch_compile")
    assert (tc.policy.name, tc.math.name, tc.stores) == ("fused", "inductor", "inductor")
    assert tc.policy.round_casts is False and ct.Stack("hf_eager").stores is None
    assert "every load of the generated code recorded" in tc.describe()
    lg = ct.Stack("liger")
    assert (lg.swiglu, lg.rope, lg.rms_norm, lg.attention) == ("liger", "liger", "liger", None)
    v = ct.Stack("vllm")
    assert v.attention == "flash" and v.rms_norm.fused is not None
    assert "fused_add_rms_norm" in v.describe()


def test_a_custom_stack():
    s = ct.Stack(base="hf_eager", rope="vllm", attention="flash")
    assert (s.name, s.rope, s.attention, s.policy.name) == (
        "hf_eager+rope=vllm+attention=flash", "vllm", "flash", "eager")
    p = cl.library("liger")["swiglu"]
    t = s.replace(swiglu=p, matmul={"allow_bf16_reduced_precision_reduction": False})
    assert t.swiglu is p and t.rope == "vllm" and s.swiglu is None
    assert "allow_bf16_reduced_precision_reduction=False" in t.describe()
    assert t != s and s == ct.Stack(base="hf_eager", rope="vllm", attention="flash")
    with pytest.raises(AttributeError, match="immutable"):
        s.rope = "liger"
    own = ct.Stack(name="mine", policy="fused", math="inductor", rope="liger")
    assert own.name == "mine" and repr(own).startswith("<castlab.torch.Stack mine")


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown stack 'ligr'; built-in stacks: hf_eager, "
                       "torch_compile, torch_compile_emulate, liger"):
        ct.Stack("ligr")
    with pytest.raises(ValueError, match="unknown kernel library 'ligr'; valid: torch_eager"):
        ct.Stack(rope="ligr")
    with pytest.raises(ValueError, match="the SDPA backends are 'math', 'flash', "
                       "'efficient', 'cudnn'"):
        ct.Stack(attention="fast")
    with pytest.raises(ValueError, match="flash_attn has no swiglu preset; libraries with "
                       "one: torch_eager, liger"):
        ct.Stack(swiglu="flash_attn")
    with pytest.raises(ValueError, match="vllm has no geglu preset; libraries with one: "
                       "torch_eager, liger"):
        ct.Stack(geglu="vllm")
    with pytest.raises(ValueError, match="liger's swiglu preset; rope takes a rope preset"):
        ct.Stack(rope=cl.library("liger")["swiglu"])
    with pytest.raises(ValueError, match="unknown matmul flag"):
        ct.Stack(matmul={"allow_tf16": True})
    with pytest.raises(ValueError, match="unknown choice"):
        ct.Stack("liger").replace(ropes="vllm")
    with pytest.raises(TypeError, match="built-in name or a castlab.torch.Stack"):
        ct.compare_stacks(lambda x: x * 2, torch.ones(2), a=3, b="liger")


# ---------------------------------------------------------------- runs

@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_hf_eager_stack_is_the_pytorch_model(name):
    m, ids, cm = _model(name)
    ref = _logits(m, ids)
    got = cm.run(ids, kwargs=KW, stack="hf_eager").logits
    assert torch.equal(got, ref), f"{int((got != ref).sum())} of {ref.numel()} differ"
    # runs without a stack are as before
    assert torch.equal(cm.run(ids, kwargs=KW, policy="eager").logits, ref)
    with pytest.raises(ValueError, match="stack= sets the policy.*drop policy"):
        cm.run(ids, kwargs=KW, stack="liger", policy="eager")


def test_stack_kernels_are_the_kernels_run():
    """A stack's kernel choices give what the same kernels= run gives."""
    m, ids, cm = _model("llama")
    got = cm.run(ids, kwargs=KW, stack="liger").logits
    want = cm.run(ids, kwargs=KW, policy="eager",
                  kernels={"swiglu": "liger", "rope": "liger", "rms_norm": "liger"}).logits
    assert torch.equal(got, want)
    s = ct.Stack(base="torch_compile", rope="unsloth", stores=None)
    got = cm.run(ids, kwargs=KW, stack=s).logits
    want = cm.run(ids, kwargs=KW, policy=s.policy, math="inductor",
                  kernels={"rope": "unsloth"}).logits
    assert torch.equal(got, want)


def test_vllm_rms_norm_is_fused_add_after_a_residual_add():
    _, _, cm = _model("llama")
    by_name = {n.name: n for n in cm.nodes}
    p = _stacks.VLLM_RMS_NORM
    picked = [p.for_region(r, by_name).fn for r in cm.regions().of("rms_norm")]
    plain = cl.library("vllm")["rms_norm"].fn
    assert picked[0] is plain  # the first layer's input norm reads the embedding
    assert all(f is p.fused.fn for f in picked[1:])  # the others a residual sum


def test_attention_backends_run_by_pytorch():
    """On the CPU PyTorch picks its flash kernel for these calls (is_causal, no mask):
    "flash" equals the default; "math" is PyTorch's math kernel, as the captured graph
    run under sdpa_kernel(MATH) gives it; efficient/cuDNN are refused, by name."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    m, ids, cm = _model("llama")
    default = cm.run(ids, kwargs=KW, stack="hf_eager").logits
    flash = cm.run(ids, kwargs=KW, stack=ct.Stack(base="hf_eager", attention="flash")).logits
    assert torch.equal(flash, default)
    with sdpa_kernel([SDPBackend.MATH]):
        want = cm.run_in_torch(ids, kwargs=KW).logits
        assert torch.equal(want, _logits(m, ids))
    math = cm.run(ids, kwargs=KW, stack=ct.Stack(base="hf_eager", attention="math")).logits
    assert torch.equal(math, want) and not torch.equal(math, default)
    for b in ("efficient", "cudnn"):
        s = ct.Stack(base="hf_eager", attention=b)
        with pytest.raises(RuntimeError, match=f"refuses attention='{b}'.*on cpu"):
            cm.run(ids, kwargs=KW, stack=s)


def test_a_cuda_refusal_of_the_chosen_attention_kernel_names_the_backend(monkeypatch):
    """Where no CUDA kernel of the chosen backend takes the model's SDPA calls (the
    memory-efficient kernel with grouped-query heads), PyTorch says only "No available
    kernel. Aborting execution."; the stack's error names the backend and the model.
    Another RuntimeError passes through as it is."""
    _, ids, cm = _model("llama")
    s = ct.Stack(base="hf_eager", attention="flash")

    def refuse(*a, **k):
        raise RuntimeError("No available kernel. Aborting execution.")
    monkeypatch.setattr(cm, "execute", refuse)
    with pytest.raises(RuntimeError, match=r"refuses attention='flash' \(SDPBackend.FLASH_"
                       r"ATTENTION\).*No available kernel"):
        cm.run(ids, kwargs=KW, stack=s)

    def boom(*a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(cm, "execute", boom)
    with pytest.raises(RuntimeError, match="^boom$"):
        cm.run(ids, kwargs=KW, stack=s)


def test_matmul_flags_are_restored_even_on_error():
    mm = torch.backends.cuda.matmul
    before = (mm.allow_bf16_reduced_precision_reduction, mm.allow_tf32)
    _, ids, cm = _model("llama")
    flags = {"allow_bf16_reduced_precision_reduction": not before[0], "allow_tf32": True}
    s = ct.Stack(base="hf_eager", matmul=flags)
    seen = []
    with _stacks.matmul_flags(s.matmul):
        seen.append((mm.allow_bf16_reduced_precision_reduction, mm.allow_tf32))
    assert seen == [(not before[0], True)]
    cm.run(ids, kwargs=KW, stack=s)
    assert (mm.allow_bf16_reduced_precision_reduction, mm.allow_tf32) == before
    with pytest.raises(RuntimeError, match="refuses"):
        cm.run(ids, kwargs=KW, stack=s.replace(attention="efficient"))
    assert (mm.allow_bf16_reduced_precision_reduction, mm.allow_tf32) == before


# ---------------------------------------------------------------- inert choices

def test_inert_choices_are_reported():
    cm, x = _mlp()
    r = ct.compare_stacks(cm, x, a="vllm", b="hf_eager")
    assert dict(r.inert["a"]) == {
        "rope": "the model has no rope instance", "rms_norm": "the model has no rms_norm "
        "instance", "attention": "the model makes no scaled_dot_product_attention call"}
    assert "inert in vllm (A): rope" in str(r)
    with pytest.warns(RuntimeWarning, match="rope inert"):
        cm.run(x, stack="liger")
    _, ids, gemma = _model("gemma")
    p = _stacks.plan("liger", gemma)
    assert p.inert == [("swiglu", "the model has no swiglu instance")]
    assert p.kernels["rms_norm"].op == "rms_norm_gemma"  # Gemma's 1 + w form
    assert ("rms_norm", "vllm's rms_norm preset does not fit this model's rms_norm (it "
            "takes rms_norm_gemma)") in _stacks.plan("vllm", gemma).inert
    al = ct.compare_stacks(gemma, ids, a="liger", b="unsloth", align=True).alignment
    assert al.inert == [("swiglu", "the model has no swiglu instance")]
    assert "swiglu" not in al.fields


# ---------------------------------------------------------------- compare and align

def _check_sets(cm, ids, r):
    """Every set the alignment reports makes B's logits equal A's when B is rerun with
    those switches, and B alone does not."""
    a = cm.run(ids, kwargs=KW, stack=r.a).logits
    assert not torch.equal(cm.run(ids, kwargs=KW, stack=r.b).logits, a)
    for s in r.alignment.sets:
        got = cm.run(ids, kwargs=KW, stack=_switched(r.b, r.a, s)).logits
        assert torch.equal(got, a), s


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_liger_vs_hf_eager_alignment(name):
    _, ids, cm = _model(name)
    r = ct.compare_stacks(cm, ids, a="liger", b="hf_eager", align=True)
    s = r.summary
    assert s["logits_differ"] > 0 and s["mean_kl"] > 0 and s["max_abs_delta"] > 0
    assert r.first is not None and r.first["differ"] > 0
    assert r.label_source.startswith("next input ids") and s["tokens"] == 2 * 15
    al = r.alignment
    assert set(al.fields) == {"swiglu", "rope", "rms_norm"}
    assert al.sets and all(set(x) <= {"swiglu", "rope", "rms_norm"} for x in al.sets)
    _check_sets(cm, ids, r)
    assert "logits now bit-identical; KL" in al.summary() and "-> 0" in al.summary()
    assert {e.verdict for e in al.effects} <= {"toward fp64", "away from fp64",
                                               "no change vs fp64"}
    assert ct.compare_stacks(cm, ids, a="liger", b="hf_eager", align=True,
                             prune=False).alignment.sets == al.sets


@pytest.mark.inductor  # the torch_compile stack compiles the model (its stores)
def test_alignment_without_a_small_set_ranks_the_choices():
    """torch_compile against liger: six choices differ; the pruned search agrees with
    the full one, and every choice gets its KL shares and fp64 verdict."""
    _, ids, cm = _model("llama")
    r = ct.compare_stacks(cm, ids, a="torch_compile", b="liger", align=True)
    full = ct.compare_stacks(cm, ids, a="torch_compile", b="liger", align=True, prune=False)
    al = r.alignment
    assert al.sets == full.alignment.sets
    assert al.pruned > 0 and full.alignment.pruned == 0
    assert len(al.effects) == len(al.fields) == 6
    if not al.sets:
        assert al.all_equal is True and "KL shares" in al.summary()
    _check_sets(cm, ids, r)


def test_a_stack_against_itself_is_zero_everywhere():
    _, ids, cm = _model("qwen2")
    r = ct.compare_stacks(cm, ids, a="liger", b=ct.Stack("liger"), align=True)
    s = r.summary
    assert (s["logits_differ"], s["max_abs_delta"], s["mean_kl"], s["flips"]) == (0, 0, 0, 0)
    assert r.first is None and all(row["differ"] == 0 for row in r.nodes)
    assert all(row["rel_diff"] == 0 for row in r.layers)
    assert r.alignment.sets == [()] and r.alignment.fields == []
    assert "the runs never differ" in str(r)


@pytest.mark.inductor  # the torch_compile stack compiles the model (its stores)
def test_labels_plots_and_reprs():
    m, ids, cm = _model("llama")
    labels = torch.randint(0, 128, (2, 16))
    labels[0, :4] = -100
    r = ct.compare_stacks(m, ids, a="hf_eager", b="torch_compile", labels=labels)
    assert r.summary["tokens"] == 28 and r.label_source == "given labels"
    want = _logits(m, ids).double().log_softmax(-1)
    mask = labels != -100
    lp = want.gather(-1, labels.clamp(min=0)[..., None])[..., 0][mask]
    assert torch.equal(torch.from_numpy(r.tokens["lp_a"]), lp)  # hf_eager: the model's
    html = r._repr_html_()
    assert "<table" in html and "per layer" in html
    text = str(r)
    assert "first difference" in text and "closer to fp64" in text
    assert len(r.to_frame()) == 28 and "node" in r.to_frame("nodes").columns
    from matplotlib.figure import Figure

    assert isinstance(r.plot_layers(), Figure) and isinstance(r.plot_logprob_hist(), Figure)
    assert [x["layer"] for x in r.layers][:3] == ["model", "model.layers.0", "model.layers.1"]


def test_bad_inputs_are_clear_errors():
    m, ids, cm = _model("llama")
    with pytest.raises(ValueError, match=r"labels have shape \[2, 15\].*must be \[2, 16\]"):
        ct.compare_stacks(cm, ids, labels=ids[:, 1:])
    with pytest.raises(TypeError, match="integer torch.Tensor"):
        ct.compare_stacks(cm, ids, labels=ids.float())
    with pytest.raises(ValueError, match="token id 500 is outside .* vocabulary of 128"):
        ct.compare_stacks(cm, ids, labels=torch.full((2, 16), 500))
    with pytest.raises(ValueError, match="captured for torch.int64 \\[2, 16\\]"):
        ct.compare_stacks(cm, ids[:, :8])  # another model's or tokenizer's inputs
    with pytest.raises(TypeError, match="must be a CapturedModel"):
        ct.compare_stacks(3, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(IndexError):  # ids of a larger vocabulary reach the embedding
            ct.compare_stacks(m, torch.full((2, 16), 1000))
