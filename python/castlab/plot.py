"""Plots for castlab's numerics toolkit (matplotlib, imported on first use; the Agg
backend is selected when there is no display). Every function returns a
``matplotlib.figure.Figure``, which Jupyter renders inline.

>>> import castlab as cl, castlab.numerics as nm, castlab.plot as cplot
>>> sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
>>> x = cl.randn(64, 64, seed=0, dtype=cl.bfloat16)
>>> c = nm.compare({"eager": sw.run(x, policy="eager"), "fused": sw(x)}, ref=sw.run(x, policy="fp64"))
>>> fig = cplot.ulp_histogram(c)
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from .numerics import Comparison, Drift, compare, ulp

__all__ = ["ulp_histogram", "error_vs_magnitude", "drift_chart"]


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


def ulp_histogram(*results: Any, ref: Any = None, names: Any = None, bins: int = 40,
                  log: bool = True):
    """Histogram of the ulp error against the reference, one series per result.

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
    fig = _new_figure((6.4, 4.0))
    ax = fig.add_subplot()
    errs = {n: e[np.isfinite(e)] for n, e in c.ulp_errors.items() if e is not None}
    hi = max((float(e.max()) for e in errs.values() if e.size), default=1.0)
    edges = np.linspace(0.0, max(hi, 0.5) * 1.0001, bins + 1)
    for n, e in errs.items():
        ax.hist(e, bins=edges, histtype="step", linewidth=1.5, label=n)
    ax.axvline(0.5, color="gray", linestyle=":", linewidth=1)
    ax.text(0.5, 0.98, " 0.5 ulp", transform=ax.get_xaxis_transform(), va="top", color="gray")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(f"error vs {c.ref_dtype.name} reference (ulps of the result's dtype)")
    ax.set_ylabel("elements")
    ax.set_title("ULP error per result")
    ax.legend()
    return fig


def error_vs_magnitude(result: Any, ref: Any, *, name: str | None = None, ulp_lines: bool = True,
                       max_points: int = 200_000, seed: int = 0):
    """Scatter of |result - ref| against |ref| (log-log), with the format's 0.5-ulp and
    1-ulp lines; `result` may be one tensor or a dict ``{name: tensor}``.

    >>> fig = error_vs_magnitude({"eager": y_eager, "fused": y_fused}, y_ref)  # doctest: +SKIP
    """
    items = result.items() if isinstance(result, dict) else [(name or "result", result)]
    c = compare(*[v for _, v in items], ref=ref, names=[k for k, _ in items])
    r = np.abs(c.ref_values).reshape(-1)
    fig = _new_figure((6.4, 4.2))
    ax = fig.add_subplot()
    rng = np.random.default_rng(seed)
    for k, v in c.values.items():
        e = np.abs(v.reshape(-1) - c.ref_values.reshape(-1))
        keep = (r > 0) & (e > 0) & np.isfinite(e)
        idx = np.flatnonzero(keep)
        if idx.size > max_points:
            idx = rng.choice(idx, max_points, replace=False)
        ax.scatter(r[idx], e[idx], s=3, alpha=0.5, label=k, rasterized=True)
    if ulp_lines and r.size:
        pos = r[(r > 0) & np.isfinite(r)]
        if pos.size:
            xs = np.geomspace(pos.min(), pos.max(), 400)
            u = ulp(xs, c[0]["dtype"]).numpy()  # ulps of the first result's dtype
            ax.plot(xs, 0.5 * u, color="gray", linestyle=":", linewidth=1, label="0.5 ulp")
            ax.plot(xs, u, color="gray", linestyle="--", linewidth=1, label="1 ulp")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("|reference|")
    ax.set_ylabel("|result - reference|")
    ax.set_title("error vs magnitude (exact matches not shown)")
    ax.legend(markerscale=4)
    return fig


def drift_chart(drift_result: Any, *, metric: str = "max_ulp"):
    """Per-node error against fp64 for each policy/math combination (grouped bars, one
    group per node in trace order), from :func:`castlab.numerics.drift`. `metric`:
    "max_ulp", "mean_ulp", "rel_rmse" or "correctly_rounded". The first divergence is
    marked.

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
    val = {(r["node"], r["combo"]): r[metric] for r in d.rows}
    fig = _new_figure((max(6.4, 1.2 * len(nodes) + 2), 4.2))
    ax = fig.add_subplot()
    width = 0.8 / max(len(combos), 1)
    x = np.arange(len(nodes))
    for k, c in enumerate(combos):
        ys = [val[(n, c)] for n in nodes]
        ax.bar(x + (k - (len(combos) - 1) / 2) * width, ys, width, label=c)
    ax.set_xticks(x, nodes, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel({"max_ulp": "max ulp error", "mean_ulp": "mean ulp error",
                   "rel_rmse": "relative RMSE", "correctly_rounded": "correctly rounded fraction"}[metric])
    if metric in ("max_ulp", "mean_ulp"):
        ax.axhline(0.5, color="gray", linestyle=":", linewidth=1)
    if d.first_divergence is not None and d.first_divergence.label in nodes:
        i = nodes.index(d.first_divergence.label)
        ax.axvspan(i - 0.45, i + 0.45, color="orange", alpha=0.15, label="drift starts")
    ax.set_title(f"{d.fn_name}: error vs fp64 per node")
    ax.legend(fontsize=8)
    return fig


def __dir__() -> list:
    """The public API only (not the helpers this module imports)."""
    return sorted(__all__)
