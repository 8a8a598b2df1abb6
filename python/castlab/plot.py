"""Plots for castlab's numerics toolkit (matplotlib, imported on first use; the Agg
backend is selected when there is no display). Every function returns a
``matplotlib.figure.Figure``, which Jupyter renders inline.

Errors span many decades (a fused result is within 0.5 ulp, an eager one can be
thousands of ulps off), so the error axes are logarithmic; a value that a log axis
cannot show is written on the plot instead of vanishing: ``0`` at the bottom edge,
``inf``/``nan`` with an arrow at the top edge (and a note in the legend). Legends sit
outside the data area.

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

from .numerics import Comparison, Drift, compare, ulp

__all__ = ["ulp_histogram", "error_vs_magnitude", "drift_chart", "study_chart"]


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


# ------------------------------------------------------------------ grouped bars

# metric -> (what is plotted, axis label, log axis)
_ERROR_METRICS = {
    "max_ulp": ("max ulp error", True),
    "mean_ulp": ("mean ulp error", True),
    "rel_rmse": ("relative RMSE vs fp64", True),
    "correctly_rounded": ("incorrectly rounded fraction", True),
    "mismatch_vs_eager": ("fraction that differs from eager", True),
    "max_rel_err": ("max relative error", True),
    "max_abs_err": ("max absolute error", True),
    "rmse": ("RMSE vs fp64", True),
}


def _plotted(metric: str, v: Any) -> float:
    """The value drawn for `metric`: correctly_rounded becomes the incorrectly rounded
    fraction (1.0 and 0.99998 would otherwise look the same)."""
    if v is None:
        return math.nan
    v = float(v)
    return 1.0 - v if metric == "correctly_rounded" else v


def _grouped_bars(ax, groups: list, members: list, value, *, log: bool) -> tuple:
    """One group of bars per entry of `groups`, one bar per member that has a value
    (``value(group, member)`` returns None when it has none); each group's bars are
    centred on its tick, the members keep their colour across groups. Values a log axis
    cannot show are written instead: "0" at the bottom, "inf" (with an arrow) or "nan"
    at the top. Returns the legend entries of the members (in order) and the notes to
    add to the legend."""
    from matplotlib.patches import Patch

    colors = [f"C{k % 10}" for k in range(len(members))]
    width = 0.8 / max(len(members), 1)
    shown = []  # the bars' heights (a log axis gets limits that keep every bar readable)
    marks = []  # (x, kind, colour)
    for gi, g in enumerate(groups):
        present = [(k, value(g, m)) for k, m in enumerate(members)]
        present = [(k, v) for k, v in present if v is not None]
        for j, (k, v) in enumerate(present):
            x = gi + (j - (len(present) - 1) / 2) * width
            if math.isfinite(v) and (v > 0 or not log):
                ax.bar(x, v, width, color=colors[k])
                shown.append(v)
            else:
                kind = "nan" if math.isnan(v) else ("inf" if math.isinf(v) else "0")
                marks.append((x, kind, colors[k]))
    handles = [Patch(color=colors[k], label=str(m)) for k, m in enumerate(members)]
    if log:
        ax.set_yscale("log")
        pos = [v for v in shown if v > 0]
        if pos:
            # bars on a log axis start at the bottom: put it a decade or so below the
            # smallest bar, and leave room at the top for the inf/nan marks
            ax.set_ylim(10.0 ** math.floor(math.log10(min(pos) / 2)), max(pos) * 4)
        else:
            ax.set_ylim(1e-3, 1e3)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    tr = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for x, kind, col in marks:
        if kind == "0":
            ax.text(x, 0.01, "0", transform=tr, ha="center", va="bottom", fontsize=8,
                    color=col, fontweight="bold")
        elif kind == "inf":
            ax.annotate("inf", xy=(x, 1.0), xycoords=tr, xytext=(x, 0.86), textcoords=tr,
                        ha="center", va="top", fontsize=8, color=col, fontweight="bold",
                        arrowprops={"arrowstyle": "->", "color": col, "lw": 1.5})
        else:
            ax.text(x, 0.97, "nan", transform=tr, ha="center", va="top", fontsize=8,
                    color=col, fontweight="bold")
    notes = []
    kinds = {k for _, k, _ in marks}
    if "inf" in kinds:
        notes.append("inf \u2191: infinite, off the scale")
    if "nan" in kinds:
        notes.append("nan: not a number")
    if "0" in kinds:
        notes.append("0: exactly zero" + (" (not on a log axis)" if log else ""))
    return handles, notes


def _finish_legend(ax, members, notes):
    """Legend outside the axes: the members, then the other labelled artists (reference
    lines, shading), then the notes (text only)."""
    handles, labels = ax.get_legend_handles_labels()
    handles = members + handles + [_note_handle(t) for t in notes]
    labels = [h.get_label() for h in members] + labels + notes
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0, fontsize=8, frameon=False)


def _metric_label(metric: str, log: bool) -> str:
    label = _ERROR_METRICS[metric][0]
    if metric == "correctly_rounded":
        return label + "\n(1 - correctly rounded" + (", log scale)" if log else ")")
    return label + (" (log scale)" if log else "")


def drift_chart(drift_result: Any, *, metric: str = "max_ulp"):
    """Per-node error against fp64 for each policy/math combination (grouped bars, one
    group per node in trace order, log y axis), from :func:`castlab.numerics.drift`.
    `metric`: "max_ulp", "mean_ulp", "rel_rmse" or "correctly_rounded" (drawn as the
    *incorrectly* rounded fraction, 1 - correctly rounded, so that 99.998% and 100% look
    different). The node where the drift starts is shaded (the first divergent node, or
    the first node after it whose plotted error is nonzero).

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
    val = {(r["node"], r["combo"]): _plotted(metric, r[metric]) for r in d.rows}
    fig = _new_figure((max(8.0, 1.2 * len(nodes) + 4.0), 4.4))
    ax = fig.add_subplot()
    log = _ERROR_METRICS[metric][1]
    members, notes = _grouped_bars(ax, nodes, combos, lambda n, c: val.get((n, c)), log=log)
    ax.set_xticks(np.arange(len(nodes)), nodes, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(_metric_label(metric, log), fontsize=9)
    if metric in ("max_ulp", "mean_ulp"):
        ax.axhline(0.5, color="gray", linestyle=":", linewidth=1, label="0.5 ulp")
    fd = d.first_divergence
    if fd is not None and fd.label in nodes:
        start = nodes.index(fd.label)
        # shade where the chart shows an error: the divergent node, or the first node
        # after it with a nonzero (or non-finite) plotted value
        for i in range(start, len(nodes)):
            vs = [val.get((nodes[i], c)) for c in combos]
            if any(v is not None and v != 0 for v in vs):
                text = "drift starts" if i == start else \
                    f"first nonzero error\n(drift starts at {fd.label})"
                ax.axvspan(i - 0.45, i + 0.45, color="orange", alpha=0.15, label=text)
                break
    ax.set_title(f"{d.fn_name}: error vs fp64 per node (lower is better)", fontsize=10)
    _finish_legend(ax, members, notes)
    return fig


# ------------------------------------------------------------------ study chart

def _study_case_keys(df) -> list:
    return ["chain", "dtype"] + (["pass", "output"] if "pass" in df.columns else [])


def _study_case_label(vals: tuple) -> str:
    chain, dt = vals[0], vals[1]
    return f"{chain}\n{dt}" + (f"\n{vals[3]}" if len(vals) > 2 and vals[2] == "backward" else "")


def study_chart(df: Any, metric: str = "correctly_rounded", *, title: str | None = None):
    """Grouped bars of one metric of a :func:`castlab.study.run` DataFrame: one group per
    case (chain, dtype, and gradient output with ``grad=True``), one bar per
    math/policy(/rounding) label, log y axis. Groups where some labels did not run are
    centred on their tick; ``correctly_rounded`` is drawn as the incorrectly rounded
    fraction; infinite values are marked at the top edge.

    >>> import castlab as cl, castlab.plot as cplot
    >>> df = cl.study.run(chains=["swiglu"], dtypes=["bfloat16"], quick=True)
    >>> fig = cplot.study_chart(df, "rel_rmse")
    """
    if metric not in _ERROR_METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: " + ", ".join(_ERROR_METRICS))
    if metric not in df.columns:
        raise ValueError(f"the DataFrame has no column {metric!r}")
    df = df.copy()
    rnd = df["rounding"] if "rounding" in df.columns else None
    df["_label"] = df["math"].astype(str) + "/" + df["policy"].astype(str) + (
        rnd.map(lambda r: "" if r == "nearest" else f"/{r}") if rnd is not None else "")
    keys = _study_case_keys(df)
    groups = [(k if isinstance(k, tuple) else (k,), g)
              for k, g in df.groupby(keys, sort=False)]
    labels = list(dict.fromkeys(df["_label"]))
    vals = {}
    for gi, (_, g) in enumerate(groups):
        for lab, v in zip(g["_label"], g[metric]):
            vals.setdefault((gi, lab), _plotted(metric, v))
    fig = _new_figure((max(8.0, 1.4 * len(groups) + 3.5), 4.4))
    ax = fig.add_subplot()
    label, log = _ERROR_METRICS[metric]
    members, notes = _grouped_bars(ax, list(range(len(groups))), labels,
                                   lambda gi, lab: vals.get((gi, lab)), log=log)
    ax.set_xticks(np.arange(len(groups)), [_study_case_label(k) for k, _ in groups], fontsize=8)
    ax.set_ylabel(_metric_label(metric, log), fontsize=9)
    ref = "" if "vs fp64" in label else " vs fp64"
    ax.set_title(title or f"{label}{ref} (lower is better)", fontsize=10)
    _finish_legend(ax, members, notes)
    return fig


def __dir__() -> list:
    """The public API only (not the helpers this module imports)."""
    return sorted(__all__)
