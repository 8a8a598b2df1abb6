"""Which piece of a Llama/Qwen2 decoder the torch_compile stack does not place as Inductor
does, on this device: each piece (HF's own modules, hidden 896) captured and run with
stack="torch_compile" against torch.compile of the same piece, element counts that differ,
the placement read (CSV) and Inductor's generated code for the pieces that differ.

    [DIAG_H=4096] [DIAG_MODEL=qwen2] [DIAG_ONLY=rms_norm,mlp] python scripts/diag_inductor_gpu.py OUT_DIR [cuda|cpu]

DIAG_H: the hidden size (default 896, Qwen2.5-0.5B's; 64-wide heads, 7 query heads per KV
head where that divides (else Llama-3's 8 KV heads), MLP 5.43 x hidden as Qwen2.5-0.5B's
4864 / 896): rows over 1,024 elements take
Inductor's looped reduction kernels.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import transformers
from torch._inductor.utils import run_and_get_code

import castlab.torch as ct

out = sys.argv[1] if len(sys.argv) > 1 else "diag_out"
dev = sys.argv[2] if len(sys.argv) > 2 else "cuda"
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)
H, T = int(os.environ.get("DIAG_H", "896")), 64
NH = H // 64
NKV = 2 if NH % 7 == 0 else 8 if NH % 8 == 0 else 1  # Qwen2.5-0.5B's 14/2, Llama-3's 32/8
MODEL = os.environ.get("DIAG_MODEL", "llama")  # qwen2: biased q/k/v projections
Config = transformers.Qwen2Config if MODEL == "qwen2" else transformers.LlamaConfig
cfg = Config(hidden_size=H, num_attention_heads=NH, num_key_value_heads=NKV,
             intermediate_size=H * 4864 // 896 // 64 * 64, vocab_size=4096, num_hidden_layers=1,
             max_position_embeddings=256, rms_norm_eps=1e-6)
cfg._attn_implementation = "sdpa"
M = transformers.models.qwen2.modeling_qwen2 if MODEL == "qwen2" else transformers.models.llama.modeling_llama
P = "Qwen2" if MODEL == "qwen2" else "Llama"
bf = torch.bfloat16


def mk(m):
    m = m.to(bf).to(dev).eval()
    for p in m.parameters():
        if p.dim() == 1:  # norms: weights that are not all ones
            with torch.no_grad():
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return m


x = torch.randn(2, T, H, device=dev).to(bf)
r = torch.randn(2, T, H, device=dev).to(bf)
pos = torch.arange(T, device=dev)[None].expand(2, T)
norm = mk(getattr(M, P + "RMSNorm")(H, 1e-6))
mlp = mk(getattr(M, P + "MLP")(cfg))
rot = getattr(M, P + "RotaryEmbedding")(cfg).to(dev)
attn = mk(getattr(M, P + "Attention")(cfg, 0))
layer = mk(getattr(M, P + "DecoderLayer")(cfg, 0))
q = torch.randn(2, NH, T, 64, device=dev).to(bf)
k = torch.randn(2, NKV, T, 64, device=dev).to(bf)


def rope(q, k, pos):
    cos, sin = rot(q, pos)
    return M.apply_rotary_pos_emb(q, k, cos, sin)


def add_norm(x, r):
    z = x + r
    return z, norm(z)


def attn_f(x, pos):
    pe = rot(x, pos)
    return attn(x, pe, None)[0]


def layer_f(x, pos):
    pe = rot(x, pos)
    o = layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
    return o[0] if isinstance(o, tuple) else o


def norm_mlp(x, r):
    z = x + r
    return z + mlp(norm(z))


pieces = {
    "rms_norm": (lambda x: norm(x), (x,)),
    "add_rms_norm": (add_norm, (x, r)),
    "mlp": (lambda x: mlp(x), (x,)),
    "norm_mlp": (norm_mlp, (x, r)),
    "rope": (rope, (q, k, pos)),
    "attention": (attn_f, (x, pos)),
    "decoder_layer": (layer_f, (x, pos)),
}
only = os.environ.get("DIAG_ONLY")
for name, (f, args) in pieces.items():
    if only and name not in only.split(","):
        continue
    t0 = time.time()
    try:
        torch._dynamo.reset()
        with torch.no_grad():
            want, code = run_and_get_code(torch.compile(f, dynamic=False), *args)
        torch._dynamo.reset()
        cm = ct.capture(f, *args, attention="traced")
        got = cm.run(*args, stack="torch_compile")
        plain = cm.run(*args, stack=ct.Stack("torch_compile", stores=None))
        emu = cm.run(*args, stack="torch_compile_emulate")
        ws = want if isinstance(want, tuple) else (want,)
        gs = got if isinstance(got, tuple) else (got,)
        ps = plain if isinstance(plain, tuple) else (plain,)
        es = emu if isinstance(emu, tuple) else (emu,)
        counts = [(int((g != w).sum()), int((p != w).sum()), int((e != w).sum()), w.numel())
                  for g, p, e, w in zip(gs, ps, es, ws)]
        bad = any(c[0] for c in counts)
        print(f"{name}: (stack, stores=None, emulate-vs-default, n) per output {counts} "
              f"[{time.time() - t0:.1f} s]", flush=True)
        pl = ct.inductor_stores(cm, *args)
        print(f"{name}: reduction tiles read {sorted(set(pl.tiles.values()))}", flush=True)
        pl.to_frame(cm).to_csv(f"{out}/{name}_placement.csv", index=False)
        if bad:
            with open(f"{out}/{name}_diffs.txt", "w") as fh:  # where and by how much
                for j, (g, w, e) in enumerate(zip(gs, ws, es)):
                    idx = (g != w).nonzero()[:40].tolist()
                    for i in idx:
                        t = tuple(i)
                        fh.write(f"out{j} {t} want {w[t].item()!r} got {g[t].item()!r} "
                                 f"emulate {e[t].item()!r}\n")
            with open(f"{out}/{name}_code.py", "w") as fh:
                fh.write("\n\n#####\n\n".join(code))
            with open(f"{out}/{name}_graph.txt", "w") as fh:
                fh.write(str(cm.exported.graph_module.code))
                for n in cm.nodes:
                    fh.write(f"\n{n.name}: {pl.describe(n.name)}")
    except Exception as e:  # noqa: BLE001 (a diagnostic: report and go on)
        import traceback
        print(f"{name}: ERROR {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()
