"""castlab's fused backward kernels on the GPU against PyTorch, in one run.

Cases (bf16):
  SwiGLU backward  silu(a) * b, a/b/dy 256M elements each -> da, db
                   bytes moved = 3 reads + 2 writes
  RoPE backward    HF rotate_half RoPE, q [4,28,4096,128], cos/sin [4,1,4096,128]
                   (broadcast over heads) -> dq; bytes = dy + cos + sin reads, dq write
Implementations: castlab ``backward_fn().run(..., policy="fused", math="inductor")``,
torch.compile(dynamic=False) of the forward with requires_grad inputs (only the compiled
backward is timed: autograd.grad(..., retain_graph=True) on one recorded graph), torch
eager autograd (the same way), and a device-to-device copy of the same bytes (the
bandwidth anchor). Two timings: CUDA events on one stream (launches queued behind a sleep
kernel, bench_cuda.device_ms) and the host clock around many calls (then a sync).

Usage: python benchmarks/bench_backward.py [--json PATH] [--small]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _require_gpu():
    script = os.path.basename(sys.argv[0])
    try:
        import torch

        import castlab.cuda as clcuda
    except ImportError as e:
        sys.exit(f"{script} needs torch and castlab importable: {e}")
    if not torch.cuda.is_available():
        sys.exit(f"{script} needs an NVIDIA GPU: torch.cuda.is_available() is False")
    if not clcuda.is_available():
        sys.exit(f"{script} needs an NVIDIA GPU: castlab sees none ({clcuda.info()})")


def host_ms(fn, iters=20, reps=3):
    """Median over reps of (host time of `iters` calls and a final sync) / iters, in ms."""
    import torch

    import castlab.cuda as clcuda

    fn()
    torch.cuda.synchronize()
    clcuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        clcuda.synchronize()
        out.append((time.perf_counter() - t0) / iters * 1e3)
    return statistics.median(out)


def measure_case(case: str, nbytes: int, impls: dict, rows: list, results: dict) -> None:
    """Time each implementation (name -> (fn, stream)) and a device copy of the same bytes
    (the bandwidth anchor), by CUDA events and by the host clock; append one row per
    implementation and timing to `rows` (ratios to the copy and to "torch.compile") and
    the raw times to results["cases"][case]."""
    import torch
    from bench_cuda import device_ms, gbps

    half = nbytes // 2 // 2          # bf16 elements read (= written) by the copy
    src = torch.empty(half, dtype=torch.bfloat16, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    impls = {**impls, "copy (same bytes)": (lambda: dst.copy_(src), torch.cuda.current_stream())}
    r = {}
    for name, (fn, stream) in impls.items():
        r[name] = {"event_ms": device_ms(fn, stream, iters=10, reps=5), "host_ms": host_ms(fn)}
    for timing in ("event_ms", "host_ms"):
        copy_ms = r["copy (same bytes)"][timing]
        comp_ms = r["torch.compile"][timing]
        for name, v in r.items():
            ms = v[timing]
            rows.append((case, name, timing.split("_")[0], ms, gbps(nbytes, ms),
                         copy_ms / ms, ms / comp_ms))
    results["cases"][case] = {"bytes": nbytes, **r}


def print_rows(rows: list) -> None:
    """The table of measure_case's rows."""
    print(f"\n{'case':30s} {'impl':26s} {'timing':6s} {'ms':>9s} {'GB/s':>7s} {'%copy':>7s} "
          f"{'/compile':>9s}")
    for case, name, timing, ms, bw, frac, ratio in rows:
        print(f"{case:30s} {name:26s} {timing:6s} {ms:9.4f} {bw:7.0f} {frac:7.1%} {ratio:9.3f}")
    print("\n%copy: copy time of the same bytes / this time;  /compile: this time / "
          "torch.compile's (< 1: faster than torch.compile)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the numbers to this file")
    ap.add_argument("--small", action="store_true", help="1/16 of the sizes (a smoke run)")
    args = ap.parse_args()
    _require_gpu()

    import torch
    import torch.nn.functional as F
    from bench_cuda import stream_of_castlab, to_cl

    import castlab as cl
    import castlab.cuda as clcuda

    info = clcuda.info()
    dev = info["devices"][0]
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"# castlab backward benchmark  {now:%Y-%m-%d %H:%M} UTC")
    print(f"# {dev['name']} cc {dev['compute_capability']}  driver {info['driver_version']}  "
          f"NVRTC {info['nvrtc_version']}  torch {torch.__version__}")
    results: dict = {"device": dev["name"], "date": f"{now:%Y-%m-%d}", "cases": {}}
    ts, cs = torch.cuda.current_stream(), stream_of_castlab()
    div = 16 if args.small else 1
    rows = []

    def measure(case, nbytes, impls):
        measure_case(case, nbytes, impls, rows, results)

    g = torch.Generator(device="cuda").manual_seed(0)

    def swiglu():
        # ---- SwiGLU backward: da, db of silu(a) * b
        n = (1 << 28) // div
        ta = (torch.randn(n, device="cuda", generator=g) * 4).to(torch.bfloat16)
        tb = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        tdy = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        a, b, dy = to_cl(ta), to_cl(tb), to_cl(tdy)
        sw_bwd = cl.jit(lambda p, q: cl.silu(p) * q).backward_fn()
        sw_t = lambda p, q: F.silu(p) * q  # noqa: E731
        torch._dynamo.reset()
        sw_c = torch.compile(sw_t, dynamic=False)
        pa, pb = ta.detach().requires_grad_(), tb.detach().requires_grad_()
        y_c, y_e = sw_c(pa, pb), sw_t(pa, pb)   # one graph each; only the backward is timed
        impls = {
            "castlab fused/inductor": (
                lambda: sw_bwd.run(a, b, dy, policy="fused", math="inductor"), cs),
            "torch.compile": (
                lambda: torch.autograd.grad(y_c, (pa, pb), tdy, retain_graph=True), ts),
            "torch eager": (
                lambda: torch.autograd.grad(y_e, (pa, pb), tdy, retain_graph=True), ts),
        }
        measure(f"swiglu bwd bf16 3x{n >> 20}M", 5 * n * 2, impls)

    def rope():
        # ---- RoPE backward: dq of q * cos + rotate_half(q) * sin (cos/sin not differentiated)
        B, H, S, D = 4, 28, 4096 // div, 128
        tq = torch.randn(B, H, S, D, device="cuda", generator=g).to(torch.bfloat16)
        tdq = torch.randn(B, H, S, D, device="cuda", generator=g).to(torch.bfloat16)
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
        fr = torch.outer(torch.arange(S, device="cuda", dtype=torch.float32), inv)
        emb = torch.cat([fr, fr], dim=-1)
        tcos = emb.cos().to(torch.bfloat16).expand(B, 1, S, D).contiguous()
        tsin = emb.sin().to(torch.bfloat16).expand(B, 1, S, D).contiguous()

        def rope_t(x, cos, sin):
            h = x.shape[-1] // 2
            return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

        def rope_c(x, cos, sin):
            h = x.shape[-1] // 2
            return x * cos + cl.cat([-x[..., h:], x[..., :h]], dim=-1) * sin

        q, dq, co, si = to_cl(tq), to_cl(tdq), to_cl(tcos), to_cl(tsin)
        ro_bwd = cl.jit(rope_c).backward_fn(argnums=0)
        torch._dynamo.reset()
        ro_c = torch.compile(rope_t, dynamic=False)
        pq = tq.detach().requires_grad_()
        y_c, y_e = ro_c(pq, tcos, tsin), rope_t(pq, tcos, tsin)
        impls = {
            "castlab fused/inductor": (
                lambda: ro_bwd.run(q, co, si, dq, policy="fused", math="inductor"), cs),
            "torch.compile": (
                lambda: torch.autograd.grad(y_c, (pq,), tdq, retain_graph=True), ts),
            "torch eager": (
                lambda: torch.autograd.grad(y_e, (pq,), tdq, retain_graph=True), ts),
        }
        nbytes = 2 * tq.numel() * 2 + 2 * tcos.numel() * 2
        measure(f"rope bwd bf16 [{B},{H},{S},{D}]", nbytes, impls)

    # each case in its own function: its tensors are freed before the next
    swiglu()
    torch.cuda.empty_cache()
    clcuda.empty_cache()
    rope()

    print_rows(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
