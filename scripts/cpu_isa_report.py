"""castlab vs torch CPU, under each build torch can run here (issue 49 item 4).

ATEN_CPU_CAPABILITY (default | avx2 | avx512) picks torch's CPU build once per process, before
torch is imported, so each capability runs in a child process of its own. Each child compares
castlab (plain eager calls, and ``jit.run(policy="eager", math="torch_eager")``; gradients by
``castlab.vjp`` under the eager policy) with torch eager and torch CPU autograd on the same
inputs, bit for bit (NaN equals NaN, -0 differs from +0), and prints one line per case.

    python scripts/cpu_isa_report.py                 # every capability this CPU has, full sizes
    python scripts/cpu_isa_report.py --quick         # the sizes tests/test_cpu_isa.py runs
    python scripts/cpu_isa_report.py --isa avx2 --only softmax

A capability the CPU lacks (torch would not choose it there: castlab.policy._capability_of) is
skipped and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ISAS = ("default", "avx2", "avx512")


def cpu_flags() -> set:
    """The x86 feature flags of the first CPU in /proc/cpuinfo (empty elsewhere)."""
    from castlab.policy import _cpu_flags

    return _cpu_flags()


def supported_isas() -> dict:
    """capability -> None where this CPU runs torch's build of it, else why not (torch's
    own choice on this CPU, castlab.policy._capability_of, and every build below it)."""
    from castlab.policy import _capability_of

    rank = {"": 0, "DEFAULT": 0, "AVX2": 1, "AVX512": 2}[_capability_of(cpu_flags())]
    return {"default": None,
            "avx2": None if rank >= 1 else "the CPU has no AVX2/FMA",
            "avx512": None if rank >= 2 else "the CPU has no AVX512VL/BW/DQ with FMA"}


# ---------------------------------------------------------------- the child: one capability

def _child(quick: bool, only: str | None, mkldnn: bool) -> None:  # noqa: C901  (flat cases)
    import torch

    import castlab as cl

    torch.backends.mkldnn.enabled = mkldnn  # off: gelu (erf) runs Gelu.h / Activation.cpp

    F = torch.nn.functional
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64}
    idt = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
           torch.float16: torch.int16}
    cap = torch.backends.cpu.get_cpu_capability()

    def C(t):
        return cl.from_dlpack(t.detach().contiguous())

    def T(x):
        return torch.from_dlpack(x)

    def bad(got, want) -> int:
        got = got if isinstance(got, torch.Tensor) else T(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.shape, want.shape)
        same = (got.view(idt[want.dtype]) == want.view(idt[want.dtype])) | (
            got.isnan() & want.isnan())
        return int((~same).sum())

    def data(shape, dt, seed, scale=3.0, specials=True):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
        if specials:
            flat = x.view(-1)
            sp = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-30,
                               -1e-30, 88.5, -88.5, 100.0, -100.0, 1e-3, 20.0, -20.0],
                              dtype=torch.float64)
            k = min(flat.numel(), sp.numel())
            idx = torch.randperm(flat.numel(), generator=g)[:k]
            flat[idx] = sp[:k]
        return x.to(tdt[dt])

    def report(case, dt, shape, n_bad, total):
        print(json.dumps({"cap": cap, "case": case, "dtype": dt, "shape": list(shape),
                          "bad": n_bad, "total": total}), flush=True)

    def want_case(name):
        return only is None or only in name

    # Math.cpu_isa "auto" follows the capability torch runs
    isa = {"DEFAULT": "default", "AVX2": "avx2", "AVX512": "avx512"}.get(cap, "?")
    report("Math().torch_cpu_isa() == " + isa, "-", (), int(cl.Math().torch_cpu_isa() != isa), 1)

    def tgrads(fn, args, cts):
        ts = [a.detach().clone().requires_grad_(True) for a in args]
        out = fn(*ts)
        outs = out if isinstance(out, tuple) else (out,)
        return outs, torch.autograd.grad(outs, ts, cts)

    def cgrads(fn, args, cts):
        outs, pullback = cl.vjp(fn, *[C(a) for a in args], policy="eager", math="torch_eager")
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        return outs, pullback(*[C(c) for c in cts])

    def check_grad(name, dt, shape, tfn, cfn, args, seed):
        if not want_case(name):
            return
        with torch.no_grad():
            shapes = tfn(*args)
        shapes = shapes if isinstance(shapes, tuple) else (shapes,)
        cts = [data(o.shape, dt, seed + 7 + i, 1.0, False) for i, o in enumerate(shapes)]
        tout, tg = tgrads(tfn, args, cts)
        cout, cg = cgrads(cfn, args, cts)
        nb = sum(bad(c, t) for c, t in zip(cout, tout))
        report(name + " fwd", dt, shape, nb, sum(t.numel() for t in tout))
        for i, (c, t) in enumerate(zip(cg, tg)):
            report(f"{name} d{i}", dt, shape, bad(c, t), t.numel())

    dts = ("float32", "bfloat16", "float16", "float64")
    sizes = (4097, 70001) if quick else (1000, 4097, 1 << 20)

    # ---- elementwise forward: plain eager and jit eager
    unary = {
        "exp": (torch.exp, cl.exp), "log": (torch.log, cl.log), "sin": (torch.sin, cl.sin),
        "cos": (torch.cos, cl.cos), "tanh": (torch.tanh, cl.tanh),
        "sigmoid": (torch.sigmoid, cl.sigmoid), "silu": (F.silu, cl.silu),
        "gelu": (F.gelu, cl.gelu),
        "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"),
                      lambda t: cl.gelu(t, approximate="tanh")),
        "rsqrt": (torch.rsqrt, cl.rsqrt), "sqrt": (torch.sqrt, cl.sqrt),
        "erf": (torch.erf, cl.erf), "reciprocal": (torch.reciprocal, cl.reciprocal),
        "hardswish": (F.hardswish, cl.hardswish),
        "pow2.5": (lambda t: t ** 2.5, lambda t: t ** 2.5),
        "pow1.1": (lambda t: t ** 1.1, lambda t: t ** 1.1),
    }
    for n in sizes:
        for dt in dts:
            x = data(n, dt, seed=n)
            xa = x.abs()
            for name, (tf, cf) in unary.items():
                if not want_case(name):
                    continue
                xin = xa if name.startswith("pow") else x
                want = tf(xin)
                report(f"{name}", dt, (n,), bad(cf(C(xin)), want), n)
                jf = cl.jit(cf)
                report(f"{name} jit", dt, (n,),
                       bad(jf.run(C(xin), policy="eager", math="torch_eager"), want), n)
            if want_case("pow(T,T)"):
                y = data(n, dt, seed=n + 1, scale=1.0)
                report("pow(T,T)", dt, (n,), bad(C(xa) ** C(y), xa ** y), n)

    # ---- backward kernels and the two chains of DESIGN.md
    gsizes = (4097, 70001) if quick else (1000, 4097, 1 << 20)
    for n in gsizes:
        for dt in dts:
            x = data(n, dt, seed=3 * n, specials=False)
            for name, (tf, cf) in (
                    ("silu_backward", (F.silu, cl.silu)),
                    ("sigmoid_backward", (torch.sigmoid, cl.sigmoid)),
                    ("tanh_backward", (torch.tanh, cl.tanh)),
                    ("gelu_backward", (F.gelu, cl.gelu)),
                    ("gelu_tanh_backward", (lambda t: F.gelu(t, approximate="tanh"),
                                            lambda t: cl.gelu(t, approximate="tanh")))):
                check_grad(name, dt, (n,), tf, cf, [x], seed=n)
            b = data(n, dt, seed=3 * n + 1, scale=1.0, specials=False)
            check_grad("swiglu", dt, (n,), lambda a, b: F.silu(a) * b,
                       lambda a, b: cl.silu(a) * b, [x, b], seed=n + 1)
    for dt in dts:
        hd = 64
        S = 64 if quick else 512
        q = data((2, 4, S, hd), dt, seed=20, scale=1.0, specials=False)
        pos = torch.arange(S, dtype=torch.float64)[:, None]
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.cat([pos * inv, pos * inv], dim=-1)
        cos, sin = ang.cos().to(tdt[dt]), ang.sin().to(tdt[dt])

        def rope_t(q, cos=cos, sin=sin):
            h = q.shape[-1] // 2
            return q * cos + torch.cat([-q[..., h:], q[..., :h]], -1) * sin

        ccos, csin = C(cos), C(sin)

        def rope_c(q, cos=ccos, sin=csin):
            h = q.shape[-1] // 2
            return q * cos + cl.cat([-q[..., h:], q[..., :h]], dim=-1) * sin
        check_grad("rope", dt, tuple(q.shape), rope_t, rope_c, [q], seed=21)

    # ---- reductions, softmax, norms
    rshapes = ((64, 1000), (16, 4097)) if quick else ((64, 1000), (16, 4097), (1024, 1024))
    for shape in rshapes:
        for dt in dts:
            x = data(shape, dt, seed=shape[1], scale=2.0, specials=False)
            for dim, dn in ((-1, "last"), (0, "dim0"), (None, "all")):
                for name, tf, cf in (
                        ("sum", lambda t, d: t.sum(d), lambda t, d: cl.sum(t, d)),
                        ("mean", lambda t, d: t.mean(d), lambda t, d: cl.mean(t, d)),
                        ("var", lambda t, d: t.var(d), lambda t, d: cl.var(t, d)),
                        ("amax", lambda t, d: t.amax(() if d is None else d),
                         lambda t, d: cl.amax(t, () if d is None else d))):
                    if not want_case(name):
                        continue
                    want = tf(x, dim)
                    report(f"{name} {dn}", dt, shape, bad(cf(C(x), dim), want), want.numel())
                    jf = cl.jit(lambda t, d=dim, cf=cf: cf(t, d))
                    report(f"{name} {dn} jit", dt, shape,
                           bad(jf.run(C(x), policy="eager", math="torch_eager"), want),
                           want.numel())
            for dim, dn in ((-1, "last"), (0, "dim0")):
                for name, tf, cf in (("softmax", torch.softmax, cl.softmax),
                                     ("log_softmax", torch.log_softmax, cl.log_softmax)):
                    if not want_case(name):
                        continue
                    want = tf(x, dim)
                    report(f"{name} {dn}", dt, shape, bad(cf(C(x), dim), want), want.numel())
                    check_grad(f"{name} {dn} grad", dt, shape,
                               lambda t, d=dim, tf=tf: tf(t, d),
                               lambda t, d=dim, cf=cf: cf(t, d), [x], seed=5)
            n = shape[-1]
            w = data(n, dt, seed=1, scale=1.0, specials=False) + 1
            bb = data(n, dt, seed=2, scale=1.0, specials=False)
            if want_case("layer_norm"):
                want = F.layer_norm(x, (n,), w, bb)
                report("layer_norm", dt, shape, bad(cl.layer_norm(C(x), n, C(w), C(bb)), want),
                       want.numel())

            def hf_t(x, w):
                h = x.to(torch.float32) if x.dtype != torch.float64 else x
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
                return w * h.to(x.dtype)
            if want_case("rms_norm"):
                want = hf_t(x, w)
                report("rms_norm hf", dt, shape,
                       bad(cl.rms_norm(C(x), n, C(w), 1e-6, cast="hf"), want), want.numel())
            check_grad("rms_norm hf grad", dt, shape, hf_t,
                       lambda x, w, n=n: cl.rms_norm(x, n, w, 1e-6, cast="hf"), [x, w], seed=9)


# ---------------------------------------------------------------- the parent

def run(isas, quick: bool = False, only: str | None = None, timeout: float = 1800,
        mkldnn: bool = True) -> list:
    """Rows (dicts) from one child per capability; a capability the CPU lacks gives one row
    with "skipped". mkldnn=False turns torch.backends.mkldnn off in the child (oneDNN's
    gelu backward is not reproduced: docs/torch_cpu_kernels.md)."""
    rows = []
    ok = supported_isas()
    for isa in isas:
        if ok[isa] is not None:
            rows.append({"cap": isa, "skipped": ok[isa]})
            continue
        env = {**os.environ, "ATEN_CPU_CAPABILITY": isa}
        args = [sys.executable, os.path.abspath(__file__), "--child"]
        args += ["--quick"] if quick else []
        args += ["--only", only] if only else []
        args += [] if mkldnn else ["--no-mkldnn"]
        r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{isa}: child failed\n{r.stderr[-4000:]}")
        got = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        want_cap = {"default": "DEFAULT", "avx2": "AVX2", "avx512": "AVX512"}[isa]
        if got and got[0]["cap"] != want_cap:
            raise RuntimeError(f"{isa}: torch reports {got[0]['cap']}")
        rows += got
    return rows


def table(rows: list, all_rows: bool = False) -> str:
    """The mismatching cases per capability (every case with all_rows)."""
    out = []
    for r in rows:
        if "skipped" in r:
            out.append(f"{r['cap']:8s} skipped: {r['skipped']}")
        elif r["bad"] or all_rows:
            out.append(f"{r['cap']:8s} {r['case']:28s} {r['dtype']:9s} "
                       f"{'x'.join(map(str, r['shape'])):>12s} {r['bad']:>9d} / {r['total']}")
    caps = sorted({r["cap"] for r in rows if "skipped" not in r})
    for c in caps:
        rs = [r for r in rows if r.get("cap") == c and "bad" in r]
        out.append(f"{c}: {sum(1 for r in rs if r['bad'])} of {len(rs)} cases differ, "
                   f"{sum(r['bad'] for r in rs)} of {sum(r['total'] for r in rs)} elements")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isa", default=",".join(ISAS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None, help="cases whose name contains this")
    ap.add_argument("--all", action="store_true", help="list matching cases too")
    ap.add_argument("--no-mkldnn", action="store_true",
                    help="torch.backends.mkldnn.enabled = False in the children")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.quick, a.only, not a.no_mkldnn)
        return
    print(table(run(a.isa.split(","), a.quick, a.only, mkldnn=not a.no_mkldnn), a.all))


if __name__ == "__main__":
    main()
