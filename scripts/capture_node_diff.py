"""Where does a captured HF Qwen2 first differ from PyTorch? Every node of the captured
graph under castlab (policy eager, math torch_eager) against PyTorch running the same
exported graph node by node (torch.fx.Interpreter), plus whether that exported graph
itself equals the eager model. For issue 17's CUDA mismatch (on an H200 the eager logits
differed: bf16 1-layer 29 of 64, fp32 2-layer 292,403 of 303,872).

Usage: python scripts/capture_node_diff.py [--device cuda] [--dtype float32] [--big]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

import castlab.torch as ct
from castlab.policy import as_math, as_policy

# the models of tests/test_torch_capture.py, exactly
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from test_torch_capture import KW, _qwen2  # noqa: E402


def _first_difference(n, cenv: dict, tenv: dict) -> None:
    """The first differing node: are its inputs equal, and does PyTorch's own op give
    castlab's or PyTorch's value when run again on each side's inputs (layout and pointer
    alignment are the only differences left when the inputs are equal)?"""
    from torch.utils import _pytree as pytree

    def sub(env):  # a region's inner values are not kept: PyTorch's stand in
        return pytree.tree_map(
            lambda x: env.get(x.name, tenv[x.name]) if isinstance(x, torch.fx.Node) else x,
            (list(n.args), dict(n.kwargs)))

    if n.name not in cenv:
        return
    (ca, ck), (ta, tk) = sub(cenv), sub(tenv)
    for i, (x, y) in enumerate(zip(pytree.tree_leaves(ca), pytree.tree_leaves(ta))):
        if isinstance(x, torch.Tensor):
            same = x.shape == y.shape and x.dtype == y.dtype and bool(torch.equal(x, y))
            print(f"    arg {i}: equal {same}; shape {tuple(x.shape)} {x.dtype}; strides "
                  f"castlab {tuple(x.stride())} PyTorch {tuple(y.stride())}; offset "
                  f"{x.storage_offset()}/{y.storage_offset()}; ptr % 256 "
                  f"{x.data_ptr() % 256}/{y.data_ptr() % 256}")
        else:
            print(f"    arg {i}: {x!r}")
    with torch.no_grad():
        want = tenv[n.name]
        again_c = n.target(*ca, **ck)
        again_t = n.target(*ta, **tk)
        cl_ = pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, (ca, ck))
        again_cc = n.target(*cl_[0], **cl_[1])
    for what, v in (("castlab's inputs", again_c), ("PyTorch's inputs", again_t),
                    ("clones of castlab's inputs", again_cc)):
        if isinstance(v, torch.Tensor):
            print(f"    torch op on {what}: == PyTorch's value {torch.equal(v, want)}, "
                  f"== castlab's value {torch.equal(v, cenv[n.name])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--big", action="store_true", help="the 2-layer Qwen2.5-0.5B shapes")
    ap.add_argument("--most", type=int, default=8, help="differing nodes to list")
    args = ap.parse_args()
    m, ids = _qwen2(getattr(torch, args.dtype), args.big, args.device)
    cm = ct.capture(m, ids, kwargs=KW)
    flat = cm._flat_inputs((ids,), KW)
    vals: dict = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            vals[n.name] = r = super().run_node(n)
            return r

    with torch.no_grad():
        run = cm.execute(flat, as_policy("eager"), as_math("torch_eager"))
        ref = m(ids, **KW).logits
        it = iter(flat)
        places = [cm._consts[n.name] if n.name in cm._consts else next(it)
                  for n in cm.nodes if n.op == "placeholder"]
        out = Recorder(cm.exported.graph_module).run(*places)
    exported = out[0] if isinstance(out, (tuple, list)) else out
    print(f"{args.dtype} {'2-layer' if args.big else '1-layer'} on {args.device}: "
          f"exported graph in PyTorch == eager model: {torch.equal(exported, ref)}; "
          f"castlab eager == eager model: {torch.equal(cm.outputs(run).logits, ref)}")
    shown = 0
    for n in cm.nodes:
        a, b = run.env.get(n.name), vals.get(n.name)
        if n.op != "call_function" or not isinstance(a, torch.Tensor) or not isinstance(
                b, torch.Tensor) or a.shape != b.shape:
            continue
        if a.dtype != b.dtype:
            print(f"  {n.name}: dtype {a.dtype} (castlab) vs {b.dtype} (PyTorch)")
            continue
        d = int((a != b).sum())
        if d:
            print(f"  {n.name:28s} {str(n.target):44s} {d} of {a.numel()} differ; strides "
                  f"castlab {tuple(a.stride())}, PyTorch {tuple(b.stride())}")
            if not shown:
                _first_difference(n, run.env, vals)
            shown += 1
            if shown >= args.most:
                break
    if not shown:
        print("  no node differs")


if __name__ == "__main__":
    main()
