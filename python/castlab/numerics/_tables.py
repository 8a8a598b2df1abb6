"""Plain-text and HTML tables for the results of compare, drift and explain."""

from __future__ import annotations

import html as _html
import math
from typing import Any

import numpy as np

# ================================================================ tables

def _fmt_num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == 0:
            return "0"
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        return f"{v:.4g}"
    return str(v)


# Text tables wider than this are made narrower: long headers wrap onto several lines,
# then the columns are split into blocks that each repeat the first column.
TEXT_WIDTH = 120


def _wrap_header(h: str, width: int) -> list:
    """`h` broken at spaces into lines of at most `width` characters (a longer word
    keeps its own line)."""
    lines: list = []
    for word in h.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def _text_block(heads: list, body: list) -> list:
    """One block of columns: `heads` is a list of header-line lists (bottom-aligned)."""
    ncol = len(heads)
    nh = max(len(h) for h in heads)
    heads = [[""] * (nh - len(h)) + h for h in heads]
    w = [max([len(x) for x in heads[i]] + [len(r[i]) for r in body]) for i in range(ncol)]

    def line(cells):
        return "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i])
                         for i, c in enumerate(cells)).rstrip()

    out = [line([heads[i][k] for i in range(ncol)]) for k in range(nh)]
    out.append("  ".join("-" * x for x in w))
    out += [line(r) for r in body]
    return out


def _text_table(headers: list, rows: list, width: int | None = None) -> str:
    """A plain-text table (first column left-aligned, the others right-aligned). A table
    wider than `width` (default :data:`TEXT_WIDTH`) wraps its long headers over several
    lines and, if still too wide, is split into blocks of columns, each repeating the
    first column, one under the other.

    >>> from castlab.numerics._tables import _text_table
    >>> print(_text_table(["name", "value"], [["a", 1.5], ["b", float("inf")]]))
    name  value
    ----  -----
    a       1.5
    b       inf
    """
    width = TEXT_WIDTH if width is None else width
    head = [str(h) for h in headers]
    body = [[c if isinstance(c, str) else _fmt_num(c) for c in r] for r in rows]
    data_w = [max([len(r[i]) for r in body], default=0) for i in range(len(head))]
    full = sum(max(len(h), d) for h, d in zip(head, data_w)) + 2 * (len(head) - 1)
    if full <= width or len(head) < 2:
        w = [max(len(h), d) for h, d in zip(head, data_w)]
        lines = ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))
                 for r in [head] + body]
        lines.insert(1, "  ".join("-" * x for x in w))
        return "\n".join(lines)
    heads = [[h] if i == 0 else _wrap_header(h, max(d, 8)) for i, (h, d) in
             enumerate(zip(head, data_w))]
    cw = [max([len(x) for x in h] + [d]) for h, d in zip(heads, data_w)]
    # Groups of columns (drift: "<combo> max ulp", "mean ulp", "rel RMSE", ... per
    # combination) stay together: a group starts at a header that is unique and is
    # followed by a header that repeats; the columns before the first group (node,
    # dtype) are repeated in every block.
    count = {h: head.count(h) for h in head}
    starts = [i for i in range(1, len(head) - 1) if count[head[i]] == 1 and count[head[i + 1]] > 1]
    key = list(range(starts[0])) if starts else [0]
    bounds = (starts or list(range(1, len(head)))) + [len(head)]
    units = [list(range(a, b)) for a, b in zip(bounds, bounds[1:])]
    base = sum(cw[i] for i in key) + 2 * (len(key) - 1)
    blocks, cur, used = [], [], base
    for u in units:
        uw = sum(2 + cw[i] for i in u)
        if cur and used + uw > width:
            blocks.append(cur)
            cur, used = [], base
        cur += u
        used += uw
    blocks.append(cur)
    out: list = []
    for k, cols in enumerate(blocks):
        if k:
            out.append("")
        idx = key + cols
        out += _text_block([heads[i] for i in idx], [[r[i] for i in idx] for r in body])
    return "\n".join(out)


def _html_table(headers: list, rows: list, caption: str = "") -> str:
    """An HTML table in a block that scrolls sideways when the table is wider than the
    notebook (rather than wrapping its cells).

    >>> from castlab.numerics._tables import _html_table
    >>> _html_table(["a"], [[1]]).startswith("<div style='overflow-x:auto")
    True
    """
    h = ["<div style='overflow-x:auto;max-width:100%'>"
         '<table style="border-collapse:collapse;font-family:monospace;white-space:nowrap">']
    if caption:
        h.append(f"<caption style='text-align:left'>{_html.escape(caption)}</caption>")
    h.append("<tr>" + "".join(f"<th style='padding:2px 8px;text-align:right'>{_html.escape(str(c))}</th>"
                              for c in headers) + "</tr>")
    for r in rows:
        h.append("<tr>" + "".join(
            f"<td style='padding:2px 8px;text-align:{'left' if i == 0 else 'right'}'>"
            f"{_html.escape(c if isinstance(c, str) else _fmt_num(c))}</td>"
            for i, c in enumerate(r)) + "</tr>")
    h.append("</table></div>")
    return "".join(h)
