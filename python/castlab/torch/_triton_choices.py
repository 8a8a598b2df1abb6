"""What a kernel Inductor generates for the GPU computes otherwise than the captured graph
says, where castlab.torch._inductor's placed regions must follow it: which product of an
add of two its fma takes (read from the launched kernel's PTX: _inductor_tiles). (Triton's
unary minus, 0 - x, is the inductor preset's: Math.neg.) Also the test of a view node."""

from __future__ import annotations

import operator
from typing import Any

import torch

from . import _aten
from ._partition import _arg_nodes

__all__ = ["fuses_right", "is_view"]

_SELECTS = ("aten.cat.default", "aten.where.self", "aten.where.ScalarOther",
            "aten.where.ScalarSelf")


def is_view(n: Any) -> bool:
    """Whether FX node n is a view of its first argument (castlab's ATen table says so)."""
    if not isinstance(n, torch.fx.Node) or n.op != "call_function":
        return False
    if n.target is operator.getitem:
        return False
    entry = _aten.ATEN.get(str(n.target))
    return entry is not None and entry[0] == "view"


def fuses_right(n: Any, fused: str | None) -> bool:
    """Whether add/sub node n of two products takes its right one into its fma in a
    Triton kernel whose last fmas fuse `fused` ("where": the product with a select among
    its factors, as rotate_half's cat; "plain": the other; _inductor_tiles)."""
    if fused is None or str(n.target) not in ("aten.add.Tensor", "aten.sub.Tensor"):
        return False
    ms = [a for a in n.args[:2] if isinstance(a, torch.fx.Node)]
    if len(ms) != 2 or any(str(m.target) != "aten.mul.Tensor" for m in ms):
        return False

    def selects(m):  # a factor that is (a view of) a select, through negations
        for a in m.args[:2]:
            while isinstance(a, torch.fx.Node) and (
                    is_view(a) or str(a.target) == "aten.neg.default"):
                a = _arg_nodes(a)[0]
            if isinstance(a, torch.fx.Node) and str(a.target) in _SELECTS:
                return True
        return False
    left, right = selects(ms[0]), selects(ms[1])
    if left == right:
        return False
    return right if fused == "where" else left
