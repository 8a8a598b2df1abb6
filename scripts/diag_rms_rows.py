"""Which rows of HF RMSNorm (on x + r, bf16, GPU) the torch_compile stack computes
differently from torch.compile, and at which value: the variance, the row scale
rsqrt(var + eps), or the output (issue 52). Two forms: `f` returns the variance and the row
scale as outputs too (so Inductor stores them), `g` is HF's own form. Writes the inputs and
both sides' outputs to OUT/rms_rows.pt for a look on the CPU.

    [H=896] python scripts/diag_rms_rows.py OUT_DIR
"""

from __future__ import annotations

import os
import sys

import torch

import castlab.torch as ct

out = sys.argv[1] if len(sys.argv) > 1 else "."
torch.manual_seed(0)
H, T, bf, eps = int(os.environ.get("H", "896")), 64, torch.bfloat16, 1e-6
x = torch.randn(2, T, H, device="cuda").to(bf)
r = torch.randn(2, T, H, device="cuda").to(bf)
w = (1 + 0.1 * torch.randn(H, device="cuda")).to(bf)


def f(x, r):
    z = x + r
    h = z.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    rs = torch.rsqrt(var + eps)
    return z, w * (h * rs).to(bf), var, rs


def g(x, r):
    z = x + r
    h = z.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return z, w * h.to(bf)


res = {"x": x.cpu(), "r": r.cpu(), "w": w.cpu()}
for name, fn in (("f", f), ("g", g)):
    torch._dynamo.reset()
    with torch.no_grad():
        want = torch.compile(fn, dynamic=False)(x, r)
    torch._dynamo.reset()
    got = ct.capture(fn, x, r).run(x, r, stack="torch_compile")
    for i, (a, b) in enumerate(zip(want, got)):
        d = a != b
        rows = d.reshape(-1, a.shape[-1]).any(-1).nonzero().flatten().tolist()
        print(f"{name} out{i}: {int(d.sum())} of {a.numel()} differ; rows {rows[:20]}", flush=True)
        res[f"{name}_want{i}"], res[f"{name}_got{i}"] = a.cpu(), b.cpu()
torch.save(res, os.path.join(out, "rms_rows.pt"))
