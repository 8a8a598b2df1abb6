"""castlab's pytest plugin (entry point ``pytest11``, loaded wherever castlab is installed):
the fixtures ``castlab_bounds`` and ``castlab_inputs``.

A kernel repository's test then reads::

    from castlab.testing import assert_kernel_matches
    import castlab as cl

    def test_my_swiglu_is_liger_bit_for_bit():
        assert_kernel_matches(my_swiglu, cl.library("liger")["swiglu"], mode="exhaustive")

    def test_my_swiglu_error(castlab_bounds, castlab_inputs):
        b = castlab_bounds("liger:swiglu", "bfloat16", against=["fp64"])  # cached on disk
        x = castlab_inputs("bfloat16", kind="specials")   # a torch tensor
        ...
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ._bounds import bounds
from ._inputs import inputs


@pytest.fixture
def castlab_bounds() -> Callable:
    """:func:`castlab.testing.bounds`: ``castlab_bounds(chain_or_preset, dtype,
    against=("fp64", "torch_eager", "inductor"), ...)``; results are cached on disk, so
    a suite pays for each bound once."""
    return bounds


@pytest.fixture
def castlab_inputs() -> Callable:
    """:func:`castlab.testing.inputs`: ``castlab_inputs(dtype, kind="all" | "finite" |
    "specials" | "sample", n=4096, seed=0, device="cpu", as_="torch")``, the values of a
    dtype as one flat tensor."""
    return inputs
