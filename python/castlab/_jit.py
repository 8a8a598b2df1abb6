"""Tracing: ``castlab.jit`` records a Python function of tensors as a graph, then runs
that graph under any policy and math variant.

>>> import castlab as cl
>>> @cl.jit
... def swiglu(x):
...     a, b = cl.chunk(x, 2, dim=-1)
...     return cl.silu(a) * b
>>> x = cl.randn(4, 8, seed=0, dtype=cl.bfloat16)
>>> y_fused = swiglu(x)                          # fp32 inside, one rounding
>>> y_eager = swiglu.run(x, policy="eager")      # rounds after every op
>>> print(swiglu.trace(x, policy="eager"))       # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools
import numbers
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from . import _C, _autodiff, _debug, _onednn
from ._creation import asarray, ones
from ._dtype import float32, float64
from ._graph import COMPARE, Proxy, _state
from ._listing import Trace, _arg_names, format_trace
from ._listing import _vop_args as _vop_args
from ._lower import input_node, lower
from ._lower_steps import ProgramStep, ReduceStep, RowStep
from ._rounding import RoundingPlan
from ._warm import warm
from .policy import Math, Policy, as_math, as_policy

__all__ = ["jit", "JitFunction", "Trace", "DEFAULT_CACHE_SIZE", "vjp", "grad"]

Tensor = _C.Tensor


DEFAULT_CACHE_SIZE = 256   # traced signatures kept per castlab.jit function (LRU)


class Traced:
    """One recorded graph (for one input signature and one set of guarded values).

    It keeps no argument tensors: input nodes carry only shape, dtype and device, and
    plans only shapes, strides and offsets. Tensors the function reached through a
    closure cell or a global are looked up again on every call (``captured_src`` holds
    where); only tensors it made itself while tracing (constants) are kept."""

    def __init__(self, name, nodes, inputs, captured, captured_nodes, outputs, structure):
        self.name = name
        self.nodes = nodes
        self.inputs = inputs                    # input nodes, by argument position
        self.captured = captured                # tensors the function closed over (this call)
        self.captured_nodes = captured_nodes
        self.outputs = outputs                  # output nodes
        self.structure = structure              # "single" | "tuple" | "list"
        self.captured_src: list = []            # per captured tensor: guard slot or constant
        self.plans: dict = {}
        self.default_plan = None  # the plan under the jit's own policy and math
        self.default_env = None   # ... lowered in this _onednn.torch_env()

    def bind_captured(self, objs: list) -> list:
        """The captured tensors for one call: guarded ones from the function's current
        closure/globals (`objs`, as ``_guards`` found them), constants as recorded."""
        return [objs[s] if type(s) is int else s[0] for s in self.captured_src]

    def bound(self, captured: list) -> Traced:
        """A view of this graph with `captured` bound (not stored in the cache)."""
        tr = copy.copy(self)
        tr.captured = captured
        return tr


def _signature(tensors: list) -> bytes:
    return _C.signature(tensors)


# ---------------------------------------------------------------- guards
# A trace bakes in the Python numbers the function read (as scalar nodes) and the
# shapes of the tensors it captured. The guard key records, for every closure cell and
# every global the function's code names (and, recursively, those of plain Python
# functions it reaches that way), the value of each number/bool and the signature of
# each castlab tensor: a different key retraces.

_GUARD_DEPTH = 3
_NO_VALUE = object()


def _code_globals(code: types.CodeType, memo: dict) -> tuple:
    names = memo.get(code)
    if names is None:
        ns = list(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                ns.extend(_code_globals(c, memo))
        names = memo[code] = tuple(dict.fromkeys(ns))
    return names


def _unwrap(fn: Any):
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            fn = fn.__func__
        else:
            return fn


_KIND: dict = {float: "f", int: "i", bool: "i", Tensor: "t", types.FunctionType: "fn",
               types.ModuleType: None, types.BuiltinFunctionType: None, type: None,
               str: None, type(None): None}


# values that never change what a trace computes
_UNGUARDED = frozenset({types.ModuleType, types.BuiltinFunctionType, type, str, type(None)})


def _kind(t: type):
    try:
        return _KIND[t]
    except KeyError:
        k = _KIND[t] = "n" if issubclass(t, numbers.Number) else None  # NumPy scalars, ...
        return k


_GUARD_ITEMS = 256    # containers up to this many items are guarded item by item


class _Same:
    """Guards an object by identity (and holds it, so its id cannot be reused while a
    trace keyed by it is cached)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


def _array_guard(v: Any):
    """A NumPy array or a torch tensor (or another array a trace reads zero-copy): the
    object, its layout and its data pointer. Its values are read at every call, so
    in-place changes need no guard; a rebound or resized array retraces."""
    try:
        if hasattr(v, "data_ptr"):                               # torch
            return ("a", _Same(v), tuple(v.shape), tuple(v.stride()), str(v.dtype),
                    v.data_ptr(), str(v.device))
        ai = v.__array_interface__                               # NumPy and friends
        return ("a", _Same(v), ai["shape"], ai.get("strides"), ai["typestr"], ai["data"][0])
    except Exception:                                            # noqa: BLE001
        return ("a", _Same(v))


_FOREIGN_MODULES = ("numpy", "torch", "castlab", "functools", "types", "typing",
                    "collections", "enum", "abc", "ml_dtypes", "cupy", "jax")
_HEAPTYPE = 1 << 9   # Py_TPFLAGS_HEAPTYPE: a class written in Python


def _guard_value(v: Any, objs: list, memo: dict, depth: int, seen: set):
    t = type(v)
    k = _kind(t)
    if k is None:
        if t is list or t is tuple or t is dict:
            if len(v) > _GUARD_ITEMS or depth >= _GUARD_DEPTH or id(v) in seen:
                # (identity and length only: documented in jit's docstring)
                return ("c", _Same(v), len(v))
            seen.add(id(v))
            if t is dict:
                items = tuple((key, g) for key, x in v.items()
                              if (g := _guard_value(x, objs, memo, depth + 1, seen)) is not None)
            else:
                items = tuple(_guard_value(x, objs, memo, depth + 1, seen) for x in v)
                if not any(g is not None for g in items):
                    items = ()
            seen.discard(id(v))
            # (nothing guardable inside, e.g. a log the function appends strings to: no guard)
            return (t, items) if items else None
        if hasattr(v, "__array_interface__") or hasattr(v, "__dlpack__"):
            return _array_guard(v)
        if not t.__flags__ & _HEAPTYPE or t.__module__.partition(".")[0] in _FOREIGN_MODULES:
            return None
        d = getattr(v, "__dict__", None)
        if type(d) is not dict or isinstance(v, type):
            return None
        # an instance of a user's class (a config object, ...): its attributes
        if depth >= _GUARD_DEPTH or id(v) in seen or len(d) > _GUARD_ITEMS:
            return ("o", _Same(v))
        seen.add(id(v))
        items = tuple((key, g) for key, x in d.items()
                      if (g := _guard_value(x, objs, memo, depth + 1, seen)) is not None)
        seen.discard(id(v))
        return ("o", t, items) if items else None
    if k == "f":
        return v.hex()                 # distinguishes -0.0 and NaN exactly
    if k == "i":
        return (t, v)
    if k == "t":
        objs.append(v)
        return (len(objs) - 1, _C.signature([v]))
    if k == "n":
        return (t, repr(v))
    if depth < _GUARD_DEPTH and not (v.__module__ or "").startswith("castlab"):
        return (v.__code__, _fn_guard(v, objs, memo, depth + 1, seen))
    return None


def _fn_guard(fn: Any, objs: list, memo: dict, depth: int, seen: set) -> tuple:
    if type(fn) is not types.FunctionType:
        fn = _unwrap(fn)
        if type(fn) is not types.FunctionType:
            return ()
    code = fn.__code__
    if code in seen:
        return ()
    seen.add(code)
    key = []
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            key.append(_NO_VALUE)
            continue
        key.append(_guard_value(v, objs, memo, depth, seen))
    g = fn.__globals__
    skip = _UNGUARDED
    for name in _code_globals(code, memo):
        v = g.get(name, None)
        # (modules, missing names, ...: nothing to guard, without a call)
        key.append(None if type(v) in skip else _guard_value(v, objs, memo, depth, seen))
    return tuple(key)


def _guards(fn: Any, memo: dict) -> tuple:
    """(guard key, the guarded objects in key order) of `fn` as it stands now."""
    objs: list = []
    return _fn_guard(fn, objs, memo, 0, set()), objs


class JitFunction:
    """A traced-and-fused function. Call it to run the graph under its policy and math;
    ``.run(..., policy=, math=)`` runs the same graph under others; ``.trace(...)``
    returns the readable listing."""

    def __init__(self, fn: Callable, policy: Any = "fused", math: Any = "torch_eager",
                 cache_size: int = DEFAULT_CACHE_SIZE):
        if not callable(fn):
            raise TypeError(f"castlab.jit: expected a function, got {type(fn).__name__}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int):
            raise TypeError("castlab.jit: cache_size must be an int >= 1, not "
                            f"{type(cache_size).__name__} {cache_size!r}")
        if cache_size < 1:
            raise ValueError(f"castlab.jit: cache_size must be >= 1, got {cache_size}")
        self.fn = fn
        self.policy = as_policy(policy)
        self.math = as_math(math)
        self.cache_size = cache_size
        # (input signature, guard key) -> Traced, least recently used first
        self._cache: OrderedDict = OrderedDict()
        self._code_memo: dict = {}
        self._lock = threading.Lock()
        self._backward: dict = {}  # (nargs, argnums) -> the backward JitFunction
        self._unguarded = getattr(fn, "_castlab_unguarded", False) is True
        functools.update_wrapper(self, fn)

    # -- tracing ---------------------------------------------------------------------
    def _bind(self, args) -> list:
        out = []
        for a in args:
            if isinstance(a, Tensor):
                out.append(a)
            elif isinstance(a, (bool, int, float)):
                raise TypeError("castlab.jit functions take tensors; pass Python numbers "
                                "through a closure or functools.partial")
            else:
                out.append(asarray(a))  # NumPy / DLPack producers, without copying
        return out

    def _lookup(self, key) -> Traced | None:
        tr = self._cache.get(key)
        if tr is not None:
            try:
                self._cache.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile: still valid here
                pass
        return tr

    def _traced(self, tensors: list) -> tuple[Traced, list]:
        """The graph for these inputs and the function's current guarded values, and
        the captured tensors to run it with."""
        # (castlab.torch's regions: functions castlab wrote, whose closures and globals
        # never change, say so with _castlab_unguarded)
        guard, objs = ((), []) if self._unguarded else _guards(self.fn, self._code_memo)
        key = (_signature(tensors), guard)
        tr = self._lookup(key)
        if tr is None:
            tr = self._record(tensors, objs)
            if not self._unguarded:
                # keyed by the values as tracing left them: a function that changes what
                # it guards while it runs (a counter it bumps) is then found again
                post, post_objs = _guards(self.fn, self._code_memo)
                if post != guard:
                    key = (key[0], post)
                    tr.captured_src = [
                        s if type(s) is not int else next(
                            (j for j, o in enumerate(post_objs) if o is objs[s]), (objs[s],))
                        for s in tr.captured_src]
                    objs = post_objs
            with self._lock:
                self._cache[key] = tr
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return tr, tr.bind_captured(objs)

    def cache_clear(self) -> None:
        """Forget every traced graph and plan."""
        with self._lock:
            self._cache.clear()

    def _record(self, tensors: list, objs: list) -> Traced:
        if _state.graph is not None:
            raise RuntimeError("nested castlab.jit tracing is not supported")
        nodes: list = []
        _state.graph = nodes
        _state.captured = []
        _state.captured_nodes = []
        _state.n_inputs = len(tensors)
        try:
            inputs = []
            for i, t in enumerate(tensors):
                n = input_node(t, i)
                n.index = -1
                inputs.append(n)
            result = self.fn(*[Proxy(n) for n in inputs])
            captured = list(_state.captured)
            captured_nodes = list(_state.captured_nodes)
        finally:
            _state.graph = None
            _state.captured = []
            _state.captured_nodes = []
        structure = "single"
        if isinstance(result, tuple):
            structure, outs = "tuple", list(result)
        elif isinstance(result, list):
            structure, outs = "list", list(result)
        else:
            outs = [result]
        out_nodes = []
        for o in outs:
            if isinstance(o, Proxy):
                out_nodes.append(o.node)
            elif isinstance(o, Tensor):
                idx = next((i for i, t in enumerate(tensors) if t is o), None)
                if idx is None:
                    n = input_node(o, len(tensors) + len(captured))
                    captured.append(o)
                    captured_nodes.append(n)
                    out_nodes.append(n)
                else:
                    out_nodes.append(inputs[idx])
            else:
                raise TypeError(f"a castlab.jit function must return tensors, got {type(o).__name__}")
        tr = Traced(getattr(self.fn, "__name__", "fn"), nodes, inputs, [], captured_nodes,
                    out_nodes, structure)
        # Captured tensors found among the guarded closure/global values are looked up
        # again on each call; the others were made by the function: keep them.
        for c in captured:
            slot = next((j for j, o in enumerate(objs) if o is c), None)
            tr.captured_src.append(slot if slot is not None else (c,))
        # The cache keeps no argument tensors (the lowering binds the call's tensors).
        for n in inputs + captured_nodes:
            n.tensor = None
        names_of = getattr(self.fn, "_castlab_arg_names", None)
        tr.arg_names = names_of(len(tensors)) if names_of else _arg_names(self.fn, len(tensors))
        return tr

    def _plan(self, tr: Traced, all_inputs: list, pol: Policy, mth: Math):
        """The plan of `tr` under `pol` and `mth`, lowered on first use: (plan, fresh
        outputs to run it into, or None when the plan was cached)."""
        env = _onednn.torch_env()
        key = (pol, mth, env)
        plan = tr.plans.get(key)
        if plan is not None:
            return plan, None
        pol.check_graph(tr.nodes)
        plan, outs = lower(tr.outputs, all_inputs, pol, mth)
        tr.plans[key] = plan
        if pol is self.policy and mth is self.math:
            tr.default_plan, tr.default_env = plan, env
        level = _debug.level()
        if level >= 1:
            print(format_trace(tr, plan.record), file=sys.stderr)
        if level >= 2:
            for k, st in enumerate(plan.steps):
                if isinstance(st, ProgramStep):
                    print(f"# program {k}\n{st.program}", file=sys.stderr)
                elif isinstance(st, ReduceStep):
                    print(f"# reduce {k}: (kind, order, p0..p3) = {st.spec}", file=sys.stderr)
                elif isinstance(st, RowStep):
                    print(f"# row step {k}: (rows, n, phases, epilogue, ...) = {st.spec}",
                          file=sys.stderr)
                else:
                    print(f"# {st.tag} step {k}: {st.spec}", file=sys.stderr)
        return plan, outs

    # -- running ---------------------------------------------------------------------
    def run(self, *args, policy: Any = None, math: Any = None):
        """Run the traced graph under `policy` and `math` (defaults: the jit's own)."""
        pol = self.policy if policy is None else as_policy(policy)
        mth = self.math if math is None else as_math(math)
        tensors = self._bind(args)
        tr, captured = self._traced(tensors)
        all_inputs = tensors + captured
        plan, outs = self._plan(tr, all_inputs, pol, mth)
        if outs is not None:
            plan.run(all_inputs, outs)
        else:
            outs = plan.run(all_inputs)
        if tr.structure == "single":
            return outs[0]
        return tuple(outs) if tr.structure == "tuple" else list(outs)

    def __call__(self, *args):
        # Fast path: a cached graph and plan for this signature under the jit's own
        # policy and math: one dict lookup and one C++ call.
        if all(type(a) is Tensor for a in args):
            tensors = list(args)
            guard, objs = _guards(self.fn, self._code_memo)
            tr = self._lookup((_C.signature(tensors), guard))
            if tr is not None and tr.default_plan is not None and tr.default_env == _onednn.torch_env():
                if tr.captured_src:
                    tensors += tr.bind_captured(objs)
                outs = tr.default_plan.run(tensors)
                if tr.structure == "single":
                    return outs[0]
                return tuple(outs) if tr.structure == "tuple" else list(outs)
        return self.run(*args)

    def trace(self, *args, policy: Any = None, math: Any = None) -> Trace:
        """The readable listing of the graph under `policy` and `math`: one line per op,
        every widening and rounding the policy inserts shown as ``convert``. It prints the
        lowering's own record (``_lower.Record``): the graph is lowered (not run) for the
        device of `args`, and that plan is kept for later runs."""
        pol = self.policy if policy is None else as_policy(policy)
        mth = self.math if math is None else as_math(math)
        tensors = self._bind(args)
        tr, captured = self._traced(tensors)
        plan, _ = self._plan(tr, tensors + captured, pol, mth)
        return Trace(format_trace(tr, plan.record))

    def _lowered(self, args: tuple, pol: Policy, mth: Math):
        """The plan of the graph for `args` under `pol` and `mth`: the one a run under
        them used (lowered now if none did). Its ``record`` and ``rounding`` say what the
        lowering decided, per node."""
        tensors = self._bind(args)
        tr, captured = self._traced(tensors)
        return self._plan(tr, tensors + captured, pol, mth)[0]

    def node_values(self, *args, policy: Any = None, math: Any = None) -> list:
        """The value of every op node of the trace under `policy`/`math`, exactly as the
        graph computes it (after the policy's rounding, before any output rounding):
        a list of (node, tensor) with each tensor in its register precision (fp32 or
        fp64), so nothing is rounded for the observation. Input nodes come first.

        Note: each node is computed by its own plan; with FMA contraction on, a product
        that feeds several ops may contract differently than in the whole graph."""
        pol = self.policy if policy is None else as_policy(policy)
        mth = self.math if math is None else as_math(math)
        value, tr, tensors = self.node_computer(args, pol, mth)
        out = [(n, t) for n, t in zip(tr.inputs, tensors)]
        for n in tr.nodes:
            if n.op in ("slice", "select", "permute", "expand", "reshape", "unsqueeze", "squeeze"):
                continue
            out.append((n, value(n)))
        return out

    def node_computer(self, args: tuple, pol: Policy, mth: Math) -> tuple:
        """``(value, graph, input tensors)`` for `args`: ``value(node)`` computes one op
        node of the graph under `pol`/`mth` with its own plan, in register precision (fp32,
        or fp64 where the policy keeps fp64), as :meth:`node_values` reports it; one node
        at a time, so a caller can measure and drop each before the next."""
        tensors = self._bind(args)
        tr, captured = self._traced(tensors)
        all_inputs = tensors + captured
        pol.check_graph(tr.nodes)
        # the register types (castlab._rounding's placement: the device does not matter)
        rounding = RoundingPlan(pol, mth, "cpu").place(tr.outputs)

        def f64(n) -> bool:
            return rounding.of(n).compute == "f64"

        def value(n):
            if n.op == "cat":
                dt = float64 if any(f64(p) for p in n.inputs if p.op != "scalar") else float32
            elif n.op in COMPARE or not n.dtype.is_floating_point:
                dt = n.dtype
            else:
                dt = float64 if f64(n) else float32
            plan, outs = lower([n], all_inputs, pol, mth, out_dtypes=[dt])
            plan.run(all_inputs, outs)
            return outs[0]

        return value, tr, tensors

    # -- gradients -------------------------------------------------------------------
    def backward_fn(self, nargs: int | None = None, argnums: Any = None) -> JitFunction:
        """The vector-Jacobian product as a castlab.jit function of its own:
        ``bwd(*primals, *cotangents)`` returns the tuple of gradients of the primals
        named by `argnums` (default: every argument). Its graph is the forward graph
        (phase "forward": the saved or recomputed activations) followed by the
        derivative rules (phase "backward"), so ``.trace()``, ``.run(policy=, math=)``
        and castlab.numerics' ``compare``/``explain``/``drift`` work on it as on any
        graph. `nargs`: the number of primals (default: the function's positional
        parameters).

        >>> f = cl.jit(lambda a, b: cl.silu(a) * b)
        >>> bwd = f.backward_fn()
        >>> a, b, dy = (cl.randn(8, seed=s, dtype=cl.bfloat16) for s in range(3))
        >>> da, db = bwd.run(a, b, dy, policy="eager")   # as torch.autograd eager
        """
        if nargs is None:
            nargs = _n_positional(self.fn)
        if isinstance(nargs, bool) or not isinstance(nargs, int) or nargs < 1:
            raise TypeError(f"backward_fn: nargs must be a positive int, not {nargs!r}")
        an = tuple(range(nargs)) if argnums is None else _autodiff.check_argnums(argnums, nargs)
        key = (nargs, an)
        bj = self._backward.get(key)
        if bj is None:
            bj = self._backward[key] = JitFunction(
                _make_backward(self.fn, nargs, an), self.policy, self.math, self.cache_size)
        return bj

    def vjp(self, *primals, argnums: Any = None, policy: Any = None, math: Any = None):
        """Run the function and return ``(outputs, pullback)``, as ``jax.vjp``:
        ``pullback(*cotangents)`` returns a tuple with the gradient of each primal named
        by `argnums` (default: all). Both run under `policy` and `math` (default: the
        jit's own); ``pullback(..., policy=, math=)`` overrides them for the backward.

        >>> f = cl.jit(lambda x: cl.exp(x) * x)
        >>> x = cl.tensor([0.5, 1.0])
        >>> y, pullback = f.vjp(x)
        >>> (dx,) = pullback(cl.ones(2))
        """
        outs = self.run(*primals, policy=policy, math=math)
        bwd = self.backward_fn(len(primals), argnums)

        def pullback(*cotangents, policy: Any = policy, math: Any = math):
            if not cotangents:
                raise TypeError("pullback: give one cotangent per output of the function")
            _check_cotangents(cotangents, "pullback")
            return bwd.run(*primals, *cotangents, policy=policy, math=math)

        return outs, pullback

    def backward(self, *primals, grad_outputs: Any, argnums: Any = None, policy: Any = None,
                 math: Any = None):
        """The gradients of the primals named by `argnums` for the output cotangents
        `grad_outputs` (a tensor, or a tuple with one per output), as
        ``torch.autograd.grad(outputs, inputs, grad_outputs)``. Returns a tuple (one
        gradient per argnum), or one tensor when `argnums` is an int.

        >>> f = cl.jit(lambda a, b: cl.silu(a) * b)
        >>> a, b = cl.randn(4, seed=0), cl.randn(4, seed=1)
        >>> da, db = f.backward(a, b, grad_outputs=cl.ones(4), policy="eager")
        """
        if grad_outputs is None or isinstance(grad_outputs, (dict, set, frozenset, str)):
            raise TypeError("backward: grad_outputs must be a tensor, or a tuple or list with "
                            "one tensor per output of the function, not "
                            f"{type(grad_outputs).__name__} (e.g. grad_outputs=cl.ones_like(y))")
        cots = tuple(grad_outputs) if isinstance(grad_outputs, (tuple, list)) else (grad_outputs,)
        _check_cotangents(cots, "backward: grad_outputs")
        grads = self.backward_fn(len(primals), argnums).run(*primals, *cots, policy=policy,
                                                            math=math)
        return grads[0] if isinstance(argnums, int) and not isinstance(argnums, bool) else grads

    def precompile(self, *args, policies: Any = None, maths: Any = None,
                   threads: int | None = None) -> dict:
        """Compile the kernels that runs on `args` under each of `policies` and `maths`
        (default: the jit's own) need, `threads` at a time (``cuda.compile_threads()``):
        each combination runs once (:func:`warm`). Later runs on inputs of the same
        layout find their kernels loaded. Returns how the kernel cache's counters moved.

        >>> f = cl.jit(lambda x: cl.silu(x) * 2)
        >>> moved = f.precompile(cl.ones(8), policies=["eager", "fused"])
        """
        one = (str, Policy, Math)
        pols = [self.policy] if policies is None else policies
        mths = [self.math] if maths is None else maths
        pols = [as_policy(p) for p in ([pols] if isinstance(pols, one) else pols)]
        mths = [as_math(m) for m in ([mths] if isinstance(mths, one) else mths)]
        before = _C._cuda_kernel_cache_stats()
        warm([(self, args, p, m) for p in pols for m in mths], threads, errors="raise")
        after = _C._cuda_kernel_cache_stats()
        return {k: after[k] - before[k] for k in after}

    def graph(self, *args) -> Traced:
        """The recorded graph for these inputs (nodes, inputs, outputs), with the
        captured tensors of this call bound as ``.captured``."""
        tr, captured = self._traced(self._bind(args))
        return tr.bound(captured)

    def __repr__(self) -> str:
        return f"<castlab.jit {getattr(self.fn, '__name__', 'fn')} policy={self.policy.describe()} math={self.math.name}>"


def _check_cotangents(cots: tuple, where: str) -> None:
    """Cotangents are tensors (castlab's, or arrays it reads: NumPy, torch, DLPack)."""
    for i, c in enumerate(cots):
        if c is None or isinstance(c, (bool, int, float, complex, dict, set, frozenset, str,
                                       bytes)):
            what = "None" if c is None else type(c).__name__
            raise TypeError(f"{where}: cotangent {i} is {what}; give a tensor shaped like "
                            f"output {i} of the function (e.g. cl.ones_like(y), or "
                            "cl.full_like(y, value) for a number)")


def _n_positional(fn: Callable) -> int:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = ()
    kinds = [p.kind for p in params]
    if not kinds or inspect.Parameter.VAR_POSITIONAL in kinds:
        raise TypeError("backward_fn: the number of arguments cannot be read from the "
                        "function's signature; pass nargs=")
    return sum(k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
               for k in kinds)


def _make_backward(fn: Callable, nargs: int, argnums: tuple) -> Callable:
    """The Python function castlab.jit traces for the VJP of fn: bwd(*primals,
    *cotangents) -> tuple of gradients."""
    primal_names = _arg_names(fn, nargs)

    def cot_names(k: int) -> list:
        base = "dy"
        while base in primal_names:
            base = "_" + base
        return [base] if k == 1 else [f"{base}{i}" for i in range(k)]

    def bwd(*args):
        if len(args) <= nargs:
            raise TypeError(f"the backward of {getattr(fn, '__name__', 'fn')} takes the "
                            f"{nargs} primal(s) and then one cotangent per output; got "
                            f"{len(args)} argument(s)")
        primals, cots = list(args[:nargs]), list(args[nargs:])
        return tuple(_autodiff.backward(fn, primals, cots, argnums, primal_names,
                                        cot_names(len(cots))))

    bwd.__name__ = bwd.__qualname__ = f"{getattr(fn, '__name__', 'fn')}_backward"
    bwd._castlab_arg_names = lambda n: primal_names + cot_names(n - nargs)
    return bwd


def jit(fn: Callable | None = None, *, policy: Any = "fused", math: Any = "torch_eager",
        cache_size: int = DEFAULT_CACHE_SIZE):
    """Trace `fn` on its first call for each input signature (shapes, dtypes, strides,
    device) and run the graph fused from then on.

    >>> swiglu = cl.jit(lambda a, b: cl.silu(a) * b, policy="fused", math="inductor")

    Guards: a trace bakes in the Python numbers the function reads and the shapes of
    the castlab tensors it captures. Every call checks them, as torch.compile's guards
    do: the values of the numbers and bools (and the signatures of the castlab tensors)
    held by `fn`'s closure cells and by the globals its code names, followed into the
    plain Python functions it reaches that way, into lists, tuples and dicts (item by
    item, up to 256 items and 3 levels deep) and into the attributes of instances of
    the user's own classes (``cfg.eps``). NumPy arrays and torch tensors it reads are
    guarded by identity, layout and data pointer: their values are read at every call
    (in-place changes are seen), a rebound or resized array is traced again. When a
    guarded value changed, `fn` is traced again (the old trace stays cached for when the
    value comes back); a captured castlab tensor rebound to another of the same signature
    is simply used, and in-place changes to it are always seen. Not guarded: a container
    of more than 256 items or deeper than 3 levels changed in place (its identity and
    length are), objects of library classes other than arrays, and numbers computed at
    trace time outside castlab (``torch_tensor.sum().item()``): pass such values as
    tensors, or make a new jit.

    >>> cfg = {"k": 2.0}
    >>> mul = cl.jit(lambda x: x * cfg["k"])
    >>> mul(cl.ones(2)).tolist()
    [2.0, 2.0]
    >>> cfg["k"] = 3.0
    >>> mul(cl.ones(2)).tolist()
    [3.0, 3.0]

    >>> k = 2.0
    >>> scale = cl.jit(lambda x: x * k)
    >>> scale(cl.ones(2)).tolist()
    [2.0, 2.0]
    >>> k = 3.0
    >>> scale(cl.ones(2)).tolist()
    [3.0, 3.0]

    Cache: the traces (and their plans, one per policy and math) are kept per input
    signature and guard values in a least-recently-used cache of `cache_size` entries
    (default ``DEFAULT_CACHE_SIZE`` = 256); the least recently used trace is dropped
    beyond it, like torch.compile's recompile limit but without falling back. The cache
    holds no argument tensors: only shapes, strides and offsets, plus the constant tensors
    the function made itself while tracing.
    """
    if fn is None:
        return lambda f: JitFunction(f, policy=policy, math=math, cache_size=cache_size)
    return JitFunction(fn, policy=policy, math=math, cache_size=cache_size)


# ---------------------------------------------------------------- trace listing

# ---------------------------------------------------------------- vjp and grad

def _as_jit(fn: Any, policy: Any, math: Any) -> JitFunction:
    if isinstance(fn, JitFunction):
        return fn
    if not callable(fn):
        raise TypeError(f"expected a function, got {type(fn).__name__}")
    return JitFunction(fn, policy="fused" if policy is None else policy,
                       math="torch_eager" if math is None else math)


def vjp(fn: Callable, *primals, argnums: Any = None, policy: Any = None, math: Any = None):
    """``(outputs, pullback)`` of `fn` at `primals`, as ``jax.vjp``: ``pullback(*cts)``
    returns the gradients (a tuple, one per primal named by `argnums`, default all) for
    output cotangents `cts`. `fn` is a castlab.jit function or a plain function (traced
    with ``castlab.jit``). The backward runs under `policy`: ``"eager"`` is PyTorch
    eager autograd (saved activations and every backward op rounded to the storage
    dtype; PyTorch's fused backward kernels such as silu_backward round once),
    ``"fused"`` is torch.compile's AOTAutograd + Inductor (activations recomputed in
    fp32 from the inputs, one rounding per gradient), ``"fp64"`` is the reference.

    >>> a, b = cl.randn(4, seed=0, dtype=cl.bfloat16), cl.randn(4, seed=1, dtype=cl.bfloat16)
    >>> y, pullback = cl.vjp(lambda a, b: cl.silu(a) * b, a, b, policy="eager")
    >>> da, db = pullback(cl.ones(4, dtype=cl.bfloat16))
    """
    return _as_jit(fn, policy, math).vjp(*primals, argnums=argnums, policy=policy, math=math)


def grad(fn: Callable, argnums: Any = 0, policy: Any = None, math: Any = None) -> Callable:
    """The gradient function of a scalar-output `fn` (one element), as ``jax.grad``:
    ``grad(fn)(*primals)`` returns the gradient for argument `argnums` (a tuple of
    gradients when `argnums` is a tuple). For outputs of more than one element use
    :func:`vjp` (PyTorch's ``backward()`` asks the same).

    >>> dfdx = cl.grad(lambda x: cl.sin(x) * x)
    >>> dfdx(cl.tensor(0.5)).shape
    ()
    """
    jf = _as_jit(fn, policy, math)

    def gradient(*primals):
        outs = jf.run(*primals, policy=policy, math=math)
        if isinstance(outs, (tuple, list)):
            raise ValueError("grad: the function must return one scalar tensor, not "
                             f"{len(outs)} outputs; use castlab.vjp")
        if outs.numel() != 1:
            raise ValueError(f"grad: the function's output has shape {list(outs.shape)}; grad "
                             "needs a scalar (one element) output. For other outputs use "
                             "castlab.vjp with a cotangent")
        ct = ones(tuple(outs.shape), dtype=outs.dtype, device=outs.device)
        return jf.backward(*primals, grad_outputs=ct, argnums=argnums, policy=policy, math=math)

    gradient.__name__ = f"grad_{getattr(fn, '__name__', 'fn')}"
    return gradient
