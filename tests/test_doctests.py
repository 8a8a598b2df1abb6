"""The examples in castlab.numerics's docstrings run and show what they print."""

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import castlab
import castlab.numerics

MODULES = ["castlab.numerics"] + sorted(
    f"castlab.numerics.{m.name}" for m in pkgutil.iter_modules(castlab.numerics.__path__))


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
@pytest.mark.parametrize("name", MODULES)
def test_numerics_doctests(name):
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, globs={"cl": castlab, "castlab": castlab, "np": np},
                          report=False)
    assert res.failed == 0, f"{res.failed} of {res.attempted} doctest examples failed in {name}"


def test_numerics_public_names_have_examples():
    for name in castlab.numerics.__all__:
        doc = getattr(castlab.numerics, name).__doc__ or ""
        assert ">>>" in doc, f"castlab.numerics.{name} has no docstring example"
