"""The kernel-library matrix (castlab.study.libraries, `castlab study --libraries`): every
library preset against Hugging Face eager and its own formula in fp64, on the CPU."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import castlab as cl
from castlab import cli, presets, study

SIZE = 1 << 14


@pytest.fixture(scope="module")
def matrix():
    return study.libraries(size=SIZE, device="cpu")


def test_one_row_per_library_op_and_dtype(matrix):
    assert list(matrix.columns) == study.LIBRARY_COLUMNS
    want = {(n, op, d) for n in cl.libraries() for op in cl.library(n).ops
            for d in study.LIBRARY_DTYPES}
    got = set(zip(matrix.library, matrix.op, matrix.dtype))
    assert got == want and len(matrix) == len(want)
    assert (matrix.device == "cpu").all()
    swiglu_bwd = matrix[matrix.op == "swiglu_backward"]
    assert (swiglu_bwd.elements == 2 * SIZE).all()       # da and db together
    assert (matrix[matrix.op == "rope"].elements == SIZE).all()


def test_eager_is_identical_to_itself(matrix):
    eager = matrix[matrix.library == "torch_eager"]
    assert eager.identical_to_eager.all() and (eager.mismatch_vs_eager == 0).all()
    assert (eager.status == presets.BASELINE).all()


def test_fp32_rope_libraries_are_more_accurate_than_eager(matrix):
    def cr(lib, op, dt):
        r = matrix[(matrix.library == lib) & (matrix.op == op) & (matrix.dtype == dt)]
        return float(r.correctly_rounded.iloc[0])

    for dt in study.LIBRARY_DTYPES:
        for op in ("rope", "rope_interleaved"):
            for lib in ("flash_attn", "vllm"):
                assert cr(lib, op, dt) > cr("torch_eager", op, dt) + 0.1, (lib, op, dt)
    fa = matrix[matrix.library == "flash_attn"]
    assert not fa.identical_to_eager.any() and (fa.max_ulp_error <= 0.5001).all()


def test_status_column(matrix):
    status = dict(zip(zip(matrix.library, matrix.op, matrix.dtype), matrix.status))
    assert status[("flash_attn", "rope_interleaved", "float16")] == presets.VERIFIED
    assert status[("liger", "swiglu", "bfloat16")] == presets.VERIFIED
    assert status[("liger", "rope", "float16")] == presets.VERIFIED
    assert status[("unsloth", "rope_backward", "float16")] == presets.VERIFIED
    assert status[("vllm", "rope", "bfloat16")] == presets.NOT_RUN


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown kernel library 'ligr'.*liger"):
        study.libraries(["ligr"], size=SIZE, device="cpu")
    with pytest.raises(ValueError, match="unknown op"):
        study.libraries(ops=["reglu"], size=SIZE, device="cpu")
    with pytest.raises(ValueError, match="size"):
        study.libraries(size=100, device="cpu")


def test_cli_prints_and_writes_the_matrix(tmp_path, capsys):
    out = tmp_path / "m"
    rc = cli.main(["study", "--chains", "swiglu,rope", "--libraries", "all", "--quick",
                   "--device", "cpu", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "flash_attn" in text and "max_ulp@scale" in text
    assert "rope bfloat16: most accurate flash_attn, vllm" in text
    df = pd.read_csv(out / "results.csv")
    assert list(df.columns) == study.LIBRARY_COLUMNS
    ops = cli.LIBRARY_CHAINS["swiglu"] + cli.LIBRARY_CHAINS["rope"]
    covering = {n for n in cl.libraries() if set(cl.library(n).ops) & set(ops)}
    assert set(df.library) == covering and set(df.dtype) == {"bfloat16", "float16"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == len(df) and summary["size"] == 1 << 16
    # each case as it finished, and the plots (issue 53: library mode wrote neither)
    cells = [json.loads(ln) for ln in (out / "cells.jsonl").read_text().splitlines()]
    assert len(cells) == len(df)
    assert {(c["library"], c["op"], c["dtype"]) for c in cells} == set(
        zip(df.library, df.op, df.dtype))
    assert (out / "correctly_rounded.png").exists() and (out / "max_ulp_error.png").exists()


def test_cli_library_mode_shows_progress(tmp_path, capsys):
    args = ["study", "--libraries", "liger", "--chains", "swiglu", "--dtypes", "bf16",
            "--device", "cpu", "--quick", "--no-plots"]
    assert cli.main([*args, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    bars = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert bars[0].endswith("0/2 liger swiglu bfloat16"), err
    assert bars and bars[-1].startswith("[" + "#" * 28 + "] 2/2 done"), err
    assert cli.main([*args, "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert not [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[")]


def test_cli_selects_libraries_and_ops(tmp_path, capsys):
    rc = cli.main(["study", "--libraries", "liger", "flash_attn", "--chains", "rope_interleaved",
                   "--dtypes", "bfloat16", "--device", "cpu", "--quick", "--out",
                   str(tmp_path / "s")])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_csv(tmp_path / "s" / "results.csv")
    assert set(zip(df.library, df.op)) == {("flash_attn", "rope_interleaved"),
                                           ("flash_attn", "rope_interleaved_backward")}


@pytest.mark.parametrize("args,pattern", [
    (["--libraries", "ligr"], "invalid choice: 'ligr' (choose from all, torch_eager, liger"),
    (["--libraries", "all", "--chains", "geglu"], "kernel-library presets cover swiglu"),
    (["--libraries", "all", "--policies", "eager"], "--policies does not apply"),
    (["--libraries", "all", "--math", "inductor"], "--math does not apply to --libraries"),
    (["--libraries", "all", "--dtypes", "float32"], "bfloat16, float16"),
])
def test_cli_bad_values_one_line_exit_2(tmp_path, capsys, args, pattern):
    rc = cli.main(["study", "--device", "cpu", "--out", str(tmp_path / "x"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and pattern in err[0], err
    assert not (tmp_path / "x").exists()


def test_cli_commas_in_chains_for_the_policy_study_too(tmp_path, capsys):
    rc = cli.main(["study", "--chains", "swiglu,rope", "--quick", "--dtypes", "bfloat16",
                   "--extra-presets", "--device", "cpu", "--no-plots", "--no-progress",
                   "--out", str(tmp_path / "p")])
    assert rc == 0, capsys.readouterr().err
    assert set(pd.read_csv(tmp_path / "p" / "results.csv").chain) == {"swiglu", "rope"}


def test_single_names_and_repeats():
    df = study.libraries("vllm", ops=["swiglu", "swiglu"], dtypes="float16", size=4096,
                         device="cpu")
    assert df[["library", "op", "dtype"]].values.tolist() == [["vllm", "swiglu", "float16"]]
    assert bool(df.identical_to_eager.iloc[0])


def test_rms_norm_presets_in_the_matrix_and_not_in_bounds(tmp_path, capsys):
    df = study.libraries(["torch_eager", "liger", "vllm", "transformer_engine"],
                         ops=list(presets.ROW_OPS), dtypes=["bfloat16"], size=4096,
                         device="cpu")
    assert set(df.op) == set(presets.ROW_OPS)
    assert df[df.library == "torch_eager"].identical_to_eager.all()
    # Liger's ran against liger-kernel on an H200; vLLM's and TE's are from source
    assert (df[df.library == "liger"].status == presets.VERIFIED).all()
    assert (df[df.library.isin(["vllm", "transformer_engine"])].status
            == presets.NOT_RUN).all()
    # TE multiplies by the weight in fp32 and rounds once: not HF's two roundings
    te = df[(df.library == "transformer_engine") & (df.op == "rms_norm")]
    assert not te.identical_to_eager.all()
    # bounds enumerates elementwise inputs: RMSNorm's rows are refused, with the reason
    rc = cli.main(["bounds", "rms_norm", "--out", str(tmp_path / "b")])
    assert rc != 0 and "reduces whole rows" in capsys.readouterr().err
