"""Tensors between PyTorch and castlab in a captured program: zero-copy conversions, the
fp64 policy's widening, eager's memory layouts, the tensors a function reaches through its
closure, and the comparison of outputs bit for bit."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from .._dlpack import from_dlpack, from_torch_tracked
from .._jit import _code_globals
from ..policy import Math, Policy, as_math, as_policy


def _to_castlab(t: torch.Tensor, made_by_torch: bool = True):
    """A region's input as a castlab tensor, zero-copy. A tensor PyTorch's allocator made
    (an external node's output, a parameter, a region's output handed back) is imported
    without a host synchronisation at its release (from_torch_tracked); a user's input,
    whose memory may come from another library, is imported as from_dlpack does."""
    t = t.detach()
    return from_torch_tracked(t) if made_by_torch else from_dlpack(t)


def _to_torch(x) -> torch.Tensor:
    return torch.utils.dlpack.from_dlpack(x)


def _widen(v: Any) -> Any:
    """An external node's argument under the fp64 policy: floating tensors and floating
    dtypes become float64 (an exact widening)."""
    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype is not torch.float64:
        return v.to(torch.float64)
    if isinstance(v, torch.dtype) and v.is_floating_point:
        return torch.float64
    return v


def _dense(meta: torch.Tensor) -> bool:
    """Whether the strides of `meta` lay its elements out without gaps or overlap."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(meta.shape, meta.stride()) if s > 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _no_grad_view(v: Any) -> Any:
    """`v`, detached where it requires grad (a parameter): DLPack exports no autograd."""
    return v.detach() if isinstance(v, torch.Tensor) and v.requires_grad else v


def _meta_dtype(n: Any) -> Any:
    """The dtype PyTorch gives FX node `n`'s value, or None where it is not a tensor."""
    meta = n.meta.get("val")
    return meta.dtype if isinstance(meta, torch.Tensor) else None


def _eager_layout(meta: Any) -> tuple | None:
    """(shape, strides) PyTorch eager gives a value whose example is `meta` (castlab
    writes contiguous results; the next PyTorch kernel must see eager's layout), or None
    where castlab's layout is kept (not a tensor, a scalar, an expanded view: the values
    are all PyTorch's kernels read)."""
    if not isinstance(meta, torch.Tensor) or meta.dim() == 0 or not _dense(meta):
        return None
    return tuple(meta.shape), tuple(meta.stride())


def _relayout(t: torch.Tensor, layout: tuple | None) -> torch.Tensor:
    if layout is None or t.stride() == layout[1] or t.shape != layout[0]:
        return t
    out = torch.empty_strided(layout[0], layout[1], dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


class Run:
    """The values of one execution of a captured program (every FX node's value, as the
    program's segments passed them on), the policy and math it ran under, and the
    castlab input tensors of each region (for per-node values and traces)."""

    def __init__(self, env: dict, policy: Policy, math: Math, region_inputs: dict):
        self.env = env
        self.policy = policy
        self.math = math
        self.region_inputs = region_inputs


def config(c: Any) -> tuple:
    """(label, Policy, Math) from "eager", "fused/inductor", ("fused", "inductor") or a
    Policy (math torch_eager)."""
    if isinstance(c, str):
        pol, _, mth = c.partition("/")
        pol, mth = as_policy(pol), as_math(mth or "torch_eager")
    elif isinstance(c, (tuple, list)) and len(c) == 2:
        pol, mth = as_policy(c[0]), as_math(c[1])
    elif isinstance(c, Policy):
        pol, mth = c, as_math("torch_eager")
    else:
        raise TypeError(f"a configuration is a policy name, 'policy/math' or a (policy, "
                        f"math) pair, not {type(c).__name__} {c!r}")
    return f"{pol.describe()}/{mth.name}", pol, mth


def _tensor_key(t: Any) -> tuple | None:
    """What identifies a tensor's memory (a lifted constant shares its parameter's)."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                t.stride(), t.dtype, t.device)
    except Exception:  # noqa: BLE001 - a tensor without storage (fake, sparse, ...)
        return None


def _closure_tensors(fn: Callable, depth: int = 0, seen: set | None = None,
                     out: dict | None = None) -> dict:
    """{tensor key: name} of the parameters, buffers and tensors a function reaches
    through its closure cells and the globals its code names (``lin.weight`` for a
    module ``lin``; ``w`` for a tensor ``w``), followed into the plain functions it
    reaches that way (3 levels) and into a bound method's ``self``."""
    out = {} if out is None else out
    seen = set() if seen is None else seen
    while isinstance(fn, functools.partial):
        fn = fn.func
    named: list = []
    if isinstance(fn, types.MethodType):
        named.append(("self", fn.__self__))
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType) or fn.__code__ in seen or depth > 3:
        return out
    seen.add(fn.__code__)
    code = fn.__code__
    for var, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            named.append((var, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    named.extend((var, fn.__globals__[var]) for var in _code_globals(code, {})
                 if var in fn.__globals__)
    for var, v in named:
        if isinstance(v, torch.nn.Module):
            for pname, t in list(v.named_parameters(prefix=var, remove_duplicate=False)) + \
                    list(v.named_buffers(prefix=var, remove_duplicate=False)):
                out.setdefault(_tensor_key(t), pname)
        elif isinstance(v, torch.Tensor):
            out.setdefault(_tensor_key(v), var)
        elif isinstance(v, (types.FunctionType, types.MethodType, functools.partial)):
            _closure_tensors(v, depth + 1, seen, out)
    out.pop(None, None)
    return out


def _gap(want: Any, got: Any) -> tuple:
    """(differing, total) floating output elements between two outputs of the model
    (NaN equals NaN; -0 differs from 0)."""
    differ = total = 0
    for a, b in zip(pytree.tree_leaves(want), pytree.tree_leaves(got)):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point():
            total += a.numel()
            if a.shape != b.shape or a.dtype != b.dtype:
                differ += a.numel()
                continue
            differ += differing_elements(a.detach(), b.detach())
    return differ, total


def differing_elements(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements of `a` and `b` (one shape; `b` is cast to `a`'s dtype) differ:
    -0 and +0 differ, NaNs of any payload are equal."""
    if a.dtype != b.dtype:
        b = b.to(a.dtype)
    if not a.is_floating_point():
        return int((a != b).sum())
    same = (a == b) & (torch.signbit(a) == torch.signbit(b)) | (a.isnan() & b.isnan())
    return int((~same).sum())
