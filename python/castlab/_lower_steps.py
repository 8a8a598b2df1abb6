"""The steps of a lowered plan, as named records.

A plan (castlab._lower.Plan) runs its steps in order; each reads its ``leaves`` and writes
its ``outs``: while lowering, Leaf expressions (castlab._lower_views); in a Plan, their
bindings ``(kind, slot, shape, strides, offset)``. Each record is a tuple whose first
field is the tag ``_C.Plan`` reads the step by (a Program; None for a reduce step; the
kind's name for the others), so the C++ plan takes the records as they are.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class ProgramStep(NamedTuple):
    """One Program (an elementwise kernel) over its leaves into its outputs."""

    program: Any  # a _C.Program
    leaves: list
    outs: list


class ReduceStep(NamedTuple):
    """A reduction of each row of ``leaves[0]`` (seen as [rows, n]) into ``outs[0]``;
    spec: ops/reduce.h's ReduceSpec, (kind, order, p0..p3[, p4, p5])."""

    tag: None
    leaves: list
    outs: list
    spec: tuple

    @classmethod
    def make(cls, leaves: list, outs: list, spec: tuple) -> ReduceStep:
        return cls(None, leaves, outs, spec)


class IndexStep(NamedTuple):
    """gather / scatter_add / an index range check: leaves [src, index], spec
    (mode, dim, size, wrap, target) (ops/index.h)."""

    tag: str
    leaves: list
    outs: list
    spec: tuple

    @classmethod
    def make(cls, leaves: list, outs: list, spec: tuple) -> IndexStep:
        return cls("index", leaves, outs, spec)


class NllStep(NamedTuple):
    """nll_loss's reduction over rows: leaves [values, weights, targets], spec
    (order, reduction, fmt, has_w, ignore_index) (ops/loss.h)."""

    tag: str
    leaves: list
    outs: list
    spec: tuple

    @classmethod
    def make(cls, leaves: list, outs: list, spec: tuple) -> NllStep:
        return cls("nll", leaves, outs, spec)


class RowStep(NamedTuple):
    """Reductions fused with their prologue Programs and an epilogue Program (ops/row_step.h):
    spec (rows, n, phases, epilogue, epilogue leaves, epilogue outs, row strides, column
    strides) (castlab._schedule.fuse_rows)."""

    tag: str
    leaves: list
    outs: list
    spec: tuple

    @classmethod
    def make(cls, leaves: list, outs: list, spec: tuple) -> RowStep:
        return cls("row", leaves, outs, spec)


Step = ProgramStep | ReduceStep | IndexStep | NllStep | RowStep

__all__ = ["ProgramStep", "ReduceStep", "IndexStep", "NllStep", "RowStep", "Step"]
