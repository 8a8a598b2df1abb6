"""Host time of one eager call of castlab's composites (softmax, log_softmax, the
reductions, the norms, cross_entropy) against torch eager's call on the same small CPU
tensor, in one run: the per-call overhead a user pays in a loop of eager calls, where the
arithmetic is negligible ([4, 64] bf16). Prints microseconds a call and the ratio
torch / castlab (> 1: castlab's call is the cheaper).

Usage: python benchmarks/bench_eager_host.py [--json PATH] [--calls N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time


def _per_call_us(f, calls: int) -> float:
    for _ in range(20):
        f()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    import torch

    import castlab as cl

    torch.set_num_threads(1)
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    t = torch.tensor([1, 2, 3, 4])
    X, W, T = cl.from_dlpack(x), cl.from_dlpack(w), cl.from_dlpack(t)
    F = torch.nn.functional
    cases = [
        ("softmax", lambda: cl.softmax(X, -1), lambda: torch.softmax(x, -1)),
        ("log_softmax", lambda: cl.log_softmax(X, -1), lambda: torch.log_softmax(x, -1)),
        ("sum", lambda: cl.sum(X, -1), lambda: torch.sum(x, -1)),
        ("var", lambda: cl.var(X, -1), lambda: torch.var(x, -1)),
        ("layer_norm", lambda: cl.layer_norm(X, (64,), W, W),
         lambda: F.layer_norm(x, (64,), w, w)),
        ("cross_entropy", lambda: cl.cross_entropy(X, T), lambda: F.cross_entropy(x, t)),
        ("cross_entropy smoothing", lambda: cl.cross_entropy(X, T, label_smoothing=0.1),
         lambda: F.cross_entropy(x, t, label_smoothing=0.1)),
    ]
    rows = []
    print(f"{'case':<24} {'torch us':>9} {'castlab us':>11} {'torch/cl':>9}")
    for name, cf, tf in cases:
        tu, cu = _per_call_us(tf, args.calls), _per_call_us(cf, args.calls)
        rows.append({"case": name, "torch_us": tu, "castlab_us": cu, "ratio": tu / cu})
        print(f"{name:<24} {tu:9.1f} {cu:11.1f} {tu / cu:9.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                       "machine": platform.processor() or platform.machine(),
                       "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
