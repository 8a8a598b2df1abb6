"""Speed and peak memory of castlab.numerics.compare on the CPU: three 16M-element bf16
results against an fp64 reference (issue 20 item 4: under 1 s on 2 CPU cores, memory at
most one extra fp64 copy), given as castlab tensors (castlab's compare kernels on the
CPU's threads) and, in the same run, as NumPy arrays (the chunked NumPy scan).

    python benchmarks/bench_compare_cpu.py [--n 16777216] [--repeat 3]

Peak memory, two ways: the process's resident high-water mark (VmHWM, reset through
/proc/self/clear_refs) above what it held once the inputs were built, for the first call
(later calls reuse memory the allocator kept, so only the first is reported); and the
peak of NumPy's allocations under tracemalloc in one more, untimed, call.
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc

import ml_dtypes
import numpy as np
from _memory import reset_peak, rss_kib

import castlab as cl
import castlab.numerics as nm


def inputs(n: int):
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(n)                          # fp64 reference, 128 MiB at 16M
    bf = ml_dtypes.bfloat16
    a = ref.astype(bf)                                    # correctly rounded
    b = ref.astype(np.float32).astype(bf)                 # through fp32 (double rounding)
    c = a.copy()
    bump = rng.random(n) < 0.3                            # 30% of elements one ulp off
    cv = c.view(np.uint16)
    cv[bump] += 1
    shape = (1, 32, n // (32 * 128), 128) if n % (32 * 128) == 0 else (n,)
    return [x.reshape(shape) for x in (a, b, c)], ref.reshape(shape)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    res_np, ref_np = inputs(args.n)
    names = ["eager", "fp32-path", "bumped"]
    print(f"# castlab compare CPU benchmark {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          f"  cores={os.cpu_count()}  n={args.n}  3 bf16 results vs fp64 ref")
    f64 = args.n * 8 / 2**20
    best = {}
    for label, res, ref in [
            ("castlab tensors (kernels)", [cl.from_numpy(r) for r in res_np],
             cl.from_numpy(ref_np)),
            ("NumPy arrays (scan)", res_np, ref_np)]:
        nm.compare(*[r[:1] for r in res], ref=ref[:1], names=names)  # first-call setup
        times, cpus, peaks = [], [], []
        for _ in range(args.repeat):
            ok = reset_peak()
            base = rss_kib("VmRSS")
            t, tc = time.perf_counter(), time.process_time()
            c = nm.compare(*res, ref=ref, names=names)
            times.append(time.perf_counter() - t)
            cpus.append(time.process_time() - tc)
            peaks.append((rss_kib("VmHWM") - base) / 1024 if ok else float("nan"))
            del c
        tracemalloc.start()
        c = nm.compare(*res, ref=ref, names=names)
        tm_peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        del c
        best[label] = min(times)
        print(f"{label}: best {min(times):.3f} s wall, {min(cpus):.3f} s CPU (all threads)  "
              f"(wall runs {', '.join(f'{t:.3f}' for t in times)}; load average "
              f"{os.getloadavg()[0]:.1f})")
        print(f"  peak extra resident memory (first call): {peaks[0]:.0f} MiB; NumPy "
              f"allocations peak (tracemalloc): {tm_peak:.0f} MiB  (one fp64 copy = "
              f"{f64:.0f} MiB)")
    k, sc = best["castlab tensors (kernels)"], best["NumPy arrays (scan)"]
    print(f"kernels / scan time: {k / sc:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
