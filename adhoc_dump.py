import os, sys, torch
for dt, v, ls in (("bfloat16", 32000, 0.1), ("float32", 4096, 0.0)):
    g = torch.Generator().manual_seed(v)
    x = (torch.randn(512, v, generator=g) * 2).to(getattr(torch, dt)).cuda()
    t = torch.randint(0, v, (512,), generator=g).cuda(); t[3] = -100
    xr = x.clone().requires_grad_()
    torch._dynamo.reset()
    f = lambda a, b: torch.nn.functional.cross_entropy(a.float(), b, reduction="none", label_smoothing=ls)
    out = torch.compile(f, dynamic=False)(xr, t)
    out.backward(torch.ones_like(out))
    print("CASE", dt, v, ls, flush=True)
