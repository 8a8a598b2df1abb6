"""A small Triton SwiGLU in Liger's order (silu = a * sigmoid(a) in fp32, rounded to b's
dtype, then * b): the user kernel tests/test_testing_cuda.py and
benchmarks/bench_testing_cuda.py check with castlab.testing. Importing it needs triton."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=m, other=0.0)
    silu = (a * tl.sigmoid(a)).to(b.dtype)    # Liger's order: silu rounded, then * b
    tl.store(c_ptr + offs, silu * b, mask=m)


def triton_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.empty_like(a)
    n = a.numel()
    _kernel[(triton.cdiv(n, 1024),)](a, b, c, n, BLOCK=1024)
    return c
