"""The trace listing: a traced graph rendered, Thunder style, from the lowering's record
of it under one policy, math and device (castlab._lower.Record, with its rounding
placement, castlab._rounding): every convert, fma contraction, PyTorch kernel quirk and
rounding it shows is one the lowering made. ``JitFunction.trace`` returns it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ._dtype import float32, float64
from ._graph import COMPARE, Node
from ._lower import Record
from ._optable import BACKWARD_KERNELS, REDUCE_OPS

_VIEW_OPS = ("slice", "select", "permute", "expand", "reshape", "unsqueeze", "squeeze")


def _arg_names(fn: Callable, n: int) -> list:
    import inspect

    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) >= n and len(set(params[:n])) == n:
        return params[:n]
    return ["x"] if n == 1 else [f"x{i}" for i in range(n)]


class Trace(str):
    """A trace listing (a str), shown in a fixed-width font in Jupyter."""

    def _repr_html_(self) -> str:
        """The listing as a monospace block (scrolling sideways rather than wrapping),
        with the node names in bold, the comments in grey, and the conversions that
        round (``convert(...)`` lines whose comment says round) highlighted.

        >>> tr = cl.jit(lambda x: cl.exp(x) * 2).trace(cl.ones(2, dtype=cl.bfloat16), policy="eager")
        >>> h = tr._repr_html_()
        >>> "castlab-round" in h and "<b>t0</b>" in h
        True
        """
        import html
        import re

        esc = html.escape
        out = []
        name_re = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*)( = )(.*)$")
        for line in str(self).split("\n"):
            if line.lstrip().startswith("#"):
                out.append(f"<span style='color:#6a737d'>{esc(line)}</span>")
                continue
            code, sep, comment = line.partition("  # ")
            m = name_re.match(code)
            if m:
                indent, name, eq, rhs = m.groups()
                body = f"{esc(indent)}<b>{esc(name)}</b>{esc(eq)}{esc(rhs)}"
            else:
                body = esc(code)
            if sep:
                body += f"<span style='color:#6a737d'>{esc(sep + comment)}</span>"
            rounds = (m is not None and m.group(4).startswith("convert(")
                      and "round" in comment.lower())
            if rounds:
                body = ("<span class='castlab-round' title='rounds to a lower precision' "
                        "style='background:#fff3cd;color:#8a4b00'>" + body + "</span>")
            out.append(body)
        return ("<div style='overflow-x:auto'><pre style='font-family:monospace;"
                "white-space:pre;margin:0'>" + "\n".join(out) + "</pre></div>")

    def __repr__(self) -> str:
        return str(self)


def _fmt_type(dt, shape) -> str:
    return f"{dt.short}[{', '.join(str(s) for s in shape)}]"


def _vop_args(node: Node) -> str:
    v = node.attrs["vop"]
    k = v[0]
    if k == "slice":
        _, d, a, b, s = v
        b = "" if b >= 2**62 else b
        return f"dim={d}, {a}:{b}" + (f":{s}" if s != 1 else "")
    if k == "select":
        return f"dim={v[1]}, index={v[2]}"
    if k in ("permute", "expand", "reshape"):
        return str(list(v[1]))
    return f"dim={v[1]}"


def _where(node: Node) -> str:
    """``file.py:LINE`` of the user code that recorded `node` (empty when unknown)."""
    w = node.where
    return f"{os.path.basename(w[0])}:{w[1]}" if w else ""


def format_trace(tr: Any, record: Record) -> str:
    """Render a traced graph (castlab._jit.Traced), Thunder style, from the lowering's
    record of it under one policy, math and device (``lower(...)[0].record``): every
    convert, fma contraction, PyTorch kernel quirk and rounding shown is one the lowering
    made."""
    return _Listing(tr, record).render()


class _Listing:
    """One listing being written. Names: graph node k is t{k} (the index that
    Policy(round_after=...) takes); a value widened or rounded to another dtype gets that
    dtype as a suffix (t2_bf16). ``rep``: each value's representation, ("st", dtype) in
    storage precision, ("cp", dtype) in compute."""

    def __init__(self, tr: Any, record: Record):
        self.tr = tr
        self.record = record
        self.policy = record.policy
        self.cuda = record.cuda
        self.placement = record.rounding  # register types of nodes no program computed, too
        self.names: dict = {}
        self.sub_names: dict = {}
        self.lines: list = []
        self.rep: dict = {}
        self.conv: dict = {}
        self.rounding = {"nearest": "round to nearest even", "toward_zero": "round toward zero",
                         "stochastic": f"stochastic rounding, seed={self.policy.seed}"
                         }[self.policy.rounding]

    def emit(self, lhs, rhs, comment="", where=""):
        s = f"  {lhs} = {rhs}"
        if comment:
            s = s.ljust(44) + "  # " + comment
        if where:
            s = (s + "  # " + where) if comment else (s.ljust(44) + "  # " + where)
        self.lines.append(s)

    def comp_dt(self, node) -> Any:
        d = self.record.of(node)
        compute = d.compute if d is not None else self.placement.of(node).compute
        if not node.dtype.is_floating_point and compute == "i64":
            return node.dtype  # integers and bools: exact in an int64 register
        return float64 if compute == "f64" else float32

    def operand(self, a: Node, cdt) -> str:
        if a.op == "scalar":
            return repr(a.value)
        nm = self.names[id(a)]
        _, dt = self.rep[id(a)]
        if dt is cdt:
            return nm
        key = (id(a), cdt.name)
        if key not in self.conv:
            t = f"{nm}_{cdt.short}"
            what = "widen, exact" if (dt.bits < cdt.bits) else "round to nearest even"
            self.emit(t, f"convert({nm}, {cdt.short})", what)
            self.conv[key] = t
        return self.conv[key]

    def round_note(self, d) -> str:
        return self.rounding + ("; done by the output store" if d.round_elided else "")

    def name(self, n: Node) -> str:
        """The listing's name of node n (t<index>, or t<index>_<k> inside an expansion)."""
        return self.sub_names.get(id(n), f"t{n.index}")

    def listed(self):
        """The graph's nodes, each kernel node (var, layer_norm) as the nodes the lowering
        expanded it into (named t<index>_<k>; the kernel node then names their result)."""
        for n in self.tr.nodes:
            sub = self.record.expansions.get(id(n))
            if not sub:
                yield n
                continue
            for k, m in enumerate(sub):
                self.sub_names[id(m)] = f"t{n.index}_{k}"
                yield m
            self.names[id(n)] = self.names[id(sub[-1])]
            self.rep[id(n)] = self.rep[id(sub[-1])]

    def render(self) -> str:
        self.header()
        phase = None
        for n in self.listed():
            ph = n.attrs.get("phase")
            if ph != phase and ph is not None:
                self.lines.append("  # " + ("forward (the activations the backward reads)"
                                            if ph == "forward"
                                            else "backward (vector-Jacobian product)"))
                phase = ph
            self.node(n, _where(n))
        self.returns()
        return "\n".join(self.lines)

    def header(self):
        tr, policy = self.tr, self.policy
        arg_decl: list = []
        arg_names = getattr(tr, "arg_names", None) or _arg_names(lambda: None, len(tr.inputs))
        for i, n in enumerate(tr.inputs):
            nm = arg_names[i]
            self.names[id(n)] = nm
            arg_decl.append(f"{nm}: {_fmt_type(n.dtype, n.shape)}")
        for i, n in enumerate(tr.captured_nodes):
            nm = f"c{i}"
            self.names[id(n)] = nm
            arg_decl.append(f"{nm}: {_fmt_type(n.dtype, n.shape)} (captured)")
        self.lines.append(f"# castlab trace: policy={policy.describe()}  "
                          f"math={self.record.math.name}"
                          f"  device={'cuda' if self.cuda else 'cpu'}")
        self.lines.append(f"def {tr.name}({', '.join(arg_decl)}):")
        for n in tr.inputs + tr.captured_nodes:
            self.rep[id(n)] = ("st", n.dtype)

    def node(self, n: Node, where: str):
        if n.op in _VIEW_OPS:
            self.view(n, where)
        elif n.op == "cat":
            self.cat(n, where)
        elif n.op in ("gather", "scatter_add"):
            self.index(n, where)
        elif n.op == "nll_reduce":
            self.nll(n, where)
        elif n.op == "astype":
            self.astype(n, where)
        else:
            self.op(n, where)

    def view(self, n: Node, where: str):
        names, rep = self.names, self.rep
        t = self.name(n)
        names[id(n)] = t
        rep[id(n)] = rep[id(n.inputs[0])]
        self.emit(t, f"{n.op}({names[id(n.inputs[0])]}, {_vop_args(n)})",
                  f"{_fmt_type(rep[id(n)][1] if rep[id(n)][0] == 'cp' else n.dtype, n.shape)}"
                  "  view", where)

    def cat(self, n: Node, where: str):
        names, rep = self.names, self.rep
        cdt = max((rep[id(p)][1] for p in n.inputs), key=lambda d: d.bits)
        parts = [self.operand(p, cdt) if rep[id(p)][1] is not cdt else names[id(p)]
                 for p in n.inputs]
        t = self.name(n)
        names[id(n)] = t
        kinds = {rep[id(p)][0] for p in n.inputs}
        rep[id(n)] = ("st", n.dtype) if kinds == {"st"} and cdt is n.dtype else ("cp", cdt)
        self.emit(t, f"cat([{', '.join(parts)}], dim={n.attrs['dim']})",
                  f"{_fmt_type(rep[id(n)][1], n.shape)}  data movement, exact", where)

    def index(self, n: Node, where: str):
        names, rep = self.names, self.rep
        x, ix = n.inputs
        t = self.name(n)
        names[id(n)] = t
        rep[id(n)] = rep[id(x)]
        extra = ", wrap=True" if n.attrs.get("wrap") else ""
        note = ("gathered, exact: each op before it computes only the gathered values"
                if n.op == "gather" else
                f"zeros with {names[id(x)]} added at the index, each row in order, "
                f"in {_fmt_type(rep[id(x)][1], n.shape)}")
        self.emit(t, f"{n.op}({names[id(x)]}, dim={n.attrs['dim']}, index={names[id(ix)]}"
                     f"{extra})",
                  f"{_fmt_type(rep[id(x)][1] if rep[id(x)][0] == 'cp' else n.dtype, n.shape)}  "
                  + note, where)

    def nll(self, n: Node, where: str):
        t = self.name(n)
        self.names[id(n)] = t
        self.rep[id(n)] = ("st", n.dtype)
        d = self.record.of(n)
        a = n.attrs
        args = ", ".join(self.names[id(m)] for m in n.inputs)
        self.emit(t, f"nll_{a['what']}({args}, reduction={a['reduction']!r}, "
                     f"ignore_index={a['ignore_index']})",
                  f"{_fmt_type(n.dtype, n.shape)}  "
                  + (d.description if d is not None and d.description else "expanded"), where)

    def astype(self, n: Node, where: str):
        d = self.record.of(n)
        cdt = self.comp_dt(n)
        t = self.name(n)
        src = self.operand(n.inputs[0], cdt)
        self.names[id(n)] = t
        tgt = d.round_to if d is not None else None
        if tgt is not None:
            what = "store" if n.attrs.get("store") else "astype"
            self.emit(t, f"convert({src}, {tgt.short})", f"{what}: {self.round_note(d)}", where)
            self.rep[id(n)] = ("st", tgt)
        else:
            self.emit(t, f"astype({src}, {n.dtype.short})",
                      ("kept exact (fp64 policy)" if self.policy.name == "fp64" else "no rounding")
                      + ("" if d is not None else "; not computed (unused)"), where)
            self.rep[id(n)] = ("cp", cdt)

    def notes(self, n: Node, d, out_dt) -> list:
        """The comment of an op's line: its type, then what the lowering decided."""
        note = [_fmt_type(out_dt, n.shape)]
        if d is None:
            note.append("not computed (unused)")
            return note
        if d.description:
            note.append(d.description)
        if d.fma_with is not None:
            note.append(f"fma-contracted with {self.names[id(d.fma_with)]}")
        if d.fma_into is not None:
            what = ("quotient as a*rcp(b) (div.full.f32, as ptxas expands it)"
                    if n.op == "div" else "product")
            note.append(f"{what} kept exact for the fma of t{d.fma_into.index}")
        if d.quirk:
            note.append(d.quirk)
        k = n.attrs.get("kernel")
        if k is not None:
            arith = BACKWARD_KERNELS[k].arith_for(self.cuda, n.dtype)
            kid = f"{k}#{n.attrs.get('kernel_id', 0)}"
            if n.attrs.get("kernel_inner") and arith == "opmath":
                note.append(f"in {kid} (one PyTorch kernel, not rounded)")
            else:
                note.append(f"{kid} " + ("result" if arith == "opmath" else
                                         "(PyTorch computes it in the storage type)"))
        return note

    def op(self, n: Node, where: str):
        d = self.record.of(n)
        cdt = self.comp_dt(n)
        t = self.name(n)
        args = [self.operand(a, cdt) for a in n.inputs]
        self.names[id(n)] = t
        note = self.notes(n, d, n.dtype if n.op in COMPARE else cdt)
        if n.op in REDUCE_OPS:
            args.append(f"dim={list(n.attrs['dims'])}")
            if n.attrs.get("keepdim"):
                args.append("keepdim=True")
        self.emit(t, f"{n.op}({', '.join(args)})", "  ".join(note), where)
        self.rep[id(n)] = ("st", n.dtype) if n.op in COMPARE else ("cp", cdt)
        if d is not None and d.round_to is not None:
            tgt = d.round_to
            r = f"{t}_{tgt.short}"
            self.emit(r, f"convert({t}, {tgt.short})", self.round_note(d))
            self.names[id(n)] = r
            self.rep[id(n)] = ("st", tgt)

    def returns(self):
        rets = []
        for n in self.tr.outputs:
            want = n.dtype
            if self.policy.output is not None and want.is_floating_point:
                want = self.policy.output
            kind, dt = self.rep[id(n)]
            nm = self.names[id(n)]
            if dt is not want:
                t = f"{nm}_{want.short}"
                self.emit(t, f"convert({nm}, {want.short})",
                          f"output: {self.rounding}" if want.bits < dt.bits
                          else "output: widen, exact")
                nm = t
            rets.append(nm)
        self.lines.append("  return " + ", ".join(rets))


__all__ = ["format_trace", "Trace"]
