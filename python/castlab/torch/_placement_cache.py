"""Inductor placements on disk: a placement (castlab.torch._inductor.InductorPlacement) is
read by compiling the captured graph with torch.compile, which takes most of a stack
comparison's time on a large model (a 24-layer Qwen2: about 10 s). The placement depends
only on what the key names (PyTorch's version, the Inductor settings that change its
program, the captured graph's code, the inputs' devices, shapes, strides and dtypes, and
the GPU model, whose autotuning picks the tiles, or ATen's CPU build), so a later process
reads it from disk.

The folder: ``$CASTLAB_PLACEMENT_DIR`` (set but empty: no disk cache), else the kernel
cache's folder with ``-inductor`` appended (``~/.cache/castlab/kernels-inductor``; none
when ``CASTLAB_CACHE_DIR`` is set but empty). Created 0700; an entry is used only from a
folder the user owns, and an unreadable entry is read again from the compiler.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from typing import Any

import torch

from .. import _C

__all__ = ["placement_key", "placement_dir", "load", "store"]

_VERSION = 4  # bump when InductorPlacement's fields change


# Inductor settings that change what its compiled program stores, fuses or launches: a
# placement read under one is not another's (the process's settings apply to castlab's
# compile of the captured graph as to the user's).
_CONFIG_FLAGS = ("emulate_precision_casts", "deterministic", "max_autotune",
                 "max_autotune_pointwise", "coordinate_descent_tuning", "online_softmax",
                 "split_reductions", "use_fast_math", "triton.multi_kernel",
                 "triton.persistent_reductions", "triton.cooperative_reductions")


def _config_key(iconfig: Any) -> tuple:
    """The values of _CONFIG_FLAGS in `iconfig` (None where this version has no such
    setting)."""
    out = []
    for name in _CONFIG_FLAGS:
        v: Any = iconfig
        for part in name.split("."):
            v = getattr(v, part, None)
        out.append(v if isinstance(v, (bool, int, float, str, type(None))) else repr(v))
    return tuple(out)


def placement_key(code: str, places: list) -> tuple:
    """The key of a captured graph's placement (its code) for inputs like `places`: the
    PyTorch version, the Inductor settings of _CONFIG_FLAGS, and each input's device,
    shape, strides and dtype (the weights' values play no part)."""
    from torch._inductor import config as iconfig

    sig = tuple((str(t.device), tuple(t.shape), t.stride(), str(t.dtype))
                if isinstance(t, torch.Tensor) else repr(t) for t in places)
    return (torch.__version__, _config_key(iconfig), code, sig)


def placement_dir() -> str | None:
    """The folder of cached placements, or None when the disk cache is off."""
    d = os.environ.get("CASTLAB_PLACEMENT_DIR")
    if d is not None:
        return d or None
    k = _C._kernel_cache_dir()
    return k.rstrip("/") + "-inductor" if k else None


def _devices(sig: tuple) -> tuple:
    """The GPU models (their autotuning picks tiles) and the CPU build ATen runs (its
    vector width picks the C++ kernels' lanes) of the devices in `sig`."""
    names = set()
    for s in sig:
        if isinstance(s, tuple) and str(s[0]).startswith("cuda"):
            names.add(torch.cuda.get_device_name(torch.device(s[0])))
        elif isinstance(s, tuple):
            names.add("cpu " + torch.backends.cpu.get_cpu_capability())
    return tuple(sorted(names))


def _path(key: tuple) -> str | None:
    d = placement_dir()
    if d is None:
        return None
    h = hashlib.sha256(repr((_VERSION, key, _devices(key[-1]))).encode()).hexdigest()[:32]
    return os.path.join(d, h + ".pkl")


def _owned(d: str) -> bool:
    try:
        st = os.stat(d)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not (st.st_mode & 0o022)


def load(key: tuple) -> Any:
    """The placement stored under `key` (the in-process cache's key), or None."""
    p = _path(key)
    if p is None or not _owned(os.path.dirname(p)):
        return None
    try:
        with open(p, "rb") as f:
            stored_key, pl = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, TypeError,
            ValueError, ImportError, IndexError):
        return None
    return pl if stored_key == repr(key) else None


def store(key: tuple, pl: Any) -> None:
    """Write `pl` under `key` (atomically; a folder that cannot be written is skipped)."""
    p = _path(key)
    if p is None:
        return
    d = os.path.dirname(p)
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        if not _owned(d):
            return
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump((repr(key), pl), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, p)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
