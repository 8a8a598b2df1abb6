"""The drawing castlab.plot's charts share: figures (matplotlib, imported on first use),
the metrics' axes and scales, bars grouped in panels, their notes and legends."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from ._dtype import as_dtype


def _plt():
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        headless = (sys.platform.startswith("linux") and not os.environ.get("DISPLAY")
                    and not os.environ.get("WAYLAND_DISPLAY"))
        if headless and "ipykernel" not in sys.modules and not os.environ.get("MPLBACKEND"):
            matplotlib.use("Agg")

    from matplotlib.figure import Figure

    return Figure


def _new_figure(figsize):
    Figure = _plt()
    fig = Figure(figsize=figsize, layout="constrained")

    def _repr_png_():
        # Jupyter shows the returned Figure inline, whatever matplotlib backend is active
        # (these figures are not managed by pyplot).
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()

    fig._repr_png_ = _repr_png_
    return fig


def _legend_outside(ax, **kw):
    """The legend to the right of the axes (constrained layout makes room for it), so
    that it never covers data; nothing when there is nothing to label."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    return ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                     borderaxespad=0.0, fontsize=8, frameon=False, **kw)


def _note_handle(text: str):
    """A legend entry that is only text (a note, e.g. what an "inf" marker means)."""
    from matplotlib.patches import Patch

    return Patch(facecolor="none", edgecolor="none", label=text)


def _unit_roundoff(dt: Any) -> float | None:
    """The unit roundoff u = 2^-p of a floating format with p significand bits (the
    implicit bit included): 2^-8 bfloat16, 2^-11 float16, 2^-24 float32, 2^-53 float64,
    2^-4 float8_e4m3fn, 2^-3 float8_e5m2 (any castlab dtype name: fp16, bf16, ...);
    None for anything that is not a floating dtype.

    >>> import castlab.plot as cplot
    >>> cplot._unit_roundoff("bfloat16") == 2.0 ** -8, cplot._unit_roundoff("fp32") == 2.0 ** -24
    (True, True)
    """
    import ml_dtypes

    try:
        d = as_dtype(dt if not isinstance(dt, str) else dt.strip())
    except TypeError:
        return None
    if not d.is_floating_point:
        return None
    return float(ml_dtypes.finfo(d.numpy).eps) / 2.0


def _u_text(u: float) -> str:
    """u as a power of two, in matplotlib's mathtext: ``$2^{-8}$``."""
    return f"$2^{{{round(math.log2(u))}}}$"


# metric -> (what is plotted, unit): "share" a fraction where higher is better (logit
# axis: 90%, 99%, 99.9%, ... equally spaced), "fraction" one where lower is better,
# "ulp" ulps of the result's format, "u" a relative error divided by the unit roundoff
# of the result's format, "abs" an absolute error (in the values' own units)
_METRICS = {
    "correctly_rounded": ("correctly rounded share", "share"),
    "mismatch_vs_eager": ("fraction of elements that differ from eager", "fraction"),
    "max_ulp": ("max ulp error", "ulp"),
    "mean_ulp": ("mean ulp error", "ulp"),
    "max_ulp_at_scale": ("max ulp error at scale (ulps of the largest magnitude)", "ulp"),
    "rel_rmse": ("relative RMSE vs fp64", "u"),
    "max_rel_err": ("max relative error vs fp64", "u"),
    "rmse": ("RMSE vs fp64", "abs"),
    "max_abs_err": ("max absolute error vs fp64", "abs"),
}


#: the metrics of a kernel-library matrix (:func:`castlab.study.libraries`)
_LIBRARY_METRICS = {
    "correctly_rounded": ("correctly rounded share", "share"),
    "mismatch_vs_eager": ("fraction of elements that differ from Hugging Face eager",
                          "fraction"),
    "max_ulp_error": ("max ulp error", "ulp"),
    "max_ulp_error_at_scale": ("max ulp error at scale (ulps of the largest magnitude)",
                               "ulp"),
}


#: the study's plot files (the names README and docs link to): metric -> file name
STUDY_PLOTS = ("correctly_rounded", "rel_rmse")


#: the kernel-library matrix's plot files
LIBRARY_PLOTS = ("correctly_rounded", "max_ulp_error")


def _metric_axis_label(metric: str, unit: str, scale: str, specs: dict) -> str:
    what = specs[metric][0]
    s = {"u": f"{what}\nin units of u (the format's unit roundoff)",
         "ulp": f"{what} (ulps)",
         "share": f"{what}\n(90%, 99%, 99.9%... equally spaced)"}.get(unit, what)
    if scale == "log":
        s += " (log scale)"
    return s


def _better(unit: str) -> str:
    return "higher is better" if unit == "share" else "lower is better"


_LOGIT_FLOOR = 0.5  # a correctly rounded share axis starts at or below 50%


def _logit(p: float) -> float:
    return math.log10(p / (1.0 - p))


def _from_logit(v: float) -> float:
    return 1.0 / (1.0 + 10.0 ** (-v))


def _percent(p: float, _pos: Any = None) -> str:
    """Tick label of a share: 50%, 90%, 99%, 99.9%, 99.99%, ...; 10%, 1%, 0.1%, ..."""
    if not 0.0 < p < 1.0:
        return ""
    near = min(p, 1.0 - p)
    digits = max(0, round(-math.log10(near)) - 2)
    return f"{100.0 * p:.{digits}f}%"


def _pick_scale(unit: str, values: list) -> str:
    """The y scale of one panel: a logit axis for a share, else linear when the bars'
    finite positive values are within a factor of 20 of each other (so that 0.43 u and
    0.62 u look different) and a log axis when they span more."""
    if unit == "share":
        return "logit"
    pos = [v for v in values if math.isfinite(v) and v > 0]
    if not pos:
        return "linear"
    return "log" if max(pos) > 20.0 * min(pos) else "linear"


def _draw_bars(ax, bars: list, unit: str, *, scale: str | None = None,
               ref: float | None = None, ref_label: str | None = None) -> set:
    """Draw `bars` on `ax`: dicts with x, width, value (the bar's height; a mean over
    seeds), lo/hi (a whisker when they differ from value), color, gid (the bar's
    matplotlib gid, e.g. "bfloat16|swiglu|torch_eager/fused") and hatch. A finite value
    is one Rectangle of exactly that height from 0; a value the axis cannot show is
    written instead: "0" at the bottom of a log axis, "inf" (with an arrow) or "nan" at
    the top, a share of exactly 100% labelled on its bar (a logit axis never reaches 1).
    `scale`: "logit", "log" or "linear" (default: :func:`_pick_scale`); `ref`: a value
    the y range includes, drawn as a dotted line (0.5 ulp, 1 u) labelled `ref_label` for
    the axes' legend. Returns the kinds of marks used (for the legend's notes) and
    "scale:<the scale>"."""
    vals = [b["value"] for b in bars] + [b["lo"] for b in bars] + [b["hi"] for b in bars]
    scale = scale or _pick_scale(unit, vals)
    # the scale and limits first (autoscaling a logit axis to bars from 0 to 1 overflows)
    fin = [v for v in vals if math.isfinite(v)]
    if scale == "logit":
        ax.set_yscale("logit", nonpositive="clip")
        inner = [v for v in fin if 0.0 < v < 1.0]
        low = min([_logit(v) for v in inner] + [_logit(_LOGIT_FLOOR)]) - 0.5
        high = max([_logit(v) for v in inner if v > 0.5] + [2.0]) + 1.0
        ax.set_ylim(_from_logit(low), _from_logit(high))
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.yaxis.set_major_formatter(FuncFormatter(_percent))
        ax.yaxis.set_minor_formatter(NullFormatter())
    elif scale == "log":
        ax.set_yscale("log")
        pos = [v for v in fin if v > 0] + ([ref] if ref else [])
        if pos:
            # bars on a log axis start at the bottom: put it a decade or so below the
            # smallest bar, and leave room at the top for the inf/nan marks
            ax.set_ylim(10.0 ** math.floor(math.log10(min(pos) / 2)), max(pos) * 4)
        else:
            ax.set_ylim(1e-3, 1e3)
    else:
        top = max(fin + ([ref] if ref else []) + [0.0])
        ax.set_ylim(0.0, top * 1.18 if top > 0 else 1.0)
    marks = []  # (x, kind, colour)
    for b in bars:
        v, x, col = b["value"], b["x"], b["color"]
        if not math.isfinite(v):
            marks.append((x, "nan" if math.isnan(v) else "inf", col))
            continue
        kw = {"hatch": b["hatch"], "edgecolor": "white", "linewidth": 0} if b.get("hatch") \
            else {}
        (rect,) = ax.bar([x], [v], b["width"], color=col, **kw)
        rect.set_gid(b["gid"])
        if b["hi"] > b["lo"]:
            ax.errorbar([x], [v], yerr=[[v - b["lo"]], [b["hi"] - v]], fmt="none",
                        ecolor="black", elinewidth=0.8, capsize=2)
        if scale == "logit" and v >= 1.0:
            marks.append((x, "100%", col))
        elif v == 0:  # no visible bar on any axis
            marks.append((x, "0", col))
    if ref is not None:
        ax.axhline(ref, color="gray", linestyle=":", linewidth=1,
                   label=ref_label or "_nolegend_")
    tr = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for x, kind, col in marks:
        if kind == "0":
            ax.text(x, 0.01, "0", transform=tr, ha="center", va="bottom", fontsize=8,
                    color=col, fontweight="bold")
        elif kind == "100%":
            ax.text(x, 0.985, "100%", transform=tr, ha="center", va="top", fontsize=7,
                    color="white", fontweight="bold", rotation=90)
        elif kind == "inf":
            ax.annotate("inf", xy=(x, 1.0), xycoords=tr, xytext=(x, 0.86), textcoords=tr,
                        ha="center", va="top", fontsize=8, color=col, fontweight="bold",
                        arrowprops={"arrowstyle": "->", "color": col, "lw": 1.5})
        else:
            ax.text(x, 0.97, "nan", transform=tr, ha="center", va="top", fontsize=8,
                    color=col, fontweight="bold")
    return {k for _, k, _ in marks} | {f"scale:{scale}"}


def _mark_notes(kinds: set, unit: str) -> list:
    notes = []
    if "inf" in kinds:
        notes.append("inf \u2191: infinite, off the scale")
    if "nan" in kinds:
        notes.append("nan: not a number")
    if "0" in kinds:
        notes.append("0: exactly zero" + (" (not on a log axis)" if "scale:log" in kinds
                                          else ""))
    if "100%" in kinds:
        notes.append("100%: every element correctly rounded\n(a bar up to the top edge)")
    return notes


def _finish_legend(ax, members, notes):
    """Legend outside the axes: the members, then the other labelled artists (reference
    lines, shading), then the notes (text only)."""
    handles, labels = ax.get_legend_handles_labels()
    handles = members + handles + [_note_handle(t) for t in notes]
    labels = [h.get_label() for h in members] + labels + notes
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0, fontsize=8, frameon=False)


def _panels_legend(ax, members: list, notes: list):
    """One legend for every panel, to the right of the top-right panel `ax` (constrained
    layout makes room for it, and it stays clear of the figure's title)."""
    handles = members + [_note_handle(t) for t in notes]
    if not handles:
        return None
    return ax.legend(handles, [h.get_label() for h in handles], loc="upper left",
                     bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8,
                     frameon=False)


def _member_patch(color: str, label: str, hatch: str | None = None):
    from matplotlib.patches import Patch

    return Patch(facecolor=color, label=str(label), hatch=hatch,
                 edgecolor="white" if hatch else color)


_GAP = 0.7     # the space between two groups of bars, in bar slots


_WIDTH = 0.85  # a bar's width, in slots


def _member_colors(members: list) -> dict:
    """A colour per member, the same in every panel: matplotlib's ten, or tab20's twenty
    when there are more (repeating past that)."""
    if len(members) <= 10:
        return {m: f"C{k}" for k, m in enumerate(members)}
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return {m: cmap(k % 20) for k, m in enumerate(members)}


def _panel_layout(slots: list) -> tuple:
    """(nrows, ncols, figsize, width_ratios) for panels of `slots` bars each: side by
    side (widths in proportion to the bars, so every bar has the same width) when they
    fit, one above the other otherwise."""
    n = len(slots)
    legend_w = 2.8
    if n <= 4 and sum(slots) <= 30:
        widths = [0.34 * max(s, 4) + 1.2 for s in slots]
        return 1, n, (max(7.0, sum(widths) + legend_w), 4.8), widths
    width = max(7.0, 0.3 * max(slots) + 1.5 + legend_w)
    return n, 1, (min(width, 30.0), 2.9 * n + 1.2), None


def _panels(data: list, unit: str, metric: str, specs: dict, *, members: list,
            title: str, hatch_note: str | None = None):
    """A figure of one panel per format. `data`: [(panel title, u or None, [(group tick
    label, [(member, mean, lo, hi, hatch?)])])], only the members a group has, in the
    order of `members` (which fixes each member's colour across panels). Bars of a group
    are packed side by side, no slot left for a member the group lacks."""
    slots = [sum(len(ms) for _, ms in groups) for _, _, groups in data]
    nrows, ncols, figsize, ratios = _panel_layout(slots)
    fig = _new_figure(figsize)
    gs = fig.add_gridspec(nrows, ncols, width_ratios=ratios)
    colors = _member_colors(members)
    kinds: set = set()
    hatched = False
    axes: list = []
    first_scale = None
    for pi, (ptitle, u, groups) in enumerate(data):
        ax = fig.add_subplot(gs[pi // ncols, pi % ncols])
        axes.append(ax)
        bars, ticks, x = [], [], 0.0
        for glabel, ms in groups:
            for j, (m, v, lo, hi, hatch) in enumerate(ms):
                bars.append({"x": x + j, "width": _WIDTH, "value": v, "lo": lo, "hi": hi,
                             "color": colors[m], "hatch": "//" if hatch else None,
                             "gid": f"{ptitle}|{glabel.replace(chr(10), ' ')}|{m}"})
                hatched |= bool(hatch)
            ticks.append(x + (len(ms) - 1) / 2)
            x += len(ms) + _GAP
        ref = {"ulp": 0.5, "u": 1.0}.get(unit)
        k = _draw_bars(ax, bars, unit, ref=ref)
        scale = next(s for s in k if s.startswith("scale:"))[6:]
        kinds |= k
        ax.set_xlim(-_WIDTH / 2 - 0.2, x - _GAP - 1.0 + _WIDTH / 2 + 0.2)
        ax.set_xticks(ticks, [g for g, _ in groups], fontsize=8)
        ax.set_title(ptitle + (f"  (u = {_u_text(u)})" if u and unit == "u" else ""),
                     fontsize=10)
        if pi % ncols == 0 or scale != first_scale:  # a row says its unit once
            ax.set_ylabel(_metric_axis_label(metric, unit, scale, specs), fontsize=9)
        first_scale = scale if pi % ncols == 0 else first_scale
    handles = [_member_patch(colors[m], m) for m in members]
    notes = _mark_notes(kinds, unit)
    if unit == "ulp":
        notes.insert(0, "dotted line: 0.5 ulp (correct rounding)")
    elif unit == "u":
        notes.insert(0, "dotted line: 1 u (unit roundoff)")
    if hatched and hatch_note:
        handles.append(_member_patch("gray", hatch_note, hatch="//"))
    _panels_legend(axes[ncols - 1], handles, notes)
    fig.suptitle(title, fontsize=10)
    return fig
