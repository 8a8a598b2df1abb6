"""Where a study's chains and inputs come from: chains from anywhere (``chain``), input
specs (``Input``) and input files, and the checks of shapes and scales."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ._dtype import as_dtype, bfloat16, float8_e4m3fn, float8_e5m2, float16
from ._study_chains import CHAINS, MAX_NUMEL, Chain

#: The input generators (``Input.distribution``, ``run(inputs=...)``).
DISTRIBUTIONS = ("normal", "uniform")


_FILE_KINDS = (".npy", ".pt", ".safetensors")


@dataclasses.dataclass(frozen=True)
class Input:
    """How one input of a chain is made: generated (`shape`, `distribution`, `scale`) or
    read from `file` (``.npy``; ``.pt`` needs torch, ``.safetensors`` the safetensors
    package; `key` picks one tensor of a file that holds several) or given as `tensor`.

    `dtype` pins the input's dtype (e.g. an fp32 ``inv_rms`` in a bf16 study); None: the
    study dtype. `distribution` and `scale` default to the study's (``run(inputs=,
    scale=)``). A file's values must be floating-point; with `shape` too, the file must
    have that shape.
    """

    shape: tuple | None = None
    dtype: str | None = None
    distribution: str | None = None
    scale: float | None = None
    file: str | None = None
    key: str | None = None
    tensor: Any = None
    #: the input column's name of a file (default: its path)
    label: str | None = None

    def __post_init__(self):
        if self.shape is not None:
            object.__setattr__(self, "shape", _check_dims(self.shape, "Input.shape"))
        if self.dtype is not None:
            d = as_dtype(self.dtype)
            if not d.is_floating_point:
                raise ValueError(f"Input.dtype must be a floating-point dtype, got {d.name}")
            object.__setattr__(self, "dtype", d.name)
        if self.distribution is not None and self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"Input.distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                             f"got {self.distribution!r}")
        if self.scale is not None:
            object.__setattr__(self, "scale", check_scale(self.scale))
        if self.file is not None and self.tensor is not None:
            raise ValueError("Input: give a file or a tensor, not both")
        if (self.file is not None or self.tensor is not None) and (
                self.distribution is not None or self.scale is not None):
            raise ValueError("Input: distribution and scale apply to generated inputs, not "
                             "to a file or a tensor")
        if self.key is not None and self.file is None:
            raise ValueError("Input: key picks a tensor of a file; give file= too")

    @property
    def fixed(self) -> bool:
        """Read from a file or given: the same values for every seed."""
        return self.file is not None or self.tensor is not None

    @property
    def generated(self) -> bool:
        return not self.fixed and self.shape is not None

    def describe(self, kind: str, scale: float) -> str:
        if self.file is not None:
            d = (self.label or self.file) + (f"[{self.key}]" if self.key else "")
        elif self.tensor is not None:
            d = "tensor"
        elif self.shape is None:
            d = "default"
        else:
            d = self.distribution or kind
            sc = self.scale if self.scale is not None else 1.0
            if sc != 1.0:
                d += f"*{sc:g}"
        return d + (f":{self.dtype}" if self.dtype else "")


def _check_dims(shape: Any, what: str, example: str | None = None,
                ndim: int | None = None) -> tuple:
    """`shape` as a tuple of positive ints (at most MAX_NUMEL elements, `ndim` of them
    when given); TypeError/ValueError naming `what` (and an `example`) otherwise."""
    eg = f" (e.g. {example})" if example else ""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        n = f"{ndim} " if ndim else ""
        raise TypeError(f"{what} must be a sequence of {n}positive integers{eg}, got {shape!r}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int):
            import numpy as np
            if not isinstance(d, np.integer):
                raise TypeError(f"{what}: dimensions must be integers, got {d!r}"
                                + (f" (expected e.g. {example})" if example else ""))
        dims.append(int(d))
    if ndim is not None and len(dims) != ndim:
        raise ValueError(f"{what} must have {ndim} dimensions{eg}, got {len(dims)}: "
                         f"{tuple(dims)}")
    if any(d <= 0 for d in dims):
        raise ValueError(f"{what}: every dimension must be positive{eg}, got {tuple(dims)}")
    n = 1
    for d in dims:
        n *= d
    if n > MAX_NUMEL:
        raise ValueError(f"{what}: {tuple(dims)} has {n} elements, too large for a study "
                         f"(the limit is {MAX_NUMEL})")
    return tuple(dims)


def _import_function(spec: str, base: str | None = None) -> tuple:
    """(function, name) of ``"pkg.module:function"`` or ``"path/file.py:function"``
    (a relative path is taken from `base`, default the working folder)."""
    import importlib
    import importlib.util

    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise ValueError(f"unknown chain {spec!r}; valid: " + ", ".join(CHAINS)
                         + ", pkg.module:function or path/file.py:function")
    if where.endswith(".py") or "/" in where or os.sep in where:
        path = where if os.path.isabs(where) else os.path.join(base or os.getcwd(), where)
        if not os.path.isfile(path):
            raise ValueError(f"chain {spec!r}: no such file {where!r}")
        mname = "_castlab_chain_" + "".join(c if c.isalnum() else "_" for c in
                                            os.path.abspath(path))
        try:
            mspec = importlib.util.spec_from_file_location(mname, path)
            if mspec is None or mspec.loader is None:
                raise ImportError(f"not a Python file: {where}")
            mod = importlib.util.module_from_spec(mspec)
            sys.modules[mname] = mod
            mspec.loader.exec_module(mod)
        except (Exception, SystemExit) as e:  # noqa: BLE001  (the user's module: any error,
            # sys.exit() included: it would end castlab silently)
            sys.modules.pop(mname, None)
            raise ValueError(f"chain {spec!r}: importing {where} failed "
                             f"({type(e).__name__}: {_one_line(e)})") from None
    else:
        added = False
        cwd = base or os.getcwd()
        if cwd not in sys.path:  # like `python -m`: modules in the working folder
            sys.path.insert(0, cwd)
            added = True
        try:
            mod = importlib.import_module(where)
        except (Exception, SystemExit) as e:  # noqa: BLE001  (sys.exit() included)
            raise ValueError(f"chain {spec!r}: cannot import module {where!r} "
                             f"({type(e).__name__}: {_one_line(e)})") from None
        finally:
            if added:
                sys.path.remove(cwd)
    fn = mod
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ValueError(f"chain {spec!r}: module {where!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if isinstance(fn, Chain):
        return fn, spec
    if not callable(fn):
        raise ValueError(f"chain {spec!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn, spec


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def chain(spec: str | Callable | Chain, inputs: Sequence | None = None, name: str | None = None,
          base: str | None = None) -> Chain:
    """A ``Chain`` from a built-in name, ``"pkg.module:function"``,
    ``"path/file.py:function"`` (relative to `base`, default the working folder), a
    function (or ``cl.jit`` function) or a Chain; `inputs` (``Input`` specs, tensors)
    replace its input generator; `name` labels its rows (default: `spec`).

    Raises ValueError naming the spec when it is unknown, its module does not import or
    it is not a function.
    """
    if isinstance(spec, Chain):
        ch = spec
    elif isinstance(spec, str):
        if spec in CHAINS:
            ch = CHAINS[spec]
        else:
            fn, label = _import_function(spec, base)
            ch = fn if isinstance(fn, Chain) else Chain(label, fn, None, (), (), source=spec)
            if ch.source is None:
                ch = dataclasses.replace(ch, source=spec)
    elif callable(spec):
        ch = Chain(getattr(spec, "__name__", "fn"), spec, None, (), ())
    else:
        raise TypeError(f"a chain is a name, 'pkg.module:function', a function or a Chain, "
                        f"got {type(spec).__name__} {spec!r}")
    if inputs is not None:
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise TypeError(f"inputs of chain {ch.name!r} must be a list of Input specs or "
                            f"tensors, got {inputs!r}")
        ch = dataclasses.replace(ch, inputs=tuple(_as_input(x) for x in inputs))
    if name is not None:
        ch = dataclasses.replace(ch, name=str(name))
    return ch


def _as_input(x: Any) -> Input:
    return x if isinstance(x, Input) else Input(tensor=x)


def load_input_file(path: str, key: str | None = None, dtype: Any = None):
    """A NumPy array (floating-point) from a ``.npy``, ``.pt`` (torch) or ``.safetensors``
    file; `key` picks one tensor of a file that holds several. ValueError (one line,
    naming the file) otherwise. NumPy writes ml_dtypes' bfloat16 and float8 arrays as
    untyped 1- or 2-byte values (``|V2``): `dtype` (the input's pinned dtype) says which
    format their bits are in."""
    import numpy as np

    ext = os.path.splitext(path)[1].lower()
    if ext not in _FILE_KINDS:
        raise ValueError(f"input file {path!r}: unknown kind {ext or '(no suffix)'!r}; "
                         f"valid: {', '.join(_FILE_KINDS)}")
    if not os.path.isfile(path):
        raise ValueError(f"input file {path!r} not found")
    try:
        if ext == ".npy":
            try:
                arr = np.load(path, allow_pickle=False)
            except ValueError as e:  # ml_dtypes' float8_e5m2 saves a descr NumPy cannot read
                if "descr" not in str(e):
                    raise
                arr = _npy_raw(path)
            if key is not None:
                raise ValueError("a .npy file holds one array: drop key")
        elif ext == ".pt":
            try:
                import torch
            except ImportError:
                raise ValueError("reading .pt files needs torch (pip install torch)") from None
            obj = torch.load(path, map_location="cpu", weights_only=True)
            arr = _torch_to_numpy(_pick(obj, key, torch.Tensor))
        else:
            try:
                from safetensors import safe_open
            except ImportError:
                raise ValueError("reading .safetensors files needs the safetensors package "
                                 "(pip install safetensors)") from None
            try:
                import torch  # noqa: F401  (bf16 needs the torch framework)
                fw = "pt"
            except ImportError:
                fw = "np"
            with safe_open(path, framework=fw) as f:
                names = list(f.keys())
                k = _pick({n: None for n in names}, key, type(None), want_key=True)
                t = f.get_tensor(k)
            arr = _torch_to_numpy(t) if fw == "pt" else t
    except ValueError as e:
        raise ValueError(f"input file {path!r}: {_one_line(e)}") from None
    except Exception as e:  # noqa: BLE001  (a corrupt or foreign file)
        raise ValueError(f"input file {path!r} cannot be read ({type(e).__name__}: "
                         f"{_one_line(e)})") from None
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"input file {path!r}: expected an array, got {type(arr).__name__}")
    if arr.dtype.type is np.void and arr.dtype.fields is None and arr.dtype.itemsize in (1, 2):
        n = arr.dtype.itemsize
        fits = [d.name for d in (bfloat16, float16, float8_e4m3fn, float8_e5m2)
                if d.itemsize == n]
        want = as_dtype(dtype) if dtype is not None else None
        if want is None or want.itemsize != n or not want.is_floating_point:
            raise ValueError(
                f"input file {path!r} holds untyped {n}-byte values ({arr.dtype.str}), as "
                f"NumPy saves ml_dtypes' {' and '.join(fits)} arrays: give the input's dtype "
                f"(dtype = \"{fits[0]}\" in the config, or Input(file=..., dtype=...)) to "
                "read their bits in that format")
        arr = arr.view(want._np)
    if arr.dtype.kind != "f" and "float" not in arr.dtype.name:
        raise ValueError(f"input file {path!r} holds {arr.dtype.name} values; expected a "
                         "floating-point array")
    return arr


def _npy_raw(path: str):
    """A .npy whose 1- or 2-byte descr NumPy cannot parse (``'<f1'``, written for ml_dtypes'
    float8_e5m2), as untyped values of that size (|V1, |V2) for load_input_file."""
    import ast

    import numpy as np

    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        hlen = int.from_bytes(f.read(2 if major == 1 else 4), "little")
        header = ast.literal_eval(f.read(hlen).decode("latin1"))
        size = int(str(header["descr"])[-1])
        if size not in (1, 2) or header.get("fortran_order"):
            raise ValueError(f"descr {header['descr']!r} is not a dtype castlab can read")
        shape = tuple(header["shape"])
        data = np.frombuffer(f.read(), dtype=f"V{size}")
    n = int(np.prod(shape))
    if data.size < n:
        raise ValueError(f"holds {data.size} values, its header says {n}")
    return data[:n].reshape(shape).copy()


def _pick(obj: Any, key: str | None, kind: type, want_key: bool = False):
    if isinstance(obj, dict):
        if key is None:
            if len(obj) != 1:
                raise ValueError(f"holds {len(obj)} tensors ({', '.join(map(str, obj))}): "
                                 "pick one with key")
            key = next(iter(obj))
        if key not in obj:
            raise ValueError(f"has no tensor {key!r}; it holds {', '.join(map(str, obj))}")
        return key if want_key else obj[key]
    if key is not None:
        raise ValueError(f"holds one tensor, not a dict: drop key {key!r}")
    if not isinstance(obj, kind):
        raise ValueError(f"expected a tensor, got {type(obj).__name__}")
    return obj


def _torch_to_numpy(t):
    import torch

    if not isinstance(t, torch.Tensor):
        raise ValueError(f"expected a tensor, got {type(t).__name__}")
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
        import ml_dtypes

        nd = ml_dtypes.float8_e4m3fn if t.dtype == torch.float8_e4m3fn else ml_dtypes.float8_e5m2
        return t.view(torch.uint8).numpy().view(nd)
    return t.numpy()


#: The chains that split their last dimension in halves or pairs (its size must be even);
#: the others take any size (logprobs: a vocabulary such as GPT-2's 50257).
_HALVED = frozenset({"swiglu", "geglu", "rope", "rope_interleaved"})


def _shape_form(ch: Chain) -> str:
    return f"{ch.name}=" + "x".join(str(d) for d in ch.default_shape)


def check_shape(chain: str, shape: Any) -> tuple:
    """Validate a study shape for a built-in chain; return it as a tuple of ints.

    Raises ValueError (TypeError for a non-sequence) naming the chain, the expected
    form (e.g. ``swiglu=1024x2048``) and what is wrong.
    """
    if chain not in CHAINS:
        raise ValueError(f"unknown chain {chain!r} in shapes; valid: " + ", ".join(CHAINS))
    ch = CHAINS[chain]
    form = _shape_form(ch)
    dims = _check_dims(shape, f"shape for {chain}", form, len(ch.default_shape))
    if dims[-1] % 2 and chain in _HALVED:
        raise ValueError(f"shape for {chain}: the last dimension must be even (the chain splits "
                         f"it in halves; e.g. {form}), got {dims[-1]}")
    return dims


def check_scale(scale: Any) -> float:
    """The input scale: a positive finite number (ValueError/TypeError otherwise)."""
    import math

    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        try:
            import numpy as np
            ok = isinstance(scale, (np.integer, np.floating))
        except ImportError:  # pragma: no cover
            ok = False
        if not ok:
            raise TypeError(f"scale must be a positive finite number, got {scale!r}")
    v = float(scale)
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return v


def row_columns(grad: bool = False) -> list[str]:
    """The columns of a study's rows; with `grad`, also ``pass`` ("forward" or
    "backward") and ``output`` ("y" for the chain's result, "da", "dx", ... for a
    gradient)."""
    cols = ["chain", "dtype", "input_dtypes", "output_dtype", "shape", "input", "scale",
            "seed", "math", "policy", "rounding", "device", "numel", "correctly_rounded", "max_ulp", "mean_ulp", "rel_rmse", "rmse",
            "max_abs_err", "max_rel_err", "mismatch_vs_eager", "torch_same_vs_eager",
            "max_ulp_at_scale", "worst_index"]
    return cols[:1] + ["pass", "output"] + cols[1:] if grad else cols
