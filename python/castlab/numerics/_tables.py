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
        if v == 0:
            return "0"
        if v == int(v) and abs(v) < 1e6:
            return str(int(v))
        return f"{v:.4g}"
    return str(v)


def _text_table(headers: list, rows: list) -> str:
    cells = [[str(h) for h in headers]] + [[c if isinstance(c, str) else _fmt_num(c) for c in r]
                                           for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for k, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
        if k == 0:
            lines.append("  ".join("-" * x for x in w))
    return "\n".join(lines)


def _html_table(headers: list, rows: list, caption: str = "") -> str:
    h = ['<table style="border-collapse:collapse;font-family:monospace">']
    if caption:
        h.append(f"<caption style='text-align:left'>{_html.escape(caption)}</caption>")
    h.append("<tr>" + "".join(f"<th style='padding:2px 8px;text-align:right'>{_html.escape(str(c))}</th>"
                              for c in headers) + "</tr>")
    for r in rows:
        h.append("<tr>" + "".join(
            f"<td style='padding:2px 8px;text-align:{'left' if i == 0 else 'right'}'>"
            f"{_html.escape(c if isinstance(c, str) else _fmt_num(c))}</td>"
            for i, c in enumerate(r)) + "</tr>")
    h.append("</table>")
    return "".join(h)
