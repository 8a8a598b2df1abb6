"""The ``castlab`` command: ``castlab study`` (the A/B precision study), ``castlab exhaustive``
(every input of a chain, :func:`castlab.numerics.exhaustive`) and ``castlab info``."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import inspect
import json
import math
import os
import platform
import sys
import time
from typing import Any

from . import _C, _runrecord, cuda, numerics, ops, plot, presets, study, testing
from ._device import as_device
from ._dtype import as_dtype
from ._optable import BITS, IMPL_MASK, OPS
from ._progress import bar as _bar
from .policy import Math, as_math
from .presets import libraries
from .study import CHAINS, DEFAULT, LIBRARY_DTYPES, QUICK

HELP = """castlab: eager vs fused low-precision numerics, bit by bit.

commands:
  study   run an A/B precision study (default: SwiGLU and RoPE; bf16, fp16, fp32;
          eager vs fused vs the fp64 reference, plus SwiGLU's formula presets) and write
          results.csv, summary.json, run.json and plots to --out; with --libraries, the
          kernel libraries' SwiGLU and RoPE (Liger, flash-attn, ...) against HF eager and fp64
  exhaustive  run a chain on every input of a dtype (or a sampled part) under several
          policies and math presets; print exact / correctly rounded / 1 ulp / >1 ulp
          counts against fp64 and where configurations disagree; write JSON, CSV, run.json
  bounds  the proven worst case of each kernel library's SwiGLU / RoPE (or an op) against
          fp64, PyTorch eager and torch.compile over every input of a dtype (or a stated
          sample); print a table, write bounds.json, bounds.csv and run.json
  info    print versions and the devices found
  ops     list the elementwise ops (the op table: each op's formula and variants)

One vocabulary in every command: --math names math presets, --policy (--policies) the
policies, --dtype (--dtypes) the dtypes (bf16, fp16, fp32, fp64, fp8_e4m3, fp8_e5m2 too),
--seed (--seeds) the seeds, --libraries the kernel libraries; a list option takes its
values space- or comma-separated (--policy eager,fused or --policies eager fused).
A computing command prints the device it runs on first and writes run.json (versions,
hardware, command line, resolved settings, seeds, git hash, date) next to its results.

castlab --version prints castlab's version.
"""


STUDY_EPILOG = """\
config file (--config FILE, TOML; settings on the command line win):

  dtypes = ["bfloat16", "float16"]        # the study dtypes
  policies = ["eager", "fused"]           # eager, fused, fp64
  math = ["torch_eager", "inductor"]      # math presets every policy runs under
                                          #   (spelled presets before; still read)
  rounding = ["nearest"]                  # nearest, toward_zero, stochastic
  seeds = [0, 1, 2]
  extra_presets = []                      # SwiGLU's side-by-side presets (or a table)
  out = "my-study"

  [[chains]]
  chain = "swiglu"                        # a built-in chain
  shape = [1024, 2048]

  [[chains]]
  chain = "mymodel.norms:rms_scale"       # pkg.module:function or path/file.py:function
  name = "rms_scale"                      # optional: the label of its rows
  [[chains.inputs]]                       # one table per input, in argument order
  shape = [64, 4096]                      # generated: distribution normal (default) or
  distribution = "uniform"                #   uniform, times scale (default: the study's)
  scale = 4.0
  [[chains.inputs]]
  shape = [64, 1]
  dtype = "float32"                       # pinned: stays fp32 while the study dtype varies
  [[chains.inputs]]
  file = "acts/weight.npy"                # real values: .npy, .pt (torch), .safetensors
  # key = "model.norm.weight"             #   (key: one tensor of several); dtype, shape

  (chains may also be a plain list: chains = ["swiglu", "pkg.mod:fn"]; file and .py
  paths are relative to the config file; a built-in chain's input table without shape
  or file keeps its own input, e.g. {} then { dtype = "float32" } twice for RoPE's
  fp32 cos/sin.)

shapes on the command line (--shape, repeatable, values space- or comma-separated):

  --shape 64x4096                  every chain (for a pkg.module:function chain: each input)
  --shape swiglu=1024x2048         one chain (a built-in name, or a name with ':')
  --shape x=4x4096 --shape w=4096  one input, by its parameter name, in every chain that
                                   has it (a built-in chain's first input x is its shape)
  --shape mymod:f.w=4096           one input of one chain
  (the most specific wins: CHAIN.NAME, then NAME, then CHAIN, then a bare shape)

output: results.csv (and results.parquet with pyarrow), one row per chain, shape,
input, scale, dtype, seed, math, policy and rounding; cells.jsonl (finished cells, for
--resume); summary.json; run.json (the run record: versions, device, command line,
resolved settings, seeds, git hash, date; also under "run" in summary.json); plots
(means over seeds, whiskers min-max). mismatch_vs_eager is bitwise (the fraction of
elements whose bits differ from eager's); torch_same_vs_eager is PyTorch's
tolerance-based accuracy check torch._dynamo.utils.same() against eager (not bitwise;
spelled same_vs_eager before).

kernel libraries (--libraries, also spelled --library):

  castlab study --chains swiglu,rope --libraries all
  castlab study --libraries liger,flash_attn --dtypes bfloat16 --device cuda

  runs each library preset (castlab.library: """ + ", ".join(libraries()) + """)
  on the same Qwen2-shaped inputs (1M elements per input; 64K with --quick) against
  Hugging Face eager and the library's own formula in fp64 (castlab.study.libraries):
  one row per library, op and dtype (bfloat16, float16) with identical_to_eager,
  mismatch_vs_eager, correctly_rounded, max_ulp_error, max_ulp_error_at_scale, elements,
  device and status (whether the preset has been run against the library itself).
  --chains picks the ops: swiglu (forward and backward), rope (half-split and
  interleaved, forward and backward) or rope_interleaved. Writes results.csv,
  summary.json, run.json and results.parquet (with pyarrow) to --out. (Not the math
  presets of --math: those are compiler math variants.)

deprecated spellings (they work for one release, with a warning):
  --presets NAME...          use --math NAME...
  --math all, --math LIBRARY...  (kernel libraries only, no math preset among them): use
                             --libraries all, --libraries LIBRARY...
  presets = [...] in --config    use math = [...]
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


def _int_arg(lo: int | None = None, hi: int | None = None):
    """An argparse type: an integer in [lo, hi] (either bound optional)."""
    def parse(v: str) -> int:
        try:
            i = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {v!r}") from None
        if (lo is not None and i < lo) or (hi is not None and i > hi):
            rng = (f"an integer >= {lo}" if hi is None else f"an integer <= {hi}" if lo is None
                   else f"an integer in [{lo}, {hi}]")
            raise argparse.ArgumentTypeError(f"expected {rng}, got {v!r}")
        return i
    parse.__name__ = "integer"
    return parse


def _seconds_arg(v: str) -> float:
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {v!r}") \
            from None
    if not math.isfinite(f) or f <= 0.0:
        raise argparse.ArgumentTypeError(f"expected a positive finite number of seconds (use "
                                         f"--allow-long for no limit), got {v!r}")
    return f


_SEED = _int_arg(0, 2**64 - 1)
#: At most this many local Dask worker processes (a typo such as 4000 would start them all).
_MAX_WORKERS = max(64, 2 * (os.cpu_count() or 1))
_FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
_EXHAUSTIVE_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float32")
_DTYPE_ALIASES = "bf16, fp16, fp32, fp64, fp8_e4m3, fp8_e5m2"
_LIST = "space- or comma-separated"


def _warn(message: str) -> None:
    """A one-line ``castlab: warning: ...`` on stderr (a deprecated spelling, ...)."""
    print(f"castlab: warning: {message}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line (CLIError: ``castlab: error: ...``,
    exit code 2) instead of the usage text and the error."""

    def error(self, message: str):
        sub = self.prog.removeprefix("castlab").strip()
        raise CLIError(f"{sub + ': ' if sub else ''}{message} (see `{self.prog} --help`)")


class _ListAction(argparse.Action):
    """A list option: its values space- or comma-separated (``--policy eager,fused``,
    ``--policies eager fused``); repeated, the lists add up. Each value is mapped by
    `convert` (e.g. the dtype aliases) and checked against `valid`. The values each
    spelling gave are kept in ``namespace._given`` (``{"--math": [...]}``); a spelling in
    `deprecated` (``{old: new}``) is noted in ``namespace._deprecated`` for a warning once
    the command line is read.

    `spill`: the command's positional argument, which argparse's greedy lists would eat
    when it comes after them (``castlab exhaustive --policy eager fused swiglu``): the
    last of several values, when it is no value of this option, is kept in
    ``namespace._spill`` (with the error it would have been) for ``_main`` to take as
    that argument."""

    def __init__(self, option_strings, dest, valid=None, convert=None, deprecated=None,
                 empty=None, nargs="+", spill=None, **kw):
        super().__init__(option_strings, dest, nargs=nargs, **kw)
        self.valid = None if valid is None else tuple(valid)
        self.convert = convert
        self.deprecated = deprecated or {}
        self.empty = empty
        self.spill = spill

    def __call__(self, parser, namespace, values, option_string=None):
        opt = option_string or self.dest
        items = [v.strip() for x in values for v in str(x).split(",")]
        items = [v for v in items if v]
        if not items and self.nargs != "*":
            parser.error(self.empty or f"argument {opt}: expected at least one value "
                         f"({_LIST})")
        out = []
        last = values[-1] if values else ""
        spillable = self.spill and len(values) > 1 and "," not in last
        for v in items:
            bad = None
            if self.convert is not None:
                try:
                    v = self.convert(v)
                except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
                    bad = f"argument {opt}: {e}"
            if bad is None and self.valid is not None and v not in self.valid:
                bad = (f"argument {opt}: invalid choice: {v!r} (choose from "
                       + ", ".join(map(str, self.valid)) + ")")
            if bad is not None:
                if spillable and v is items[-1] and v == last.strip():
                    earlier = getattr(namespace, "_spill", None)
                    if earlier is not None:  # two such values: the first was no chain
                        parser.error(earlier[1])
                    namespace._spill = (v, bad)  # perhaps the positional argument
                    continue
                parser.error(bad)
            out.append(v)
        setattr(namespace, self.dest, list(getattr(namespace, self.dest, None) or []) + out)
        given = dict(getattr(namespace, "_given", None) or {})
        given[opt] = given.get(opt, []) + out
        namespace._given = given
        if opt in self.deprecated:
            dep = list(getattr(namespace, "_deprecated", None) or [])
            if (opt, self.deprecated[opt]) not in dep:
                dep.append((opt, self.deprecated[opt]))
            namespace._deprecated = dep


def _list(p, *flags: str, **kw) -> None:
    """A list option (``_ListAction``) with default None."""
    p.add_argument(*flags, action=_ListAction, default=None, **kw)


class _Run:
    """The run record of one computing command (castlab._runrecord): its first line,
    printed at once (the device and, when it fell back to the CPU, why), and run.json in
    `out`, written now (status "running") and again when the ``with`` block ends
    (finished, interrupted or failed, with the elapsed time and ``extra``)."""

    def __init__(self, command: str, device: str, requested: str | None, config: dict,
                 seeds: Any, out: str, workers: int | None = None,
                 scheduler: str | None = None):
        fallback = None if scheduler else _runrecord.fallback_reason(requested, device)
        short = None if scheduler else _runrecord.fallback_reason(requested, device, short=True)
        print(_runrecord.first_line(command, device, short, workers=workers,
                                    scheduler=scheduler), flush=True)
        self.record = _runrecord.record(command, device, config, seeds, fallback)
        self.out, self.extra, self.status = out, {}, "finished"
        self.t0 = time.perf_counter()
        self.path = self._write("running")

    def _write(self, status: str, **more: Any) -> str:
        return _runrecord.write(self.out, self.record, status=status, **self.extra, **more)

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, kind, value, tb) -> None:
        elapsed = round(time.perf_counter() - self.t0, 3)
        try:
            if kind is None:
                self._write(self.status, elapsed_s=elapsed)
            elif issubclass(kind, KeyboardInterrupt):
                self._write("interrupted", elapsed_s=elapsed)
            else:
                self._write("failed", elapsed_s=elapsed,
                            error=" ".join(str(value).split()) or kind.__name__)
        except OSError:  # the folder went away: the command's own error says more
            if kind is None:
                raise


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="castlab", description=HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"castlab {_C.__version__}")
    sub = p.add_subparsers(dest="command", metavar="{study,exhaustive,bounds,info,ops}")
    s = sub.add_parser("study", help="run an A/B precision study",
                       description="Run the same chains under several policies and math presets "
                       "and compare each result with the fp64 reference. Every list option "
                       f"takes its values {_LIST}.",
                       epilog=STUDY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _list(s, "--chains", "--chain", dest="chains", metavar="CHAIN",
          empty="--chains needs at least one chain, e.g. --chains swiglu,rope",
          help="chains to study: built-in names (" + ", ".join(CHAINS) + "), "
          "pkg.module:function or path/file.py:function (any castlab.jit-able "
          "function; give its inputs with --shape, e.g. --shape CHAIN=AxB or --shape "
          "NAME=AxB per input, or in --config); default: swiglu rope")
    _list(s, "--math", dest="math", metavar="PRESET",
          help="math presets every policy runs under (valid: " + ", ".join(_valid_presets())
          + "; default: torch_eager). For one release, --math all or kernel-library "
          "names alone still run --libraries, with a warning")
    _list(s, "--presets", dest="math", metavar="PRESET", valid=_valid_presets(),
          deprecated={"--presets": "--math"}, help=argparse.SUPPRESS)
    _list(s, "--libraries", "--library", dest="libraries", metavar="LIBRARY",
          valid=["all", *libraries()],
          help="measure kernel-library presets instead of policies: 'all' or names ("
          + ", ".join(libraries()) + "), e.g. `castlab study --chains swiglu,rope "
          "--libraries all` (see below)")
    _list(s, "--dtypes", "--dtype", dest="dtypes", metavar="DTYPE", convert=_dtype_name,
          valid=_FLOAT_DTYPES,
          help="input dtypes (valid: " + ", ".join(_FLOAT_DTYPES) + f", or {_DTYPE_ALIASES}; "
          "default: bfloat16 float16 float32)")
    _list(s, "--policies", "--policy", dest="policies", metavar="POLICY",
          valid=["eager", "fused", "fp64"],
          help="policies (valid: eager, fused, fp64; default: eager fused)")
    _list(s, "--extra-presets", dest="extra_presets", metavar="PRESET", nargs="*",
          valid=_valid_presets(),
          help="math presets run fused next to the others, for SwiGLU only "
          "(default: inductor nvfuser transformer_engine; give none to skip)")
    _list(s, "--rounding", dest="rounding", metavar="MODE",
          valid=["nearest", "toward_zero", "stochastic"],
          help="downcast rounding modes (valid: nearest, toward_zero, stochastic)")
    _list(s, "--shape", "--shapes", dest="shape", metavar="SHAPE",
          help="input shapes (positive sizes, at most 2**31 elements): a bare AxB for every "
          "chain, CHAIN=AxB for one chain (e.g. swiglu=1024x2048, rope=1x8x512x128; for a "
          "pkg.module:function chain, the shape of each of its inputs), NAME=AxB for the "
          "input of that parameter name (x=4x4096 w=4096), CHAIN.NAME=AxB for one input of "
          "one chain; repeatable (see below)")
    _list(s, "--seeds", "--seed", dest="seeds", metavar="SEED", convert=_SEED,
          help="input seeds (default 0)")
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
    s.add_argument("--config", metavar="FILE", help="a TOML file with any of these settings, "
                   "and chains with per-input specs (see below)")
    s.add_argument("--out", default=None,
                   help="output folder (default castlab-study/; given here it wins over the "
                   "config file's `out`). A folder that already holds results (results.csv or "
                   "summary.json) is refused unless --overwrite is given")
    s.add_argument("--overwrite", action="store_true",
                   help="replace the results in an existing --out folder")
    s.add_argument("--resume", action="store_true",
                   help="continue an interrupted study in --out: the cells already finished "
                   "there (cells.jsonl) are kept and not run again")
    s.add_argument("--workers", type=_int_arg(1, _MAX_WORKERS), default=None, metavar="N",
                   help="run the study's cells on a Dask LocalCluster of N worker processes "
                   "(with --device cuda: one GPU each); rows equal a serial run's")
    s.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="send the cells to an existing Dask cluster (tcp://host:8786)")
    s.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    _exhaustive_parser(sub)
    _bounds_parser(sub)
    sub.add_parser("info", help="print versions and devices")
    sub.add_parser("ops", help="list the elementwise ops (the op table, ops/op_table.h)")
    return p


# ---------------------------------------------------------------- castlab exhaustive

def _swiglu2(a, b):
    return ops.silu(a) * b


def _geglu2(a, b):
    return ops.gelu(a) * b


#: Chains of separate inputs for ``castlab exhaustive`` (besides every unary op by name).
EXHAUSTIVE_CHAINS = {"swiglu": _swiglu2, "geglu": _geglu2}
_UNARY = sorted(o.name for o in OPS.values() if o.arity == 1 and o.public and o.category != "internal")
#: The files ``castlab exhaustive`` writes into --out (the first two are its results).
EXHAUSTIVE_FILES = ("exhaustive.json", "exhaustive.csv", "run.json")


def _exhaustive_parser(sub) -> None:
    e = sub.add_parser(
        "exhaustive", help="every input of a chain, against fp64",
        description="Run a chain on every input tuple of a dtype (the cross product of one "
        "enumeration per argument) under each policy x math, count exact / correctly rounded "
        "/ 1 ulp / >1 ulp / NaN-mismatch results against the fp64 reference and where the "
        "configurations disagree (castlab.numerics.exhaustive). Every list option takes its "
        f"values {_LIST}; the chain may come first or last (castlab exhaustive swiglu "
        "--policy eager fused, castlab exhaustive --policy eager fused swiglu).")
    e.add_argument("chain", nargs="?", default=None,
                   help="swiglu, geglu (silu(a)*b, gelu(a)*b), a unary op ("
                   + ", ".join(_UNARY) + ") or pkg.module:function / path/file.py:function")
    _list(e, "--dtype", "--dtypes", dest="dtype", metavar="DTYPE", convert=_dtype_name,
          valid=_EXHAUSTIVE_DTYPES, spill="chain",
          help="input dtype, one (valid: " + ", ".join(_EXHAUSTIVE_DTYPES) + ", or bf16, "
          "fp16, fp32, fp8_e4m3, fp8_e5m2; default bfloat16)")
    _list(e, "--math", dest="math", metavar="PRESET", valid=_valid_presets(), spill="chain",
          help="math presets (valid: " + ", ".join(_valid_presets()) + "; default torch_eager)")
    _list(e, "--policy", "--policies", dest="policy", metavar="POLICY", valid=["eager", "fused"],
          spill="chain", help="policies: eager, fused (default eager fused)")
    e.add_argument("--values", choices=["all", "finite"], default="all",
                   help="every bit pattern, or the finite values only (default all)")
    e.add_argument("--sample", type=_int_arg(1), default=None, metavar="N",
                   help="the second and later inputs take N sampled values each (seed --seed)")
    _list(e, "--seed", "--seeds", dest="seed", metavar="SEED", convert=_int_arg(0, 2**63 - 1),
          spill="chain", help="seed of --sample, one (default 0)")
    e.add_argument("--start", type=_int_arg(0), default=0,
                   help="first index of the cross product")
    e.add_argument("--stop", type=_int_arg(0), default=None, help="end index (default: all)")
    e.add_argument("--first-k", type=_int_arg(0, 2**31 - 1), default=10,
                   help="differing inputs kept per pair")
    e.add_argument("--ref-math", default="portable",
                   help="math of the fp64 reference (default portable)")
    e.add_argument("--allow-long", action="store_true",
                   help="run even when the estimate exceeds --max-seconds")
    e.add_argument("--max-seconds", type=_seconds_arg, default=120.0,
                   help="refuse runs estimated to take longer (default 120)")
    e.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda when available, else cpu); on the "
                   "GPU one generated kernel enumerates and reduces, and no run is refused")
    e.add_argument("--out", default="castlab-exhaustive",
                   help="folder for exhaustive.json, exhaustive.csv and run.json (default "
                   "%(default)s). A folder that already holds results is refused unless "
                   "--overwrite is given")
    e.add_argument("--overwrite", action="store_true",
                   help="replace the results in an existing --out folder")
    e.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it shows the time estimate and the running rate)")


def _exhaustive_fn(spec: str) -> Any:
    if spec in EXHAUSTIVE_CHAINS:
        return EXHAUSTIVE_CHAINS[spec]
    if spec in _UNARY:
        return getattr(ops, spec)
    if ":" in spec:
        return _resolve_chain(spec, "").fn
    raise CLIError(f"unknown chain {spec!r}; valid: " + ", ".join(list(EXHAUSTIVE_CHAINS) + _UNARY)
                   + ", or pkg.module:function")


def _cuda_ok() -> bool:
    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001  (no CUDA support compiled or loadable)
        return False


def _fn_arity(fn: Any) -> int:
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(1 for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is p.empty) or 1


def _one(args: argparse.Namespace, dest: str, flag: str, default: Any, what: str) -> Any:
    """The one value of a list option that takes one value in this command."""
    v = getattr(args, dest)
    if v is None:
        return default
    v = list(dict.fromkeys(v))
    if len(v) != 1:
        raise CLIError(f"{flag}: castlab exhaustive runs one {what} at a time, got "
                       + ", ".join(map(str, v)) + f" (run it once per {what})")
    return v[0]


def _refuse_old_results(out: str, names: tuple, overwrite: bool) -> None:
    """Refuse an --out folder that holds results (regular files among `names`) unless
    --overwrite."""
    if overwrite or not os.path.isdir(out):
        return
    old = [n for n in names if os.path.isfile(os.path.join(out, n))]
    if old:
        raise CLIError(f"--out {out!r} already holds results ({', '.join(old)}); pass "
                       "--overwrite to replace them or choose another --out")


def _secs(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def _exhaustive_progress(stream: Any = None):
    """progress(done, n, seconds) for numerics.exhaustive: the estimate once measured,
    then a bar with the running rate and the time left (on stderr)."""
    said, last = [False], [0]

    def show(done: int, n: int, seconds: float) -> None:
        rate = done / seconds if seconds > 0 else 0.0
        if not said[0]:
            said[0] = True
            if 0 < done < n and rate > 0:
                print(f"castlab exhaustive: {n} inputs, about {_secs(n / rate)} s at "
                      f"{rate:.3g} inputs/s (measured on the first {done})",
                      file=stream or sys.stderr, flush=True)
            elif done == 0:
                print(f"castlab exhaustive: {n} inputs in one GPU kernel",
                      file=stream or sys.stderr, flush=True)
        if done >= n:
            label = f"{rate:.3g} inputs/s, {_secs(seconds)} s" if rate else "done"
        else:
            label = (f"{rate:.3g} inputs/s, about {_secs((n - done) / rate)} s left" if rate
                     else "starting")
        _bar(done, n, label, stream=stream, prev=last[0])
        last[0] = done
    return show


def cmd_exhaustive(args: argparse.Namespace) -> int:
    fn = _exhaustive_fn(args.chain)
    maths = list(dict.fromkeys(args.math or ["torch_eager"]))
    pols = list(dict.fromkeys(args.policy or ["eager", "fused"]))
    dtype = _one(args, "dtype", "--dtype", "bfloat16", "dtype")
    seed = _one(args, "seed", "--seed", 0, "seed")
    if args.sample is not None and args.sample <= 0:
        raise CLIError(f"--sample must be positive, got {args.sample}")
    try:
        as_math(args.ref_math)
    except (TypeError, ValueError) as e:
        raise CLIError(f"--ref-math {args.ref_math!r}: {e}") from None
    device = args.device or ("cuda" if _cuda_ok() else "cpu")
    try:
        dev = as_device(device)
    except (TypeError, ValueError) as e:
        raise CLIError(f"--device {device!r}: {e}") from None
    if dev.is_cuda and not _cuda_ok():
        raise CLIError(f"--device {device}: no usable GPU ({cuda.unavailable_reason()})")
    if args.stop is not None and args.stop <= args.start:
        raise CLIError(f"--start/--stop: the index range [{args.start}, {args.stop}) is empty "
                       "(--stop must be greater than --start)")
    E = numerics.Enumeration
    first = E.finite(dtype) if args.values == "finite" else E.all(dtype)
    n_in = _fn_arity(fn)
    if args.sample and n_in == 1:
        raise CLIError(f"--sample samples the second and later inputs; {args.chain} has one "
                       "input (restrict it with --start/--stop instead)")
    rest = [E.sample(dtype, args.sample, seed=seed + k, finite=args.values == "finite")
            if args.sample else first for k in range(n_in - 1)]
    total = math.prod(len(x) for x in [first, *rest])
    if args.start >= total or (args.stop is not None and args.stop > total):
        raise CLIError(f"--start/--stop: the index range [{args.start}, "
                       f"{total if args.stop is None else args.stop}) lies outside the {total} "
                       f"inputs of {args.chain} (indices 0 to {total - 1})")
    # the folder before the run, not after
    _refuse_old_results(args.out, EXHAUSTIVE_FILES[:2], args.overwrite)
    _check_out(args.out, EXHAUSTIVE_FILES)
    config = {"chain": args.chain, "dtype": dtype, "math": maths, "policy": pols,
              "values": args.values, "sample": args.sample, "seed": seed, "start": args.start,
              "stop": args.stop, "first_k": args.first_k, "ref_math": args.ref_math,
              "allow_long": args.allow_long, "max_seconds": args.max_seconds,
              "device": str(dev), "out": args.out, "overwrite": args.overwrite,
              "progress": not args.no_progress}
    run = _Run("exhaustive", str(dev), args.device, config, [seed], args.out)
    with run:
        try:
            res = numerics.exhaustive(
                fn, [first, *rest], [(p, m) for p in pols for m in maths],
                ref_math=args.ref_math, first_k=args.first_k, start=args.start, stop=args.stop,
                allow_long=args.allow_long, max_seconds=args.max_seconds, device=str(dev),
                progress=None if args.no_progress else _exhaustive_progress())
        except numerics.ExhaustiveTooLong as e:  # the message names the CLI's flags
            raise CLIError(
                f"exhaustive: {e.n} inputs would take about {e.estimate:.0f} s on this CPU "
                f"({e.rate:.3g} inputs/s measured on the first {e.measured}), more than "
                f"--max-seconds {e.max_seconds:g}; pass --allow-long (or a larger "
                "--max-seconds), a smaller range (--start/--stop)"
                + (", a sampled second input (--sample N)" if n_in > 1 else "")
                + " or --device cuda on a GPU") from None
        print(res)
        res.to_json(os.path.join(args.out, "exhaustive.json"))
        res.to_csv(os.path.join(args.out, "exhaustive.csv"))
        run.extra["inputs"] = res.n
    print(f"wrote {os.path.join(args.out, 'exhaustive.json')}, exhaustive.csv and run.json")
    return 0


# ---------------------------------------------------------------- castlab bounds

#: The files ``castlab bounds`` writes into --out (the first two are its results).
BOUNDS_FILES = ("bounds.json", "bounds.csv", "run.json")


def _bounds_parser(sub) -> None:
    b = sub.add_parser(
        "bounds", help="proven worst cases of library kernels against fp64, eager, compile",
        description="The proven worst case of each kernel library's preset of an op (or of a "
        "one-argument op) against the exact answer, PyTorch eager and torch.compile, over "
        "every input of a dtype: max ulps, max absolute and relative error, the share that "
        "differs, and the worst input (castlab.testing.bounds). A one-argument op visits all "
        "65,536 patterns; SwiGLU every gate value times sampled up values (every pair on a "
        "GPU); RoPE every x1 times sampled x2 and angles. Results are cached on disk. Every "
        f"list option takes its values {_LIST}.")
    b.add_argument("chains", nargs="*", default=None, metavar="CHAIN",
                   help="ops: " + ", ".join(_presets_ops()) + " or a one-argument op ("
                   + ", ".join(_testing_unary()) + "); default swiglu rope")
    _list(b, "--dtype", "--dtypes", dest="dtype", metavar="DTYPE", convert=_dtype_name,
          valid=["bfloat16", "float16", "float32"], spill="chains",
          help="dtypes (bfloat16, float16, float32 or bf16, fp16, fp32; default bfloat16)")
    _list(b, "--libraries", "--library", dest="libraries", metavar="LIBRARY",
          valid=["all", *libraries()], spill="chains",
          help="the libraries whose presets are bounded: 'all' (default) or names ("
          + ", ".join(libraries()) + ")")
    _list(b, "--against", dest="against", metavar="REF", spill="chains",
          help="references: fp64, torch_eager, inductor (default all three), a library, "
          "or POLICY/MATH")
    b.add_argument("--values", choices=["all", "finite"], default="all",
                   help="every bit pattern, or the finite values only (default all)")
    b.add_argument("--sample", type=_int_arg(1), default=None, metavar="N",
                   help="input tuples a multi-input op visits (default: 2**32 on a GPU, "
                   "2**22 on the CPU)")
    b.add_argument("--seed", type=_int_arg(0, 2**63 - 1), default=0,
                   help="seed of the sampled inputs (default 0)")
    b.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    b.add_argument("--no-cache", action="store_true",
                   help="recompute instead of reading the disk cache "
                   "($CASTLAB_BOUNDS_DIR, default ~/.cache/castlab/bounds)")
    b.add_argument("--out", default="castlab-bounds",
                   help="folder for bounds.json, bounds.csv and run.json (default "
                   "%(default)s); one that already holds results is refused unless "
                   "--overwrite")
    b.add_argument("--overwrite", action="store_true",
                   help="replace the results in an existing --out folder")


def _presets_ops() -> list:
    return list(presets.OPS)


def _testing_unary() -> list:
    return testing.unary_ops()


def _bounds_subjects(chains: list, libs: list) -> list:
    """(chain, subject) pairs: each library's preset of each preset op; a one-argument op
    as itself."""
    out = []
    for ch in chains:
        if ch in presets.OPS:
            have = [lib for lib in libs if ch in presets.library(lib).presets]
            if not have:
                raise CLIError(f"{ch}: none of the libraries {', '.join(libs)} has a preset "
                               f"of it (castlab.presets.coverage: "
                               f"{', '.join(presets.coverage()[ch])})")
            out += [(ch, presets.library(lib)[ch]) for lib in have]
        elif ch in testing.unary_ops():
            out.append((ch, ch))
        else:
            raise CLIError(f"unknown chain {ch!r}; valid: " + ", ".join(
                list(presets.OPS) + testing.unary_ops()))
    return out


def cmd_bounds(args: argparse.Namespace) -> int:
    chains = list(dict.fromkeys(args.chains or ["swiglu", "rope"]))
    dtypes = list(dict.fromkeys(args.dtype or ["bfloat16"]))
    libs = list(dict.fromkeys(args.libraries or ["all"]))
    libs = libraries() if "all" in libs else libs
    against = list(dict.fromkeys(args.against or list(testing.DEFAULT_AGAINST)))
    device = args.device or ("cuda" if _cuda_ok() else "cpu")
    try:
        dev = as_device(device)
    except (TypeError, ValueError) as e:
        raise CLIError(f"--device {device!r}: {e}") from None
    if dev.is_cuda and not _cuda_ok():
        raise CLIError(f"--device {device}: no usable GPU ({cuda.unavailable_reason()})")
    subjects = _bounds_subjects(chains, libs)
    _refuse_old_results(args.out, BOUNDS_FILES[:2], args.overwrite)
    _check_out(args.out, BOUNDS_FILES)
    config = {"chains": chains, "dtype": dtypes, "libraries": libs, "against": against,
              "values": args.values, "sample": args.sample, "seed": args.seed,
              "device": str(dev), "cache": not args.no_cache, "out": args.out,
              "overwrite": args.overwrite}
    results = []
    run = _Run("bounds", str(dev), args.device, config, [args.seed], args.out)
    with run:
        for d in dtypes:
            for ch, subj in subjects:
                refs = [a for a in against
                        if not (isinstance(subj, presets.OpPreset) and a in libraries()
                                and ch not in presets.library(a).presets)]
                try:
                    r = testing.bounds(subj, d, refs, device=str(dev), values=args.values,
                                       sample=args.sample, seed=args.seed,
                                       cache=not args.no_cache)
                except (TypeError, ValueError) as e:
                    raise CLIError(f"bounds {ch} {d}: {e}") from None
                results.append(r)
                print(r, flush=True)
        rows = [dict(zip(testing.Bounds.headers(), row)) for r in results
                for row in r.table_rows()]
        with open(os.path.join(args.out, "bounds.json"), "w") as f:
            json.dump([r.to_dict() for r in results], f, indent=1)
        with open(os.path.join(args.out, "bounds.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=testing.Bounds.headers())
            w.writeheader()
            w.writerows(rows)
        run.extra["bounds"] = len(results)
    print(f"wrote {os.path.join(args.out, 'bounds.json')}, bounds.csv and run.json")
    return 0


CONFIG_KEYS = {"chains", "dtypes", "policies", "math", "presets", "extra_presets", "rounding",
               "shapes", "seeds", "seed", "input", "scale", "device", "quick", "out", "grad",
               "attribute"}


_MAX_CONFIG_BYTES = 1 << 24


def load_config(path: str) -> dict:
    """Read a study TOML file; errors name the file and line."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise CLIError("reading --config needs Python 3.11+ or `pip install tomli`") from None
    if os.path.exists(path) and not os.path.isfile(path):  # a folder, /dev/zero, a FIFO
        raise CLIError(f"config file {path!r} is not a regular file")
    if os.path.isfile(path) and os.path.getsize(path) > _MAX_CONFIG_BYTES:
        raise CLIError(f"config file {path!r} is {os.path.getsize(path)} bytes; a study "
                       f"config is at most {_MAX_CONFIG_BYTES} bytes")
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
                       + ", ".join(sorted(CONFIG_KEYS - {"presets"})))
    if "presets" in cfg:  # the old name of math (one release)
        if "math" in cfg:
            raise CLIError(f"{path}: math and presets (its old name) both give the math "
                           "presets: give math")
        _warn(f"{path}: presets is deprecated; use math")
        cfg["math"] = cfg.pop("presets")
    return cfg


def _form(chain: str) -> str:
    return f"{chain}=" + "x".join(str(d) for d in CHAINS[chain].default_shape)


def _shape_entries(items: list[str] | None) -> list[tuple[str, str | None, tuple]]:
    """--shape values as (the value, its key or None, dims): ``AxB`` (every chain),
    ``KEY=AxB`` (a chain, an input name or CHAIN.NAME: told apart once the chains are
    known, by ``_apply_shapes``)."""
    out = []
    for it in items or []:
        k, eq, v = it.rpartition("=")
        key = k.strip() if eq else None
        if eq and not key:
            raise CLIError(f"--shape {it!r}: nothing before '='; expected AxB, CHAIN=AxB, "
                           "NAME=AxB or CHAIN.NAME=AxB (e.g. swiglu=1024x2048, x=4x4096)")
        if not eq and (v.strip() in CHAINS or ":" in v):
            name = v.strip()
            raise CLIError(f"--shape {it!r} names a chain but no shape: write CHAIN=AxB, e.g. "
                           + (_form(name) if name in CHAINS else f"{name}=64x4096"))
        form = _form(key) if key in CHAINS else f"{key}=64x4096" if key else "64x4096"
        try:
            dims = tuple(int(x) for x in v.strip().lower().split("x"))
        except ValueError:
            raise CLIError(f"--shape {it!r}: bad shape {v!r}" + (f" for {key}" if key else "")
                           + f": expected positive integers joined by 'x', e.g. {form}") from None
        out.append((it, key, dims))
    return out


def _chain_key(key: str, names: list[str]) -> bool:
    """Whether a --shape key names a chain: one of this study's, a built-in, or a
    pkg.module:function / path/file.py:function spec (a ':' with no '.' after it)."""
    return key in names or key in CHAINS or (":" in key and "." not in key.rsplit(":", 1)[1])


def _checked_shape_of(ch: Any, dims: tuple, where: str) -> tuple:
    try:
        return study._check_chain_shape(ch, dims)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{where}: {e}") from None


def _apply_shapes(chains: list, shapes: dict, items: list[str] | None) -> tuple[list, dict]:
    """Apply the --shape values to the study's chains (Chain objects): the chains (a
    pkg.module:function chain given per-input shapes gets Input specs) and the shapes
    per chain name. The most specific value wins: CHAIN.NAME, then NAME, then CHAIN,
    then a bare shape. A built-in chain's shape is its first input's (x)."""
    entries = _shape_entries(items)
    if not entries:
        return chains, shapes
    names = [ch.name for ch in chains]
    params = {ch.name: study.input_names(ch) for ch in chains}
    bare, per_chain, per_name, per_input = None, {}, {}, {}
    for it, key, dims in entries:
        if key is None:
            bare = (it, dims)
        elif _chain_key(key, names):
            if key not in names and key not in CHAINS:
                raise CLIError(f"--shape {it!r}: chain {key!r} is not in this study (chains: "
                               + ", ".join(names) + ")")
            if key not in names:  # a built-in not studied: checked, as before, not used
                _checked_shape(key, dims, f"--shape {it!r}")
                continue
            per_chain[key] = (it, dims)
        elif "." in key and _chain_key(key.rsplit(".", 1)[0], names):
            cname, iname = key.rsplit(".", 1)
            if cname not in names:
                raise CLIError(f"--shape {it!r}: chain {cname!r} is not in this study "
                               "(chains: " + ", ".join(names) + ")")
            if iname not in params[cname]:
                raise CLIError(f"--shape {it!r}: chain {cname!r} has no input {iname!r}; its "
                               "inputs: " + ", ".join(params[cname]))
            per_input[(cname, iname)] = (it, dims)
        else:
            if not any(key in ps for ps in params.values()):
                raise CLIError(f"--shape {it!r}: unknown chain or input name {key!r}; this "
                               "study's chains and their inputs: " + "; ".join(
                                   f"{n}({', '.join(ps)})" for n, ps in params.items()))
            per_name[key] = (it, dims)
    shapes = dict(shapes or {})
    out = []
    for ch in chains:
        ps = params[ch.name]

        def given(i: int, ps=ps, ch=ch):
            return per_input.get((ch.name, ps[i])) or per_name.get(ps[i])

        whole = per_chain.get(ch.name) or bare
        if study._is_builtin(ch):  # one shape, its first input's; the others follow it
            for i in range(1, len(ps)):
                if (ch.name, ps[i]) in per_input:
                    it = per_input[(ch.name, ps[i])][0]
                    raise CLIError(f"--shape {it!r}: {ch.name}'s input {ps[i]!r} is made from "
                                   f"its {ps[0]!r}; give --shape {ch.name}.{ps[0]}=... or "
                                   f"--shape {ch.name}=...")
            pick = given(0) or whole
            if pick is not None:
                where = f"--shape {pick[0]!r}"
                if (ch.name, ps[0]) not in per_input and pick is per_name.get(ps[0]):
                    where += (f" (it gives every chain's input {ps[0]!r}; --shape "
                              f"{ch.name}.{ps[0]}=... gives {ch.name}'s alone)")
                shapes[ch.name] = _checked_shape_of(ch, pick[1], where)
            out.append(ch)
            continue
        if whole is not None:
            shapes[ch.name] = _checked_shape_of(ch, whole[1], f"--shape {whole[0]!r}")
        named = {i: given(i) for i in range(len(ps)) if given(i) is not None}
        if not named:
            out.append(ch)
            continue
        for it, dims in named.values():
            _checked_shape_of(ch, dims, f"--shape {it!r}")
        if ch.inputs is not None:  # specs from --config: the named inputs get new shapes
            specs = list(ch.inputs)
            for i, (it, dims) in named.items():
                if specs[i].fixed:
                    raise CLIError(f"--shape {it!r}: input {ps[i]!r} of chain {ch.name!r} is "
                                   "read from a file or given as a tensor; its shape is the "
                                   "file's")
                specs[i] = dataclasses.replace(specs[i], shape=tuple(dims))
        else:
            specs = []
            for i, n in enumerate(ps):
                dims = named[i][1] if i in named else (whole[1] if whole else None)
                if dims is None:
                    raise CLIError(f"--shape: input {n!r} of chain {ch.name!r} has no shape; "
                                   f"give --shape {n}=AxB, --shape {ch.name}.{n}=AxB or "
                                   f"--shape {ch.name}=AxB (every input)")
                specs.append(study.Input(shape=tuple(dims)))
        out.append(study.chain(ch, inputs=specs))
    return out, shapes


def _checked_shape(chain: str, dims: Any, where: str) -> tuple:
    try:
        if chain not in CHAINS and ":" in chain:
            return study._check_dims(dims, f"shape for {chain}")
        return study.check_shape(chain, dims)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{where}: {e}") from None


CHAIN_KEYS = ("chain", "name", "shape", "inputs")
INPUT_KEYS = ("shape", "dtype", "distribution", "scale", "file", "key")


def _config_chains(items: list, path: str) -> tuple[list, dict]:
    """The chains of a config file (names, specs or tables with per-input specs) as
    ``study.run`` takes them, and the shapes the tables give."""
    base = os.path.dirname(os.path.abspath(path))
    chains: list = []
    shapes: dict = {}
    for i, it in enumerate(items):
        where = f"{path}: chains[{i}]"
        if isinstance(it, str):
            chains.append(_resolve_chain(it, where, base))
            continue
        if not isinstance(it, dict):
            raise CLIError(f"{where} must be a chain name or a table like "
                           f'{{ chain = "pkg.module:function", inputs = [...] }}, got {it!r}')
        unknown = sorted(set(it) - set(CHAIN_KEYS))
        if unknown:
            raise CLIError(f"{where}: unknown key(s) {unknown}; valid: " + ", ".join(CHAIN_KEYS))
        spec = it.get("chain")
        if not isinstance(spec, str) or not spec:
            raise CLIError(f'{where}.chain must be a string: a built-in name or '
                           f'"pkg.module:function", got {spec!r}')
        name = it.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            raise CLIError(f"{where}.name must be a non-empty string, got {name!r}")
        ins = it.get("inputs")
        specs = None
        if ins is not None:
            if not isinstance(ins, list) or not ins:
                raise CLIError(f"{where}.inputs must be a non-empty list of tables, e.g. "
                               "[{ shape = [64, 4096] }, { file = \"x.npy\" }], got "
                               f"{ins!r}")
            specs = [_config_input(x, f"{where}.inputs[{j}]", base) for j, x in enumerate(ins)]
        try:
            ch = study.chain(spec if spec in CHAINS else _resolve_chain(spec, where, base),
                             inputs=specs, name=name)
        except (TypeError, ValueError) as e:
            raise CLIError(f"{where}: {e}") from None
        if "shape" in it:
            shp = it["shape"]
            if ch.name in CHAINS and ch.make_inputs is not None:
                shapes[ch.name] = _checked_shape(ch.name, shp, f"{where}.shape")
            else:
                try:
                    shapes[ch.name] = study._check_dims(shp, f"{where}.shape")
                except (TypeError, ValueError) as e:
                    raise CLIError(f"{e} (expected a list of positive integers, e.g. "
                                   "[64, 4096])") from None
        chains.append(ch)
    return chains, shapes


def _config_input(x: Any, where: str, base: str) -> Any:
    if not isinstance(x, dict):
        raise CLIError(f"{where} must be a table like {{ shape = [64, 4096], dtype = "
                       f'"float32" }} or {{ file = "x.npy" }}, got {x!r}')
    unknown = sorted(set(x) - set(INPUT_KEYS))
    if unknown:
        raise CLIError(f"{where}: unknown key(s) {unknown}; valid: " + ", ".join(INPUT_KEYS))
    kw = dict(x)
    if "shape" in kw:
        shp = kw["shape"]
        if not isinstance(shp, list) or not shp or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shp):
            raise CLIError(f"{where}.shape must be a list of positive integers, e.g. "
                           f"[64, 4096], got {shp!r}")
        kw["shape"] = tuple(shp)
    if "dtype" in kw:
        kw["dtype"] = _dtype_name(kw["dtype"])
        _one_of(f"{where}.dtype", kw["dtype"], _FLOAT_DTYPES)
    if "distribution" in kw:
        _one_of(f"{where}.distribution", kw["distribution"], study.DISTRIBUTIONS)
    if "scale" in kw:
        sc = kw["scale"]
        if (isinstance(sc, bool) or not isinstance(sc, (int, float)) or not math.isfinite(sc)
                or sc <= 0):
            raise CLIError(f"{where}.scale must be a positive finite number, e.g. 2.0, got "
                           f"{sc!r}")
    for k in ("file", "key"):
        if k in kw and (not isinstance(kw[k], str) or not kw[k]):
            raise CLIError(f"{where}.{k} must be a non-empty string, got {kw[k]!r}")
    if "file" in kw:
        f = kw["file"]
        kw["file"] = f if os.path.isabs(f) else os.path.normpath(os.path.join(base, f))
    try:  # a file is read from its resolved path, named as written
        return study.Input(label=x.get("file"), **kw)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{where}: {e}") from None


def _resolve_chain(spec: str, where: str, base: str | None = None) -> Any:
    if spec in CHAINS:
        return spec
    try:
        return study.chain(spec, base=base)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{where}: {e}" if where else str(e)) from None


def _study_settings(args: argparse.Namespace) -> dict:
    """The study's settings: the defaults, then the config file, then the command line
    (the math presets under "math", chains as Chain objects with --shape applied)."""
    st: dict[str, Any] = dict(QUICK if args.quick else DEFAULT)
    st["math"] = st.pop("presets")
    st["quick"] = bool(args.quick)
    st["out"] = "castlab-study"
    if args.config is not None:  # (--config '' names no file: refused, not ignored)
        if not args.config.strip():
            raise CLIError("--config needs a TOML file, got an empty name")
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
        for key in ("chains", "dtypes", "policies", "math", "rounding", "seeds"):
            if key in cfg and (not isinstance(cfg[key], list) or not cfg[key]):
                raise CLIError(f"{args.config}: {key} must be a non-empty list, got {cfg[key]!r}")
        for key in ("quick", "grad", "attribute"):
            if key in cfg and not isinstance(cfg[key], bool):
                raise CLIError(f"{args.config}: {key} must be true or false, got {cfg[key]!r}")
        valid = {"dtypes": _FLOAT_DTYPES, "policies": ("eager", "fused", "fp64"),
                 "math": tuple(_valid_presets()),
                 "rounding": ("nearest", "toward_zero", "stochastic")}
        if "dtypes" in cfg:
            cfg["dtypes"] = [_dtype_name(v) for v in cfg["dtypes"]]
        for key, ok in valid.items():
            for j, v in enumerate(cfg.get(key, [])):
                _one_of(f"{args.config}: {key}[{j}]", v, ok)
        for j, v in enumerate(cfg.get("seeds", [])):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
                raise CLIError(f"{args.config}: seeds[{j}] must be an integer in [0, 2**64), "
                               f"got {v!r}")
        if "input" in cfg:
            _one_of(f"{args.config}: input", cfg["input"], study.DISTRIBUTIONS)
        if "extra_presets" in cfg:
            ep = cfg["extra_presets"]
            if not isinstance(ep, dict) or not all(
                    isinstance(v, list) and all(m in _valid_presets() for m in v)
                    for v in ep.values()):
                raise CLIError(f"{args.config}: extra_presets must be a list of presets "
                               "(for swiglu) or a table { chain = [presets] }, e.g. "
                               f'extra_presets = ["inductor"], got {ep!r}')
        if "chains" in cfg:
            cfg["chains"], cshapes = _config_chains(cfg["chains"], args.config)
            if cshapes:
                cfg["shapes"] = dict(cfg.get("shapes") or {}, **cshapes)
        st.update(cfg)
    if args.out is not None:  # an explicit --out wins over the config file
        st["out"] = args.out
    for key in ("chains", "dtypes", "policies", "math", "rounding", "input", "scale",
                "device", "seeds"):
        v = getattr(args, key)
        if v is not None:
            st[key] = v
    st["grad"] = bool(args.grad or st.get("grad", False))
    st["attribute"] = bool(args.attribute or st.get("attribute", False))
    if args.extra_presets is not None:
        st["extra_presets"] = {"swiglu": list(args.extra_presets)}
    _shape_entries(args.shape)  # a malformed --shape is refused before any chain is imported
    chains = [_resolve_chain(c, "--chains" if args.chains else "") if isinstance(c, str)
              else c for c in st["chains"]]
    st["chains"], st["shapes"] = _apply_shapes([study.chain(c) for c in chains],
                                               st.get("shapes"), args.shape)
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


# ---------------------------------------------------------------- castlab study --libraries

#: The ops of the kernel-library presets that each --chains name selects.
LIBRARY_CHAINS = {
    "swiglu": ["swiglu", "swiglu_backward"],
    "rope": ["rope", "rope_backward", "rope_interleaved", "rope_interleaved_backward"],
    "rope_interleaved": ["rope_interleaved", "rope_interleaved_backward"],
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


def _dtype_name(v: Any) -> Any:
    """The full name of a floating dtype given by any of castlab's names (bf16, fp32,
    fp8_e4m3, ...); anything else unchanged, for the caller's check to refuse."""
    if isinstance(v, str):
        try:
            d = as_dtype(v)
        except TypeError:
            return v
        if d.is_floating_point:
            return d.name
    return v


def _one_of(what: str, v: Any, choices) -> None:
    """CLIError "<what> must be one of ..., got v" unless v is one of `choices`."""
    if v not in choices:
        raise CLIError(f"{what} must be one of {', '.join(choices)}, got {v!r}")


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
        if args.libraries is not None:
            return cmd_libraries(args)
        return cmd_study(args)
    except SystemExit as e:  # sys.exit() in a chain's code would end castlab silently
        raise CLIError(f"a chain's code called sys.exit({e.code!r}) (SystemExit); a chain "
                       "must return a tensor") from None


if __name__ == "__main__":
    sys.exit(main())
