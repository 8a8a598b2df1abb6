"""castlab.plot's study and kernel-library charts (issue 53, "plots a researcher reads at a
glance"): one panel per dtype, relative errors in units of the format's unit roundoff,
the correctly rounded share (not its complement), only the bars that ran (no empty
slots), titles that say what ran where, and the files ``castlab study`` writes."""

import math
import os

import pytest

import castlab as cl

mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")
pd = pytest.importorskip("pandas")

from castlab import plot  # noqa: E402  (after the Agg backend is chosen)

# a chart that warns (an overflowing axis transform, a layout that does not fit) fails
pytestmark = pytest.mark.filterwarnings("error")


def _study(dtypes=("bfloat16", "float16"), chains=("swiglu", "rope")):
    return cl.study.run(chains=list(chains), dtypes=list(dtypes), quick=True, progress=False,
                        device="cpu")


@pytest.fixture(scope="module")
def study_df():
    return _study()


@pytest.fixture(scope="module")
def library_df():
    # apex has no SwiGLU and flash_attn no SwiGLU: groups with members missing
    return cl.study.libraries(["torch_eager", "liger", "flash_attn", "apex"],
                              ops=["swiglu", "rope"], size=4096, device="cpu")


def _suptitle(fig) -> str:
    fig.draw_without_rendering()  # lays the figure out (a warning there fails the test)
    return fig._suptitle.get_text()


def _bars(ax) -> dict:
    """gid ("panel|group|member") -> the bar (Rectangle)."""
    return {p.get_gid(): p for p in ax.patches if p.get_gid()}


def _row(u_dtype, **kw):
    r = {"chain": "swiglu", "dtype": u_dtype, "output_dtype": u_dtype, "shape": "8x16",
         "input": "normal", "scale": 1.0, "seed": 0, "math": "torch_eager",
         "policy": "fused", "rounding": "nearest", "device": "cpu",
         "correctly_rounded": 1.0, "rel_rmse": 1e-3, "max_ulp": 0.5, "numel": 64}
    r.update(kw)
    return r


# ------------------------------------------------------------------ units

@pytest.mark.parametrize("name,exp", [
    ("bfloat16", -8), ("bf16", -8), ("float16", -11), ("fp16", -11), ("float32", -24),
    ("fp32", -24), ("float64", -53), ("fp64", -53), ("float8_e4m3fn", -4),
    ("fp8_e4m3", -4), ("float8_e5m2", -3), ("fp8_e5m2", -3)])
def test_unit_roundoff_of_each_format(name, exp):
    assert plot._unit_roundoff(name) == 2.0 ** exp


def test_unit_roundoff_of_a_non_float_is_none():
    assert plot._unit_roundoff("int32") is None and plot._unit_roundoff("bogus") is None


# ------------------------------------------------------------------ files

def test_study_plots_written(study_df, tmp_path):
    paths = plot.write_study_plots(study_df, str(tmp_path))
    # the file names README and docs link to
    assert [os.path.basename(p) for p in paths] == ["correctly_rounded.png", "rel_rmse.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(p) > 1000


def test_library_plots_written(library_df, tmp_path):
    paths = plot.write_library_plots(library_df, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["correctly_rounded.png",
                                                    "max_ulp_error.png"]
    assert all(os.path.getsize(p) > 1000 for p in paths)


def test_no_rows_no_files(study_df, library_df, tmp_path):
    assert plot.write_study_plots(study_df.iloc[:0], str(tmp_path)) == []
    assert plot.write_library_plots(library_df.iloc[:0], str(tmp_path)) == []
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ correctly rounded

def test_correctly_rounded_plot_shows_the_correctly_rounded_share(study_df):
    fig = plot.study_chart(study_df, "correctly_rounded")
    seen = 0
    for ax in fig.axes:
        assert ax.get_yscale() == "logit"
        bars = _bars(ax)
        for gid, bar in bars.items():
            panel, group, member = gid.split("|")
            r = study_df[(study_df.dtype == panel) & (study_df.chain == group)
                         & (study_df.math + "/" + study_df.policy == member)]
            assert len(r) == 1
            assert bar.get_y() == 0.0
            assert bar.get_height() == r.correctly_rounded.iloc[0]  # the share itself
            seen += 1
    assert seen == len(study_df)
    assert "correctly rounded share" in _suptitle(fig)
    assert "incorrectly" not in _suptitle(fig)
    assert "correctly rounded share" in fig.axes[0].get_ylabel()
    # eager (about 73% correctly rounded) is the lower bar, fused (100%) the higher
    heights = {gid.split("|")[2]: b.get_height() for gid, b in _bars(fig.axes[0]).items()
               if "|swiglu|" in gid}
    assert heights["torch_eager/fused"] > heights["torch_eager/eager"]
    # 100% is labelled on its bar: a logit axis never reaches 1
    assert "100%" in [t.get_text() for t in fig.axes[0].texts]


def test_library_correctly_rounded_plot_shows_the_share(library_df):
    fig = plot.library_chart(library_df)
    n = 0
    for ax in fig.axes:
        for gid, bar in _bars(ax).items():
            dt, op, lib = gid.split("|")
            r = library_df[(library_df.dtype == dt) & (library_df.op == op)
                           & (library_df.library == lib)]
            assert bar.get_height() == r.correctly_rounded.iloc[0]
            # bit-identical to eager: hatched
            assert bool(bar.get_hatch()) == bool(r.identical_to_eager.iloc[0]
                                                 and lib != "torch_eager")
            n += 1
    assert n == len(library_df)


def test_share_ticks_read_as_percentages():
    assert [plot._percent(p) for p in (0.5, 0.9, 0.99, 0.999, 0.9999, 0.1, 0.001)] == [
        "50%", "90%", "99%", "99.9%", "99.99%", "10%", "0.1%"]


# ------------------------------------------------------------------ one panel per dtype

def test_one_panel_per_dtype_errors_in_units_of_u():
    df = _study(dtypes=("bfloat16", "float16", "float32"), chains=("swiglu",))
    fig = plot.study_chart(df, "rel_rmse")
    assert len(fig.axes) == 3
    for ax, (dt, exp) in zip(fig.axes, [("bfloat16", -8), ("float16", -11), ("float32", -24)]):
        assert ax.get_title().startswith(dt)
        assert f"2^{{{exp}}}" in ax.get_title()
        bars = _bars(ax)
        assert len(bars) == len(df[df.dtype == dt])
        for gid, bar in bars.items():
            member = gid.split("|")[2]
            r = df[(df.dtype == dt) & (df.math + "/" + df.policy == member)]
            assert bar.get_height() == pytest.approx(r.rel_rmse.iloc[0] / 2.0 ** exp,
                                                     rel=1e-12)
    assert "units of u" in fig.axes[0].get_ylabel()  # a row of panels says it once
    # in units of u the three formats' errors are of one size (not 5 decades apart)
    hs = [b.get_height() for ax in fig.axes for b in _bars(ax).values()]
    assert max(hs) / min(hs) < 10
    # the eager/fused gap is visible: bf16's eager bar is at least 20% above fused
    bf = {g.split("|")[2]: b.get_height() for g, b in _bars(fig.axes[0]).items()}
    assert bf["torch_eager/eager"] > 1.2 * bf["torch_eager/fused"]
    # a panel whose values are within a factor of 20 gets a linear axis from 0
    assert fig.axes[0].get_yscale() == "linear" and fig.axes[0].get_ylim()[0] == 0


def test_ulp_metrics_panel_per_dtype_with_half_ulp_line(study_df):
    fig = plot.study_chart(study_df, "max_ulp")
    assert [ax.get_title() for ax in fig.axes] == ["bfloat16", "float16"]
    for ax in fig.axes:
        assert "ulps" in ax.get_ylabel() or ax.get_ylabel() == ""
        assert any(list(ln.get_ydata()) == [0.5, 0.5] for ln in ax.get_lines())
        # rope's eager max ulp is hundreds of ulps, fused 0.5: a log axis
        assert ax.get_yscale() == "log"


def test_panel_of_a_promoted_output_uses_the_output_format():
    df = pd.DataFrame([_row("bfloat16", output_dtype="float32", rel_rmse=2.0 ** -25),
                       _row("bfloat16", output_dtype="float32", policy="eager",
                            rel_rmse=2.0 ** -24)])
    fig = plot.study_chart(df, "rel_rmse")
    (ax,) = fig.axes
    assert ax.get_title().startswith("bfloat16 (output float32)")
    assert sorted(b.get_height() for b in _bars(ax).values()) == [0.5, 1.0]


def test_library_chart_one_panel_per_dtype(library_df):
    fig = plot.library_chart(library_df, "max_ulp_error")
    assert [ax.get_title() for ax in fig.axes] == ["bfloat16", "float16"]


# ------------------------------------------------------------------ no empty slots

def _group_centres(ax) -> dict:
    """group -> the sorted centres of its bars."""
    out: dict = {}
    for gid, b in _bars(ax).items():
        out.setdefault(gid.split("|")[1], []).append(b.get_x() + b.get_width() / 2)
    return {g: sorted(xs) for g, xs in out.items()}


def test_no_empty_slots_in_study_groups():
    rows = [_row("bfloat16", math=m, policy=p) for m, p in [
        ("torch_eager", "eager"), ("torch_eager", "fused"), ("inductor", "fused"),
        ("nvfuser", "fused"), ("transformer_engine", "fused")]]
    rows += [_row("bfloat16", chain="rope", shape="1x2x8x16", policy=p)
             for p in ("eager", "fused")]  # rope: two of the five labels ran
    df = pd.DataFrame(rows)
    for metric in ("correctly_rounded", "rel_rmse", "max_ulp"):
        (ax,) = plot.study_chart(df, metric).axes
        groups = _group_centres(ax)
        assert {g: len(xs) for g, xs in groups.items()} == {"swiglu": 5, "rope": 2}
        for xs in groups.values():  # bars side by side, one slot each
            assert all(b - a == 1.0 for a, b in zip(xs, xs[1:]))
        # between the groups only the fixed gap, no slot for the three labels rope lacks
        gap = groups["rope"][0] - groups["swiglu"][-1]
        assert gap == pytest.approx(1.0 + plot._GAP)
        ticks = list(ax.get_xticks())
        assert ticks == pytest.approx([sum(groups["swiglu"]) / 5, sum(groups["rope"]) / 2])


def test_no_empty_slots_in_library_groups(library_df):
    fig = plot.library_chart(library_df)
    for ax in fig.axes:
        dt = ax.get_title()
        groups = _group_centres(ax)
        for op, xs in groups.items():
            have = library_df[(library_df.dtype == dt) & (library_df.op == op)]
            assert len(xs) == len(have)  # only the libraries with a kernel for the op
            assert all(b - a == 1.0 for a, b in zip(xs, xs[1:]))
        assert len(groups["swiglu"]) < len(groups["rope"])  # flash_attn, apex: no SwiGLU


# ------------------------------------------------------------------ titles

def test_titles_say_device_and_shape(study_df):
    for metric in ("correctly_rounded", "rel_rmse"):
        t = _suptitle(plot.study_chart(study_df, metric))
        assert "device cpu" in t
        for chain, shape in study_df.groupby("chain")["shape"].first().items():
            assert f"{chain} {shape}" in t


def test_title_names_the_gpu():
    df = pd.DataFrame([_row("bfloat16", device="cuda:0")])
    assert "device cuda:0 (NVIDIA H200)" in _suptitle(
        plot.study_chart(df, gpu_name="NVIDIA H200"))
    run = {"cuda": {"devices": [{"index": 0, "name": "NVIDIA H200", "multiprocessors": 132}]}}
    assert "device cuda:0 (NVIDIA H200)" in _suptitle(plot.study_chart(df, run=run))
    df2 = df.assign(device="cuda:1", gpu_name="NVIDIA A100")
    assert "device cuda:1 (NVIDIA A100)" in _suptitle(plot.study_chart(df2))
    # a device given wins over the rows'
    assert "device cuda:3" in _suptitle(plot.study_chart(df, device="cuda:3"))
    # a CPU run names no GPU, even with a run record that has one
    assert _suptitle(plot.study_chart(df.assign(device="cpu"), run=run)).split("\n")[1] \
        .startswith("device cpu;")


def test_title_argument_replaces_the_first_line(study_df):
    t = _suptitle(plot.study_chart(study_df, "rel_rmse", title="my study"))
    assert t.startswith("my study\n") and "device cpu" in t


def test_library_titles_say_device_and_shape(library_df):
    t = _suptitle(plot.library_chart(library_df))
    assert "device cpu" in t
    assert "swiglu 4x1024" in t and "rope 1x1x32x128" in t and "4,096 elements" in t
    # the shapes are library_inputs' own
    for size in (4096, 1 << 16, 1 << 20):
        d = library_df.copy()
        d.attrs = {"size": size}
        text = plot._library_shapes_text(d)
        ins = cl.study.library_inputs(size, "bfloat16")
        assert "swiglu " + "x".join(map(str, ins["swiglu"]["a"].shape)) in text
        assert "rope " + "x".join(map(str, ins["rope"]["x"].shape)) in text
    df = library_df.assign(device="cuda:0")
    assert "cuda:0 (NVIDIA H200)" in _suptitle(
        plot.library_chart(df, gpu_name="NVIDIA H200"))


# ------------------------------------------------------------------ seeds, inf, nan

def test_seeds_mean_with_min_max_whiskers():
    df = pd.DataFrame([_row("float16", seed=s, rel_rmse=v * 2.0 ** -11)
                       for s, v in enumerate((0.4, 0.5, 0.9))])
    fig = plot.study_chart(df, "rel_rmse")
    (ax,) = fig.axes
    (bar,) = _bars(ax).values()
    assert bar.get_height() == pytest.approx(0.6)
    assert "mean of 3 seeds" in _suptitle(fig)
    segs = [c for c in ax.collections if c.get_segments()]
    (seg,) = segs[0].get_segments()
    assert [y for _, y in seg] == pytest.approx([0.4, 0.9])


def test_non_finite_values_are_marked_not_dropped():
    df = pd.DataFrame([_row("bfloat16", rel_rmse=math.inf),
                       _row("bfloat16", policy="eager", rel_rmse=math.nan),
                       _row("bfloat16", math="inductor", rel_rmse=0.0)])
    (ax,) = plot.study_chart(df, "rel_rmse").axes
    assert {t.get_text() for t in ax.texts} >= {"inf", "nan", "0"}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("inf") for t in legend) and any(t.startswith("nan") for t in legend)


def test_bad_metric_refused(study_df, library_df):
    with pytest.raises(ValueError, match="unknown metric"):
        plot.study_chart(study_df, "bogus")
    with pytest.raises(ValueError, match="unknown metric"):
        plot.library_chart(library_df, "rel_rmse")
    with pytest.raises(ValueError, match="no column 'library'"):
        plot.library_chart(study_df)


# ------------------------------------------------------------------ castlab study

def _hooked(fn, name: str) -> bool:
    import inspect

    return name in inspect.getsource(fn)


def test_cli_study_writes_the_panel_plots(tmp_path):
    from castlab import cli

    if not _hooked(cli.write_plots, "write_study_plots"):
        pytest.skip("cli.write_plots does not call castlab.plot.write_study_plots yet")
    out = tmp_path / "o"
    assert cli.main(["study", "--chains", "swiglu", "--dtypes", "bfloat16", "float16",
                     "--quick", "--device", "cpu", "--out", str(out), "--no-progress"]) == 0
    for n in ("correctly_rounded.png", "rel_rmse.png"):
        assert (out / n).stat().st_size > 1000


def test_cli_library_mode_writes_plots(tmp_path, capsys):
    from castlab import cli

    if not _hooked(cli.cmd_libraries, "write_library_plots"):
        pytest.skip("cli.cmd_libraries does not call castlab.plot.write_library_plots yet")
    out = tmp_path / "o"
    assert cli.main(["study", "--chains", "swiglu,rope", "--math", "all", "--quick",
                     "--device", "cpu", "--out", str(out), "--no-progress"]) == 0
    wrote = capsys.readouterr().out.splitlines()[-1]
    for n in ("correctly_rounded.png", "max_ulp_error.png"):
        assert (out / n).stat().st_size > 1000 and n in wrote
    # --no-plots writes none
    out2 = tmp_path / "o2"
    assert cli.main(["study", "--chains", "rope", "--math", "all", "--quick", "--device",
                     "cpu", "--out", str(out2), "--no-progress", "--no-plots"]) == 0
    assert not list(out2.glob("*.png"))
