"""Hostile input to the command line and the numerics API (issue 50): every bad value ends
with one line ``castlab: error: ...`` and a non-zero exit code (the CLI), or a clear
TypeError/ValueError naming the argument (the API), before any work starts; never a
traceback, a hang or a silent success.

Most CLI cases call ``castlab.cli.main(argv)`` in this process (fast); the few whose
failure mode is a hang, an exit from the user's code or a Dask cluster run ``python -m
castlab`` in a subprocess with a timeout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import castlab as cl
from castlab import cli
from castlab import numerics as nm
from castlab.numerics import Enumeration

HERE = os.path.dirname(os.path.abspath(__file__))
# The folder castlab was imported from (the installed package in CI, python/ in a
# development build): children import the same castlab.
PKG = os.path.dirname(os.path.dirname(os.path.abspath(cl.__file__)))

# a small study that runs in well under a second
Q = ["study", "--device", "cpu", "--chains", "swiglu", "--dtypes", "bfloat16", "--no-plots",
     "--no-progress", "--extra-presets", "--shape", "swiglu=2x4"]
EX = ["exhaustive", "exp", "--device", "cpu"]

CHAINS = {
    "sx_import.py": "raise SystemExit(3)\n",
    "sx_body.py": "import sys\ndef f(a):\n    sys.exit(4)\n",
    "tup.py": "def f(a, b):\n    return a * b, a + b\n",
    "boolout.py": "def f(a):\n    return a > 0\n",
    "notfn.py": "f = 3\n",
    "noret.py": "def f(a):\n    pass\n",
    "boom.py": "def f(a):\n    raise RuntimeError('kaboom')\n",
    "fails_later.py": ("N = [0]\ndef f(a, b):\n    N[0] += 1\n    if N[0] > 1:\n"
                       "        raise ZeroDivisionError('boom in cell')\n    return a * b\n"),
}


@pytest.fixture
def chains(tmp_path):
    for name, text in CHAINS.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def _main(argv, capsys):
    t0 = time.perf_counter()
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err, time.perf_counter() - t0


def _refused(argv, pattern, capsys, max_s=30.0):
    """The CLI refuses argv: exit code 2, one line `castlab: error: ...` matching pattern."""
    rc, out, err, dt = _main(argv, capsys)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith("castlab: error: "), lines[0]
    assert re.search(pattern, lines[0]), (pattern, lines[0])
    assert dt < max_s, f"refused only after {dt:.1f} s"
    return lines[0]


def _sub(argv, cwd, timeout=120):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [PKG, env.get("PYTHONPATH", "")] if p)
    return subprocess.run([sys.executable, "-m", "castlab", *[str(a) for a in argv]],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def _last(p) -> str:
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# ================================================================ item 7: Enumeration tables

@pytest.mark.parametrize("table,exc,pattern", [
    (np.array([0x3F80, 0x13F80], np.uint64), ValueError, r"table\[1\] = 81792.*bfloat16"),
    (np.array([-1]), ValueError, r"table\[0\] = -1.*bit pattern"),
    ([0x3F80, -5], ValueError, r"table\[1\] = -5"),
    ([1, 2**70], ValueError, r"table\[1\]"),
    (np.array([1.0, 2.0]), TypeError, r"integer bit patterns.*float64"),
    ([0x3F80, 1.5], TypeError, r"integer"),
    ([1, True], TypeError, r"table\[1\] = True"),
    (np.array([[1, 2]]), ValueError, r"one-dimensional"),
    ("0x3F80", TypeError, r"table must be"),
    (np.array(["a"]), TypeError, r"integer bit patterns"),
    (np.array([], np.uint64), ValueError, r"empty"),
    (np.array([0x10000], np.uint32), ValueError, r"table\[0\] = 65536"),
])
def test_enumeration_table_refuses_bad_patterns(table, exc, pattern):
    with pytest.raises(exc, match=pattern):
        Enumeration(cl.bfloat16, table=table)


def test_enumeration_table_accepts_every_pattern_of_its_dtype():
    e = Enumeration(cl.bfloat16, table=np.array([0, 0x3F80, 0xFFFF], np.uint16))
    assert e.bits_at(2) == 0xFFFF and e.values()[1] == 1.0
    assert Enumeration(cl.float8_e4m3fn, table=[0xFF]).bits_at(0) == 0xFF
    with pytest.raises(ValueError, match=r"table\[0\] = 256.*float8_e4m3fn"):
        Enumeration(cl.float8_e4m3fn, table=[0x100])


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda: Enumeration(cl.bfloat16, 1.5, 2), TypeError, r"lo must be an integer"),
    (lambda: Enumeration(cl.bfloat16, True, 2), TypeError, r"lo must be an integer"),
    (lambda: Enumeration(cl.bfloat16, -1, 3), ValueError, r"outside the 16-bit patterns"),
    (lambda: Enumeration(cl.bfloat16, 0, 2.0), TypeError, r"count must be an integer"),
    (lambda: Enumeration(cl.bfloat16, 0x10000, 1), ValueError, r"outside"),
    (lambda: Enumeration(cl.int32, 0, 1), TypeError, r"not a floating-point"),
    (lambda: Enumeration.bits(cl.bfloat16, 0.5, 4), TypeError, r"start must be an integer"),
    (lambda: Enumeration.bits(cl.bfloat16, 0, float("nan")), TypeError, r"stop must be an integer"),
    (lambda: Enumeration.bits(cl.bfloat16, -4, 4), ValueError, r"outside"),
    (lambda: Enumeration.sample(cl.bfloat16, 0), ValueError, r"n must be >= 1"),
    (lambda: Enumeration.sample(cl.bfloat16, -3), ValueError, r"n must be >= 1"),
    (lambda: Enumeration.sample(cl.bfloat16, 2.5), TypeError, r"n must be an integer"),
    (lambda: Enumeration.sample(cl.bfloat16, 4, seed=-1), ValueError, r"seed must be >= 0"),
    (lambda: Enumeration.sample(cl.bfloat16, 4, seed=1.5), TypeError, r"seed must be an integer"),
    (lambda: Enumeration.sample(cl.bfloat16, 4, finite="no"), TypeError, r"finite must be"),
    (lambda: Enumeration.sample(cl.bfloat16, 10**6), ValueError, r"values asked"),
])
def test_enumeration_constructors_check_their_numbers(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# ================================================================ item 12: numerics.exhaustive

BF = [Enumeration.bits(cl.bfloat16, 0x3F80, 0x3F90)]


@pytest.mark.parametrize("kw,exc,pattern", [
    ({"max_seconds": float("nan")}, ValueError, r"max_seconds.*nan"),
    ({"max_seconds": float("inf")}, ValueError, r"max_seconds.*allow_long"),
    ({"max_seconds": -1}, ValueError, r"max_seconds must be a positive"),
    ({"max_seconds": 0}, ValueError, r"max_seconds must be a positive"),
    ({"max_seconds": True}, TypeError, r"max_seconds must be a number"),
    ({"max_seconds": "10"}, TypeError, r"max_seconds must be a number"),
    ({"max_seconds": None}, TypeError, r"max_seconds must be a number"),
    ({"first_k": -1}, ValueError, r"first_k"),
    ({"first_k": 2.0}, ValueError, r"first_k"),
    ({"first_k": True}, ValueError, r"first_k"),
    ({"first_k": 2**40}, ValueError, r"first_k"),
    ({"start": -1}, ValueError, r"start must be >= 0"),
    ({"start": 1.5}, TypeError, r"start must be an integer"),
    ({"start": True}, TypeError, r"start must be an integer"),
    ({"stop": float("nan")}, TypeError, r"stop must be an integer"),
    ({"stop": -3}, ValueError, r"stop must be >= 0"),
    ({"start": 5, "stop": 5}, ValueError, r"empty"),
    ({"stop": 10**6}, ValueError, r"outside"),
    ({"allow_long": "yes"}, TypeError, r"allow_long must be True or False"),
    ({"device": "tpu"}, ValueError, r"tpu"),
])
def test_exhaustive_checks_every_number_before_running(kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        nm.exhaustive(cl.exp, BF, ["fused"], **kw)


def test_exhaustive_nan_max_seconds_is_refused_before_the_first_chunk():
    # 2**32 inputs: with the old `estimate > max_seconds` guard NaN ran them all
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="max_seconds"):
        nm.exhaustive(lambda a, b: a * b, [cl.bfloat16] * 2, ["fused"],
                      max_seconds=float("nan"))
    assert time.perf_counter() - t0 < 5


def test_exhaustive_still_runs_with_valid_numbers():
    r = nm.exhaustive(cl.exp, BF, ["fused"], max_seconds=30, start=np.int64(2), stop=10,
                      first_k=0)
    assert r.n == 8


# ================================================================ items 12, 20: castlab exhaustive

@pytest.mark.parametrize("extra,pattern", [
    (["--max-seconds", "nan"], r"--max-seconds.*nan"),
    (["--max-seconds=-1"], r"--max-seconds.*-1"),
    (["--max-seconds", "inf"], r"--max-seconds.*--allow-long"),
    (["--max-seconds", "0"], r"--max-seconds"),
    (["--max-seconds", "soon"], r"--max-seconds.*soon"),
    (["--sample", "0"], r"--sample.*>= 1"),
    (["--sample=-3"], r"--sample"),
    (["--sample", "1.5"], r"--sample.*integer"),
    (["--sample", "8"], r"--sample .*exp has one input"),
    (["--seed=-1"], r"--seed"),
    (["--seed", str(2**64)], r"--seed"),
    (["--start=-1"], r"--start"),
    (["--start", "1e3"], r"--start.*integer"),
    (["--stop=-1"], r"--stop"),
    (["--start", "7", "--stop", "7"], r"empty"),
    (["--first-k=-1"], r"--first-k"),
    (["--first-k", str(2**40)], r"--first-k"),
    (["--dtype", "int8"], r"--dtype.*invalid choice"),
    (["--values", "some"], r"--values"),
    (["--math", ",,"], r"--math"),
    (["--math", "nosuch"], r"--math"),
    (["--policy", "fp64"], r"--policy"),
    (["--device", "tpu"], r"--device.*tpu"),
    (["--device", "cuda:x"], r"--device"),
    (["--ref-math", "nosuch"], r"(?i)math|preset"),
])
def test_cli_exhaustive_bad_options(extra, pattern, capsys, tmp_path):
    _refused([*EX, "--out", tmp_path / "o", *extra], pattern, capsys)


def test_cli_exhaustive_unknown_chain_and_missing_chain(capsys):
    _refused(["exhaustive", "nosuchchain"], r"unknown chain", capsys)
    _refused(["exhaustive"], r"required.*chain", capsys)


@pytest.mark.parametrize("setup,out,pattern", [
    ({"file": "x"}, "file", r"--out .* is not a folder"),
    ({"file": "x"}, "file/sub", r"cannot write to --out"),
    ({"o/exhaustive.json/": None}, "o", r"exhaustive\.json.*a folder"),
    ({"o/exhaustive.csv/": None}, "o", r"exhaustive\.csv.*a folder"),
    ({}, "", r"--out must name a folder"),
])
def test_cli_exhaustive_checks_out_before_the_run(setup, out, pattern, capsys, tmp_path):
    for name, text in setup.items():
        p = tmp_path / name
        if text is None:
            p.mkdir(parents=True)
        else:
            p.write_text(text)
    # --allow-long over all 2**32 inputs: refused at once or this would run for minutes
    argv = ["exhaustive", "swiglu", "--device", "cpu", "--allow-long",
            "--out", str(tmp_path / out) if out else ""]
    _refused(argv, pattern, capsys, max_s=5)


@pytest.mark.parametrize("chain,pattern", [
    ("tup.py:f", r"returns a tuple of 2 tensors; it must return one tensor"),
    ("boolout.py:f", r"bool.*not floating point"),
    ("notfn.py:f", r"not a function"),
    ("noret.py:f", r"(?i)tensor|traced"),
    ("boom.py:f", r"could not be traced.*kaboom"),
    ("sx_body.py:f", r"SystemExit: 4"),
    ("sx_import.py:f", r"importing .*sx_import\.py failed \(SystemExit: 3\)"),
])
def test_cli_exhaustive_bad_chains(chain, pattern, chains, capsys):
    _refused(["exhaustive", f"{chains}/{chain}", "--device", "cpu", "--out", chains / "o"],
             pattern, capsys)


@pytest.mark.parametrize("flag", ["nan", "-1"])
def test_cli_exhaustive_max_seconds_reproducer_subprocess(flag, tmp_path):
    # the reproducer of items 12 and 20: refused at once, not 2**32 inputs later
    p = _sub(["exhaustive", "swiglu", "--device", "cpu", f"--max-seconds={flag}",
              "--out", tmp_path / "o"], tmp_path, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--max-seconds" in _last(p) and "would take" not in p.stderr
    assert not (tmp_path / "o").exists()


# ================================================================ castlab study: numbers and paths

@pytest.mark.parametrize("extra,pattern", [
    (["--seed=-1"], r"--seed"),
    (["--seed", "1.5"], r"--seed.*integer"),
    (["--seed", str(2**64)], r"--seed"),
    (["--seeds", "1", "-2"], r"--seeds"),
    (["--workers", "0"], r"--workers.*>= 1|--workers.*\[1"),
    (["--workers=-2"], r"--workers"),
    (["--workers", "two"], r"--workers.*integer"),
    (["--workers", "100000"], r"--workers.*integer in \[1, \d+\]"),
    (["--scale", "nan"], r"--scale"),
    (["--scale", "1e400"], r"--scale"),
    (["--scale", "-0.0"], r"--scale"),
    (["--shape", "swiglu=2x-4"], r"positive"),
    (["--shape", "swiglu=2.5x4"], r"shape"),
    (["--resume", "--overwrite"], r"give one"),
    (["--libraries", "all", "--workers", "2"], r"does not apply to --libraries"),
    (["--input", "cauchy"], r"--input"),
    (["--workers", "2", "--scheduler", "tcp://127.0.0.1:8786"], r"give one"),
    (["--scheduler", ""], r"--scheduler needs the address"),
    (["--config", ""], r"--config needs a TOML file"),
    (["--config", "/nonexistent/c.toml"], r"not found"),
    (["--rounding", "up"], r"--rounding"),
])
def test_cli_study_bad_options(extra, pattern, capsys, tmp_path):
    _refused([*Q, "--out", tmp_path / "o", *extra], pattern, capsys)
    assert not (tmp_path / "o" / "results.csv").exists()


@pytest.mark.parametrize("toml,pattern", [
    ("seeds = [1.5]\n", r"seeds\[0\] must be an integer"),
    ("seeds = [true]\n", r"seeds\[0\] must be an integer"),
    ("seed = -3\n", r"seeds\[0\]"),
    ("scale = true\n", r"scale"),
    ("scale = inf\n", r"scale"),
    ("scale = -2.0\n", r"scale"),
    ('out = ""\n', r"--out must name a folder"),
    ("out = 3\n", r"out must be a string"),
    ("quick = 1\n", r"quick must be true or false"),
    ("shapes = { swiglu = [2, -4] }\n", r"positive"),
    ("shapes = { swiglu = [2.5, 4] }\n", r"(?i)integer|shape"),
])
def test_cli_study_bad_config_numbers(toml, pattern, capsys, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    argv = ["study", "--device", "cpu", "--chains", "swiglu", "--dtypes", "bfloat16",
            "--no-plots", "--no-progress", "--extra-presets", "--config", cfg]
    _refused(argv, pattern, capsys)


@pytest.mark.parametrize("name", ["results.csv", "summary.json", "cells.jsonl", "rel_rmse.png"])
def test_cli_study_refuses_an_output_file_that_is_a_folder_before_running(name, capsys, tmp_path):
    (tmp_path / "o" / name).mkdir(parents=True)
    line = _refused([*Q, "--out", tmp_path / "o", "--overwrite"], rf"{re.escape(name)}.*a folder",
                    capsys)
    assert "cannot write" in line
    assert not (tmp_path / "o" / "results.csv").is_file()


def test_cli_study_out_nul_and_file(capsys, tmp_path):
    _refused([*Q, "--out", "bad\0name"], r"NUL", capsys)
    (tmp_path / "f").write_text("x")
    _refused([*Q, "--out", tmp_path / "f"], r"not a folder", capsys)


@pytest.mark.parametrize("chain,pattern", [
    ("tup.py:f", r"returns a tuple of 2 tensors; a chain must return one tensor"),
    ("boolout.py:f", r"returns a bool tensor.*floating-point"),
    ("sx_import.py:f", r"importing .*sx_import\.py failed \(SystemExit: 3\)"),
    ("sx_body.py:f", r"cannot be traced.*SystemExit: 4"),
    ("boom.py:f", r"cannot be traced.*kaboom"),
    ("notfn.py:f", r"not a function"),
])
def test_cli_study_bad_chains(chain, pattern, chains, capsys):
    spec = f"{chains}/{chain}"
    _refused(["study", "--device", "cpu", "--dtypes", "bfloat16", "--no-plots", "--no-progress",
              "--chains", spec, "--shape", f"{spec}=4x4", "--out", chains / "o"], pattern, capsys)
    assert not (chains / "o" / "results.csv").exists()


def test_cli_study_a_failing_cell_exits_2_naming_the_cell(chains, capsys):
    spec = f"{chains}/fails_later.py:f"
    line = _refused(["study", "--device", "cpu", "--dtypes", "bfloat16", "float16",
                     "--no-plots", "--no-progress", "--chains", spec, "--shape", f"{spec}=4x4",
                     "--out", chains / "o"], r"cell .*fails_later\.py:f float16 seed=0 failed: "
                    r"ZeroDivisionError: boom in cell", capsys)
    assert "--resume" in line
    # the cell that finished is kept for --resume
    assert len((chains / "o" / "cells.jsonl").read_text().splitlines()) == 1


# ================================================================ items 15, 8: by subprocess

def test_item15_systemexit_at_import_is_named_and_exit_2(chains):
    spec = f"{chains}/sx_import.py:f"
    for argv in (["exhaustive", spec, "--device", "cpu", "--out", chains / "o"],
                 ["study", "--device", "cpu", "--chains", spec, "--shape", f"{spec}=4x4",
                  "--out", chains / "o2"]):
        p = _sub(argv, chains, timeout=60)
        assert p.returncode == 2, (p.returncode, p.stderr)
        assert "sx_import.py" in _last(p) and "SystemExit" in _last(p)
        assert _last(p).startswith("castlab: error:") and "Traceback" not in p.stderr


@pytest.mark.slow  # ~15 s (a Dask cluster)
def test_item8_workers_and_serial_agree_on_a_failed_cell(chains):
    spec = f"{chains}/fails_later.py:f"
    base = ["study", "--device", "cpu", "--dtypes", "bfloat16", "float16", "--no-plots",
            "--no-progress", "--chains", spec, "--shape", f"{spec}=4x4"]
    serial = _sub([*base, "--out", chains / "s"], chains, timeout=120)
    try:
        dask = _sub([*base, "--out", chains / "d", "--workers", "1"], chains, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("castlab study --workers hung on a path/file.py chain")
    if "pip install 'dask[distributed]'" in dask.stderr:
        pytest.skip("dask.distributed not installed")
    for p in (serial, dask):
        assert p.returncode == 2, p.stderr
        assert "Traceback" not in p.stderr, p.stderr[-2000:]
        assert re.match(r"castlab: error: study: cell \S*fails_later\.py:f \w+ seed=0 failed: "
                        r"ZeroDivisionError: boom in cell", _last(p)), _last(p)


# ================================================================ item 17: a corrupt cells.jsonl

@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished small study's folder (for --resume cases)."""
    d = tmp_path_factory.mktemp("finished")
    assert cli.main([*Q, "--out", str(d / "o")]) == 0
    return d / "o"


def _record(finished) -> dict:
    return json.loads((finished / "cells.jsonl").read_text().splitlines()[0])


def _bad_rec(finished, edit) -> bytes:
    rec = _record(finished)
    edit(rec)
    return (json.dumps(rec) + "\n").encode()


CORRUPT = {
    "binary-garbage": lambda f: b"\xff\xfe\x00garbage\x00\x01",
    "invalid-utf8-line-2": lambda f: (f / "cells.jsonl").read_bytes() + b"{\"key\": \"\xe9\"}\n",
    "not-json-middle": lambda f: b"not json\n" + (f / "cells.jsonl").read_bytes(),
    "json-list": lambda f: b"[1, 2]\n",
    "no-rows": lambda f: b'{"key": {}}\n',
    "no-key": lambda f: b'{"rows": []}\n',
    "key-int": lambda f: b'{"key": 3, "rows": []}\n',
    "rows-not-list": lambda f: b'{"key": {}, "rows": 5}\n',
    "row-extra-column": lambda f: _bad_rec(f, lambda r: r["rows"][0].update(bogus=1)),
    "row-missing-column": lambda f: _bad_rec(f, lambda r: r["rows"][0].pop("max_ulp")),
    "row-text-metric": lambda f: _bad_rec(f, lambda r: r["rows"][0].update(correctly_rounded="x")),
    "row-bool-numel": lambda f: _bad_rec(f, lambda r: r["rows"][0].update(numel=True)),
    "row-chain-number": lambda f: _bad_rec(f, lambda r: r["rows"][0].update(chain=7)),
    "attribution-not-list": lambda f: _bad_rec(f, lambda r: r.update(attribution="x")),
}


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_item17_corrupt_cells_file_names_it_and_suggests_overwrite(kind, finished, capsys, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "results.csv").write_bytes((finished / "results.csv").read_bytes())
    (out / "cells.jsonl").write_bytes(CORRUPT[kind](finished))
    line = _refused([*Q, "--out", out, "--resume"], r"cells\.jsonl", capsys)
    assert str(out / "cells.jsonl") in line and "--overwrite" in line
    assert not re.search(r"(?i)pandas|codec|csv\.|dict contains fields", line), line


@pytest.mark.parametrize("content", [b"", b"\n\n", "truncated"])
def test_item17_empty_or_cut_short_cells_file_resumes(content, finished, capsys, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    if content == "truncated":  # an interrupt cut the last record short: dropped
        content = (finished / "cells.jsonl").read_bytes()[:-40]
    (out / "cells.jsonl").write_bytes(content)
    rc, text, err, _ = _main([*Q, "--out", out, "--resume"], capsys)
    assert rc == 0, err
    assert "correctly rounded" in text


# ================================================================ the rest of the command line

def test_top_level_errors_are_one_line(capsys):
    _refused(["frobnicate"], r"invalid choice", capsys)
    _refused(["info", "extra"], r"unrecognized arguments", capsys)
    _refused(["study", "--frobnicate"], r"unrecognized arguments", capsys)
    _refused(["exhaustive", "exp", "--max-seconds"], r"expected one argument", capsys)


def test_help_still_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["exhaustive", "--help"])
    assert e.value.code == 0 and "--max-seconds" in capsys.readouterr().out
    assert cli.main([]) == 0


@pytest.mark.parametrize("what", ["dev-zero", "folder", "fifo"])
def test_config_that_is_not_a_regular_file_is_refused_not_read_forever(what, capsys, tmp_path):
    path = {"dev-zero": "/dev/zero", "folder": str(tmp_path)}.get(what)
    if what == "fifo":
        path = str(tmp_path / "fifo.toml")
        os.mkfifo(path)
    _refused([*Q, "--out", tmp_path / "o", "--config", path], r"not a regular file", capsys,
             max_s=5)


@pytest.mark.parametrize("chains_arg", [",", "", ",,,"])
def test_study_with_no_chains_is_refused_not_an_empty_success(chains_arg, capsys, tmp_path):
    _refused(["study", "--device", "cpu", "--chains", chains_arg, "--out", tmp_path / "o"],
             r"--chains needs at least one chain", capsys)
    assert not (tmp_path / "o" / "results.csv").exists()


def test_exhaustive_on_cuda_without_a_gpu_is_refused_before_making_out(capsys, tmp_path):
    if cl.cuda.is_available():
        pytest.skip("a GPU is present")
    _refused(["exhaustive", "exp", "--device", "cuda", "--out", tmp_path / "o"],
             r"--device cuda: no usable GPU", capsys)
    assert not (tmp_path / "o").exists()


# ================================================================ the rest of the numerics API

X16 = cl.randn(16, seed=0, dtype=cl.bfloat16)
Y16 = cl.randn(16, seed=1, dtype=cl.bfloat16)


@pytest.mark.parametrize("kw,exc,pattern", [
    ({"rtol": float("nan"), "atol": 0.0}, ValueError, r"rtol must be >= 0 \(and not NaN\)"),
    ({"rtol": -1.0, "atol": 0.0}, ValueError, r"rtol must be >= 0"),
    ({"rtol": 0.0, "atol": -1e-3}, ValueError, r"atol must be >= 0"),
    ({"rtol": True, "atol": 0.0}, TypeError, r"rtol must be a real number"),
    ({"rtol": "0.1", "atol": 0.0}, TypeError, r"rtol must be a real number"),
    ({"rtol": 0.1}, ValueError, r"both rtol and atol"),
    ({"equal_nan": "yes"}, TypeError, r"equal_nan must be True or False"),
])
def test_assert_close_message_checks_its_tolerances(kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        nm.assert_close_message(X16, Y16, **kw)


@pytest.mark.parametrize("index", [True, (True,), 1.5, float("nan"), "3"])
def test_explain_refuses_an_index_that_is_not_ints(index):
    f = cl.jit(lambda a: cl.exp(a))
    with pytest.raises(TypeError, match="index must be a tuple of ints"):
        nm.explain(f, (X16,), index)


# ================================================================ study.run, study.libraries, sweep

SMALL_RUN = {"chains": ["swiglu"], "dtypes": ["bfloat16"], "shapes": {"swiglu": (2, 4)},
             "device": "cpu"}


@pytest.mark.parametrize("kw,exc,pattern", [
    ({"workers": -1}, ValueError, r"workers must be an int >= 0"),
    ({"workers": 1.5}, ValueError, r"workers must be an int >= 0"),
    ({"workers": True}, ValueError, r"workers must be an int >= 0"),
    ({"scheduler": 3}, TypeError, r"scheduler must be a Dask scheduler address"),
    ({"quick": "no"}, TypeError, r"quick must be True or False"),
    ({"grad": 2}, TypeError, r"grad must be True or False"),
    ({"seeds": [0, -1]}, ValueError, r"seed -1 is out of range"),
    ({"seeds": [1.0]}, TypeError, r"seeds must be integers"),
    ({"scale": float("nan")}, ValueError, r"scale must be a positive finite number"),
])
def test_study_run_checks_its_numbers_first(kw, exc, pattern):
    from castlab import study
    with pytest.raises(exc, match=pattern):
        study.run(**{**SMALL_RUN, **kw})


@pytest.mark.parametrize("seed,exc", [(-1, ValueError), (1.5, TypeError), (True, TypeError),
                                      (2**70, ValueError)])
def test_study_libraries_checks_the_seed(seed, exc):
    from castlab import study
    with pytest.raises(exc, match=r"seed"):
        study.libraries(["torch_eager"], ops=["swiglu"], dtypes=["bfloat16"], size=1024,
                        seed=seed, device="cpu")


@pytest.mark.parametrize("retries", [-1, 1.5, True])
def test_run_cells_checks_retries(retries):
    from castlab.sweep import run_cells
    with pytest.raises(ValueError, match="retries must be an int >= 0"):
        run_cells([1], abs, workers=0, retries=retries)


# ================================================================ issue 53: dtype names

@pytest.mark.parametrize("alias,name", [("bf16", "bfloat16"), ("fp16", "float16"),
                                        ("fp32", "float32"), ("fp64", "float64"),
                                        ("f32", "float32"), ("half", "float16"),
                                        ("fp8_e4m3", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2")])
def test_dtype_aliases_in_python_and_the_study_cli(alias, name, capsys, tmp_path):
    import castlab as cl
    assert cl.as_dtype(alias).name == name
    rc, out, err, _ = _main(["study", "--device", "cpu", "--chains", "swiglu", "--dtypes", alias,
                             "--shape", "swiglu=2x4", "--no-plots", "--no-progress",
                             "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    assert f"swiglu {name}:" in out
    import pandas as pd
    assert set(pd.read_csv(tmp_path / "o" / "results.csv")["dtype"]) == {name}


def test_dtype_aliases_in_a_config_and_unknown_names_refused(capsys, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('dtypes = ["bf16"]\n[[chains]]\nchain = "swiglu"\nshape = [2, 4]\n')
    rc, out, err, _ = _main(["study", "--device", "cpu", "--config", cfg, "--no-plots",
                             "--no-progress", "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    _refused(["study", "--dtypes", "fp9"], r"invalid choice: 'fp9'", capsys)
    _refused(["study", "--dtypes", "int32"], r"invalid choice: 'int32'", capsys)


def test_version_and_help_list_every_command(capsys):
    import castlab as cl
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"castlab {cl.__version__}"
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    commands = text[text.index("commands:"):text.index("positional arguments")]
    for name in cli._parser()._subparsers._group_actions[0].choices:
        assert f"\n  {name} " in commands, name


def _pinned_fp32_study(capsys, tmp_path, dtypes: str, module: str):
    """castlab study of rms_scale(x, w) with w pinned to float32 (the README's TOML example)
    in the study dtypes `dtypes`: (rc, stdout, stderr, its castlab: warning lines)."""
    (tmp_path / f"{module}.py").write_text(
        "import castlab as cl\ndef rms_scale(x, w):\n"
        "    return x * cl.rsqrt(cl.mean(x * x, -1, keepdim=True) + 1e-6) * w\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'dtypes = {dtypes}\n[[chains]]\nchain = "{tmp_path}/{module}.py:rms_scale"\n'
                   "[[chains.inputs]]\nshape = [8, 32]\n[[chains.inputs]]\nshape = [8, 1]\n"
                   'dtype = "float32"\n')
    rc, out, err, _ = _main(["study", "--device", "cpu", "--config", cfg, "--no-plots",
                             "--no-progress", "--out", tmp_path / "o"], capsys)
    return rc, out, err, [ln for ln in err.splitlines() if ln.startswith("castlab: warning:")]


def test_a_pinned_input_that_promotes_the_result_is_said_and_recorded(capsys, tmp_path):
    # issue 53 item 1: the README's TOML example (an input pinned to float32) makes the
    # chain's result float32; the rows say so and the console warns, in one line
    rc, out, err, warn = _pinned_fp32_study(capsys, tmp_path, '["bf16", "float32"]', "norms53")
    assert rc == 0, err
    assert len(warn) == 1 and "result is float32 (input 1 is float32)" in warn[0], err
    assert any("output_dtype" in ln for ln in out.splitlines()[:3]), out
    import pandas as pd
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert set(zip(df["dtype"], df["input_dtypes"], df["output_dtype"])) == {
        ("bfloat16", "bfloat16,float32", "float32"), ("float32", "float32,float32", "float32")}


def test_the_promotion_warning_names_every_study_dtype_it_happens_in(capsys, tmp_path):
    # a float32 input promotes the bf16 and the fp16 studies: a line for each (the second
    # when its cells come in: tracing it first would call the user's function again)
    rc, _, err, warn = _pinned_fp32_study(capsys, tmp_path, '["bf16", "fp16"]', "norms53b")
    assert rc == 0, err
    assert len(warn) == 2, err
    assert "in the bfloat16 study its result is float32 (input 1 is float32)" in warn[0], err
    assert "in the float16 study too its result is float32" in warn[1], err


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
def test_npy_files_written_with_ml_dtypes_load_with_their_dtype(name, tmp_path):
    # issue 53 item 1: NumPy saves ml_dtypes' arrays as untyped |V2 / |V1 values
    import ml_dtypes
    import numpy as np

    from castlab import study
    np_t = {"bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
            "float8_e5m2": ml_dtypes.float8_e5m2, "float16": np.float16}[name]
    a = np.linspace(-3, 3, 32, dtype=np.float32).reshape(4, 8).astype(np_t)
    np.save(tmp_path / "x.npy", a)
    got = study.load_input_file(str(tmp_path / "x.npy"), dtype=name)
    assert got.dtype == a.dtype and got.tobytes() == a.tobytes()
    if name != "float16":  # (fp16 is NumPy's own type: no dtype needed)
        with pytest.raises(ValueError, match=r"untyped \d-byte values.*give the input's dtype"):
            study.load_input_file(str(tmp_path / "x.npy"))
    df = study.run(chains=[study.chain(lambda x: x * 2.0, inputs=[study.Input(
        file=str(tmp_path / "x.npy"), dtype=name)], name="twice")],
        dtypes=["bfloat16"], device="cpu", extra_presets={})
    assert set(df["input_dtypes"]) == {name}
