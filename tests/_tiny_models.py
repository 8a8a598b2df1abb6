"""Tiny random-weight Hugging Face causal LMs captured with castlab.torch, shared by the
regions and stacks tests: 2 layers, hidden 64, 4 heads, 2 KV heads, vocabulary 128, SDPA
attention, 2 x 16 token ids; each made and captured once per process."""

from __future__ import annotations

import torch
import transformers

import castlab.torch as ct

KW = {"use_cache": False}
#: name -> (config class, model class, modeling module, class-name prefix)
MODELS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              transformers.models.llama.modeling_llama, "Llama"),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              transformers.models.qwen2.modeling_qwen2, "Qwen2"),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM,
              transformers.models.gemma.modeling_gemma, "Gemma"),
}
_CACHE: dict = {}


def tiny_model(name: str, dtype=torch.bfloat16) -> tuple:
    """(model, ids, captured) of the tiny `name` model in `dtype`."""
    key = (name, dtype)
    if key not in _CACHE:
        cfg_cls, model_cls, _, _ = MODELS[name]
        torch.manual_seed(0)
        cfg = cfg_cls(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=128, num_hidden_layers=2,
                      max_position_embeddings=64, head_dim=16)
        cfg._attn_implementation = "sdpa"
        m = model_cls(cfg).to(dtype).eval()
        ids = torch.randint(0, 128, (2, 16))
        _CACHE[key] = (m, ids, ct.capture(m, ids, kwargs=KW))
    return _CACHE[key]


def logits(m, ids):
    """The PyTorch model's own logits."""
    with torch.no_grad():
        return m(ids, **KW).logits


def compiled_and_stack(m, ids, kw: dict, stack: str = "torch_compile") -> tuple:
    """(torch.compile(m)(ids, **kw) under Inductor's settings now, castlab's `stack` run of
    m captured as torch.compile traces it, the capture): the pair a stack test compares."""
    torch._dynamo.reset()
    with torch.no_grad():
        want = torch.compile(m, dynamic=False)(ids, **kw)
    torch._dynamo.reset()
    cm = ct.capture(m, ids, kwargs=kw, attention="traced")
    return want, cm.run(ids, kwargs=kw, stack=stack), cm
