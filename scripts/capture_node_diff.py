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
            shown += 1
            if shown >= args.most:
                break
    if not shown:
        print("  no node differs")


if __name__ == "__main__":
    main()
