"""castlab on NVIDIA GPUs: devices, memory, streams and copies.

The CUDA driver and NVRTC are loaded at run time, so ``import castlab`` works on machines
without a GPU; :func:`is_available` says whether one was found.

>>> import castlab as cl
>>> if cl.cuda.is_available():
...     x = cl.ones(4, device="cuda")
...     cl.cuda.synchronize()
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from . import _C
from ._device import as_device

__all__ = ["is_available", "device_count", "synchronize", "memory_stats", "empty_cache", "info",
           "to_device", "current_stream_ptr", "producer_sync", "consumer_stream",
           "kernel_cache_stats", "compile_log", "unavailable_reason", "wait_on_stream", "compile_threads",
           "precompile_kernels", "builtin_kernels", "MAX_COMPILE_THREADS"]


def _nvrtc_candidates() -> list[str]:
    """Directories that may hold libnvrtc: the nvidia-cuda-nvrtc wheels (CUDA 12 and 13
    layouts), found without importing them."""
    out: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        for sub in ("cuda_nvrtc/lib", "cu13/lib", "cu12/lib", "cuda_nvrtc/lib64"):
            d = os.path.join(root, sub)
            if os.path.isdir(d):
                out.append(d)
    return out


_C._cuda_init(_nvrtc_candidates())


def is_available() -> bool:
    """True when the CUDA driver loads and at least one GPU is present (never raises)."""
    try:
        return bool(_C._cuda_is_available())
    except Exception:  # noqa: BLE001
        return False


def unavailable_reason() -> str:
    """Why CUDA is not available (empty when it is)."""
    if is_available():
        return ""
    try:
        info_d = dict(_C._cuda_info())
    except Exception as e:  # noqa: BLE001
        return str(e)
    for k in ("error", "reason", "driver_error"):
        if info_d.get(k):
            return str(info_d[k])
    return "no CUDA driver or GPU found"


def device_count() -> int:
    """Number of CUDA devices (0 without a driver or GPU)."""
    try:
        return int(_C._cuda_device_count())
    except Exception:  # noqa: BLE001
        return 0


def info() -> dict:
    """What castlab found: GPUs (name, compute capability, memory), driver and NVRTC
    versions, or why CUDA is unavailable."""
    return dict(_C._cuda_info())


def synchronize(device: int | str | None = None) -> None:
    """Wait for castlab's queued GPU work (one device, or all); raises the first
    asynchronous error, naming the last kernel launched. RuntimeError without a usable
    GPU (as ``torch.cuda.synchronize``)."""
    idx = -1 if device is None else _index(device)
    _require_cuda("synchronize")
    _C._cuda_synchronize(idx)


def memory_stats(device: int | str = 0) -> dict:
    """The caching allocator's counters: allocated/reserved/peak bytes, allocations,
    cache hits, out-of-memory events. RuntimeError without a usable GPU."""
    idx = _index(device)
    _require_cuda("memory_stats")
    return dict(_C._cuda_memory_stats(idx))


def _require_cuda(what: str) -> None:
    if not is_available():
        raise RuntimeError(f"castlab.cuda.{what}: CUDA is not available (no usable GPU: "
                           f"{unavailable_reason()})")


def empty_cache() -> None:
    """Return the allocator's cached (unused) blocks to the driver."""
    _C._cuda_empty_cache()


def kernel_cache_stats() -> dict:
    """Kernel cache counters: ``memory_hits`` (kernels found loaded), ``module_hits`` (a
    kernel whose source was already compiled, or was being compiled by another thread,
    which then waited for it), ``disk_hits``, ``compiles`` (NVRTC runs, failed ones included), ``disk_rejects`` and
    ``compile_seconds`` (summed over the threads that compiled, not wall time)."""
    return dict(_C._cuda_kernel_cache_stats())


def compile_log() -> list[dict]:
    """This process's NVRTC runs, oldest first (the most recent 4,096): each kernel's
    ``name``, ``source_chars``, ``start`` and ``end`` (seconds since the process's first
    compile) and ``ok``. What made a cold start slow: the longest runs, and how many
    overlapped.

    >>> import castlab.cuda as cc
    >>> log = cc.compile_log()          # [] until a kernel is compiled
    >>> sorted(log, key=lambda r: r["start"] - r["end"])[:3]  # doctest: +SKIP
    """
    return [dict(r) for r in _C._cuda_compile_log()]


def _compile_profile(log: list[dict], top: int = 8) -> dict:
    """A summary of compile-log records: how many, the wall span from the first start to
    the last end, the seconds summed over them, their mean overlap (summed / span) and the
    `top` longest (name, seconds, source characters)."""
    if not log:
        return {"runs": 0}
    span = max(r["end"] for r in log) - min(r["start"] for r in log)
    summed = sum(r["end"] - r["start"] for r in log)
    slow = sorted(log, key=lambda r: r["start"] - r["end"])[:top]
    return {"runs": len(log), "wall_s": round(span, 3), "summed_s": round(summed, 3),
            "overlap": round(summed / span, 2) if span > 0 else None,
            "failed": sum(not r["ok"] for r in log),
            "longest": [{"name": r["name"], "seconds": round(r["end"] - r["start"], 3),
                         "source_chars": r["source_chars"]} for r in slow]}


#: The most threads :func:`compile_threads` gives by default (NVRTC compiles of one
#: study rarely keep more busy; CASTLAB_COMPILE_THREADS may set more).
MAX_COMPILE_THREADS = 32


def compile_threads(threads: int | None = None) -> int:
    """How many threads compile kernels at once (the study's warm-up, ``precompile``):
    `threads` when given, else the environment variable ``CASTLAB_COMPILE_THREADS``, else
    the CPUs this process may run on (``os.sched_getaffinity``), at most
    ``MAX_COMPILE_THREADS``. 1 compiles one kernel at a time, as each first run does.

    >>> cl.cuda.compile_threads(4)
    4
    """
    if threads is None:
        env = os.environ.get("CASTLAB_COMPILE_THREADS", "").strip()
        if env:
            try:
                threads = int(env)
            except ValueError:
                raise ValueError("CASTLAB_COMPILE_THREADS must be a positive integer, got "
                                 f"{env!r}") from None
            if threads < 1:
                raise ValueError(f"CASTLAB_COMPILE_THREADS must be >= 1, got {threads}")
            return threads
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # (not Linux)
            cpus = os.cpu_count() or 1
        return max(1, min(cpus, MAX_COMPILE_THREADS))
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {threads!r}")
    return threads


def kernel_group(source: str) -> str:
    """The group (:func:`builtin_kernels`) of a fixed-source kernel: the C++ file its
    first line names ("compare", "reduce", "loss", "index"); "" for another source."""
    m = re.search(r"\(ops/cuda/(\w+)\.cpp\)", source.split("\n", 1)[0])
    return m.group(1) if m else ""


def builtin_kernels(*groups: str) -> list:
    """castlab's kernels of fixed source as (name, source) pairs: every one, or those of
    `groups` (the C++ file each comes from): ``"compare"`` (castlab.numerics.compare's),
    ``"reduce"`` (the generic reduction, one kernel per order and dtype, named
    ``cl_reduce_f32_o<order>``), ``"loss"``, ``"index"``.

    >>> sorted({n.split("_")[1] for n, _ in cl.cuda.builtin_kernels("compare")})
    ['compare', 'near', 'tie', 'ulp']
    """
    ks = [(str(n), str(s)) for n, s in _C._cuda_builtin_kernels()]
    if not groups:
        return ks
    of = {n: kernel_group(s) for n, s in ks}
    for g in groups:
        if g not in set(of.values()):
            raise ValueError(f"unknown kernel group {g!r}; groups: "
                             + ", ".join(sorted(set(of.values()) - {""})))
    return [(n, s) for n, s in ks if of[n] in groups]


def precompile_kernels(kernels: Any = None, device: int | str = 0,
                       threads: int | None = None) -> None:
    """Compile kernels for `device` now, `threads` at a time (:func:`compile_threads`),
    into the kernel cache (memory and disk), as their first use would: `kernels` is a
    list of (name, source) pairs (:func:`builtin_kernels` gives castlab's by group), by
    default every kernel of fixed source (the comparison's, the reductions', the index and
    loss kernels). The first failure is raised once every kernel has been tried.
    RuntimeError without a usable GPU."""
    idx = _index(device)
    _require_cuda("precompile_kernels")
    ks = builtin_kernels() if kernels is None else [(str(n), str(s)) for n, s in kernels]
    _C._cuda_precompile(idx, ks, compile_threads(threads))


def _concurrently(calls: list, threads: int | None = None, errors: str = "raise") -> list:
    """Call each of `calls` (no arguments) on `threads` threads (compile_threads()): their
    results in the order of `calls`. castlab's C++ (runs, NVRTC compiles) releases the
    GIL, so first runs compile their kernels at the same time. `errors`: "raise" raises
    the first failure (in the order of `calls`) once all have finished; "ignore" gives
    None for a call that failed."""
    n = compile_threads(threads)
    if n <= 1 or len(calls) <= 1:
        out = []
        for c in calls:
            try:
                out.append(c())
            except Exception:  # noqa: BLE001  (kept for the caller, as below)
                if errors == "raise":
                    raise
                out.append(None)
        return out
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(n, len(calls)),
                            thread_name_prefix="castlab-compile") as pool:
        futs = [pool.submit(c) for c in calls]
        out = []
        for f in futs:
            e = f.exception()
            if e is not None and errors == "raise":
                for g in futs:
                    g.cancel()
                raise e
            out.append(None if e is not None else f.result())
    return out


def current_stream_ptr(device: int | str = 0) -> int:
    """castlab's stream on ``device`` (a ``CUstream`` as an int)."""
    return int(_C._cuda_stream_ptr(_index(device)))


def _index(device: Any) -> int:
    d = as_device(device)
    if not d.is_cuda:
        raise ValueError(f"not a CUDA device: {device!r}")
    return d.index


def to_device(t, device: Any):
    """``t`` on ``device`` ("cpu", "cuda", "cuda:N" or a device object): the same tensor if
    it is there already, else a contiguous copy with the same dtype and bits."""
    device = str(as_device(device))
    if t._device_str == device:
        return t
    dst = _C.empty(list(t.shape), t._dtype_name, device)
    if t.numel() == 0:  # nothing to copy (an empty view's strides need not be contiguous)
        return dst
    src = t if t.is_contiguous() else t.clone()  # on the source's device (Tensor.clone)
    _C._cuda_copy(src, dst)
    return dst


# ---- DLPack stream hooks (used by castlab._dlpack) --------------------------------------

def producer_sync(tensor, consumer_stream: Any) -> None:
    """``Tensor.__dlpack__(stream=...)`` for a CUDA tensor: make the consumer's stream wait
    for castlab's pending work on the tensor's device, through an event (no host sync).

    ``None``: the consumer uses the legacy default stream (1); ``-1``: no synchronisation;
    ``0``: invalid (ValueError); any other int: a ``cudaStream_t`` (1 legacy default,
    2 per-thread default)."""
    if consumer_stream is None:
        consumer_stream = 1
    if isinstance(consumer_stream, bool) or not isinstance(consumer_stream, int):
        raise TypeError(f"stream must be None or an int, got {type(consumer_stream).__name__}")
    if consumer_stream == -1:
        return
    if consumer_stream == 0:
        raise ValueError("stream=0 is ambiguous for CUDA and not allowed by the array API; "
                         "use 1 (legacy default stream) or 2 (per-thread default stream)")
    _C._cuda_stream_wait_for(consumer_stream, int(tensor._device_index))


def consumer_stream(device_index: int) -> int:
    """The stream castlab passes to a CUDA producer's ``__dlpack__(stream=...)``: castlab's
    own stream on that device, so the producer orders its pending work before castlab's."""
    return current_stream_ptr(int(device_index))


def wait_on_stream(producer_stream: int, device_index: int = 0) -> None:
    """Make castlab's stream wait for the work queued so far on ``producer_stream``."""
    _C._cuda_wait_on_stream(int(producer_stream), int(device_index))


def __dir__() -> list:
    """The public API only (not the helpers this module imports)."""
    return sorted(__all__)
