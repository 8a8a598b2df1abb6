"""castlab study: the Python API, the CLI (by subprocess), config files and bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import castlab as cl
from castlab import study

ENV = dict(os.environ)


def _cli(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "castlab", *args], capture_output=True,
                          text=True, env=ENV, cwd=cwd, timeout=timeout)


def test_api_rows_and_headline():
    df = study.run(chains=["swiglu"], dtypes=["bfloat16"], quick=True, device="cpu",
                   extra_presets={"swiglu": ["transformer_engine"]})
    assert list(df.columns) == study.row_columns()
    assert len(df) == 3
    eager = df[(df.policy == "eager")].iloc[0]
    fused = df[(df.policy == "fused") & (df.math == "torch_eager")].iloc[0]
    # the headline of the study: fusing (one rounding) is far more often correctly rounded
    assert fused.correctly_rounded > 0.999
    assert eager.correctly_rounded < 0.85
    assert eager.mismatch_vs_eager == 0.0 and fused.mismatch_vs_eager > 0.1
    assert fused.rel_rmse < eager.rel_rmse


def test_api_correctly_rounded_matches_independent_count():
    # recompute the fused SwiGLU correctly-rounded fraction with NumPy + ml_dtypes:
    # the fp64 reference rounded once to bf16 (directly from fp64 via castlab's conversion)
    x = cl.randn(128, 256, seed=3, dtype=cl.bfloat16)
    df = study.run(chains=["swiglu"], dtypes=["bfloat16"], shapes={"swiglu": (128, 256)},
                   seeds=[3], policies=["fused"], device="cpu", extra_presets={})
    xs = x.numpy().astype(np.float64)
    a, b = xs[:, :128], xs[:, 128:]
    ref = a / (1 + np.exp(-a)) * b
    f = study.CHAINS["swiglu"].fn
    y = cl.jit(f)(x).numpy().astype(np.float64)
    ref_bf16 = cl.from_numpy(ref).astype(cl.bfloat16).numpy().astype(np.float64)
    frac = float(np.mean(y == ref_bf16))
    assert abs(df.iloc[0].correctly_rounded - frac) < 1e-12


def test_api_user_function_and_tensor_inputs():
    def scaled_silu(x):
        return cl.silu(x) * 0.5

    x = cl.randn(64, 64, seed=1, dtype=cl.float32)
    df = study.run(chains=[scaled_silu], dtypes=["bfloat16", "float16"], device="cpu",
                   inputs={"scaled_silu": (x,)})
    assert set(df.dtype) == {"bfloat16", "float16"}
    assert (df.input == "tensor").all()


def test_api_stochastic_rounding_reproducible():
    kw = dict(chains=["swiglu"], dtypes=["bfloat16"], quick=True, device="cpu",
              rounding=["stochastic"], policies=["eager"], extra_presets={})
    d1, d2 = study.run(**kw), study.run(**kw)
    pd.testing.assert_frame_equal(d1, d2)


def test_api_bad_names():
    with pytest.raises(ValueError, match="valid: swiglu"):
        study.run(chains=["nope"], device="cpu")
    with pytest.raises(ValueError, match="unknown policy"):
        study.run(chains=["swiglu"], policies=["sometimes"], quick=True, device="cpu")
    with pytest.raises(ValueError, match="unknown math preset"):
        study.run(chains=["swiglu"], presets=["fastest"], quick=True, device="cpu")


def test_cli_quick_writes_outputs_and_agrees_with_api(tmp_path):
    out = tmp_path / "st"
    r = _cli("study", "--quick", "--device", "cpu", "--chains", "swiglu", "--out", str(out),
             "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "correctly rounded" in r.stdout
    df = pd.read_csv(out / "results.csv")
    api = study.run(chains=["swiglu"], dtypes=["bfloat16", "float16"], quick=True, device="cpu",
                    extra_presets=study.DEFAULT["extra_presets"])
    assert list(df.columns) == study.row_columns()
    np.testing.assert_allclose(df.correctly_rounded.values, api.correctly_rounded.values, rtol=0, atol=0)
    np.testing.assert_allclose(df.rel_rmse.values, api.rel_rmse.values, rtol=1e-12)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == len(df)
    assert (out / "correctly_rounded.png").stat().st_size > 1000


@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_default_study_runs(tmp_path):
    r = _cli("study", "--device", "cpu", "--no-progress", "--no-plots", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "castlab-study" / "results.csv")
    assert set(df.chain) == {"swiglu", "rope"}
    assert set(df.dtype) == {"bfloat16", "float16", "float32"}
    assert {"inductor", "nvfuser", "transformer_engine"} <= set(df.math)
    bf = df[(df.chain == "swiglu") & (df.dtype == "bfloat16")]
    assert bf[bf.policy == "fused"].correctly_rounded.min() > 0.999
    assert bf[bf.policy == "eager"].correctly_rounded.max() < 0.8


def test_cli_config_file(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text('chains = ["rope"]\ndtypes = ["float16"]\npolicies = ["eager", "fused"]\n'
                   'shapes = { rope = [1, 2, 32, 64] }\nseed = 7\nextra_presets = []\n')
    r = _cli("study", "--config", str(cfg), "--device", "cpu", "--out", str(tmp_path / "o"),
             "--no-progress", "--no-plots")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert set(df.chain) == {"rope"} and set(df.seed) == {7} and len(df) == 2
    assert set(df["shape"]) == {"1x2x32x64"}


def test_cli_broken_config_names_the_line(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('chains = ["rope"]\ndtypes = [float16\n')
    r = _cli("study", "--config", str(cfg), "--device", "cpu")
    assert r.returncode != 0
    assert "line 2" in r.stderr
    cfg.write_text('chainz = ["rope"]\n')
    r = _cli("study", "--config", str(cfg), "--device", "cpu")
    assert r.returncode != 0 and "chainz" in r.stderr and "valid" in r.stderr


@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_bad_flags_list_valid_values():
    r = _cli("study", "--chains", "nope")
    assert r.returncode == 2 and "swiglu" in r.stderr
    r = _cli("study", "--math", "fastest")
    assert r.returncode == 2 and "inductor" in r.stderr
    r = _cli("study", "--frobnicate")
    assert r.returncode == 2 and "unrecognized" in r.stderr
    r = _cli("--help")
    assert r.returncode == 0 and "study" in r.stdout and "info" in r.stdout


def test_cli_info():
    r = _cli("info")
    assert r.returncode == 0, r.stderr
    assert "castlab" in r.stdout and "numpy" in r.stdout and "ml_dtypes" in r.stdout
    assert "cuda" in r.stdout


@pytest.mark.slow  # ~25 s (a study interrupted in a subprocess)
def test_cli_interrupt_keeps_finished_rows(tmp_path):
    # SIGINT after the first configuration: the finished rows stay in the CSV. 48 seeds
    # of one chain: after the first cell's rows appear, 47 cells of the same size are
    # left (seconds of work), so the signal cannot come after the study ended (two
    # chains, then eight seeds, left too short a window on a loaded machine). The inputs
    # of every seed are made before the first cell runs, so far more seeds delay the
    # first row past the deadline. (Two CI runs launched in the background ended with
    # exit 0 at sixteen seeds; see the child's SIGINT action below.)
    import signal
    import time

    out = tmp_path / "int"
    p = subprocess.Popen([sys.executable, "-m", "castlab", "study", "--device", "cpu",
                          "--out", str(out), "--no-progress", "--no-plots", "--chains", "swiglu",
                          "--shape", "swiglu=1024x4096", "--seeds", *map(str, range(48))],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # a run started in the background by a non-interactive shell may
                         # inherit SIGINT ignored, and Python then never raises
                         # KeyboardInterrupt: the child starts with the default action
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    csv = out / "results.csv"
    deadline = time.time() + 120
    while time.time() < deadline:
        if csv.exists() and len(csv.read_text().splitlines()) > 1:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    rows = pd.read_csv(csv)
    assert 1 <= len(rows) and rows["seed"].nunique() < 48
    assert "interrupted" in err


@pytest.mark.parametrize("args,pattern", [
    (["--scale", "nan"], "scale"),
    (["--scale=-1"], "scale"),
    (["--shape", "nosuch=4x8"], "unknown chain or input name 'nosuch'"),
    (["--shape", "swiglu=3x3"], "last dimension must be even"),
    (["--shape", "swiglu=abc"], "swiglu=2048x2048"),
    (["--shape", "swiglu=4611686018427387905x4"], "too large"),
    (["--out", "/dev/null/x"], "cannot write to --out"),
])
@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_bad_values_one_line_exit_2(args, pattern):
    # issue 14: a bad value ends with one line `castlab: error: ...` and exit code 2
    r = _cli("study", "--device", "cpu", "--chains", "swiglu", "--no-progress", *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert pattern in last and "error" in last, last


@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_out_refuses_old_results_and_beats_config(tmp_path):
    small = ["study", "--device", "cpu", "--chains", "swiglu", "--dtypes", "bfloat16",
             "--shape", "swiglu=2x4", "--extra-presets", "--no-plots", "--no-progress"]
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'out = "{tmp_path / "from_config"}"\n')
    out = tmp_path / "explicit"
    r = _cli(*small, "--config", str(cfg), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "results.csv").exists() and not (tmp_path / "from_config").exists()
    r = _cli(*small, "--out", str(out))
    assert r.returncode == 2 and "--overwrite" in r.stderr and "Traceback" not in r.stderr
    r = _cli(*small, "--out", str(out), "--overwrite")
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- gradients (grad=True, --grad)

def test_api_grad_rows_next_to_forward_rows():
    kw = dict(chains=["swiglu", "rope"], dtypes=["bfloat16"], quick=True, device="cpu",
              extra_presets={})
    df = study.run(**kw, grad=True)
    assert list(df.columns) == study.row_columns(grad=True)
    assert {"pass", "output"} <= set(df.columns) and "pass" not in study.row_columns()
    got = {(r.chain, r["pass"], r.output) for _, r in df.iterrows()}
    # SwiGLU's x gradient is reported as its halves; RoPE differentiates x, not cos/sin
    assert got == {("swiglu", "forward", "y"), ("swiglu", "backward", "da"),
                   ("swiglu", "backward", "db"), ("rope", "forward", "y"),
                   ("rope", "backward", "dx")}
    assert len(df) == 10 and df.groupby(["chain", "pass", "output", "policy"]).size().max() == 1
    # the forward rows are the ones a study without gradients gives
    fwd = df[df["pass"] == "forward"].drop(columns=["pass", "output"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(fwd, study.run(**kw))
    bwd = df[df["pass"] == "backward"]
    n, d = study.CHAINS["swiglu"].quick_shape
    assert set(bwd[bwd.chain == "swiglu"].numel) == {n * d // 2}
    assert set(bwd[bwd.chain == "rope"].numel) == {int(np.prod(study.CHAINS["rope"].quick_shape))}
    assert np.isfinite(bwd[["max_ulp", "mean_ulp", "rel_rmse", "rmse"]].values).all()
    for _, g in bwd.groupby(["chain", "output"]):
        eager = g[g.policy == "eager"].iloc[0]
        fused = g[g.policy == "fused"].iloc[0]
        # fused rounds each gradient once from fp32: (nearly) always correctly rounded;
        # eager rounds the saved activations and every backward op
        assert fused.correctly_rounded > 0.999 and fused.max_ulp < 0.6
        assert 0.5 < eager.correctly_rounded < 0.9 and eager.max_ulp > 1.0
        assert fused.rel_rmse < eager.rel_rmse < 1e-2
        assert eager.mismatch_vs_eager == 0.0 and 0.05 < fused.mismatch_vs_eager < 0.5
        assert bool(eager.torch_same_vs_eager) and bool(fused.torch_same_vs_eager)


def _swiglu_bf16_case(shape=(64, 128), seed=0):
    (x,) = study.CHAINS["swiglu"].make_inputs(shape, cl.bfloat16, seed, "normal", 1.0, "cpu")
    dy = cl.randn(shape[0], shape[1] // 2, seed=seed ^ study.COTANGENT_SEED_MIX,
                  dtype=cl.float64).astype(cl.bfloat16)
    return x, dy


def test_grad_eager_swiglu_bf16_is_torch_autograd_bit_for_bit():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x, dy = _swiglu_bf16_case()
    bwd = cl.jit(study.CHAINS["swiglu"].fn).backward_fn()
    (dx,) = bwd.run(x, dy, policy="eager")
    xt, dyt = torch.from_dlpack(x), torch.from_dlpack(dy)
    h = xt.shape[-1] // 2
    a = xt[..., :h].clone().requires_grad_()
    b = xt[..., h:].clone().requires_grad_()
    da, db = torch.autograd.grad(F.silu(a) * b, (a, b), dyt)
    mine = torch.from_dlpack(dx)
    for got, want in ((mine[..., :h], da), (mine[..., h:], db)):
        assert got.dtype == want.dtype == torch.bfloat16
        assert torch.equal(got.contiguous().view(torch.int16), want.view(torch.int16))
    # and the study's eager da row measures exactly that gradient
    df = study.run(chains=["swiglu"], dtypes=["bfloat16"], shapes={"swiglu": (64, 128)},
                   device="cpu", extra_presets={}, grad=True)
    (ref,) = bwd.run(x, dy, policy="fp64")
    cmp = cl.numerics.compare(cl.from_dlpack(da), ref=ref[..., :h], names=["torch"])
    row = df[(df.output == "da") & (df.policy == "eager")].iloc[0]
    assert row.correctly_rounded == cmp.to_dict()["torch"]["correctly_rounded"]


def test_api_grad_user_function_skips_broadcast_inputs():
    def gate(x, w):
        return cl.silu(x) * w

    x = cl.randn(32, 16, seed=1, dtype=cl.float32)
    w = cl.randn(16, seed=2, dtype=cl.float32)   # broadcast over rows: not differentiated
    df = study.run(chains=[gate], dtypes=["bfloat16"], inputs={"gate": (x, w)}, device="cpu",
                   grad=True)
    assert set(df[df["pass"] == "backward"].output) == {"dx"}


@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_grad_writes_all_rows(tmp_path):
    out = tmp_path / "g"
    r = _cli("study", "--grad", "--device", "cpu", "--dtypes", "bfloat16", "--extra-presets",
             "inductor", "--shape", "swiglu=8x16", "--shape", "rope=1x2x8x16", "--out", str(out),
             "--no-progress")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out / "results.csv")
    assert list(df.columns) == study.row_columns(grad=True)
    # forward: eager, fused (+ inductor for SwiGLU); backward: eager, fused per gradient
    assert len(df) == 3 + 2 * 2 + 2 + 2
    assert set(df[df["pass"] == "backward"].output) == {"da", "db", "dx"}
    assert "backward" in r.stdout and " da " in r.stdout
    assert "swiglu bfloat16 da: correctly rounded" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == len(df)
    cases = {(c["chain"], c["pass"], c["output"]) for c in summary["cases"]}
    assert len(summary["cases"]) == len(cases) == 5
    assert sum(len([k for k in c if "/" in k]) for c in summary["cases"]) == len(df)
    assert (out / "correctly_rounded.png").stat().st_size > 1000
    # the CLI's rows are the API's
    api = study.run(chains=["swiglu", "rope"], dtypes=["bfloat16"], device="cpu",
                    shapes={"swiglu": (8, 16), "rope": (1, 2, 8, 16)},
                    extra_presets={"swiglu": ["inductor"]}, grad=True)
    np.testing.assert_array_equal(df.correctly_rounded.values, api.correctly_rounded.values)
    assert list(df.output) == list(api.output)


# ---------------------------------------------------------------- attribution (--attribute)

def test_cli_attribute_writes_table_and_verdicts(tmp_path):
    out = tmp_path / "a"
    r = _cli("study", "--attribute", "--device", "cpu", "--dtypes", "bfloat16", "float16",
             "--shape", "swiglu=64x128", "--shape", "rope=1x2x16x32", "--out", str(out),
             "--no-progress", "--no-plots")
    assert r.returncode == 0, r.stderr
    att = pd.read_csv(out / "attribution.csv")
    assert list(att.columns) == study.ATTRIBUTION_COLUMNS
    assert set(att.chain) == {"swiglu", "rope"} and set(att.dtype) == {"bfloat16", "float16"}
    # every differing element of the default chains is explained by a named factor
    assert "unexplained" not in set(att.factors)
    verdict_cols = ["toward", "away", "tie", "equal", "nan"]
    assert (att[verdict_cols].sum(axis=1) == att.elements).all()
    ev = att[(att.A == "eager/torch_eager") & (att.B == "fused/torch_eager")]
    assert set(ev[ev.chain == "swiglu"].factors) == {"rounding after silu (t2)"}
    assert all("rounding after mul" in f for f in ev[ev.chain == "rope"].factors)
    assert ev.toward.sum() > 0.95 * ev.elements.sum()  # fused moves toward fp64
    # the extra presets against the first, under fused: only the silu formula can differ
    ex = att[att.A == "fused/torch_eager"]
    assert set(ex.B) <= {"fused/inductor", "fused/nvfuser", "fused/transformer_engine"}
    assert set(ex.factors) <= {"math silu"}
    summary = json.loads((out / "summary.json").read_text())
    verdicts = summary["attribution"]
    # per dtype: swiglu eager/fused + 3 extra presets, rope eager/fused
    assert len(verdicts) == 2 * (4 + 1)
    assert all(v["unexplained"] == 0 for v in verdicts)
    for v in verdicts:
        assert v["verdict"].startswith(f"B ({v['B']}) differs from A ({v['A']})")
        assert f"{v['chain']} {v['dtype']} seed=0: {v['verdict']}" in r.stdout
    # the verdicts come after the table, before the headline
    assert r.stdout.index("attribution") < r.stdout.index("correctly rounded: fused")
    # the differing elements are those the table counts
    for v in verdicts:
        rows = att[(att.chain == v["chain"]) & (att.dtype == v["dtype"]) & (att.B == v["B"])
                   & (att.A == v["A"])]
        assert rows.elements.sum() == v["differ"]


@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_attribute_from_config_and_off_by_default(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text('chains = ["swiglu"]\ndtypes = ["bfloat16"]\nshapes = { swiglu = [8, 16] }\n'
                   'extra_presets = []\nattribute = true\n')
    r = _cli("study", "--config", str(cfg), "--device", "cpu", "--out", str(tmp_path / "c"),
             "--no-progress", "--no-plots")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "c" / "attribution.csv").exists()
    assert len(json.loads((tmp_path / "c" / "summary.json").read_text())["attribution"]) == 1
    cfg.write_text('chains = ["swiglu"]\nshapes = { swiglu = [8, 16] }\nattribute = "yes"\n')
    r = _cli("study", "--config", str(cfg), "--device", "cpu", "--out", str(tmp_path / "d"))
    assert r.returncode == 2 and "attribute must be true or false" in r.stderr
    # without --attribute: no table, no key, no verdict lines
    r = _cli("study", "--device", "cpu", "--chains", "swiglu", "--dtypes", "bfloat16",
             "--shape", "swiglu=8x16", "--out", str(tmp_path / "e"), "--no-progress",
             "--no-plots")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "e" / "attribution.csv").exists()
    assert "attribution" not in json.loads((tmp_path / "e" / "summary.json").read_text())
    assert "attribution" not in r.stdout


def test_api_attribute_table_in_attrs():
    kw = dict(chains=["swiglu", "rope"], dtypes=["bfloat16"], quick=True, device="cpu",
              seeds=[0, 1], extra_presets={"swiglu": ["transformer_engine"]})
    plain = study.run(**kw)
    df = study.run(**kw, attribute=True)
    assert "attribution" not in plain.attrs
    with pytest.raises(ValueError, match="attribute=True"):
        study.attribution_table(plain)
    # the rows are those of a study without attribution
    pd.testing.assert_frame_equal(df, plain, check_flags=False)
    att = study.attribution_table(df)
    assert list(att.columns) == study.ATTRIBUTION_COLUMNS and len(att) >= 4
    assert set(att.seed) == {0, 1} and "unexplained" not in set(att.factors)
    verdicts = df.attrs["attribution_verdicts"]
    assert [(v["chain"], v["seed"], v["B"]) for v in verdicts] == [
        ("swiglu", 0, "fused/torch_eager"), ("swiglu", 0, "fused/transformer_engine"),
        ("swiglu", 1, "fused/torch_eager"), ("swiglu", 1, "fused/transformer_engine"),
        ("rope", 0, "fused/torch_eager"), ("rope", 1, "fused/torch_eager")]
    # the study's attribution is castlab.numerics.attribute's
    args = study.CHAINS["swiglu"].make_inputs(study.CHAINS["swiglu"].quick_shape,
                                             cl.bfloat16, 1, "normal", 1.0, "cpu")
    ref = cl.numerics.attribute(cl.jit(study.CHAINS["swiglu"].fn), args, a="eager",
                                b="fused")
    assert verdicts[2]["verdict"] == ref.verdict
    mine = att[(att.chain == "swiglu") & (att.seed == 1) & (att.B == "fused/torch_eager")]
    assert mine.elements.tolist() == ref.summary()["elements"].tolist()
    # one policy: nothing to attribute but the extra preset
    one = study.run(chains=["swiglu"], dtypes=["bfloat16"], quick=True, device="cpu",
                    policies=["fused"], extra_presets={"swiglu": ["nvfuser"]}, attribute=True)
    assert [v["B"] for v in one.attrs["attribution_verdicts"]] == ["fused/nvfuser"]
    # plain lists: two studies concatenate (a DataFrame in attrs would make pd.concat fail)
    both = pd.concat([df, one])
    assert len(both) == len(df) + len(one)
    json.dumps(df.attrs)


# ---------------------------------------------------------------- issue 20: chains from anywhere

CHAINS_PY = """import castlab as cl

def rms_scale(x, inv_rms):
    return x * inv_rms

def gate(x):
    a, b = cl.chunk(x, 2, dim=-1)
    return cl.silu(a) * b

def untraceable(x):
    return float(x)
"""


@pytest.fixture()
def chains_dir(tmp_path):
    (tmp_path / "mychains_i20.py").write_text(CHAINS_PY)
    (tmp_path / "broken_i20.py").write_text("import no_such_module_anywhere\n")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.standard_normal((16, 32)).astype(np.float32))
    np.save(tmp_path / "ints.npy", np.ones((16, 1), np.int64))
    return tmp_path


def test_api_input_specs_pin_dtype_and_module_spec(chains_dir, monkeypatch):
    monkeypatch.chdir(chains_dir)
    seen = []

    def f(x, s):
        seen.append((x.dtype.name, s.dtype.name))
        return x * s

    ch = study.chain(f, inputs=[study.Input(shape=(4, 8)),
                                study.Input(shape=(4, 1), dtype="float32", distribution="uniform")])
    df = study.run(chains=[ch, "mychains_i20:gate"], shapes={"mychains_i20:gate": (8, 16)},
                   dtypes=["bfloat16", "float16"], device="cpu", seeds=[0, 1], extra_presets={})
    # the pinned input stays fp32 whatever the study dtype (it used to be cast to it)
    assert seen == [("bfloat16", "float32"), ("float16", "float32")]
    assert set(df.chain) == {"f", "mychains_i20:gate"}
    assert set(df[df.chain == "f"].input) == {"normal, uniform:float32"}
    assert set(df[df.chain == "f"]["shape"]) == {"4x8,4x1"}
    # a module function with a shape: its one input, drawn as the built-in chains draw x
    g = df[df.chain == "mychains_i20:gate"].reset_index(drop=True)
    sw = study.run(chains=["swiglu"], shapes={"swiglu": (8, 16)}, dtypes=["bfloat16", "float16"],
                   device="cpu", seeds=[0, 1], extra_presets={})
    np.testing.assert_array_equal(g.correctly_rounded.values, sw.correctly_rounded.values)
    assert len(df) == 2 * 2 * 2 * 2


def test_api_fixed_inputs_run_one_seed():
    x = cl.randn(32, 64, seed=1, dtype=cl.float32)

    def gate(x):
        a, b = cl.chunk(x, 2, dim=-1)
        return cl.silu(a) * b

    df = study.run(chains=[gate], dtypes=["bfloat16"], inputs={"gate": (x,)}, seeds=[0, 1, 2],
                   device="cpu")
    assert list(df.seed) == ["fixed", "fixed"] and len(df) == 2
    # stochastic rounding: the seeds seed it, so they still run
    st = study.run(chains=[gate], dtypes=["bfloat16"], inputs={"gate": (x,)}, seeds=[0, 1],
                   device="cpu", rounding=["stochastic"], policies=["eager"])
    assert list(st.seed) == [0, 1]


def test_api_file_inputs(tmp_path):
    arr = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    np.save(tmp_path / "a.npy", arr)
    ch = study.chain(study.CHAINS["swiglu"].fn, name="sw",
                     inputs=[study.Input(file=str(tmp_path / "a.npy"))])
    df = study.run(chains=[ch], dtypes=["bfloat16"], seeds=[0, 1], device="cpu")
    same = study.run(chains=[study.CHAINS["swiglu"].fn], dtypes=["bfloat16"], device="cpu",
                     inputs={"_swiglu": (cl.from_numpy(arr),)})
    np.testing.assert_array_equal(df.correctly_rounded.values, same.correctly_rounded.values)
    assert list(df.seed) == ["fixed"] * 2 and df.input.iloc[0].endswith("a.npy")
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(arr).to(torch.bfloat16)
    torch.save({"h": t}, tmp_path / "a.pt")
    pt = study.run(chains=[study.chain(ch, inputs=[study.Input(file=str(tmp_path / "a.pt"))])],
                   dtypes=["bfloat16"], device="cpu")
    bf = study.run(chains=[study.CHAINS["swiglu"].fn], dtypes=["bfloat16"], device="cpu",
                   inputs={"_swiglu": (cl.from_dlpack(t),)})
    np.testing.assert_array_equal(pt.correctly_rounded.values, bf.correctly_rounded.values)
    st = pytest.importorskip("safetensors.torch")
    st.save_file({"h": t, "other": t[:1].clone()}, str(tmp_path / "a.safetensors"))
    sf = study.run(chains=[study.chain(ch, inputs=[study.Input(
        file=str(tmp_path / "a.safetensors"), key="h")])], dtypes=["bfloat16"], device="cpu")
    np.testing.assert_array_equal(sf.correctly_rounded.values, bf.correctly_rounded.values)
    with pytest.raises(ValueError, match="pick one with key"):
        study.load_input_file(str(tmp_path / "a.safetensors"))


@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_config_chains_with_input_specs(chains_dir):
    import torch
    torch.save(torch.rand(16, 1), chains_dir / "r.pt")
    cfg = chains_dir / "s.toml"
    cfg.write_text("""dtypes = ["bfloat16", "float16"]
seeds = [0, 1]
extra_presets = []

[[chains]]
chain = "swiglu"
shape = [8, 16]

[[chains]]
chain = "mychains_i20:rms_scale"
[[chains.inputs]]
shape = [16, 32]
scale = 2.0
[[chains.inputs]]
shape = [16, 1]
dtype = "float32"
distribution = "uniform"

[[chains]]
chain = "mychains_i20.py:rms_scale"
name = "from_files"
inputs = [{ file = "x.npy" }, { file = "r.pt", dtype = "float32" }]
""")
    r = _cli("study", "--config", str(cfg), "--device", "cpu", "--out", str(chains_dir / "o"),
             "--no-progress", cwd=chains_dir)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(chains_dir / "o" / "results.csv")
    assert set(df.chain) == {"swiglu", "mychains_i20:rms_scale", "from_files"}
    rs = df[df.chain == "mychains_i20:rms_scale"]
    assert set(rs.input) == {"normal*2, uniform:float32"} and set(rs["shape"]) == {"16x32,16x1"}
    ff = df[df.chain == "from_files"]
    assert set(ff.seed) == {"fixed"} and len(ff) == 2 * 2 and set(ff.input) == {"x.npy, r.pt:float32"}
    assert len(df) == 2 * 2 * 2 + 2 * 2 * 2 + 4
    assert " seed " in r.stdout.splitlines()[1] and "fixed" in r.stdout
    # the mix of built-in names and specs on the command line
    r = _cli("study", "--chains", "swiglu", "mychains_i20:gate", "--shape", "swiglu=8x16",
             "--shape", "mychains_i20:gate=8x16", "--dtypes", "bfloat16", "--extra-presets",
             "--device", "cpu", "--out", str(chains_dir / "o2"), "--no-progress", "--no-plots",
             cwd=chains_dir)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(chains_dir / "o2" / "results.csv")
    a, b = df[df.chain == "swiglu"], df[df.chain == "mychains_i20:gate"]
    np.testing.assert_array_equal(a.correctly_rounded.values, b.correctly_rounded.values)


def test_cli_help_documents_the_config():
    r = _cli("study", "--help")
    assert r.returncode == 0
    assert "[[chains.inputs]]" in r.stdout and 'dtype = "float32"' in r.stdout
    assert "--resume" in r.stdout and "pkg.module:function" in r.stdout


@pytest.mark.parametrize("args,toml,pattern", [
    (["--chains", "nope"], None, "unknown chain 'nope'"),
    (["--chains", "no_such_mod_i20:f"], None, "cannot import module 'no_such_mod_i20'"),
    (["--chains", "broken_i20:f"], None, "cannot import module 'broken_i20'"),
    (["--chains", "missing_i20.py:f"], None, "no such file"),
    (["--chains", "mychains_i20:nothere"], None, "has no attribute 'nothere'"),
    (["--chains", "mychains_i20:untraceable", "--shape", "mychains_i20:untraceable=4x4"], None,
     "cannot be traced by castlab.jit"),
    (["--chains", "mychains_i20:gate"], None, "has no inputs"),
    ([], '[[chains]]\nchain = "mychains_i20:rms_scale"\ninputs = [{ file = "ints.npy" }, '
         '{ shape = [16, 1] }]\n', "holds int64 values; expected a floating-point array"),
    ([], '[[chains]]\nchain = "mychains_i20:rms_scale"\ninputs = [{ file = "x.npy", shape = [4, 4] '
         '}, { shape = [16, 1] }]\n', "has shape (16, 32), expected (4, 4)"),
    ([], '[[chains]]\nchain = "mychains_i20:rms_scale"\ninputs = [{ shape = "abc" }]\n',
     "chains[0].inputs[0].shape must be a list of positive integers, e.g. [64, 4096]"),
    ([], '[[chains]]\nchain = "mychains_i20:rms_scale"\ninputs = [{ shape = [4], dtype = "int8" }]\n',
     "chains[0].inputs[0].dtype must be one of bfloat16"),
    ([], '[[chains]]\nchain = "mychains_i20:gate"\ninputs = [{ shape = [4], distribution = "gauss" }]\n',
     "distribution must be one of normal, uniform"),
    ([], '[[chains]]\nchain = "mychains_i20:gate"\ninptus = []\n',
     "chains[0]: unknown key(s) ['inptus']; valid: chain, name, shape, inputs"),
    ([], '[[chains]]\nname = "x"\n', "chains[0].chain must be a string"),
    ([], 'chains = [3]\n', "chains[0] must be a chain name or a table"),
    ([], 'policies = ["sometimes"]\n', "policies[0] must be one of eager, fused, fp64"),
    ([], 'seeds = [-1]\n', "seeds[0] must be an integer in [0, 2**64)"),
])
@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_bad_chains_and_config_one_line_exit_2(chains_dir, args, toml, pattern):
    if toml is not None:
        (chains_dir / "bad.toml").write_text(toml)
        args = [*args, "--config", str(chains_dir / "bad.toml")]
    r = _cli("study", "--device", "cpu", "--no-progress", "--out", str(chains_dir / "o"), *args,
             cwd=chains_dir)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert pattern in r.stderr, r.stderr
    assert not (chains_dir / "o" / "results.csv").exists()  # nothing written


# ---------------------------------------------------------------- issue 20: lossless output

def test_mismatch_vs_eager_is_against_eager_with_fp64_policy():
    kw = dict(chains=["swiglu"], dtypes=["bfloat16"], quick=True, device="cpu",
              extra_presets={"swiglu": ["inductor"]})
    full = study.run(**kw, policies=["eager", "fused", "fp64"])
    for pols in (["fp64"], ["fp64", "fused"], ["fused", "fp64"], ["fp64", "eager", "fused"]):
        df = study.run(**kw, policies=pols)
        # rows in the order of the grid (the eager row is no longer moved first)
        assert list(df.policy) == pols + ["fused"]
        for _, r in df.iterrows():
            want = full[(full.policy == r.policy) & (full.math == r.math)].iloc[0]
            # always against eager (nearest, first preset), never against fp64 or fused
            assert r.mismatch_vs_eager == want.mismatch_vs_eager, (pols, r.policy, r.math)
            assert r.torch_same_vs_eager == want.torch_same_vs_eager
    fp = full[full.policy == "fp64"].iloc[0]
    assert fp.mismatch_vs_eager > 0.5  # the fp64 result is not the eager one
    # gradients too
    g = study.run(**dict(kw, extra_presets={}), policies=["fp64", "fused"], grad=True)
    gf = study.run(**dict(kw, extra_presets={}), policies=["eager", "fused"], grad=True)
    np.testing.assert_array_equal(g[g.policy == "fused"].mismatch_vs_eager.values,
                                  gf[gf.policy == "fused"].mismatch_vs_eager.values)


@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_seeds_summary_keeps_every_row_and_headline_without_torch_eager(tmp_path):
    out = tmp_path / "s"
    r = _cli("study", "--device", "cpu", "--chains", "swiglu", "rope", "--dtypes", "bfloat16",
             "--shape", "swiglu=8x16", "--shape", "rope=1x2x8x16", "--seeds", "0", "1", "2",
             "--math", "inductor", "torch_eager", "--rounding", "nearest", "toward_zero",
             "--extra-presets", "nvfuser", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out / "results.csv")
    # one row per (chain, dtype, seed, math, policy, rounding) (+ the extra preset)
    assert len(df) == 2 * 3 * 2 * 2 * 2 + 3
    assert df.groupby(["chain", "seed", "math", "policy", "rounding"]).size().max() == 1
    summary = json.loads((out / "summary.json").read_text())
    assert sum(len([k for k in c if "/" in k]) for c in summary["cases"]) == len(df) == summary["rows"]
    assert {c["seed"] for c in summary["cases"]} == {0, 1, 2}
    # the headline uses the first preset when torch_eager is not first
    lines = summary["headline"].splitlines()
    assert len(lines) == 6 and all("(inductor): fused" in ln and "vs eager" in ln for ln in lines)
    assert "swiglu bfloat16 seed=2: correctly rounded (inductor): fused" in r.stdout
    # the table (after the first line, the device) shows seed, shape and input
    assert r.stdout.startswith("castlab study on cpu (")
    head = r.stdout.splitlines()[1].split()
    assert {"seed", "shape", "input"} <= set(head)
    assert (out / "correctly_rounded.png").stat().st_size > 1000
    pa = pytest.importorskip("pyarrow")
    assert pa is not None
    pq = pd.read_parquet(out / "results.parquet")
    pd.testing.assert_frame_equal(pq, df)


def test_api_no_eager_policy_headline(tmp_path):
    from castlab.cli import summarize
    df = study.run(chains=["swiglu"], dtypes=["bfloat16"], quick=True, device="cpu",
                   policies=["fused", "fp64"], presets=["nvfuser"], extra_presets={})
    assert summarize(df, 0.0)["headline"].startswith(
        "swiglu bfloat16: correctly rounded (nvfuser): fused")


def _records(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow  # studies in subprocesses: 1-6 s each
def test_cli_resume_equals_full_run_bit_for_bit(tmp_path):
    small = ["study", "--device", "cpu", "--dtypes", "bfloat16", "float16", "--seeds", "0", "1",
             "--shape", "swiglu=16x32", "--shape", "rope=1x2x8x16", "--extra-presets",
             "inductor", "--rounding", "nearest", "stochastic", "--grad", "--no-progress",
             "--no-plots"]
    full, part = tmp_path / "full", tmp_path / "part"
    r = _cli(*small, "--out", str(full))
    assert r.returncode == 0, r.stderr
    r = _cli(*small, "--out", str(part))
    assert r.returncode == 0, r.stderr
    cells = (part / "cells.jsonl").read_text().splitlines()
    assert len(cells) == 2 * 2 * 2
    # an interrupted study: 3 cells finished, a 4th cut short mid-line, stale results
    (part / "cells.jsonl").write_text("\n".join(cells[:3]) + "\n" + cells[3][:50])
    (part / "results.csv").write_text("\n".join(
        (part / "results.csv").read_text().splitlines()[:5]) + "\n")
    r = _cli(*small, "--out", str(part))
    assert r.returncode == 2 and "--resume" in r.stderr
    r = _cli(*small, "--out", str(part), "--resume")
    assert r.returncode == 0, r.stderr
    assert json.loads((part / "summary.json").read_text())["resumed_cells"] == 3
    a = pd.read_csv(full / "results.csv")
    b = pd.read_csv(part / "results.csv")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    ra, rb = _records(full / "cells.jsonl"), _records(part / "cells.jsonl")
    key = lambda rec: study.cell_key(rec["key"])  # noqa: E731
    assert sorted(map(key, ra)) == sorted(map(key, rb))
    assert {key(x): x["rows"] for x in ra} == {key(x): x["rows"] for x in rb}
    r = _cli(*small, "--out", str(part), "--resume", "--overwrite")
    assert r.returncode == 2 and "give one" in r.stderr


def test_api_resume_with_done_records():
    kw = dict(chains=["swiglu", "rope"], dtypes=["bfloat16"], quick=True, device="cpu",
              seeds=[0, 1], extra_presets={"swiglu": ["nvfuser"]}, attribute=True)
    recs = []
    full = study.run(**kw, on_cell=recs.append)
    assert len(recs) == 4
    ran = []
    again = study.run(**kw, done=recs[:2], on_cell=ran.append)
    assert [r["key"] for r in ran] == [r["key"] for r in recs[2:]]
    pd.testing.assert_frame_equal(full, again, check_exact=True)
    assert full.attrs == again.attrs
    # records of another grid (another policy set) are not reused
    other = study.run(**dict(kw, policies=["fused"]), done=recs, on_cell=ran.append)
    assert len(ran) == 2 + 4 and len(other) == 2 * 2 + 2


# ---------------------------------------------------------------- Dask sweeps

@pytest.mark.slow  # ~15 s (a Dask cluster)
def test_dask_workers_give_the_rows_of_a_serial_run(tmp_path):
    pytest.importorskip("distributed")
    kw = dict(chains=["swiglu", "rope"], dtypes=["bfloat16", "float32"], quick=True,
              seeds=[0, 1], device="cpu", grad=True)
    serial = study.run(**kw)
    seen = []
    dask = study.run(**kw, workers=2, on_row=seen.append)
    assert serial.equals(dask)  # same rows, same order, bit for bit in every metric
    assert len(seen) == len(serial)  # streamed back as cells finished
    r = _cli("study", "--quick", "--device", "cpu", "--out", str(tmp_path / "o"),
             "--no-progress", "--no-plots", "--workers", "2", "--dtypes", "bfloat16")
    assert r.returncode == 0, r.stderr
    r = _cli("study", "--quick", "--device", "cpu", "--out", str(tmp_path / "p"),
             "--no-progress", "--no-plots", "--scheduler", "tcp://127.0.0.1:9")
    assert r.returncode == 2 and "cannot reach the Dask scheduler" in r.stderr
    assert "Traceback" not in r.stderr
