"""Which step of Qwen2's attention makes the torch_compile stack differ from torch.compile
(issue 52): Qwen2's attention module (hidden 896, 14 query heads over 2 KV heads, biased
q/k/v, bf16) compiled by Inductor under its default settings, against the same module
computed step by step in PyTorch with each candidate choice: the RoPE kernel's fma
contraction (fma(q, cos, rot*sin), fma(rot, sin, q*cos) or none; cos/sin in fp32 as
Inductor recomputes them) and each SDPA backend. Prints the count of differing outputs per
choice, and which query elements the contractions disagree on; the Triton kernels' PTX
goes to OUT_DIR (set TRITON_CACHE_DIR=OUT_DIR/triton before running).

    TRITON_CACHE_DIR=$OUT/triton python scripts/qwen2_attention_probe.py $OUT
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

import torch
import torch.nn.functional as F
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel

import castlab.torch as ct

out = sys.argv[1] if len(sys.argv) > 1 else "probe_out"
os.makedirs(out, exist_ok=True)
dev, bf = os.environ.get("PROBE_DEV", "cuda"), torch.bfloat16
H, T, NH, NKV, D = 896, 64, 14, 2, 64
seeds = [int(s) for s in os.environ.get("PROBE_SEEDS", "0,1,2").split(",")]
cfg = transformers.Qwen2Config(hidden_size=H, num_attention_heads=NH, num_key_value_heads=NKV,
                               intermediate_size=4864, vocab_size=4096, num_hidden_layers=1,
                               max_position_embeddings=256, rms_norm_eps=1e-6)
cfg._attn_implementation = "sdpa"
M = transformers.models.qwen2.modeling_qwen2


def fma_f32(a, b, c):
    """fp32 fma from fp64: a*b exact (24+24 bits), one rounding to fp64, one to fp32."""
    return (a.double() * b.double() + c.double()).float()


def probe(seed: int) -> None:
    torch.manual_seed(seed)
    attn = M.Qwen2Attention(cfg, 0).to(bf).to(dev).eval()
    for p in attn.parameters():
        if p.dim() == 1:
            with torch.no_grad():
                p.copy_(1 + 0.1 * torch.randn_like(p))
    rot = M.Qwen2RotaryEmbedding(cfg).to(dev)
    x = torch.randn(2, T, H, device=dev).to(bf)
    pos = torch.arange(T, device=dev)[None].expand(2, T)

    def f(x, pos):
        return attn(x, rot(x, pos), None)[0]

    torch._dynamo.reset()
    with torch.no_grad():
        want = torch.compile(f, dynamic=False)(x, pos)
        want2 = torch.compile(f, dynamic=False)(x, pos)
    torch._dynamo.reset()
    cm = ct.capture(f, x, pos, attention="traced")
    got = cm.run(x, pos, stack="torch_compile")
    print(f"seed {seed}: torch.compile twice: {int((want != want2).sum())} differ; "
          f"stack vs compile: {int((got != want).sum())} differ in rows "
          f"{sorted({tuple(i[:2]) for i in (got != want).nonzero().tolist()})}", flush=True)

    with torch.no_grad():
        inv = rot.inv_freq
        ang = inv[None, :, None].float().expand(2, -1, 1) @ pos[:, None, :].float()
        ang = ang.transpose(1, 2)
        emb = torch.cat([ang, ang], -1)
        cos, sin = emb.cos()[:, :, None, :], emb.sin()[:, :, None, :]

        def lin(m, t):
            return F.linear(t, m.weight, m.bias)

        def heads(t, n):
            return t.view(2, T, n, D).float()

        def rope(t, how):
            r = torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1)
            qc, rs = t * cos, r * sin
            if how == "fma(q,cos,rot*sin)":
                y = fma_f32(t, cos, rs)
            elif how == "fma(rot,sin,q*cos)":
                y = fma_f32(r, sin, qc)
            else:
                y = qc + rs
            return y.to(bf).transpose(1, 2)  # [B, T, H, D] storage, as Inductor's buffer

        qh, kh = heads(lin(attn.q_proj, x), NH), heads(lin(attn.k_proj, x), NKV)
        v = lin(attn.v_proj, x).view(2, T, NKV, D).transpose(1, 2)
        hows = ("fma(q,cos,rot*sin)", "fma(rot,sin,q*cos)", "no fma")
        qs = {h: rope(qh, h) for h in hows}
        ks = {h: rope(kh, h) for h in hows}
        for h in hows[1:]:
            dq = (qs[h] != qs[hows[0]]).nonzero().tolist()
            dk = (ks[h] != ks[hows[0]]).nonzero().tolist()
            print(f"  {h} vs {hows[0]}: q differs at {dq[:8]} ({len(dq)}), "
                  f"k at {dk[:8]} ({len(dk)})", flush=True)
        backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "default": None}
        for hq in hows:
            for hk in hows:
                if hq != hk and hk != hows[0] and hq != hows[0]:
                    continue
                for bname, b in backends.items():
                    try:
                        if b is None:
                            o = F.scaled_dot_product_attention(qs[hq], ks[hk], v, is_causal=True,
                                                               scale=0.125, enable_gqa=True)
                        else:
                            with sdpa_kernel([b]):
                                o = F.scaled_dot_product_attention(qs[hq], ks[hk], v,
                                                                   is_causal=True, scale=0.125,
                                                                   enable_gqa=True)
                    except RuntimeError as e:
                        print(f"  q {hq}, k {hk}, {bname}: refused ({str(e)[:80]})")
                        continue
                    y = F.linear(o.transpose(1, 2).reshape(2, T, H), attn.o_proj.weight)
                    print(f"  q {hq}, k {hk}, sdpa {bname}: {int((y != want).sum())} differ "
                          f"from torch.compile, {int((y != got).sum())} from the stack",
                          flush=True)
        choice = torch._fused_sdp_choice(qs[hows[0]], ks[hows[0]], v, is_causal=True, scale=0.125,
                                         enable_gqa=True)
        print(f"  eager _fused_sdp_choice: {choice}", flush=True)

for s in seeds:
    probe(s)
tc = os.environ.get("TRITON_CACHE_DIR")
if tc:
    for p in glob.glob(f"{tc}/**/*rope*.ptx", recursive=True) + glob.glob(
            f"{tc}/**/*cat_cos*.ptx", recursive=True):
        shutil.copy(p, out)
    shutil.rmtree(tc, ignore_errors=True)
