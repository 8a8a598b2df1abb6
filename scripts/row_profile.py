"""Run castlab's fused/inductor RMSNorm and softmax (issue 16's cases) and torch.compile's
kernels for the same cases a few times, with the profiled calls between
torch.cuda.profiler.start() and stop(): under `ncu --profile-from-start off` each kernel
of one castlab call and one torch.compile call is measured.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        --section Occupancy --section LaunchStats python scripts/row_profile.py
"""

from __future__ import annotations

import torch

import castlab as cl
from castlab import cuda as clcuda  # noqa: F401  (castlab's CUDA runtime)


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = []
    R, H = 16384, 4096
    tx = torch.randn(R, H, device="cuda", generator=g).to(torch.bfloat16)
    tw = (torch.rand(H, device="cuda", generator=g) + 0.5).to(torch.bfloat16)

    def hf(x, w):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)

    f = cl.jit(lambda x, w: cl.rms_norm(x, H, w, 1e-6, cast="hf"))
    x, w = cl.from_dlpack(tx), cl.from_dlpack(tw)
    cases.append(("castlab rmsnorm", lambda: f.run(x, w, policy="fused", math="inductor")))
    comp_hf = torch.compile(hf, dynamic=False)
    cases.append(("compile rmsnorm", lambda: comp_hf(tx, tw)))
    ts = torch.randn(32 * 4096, 4096, device="cuda", generator=g).to(torch.bfloat16)
    s = cl.from_dlpack(ts)
    fs = cl.jit(lambda x: cl.softmax(x, -1))
    cases.append(("castlab softmax", lambda: fs.run(s, policy="fused", math="inductor")))
    comp_sm = torch.compile(lambda t: torch.softmax(t, -1), dynamic=False)
    cases.append(("compile softmax", lambda: comp_sm(ts)))
    for _, fn in cases:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    clcuda.synchronize()
    for name, fn in cases:
        torch.cuda.profiler.start()
        torch.cuda.nvtx.range_push(name)
        fn()
        clcuda.synchronize()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
