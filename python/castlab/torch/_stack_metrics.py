"""What compare_stacks and alignment measure: one captured model's runs under stacks, the
scored tokens, their log-probabilities, the KL between two runs' next-token
distributions, and where two runs' values first differ, node by node.

Log-probabilities are ``log_softmax`` in fp64 of each run's logits (the logits widened
exactly): the comparison metric, not what either stack's own loss kernel computes.

>>> import torch, castlab.torch as ct
>>> from castlab.torch._stack_metrics import Scorer
>>> lin = torch.nn.Linear(4, 8).bfloat16()
>>> x = torch.randn(3, 4).bfloat16()
>>> m = ct.capture(lambda x: torch.nn.functional.silu(lin(x)) * 2, x)
>>> s = Scorer(m, m._flat_inputs((x,), {}), None)
>>> s.label_source, s.mask.shape
('argmax of the fp64 logits', torch.Size([3]))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..policy import as_policy
from . import _stacks
from ._drift import _layer
from ._partition import module_path

__all__ = ["Scorer", "Outcome", "node_rows", "layer_rows", "first_difference"]

IGNORE = -100  #: a label that is not scored (Hugging Face's ignore index)


def logits_of(captured: Any, run: Any) -> torch.Tensor:
    """The logits of a run: the output's ``logits`` (a Hugging Face model), the output
    itself when it is one tensor, else its first floating tensor."""
    out = captured.outputs(run)
    lg = getattr(out, "logits", None)
    if lg is None and isinstance(out, dict):
        lg = out.get("logits")
    if lg is None:
        lg = next((t for t in pytree.tree_leaves(out)
                   if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    if lg is None or lg.dim() < 1:
        raise ValueError(f"{captured.name}: its outputs hold no floating tensor of logits "
                         "[..., vocabulary] to compare")
    return lg


@dataclasses.dataclass
class Outcome:
    """One run under one plan: its Run (every value), logits and the scored tokens'
    fp64 log-probabilities."""

    plan: Any
    run: Any
    logits: torch.Tensor
    lp: torch.Tensor


class Scorer:
    """The fp64 reference run of `captured` on `flat` inputs and the tokens scored:
    `labels` (shape ``logits.shape[:-1]``; -100 not scored), else the next input ids
    (an integer input of that shape, shifted: position t scores id t + 1, the last
    position none), else the fp64 run's argmax."""

    def __init__(self, captured: Any, flat: list, labels: Any):
        self.captured, self.flat = captured, flat
        with torch.no_grad():
            self.ref_run = captured.execute(flat, as_policy("fp64"), captured.math)
        self.ref_logits = logits_of(captured, self.ref_run).double()
        self.labels, self.label_source = self._labels(labels)
        self.mask = self.labels != IGNORE
        self.ref_lp = self.token_lp(self.ref_logits)
        self.runs = 0

    def _labels(self, labels: Any) -> tuple:
        lg = self.ref_logits
        shape, vocab = tuple(lg.shape[:-1]), lg.shape[-1]
        name = self.captured.name
        if labels is not None:
            if not isinstance(labels, torch.Tensor) or labels.is_floating_point() \
                    or labels.is_complex() or labels.dtype == torch.bool:
                raise TypeError(f"compare_stacks: labels must be an integer torch.Tensor of "
                                f"token ids, not {getattr(labels, 'dtype', type(labels))}")
            if tuple(labels.shape) != shape:
                raise ValueError(f"compare_stacks: labels have shape {list(labels.shape)}; "
                                 f"{name}'s logits are {list(lg.shape)}, so labels must be "
                                 f"{list(shape)} (label t is the token position t predicts; "
                                 f"{IGNORE}: not scored)")
            lab = labels.to(lg.device, torch.long)
            src = "given labels"
        else:
            ids = next((t for t in self.flat if isinstance(t, torch.Tensor)
                        and not t.is_floating_point() and t.dtype != torch.bool
                        and tuple(t.shape) == shape and len(shape) >= 1 and shape[-1] > 1),
                       None)
            if ids is not None:
                lab = torch.full(shape, IGNORE, dtype=torch.long, device=lg.device)
                lab[..., :-1] = ids[..., 1:].to(lg.device, torch.long)
                src = "next input ids (position t scores id t+1; the last position none)"
            else:
                lab = lg.argmax(-1)
                src = "argmax of the fp64 logits"
        bad = lab[(lab != IGNORE) & ((lab < 0) | (lab >= vocab))]
        if bad.numel():
            raise ValueError(f"compare_stacks: token id {int(bad[0])} is outside {name}'s "
                             f"vocabulary of {vocab} logits (labels or input ids of another "
                             "tokenizer or model?)")
        return lab, src

    def token_lp(self, logits: torch.Tensor) -> torch.Tensor:
        """fp64 log-probabilities of the scored tokens (flat, in position order)."""
        lsm = logits.double().log_softmax(-1)
        return lsm.gather(-1, self.labels.clamp(min=0)[..., None])[..., 0][self.mask]

    def run(self, p: Any) -> Outcome:
        """Run the model under plan `p`."""
        self.runs += 1
        r = _stacks.execute(self.captured, p, self.flat)
        lg = logits_of(self.captured, r)
        return Outcome(p, r, lg, self.token_lp(lg))

    def kl(self, a: Outcome, b: Outcome) -> torch.Tensor:
        """KL(a || b) of the next-token distributions at the scored positions (fp64)."""
        la = a.logits.double().log_softmax(-1)[self.mask]
        lb = b.logits.double().log_softmax(-1)[self.mask]
        return (la.exp() * (la - lb)).sum(-1)

    def error(self, o: Outcome) -> float:
        """Mean |log-probability - fp64 log-probability| over the scored tokens."""
        return float((o.lp - self.ref_lp).abs().mean()) if o.lp.numel() else 0.0


def _floats(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _compared(captured: Any, ea: dict, eb: dict) -> list:
    """The op nodes whose values both environments hold as same-shaped floating tensors,
    in graph order (views left out: they are exact)."""
    views = {n.name for s in captured.segments if s.kind == "view" for n in s.nodes}
    out = []
    for n in captured.nodes:
        if n.op != "call_function" or n.name in views:
            continue
        va, vb = ea.get(n.name), eb.get(n.name)
        if _floats(va) and _floats(vb) and va.shape == vb.shape:
            out.append(n)
    return out


def _differ(va: torch.Tensor, vb: torch.Tensor) -> torch.Tensor:
    return (va != vb) & ~(va.isnan() & vb.isnan())


def first_difference(captured: Any, ra: Any, rb: Any) -> Any:
    """The first node (graph order) whose value differs between runs `ra` and `rb`, or
    None where every compared value is equal."""
    for n in _compared(captured, ra.env, rb.env):
        if not torch.equal(ra.env[n.name], rb.env[n.name]) and bool(
                _differ(ra.env[n.name], rb.env[n.name]).any()):
            return n
    return None


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    d = float((x.double() - ref.double()).norm())
    r = float(ref.double().norm())
    return d / r if r else (0.0 if d == 0 else float("inf"))


def node_rows(captured: Any, ra: Any, rb: Any, ref: Any) -> list:
    """One row per compared node: where it is (region kind, module, layer), how many
    elements differ between the two runs, the largest difference, the relative RMS
    difference, and each run's relative RMS error against fp64 (None where the fp64
    run does not hold the value)."""
    kind = {}
    for r in captured.regions():
        for m in (*r.nodes, *r.outputs):
            kind.setdefault(m, f"{r.kind}")
    seg_kind = {n.name: s.kind for s in captured.segments for n in s.nodes}
    rows = []
    for n in _compared(captured, ra.env, rb.env):
        va, vb = ra.env[n.name], rb.env[n.name]
        vr = ref.env.get(n.name)
        vr = vr if _floats(vr) and vr.shape == va.shape else None
        d = _differ(va, vb)
        mod = module_path(n)
        rows.append({
            "node": n.name, "op": str(n.target).replace("aten.", "").replace(".default", ""),
            "kind": kind.get(n.name, seg_kind.get(n.name, "")), "module": mod,
            "layer": _layer(mod), "differ": int(d.sum()), "total": va.numel(),
            "max_abs": float((va.double() - vb.double()).abs().nan_to_num().max())
            if va.numel() else 0.0,
            "rel_diff": _rel(va, vb), "a_err": None if vr is None else _rel(va, vr),
            "b_err": None if vr is None else _rel(vb, vr)})
    return rows


def layer_rows(rows: list) -> list:
    """Per layer (graph order): its compared nodes, how many differ, the first that does
    (and its kind), and at its last compared node the relative difference of the two runs
    and each one's relative error against fp64."""
    layers: dict = {}
    for r in rows:
        layers.setdefault(r["layer"] or "<top>", []).append(r)
    out = []
    for name, rs in layers.items():
        first = next((r for r in rs if r["differ"]), None)
        last = rs[-1]
        out.append({"layer": name, "nodes": len(rs), "differing": sum(bool(r["differ"])
                                                                      for r in rs),
                    "first": first["node"] if first else None,
                    "first_kind": first["kind"] if first else None,
                    "last": last["node"], "rel_diff": last["rel_diff"],
                    "a_err": last["a_err"], "b_err": last["b_err"]})
    return out
