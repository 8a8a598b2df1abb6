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

from ._plot_draw import _GAP as _GAP
from ._plot_draw import (
    _LIBRARY_METRICS,
    _METRICS,
    LIBRARY_PLOTS,
    STUDY_PLOTS,
    _better,
    _draw_bars,
    _finish_legend,
    _legend_outside,
    _mark_notes,
    _member_patch,
    _metric_axis_label,
    _new_figure,
    _panels,
    _plt,
    _unit_roundoff,
)
from ._plot_draw import _percent as _percent
from ._plot_labels import _device_of, _gpu_for, _shapes_text, _stats, _varying_keys, _where
from .numerics import Comparison, Drift, compare, ulp

__all__ = ["ulp_histogram", "error_vs_magnitude", "drift_chart", "study_chart",
           "write_study_plots", "library_chart", "write_library_plots"]


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
