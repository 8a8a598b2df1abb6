"""Where the torch_compile stack and torch.compile part on a whole Qwen2 model (issue 52):
tests/test_stacks_cuda.py's model (hidden 896, 14 heads over 2 KV heads, 2 layers, bf16,
2 x 64 tokens, random weights, RMSNorm weights not all ones), compiled by Inductor under
its default settings, against castlab's ``stack="torch_compile"``. Prints, per variant, the
differing logits and the (batch, token) rows they sit in:

- as the test runs it (labels given), and torch.compile compiled twice (its own
  reproducibility: its autotuner picks kernel configurations by timing);
- Inductor's ``deterministic=True`` (one configuration per kernel by a fixed rule, for
  torch.compile and for castlab's reading of the program alike);
- one layer; no labels; the hidden states after every layer (output_hidden_states=True);
- the Inductor placement castlab read: every generated kernel, the captured values it
  computes and, for the adds of two products, which product its fma takes.

    TORCH_LOGS=output_code python scripts/qwen2_stack_probe.py OUT_DIR 2> OUT_DIR/code.txt
"""

from __future__ import annotations

import os
import sys

import torch
import transformers
from torch._inductor import config as iconfig

import castlab.torch as ct
from castlab.torch._inductor import _SHARED, placement_for

out = sys.argv[1] if len(sys.argv) > 1 else "qwen2_probe"
os.makedirs(out, exist_ok=True)


def model(layers: int):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(hidden_size=896, num_attention_heads=14,
                                   num_key_value_heads=2, intermediate_size=4864,
                                   vocab_size=4096, num_hidden_layers=layers,
                                   max_position_embeddings=256, rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    m = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).cuda().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    ids = torch.randint(0, 4096, (2, 64), device="cuda")
    return m, ids


def rows(a, b) -> str:
    d = a != b
    if d.dim() >= 2:
        r = sorted({tuple(i[:2]) for i in d.nonzero().tolist()})
        return f"{int(d.sum())} of {d.numel()} differ, rows {r[:12]}{' ...' if len(r) > 12 else ''}"
    return f"{int(d.sum())} of {d.numel()} differ"


def case(name: str, layers: int = 2, labels: bool = True, hidden: bool = False,
         twice: bool = False, placement: bool = False) -> None:
    _SHARED.clear()
    m, ids = model(layers)
    kw = {"use_cache": False}
    if labels:
        kw["labels"] = ids
    if hidden:
        kw["output_hidden_states"] = True
    torch._dynamo.reset()
    with torch.no_grad():
        want = torch.compile(m, dynamic=False)(ids, **kw)
        if twice:
            torch._dynamo.reset()
            want2 = torch.compile(m, dynamic=False)(ids, **kw)
            print(f"  {name}: torch.compile twice: {rows(want.logits, want2.logits)}", flush=True)
    torch._dynamo.reset()
    cm = ct.capture(m, ids, kwargs=kw, attention="traced")
    got = cm.run(ids, kwargs=kw, stack="torch_compile")
    print(f"  {name}: stack vs compile: logits {rows(got.logits, want.logits)}", flush=True)
    if labels:
        print(f"    loss {float(got.loss)!r} vs {float(want.loss)!r}", flush=True)
    if hidden:
        for k, (a, b) in enumerate(zip(got.hidden_states, want.hidden_states)):
            print(f"    hidden state {k}: {rows(a, b)}", flush=True)
    if placement:
        pl = placement_for(cm, cm._flat_inputs((ids,), kw))
        with open(os.path.join(out, f"placement_{name.replace(' ', '_')}.txt"), "w") as f:
            f.write(str(pl) + "\n")
            for k in pl.kernels:
                f.write(f"kernel {k.index} {k.kind} parts={k.parts} writes={k.writes} "
                        f"loads={k.loads}\n  computes={k.computes}\n")
                for p in k.parts:
                    if p in pl.products or p in pl.tiles:
                        f.write(f"  {p}: product={pl.products.get(p)} tile={pl.tiles.get(p)}\n")
            for r in pl.rows(cm):
                f.write(f"{r}\n")
        print(f"    placement: {pl}; products {pl.products}", flush=True)


print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(), flush=True)
case("as the test", twice=True, placement=True)
with iconfig.patch(deterministic=True):
    case("deterministic", placement=True)
case("one layer", layers=1)
case("no labels", labels=False)
case("hidden states", hidden=True)
