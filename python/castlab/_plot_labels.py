"""What castlab.plot's charts say about a run: the GPU's name, the device, the shapes, and
the settings that vary between rows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import cuda as _cuda


def _find_gpu_name(obj: Any, index: int, depth: int = 0) -> str | None:
    """A GPU name in a run record (summary.json, run.json, ``castlab.cuda.info()``): a
    "gpu_name" or "gpu" string, or the name of device `index` in a "devices" list."""
    if depth > 4:
        return None
    if isinstance(obj, dict):
        for k in ("gpu_name", "gpu"):
            if isinstance(obj.get(k), str) and obj[k]:
                return obj[k]
            if isinstance(obj.get(k), dict) and isinstance(obj[k].get("name"), str):
                return obj[k]["name"]
        devs = obj.get("devices") or obj.get("gpus")
        if isinstance(devs, list):
            named = [d for d in devs if isinstance(d, dict) and isinstance(d.get("name"), str)]
            for dv in named:
                if dv.get("index") == index:
                    return dv["name"]
            if named:
                return named[min(index, len(named) - 1)]["name"]
        for v in obj.values():
            if isinstance(v, (dict, list)):
                got = _find_gpu_name(v, index, depth + 1)
                if got:
                    return got
    elif isinstance(obj, list):
        for v in obj:
            got = _find_gpu_name(v, index, depth + 1)
            if got:
                return got
    return None


def _cuda_index(device: str) -> int:
    tail = device.partition(":")[2]
    return int(tail) if tail.isdigit() else 0


def _gpu_for(df, device: str | None, gpu_name: str | None, run: Any,
             ask_cuda: bool = False) -> str | None:
    """The name of the GPU a CUDA `device` is: `gpu_name`, else the rows' gpu_name
    column, ``df.attrs`` or the run record `run` (a loaded run.json or summary.json), and
    with `ask_cuda` ``castlab.cuda.info()`` (this process's GPUs: for plots written right
    after the run); None when unknown or `device` is not a GPU."""
    if gpu_name is not None or not device or "cuda" not in device:
        return gpu_name
    if "gpu_name" in df.columns:
        names = list(dict.fromkeys(str(v) for v in df["gpu_name"].dropna()))
        if names:
            return ", ".join(names)
    idx = _cuda_index(device)
    name = _find_gpu_name(dict(df.attrs), idx) or (
        _find_gpu_name(run, idx) if run is not None else None)
    if name is None and ask_cuda:
        try:
            if _cuda.is_available():
                name = _find_gpu_name(_cuda.info(), idx)
        except Exception:  # noqa: BLE001  (a name in a title is not worth failing for)
            name = None
    return name


def _device_of(df, device: str | None) -> str | None:
    """`device`, else the rows' device column ("cpu", "cuda:0", ...)."""
    if device is None and "device" in df.columns:
        devs = list(dict.fromkeys(str(v) for v in df["device"].dropna()))
        device = ", ".join(devs) if devs else None
    return device


def _where(df, device: str | None, gpu_name: str | None, run: Any) -> str:
    """"device cpu" or "device cuda:0 (NVIDIA H200)" (see :func:`_gpu_for`)."""
    device = _device_of(df, device)
    if device is None:
        return "device not recorded"
    name = _gpu_for(df, device, gpu_name, run)
    return f"device {device}" + (f" ({name})" if name else "")


def _shapes_text(df) -> str:
    """The shapes of a study's chains: "swiglu 256x512, rope 1x2x128x64"."""
    if "shape" not in df.columns:
        return ""
    parts = []
    for chain, g in df.groupby("chain", sort=False):
        shapes = list(dict.fromkeys(str(s) for s in g["shape"]))
        parts.append(f"{chain} " + (" / ".join(shapes) if len(shapes) <= 3
                                    else f"{len(shapes)} shapes (see the groups)"))
    return "shape " + ", ".join(parts) if parts else ""


def _varying_keys(df, keys=("shape", "input", "scale")) -> list:
    """The cell keys (of `keys`) that take more than one value for one chain."""
    return [k for k in keys if k in df.columns
            and (df.groupby("chain", sort=False)[k].agg(lambda c: c.astype(str).nunique())
                 > 1).any()]


def _stats(values: list) -> tuple:
    """(mean, min, max) of the finite values (a bar and its whisker), or (inf or nan,)*3
    when none is finite; and how many were not finite."""
    a = np.asarray(values, dtype=np.float64)
    fin = a[np.isfinite(a)]
    bad = int(a.size - fin.size)
    if fin.size == 0:
        v = math.inf if np.isinf(a).any() else math.nan
        return v, v, v, bad
    m = float(fin[0]) if fin.size == 1 else float(fin.mean())
    return m, float(fin.min()), float(fin.max()), bad
