"""The CPU code generator (ops/cpu/jit.h, castlab.cpu_codegen) gives the interpreter's bits.

Each case runs one program twice in this process: interpreted (codegen off) and as the
compiled loop (sync, from 0 elements), and asks for the same bits in every output. The
inputs are all 65,536 bf16 patterns (widened for fp32/fp64; for fp16 the fp16 patterns),
so NaNs, infinities, signed zeros and subnormals are in every case. A NaN equals a NaN
whatever its sign and payload: C++ compilers treat a + b as commutative, and x86 returns
the first operand's NaN, so two builds of one expression may differ there (bf16 and fp16
outputs are canonical NaNs either way). The interpreter's
bits themselves are checked against PyTorch, NumPy and exact references elsewhere
(tests/test_ops.py, test_special_values.py, test_torch_cpu_math.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import castlab as cl
from castlab import _optable

# The folder castlab was imported from: children import the same castlab.
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(cl.__file__)))

try:  # torch changes what torch_eager computes (MKL VML, scalar tails): load it up front,
    import torch  # noqa: F401  so every test sees the same, whatever ran before
except ImportError:
    pass

pytestmark = pytest.mark.skipif(bool(cl.cpu_codegen()["why_not"]),
                                reason="no C++ compiler: " + cl.cpu_codegen()["why_not"])

UNARY = tuple(o.name for o in _optable.OPS.values() if o.arity == 1 and o.public)
ARITH = ("add", "sub", "mul", "div", "maximum", "minimum", "pow")
NP = {"float32": np.float32, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16,
      "float16": np.float16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@pytest.fixture
def codegen():
    """Restores the generator's settings after the test."""
    old = cl.cpu_codegen()
    yield
    cl.cpu_codegen(old["mode"], old["min_elements"])


def _patterns(dtype: str, n: int = 1 << 16) -> np.ndarray:
    if dtype == "float16":
        x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    else:
        x = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    x = np.resize(x, n)
    with np.errstate(invalid="ignore"):
        return x.astype(NP[dtype])


def _bits(t) -> np.ndarray:
    a = np.asarray(t.numpy() if hasattr(t, "numpy") else t)
    return a.view(UINT[a.dtype.itemsize])


def _both(fn, *args):
    """fn(*args) interpreted, then compiled; the generator's `runs` must have grown."""
    cl.cpu_codegen("off")
    ref = fn(*args)
    cl.cpu_codegen("sync", min_elements=0)
    before = cl.cpu_codegen()
    got = fn(*args)
    after = cl.cpu_codegen()
    assert after["failures"] == before["failures"], "a kernel failed to compile"
    ref = ref if isinstance(ref, tuple) else (ref,)
    got = got if isinstance(got, tuple) else (got,)
    return ref, got, after["runs"] - before["runs"]


def _assert_same(ref, got, names):
    for name, r, g in zip(names, ref, got, strict=True):
        rb, gb = _bits(r), _bits(g)
        with np.errstate(invalid="ignore"):
            nan = np.isnan(r.numpy().astype(np.float64)) & np.isnan(g.numpy().astype(np.float64))
        bad = np.flatnonzero((rb != gb) & ~nan)
        assert bad.size == 0, (f"{name}: {bad.size} elements differ, first at {bad[0]}: "
                               f"interpreter {rb.flat[bad[0]]:#x}, compiled {gb.flat[bad[0]]:#x}")


EXTRA = {"gelu tanh": lambda x: cl.gelu(x, approximate="tanh"), "pow 2.5": lambda x: x ** 2.5,
         "pow 0.5": lambda x: x ** 0.5, "pow -1": lambda x: x ** -1.0}  # 0.5: sqrt


def _unary(ops):
    def f(x):
        return tuple(EXTRA[op](x) if op in EXTRA else getattr(cl, op)(x) for op in ops)
    return f


def _binary_all(x, y):
    return tuple(getattr(cl, op)(x, y) for op in ARITH) + (cl.fma(x, y, x),)


MATHS = {
    "torch_eager": "torch_eager",  # the default: PyTorch CPU's SLEEF functions (torch_cpu)
    "portable": cl.Math.preset("portable"),
    "libm": cl.Math("libm", impl="libm"),
}

CASES = [  # (dtype, policy, math)
    ("bfloat16", "fused", "torch_eager"), ("float16", "fused", "torch_eager"),
    ("float32", "fused", "torch_eager"), ("float64", "fused", "torch_eager"),
    ("bfloat16", "eager", "torch_eager"), ("bfloat16", "fp64", "torch_eager"),
    ("bfloat16", "fused", "portable"), ("float32", "eager", "portable"),
    ("bfloat16", "fused", "libm"), ("float32", "fused", "libm"),
]


@pytest.mark.parametrize("dtype,policy,math", CASES)
def test_every_unary_op_same_bits(codegen, dtype, policy, math):
    x = cl.from_numpy(_patterns(dtype))
    # Interpreted, never compiled: torch_cpu's float sin/cos (SLEEF's argument reduction is
    # chosen per vector of 8) and ops PyTorch sends to MKL VML (fp32/fp64 exp, log, ...,
    # once torch is loaded): a program with them runs as a whole in the interpreter.
    wide = dtype == "float64" or policy == "fp64"
    m = cl.Math.preset(math) if isinstance(MATHS[math], str) else MATHS[math]
    vml, sleef = _optable.BITS["torch_vml"], _optable.MATH_IMPLS["torch_cpu"]
    bits = {op: m.variant_bits(op, wide, False, dtype) for op in UNARY}
    bits["pow 0.5"] = bits["sqrt"]
    alone = [op for op in [*UNARY, *EXTRA] if bits.get(op, 0) & vml or (
        op in ("sin", "cos") and not wide and bits[op] & _optable.IMPL_MASK == sleef)]
    ops = [op for op in [*UNARY, *EXTRA] if op not in alone]
    ref, got, runs = _both(cl.jit(_unary(ops), policy=policy, math=MATHS[math]), x)
    _assert_same(ref, got, ops)
    assert runs >= 1
    if alone:
        ref, got, runs = _both(cl.jit(_unary(alone), policy=policy, math=MATHS[math]), x)
        _assert_same(ref, got, alone)
        assert runs == 0


@pytest.mark.parametrize("dtype,policy,math", CASES)
def test_binary_ops_and_fma_same_bits(codegen, dtype, policy, math):
    x = _patterns(dtype)
    y = np.roll(x, 12345)  # every pattern against another, specials against ordinary values
    f = cl.jit(_binary_all, policy=policy, math=MATHS[math])
    ref, got, runs = _both(f, cl.from_numpy(x), cl.from_numpy(y))
    _assert_same(ref, got, list(ARITH) + ["fma"])
    assert runs >= 1


def _swiglu(a, b):
    return cl.silu(a) * b


def _rope(x, cos, sin):
    x1, x2 = cl.chunk(x, 2, -1)
    return x * cos + cl.cat([-x2, x1], dim=-1) * sin


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("policy", ["fused", "eager", "fp64"])
def test_rope_broadcast_and_halves_same_bits(codegen, dtype, policy):
    rng = np.random.default_rng(0)
    x = _patterns(dtype, 2 * 5 * 64 * 128).reshape(2, 5, 64, 128)
    rng.shuffle(x.reshape(-1))
    cos = rng.standard_normal((64, 128)).astype(NP[dtype])
    sin = rng.standard_normal((64, 128)).astype(NP[dtype])
    f = cl.jit(_rope, policy=policy)
    ref, got, runs = _both(f, *(cl.from_numpy(a) for a in (x, cos, sin)))
    _assert_same(ref, got, ["rope"])
    assert runs >= 1


def test_strided_and_transposed_inputs_same_bits(codegen):
    # portable math: no PyTorch scalar-lambda emulation, so strided layouts compile too
    x = _patterns("float32", 512 * 256).reshape(512, 256)
    y = np.ascontiguousarray(np.roll(x, 7).T)  # read through a transpose below
    f = cl.jit(_swiglu, math=MATHS["portable"])
    a = cl.from_numpy(x)[:, ::2]
    b = cl.from_numpy(y).transpose(0, 1)[:, 1::2]
    ref, got, runs = _both(f, a, b)
    _assert_same(ref, got, ["swiglu"])
    assert runs >= 1
    np.testing.assert_array_equal(_bits(got[0]), _bits(f(a.clone(), b.clone())))


@pytest.mark.parametrize("n", [(1 << 16) + 13, 3 * 32768 + 5, 100003])
def test_torch_scalar_tails_keep_the_interpreter_s_bits(codegen, n):
    # with torch loaded, torch_eager's silu recomputes the tail of each of PyTorch's thread
    # chunks with glibc (kVarTorchTail): those blocks stay interpreted, the others compile
    pytest.importorskip("torch")
    x = _patterns("bfloat16", n)
    f = cl.jit(_swiglu)
    ref, got, runs = _both(f, cl.from_numpy(x), cl.from_numpy(np.roll(x, 999)))
    _assert_same(ref, got, ["swiglu"])
    assert runs >= 1
    eager = cl.silu(cl.from_numpy(x))  # its own program (one op), same rule
    cl.cpu_codegen("off")
    np.testing.assert_array_equal(_bits(eager), _bits(cl.silu(cl.from_numpy(x))))


def test_fp8_and_mixed_dtypes_same_bits(codegen):
    x = _patterns("bfloat16")
    x8 = cl.from_numpy(x.astype(np.float32)).astype(cl.float8_e4m3fn)
    y = cl.from_numpy(np.roll(x, 3).astype(np.float32))

    def f(a, b):
        wide = a.astype(cl.float32)
        return (wide * b).astype(cl.float8_e4m3fn), cl.exp(wide) + b, cl.exp(a)

    ref, got, runs = _both(cl.jit(f, math="portable"), x8, y)
    _assert_same(ref, got, ["fp8 out", "f32 out", "fp8 exp"])
    assert runs >= 1


def test_output_sharing_memory_with_an_input_stays_interpreted(codegen):
    v = _patterns("float32", 1 << 17)
    x = cl.from_numpy(v.copy())
    cl.cpu_codegen("sync", min_elements=0)
    before = cl.cpu_codegen()["runs"]
    cl.copy_(x, x)  # the output is the input, element for element
    assert cl.cpu_codegen()["runs"] == before
    np.testing.assert_array_equal(_bits(x), v.view(np.uint32))
    x[1:] = x[:-1]  # overlapping views: through a temporary, as NumPy
    w = v.copy()
    w[1:] = w[:-1]
    np.testing.assert_array_equal(_bits(x), w.view(np.uint32))


def test_below_min_elements_and_off_stay_interpreted(codegen):
    x = cl.from_numpy(_patterns("float32", 1000))
    cl.cpu_codegen("sync", min_elements=1001)
    before = cl.cpu_codegen()["runs"]
    cl.exp(x)
    assert cl.cpu_codegen()["runs"] == before
    cl.cpu_codegen("off", min_elements=0)
    cl.exp(x)
    assert cl.cpu_codegen()["runs"] == before


def test_async_compiles_in_the_background_then_runs(codegen):
    x = cl.from_numpy(_patterns("float32", 4096))
    y = cl.from_numpy(np.roll(_patterns("float32", 4096), 5))

    def f(a, b):
        return cl.tanh(a) * b + 0.25  # a program no other test compiles (portable: no VML)

    g = cl.jit(f, math="portable")
    cl.cpu_codegen("off")
    ref = g(x, y)
    cl.cpu_codegen("async", min_elements=0)
    first = g(x, y)  # interpreted while it compiles
    st = cl.cpu_codegen(wait=True)
    assert st["pending"] == 0
    before = st["runs"]
    got = g(x, y)
    assert cl.cpu_codegen()["runs"] == before + 1
    _assert_same((ref, ref), (first, got), ["first call", "after compiling"])


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="mode must be one of"):
        cl.cpu_codegen("fast")
    with pytest.raises(TypeError, match="min_elements must be an int"):
        cl.cpu_codegen(min_elements=1.5)
    with pytest.raises(TypeError, match="min_elements must be an int"):
        cl.cpu_codegen(min_elements=True)
    with pytest.raises(ValueError, match="min_elements must be >= 0"):
        cl.cpu_codegen(min_elements=-1)


_CHILD = r"""
import json, sys
import numpy as np
import castlab as cl
x = cl.from_numpy(np.linspace(-5, 5, 1 << 18, dtype=np.float32))
f = cl.jit(lambda a: cl.sigmoid(a) * a - 1.0)
y = f(x)
print(json.dumps({"status": cl.cpu_codegen(), "sum": float(np.asarray(y.numpy(), np.float64).sum())}))
"""


def _child(env_extra: dict, tmp_path) -> dict:
    env = dict(os.environ, CASTLAB_CPU_CODEGEN="sync", CASTLAB_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = _PKG + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("CXX", "CASTLAB_CXX", "CASTLAB_CPU_CODEGEN_MIN"):  # this test's choices only
        env.pop(k, None)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_disk_cache_serves_a_second_process(tmp_path):
    first = _child({}, tmp_path)
    second = _child({}, tmp_path)
    assert first["status"]["compiled"] == 1 and first["status"]["runs"] == 1
    assert second["status"]["compiled"] == 0 and second["status"]["disk_hits"] == 1
    assert second["status"]["runs"] == 1
    assert first["sum"] == second["sum"]


@pytest.mark.slow  # compiler runs and timeouts: 3-5 s
def test_no_compiler_or_a_broken_one_falls_back_to_the_interpreter(tmp_path):
    ref = _child({"CASTLAB_CPU_CODEGEN": "off"}, tmp_path)
    none = _child({"CASTLAB_CXX": "/nonexistent/c++", "PATH": str(tmp_path)}, tmp_path)
    assert "no C++ compiler found" in none["status"]["why_not"]
    assert none["status"]["runs"] == 0 and none["sum"] == ref["sum"]
    # a "compiler" that answers --version but writes no library
    broken = _child({"CASTLAB_CXX": "echo", "CASTLAB_CACHE_DIR": ""}, tmp_path)
    assert broken["status"]["failures"] == 1 and broken["status"]["runs"] == 0
    assert broken["status"]["last_error"]
    assert broken["sum"] == ref["sum"]


_EXIT_MID_COMPILE = r"""
import os
import numpy as np
import castlab as cl
x = cl.from_numpy(np.linspace(-5, 5, 1 << 18, dtype=np.float32))
f = cl.jit(lambda a: cl.tanh(a) * a - 3.5, math="portable")
f(x)  # queues the compile in the background, then the process exits at once
print(os.getpid(), cl.cpu_codegen()["pending"])
"""


def test_exit_mid_compile_and_dead_processes_leave_no_temporary_files(tmp_path):
    tmp = tmp_path / "t"
    tmp.mkdir()
    # what a killed process left: its folder, and a library it had not yet loaded
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    (tmp / f"castlab-cpu-{p.pid}-abcdef").mkdir()
    (tmp / f"castlab-cpu-{p.pid}-abcdef" / "kernel.cpp").write_text("//")
    (tmp / f"castlab-cpu-{p.pid}-ghijkl.so").write_text("")
    (tmp / "castlab-cpu-notapid").mkdir()  # not castlab's naming: left alone
    env = dict(os.environ, CASTLAB_CPU_CODEGEN="async", CASTLAB_CACHE_DIR="", TMPDIR=str(tmp))
    env["PYTHONPATH"] = _PKG + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CASTLAB_CPU_CODEGEN_MIN", None)
    out = subprocess.run([sys.executable, "-c", _EXIT_MID_COMPILE], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    pid, pending = out.stdout.split()
    assert pending == "1"  # it did exit with the compiler running
    assert sorted(q.name for q in tmp.iterdir()) == ["castlab-cpu-notapid"], list(tmp.iterdir())


def _compiler() -> str:
    import shutil
    for c in ("c++", "g++", "clang++"):
        if shutil.which(c):
            return c
    pytest.skip("no C++ compiler on this machine")


@pytest.mark.slow  # compiler runs and timeouts: 3-5 s
def test_flags_in_castlab_cxx_are_part_of_the_disk_cache_key(tmp_path):
    # issue 50 item 10: a kernel built by `g++ -O0 -DX` was reused by plain `g++`
    cxx = _compiler()
    flagged = _child({"CASTLAB_CXX": f"{cxx} -O0 -DCASTLAB_KEY_TEST=1"}, tmp_path)
    plain = _child({"CASTLAB_CXX": cxx}, tmp_path)
    again = _child({"CASTLAB_CXX": f"{cxx} -O0 -DCASTLAB_KEY_TEST=1"}, tmp_path)
    assert flagged["status"]["compiled"] == 1
    assert plain["status"]["compiled"] == 1 and plain["status"]["disk_hits"] == 0
    assert again["status"]["compiled"] == 0 and again["status"]["disk_hits"] == 1
    assert flagged["sum"] == plain["sum"] == again["sum"]


_TWO_PROGRAMS = r"""
import json, time
import numpy as np
import castlab as cl
x = cl.from_numpy(np.linspace(-5, 5, 1 << 18, dtype=np.float32))
t0 = time.monotonic()
a = cl.jit(lambda v: cl.sigmoid(v) * v - 1.0)(x)
b = cl.jit(lambda v: cl.tanh(v) * 3.0)(x)
print(json.dumps({"status": cl.cpu_codegen(), "seconds": time.monotonic() - t0,
                  "a": a.numpy().tolist()[:4096:97], "b": b.numpy().tolist()[:4096:97]}))
"""


def _hung_child(tmp_path, script: str, extra: dict) -> tuple:
    env = dict(os.environ, CASTLAB_CPU_CODEGEN="sync", CASTLAB_CACHE_DIR="",
               CASTLAB_CXX_TIMEOUT="1")
    env["PYTHONPATH"] = _PKG + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("CXX", "CASTLAB_CXX", "CASTLAB_CPU_CODEGEN_MIN"):
        env.pop(k, None)
    if script:
        cc = tmp_path / "cc"
        cc.write_text(script)
        cc.chmod(0o755)
        env["CASTLAB_CXX"] = str(cc)
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", _TWO_PROGRAMS], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.slow  # compiler runs and timeouts: 3-5 s
@pytest.mark.parametrize("where", ["version", "compile"])
def test_a_compiler_that_hangs_times_out_and_the_interpreter_runs(tmp_path, where):
    # issue 50 item 13: a compiler (or a ccache/distcc wrapper) that never exits used to
    # hang the first call for ever, holding the JIT's lock
    ref, _ = _hung_child(tmp_path, "", {"CASTLAB_CPU_CODEGEN": "off"})
    if where == "version":
        script = "#!/bin/sh\nexec sleep 300\n"
    else:
        script = ('#!/bin/sh\nif [ "$1" = --version ]; then echo "hangcc 1.0"; exit 0; fi\n'
                  "exec sleep 300\n")
    got, err = _hung_child(tmp_path, script, {})
    st = got["status"]
    assert got["a"] == ref["a"] and got["b"] == ref["b"]
    assert st["runs"] == 0 and st["compiled"] == 0
    want = "did not answer --version within 1 s" if where == "version" else "ran past 1 s"
    assert want in st["why_not"], st
    # one warning, and the second program did not try (and wait) again
    assert err.count("castlab: warning:") == 1, err
    assert st["failures"] == (0 if where == "version" else 1)
    assert got["seconds"] < 30


@pytest.mark.slow  # compiler runs and timeouts: 3-5 s
def test_compiler_timeout_setting_is_read_and_bad_values_are_ignored(tmp_path):
    cxx = _compiler()
    for bad in ("nan", "-1", "0", "abc", "1e9"):
        got = _child({"CASTLAB_CXX": cxx, "CASTLAB_CXX_TIMEOUT": bad}, tmp_path)
        assert got["status"]["runs"] == 1, (bad, got["status"])
