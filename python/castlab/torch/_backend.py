"""``castlab.torch.backend``: a ``torch.compile`` backend that runs each graph Dynamo
hands it through castlab (captured with :func:`capture`), under one policy and math.

Dynamo splits the model at graph breaks and calls the backend once per graph with
example inputs; castlab captures that graph (``torch.export`` of Dynamo's GraphModule:
the same ATen program castlab captures directly) and returns a function of PyTorch
tensors. A graph castlab refuses (one that mutates its inputs, needs autograd, has
symbolic shapes or an op PyTorch cannot run as an external node) runs as PyTorch
compiled it not, eagerly, and castlab warns once per reason.

>>> import torch, castlab.torch as ct
>>> f = torch.compile(torch.nn.SiLU(), backend=ct.backend(policy="eager"), dynamic=False)
>>> a = torch.linspace(-4, 4, 64).to(torch.bfloat16)
>>> torch.equal(f(a), torch.nn.functional.silu(a))
True
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..policy import as_math, as_policy
from ._program import CaptureError, capture

__all__ = ["backend", "CastlabBackend"]

_warned: set = set()
_warned_lock = threading.Lock()


def _warn_once(reason: str, detail: str) -> None:
    with _warned_lock:
        if reason in _warned:
            return
        _warned.add(reason)
    warnings.warn(f"castlab.torch.backend: {detail}; this graph runs in PyTorch (eager) "
                  "instead (said once)", RuntimeWarning, stacklevel=3)


class CastlabBackend:
    """The callable ``torch.compile(backend=...)`` receives: ``(GraphModule, example
    inputs) -> function``. ``graphs`` lists, per graph Dynamo gave it, the captured
    program (:class:`CapturedModel`) or the reason it fell back to PyTorch."""

    def __init__(self, policy: Any = "fused", math: Any = "inductor"):
        self.policy = as_policy(policy)
        self.math = as_math(math)
        self.graphs: list = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        reason = self._refusal(example_inputs)
        if reason is None:
            try:
                cm = capture(gm, *example_inputs, policy=self.policy, math=self.math)
            except CaptureError as e:
                reason = ("capture", str(e).splitlines()[0])
        if reason is not None:
            self.graphs.append(reason[1])
            _warn_once(*reason)
            return gm.forward
        self.graphs.append(cm)
        return _Compiled(cm, gm)

    @staticmethod
    def _refusal(example_inputs: list):
        for x in example_inputs:
            if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return ("dynamic", "a graph with symbolic sizes (castlab captures static "
                                   "shapes; pass dynamic=False to torch.compile)")
            if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
                return ("grad", "a graph that autograd records (castlab.torch runs forwards "
                                "only: call the model under torch.no_grad())")
        return None

    def __repr__(self) -> str:
        return (f"castlab.torch.backend(policy={self.policy.describe()!r}, "
                f"math={self.math.name!r})")


class _Compiled:
    """One captured Dynamo graph: called with that graph's flat inputs."""

    def __init__(self, cm, gm):
        self.cm = cm
        self.gm = gm

    def __call__(self, *args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            _warn_once("grad", "a graph that autograd records (castlab.torch runs forwards "
                               "only: call the model under torch.no_grad())")
            return self.gm.forward(*args)
        return self.cm.run(*args)


def backend(policy: Any = "fused", math: Any = "inductor") -> CastlabBackend:
    """A ``torch.compile`` backend running each captured graph through castlab under
    `policy` and `math`: ``torch.compile(model, backend=castlab.torch.backend())``.
    Outputs are PyTorch tensors; graphs castlab refuses run in PyTorch, with one warning.

    >>> import torch, castlab.torch as ct
    >>> be = ct.backend(policy="fused", math="inductor")
    >>> f = torch.compile(torch.nn.Tanh(), backend=be, dynamic=False)
    >>> f(torch.zeros(2)).tolist(), type(be.graphs[0]).__name__
    ([0.0, 0.0], 'CapturedModel')
    """
    return CastlabBackend(policy, math)
