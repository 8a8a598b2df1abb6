"""Issue 53, "one vocabulary" and "run record": the CLI's options mean the same in every
command (--math is a math preset, --policy/--policies, --dtype/--dtypes, --seed/--seeds,
--library/--libraries are one option each, lists are space- or comma-separated), --shape
takes an input's name, old spellings work with a one-line warning, every computing command
says first where it runs and writes run.json, `castlab exhaustive` shows its progress and
refuses to overwrite results, and `torch_same_vs_eager` is named for what it is.

Most cases call ``castlab.cli.main(argv)`` in this process (fast); the one that checks
that castlab never imports torch runs ``python -m castlab`` in a subprocess.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

import castlab as cl
from castlab import _runrecord, cli, study

PKG = os.path.dirname(os.path.dirname(os.path.abspath(cl.__file__)))
# a small study that runs in well under a second
Q = ["study", "--device", "cpu", "--chains", "swiglu", "--dtypes", "bfloat16", "--no-plots",
     "--no-progress", "--extra-presets", "--shape", "swiglu=2x4"]
FIRST_LINE = re.compile(r"^castlab (study|exhaustive) on (cpu \(.+\)(: no usable CUDA GPU.*)?"
                        r"|cuda:\d+ \(.+, \d+ SMs\))$")
WARN_PRESETS = "castlab: warning: --presets is deprecated; use --math"


def _main(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(argv, pattern, capsys):
    rc, out, err = _main(argv, capsys)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("castlab: error: "), err
    assert re.search(pattern, lines[0]), (pattern, lines[0])
    return lines[0]


def _warnings(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("castlab: warning:")]


def _parse(argv):
    args = cli._parser().parse_args(argv)
    return args


# ================================================================ 1. --math is a math preset

def test_study_math_names_the_math_presets(capsys, tmp_path):
    rc, out, err = _main([*Q, "--math", "inductor,torch_eager", "--out", tmp_path / "a"], capsys)
    assert rc == 0, err
    assert not _warnings(err), err
    df = pd.read_csv(tmp_path / "a" / "results.csv")
    assert list(dict.fromkeys(df["math"])) == ["inductor", "torch_eager"]
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run["config"]["math"] == ["inductor", "torch_eager"]


def test_study_presets_is_the_old_spelling_with_one_warning(capsys, tmp_path):
    rc, out, err = _main([*Q, "--presets", "inductor", "torch_eager", "--out", tmp_path / "a"],
                         capsys)
    assert rc == 0, err
    assert _warnings(err) == [WARN_PRESETS]
    new = pd.read_csv(tmp_path / "a" / "results.csv")
    rc, out, err = _main([*Q, "--math", "inductor", "torch_eager", "--out", tmp_path / "b"],
                         capsys)
    assert rc == 0 and not _warnings(err)
    old = pd.read_csv(tmp_path / "b" / "results.csv")
    pd.testing.assert_frame_equal(new, old)


@pytest.fixture
def library_args(monkeypatch):
    """cli.cmd_libraries replaced by a recorder of the arguments it gets."""
    got: list = []
    monkeypatch.setattr(cli, "cmd_libraries", lambda args: got.append(args) or 0)
    return got


@pytest.mark.parametrize("argv,libs", [
    (["--math", "all"], ["all"]),
    (["--math", "liger", "flash_attn"], ["liger", "flash_attn"]),
    (["--math", "liger,transformer_engine"], ["liger", "transformer_engine"]),
])
def test_study_math_all_or_libraries_alone_still_run_the_libraries(argv, libs, library_args,
                                                                   capsys):
    rc, out, err = _main(["study", "--chains", "swiglu,rope", *argv], capsys)
    assert rc == 0, err
    assert library_args[0].libraries == libs and library_args[0].math is None
    shown = ",".join(libs)
    assert _warnings(err) == [f"castlab: warning: --math {shown} (kernel libraries) is "
                              f"deprecated; use --libraries {shown} (--math names math presets: "
                              + ", ".join(cl.Math.presets()) + ")"], err


@pytest.mark.parametrize("argv", [["--libraries", "all"], ["--library", "liger,flash_attn"],
                                  ["--libraries", "liger", "flash_attn"]])
def test_libraries_new_spellings_have_no_warning(argv, library_args, capsys):
    rc, out, err = _main(["study", *argv], capsys)
    assert rc == 0 and not _warnings(err), err
    assert library_args[0].libraries == [v for a in argv[1:] for v in a.split(",")]


@pytest.mark.parametrize("value", ["torch_eager", "transformer_engine"])
def test_a_name_that_is_both_a_library_and_a_math_preset_is_the_preset(value, library_args,
                                                                       capsys, tmp_path):
    rc, out, err = _main([*Q, "--math", value, "--out", tmp_path / "o"], capsys)
    assert rc == 0 and not library_args and not _warnings(err), err
    assert set(pd.read_csv(tmp_path / "o" / "results.csv")["math"]) == {value}


@pytest.mark.parametrize("argv,pattern", [
    (["--math", "liger,inductor"], r"'liger' is a kernel library, not a math preset; give "
                                   r"kernel libraries with --libraries"),
    (["--math", "all", "inductor"], r"'all' .* cannot be mixed with math presets; give "
                                    r"--libraries all"),
    (["--math", "nosuch"], r"--math: invalid choice: 'nosuch' \(choose from torch_eager, "),
    (["--presets", "liger"], r"--presets: invalid choice: 'liger'"),
    (["--libraries", "nosuch"], r"--libraries: invalid choice: 'nosuch' \(choose from all, "),
    (["--libraries", "liger", "--math", "inductor"], r"--math does not apply to --libraries"),
    (["--libraries", "liger", "--seeds", "1,2"], r"--libraries runs one seed: give --seed N"),
])
def test_study_math_and_libraries_refusals(argv, pattern, capsys, tmp_path):
    _refused(["study", "--device", "cpu", "--chains", "swiglu", "--out", tmp_path / "o", *argv],
             pattern, capsys)
    assert not (tmp_path / "o" / "results.csv").exists()


def test_exhaustive_math_is_the_math_preset_as_before(capsys):
    args = _parse(["exhaustive", "exp", "--math", "inductor", "portable"])
    assert args.math == ["inductor", "portable"]
    _refused(["exhaustive", "exp", "--math", "liger"], r"--math: invalid choice: 'liger'", capsys)


def test_config_key_math_and_the_old_presets_key(capsys, tmp_path):
    for key, warned in (("math", False), ("presets", True)):
        cfg = tmp_path / f"{key}.toml"
        cfg.write_text(f'{key} = ["nvfuser"]\n')
        rc, out, err = _main([*Q, "--config", cfg, "--out", tmp_path / key], capsys)
        assert rc == 0, err
        assert set(pd.read_csv(tmp_path / key / "results.csv")["math"]) == {"nvfuser"}
        assert _warnings(err) == ([f"castlab: warning: {cfg}: presets is deprecated; use math"]
                                  if warned else []), err
    cfg = tmp_path / "both.toml"
    cfg.write_text('math = ["nvfuser"]\npresets = ["inductor"]\n')
    rc, out, err = _main([*Q, "--config", cfg, "--out", tmp_path / "both"], capsys)
    assert rc == 2 and "math and presets (its old name) both give the math presets" in err


# ================================================================ 2. one option, one list syntax

@pytest.mark.parametrize("argvs,dest,want", [
    ([["--policy", "eager,fused"], ["--policies", "eager", "fused"],
      ["--policy", "eager", "--policies", "fused"]], "policies", ["eager", "fused"]),
    ([["--dtypes", "bf16,fp16"], ["--dtype", "bfloat16", "float16"],
      ["--dtype", "bf16", "--dtype", "fp16"]], "dtypes", ["bfloat16", "float16"]),
    ([["--seed", "0,7"], ["--seeds", "0", "7"], ["--seed", "0", "--seeds", "7"]], "seeds",
     [0, 7]),
    ([["--math", "inductor,portable"], ["--math", "inductor", "portable"]], "math",
     ["inductor", "portable"]),
    ([["--chains", "swiglu,rope"], ["--chain", "swiglu", "rope"]], "chains", ["swiglu", "rope"]),
    ([["--rounding", "nearest,stochastic"], ["--rounding", "nearest", "stochastic"]],
     "rounding", ["nearest", "stochastic"]),
    ([["--extra-presets", "inductor,nvfuser"], ["--extra-presets", "inductor", "nvfuser"]],
     "extra_presets", ["inductor", "nvfuser"]),
    ([["--shape", "swiglu=2x4,rope=1x2x8x16"], ["--shape", "swiglu=2x4", "rope=1x2x8x16"],
      ["--shapes", "swiglu=2x4", "--shape", "rope=1x2x8x16"]], "shape",
     ["swiglu=2x4", "rope=1x2x8x16"]),
    ([["--libraries", "liger,apex"], ["--library", "liger", "apex"]], "libraries",
     ["liger", "apex"]),
])
def test_study_spellings_and_list_syntaxes_agree(argvs, dest, want):
    for argv in argvs:
        assert getattr(_parse(["study", *argv]), dest) == want, argv


@pytest.mark.parametrize("argvs,dest,want", [
    ([["--policy", "eager,fused"], ["--policies", "eager", "fused"]], "policy",
     ["eager", "fused"]),
    ([["--dtype", "bf16"], ["--dtypes", "bfloat16"]], "dtype", ["bfloat16"]),
    ([["--seed", "3"], ["--seeds", "3"]], "seed", [3]),
    ([["--math", "inductor,torch_eager"], ["--math", "inductor", "torch_eager"]], "math",
     ["inductor", "torch_eager"]),
])
def test_exhaustive_spellings_and_list_syntaxes_agree(argvs, dest, want):
    for argv in argvs:
        assert getattr(_parse(["exhaustive", "exp", *argv]), dest) == want, argv


@pytest.mark.parametrize("argv", [
    ["exp", "--policy", "eager", "fused", "--dtype", "bf16"],
    ["--policy", "eager", "fused", "exp", "--dtype", "bf16"],
    ["--dtype", "bf16", "--policies", "eager,fused", "exp"],
    ["--policies", "eager", "--dtypes", "bfloat16", "--seed", "0", "--policy", "fused", "exp"],
])
def test_exhaustive_chain_may_follow_a_list_option(argv):
    args = _parse(["exhaustive", *argv])  # (cli._main takes a spilled value as the chain)
    assert (args.chain or getattr(args, "_spill", (None,))[0]) == "exp"
    assert args.policy == ["eager", "fused"] and args.dtype == ["bfloat16"]


@pytest.mark.parametrize("argv,pattern", [
    (["exhaustive", "--policy", "eager", "fused"], r"required: chain"),
    (["exhaustive", "--policy", "eager", "exp", "swiglu"], r"--policy: invalid choice: 'exp'"),
    (["exhaustive", "--policy", "eager", "swiglu", "--math", "inductor", "exp"],
     r"--policy: invalid choice: 'swiglu'"),
    (["exhaustive", "exp", "--policy", "eager", "swiglu"], r"--policy: invalid choice: 'swiglu'"),
    (["exhaustive", "--math", "exp"], r"--math: invalid choice: 'exp'"),
])
def test_exhaustive_chain_after_lists_refusals(argv, pattern, capsys, tmp_path):
    _refused([*argv, "--out", tmp_path / "o"], pattern, capsys)


def test_exhaustive_runs_with_the_chain_last(capsys, tmp_path):
    rc, out, err = _main(["exhaustive", "--device", "cpu", "--stop", "64", "--no-progress",
                          "--policies", "eager", "fused", "--out", tmp_path / "o", "--math",
                          "inductor", "exp"], capsys)
    assert rc == 0, err
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["config"]["chain"] == "exp" and run["config"]["math"] == ["inductor"]


@pytest.mark.parametrize("alias,name", [("bf16", "bfloat16"), ("fp16", "float16"),
                                        ("fp32", "float32"), ("fp64", "float64"),
                                        ("fp8_e4m3", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2")])
def test_dtype_aliases_in_every_list(alias, name):
    assert _parse(["study", "--dtypes", f"bf16,{alias}"]).dtypes == ["bfloat16", name]
    if name != "float64":
        assert _parse(["exhaustive", "exp", "--dtype", alias]).dtype == [name]


def test_the_spellings_give_the_same_study(capsys, tmp_path):
    a = ["study", "--device", "cpu", "--chains", "swiglu", "--shape", "swiglu=4x8",
         "--extra-presets", "--no-plots", "--no-progress"]
    rc, _, err = _main([*a, "--policy", "eager,fused", "--dtype", "bf16,fp16", "--seed", "0,1",
                        "--out", tmp_path / "one"], capsys)
    assert rc == 0, err
    rc, _, err = _main([*a, "--policies", "eager", "fused", "--dtypes", "bfloat16", "float16",
                        "--seeds", "0", "1", "--out", tmp_path / "two"], capsys)
    assert rc == 0, err
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "one" / "results.csv"),
                                  pd.read_csv(tmp_path / "two" / "results.csv"))


@pytest.mark.parametrize("argv,pattern", [
    (["study", "--dtypes", "bf16,fp9"], r"argument --dtypes: invalid choice: 'fp9'"),
    (["study", "--policy", "eager,lazy"], r"argument --policy: invalid choice: 'lazy'"),
    (["study", "--policies", ","], r"argument --policies: expected at least one value"),
    (["study", "--seed", "1,x"], r"argument --seed: expected an integer"),
    (["exhaustive", "exp", "--policies", "eager,fp64"], r"argument --policies: invalid choice"),
    (["exhaustive", "exp", "--dtypes", "bf16,fp16"], r"--dtype: castlab exhaustive runs one "
                                                     r"dtype at a time"),
    (["exhaustive", "exp", "--seeds", "1", "2"], r"--seed: castlab exhaustive runs one seed"),
])
def test_list_refusals_name_the_spelling_used(argv, pattern, capsys, tmp_path):
    _refused([*argv, "--out", tmp_path / "o"], pattern, capsys)


# ================================================================ 3. --shape NAME=SHAPE

@pytest.fixture
def fchain(tmp_path, monkeypatch):
    (tmp_path / "vocab53.py").write_text("def f(x, w):\n    return x * w\n")
    monkeypatch.chdir(tmp_path)
    return "vocab53.py:f"


def _shapes(tmp_path, name="o"):
    df = pd.read_csv(tmp_path / name / "results.csv")
    return {c: set(g["shape"]) for c, g in df.groupby("chain")}


S = ["study", "--device", "cpu", "--dtypes", "bfloat16", "--no-plots", "--no-progress",
     "--extra-presets"]


@pytest.mark.parametrize("shape_args,want", [
    (["--shape", "x=4x16", "--shape", "w=16"], "4x16,16"),
    (["--shape", "x=4x16,w=16"], "4x16,16"),
    (["--shape", "4x16", "--shape", "w=16"], "4x16,16"),                 # bare, then by name
    (["--shape", "vocab53.py:f=4x16", "--shape", "vocab53.py:f.w=1x16"], "4x16,1x16"),
    (["--shape", "vocab53.py:f=4x16", "--shape", "w=16", "--shape", "vocab53.py:f.w=4x1"],
     "4x16,4x1"),                                                      # CHAIN.NAME wins
    (["--shape", "vocab53.py:f=4x16"], "4x16,4x16"),                   # as before
])
def test_shape_by_input_name(shape_args, want, fchain, capsys, tmp_path):
    rc, out, err = _main([*S, "--chains", fchain, *shape_args, "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    assert _shapes(tmp_path) == {fchain: {want}}


def test_shape_by_name_reaches_a_builtin_chains_first_input(fchain, capsys, tmp_path):
    rc, out, err = _main([*S, "--chains", f"{fchain},swiglu", "--shape", "x=4x16", "w=16",
                          "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    assert _shapes(tmp_path) == {fchain: {"4x16,16"}, "swiglu": {"4x16"}}
    # the same inputs as the chain-wide shape of before
    rc, out, err = _main([*S, "--chains", "swiglu", "--shape", "swiglu=4x16",
                          "--out", tmp_path / "p"], capsys)
    assert rc == 0, err
    a = pd.read_csv(tmp_path / "o" / "results.csv")
    b = pd.read_csv(tmp_path / "p" / "results.csv")
    pd.testing.assert_frame_equal(a[a.chain == "swiglu"].reset_index(drop=True), b)
    rc, out, err = _main([*S, "--chains", "rope", "--shape", "rope.x=1x2x8x16",
                          "--out", tmp_path / "q"], capsys)
    assert rc == 0 and _shapes(tmp_path, "q") == {"rope": {"1x2x8x16"}}, err


def test_shape_by_name_keeps_the_inputs_of_a_chain_wide_shape(fchain, capsys, tmp_path):
    rc, _, err = _main([*S, "--chains", fchain, "--shape", f"{fchain}=4x16", "--out",
                        tmp_path / "a"], capsys)
    assert rc == 0, err
    rc, _, err = _main([*S, "--chains", fchain, "--shape", "x=4x16", "w=4x16", "--out",
                        tmp_path / "b"], capsys)
    assert rc == 0, err
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / "results.csv"),
                                  pd.read_csv(tmp_path / "b" / "results.csv"))


@pytest.mark.parametrize("shape_args,pattern", [
    (["q=4x4"], r"--shape 'q=4x4': unknown chain or input name 'q'; this study's chains and "
                r"their inputs: vocab53\.py:f\(x, w\); swiglu\(x\)"),
    (["x=4x16"], r"input 'w' of chain 'vocab53\.py:f' has no shape; give --shape w=AxB, "
                 r"--shape vocab53\.py:f\.w=AxB or --shape vocab53\.py:f=AxB"),
    (["vocab53.py:f.q=4"], r"chain 'vocab53\.py:f' has no input 'q'; its inputs: x, w"),
    (["other.py:g=4x4"], r"chain 'other\.py:g' is not in this study"),
    (["x=3x3", "w=3"], r"--shape 'x=3x3' \(it gives every chain's input 'x'; --shape "
                       r"swiglu\.x=\.\.\. gives swiglu's alone\): .*last dimension must be even"),
    (["=4x4"], r"nothing before '='"),
    (["x=4xa"], r"bad shape '4xa' for x"),
])
def test_shape_refusals_name_the_inputs(shape_args, pattern, fchain, capsys, tmp_path):
    _refused([*S, "--chains", f"{fchain},swiglu", "--shape", *shape_args,
              "--out", tmp_path / "o"], pattern, capsys)


def test_shape_of_a_builtin_chains_derived_input_is_refused(capsys, tmp_path):
    _refused([*S, "--chains", "rope", "--shape", "rope.cos=8x16", "--out", tmp_path / "o"],
             r"rope's input 'cos' is made from its 'x'; give --shape rope\.x=\.\.\. or "
             r"--shape rope=\.\.\.", capsys)


def test_shape_names_a_config_chains_input(capsys, tmp_path):
    (tmp_path / "vocab53c.py").write_text("def f(x, w):\n    return x * w\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[chains]]\nchain = "vocab53c.py:f"\nname = "g"\n'
                   '[[chains.inputs]]\nshape = [4, 16]\n[[chains.inputs]]\nshape = [4, 16]\n'
                   'dtype = "float32"\n')
    rc, out, err = _main([*S, "--config", cfg, "--shape", "g.w=16", "--out", tmp_path / "o"],
                         capsys)
    assert rc == 0, err
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert set(df["shape"]) == {"4x16,16"} and set(df["input"]) == {"normal, normal:float32"}


# ================================================================ 5. first line and run.json

def _first(out: str) -> str:
    return out.splitlines()[0]


def test_study_first_line_names_the_device(capsys, tmp_path):
    rc, out, err = _main([*Q, "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    line = _first(out)
    assert FIRST_LINE.match(line), line
    assert line.startswith(f"castlab study on cpu ({_runrecord.cpu_model()}, ")
    assert ": no usable CUDA GPU" not in line  # --device cpu was asked for: no fallback


def test_study_first_line_says_why_it_fell_back(capsys, tmp_path):
    if cl.cuda.is_available():
        pytest.skip("a GPU is present: the study runs there")
    argv = [a for a in Q if a not in ("--device", "cpu")]
    rc, out, err = _main([*argv, "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    assert re.match(r"castlab study on cpu \(.+\): no usable CUDA GPU \(.+\)$", _first(out))
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["device"] == "cpu" and run["device_fallback"].startswith("no usable CUDA GPU")


def _check_record(run: dict, command: str) -> None:
    for k in _runrecord.KEYS:
        assert k in run, k
    assert run["command"] == command and run["castlab_version"] == cl.__version__
    assert isinstance(run["argv"], list) and all(isinstance(a, str) for a in run["argv"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", run["date_utc"])
    h = run["castlab_git_hash"]
    assert h is None or re.fullmatch(r"[0-9a-f]{40}", h)
    assert run["castlab_git_dirty"] in (None, True, False)
    for k in ("torch", "torch_cuda", "torch_cpu_capability", "cuda_driver", "nvrtc", "gpu",
              "gpu_compute_capability", "device_fallback"):
        assert run[k] is None or isinstance(run[k], str), k
    assert run["gpu_sm_count"] is None or isinstance(run["gpu_sm_count"], int)
    assert isinstance(run["cpu"], str) and run["cpu"]
    assert isinstance(run["cpu_threads"], int) and run["cpu_threads"] >= 1
    assert run["castlab_torch_cpu_isa"] in ("avx512", "avx2", "default")
    assert isinstance(run["seeds"], list) and isinstance(run["config"], dict)
    if run["device"].startswith("cuda"):
        assert run["gpu"] and run["gpu_sm_count"] > 0
    if importlib.util.find_spec("torch") is not None:
        assert run["torch"] and run["torch_cpu_capability"], run.get("torch_error")
    else:
        assert run["torch"] is None
    assert run["status"] == "finished" and isinstance(run["elapsed_s"], float)


def test_study_run_json_and_summary(capsys, tmp_path):
    rc, out, err = _main([*Q, "--seeds", "3,4", "--math", "inductor", "--out", tmp_path / "o"],
                         capsys)
    assert rc == 0, err
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    _check_record(run, "study")
    assert run["seeds"] == [3, 4] and run["device"] == "cpu"
    c = run["config"]
    assert c["math"] == ["inductor"] and c["policies"] == ["eager", "fused"]
    assert c["dtypes"] == ["bfloat16"] and c["seeds"] == [3, 4] and c["shapes"] == {"swiglu": [2, 4]}
    assert c["chains"] == [{"name": "swiglu", "source": "swiglu", "input_names": ["x"]}]
    assert c["extra_presets"] == {"swiglu": []} and c["device"] == "cpu"
    assert c["out"] == str(tmp_path / "o") and c["plots"] is False and c["progress"] is False
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["run"] == {k: v for k, v in run.items() if k not in ("status", "elapsed_s")}
    assert "run.json" in out.splitlines()[-1]


def test_libraries_and_exhaustive_write_the_record_too(capsys, tmp_path):
    rc, out, err = _main(["study", "--libraries", "torch_eager", "--chains", "swiglu",
                          "--dtypes", "bf16", "--quick", "--device", "cpu",
                          "--out", tmp_path / "lib"], capsys)
    assert rc == 0, err
    assert FIRST_LINE.match(_first(out)), _first(out)
    run = json.loads((tmp_path / "lib" / "run.json").read_text())
    _check_record(run, "study")
    assert run["config"]["libraries"] == ["torch_eager"] and run["seeds"] == [0]
    assert json.loads((tmp_path / "lib" / "summary.json").read_text())["run"]["command"] == "study"
    rc, out, err = _main(["exhaustive", "exp", "--device", "cpu", "--stop", "4096", "--seed", "5",
                          "--out", tmp_path / "ex"], capsys)
    assert rc == 0, err
    assert FIRST_LINE.match(_first(out)) and _first(out).startswith("castlab exhaustive on cpu")
    run = json.loads((tmp_path / "ex" / "run.json").read_text())
    _check_record(run, "exhaustive")
    assert run["seeds"] == [5] and run["inputs"] == 4096
    assert run["config"]["math"] == ["torch_eager"] and run["config"]["policy"] == ["eager", "fused"]
    assert run["config"]["dtype"] == "bfloat16" and run["config"]["stop"] == 4096


def test_a_failed_run_says_so_in_run_json(capsys, tmp_path):
    _refused(["exhaustive", "swiglu", "--device", "cpu", "--max-seconds", "0.001",
              "--out", tmp_path / "o"], r"--allow-long", capsys)
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["status"] == "failed" and "--allow-long" in run["error"]


def test_castlab_never_imports_torch_for_its_record(tmp_path):
    # a loaded torch changes what castlab's torch_cpu math follows: the record asks a child
    code = ("import sys; from castlab import cli\n"
            f"rc = cli.main({[*Q, '--out', str(tmp_path / 'o')]!r})\n"
            "print('TORCH_LOADED', 'torch' in sys.modules, rc)\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [PKG, env.get("PYTHONPATH", "")] if p)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300, cwd=tmp_path)
    assert "TORCH_LOADED False 0" in p.stdout, p.stdout + p.stderr
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    if importlib.util.find_spec("torch") is not None:
        assert run["torch"] and run["torch_cpu_capability"], run
        # without torch loaded, castlab's torch_cpu math models the build torch would
        # dispatch to here (Math.cpu_isa "auto"): the record shows both, and they agree
        assert run["castlab_torch_cpu_isa"] == run["torch_cpu_capability"].lower(), run


@pytest.fixture
def fake_gpu(monkeypatch):
    """castlab.cuda as on an H200 machine (its info() as bind_cuda.cpp builds it)."""
    info = {"available": True, "driver_version": "12.8", "nvrtc_version": "12.8",
            "devices": [{"index": i, "name": "NVIDIA H200", "compute_capability": (9, 0),
                         "total_memory": 150 << 30, "multiprocessors": 132} for i in range(2)]}
    monkeypatch.setattr(_runrecord.cuda, "info", lambda: dict(info))
    monkeypatch.setattr(_runrecord.cuda, "is_available", lambda: True)
    return info


def test_gpu_first_line_and_record(fake_gpu):
    assert _runrecord.first_line("study", "cuda") == "castlab study on cuda:0 (NVIDIA H200, 132 SMs)"
    assert _runrecord.first_line("exhaustive", "cuda:1") == \
        "castlab exhaustive on cuda:1 (NVIDIA H200, 132 SMs)"
    assert FIRST_LINE.match(_runrecord.first_line("study", "cuda"))
    assert _runrecord.first_line("study", "cuda", workers=2) == \
        "castlab study on cuda (NVIDIA H200, 132 SMs) with 2 Dask workers"
    assert _runrecord.fallback_reason(None, "cuda") is None
    rec = _runrecord.record("exhaustive", "cuda:1", {"a": (1, 2)}, 7)
    assert rec["device"] == "cuda:1" and rec["gpu"] == "NVIDIA H200" and rec["gpu_sm_count"] == 132
    assert rec["gpu_compute_capability"] == "9.0" and rec["cuda_driver"] == "12.8"
    assert rec["nvrtc"] == "12.8" and rec["seeds"] == [7] and rec["config"] == {"a": [1, 2]}
    json.dumps(rec)


def test_cpu_first_line_forms():
    line = _runrecord.first_line("study", "cpu", "no usable CUDA GPU (x)",
                                 torch={"version": "2.9", "cpu_capability": "AVX2"})
    model = _runrecord.cpu_model()
    isa = cl.Math.preset("torch_eager").torch_cpu_isa()
    extra = "" if isa == "avx2" else f"; castlab models torch's {isa} kernels"
    assert line == f"castlab study on cpu ({model}, torch ISA avx2{extra}): no usable CUDA GPU (x)"
    line = _runrecord.first_line("exhaustive", "cpu", torch={"version": None})
    assert line == f"castlab exhaustive on cpu ({model}, no torch; castlab models torch's {isa} " \
        "kernels)"
    assert _runrecord.first_line("study", "cpu", workers=3, torch={"version": None}).endswith(
        " with 3 Dask workers")


def test_git_revision_is_none_outside_castlabs_checkout(monkeypatch, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("no git")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "pkg").mkdir()
    monkeypatch.setattr(_runrecord, "__file__", str(tmp_path / "pkg" / "_runrecord.py"))
    assert _runrecord.git_revision() == (None, None)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no git at all: still no error
    assert _runrecord.git_revision() == (None, None)


def test_git_revision_of_this_checkout():
    pkg = os.path.dirname(os.path.realpath(cl.__file__))
    if shutil.which("git") is None or not os.path.isdir(os.path.join(pkg, "..", "..", ".git")) \
            and not os.path.isfile(os.path.join(pkg, "..", "..", ".git")):
        pytest.skip("castlab is not run from a git checkout")
    head, dirty = _runrecord.git_revision()
    assert re.fullmatch(r"[0-9a-f]{40}", head) and dirty in (True, False)


def test_info_names_the_cpu(capsys):
    assert cli.main(["info"]) == 0
    assert f"cpu: {_runrecord.cpu_model()}" in capsys.readouterr().out


# ================================================================ 6. castlab exhaustive

EX = ["exhaustive", "swiglu", "--dtype", "bf16", "--values", "finite", "--sample", "24",
      "--device", "cpu"]


def test_exhaustive_shows_its_estimate_and_progress(capsys, tmp_path):
    rc, out, err = _main([*EX, "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    n = 65280 * 24
    assert re.search(rf"castlab exhaustive: {n} inputs, about [\d.]+ s at [\d.e+]+ inputs/s "
                     r"\(measured on the first 1048576\)", err), err
    bars = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert bars and bars[-1].startswith(f"[{'#' * 28}] {n}/{n} ") and "inputs/s" in bars[-1]
    assert all("inputs/s" in b for b in bars), bars
    assert "\r" not in err  # not a terminal: whole lines
    rc, out, err = _main([*EX, "--no-progress", "--out", tmp_path / "p"], capsys)
    assert rc == 0 and "inputs/s" not in err and not err.strip(), err


def test_exhaustive_refuses_old_results_unless_overwrite(capsys, tmp_path):
    argv = ["exhaustive", "exp", "--device", "cpu", "--stop", "1024", "--no-progress",
            "--out", tmp_path / "o"]
    rc, out, err = _main(argv, capsys)
    assert rc == 0, err
    before = (tmp_path / "o" / "exhaustive.json").read_text()
    line = _refused(argv, r"--out '.*' already holds results \(exhaustive\.json, "
                          r"exhaustive\.csv\); pass --overwrite", capsys)
    assert "castlab exhaustive on" not in line
    assert (tmp_path / "o" / "exhaustive.json").read_text() == before
    rc, out, err = _main([*argv, "--overwrite"], capsys)
    assert rc == 0, err
    # a folder with run.json only (a refused run) is no result
    (tmp_path / "o" / "exhaustive.json").unlink()
    (tmp_path / "o" / "exhaustive.csv").unlink()
    assert _main(argv, capsys)[0] == 0


def test_exhaustive_refusal_names_cli_flags_not_python_arguments(capsys, tmp_path):
    line = _refused(["exhaustive", "swiglu", "--device", "cpu", "--max-seconds", "0.001",
                     "--out", tmp_path / "o"], r"would take about \d+ s", capsys)
    for flag in ("--allow-long", "--max-seconds", "--start/--stop", "--sample"):
        assert flag in line, (flag, line)
    for py in ("allow_long", "max_seconds=", "Enumeration.sample", "(start/stop)"):
        assert py not in line, (py, line)
    line = _refused(["exhaustive", "exp", "--device", "cpu", "--start", "70000",
                     "--out", tmp_path / "p"], r"--start/--stop", capsys)
    assert "outside the 65536 inputs of exp" in line


def test_exhaustive_progress_keeps_the_statistics():
    import castlab.numerics as nm
    E = nm.Enumeration
    f = cli.EXHAUSTIVE_CHAINS["swiglu"]
    ins = [E.finite(cl.bfloat16), E.sample(cl.bfloat16, 20, seed=2)]
    cfgs = [("eager", "torch_eager"), ("fused", "inductor")]
    a = nm.exhaustive(f, ins, cfgs).to_dict()
    calls: list = []
    b = nm.exhaustive(f, ins, cfgs, progress=lambda d, n, s: calls.append((d, n))).to_dict()
    a.pop("seconds", None)
    b.pop("seconds", None)
    assert a == b
    assert calls[-1] == (65280 * 20, 65280 * 20) and len(calls) >= 2
    assert all(x[0] < y[0] for x, y in zip(calls, calls[1:]))
    with pytest.raises(TypeError, match="progress must be None or a function"):
        nm.exhaustive(f, ins, cfgs, progress=3)


# ================================================================ 7. torch_same_vs_eager

def test_torch_same_vs_eager_in_rows_table_legend_and_summary(capsys, tmp_path):
    rc, out, err = _main([*Q, "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert "torch_same_vs_eager" in df.columns and "same_vs_eager" not in df.columns
    assert "torch_same_vs_eager" in study.row_columns()
    header = out.splitlines()[1].split()
    assert "torch_same_vs_eager" in header and "same_vs_eager" not in header
    assert re.search(r"mismatch_vs_eager: .*\(bitwise", out)
    assert re.search(r"torch_same_vs_eager: PyTorch's accuracy check "
                     r"torch\._dynamo\.utils\.same\(\) against eager \(tolerance-based", out)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    case = summary["cases"][0]
    row = case[next(k for k in case if "/" in k)]
    assert "torch_same_vs_eager" in row and "same_vs_eager" not in row


def test_resume_reads_old_same_vs_eager_cells(capsys, tmp_path):
    small = ["study", "--device", "cpu", "--chains", "swiglu", "--dtypes", "bf16,fp16",
             "--shape", "swiglu=4x8", "--extra-presets", "--no-plots", "--no-progress"]
    rc, _, err = _main([*small, "--out", tmp_path / "full"], capsys)
    assert rc == 0, err
    part = tmp_path / "part"
    rc, _, err = _main([*small, "--out", part], capsys)
    assert rc == 0, err
    # cells.jsonl as the castlab before the rename wrote it, with its second cell missing
    recs = [json.loads(x) for x in (part / "cells.jsonl").read_text().splitlines()]
    old = recs[0]
    old["rows"] = [{("same_vs_eager" if k == "torch_same_vs_eager" else k): v
                    for k, v in r.items()} for r in old["rows"]]
    (part / "cells.jsonl").write_text(json.dumps(old) + "\n")
    rc, _, err = _main([*small, "--out", part, "--resume"], capsys)
    assert rc == 0, err
    a = pd.read_csv(tmp_path / "full" / "results.csv")
    b = pd.read_csv(part / "results.csv")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert b["torch_same_vs_eager"].notna().all()
    assert "same_vs_eager" not in (part / "cells.jsonl").read_text().replace(
        "torch_same_vs_eager", "")


def test_upgrade_record_renames_in_place():
    rec = {"key": {"a": 1}, "rows": [{"chain": "s", "same_vs_eager": False, "x": 1}]}
    up = study.upgrade_record(rec)
    assert list(up["rows"][0]) == ["chain", "torch_same_vs_eager", "x"]
    assert up["rows"][0]["torch_same_vs_eager"] is False and rec["rows"][0]["same_vs_eager"] is False
    assert study.upgrade_record(up) is up
    assert study.upgrade_record({"key": {}, "rows": 5}) == {"key": {}, "rows": 5}
