"""The ``castlab`` command line's parser (study, exhaustive, bounds, stacks, info, ops): its help
texts, argument types and the list options (space- or comma-separated values)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from . import _C, _runrecord, presets, testing
from ._dtype import as_dtype
from ._optable import OPS
from .policy import Math
from .presets import libraries
from .study import CHAINS

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
  stacks  one Hugging Face causal LM (a config.json with random weights, or a local model
          folder with safetensors) under two stacks (liger, vllm, hf_eager, ...) and fp64:
          per-token log-probability differences, KL, where the runs first differ, and
          with --align the smallest set of choices that makes them bit-identical; writes
          results.csv, summary.json, run.json and plots (needs torch and transformers)
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
    sub = p.add_subparsers(dest="command", metavar="{study,exhaustive,bounds,stacks,info,ops}")
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
    _stacks_parser(sub)
    sub.add_parser("info", help="print versions and devices")
    sub.add_parser("ops", help="list the elementwise ops (the op table, ops/op_table.h)")
    return p


_UNARY = sorted(o.name for o in OPS.values() if o.arity == 1 and o.public and o.category != "internal")


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


#: The built-in stacks of castlab.torch (named here, for the help text, without importing
#: torch; tests/test_cli_stacks.py checks that they equal castlab.torch.stacks()).
STACK_NAMES = ("hf_eager", "torch_compile", "torch_compile_emulate", "liger", "unsloth", "vllm",
               "transformer_engine")


def _stacks_dtype(v: str) -> str:
    """--dtype of castlab stacks: bfloat16, float16 or float32 (or bf16, fp16, fp32)."""
    d = _dtype_name(v)
    if d not in ("bfloat16", "float16", "float32"):
        raise argparse.ArgumentTypeError(f"expected bfloat16, float16 or float32 (or bf16, "
                                         f"fp16, fp32), got {v!r}")
    return d


def _stacks_parser(sub) -> None:
    s = sub.add_parser(
        "stacks", help="one model under two stacks, token by token (castlab.torch)",
        description="Build a Hugging Face causal LM from a config.json (random weights, "
        "seeded by --seed) or a local model folder with safetensors weights, capture it "
        "with castlab.torch, and run it on --batch x --tokens random token ids (seeded) "
        "under stacks --a and --b and the fp64 reference (castlab.torch.compare_stacks). "
        "Prints the comparison (per-token log-probability differences, KL, top-1 flips, "
        "which stack is closer to fp64, per-layer drift) and, with --align, the smallest "
        "set of B's choices whose switch to A's makes the logits bit-identical. Writes "
        "results.csv (one row per scored token), summary.json, run.json, layers.png and "
        "logprob_hist.png to --out. Needs torch and transformers.")
    s.add_argument("--config", required=True, metavar="PATH",
                   help="a config.json (random weights) or a local model folder (with "
                   "*.safetensors: its weights, loaded with local_files_only)")
    s.add_argument("--a", default="liger", metavar="STACK",
                   help="stack A (built-in: " + ", ".join(STACK_NAMES) + "; default liger)")
    s.add_argument("--b", default="vllm", metavar="STACK", help="stack B (default vllm)")
    s.add_argument("--tokens", type=_int_arg(2, 1 << 20), default=512, metavar="N",
                   help="tokens per row (default 512)")
    s.add_argument("--batch", type=_int_arg(1, 1 << 16), default=4, metavar="N",
                   help="rows of tokens (default 4)")
    s.add_argument("--labels", action="store_true",
                   help="score random labels (seeded) instead of the next input ids")
    s.add_argument("--align", action="store_true",
                   help="also find the smallest set of B's choices that makes B's logits "
                   "equal A's bit for bit, and each choice's share of the KL")
    s.add_argument("--seed", type=_int_arg(0, 2**63 - 1), default=0,
                   help="seed of the random weights, token ids and labels (default 0)")
    s.add_argument("--dtype", type=_stacks_dtype, default="bfloat16",
                   help="the model's dtype: bfloat16, float16, float32 (or bf16, fp16, "
                   "fp32; default bfloat16)")
    s.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="device (default: cuda when PyTorch sees a GPU, else cpu)")
    s.add_argument("--out", default="castlab-stacks",
                   help="folder for the results (default %(default)s); one that already "
                   "holds results is refused unless --overwrite")
    s.add_argument("--overwrite", action="store_true",
                   help="replace the results in an existing --out folder")
    s.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def _presets_ops() -> list:
    """The preset ops bounds covers: the elementwise ones (not RMSNorm's rows)."""
    return [o for o in presets.OPS if o not in presets.ROW_OPS]


def _testing_unary() -> list:
    return testing.unary_ops()


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
