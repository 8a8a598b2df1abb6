"""Eager composites: a function of several ops (softmax, the norms, the losses, gather)
built over traced tensors, recorded into the graph being traced or run now as a small
graph of its own under the eager policy, its plan cached."""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Sequence
from typing import Any

from . import _C, _onednn, ops
from ._creation import asarray
from ._dtype import dtype as _DType
from ._graph import Proxy, tracing
from ._graph import _state as _trace_state
from ._lower import input_node, lower
from .ops import Tensor
from .policy import Policy, current_math

_EAGER_POLICY = Policy.eager()
_kernel_ids = itertools.count(1)


# Eager composites (softmax, cross_entropy, ...): plans by the body's code and the values
# it closes over, the inputs' signature, the math and what of PyTorch is loaded. Tracing
# and lowering a composite anew took 2.5 ms of host time a call (a vocabulary
# cross_entropy on the GPU ran at 0.11-0.37x torch eager); a cached plan runs in tens of us.
_composite_cache: dict = {}
_UNCACHED = object()
_BODY_DEPTH = 4


def _closed_key(v: Any, depth: int):
    """A key for a value a composite's body closes over: numbers by type and exact value,
    strings, dtypes, tuples of these and the bodies of nested functions; _UNCACHED for
    anything else (a tensor, an object): that call traces anew. (Stricter than jit's
    guards, castlab._jit._guard_value, which leave strings and castlab's own functions
    unguarded: here a string is a parameter such as reduction="sum".)"""
    t = type(v)
    if v is None or t is str:
        return v
    if t is bool or t is int:
        return (t, v)
    if t is float:
        return v.hex()                      # -0.0 and NaN exactly
    if isinstance(v, _DType):
        return ("dtype", v.name)
    if t is tuple or t is list:
        items = tuple(_closed_key(x, depth) for x in v)
        return _UNCACHED if any(k is _UNCACHED for k in items) else (t, items)
    if t is dict:
        items = tuple((_closed_key(a, depth), _closed_key(b, depth)) for a, b in v.items())
        return _UNCACHED if any(_UNCACHED in kv for kv in items) else (t, items)
    if t is types.FunctionType and depth < _BODY_DEPTH:
        return _body_key(v, depth + 1)
    return _UNCACHED


def _body_key(fn: Any, depth: int = 0):
    """(code, closed-over values, defaults) of a composite's body, or _UNCACHED."""
    if type(fn) is not types.FunctionType:
        return _UNCACHED
    parts = [fn.__code__]
    for cell in fn.__closure__ or ():
        try:
            parts.append(_closed_key(cell.cell_contents, depth))
        except ValueError:                  # an empty cell
            parts.append(_UNCACHED)
    parts.append(_closed_key(fn.__defaults__ or (), depth))
    return _UNCACHED if any(p is _UNCACHED for p in parts) else tuple(parts)


def _call(body: Callable, args: Sequence[Any], kernel: str | None = None):
    """Build `body` over traced tensors: recorded into the graph being traced, or traced
    into a small graph of its own and run now (eager policy, current math; the plan cached
    by the body's code and closed-over values). With `kernel`, every node it records but
    the result is inside that PyTorch kernel."""
    st = _trace_state
    if tracing():
        start = len(st.graph)
        proxies = [a if isinstance(a, Proxy) else
                   (Proxy(ops._trace_input(a if isinstance(a, Tensor) else asarray(a)))
                    if a is not None else None) for a in args]
        out = body(*proxies)
        _mark_kernel(st.graph[start:], out, kernel)
        return out
    tensors = [a if isinstance(a, Tensor) else asarray(a) for a in args if a is not None]
    for a in args:
        if isinstance(a, Proxy):
            raise TypeError("a traced tensor escaped its castlab.jit function")
    math = current_math()
    key = _body_key(body)
    if key is not _UNCACHED:
        key = (key, kernel, tuple(a is None for a in args), _C.signature(tensors), math,
               _onednn.torch_env(), _C.torch_num_threads())
        hit = _composite_cache.get(key)
        if hit is not None:
            plan, captured = hit
            return plan.run(tensors + captured)[0]
    st.graph, st.captured, st.captured_nodes, st.n_inputs = [], [], [], len(tensors)
    try:
        proxies: list = []
        k = 0
        for a in args:
            if a is None:
                proxies.append(None)
            else:
                proxies.append(Proxy(input_node(tensors[k], k)))
                k += 1
        out = body(*proxies)
        _mark_kernel(st.graph, out, kernel)
        captured = list(st.captured)
    finally:
        st.graph, st.captured, st.captured_nodes, st.n_inputs = None, [], [], 0
    inputs = tensors + captured
    plan, res = lower([out.node], inputs, _EAGER_POLICY, math)
    plan.run(inputs, res)
    if key is not _UNCACHED:
        for p in proxies:   # the cached plan keeps no input tensor (its record, the nodes)
            if p is not None:
                p.node.tensor = None
        ops._cache_put(_composite_cache, key, (plan, captured))
    return res[0]


def _mark_kernel(nodes: list, out: Proxy, kernel: str | None) -> None:
    if kernel is None:
        return
    kid = next(_kernel_ids)
    for n in nodes:
        if n.attrs.get("kernel") is not None:
            continue  # a nested kernel (rms_norm's TE step) keeps its own
        n.attrs = {**n.attrs, "kernel": kernel, "kernel_id": kid}
        if n is not out.node:
            n.attrs["kernel_inner"] = True
