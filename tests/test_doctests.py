"""The examples in castlab's docstrings (every module, public and internal) run and show
what they print."""

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import castlab
import castlab.numerics

MODULES = ["castlab"] + sorted(
    m.name for m in pkgutil.walk_packages(castlab.__path__, "castlab.")
    if m.name != "castlab.__main__")  # importing __main__ runs the command line
# modules whose examples compile with torch.compile's Inductor
INDUCTOR = {"castlab.torch._versus"}
# modules whose examples take over ~10 s on 2 cores (torch.export, torch.compile)
SLOW = {"castlab.torch", "castlab.torch._versus"}


def _param(m: str):
    marks = ([pytest.mark.inductor] if m in INDUCTOR else []) + ([pytest.mark.slow] if m in SLOW
                                                                  else [])
    return pytest.param(m, marks=marks)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
@pytest.mark.parametrize("name", [_param(m) for m in MODULES])
def test_doctests(name):
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, globs={"cl": castlab, "castlab": castlab, "np": np},
                          report=False)
    assert res.failed == 0, f"{res.failed} of {res.attempted} doctest examples failed in {name}"


def test_public_modules_have_examples():
    for name in ("castlab", "castlab.ops", "castlab._creation", "castlab.policy", "castlab._jit",
                 "castlab.cuda", "castlab.study", "castlab.plot", "castlab.numerics"):
        finder = doctest.DocTestFinder()
        n = sum(len(t.examples) for t in finder.find(importlib.import_module(name)))
        assert n > 0, f"{name} has no docstring examples"


def test_numerics_public_names_have_examples():
    for name in castlab.numerics.__all__:
        doc = getattr(castlab.numerics, name).__doc__ or ""
        assert ">>>" in doc, f"castlab.numerics.{name} has no docstring example"
