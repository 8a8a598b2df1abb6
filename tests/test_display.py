"""Rich display (Jupyter HTML reprs), the plots' axes and legends, the text tables and
the progress bar."""

import io
import math
import warnings

import numpy as np
import pytest

import castlab as cl
import castlab.numerics as nm
from castlab import _progress
from castlab.numerics._tables import _html_table, _text_table

# ------------------------------------------------------------------ tensors


@pytest.mark.parametrize("dt", [cl.bfloat16, cl.float32, cl.float16])
def test_tensor_html_has_key_facts(dt):
    t = cl.randn(3, 4, seed=0, dtype=dt)
    h = t._repr_html_()
    assert dt.name in h and "cpu" in h and "(3, 4)" in h and "12 elements" in h
    assert "<pre" in h and "tensor([[" in h
    assert "overflow-x:auto" in h


def test_tensor_html_truncates_big_tensors():
    t = cl.randn(300, 400, seed=0)
    h = t._repr_html_()
    assert "..." in h and "summarised" in h and "120,000 elements" in h
    assert len(h) < 5000


def test_tensor_plain_repr_unchanged():
    assert repr(cl.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert repr(cl.tensor([1.5, 2.0], dtype=cl.bfloat16)) == \
        "tensor([1.5000, 2.0000], dtype=castlab.bfloat16)"
    assert str(cl.zeros(0, 3)) == "tensor([], size=(0, 3))"
    assert "<" not in repr(cl.ones(2))


def test_tensor_html_escapes_and_empty():
    h = cl.zeros(0, 3)._repr_html_()
    assert "(0, 3)" in h and "0 elements" in h


# ------------------------------------------------------------------ policy, math, trace


def test_policy_and_math_html():
    p = cl.Policy("custom", round_after=("silu", 2), compute="float64", rounding="toward_zero")
    h = p._repr_html_()
    for fact in ("castlab.Policy", "custom", "round_after", "silu, 2", "compute", "float64",
                 "rounding", "toward_zero", "round_casts", "<table"):
        assert fact in h, fact
    assert "op-math" in cl.Policy("eager")._repr_html_()
    m = cl.Math.preset("inductor")
    h = m._repr_html_()
    for fact in ("castlab.Math", "inductor", "impl", "fma", "silu", "sigmoid", "ex2_approx",
                 "division", "approx", "cuda_kernels"):
        assert fact in h, fact
    assert repr(cl.Policy("eager")).startswith("Policy(name='eager', round_after='all'")
    assert repr(m).startswith("Math(name='inductor'")


def test_trace_html_marks_rounding():
    sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    x = cl.randn(4, 8, seed=0, dtype=cl.bfloat16)
    eager = sw.trace(x, policy="eager")
    fused = sw.trace(x, policy="fused")
    he, hf = eager._repr_html_(), fused._repr_html_()
    assert "<pre" in he and "monospace" in he
    # eager rounds silu's result and the output; fused only the output
    assert he.count("castlab-round") == 2 and hf.count("castlab-round") == 1
    import re

    names = re.findall(r"<b>(t\d+(?:_\w+)?)</b>", he)
    assert "t0" in names and any(n.endswith("_bf16") for n in names)
    # widening converts are not marked
    for line in he.split("\n"):
        if "widen" in line:
            assert "castlab-round" not in line
    assert str(eager) == repr(eager)  # the plain listing is unchanged


# ------------------------------------------------------------------ tables


def test_html_tables_scroll_horizontally():
    h = _html_table(["a", "b"], [["x", 1.0]], "cap")
    assert h.startswith("<div style='overflow-x:auto") and h.endswith("</div>")
    sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    x = cl.randn(16, 16, seed=0, dtype=cl.bfloat16)
    c = nm.compare(sw.run(x, policy="eager"), sw(x), ref=sw.run(x, policy="fp64"))
    assert "overflow-x:auto" in c._repr_html_()
    assert "overflow-x:auto" in nm.drift(sw, (x,))._repr_html_()


def test_text_tables_narrow_and_wide():
    # narrow tables are as before
    assert _text_table(["n", "v"], [["a", 1.5], ["b", math.inf]]) == \
        "n    v\n-  ---\na  1.5\nb  inf"
    # wide tables stay within the width, keep every value and repeat the key columns
    heads = ["node", "dtype"] + sum(([f"combo{k} max ulp", "mean ulp", "rel RMSE"]
                                     for k in range(6)), [])
    rows = [[f"node{i}", "bfloat16"] + [float(i + k) / 7 for k in range(18)] for i in range(3)]
    s = _text_table(heads, rows, width=100)
    lines = s.split("\n")
    assert max(map(len, lines)) <= 100
    for k in range(6):
        assert f"combo{k}" in s
    assert sum("node1" in ln for ln in lines) >= 2  # the first column is repeated per block
    assert s.count("bfloat16") >= 6


def test_drift_text_is_readable():
    sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    x = cl.randn(16, 16, seed=0, dtype=cl.bfloat16)
    d = nm.drift(sw, (x,), policies=("eager", "fused"), maths=("torch_eager", "inductor"))
    lines = str(d).split("\n")
    assert max(len(ln) for ln in lines[1:]) <= 120


# ------------------------------------------------------------------ progress bar


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_log_file_has_no_carriage_returns():
    log = io.StringIO()
    for i in range(101):
        _progress.bar(i, 100, f"job {i}", stream=log)
    out = log.getvalue()
    assert "\r" not in out
    lines = out.splitlines()
    assert 10 <= len(lines) <= 12
    assert lines[0].endswith("0/100 job 0") and lines[-1].endswith("100/100 job 100")


def test_progress_bar_small_n_and_zero():
    log = io.StringIO()
    for i in range(4):
        _progress.bar(i, 3, "x", stream=log)
    assert len(log.getvalue().splitlines()) == 4
    log = io.StringIO()
    _progress.bar(0, 0, "done", stream=log)
    assert log.getvalue().endswith("0/0 done\n")


def test_progress_bar_tty_redraws_in_place():
    t = _Tty()
    for i in range(4):
        _progress.bar(i, 3, "x", stream=t)
    out = t.getvalue()
    assert out.count("\r") == 4 and out.endswith("\n") and out.count("\n") == 1


# ------------------------------------------------------------------ plots

mpl = pytest.importorskip("matplotlib")


def _swiglu_data():
    sw = cl.jit(lambda x: cl.silu(cl.chunk(x, 2, -1)[0]) * cl.chunk(x, 2, -1)[1])
    x = cl.randn(64, 64, seed=0, dtype=cl.bfloat16)
    return sw, x


def _legend_outside_axes(fig):
    fig.draw_without_rendering()
    ax = fig.axes[0]
    leg = ax.get_legend()
    assert leg is not None
    lb = leg.get_window_extent()
    ab = ax.get_window_extent()
    # the legend does not overlap the data area
    assert lb.x0 >= ab.x1 - 1 or lb.y1 <= ab.y0 + 1 or lb.x1 <= ab.x0 + 1 or lb.y0 >= ab.y1 - 1
    # and is not clipped by the figure
    fb = fig.bbox
    assert lb.x1 <= fb.x1 + 1 and lb.y0 >= fb.y0 - 1


def _no_warnings(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = fn(*a, **k)
        fig.draw_without_rendering()
    return fig


def test_ulp_histogram_log_axes_and_legend():
    from castlab import plot

    sw, x = _swiglu_data()
    c = nm.compare({"eager": sw.run(x, policy="eager"), "fused": sw(x)},
                   ref=sw.run(x, policy="fp64"))
    fig = _no_warnings(plot.ulp_histogram, c)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "ulp" in ax.get_xlabel() and "log" in ax.get_xlabel()
    assert "elements" in ax.get_ylabel()
    _legend_outside_axes(fig)
    assert plot.ulp_histogram(c, log=False).axes[0].get_yscale() == "linear"


def test_plots_with_inf_and_nan_errors():
    from castlab import plot

    # exp overflows bf16 (and fp32) for x = 89: infinite ulp errors; 0 * inf gives NaN
    f = cl.jit(lambda x: cl.exp(x) * 0.5)
    x = cl.tensor(np.array([[1.0, 89.0, -3.0, 0.25]] * 8, dtype=np.float32)).astype(cl.bfloat16)
    c = nm.compare({"eager": f.run(x, policy="eager"), "fused": f(x)},
                   ref=f.run(x, policy="fp64"))
    fig = _no_warnings(plot.ulp_histogram, c)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("inf" in t for t in labels)
    assert any("inf" in t.get_text() for t in fig.axes[0].texts)  # marked at the edge
    _no_warnings(plot.error_vs_magnitude, {"eager": f.run(x, policy="eager")},
                 f.run(x, policy="fp64"))
    d = nm.drift(f, (x,), policies=("eager", "fused"))
    for metric in ("max_ulp", "mean_ulp", "rel_rmse", "correctly_rounded"):
        fig = _no_warnings(plot.drift_chart, d, metric=metric)
        _legend_outside_axes(fig)
    fig = plot.drift_chart(d)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "inf" in texts
    assert any("inf" in t.get_text() for t in fig.axes[0].get_legend().get_texts())


def test_drift_chart_correctly_rounded_share_and_shading():
    from castlab import plot

    sw, x = _swiglu_data()
    d = nm.drift(sw, (x,), policies=("eager", "fused"))
    fig = _no_warnings(plot.drift_chart, d, metric="correctly_rounded")
    ax = fig.axes[0]
    # the correctly rounded share itself, on a logit axis (99.998% and 100% look different)
    assert ax.get_yscale() == "logit"
    assert "correctly rounded share" in ax.get_ylabel()
    share = {f"{r['node']}|{r['combo']}": r["correctly_rounded"] for r in d.rows}
    bars = {p.get_gid(): p.get_height() for p in ax.patches if p.get_gid()}
    assert bars and all(bars[k] == share[k] for k in bars)
    _legend_outside_axes(fig)
    # the shading sits on a node where the chart shows some error (a share below 1)
    val = {(r["node"], r["combo"]): 1 - r["correctly_rounded"] for r in d.rows}
    spans = [p for p in ax.patches if p.get_label().startswith(("drift starts", "first nonzero"))]
    assert len(spans) == 1
    i = round(spans[0].get_x() + spans[0].get_width() / 2)
    node = d.node_labels[i]
    assert any(val[(node, c)] > 0 for c in d.combos)
    for metric in ("max_ulp", "rel_rmse"):
        fig = _no_warnings(plot.drift_chart, d, metric=metric)
        assert fig.axes[0].get_yscale() == "log"


def test_study_chart_packs_partial_groups_and_marks_inf():
    pd = pytest.importorskip("pandas")
    from castlab import plot

    df = pd.DataFrame([
        {"chain": "swiglu", "dtype": "bfloat16", "policy": "eager", "math": "torch_eager",
         "rounding": "nearest", "correctly_rounded": 0.72, "rel_rmse": 2.4e-3},
        {"chain": "swiglu", "dtype": "bfloat16", "policy": "fused", "math": "torch_eager",
         "rounding": "nearest", "correctly_rounded": 0.999987, "rel_rmse": 1.7e-3},
        {"chain": "swiglu", "dtype": "bfloat16", "policy": "fused", "math": "inductor",
         "rounding": "nearest", "correctly_rounded": 0.999981, "rel_rmse": math.inf},
        {"chain": "rope", "dtype": "bfloat16", "policy": "eager", "math": "torch_eager",
         "rounding": "nearest", "correctly_rounded": 0.75, "rel_rmse": 2.3e-3},
        {"chain": "rope", "dtype": "bfloat16", "policy": "fused", "math": "torch_eager",
         "rounding": "nearest", "correctly_rounded": 1.0, "rel_rmse": float("nan")},
    ])
    fig = _no_warnings(plot.study_chart, df, "correctly_rounded")
    ax = fig.axes[0]
    assert ax.get_yscale() == "logit" and "correctly rounded share" in ax.get_ylabel()
    bars = [p for p in ax.patches]
    # the correctly rounded share itself: 0.999987 and 0.999981 are told apart on the
    # logit axis, and 100% is a bar to the top edge, labelled
    assert sorted(p.get_height() for p in bars) == [0.72, 0.75, 0.999981, 0.999987, 1.0]
    assert "100%" in [t.get_text() for t in ax.texts]
    # the group of rope (2 of 3 labels) has two bars side by side, no empty slot, and
    # its tick sits between them
    xs = sorted(p.get_x() + p.get_width() / 2 for p in bars)
    assert xs[1] - xs[0] == xs[2] - xs[1] == xs[4] - xs[3] == 1.0
    assert ax.get_xticks()[1] == pytest.approx((xs[3] + xs[4]) / 2)
    _legend_outside_axes(fig)
    fig = _no_warnings(plot.study_chart, df, "rel_rmse")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "inf" in texts and "nan" in texts
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(t.startswith("inf") for t in legend)
    _legend_outside_axes(fig)
