"""Speed and peak memory of castlab.numerics.drift and near_ties on the CPU (issue 20
item 4): RoPE q [1, 28, 4096, 128] bf16 with cos/sin [4096, 128] (14.7M elements) and
SwiGLU x [4096, 8192] bf16 (output 16.8M elements), policies eager and fused.

    python benchmarks/bench_drift_cpu.py [--repeat 3] [--case rope|swiglu|all] [--device cuda]

On a GPU (--device cuda) drift runs castlab's compare kernels where the values are; the
peak column is then the host's memory only.

Wall and CPU time (all threads) of each call, best of `--repeat`; peak memory as the
process's resident high-water mark (VmHWM, reset through /proc/self/clear_refs) above what
it held once the inputs were built, for the first call (later calls reuse memory the
allocator kept). drift includes computing every node under fp64, eager and fused.
"""

from __future__ import annotations

import argparse
import time

from _memory import reset_peak, rss_kib

import castlab as cl
import castlab.numerics as nm
from castlab.study import CHAINS


def _case(name: str, device: str = "cpu"):
    if name == "rope":
        ch = CHAINS["rope"]
        args = ch.make_inputs((1, 28, 4096, 128), cl.bfloat16, 0, "normal", 1.0, device)
    else:
        ch = CHAINS["swiglu"]
        args = ch.make_inputs((4096, 2 * 4096), cl.bfloat16, 0, "normal", 1.0, device)
    return cl.jit(ch.fn), args


def _timed(f, repeat: int):
    walls, cpus, peak = [], [], None
    for k in range(repeat):
        can = reset_peak()
        before = rss_kib("VmRSS")
        t0, c0 = time.perf_counter(), time.process_time()
        res = f()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if k == 0 and can:
            peak = (rss_kib("VmHWM") - before) / 1024
        del res
    return min(walls), min(cpus), peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--case", default="all", choices=["rope", "swiglu", "all"])
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    cases = ["rope", "swiglu"] if a.case == "all" else [a.case]
    print(f"{'case':<28} {'wall s (best)':>13} {'CPU s (best)':>13} {'peak extra MiB':>15}")
    for name in cases:
        fn, args = _case(name, a.device)
        w, c, p = _timed(lambda fn=fn, args=args: nm.drift(fn, args, policies=("eager", "fused")),
                         a.repeat)
        ps = f"{p:15.0f}" if p is not None else f"{'n/a':>15}"
        print(f"{'drift ' + name:<28} {w:13.2f} {c:13.2f} {ps}")
        ref = fn.run(*args, policy="fp64")
        w, c, p = _timed(lambda ref=ref: nm.near_ties(ref, cl.bfloat16), a.repeat)
        ps = f"{p:15.0f}" if p is not None else f"{'n/a':>15}"
        print(f"{'near_ties ' + name:<28} {w:13.2f} {c:13.2f} {ps}")
        del fn, args, ref
    d = nm.drift(*_case("rope", a.device), policies=("eager", "fused")) \
        if a.case != "swiglu" else None
    if d is not None:
        print()
        print(d)


if __name__ == "__main__":
    main()
