"""castlab against torch.compile, value by value (issue 17, contract 2).

torch.compile fuses a model into kernels whose inner values never reach memory, so it can
only be compared where it writes a tensor. Every value a castlab region hands back to
PyTorch feeds a PyTorch op; those that feed a library call (a matmul, attention, an embedding, directly
or through views) or the outputs, Inductor writes too: its default matmuls and attention
are library calls that read their operands from memory. :func:`versus_compiled` compiles the captured graph itself with
those values as extra outputs, runs castlab on the same inputs, and counts the differing
bits at each one, in graph order.

Adding outputs can still change what Inductor fuses where the matmul or attention is one it
generates itself: ``max-autotune`` templates, or attention it decomposes into bmm and
softmax (the 1-layer Qwen2 of the Thunder report, head dimension 2, on an H200).
``model=`` checks it: torch.compile of the model itself must give the same outputs as the
compiled graph, and where it does not, the plain graph says whether the extra outputs or
the graph made the difference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from ..numerics._tables import _html_table, _text_table
from ..policy import as_math, as_policy
from ._program import CapturedModel, differing_elements, module_path, where_text

__all__ = ["versus_compiled", "CompiledComparison"]


def _materialised(n: torch.fx.Node, kind_of: dict) -> bool:
    """Whether Inductor writes node `n`'s value to memory anyway: an external node (a
    library call: matmul, attention, embedding, ...) or the graph's output reads it,
    directly or through views. Asking it for any other value (one it keeps inside a fused
    kernel) would make it write, and may change what it fuses."""
    for u in n.users:
        if u.op == "output" or kind_of.get(u.name) == "external":
            return True
        if kind_of.get(u.name) == "view" and _materialised(u, kind_of):
            return True
    return False


class CompiledComparison:
    """Result of :func:`versus_compiled`. ``rows``: one dict per compared value (the
    values castlab's regions hand to PyTorch's library calls and the graph's outputs, in
    graph order):
    ``node``, ``op``, ``kind`` ("region" or "external": which side computed it in the
    castlab run), ``module``, ``line``, ``dtype``, ``numel``, ``mismatches`` (elements
    whose bits differ from torch.compile's), ``max_abs_diff``. ``first``: the first row
    that differs (None: all equal). ``model_outputs_equal``: whether torch.compile of
    the model itself gave the compiled graph's outputs (None when no model was given);
    ``model_mismatch``: where they differ, why: ``"extra outputs"`` (they changed what
    Inductor fused: the graph compiled without them gives the model's outputs) or
    ``"graph"`` (the captured graph is another program than the one the model runs,
    see ``CapturedModel.eager_gap``); None otherwise.
    ``to_frame()``, text and HTML."""

    def __init__(self, name: str, label: str, rows: list, model_outputs_equal: bool | None,
                 model_mismatch: str | None = None):
        self.name = name
        self.label = label
        self.rows = rows
        self.first = next((r for r in rows if r["mismatches"]), None)
        self.model_outputs_equal = model_outputs_equal
        self.model_mismatch = model_mismatch

    def to_frame(self):
        """The rows as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def _caption(self) -> str:
        n = sum(1 for r in self.rows if r["mismatches"])
        first = self.first
        where = (f"{first['node']} ({first['op'].replace('aten.', '')}, "
                 f"{first['module'] or 'top'}, {first['line']}): {first['mismatches']:,}/"
                 f"{first['numel']:,} elements" if first else "nowhere")
        lines = [f"castlab {self.label} vs torch.compile: {self.name}; {n} of "
                 f"{len(self.rows)} values differ; first at {where}"]
        if self.model_outputs_equal is not None:
            why = {None: "yes",
                   "extra outputs": "NO: the extra outputs changed what Inductor fused "
                                    "(without them the graph compiles to the model's outputs)",
                   "graph": "NO: the captured graph is not the program the model runs "
                            "(compiled without the extra outputs it still differs; see "
                            "eager_gap, and capture's attention='traced', which keeps "
                            "the SDPA calls as torch.compile traces them)"}
            lines.append("torch.compile of the model gives the compiled graph's outputs: "
                         + why[self.model_mismatch])
        return "\n".join(lines)

    def _table(self) -> tuple:
        heads = ["node", "op", "kind", "line", "dtype", "differ", "of", "max |diff|"]
        body = [[r["node"], r["op"].replace("aten.", ""), r["kind"], r["line"], r["dtype"],
                 r["mismatches"], r["numel"], f"{r['max_abs_diff']:.3g}"] for r in self.rows]
        return heads, body

    def __str__(self) -> str:
        return self._caption() + "\n" + _text_table(*self._table())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return _html_table(*self._table(), self._caption().replace("\n", "; "))


def _tensors(x: Any) -> list:
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _same(xs: list, ys: list) -> bool:
    return len(xs) == len(ys) and all(
        a.shape == b.shape and differing_elements(a, b) == 0 for a, b in zip(xs, ys))


def versus_compiled(cm: CapturedModel, *inputs: Any, kwargs: dict | None = None,
                    policy: Any = "fused", math: Any = "inductor", model: Any = None,
                    compile_options: dict | None = None) -> CompiledComparison:
    """Compare castlab's run of a captured model with ``torch.compile``'s, at every value a
    castlab region hands to a PyTorch library call (matmul, attention, ...) and at the
    outputs: the values torch.compile writes to memory too. How many elements of each
    differ in any bit, and the first that does.

    torch.compile compiles the captured graph with those values as extra outputs (see the
    module's notes); `model` (the module or function that was captured) is compiled too,
    to check that its outputs equal the graph's (where they do not, the captured graph is
    compiled once more without the extra outputs, to tell which changed the program).
    To compare with ``torch.compile`` of the model, capture it with
    ``attention="traced"``: by default ``capture`` restores the SDPA calls the model makes
    eagerly, where torch.compile compiles the traced ones (see :func:`capture`).
    `compile_options`: keyword arguments of
    ``torch.compile`` (default ``dynamic=False``). Each compile starts from
    ``torch._dynamo.reset()``, so functions compiled earlier in the process compile again
    on their next call.

    >>> import torch, castlab.torch as ct
    >>> f = lambda x, w: (x @ w) * 1.5 + x
    >>> g = torch.Generator().manual_seed(0)
    >>> x, w = (torch.randn(8, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    >>> cm = ct.capture(f, x, w)
    >>> ct.versus_compiled(cm, x, w, policy="fused", math="inductor").first is None
    True
    """
    if not isinstance(cm, CapturedModel):
        raise TypeError(f"versus_compiled: expected a model captured by castlab.torch.capture, "
                        f"got {type(cm).__name__} (capture it first: ct.capture(model, *inputs))")
    pol, mth = as_policy(policy), as_math(math)
    flat = cm._flat_inputs(inputs, kwargs)
    kind_of = {n.name: s.kind for s in cm.segments for n in s.nodes}
    names = [n.name for s in cm.segments if s.kind == "region" for n in s.outputs
             if _materialised(n, kind_of)]
    out_nodes = [a for a in pytree.tree_leaves(cm._output_node.args[0])
                 if isinstance(a, torch.fx.Node)]
    wanted = list(dict.fromkeys(names + [n.name for n in out_nodes]))
    by_name = {n.name: n for n in cm.nodes}
    # the captured graph, returning its outputs and then every wanted value
    gm = cm.exported.graph_module
    graph = torch.fx.Graph()
    env: dict = {}
    outs = graph.graph_copy(gm.graph, env)
    graph.output(tuple(pytree.tree_leaves(outs))
                  + tuple(env[by_name[k]] for k in wanted))
    extended = torch.fx.GraphModule(gm, graph)
    it = iter(flat)
    places = [cm._consts[n.name] if n.name in cm._consts else next(it)
              for n in cm.nodes if n.op == "placeholder"]
    opts = {"dynamic": False, **(compile_options or {})}
    torch._dynamo.reset()
    with torch.no_grad():
        got = list(torch.compile(extended, **opts)(*places))
        n_out = len(got) - len(wanted)
        compiled = dict(zip(wanted, got[n_out:]))
        model_equal = why = None
        if model is not None:
            torch._dynamo.reset()
            ref = torch.compile(model, **opts)(*inputs, **(kwargs or {}))
            ref_flat = _tensors(ref)
            model_equal = _same(ref_flat, _tensors(got[:n_out]))
            if not model_equal:  # which program differs: the graph itself, or with extras?
                torch._dynamo.reset()
                plain = torch.compile(gm, **opts)(*places)
                why = "extra outputs" if _same(ref_flat, _tensors(plain)) else "graph"
        torch._dynamo.reset()
        run = cm.execute(flat, pol, mth)
    region_made = set(names)
    rows = []
    for name in wanted:
        node, a, b = by_name[name], run.env[name], compiled[name]
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue
        if a.shape != b.shape:
            raise RuntimeError(f"versus_compiled: {name} is {list(a.shape)} in castlab's run "
                               f"and {list(b.shape)} in torch.compile's")
        diff = (a.double() - b.double()).abs()
        finite = diff[torch.isfinite(diff)]
        rows.append({"node": name, "op": str(node.target), "module": module_path(node),
                     "line": where_text(node),
                     "kind": "region" if name in region_made else "external",
                     "dtype": str(b.dtype).replace("torch.", ""), "numel": b.numel(),
                     "mismatches": differing_elements(a, b),
                     "max_abs_diff": float(finite.max()) if finite.numel() else 0.0})
    order = {n.name: i for i, n in enumerate(cm.nodes)}
    rows.sort(key=lambda r: order[r["node"]])
    return CompiledComparison(cm.name, f"{pol.name}/{mth.name}", rows, model_equal, why)
