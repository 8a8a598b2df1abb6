"""The CUDA code generator, compiled with NVRTC on any machine: no GPU, no driver.

Every kernel shape the generator can emit (each opcode, the math-variant bits, f32 and
f64 registers, every storage dtype loaded and stored, each rounding mode with and
without saturation, contiguous layouts with each vector width and unroll, n-D layouts
with a run-time or a static shape, 32- and 64-bit indices, one to three outputs, and
eager- and fused-style programs) is generated with ``_C._cuda_generate`` and compiled
with ``_C._nvrtc_compile_check``: the options and embedded headers of the real kernel
cache, for ``sm_90`` (set CASTLAB_NVRTC_ARCH for another, e.g. ``compute_90`` or
``sm_120``). NVRTC comes from the ``nvidia-cuda-nvrtc-cu12`` wheel (the ``test`` extra)
or a CUDA toolkit; without it the test is skipped.

To keep CI fast, kernels are compiled in batches: several generated kernels, each in its
own namespace (their ``extern "C"`` names differ), in one translation unit. A failing
batch is recompiled kernel by kernel, unmodified, to name the culprit.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from castlab import _C
from castlab import cuda as clcuda
from castlab._optable import OPCODE, OPS, TABLE
from castlab.policy import Math

ARCH = os.environ.get("CASTLAB_NVRTC_ARCH", "sm_90")
# The largest kernels (the reduce kernel with every order, the row kernels) compile here to
# PTX: NVRTC's front end and optimizer give every warning the tests look for, and ptxas,
# half of a CUBIN's time (60 s of the f32 reduce kernel's, on 2 cores), runs where these
# kernels run: the GPU suite compiles each of them to a CUBIN on the device.
PTX_ARCH = "compute_" + ARCH[3:] if ARCH.startswith("sm_") else ARCH


# ---------------------------------------------------------------- Program construction
# The one place that knows how castlab._C builds a Program (adapt here if that API changes).

def make_program(code: list[dict], n_regs: int, outputs: list[dict], seed: int = 0):
    """A _C.Program from instructions given as dicts (op: name, f64 (the register type:
    0 float, 1 double, 2 int64), dst, a, b, c, var, dtype, mode, sat, aux, imm, iimm) and
    outputs as dicts (reg, mode, sat, salt)."""
    instrs = [_C.Instr(op=OPCODE[i["op"]], rtype=int(i.get("f64", 0)), var=i.get("var", 0),
                       dtype=i.get("dtype", 0), mode=i.get("mode", 0), saturate=i.get("sat", 0),
                       dst=i["dst"], a=i.get("a", -1), b=i.get("b", -1), c=i.get("c", -1),
                       aux=i.get("aux", 0), imm=float(i.get("imm", 0.0)),
                       iimm=int(i.get("iimm", 0))) for i in code]
    outs = [_C.OutputSpec(reg=o["reg"], mode=o.get("mode", 0), saturate=o.get("sat", 1),
                          salt=o.get("salt", 0)) for o in outputs]
    return _C.Program(instrs, n_regs, outs, seed)


# ---------------------------------------------------------------- vocabulary

DTYPES = {"float64": 0, "float32": 1, "float16": 2, "bfloat16": 3, "float8_e4m3fn": 4,
          "float8_e5m2": 5, "bool": 6, "int32": 7, "int64": 8}
ITEMSIZE = {0: 8, 1: 4, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1, 7: 4, 8: 8}
MODES = {"nearest": 0, "toward_zero": 1, "stochastic": 2}

# From the op table (ops/op_table.h): a new op is compiled here without editing this file.
UNARY = [o.name for o in OPS.values() if o.arity == 1]
BINARY = [o.name for o in OPS.values() if o.arity == 2]
TERNARY = [o.name for o in OPS.values() if o.arity == 3]
SPECIAL = [o.name for o in TABLE if o.category == "internal"]
# Ops whose code depends on the variant bits (ops/scalar/ops.h VariantBits).
VARIANT_OPS = [o.name for o in OPS.values() if o.factors]
IMPLS = sorted(_C.MATH_IMPLS.values())
FLAG_BITS = [v for k, v in _C.VARIANT_BITS.items() if k != "impl_mask"]


def variants(f64: bool) -> list[int]:
    """Variant bits worth compiling: each impl with no flag and with every flag (so each
    branch a flag selects is compiled both ways), and (fp32) each flag alone. The presets'
    per-op bits are compiled by the recipes below."""
    out = {impl | extra for impl in IMPLS for extra in (0, sum(FLAG_BITS))}
    if not f64:
        out |= {1 | bit for bit in FLAG_BITS}
    return sorted(out)


class PB:
    """A small program builder: one register per value, loads numbered in order."""

    def __init__(self, f64: bool = False):
        self.f64 = f64
        self.code: list[dict] = []
        self.n = 0
        self.in_dtypes: list[int] = []
        self.outs: list[dict] = []
        self.out_dtypes: list[int] = []

    def ins(self, op, a=-1, b=-1, c=-1, f64=None, **kw) -> int:
        r = self.n
        self.n += 1
        self.code.append(dict(op=op, f64=self.f64 if f64 is None else f64, dst=r, a=a, b=b, c=c,
                              **kw))
        return r

    def load(self, dtype: int, f64=None) -> int:
        self.in_dtypes.append(dtype)
        return self.ins("load", dtype=dtype, aux=len(self.in_dtypes) - 1, f64=f64)

    def const(self, v: float, f64=None) -> int:
        return self.ins("const", imm=v, f64=f64)

    def round(self, a: int, dtype: int, mode: int = 0, sat: int = 1, salt: int = 0) -> int:
        return self.ins("round", a, dtype=dtype, mode=mode, sat=sat, aux=salt)

    def out(self, reg: int, dtype: int, mode: int = 0, sat: int = 1, salt: int = 0):
        self.outs.append(dict(reg=reg, mode=mode, sat=sat, salt=salt))
        self.out_dtypes.append(dtype)

    def program(self, seed: int = 1234):
        return make_program(self.code, self.n, self.outs, seed)


# ---------------------------------------------------------------- layouts

def layouts() -> list[dict]:
    """Every walk the generator writes: contiguous (vec x unroll), n-D with a run-time
    shape, n-D with a static shape and strides; 32- and 64-bit indices alternate."""
    out = []
    for vec, unroll in itertools.product((1, 2, 4, 8), (1, 2, 4)):
        out.append(dict(kind="contig", vec=vec, unroll=unroll))
    for nd, vec in itertools.product((1, 2, 3), (1, 2, 4, 8)):
        out.append(dict(kind="nd", nd=nd, vec=vec))
    for nd, vec in itertools.product((1, 2, 3), (1, 4, 8)):
        out.append(dict(kind="static", nd=nd, vec=vec))
    for i, lay in enumerate(out):
        lay["idx32"] = i % 2 == 0
    return out


def gen_args(pb: PB, lay: dict) -> dict:
    """_cuda_generate's arguments for a program built by `pb` under layout `lay`."""
    dtypes = pb.out_dtypes + pb.in_dtypes
    nops, n_out = len(dtypes), len(pb.out_dtypes)
    kw = dict(dtypes=dtypes, n_out=n_out, vec=lay["vec"], idx32=lay["idx32"])
    if lay["kind"] == "contig":
        return dict(kw, nd=1, contig=True, unroll=lay["unroll"])
    nd = lay["nd"]
    kw.update(nd=nd, contig=False)
    if lay["kind"] == "static":
        shape = [3, 5, 16 * lay["vec"]][-nd:]
        strides = []
        for k in range(nops):
            row = [0] * nd
            step = 1
            for d in reversed(range(nd)):
                row[d] = step
                step *= shape[d]
            if k >= n_out and k % 3 == 1:  # some inputs broadcast along the vector
                row[-1] = 0
            if k >= n_out and k % 3 == 2 and nd > 1:  # and some along an outer dimension
                row[0] = 0
            strides += row
        kw.update(shape=shape, strides=strides)
    return kw


# ---------------------------------------------------------------- the kernels

# The per-element body does not depend on the layout, nor the walk on the body: op and
# math sweeps use one cheap layout, layout sweeps a small body. (A large body in a wide
# layout is slow to compile: each lane inlines it vec x unroll times.)
SCALAR = dict(kind="contig", vec=1, unroll=1, idx32=True)
CHEAP = [SCALAR, dict(kind="contig", vec=2, unroll=1, idx32=False),
         dict(kind="nd", nd=2, vec=1, idx32=True), dict(kind="static", nd=3, vec=1, idx32=False)]


def _ops_program(use64: bool, ops: list[str], var: int) -> PB:
    """Every op of `ops` applied to loaded values, the results summed into one output."""
    st = DTYPES["float64" if use64 else "float32"]
    pb = PB(use64)
    x, y, z = pb.load(st), pb.load(st), pb.load(st)
    acc = pb.ins("add", pb.ins("add", x, y), z)
    for op in ops:
        arity = 1 if op in UNARY else 2 if op in BINARY else 3
        acc = pb.ins("add", acc, pb.ins(op, *[x, y, z][:arity], var=var))
    pb.out(acc, st)
    return pb


def cases():
    """(label, program builder, layout) for every kernel the test compiles."""
    f32, f64 = DTYPES["float32"], DTYPES["float64"]
    all_dt = list(DTYPES.values())

    for use64 in (False, True):
        st = f64 if use64 else f32
        # Each opcode, with each variant (several ops to a kernel).
        plain = [op for op in UNARY + BINARY + TERNARY if op not in VARIANT_OPS]
        yield f"ops {plain} f64={use64}", _ops_program(use64, plain, 0), SCALAR
        for var in variants(use64):
            yield (f"ops {VARIANT_OPS} f64={use64} var={var:#x}",
                   _ops_program(use64, VARIANT_OPS, var), SCALAR)
        # pow with a constant exponent (the lowering's x**s) and special constants (NaN
        # and Inf are written from their bits)
        pb = PB(use64)
        x = pb.load(st)
        acc = x
        for e in (2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 1.0, 0.0, 1.7):
            acc = pb.ins("add", acc, pb.ins("pow", x, pb.const(e), var=1))
        # (Constants outside float's range in float registers are left out: NVRTC warns
        # "floating-point value does not fit" on static_cast<float>(1e300), which is
        # undefined behaviour in C++.)
        specials = [0.0, -0.0, 1.5, float("inf"), -float("inf"), float("nan"),
                    3.4028234663852886e38, 1.401298464324817e-45, -1.1754943508222875e-38]
        if use64:
            specials += [1e-300, 5e-324, 1e300, 1.7976931348623157e308]
        for v in specials:
            acc = pb.ins("add", acc, pb.const(v))
        pb.out(acc, st)
        yield f"pow by constants, special constants f64={use64}", pb, SCALAR
        # register conversions and random numbers
        pb = PB(use64)
        x = pb.load(st)
        y = pb.ins("to_f32", x, f64=False) if use64 else pb.ins("to_f64", x, f64=True)
        z = pb.ins("to_f64", y, f64=True) if use64 else pb.ins("to_f32", y, f64=False)
        u = pb.ins("rand_uniform", aux=7)
        n = pb.ins("rand_normal", aux=-1)  # stream 0xffffffff
        pb.out(pb.ins("fma", z, u, n), st, MODES["stochastic"], 0, 3)
        yield f"convert+random f64={use64}", pb, SCALAR
        # Integers in int64 registers: exact loads, constants, comparisons, where, the
        # conversions to_i64 (from float, double and int64 registers, to every integer
        # format) and to_f32/to_f64 from int64, and stores of int64 registers.
        pb = PB(use64)
        xi = pb.load(DTYPES["int64"], f64=2)
        xj = pb.load(DTYPES["int32"], f64=2)
        xb = pb.load(DTYPES["bool"], f64=2)
        xf = pb.load(st)
        k = pb.ins("const", iimm=-(1 << 63), f64=2)
        k2 = pb.ins("const", iimm=(1 << 62) + 1, f64=2)
        acc = pb.ins("where", xb, xi, xj, f64=2)
        for op in ("eq", "ne", "lt", "le", "gt", "ge"):
            acc = pb.ins("where", pb.ins(op, acc, k, f64=2), acc, k2, f64=2)
        for src in (xf, acc):
            for dt in ("bool", "int32", "int64"):
                acc = pb.ins("where", pb.ins("to_i64", src, dtype=DTYPES[dt], f64=2), acc, k,
                             f64=2)
        back = pb.ins("to_f64", acc, f64=True) if use64 else pb.ins("to_f32", acc, f64=False)
        pb.out(acc, DTYPES["int64"])
        pb.out(acc, DTYPES["int32"])
        pb.out(acc, DTYPES["bool"])
        pb.out(acc, st)
        pb.out(back, st)
        pb.out(xf, DTYPES["int32"])
        yield f"integers f64={use64}", pb, SCALAR
        # Every rounding step: target dtype x mode x saturate.
        for mode in MODES.values():
            pb = PB(use64)
            r = pb.load(st)
            for i, (dt, sat) in enumerate(itertools.product(all_dt, (0, 1))):
                r = pb.round(r, dt, mode, sat, salt=i)
            pb.out(r, st)
            yield f"round chain f64={use64} mode={mode}", pb, SCALAR
        # Every store: dtype x mode x saturate (three outputs to a kernel).
        for (mode, sat), part in itertools.product(((0, 1), (0, 0), (1, 1), (2, 0), (2, 1)),
                                                   range(3)):
            pb = PB(use64)
            x = pb.load(st)
            for k, dt in enumerate(all_dt[3 * part:3 * part + 3]):
                pb.out(pb.ins("mul", x, pb.const(k + 1)), dt, mode, sat, salt=k)
            yield f"stores f64={use64} mode={mode} sat={sat} part={part}", pb, SCALAR

    # Every layout with loads and stores of every dtype, in kernels of one to three
    # outputs: (f64 registers, store mode, saturate, loaded dtypes, stored dtypes). The
    # first has the widened fp16 vector loads and the paired bf16/fp16 stores.
    D = DTYPES
    groups = [(False, 0, 1, ["float16", "bfloat16", "float32"],
               ["bfloat16", "float16", "float8_e4m3fn"]),
              (True, 2, 0, ["float64", "int64", "float8_e4m3fn"], ["float64", "int64", "int32"]),
              (False, 1, 1, ["bool", "int32", "float8_e5m2"], ["bool", "float8_e5m2"]),
              (False, 0, 1, ["float16"], ["float32"])]
    for lay in layouts():
        for use64, mode, sat, ins, outs in groups:
            pb = PB(use64)
            acc = None
            for dt in ins:
                r = pb.load(D[dt])
                acc = r if acc is None else pb.ins("add", acc, r)
            for k, dt in enumerate(outs):
                pb.out(acc if k == 0 else pb.ins("mul", acc, pb.const(k + 1)), D[dt], mode, sat,
                       salt=k)
            yield f"layout {lay} loads {ins} stores {outs} f64={use64}", pb, lay

    # Eager- and fused-style programs, as the lowering writes them: every recipe under
    # each policy, storage dtype and math preset.
    # (Each combination gets one of the two recipe groups and one preset, in turn.)
    combos = [("eager", "bfloat16"), ("eager", "float16"), ("eager", "float8_e4m3fn"),
              ("eager", "float32"), ("fused", "bfloat16"), ("fused", "float16"),
              ("fused", "float8_e5m2"), ("fp64", "bfloat16"), ("fp64", "float64"),
              ("stochastic", "bfloat16"), ("stochastic", "float8_e4m3fn")]
    groups = (["swiglu", "gelu_bias", "rope"], ["norm", "softmax", "misc"])
    presets = Math.presets()
    for i, (policy, st) in enumerate(combos):
        names, preset = groups[i % 2], presets[i % len(presets)]
        pb = PB(policy == "fp64")
        s = Styled(pb, DTYPES[st], policy, Math.preset(preset))
        for name in names:
            RECIPES[name](s)
        s.flush()
        yield f"{names} {policy} {st} {preset}", pb, CHEAP[i % len(CHEAP)]
    # The kernels castlab launches most: eager and fused SwiGLU on bf16 in the widest
    # layouts.
    for policy, lay in itertools.product(
            ("eager", "fused"), (dict(kind="contig", vec=8, unroll=2, idx32=True),
                                 dict(kind="static", nd=2, vec=8, idx32=True))):
        pb = PB(False)
        s = Styled(pb, DTYPES["bfloat16"], policy, Math.preset("torch_eager"))
        _swiglu(s)
        s.flush()
        yield f"swiglu {policy} bfloat16 {lay}", pb, lay


class Styled:
    """Builds a recipe the way the lowering would under a policy: eager rounds after every
    op, fused only at the store, fp64 computes in double; stochastic rounds at random."""

    def __init__(self, pb: PB, st: int, policy: str, math: Math):
        self.pb, self.st, self.policy, self.math = pb, st, policy, math
        self.mode = MODES["stochastic"] if policy == "stochastic" else 0
        self.salt = 0
        self.pending: list[int] = []

    def x(self) -> int:
        return self.pb.load(self.st)

    def c(self, v: float) -> int:
        return self.pb.const(v)

    def op(self, name: str, *args: int) -> int:
        var = self.math.variant_bits(name, self.pb.f64, True)
        r = self.pb.ins(name, *args, var=var)
        if self.policy in ("eager", "stochastic"):
            self.salt += 1
            r = self.pb.round(r, self.st, self.mode, 1, self.salt)
        return r

    def out(self, r: int):
        self.pending.append(r)

    def flush(self):
        """The outputs: up to three, the later results summed into the third."""
        rs = self.pending
        if len(rs) > 3:
            acc = rs[2]
            for r in rs[3:]:
                acc = self.op("add", acc, r)
            rs = rs[:2] + [acc]
        for r in rs:
            self.pb.out(r, self.st, self.mode, 1, 100 + len(self.pb.outs))
        self.pending = []


def _swiglu(s):
    s.out(s.op("mul", s.op("silu", s.x()), s.x()))


def _gelu_bias(s):
    x = s.op("add", s.x(), s.x())
    s.out(s.op("gelu_tanh", x))
    s.out(s.op("gelu", x))


def _rope(s):
    x1, x2, cos, sin = s.x(), s.x(), s.x(), s.x()
    s.out(s.op("sub", s.op("mul", x1, cos), s.op("mul", x2, sin)))
    s.out(s.op("add", s.op("mul", x2, cos), s.op("mul", x1, sin)))


def _norm_scale(s):
    x, v, w = s.x(), s.x(), s.x()
    r = s.op("rsqrt", s.op("add", v, s.c(1e-6)))
    s.out(s.op("mul", s.op("mul", x, r), w))


def _softmax_parts(s):
    x, m, z = s.x(), s.x(), s.x()
    e = s.op("exp", s.op("sub", x, m))
    s.out(s.op("div", e, z))
    s.out(s.op("log", s.op("sigmoid", x)))
    s.out(s.op("where", s.op("gt", x, m), s.op("pow", x, s.c(3.0)), s.op("tanh", x)))


def _misc(s):
    x, y = s.x(), s.x()
    a = s.op("fma", x, y, s.op("square", x))
    b = s.op("maximum", s.op("abs", a), s.op("minimum", s.op("sin", x), s.op("cos", y)))
    c = s.op("reciprocal", s.op("sqrt", s.op("add", s.op("erf", b), s.c(2.0))))
    s.out(s.op("pow", c, s.op("neg", y)))


RECIPES = {"swiglu": _swiglu, "gelu_bias": _gelu_bias, "rope": _rope, "norm": _norm_scale,
           "softmax": _softmax_parts, "misc": _misc}


# ---------------------------------------------------------------- compiling

def _nvrtc_or_skip() -> dict:
    try:
        info = dict(_C._nvrtc_info())
    except RuntimeError as e:
        pytest.skip(f"NVRTC not found (pip install nvidia-cuda-nvrtc-cu12, or castlab[test]): {e}")
    digits = ARCH.split("_")[-1]
    if info["archs"] and int(digits) not in info["archs"]:
        pytest.skip(f"NVRTC {info['version']} at {info['path']} cannot compile for {ARCH}")
    return info


def batch_source(sources: list[str]) -> str:
    """One translation unit from several generated kernels: their #include lines once, at
    the top; each kernel's text in its own namespace."""
    includes: list[str] = []
    bodies = []
    for i, src in enumerate(sources):
        lines = src.splitlines()
        for ln in lines:
            if ln.startswith("#include") and ln not in includes:
                includes.append(ln)
        body = "\n".join(ln for ln in lines if not ln.startswith("#include"))
        bodies.append(f"namespace cl_batch_{i} {{\n{body}\n}}  // namespace cl_batch_{i}\n")
    return "\n".join(includes) + "\n" + "\n".join(bodies)


def _check(item):
    name, src = item
    ok, log = _C._nvrtc_compile_check(src, ARCH, name)
    return ok, log


def _check_ptx(item):
    name, src = item
    return _C._nvrtc_compile_check(src, PTX_ARCH, name)


@pytest.mark.slow  # ~20 s on 2 cores (NVRTC)
def test_nvrtc_compiles_every_generated_kernel():
    info = _nvrtc_or_skip()
    t0 = time.perf_counter()
    kernels: dict[str, tuple[str, str]] = {}  # kernel name -> (label, source)
    ops_seen: set[str] = set()
    for label, pb, lay in cases():
        name, src = _C._cuda_generate(pb.program(), **gen_args(pb, lay))
        kernels.setdefault(name, (label, src))
        ops_seen.update(i["op"] for i in pb.code)
    assert ops_seen == set(OPCODE), f"opcodes never generated: {set(OPCODE) - ops_seen}"
    assert set(OPCODE) == set(UNARY + BINARY + TERNARY + SPECIAL)
    t_gen = time.perf_counter() - t0

    # Batches of a few kernels, the longest first, so that the threads finish together.
    names = sorted(kernels, key=lambda n: (-len(kernels[n][1]), n))
    per_batch = 6
    batches = [names[i:i + per_batch] for i in range(0, len(names), per_batch)]
    items = [(f"castlab_batch{i}", batch_source([kernels[n][1] for n in b]))
             for i, b in enumerate(batches)]
    # Two kernels alone, exactly as generated (no batching).
    items += [(n, kernels[n][1]) for n in (names[len(names) // 2], names[-1])]
    workers = min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(_check, items))
    failures, warnings = [], []
    for (name, _), (ok, log), i in zip(items, results, itertools.count()):
        if ok:
            if log.strip():
                warnings.append(f"{name}: {log}")
            continue
        if i >= len(batches):
            failures.append(f"{kernels[name][0]} ({name}):\n{log}")
            continue
        for n in batches[i]:  # the culprits, compiled alone
            ok1, log1 = _check((n, kernels[n][1]))
            if not ok1:
                failures.append(f"{kernels[n][0]} ({n}):\n{log1}\n--- source ---\n{kernels[n][1]}")
        if not failures:
            failures.append(f"batch {name} failed, yet each kernel compiles alone:\n{log}")
    dt = time.perf_counter() - t0
    print(f"\nNVRTC {info['version']} ({info['path']}), {ARCH}: {len(kernels)} kernels in "
          f"{len(items)} compiles, {dt:.1f} s ({t_gen:.1f} s generating, {workers} threads)")
    assert not failures, f"{len(failures)} kernels fail to compile:\n" + "\n\n".join(failures[:5])
    assert not warnings, "NVRTC warnings:\n" + "\n".join(warnings[:5])


def test_static_kernels_keep_outer_broadcast_inputs_in_l2():
    """A static n-D kernel loads an input broadcast along an outer dimension (RoPE's
    cos/sin over the heads) with an L2 evict-last policy, as Inductor marks broadcast loads
    (cl_vload_keep); inputs read once, inputs broadcast only along the vector, an outer
    dimension of extent 1 and run-time layouts load plainly; under evict_first_reads the
    inputs read once load evict-first (cl_vload_first). The kernels compile for sm_90 and
    for sm_75 (no cache policies before sm_80: plain loads)."""
    bf = DTYPES["bfloat16"]
    pb = PB()
    a, b, c, d = (pb.load(bf) for _ in range(4))
    pb.out(pb.round(pb.ins("fma", a, b, pb.ins("mul", c, d)), bf), bf)
    shape = [3, 4, 64]
    strides = ([256, 64, 1]  # output
               + [256, 64, 1]  # a: read once
               + [0, 64, 1]  # b: broadcast over the outer dimension
               + [256, 64, 0]  # c: broadcast along the vector only
               + [64, 0, 1])  # d: broadcast over the middle dimension
    kw = dict(dtypes=[bf] * 5, n_out=1, nd=3, contig=False, vec=8, idx32=True)
    name, src = _C._cuda_generate(pb.program(), **kw, shape=shape, strides=strides)
    loads = [ln.strip() for ln in src.splitlines() if "cl_vload" in ln and "P.ptr" in ln]
    assert loads == ["cl_vload(a0, ((const unsigned short*)P.ptr[1]) + o1);",
                     "cl_vload_keep(a1, ((const unsigned short*)P.ptr[2]) + o2);",
                     "cl_vload_keep(a3, ((const unsigned short*)P.ptr[4]) + o4);"], loads
    # extent 1 where the stride is 0: nothing is read twice
    _, src1 = _C._cuda_generate(pb.program(), **kw, shape=[1, 4, 64],
                                strides=[256, 64, 1] * 2 + [0, 64, 1] + [256, 64, 0] + [0, 64, 1])
    assert "cl_vload_keep(" not in src1
    _, src_rt = _C._cuda_generate(pb.program(), **kw)
    assert "cl_vload_keep(" not in src_rt
    # evict_first_reads (the executor's choice where the operands exceed the L2 and fit in
    # twice its size): the input read once loads evict-first, the broadcast ones as
    # before; a different kernel
    name_f, src_f = _C._cuda_generate(pb.program(), **kw, shape=shape, strides=strides,
                                      evict_first_reads=True)
    loads_f = [ln.strip() for ln in src_f.splitlines() if "cl_vload" in ln and "P.ptr" in ln]
    assert loads_f == ["cl_vload_first(a0, ((const unsigned short*)P.ptr[1]) + o1);"] + loads[1:]
    assert name_f != name
    _nvrtc_or_skip()
    for arch in ("sm_90", "sm_75"):
        for nm, sc in ((name, src), (name_f, src_f)):
            ok, log = _C._nvrtc_compile_check(sc, arch, nm)
            assert ok and not log.strip(), (arch, log)


def test_every_kernel_waits_for_the_kernel_before_it_first():
    """castlab launches elementwise kernels with programmatic stream serialization on
    sm_90+ (ops/cuda/executor.cpp), so a kernel may be scheduled before the one ahead of it
    in the stream has completed: every generated kernel, in every layout, must first wait for it
    (cl_pdl_enter: griddepcontrol.wait) before touching memory. The wait compiles for sm_90
    and is compiled out for sm_75."""
    bf = DTYPES["bfloat16"]
    pb = PB()
    a, b = pb.load(bf), pb.load(bf)
    pb.out(pb.round(pb.ins("mul", a, b), bf), bf)
    for lay in layouts():
        name, src = _C._cuda_generate(pb.program(), **gen_args(pb, lay))
        body = src[src.index(f"void __launch_bounds__(128) {name}(const Params P) {{"):]
        first = body.splitlines()[1].strip()
        assert first.startswith("cl_pdl_enter();"), (lay, first)
        assert body.count("cl_pdl_enter()") == 1
    prelude = (Path(__file__).resolve().parents[1] / "ops" / "cuda" / "prelude.cuh").read_text()
    enter = prelude[prelude.index("void cl_pdl_enter()"):]
    enter = enter[:enter.index("\n}\n")]
    assert "__CUDA_ARCH__ >= 900" in enter and "griddepcontrol.wait;" in enter, enter
    _nvrtc_or_skip()
    for arch in ("sm_90", "sm_75"):
        ok, log = _C._nvrtc_compile_check(src, arch, name)
        assert ok and not log.strip(), (arch, log)


def test_double_device_pow_is_linked_from_a_fmad_build():
    """CUDA's double pow as PyTorch's nvcc build has it (libdevice's pow contracts under
    --fmad=true: 54 of 4M results differ from torch.pow without it, 0 with it, H200): a
    kernel calling it starts with the define that makes the kernel cache link
    cl_pow_fmad, compiled with --fmad=true; float pow and castlab's own pow do not."""
    _nvrtc_or_skip()
    dev = _C.VARIANT_BITS["pow_device"] | _C.VARIANT_BITS["pow_tensor_exp"]
    srcs = {}
    for f64, var in ((True, dev), (True, 0), (False, dev)):
        pb = PB(f64=f64)
        a, b = pb.load(DTYPES["float64" if f64 else "float32"]), pb.load(
            DTYPES["float64" if f64 else "float32"])
        pb.out(pb.ins("pow", a, b, var=var), DTYPES["float64" if f64 else "float32"])
        _, srcs[(f64, var)] = _C._cuda_generate(
            pb.program(), **gen_args(pb, dict(kind="contig", vec=1, unroll=1, idx32=True)))
    define = "#define CL_LINK_POW_FMAD 1"
    assert srcs[(True, dev)].split("\n")[1] == define
    assert define not in srcs[(True, 0)] and define not in srcs[(False, dev)]
    ok, log = _C._nvrtc_compile_check(srcs[(True, dev)], ARCH, "cl_pow_linked")
    assert ok, log


def test_payne_hanek_reduction_is_called_not_inlined():
    """castlab's Payne-Hanek reduction (rem_pio2_big, |x| >= 2**31) is an out-of-line
    device function: a kernel computing fp64 cos and sin of loaded angles in several lanes
    calls one copy of it. Inlined into every use, the four fp64 RoPE reference kernels of
    the cold library study took 17-24 s each to compile on an H100 (14.8 s here), then
    0.4 s. (Kernels compile with --fmad=false, so a call changes no value.)"""
    _nvrtc_or_skip()
    pb = PB(f64=True)
    f64 = DTYPES["float64"]
    a = pb.load(f64)
    pb.out(pb.ins("add", pb.ins("cos", a), pb.ins("sin", a)), f64)
    name, src = _C._cuda_generate(
        pb.program(), **gen_args(pb, dict(kind="contig", vec=2, unroll=2, idx32=True)))
    ptx = _C._nvrtc_compile_image(src, PTX_ARCH, name).decode("utf-8", "replace")
    lines = ptx.splitlines()
    defs = [i for i, ln in enumerate(lines) if ".func" in ln and "rem_pio2_big" in ln
            and ln.rstrip().endswith("(")]
    assert len(defs) == 1, defs              # one body (a declaration may come first)
    calls = [ln for ln in lines if "call" in ln and "rem_pio2_big" in ln]
    calls += [lines[i + 1] for i, ln in enumerate(lines[:-1])
              if ln.strip().startswith("call") and "rem_pio2_big" in lines[i + 1]]
    assert len(calls) >= 2, calls            # cos and sin (each lane) call it


def test_nvrtc_compile_check_reports_errors():
    _nvrtc_or_skip()
    ok, log = _C._nvrtc_compile_check("__global__ void k() { undefined_name; }", ARCH)
    assert not ok and "undefined_name" in log
    with pytest.raises(ValueError, match="sm_<n>"):
        _C._nvrtc_compile_check("", "90")
    opts = _C._nvrtc_options(ARCH)
    assert f"--gpu-architecture={ARCH}" in opts and "--fmad=false" in opts


@pytest.mark.slow  # ~2 min on 2 cores (NVRTC, to PTX)
def test_nvrtc_compiles_the_reduce_kernels():
    """The reduce kernels (ops/cuda/reduce.cpp), one per order in ops/scalar/reduce.h, for
    float and double rows, compile without a warning; the softmax orders share one."""
    _nvrtc_or_skip()
    assert _C._reduce_kernel_name(False, 4) == _C._reduce_kernel_name(False, 10) == \
        _C._reduce_kernel_name(False, 5) == "cl_reduce_f32_o5"
    with pytest.raises(ValueError, match="no reduction order 11"):
        _C._reduce_kernel_source(True, 11)
    ks = clcuda.builtin_kernels("reduce")
    assert len(ks) == 20  # and the reduction of columns, float and double
    for name, src in ks:
        if name.startswith("cl_colred_"):
            assert src == _C._colred_kernel_source(name.endswith("f64"))
        else:
            order = int(name.rsplit("_o", 1)[1])
            assert f"red_part<T, {order}>" in src and f"red_combine<T, {order}>" in src
        ok, log = _C._nvrtc_compile_check(src, PTX_ARCH, name)
        assert ok, log
        assert "warning" not in log, log


def _local_depot(src: str, name: str) -> int:
    """The bytes of local memory (the stack's arrays) a kernel's PTX declares."""
    ptx = _C._nvrtc_compile_image(src, PTX_ARCH, name).decode("utf-8", "replace")
    return sum(int(m) for m in re.findall(r"__local_depot\d+\[(\d+)\]", ptx))


def test_the_gpu_orders_reduce_kernels_keep_a_small_stack():
    """The driver reserves a kernel's stack for every thread the GPU can hold (2,048 per
    multiprocessor: 270 MB per KB on an H100). One kernel dispatching on the order at run
    time carried the CPU moments' 11 KB cascade: 3.1 GB for any reduction, out of memory on
    a busy GPU. Each order's kernel now holds only its own arrays: torch's CUDA order (the
    default math) and Triton's under 1 KB, the CPU moments' 9 KB its own."""
    _nvrtc_or_skip()
    for order in (3, 9):  # kOrdTorchCuda, kOrdTriton
        assert _local_depot(_C._reduce_kernel_source(True, order),
                            _C._reduce_kernel_name(True, order)) <= 1024
    assert _local_depot(_C._reduce_kernel_source(True, 6), _C._reduce_kernel_name(True, 6)) > 4096
    # the reduction of columns (Triton's order through a column accessor) as the rows'
    assert _local_depot(_C._colred_kernel_source(True), "cl_colred_f64") <= 1024


def test_nvrtc_compiles_the_index_and_nll_kernels():
    """The index steps' kernels (ops/cuda/index.cpp: gather, scatter_add, the range check,
    the zero fill) and the nll_loss step's (ops/cuda/loss.cpp, float and double, both of
    PyTorch's orders in ops/scalar/loss.h) compile without a warning."""
    _nvrtc_or_skip()
    src = _C._index_kernel_source()
    for name in ("cl_gather", "cl_scatter_add", "cl_index_check", "cl_zero"):
        ok, log = _C._nvrtc_compile_check(src, ARCH, name)
        assert ok, log
        assert "warning" not in log, log
    for f64 in (False, True):
        src = _C._nll_kernel_source(f64)
        # the CPU's tree steps, a level at a time on the block's threads
        assert "nll_cuda_tree_step<A>(sh, aw, k, stride)" in src and "nll_cpu" in src
        assert "nll_cuda_combine" not in src
        ok, log = _C._nvrtc_compile_check(src, ARCH, "cl_nll_f64" if f64 else "cl_nll_f32")
        assert ok, log
        assert "warning" not in log, log


@pytest.mark.slow  # ~50 s on 2 cores (NVRTC, to PTX)
def test_nvrtc_compiles_row_kernels(monkeypatch):
    """The row kernels (ops/cuda/row_kernel.cpp) of RMSNorm (both casts), softmax,
    log_softmax, layer_norm and amax, for every input dtype and under the fp64 policy,
    and of var and layer_norm in every Welford order (ops/scalar/moments.h: the CPU's
    WelfordOps and RowwiseMoments, Reduce.cuh's WelfordOps, the vectorized and the block
    layer_norm kernels), compile without a warning."""
    import dataclasses

    import castlab as cl
    from castlab import _lower

    _nvrtc_or_skip()
    monkeypatch.setattr(_lower, "FUSE_ROWS", True)
    fns = [lambda x, w: cl.rms_norm(x, 64, w, cast="hf"),
           lambda x, w: cl.rms_norm(x, 64, w, cast="te"),
           lambda x, w: cl.softmax(x, -1), lambda x, w: cl.log_softmax(x, -1),
           lambda x, w: cl.layer_norm(x, 64, w), lambda x, w: x - cl.amax(x, -1, keepdim=True)]
    items = {}
    # Each function in both dtypes under the inductor math, and under torch_eager math
    # (the CPU's libm formulas: 8-25 s of NVRTC a kernel) in one dtype, alternating, so that
    # every (dtype, math) pair and every function under each math compiles.
    cases = [(dt, "eager", "inductor", fn) for dt in ("bfloat16", "float32") for fn in fns]
    cases += [(("bfloat16", "float32")[i % 2], "eager", "torch_eager", fn)
              for i, fn in enumerate(fns)]
    cases += [("float16", "fp64", "torch_eager", fn) for fn in (fns[0], fns[2])]
    welford = [lambda x, w: cl.layer_norm(x, 64, w, w),
               lambda x, w: cl.layer_norm(x[:, :63], 63, None, w[:63]),
               lambda x, w: cl.var(x, -1, keepdim=True) * w]
    for order in ("torch_cpu", "torch_cuda"):
        m = dataclasses.replace(cl.Math.preset("torch_eager"), reduction=order)
        cases += [(dt, "eager", m, fn) for dt in ("bfloat16", "float64") for fn in welford]
    # Inductor's order: the register kernel (rows of 896, 1000 and 4096: persistent and
    # looped tiles, vector words and a tail) and the general one (64: 8 lanes)
    for n in (64, 896, 1000, 4096, 5000, 12288, 50257):  # (5000 on: a tile at a time;
        # softmax at 5000: the online sum)
        cases += [(dt, "fused", "inductor", lambda x, w, n=n: cl.rms_norm(x, n, w, cast="hf"))
                  for dt in ("bfloat16", "float32")]
        cases += [("bfloat16", "fused", "inductor", lambda x, w, n=n: cl.softmax(x * w, -1))]
    # SoftMax.cu's orders: a block of its threads reading the row from memory (the warp
    # kernel, the register, shared-memory and ilpReduce block kernels)
    cuda_order = dataclasses.replace(cl.Math.preset("torch_eager"), reduction="torch_cuda")
    for n in (64, 5000, 12000, 32000):
        cases += [(dt, "eager", cuda_order, lambda x, w, n=n: cl.softmax(x, -1))
                  for dt in ("bfloat16", "float32")]
        cases += [("bfloat16", "eager", cuda_order, lambda x, w, n=n: cl.log_softmax(x, -1))]
    cases += [("float16", "eager", cuda_order, lambda x, w, n=n, op=op: op(x, -1))  # <true>
              for n, op in ((12000, cl.softmax), (32000, cl.log_softmax))]
    for dt, policy, math, fn in cases:
        n = 64 if "n" not in fn.__code__.co_varnames else fn.__defaults__[0]
        x = cl.randn(8, n, seed=0, dtype=dt)
        w = cl.randn(n, seed=1, dtype=dt)
        f = cl.jit(fn)
        f.run(x, w, policy=policy, math=math)
        tr, _ = f._traced(f._bind((x, w)))
        for plan in tr.plans.values():
            for spec, dts in plan.row_steps:
                src = _C._row_kernel_source(spec, [_C.empty([1], d, "cpu") for d in dts])
                at = next(src.index(k) for k in ("castlab_row", "castlab_trow", "castlab_srow")
                          if k in src)
                items[src[at:src.index("(", at)]] = src
    assert len(items) >= 20, len(items)
    names = sorted(items)
    batches = [names[i:i + 6] for i in range(0, len(names), 6)]
    srcs = [(f"castlab_rowbatch{i}", batch_source([items[n] for n in b]))
            for i, b in enumerate(batches)]
    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        results = list(pool.map(_check_ptx, srcs))
    for (name, _), (ok, log) in zip(srcs, results):
        assert ok, f"{name}:\n{log[:3000]}"
        assert "warning" not in log, log[:3000]


def _softmax_row_source(monkeypatch, op: str, dt: str, n: int) -> str:
    """The CUDA source of the SoftMax.cu row kernel that `cl.<op>(x, -1)` runs eagerly
    on [4, n] rows of dtype dt (the kernel's own source, no GPU needed)."""
    import dataclasses

    import castlab as cl
    from castlab import _lower

    monkeypatch.setattr(_lower, "FUSE_ROWS", True)
    m = dataclasses.replace(cl.Math.preset("torch_eager"), reduction="torch_cuda")
    x = cl.randn(4, n, seed=0, dtype=dt)
    f = cl.jit(lambda x: getattr(cl, op)(x, -1))
    f.run(x, policy="eager", math=m)
    tr, _ = f._traced(f._bind((x,)))
    (plan,) = tr.plans.values()
    (spec, dts), = plan.row_steps
    return _C._row_kernel_source(spec, [_C.empty([1], d, "cpu") for d in dts])


@pytest.mark.parametrize("dt,n,cached", [("bfloat16", 32000, True), ("bfloat16", 50257, True),
                                         ("float16", 32064, True), ("float32", 24000, True),
                                         ("float32", 32000, False), ("bfloat16", 151936, False)])
def test_softmax_row_kernel_keeps_the_row_in_shared_memory(monkeypatch, dt, n, cached):
    """SoftMax.cu's row kernel (the eager vocabulary softmax): the first phase keeps the
    row it reads in shared memory where it fits two blocks an SM (up to 115,200 bytes on
    an H100/H200), and the second phase and the epilogue read it there instead of from
    global memory; a longer row (fp32 32,000: 128 KB) is read from memory each time. The
    float maximum folds by max.NaN, the log of the row sum is taken once per thread
    (cl_epi_row), 16-bit outputs are rounded two at a time, and the phases index with
    int (SoftMax.cu's index_t: no 64-bit division per thread) with only the plan's loop
    compiled; a thread tests its chunks' alignment once, and a row starting inside a
    16-byte word writes whole words after a head of single elements. (No NVRTC needed: the source is inspected; the bits are tested on the
    GPU, test_reduce_cuda.py and test_reduce_sweep_cuda.py.)"""
    src = _softmax_row_source(monkeypatch, "log_softmax", dt, n)
    assert "castlab_srow" in src
    kernel = src[src.index('extern "C"'):]
    phases = kernel.split("cl::red_softmax_thread<")
    assert len(phases) == 3  # the max, the sum of exponentials
    # int indices, and the plan's kernel (1: Smem, 2: ilpReduce) known when it compiles
    assert all(p.startswith(("ACC, 8, ", "ACC, 4, ")) and p[p.index(">(") - 8:p.index(">(")]
               in (", int, 1", ", int, 2") for p in phases[1:])
    epilogue = kernel[kernel.index("cl_epi_row("):]
    assert "cl_epi_row(h1, h2," in epilogue and "op_log" not in epilogue
    assert "cl::op_log" in src[src.index("void cl_epi_row("):src.index("void cl_epi(")]
    pair = {"bfloat16": "cl::f32x2_to_bf16x2_rne(yf0[j], yf0[j + 1])",
            "float16": "cl::f32x2_to_f16x2_rne(yf0[j], yf0[j + 1])"}.get(dt)
    if pair:  # the vector path rounds two outputs at a time (one paired conversion)
        assert pair in epilogue and "float& y0" in src
    else:
        assert "f32x2_to" not in epilogue and "float& y0" in src
    # a chunk's 16-byte test is made once per thread and loop (red_fold_chunks), not per
    # chunk: the chunk lambda takes the caller's answer
    assert kernel.count("auto aligned = [&](long long i) -> bool") == 2
    assert kernel.count("if (decltype(al)::value || ") >= 2
    # rows that start inside a word (an odd n) still write whole vectors after a head
    assert "const int cb = cl_hd + 8 * c;" in epilogue
    assert "cl_hd = cl_a0 % " in epilogue and "j < cl_hd;" in epilogue
    if cached:
        assert "extern __shared__ __align__(16) unsigned char cl_rowcache[];" in kernel
        assert "cl_rc[csh + i] = a0;" in phases[0]  # kept as read
        assert "P.ptr[0]" not in phases[1] and "cl_rc" in phases[1]
        assert "P.ptr[0]" not in epilogue and "cl_rc" in epilogue
    else:
        assert "cl_rc" not in kernel
        assert "P.ptr[0]" in phases[1] and "P.ptr[0]" in epilogue


@pytest.mark.parametrize("n,dt,tiles", [(4096, "bfloat16", 0), (12288, "float32", 6),
                                        (8192, "bfloat16", 4), (32000, "bfloat16", 16),
                                        (50257, "bfloat16", 25), (151936, "float32", 75)])
def test_register_row_kernel_reads_rows_of_many_tiles_a_tile_at_a_time(monkeypatch, n, dt,
                                                                       tiles):
    """Inductor's softmax on rows of several tiles (2,048 elements on 16 warps above
    4,096): the register kernel's two phases (the maximum, the online softmax sum) and its
    epilogue each loop over the row's tiles, reading the thread's 4 values of a tile from
    memory into registers, with a running (max, sum) per position for the online sum
    (cl::red_online_step, ops/scalar/reduce.h), at two blocks of 512 threads an SM; one
    tile (4,096) keeps the row in registers, four blocks an SM. (The source is inspected;
    the bits: tests/test_online_softmax.py on the CPU, test_reduce_cuda.py on a GPU.)"""
    import castlab as cl
    from castlab import _lower

    monkeypatch.setattr(_lower, "FUSE_ROWS", True)
    x = cl.randn(300, n, seed=0, dtype=dt)
    f = cl.jit(lambda x: cl.softmax(x, -1))
    f.run(x, policy="fused", math="inductor")
    tr, _ = f._traced(f._bind((x,)))
    (plan,) = tr.plans.values()
    (spec, dts), = plan.row_steps
    src = _C._row_kernel_source(spec, [_C.empty([1], d, "cpu") for d in dts])
    assert "castlab_trow" in src
    loop = f"for (int it = 0; it < {tiles}; ++it)"
    if tiles:
        assert src.count(loop) == 3 and "__launch_bounds__(512, 2)" in src
        assert "ACC am[4], as[4];" in src and "cl::red_online_step(am[e], as[e], y[e]," in src
        assert " p = (const " + ("float" if dt == "float32" else "unsigned short") in \
            src.split(loop)[1]
    else:
        assert "ACC acc[" not in src and "red_online" not in src
        assert "__launch_bounds__(512, 4)" in src


def test_register_row_kernel_splits_the_row_invariant_epilogue(monkeypatch):
    """The register row kernel (Triton's order) of HF RMSNorm computes the epilogue's
    row-invariant part (mean, + eps, rsqrt) once per thread in cl_epi_row, and per
    element only what reads the row's elements; the warps' partials are folded by a
    butterfly of shuffles, not through an array every thread walks. (No NVRTC needed:
    the source is inspected.)"""
    import castlab as cl
    from castlab import _lower

    monkeypatch.setattr(_lower, "FUSE_ROWS", True)
    x = cl.randn(8, 4096, seed=0, dtype="bfloat16")
    w = cl.randn(4096, seed=1, dtype="bfloat16")
    f = cl.jit(lambda x, w: cl.rms_norm(x, 4096, w, 1e-6, cast="hf"))
    f.run(x, w, policy="fused", math="inductor")
    tr, _ = f._traced(f._bind((x, w)))
    (plan,) = tr.plans.values()
    (spec, dts), = plan.row_steps
    one: dict = {}  # the row sum is read back from the memory it was written to
    src = _C._row_kernel_source(spec, [one.setdefault(d, _C.empty([1], d, "cpu")) for d in dts])
    assert "castlab_trow" in src

    def body(name):
        at = src.index(f"void {name}(")
        return src[at:src.index("\n}\n", at)]
    row, elem = body("cl_epi_row"), body("cl_epi")
    assert "op_rsqrt" in row and "op_div" in row and "op_add" in row
    assert "op_rsqrt" not in elem and "op_div" not in elem
    assert "op_mul" in elem and "round_f32_to" in elem
    kernel = src[src.index("void cl_trow("):]  # the body (the kernel picks its vector path)
    assert kernel.count("cl_epi_row(") == 1 and "ACC q[" not in kernel
    assert kernel.count("__shfl_xor_sync") == 2  # in the warp, then across the warps
    # rows after a block's first come by ticket from the device's counter, one atomic
    assert kernel.count("atomicAdd(P.ctr, 1ull) - P.base") == 1


@pytest.mark.parametrize("policy", ["fused", "fp64"])
def test_register_row_kernel_max_by_the_hardware_with_the_exact_fold_kept(monkeypatch, policy):
    """The register row kernel folds a max/min phase with the hardware's NaN-propagating
    max/min (one instruction) and runs Triton's exact fold only where that gave a NaN or
    a zero (a NaN's payload and a zero's sign depend on the order); an fp64 accumulator
    has no such instruction and always folds exactly. The body is compiled once per
    vector path, chosen at entry. (No NVRTC needed: the source is inspected; the bits
    are tested on the GPU, test_reduce_cuda.py.)"""
    import castlab as cl
    from castlab import _lower

    monkeypatch.setattr(_lower, "FUSE_ROWS", True)
    x = cl.randn(8, 4096, seed=0, dtype="bfloat16")
    for fn, op in ((lambda x: cl.softmax(x, -1), "max"),
                   (lambda x: x - cl.amin(x, -1, keepdim=True), "min")):
        f = cl.jit(fn)
        f.run(x, policy=policy, math="inductor")
        tr, _ = f._traced(f._bind((x,)))
        (plan,) = tr.plans.values()
        (spec, dts), = plan.row_steps
        src = _C._row_kernel_source(spec, [_C.empty([1], d, "cpu") for d in dts])
        assert "castlab_trow" in src
        body = src[src.index("void cl_trow("):src.index('extern "C"')]
        fast = f"cl_max_min_nan<{'true' if op == 'max' else 'false'}>("
        if policy == "fp64":
            assert "typedef double ACC;" in src and "cl_max_min_nan" not in body
            continue
        assert body.count(fast) == 3  # elements, the warp, the warps
        guard = body.index("if (v != v || v == 0.0f) {")
        assert body.index(fast) < guard
        assert "__syncthreads();\n    v = ACC(0);" in body[guard:]  # buffer read by all
        assert "cl::red_op(" in body[guard:]  # Triton's fold, exactly as before
        assert "P.vec" not in body and "if (VEC)" in body
        kernel = src[src.index('extern "C"'):]
        assert "cl_trow<true>(P" in kernel and "cl_trow<false>(P" in kernel


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
def test_softmax_row_kernel_divides_by_the_rows_reciprocal(monkeypatch, dt):
    """The vocabulary softmax's epilogue, exp(x - max) / sum with a bf16 or fp16 output:
    the row part (cl_epi_row) takes the sum's reciprocal once (cl_rcp_div16), and each
    element multiplies by it, dividing only near a 16-bit rounding boundary
    (cl_div_rn_16, whose rule test_div_rn_16_rounds_as_the_division checks). An fp32
    output keeps the division. 16-bit inputs are unpacked from their words (cl_unpack16),
    the row cache written from the word itself."""
    src = _softmax_row_source(monkeypatch, "softmax", dt, 32000)
    row = src[src.index("void cl_epi_row("):src.index("void cl_epi(")]
    body = src[src.index("void cl_epi("):src.index("struct RowParams")]
    if dt == "float32":
        assert "cl_rcp_div16" not in src and "cl::op_div(" in body
        return
    assert "= cl_rcp_div16(" in row and "cl::op_div(" not in body
    assert f"cl_div_rn_16<{'true' if dt == 'bfloat16' else 'false'}>(" in body
    kernel = src[src.index('extern "C"'):]
    assert kernel.count("cl_unpack16(a0 + 8 * w, cw);") == 2  # the max and the sum
    assert "((uint4*)(cl_rc + csh + i))[w] = cw;" in kernel
    assert "cl_unpack16(a0 + 8 * v, p[v]);" in kernel  # the epilogue's words


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dt,n", [("float16", 32000), ("float16", 50257), ("bfloat16", 32000)])
def test_softmax_row_kernel_widens_fp16_by_the_hardware_where_no_nan(monkeypatch, op, dt, n):
    """SoftMax.cu's row kernel on fp16 rows: the max, the sum and the epilogue fold the
    magnitudes of the 16-byte words they read (cl_f16_mag, one per word, not per unpacked
    value), and where none is a NaN run their functions' <true> form, which widens with
    the hardware conversion alone (cl_h2f<true>); else the form that keeps a NaN's payload.
    Single elements (a row's head and tail) take the payload-keeping form. bf16 rows have
    nothing to test. (The source is inspected; the bits are tested on the GPU.)"""
    src = _softmax_row_source(monkeypatch, op, dt, n)
    kernel = src[src.index('extern "C"'):]
    if dt != "float16":
        assert "cl_f16_mag" not in kernel and "<true>(" not in kernel
        return
    for f in ("cl_phase0", "cl_phase1", "cl_epi"):
        body = src[src.index(f"void {f}("):]
        body = body[:body.index("\n}\n")]
        assert f"template <bool HW16 = false>\n__device__ __forceinline__ void {f}(" in src
        assert "cl_h2f<HW16>(x0)" in body and "f16_to_f32" not in body
        assert f"{f}<true>(0ull, 0ull, a0[" in kernel
    assert kernel.count("cl_n = cl_f16_mag(cl_n, cw);") == 2  # the max, the sum: per word
    assert "cl_n = cl_f16_mag(cl_n, p[v]);" in kernel  # the epilogue's words
    assert kernel.count("if (cl_f16_no_nan_in(cl_n)) {") == 3
    # the single-element paths keep the payload-keeping form
    assert kernel.count("cl_phase0(0ull, 0ull, a0, y);") == 1
    assert "cl_epi(0ull, 0ull, a0[u]" in kernel


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dt,n,lanes,per", [("bfloat16", 1024, 32, 32), ("float32", 1000, 32, 32),
                                            ("float16", 40, 32, 2), ("float32", 7, 8, 1)])
def test_softmax_warp_kernel_combines_by_shuffles(monkeypatch, op, dt, n, lanes, per):
    """The persistent warp softmax's row kernel (rows up to 2,048): each lane folds its
    elements lane + it * lanes with the trip count and the row's length written in (so
    that its loads issue together), and the lanes combine by an xor butterfly of shuffles
    from offset lanes/2; no thread walks the parts alone, no parts array in shared memory.
    (The source is inspected; the bits are tested on the GPU, test_reduce_sweep_cuda.)"""
    src = _softmax_row_source(monkeypatch, op, dt, n)
    kernel = src[src.index('extern "C"'):]
    assert "__launch_bounds__(32, 32)" in kernel
    assert kernel.count(f"for (int i0 = 0; i0 < {per}; i0 += {min(per, 16)})") == 2
    assert kernel.count(f"x[it] = i < {n} ? v[i]") == 2
    assert kernel.count(f"for (int off = {lanes} / 2; off > 0; off >>= 1)") == 2
    assert kernel.count("__shfl_xor_sync(0xffffffffu, r, off)") == 2
    assert "red_softmax_part" not in kernel and "red_softmax_combine" not in kernel
    assert "parts[" not in kernel


@pytest.mark.parametrize("dt,n,per", [("bfloat16", 4096, 4), ("bfloat16", 5000, 5),
                                      ("float32", 9000, 9)])
def test_softmax_register_kernel_reads_its_values_ahead(monkeypatch, dt, n, per):
    """cunn_SoftMaxForwardReg's order (fewer than 10 elements a thread of a 1,024-thread
    block): each thread reads its `per` elements t + k * 1024 into registers, then folds
    them in order, where in range; the generic loop (red_softmax_thread) is not used."""
    src = _softmax_row_source(monkeypatch, "softmax", dt, n)
    kernel = src[src.index('extern "C"'):]
    assert kernel.count(f"ACC x[{per}];") == 2
    assert kernel.count(f"x[k] = i < {n} ? v[i]") == 2
    assert kernel.count(f"if (t + k * 1024 < {n}) r = cl::red_op(") == 2
    assert "red_softmax_thread<" not in kernel


@pytest.mark.parametrize("bf", [True, False])
def test_div_rn_16_rounds_as_the_division(bf):
    """cl_div_rn_16's rule (ops/cuda/prelude.cuh), run in NumPy's IEEE float32: q =
    fl(a * fl(1 / b)) kept where it is normal in the 16-bit format and 9 or more fp32 bit
    patterns from a 16-bit midpoint, else fl(a / b). Rounded to bf16/fp16 (ml_dtypes,
    nearest even), it must give fl(a / b)'s 16-bit value for every a and b: random bit
    patterns (specials included), the softmax's range, and quotients placed within 12
    patterns of a midpoint, where the product alone would round the other way."""
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(7)
    u32 = np.uint32
    half = ml_dtypes.bfloat16 if bf else np.float16

    def rule(a, b):
        with np.errstate(all="ignore"):
            ub = b.view(u32) & u32(0x7FFFFFFF)
            r = np.where(ub - u32(1) < u32(0x7E800000), np.float32(1) / b, np.float32(np.nan))
            q = (a * r).astype(np.float32)
            mag, u = np.abs(q), q.view(u32)
            if bf:
                low = (u + u32(0x8008)) & u32(0xFFFF)
                ok = (mag >= np.float32(2.0**-126)) & (mag < np.float32(2.0**127))
            else:
                low = (u + u32(0x1008)) & u32(0x1FFF)
                ok = (mag >= np.float32(2.0**-14)) & (mag < np.float32(65504.0))
            return np.where(ok & (low > 16), q, a / b), ok & (low > 16)

    def bits16(v):
        with np.errstate(over="ignore"):  # above fp16's range: inf on both sides
            return v.astype(half).view(np.uint16)

    n = 1 << 20
    cases = [  # random bit patterns; exp(x - max) over a row sum (softmax's own range)
        (rng.integers(0, 2**32, n, dtype=np.uint64).astype(u32).view(np.float32),
         rng.integers(0, 2**32, n, dtype=np.uint64).astype(u32).view(np.float32)),
        (np.exp(-rng.uniform(0, 90, n)).astype(np.float32),
         rng.uniform(1, 2e5, n).astype(np.float32))]
    # quotients within 12 fp32 patterns of a 16-bit midpoint
    b = rng.uniform(1, 2e5, n).astype(np.float32)
    mid = (rng.integers(0x3000, 0x3F80, n) if bf else rng.integers(0x0400, 0x7BFF, n))
    mid_f32 = ((mid.astype(u32) << 16) | u32(0x8000) if bf else
               mid.astype(np.uint16).view(np.float16).astype(np.float32).view(u32) + u32(0x1000))
    q = (mid_f32.astype(np.int64) + rng.integers(-12, 13, n)).astype(u32).view(np.float32)
    cases.append(((q.astype(np.float64) * b).astype(np.float32), b))
    near = 0
    for a, b in cases:
        got, sure = rule(a, b)
        with np.errstate(all="ignore"):
            want = (a / b).astype(np.float32)
            prod = (a * (np.float32(1) / b)).astype(np.float32)
        g, w = bits16(got), bits16(want)
        nan = np.isnan(want)
        assert np.array_equal(g[~nan], w[~nan]), int((g[~nan] != w[~nan]).sum())
        assert np.isnan(got[nan]).all()
        near += int((bits16(prod) != w)[~nan].sum())
    assert near > 0  # the product alone differs somewhere: the rule's division is needed
