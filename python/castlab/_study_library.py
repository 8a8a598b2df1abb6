"""The kernel-library presets measured against Hugging Face eager and their fp64 formula
on Qwen2-shaped inputs (``castlab study --libraries``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from . import cuda, numerics
from . import presets as _presets
from ._creation import randn, tensor
from ._device import as_device
from ._dtype import as_dtype, float32, float64
from ._jit import warm
from ._progress import bar as _bar
from ._study_cells import _check_seed, _device_default
from ._study_chains import MAX_NUMEL, _rope_angles
from .ops import cat, reshape

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
    cotangent ``dc``, each [size/1024, 1024]; ``"rms_norm"`` (and ``"fused_add_rms_norm"``,
    ``"rms_norm_gemma"``): ``x`` and ``residual`` [size/1024, 1024] and a ``weight`` [1024]
    of 1 + 0.1 * normal (Gemma's: 0.1 * normal); ``"rope"`` and ``"rope_interleaved"``: ``x``
    and ``dy`` [1, H, 1024, 128] (normal; fewer positions when `size` < 128K), the cos/sin
    cache ``c``/``s`` [S, 128] in `dtype` (Hugging Face's ``cat(freqs, freqs)`` of the
    fp32 angles, theta 1e6; fp64 cos/sin rounded to fp32, then to `dtype`) and the fp32
    angles ``freqs`` (``cat(f, f)``, or ``repeat_interleave(f, 2)`` for the interleaved
    layout). Seeds `seed` + 1 ... + 8.

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
    # RMSNorm: rows of 1024 (hidden), a weight near 1 (Gemma's: near 0, the offset from 1)
    w = normal((_ROW,), 7, 0.1)
    norm = {"x": normal(rows, 6), "residual": normal(rows, 8),
            "weight": (w.astype(float64) + 1.0).astype(dt)}
    glu = {"a": normal(rows, 1, 3.0), "b": normal(rows, 2), "dc": normal(rows, 3)}
    return {
        "rms_norm": norm, "fused_add_rms_norm": norm, "rms_norm_gemma": {**norm, "weight": w},
        "swiglu": glu, "geglu": glu,
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


def _warm_runs_of(inputs: dict, ops: list, libs: list) -> list:
    """The (jit function, args, policy, math) the matrix runs: each library's op and its
    fp64 reference on each dtype's inputs (castlab._jit.warm)."""
    runs = []
    for ins in inputs.values():
        for op in ops:
            pool = ins[op.removesuffix("_backward")]
            for lib in libs:
                if op in lib.presets:
                    runs += lib[op]._runs([pool[a] for a in lib[op].inputs])
    return runs


def _warm_libraries(inputs: dict, ops: list, libs: list, device: str) -> None:
    """Compile the kernels the matrix will run, `cuda.compile_threads()` at a time, before
    it runs them one by one (castlab._jit.warm: nothing it computes is kept; a failure is
    left for the matrix to report). With CASTLAB_COMPILE_THREADS=1, nothing is done."""
    threads = cuda.compile_threads()
    if threads > 1:   # (with numerics.compare's kernels, and the fixed-source kernels the
        # plans use: the generic reduction only where one reduces, since its NVRTC compile
        # alone is longer than all the rest together)
        warm(_warm_runs_of(inputs, ops, libs), threads, device=device)


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
    inputs = {d: library_inputs(size, d, seed, device) for d in dtypes}
    timing: dict = {}
    if device.startswith("cuda"):
        t0 = time.perf_counter()
        n_log = len(cuda.compile_log())
        _warm_libraries(inputs, ops, [eager] + [b for b in libs if b is not eager], device)
        timing = {"warm_s": round(time.perf_counter() - t0, 3),
                  "kernel_cache_after_warm": cuda.kernel_cache_stats(),
                  "warm_compiles": cuda._compile_profile(cuda.compile_log()[n_log:])}
    for d in dtypes:
        ins = inputs[d]
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
    if timing:   # on a GPU: the parallel compile's wall time and the cache after it
        timing["kernel_cache_end"] = cuda.kernel_cache_stats()
        df.attrs["timing"] = timing
    return df
