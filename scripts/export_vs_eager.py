"""Does the graph torch.export captured run the same ATen kernels as the eager model?
castlab.torch replays the exported graph; where PyTorch itself gives other bits running
that graph than running the model (issue 17: HF Qwen2 on CUDA, bf16 1-layer and fp32
2-layer), this lists the ATen ops each run dispatched (after PyTorch's own composite
decompositions, so `linear` shows as `addmm` or as `mm` + `add`), with argument strides,
and the first place the two sequences part, plus whether each run repeats itself.

Usage: python scripts/export_vs_eager.py [--device cuda] [--dtype float32] [--big]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from test_torch_capture import KW, _qwen2  # noqa: E402


class Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))

        def desc(x):
            if isinstance(x, torch.Tensor):
                return f"T{tuple(x.shape)}{tuple(x.stride())}{str(x.dtype)[6:]}"
            return repr(x) if isinstance(x, (int, float, bool, type(None))) else type(x).__name__

        sig = (str(func), tuple(desc(a) for a in pytree.tree_leaves((args, kwargs or {}))))
        vals = [o.detach().clone() for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        self.calls.append((sig, vals))
        return out


def record(fn):
    with torch.no_grad(), Log() as log:
        fn()
    return log.calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--big", action="store_true")
    args = ap.parse_args()
    m, ids = _qwen2(getattr(torch, args.dtype), args.big, args.device)
    with torch.no_grad():
        ep = torch.export.export(m, (ids,), KW, strict=False)
        ref, ref2 = m(ids, **KW).logits, m(ids, **KW).logits
        g = ep.module()
        o1, o2 = g(ids, **KW), g(ids, **KW)
    o1 = o1.logits if hasattr(o1, "logits") else o1[0]
    o2 = o2.logits if hasattr(o2, "logits") else o2[0]
    print(f"{args.dtype} big={args.big} {args.device}: eager repeats {torch.equal(ref, ref2)}; "
          f"exported repeats {torch.equal(o1, o2)}; exported == eager {torch.equal(o1, ref)} "
          f"({int((o1 != ref).sum())} of {ref.numel()} differ)")
    e = record(lambda: m(ids, **KW))
    x = record(lambda: g(ids, **KW))
    print(f"ATen calls: eager {len(e)}, exported {len(x)}")
    ne = [c for c in e if "detach" not in c[0][0] and "alias" not in c[0][0]]
    nx = [c for c in x if "detach" not in c[0][0] and "alias" not in c[0][0]]
    shown = 0
    i = j = 0
    while i < len(ne) and j < len(nx) and shown < 25:
        (se, ve), (sx, vx) = ne[i], nx[j]
        same_sig = se == sx
        same_val = len(ve) == len(vx) and all(
            a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ve, vx))
        if not (same_sig and same_val):
            print(f"  eager[{i}]    {se[0]} {' '.join(se[1])}\n"
                  f"  exported[{j}] {sx[0]} {' '.join(sx[1])}  values equal: {same_val}")
            shown += 1
            if not same_sig:  # resynchronise on the next op of the same name
                k = next((k for k in range(j, min(j + 40, len(nx))) if nx[k][0][0] == se[0]), None)
                if k is not None and k != j:
                    print(f"  (exported ran {[c[0][0] for c in nx[j:k]]} here)")
                    j = k
                    continue
        i += 1
        j += 1
    if not shown:
        print("  the two runs dispatched the same ops with the same values")


if __name__ == "__main__":
    main()
