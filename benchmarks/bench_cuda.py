"""castlab's CUDA kernels against PyTorch, in one run (issues 5 and 6).

Measures with CUDA events (warm-up, median of many): device-to-device copy bandwidth,
fused SwiGLU and RoPE (castlab fused vs torch eager vs torch.compile(dynamic=False)),
each eager op kernel vs torch's, host time per call on tiny tensors, and the first-call
and disk-cache costs. Prints a table of ratios; ``--json PATH`` writes the numbers.

Device times of small launches are measured with the stream blocked by a sleep kernel
while the launches are queued, so they are kernel times, not host times.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch
import torch.nn.functional as F

import castlab as cl
import castlab.cuda as clcuda
from castlab.torch._aten import torch_pairs

RESULTS: dict = {}


def stream_of_castlab():
    return torch.cuda.ExternalStream(clcuda.current_stream_ptr(0))


def run_header(title: str, detail: str) -> tuple:
    """Print a benchmark run's first line (title, UTC time, GPU, torch, `detail`) and
    return (torch's stream, castlab's stream, the results dict to fill)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    name = torch.cuda.get_device_name()
    print(f"# castlab {title}  {now:%Y-%m-%d %H:%M} UTC  {name}  torch {torch.__version__}  "
          f"{detail}")
    results = {"device": name, "date": f"{now:%Y-%m-%d}", "cases": {}}
    return torch.cuda.current_stream(), stream_of_castlab(), results


def device_ms(fn, stream, iters=20, reps=5, sleep_cycles=None):
    """Median per-call device time (ms) of `fn` queued on `stream`, the stream held by a
    sleep kernel so that queued launches run back to back."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    clcuda.synchronize()
    if sleep_cycles is None:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        host = (time.perf_counter() - t0)
        torch.cuda.synchronize()
        clcuda.synchronize()
        sleep_cycles = int(min(2e9, max(1e5, host * 2.5e9)))
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(sleep_cycles)
            s.record(stream)
            for _ in range(iters):
                fn()
            e.record(stream)
        e.synchronize()
        out.append(s.elapsed_time(e) / iters)
    return statistics.median(out)


def host_us(fn, iters=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    clcuda.synchronize()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best.append((time.perf_counter() - t0) / iters * 1e6)
        torch.cuda.synchronize()
        clcuda.synchronize()
    return statistics.median(best)


def to_cl(t):
    return cl.from_dlpack(t)


def _n_steps(jf):
    try:
        tr = next(iter(jf._cache.values()))
        return len(next(iter(tr.plans.values())).steps)
    except Exception:  # noqa: BLE001
        return None


def rope_t(x, cos, sin):
    """RoPE on head dim 128 in PyTorch: x*cos + rotate_half(x)*sin."""
    x1, x2 = x[..., :64], x[..., 64:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rope_c(x, cos, sin):
    """The same in castlab."""
    x1, x2 = x[..., :64], x[..., 64:]
    return x * cos + cl.cat([-x2, x1], dim=-1) * sin


def gbps(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    assert clcuda.is_available(), clcuda.info()
    info = clcuda.info()
    dev = info["devices"][0]
    print(f"# castlab CUDA benchmark  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"# {dev['name']} cc {dev['compute_capability']}  driver {info['driver_version']}  "
          f"NVRTC {info['nvrtc_version']}  torch {torch.__version__}")
    RESULTS["device"] = dev["name"]
    RESULTS["date"] = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"
    ts = torch.cuda.current_stream()
    cs = stream_of_castlab()
    rows = []

    # ---- copy bandwidth
    n_copy = 512 * 2**20
    src = torch.randn(n_copy, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    ms = device_ms(lambda: dst.copy_(src), ts, iters=10)  # noqa: F821 (src, dst freed below)
    copy_bw = gbps(2 * src.numel() * 2, ms)
    RESULTS["copy_GBps"] = copy_bw
    print(f"device-to-device copy (torch, {src.numel() * 2 / 2**30:.0f} GiB): {copy_bw:.0f} GB/s (read+write)")
    del src, dst

    # ---- SwiGLU
    sw_cl = cl.jit(lambda a, b: cl.silu(a) * b, policy="fused", math="inductor")
    sw_cl_te = cl.jit(lambda a, b: cl.silu(a) * b, policy="fused", math="torch_eager")
    sw_t = lambda a, b: F.silu(a) * b  # noqa: E731
    sw_c = torch.compile(sw_t, dynamic=False)
    for n in ([2**20, 2**24, 2**28] if not args.quick else [2**20, 2**24]):
        ta = torch.randn(n, device="cuda").to(torch.bfloat16)
        tb = torch.randn(n, device="cuda").to(torch.bfloat16)
        a, b = to_cl(ta), to_cl(tb)
        nbytes = 3 * n * 2
        r = {}
        r["castlab_fused"] = device_ms(lambda a=a, b=b: sw_cl(a, b), cs)
        r["castlab_fused_torch_eager_math"] = device_ms(lambda a=a, b=b: sw_cl_te(a, b), cs)
        r["castlab_eager"] = device_ms(lambda a=a, b=b: cl.silu(a) * b, cs)
        r["torch_eager"] = device_ms(lambda ta=ta, tb=tb: sw_t(ta, tb), ts)
        sw_c(ta, tb)
        r["torch_compile"] = device_ms(lambda ta=ta, tb=tb: sw_c(ta, tb), ts)
        for k, v in r.items():
            rows.append((f"swiglu bf16 2x{n >> 20}M", k, v, gbps(nbytes, v), gbps(nbytes, v) / copy_bw))
        RESULTS[f"swiglu_{n}"] = r
        del ta, tb, a, b

    # ---- RoPE [1,32,32768,128], cos/sin [32768,128]
    tx = torch.randn(1, 32, 32768, 128, device="cuda").to(torch.bfloat16)
    tcos = torch.randn(32768, 128, device="cuda").to(torch.bfloat16)
    tsin = torch.randn(32768, 128, device="cuda").to(torch.bfloat16)
    x, co, si = to_cl(tx), to_cl(tcos), to_cl(tsin)
    ro_cl = cl.jit(rope_c, policy="fused", math="inductor")
    ro_c = torch.compile(rope_t, dynamic=False)
    nbytes = 2 * tx.numel() * 2 + 2 * tcos.numel() * 2
    cl_args, t_args = (x, co, si), (tx, tcos, tsin)
    r = {"castlab_fused": device_ms(lambda: ro_cl(*cl_args), cs, iters=10),
         "castlab_eager": device_ms(lambda: rope_c(*cl_args), cs, iters=5),
         "torch_eager": device_ms(lambda: rope_t(*t_args), ts, iters=5)}
    ro_c(*t_args)
    r["torch_compile"] = device_ms(lambda: ro_c(*t_args), ts, iters=10)
    for k, v in r.items():
        rows.append(("rope bf16 [1,32,32768,128]", k, v, gbps(nbytes, v), gbps(nbytes, v) / copy_bw))
    RESULTS["rope"] = r
    RESULTS["rope_kernels_per_call"] = _n_steps(ro_cl)
    del tx, tcos, tsin, x, co, si
    cl_args = t_args = None  # frees the tensors (the lambdas above refer to these names)

    # ---- eager op kernels vs torch's
    print()
    unary = torch_pairs("unary_float", "unary_signed", castlab_first=True)  # the op table's
    ops = {
        **{n: unary[n] for n in ("neg", "exp", "sigmoid", "silu", "tanh", "gelu", "sqrt", "sin",
                                 "log")},
        "mul": (lambda p: p * p, lambda p: p * p), "add": (lambda p: p + p, lambda p: p + p),
        "div": (lambda p: p / p, lambda p: p / p), "mul_scalar": (lambda p: p * 0.5, lambda p: p * 0.5),
    }
    op_rows = []
    for n in ([2**24, 2**28] if not args.quick else [2**24]):
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            tp = torch.rand(n, device="cuda").to(dt) + 0.5
            p = to_cl(tp)
            for name, (fc, ft) in ops.items():
                mc = device_ms(lambda fc=fc, p=p: fc(p), cs, iters=10, reps=3)
                mt = device_ms(lambda ft=ft, tp=tp: ft(tp), ts, iters=10, reps=3)
                op_rows.append((name, str(dt).replace("torch.", ""), n, mc, mt, mt / mc))
            del tp, p
    RESULTS["eager_ops"] = [dict(op=a, dtype=b, n=c, castlab_ms=d, torch_ms=e, speed_ratio=f)
                            for a, b, c, d, e, f in op_rows]

    # ---- host time per call on tiny tensors
    ta = torch.randn(1024, device="cuda").to(torch.bfloat16)
    tb = torch.randn(1024, device="cuda").to(torch.bfloat16)
    a, b = to_cl(ta), to_cl(tb)
    sw_small = cl.jit(lambda p, q: cl.silu(p) * q)
    sw_c_small = torch.compile(sw_t, dynamic=False)
    sw_c_small(ta, tb)
    h = {
        "castlab_fused_cached": host_us(lambda: sw_small(a, b)),
        "castlab_eager_silu": host_us(lambda: cl.silu(a)),
        "castlab_eager_swiglu": host_us(lambda: cl.silu(a) * b),
        "torch_eager_silu": host_us(lambda: F.silu(ta)),
        "torch_eager_swiglu": host_us(lambda: sw_t(ta, tb)),
        "torch_compile_swiglu": host_us(lambda: sw_c_small(ta, tb)),
    }
    # the bare Program.run (C++: key, lookup, launch) under the fused plan
    sw_small(a, b)
    step = next(iter(next(iter(sw_small._cache.values())).plans.values())).steps[0]
    out = cl.empty(1024, dtype=cl.bfloat16, device="cuda")
    ins = [a, b]

    def bare():
        step[0].run(ins, [out])

    h["castlab_program_run_only"] = host_us(bare)
    RESULTS["host_us"] = h
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(3000):
        sw_small(a, b)
    pr.disable()
    sio = io.StringIO()
    pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(12)
    RESULTS["host_profile"] = sio.getvalue()

    # ---- first call (trace + NVRTC) and second-process disk-cache hit
    code = textwrap.dedent("""
        import time, json, castlab as cl, castlab.cuda as cc
        x = cl.full((4096,), 1.5, device="cuda"); cc.synchronize()
        t0 = time.perf_counter()
        y = cl.jit(lambda v: cl.silu(v) * 1.2109375 - v * 0.3251953125)(x); cc.synchronize()
        t1 = time.perf_counter()
        print(json.dumps({"first_call_s": t1 - t0, "stats": cc.kernel_cache_stats()}))
    """)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, CASTLAB_CACHE_DIR=d)
        res = []
        for _ in range(2):
            p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            res.append(json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-2000:]})
    RESULTS["first_call"] = res

    # ---- print
    print(f"\n{'case':32s} {'impl':32s} {'ms':>9s} {'GB/s':>8s} {'/copy':>7s}")
    for c, k, v, bw, ratio in rows:
        print(f"{c:32s} {k:32s} {v:9.4f} {bw:8.0f} {ratio:7.1%}")
    print(f"\n{'eager op':12s} {'dtype':9s} {'n':>10s} {'castlab ms':>11s} {'torch ms':>9s} {'torch/castlab':>14s}")
    for name, dt, n, mc, mt, ratio in op_rows:
        print(f"{name:12s} {dt:9s} {n:10d} {mc:11.4f} {mt:9.4f} {ratio:14.3f}")
    print("\nhost time per call, tiny tensors (us):")
    for k, v in h.items():
        print(f"  {k:28s} {v:8.1f}")
    print(f"  ratio castlab eager silu / torch eager silu: {h['castlab_eager_silu'] / h['torch_eager_silu']:.2f}")
    print("\nfirst call (trace+lower+NVRTC) in a fresh process, then a second process with the disk cache:")
    for k, r_ in enumerate(res):
        print(f"  process {k + 1}: {json.dumps(r_)}")
    print("\nprofile of 3000 cached fused calls (tottime):")
    print(RESULTS["host_profile"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)


if __name__ == "__main__":
    main()
