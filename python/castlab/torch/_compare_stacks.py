"""``castlab.torch.compare_stacks``: one model under two stacks and the fp64 reference.

Per scored token: the log-probability under each stack and under fp64, their
difference, the KL(A||B) of the two next-token distributions and whether the top-1
token flips. Per node and per layer: where the two runs first differ and by how much,
and each one's error against fp64. Which stack is closer to fp64, per token and
overall. With ``align=True``, the alignment (:mod:`castlab.torch._align`).

Log-probabilities are ``log_softmax`` in fp64 of each run's logits: the comparison's
metric, not either stack's own loss kernel. The scored tokens are the given `labels`
(label t is the token position t predicts; -100 is not scored), else the input ids
shifted by one (position t scores input id t+1; the last position none), else, with
no integer input of the logits' leading shape, the fp64 run's argmax.

>>> import torch, castlab.torch as ct
>>> g = torch.linspace(-4, 4, 64).reshape(8, 8).bfloat16()
>>> r = ct.compare_stacks(lambda g, u: torch.nn.functional.silu(g) * u, (g, g),
...                       a="hf_eager", b="unsloth")
>>> r.inert["b"]
[('rope', 'the model has no rope instance'), ('rms_norm', 'the model has no rms_norm instance')]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ..numerics._tables import _fmt_num, _html_table, _text_table
from . import _align, _stacks
from ._program import CapturedModel, capture
from ._stack_metrics import Scorer, layer_rows, node_rows

__all__ = ["compare_stacks", "StackComparison"]


def compare_stacks(model: Any, inputs: Any, a: Any = "liger", b: Any = "vllm",
                   labels: torch.Tensor | None = None, align: bool = False,
                   kwargs: dict | None = None, prune: bool = True) -> StackComparison:
    """Run `model` (a :class:`CapturedModel`, or a module or function, captured here on
    `inputs`) under stacks `a` and `b` (built-in names or :class:`Stack`) and the fp64
    policy, and compare them (see :mod:`castlab.torch._compare_stacks`). `inputs`: a
    tensor or a tuple of them; `kwargs`: the forward's keyword arguments (default for a
    Hugging Face model: ``{"use_cache": False}``; for a CapturedModel, the captured
    ones). `align`: also find the smallest set of B's choices whose switch to A's makes
    the logits bit-identical (`prune`: see :mod:`castlab.torch._align`).

    >>> import torch, castlab.torch as ct
    >>> x = torch.linspace(-4, 4, 32).reshape(4, 8).bfloat16()
    >>> r = ct.compare_stacks(lambda g: torch.nn.functional.silu(g) * g, x,
    ...                       a="hf_eager", b="torch_compile", align=True)
    >>> r.alignment.sets
    [('policy',)]
    """
    t0 = time.perf_counter()
    sa, sb = _stacks.stack(a), _stacks.stack(b)
    ins = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if isinstance(model, CapturedModel):
        cm = model
        kw = dict(cm._example[1]) if kwargs is None else kwargs
    elif callable(model):
        kw = kwargs
        if kw is None and isinstance(model, torch.nn.Module) and hasattr(model, "config"):
            kw = {"use_cache": False}
        cm = capture(model, *ins, kwargs=kw)
    else:
        raise TypeError(f"compare_stacks: model must be a CapturedModel, a torch.nn.Module "
                        f"or a function, not {type(model).__name__}")
    flat = cm._flat_inputs(ins, kw)
    scorer = Scorer(cm, flat, labels)
    pa, pb = _stacks.plan(sa, cm), _stacks.plan(sb, cm)
    oa, ob = scorer.run(pa), scorer.run(pb)
    rows = node_rows(cm, oa.run, ob.run, scorer.ref_run)
    al = _align.align(scorer, sa, sb, oa, ob, prune=prune) if align else None
    return StackComparison(cm.name, sa, sb, scorer, oa, ob, rows, al,
                           time.perf_counter() - t0)


class StackComparison:
    """Result of :func:`compare_stacks`. ``tokens`` (numpy arrays over the scored
    tokens: ``index`` (position in the logits' leading dims), ``label``, ``lp_a``,
    ``lp_b``, ``lp_ref``, ``delta`` (lp_a - lp_b), ``kl`` (KL(A||B)), ``flip`` (top-1
    differs), ``err_a``/``err_b`` (|lp - lp_ref|)); ``summary`` (a dict); ``nodes`` and
    ``layers`` (rows: see ``_stack_metrics.node_rows``/``layer_rows``); ``first`` (the
    first differing node's row, or None); ``inert`` ({"a": [...], "b": [...]}: choices
    that do not apply, with why); ``alignment`` (or None); ``plot_layers()``,
    ``plot_logprob_hist()``; text and HTML."""

    def __init__(self, name: str, a: Any, b: Any, scorer: Scorer, oa: Any, ob: Any,
                 rows: list, alignment: Any, seconds: float):
        self.name, self.a, self.b = name, a, b
        self.label_source = scorer.label_source
        self.inert = {"a": list(oa.plan.inert), "b": list(ob.plan.inert)}
        idx = scorer.mask.nonzero().cpu().numpy()
        kl = scorer.kl(oa, ob)
        la, lb = oa.logits.double()[scorer.mask], ob.logits.double()[scorer.mask]
        lp_a, lp_b, lp_r = (t.cpu().numpy() for t in (oa.lp, ob.lp, scorer.ref_lp))
        self.tokens = {
            "index": idx, "label": scorer.labels[scorer.mask].cpu().numpy(),
            "lp_a": lp_a, "lp_b": lp_b, "lp_ref": lp_r, "delta": lp_a - lp_b,
            "kl": kl.cpu().numpy(), "flip": (la.argmax(-1) != lb.argmax(-1)).cpu().numpy(),
            "err_a": np.abs(lp_a - lp_r), "err_b": np.abs(lp_b - lp_r)}
        self.nodes = rows
        self.layers = layer_rows(rows)
        self.first = next((r for r in rows if r["differ"]), None)
        self.alignment = alignment
        self.seconds = seconds
        t = self.tokens
        n = len(t["delta"])
        diff = oa.logits != ob.logits
        self.summary = {
            "tokens": n, "logits_differ": int(diff.sum()), "logits": oa.logits.numel(),
            "max_abs_delta": float(np.abs(t["delta"]).max()) if n else 0.0,
            "mean_abs_delta": float(np.abs(t["delta"]).mean()) if n else 0.0,
            "mean_kl": float(t["kl"].mean()) if n else 0.0,
            "max_kl": float(t["kl"].max()) if n else 0.0, "flips": int(t["flip"].sum()),
            "mean_err_a": float(t["err_a"].mean()) if n else 0.0,
            "mean_err_b": float(t["err_b"].mean()) if n else 0.0,
            "a_closer": int((t["err_a"] < t["err_b"]).sum()),
            "b_closer": int((t["err_b"] < t["err_a"]).sum()),
            "ties": int((t["err_a"] == t["err_b"]).sum())}

    def closer(self) -> str:
        """Which stack's scored log-probabilities are closer to fp64, overall (mean |lp -
        lp_fp64|) and token by token."""
        s = self.summary
        ea, eb = s["mean_err_a"], s["mean_err_b"]
        who = ("neither (equal mean error)" if ea == eb else
               f"{self.a.name} (A)" if ea < eb else f"{self.b.name} (B)")
        return (f"closer to fp64: {who}; mean |logprob - fp64| A {_fmt_num(ea)}, B "
                f"{_fmt_num(eb)}; per token A closer at {s['a_closer']}, B at "
                f"{s['b_closer']}, tied at {s['ties']} of {s['tokens']}")

    def _lines(self) -> list:
        s = self.summary
        out = [f"compare_stacks on {self.name}: A = {self.a.name}, B = {self.b.name}; "
               f"{s['tokens']} tokens scored ({self.label_source}); log-probabilities: "
               "log_softmax in fp64 of each stack's logits",
               f"  logits differing: {s['logits_differ']:,} of {s['logits']:,}; "
               f"|logprob A - B| max {_fmt_num(s['max_abs_delta'])}, mean "
               f"{_fmt_num(s['mean_abs_delta'])}; KL(A||B) mean {_fmt_num(s['mean_kl'])}, "
               f"max {_fmt_num(s['max_kl'])}; top-1 flips {s['flips']}",
               "  " + self.closer()]
        f = self.first
        out.append("  the runs never differ" if f is None else
                   f"  first difference: {f['node']} ({f['op']}, {f['kind'] or '-'}, "
                   f"{f['module'] or '<top>'}): {f['differ']:,} of {f['total']:,} elements, "
                   f"max |A - B| {_fmt_num(f['max_abs'])}")
        for k in ("a", "b"):
            stk = self.a if k == "a" else self.b
            out += [f"  inert in {stk.name} ({k.upper()}): {fld}: {why}"
                    for fld, why in self.inert[k]]
        return out

    def _layer_table(self) -> tuple:
        heads = ["layer", "nodes", "differing", "first differing", "kind", "rel. diff A-B",
                 "A rel. err", "B rel. err"]
        rows = [[r["layer"], r["nodes"], r["differing"], r["first"] or "-",
                 r["first_kind"] or "-", r["rel_diff"], r["a_err"], r["b_err"]]
                for r in self.layers]
        return heads, rows

    def __str__(self) -> str:
        out = self._lines() + [_text_table(*self._layer_table())]
        if self.alignment is not None:
            out.append(str(self.alignment))
        return "\n".join(out)

    def __repr__(self) -> str:
        return (f"<castlab.torch.StackComparison {self.name}: {self.a.name} vs {self.b.name},"
                f" mean KL {_fmt_num(self.summary['mean_kl'])}>")

    def _repr_html_(self) -> str:
        import html

        h = ["<div>" + "<br>".join(html.escape(x) for x in self._lines()) + "</div>",
             _html_table(*self._layer_table(), caption="per layer")]
        if self.alignment is not None:
            al = self.alignment
            h.append("<div><b>alignment</b>: " + html.escape(al.summary()).replace("\n", "<br>")
                     + "</div>")
            if al.effects:
                h.append(_html_table(*al.table(), caption="per choice"))
        return "".join(h)

    def to_frame(self, what: str = "tokens") -> Any:
        """``tokens``, ``nodes`` or ``layers`` as a pandas DataFrame."""
        import pandas as pd

        if what == "tokens":
            t = dict(self.tokens)
            t["index"] = [tuple(i) for i in t["index"]]
            return pd.DataFrame(t)
        if what in ("nodes", "layers"):
            return pd.DataFrame(getattr(self, what))
        raise ValueError(f"to_frame: what must be 'tokens', 'nodes' or 'layers', not {what!r}")

    def plot_layers(self) -> Any:
        """Per layer (graph order), at each layer's last compared value: the relative RMS
        difference of A and B, and each one's relative error against fp64 (log scale);
        a matplotlib Figure (not shown)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 3.5))
        ax = fig.add_subplot()
        x = np.arange(len(self.layers))
        floor = 1e-18   # (zero on a log scale)
        for key, label in (("rel_diff", "A vs B"), ("a_err", f"A ({self.a.name}) vs fp64"),
                           ("b_err", f"B ({self.b.name}) vs fp64")):
            y = [max(r[key], floor) if r[key] is not None else np.nan for r in self.layers]
            ax.plot(x, y, marker="o", label=label)
        ax.set_yscale("log")
        ax.set_xticks(x, [r["layer"] for r in self.layers], rotation=45, ha="right",
                      fontsize=7)
        ax.set_ylabel("relative RMS")
        ax.set_title(f"{self.name}: per-layer drift")
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig

    def plot_logprob_hist(self, bins: int = 50) -> Any:
        """Histogram of the per-token log-probability difference A - B; a matplotlib
        Figure (not shown)."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6, 3.5))
        ax = fig.add_subplot()
        ax.hist(self.tokens["delta"], bins=bins)
        ax.set_xlabel(f"logprob {self.a.name} - logprob {self.b.name}")
        ax.set_ylabel("tokens")
        ax.set_title(f"{self.name}: {self.summary['tokens']} tokens ({self.label_source})",
                     fontsize=8)
        fig.tight_layout()
        return fig
