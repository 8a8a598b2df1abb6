"""castlab's portable math library (ops/scalar/math_portable.h), measured by the C++
harness tests/cpp/test_math_portable.cpp: expf exhaustively over every float input with
a finite result, the other functions on all bf16 patterns and a large random sample.
The harness exits nonzero when a bound is broken (expf: 1 ulp; others: 2 ulp)."""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _cpu_flags() -> list[str]:
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return []
    return ["-mavx2", "-mfma"] if (" avx2" in info and " fma" in info) else []


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("mathtest") / "test_math_portable"
    cmd = [cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-fno-trapping-math", *_cpu_flags(),
           f"-I{ROOT}", str(ROOT / "tests/cpp/test_math_portable.cpp"), "-o", str(exe), "-pthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


@pytest.mark.slow  # ~35 s: expf over every float
def test_portable_math_exhaustive(harness):
    r = subprocess.run([str(harness)], capture_output=True, text=True, timeout=1200)
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "expf_" in r.stdout
