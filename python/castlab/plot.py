"""Plots for castlab's numerics toolkit (matplotlib, imported on first use; the Agg
backend is selected when there is no display). Every function returns a
``matplotlib.figure.Figure``, which Jupyter renders inline.

Errors span many decades (a fused result is within 0.5 ulp, an eager one can be
thousands of ulps off), so the error axes are logarithmic where the values span more
than a factor of 20; a value that an axis cannot show is written on the plot instead of
vanishing: ``0`` at the bottom edge, ``inf``/``nan`` with an arrow at the top edge (and
a note in the legend). Legends sit outside the data area.

The study and library charts (:func:`study_chart`, :func:`library_chart`, and
:func:`write_study_plots` / :func:`write_library_plots` that ``castlab study`` calls)
draw one panel per dtype, relative errors in units of that format's unit roundoff u
(2^-8 bfloat16, 2^-11 float16, 2^-24 float32, 2^-53 float64, 2^-4 / 2^-3 fp8), the
correctly rounded share on a logit axis (90%, 99%, 99.9%... equally spaced), only the
bars that ran (no empty slots), and say in the title what ran where (device, GPU, shapes).

>>> import castlab as cl, castlab.numerics as nm, castlab.plot as cplot
>>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
>>> x = cl.randn(64, 64, seed=0, dtype=cl.bfloat16)
>>> c = nm.compare({"eager": sw.run(x, policy="eager"), "fused": sw(x)}, ref=sw.run(x, policy="fp64"))
>>> fig = cplot.ulp_histogram(c)
>>> fig.axes[0].get_xscale()
'log'
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import numpy as np

from . import cuda as _cuda
from ._dtype import as_dtype
from .numerics import Comparison, Drift, compare, ulp

__all__ = ["ulp_histogram", "error_vs_magnitude", "drift_chart", "study_chart",
           "write_study_plots", "library_chart", "write_library_plots"]


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


# ------------------------------------------------------------------ ulp histogram

_HIST_FLOOR = 1e-3  # ulps: smaller errors (exact results included) share the first bin


def ulp_histogram(*results: Any, ref: Any = None, names: Any = None, bins: int = 40,
                  log: bool = True):
    """Histogram of the ulp error against the reference, one series per result, with
    log-spaced bins on a log x axis (so both the bulk below 0.5 ulp and a tail of
    thousands of ulps are visible). Errors below 1e-3 ulp, exact results included, are
    counted in the first bin; infinite/NaN errors are counted in the legend. `log`: log
    y axis (element counts).

    Takes a :class:`castlab.numerics.Comparison` made with a reference, or results plus
    ``ref=`` (passed to :func:`castlab.numerics.compare`).

    >>> fig = ulp_histogram(y_eager, y_fused, ref=y_ref, names=["eager", "fused"])  # doctest: +SKIP
    """
    if len(results) == 1 and isinstance(results[0], Comparison):
        c = results[0]
    else:
        if ref is None:
            raise ValueError("ulp_histogram needs a reference: pass ref= or a Comparison "
                             "made with ref=")
        c = compare(*results, ref=ref, names=names)
    if c.ref_values is None:
        raise ValueError("this Comparison has no reference; make it with compare(..., ref=...)")
    fig = _new_figure((7.2, 4.0))
    ax = fig.add_subplot()
    errs = {n: np.asarray(e, dtype=np.float64).reshape(-1)
            for n, e in c.ulp_errors.items() if e is not None}
    finite = {n: e[np.isfinite(e)] for n, e in errs.items()}
    hi = max((float(e.max()) for e in finite.values() if e.size), default=1.0)
    hi = max(hi, 1.0) * 1.0001
    edges = np.geomspace(_HIST_FLOOR, hi, max(int(bins), 1) + 1)
    off = []  # (count, colour): infinite errors, marked at the right edge
    for k, (n, e) in enumerate(errs.items()):
        f = finite[n]
        label = n
        bad = int(e.size - f.size)
        col = f"C{k % 10}"
        if bad:
            n_inf = int(np.isinf(e).sum())
            parts = ([f"{n_inf} inf"] if n_inf else []) + (
                [f"{bad - n_inf} nan"] if bad - n_inf else [])
            label += f" ({' + '.join(parts)}: not in the bins)"
            if n_inf:
                off.append((n_inf, col))
        ax.hist(np.clip(f, _HIST_FLOOR, None), bins=edges, histtype="step", linewidth=1.5,
                label=label, color=col)
    for j, (cnt, col) in enumerate(off):
        ax.annotate(f"{cnt} inf", xy=(1.0, 0.9 - 0.08 * j), xycoords="axes fraction",
                    xytext=(0.86, 0.9 - 0.08 * j), textcoords="axes fraction", ha="right",
                    va="center", fontsize=8, color=col, fontweight="bold",
                    arrowprops={"arrowstyle": "->", "color": col, "lw": 1.5})
    ax.axvline(0.5, color="gray", linestyle=":", linewidth=1,
               label="0.5 ulp (correct rounding)")
    ax.set_xscale("log")
    if log:
        ax.set_yscale("log")
    ax.set_xlim(_HIST_FLOOR, hi)
    ax.set_xlabel(f"|error| vs {c.ref_dtype.name} reference, in ulps of the result's dtype "
                  f"(log scale)\nerrors below {_HIST_FLOOR:g} ulp, exact ones included, are "
                  "counted in the first bin", fontsize=9)
    ax.set_ylabel("elements per bin" + (" (log scale)" if log else ""))
    ax.set_title("ULP error per result")
    _legend_outside(ax)
    return fig


# ------------------------------------------------------------------ error vs magnitude

def error_vs_magnitude(result: Any, ref: Any, *, name: str | None = None, ulp_lines: bool = True,
                       max_points: int = 200_000, seed: int = 0):
    """Scatter of |result - ref| against |ref| (log-log), with the format's 0.5-ulp and
    1-ulp lines; `result` may be one tensor or a dict ``{name: tensor}``. Exact matches
    (and non-finite errors, counted in the legend) cannot sit on log axes and are not
    drawn.

    >>> fig = error_vs_magnitude({"eager": y_eager, "fused": y_fused}, y_ref)  # doctest: +SKIP
    """
    items = result.items() if isinstance(result, dict) else [(name or "result", result)]
    c = compare(*[v for _, v in items], ref=ref, names=[k for k, _ in items])
    r = np.abs(c.ref_values).reshape(-1)
    fig = _new_figure((7.4, 4.2))
    ax = fig.add_subplot()
    rng = np.random.default_rng(seed)
    for k, v in c.values.items():
        with np.errstate(invalid="ignore"):
            e = np.abs(v.reshape(-1) - c.ref_values.reshape(-1))
        keep = (r > 0) & (e > 0) & np.isfinite(e) & np.isfinite(r)
        bad = int((~np.isfinite(e)).sum())
        idx = np.flatnonzero(keep)
        if idx.size > max_points:
            idx = rng.choice(idx, max_points, replace=False)
        label = k + (f" ({bad} inf/nan errors not shown)" if bad else "")
        ax.scatter(r[idx], e[idx], s=3, alpha=0.5, label=label, rasterized=True)
    if ulp_lines and r.size:
        pos = r[(r > 0) & np.isfinite(r)]
        if pos.size:
            xs = np.geomspace(pos.min(), pos.max(), 400)
            u = ulp(xs, c[0]["dtype"]).numpy()  # ulps of the first result's dtype
            ax.plot(xs, 0.5 * u, color="gray", linestyle=":", linewidth=1, label="0.5 ulp")
            ax.plot(xs, u, color="gray", linestyle="--", linewidth=1, label="1 ulp")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("|reference| (log scale)")
    ax.set_ylabel("|result - reference| (log scale)")
    ax.set_title("error vs magnitude (exact matches not shown)")
    _legend_outside(ax, markerscale=4)
    return fig


# ------------------------------------------------------------------ units

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


# ------------------------------------------------------------------ bars

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


# ------------------------------------------------------------------ drift chart

def drift_chart(drift_result: Any, *, metric: str = "max_ulp", device: str | None = None,
                shape: str | None = None):
    """Per-node error against fp64 for each policy/math combination (grouped bars, one
    group per node in trace order), from :func:`castlab.numerics.drift`. `metric`:
    "max_ulp" or "mean_ulp" (ulps of each node's format, log axis, 0.5 ulp line),
    "rel_rmse" (in units of each node's unit roundoff u, log axis, 1 u line) or
    "correctly_rounded" (the correctly rounded share, on a logit axis where 90%, 99%,
    99.9%... are equally spaced, so that 99.998% and 100% look different). The node
    where the drift starts is shaded (the first divergent node, or the first node after
    it that the chart shows with an error). `device`, `shape`: said in the title.

    >>> fig = drift_chart(nm.drift(swiglu, (x,)))  # doctest: +SKIP
    """
    if not isinstance(drift_result, Drift):
        raise TypeError(f"drift_chart takes the result of castlab.numerics.drift(), got "
                        f"{type(drift_result).__name__}")
    if metric not in ("max_ulp", "mean_ulp", "rel_rmse", "correctly_rounded"):
        raise ValueError(f"unknown metric {metric!r}")
    d = drift_result
    nodes = d.node_labels
    combos = d.combos
    unit = _METRICS[metric][1]

    def plotted(r) -> float | None:
        v = r[metric]
        if v is None:
            return None
        v = float(v)
        if unit == "u":
            u = _unit_roundoff(r.get("dtype"))
            return None if u is None else v / u
        return v

    val = {(r["node"], r["combo"]): plotted(r) for r in d.rows}
    fig = _new_figure((max(8.0, 1.2 * len(nodes) + 4.0), 4.4))
    ax = fig.add_subplot()
    colors = [f"C{k % 10}" for k in range(len(combos))]
    width = 0.8 / max(len(combos), 1)
    bars = []
    for gi, n in enumerate(nodes):
        present = [(k, val.get((n, c))) for k, c in enumerate(combos)]
        present = [(k, v) for k, v in present if v is not None]
        for j, (k, v) in enumerate(present):
            bars.append({"x": gi + (j - (len(present) - 1) / 2) * width, "width": width,
                         "value": v, "lo": v, "hi": v, "color": colors[k],
                         "gid": f"{n}|{combos[k]}", "hatch": None})
    ref = {"ulp": 0.5, "u": 1.0}.get(unit)
    kinds = _draw_bars(ax, bars, unit, scale="logit" if unit == "share" else "log", ref=ref,
                       ref_label="0.5 ulp" if unit == "ulp" else "1 u (unit roundoff)")
    ax.set_xlim(-0.6, len(nodes) - 0.4)
    ax.set_xticks(np.arange(len(nodes)), nodes, rotation=20, ha="right", fontsize=8)
    ylabel = _metric_axis_label(metric, unit, "log" if unit != "share" else "logit", _METRICS)
    if unit == "u":
        ylabel = ylabel.replace("the format's", "each node's format's")
    ax.set_ylabel(ylabel, fontsize=9)
    fd = d.first_divergence
    if fd is not None and fd.label in nodes:
        start = nodes.index(fd.label)
        # shade where the chart shows an error: the divergent node, or the first node
        # after it with a nonzero (or non-finite) plotted error
        for i in range(start, len(nodes)):
            vs = [val.get((nodes[i], c)) for c in combos]
            if any(v is not None and (v != 1 if unit == "share" else v != 0) for v in vs):
                text = "drift starts" if i == start else \
                    f"first nonzero error\n(drift starts at {fd.label})"
                ax.axvspan(i - 0.45, i + 0.45, color="orange", alpha=0.15, label=text)
                break
    dts = list(dict.fromkeys(str(r.get("dtype")) for r in d.rows if r.get("dtype")))
    where = [f"device {device}"] if device else []
    where += [f"shape {shape}"] if shape else []
    where += [", ".join(dts)] if dts else []
    ax.set_title(f"{d.fn_name}: {_METRICS[metric][0]} per node ({_better(unit)})"
                 + ("\n" + "; ".join(where) if where else ""), fontsize=10)
    members = [_member_patch(colors[k], c) for k, c in enumerate(combos)]
    _finish_legend(ax, members, _mark_notes(kinds, unit))
    return fig


def _member_patch(color: str, label: str, hatch: str | None = None):
    from matplotlib.patches import Patch

    return Patch(facecolor=color, label=str(label), hatch=hatch,
                 edgecolor="white" if hatch else color)


# ------------------------------------------------------------------ panels per dtype

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


# ------------------------------------------------------------------ what ran where

def _find_gpu_name(obj: Any, index: int, depth: int = 0) -> str | None:
    """A GPU name in a run record (summary.json, run.json, ``castlab.cuda.info()``): a
    "gpu_name" or "gpu" string, or the name of device `index` in a "devices" list."""
    if depth > 4:
        return None
    if isinstance(obj, dict):
        for k in ("gpu_name", "gpu"):
            if isinstance(obj.get(k), str) and obj[k]:
                return obj[k]
            if isinstance(obj.get(k), dict) and isinstance(obj[k].get("name"), str):
                return obj[k]["name"]
        devs = obj.get("devices") or obj.get("gpus")
        if isinstance(devs, list):
            named = [d for d in devs if isinstance(d, dict) and isinstance(d.get("name"), str)]
            for dv in named:
                if dv.get("index") == index:
                    return dv["name"]
            if named:
                return named[min(index, len(named) - 1)]["name"]
        for v in obj.values():
            if isinstance(v, (dict, list)):
                got = _find_gpu_name(v, index, depth + 1)
                if got:
                    return got
    elif isinstance(obj, list):
        for v in obj:
            got = _find_gpu_name(v, index, depth + 1)
            if got:
                return got
    return None


def _cuda_index(device: str) -> int:
    tail = device.partition(":")[2]
    return int(tail) if tail.isdigit() else 0


def _gpu_for(df, device: str | None, gpu_name: str | None, run: Any,
             ask_cuda: bool = False) -> str | None:
    """The name of the GPU a CUDA `device` is: `gpu_name`, else the rows' gpu_name
    column, ``df.attrs`` or the run record `run` (a loaded run.json or summary.json), and
    with `ask_cuda` ``castlab.cuda.info()`` (this process's GPUs: for plots written right
    after the run); None when unknown or `device` is not a GPU."""
    if gpu_name is not None or not device or "cuda" not in device:
        return gpu_name
    if "gpu_name" in df.columns:
        names = list(dict.fromkeys(str(v) for v in df["gpu_name"].dropna()))
        if names:
            return ", ".join(names)
    idx = _cuda_index(device)
    name = _find_gpu_name(dict(df.attrs), idx) or (
        _find_gpu_name(run, idx) if run is not None else None)
    if name is None and ask_cuda:
        try:
            if _cuda.is_available():
                name = _find_gpu_name(_cuda.info(), idx)
        except Exception:  # noqa: BLE001  (a name in a title is not worth failing for)
            name = None
    return name


def _device_of(df, device: str | None) -> str | None:
    """`device`, else the rows' device column ("cpu", "cuda:0", ...)."""
    if device is None and "device" in df.columns:
        devs = list(dict.fromkeys(str(v) for v in df["device"].dropna()))
        device = ", ".join(devs) if devs else None
    return device


def _where(df, device: str | None, gpu_name: str | None, run: Any) -> str:
    """"device cpu" or "device cuda:0 (NVIDIA H200)" (see :func:`_gpu_for`)."""
    device = _device_of(df, device)
    if device is None:
        return "device not recorded"
    name = _gpu_for(df, device, gpu_name, run)
    return f"device {device}" + (f" ({name})" if name else "")


def _shapes_text(df) -> str:
    """The shapes of a study's chains: "swiglu 256x512, rope 1x2x128x64"."""
    if "shape" not in df.columns:
        return ""
    parts = []
    for chain, g in df.groupby("chain", sort=False):
        shapes = list(dict.fromkeys(str(s) for s in g["shape"]))
        parts.append(f"{chain} " + (" / ".join(shapes) if len(shapes) <= 3
                                    else f"{len(shapes)} shapes (see the groups)"))
    return "shape " + ", ".join(parts) if parts else ""


def _varying_keys(df, keys=("shape", "input", "scale")) -> list:
    """The cell keys (of `keys`) that take more than one value for one chain."""
    return [k for k in keys if k in df.columns
            and (df.groupby("chain", sort=False)[k].agg(lambda c: c.astype(str).nunique())
                 > 1).any()]


def _stats(values: list) -> tuple:
    """(mean, min, max) of the finite values (a bar and its whisker), or (inf or nan,)*3
    when none is finite; and how many were not finite."""
    a = np.asarray(values, dtype=np.float64)
    fin = a[np.isfinite(a)]
    bad = int(a.size - fin.size)
    if fin.size == 0:
        v = math.inf if np.isinf(a).any() else math.nan
        return v, v, v, bad
    m = float(fin[0]) if fin.size == 1 else float(fin.mean())
    return m, float(fin.min()), float(fin.max()), bad


# ------------------------------------------------------------------ study chart

def _study_panels(df, metric: str) -> tuple:
    """The data of :func:`_panels` for a study DataFrame, its members, the number of
    seeds and of non-finite seed values left out of the means."""
    unit = _METRICS[metric][1]
    df = df.copy()
    rnd = df["rounding"] if "rounding" in df.columns else None
    df["_label"] = df["math"].astype(str) + "/" + df["policy"].astype(str) + (
        rnd.map(lambda r: "" if r == "nearest" else f"/{r}") if rnd is not None else "")
    measured = df["output_dtype"] if "output_dtype" in df.columns else df["dtype"]
    df["_fmt"] = measured.astype(str)
    df["_panel"] = [str(d) if str(d) == f else f"{d} (output {f})"
                    for d, f in zip(df["dtype"], df["_fmt"])]
    vary = _varying_keys(df)
    grad = "pass" in df.columns
    gkeys = ["chain"] + vary + (["pass", "output"] if grad else [])
    members = list(dict.fromkeys(df["_label"]))
    nseeds = df["seed"].astype(str).nunique() if "seed" in df.columns else 1
    data, left_out = [], 0
    for panel, pg in df.groupby("_panel", sort=False):
        u = _unit_roundoff(pg["_fmt"].iloc[0])
        groups = []
        for key, g in pg.groupby(gkeys, sort=False):
            key = key if isinstance(key, tuple) else (key,)
            kd = dict(zip(gkeys, key))
            label = str(kd["chain"]) + (f"\n{kd['output']}" if kd.get("pass") == "backward"
                                        else "") + "".join(f"\n{kd[k]}" for k in vary)
            ms = []
            for m in members:
                vs = g.loc[g["_label"] == m, metric]
                if not len(vs):
                    continue  # not run here: no bar, no slot
                vs = [math.nan if v is None else float(v) for v in vs]
                if unit == "u":
                    vs = [v / u if u else math.nan for v in vs]
                mean, lo, hi, bad = _stats(vs)
                left_out += bad if len(vs) > bad else 0
                ms.append((m, mean, lo, hi, False))
            if ms:
                groups.append((label, ms))
        data.append((panel, u, groups))
    return data, members, nseeds, left_out


def study_chart(df: Any, metric: str = "correctly_rounded", *, title: str | None = None,
                device: str | None = None, gpu_name: str | None = None, run: Any = None):
    """Bars of one metric of a :func:`castlab.study.run` DataFrame: one panel per dtype
    (the format the results are measured in), one group per case in it (chain; shape,
    input or scale when they vary; the gradient output with ``grad=True``), one bar per
    math/policy(/rounding) that ran there, packed (no empty slot for one that did not).
    With several seeds a bar is the mean and its whisker spans min to max.

    Units: ``correctly_rounded`` is the correctly rounded share on a logit axis (90%,
    99%, 99.9%... equally spaced); ``rel_rmse`` and ``max_rel_err`` are in units of the
    panel's unit roundoff u (2^-8 bfloat16, 2^-11 float16, 2^-24 float32, ...); ulp
    metrics in ulps with the 0.5 ulp line. A panel's axis is linear when its values are
    within a factor of 20 of each other, logarithmic otherwise.

    The title says what ran where: `device` (default: the rows' device column) with the
    GPU's name (`gpu_name`, or found in the rows, ``df.attrs`` or the run record `run`,
    e.g. a loaded run.json or summary.json) and the chains' shapes; `title` replaces the
    first line. Returns the Figure; each bar's gid is "panel|group|member".

    >>> import castlab as cl, castlab.plot as cplot
    >>> df = cl.study.run(chains=["swiglu"], dtypes=["bfloat16"], quick=True)
    >>> fig = cplot.study_chart(df, "rel_rmse")
    >>> [ax.get_title() for ax in fig.axes]
    ['bfloat16  (u = $2^{-8}$)']
    """
    if metric not in _METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: " + ", ".join(_METRICS))
    if metric not in df.columns:
        raise ValueError(f"the DataFrame has no column {metric!r}")
    if not len(df):
        raise ValueError("the DataFrame has no rows to plot")
    what, unit = _METRICS[metric]
    data, members, nseeds, left_out = _study_panels(df, metric)
    line1 = title or (f"{what}" + (" vs fp64" if unit in ("share", "ulp") else "")
                      + f" ({_better(unit)})")
    line2 = [_where(df, device, gpu_name, run)]
    shapes = _shapes_text(df)
    if shapes:
        line2.append(shapes)
    if "input" in df.columns and df["input"].astype(str).nunique() == 1:
        line2.append(f"input {df['input'].iloc[0]}")
    if nseeds > 1:
        line2.append(f"mean of {nseeds} seeds, whiskers min-max")
    if left_out:
        line2.append(f"{left_out} non-finite seed value(s) left out of the means")
    return _panels(data, unit, metric, _METRICS, members=members,
                   title=line1 + "\n" + "; ".join(line2))


def _save(fig, path: str, dpi: int) -> str:
    fig.savefig(path, dpi=dpi)
    return path


def write_study_plots(df: Any, out: str, *, metrics: Any = STUDY_PLOTS,
                      device: str | None = None, gpu_name: str | None = None,
                      run: Any = None, dpi: int = 110) -> list:
    """Write :func:`study_chart` of each metric to ``out/<metric>.png`` (by default
    correctly_rounded.png and rel_rmse.png, the files ``castlab study`` writes) and
    return their paths; nothing (``[]``) when matplotlib is not installed or `df` has no
    rows. A CUDA GPU's name not given nor recorded is asked of ``castlab.cuda`` (these
    files are written right after the run, in its process).

    >>> import castlab as cl, castlab.plot as cplot, tempfile, os
    >>> df = cl.study.run(chains=["swiglu"], dtypes=["bfloat16"], quick=True)
    >>> d = tempfile.mkdtemp()
    >>> [os.path.basename(p) for p in cplot.write_study_plots(df, d)]
    ['correctly_rounded.png', 'rel_rmse.png']
    """
    return _write_charts(study_chart, df, out, metrics, device, gpu_name, run, dpi)


# ------------------------------------------------------------------ library matrix

def _library_size(df) -> int | None:
    size = df.attrs.get("size") if hasattr(df, "attrs") else None
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    fwd = df[df["op"].isin(["swiglu", "rope", "rope_interleaved"])] if "op" in df.columns \
        else df.iloc[:0]
    if "elements" in df.columns and len(fwd):
        return int(fwd["elements"].max())
    return None


def _library_shapes_text(df) -> str:
    """The inputs of a library matrix: "swiglu 1024x1024, rope 1x8x1024x128 (Qwen2
    shapes, 1,048,576 elements per input)", as :func:`castlab.study.library_inputs`
    makes them."""
    size = _library_size(df)
    if size is None:
        return ""
    st = sys.modules.get("castlab.study")
    row = getattr(st, "_ROW", 1024)
    dim = getattr(st, "_QWEN2_DIM", 128)
    seq = min(getattr(st, "_SEQ", 1024), max(size // dim, 1))
    fams = list(dict.fromkeys(str(op).removesuffix("_backward").removesuffix("_interleaved")
                              for op in df["op"]))
    shp = {"swiglu": f"swiglu {size // row}x{row}",
           "rope": f"rope 1x{size // (seq * dim)}x{seq}x{dim}"}
    parts = [shp[f] for f in fams if f in shp]
    return "shape " + ", ".join(parts) + f" (Qwen2 shapes, {size:,} elements per input)"


def _library_panels(df, metric: str) -> tuple:
    members = list(dict.fromkeys(df["library"].astype(str)))
    data = []
    for dt, pg in df.groupby("dtype", sort=False):
        groups = []
        for op, g in pg.groupby("op", sort=False):
            ms = []
            for m in members:
                r = g[g["library"].astype(str) == m]
                if not len(r):
                    continue  # the library has no kernel for this op: no bar, no slot
                v = r[metric].iloc[0]
                v = math.nan if v is None else float(v)
                same = bool(r["identical_to_eager"].iloc[0]) if "identical_to_eager" in r \
                    else False
                ms.append((m, v, v, v, same and m != "torch_eager"))
            if ms:
                groups.append((str(op).replace("_", "\n"), ms))
        data.append((str(dt), _unit_roundoff(dt), groups))
    return data, members


def library_chart(df: Any, metric: str = "correctly_rounded", *, title: str | None = None,
                  device: str | None = None, gpu_name: str | None = None, run: Any = None):
    """Bars of one metric of the kernel-library matrix (:func:`castlab.study.libraries`,
    ``castlab study --math ...``): one panel per dtype, one group per op, one bar per
    library that has a kernel for that op (packed: no empty slot for one that lacks it),
    hatched when bit-identical to Hugging Face eager (``torch_eager``). `metric`:
    "correctly_rounded" (the correctly rounded share, logit axis), "mismatch_vs_eager",
    "max_ulp_error" or "max_ulp_error_at_scale" (ulps, 0.5 ulp line). The title says the
    device (with the GPU's name when known: `gpu_name`, ``df.attrs``, the run record
    `run`) and the input shapes. Returns the Figure; each bar's gid is
    "dtype|op|library".

    >>> import castlab as cl, castlab.plot as cplot
    >>> df = cl.study.libraries(["torch_eager", "flash_attn"], ops=["rope"], size=4096,
    ...                         device="cpu")
    >>> fig = cplot.library_chart(df)
    >>> [ax.get_title() for ax in fig.axes]
    ['bfloat16', 'float16']
    """
    if metric not in _LIBRARY_METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: " + ", ".join(_LIBRARY_METRICS))
    for c in ("library", "op", "dtype", metric):
        if c not in df.columns:
            raise ValueError(f"the DataFrame has no column {c!r} (a castlab.study.libraries "
                             "result has)")
    if not len(df):
        raise ValueError("the DataFrame has no rows to plot")
    what, unit = _LIBRARY_METRICS[metric]
    data, members = _library_panels(df, metric)
    line1 = title or (f"kernel libraries: {what}"
                      + (" vs each library's formula in fp64" if unit in ("share", "ulp")
                         else "") + f" ({_better(unit)})")
    line2 = [_where(df, device, gpu_name, run)]
    shapes = _library_shapes_text(df)
    if shapes:
        line2.append(shapes)
    return _panels(data, unit, metric, _LIBRARY_METRICS, members=members,
                   title=line1 + "\n" + "; ".join(line2),
                   hatch_note="hatched: bit-identical to torch_eager")


def write_library_plots(df: Any, out: str, *, metrics: Any = LIBRARY_PLOTS,
                        device: str | None = None, gpu_name: str | None = None,
                        run: Any = None, dpi: int = 110) -> list:
    """Write :func:`library_chart` of each metric to ``out/<metric>.png`` (by default
    correctly_rounded.png and max_ulp_error.png) and return their paths; ``[]`` when
    matplotlib is not installed or `df` has no rows. A CUDA GPU's name not given nor
    recorded is asked of ``castlab.cuda`` (written right after the run, in its process).

    >>> import castlab as cl, castlab.plot as cplot, tempfile, os
    >>> df = cl.study.libraries(["torch_eager", "liger"], ops=["swiglu"], size=4096,
    ...                         device="cpu")
    >>> [os.path.basename(p) for p in cplot.write_library_plots(df, tempfile.mkdtemp())]
    ['correctly_rounded.png', 'max_ulp_error.png']
    """
    return _write_charts(library_chart, df, out, metrics, device, gpu_name, run, dpi)



def _write_charts(chart, df, out: str, metrics, device, gpu_name, run, dpi: int) -> list[str]:
    """`chart(df, metric, ...)` saved as out/<metric>.png for each metric df has; [] without
    matplotlib or rows."""
    try:
        _plt()
    except ImportError:
        return []
    if not len(df):
        return []
    device = _device_of(df, device)
    gpu_name = _gpu_for(df, device, gpu_name, run, ask_cuda=True)
    paths = []
    for m in [metrics] if isinstance(metrics, str) else metrics:
        if m not in df.columns:
            continue
        fig = chart(df, m, device=device, gpu_name=gpu_name, run=run)
        paths.append(_save(fig, os.path.join(out, f"{m}.png"), dpi))
    return paths

def __dir__() -> list:
    """The public API only (not the helpers this module imports)."""
    return sorted(__all__)
