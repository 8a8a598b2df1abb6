"""Alignment of two stacks: the smallest set of stack B's choices whose switch to stack
A's values makes B's logits equal A's bit for bit (``compare_stacks(..., align=True)``).

The choices are the fields of :data:`castlab.torch._stacks.FIELDS` whose effective
values differ on the model (an inert choice, one that does not apply, is listed apart
and never searched). The search tries every single choice, then pairs, then triples,
and stops at the first size where a set works (all sets of that size that work are
listed); every set reported was run, so each "bit-identical" is measured.

Pruning (``prune=True``). Each field has a *first touch*: the earliest node (graph
order) whose value it can change (policy and math: the first node of a castlab region;
a kernel kind: the first node of any captured segment holding one of its instances or
the values they read, since a kernel splits that segment; attention: the first SDPA
call; matmul: the first matmul). Switching field g leaves every value before g's first
touch as it was. So where B with set S' switched was run (or pruned) and first differs
from A at node n, a set S' + {g} with g's first touch after n still differs from A at
n, and is skipped without a run. That proves a difference at n, not at the logits: a
difference that vanished on the way to the logits could make such a set equal at the
logits; ``prune=False`` runs every set.

Where no set of up to three choices works, each choice is ranked by its share of the
KL(A||B): switched alone (``1 - KL(A||B+f) / KL(A||B)``) and left out of all the others
(``KL(A||B+all-f) / KL(A||B)``). Each choice's verdict against fp64 compares the mean
|log-probability - fp64 log-probability| of B's scored tokens before and after
switching it alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any

import torch

from ..numerics._tables import _fmt_num, _text_table
from . import _stacks
from ._stack_metrics import first_difference

__all__ = ["Alignment", "ChoiceEffect", "align", "first_touch"]

_MATMULS = ("aten.linear.default", "aten.matmul.default", "aten.mm.default",
            "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default")
_SDPA = "aten.scaled_dot_product_attention.default"


def first_touch(captured: Any) -> dict:
    """{field: position in ``captured.nodes`` of the first node whose value switching the
    field can change} (``math.inf``: none), conservatively (see the module's docstring).

    >>> import torch, castlab.torch as ct
    >>> g = torch.ones(2, 4, dtype=torch.bfloat16)
    >>> m = ct.capture(lambda g, u: torch.nn.functional.silu(g @ g.T) * u[:, :2], g, g)
    >>> from castlab.torch._align import first_touch
    >>> t = first_touch(m)
    >>> t["matmul"] < t["swiglu"], t["rope"]
    (True, inf)
    """
    pos = {n.name: i for i, n in enumerate(captured.nodes)}
    seg_of = {n.name: k for k, s in enumerate(captured.segments) for n in s.nodes}
    span = [min((pos[n.name] for n in s.nodes), default=math.inf) for s in captured.segments]
    out = {f: math.inf for f in _stacks.FIELDS}
    regions = [k for k, s in enumerate(captured.segments) if s.kind == "region"]
    out["policy"] = out["math"] = out["stores"] = min((span[k] for k in regions), default=math.inf)
    for r in captured.regions():
        if r.kind in _stacks.KERNEL_KINDS:
            # its nodes, and the values it reads where a castlab region computes them
            # (a PyTorch node's value does not change when a kernel splits a region)
            names = [m for m in r.nodes if m in pos] + [
                m for m in r.inputs if m in seg_of
                and captured.segments[seg_of[m]].kind == "region"]
            first = min([pos[m] for m in names]
                        + [span[seg_of[m]] for m in names if m in seg_of], default=math.inf)
            out[r.kind] = min(out[r.kind], first)
    for n in captured.nodes:
        t = str(n.target)
        if t == _SDPA:
            out["attention"] = min(out["attention"], pos[n.name])
        elif t in _MATMULS:
            out["matmul"] = min(out["matmul"], pos[n.name])
    return out


@dataclasses.dataclass
class ChoiceEffect:
    """One differing choice: its values in A and B, the KL(A||B) after switching it alone
    and after switching all the others (and their shares of B's KL), and B's mean
    |log-prob - fp64| before and after switching it alone (the verdict)."""

    field: str
    a_value: str
    b_value: str
    kl_alone: float
    kl_all_but: float
    share_alone: float
    share_all_but: float
    err_before: float
    err_after: float

    @property
    def verdict(self) -> str:
        if self.err_after < self.err_before:
            return "toward fp64"
        if self.err_after > self.err_before:
            return "away from fp64"
        return "no change vs fp64"


class Alignment:
    """Result of aligning stack B to stack A (see :mod:`castlab.torch._align`):
    ``sets`` (the smallest sets of fields that make B's logits equal A's, each run; []
    when none of up to three does), ``fields`` (the differing choices), ``inert``
    ((field, why) of differing choices that do not apply), ``effects``
    (:class:`ChoiceEffect` per field, largest KL share first), ``kl`` (KL(A||B) before),
    ``runs``, ``pruned`` and ``seconds``."""

    def __init__(self, a: Any, b: Any, fields: list, inert: list, sets: list, effects: list,
                 kl: float, err_b: float, err_a: float, all_equal: bool | None, runs: int,
                 pruned: int, seconds: float):
        self.a, self.b, self.fields, self.inert = a, b, fields, inert
        self.sets, self.effects, self.kl = sets, effects, kl
        self.err_b, self.err_a, self.all_equal = err_b, err_a, all_equal
        self.runs, self.pruned, self.seconds = runs, pruned, seconds

    def _switch(self, fields: tuple) -> str:
        return ", ".join(f"{f} to {self.a.name}'s ({_value(self.a, f)})" for f in fields)

    def summary(self) -> str:
        """The alignment in one line per minimal set (or why there is none)."""
        if self.sets == [()] and self.fields:
            return (f"{self.b.name}'s logits already equal {self.a.name}'s bit for bit; "
                    f"its {len(self.fields)} differing choices change nothing here")
        if not self.fields:
            return (f"{self.b.name} and {self.a.name} already give bit-identical logits"
                    if self.kl == 0 and self.sets == [()] else
                    f"{self.b.name} and {self.a.name} make the same choices on this model")
        if self.sets:
            return "\n".join(
                f"switch {self._switch(s)}: logits now bit-identical; KL "
                f"{_fmt_num(self.kl)} -> 0; B's mean |logprob - fp64| {_fmt_num(self.err_b)} "
                f"-> {_fmt_num(self.err_a)} ({_toward(self.err_b, self.err_a)})"
                for s in self.sets)
        tail = (f"; switching all {len(self.fields)} gives bit-identical logits"
                if self.all_equal else "")
        return (f"no set of up to 3 of {len(self.fields)} differing choices makes the logits "
                f"bit-identical{tail}; KL shares below")

    def table(self) -> tuple:
        """(headers, rows) of the per-choice effects."""
        heads = ["choice", f"A ({self.a.name})", f"B ({self.b.name})", "KL after alone",
                 "share alone", "KL after all but", "share all but", "B err before",
                 "B err after", "verdict"]
        rows = [[e.field, e.a_value, e.b_value, e.kl_alone, e.share_alone, e.kl_all_but,
                 e.share_all_but, e.err_before, e.err_after, e.verdict] for e in self.effects]
        return heads, rows

    def __str__(self) -> str:
        lines = [f"alignment of {self.b.name} (B) to {self.a.name} (A): {self.summary()}"]
        if self.effects:
            lines.append(_text_table(*self.table()))
        lines += [f"  inert (not searched): {f}: {why}" for f, why in self.inert]
        lines.append(f"  {self.runs} runs, {self.pruned} sets pruned, {self.seconds:.2f} s")
        return "\n".join(lines)


def _toward(before: float, after: float) -> str:
    return ("toward fp64" if after < before else "away from fp64" if after > before
            else "no change vs fp64")


def _value(s: Any, f: str) -> str:
    v = getattr(s, f)
    if v is None:
        if f == "stores":
            return "regions"
        return "as captured" if f in _stacks.KERNEL_KINDS else "PyTorch's default"
    return _stacks._short(v)


def _switched(b: Any, a: Any, fields: tuple) -> Any:
    return b.replace(name=f"{b.name}+{'+'.join(fields)} of {a.name}",
                     **{f: getattr(a, f) for f in fields})


def align(scorer: Any, a: Any, b: Any, out_a: Any, out_b: Any, prune: bool = True,
          max_size: int = 3) -> Alignment:
    """Align stack `b` to stack `a` on `scorer`'s model (see the module's docstring);
    `out_a`, `out_b`: their runs (:class:`~castlab.torch._stack_metrics.Outcome`)."""
    t0 = time.perf_counter()
    cm = scorer.captured
    runs0 = scorer.runs
    ea, eb = out_a.plan.effective(), out_b.plan.effective()
    inert = list({f: (f, why) for f, why in out_b.plan.inert + out_a.plan.inert
                  if _stacks._key(getattr(a, f)) != _stacks._key(getattr(b, f))}.values())
    fields = [f for f in _stacks.FIELDS if ea[f] != eb[f]]
    kl0 = float(scorer.kl(out_a, out_b).mean()) if out_a.lp.numel() else 0.0
    err_b, err_a = scorer.error(out_b), scorer.error(out_a)
    equal0 = _same(out_a, out_b)
    touch = first_touch(cm)
    pos = {n.name: i for i, n in enumerate(cm.nodes)}
    witness: dict = {}   # set -> position where B with it switched provably differs from A
    outs: dict = {(): out_b}
    if not equal0:
        n0 = first_difference(cm, out_a.run, out_b.run)
        witness[()] = pos[n0.name] if n0 is not None else -1
    sets, pruned = ([()] if equal0 else []), 0
    for size in range(1, min(max_size, len(fields)) + 1):
        if sets:
            break
        for s in itertools.combinations(fields, size):
            w = _pruned(s, witness, touch) if prune and size > 1 else None
            if w is not None:
                witness[s] = w
                pruned += 1
                continue
            o = outs[s] = scorer.run(_stacks.plan(_switched(b, a, s), cm))
            if _same(out_a, o):
                sets.append(s)
            else:
                n = first_difference(cm, out_a.run, o.run)
                witness[s] = pos[n.name] if n is not None else -1
    effects, all_equal = _effects(scorer, a, b, fields, outs, out_a, kl0, err_b)
    return Alignment(a, b, fields, inert, sets, effects, kl0, err_b, err_a, all_equal,
                     scorer.runs - runs0, pruned, time.perf_counter() - t0)


def _same(x: Any, y: Any) -> bool:
    """Bit-identical logits (signed zeros and NaN payloads told apart)."""
    lx, ly = x.logits, y.logits
    if lx.shape != ly.shape or lx.dtype != ly.dtype:
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[lx.element_size()]
    return torch.equal(lx.contiguous().view(ints), ly.contiguous().view(ints))


def _pruned(s: tuple, witness: dict, touch: dict) -> int | None:
    """A witness for set `s` from a subset one field smaller that differs from A at a
    node before that field's first touch, else None."""
    for g in s:
        sub = tuple(f for f in s if f != g)
        w = witness.get(sub)
        if w is not None and w >= 0 and touch[g] > w:
            return w
    return None


def _effects(scorer: Any, a: Any, b: Any, fields: list, outs: dict, out_a: Any, kl0: float,
             err_b: float) -> tuple:
    """Per field: KL after switching it alone and all but it, and the fp64 verdict; and
    whether switching every field gives A's logits (None: not run)."""
    cm = scorer.captured
    effects = []
    loo: dict = {}
    all_equal = None
    if len(fields) == 1:
        loo[fields[0]] = outs[()]
    elif fields:
        for f in fields:
            rest = tuple(x for x in fields if x != f)
            loo[f] = outs.get(rest) or scorer.run(_stacks.plan(_switched(b, a, rest), cm))
        every = tuple(fields)
        o_all = outs.get(every) or scorer.run(_stacks.plan(_switched(b, a, every), cm))
        all_equal = _same(out_a, o_all)
    for f in fields:
        o = outs.get((f,)) or scorer.run(_stacks.plan(_switched(b, a, (f,)), cm))
        kl_alone = float(scorer.kl(out_a, o).mean()) if o.lp.numel() else 0.0
        kl_loo = float(scorer.kl(out_a, loo[f]).mean()) if o.lp.numel() else 0.0
        effects.append(ChoiceEffect(
            f, _value(a, f), _value(b, f), kl_alone, kl_loo,
            (1 - kl_alone / kl0) if kl0 else 0.0,
            (kl_loo / kl0) if kl0 else 0.0,
            err_b, scorer.error(o)))
    effects.sort(key=lambda e: -e.share_alone)
    return effects, all_equal
