"""castlab.testing: proven tolerances and exhaustive checks for people who write kernels.

- :func:`bounds`: the proven worst case of a chain or library preset against the exact
  answer, PyTorch eager and torch.compile, over every input of a dtype (or a stated
  sample), cached on disk.
- :func:`assert_kernel_matches`: run your kernel (any callable on torch tensors) on every
  input and fail with a report -- how many differ, the first differing inputs, each
  explained -- unless it equals a castlab reference bit for bit (or within ``max_ulp``).
- :func:`inputs`: the values of a dtype to feed a kernel: all, finite, specials or a
  sample. The pytest plugin (entry point ``pytest11``) provides the fixtures
  ``castlab_bounds`` and ``castlab_inputs``.

>>> import castlab as cl
>>> from castlab.testing import bounds
>>> b = bounds(cl.library("liger")["swiglu"], "bfloat16", against=["torch_eager"],
...            sample=1 << 18, cache=False)
>>> b.rows["torch_eager"]["differ"]
0
"""

from ._bounds import DEFAULT_AGAINST, Bounds, bounds, cache_dir
from ._inputs import inputs
from ._kernel import KernelMismatch, KernelReport, assert_kernel_matches
from ._target import unary_ops

__all__ = ["bounds", "Bounds", "assert_kernel_matches", "KernelReport", "KernelMismatch",
           "inputs", "cache_dir", "unary_ops", "DEFAULT_AGAINST"]
