"""The ``castlab`` command: ``castlab study`` (the A/B precision study), ``castlab exhaustive``
(every input of a chain, :func:`castlab.numerics.exhaustive`), ``castlab bounds``,
``castlab stacks`` (one model under two stacks, :mod:`castlab._cli_stacks`) and
``castlab info``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from typing import Any

from . import _C, _runrecord, cuda, plot, study
from ._cli_config import CHAIN_KEYS as CHAIN_KEYS
from ._cli_config import CONFIG_KEYS as CONFIG_KEYS
from ._cli_config import INPUT_KEYS as INPUT_KEYS
from ._cli_config import _study_settings
from ._cli_config import load_config as load_config
from ._cli_exhaustive import BOUNDS_FILES as BOUNDS_FILES
from ._cli_exhaustive import EXHAUSTIVE_CHAINS as EXHAUSTIVE_CHAINS
from ._cli_exhaustive import EXHAUSTIVE_FILES as EXHAUSTIVE_FILES
from ._cli_exhaustive import cmd_bounds, cmd_exhaustive
from ._cli_files import STUDY_FILES as STUDY_FILES
from ._cli_files import _prepare_out, _read_cells, write_parquet
from ._cli_parser import HELP as HELP
from ._cli_parser import STUDY_EPILOG as STUDY_EPILOG
from ._cli_parser import (
    CLIError,
    _one_of,
    _parser,
    _Run,
    _valid_presets,
    _warn,
)
from ._cli_parser import _int_arg as _int_arg
from ._cli_parser import _scale_arg as _scale_arg
from ._cli_parser import _seconds_arg as _seconds_arg
from ._cli_stacks import STACKS_FILES as STACKS_FILES
from ._cli_stacks import cmd_stacks
from ._optable import BITS, IMPL_MASK, OPS
from .presets import libraries
from .study import LIBRARY_DTYPES

# ---------------------------------------------------------------- castlab study --libraries

#: The ops of the kernel-library presets that each --chains name selects.
LIBRARY_CHAINS = {
    "swiglu": ["swiglu", "swiglu_backward"],
    "rope": ["rope", "rope_backward", "rope_interleaved", "rope_interleaved_backward"],
    "rope_interleaved": ["rope_interleaved", "rope_interleaved_backward"],
    "rms_norm": ["rms_norm", "rms_norm_gemma", "fused_add_rms_norm"],
}
# study settings that have no meaning for fixed library formulas: refused, not ignored
_NOT_WITH_LIBRARIES = ("policies", "math", "extra_presets", "rounding", "shape", "input",
                       "scale", "grad", "attribute", "config", "resume", "workers",
                       "scheduler")
LIBRARY_TABLE_COLUMNS = ["library", "op", "dtype", "identical_to_eager", "mismatch_vs_eager",
                         "correctly_rounded", "max_ulp_error", "max_ulp_error_at_scale",
                         "elements", "status"]


def _study_math(args: argparse.Namespace) -> None:
    """Sort out study --math: math presets (checked here: the option takes library names
    too, for one release). ``--math all`` or kernel-library names alone (none of them a
    math preset; torch_eager and transformer_engine name both) are the old spelling of
    --libraries: they move there, with a warning."""
    given = getattr(args, "_given", None) or {}
    vals = given.get("--math", [])
    if not vals:
        return
    presets, libs = _valid_presets(), libraries()
    lib_only = [v for v in vals if v == "all" or (v in libs and v not in presets)]
    if lib_only and all(v == "all" or v in libs for v in vals) and not given.get("--presets"):
        shown = ",".join(vals)
        _warn(f"--math {shown} (kernel libraries) is deprecated; use --libraries {shown} "
              "(--math names math presets: " + ", ".join(presets) + ")")
        args.libraries = list(args.libraries or []) + vals
        args.math = None
        return
    for v in vals:
        if v in presets:
            continue
        if v == "all":
            raise CLIError("study: argument --math: 'all' (every kernel library, the old "
                           "meaning of --math) cannot be mixed with math presets; give "
                           "--libraries all, or name the math presets: " + ", ".join(presets))
        if v in libs:
            raise CLIError(f"study: argument --math: {v!r} is a kernel library, not a math "
                           f"preset; give kernel libraries with --libraries (math presets: "
                           + ", ".join(presets) + ")")
        raise CLIError(f"study: argument --math: invalid choice: {v!r} (choose from "
                       + ", ".join(presets) + "; kernel libraries are --libraries) (see "
                       "`castlab study --help`)")


def _library_names(names: list[str]) -> list[str]:
    if "all" in names:
        return libraries()
    for n in names:
        if n not in libraries():
            raise CLIError(f"--libraries: unknown library {n!r}; valid: all, "
                           + ", ".join(libraries()))
    if not names:
        raise CLIError("--libraries needs 'all' or library names: " + ", ".join(libraries()))
    return list(dict.fromkeys(names))


def _library_settings(args: argparse.Namespace) -> dict:
    """The arguments of castlab.study.libraries from the command line."""
    for key in _NOT_WITH_LIBRARIES:
        v = getattr(args, key)
        if v not in (None, False) and v != []:
            flag = "--" + key.replace("_", "-")
            raise CLIError(f"{flag} does not apply to --libraries (kernel-library presets "
                           "have their own formulas and roundings); drop it")
    ops: list[str] = []
    for c in args.chains or ["swiglu", "rope"]:
        if c not in LIBRARY_CHAINS:
            raise CLIError(f"--chains {c!r}: kernel-library presets cover "
                           + ", ".join(LIBRARY_CHAINS))
        ops += [op for op in LIBRARY_CHAINS[c] if op not in ops]
    dtypes = list(dict.fromkeys(args.dtypes or LIBRARY_DTYPES))
    for d in dtypes:
        _one_of("--dtypes (with --libraries)", d, LIBRARY_DTYPES)
    seeds = list(dict.fromkeys(args.seeds or [0]))
    if len(seeds) != 1:
        raise CLIError("--libraries runs one seed: give --seed N")
    dev = args.device or study._device_default()
    if dev == "cuda" and not cuda.is_available():
        raise CLIError(f"--device cuda: no usable GPU ({cuda.unavailable_reason()})")
    return {"names": _library_names(args.libraries), "ops": ops, "dtypes": dtypes,
            "device": dev, "size": 1 << 16 if args.quick else 1 << 20, "seed": seeds[0]}


def cmd_libraries(args: argparse.Namespace) -> int:
    """``castlab study --libraries ...``: the kernel-library matrix
    (castlab.study.libraries)."""
    kw = _library_settings(args)
    out = args.out or "castlab-study"
    _prepare_out(out, args.overwrite)
    config = dict(kw, libraries=kw["names"], chains=list(args.chains or ["swiglu", "rope"]),
                  out=out, quick=bool(args.quick), overwrite=bool(args.overwrite),
                  plots=not args.no_plots, progress=not args.no_progress)
    config.pop("names")
    run = _Run("study", kw["device"], args.device, config, [kw["seed"]], out)
    with run:
        t0 = time.perf_counter()
        cells = os.path.join(out, "cells.jsonl")
        with open(cells, "w") as fc:  # each case as it finishes: what an interrupted run did
            def on_row(r: dict) -> None:
                fc.write(json.dumps(study._jsonable(r)) + "\n")
                fc.flush()
            try:
                df = study.libraries(**kw, progress=not args.no_progress, on_row=on_row)
            except (ValueError, TypeError) as e:
                raise CLIError(str(e)) from None
        elapsed = time.perf_counter() - t0
        print(format_library_table(df))
        headline = library_headline(df)
        csv_path = os.path.join(out, "results.csv")
        df.to_csv(csv_path, index=False)
        written = [csv_path]
        pq = os.path.join(out, "results.parquet")
        if write_parquet(df, pq):
            written.append(pq)
        written.append(cells)
        summary = {"elapsed_s": round(elapsed, 3), "rows": len(df), "size": kw["size"],
                   "seed": kw["seed"], "device": kw["device"], "headline": headline,
                   "cases": df.to_dict("records"), "run": run.record}
        if "timing" in df.attrs:   # the GPU's kernel compiles (castlab.study.libraries)
            summary["timing"] = df.attrs["timing"]
        written.append(os.path.join(out, "summary.json"))
        with open(written[-1], "w") as fj:
            json.dump(summary, fj, indent=2)
        written.append(run.path)
    if not args.no_plots:
        written += plot.write_library_plots(df, out)
    print(f"\n{headline}")
    print("wrote " + ", ".join(written) + f"  ({elapsed:.1f} s)")
    return 0


def format_library_table(df) -> str:
    show = df[LIBRARY_TABLE_COLUMNS].copy()
    show["mismatch_vs_eager"] = show["mismatch_vs_eager"].map(lambda v: f"{100 * v:.3f}%")
    show["correctly_rounded"] = show["correctly_rounded"].map(lambda v: f"{100 * v:.4f}%")
    show["max_ulp_error"] = show["max_ulp_error"].map(_fmt_ulp)
    show["max_ulp_error_at_scale"] = show["max_ulp_error_at_scale"].map(_fmt_ulp)
    show = show.rename(columns={"identical_to_eager": "= eager", "max_ulp_error": "max_ulp",
                                "max_ulp_error_at_scale": "max_ulp@scale"})
    return (show.to_string(index=False) + "\n" + ULP_LEGEND + "\n= eager: bit-identical to "
            "Hugging Face eager; mismatch_vs_eager: the fraction of elements whose bits "
            "differ from it (bitwise).")


def library_headline(df) -> str:
    """Per op and dtype: the most accurate libraries (the highest correctly-rounded
    fraction) and those bit-identical to Hugging Face eager."""
    lines = []
    for (op, dt), g in df.groupby(["op", "dtype"], sort=False):
        best = g[g.correctly_rounded == g.correctly_rounded.max()]
        same = g[g.identical_to_eager & (g.library != "torch_eager")]
        lines.append(f"{op} {dt}: most accurate {', '.join(best.library)} "
                     f"({100 * best.correctly_rounded.iloc[0]:.4f}% correctly rounded); "
                     f"identical to eager: {', '.join(same.library) or 'none'}")
    return "\n".join(lines)


def cmd_study(args: argparse.Namespace) -> int:
    if args.resume and args.overwrite:
        raise CLIError("--resume continues the results in --out and --overwrite replaces "
                       "them: give one")
    if args.workers is not None and args.scheduler is not None:
        raise CLIError("--workers starts a local Dask cluster and --scheduler uses an "
                       "existing one: give one")
    if args.scheduler is not None and not args.scheduler.strip():
        raise CLIError("--scheduler needs the address of a Dask scheduler, e.g. "
                       "tcp://host:8786")
    st = _study_settings(args)
    out = st.pop("out")
    _prepare_out(out, args.overwrite, args.resume)
    device = st.get("device") or study._device_default()
    csv_path = os.path.join(out, "results.csv")
    cells_path = os.path.join(out, "cells.jsonl")
    done: list = []
    if args.resume:
        if os.path.exists(cells_path):
            done = _read_cells(cells_path, study.row_columns(st["grad"]))
        elif os.path.exists(csv_path):
            raise CLIError(f"--resume: {out!r} holds results.csv but no cells.jsonl (the "
                           "finished cells): pass --overwrite to start again")
    config = _study_config(st, args, out, device)
    run = _Run("study", device, st.get("device"), config, st["seeds"], out,
               workers=args.workers, scheduler=args.scheduler)
    with run:
        return _run_study(args, st, out, device, done, run)


def _study_config(st: dict, args: argparse.Namespace, out: str, device: str) -> dict:
    """The study's resolved settings, for run.json (the command line's names)."""
    return {"chains": [_describe_chain(ch) for ch in st["chains"]],
            "shapes": {k: list(v) for k, v in (st.get("shapes") or {}).items()},
            "dtypes": [str(d) for d in st["dtypes"]], "policies": list(st["policies"]),
            "math": list(st["math"]), "extra_presets": st.get("extra_presets") or {},
            "rounding": list(st["rounding"]), "seeds": list(st["seeds"]),
            "input": st["input"], "scale": float(st["scale"]), "device": device,
            "quick": st["quick"], "grad": st["grad"], "attribute": st["attribute"],
            "out": out, "config": args.config, "workers": args.workers,
            "scheduler": args.scheduler, "resume": bool(args.resume),
            "overwrite": bool(args.overwrite), "plots": not args.no_plots,
            "progress": not args.no_progress}


def _describe_chain(ch: Any) -> dict:
    d: dict[str, Any] = {"name": ch.name, "source": ch.source or ch.name,
                         "input_names": study.input_names(ch)}
    if ch.inputs is not None:
        d["inputs"] = []
        for sp in ch.inputs:
            spec = {f.name: getattr(sp, f.name) for f in dataclasses.fields(sp)
                    if f.name != "tensor" and getattr(sp, f.name) is not None}
            if sp.tensor is not None:
                spec["tensor"] = True
            d["inputs"].append(spec)
    return d


def _run_study(args: argparse.Namespace, st: dict, out: str, device: str, done: list,
               run: _Run) -> int:
    """The study itself (cmd_study's settings and run record): cells stream to
    cells.jsonl and results.csv as they finish, then the table, summary and plots."""
    import csv

    csv_path = os.path.join(out, "results.csv")
    cells_path = os.path.join(out, "cells.jsonl")
    cols = study.row_columns(st["grad"])
    files: dict = {}

    def open_outputs() -> None:  # on the first finished cell: a bad setting writes nothing
        try:
            files["cells"] = open(cells_path, "w")
            for rec in done:  # the records kept, without a line cut short
                files["cells"].write(json.dumps(rec) + "\n")
            files["csv"] = open(csv_path, "w", newline="")
        except OSError as e:
            raise CLIError(f"cannot write to {out!r}: {e.strerror or e}") from None
        files["writer"] = csv.DictWriter(files["csv"], fieldnames=cols)
        files["writer"].writeheader()
        for rec in done:
            files["writer"].writerows(rec["rows"])

    n_new = [0]

    def on_cell(rec: dict) -> None:  # stream cells, so an interrupted run keeps them
        if not files:
            open_outputs()
        files["cells"].write(json.dumps(rec) + "\n")
        files["cells"].flush()
        files["writer"].writerows(rec["rows"])
        files["csv"].flush()
        n_new[0] += 1

    t0 = time.perf_counter()
    interrupted = False
    df = None
    try:
        df = study.run(chains=st["chains"], dtypes=st["dtypes"], shapes=st.get("shapes"),
                       policies=st["policies"], presets=st["math"], rounding=st["rounding"],
                       seeds=st["seeds"], device=device, inputs=st["input"],
                       scale=float(st["scale"]), extra_presets=st.get("extra_presets"),
                       quick=st["quick"], progress=not args.no_progress, on_cell=on_cell,
                       grad=st["grad"], attribute=st["attribute"], done=done,
                       workers=args.workers, scheduler=args.scheduler)
    except KeyboardInterrupt:
        interrupted = True
    except (ValueError, TypeError, ConnectionError, ImportError) as e:
        raise CLIError(str(e)) from None
    finally:
        for k in ("cells", "csv"):
            if k in files:
                files[k].close()
    elapsed = time.perf_counter() - t0
    import pandas as pd

    if interrupted:
        kept = len(done) + n_new[0]
        run.status = "interrupted"
        run.extra["finished_cells"] = kept
        print(f"\ncastlab: interrupted; {kept} finished cells kept in {out} (results.csv, "
              "cells.jsonl); run the same command with --resume to finish", file=sys.stderr)
        return 130
    if df is None:  # pragma: no cover
        df = pd.read_csv(csv_path)
    if not files:  # nothing new ran (all cells resumed) or the study is empty
        open_outputs()
        for k in ("cells", "csv"):
            files[k].close()
    df.to_csv(csv_path, index=False)  # every row, in the order of the grid
    print(format_table(df))
    summary = summarize(df, elapsed)
    if done:
        summary["resumed_cells"] = len(done)
        run.extra["resumed_cells"] = len(done)
    summary["run"] = run.record
    written = [csv_path]
    pq = os.path.join(out, "results.parquet")
    if write_parquet(df, pq):
        written.append(pq)
    written += [cells_path, os.path.join(out, "summary.json")]
    if st["attribute"]:
        att_path = os.path.join(out, "attribution.csv")
        study.attribution_table(df).to_csv(att_path, index=False)
        written.insert(1, att_path)
        summary["attribution"] = df.attrs["attribution_verdicts"]
        print("\nattribution (B vs A: the factors behind every differing element):")
        for v in summary["attribution"]:
            print(f"{v['chain']} {v['dtype']} seed={v['seed']}: {v['verdict']}")
    with open(os.path.join(out, "summary.json"), "w") as fj:
        json.dump(summary, fj, indent=2)
    plots = []
    if not args.no_plots:
        plots = write_plots(df, out)
    written.append(run.path)
    print(f"\n{summary['headline']}")
    print("wrote " + ", ".join(written + plots) + f"  ({elapsed:.1f} s)")
    return 0


def format_table(df) -> str:
    cols = ["chain", "dtype", "shape", "input", "seed", "math", "policy", "rounding",
            "correctly_rounded", "max_ulp", "max_ulp_at_scale", "rel_rmse", "mismatch_vs_eager",
            "torch_same_vs_eager"]
    if "pass" in df.columns:  # a study with gradients: say which result each row is
        cols[1:1] = ["pass", "output"]
    if "output_dtype" in df.columns and (df["output_dtype"] != df["dtype"]).any():
        # a pinned or file input promoted a result: say in which format it was measured
        cols.insert(cols.index("dtype") + 1, "output_dtype")
    cols = [c for c in cols if c in df.columns]
    show = df[cols].copy()
    show["correctly_rounded"] = show["correctly_rounded"].map(lambda v: f"{100 * v:.4f}%")
    show["mismatch_vs_eager"] = show["mismatch_vs_eager"].map(lambda v: f"{100 * v:.3f}%")
    show["rel_rmse"] = show["rel_rmse"].map(lambda v: f"{v:.3e}")
    show["max_ulp"] = show["max_ulp"].map(_fmt_ulp)
    if "max_ulp_at_scale" in show.columns:
        show["max_ulp_at_scale"] = show["max_ulp_at_scale"].map(_fmt_ulp)
        show = show.rename(columns={"max_ulp_at_scale": "max_ulp@scale"})
    return show.to_string(index=False) + "\n" + STUDY_LEGEND


ULP_LEGEND = ("max_ulp: the worst error in ulps of the exact value at that element (it "
              "explodes where the exact result is tiny: cancellation, or 0);\n"
              "max_ulp@scale: the worst error in ulps of the largest exact magnitude (stays "
              "meaningful under cancellation).")
#: Against eager: the bitwise column and PyTorch's tolerance-based verdict, side by side.
EAGER_LEGEND = ("mismatch_vs_eager: the fraction of elements whose bits differ from eager's "
                "(bitwise; eager: the first math preset, rounding to nearest);\n"
                "torch_same_vs_eager: PyTorch's accuracy check torch._dynamo.utils.same() "
                "against eager (tolerance-based, an RMSE rule against fp64:\nTrue does not "
                "mean the same bits; mismatch_vs_eager does).")
WORST_LEGEND = ("results.csv's worst_index is the worst element; castlab.numerics.explain("
                "fn, args, worst_index) shows why\nit comes out as it does.")
STUDY_LEGEND = "\n".join([ULP_LEGEND, EAGER_LEGEND, WORST_LEGEND])


def _fmt_ulp(v) -> str:
    v = float(v)
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    return f"{v:.2f}" if v < 1e6 else f"{v:.3e}"


def _varying(df) -> list[str]:
    """The cell keys (shape, input, scale, seed) that take more than one value for one
    chain of this study."""
    return plot._varying_keys(df, ("shape", "input", "scale", "seed"))


def summarize(df, elapsed: float) -> dict:
    """Headline numbers: per cell (chain, shape, input, scale, dtype, seed; and, in a study
    with gradients, pass and output), the correctly-rounded fraction of each policy under
    the first preset and rounding mode (fused vs eager first). Each case holds every row
    of its cell under "math/policy/rounding"."""
    out: dict[str, Any] = {"elapsed_s": round(elapsed, 3), "rows": len(df), "cases": []}
    lines = []
    keys = _case_keys(df)
    vary = _varying(df)
    for vals, g in df.groupby(keys, sort=False):
        case = {k: (v.item() if hasattr(v, "item") else v) for k, v in zip(keys, vals)}
        chain, dt = case["chain"], case["dtype"]
        what = f"{chain} {dt}" + (f" {case['output']}" if case.get("pass") == "backward" else "")
        what += "".join(f" {k}={case[k]}" for k in vary)
        for _, r in g.iterrows():
            case[f"{r['math']}/{r['policy']}/{r['rounding']}"] = {
                "correctly_rounded": float(r["correctly_rounded"]), "rel_rmse": float(r["rel_rmse"]),
                "max_ulp": float(r["max_ulp"]),
                "torch_same_vs_eager": bool(r["torch_same_vs_eager"])}
        out["cases"].append(case)
        m0, r0 = g.math.iloc[0], g.rounding.iloc[0]
        sub = g[(g.math == m0) & (g.rounding == r0)]
        pols = list(dict.fromkeys(sub.policy))
        order = [p for p in ("fused", "eager") if p in pols] + [
            p for p in pols if p not in ("fused", "eager")]
        if order:
            how = "" if m0 == "torch_eager" and r0 == "nearest" else (
                f" ({m0}" + ("" if r0 == "nearest" else f", {r0}") + ")")
            lines.append(f"{what}: correctly rounded{how}: " + " vs ".join(
                f"{p} {100 * sub[sub.policy == p].iloc[0].correctly_rounded:.4f}%"
                for p in order))
    out["headline"] = "\n".join(lines)
    return out


def _case_keys(df, seed: bool = True) -> list[str]:
    """The columns that make one case: chain, dtype and the cell's other keys (shape,
    input, scale, seed), plus pass and output when the study has gradient rows (so that
    no row overwrites another)."""
    keys = ["chain", "dtype"] + [k for k in ("shape", "input", "scale") if k in df.columns]
    if seed and "seed" in df.columns:
        keys.append("seed")
    return keys + (["pass", "output"] if "pass" in df.columns else [])


def write_plots(df, out: str) -> list[str]:
    """correctly_rounded.png (the correctly rounded share) and rel_rmse.png (in units of
    each format's unit roundoff), one panel per dtype: castlab.plot.write_study_plots."""
    return plot.write_study_plots(df, out)


def info_text() -> str:
    import ml_dtypes
    import numpy as np

    lines = [f"castlab {_C.__version__}", f"python {platform.python_version()} ({sys.executable})",
             f"numpy {np.__version__}", f"ml_dtypes {ml_dtypes.__version__}"]
    try:
        import torch

        lines.append(f"torch {torch.__version__}")
    except ImportError:
        lines.append("torch: not installed")
    lines.append(f"cpu: {_runrecord.cpu_model()}")
    lines.append(f"cpu threads: {_C.num_threads()}")
    cg = _C._cpu_codegen()
    if cg["why_not"]:
        lines.append(f"cpu codegen: not available ({cg['why_not']})")
    else:
        lines.append(f"cpu codegen: {cg['mode']} from {cg['min_elements']} elements, "
                     f"{cg['compiler']}")
    try:
        if cuda.is_available():
            info = cuda.info()
            for k, v in info.items():
                lines.append(f"cuda {k}: {v}")
        else:
            lines.append("cuda: not available (" + cuda.unavailable_reason() + ")")
    except Exception as e:  # noqa: BLE001
        lines.append(f"cuda: not available ({e})")
    return "\n".join(lines)


def ops_text() -> str:
    """The op table as a text listing: name, operands, typing rule, the math-variant
    factors its formula reads, the formula, and (indented) its derivative rule.

    >>> from castlab.cli import ops_text
    >>> ops_text().split()[:5]
    ['op', 'args', 'category', 'factors', 'formula']
    """
    names = {v: k for k, v in BITS.items() if k != "impl_mask"}
    lines = [f"{'op':<11} {'args':<5} {'category':<13} {'factors':<45} formula"]
    for o in OPS.values():
        fs = (["impl"] if o.factors & IMPL_MASK else []) + [
            n for b, n in sorted(names.items()) if o.factors & b]
        name = o.name if o.public else f"({o.name})"
        lines.append(f"{name:<11} {o.arity:<5} {o.category:<13} {','.join(fs) or '-':<45} "
                     f"{o.formula}")
        if o.grad:
            lines.append(f"{'':<11} grad: {o.grad}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; a bad value ends with one line on stderr and exit code 2
    (``castlab: error: ...``), never a traceback; Ctrl-C ends with exit code 130."""
    import warnings

    def one_line(message, category, filename, lineno, file=None, line=None):
        # castlab's own warnings (a result in another dtype than the study's, ...) as one
        # line each, like its errors; others keep Python's format
        text = " ".join(str(message).split())
        if category.__module__.startswith("castlab") or filename.startswith(
                os.path.dirname(os.path.abspath(__file__))):
            print(f"castlab: warning: {text}", file=file or sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    show = warnings.showwarning
    warnings.showwarning = one_line
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("\ncastlab: interrupted", file=sys.stderr)
        return 130
    except CLIError as e:
        print(f"castlab: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `castlab ops | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except MemoryError:
        print("castlab: error: out of memory", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001  (one line, never a traceback)
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"castlab: error: {msg}", file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = show


def _main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "info":
        print(info_text())
        return 0
    if args.command == "ops":
        print(ops_text())
        return 0
    if args.command == "exhaustive":  # its chain, after a list option's values
        spill = getattr(args, "_spill", None)
        if spill is not None and args.chain is None:
            args.chain = spill[0]
        elif spill is not None:
            raise CLIError(f"exhaustive: {spill[1]} (see `castlab exhaustive --help`)")
        if args.chain is None:
            raise CLIError("exhaustive: the following arguments are required: chain (see "
                           "`castlab exhaustive --help`)")
    for old, new in getattr(args, "_deprecated", None) or []:
        _warn(f"{old} is deprecated; use {new}")
    if args.command == "bounds":  # chains after a list option's values
        spill = getattr(args, "_spill", None)
        if spill is not None:
            args.chains = list(args.chains or []) + [spill[0]]
    if args.command == "study":
        _study_math(args)
    _runrecord.probe_torch()  # (for the run record: in the background, while we set up)
    try:
        if args.command == "exhaustive":
            return cmd_exhaustive(args)
        if args.command == "bounds":
            return cmd_bounds(args)
        if args.command == "stacks":
            return cmd_stacks(args)
        if args.libraries is not None:
            return cmd_libraries(args)
        return cmd_study(args)
    except SystemExit as e:  # sys.exit() in a chain's code would end castlab silently
        raise CLIError(f"a chain's code called sys.exit({e.code!r}) (SystemExit); a chain "
                       "must return a tensor") from None


if __name__ == "__main__":
    sys.exit(main())
