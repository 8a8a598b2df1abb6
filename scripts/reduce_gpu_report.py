"""Reductions on the GPU against PyTorch CUDA: mismatch counts per op, dtype and shape.

castlab (eager policy, torch_eager math) vs torch eager CUDA; castlab (fused, inductor)
vs torch.compile; castlab portable on the GPU vs castlab portable on the CPU. Prints one
line per case (op, dtype, shape: mismatching elements / elements). Run on a GPU machine:

    python scripts/reduce_gpu_report.py [--quick]
"""

from __future__ import annotations

import sys

import torch

import castlab as cl

QUICK = "--quick" in sys.argv
DTYPES = {"bf16": (cl.bfloat16, torch.bfloat16), "f16": (cl.float16, torch.float16),
          "f32": (cl.float32, torch.float32)}
ROWS = 256 if QUICK else 1024
rows_out: list = []


def mism(a, b) -> tuple[int, int]:
    a = torch.from_dlpack(a) if not isinstance(a, torch.Tensor) else a
    a, b = a.double().cpu(), b.double().cpu()
    eq = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return int((~eq).sum()), a.numel()


def report(what: str, dt: str, shape, m: tuple) -> None:
    line = f"{what:28s} {dt:5s} {str(list(shape)):16s} {m[0]:8d} / {m[1]:9d}"
    rows_out.append((what, dt, shape, m))
    print(line, flush=True)


def hf_rmsnorm(t, w, eps=1e-6):
    h = t.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(t.dtype)


def te_rmsnorm(t, w, eps=1e-6):
    h = t.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    return (h * torch.rsqrt(var + eps) * w.float()).to(t.dtype)


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    eager = dict(policy="eager", math="torch_eager")
    print("# castlab eager/torch_eager vs torch eager CUDA")
    for dn, (_cd, td) in DTYPES.items():
        for n in (896, 3584, 4096, 1000, 100):
            t = (torch.randn(ROWS, n, device="cuda", generator=gen) * 2).to(td)
            x = cl.from_dlpack(t)
            for op in ("sum", "mean", "amax"):
                f = cl.jit(lambda x, op=op: getattr(cl, op)(x, -1))
                report(f"{op}(-1)", dn, t.shape, mism(f.run(x, **eager), getattr(torch, op)(t, -1)))
            f = cl.jit(lambda x: cl.sum(x, 0))
            report("sum(0)", dn, t.shape, mism(f.run(x, **eager), t.sum(0)))
        for n in (32, 100, 128, 896, 1000, 2048, 3584, 4096, 12000):
            t = (torch.randn(ROWS, n, device="cuda", generator=gen) * 3).to(td)
            x = cl.from_dlpack(t)
            for op in ("softmax", "log_softmax"):
                f = cl.jit(lambda x, op=op: getattr(cl, op)(x, -1))
                report(op, dn, t.shape, mism(f.run(x, **eager), getattr(torch, op)(t, -1)))
        for h in (896, 3584):
            t = torch.randn(ROWS, h, device="cuda", generator=gen).to(td)
            w = (torch.rand(h, device="cuda", generator=gen) + 0.5).to(td)
            b = torch.randn(h, device="cuda", generator=gen).to(td)
            x, cw, cb = cl.from_dlpack(t), cl.from_dlpack(w), cl.from_dlpack(b)
            f = cl.jit(lambda x, w: cl.rms_norm(x, x.shape[-1], w, 1e-6, cast="hf"))
            report("rms_norm hf (Qwen2RMSNorm)", dn, t.shape, mism(f.run(x, cw, **eager),
                                                                 hf_rmsnorm(t, w)))
            f = cl.jit(lambda x, w, b: cl.layer_norm(x, x.shape[-1], w, b))
            report("layer_norm", dn, t.shape,
                   mism(f.run(x, cw, cb, **eager),
                        torch.nn.functional.layer_norm(t, (h,), w, b)))
            f = cl.jit(lambda x: cl.var(x, -1))
            report("var(-1)", dn, t.shape, mism(f.run(x, **eager), t.var(-1)))

    print("# castlab portable: GPU vs CPU (eager and fused)")
    for dn, (_cd, td) in DTYPES.items():
        t = torch.randn(64, 896, device="cuda", generator=gen).to(td)
        w = torch.randn(896, device="cuda", generator=gen).to(td)
        x, cw = cl.from_dlpack(t), cl.from_dlpack(w)
        fns = {"sum": lambda x, w: cl.sum(x * w, -1), "softmax": lambda x, w: cl.softmax(x, -1),
               "rms_norm": lambda x, w: cl.rms_norm(x, 896, w),
               "layer_norm": lambda x, w: cl.layer_norm(x, 896, w)}
        for name, fn in fns.items():
            f = cl.jit(fn)
            for pol in ("eager", "fused", "fp64"):
                for red in ("pairwise", "torch_cuda", "torch_cpu"):
                    m = cl.Math("p", impl="portable", reduction=red)
                    g = f.run(x, cw, policy=pol, math=m)
                    c = f.run(x.cpu(), cw.cpu(), policy=pol, math=m)
                    report(f"{name} {pol} {red} gpu-cpu", dn, t.shape,
                           mism(torch.from_dlpack(g).cpu(), torch.from_dlpack(c)))

    print("# castlab fused/inductor vs torch.compile")
    for dn, (_cd, td) in DTYPES.items():
        for h in (896, 3584, 4096):
            t = torch.randn(ROWS, h, device="cuda", generator=gen).to(td)
            w = (torch.rand(h, device="cuda", generator=gen) + 0.5).to(td)
            x, cw = cl.from_dlpack(t), cl.from_dlpack(w)
            f = cl.jit(lambda x, w: cl.rms_norm(x, x.shape[-1], w, 1e-6, cast="hf"))
            comp = torch.compile(hf_rmsnorm, dynamic=False)
            report("rms_norm hf fused/inductor", dn, t.shape,
                   mism(f.run(x, cw, policy="fused", math="inductor"), comp(t, w)))
            f = cl.jit(lambda x: cl.softmax(x, -1))
            comp = torch.compile(lambda t: torch.softmax(t, -1), dynamic=False)
            report("softmax fused/inductor", dn, t.shape,
                   mism(f.run(x, policy="fused", math="inductor"), comp(t)))


if __name__ == "__main__":
    main()
