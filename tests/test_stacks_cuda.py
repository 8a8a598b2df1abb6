"""The liger stack against liger-kernel itself on a GPU (issue 52): a captured Hugging Face
model run with ``stack="liger"`` gives the logits and the loss of the same model patched by
liger-kernel's own ``apply_liger_kernel_to_llama``/``_qwen2`` (rope, swiglu, rms_norm; the
loss left to Hugging Face), bit for bit.

The reference is liger-kernel 0.8.5's Triton kernels run by PyTorch (carry its wheel in
``wheels/``; scripts/gpu_check.sh installs it). Qwen2.5-0.5B's shape (hidden 896, 14 heads,
2 KV heads, MLP 4864) with 2 layers and random weights, bf16, 2 x 64 tokens."""

from __future__ import annotations

import copy
import json
import os

import pytest

import castlab.cuda as clcuda

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")]

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("torch has no CUDA", allow_module_level=True)

from _tiny_models import compiled_and_stack  # noqa: E402

import castlab.torch as ct  # noqa: E402

MODELS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              transformers.models.llama.modeling_llama, "apply_liger_kernel_to_llama"),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              transformers.models.qwen2.modeling_qwen2, "apply_liger_kernel_to_qwen2"),
}


def report(**kw):
    path = os.environ.get("CASTLAB_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(kw) + "\n")


def _model(name: str, vocab: int = 4096, tokens: int = 64):
    cfg_cls, model_cls, _, _ = MODELS[name]
    torch.manual_seed(0)
    cfg = cfg_cls(hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=vocab, num_hidden_layers=2,
                  max_position_embeddings=256, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    m = model_cls(cfg).to(torch.bfloat16).cuda().eval()
    with torch.no_grad():  # RMSNorm weights that are not all ones (a trained model's)
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    ids = torch.randint(0, vocab, (2, tokens), device="cuda")
    return m, ids


def _liger_patched(name: str, m):
    """A copy of `m` patched by liger-kernel as its users patch it, and an undo for the
    module-level names the patch replaces (apply_rotary_pos_emb, the RMSNorm and MLP
    classes), so that other tests in this process see Hugging Face's own."""
    liger = pytest.importorskip("liger_kernel.transformers")
    mod = MODELS[name][2]
    saved = dict(vars(mod))
    ref = copy.deepcopy(m)
    getattr(liger, MODELS[name][3])(rope=True, swiglu=True, rms_norm=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False, model=ref)

    def undo():
        for k in list(vars(mod)):
            if k not in saved:
                delattr(mod, k)
        for k, v in saved.items():
            setattr(mod, k, v)

    return ref, undo


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_liger_stack_equals_apply_liger_kernel(name):
    m, ids = _model(name)
    kw = {"use_cache": False, "labels": ids}
    with torch.no_grad():  # before the patch: liger patches rope module-wide
        hf = m(ids, **kw)
    ref, undo = _liger_patched(name, m)
    try:
        with torch.no_grad():
            want = ref(ids, **kw)
    finally:
        undo()
    cm = ct.capture(m, ids, kwargs=kw)
    got = cm.run(ids, kwargs=kw, stack="liger")
    n = int((got.logits != want.logits).sum())
    report(test="stacks", case=f"liger stack vs apply_liger_kernel ({name}, 2 layers, hidden "
           "896, bf16, 2x64 tokens)", logits=want.logits.numel(), logits_differ=n,
           loss_castlab=float(got.loss), loss_liger=float(want.loss),
           liger_vs_hf_logits_differ=int((want.logits != hf.logits).sum()))
    assert n == 0, f"{n} of {want.logits.numel()} logits differ"
    assert torch.equal(got.loss, want.loss), (float(got.loss), float(want.loss))
    # the check can fail: the patched model is not the unpatched one
    assert not torch.equal(want.logits, hf.logits)


@pytest.mark.parametrize("name,vocab,tokens", [
    ("llama", 4096, 64), ("qwen2", 4096, 64),
    pytest.param("qwen2", 32000, 160, marks=pytest.mark.xfail(reason=(
        "H100, 2026-12-07: 50,068 of 10,240,000 logits differ (8,278,206 without the "
        "placement), loss 10.557421 against 10.557427. 2026-12-08 (scratch probe, "
        "output_hidden_states): not the vocabulary but the tokens. 2 x 160 tokens differ at "
        "a 4,096 vocabulary too (1 row), 2 x 64 at 32,000 do not; the first layer's output "
        "is equal and the last hidden state (layer 2, then the final norm) differs in 1-3 "
        "rows (229-601 elements, Llama too): a few rows' rounding at 320 tokens, not yet "
        "found"),
        strict=False))],
    ids=["llama", "qwen2", "qwen2-vocabulary32000"])
def test_torch_compile_stack_equals_torch_compile(name, vocab, tokens):
    """The torch_compile stack (castlab.torch._inductor: roundings where Inductor's kernels
    store, read from the compiled program) against torch.compile of the model under
    Inductor's default settings: logits and loss bit for bit. The model is captured as
    torch.compile traces it (attention="traced"). The counts for the regions' own
    placement (stores=None) go to the report too. With a 32,000-entry vocabulary and 2 x
    160 tokens (318 rows, which Inductor does not split) the loss's log-softmax is
    Inductor's online softmax over tiles of 2,048 (castlab's kRedOnline); on an H100 that
    case's logits already differ (the xfail gives the counts)."""
    m, ids = _model(name, vocab=vocab, tokens=tokens)
    kw = {"use_cache": False, "labels": ids}
    want, got, cm = compiled_and_stack(m, ids, kw)
    plain = cm.run(ids, kwargs=kw, stack=ct.Stack("torch_compile", stores=None))
    n = int((got.logits != want.logits).sum())
    report(test="stacks", case=f"torch_compile stack vs torch.compile ({name}, 2 layers, "
           f"hidden 896, vocabulary {vocab}, bf16, 2x{tokens} tokens)",
           logits=want.logits.numel(), logits_differ=n,
           logits_differ_without_placement=int((plain.logits != want.logits).sum()),
           loss_castlab=float(got.loss), loss_compile=float(want.loss))
    assert n == 0, f"{n} of {want.logits.numel()} logits differ"
    assert torch.equal(got.loss, want.loss), (float(got.loss), float(want.loss))


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_torch_compile_emulate_stack_equals_torch_compile_keeping_casts(name):
    """torch_compile_emulate (castlab's eager policy) against torch.compile with Inductor's
    emulate_precision_casts=True: logits bit for bit."""
    m, ids = _model(name)
    kw = {"use_cache": False}
    from torch._inductor import config as iconfig

    torch._dynamo.reset()
    with torch.no_grad(), iconfig.patch(emulate_precision_casts=True):
        want = torch.compile(m, dynamic=False)(ids, **kw)
    torch._dynamo.reset()
    cm = ct.capture(m, ids, kwargs=kw, attention="traced")
    got = cm.run(ids, kwargs=kw, stack="torch_compile_emulate")
    n = int((got.logits != want.logits).sum())
    report(test="stacks", case=f"torch_compile_emulate stack vs torch.compile with "
           f"emulate_precision_casts ({name}, 2 layers, hidden 896, bf16, 2x64 tokens)",
           logits=want.logits.numel(), logits_differ=n)
    assert n == 0, f"{n} of {want.logits.numel()} logits differ"


@pytest.mark.parametrize("backend", ["math", "flash", "efficient", "cudnn"])
def test_attention_backend_equals_the_model_under_sdpa_kernel(backend):
    """A stack's attention choice on the GPU: the captured Llama run with
    ``attention=backend`` gives the logits of the model itself run under
    ``torch.nn.attention.sdpa_kernel([backend])``, bit for bit; where PyTorch refuses the
    backend for the model's calls on this GPU (grouped-query heads: the memory-efficient
    kernel), the stack's run is a RuntimeError that names it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    m, ids = _model("llama")
    kw = {"use_cache": False}
    cm = ct.capture(m, ids, kwargs=kw)
    s = ct.Stack(base="hf_eager", attention=backend)
    try:
        with torch.no_grad(), sdpa_kernel([b[backend]]):
            want = m(ids, **kw).logits
    except RuntimeError:
        with pytest.raises(RuntimeError, match=f"refuses attention='{backend}'"):
            cm.run(ids, kwargs=kw, stack=s)
        return
    got = cm.run(ids, kwargs=kw, stack=s).logits
    n = int((got != want).sum())
    report(test="stacks", case=f"attention={backend} vs sdpa_kernel (llama, 2 layers, hidden "
           "896, bf16, 2x64 tokens)", logits=want.numel(), logits_differ=n)
    assert n == 0, f"{n} of {want.numel()} logits differ"
