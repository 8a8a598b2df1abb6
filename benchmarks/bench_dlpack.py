"""DLPack exchange cost: castlab <-> torch against torch <-> torch, at three sizes.

Prints the per-call time of
  cl.from_dlpack(torch_t)      torch -> castlab
  torch.from_dlpack(cl_t)      castlab -> torch
  torch.from_dlpack(torch_t2)  torch -> torch (the reference)
for fp32 tensors of 1e3, 1e6 and 1e8 elements, the ratios to the reference, and the ratio
of the largest size to the smallest (about 1 when the exchange is O(1), i.e. zero-copy).
Runs in well under 30 s on a laptop-class CPU.

    PYTHONPATH=python python3 benchmarks/bench_dlpack.py
"""

from __future__ import annotations

import sys
import timeit

import torch

import castlab as cl
from castlab import _C, _dlpack

from_dlpack = getattr(cl, "from_dlpack", _dlpack.from_dlpack)
if not hasattr(_C.Tensor, "__dlpack__"):
    _C.Tensor.__dlpack__ = _dlpack.tensor_dlpack
    _C.Tensor.__dlpack_device__ = _dlpack.tensor_dlpack_device

SIZES = [10**3, 10**6, 10**8]
NUMBER = 20_000   # calls per timing
REPEAT = 5        # best of


def per_call_us(fn) -> float:
    return min(timeit.repeat(fn, number=NUMBER, repeat=REPEAT)) / NUMBER * 1e6


def main() -> None:
    print(f"castlab DLPack exchange, fp32, CPU; torch {torch.__version__}, "
          f"python {sys.version.split()[0]}; best of {REPEAT} x {NUMBER} calls")
    header = (f"{'elements':>10} | {'cl.from_dlpack(torch)':>22} | {'torch.from_dlpack(cl)':>22} | "
              f"{'torch.from_dlpack(torch)':>24} | {'ratio t->cl':>11} | {'ratio cl->t':>11}")
    print(header)
    print("-" * len(header))
    rows = []
    for n in SIZES:
        torch_t = torch.empty(n, dtype=torch.float32)   # pages never touched: cheap to create
        torch_t2 = torch.empty(n, dtype=torch.float32)
        cl_t = from_dlpack(torch.empty(n, dtype=torch.float32))
        assert from_dlpack(torch_t).data_ptr() == torch_t.data_ptr()
        assert torch.from_dlpack(cl_t).data_ptr() == cl_t.data_ptr()
        t_import = per_call_us(lambda a=torch_t: from_dlpack(a))
        t_export = per_call_us(lambda a=cl_t: torch.from_dlpack(a))
        t_ref = per_call_us(lambda a=torch_t2: torch.from_dlpack(a))
        rows.append((t_import, t_export, t_ref))
        print(f"{n:>10.0e} | {t_import:>19.2f} us | {t_export:>19.2f} us | {t_ref:>21.2f} us | "
              f"{t_import / t_ref:>10.2f}x | {t_export / t_ref:>10.2f}x")
        torch_t = torch_t2 = cl_t = None  # free the large buffers before the next size
    first, last = rows[0], rows[-1]
    print(f"\nsize scaling (time at 1e8 / time at 1e3; ~1 means O(1), no copy): "
          f"torch->castlab {last[0] / first[0]:.2f}, castlab->torch {last[1] / first[1]:.2f}, "
          f"torch->torch {last[2] / first[2]:.2f}")


if __name__ == "__main__":
    main()
