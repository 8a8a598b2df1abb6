"""A fingerprint of every kernel source castlab generates, computed on the CPU (no GPU,
no NVRTC): one SHA-256 per source and a total, written as JSON. Run it before and after
a refactoring of the code generators (issue 51) and compare: the sources must be
byte-identical.

    python scripts/codegen_identity.py OUT.json              # write the fingerprint
    python scripts/codegen_identity.py OUT.json --against BEFORE.json   # and compare

The corpus:
- every op of the op table (castlab._optable) x float storage dtypes x policies (eager,
  fused) x math presets (castlab.policy.Math.presets()), lowered by castlab.jit on the
  CPU: each Program's CUDA kernel (_C._cuda_generate, several layouts) and CPU JIT source
  (_C._cpu_codegen_source);
- the same per-op sweep built directly as Programs (tests/test_nvrtc_codegen.py's Styled
  recipes) and that test's whole kernel list (opcodes x variant bits, rounding, stores,
  layouts, recipes), in CUDA and CPU form;
- the row kernels (_C._row_kernel_source: the shared-memory, Triton register and
  SoftMax.cu kernels) of the reduction ops under each policy, preset and row length;
- the exhaustive kernels (castlab.numerics._exhaustive._kernel_source), the compare
  kernels, and the reduce, index and nll kernels.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import test_exhaustive as tex  # noqa: E402
import test_nvrtc_codegen as tn  # noqa: E402

import castlab as cl  # noqa: E402
from castlab import _C, _lower  # noqa: E402
from castlab._optable import OPS  # noqa: E402
from castlab.numerics import Enumeration  # noqa: E402
from castlab.numerics._exhaustive import _kernel_source  # noqa: E402
from castlab.policy import Math  # noqa: E402

FLOATS = ["float16", "bfloat16", "float32", "float64"]
POLICIES = ["eager", "fused"]
DT = tn.DTYPES
LAYOUTS = [tn.SCALAR, dict(kind="contig", vec=4, unroll=2, idx32=True),
           dict(kind="nd", nd=2, vec=1, idx32=False), dict(kind="static", nd=2, vec=2, idx32=True)]


class Corpus:
    def __init__(self):
        self.hashes: dict[str, str] = {}
        self.skipped: list[str] = []

    def add(self, key: str, src: str):
        if key in self.hashes:
            raise SystemExit(f"duplicate key {key}")
        self.hashes[key] = hashlib.sha256(src.encode()).hexdigest()

    def skip(self, key: str, why: Exception):
        self.skipped.append(f"{key}: {type(why).__name__}: {str(why)[:200]}")


def cuda_and_cpu(c: Corpus, key: str, prog, dtypes: list[int], n_out: int, layouts=LAYOUTS):
    """The CUDA kernels of `prog` in each layout and its CPU JIT sources."""
    nops = len(dtypes)
    for lay in layouts:
        kw = dict(dtypes=dtypes, n_out=n_out, vec=lay["vec"], idx32=lay["idx32"])
        if lay["kind"] == "contig":
            kw.update(nd=1, contig=True, unroll=lay["unroll"])
        else:
            nd = lay["nd"]
            kw.update(nd=nd, contig=False)
            if lay["kind"] == "static":  # as tests/test_nvrtc_codegen.py gen_args
                shape = [3, 5, 16 * lay["vec"]][-nd:]
                strides = []
                for k in range(nops):
                    row, step = [0] * nd, 1
                    for d in reversed(range(nd)):
                        row[d] = step
                        step *= shape[d]
                    if k >= n_out and k % 3 == 1:
                        row[-1] = 0
                    if k >= n_out and k % 3 == 2 and nd > 1:
                        row[0] = 0
                    strides += row
                kw.update(shape=shape, strides=strides)
        name, src = _C._cuda_generate(prog, **kw)
        c.add(f"cuda {key} {json.dumps(lay, sort_keys=True)}", name + "\n" + src)
    for strides in ([1] * nops, [1 if k % 2 == 0 else 0 for k in range(nops)]):
        c.add(f"cpu {key} {strides}", _C._cpu_codegen_source(prog, dtypes, strides))


def program_tests(c: Corpus):
    """tests/test_nvrtc_codegen.py's kernel list, and its recipes per op."""
    for i, (label, pb, lay) in enumerate(tn.cases()):
        prog = pb.program()
        dts = pb.out_dtypes + pb.in_dtypes
        cuda_and_cpu(c, f"case{i} {label}", prog, dts, len(pb.out_dtypes), [lay])
    presets = Math.presets()
    for name, info in OPS.items():
        for st, policy, preset in itertools.product(FLOATS, POLICIES, presets):
            key = f"styled {name} {st} {policy} {preset}"
            try:
                pb = tn.PB(st == "float64")
                s = tn.Styled(pb, DT[st], policy, Math.preset(preset))
                xs = [s.x() for _ in range(info.arity)]
                s.out(s.op(name, *xs))
                s.flush()
                cuda_and_cpu(c, key, pb.program(), pb.out_dtypes + pb.in_dtypes,
                             len(pb.out_dtypes), LAYOUTS[:2])
            except Exception as e:  # noqa: BLE001 (an op the builder cannot express)
                c.skip(key, e)


def _plan_programs(plan, in_dtypes: list[str]):
    """(Program, operand dtypes (outputs first), n_out) of each Program step of a Plan."""
    temps = [d.name for _, d in plan.temps]
    outs = [d.name for d in plan.out_dtypes]
    src = {0: in_dtypes, 1: temps, 2: outs}
    for st in plan.steps:
        if not isinstance(st[0], _C.Program):
            continue
        o = [DT[src[b[0]][b[1]]] for b in st[2]]
        i = [DT[src[b[0]][b[1]]] for b in st[1]]
        yield st[0], o + i, len(o)


def _op_fn(name: str, arity: int):
    f = getattr(cl, name)
    if arity == 1:
        return lambda x, y, z: f(x)
    if arity == 2:
        return lambda x, y, z: f(x, y)
    if OPS[name].category == "conditional":
        return lambda x, y, z: f(x > y, y, z)
    return lambda x, y, z: f(x, y, z)


def lowered(c: Corpus):
    """Each public op lowered by castlab.jit under each dtype, policy and preset."""
    presets = Math.presets()
    for name, info in OPS.items():
        if not info.public or not hasattr(cl, name):
            continue
        fn = _op_fn(name, info.arity)
        for st, policy, preset in itertools.product(FLOATS, POLICIES, presets):
            key = f"lowered {name} {st} {policy} {preset}"
            try:
                xs = [cl.randn(4, 8, seed=k, dtype=st) for k in range(3)]
                f = cl.jit(fn)
                f.run(*xs, policy=policy, math=preset)
                tr, _ = f._traced(f._bind(tuple(xs)))
                n = 0
                for plan in tr.plans.values():
                    for prog, dts, n_out in _plan_programs(plan, [st] * 3):
                        cuda_and_cpu(c, f"{key} #{n}", prog, dts, n_out, LAYOUTS[:3])
                        n += 1
            except Exception as e:  # noqa: BLE001
                c.skip(key, e)


def row_kernels(c: Corpus):
    """Row kernels of the reduction ops: every kernel kind, policy and preset."""
    old = _lower.FUSE_ROWS
    _lower.FUSE_ROWS = True
    try:
        fns = {"rms_hf": lambda x, w: cl.rms_norm(x, x.shape[-1], w, cast="hf"),
               "rms_te": lambda x, w: cl.rms_norm(x, x.shape[-1], w, cast="te"),
               "softmax": lambda x, w: cl.softmax(x, -1),
               "log_softmax": lambda x, w: cl.log_softmax(x, -1),
               "layer_norm": lambda x, w: cl.layer_norm(x, x.shape[-1], w),
               "layer_norm_b": lambda x, w: cl.layer_norm(x, x.shape[-1], w, w),
               "amax": lambda x, w: x - cl.amax(x, -1, keepdim=True),
               "amin": lambda x, w: x - cl.amin(x, -1, keepdim=True),
               "sum": lambda x, w: x * cl.sum(x, -1, keepdim=True),
               "mean": lambda x, w: x - cl.mean(x, -1, keepdim=True),
               "var": lambda x, w: cl.var(x, -1, keepdim=True) * w,
               "softmax_w": lambda x, w: cl.softmax(x * w, -1)}
        maths = {p: Math.preset(p) for p in Math.presets()}
        for order in ("torch_cpu", "torch_cuda"):
            maths[f"torch_eager/{order}"] = dataclasses.replace(Math.preset("torch_eager"),
                                                               reduction=order)
        for (fname, fn), dt, policy, (mname, math), n in itertools.product(
                fns.items(), ["bfloat16", "float16", "float32", "float64"],
                ["eager", "fused", "fp64"], maths.items(), (64, 1000, 4096)):
            key = f"row {fname} {dt} {policy} {mname} n={n}"
            try:
                x = cl.randn(4, n, seed=0, dtype=dt)
                w = cl.randn(n, seed=1, dtype=dt)
                f = cl.jit(fn)
                f.run(x, w, policy=policy, math=math)
                tr, _ = f._traced(f._bind((x, w)))
                k = 0
                for plan in tr.plans.values():
                    for spec, dts in plan.row_steps:
                        src = _C._row_kernel_source(spec, [_C.empty([1], d, "cpu") for d in dts])
                        c.add(f"{key} #{k}", src)
                        k += 1
                    for prog, pdts, n_out in _plan_programs(plan, [dt, dt]):
                        cuda_and_cpu(c, f"{key} prog#{k}", prog, pdts, n_out, LAYOUTS[:1])
                        k += 1
            except Exception as e:  # noqa: BLE001
                c.skip(key, e)
    finally:
        _lower.FUSE_ROWS = old


def exhaustive_kernels(c: Corpus):
    for case, (fn, inputs, configs, k) in tex.NVRTC_CASES.items():
        c.add(f"exhaustive {case}", _kernel_source(fn, inputs, configs, first_k=k))
    extra = {
        "decode swiglu": (tex.swiglu, [Enumeration.finite(cl.bfloat16),
                                       Enumeration.sample(cl.bfloat16, 64, seed=5)], ["fused"], 1),
        "portable pair": (tex.swiglu, [Enumeration.finite(cl.bfloat16),
                                       Enumeration.sample(cl.bfloat16, 12, seed=5)],
                          [("eager", "portable"), ("fused", "portable")], 1),
        "fp8 presets": (tex.swiglu, [Enumeration.sample(cl.float8_e4m3fn, 40, seed=1),
                                     Enumeration.all(cl.float8_e4m3fn)],
                        [("eager", "torch_eager"), ("fused", "inductor")], 1),
        "of array": (tex.mixed3, [Enumeration.sample(cl.float8_e4m3fn, 5, seed=1),
                                  Enumeration.all(cl.float8_e4m3fn),
                                  Enumeration.of(np.array([0.5, -3.0, 7.0], dtype=np.float32))],
                     ["fused"], 1),
    }
    for case, (fn, inputs, configs, k) in extra.items():
        for ref in ("portable", "torch_eager"):
            c.add(f"exhaustive {case} ref={ref}",
                  _kernel_source(fn, inputs, configs, ref_math=ref, first_k=k))


def fixed_kernels(c: Corpus):
    c.add("compare", _C._compare_cuda_source())
    for f64 in (False, True):
        for order in range(11):  # ReduceOrder (one kernel per order since 2026-12-06)
            c.add(f"reduce f64={f64} order={order}", _C._reduce_kernel_source(f64, order))
        c.add(f"nll f64={f64}", _C._nll_kernel_source(f64))
    c.add("index", _C._index_kernel_source())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--against", help="a fingerprint to require identical hashes with")
    a = ap.parse_args()
    t0 = time.perf_counter()
    c = Corpus()
    for part in (fixed_kernels, exhaustive_kernels, program_tests, lowered, row_kernels):
        n0 = len(c.hashes)
        part(c)
        print(f"{part.__name__}: {len(c.hashes) - n0} sources", file=sys.stderr)
    total = hashlib.sha256("".join(f"{k}\0{v}\n" for k, v in sorted(c.hashes.items()))
                           .encode()).hexdigest()
    doc = {"count": len(c.hashes), "total": total, "skipped": c.skipped, "sources": c.hashes}
    pathlib.Path(a.out).write_text(json.dumps(doc, indent=0, sort_keys=True))
    kinds = {}
    for k in c.hashes:
        kinds[k.split()[0]] = kinds.get(k.split()[0], 0) + 1
    print(f"{len(c.hashes)} sources {kinds}, {len(c.skipped)} skipped, total {total}, "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if a.against:
        before = json.loads(pathlib.Path(a.against).read_text())
        b = before["sources"]
        missing = sorted(set(b) - set(c.hashes))
        new = sorted(set(c.hashes) - set(b))
        diff = sorted(k for k in set(b) & set(c.hashes) if b[k] != c.hashes[k])
        for k in diff[:20]:
            print(f"DIFFERS: {k}", file=sys.stderr)
        print(f"compared {len(set(b) & set(c.hashes))}: {len(diff)} differ, {len(missing)} "
              f"missing, {len(new)} new; totals {'equal' if before['total'] == total else 'DIFFER'}",
              file=sys.stderr)
        sys.exit(1 if diff or missing or new or before["total"] != total else 0)


if __name__ == "__main__":
    main()
