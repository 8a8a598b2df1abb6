"""A captured PyTorch program: castlab regions and external PyTorch nodes, in order.

``capture`` asks ``torch.export`` (non-strict) for the ATen graph of the forward, then
walks its nodes once, in the graph's order (PyTorch eager's execution order):

* an op castlab computes itself (``_aten.can_map``) joins the open *region*: a
  ``castlab.jit`` function that replays the region's nodes with castlab's op functions,
  so a policy decides where it rounds (eager: after every op; fused: only the values
  that leave the region; fp64: nowhere);
* a view of a value made outside the open region runs in PyTorch (a view is exact, and
  PyTorch's view keeps the strides eager would give the next kernel);
* everything else is an *external* node: the ATen op itself, called through PyTorch on
  the same device with zero-copy DLPack tensors. When an external node reads a value of
  the open region, the region is closed (it runs first); an external node that does not
  runs before it, so a region spans as much of the graph as the data flow allows.

Under the ``fp64`` policy external nodes run in float64: every floating tensor argument
is widened (exactly) and every floating ``dtype=`` argument becomes float64; castlab's
regions take the float64 values as they come (castlab computes in fp64 under that policy
and keeps explicit casts exact), so the whole model has an fp64 reference.

>>> import torch, castlab.torch as ct
>>> m = ct.capture(lambda x, w: torch.nn.functional.silu(x @ w) * 2,
...                torch.randn(4, 8), torch.randn(8, 8))
>>> [s.kind for s in m.segments]
['external', 'region']
"""

from __future__ import annotations

import collections
import contextlib
import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from .. import _autodiff
from .. import numerics as _nm
from .._dlpack import from_torch_region, to_torch_region
from .._jit import JitFunction
from ..policy import Math, Policy, as_math, as_policy
from . import _attention, _regions, _stacks
from ._partition import (
    _SKIP,
    CaptureError,
    Segment,
    _arg_nodes,
    _export_error,
    _fmt_arg,
    _getter,
    _op_name,
    _short_type,
    _subst,
    _subst_nominal,
    _wrap,
    module_path,
    partition,
    where_text,
)
from ._tensors import (
    Run,
    _closure_tensors,
    _eager_layout,
    _gap,
    _meta_dtype,
    _no_grad_view,
    _relayout,
    _tensor_key,
    _to_castlab,
    _to_torch,
    _widen,
    config,
)
from ._tensors import differing_elements as differing_elements

__all__ = ["CaptureError", "CapturedModel", "Segment", "capture"]


class CapturedModel:
    """A PyTorch forward captured by :func:`capture`: castlab regions and external PyTorch
    nodes. Call it (runs under its own policy and math) or ``.run(..., policy=, math=)``;
    inputs and outputs are PyTorch tensors (shared with castlab without copies).

    >>> import torch, castlab.torch as ct
    >>> f = ct.capture(lambda x: torch.exp(x) * 2, torch.ones(3, dtype=torch.bfloat16))
    >>> f.run(torch.zeros(3, dtype=torch.bfloat16), policy="eager").tolist()
    [2.0, 2.0, 2.0]
    """

    def __init__(self, ep: Any, name: str, example: tuple, policy: Any = "fused",
                 math: Any = "torch_eager", closure_tensors: dict | None = None):
        self.exported = ep
        self._closure_tensors = closure_tensors or {}
        self.name = name
        self.policy = as_policy(policy)
        self.math = as_math(math)
        self.graph = ep.graph_module.graph
        self.nodes = list(self.graph.nodes)
        sig = ep.graph_signature
        self._consts: dict = {}
        self._const_target: dict = {}  # placeholder name -> parameter/buffer name
        self._user: list = []  # placeholder names of the user inputs, in flat order
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        for n, spec in zip(placeholders, sig.input_specs):
            kind = spec.kind.name
            if kind == "USER_INPUT":
                self._user.append(n.name)
            elif kind in ("PARAMETER", "BUFFER"):
                self._const_target[n.name] = spec.target
                v = ep.state_dict.get(spec.target)
                if v is None:
                    v = ep.constants[spec.target]
                self._consts[n.name] = v.detach()
            elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
                self._consts[n.name] = ep.constants[spec.target]
                # a function's module used through its closure or globals: torch.export
                # lifts its parameters as constants (sharing their storage); name them as
                # the function does (``lin.weight``) so that wrt="parameters" finds them
                owner = self._closure_tensors.get(_tensor_key(self._consts[n.name]))
                if owner is not None:
                    self._const_target[n.name] = owner
            else:  # pragma: no cover - token inputs of effectful ops
                raise CaptureError(f"castlab.torch.capture: unsupported graph input {spec}")
        for spec in sig.output_specs:
            if spec.kind.name != "USER_OUTPUT":
                raise CaptureError(
                    f"castlab.torch.capture: the forward mutates {spec.target!r} in place "
                    f"({spec.kind.name}); castlab captures forwards without side effects "
                    f"(in-place ops on the forward's own intermediates are fine)")
        self._in_spec = ep.call_spec.in_spec
        self._out_spec = ep.call_spec.out_spec
        self._example = example
        flat, _ = pytree.tree_flatten(example)
        self._example_flat = flat
        self._output_node = self.nodes[-1]
        self.segments = partition(self.nodes)
        self._by_name = {n.name: n for n in self.nodes}
        self._wide: dict = {}  # fp64 copies of parameters and buffers (fp64 policy)
        self.eager_gap: tuple | None = None  # set by capture(check=True)
        # how capture changed the traced SDPA calls (None: as traced; see _attention)
        self.attention: str | None = None
        self._binders: dict = {}  # node name -> (args, kwargs) getters (see _getter)
        self._binders64: dict = {}  # the same for the fp64 policy (see _wide_getters)
        self._regions: _regions.Regions | None = None  # see regions()
        self._kernel_plans: dict = {}  # kernels -> (their segments, the presets they hold)

    # -- inputs --------------------------------------------------------------------
    def _flat_inputs(self, args: tuple, kwargs: dict | None) -> list:
        for k, (v, ex) in enumerate(zip(args, self._example[0])):
            if isinstance(ex, torch.Tensor) and not isinstance(v, torch.Tensor):
                raise TypeError(f"{self.name}: input {k} must be a torch.Tensor, got "
                                f"{type(v).__name__}")
        flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
        if self._in_spec is not None and spec != self._in_spec:
            raise ValueError(f"{self.name}: the inputs' structure {spec} differs from the "
                             f"captured one {self._in_spec}; capture again for these inputs")
        for k, (v, ex) in enumerate(zip(flat, self._example_flat)):
            if isinstance(ex, torch.Tensor):
                if not isinstance(v, torch.Tensor):
                    raise TypeError(f"{self.name}: input {k} must be a torch.Tensor, got "
                                    f"{type(v).__name__}")
                if tuple(v.shape) != tuple(ex.shape) or v.dtype != ex.dtype or v.device != ex.device:
                    raise ValueError(
                        f"{self.name}: input {k} is {v.dtype} {list(v.shape)} on {v.device}, "
                        f"but the model was captured for {ex.dtype} {list(ex.shape)} on "
                        f"{ex.device}; castlab captures static shapes: capture again for "
                        "these inputs")
            elif v != ex:
                raise ValueError(f"{self.name}: argument {k} is {v!r}, captured as {ex!r} "
                                 "(Python values are baked into the capture)")
        return flat

    # -- execution -----------------------------------------------------------------
    def run_in_torch(self, *inputs: Any, kwargs: dict | None = None) -> Any:
        """PyTorch itself running the captured graph, node by node with its own kernels:
        what ``policy="eager", math="torch_eager"`` reproduces bit for bit. It equals
        calling the model unless the model's code takes other branches when traced (see
        :attr:`eager_gap`).

        >>> import torch, castlab.torch as ct
        >>> f = ct.capture(lambda x: torch.exp(x) * 2, torch.ones(3))
        >>> f.run_in_torch(torch.zeros(3)).tolist()
        [2.0, 2.0, 2.0]
        """
        return self._run_graph(self._flat_inputs(inputs, kwargs))

    def _run_graph(self, flat: list, record: dict | None = None) -> Any:
        """PyTorch running the captured graph on flat inputs; the values of the nodes
        named in `record` (a dict, name -> None) are stored into it."""
        it = iter(flat)
        places = [self._consts[n.name] if n.name in self._consts else next(it)
                  for n in self.nodes if n.op == "placeholder"]

        class Recorder(torch.fx.Interpreter):
            def run_node(self, n):
                v = super().run_node(n)
                if record is not None and n.name in record:
                    record[n.name] = v
                return v
        with torch.no_grad():
            out = Recorder(self.exported.graph_module).run(*places)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        return pytree.tree_unflatten(out, self._out_spec) if self._out_spec is not None else out

    def execute(self, flat: list, policy: Policy, math: Math, segments: list | None = None,
                given: dict | None = None, start: int = 0, env: dict | None = None,
                region_policy: dict | None = None) -> Run:
        """Run the program on flat inputs; returns the :class:`Run` (every value).
        `segments`: another partition of the graph (one with `given`, a dict of node
        values supplied from outside, cut out); `start`, `env`: begin at that segment
        with the values of an earlier run of the same segments up to there;
        `region_policy`: segment index -> the policy that region runs under instead."""
        if env is not None:
            env = dict(env)
        else:
            env = dict(self._consts)
            for name, v in zip(self._user, flat):
                env[name] = v.detach() if isinstance(v, torch.Tensor) else v
        if given:
            env.update(given)
        f64 = policy.name == "fp64"
        region_inputs: dict = {}
        streams: dict = {}  # PyTorch's current stream per device, read once a run
        segs = self.segments if segments is None else segments
        for k in range(start, len(segs)):
            seg = segs[k]
            if seg.kind in ("region", "kernel"):
                io = seg.io
                if io is None:  # the names and layouts each run needs, found once
                    io = seg.io = (
                        [n.name for n in seg.inputs],
                        [n.name not in self._user for n in seg.inputs],
                        [(n.name, _meta_dtype(n), _eager_layout(n.meta.get("val")))
                         for n in seg.outputs])
                xs = from_torch_region([_no_grad_view(env[name]) for name in io[0]], io[1],
                                       streams)
                region_inputs[k] = xs
                if seg.kind == "kernel":  # a library's kernel: its preset's policy and math
                    outs = seg.jit(*xs)
                else:
                    rp = policy if region_policy is None else region_policy.get(k, policy)
                    outs = seg.jit.run(*xs, policy=rp, math=math)
                for (name, dt, layout), t in zip(io[2], to_torch_region(outs, streams)):
                    if not f64 and dt is not None and t.dtype != dt:
                        t = t.to(dt)  # a substituted input widened the region
                    env[name] = _relayout(t, layout)
                continue
            (n,) = seg.nodes
            if f64 and seg.kind == "external":  # floating arguments widened to float64
                bind = self._binders64.get(n.name)
                if bind is None:
                    bind = self._binders64[n.name] = self._wide_getters(n)
                args, kwargs = bind[0](env), bind[1](env)
            elif given and not f64:  # a substituted value held wider than PyTorch holds it
                args, kwargs = _subst_nominal((list(n.args), dict(n.kwargs)), env)
            else:
                bind = self._binders.get(n.name)
                if bind is None:
                    bind = self._binders[n.name] = (_getter(list(n.args)),
                                                    _getter(dict(n.kwargs)))
                args, kwargs = bind[0](env), bind[1](env)
            if n.target is operator.getitem:
                env[n.name] = args[0][args[1]]
                continue
            env[n.name] = n.target(*args, **kwargs)
        return Run(env, policy, math, region_inputs)

    def _wide_getters(self, n) -> tuple:
        """Getters of external node `n`'s args and kwargs under the fp64 policy: floating
        tensors and dtypes widened to float64, the parameters and buffers it reads taken
        from fp64 copies made once (again only when the weight changed in place), as the
        fp64 policy reads every weight on every call."""
        def leaf(name: str) -> Callable:
            if name in self._consts:
                return lambda env: self._wide_const(name)
            return lambda env: _widen(env[name])

        def const(a: Any) -> Any:
            return pytree.tree_map(_widen, a)
        return _getter(list(n.args), leaf, const), _getter(dict(n.kwargs), leaf, const)

    def _wide_consts(self, n, env: dict) -> Any:
        """`env` with the parameters and buffers node `n` reads in float64."""
        names = [a.name for a in _arg_nodes(n) if a.name in self._consts]
        if not names:
            return env
        return collections.ChainMap({k: self._wide_const(k) for k in names}, env)

    def _wide_const(self, name: str) -> Any:
        v = self._consts[name]
        key = (getattr(v, "_version", 0), v.data_ptr() if isinstance(v, torch.Tensor) else 0)
        w = self._wide.get(name)
        if w is None or w[0] != key:
            w = self._wide[name] = (key, _widen(v))
        return w[1]

    def outputs(self, run: Run) -> Any:
        """The program's outputs from a :class:`Run`, in the forward's structure."""
        flat = [run.env[a.name] if isinstance(a, torch.fx.Node) else a
                for a in pytree.tree_leaves(self._output_node.args[0])]
        out = pytree.tree_unflatten(flat, self._out_spec) if self._out_spec is not None else flat
        return out

    def run(self, *inputs: Any, policy: Any = None, math: Any = None, kwargs: dict | None = None,
            kernels: dict | None = None, stack: Any = None) -> Any:
        """Run the captured forward on `inputs` (torch tensors of the captured shapes)
        under `policy` and `math` (default: the capture's own); returns PyTorch tensors
        in the forward's output structure. Under ``"fp64"`` floating outputs are float64.
        `kernels`: ``{kind: preset}`` (see :meth:`regions`) puts a kernel-library preset
        (``cl.library("liger")["swiglu"]``, or a library name) in place of every instance
        of that kind, run under the preset's own policy and math on the storage-dtype
        tensors that reach it; not under ``"fp64"`` (the reference: kernels are ignored).
        `stack`: a :class:`~castlab.torch.Stack` or built-in name, all choices in one call.

        >>> import torch, castlab.torch as ct
        >>> f = ct.capture(lambda x: torch.sigmoid(x) * x, torch.ones(2, dtype=torch.bfloat16))
        >>> f.run(torch.ones(2, dtype=torch.bfloat16), policy="fp64").dtype
        torch.float64
        """
        if stack is not None:  # (its policy, math and kernels are the stack's)
            return _stacks.run_with(self, stack, inputs, kwargs, policy, math, kernels)
        pol = self.policy if policy is None else as_policy(policy)
        mth = self.math if math is None else as_math(math)
        flat = self._flat_inputs(inputs, kwargs)
        segs = _regions.run_segments(self, kernels, pol)
        with torch.no_grad():
            return self.outputs(self.execute(flat, pol, mth, segments=segs))

    def regions(self) -> _regions.Regions:
        """The model's SwiGLU/GeGLU, RoPE, RMSNorm, attention and matmul instances,
        recognised by the graph's dataflow (:mod:`castlab.torch._regions`), in graph order.

        >>> import torch, castlab.torch as ct
        >>> x = torch.ones(2, 4, dtype=torch.bfloat16)
        >>> [r.kind for r in ct.capture(lambda a, b: torch.nn.functional.silu(a) * b @ b.T,
        ...                             x, x).regions()]
        ['swiglu', 'matmul']
        """
        if self._regions is None:
            self._regions = _regions.find(self.nodes)
        return self._regions

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.run(*inputs, kwargs=kwargs or None)

    # -- gradients -----------------------------------------------------------------
    def vjp(self, *inputs: Any, policy: Any = None, math: Any = None,
            kwargs: dict | None = None, kernels: dict | None = None) -> tuple:
        """Run the captured forward and return ``(outputs, pullback)``, as ``jax.vjp``.
        ``pullback(*cotangents, wrt="inputs")`` takes one cotangent per output (PyTorch
        tensors in the outputs' structure; None for an output that does not matter) and
        returns the gradient of each user input in flat order (None for one that is not
        a floating tensor); ``wrt="parameters"`` returns ``{parameter or buffer name:
        gradient}``, ``wrt="all"`` both. Each castlab region's backward is castlab's
        (``castlab.jit.vjp``: its rules, under `policy` and `math`: eager rounds after
        every backward op as PyTorch eager's autograd does); each external node's is
        PyTorch's autograd of that ATen op, in the dtype it ran in (float64 under
        ``"fp64"``). A value used by several nodes sums their gradients in its dtype, as
        autograd accumulates.

        >>> import torch, castlab.torch as ct
        >>> x, w = torch.randn(4, 8), torch.randn(8, 8)
        >>> m = ct.capture(lambda x, w: torch.nn.functional.silu(x @ w), x, w)
        >>> y, pullback = m.vjp(x, w, policy="eager")
        >>> dx, dw = pullback(torch.ones_like(y))
        >>> dw.shape
        torch.Size([8, 8])
        """
        if kernels and any(v is not None for v in kernels.values()):
            raise NotImplementedError(
                f"{self.name}: vjp/backward with kernels= is not supported: a library's "
                "backward is a kernel of its own (the presets' *_backward ops), which "
                "the pullback does not put in place yet; run(..., kernels=) is forward only")
        pol = self.policy if policy is None else as_policy(policy)
        mth = self.math if math is None else as_math(math)
        flat = self._flat_inputs(inputs, kwargs)
        with torch.no_grad():
            run = self.execute(flat, pol, mth)
        outs = self.outputs(run)

        def pullback(*cotangents: Any, wrt: str = "inputs") -> Any:
            if wrt not in ("inputs", "parameters", "all"):
                raise ValueError(f"pullback: wrt must be 'inputs', 'parameters' or 'all', "
                                 f"not {wrt!r}")
            grads = self._backward(run, cotangents)
            gi = tuple(grads.get(name) if isinstance(v, torch.Tensor) and v.is_floating_point()
                       else None for name, v in zip(self._user, flat))
            gp = {self._const_target[name]: grads[name] for name in self._consts
                  if name in grads and name in self._const_target}
            return gi if wrt == "inputs" else gp if wrt == "parameters" else (gi, gp)

        return outs, pullback

    def backward(self, *inputs: Any, grad_outputs: Any, policy: Any = None, math: Any = None,
                 wrt: str = "inputs", kwargs: dict | None = None,
                 kernels: dict | None = None) -> Any:
        """The gradients for the output cotangents `grad_outputs` (see :meth:`vjp`), as
        ``torch.autograd.grad(outputs, inputs, grad_outputs)``.

        >>> import torch, castlab.torch as ct
        >>> x = torch.linspace(-2, 2, 8)
        >>> m = ct.capture(lambda x: torch.tanh(x) * x, x)
        >>> (dx,) = m.backward(x, grad_outputs=torch.ones(8), policy="eager")
        >>> torch.allclose(dx, torch.func.grad(lambda v: (torch.tanh(v) * v).sum())(x))
        True
        """
        _, pullback = self.vjp(*inputs, policy=policy, math=math, kwargs=kwargs,
                               kernels=kernels)
        cots = grad_outputs if isinstance(grad_outputs, tuple) else (grad_outputs,)
        return pullback(*cots, wrt=wrt)

    def _backward(self, run: Run, cotangents: tuple) -> dict:
        """FX node name -> gradient, from the outputs' cotangents back through the
        segments in reverse."""
        leaves = pytree.tree_leaves(self._output_node.args[0])
        cts = pytree.tree_leaves(cotangents, is_leaf=lambda c: c is None)
        if len(cts) != len(leaves):
            raise TypeError(f"{self.name}: pullback takes one cotangent per output "
                            f"({len(leaves)} in flat order), got {len(cts)}")
        grad: dict = {}

        def add(name: str, g: Any) -> None:
            if g is None:
                return
            grad[name] = g if name not in grad else grad[name] + g

        for a, c in zip(leaves, cts):
            if isinstance(a, torch.fx.Node) and c is not None:
                v = run.env[a.name]
                if not isinstance(c, torch.Tensor) or c.shape != v.shape:
                    raise ValueError(f"{self.name}: the cotangent of output {a.name} must be "
                                     f"a tensor of shape {list(v.shape)}")
                add(a.name, c.to(dtype=v.dtype, device=v.device))
        f64 = run.policy.name == "fp64"
        for k in range(len(self.segments) - 1, -1, -1):
            seg = self.segments[k]
            if seg.kind == "region":
                self._region_backward(k, seg, run, grad, add)
                continue
            (n,) = seg.nodes
            g = grad.pop(n.name, None)
            if g is None:
                continue
            if n.target is operator.getitem:
                src, i = n.args[0], n.args[1]
                if isinstance(src, torch.fx.Node):
                    parts = grad.setdefault(src.name, [None] * len(run.env[src.name]))
                    parts[i] = g if parts[i] is None else parts[i] + g
                continue
            self._external_backward(n, run, g, add, f64)
        return grad

    def _region_backward(self, k: int, seg: Segment, run: Run, grad: dict, add) -> None:
        gs = [grad.pop(o.name, None) for o in seg.outputs]
        if all(g is None for g in gs):
            return
        xs = run.region_inputs[k]
        idx = tuple(i for i, x in enumerate(xs) if x.dtype.is_floating_point)
        if not idx:
            return
        fn, keep = self._float_region(seg)
        f64 = run.policy.name == "fp64"
        cts = []
        for g, o, kp in zip(gs, seg.outputs, keep):
            if not kp:
                continue
            v = run.env[o.name]  # the output's value: its shape, and its dtype but under fp64
            dt = torch.float64 if f64 else v.dtype  # (there the cotangent stays float64)
            c = torch.zeros(v.shape, dtype=dt, device=v.device) if g is None else g.to(dt)
            cts.append(_to_castlab(c.contiguous()))
        bwd = fn.backward_fn(len(xs), idx)
        with _autodiff.wide_cotangents() if f64 else contextlib.nullcontext():
            got = bwd.run(*xs, *cts, policy=run.policy, math=run.math)
        for i, gx in zip(idx, got):
            add(seg.inputs[i].name, _to_torch(gx))

    def _float_region(self, seg: Segment) -> tuple:
        """(jit, keep): the region's function returning only its floating outputs (the
        ones that have gradients), and which of its outputs those are."""
        keep = [isinstance(o.meta.get("val"), torch.Tensor) and o.meta["val"].is_floating_point()
                for o in seg.outputs]
        if all(keep):
            return seg.jit, keep
        if getattr(seg, "float_jit", None) is None:
            inner = seg.jit.fn

            def floats(*xs):
                outs = inner(*xs)
                outs = outs if isinstance(outs, (tuple, list)) else (outs,)
                return tuple(o for o, kp in zip(outs, keep) if kp)
            seg.float_jit = JitFunction(floats)
        return seg.float_jit, keep

    def _external_backward(self, n, run: Run, g: Any, add, f64: bool) -> None:
        src = self._wide_consts(n, run.env) if f64 else run.env
        req: dict = {}
        for a in _arg_nodes(n):
            v = src[a.name]
            if a.name in req or not isinstance(v, torch.Tensor) or not v.is_floating_point():
                continue
            req[a.name] = (_widen(v) if f64 else v).detach().requires_grad_(True)
        if not req:
            return
        env = collections.ChainMap(req, src)
        args, kwargs = _subst((list(n.args), dict(n.kwargs)), env)
        if f64:
            args, kwargs = pytree.tree_map(
                lambda v: _widen(v) if not (isinstance(v, torch.Tensor) and v.requires_grad)
                else v, (args, kwargs))
        with torch.enable_grad():
            out = n.target(*args, **kwargs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        gs = list(g) if isinstance(g, list) else [g]
        pairs = [(o, c) for o, c in zip(outs, gs) if c is not None and isinstance(o, torch.Tensor)
                 and o.requires_grad]
        if not pairs:
            return
        names = list(req)
        got = torch.autograd.grad([o for o, _ in pairs], [req[m] for m in names],
                                  [c.to(o.dtype) for o, c in pairs], allow_unused=True)
        for m, gx in zip(names, got):
            add(m, gx)  # in its leaf's dtype: the value's, or float64 under fp64

    # -- inspection ----------------------------------------------------------------
    def externals(self) -> list:
        """The external nodes: (FX name, ATen op, module path, ``file:line``).

        >>> import torch, castlab.torch as ct
        >>> f = ct.capture(lambda x, w: x @ w, torch.ones(2, 2), torch.ones(2, 2))
        >>> [e[1] for e in f.externals()]
        ['aten.matmul.default']
        """
        return [(s.nodes[0].name, str(s.nodes[0].target), module_path(s.nodes[0]),
                 where_text(s.nodes[0])) for s in self.segments if s.kind == "external"]

    def trace(self, *inputs: Any, policy: Any = None, math: Any = None,
              kwargs: dict | None = None) -> str:
        """The program's listing under `policy`/`math`: each castlab region as castlab's
        own trace (every rounding the policy makes shown as ``convert``), each external
        node with its PyTorch op, the dtype it runs in and the user's source line. It runs
        the program once (the regions' inputs come from the external nodes).

        >>> import torch, castlab.torch as ct
        >>> f = ct.capture(lambda x, w: torch.nn.functional.silu(x @ w), torch.ones(2, 2),
        ...                torch.ones(2, 2))
        >>> print(f.trace(torch.ones(2, 2), torch.ones(2, 2), policy="eager"))  # doctest: +ELLIPSIS
        # castlab.torch program ...: policy=eager  math=torch_eager
        ...
        """
        pol = self.policy if policy is None else as_policy(policy)
        mth = self.math if math is None else as_math(math)
        flat = self._flat_inputs(inputs, kwargs)
        with torch.no_grad():
            run = self.execute(flat, pol, mth)
        f64 = pol.name == "fp64"
        lines = [f"# castlab.torch program {self.name}: policy={pol.describe()}  math={mth.name}",
                 f"# {sum(s.kind == 'region' for s in self.segments)} castlab regions, "
                 f"{sum(s.kind == 'external' for s in self.segments)} external PyTorch nodes"]
        if self.attention:
            lines.append(f"# {self.attention}")
        r = 0
        for k, seg in enumerate(self.segments):
            n = seg.nodes[0]
            if seg.kind == "region":
                r += 1
                lines.append(f"# castlab region {r - 1} (step {k}): {len(seg.nodes)} ATen "
                             "nodes, returns "
                             + ", ".join(o.name for o in seg.outputs))
                tr = seg.jit.trace(*run.region_inputs[k], policy=pol, math=mth)
                lines.extend("  " + s for s in str(tr).splitlines())
                continue
            args = ", ".join([_fmt_arg(a) for a in n.args]
                             + [f"{k}={_fmt_arg(a)}" for k, a in n.kwargs.items()])
            val = run.env[n.name]
            if seg.kind == "view":
                lines.append(f"  {n.name} = torch {_op_name(n)}({args})".ljust(48)
                             + f"  # {_short_type(val)}  view in PyTorch, exact")
                continue
            note = "PyTorch" + (" (floating inputs widened to f64)" if f64 else "")
            w = where_text(n)
            mod = module_path(n)
            lines.append(f"  {n.name} = external {n.target}({args})".ljust(48)
                         + f"  # {_short_type(val)}  {note}"
                         + (f"  # {mod}" if mod else "") + (f"  # {w}" if w else ""))
        outs = [a.name for a in pytree.tree_leaves(self._output_node.args[0])
                if isinstance(a, torch.fx.Node)]
        lines.append("  return " + ", ".join(outs))
        return "\n".join(lines)

    def region(self, node: str, *inputs: Any, policy: Any = "eager", math: Any = None,
               kwargs: dict | None = None) -> tuple:
        """``(jit, args)``: the castlab region that computes FX node `node` (a name from
        ``trace()`` or ``drift``) as a ``castlab.jit`` function, and its castlab input
        tensors as a run under `policy`/`math` gives them, so castlab.numerics' explain,
        attribute and drift look inside it.

        >>> import torch, castlab.torch as ct, castlab.numerics as nm
        >>> x = torch.linspace(-3, 3, 64).to(torch.bfloat16).reshape(8, 8)
        >>> f = ct.capture(lambda a: torch.nn.functional.silu(a) * a, x)
        >>> jit, args = f.region("silu", x)
        >>> e = nm.explain(jit, args, (0, 3))
        >>> [o.label for o in e.outcomes]
        ['eager/torch_eager', 'fused/torch_eager']
        """
        pol = as_policy(policy)
        mth = self.math if math is None else as_math(math)
        flat = self._flat_inputs(inputs, kwargs)
        for k, seg in enumerate(self.segments):
            if seg.kind == "region" and any(n.name == node for n in seg.nodes):
                with torch.no_grad():
                    run = self.execute(flat, pol, mth)
                return seg.jit, tuple(run.region_inputs[k])
        where = next((s.kind for s in self.segments if any(n.name == node for n in s.nodes)),
                     None)
        raise ValueError(f"{self.name}: node {node!r} is "
                         + (f"an {where} node, not in a castlab region" if where else
                            "not an op node of the captured graph"))

    def explain(self, node: str, index: Any, *inputs: Any, policies: Any = ("eager", "fused"),
                maths: Any = None, kwargs: dict | None = None) -> Any:
        """castlab.numerics.explain of element `index` of FX node `node` (a value a castlab
        region hands on: a name from ``trace()`` or ``drift``): its exact value, the
        rounding of each policy/math and every region node's value there. The region's
        inputs are the ones an eager run gives it, the same for every configuration, so
        the differences are the region's own.

        >>> import torch, castlab.torch as ct
        >>> x = torch.linspace(-3, 3, 64).to(torch.bfloat16).reshape(8, 8)
        >>> f = ct.capture(lambda a: torch.nn.functional.silu(a) * a, x)
        >>> e = f.explain("mul", (0, 3), x)
        >>> [o.label for o in e.outcomes]
        ['eager/torch_eager', 'fused/torch_eager']
        """
        seg = next((sg for sg in self.segments if sg.kind == "region"
                    and any(n.name == node for n in sg.nodes)), None)
        jit, args = self.region(node, *inputs, policy="eager", kwargs=kwargs)
        outs = [o.name for o in seg.outputs]
        if node not in outs:
            raise ValueError(f"{self.name}: node {node!r} is inside a castlab region but not "
                             f"one of the values it hands on ({', '.join(outs)}); explain one "
                             "of those")
        mth = (self.math.name,) if maths is None else maths
        return _nm.explain(jit, args, index, policies=policies, maths=mth,
                           output=outs.index(node))

    def compare(self, *inputs: Any, configs: Any = ("eager", "fused/inductor"),
                kwargs: dict | None = None, output: int = 0) -> Any:
        """castlab.numerics.compare of floating output number `output` (in flat order)
        under each configuration ("policy" or "policy/math") against the fp64 run.

        >>> import torch, castlab.torch as ct
        >>> x = torch.linspace(-3, 3, 64).to(torch.bfloat16)
        >>> f = ct.capture(lambda a: torch.nn.functional.silu(a) * a, x)
        >>> c = f.compare(x, configs=("eager", "fused"))
        >>> c["fused"]["max_ulp_error"] <= c["eager"]["max_ulp_error"]
        True
        """
        flat = self._flat_inputs(inputs, kwargs)
        labels, outs = [], []
        for c in (configs if isinstance(configs, (list, tuple)) else (configs,)):
            label, pol, mth = config(c)
            with torch.no_grad():
                run = self.execute(flat, pol, mth)
            labels.append(label.split("/")[0] if label.endswith("/torch_eager") else label)
            outs.append(self._float_output(run, output))
        with torch.no_grad():
            ref = self._float_output(self.execute(flat, as_policy("fp64"), self.math), output)
        return _nm.compare(*outs, ref=ref, names=labels)

    def _float_output(self, run: Run, k: int) -> torch.Tensor:
        outs = [run.env[a.name] for a in pytree.tree_leaves(self._output_node.args[0])
                if isinstance(a, torch.fx.Node) and isinstance(run.env[a.name], torch.Tensor)
                and run.env[a.name].is_floating_point()]
        if not 0 <= k < len(outs):
            raise IndexError(f"{self.name}: output {k} out of range ({len(outs)} floating "
                             "outputs)")
        return outs[k]

    def __repr__(self) -> str:
        r = sum(s.kind == "region" for s in self.segments)
        e = sum(s.kind == "external" for s in self.segments)
        return (f"<castlab.torch captured {self.name}: {r} castlab regions, {e} external "
                f"nodes; policy={self.policy.describe()} math={self.math.name}>")


def capture(fn: Callable, *example_inputs: Any, kwargs: dict | None = None,
            policy: Any = "fused", math: Any = "torch_eager",
            check: bool = True, attention: str = "eager") -> CapturedModel:
    """Capture a PyTorch module or function into castlab (see :mod:`castlab.torch`).

    `example_inputs` (and the keyword arguments `kwargs`, e.g. ``{"use_cache": False}``
    for a Hugging Face model) fix the shapes, dtypes and device: castlab captures static
    shapes. `policy` and `math` are the defaults of calls (``.run`` takes others).

    `check` (default True): call the model once and run the captured graph once in
    PyTorch on the example inputs, and warn when their outputs differ: then the model's
    code branches on being traced and the captured graph (what castlab reproduces, and
    what torch.compile traces) is not the program eager PyTorch runs. The counts are in
    the result's ``eager_gap`` (``(differing, total)`` output elements; None unchecked).

    `attention` (with `check`): ``"eager"`` (default) calls scaled-dot-product attention
    as the model does eagerly where tracing changed the call: Hugging Face attention
    builds an explicit causal mask and repeats K/V per head when traced, but calls SDPA
    with ``is_causal=True`` (and grouped K/V, ``enable_gqa=True``) eagerly, and on a GPU
    the two run other kernels. Where a traced SDPA call's mask is a constant causal mask,
    castlab tries those eager calls and keeps the one with which PyTorch running the
    graph gives the model's outputs bit for bit (the result's ``attention`` says which;
    None: none changed). ``"traced"`` keeps the graph as traced: the program
    ``torch.compile`` compiles (see :func:`castlab.torch.versus_compiled`).

    >>> import torch, castlab.torch as ct
    >>> f = ct.capture(lambda a, b: torch.nn.functional.silu(a) * b,
    ...                torch.ones(4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16))
    >>> f
    <castlab.torch captured <lambda>: 1 castlab regions, 0 external nodes; policy=fused math=torch_eager>
    """
    if not callable(fn):
        raise TypeError(f"castlab.torch.capture: expected a torch.nn.Module or a function, "
                        f"got {type(fn).__name__}")
    if attention not in ("eager", "traced"):
        raise ValueError(f"castlab.torch.capture: attention must be 'eager' or 'traced', "
                         f"got {attention!r}")
    name = getattr(fn, "__name__", None) or type(fn).__name__
    mod = _wrap(fn)
    kw = dict(kwargs or {})
    try:
        with torch.no_grad():
            ep = torch.export.export(mod, tuple(example_inputs), kw, strict=False)
    except Exception as e:  # torch's own errors name the line; keep them, say what it means
        raise _export_error(name, e) from e
    if any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
           and n.target._schema.is_mutable for n in ep.graph.nodes):
        # in-place ops (``y.add_(1)``, ``z[0] = v``): functionalized as torch.compile does
        # (aten.add_ -> aten.add, an indexed store -> select_scatter), nothing decomposed;
        # a model that updates its own inputs or buffers is then refused below
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own pytree notice
            ep = ep.run_decompositions({})
    cm = CapturedModel(ep, name, (tuple(example_inputs), kw), policy, math,
                       None if isinstance(fn, torch.nn.Module) else _closure_tensors(fn))
    if check:
        cm = _check_eager(cm, mod, attention == "eager")
        if cm.eager_gap[0]:
            warnings.warn(
                f"castlab.torch.capture: the captured graph of {name} is not the program it "
                f"runs eagerly: PyTorch itself gives other bits in {cm.eager_gap[0]:,} of "
                f"{cm.eager_gap[1]:,} output elements running the captured graph than calling "
                f"the model. The model's code takes other branches when traced, and castlab "
                f"found no SDPA call to restore (attention='eager') that explains it. castlab "
                f"reproduces the captured graph (`run_in_torch` is PyTorch running it), which "
                f"is the program torch.compile traces.", RuntimeWarning, stacklevel=2)
    return cm


def _check_eager(cm: CapturedModel, mod: torch.nn.Module, restore_sdpa: bool) -> CapturedModel:
    """Compare calling the model with PyTorch running the captured graph on the example
    inputs (same RNG state for both); with `restore_sdpa`, try the eager SDPA calls of
    :mod:`._attention` and keep the first that gives the model's outputs bit for bit (the
    changed graph partitioned anew: a new CapturedModel). Sets ``eager_gap``."""
    args, kw = cm._example
    devices = sorted({t.device.index or 0 for t in pytree.tree_leaves((args, kw))
                      if isinstance(t, torch.Tensor) and t.is_cuda})
    with torch.random.fork_rng(devices=devices):
        states = torch.random.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices]

        def replay(f: Callable, *a: Any, **k: Any) -> Any:
            torch.random.set_rng_state(states[0])
            for d, st in zip(devices, states[1]):
                torch.cuda.set_rng_state(st, d)
            with torch.no_grad():
                return f(*a, **k)

        want = replay(mod, *args, **kw)
        flat = cm._flat_inputs(args, kw)
        sites = _attention.sdpa_sites(cm.nodes, set(cm._user)) if restore_sdpa else []
        masks = {s["args"]["attn_mask"].name: None for s in sites}
        cm.eager_gap = _gap(want, replay(cm._run_graph, flat, masks))
        for calls, what in _attention.candidates(sites, masks):
            undo = _attention.apply(calls)
            try:
                same = _gap(want, replay(cm._run_graph, flat))[0] == 0
            except Exception:  # a call this PyTorch or device refuses (enable_gqa, ...)
                same = False
            if same:
                _attention.drop_dead(cm.graph, _SKIP)
                cm.exported.graph_module.recompile()
                new = CapturedModel(cm.exported, cm.name, cm._example, cm.policy, cm.math,
                                    cm._closure_tensors)
                new.eager_gap = (0, cm.eager_gap[1])
                new.attention = (f"{len(calls)} scaled_dot_product_attention call(s) as "
                                 f"the model makes them eagerly: {what}")
                return new
            _attention.apply(undo)
    return cm


