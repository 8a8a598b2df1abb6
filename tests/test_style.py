"""The repository's formatting and lint rules hold (ruff for Python, clang-format for C++)."""

import pathlib
import re
import shutil
import subprocess

import pytest
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CPP_DIRS = ["core", "ops", "python/src", "tests/cpp"]


def test_ruff_clean():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    r = subprocess.run([ruff, "check", "python/castlab", "tests", "benchmarks", "notebooks"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:]


def test_clang_format_clean():
    cf = shutil.which("clang-format")
    if cf is None:
        pytest.skip("clang-format is not installed")
    files = sorted(str(p) for d in CPP_DIRS for ext in ("*.h", "*.cpp")
                   for p in (ROOT / d).rglob(ext))
    r = subprocess.run([cf, "--dry-run", "-Werror", *files], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-4000:]


# Modules a test may skip without: the GPU's libraries (cupy, triton, the kernel libraries
# the GPU script carries) -- every other module a test needs is in the `test` extra, so CI
# (which installs it) never skips a CPU test for a missing package.
GPU_ONLY = {"cupy", "triton", "liger_kernel", "transformer_engine",
            "fused_rotary_positional_embedding"}


def test_every_module_a_test_skips_without_is_in_the_test_extra():
    with open(ROOT / "pyproject.toml", "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    have = {re.split(r"[<>=!;\[ ]", d, maxsplit=1)[0].lower().replace("-", "_") for d in extra}
    have |= {"torch", "distributed"}   # installed first by the test command; dask's
    needed = set()
    for p in (ROOT / "tests").glob("*.py"):
        needed |= set(re.findall(r'importorskip\("([A-Za-z0-9_]+)', p.read_text()))
    missing = sorted(m for m in needed - have if m not in GPU_ONLY)
    assert not missing, (f"tests skip without {missing}, which the `test` extra in "
                         "pyproject.toml does not install: CI would skip those tests silently")
