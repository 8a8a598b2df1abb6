"""The ``castlab`` command: ``castlab study`` (the A/B precision study) and ``castlab info``."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from typing import Any

from . import _C, cuda, study
from ._optable import BITS, IMPL_MASK, OPS
from .policy import Math
from .study import CHAINS, DEFAULT, QUICK

HELP = """castlab: eager vs fused low-precision numerics, bit by bit.

commands:
  study   run an A/B precision study (default: SwiGLU and RoPE; bf16, fp16, fp32;
          eager vs fused vs the fp64 reference, plus SwiGLU's formula presets) and write
          results.csv, summary.json and plots to --out
  info    print versions and the devices found
"""


class CLIError(Exception):
    """A bad value given to the command line: printed as one line, exit code 2."""


def _valid_presets() -> list[str]:
    return Math.presets()


def _scale_arg(v: str) -> float:
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {v!r}") from None
    if not math.isfinite(f) or f <= 0.0:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {v!r}")
    return f


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="castlab", description=HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="{study,info,ops}")
    s = sub.add_parser("study", help="run an A/B precision study",
                       description="Run the same chains under several policies and math presets "
                       "and compare each result with the fp64 reference.")
    s.add_argument("--chains", nargs="+", choices=list(CHAINS), metavar="CHAIN",
                   help="chains to study (valid: %(choices)s; default: swiglu rope)")
    s.add_argument("--dtypes", nargs="+", metavar="DTYPE",
                   choices=["bfloat16", "float16", "float32", "float64", "float8_e4m3fn",
                            "float8_e5m2"],
                   help="input dtypes (valid: %(choices)s; default: bfloat16 float16 float32)")
    s.add_argument("--policies", nargs="+", choices=["eager", "fused", "fp64"], metavar="POLICY",
                   help="policies (valid: %(choices)s; default: eager fused)")
    s.add_argument("--presets", nargs="+", choices=_valid_presets(), metavar="PRESET",
                   help="math presets every policy runs under (valid: %(choices)s; "
                   "default: torch_eager)")
    s.add_argument("--extra-presets", nargs="*", choices=_valid_presets(), metavar="PRESET",
                   help="presets run fused next to the others, for SwiGLU only "
                   "(default: inductor nvfuser transformer_engine; give none to skip)")
    s.add_argument("--rounding", nargs="+", choices=["nearest", "toward_zero", "stochastic"],
                   metavar="MODE", help="downcast rounding modes (valid: %(choices)s)")
    s.add_argument("--shape", action="append", default=None, metavar="CHAIN=AxBx...",
                   help="shape for a chain, e.g. swiglu=1024x2048 or rope=1x8x512x128 "
                   "(positive sizes, the last one even; at most 2**31 elements)")
    s.add_argument("--seed", type=int, default=None, help="input seed (default 0)")
    s.add_argument("--seeds", type=int, nargs="+", default=None, help="several input seeds")
    s.add_argument("--input", choices=["normal", "uniform"], default=None,
                   help="input generator (default normal)")
    s.add_argument("--scale", type=_scale_arg, default=None,
                   help="input scale, a positive finite number (default 1.0)")
    s.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="device (default: cuda when available, else cpu)")
    s.add_argument("--quick", action="store_true", help="small shapes, bf16 and fp16 only")
    s.add_argument("--grad", action="store_true", default=None,
                   help="also study each chain's gradients (its backward for a random "
                   "cotangent vs the fp64 gradient): rows with pass=backward and output "
                   "da/db (SwiGLU, GeGLU) or dx (RoPE)")
    s.add_argument("--attribute", action="store_true", default=None,
                   help="also attribute each configuration's differing bits to named factors "
                   "(castlab.numerics.attribute): the second policy vs the first, and each "
                   "extra preset vs the first preset; writes attribution.csv, adds the "
                   "verdicts to summary.json and prints them")
    s.add_argument("--config", metavar="FILE", help="a TOML file with any of these settings")
    s.add_argument("--out", default=None,
                   help="output folder (default castlab-study/; given here it wins over the "
                   "config file's `out`). A folder that already holds results (results.csv or "
                   "summary.json) is refused unless --overwrite is given")
    s.add_argument("--overwrite", action="store_true",
                   help="replace the results in an existing --out folder")
    s.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    sub.add_parser("info", help="print versions and devices")
    sub.add_parser("ops", help="list the elementwise ops (the op table, ops/op_table.h)")
    return p


CONFIG_KEYS = {"chains", "dtypes", "policies", "presets", "extra_presets", "rounding",
               "shapes", "seeds", "seed", "input", "scale", "device", "quick", "out", "grad",
               "attribute"}


def load_config(path: str) -> dict:
    """Read a study TOML file; errors name the file and line."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise CLIError("reading --config needs Python 3.11+ or `pip install tomli`") from None
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except FileNotFoundError:
        raise CLIError(f"config file {path!r} not found") from None
    except OSError as e:
        raise CLIError(f"cannot read config file {path!r}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise CLIError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise CLIError(f"{path}: invalid TOML: not UTF-8 text ({e.reason})") from None
    cfg = cfg.get("study", cfg)
    if not isinstance(cfg, dict):
        raise CLIError(f"{path}: [study] must be a table of settings")
    unknown = set(cfg) - CONFIG_KEYS
    if unknown:
        raise CLIError(f"{path}: unknown setting(s) {sorted(unknown)}; valid: "
                       + ", ".join(sorted(CONFIG_KEYS)))
    return cfg


def _form(chain: str) -> str:
    return f"{chain}=" + "x".join(str(d) for d in CHAINS[chain].default_shape)


def _parse_shapes(items: list[str] | None) -> dict:
    out: dict = {}
    for it in items or []:
        if "=" not in it:
            raise CLIError(f"--shape expects CHAIN=AxB... (e.g. swiglu=1024x2048 or "
                           f"rope=1x8x512x128), got {it!r}")
        k, v = it.split("=", 1)
        k = k.strip()
        if k not in CHAINS:
            raise CLIError(f"--shape {it!r}: unknown chain {k!r}; valid: " + ", ".join(CHAINS))
        try:
            dims = tuple(int(x) for x in v.lower().split("x"))
        except ValueError:
            raise CLIError(f"--shape {it!r}: bad shape {v!r} for {k}: expected positive "
                           f"integers joined by 'x', e.g. {_form(k)}") from None
        out[k] = _checked_shape(k, dims, f"--shape {it!r}")
    return out


def _checked_shape(chain: str, dims: Any, where: str) -> tuple:
    try:
        return study.check_shape(chain, dims)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{where}: {e}") from None


def _study_settings(args: argparse.Namespace) -> dict:
    st: dict[str, Any] = dict(QUICK if args.quick else DEFAULT)
    st["quick"] = bool(args.quick)
    st["out"] = "castlab-study"
    if args.config:
        cfg = load_config(args.config)
        if "shapes" in cfg:
            if not isinstance(cfg["shapes"], dict):
                raise CLIError(f"{args.config}: shapes must be a table, e.g. "
                               "shapes = { swiglu = [1024, 2048] }")
            cfg["shapes"] = {k: _checked_shape(k, v, f"{args.config}: shapes.{k}")
                             for k, v in cfg["shapes"].items()}
        if "seed" in cfg:
            cfg["seeds"] = [cfg.pop("seed")]
        if "extra_presets" in cfg and isinstance(cfg["extra_presets"], list):
            cfg["extra_presets"] = {"swiglu": cfg["extra_presets"]}
        if "out" in cfg and not isinstance(cfg["out"], str):
            raise CLIError(f"{args.config}: out must be a string (a folder), got {cfg['out']!r}")
        if "scale" in cfg:
            try:
                cfg["scale"] = study.check_scale(cfg["scale"])
            except (TypeError, ValueError) as e:
                raise CLIError(f"{args.config}: {e}") from None
        for key in ("chains", "dtypes", "policies", "presets", "rounding", "seeds"):
            if key in cfg and (not isinstance(cfg[key], list) or not cfg[key]):
                raise CLIError(f"{args.config}: {key} must be a non-empty list, got {cfg[key]!r}")
        for key in ("quick", "grad", "attribute"):
            if key in cfg and not isinstance(cfg[key], bool):
                raise CLIError(f"{args.config}: {key} must be true or false, got {cfg[key]!r}")
        st.update(cfg)
    if args.out is not None:  # an explicit --out wins over the config file
        st["out"] = args.out
    for key in ("chains", "dtypes", "policies", "presets", "rounding", "input", "scale",
                "device", "seeds"):
        v = getattr(args, key)
        if v is not None:
            st[key] = v
    if args.seed is not None:
        st["seeds"] = [args.seed]
    st["grad"] = bool(args.grad or st.get("grad", False))
    st["attribute"] = bool(args.attribute or st.get("attribute", False))
    if args.extra_presets is not None:
        st["extra_presets"] = {"swiglu": list(args.extra_presets)}
    shapes = _parse_shapes(args.shape)
    if shapes:
        st["shapes"] = dict(st.get("shapes") or {}, **shapes)
    for c in st["chains"]:
        if c not in CHAINS:
            raise CLIError(f"unknown chain {c!r}; valid: " + ", ".join(CHAINS))
    for s in st["seeds"]:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**64:
            raise CLIError(f"seed {s!r} is out of range: seeds are integers in [0, 2**64)")
    dev = st.get("device")
    if dev not in (None, "cpu", "cuda"):
        raise CLIError(f"unknown device {dev!r}; valid: cpu, cuda")
    if dev == "cuda":
        try:
            ok = cuda.is_available()
            why = "" if ok else cuda.unavailable_reason()
        except Exception as e:  # noqa: BLE001
            ok, why = False, str(e)
        if not ok:
            raise CLIError(f"--device cuda: no usable GPU ({why})")
    return st


def _prepare_out(out: str, overwrite: bool) -> None:
    """Create the output folder; refuse to replace earlier results without --overwrite."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise CLIError(f"--out {out!r} exists and is not a folder")
    if not overwrite and os.path.isdir(out):
        old = [n for n in ("results.csv", "summary.json") if os.path.exists(os.path.join(out, n))]
        if old:
            raise CLIError(f"--out {out!r} already holds results ({', '.join(old)}); "
                           "pass --overwrite to replace them or choose another --out")
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".castlab-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise CLIError(f"cannot write to --out {out!r}: {e.strerror or e}") from None


def cmd_study(args: argparse.Namespace) -> int:
    import csv

    st = _study_settings(args)
    out = st.pop("out")
    _prepare_out(out, args.overwrite)
    csv_path = os.path.join(out, "results.csv")
    cols = study.row_columns(st["grad"])
    try:
        f = open(csv_path, "w", newline="")
    except OSError as e:
        raise CLIError(f"cannot write {csv_path!r}: {e.strerror or e}") from None
    writer = csv.DictWriter(f, fieldnames=cols)
    writer.writeheader()
    f.flush()

    def on_row(row: dict) -> None:  # stream rows, so an interrupted run keeps them
        writer.writerow(row)
        f.flush()

    t0 = time.perf_counter()
    interrupted = False
    df = None
    try:
        df = study.run(chains=st["chains"], dtypes=st["dtypes"], shapes=st.get("shapes"),
                       policies=st["policies"], presets=st["presets"], rounding=st["rounding"],
                       seeds=st["seeds"], device=st.get("device"), inputs=st["input"],
                       scale=float(st["scale"]), extra_presets=st.get("extra_presets"),
                       quick=st["quick"], progress=not args.no_progress, on_row=on_row,
                       grad=st["grad"], attribute=st["attribute"])
    except KeyboardInterrupt:
        interrupted = True
    except (ValueError, TypeError) as e:
        f.close()
        raise CLIError(str(e)) from None
    finally:
        f.close()
    elapsed = time.perf_counter() - t0
    import pandas as pd

    if df is None:
        df = pd.read_csv(csv_path)
    if interrupted:
        print(f"\ncastlab: interrupted; {len(df)} finished rows kept in {csv_path}", file=sys.stderr)
        return 130
    print(format_table(df))
    summary = summarize(df, elapsed)
    written = [csv_path, os.path.join(out, "summary.json")]
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
    print(f"\n{summary['headline']}")
    print("wrote " + ", ".join(written + plots) + f"  ({elapsed:.1f} s)")
    return 0


def format_table(df) -> str:
    cols = ["chain", "dtype", "math", "policy", "rounding", "correctly_rounded", "max_ulp",
            "rel_rmse", "mismatch_vs_eager", "same_vs_eager"]
    if "pass" in df.columns:  # a study with gradients: say which result each row is
        cols[1:1] = ["pass", "output"]
    show = df[cols].copy()
    show["correctly_rounded"] = show["correctly_rounded"].map(lambda v: f"{100 * v:.4f}%")
    show["mismatch_vs_eager"] = show["mismatch_vs_eager"].map(lambda v: f"{100 * v:.3f}%")
    show["rel_rmse"] = show["rel_rmse"].map(lambda v: f"{v:.3e}")
    show["max_ulp"] = show["max_ulp"].map(lambda v: f"{v:.2f}")
    return show.to_string(index=False)


def summarize(df, elapsed: float) -> dict:
    """Headline numbers: per chain and dtype (and, in a study with gradients, per pass
    and output), eager vs fused correctly-rounded fractions."""
    out: dict[str, Any] = {"elapsed_s": round(elapsed, 3), "rows": len(df), "cases": []}
    lines = []
    keys = _case_keys(df)
    for vals, g in df.groupby(keys, sort=False):
        case = dict(zip(keys, vals))
        chain, dt = case["chain"], case["dtype"]
        what = f"{chain} {dt}" + (f" {case['output']}" if case.get("pass") == "backward" else "")
        for _, r in g.iterrows():
            case[f"{r['math']}/{r['policy']}/{r['rounding']}"] = {
                "correctly_rounded": float(r["correctly_rounded"]), "rel_rmse": float(r["rel_rmse"]),
                "max_ulp": float(r["max_ulp"]), "same_vs_eager": bool(r["same_vs_eager"])}
        out["cases"].append(case)
        e = g[(g.policy == "eager") & (g.math == "torch_eager")]
        fu = g[(g.policy == "fused") & (g.math == "torch_eager")]
        if len(e) and len(fu):
            lines.append(f"{what}: correctly rounded: fused {100 * fu.iloc[0].correctly_rounded:.4f}% "
                         f"vs eager {100 * e.iloc[0].correctly_rounded:.4f}%")
    out["headline"] = "\n".join(lines)
    return out


def _case_keys(df) -> list[str]:
    """The columns that make one case: chain and dtype, plus pass and output when the
    study has gradient rows (so that they never overwrite the forward rows)."""
    return ["chain", "dtype"] + (["pass", "output"] if "pass" in df.columns else [])


def _case_label(vals: tuple) -> str:
    chain, dt = vals[0], vals[1]
    return f"{chain}\n{dt}" + (f"\n{vals[3]}" if len(vals) > 2 and vals[2] == "backward" else "")


def write_plots(df, out: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    df = df.copy()
    df["label"] = df["math"] + "/" + df["policy"] + df["rounding"].map(lambda r: "" if r == "nearest" else f"/{r}")
    for metric, title, fname in [("correctly_rounded", "correctly rounded fraction (higher is better)", "correctly_rounded.png"),
                                 ("rel_rmse", "relative RMSE vs fp64 (lower is better)", "rel_rmse.png")]:
        groups = list(df.groupby(_case_keys(df), sort=False))
        labels = list(dict.fromkeys(df["label"]))
        fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(groups)), 4.4))
        w = 0.8 / max(1, len(labels))
        for li, lab in enumerate(labels):
            xs, ys = [], []
            for gi, (_, g) in enumerate(groups):
                v = g[g.label == lab][metric]
                if len(v):
                    xs.append(gi + li * w)
                    ys.append(float(v.iloc[0]))
            ax.bar(xs, ys, width=w, label=lab)
        ax.set_xticks([i + (len(labels) - 1) * w / 2 for i in range(len(groups))])
        ax.set_xticklabels([_case_label(k) for k, _ in groups], fontsize=8)
        ax.set_title(title, fontsize=10)
        if metric == "rel_rmse":
            ax.set_yscale("log")
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                  frameon=False)
        fig.tight_layout()
        path = os.path.join(out, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


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
    lines.append(f"cpu threads: {_C.num_threads()}")
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
    return cmd_study(args)


if __name__ == "__main__":
    sys.exit(main())
