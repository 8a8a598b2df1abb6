"""Contract 2 of issue 17 on a GPU, for reading: the report config's 1-layer HF Qwen2
(bf16; `big`: a 2-layer Qwen2.5-0.5B-shaped one) captured, castlab fused+inductor against
torch.compile at every value castlab's regions hand to PyTorch, under the fused policy
and under fused with round_casts=False (torch.compile drops a down-cast followed by an
up-cast inside a kernel: config.emulate_precision_casts is off by default), and castlab's
trace of the model. With TORCH_LOGS=output_code, the kernels Inductor wrote (on stderr).

    TORCH_LOGS=output_code python scripts/qwen2_versus_compiled.py cuda 2> inductor_code.txt
    python scripts/qwen2_versus_compiled.py cuda big
"""

import sys

import torch
import transformers

import castlab as cl
import castlab.torch as ct

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
big = "big" in sys.argv[2:]
torch.manual_seed(0)
if big:
    cfg = transformers.Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                                   intermediate_size=4864, vocab_size=151936 // 16,
                                   max_position_embeddings=32, num_hidden_layers=2)
else:
    cfg = transformers.Qwen2Config(hidden_size=56, num_attention_heads=28, num_key_value_heads=4,
                                   intermediate_size=112, vocab_size=2,
                                   max_position_embeddings=32, num_hidden_layers=1)
cfg._attn_implementation = "sdpa"
m = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).to(device).eval()
ids = torch.randint(0, cfg.vocab_size, (1, 32), device=device)
kw = {"use_cache": False}
cm = ct.capture(m, ids, kwargs=kw, attention="traced")  # the graph torch.compile traces
if not big:
    print(cm.trace(ids, kwargs=kw, policy="fused", math="inductor"))
emulate = {"options": {"emulate_precision_casts": True}}
for head, pol, mth, opts in (
        ("castlab fused", "fused", "inductor", None),
        ("castlab fused, round_casts=False", cl.Policy("fused", round_casts=False), "inductor",
         None),
        ("castlab eager vs torch.compile with emulate_precision_casts", "eager", "inductor",
         emulate),
        ("castlab eager/torch_eager vs torch.compile with emulate_precision_casts", "eager",
         "torch_eager", emulate)):
    print(f"\n=== {head}")
    print(ct.versus_compiled(cm, ids, kwargs=kw, policy=pol, math=mth, model=m,
                             compile_options=opts))
