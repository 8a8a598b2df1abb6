"""Parallel kernel compiles (issue 53), the parts that run without a GPU: NVRTC from several
threads gives the bytes a serial compile gives, the thread count and its knob, the
concurrent-call helper, and the warm-up's coverage: the runs the study and the library
matrix warm up are exactly the plans their real runs use (the kernels are functions of
the plan and the inputs' layouts, so the same plans on the same inputs compile the same
sources). The GPU side is tests/test_compile_parallel_cuda.py."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import castlab as cl
import castlab.cuda as clcuda
from castlab import _C
from castlab import presets as _presets
from castlab._dtype import as_dtype
from castlab._jit import JitFunction, warm
from castlab._study_library import _warm_runs_of, library_inputs
from castlab._study_rows import _cell_warm_runs, _jit_of, _run_cell

ARCH = os.environ.get("CASTLAB_NVRTC_ARCH", "sm_90")


def _nvrtc_or_skip() -> None:
    try:
        _C._nvrtc_compile_image('extern "C" __global__ void k() {}\n', ARCH, "k")
    except Exception as e:  # noqa: BLE001  (no NVRTC here, or it lacks ARCH)
        pytest.skip(f"NVRTC cannot compile for {ARCH}: {e}")


def _tiny(i: int) -> str:
    return (f'extern "C" __global__ void castlab_t{i}(float* x) '
            f"{{ x[threadIdx.x] = x[threadIdx.x] * {i}.5f + 0.25f; }}\n")


def test_concurrent_nvrtc_gives_the_serial_bytes():
    _nvrtc_or_skip()
    srcs = [(f"castlab_t{i}", _tiny(i)) for i in range(8)]
    serial = [_C._nvrtc_compile_image(s, ARCH, n) for n, s in srcs]
    with ThreadPoolExecutor(4) as pool:
        par = list(pool.map(lambda ns: _C._nvrtc_compile_image(ns[1], ARCH, ns[0]), srcs * 2))
    assert par == serial * 2
    assert len(set(serial)) == len(serial)  # (distinct sources, distinct images)


def test_nvrtc_image_failure_raises_with_log():
    _nvrtc_or_skip()
    with pytest.raises(RuntimeError, match="undefined_name"):
        _C._nvrtc_compile_image('extern "C" __global__ void k() { undefined_name; }', ARCH)


def test_compile_threads_default_env_and_bounds(monkeypatch):
    monkeypatch.delenv("CASTLAB_COMPILE_THREADS", raising=False)
    n = clcuda.compile_threads()
    assert 1 <= n <= clcuda.MAX_COMPILE_THREADS
    assert n <= len(os.sched_getaffinity(0))
    monkeypatch.setenv("CASTLAB_COMPILE_THREADS", "3")
    assert clcuda.compile_threads() == 3
    assert clcuda.compile_threads(5) == 5  # the argument wins
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("CASTLAB_COMPILE_THREADS", bad)
        with pytest.raises(ValueError, match="CASTLAB_COMPILE_THREADS"):
            clcuda.compile_threads()
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="threads"):
            clcuda.compile_threads(bad)


def test_concurrently_keeps_order_and_reports_failures():
    seen = set()

    def call(i):
        def f():
            seen.add(threading.current_thread().name)
            if i == 3:
                raise KeyError(i)
            return i * i
        return f

    calls = [call(i) for i in range(8)]
    assert clcuda._concurrently(calls, 4, errors="ignore") == [0, 1, 4, None, 16, 25, 36, 49]
    with pytest.raises(KeyError):
        clcuda._concurrently(calls, 4)
    with pytest.raises(KeyError):
        clcuda._concurrently(calls, 1)
    assert clcuda._concurrently(calls[:3], 1) == [0, 1, 4]
    assert any(n.startswith("castlab-compile") for n in seen)


def _plans(jits) -> int:
    """The plans lowered so far by these jit functions and their backward functions."""
    n = 0
    for j in jits:
        for tr in list(j._cache.values()):
            n += len(tr.plans)
        n += _plans(j._backward.values())
    return n


def _cell_spec(chain: str, dt: str, device: str = "cpu") -> dict:
    from castlab import study
    from castlab._study_cells import _make_args

    ch = study.CHAINS[chain]
    shape = (4, 64) if chain == "swiglu" else (1, 2, 8, 16)
    spec = {"chain": ch, "dtype": as_dtype(dt), "seed_label": 0, "seed": 0, "shape": shape, "kind": "normal", "scale": 1.0,
            "device": device, "maths": [cl.policy.as_math(m) for m in ("torch_eager",
                                                                        "portable")],
            "pols": [cl.Policy.eager(), cl.Policy.fused()], "rounding": ["nearest"],
            "ref": cl.policy.as_policy("fp64"),
            "extras": [cl.policy.as_math("inductor")] if chain == "swiglu" else [],
            "grad": False, "attribute": False, "settings": {}}
    spec["made"] = _make_args(ch, shape, spec["dtype"], 0, "normal", 1.0, device)
    return spec


@pytest.mark.parametrize("chain", ["swiglu", "rope"])
def test_study_warm_up_covers_the_cells_plans(chain):
    # the warm-up lowers every plan the cell runs: the cell then lowers none of its own
    spec = _cell_spec(chain, "bfloat16")
    fn = _jit_of(spec["chain"].fn)
    fn.cache_clear()
    runs = _cell_warm_runs(spec)
    warm(runs, 2, errors="raise")
    lowered = _plans([fn])
    assert lowered == len({(id(f), p, m) for f, _, p, m in runs})
    rec = _run_cell(spec)
    assert _plans([fn]) == lowered, "the cell ran a plan the warm-up did not"
    # and the rows are those of a cell run without the warm-up
    fn.cache_clear()
    assert _run_cell(spec)["rows"] == rec["rows"]


def test_library_warm_up_covers_the_matrix_plans():
    from castlab import study

    size, names = 4096, ["torch_eager", "liger", "flash_attn"]
    libs = [_presets.library(n) for n in names]
    jits = [lib[op].jit() for lib in libs for op in lib.presets]
    for j in jits:
        j.cache_clear()
        j._backward.clear()
    inputs = {d: library_inputs(size, d, 0, "cpu") for d in ("bfloat16",)}
    runs = _warm_runs_of(inputs, list(_presets.OPS), libs)
    warm(runs, 2, errors="raise")
    lowered = _plans(jits)
    assert lowered > 0
    df = study.libraries(names, dtypes=["bfloat16"], size=size, device="cpu")
    assert _plans(jits) == lowered, "the matrix ran a plan the warm-up did not"
    assert len(df) > 0


def test_precompile_method_runs_each_combination():
    f = cl.jit(lambda x: cl.silu(x) * 1.375)
    x = cl.randn(64, seed=3, dtype=cl.bfloat16)
    moved = f.precompile(x, policies=["eager", "fused"], maths=["torch_eager", "portable"])
    assert set(moved) >= {"compiles", "memory_hits", "module_hits"}
    assert _plans([f]) == 4
    assert isinstance(f, JitFunction)
    with pytest.raises(ValueError):
        f.precompile(x, policies="no such policy")


def test_builtin_kernel_groups_partition_the_builtins():
    """cuda.builtin_kernels(*groups): each builtin kernel in exactly one group (the C++
    file it comes from); a study's warm-up compiles "compare" and, only where a plan
    reduces, "reduce", since the generic reduction's NVRTC compile dominates a cold run."""
    every = clcuda.builtin_kernels()
    groups = ("compare", "reduce", "loss", "index")
    parts = [clcuda.builtin_kernels(g) for g in groups]
    assert sorted(n for p in parts for n, _ in p) == sorted(n for n, _ in every)
    assert {n for n, _ in parts[0]} == {"cl_compare_leaves", "cl_compare_tree", "cl_near_ties",
                                        "cl_tie_split", "cl_ulp_error", "cl_ulp_diff"}
    # the generic reduction: one kernel per order (the softmax orders share one) and dtype,
    # and the reduction of columns per dtype
    assert {n for n, _ in parts[1]} == {f"cl_reduce_f{b}_o{o}" for b in (32, 64)
                                        for o in (0, 1, 2, 3, 5, 6, 7, 8, 9)} | {
                                            "cl_colred_f32", "cl_colred_f64"}
    with pytest.raises(ValueError, match="unknown kernel group 'nope'; groups: compare"):
        clcuda.builtin_kernels("nope")


@pytest.mark.parametrize("reduces", [False, True])
def test_warm_up_compiles_the_fixed_source_kernels_its_plans_use(reduces, monkeypatch):
    """warm(..., device="cuda"): numerics.compare's kernels always, the generic reduction
    only when a plan has a reduce step, each its own task ahead of the runs, the
    reduction (the slowest NVRTC compile) first. Recorded here without a GPU."""
    tasks, compiled = [], []
    monkeypatch.setattr(clcuda, "_concurrently", lambda calls, threads=None, errors="raise":
                        tasks.extend(calls))
    monkeypatch.setattr(clcuda, "precompile_kernels", lambda ks, device=0, threads=None:
                        compiled.extend(n for n, _ in ks))
    x = cl.randn(4, 64, seed=0)
    fn = cl.jit((lambda v: cl.sum(v * v, -1)) if reduces else (lambda v: cl.silu(v) * v))
    warm([(fn, (x,), cl.Policy("eager"), cl.Math.preset("torch_eager"))], 4, device="cuda:0")
    for t in tasks[:-1]:
        t()                      # the kernel tasks (the last task is the run itself)
    want = {n for n, _ in clcuda.builtin_kernels("compare")}
    if reduces:   # the kernels of the order the plan reduces in, not every order's
        (o,) = {st.spec[1] for st in fn._lowered((x,), cl.Policy("eager"),
                                                  cl.Math.preset("torch_eager")).steps
                if type(st).__name__ == "ReduceStep"}
        want |= {f"cl_reduce_f32_o{o}", f"cl_reduce_f64_o{o}"}
        assert compiled[0].startswith("cl_reduce")
    assert set(compiled) == want and len(tasks) == len(want) + 1
