"""CPU speed and peak memory of the seed chains: castlab eager, castlab fused (cl.jit),
torch CPU eager and torch.compile, on the same inputs.

    PYTHONPATH=python python3 benchmarks/bench_cpu.py [--quick] [--no-compile]
    PYTHONPATH=python python3 benchmarks/bench_cpu.py --vs-compile [--threads N]  # 1M/16M

SwiGLU: silu(a) * b, bf16, a and b 16M elements each.
RoPE:   x*cos + cat(-x2, x1)*sin, bf16 x [1,32,4096,128], cos/sin [4096,128] (broadcast).

Times are the best of several runs (ms). Peak memory is measured in a fresh subprocess per
(chain, implementation): resident set after the inputs exist, then the peak (VmHWM, reset
through /proc/self/clear_refs) while one call runs; the table shows that growth next to the
size of the output, so "extra" is what the implementation allocates beyond its output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYPATH = os.path.join(os.path.dirname(HERE), "python")


def _setup(chain: str, quick: bool, n: int | None = None, dtype: str = "bfloat16"):
    import torch

    import castlab as cl

    torch.manual_seed(0)
    tdt = getattr(torch, dtype)
    if chain == "swiglu":
        n = n or ((1 << 22) if quick else (1 << 24))
        a = torch.randn(n).to(tdt)
        b = torch.randn(n).to(tdt)
        targs = (a, b)

        def tfn(a, b):
            return torch.nn.functional.silu(a) * b

        def cfn(a, b):
            return cl.silu(a) * b
    else:
        s = (n // (32 * 128)) if n else (1024 if quick else 4096)
        x = torch.randn(1, 32, s, 128).to(tdt)
        ang = torch.arange(s)[:, None] * (10000.0 ** (-torch.arange(64) / 64))[None, :]
        ang = torch.cat([ang, ang], -1)
        targs = (x, ang.cos().to(tdt), ang.sin().to(tdt))

        def tfn(x, cos, sin):
            x1, x2 = x.chunk(2, -1)
            return x * cos + torch.cat([-x2, x1], -1) * sin

        def cfn(x, cos, sin):
            x1, x2 = cl.chunk(x, 2, -1)
            return x * cos + cl.cat([-x2, x1], dim=-1) * sin
    cargs = tuple(cl.from_dlpack(t) for t in targs)
    return cl, torch, targs, cargs, tfn, cfn


def _impls(cl, torch, tfn, cfn, want_compile: bool):
    # torch_eager math (the default) uses castlab's portable exp on the CPU; the rows
    # "C-library exp" run the same ops with the C library's scalar expf instead.
    libm = cl.Math("torch_eager_libm", impl="libm")

    def eager_libm(*a):
        with cl.use_math(libm):
            return cfn(*a)

    impls = {"castlab eager": ("cl", cfn), "castlab fused": ("cl", cl.jit(cfn)),
             "cl eager C-lib exp": ("cl", eager_libm),
             "cl fused C-lib exp": ("cl", cl.jit(cfn, math=libm)),
             "torch eager": ("torch", tfn)}
    if want_compile:
        impls["torch.compile"] = ("torch", torch.compile(tfn))
    return impls


def _best(fn, args, reps: int) -> float:
    fn(*args)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def memory_child(chain: str, impl: str, quick: bool) -> None:
    cl, torch, targs, cargs, tfn, cfn = _setup(chain, quick)
    kind, fn = _impls(cl, torch, tfn, cfn, impl == "torch.compile")[impl]
    args = cargs if kind == "cl" else targs
    if impl in ("castlab fused", "cl fused C-lib exp", "torch.compile"):
        out = fn(*args)  # trace / compile first: not part of the steady-state peak
        del out
    import gc

    gc.collect()
    cl._C.cpu_empty_cache()  # castlab keeps freed blocks for reuse: count fresh memory only
    rss0 = _status_kb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        reset = True
    except OSError:
        reset = False
    out = fn(*args)
    peak = _status_kb("VmHWM")
    out_bytes = out.numel() * out.element_size() if hasattr(out, "element_size") else out.numel() * out.itemsize
    in_bytes = sum(t.numel() * t.element_size() for t in targs)
    print(json.dumps({"growth_mb": (peak - rss0) / 1024, "out_mb": out_bytes / 2**20,
                      "in_mb": in_bytes / 2**20, "reset": reset}))


def vs_compile(reps: int, threads: int) -> None:
    """castlab fused (cl.jit, default math) against torch.compile (Inductor C++) at 1M and
    16M elements, bf16 and fp32, same inputs, same run (issue 21's CPU goal). castlab's
    compiled loop (cl.cpu_codegen) is waited for after the first call, as torch.compile's
    compilation is: both are timed in their steady state. "cl interp" is castlab's
    interpreter alone (the code generator off) in the same run."""
    import torch

    import castlab as cl

    torch.set_num_threads(threads)
    cl._C.set_num_threads(threads)
    print(f"castlab {cl.__version__}, torch {torch.__version__}, {threads} threads "
          f"({os.cpu_count()} CPUs)")
    print(f"{'chain':7} {'dtype':9} {'elements':>9} {'cl fused ms':>12} {'cl interp ms':>13} "
          f"{'compile ms':>11} {'compile/cl':>11}")
    mode = cl.cpu_codegen()["mode"]
    for chain in ("swiglu", "rope"):
        for dtype in ("bfloat16", "float32"):
            for n in (1 << 20, 1 << 24):
                _, _, targs, cargs, tfn, cfn = _setup(chain, False, n, dtype)
                comp, jf = torch.compile(tfn), cl.jit(cfn)
                comp(*targs)
                jf(*cargs)
                cl.cpu_codegen(wait=True)  # the compiled loop (background) is ready
                t_cl = min(_best(jf, cargs, reps) for _ in range(3))
                cl.cpu_codegen("off")
                t_in = min(_best(jf, cargs, reps) for _ in range(3))
                cl.cpu_codegen(mode)
                t_tc = min(_best(comp, targs, reps) for _ in range(3))
                print(f"{chain:7} {dtype:9} {n:>9} {t_cl:12.3f} {t_in:13.3f} {t_tc:11.3f} "
                      f"{t_tc / t_cl:10.2f}x")
    st = cl.cpu_codegen()
    print("compile/cl > 1: castlab faster than torch.compile.")
    print(f"castlab's compiled CPU loops: {st['mode']}, {st['compiled']} compiled in "
          f"{st['compile_seconds']:.2f} s, {st['disk_hits']} from the disk cache, "
          f"{st['failures']} failed, {st['runs']} runs ({st['compiler'] or st['why_not']})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vs-compile", action="store_true",
                    help="castlab fused vs torch.compile at 1M and 16M, bf16 and fp32")
    ap.add_argument("--quick", action="store_true", help="4x smaller inputs")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="CPU threads for castlab and torch (--vs-compile; default: all)")
    ap.add_argument("--_mem", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.vs_compile:
        vs_compile(a.reps, a.threads)
        return
    if a._mem:
        memory_child(a._mem[0], a._mem[1], a.quick)
        return

    import torch

    import castlab as cl

    ncpu = os.cpu_count()
    torch.set_num_threads(ncpu)
    print(f"castlab {cl.__version__}, torch {torch.__version__}, {ncpu} CPU threads"
          + (" (quick sizes)" if a.quick else ""))
    compile_ok = not a.no_compile
    compile_note = "skipped (--no-compile)" if a.no_compile else ""
    rows = []
    for chain in ("swiglu", "rope"):
        cl, torch, targs, cargs, tfn, cfn = _setup(chain, a.quick)
        impls = _impls(cl, torch, tfn, cfn, False)
        if compile_ok:
            try:
                t0 = time.perf_counter()
                comp = torch.compile(tfn)
                comp(*targs)
                compile_note = f"ok (first call {time.perf_counter() - t0:.1f} s)"
                impls["torch.compile"] = ("torch", comp)
            except Exception as e:  # no compiler, unsupported CPU, ...
                compile_ok = False
                compile_note = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        # same inputs, same results (bitwise for eager; fused rounds once)
        ref = tfn(*targs)
        ce = impls["castlab eager"][1](*cargs)
        same = torch.equal(torch.from_dlpack(ce).view(torch.int16), ref.view(torch.int16))
        times = {}
        for name, (kind, fn) in impls.items():
            times[name] = _best(fn, cargs if kind == "cl" else targs, a.reps)
        mem = {}
        for name in impls:
            try:
                r = subprocess.run([sys.executable, __file__, "--_mem", chain, name]
                                   + (["--quick"] if a.quick else []),
                                   capture_output=True, text=True, timeout=120,
                                   env={**os.environ, "PYTHONPATH": PYPATH + os.pathsep
                                        + os.environ.get("PYTHONPATH", "")})
                mem[name] = json.loads(r.stdout.strip().splitlines()[-1])
            except Exception as e:  # report and continue
                mem[name] = {"error": f"{type(e).__name__}"}
        rows.append((chain, times, mem, same))

    print(f"torch.compile: {compile_note}")
    print()
    hdr = (f"{'chain':7} {'implementation':15} {'time ms':>9} {'vs torch eager':>15} "
           f"{'vs cl eager':>12} {'peak growth MB':>15} {'output MB':>10} {'extra MB':>9}")
    print(hdr)
    print("-" * len(hdr))
    for chain, times, mem, same in rows:
        te, ce = times["torch eager"], times["castlab eager"]
        for name, t in times.items():
            m = mem.get(name, {})
            if "growth_mb" in m:
                g, o = m["growth_mb"], m["out_mb"]
                mtxt = f"{g:15.1f} {o:10.1f} {g - o:9.1f}"
            else:
                mtxt = f"{m.get('error', '?'):>15}"
            print(f"{chain:7} {name:15} {t:9.2f} {te / t:14.2f}x {ce / t:11.2f}x {mtxt}")
        ins = next(iter(mem.values())).get("in_mb", float("nan"))
        print(f"{'':7} inputs {ins:.1f} MB; castlab eager == torch eager bitwise: {same}")
    print()
    print("ratios > 1 mean faster than the reference column.")


if __name__ == "__main__":
    main()
