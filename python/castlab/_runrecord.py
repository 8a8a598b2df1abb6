"""The run record of a computing ``castlab`` command: the first line it prints (the device
it runs on and, when it fell back to the CPU, why) and ``run.json`` (versions, hardware,
the command line, the resolved configuration, the seeds, castlab's git hash, the date).
One builder for every command (``castlab study``, its ``--libraries`` mode, ``castlab
exhaustive``).

castlab never imports torch itself: a loaded torch changes what its ``torch_cpu`` math
follows (``Math.cpu_isa="auto"``). So torch's version, CUDA build and CPU dispatch level
(``torch.backends.cpu.get_cpu_capability()``) are asked of a separate Python process,
started in the background (:func:`probe_torch`), unless torch is already loaded.

>>> from castlab import _runrecord
>>> _runrecord.first_line("study", "cpu", torch={"version": None}).startswith(
...     "castlab study on cpu (")
True
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import threading
from typing import Any

from . import _C, cuda
from .policy import as_math

__all__ = ["record", "first_line", "write", "probe_torch", "torch_info", "cpu_model",
           "git_revision", "device_info", "KEYS"]

#: The keys of a run record (``run.json``), in order.
KEYS = ("castlab_version", "castlab_git_hash", "castlab_git_dirty", "command", "argv",
        "date_utc", "python", "numpy", "platform", "torch", "torch_cuda",
        "torch_cpu_capability", "castlab_torch_cpu_isa", "cuda_driver", "nvrtc", "device",
        "device_fallback", "gpu", "gpu_sm_count", "gpu_compute_capability", "cpu",
        "cpu_threads", "seeds", "config")

_TORCH_CODE = (
    "import json, torch\n"
    "c = getattr(getattr(torch.backends, 'cpu', None), 'get_cpu_capability', None)\n"
    "print(json.dumps({'version': str(torch.__version__), 'cpu_capability': c() if c else None,"
    " 'cuda': torch.version.cuda}))\n")
_lock = threading.Lock()
_torch: dict = {}          # the probe's result, once known
_thread: list = []         # the probe's thread, while it runs


def _ask_loaded_torch(torch: Any) -> dict:
    cap = getattr(getattr(getattr(torch, "backends", None), "cpu", None),
                  "get_cpu_capability", None)
    try:
        c = cap() if cap is not None else None
    except Exception:  # noqa: BLE001  (a broken torch: the record says nothing)
        c = None
    return {"version": str(getattr(torch, "__version__", "")) or None, "cpu_capability": c,
            "cuda": getattr(getattr(torch, "version", None), "cuda", None)}


def _torch_dist_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except Exception:  # noqa: BLE001
        return None


def _probe() -> dict:
    """torch's facts, asked of a child Python process (never raises)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return _ask_loaded_torch(torch)
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return {"version": None, "cpu_capability": None, "cuda": None}
    out = {"version": _torch_dist_version(), "cpu_capability": None, "cuda": None}
    if not sys.executable:
        return dict(out, error="no Python executable to ask torch in")
    try:
        p = subprocess.run([sys.executable, "-c", _TORCH_CODE], capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
        lines = p.stdout.strip().splitlines()
        if p.returncode == 0 and lines:
            got = json.loads(lines[-1])
            return {"version": got.get("version") or out["version"],
                    "cpu_capability": got.get("cpu_capability"), "cuda": got.get("cuda")}
        err = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        return dict(out, error=f"import torch failed: {err}")
    except Exception as e:  # noqa: BLE001  (a timeout, no such executable, bad JSON)
        return dict(out, error=f"asking torch failed: {type(e).__name__}: {e}")


def _run_probe() -> None:
    res = _probe()
    with _lock:
        _torch.update(res)


def probe_torch() -> None:
    """Start asking torch (in the background; once per process)."""
    with _lock:
        if _torch or _thread:
            return
        t = threading.Thread(target=_run_probe, name="castlab-torch-probe", daemon=True)
        _thread.append(t)
    t.start()


def torch_info() -> dict:
    """{"version", "cpu_capability", "cuda"} of the torch this Python would import (None
    values without torch); waits for :func:`probe_torch`'s answer."""
    probe_torch()
    with _lock:
        t = _thread[0] if _thread else None
    if t is not None:
        t.join(150)
    with _lock:
        return dict(_torch) if _torch else {"version": _torch_dist_version(),
                                            "cpu_capability": None, "cuda": None,
                                            "error": "asking torch did not finish"}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else the platform's processor name)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    name = " ".join(line.split(":", 1)[1].split())
                    if name:
                        return name
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def git_revision() -> tuple[str | None, bool | None]:
    """(commit hash, dirty) of the checkout castlab runs from (python/castlab/ inside a
    git work tree); (None, None) for an installed package or without git. Never raises."""
    pkg = os.path.dirname(os.path.realpath(__file__))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}

    def git(*args: str) -> str | None:
        try:
            p = subprocess.run(["git", "-C", pkg, *args], capture_output=True, text=True,
                               timeout=10, env=env, stdin=subprocess.DEVNULL)
        except Exception:  # noqa: BLE001  (no git, a timeout)
            return None
        return p.stdout.strip() if p.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if not top or os.path.realpath(os.path.join(top, "python", "castlab")) != pkg:
        return None, None  # not castlab's own checkout (e.g. site-packages inside a repo)
    head = git("rev-parse", "HEAD")
    if not head:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return head, (None if status is None else bool(status))


def _cuda_index(device: str) -> int:
    _, _, idx = device.partition(":")
    return int(idx) if idx.isdigit() else 0


def device_info(device: str) -> dict:
    """The GPU (name, SMs, compute capability) of a "cuda[:i]" device; Nones otherwise."""
    out = {"gpu": None, "gpu_sm_count": None, "gpu_compute_capability": None}
    if not device.startswith("cuda"):
        return out
    try:
        devs = cuda.info().get("devices") or []
        d = devs[_cuda_index(device)]
    except Exception:  # noqa: BLE001
        return out
    cc = d.get("compute_capability")
    return {"gpu": d.get("name"), "gpu_sm_count": d.get("multiprocessors"),
            "gpu_compute_capability": ".".join(str(c) for c in cc) if cc else None}


def _modelled_isa() -> str:
    """The build of PyTorch's CPU kernels castlab's torch_cpu math follows now."""
    try:
        return as_math("torch_eager").torch_cpu_isa()
    except Exception:  # noqa: BLE001
        return "unknown"


def _device_name(device: str) -> str:
    return "cuda:0" if device == "cuda" else device


def first_line(command: str, device: str, fallback: str | None = None,
               torch: dict | None = None, workers: int | None = None,
               scheduler: str | None = None) -> str:
    """``castlab <command> on <device> (<what it is>)[: <why it fell back>]``."""
    if scheduler:
        where = f"the Dask cluster at {scheduler} ({device} on its workers)"
    elif device.startswith("cuda"):
        g = device_info(device if workers is None else "cuda:0")
        sms = f", {g['gpu_sm_count']} SMs" if g["gpu_sm_count"] else ""
        name = _device_name(device) if workers is None else "cuda"
        where = f"{name} ({g['gpu'] or 'unknown GPU'}{sms})"
    else:
        t = torch_info() if torch is None else torch
        isa = _modelled_isa()
        if t.get("cpu_capability"):
            what = f"torch ISA {str(t['cpu_capability']).lower()}"
            if str(t["cpu_capability"]).lower() != isa:
                what += f"; castlab models torch's {isa} kernels"
        else:
            what = ("no torch" if not t.get("version") else "torch ISA unknown") + \
                f"; castlab models torch's {isa} kernels"
        where = f"{_device_name(device)} ({cpu_model()}, {what})"
    if workers is not None and not scheduler:
        where += f" with {workers} Dask worker{'s' if workers != 1 else ''}"
    return f"castlab {command} on {where}" + (f": {fallback}" if fallback else "")


def fallback_reason(requested: str | None, device: str, short: bool = False) -> str | None:
    """Why a command runs on the CPU although it was not asked to (None otherwise);
    `short`: the first clause of CUDA's reason only (for the first line)."""
    if requested is not None or device.startswith("cuda"):
        return None
    try:
        why = cuda.unavailable_reason()
    except Exception as e:  # noqa: BLE001
        why = str(e)
    if short and why:
        why = why.split(" (")[0].split(": ")[0]
    return "no usable CUDA GPU" + (f" ({why})" if why else "")


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "item"):  # NumPy scalars
        try:
            return v.item()
        except (TypeError, ValueError):
            pass
    return str(v)


def record(command: str, device: str, config: dict, seeds: Any,
           fallback: str | None = None, argv: list | None = None) -> dict:
    """The run record (``KEYS``): JSON-serialisable, never raising for a missing tool."""
    import numpy as np

    t = torch_info()
    head, dirty = git_revision()
    cinfo: dict = {}
    try:
        cinfo = cuda.info() if cuda.is_available() else {}
    except Exception:  # noqa: BLE001
        cinfo = {}
    rec = {
        "castlab_version": _C.__version__,
        "castlab_git_hash": head,
        "castlab_git_dirty": dirty,
        "command": command,
        "argv": list(sys.argv if argv is None else argv),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "torch": t.get("version"),
        "torch_cuda": t.get("cuda"),
        "torch_cpu_capability": t.get("cpu_capability"),
        "castlab_torch_cpu_isa": _modelled_isa(),
        "cuda_driver": cinfo.get("driver_version"),
        "nvrtc": cinfo.get("nvrtc_version"),
        "device": _device_name(device),
        "device_fallback": fallback,
        **device_info(device),
        "cpu": cpu_model(),
        "cpu_threads": int(_C.num_threads()),
        "seeds": _jsonable(list(seeds) if isinstance(seeds, (list, tuple)) else [seeds]),
        "config": _jsonable(config),
    }
    if t.get("error"):
        rec["torch_error"] = t["error"]
    return rec


def write(out: str, rec: dict, **extra: Any) -> str:
    """Write `rec` (with `extra` keys) to ``out/run.json``; its path."""
    path = os.path.join(out, "run.json")
    with open(path, "w") as f:
        json.dump(dict(rec, **_jsonable(extra)), f, indent=2)
        f.write("\n")
    return path
