"""A/B precision studies: the same chains under several policies and math variants,
each compared with the fp64 golden reference.

>>> import castlab as cl
>>> df = cl.study.run(chains=["swiglu"], dtypes=["bfloat16"], shapes={"swiglu": (256, 512)})
>>> df[["policy", "math", "correctly_rounded", "rel_rmse"]]          # doctest: +SKIP

With ``grad=True`` each chain's backward (its vector-Jacobian product for a random
cotangent) is studied too: one row per gradient, compared with the fp64 policy's
gradient, marked by the columns ``pass`` ("forward"/"backward") and ``output``.

With ``attribute=True`` each configuration's differences are attributed to named factors
(``castlab.numerics.attribute``): the second policy against the first, and each extra
preset against the first preset; ``attribution_table(df)`` is the table of factor sets,
``df.attrs["attribution_verdicts"]`` the one-line verdicts.

Chains come from anywhere: a built-in name (``CHAINS``), ``"pkg.module:function"`` or
``"path/file.py:function"`` (any ``cl.jit``-able function), a function, or a ``Chain``.
Their inputs are generated or read from files per input (``Input``: shape, dtype,
distribution, scale, or a ``.npy``/``.pt``/``.safetensors`` file)::

    run(chains=[chain("mymodel.norms:rms_scale",
                      inputs=[Input(shape=(64, 4096)), Input(shape=(64, 1), dtype="float32")])])

One row per (chain, shape, input, scale, dtype, seed, [pass, output], math, policy,
rounding). Chains whose inputs are all fixed (files, tensors) run once, with
``seed="fixed"`` (unless a rounding mode is stochastic: the seeds seed it). ``on_cell``
receives each finished cell (one chain, shape, input, dtype and seed: all its rows) and
``done=`` takes such records back, so that an interrupted study resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from . import cuda, numerics
from . import presets as _presets  # (run() has a parameter named presets)
from ._creation import rand, randn, tensor
from ._device import as_device
from ._dtype import as_dtype, bfloat16, float8_e4m3fn, float8_e5m2, float16, float32, float64, int64
from ._index import gather
from ._jit import JitFunction, _arg_names, jit
from ._progress import bar as _bar
from ._reduce import log_softmax, rms_norm, softmax
from .ops import cat, chunk, gelu, reshape, silu, stack
from .policy import Policy, as_math, as_policy
from .sweep import CellFailure, run_cells, worker_device

__all__ = ["Chain", "CHAINS", "run", "DEFAULT", "QUICK", "row_columns", "check_shape",
           "check_scale", "MAX_NUMEL", "ATTRIBUTION_COLUMNS", "attribution_table", "Input",
           "chain", "load_input_file", "DISTRIBUTIONS", "GRID_KEYS", "cell_key", "libraries",
           "library_inputs", "LIBRARY_COLUMNS", "LIBRARY_DTYPES", "input_names", "upgrade_record",
           "RENAMED_COLUMNS"]

# The largest input a study generates (elements). Inputs are made in fp64 and the
# study keeps several results of the same size, so this is already tens of GB.
MAX_NUMEL = 1 << 31


# ---------------------------------------------------------------- built-in chains

def _swiglu(x):
    a, b = chunk(x, 2, dim=-1)
    return silu(a) * b


def _geglu(x):
    a, b = chunk(x, 2, dim=-1)
    return gelu(a) * b


def _rope(x, cos, sin):
    # Hugging Face rotate_half layout: cat(-x2, x1) with cos/sin broadcast over batch/heads.
    x1, x2 = chunk(x, 2, dim=-1)
    return x * cos + cat([-x2, x1], dim=-1) * sin


def _rope_interleaved(x, cos, sin):
    # GPT-J / Meta layout: pairs (x[2i], x[2i+1]) rotate together.
    shp = x.shape
    xp = reshape(x, *shp[:-1], shp[-1] // 2, 2)
    x0, x1 = xp[..., 0], xp[..., 1]
    out = stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return reshape(out, *shp)


def _rope_angles(seq: int, dim: int, base: float = 10000.0):
    """The angles [seq, dim/2] as Hugging Face builds them: fp32 inverse frequencies,
    fp32 outer product with the positions."""
    import numpy as np

    inv = (1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))).astype(np.float32)
    t = np.arange(seq, dtype=np.float32)
    return np.outer(t, inv).astype(np.float32)


def _rope_tables(seq: int, dim: int, base: float = 10000.0):
    """cos/sin as Hugging Face builds them: fp32 inverse frequencies, fp32 angles."""
    import numpy as np

    freqs = _rope_angles(seq, dim, base)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def _gen(kind: str, shape, seed: int, scale: float, dt, device):
    if kind == "normal":
        t = randn(*shape, seed=seed, dtype=float64, device="cpu")
    elif kind == "uniform":
        t = rand(*shape, seed=seed, dtype=float64, device="cpu")
    else:
        raise ValueError(f"unknown input generator {kind!r}; valid: normal, uniform")
    if scale != 1.0:
        t = t * float(scale)
    return t.astype(dt).to(device)


def _swiglu_inputs(shape, dt, seed, kind, scale, device):
    return (_gen(kind, shape, seed, scale, dt, device),)


def _rope_inputs(shape, dt, seed, kind, scale, device, interleaved=False):
    import numpy as np

    b, h, s, d = shape
    x = _gen(kind, shape, seed, scale, dt, device)
    cos, sin = _rope_tables(s, d)
    if not interleaved:
        cos = np.concatenate([cos, cos], axis=-1)
        sin = np.concatenate([sin, sin], axis=-1)
    return (x, tensor(cos).astype(dt).to(device), tensor(sin).astype(dt).to(device))


def _halves(grads: tuple) -> dict:
    """SwiGLU/GeGLU: the gradient of x = [a, b] as the gradients of its halves a and b."""
    (dx,) = grads
    h = dx.shape[-1] // 2
    return {"da": dx[..., :h], "db": dx[..., h:]}


@dataclasses.dataclass
class Chain:
    """A named chain of ops and how to make its inputs.

    For ``study.run(grad=True)``: `grad_argnums` are the inputs differentiated (None: the
    floating-point inputs with the most elements; smaller ones are taken to be broadcast,
    e.g. RoPE's cos/sin, whose gradients are sums over the broadcast dims), and
    `grad_parts` turns the tuple of gradients into named results (None: ``d<argument>``).
    """

    name: str
    fn: Callable
    make_inputs: Callable      # (shape, dtype, seed, kind, scale, device) -> tuple of tensors
    default_shape: tuple
    quick_shape: tuple
    description: str = ""
    grad_argnums: tuple | None = None
    grad_parts: Callable | None = None   # (tuple of gradients) -> {name: tensor}
    #: per-input specs (``Input``) that replace `make_inputs` (for a built-in chain, a
    #: spec without shape, file or tensor keeps the chain's own input, in its dtype)
    inputs: tuple | None = None
    #: where the chain came from ("swiglu", "pkg.module:function", "file.py:function")
    source: str | None = None


def _rmsnorm(x, w):
    # Hugging Face Qwen2RMSNorm: variance in fp32, cast to the input dtype, then * weight
    return rms_norm(x, x.shape[-1], w, 1e-6, cast="hf")


def _rmsnorm_inputs(shape, dt, seed, kind, scale, device):
    w = _gen("uniform", shape[-1:], seed + 1, 1.0, float64, "cpu") + 0.5
    return (_gen(kind, shape, seed, scale, dt, device), w.astype(dt).to(device))


def _softmax(x):
    return softmax(x, -1)


def _logprobs(x, t):
    # the log-probability of each row's token: log_softmax over the vocabulary, gathered
    return gather(log_softmax(x, -1), -1, t)


def _logprobs_inputs(shape, dt, seed, kind, scale, device):
    import numpy as np

    x = _gen(kind, shape, seed, scale, dt, device)
    rng = np.random.default_rng(seed + 1)
    t = tensor(rng.integers(0, shape[-1], size=tuple(shape[:-1]) + (1,)), dtype=int64)
    return (x, t.to(device))


CHAINS: dict[str, Chain] = {
    # gradients: SwiGLU/GeGLU of x, reported as its halves da and db; RoPE of x only
    # (cos/sin are broadcast over batch and heads: their gradients are reductions)
    "swiglu": Chain("swiglu", _swiglu, _swiglu_inputs, (2048, 2048), (256, 512),
                    "a, b = chunk(x, 2, -1); silu(a) * b", (0,), _halves),
    "geglu": Chain("geglu", _geglu, _swiglu_inputs, (2048, 2048), (256, 512),
                   "a, b = chunk(x, 2, -1); gelu(a) * b", (0,), _halves),
    "rope": Chain("rope", _rope, _rope_inputs, (1, 8, 1024, 128), (1, 2, 128, 64),
                  "x*cos + cat(-x2, x1)*sin (HF rotate_half), cos/sin [S, D] broadcast", (0,)),
    "rope_interleaved": Chain(
        "rope_interleaved", _rope_interleaved,
        lambda *a: _rope_inputs(*a, interleaved=True), (1, 8, 1024, 128), (1, 2, 128, 64),
        "GPT-J/Meta pairs: (x0*cos - x1*sin, x0*sin + x1*cos) interleaved", (0,)),
    # reductions (no gradients yet: the derivative of a sum is not in the op table)
    "rmsnorm": Chain("rmsnorm", _rmsnorm, _rmsnorm_inputs, (4096, 3584), (256, 896),
                     "Qwen2RMSNorm: w * (h * rsqrt(mean(h**2) + 1e-6)).to(x.dtype), h = x.float()",
                     (0,)),
    "softmax": Chain("softmax", _softmax, _swiglu_inputs, (4096, 4096), (256, 1024),
                     "softmax(x, -1): max, exp(x - max), sum, divide; one PyTorch kernel", (0,)),
    "logprobs": Chain("logprobs", _logprobs, _logprobs_inputs, (512, 32000), (64, 32000),
                      "per-token log-probabilities: gather(log_softmax(logits, -1), -1, "
                      "tokens), tokens [rows, 1] drawn with the seed", (0,)),
}

# The default study: every dtype, eager vs fused vs fp64, and SwiGLU's formula presets.
DEFAULT = {
    "chains": ["swiglu", "rope"],
    "dtypes": ["bfloat16", "float16", "float32"],
    "policies": ["eager", "fused"],
    "presets": ["torch_eager"],
    "extra_presets": {"swiglu": ["inductor", "nvfuser", "transformer_engine"]},
    "rounding": ["nearest"],
    "seeds": [0],
    "input": "normal",
    "scale": 1.0,
}
QUICK = dict(DEFAULT, dtypes=["bfloat16", "float16"])



# ---------------------------------------------------------------- chains from anywhere

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


# Cotangents are drawn like the inputs (same generator, scale 1) from this seed ^ the
# input seed, so they differ from every input stream.
COTANGENT_SEED_MIX = 0x9E3779B97F4A7C15


def _device_default() -> str:
    try:
        return "cuda" if cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001  (no CUDA support compiled or loadable)
        return "cpu"


def _policy_with_rounding(p: str | Policy, rounding: str, seed: int) -> Policy:
    pol = as_policy(p)
    if rounding == "nearest":
        return pol
    return dataclasses.replace(pol, name=pol.name, rounding=rounding, seed=seed)


#: The grid keys of a row: one row per combination (``pass`` and ``output`` only in a
#: study with gradients). ``CELL_KEYS`` make one cell, the unit a study runs and resumes:
#: every row of a cell comes from one set of inputs.
GRID_KEYS = ["chain", "shape", "input", "scale", "dtype", "seed", "pass", "output", "math",
             "policy", "rounding"]
CELL_KEYS = ["chain", "shape", "input", "scale", "dtype", "seed"]

#: The seed label of a chain whose inputs are all fixed (files, tensors): seeds change
#: nothing, so it runs once.
FIXED_SEED = "fixed"


#: Row columns renamed since: {old name: new name} (``upgrade_record`` reads the old).
RENAMED_COLUMNS = {"same_vs_eager": "torch_same_vs_eager"}


def upgrade_record(rec: Any) -> Any:
    """A cell record (``on_cell``'s) of an earlier castlab with its rows' renamed
    columns under their new names (``RENAMED_COLUMNS``: same_vs_eager is now
    torch_same_vs_eager); anything else unchanged.

    >>> cl.study.upgrade_record({"key": {}, "rows": [{"same_vs_eager": True}]})["rows"]
    [{'torch_same_vs_eager': True}]
    """
    rows = rec.get("rows") if isinstance(rec, dict) else None
    if not isinstance(rows, list) or not any(
            isinstance(r, dict) and any(k in r for k in RENAMED_COLUMNS) for r in rows):
        return rec
    return dict(rec, rows=[_upgrade_row(r) for r in rows])


def _upgrade_row(r: Any) -> Any:
    if not isinstance(r, dict) or not any(k in r for k in RENAMED_COLUMNS):
        return r
    out = {}
    for k, v in r.items():  # in place, so that the columns keep their order
        new = RENAMED_COLUMNS.get(k)
        if new is None:
            out[k] = v
        elif new not in r:  # (both: the new one wins)
            out[new] = v
    return out


def cell_key(cell: dict) -> str:
    """The key of one cell (``CELL_KEYS`` plus the settings its rows depend on, as
    ``run``'s ``on_cell`` records hold it under "key"): a JSON string."""
    return json.dumps(cell, sort_keys=True, default=str)


def _unique(items: list, key: Callable) -> list:
    seen, out = set(), []
    for x in items:
        k = key(x)
        if k not in seen:
            seen.add(k)
            out.append(x)
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # NumPy scalars
        try:
            return v.item()
        except (TypeError, ValueError):
            return str(v)
    return v


def _input_seed(seed: int, i: int) -> int:
    """Input i's stream: input 0 uses the seed itself (as the built-in chains do)."""
    return seed if i == 0 else (seed + i * 0xD1B54A32D192ED03) % 2**64


def _is_builtin(ch: Chain) -> bool:
    return ch.make_inputs is not None


def _fixed_inputs(ch: Chain) -> bool:
    return ch.inputs is not None and all(sp.fixed for sp in ch.inputs)


def _positional_count(fn: Any) -> int:
    import inspect

    f = fn.fn if isinstance(fn, JitFunction) else fn
    try:
        ps = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
               for p in ps) or 1


def input_names(ch: Chain) -> list[str]:
    """The names of a chain's inputs, in argument order: its function's positional
    parameters (``x``, ``cos``, ``sin`` for RoPE; ``x0``, ``x1``, ... when they cannot be
    read). A built-in chain's shape is the shape of its first input.

    >>> cl.study.input_names(cl.study.CHAINS["rope"])
    ['x', 'cos', 'sin']
    """
    n = len(ch.inputs) if ch.inputs is not None else _positional_count(ch.fn)
    f = ch.fn.fn if isinstance(ch.fn, JitFunction) else ch.fn
    return list(_arg_names(f, n))


def _make_args(ch: Chain, shape: tuple | None, dt, seed: int, kind: str, scale: float,
               device: str) -> tuple:
    """(args, shape column, input column) of one cell."""
    if ch.inputs is None:
        if _is_builtin(ch):
            return (ch.make_inputs(shape, dt, seed, kind, scale, device),
                    "x".join(str(s) for s in shape), kind)
        if shape is None:
            raise ValueError(
                f"chain {ch.name!r} has no inputs: give Input specs (study.chain(..., "
                f"inputs=[...]) or [[chains.inputs]] in --config), a shape for it "
                f"(shapes={{{ch.name!r}: ...}}, --shape {ch.name}=AxB) or inputs={{{ch.name!r}: "
                f"(tensors...)}}")
        specs = (Input(shape=tuple(shape)),) * _positional_count(ch.fn)
    else:
        specs = ch.inputs
    base = None
    if any(not sp.fixed and sp.shape is None for sp in specs):
        if not _is_builtin(ch):
            i = next(i for i, sp in enumerate(specs) if not sp.fixed and sp.shape is None)
            raise ValueError(f"input {i} of chain {ch.name!r}: give a shape, a file or a tensor")
        base = ch.make_inputs(shape, float64, seed, kind, scale, "cpu")
        if len(base) != len(specs):
            raise ValueError(f"chain {ch.name!r} takes {len(base)} inputs, got {len(specs)} "
                             "input specs")
    args = []
    for i, sp in enumerate(specs):
        idt = as_dtype(sp.dtype) if sp.dtype else dt
        if sp.file is not None:
            arr = load_input_file(sp.file, sp.key, sp.dtype)
            if sp.shape is not None and tuple(arr.shape) != tuple(sp.shape):
                raise ValueError(f"input {i} of chain {ch.name!r}: file {sp.file!r} has shape "
                                 f"{tuple(arr.shape)}, expected {tuple(sp.shape)}")
            t = tensor(arr)
        elif sp.tensor is not None:
            t = sp.tensor
            if sp.shape is not None and tuple(t.shape) != tuple(sp.shape):
                raise ValueError(f"input {i} of chain {ch.name!r}: the tensor has shape "
                                 f"{tuple(t.shape)}, expected {tuple(sp.shape)}")
        elif sp.shape is not None:
            t = _gen(sp.distribution or kind, sp.shape, _input_seed(seed, i),
                     sp.scale if sp.scale is not None else scale, idt, device)
        else:
            t = base[i]
        if not getattr(t, "dtype", None) or not t.dtype.is_floating_point:
            raise ValueError(f"input {i} of chain {ch.name!r} is {t.dtype}, not floating-point")
        args.append(t.astype(idt).to(device))
    if base is not None and shape is not None and all(not sp.fixed and sp.shape is None
                                                      for sp in specs):
        shape_s = "x".join(str(s) for s in shape)
    else:
        shape_s = ",".join("x".join(str(s) for s in a.shape) for a in args)
    return tuple(args), shape_s, ", ".join(sp.describe(kind, scale) for sp in specs)


def _cells_for_workers(cells: list, chains: list) -> list:
    """The cells as Dask workers get them. Chains read from path/file.py live in a module
    only this process has (``_castlab_chain_...``), which a worker cannot import to
    unpickle them (Dask then waits forever): such cells travel as cloudpickle bytes with
    those modules pickled by value."""
    mods = {getattr(ch.fn, "__module__", None) or "" for ch in chains}
    mods = [sys.modules[m] for m in mods if m.startswith("_castlab_chain_") and m in sys.modules]
    if not mods:
        return cells
    import cloudpickle

    for m in mods:
        cloudpickle.register_pickle_by_value(m)
    try:
        return [(ji, cloudpickle.dumps(spec)) for ji, spec in cells]
    finally:
        for m in mods:
            cloudpickle.unregister_pickle_by_value(m)


def _check_seed(sd: Any) -> int:
    """A seed: an integer in [0, 2**64) (not a bool, a float or a string)."""
    if isinstance(sd, bool) or not isinstance(sd, int):
        raise TypeError(f"seeds must be integers, got {sd!r}")
    if not 0 <= sd < 2**64:
        raise ValueError(f"seed {sd} is out of range: seeds are integers in [0, 2**64)")
    return sd


def _check_one_output(ch: Chain, tr: Any) -> None:
    """A chain returns one floating-point tensor (its rows compare that one result)."""
    if tr.structure != "single" or len(tr.outputs) != 1:
        raise ValueError(f"chain {ch.name!r} returns a {tr.structure} of {len(tr.outputs)} "
                         "tensors; a chain must return one tensor (study each output as a "
                         "chain of its own)")
    dt = tr.outputs[0].dtype
    if not dt.is_floating_point:
        raise ValueError(f"chain {ch.name!r} returns a {dt.name} tensor; a chain must return "
                         "one floating-point tensor")


class CellFailed(ValueError):
    """A cell of a study failed (in this process, or on a Dask worker after its retry)."""


def _check_chain_shape(ch: Chain, v: Any) -> tuple:
    if _is_builtin(ch) and ch.name in CHAINS:
        return check_shape(ch.name, v)
    return _check_dims(v, f"shape for {ch.name}")


def run(chains: Sequence[str | Callable | Chain] = ("swiglu", "rope"),
        dtypes: Sequence[Any] = ("bfloat16", "float16", "float32"),
        shapes: dict | Sequence | None = None,
        policies: Sequence[Any] = ("eager", "fused"),
        presets: Sequence[Any] = ("torch_eager",),
        rounding: Sequence[str] = ("nearest",),
        seeds: Sequence[int] = (0,),
        device: str | None = None,
        ref: Any = "fp64",
        inputs: str | dict = "normal",
        scale: float = 1.0,
        extra_presets: dict | None = None,
        quick: bool = False,
        progress: bool | Callable = False,
        on_row: Callable | None = None,
        grad: bool = False,
        attribute: bool = False,
        on_cell: Callable | None = None,
        done: Any = None,
        workers: int | None = None,
        scheduler: str | None = None):
    """Run a study and return a pandas DataFrame, one row per configuration and policy.

    Each row compares one result with the fp64 reference (correctly-rounded fraction,
    max/mean ulp error, relative RMSE, ...) and with the eager result of the same
    configuration (mismatch fraction, PyTorch's ``same()`` verdict): the eager policy
    under the first preset, rounding to nearest, run for the comparison when `policies`
    has no eager.

    Args:
        chains: built-in chain names (``castlab.study.CHAINS``), ``"pkg.module:function"``
            or ``"path/file.py:function"`` specs, functions of tensors, or ``Chain``\\ s
            (``chain(spec, inputs=[Input(...), ...])``).
        dtypes: storage dtypes of the inputs (an ``Input`` may pin its own).
        shapes: a shape per chain name (dict), or one shape for all chains. A function
            chain without input specs gets inputs of its shape, one per parameter.
        policies: policy names or ``castlab.Policy`` objects.
        presets: math presets (or ``castlab.Math``) to run every policy under.
        rounding: downcast rounding modes ("nearest", "toward_zero", "stochastic").
        seeds: input seeds (and stochastic-rounding seeds). A chain whose inputs are all
            fixed (files, tensors) runs once, labelled ``seed="fixed"``, unless a rounding
            mode is stochastic.
        device: "cpu" or "cuda" (default: the GPU when there is one).
        inputs: "normal", "uniform", or a dict {chain name: tuple of tensors or
            ``Input``\\ s} to study real activations (e.g. passed in from PyTorch;
            tensors are cast to the study dtype, ``Input(tensor=t, dtype=...)`` pins one).
        scale: multiplies generated inputs.
        extra_presets: {chain: [presets]} run under "fused" only, side by side.
        quick: small shapes.
        progress: show a progress bar (True) or call progress(i, n, label).
        on_row: called with each finished row (a dict), e.g. to stream to a CSV.
        grad: also study the chains' gradients. Each chain's backward
            (``backward_fn``, with respect to ``Chain.grad_argnums``: SwiGLU/GeGLU's x,
            reported as its halves ``da`` and ``db``; RoPE's x, not cos/sin) runs for a
            random cotangent (drawn like the inputs, seed ``seed ^ COTANGENT_SEED_MIX``)
            under every preset, policy and rounding mode (not `extra_presets`), and each
            gradient is compared with the fp64 policy's gradient as the forward results
            are with the fp64 forward. Rows gain the columns ``pass`` ("forward" or
            "backward") and ``output`` ("y", or the gradient's name).
        attribute: also attribute the forward results' differing bits to named factors
            (``castlab.numerics.attribute``) for each chain, dtype and seed: the second
            policy against the first (under the first preset and rounding mode), and each
            of the chain's `extra_presets` against the first preset (under "fused"). The
            returned DataFrame's rows are the same; its ``attrs["attribution"]`` holds one
            dict per factor set of each pair, with the keys ``ATTRIBUTION_COLUMNS``
            (chain, dtype, seed, A, B, factors, elements, toward, away, tie, equal, nan,
            suspicious; ``attribution_table(df)`` makes it a DataFrame), and
            ``attrs["attribution_verdicts"]`` one dict per pair (chain, dtype, seed, A, B,
            differ, unexplained, verdict). Plain lists, so that the attrs survive
            ``pd.concat`` of several studies and serialize to JSON.
        on_cell: called with each finished cell, a JSON-serialisable dict: "key" (the
            cell's ``CELL_KEYS`` and the settings its rows depend on), "rows",
            "attribution", "verdicts".
        done: such records of an earlier, interrupted run of this study: cells whose key
            is among them are not run again; their rows are returned as recorded (and not
            passed to `on_row` or `on_cell`).
        workers: run the cells on a Dask ``distributed`` LocalCluster of this many worker
            processes (on "cuda": one GPU per worker, ``cuda:k`` for worker k); results
            stream back to `on_row`/`on_cell` as cells finish, a failed cell is retried
            once, and the rows equal a serial run's, bit for bit.

    A cell that fails (its chain raises; on workers: after its retry) ends the study with
    ``CellFailed`` (a ValueError naming the cell and the error), in this process at once,
    on workers once the other cells have finished; the finished cells have been passed
    to `on_row`/`on_cell` (give their records as `done` to run the rest).
        scheduler: the address of an existing Dask cluster ("tcp://host:8786") to send
            the cells to instead (its workers need castlab and the chains' functions).

    >>> df = run(chains=["swiglu"], dtypes=["bfloat16"], quick=True)   # doctest: +SKIP
    """
    import pandas as pd

    scale = check_scale(scale)
    if seeds is None or isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise TypeError(f"seeds must be a sequence of integers, got {seeds!r}")
    for sd in seeds:
        _check_seed(sd)
    for what, v in (("quick", quick), ("grad", grad), ("attribute", attribute)):
        if not isinstance(v, bool):
            raise TypeError(f"{what} must be True or False, got {v!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 0):
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    if scheduler is not None and not isinstance(scheduler, str):
        raise TypeError(f"scheduler must be a Dask scheduler address (a string such as "
                        f"'tcp://host:8786'), got {scheduler!r}")
    if device is not None:
        if not isinstance(device, str):
            raise TypeError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        as_device(device)  # ValueError naming the device for 'tpu', 'cudax', ...
    device = device or _device_default()
    extra_presets = extra_presets or {}
    if isinstance(inputs, str):
        if inputs not in DISTRIBUTIONS:
            raise ValueError(f"unknown input generator {inputs!r}; valid: "
                             + ", ".join(DISTRIBUTIONS))
        kind = inputs
    elif isinstance(inputs, dict):
        kind = "normal"
    else:
        raise TypeError(f"inputs must be 'normal', 'uniform' or a dict {{chain: tensors}}, "
                        f"got {type(inputs).__name__}")
    chain_objs = []
    for c in chains:
        ch = chain(c)
        if isinstance(inputs, dict):
            if ch.name in inputs:
                ch = chain(ch, inputs=list(inputs[ch.name]))
            elif ch.inputs is None:
                raise ValueError(f"inputs has no tensors for chain {ch.name!r}")
        if any(o.name == ch.name and o is not ch and o != ch for o in chain_objs):
            raise ValueError(f"two different chains are named {ch.name!r}: name one")
        chain_objs.append(ch)
    chain_objs = _unique(chain_objs, lambda ch: ch.name)
    by_name = {ch.name: ch for ch in chain_objs}
    if isinstance(shapes, dict):
        checked = {}
        for k, v in shapes.items():
            if k in by_name:
                checked[k] = _check_chain_shape(by_name[k], v)
            else:
                checked[k] = check_shape(k, v)  # a built-in not studied, or unknown: raises
        shapes = checked
    elif shapes is not None:
        for ch in chain_objs:
            _check_chain_shape(ch, shapes)
    dts = _unique([as_dtype(d) for d in dtypes], lambda d: d.name)
    for d in dts:
        if not d.is_floating_point:
            raise ValueError(f"dtype {d} is not a floating-point dtype")
    pols = _unique([as_policy(p) for p in policies], lambda p: p.describe())
    maths = _unique([as_math(m) for m in presets], lambda m: m)
    rounding = _unique(list(rounding), lambda r: r)
    for r in rounding:
        Policy(rounding=r)  # validates
    seeds = _unique(list(seeds), lambda s: s)
    ref_policy = as_policy(ref)
    settings = {"device": device, "policies": [p.describe() for p in pols],
                "presets": [m.name for m in maths], "rounding": list(rounding),
                "ref": ref_policy.describe(), "grad": bool(grad), "attribute": bool(attribute)}
    done_map = {}
    for rec in done or ():
        rec = upgrade_record(rec)
        k = rec["key"]
        done_map[k if isinstance(k, str) else cell_key(k)] = rec

    def shape_of(ch: Chain):
        if isinstance(shapes, dict):
            if ch.name in shapes:
                return tuple(shapes[ch.name])
        elif shapes is not None:
            return tuple(shapes)
        if _is_builtin(ch):
            return ch.quick_shape if quick else ch.default_shape
        return None

    fns = {ch.name: _jit_of(ch.fn) for ch in chain_objs}
    jobs = []
    for ch in chain_objs:
        fixed = _fixed_inputs(ch) and "stochastic" not in rounding
        for dt in dts:
            for seed in ([FIXED_SEED] if fixed and seeds else seeds):
                jobs.append((ch, dt, seed))
    # chains that are not built in: make the first cell's inputs and trace them now, so
    # that a bad file or an untraceable function fails before the study starts
    first_args: dict = {}
    promoted_said: set = set()  # (chain, study dtype) whose promotion was warned about
    for ch in chain_objs:
        if _is_builtin(ch) and ch.inputs is None:
            continue
        job = next((j for j in jobs if j[0] is ch), None)
        if job is None:
            continue
        sd = seeds[0] if job[2] == FIXED_SEED else job[2]
        made = _make_args(ch, shape_of(ch), job[1], sd, kind, scale, device)
        try:
            tr = fns[ch.name].graph(*made[0])
        except (Exception, SystemExit) as e:  # noqa: BLE001  (whatever the user's function raises)
            raise ValueError(f"chain {ch.name!r} cannot be traced by castlab.jit "
                             f"({type(e).__name__}: {_one_line(e)})") from None
        _check_one_output(ch, tr)
        # (the other dtypes are not traced here: a trace calls the user's function, and
        # the study's cells would then see what that call changed; their rows say it)
        _warn_other_output_dtype(ch.name, job[1].name, tr.outputs[0].dtype.name, made[0])
        promoted_said.add((ch.name, job[1].name))
        first_args[(ch.name, job[1].name, job[2])] = made
    rows: list = []
    att_rows: list = []
    verdicts: list = []
    total = len(jobs)
    cells: list = []   # (job position, cell spec) of the cells still to run
    records: dict = {}
    for ji, (ch, dt, seed_label) in enumerate(jobs):
        seed = seeds[0] if seed_label == FIXED_SEED else seed_label
        spec = {"chain": ch, "dtype": dt, "seed_label": seed_label, "seed": seed,
                "shape": shape_of(ch), "kind": kind, "scale": scale, "device": device,
                "maths": maths, "pols": pols, "rounding": rounding, "ref": ref_policy,
                "extras": [as_math(m) for m in extra_presets.get(ch.name, [])],
                "grad": bool(grad), "attribute": bool(attribute), "settings": settings}
        made = first_args.pop((ch.name, dt.name, seed_label), None)
        if made is None and workers is None and scheduler is None:
            made = _make_args(ch, spec["shape"], dt, seed, kind, scale, device)
        if made is not None:
            common = _cell_common(ch, dt, made, scale, seed_label)
            kstr = cell_key(_cell_key_dict(spec, common))
            if kstr in done_map:
                records[ji] = done_map[kstr]
                continue
            if workers is None and scheduler is None:
                spec["made"] = made  # (tensors stay in this process)
        cells.append((ji, spec))

    finished = [0]
    failures: list = []

    def collect(pos_spec, rec) -> None:
        ji, spec = pos_spec
        finished[0] += 1
        if isinstance(rec, CellFailure):
            failures.append(f"cell {spec['chain'].name} {spec['dtype'].name} "
                            f"seed={spec['seed_label']} failed: {rec.error}")
            return
        if spec.get("made") is None and cell_key(rec["key"]) in done_map:
            rec = done_map[cell_key(rec["key"])]
            records[ji] = rec
            return
        records[ji] = rec
        for row in rec["rows"]:
            said = (row.get("chain"), row.get("dtype"))
            if row.get("output_dtype") not in (None, row.get("dtype")) and \
                    said not in promoted_said:
                promoted_said.add(said)
                _warn_other_output_dtype(said[0], said[1], row["output_dtype"], too=True)
            if on_row is not None:
                on_row(row)
        if on_cell is not None:
            on_cell(rec)
        if progress is True:
            _bar(finished[0] + len(jobs) - len(cells), total, f"{spec['chain'].name} "
                 f"{spec['dtype'].name} seed={spec['seed_label']}")
        elif callable(progress):
            progress(finished[0] + len(jobs) - len(cells), total, spec["chain"].name)

    if workers is None and scheduler is None:
        for pos_spec in cells:
            try:
                rec = _run_cell(pos_spec[1])
            except (Exception, SystemExit) as e:  # noqa: BLE001  (the chain's code: reported
                # as a worker's failure is, and the study stops)
                rec = CellFailure(pos_spec, f"{type(e).__name__}: {_one_line(e)}")
            collect(pos_spec, rec)
            if failures:
                break
    else:
        devs = None
        if device.startswith("cuda") and scheduler is None:
            devs = [f"cuda:{i}" for i in range(cuda.device_count())]
        sent = _cells_for_workers(cells, chain_objs)
        by_pos = dict(cells)
        out = run_cells(sent, _run_cell_at, workers=workers, scheduler=scheduler,
                        devices=devs, on_result=lambda c, r: collect((c[0], by_pos[c[0]]), r))
        if out.interrupted:
            raise KeyboardInterrupt
    if failures:
        more = f" (and {len(failures) - 1} more cell(s))" if len(failures) > 1 else ""
        raise CellFailed(f"study: {failures[0]}{more}; the finished cells are kept "
                         "(castlab study --resume, or run(done=records), runs the rest)")
    for ji in sorted(records):
        rec = records[ji]
        rows += rec["rows"]
        att_rows += rec.get("attribution", [])
        verdicts += rec.get("verdicts", [])
    if progress is True:
        _bar(total, total, "done")
    df = pd.DataFrame(rows, columns=row_columns(grad))
    if attribute:
        df.attrs["attribution"] = att_rows
        df.attrs["attribution_verdicts"] = verdicts
    return df


# ---------------------------------------------------------------- kernel-library presets

#: The columns of :func:`libraries`: one row per (library, op, dtype).
LIBRARY_COLUMNS = ["library", "op", "dtype", "identical_to_eager", "mismatch_vs_eager",
                   "correctly_rounded", "max_ulp_error", "max_ulp_error_at_scale", "elements",
                   "device", "status"]
#: The dtypes the libraries' kernels are measured in.
LIBRARY_DTYPES = ("bfloat16", "float16")
# Qwen2: head dim 128, rope_theta 1e6; SwiGLU rows of 1024, sequences of 1024 positions
_QWEN2_DIM, _QWEN2_THETA, _ROW, _SEQ = 128, 1e6, 1024, 1024


def library_inputs(size: int, dtype: Any, seed: int = 0, device: str = "cpu") -> dict:
    """The Qwen2-shaped inputs of :func:`libraries`, by op family and argument name (the
    names in ``OpPreset.inputs``): ``"swiglu"``: gate ``a`` (normal, times 3), up ``b``,
    cotangent ``dc``, each [size/1024, 1024]; ``"rope"`` and ``"rope_interleaved"``: ``x``
    and ``dy`` [1, H, 1024, 128] (normal; fewer positions when `size` < 128K), the cos/sin
    cache ``c``/``s`` [S, 128] in `dtype` (Hugging Face's ``cat(freqs, freqs)`` of the
    fp32 angles, theta 1e6; fp64 cos/sin rounded to fp32, then to `dtype`) and the fp32
    angles ``freqs`` (``cat(f, f)``, or ``repeat_interleave(f, 2)`` for the interleaved
    layout). Seeds `seed` + 1 ... + 5.

    >>> ins = cl.study.library_inputs(4096, "bfloat16")
    >>> ins["rope"]["x"].shape, ins["rope_interleaved"]["freqs"].shape
    ((1, 1, 32, 128), (32, 128))
    """
    import numpy as np

    if isinstance(size, bool) or not isinstance(size, int) or not _ROW <= size <= MAX_NUMEL:
        raise ValueError(f"size must be an integer in [{_ROW}, {MAX_NUMEL}] (elements per "
                         f"input), got {size!r}")
    dt = as_dtype(dtype)

    def normal(shape, k, scale=1.0):
        t = randn(*shape, seed=(seed + k) % 2**64, dtype=float64, device="cpu")
        return (t * scale if scale != 1.0 else t).astype(dt).to(device)

    rows = (size // _ROW, _ROW)
    seq = min(_SEQ, size // _QWEN2_DIM)
    xs = (1, size // (seq * _QWEN2_DIM), seq, _QWEN2_DIM)
    f = _rope_angles(seq, _QWEN2_DIM, _QWEN2_THETA).astype(np.float64)
    emb = np.concatenate([f, f], axis=-1)

    def cache(fn):  # fp64 cos/sin rounded to fp32 (as HF's fp32 cache), then to dtype
        return tensor(fn(emb)).astype(float32).astype(dt).to(device)

    x, dy = normal(xs, 4), normal(xs, 5)
    c, s = cache(np.cos), cache(np.sin)
    return {
        "swiglu": {"a": normal(rows, 1, 3.0), "b": normal(rows, 2), "dc": normal(rows, 3)},
        "rope": {"x": x, "dy": dy, "c": c, "s": s,
                 "freqs": tensor(emb).astype(float32).to(device)},
        "rope_interleaved": {"x": x, "dy": dy, "c": c, "s": s,
                             "freqs": tensor(np.repeat(f, 2, axis=-1)).astype(float32)
                             .to(device)},
    }


def _one_tensor(out: Any):
    """A result as one tensor: the outputs of a multi-output op (``(da, db)``) flattened
    and concatenated."""
    if not isinstance(out, (tuple, list)):
        return out
    return cat([reshape(t, t.numel()) for t in out], dim=0)


def libraries(names: Sequence[str] | None = None, ops: Sequence[str] | None = None,
              dtypes: Sequence[str] = LIBRARY_DTYPES, device: str | None = None,
              size: int = 1 << 20, seed: int = 0, progress: bool = False,
              on_row: Callable[[dict], None] | None = None) -> Any:
    """Each kernel-library preset (``cl.library``) against Hugging Face eager (the
    ``torch_eager`` library) and against the library's own formula in fp64
    (``OpPreset.reference``), on the same Qwen2-shaped inputs (:func:`library_inputs`):
    a DataFrame with one row per (library, op, dtype), columns ``LIBRARY_COLUMNS``.

    ``identical_to_eager``: every bit equals eager's; ``mismatch_vs_eager``: the fraction
    of elements that differ; ``correctly_rounded``: the fraction equal to the fp64 value
    rounded once; ``max_ulp_error`` (and ``_at_scale``, in ulps of the largest magnitude)
    from :func:`castlab.numerics.compare`, which runs on the device. A backward op's
    outputs (``da``, ``db``) count together. ``status``: whether the library's kernel has
    been run against castlab's preset (``Library.status``). `names` default to every
    library, `ops` to every op each one covers (``castlab.presets.OPS``); an op a
    library lacks is skipped. RoPE from angles (``apex``, ``transformer_engine``) reads
    ``freqs``, and its fp64 reference uses the exact cos/sin of the fp32 angles.
    `progress`: a progress bar on stderr, one step per (dtype, op, library) case;
    `on_row`: called with each row as its case finishes (the CLI's cells.jsonl).

    >>> df = cl.study.libraries(["torch_eager", "flash_attn"], ops=["rope"], size=4096,
    ...                         device="cpu")
    >>> df[["library", "dtype", "identical_to_eager"]].values.tolist()
    [['torch_eager', 'bfloat16', True], ['torch_eager', 'float16', True], ['flash_attn', 'bfloat16', False], ['flash_attn', 'float16', False]]
    """
    import pandas as pd

    def listed(v: Any, default: Sequence[str]) -> list:
        v = default if v is None else [v] if isinstance(v, str) else v
        return list(dict.fromkeys(v))

    _check_seed(seed)
    names, ops = listed(names, _presets.libraries()), listed(ops, _presets.OPS)
    dtypes = listed(dtypes, LIBRARY_DTYPES)
    libs = [_presets.library(n) for n in names]     # ValueError listing the valid names
    for op in ops:
        if op not in _presets.OPS:
            raise ValueError(f"unknown op {op!r}; kernel-library presets cover: "
                             + ", ".join(_presets.OPS))
    for d in dtypes:
        if d not in LIBRARY_DTYPES:
            raise ValueError(f"unknown dtype {d!r} for the library presets; valid: "
                             + ", ".join(LIBRARY_DTYPES))
    device = str(as_device(device or _device_default()))
    eager = _presets.library("torch_eager")
    rows = []
    total = sum(op in lib.presets for _ in dtypes for op in ops for lib in libs)
    for d in dtypes:
        ins = library_inputs(size, d, seed, device)
        for op in ops:
            pool = ins[op.removesuffix("_backward")]
            base = _one_tensor(eager[op](*(pool[a] for a in eager[op].inputs)))
            for lib in libs:
                if op not in lib.presets:
                    continue
                if progress:
                    _bar(len(rows), total, f"{lib.name} {op} {d}")
                p = lib[op]
                args = [pool[a] for a in p.inputs]
                got = base if lib is eager else _one_tensor(p(*args))
                r = numerics.compare(base, got, ref=_one_tensor(p.reference(*args)),
                                     names=["eager", "library"]).to_dict()["library"]
                rows.append({"library": lib.name, "op": op, "dtype": d,
                             "identical_to_eager": r["mismatches"] == 0,
                             "mismatch_vs_eager": r["mismatch_fraction"],
                             "correctly_rounded": r["correctly_rounded"],
                             "max_ulp_error": r["max_ulp_error"],
                             "max_ulp_error_at_scale": r["max_ulp_error_at_scale"],
                             "elements": got.numel(), "device": device,
                             "status": lib.status(op, d)})
                if on_row is not None:
                    on_row(dict(rows[-1]))
    if progress and total:
        _bar(total, total, "done")
    order = {(n, op, d): i for i, (n, op, d) in enumerate(
        (n, op, d) for n in names for op in _presets.OPS for d in dtypes)}
    rows.sort(key=lambda r: order[(r["library"], r["op"], r["dtype"])])
    df = pd.DataFrame(rows, columns=LIBRARY_COLUMNS)
    df.attrs.update(size=size, seed=seed)
    return df


_JITS: dict = {}  # a chain's function -> its castlab.jit (traces and plans kept per process)


def _jit_of(fn: Callable) -> JitFunction:
    if isinstance(fn, JitFunction):
        return fn
    j = _JITS.get(fn)
    if j is None:
        j = _JITS[fn] = jit(fn)
        while len(_JITS) > 64:  # the functions of recent studies, not every one ever run
            _JITS.pop(next(iter(_JITS)))
    return j


def _cell_common(ch: Chain, dt, made: tuple, scale: float, seed_label) -> dict:
    _, shape_s, input_s = made
    return {"chain": ch.name, "dtype": dt.name, "shape": shape_s, "input": input_s,
            "scale": scale, "seed": seed_label}


def _cell_key_dict(spec: dict, common: dict) -> dict:
    maths = spec["maths"]
    return dict(common, **spec["settings"],
                extra_presets=[m.name for m in spec["extras"] if m not in maths])


def _run_cell_at(pos_spec: tuple) -> dict:
    """A Dask worker's cell: on the worker's own device (castlab.sweep.worker_device)."""
    spec = pos_spec[1]
    if isinstance(spec, bytes):  # (a chain from path/file.py, pickled by value)
        import cloudpickle

        spec = cloudpickle.loads(spec)
    return _run_cell(spec, worker_device(spec["device"]))


def _run_cell(spec: dict, on_device: str | None = None) -> dict:
    """One cell of a study (a chain, dtype and seed under every policy, preset and
    rounding mode): its record {"key", "rows", "attribution", "verdicts"}. The same
    function runs in this process and on Dask workers, so both give the same rows."""
    ch, dt, seed = spec["chain"], spec["dtype"], spec["seed"]
    maths, pols, rounding = spec["maths"], spec["pols"], spec["rounding"]
    device = on_device or spec["device"]
    made = spec.get("made")
    if made is None or on_device not in (None, spec["device"]):
        made = _make_args(ch, spec["shape"], dt, seed, spec["kind"], spec["scale"], device)
    args = made[0]
    common = _cell_common(ch, dt, made, spec["scale"], spec["seed_label"])
    key = _cell_key_dict(spec, common)
    # what was computed: the inputs' dtypes (a pinned or file input keeps its own) and,
    # per row, the output's (its metrics are in the output's format)
    common["input_dtypes"] = ",".join(a.dtype.name for a in args)
    fn = _jit_of(ch.fn)
    reference = fn.run(*args, policy=spec["ref"])
    runs = []  # (math, policy, rounding, result)
    for m in maths:
        for p in pols:
            for r in rounding:
                pol = _policy_with_rounding(p, r, seed)
                runs.append((m, pol, r, fn.run(*args, policy=pol, math=m)))
    extras = []
    for m in spec["extras"]:
        if any(x[0] == m for x in runs) or m in extras:
            continue
        extras.append(m)
        runs.append((m, Policy.fused(), "nearest", fn.run(*args, policy="fused", math=m)))
    base = _baseline(runs, maths[0] if maths else None,
                     lambda m, fn=fn, args=args: fn.run(*args, policy="eager", math=m))
    if spec["grad"]:
        common.update({"pass": "forward", "output": "y"})
    # rows name the study's device ("cuda"), not the worker's GPU ("cuda:1")
    new_rows = _compare_rows(runs, reference, common, spec["device"], base)
    if spec["grad"]:
        new_rows += _grad_rows(ch, fn, args, reference, dt, seed, spec["kind"],
                               spec["device"], maths, pols, rounding, spec["ref"], common)
    new_att, new_verdicts = [], []
    if spec["attribute"]:
        for a, b in _attribution_pairs(pols, maths, rounding[0], seed, extras):
            r, v = _attribution(fn, args, a, b, common)
            new_att += r
            new_verdicts.append(v)
    return {"key": key, "rows": [_jsonable(r) for r in new_rows],
            "attribution": _jsonable(new_att), "verdicts": _jsonable(new_verdicts)}


def _warn_other_output_dtype(chain: str, dt: str, out: str, args: tuple | None = None,
                             too: bool = False) -> None:
    """Say when a chain's result is not in the study dtype (an input pinned to float32, or
    a float32 file, promotes it): its rows then carry the output's dtype and their ulp and
    rounding figures are in that format. Before the study runs for its first dtype
    (naming the inputs that differ), and for each other dtype when its first cell comes
    in (`too`)."""
    if out == dt:
        return
    pinned = [f"input {k} is {a.dtype.name}" for k, a in enumerate(args or ())
              if a.dtype.name != dt]
    warnings.warn(
        f"chain {chain!r}: in the {dt} study{' too' if too else ''} its result is {out}"
        + (f" ({', '.join(pinned)})" if pinned else "")
        + f": its rows say output_dtype={out}, and their ulp and correctly-rounded "
        f"figures are in {out}", UserWarning, stacklevel=3)


def _baseline(runs: list, math0, run_eager: Callable):
    """The run `mismatch_vs_eager` compares with: eager, nearest, under the first preset;
    run here (and not reported) when the study has none."""
    for x in runs:
        if x[1].name == "eager" and x[2] == "nearest" and x[0] == math0:
            return x
    if math0 is None:
        return None
    return (math0, Policy.eager(), "nearest", run_eager(math0))



#: The columns of ``run(attribute=True).attrs["attribution"]``: one row per factor set of
#: one attributed pair (A, B) of one chain, dtype and seed; the verdict columns count the
#: differing elements where B is nearer the fp64 value than A ("toward"), farther
#: ("away"), A and B straddle a midpoint ("tie"), equally far ("equal"), or a NaN.
ATTRIBUTION_COLUMNS = ["chain", "dtype", "seed", "A", "B", "factors", "elements", "toward",
                       "away", "tie", "equal", "nan", "suspicious"]

def attribution_table(df):
    """The attribution of a ``run(..., attribute=True)`` study as a DataFrame: one row per
    factor set of each attributed pair, columns ``ATTRIBUTION_COLUMNS``."""
    import pandas as pd

    if "attribution" not in df.attrs:
        raise ValueError("this study has no attribution: run it with attribute=True")
    return pd.DataFrame(df.attrs["attribution"], columns=ATTRIBUTION_COLUMNS)


# Attribution.summary()'s columns under their names in the study's table
_SUMMARY_COLUMNS = {"toward fp64": "toward", "away from fp64": "away", "tie at midpoint": "tie",
                    "equally far": "equal", "NaN": "nan"}


def _attribution_pairs(pols: list, maths: list, rounding: str, seed: int,
                       extra: list) -> list:
    """The (A, B) configurations a study attributes: the second policy against the first
    (first preset and rounding mode), then each extra preset against the first preset
    (fused, nearest, as the study runs them)."""
    pairs = []
    if len(pols) >= 2:
        pa, pb = (_policy_with_rounding(p, rounding, seed) for p in pols[:2])
        pairs.append(((pa, maths[0]), (pb, maths[0])))
    for m in extra:
        pairs.append(((Policy.fused(), maths[0]), (Policy.fused(), m)))
    return pairs


def _attribution(fn: JitFunction, args: tuple, a: tuple, b: tuple, common: dict) -> tuple:
    """The summary rows and the verdict of one attributed pair."""
    key = {"chain": common["chain"], "dtype": common["dtype"], "seed": common["seed"],
           "A": f"{a[0].describe()}/{a[1].name}", "B": f"{b[0].describe()}/{b[1].name}"}
    try:
        att = numerics.attribute(fn, args, a=a, b=b)
    except ValueError as e:  # nothing to attribute (no factor differs, or the dtypes do)
        return [], dict(key, differ=0, unexplained=0, verdict=f"not attributed: {e}")
    table = att.summary().rename(columns=_SUMMARY_COLUMNS)
    rows = [dict(key, **{c: r[c] for c in ATTRIBUTION_COLUMNS[5:]})
            for r in table.to_dict("records")]
    return rows, dict(key, differ=len(att.indices), unexplained=att.unexplained,
                      verdict=att.verdict)


def _compare_rows(runs: list, reference, common: dict, device: str, base=None) -> list:
    """One row per run (math, policy, rounding, result), in the order of `runs`, compared
    with `reference` and with `base` (a run of `runs`, or one run only for the
    comparison; default the first run)."""
    if base is None:
        base = runs[0]
    hidden = not any(x is base for x in runs)
    ordered = [base] + [x for x in runs if x is not base]
    names = [f"{x[0].name}/{x[1].describe()}" for x in ordered]
    if hidden:
        names[0] = "(eager baseline)"
    cmp = numerics.compare(*[x[3] for x in ordered], ref=reference, names=names)
    metrics = cmp.to_dict()
    name_of = {id(x): n for x, n in zip(ordered, names)}
    rows = []
    for x in runs:
        m, pol, r, res = x
        row = dict(common, math=m.name, policy=pol.name, rounding=r, device=device,
                   output_dtype=res.dtype.name)
        row.update(_metrics_of(metrics, name_of[id(x)], res.numel()))
        rows.append(row)
    return rows


def _grad_argnums(ch: Chain, args: tuple) -> tuple:
    if ch.grad_argnums is not None:
        return tuple(ch.grad_argnums)
    fl = [i for i, a in enumerate(args) if a.dtype.is_floating_point]
    most = max((args[i].numel() for i in fl), default=0)
    return tuple(i for i in fl if args[i].numel() == most)


def _grad_parts(ch: Chain, fn: JitFunction, argnums: tuple, grads: Any) -> dict:
    grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
    if ch.grad_parts is not None:
        return ch.grad_parts(grads)
    names = _arg_names(fn.fn, max(argnums) + 1)
    return {f"d{names[i]}": g for i, g in zip(argnums, grads)}


def _grad_rows(ch: Chain, fn: JitFunction, args: tuple, out, dt, seed: int, kind: str,
               device: str, maths: list, pols: list, rounding: Sequence[str], ref_policy,
               common: dict) -> list:
    """The backward rows of one configuration: every gradient of the chain under each
    math x policy x rounding, compared with the fp64 policy's gradient."""
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    cseed = seed ^ COTANGENT_SEED_MIX
    gen = kind if kind in ("normal", "uniform") else "normal"
    cots = tuple(_gen(gen, tuple(o.shape), (cseed + k) % 2**64, 1.0, dt, device)
                 for k, o in enumerate(outs))
    argnums = _grad_argnums(ch, args)
    bwd = fn.backward_fn(nargs=len(args), argnums=argnums)
    ref = _grad_parts(ch, fn, argnums, bwd.run(*args, *cots, policy=ref_policy))
    runs = []
    for m in maths:
        for p in pols:
            for r in rounding:
                pol = _policy_with_rounding(p, r, seed)
                runs.append((m, pol, r, _grad_parts(ch, fn, argnums,
                                                    bwd.run(*args, *cots, policy=pol, math=m))))
    base = _baseline(runs, maths[0] if maths else None,
                     lambda m: _grad_parts(ch, fn, argnums,
                                           bwd.run(*args, *cots, policy="eager", math=m)))
    rows = []
    for name, gref in ref.items():
        c = dict(common, output=name)
        c["pass"] = "backward"
        part = [(m, pol, r, parts[name]) for m, pol, r, parts in runs]
        bi = next((i for i, x in enumerate(runs) if x is base), None)
        pbase = part[bi] if bi is not None else (base[0], base[1], base[2], base[3][name])
        rows += _compare_rows(part, gref, c, device, pbase)
    return rows


def _metrics_of(d: dict, name: str, numel: int) -> dict:
    """Pick one result's study metrics out of ``Comparison.to_dict()``."""
    r = d[name]
    same = r.get("same")
    return {
        "numel": numel,
        "correctly_rounded": r["correctly_rounded"],
        "max_ulp": r["max_ulp_error"],
        "mean_ulp": r["mean_ulp_error"],
        "rel_rmse": r["rel_rmse"],
        "rmse": r["rmse"],
        "max_abs_err": r["max_abs_error"],
        "max_rel_err": r["max_rel_error"],
        "mismatch_vs_eager": r["mismatch_fraction"],
        # PyTorch's tolerance-based accuracy check (torch._dynamo.utils.same()) against
        # eager; mismatch_vs_eager is the bitwise comparison
        "torch_same_vs_eager": True if same is None else bool(same),  # the baseline passes itself
        # under cancellation max_ulp (ulps of the tiny exact value) explodes; this stays
        # meaningful: the worst error in ulps of the largest exact magnitude
        "max_ulp_at_scale": r["max_ulp_error_at_scale"],
        "worst_index": "" if r.get("worst_index") is None else str(tuple(r["worst_index"])),
    }


def __dir__() -> list:
    """The public API only (not the helpers this module imports)."""
    return sorted(__all__)
