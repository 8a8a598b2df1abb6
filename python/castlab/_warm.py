"""Warming a set of jit runs: their kernels compiled at the same time before they run
one by one (the studies on a GPU, :meth:`castlab.JitFunction.precompile`)."""

from __future__ import annotations

import functools

from . import _C, cuda
from ._lower_steps import IndexStep, NllStep, ReduceStep

__all__ = ["warm"]

#: The group of castlab's fixed-source kernels (cuda.builtin_kernels) a plan step uses.
_STEP_KERNELS = {ReduceStep: "reduce", IndexStep: "index", NllStep: "loss"}


def warm(runs: list, threads: int | None = None, errors: str = "ignore",
         device: str | None = None) -> None:
    """Run each (jit function, args, policy, math) of `runs` once, for the kernels it
    compiles: traced and lowered here one after another, then run `threads` at a time
    (``cuda.compile_threads()``), the GIL released, so that first-run NVRTC compiles
    overlap. The results are dropped; the plans and kernels stay cached, so a later run
    computes exactly what it would have. `errors="ignore"` leaves a run that fails for
    its real run to report; "raise" raises the first failure. With a CUDA `device`,
    castlab's fixed-source kernels that the plans' steps use (the generic reduction of each
    order they reduce in, the index and loss kernels) and numerics.compare's compile
    alongside, each its own task, the slowest first."""
    ready, groups, orders = [], {"compare"}, set()
    for fn, args, pol, mth in runs:
        try:
            plan = fn._lowered(args, pol, mth)
        except Exception:  # noqa: BLE001  (see `errors`)
            if errors == "raise":
                raise
            continue
        groups.update(_STEP_KERNELS[type(st)] for st in plan.steps if type(st) in _STEP_KERNELS)
        orders.update(st.spec[1] for st in plan.steps if type(st) is ReduceStep)
        ready.append(functools.partial(fn.run, *args, policy=pol, math=mth))
    if device is not None and str(device).startswith("cuda"):
        order = ("reduce", "compare", "loss", "index")   # longest NVRTC compiles first
        ks = cuda.builtin_kernels(*sorted(groups, key=order.index))
        # the generic reduction is one kernel per order: those of the plans' reduce steps
        names = {_C._reduce_kernel_name(f64, o) for o in orders for f64 in (False, True)}
        ks = [k for k in ks if cuda.kernel_group(k[1]) != "reduce" or k[0] in names]
        ks.sort(key=lambda k: order.index(cuda.kernel_group(k[1])))
        ready = [functools.partial(cuda.precompile_kernels, [k], device, 1) for k in ks] + ready
    cuda._concurrently(ready, threads, errors=errors)

