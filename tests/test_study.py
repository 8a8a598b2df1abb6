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


def test_cli_bad_flags_list_valid_values():
    r = _cli("study", "--chains", "nope")
    assert r.returncode == 2 and "swiglu" in r.stderr
    r = _cli("study", "--presets", "fastest")
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


def test_cli_interrupt_keeps_finished_rows(tmp_path):
    # SIGINT after the first configuration: the finished rows stay in the CSV
    import signal
    import time

    out = tmp_path / "int"
    p = subprocess.Popen([sys.executable, "-m", "castlab", "study", "--device", "cpu",
                          "--out", str(out), "--no-progress", "--no-plots",
                          "--shape", "swiglu=1024x4096", "--shape", "rope=1x16x1024x128"],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    assert len(rows) >= 1
    assert "interrupted" in err


@pytest.mark.parametrize("args,pattern", [
    (["--scale", "nan"], "scale"),
    (["--scale=-1"], "scale"),
    (["--shape", "nosuch=4x8"], "unknown chain 'nosuch'"),
    (["--shape", "swiglu=3x3"], "last dimension must be even"),
    (["--shape", "swiglu=abc"], "swiglu=2048x2048"),
    (["--shape", "swiglu=4611686018427387905x4"], "too large"),
    (["--out", "/dev/null/x"], "cannot write to --out"),
])
def test_cli_bad_values_one_line_exit_2(args, pattern):
    # issue 14: a bad value ends with one line `castlab: error: ...` and exit code 2
    r = _cli("study", "--device", "cpu", "--chains", "swiglu", "--no-progress", *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert pattern in last and "error" in last, last


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
        assert bool(eager.same_vs_eager) and bool(fused.same_vs_eager)


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
