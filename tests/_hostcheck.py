"""Small C++ programs that tests compile for the host and run: castlab's scalar headers
(ops/scalar/*.h) checked against each other over millions of values. A program's source
starts with HEAD (the counters, ``report`` and ``around``) and prints "checked bad"."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

HEAD = r"""#include <cmath>
#include <cstdio>
#include <random>
static unsigned long long checked = 0, bad = 0;
// counts one comparison; prints the first few failures
template <class... A>
static void report(bool ok, const char* fmt, A... args) {
  ++checked;
  if (!ok && bad++ < 5) printf(fmt, args...);
}
// check(v) at v and 3 fp64 ulps either side
template <class C>
static void around(double v, C check) {
  double u = v, d = v;
  check(v);
  for (int k = 0; k < 3; ++k) {
    u = std::nextafter(u, INFINITY);
    d = std::nextafter(d, -INFINITY);
    check(u);
    check(d);
  }
}
"""


def run(tmp_path, source: str) -> tuple[int, int, str]:
    """Compile HEAD + `source` (with the repository on the include path, no fused
    multiply-adds, as NVRTC's --fmad=false) and run it: (checked, bad, its output)."""
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    (tmp_path / "check.cpp").write_text(HEAD + source)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-I", root,
                    str(tmp_path / "check.cpp"), "-o", str(tmp_path / "check")], check=True)
    out = subprocess.run([str(tmp_path / "check")], check=True, capture_output=True,
                         text=True).stdout
    words = out.split()
    return int(words[-2]), int(words[-1]), out
