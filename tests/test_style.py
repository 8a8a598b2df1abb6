"""The repository's formatting and lint rules hold (ruff for Python, clang-format for C++)."""

import pathlib
import shutil
import subprocess

import pytest

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
