"""The commands' --out folder and the files in it: checked before any work, earlier results
refused without --overwrite, a study's cells.jsonl read back (--resume), Parquet written."""

from __future__ import annotations

import json
import os
from typing import Any

from . import study
from ._cli_parser import CLIError


def _refuse_old_results(out: str, names: tuple, overwrite: bool) -> None:
    """Refuse an --out folder that holds results (regular files among `names`) unless
    --overwrite."""
    if overwrite or not os.path.isdir(out):
        return
    old = [n for n in names if os.path.isfile(os.path.join(out, n))]
    if old:
        raise CLIError(f"--out {out!r} already holds results ({', '.join(old)}); pass "
                       "--overwrite to replace them or choose another --out")


#: The files ``castlab study`` may write into --out.
STUDY_FILES = ("results.csv", "results.parquet", "cells.jsonl", "summary.json",
               "attribution.csv", "correctly_rounded.png", "rel_rmse.png", "max_ulp_error.png",
               "run.json")


def _check_out(out: str, names: tuple = (), flag: str = "--out") -> None:
    """Make the output folder `out` and check, before any work, that the files `names`
    can be written in it: the folder is a folder, writable, and none of the names is a
    folder or something else than a regular file."""
    if not isinstance(out, str) or not out.strip():
        raise CLIError(f"{flag} must name a folder, got {out!r}")
    if "\0" in out:
        raise CLIError(f"{flag} {out!r}: a path cannot hold a NUL character")
    if os.path.exists(out) and not os.path.isdir(out):
        raise CLIError(f"{flag} {out!r} exists and is not a folder")
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".castlab-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except (OSError, ValueError) as e:
        raise CLIError(f"cannot write to {flag} {out!r}: {getattr(e, 'strerror', None) or e}") \
            from None
    for n in names:
        p = os.path.join(out, n)
        if os.path.lexists(p) and (not os.path.isfile(p) or not os.access(p, os.W_OK)):
            what = "a folder" if os.path.isdir(p) else (
                "not writable" if os.path.isfile(p) else "not a regular file")
            raise CLIError(f"cannot write {p!r}: it is {what}" if what != "not writable"
                           else f"cannot write {p!r}: it is not writable")


def _prepare_out(out: str, overwrite: bool, resume: bool = False) -> None:
    """Create the output folder; refuse to replace earlier results without --overwrite
    (or --resume)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise CLIError(f"--out {out!r} exists and is not a folder")
    if not overwrite and not resume and os.path.isdir(out):
        old = [n for n in ("results.csv", "summary.json") if os.path.exists(os.path.join(out, n))]
        if old:
            raise CLIError(f"--out {out!r} already holds results ({', '.join(old)}); "
                           "pass --overwrite to replace them, --resume to continue them, or "
                           "choose another --out")
    _check_out(out, STUDY_FILES)


def _read_cells(path: str, columns: list | None = None) -> list:
    """The finished cells of cells.jsonl (a last line cut short by an interrupt is
    dropped); a file that is not such records is refused, naming it (CLIError)."""
    def bad(why: str) -> CLIError:
        return CLIError(f"--resume: {path} is not a castlab cells file ({why}); pass "
                        "--overwrite to start the study again")

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CLIError(f"--resume: cannot read {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise bad(f"line {line} is not UTF-8 text") from None
    lines = text.split("\n")
    cut_short = not text.endswith("\n")  # the last line, written when interrupted
    recs = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if cut_short and i == len(lines):
                continue
            raise bad(f"line {i} is not JSON") from None
        rec = study.upgrade_record(rec)  # same_vs_eager -> torch_same_vs_eager
        why = _cell_record_problem(rec, columns)
        if why:
            raise bad(f"line {i}: {why}")
        recs.append(rec)
    return recs


def _cell_record_problem(rec: Any, columns: list | None) -> str:
    """Why `rec` is not a cell record as ``study.run``'s on_cell writes it ('' if it is)."""
    if not isinstance(rec, dict):
        return f"a record is a JSON object, got {type(rec).__name__}"
    missing = [k for k in ("key", "rows") if k not in rec]
    if missing:
        return f"the record has no {' or '.join(repr(k) for k in missing)}"
    if not isinstance(rec["key"], (dict, str)):
        return f"'key' must be an object, got {type(rec['key']).__name__}"
    if not isinstance(rec["rows"], list) or not all(isinstance(r, dict) for r in rec["rows"]):
        return "'rows' must be a list of objects"
    for k in ("attribution", "verdicts"):
        if k in rec and not (isinstance(rec[k], list)
                             and all(isinstance(r, dict) for r in rec[k])):
            return f"{k!r} must be a list of objects"
    if columns is not None:
        for r in rec["rows"]:
            extra = sorted(set(r) - set(columns))
            if extra:
                return (f"a row has column(s) {extra} this study does not write (a study "
                        "with other settings, e.g. --grad?)")
            missing = [c for c in columns if c not in r]
            if missing:
                return f"a row lacks the column(s) {missing}"
            for c in _NUMERIC_COLUMNS:
                v = r.get(c)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                    return f"a row's {c} is {v!r}, not a number"
            if r.get("torch_same_vs_eager") not in (None, True, False):
                return (f"a row's torch_same_vs_eager is {r['torch_same_vs_eager']!r}, not true "
                        "or false")
            for c in ("chain", "dtype", "policy", "math", "rounding"):
                if not isinstance(r.get(c), str):
                    return f"a row's {c} is {r.get(c)!r}, not a string"
    return ""


_NUMERIC_COLUMNS = ("numel", "correctly_rounded", "max_ulp", "mean_ulp", "rel_rmse", "rmse",
                    "max_abs_err", "max_rel_err", "mismatch_vs_eager", "max_ulp_at_scale")


def _seed_as_text(df):
    """A copy whose seed column is text when it mixes numbers and "fixed" (Parquet
    columns have one type)."""
    if "seed" in df.columns and df["seed"].dtype == object:
        df = df.copy()
        df["seed"] = df["seed"].astype(str)
    return df


def write_parquet(df, path: str) -> bool:
    """results.parquet when pyarrow is installed (else nothing; False)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    _seed_as_text(df).to_parquet(path, index=False)
    return True
