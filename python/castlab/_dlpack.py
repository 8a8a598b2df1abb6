"""DLPack interchange: ``castlab.from_dlpack`` and ``Tensor.__dlpack__``/``__dlpack_device__``.

Both directions are zero-copy. The C++ side (``python/src/bind_dlpack.cpp``) builds and
consumes the capsules; this module implements the array-API protocol around it
(versions, devices, streams, copies).

Exported capsules point ``data`` at the first element of the view, with ``byte_offset = 0``
and strides always filled (in elements). Versioned capsules are DLPack 1.1 and carry the
READ_ONLY flag for read-only tensors; a read-only tensor cannot be exported through the
legacy (unversioned) capsule, which has no way to say so.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import numpy as np

from . import _C, cuda
from ._device import as_device

__all__ = ["from_dlpack", "tensor_dlpack", "tensor_dlpack_device"]

# DLPack device types (DLDeviceType) castlab deals with.
_kDLCPU = 1
_kDLCUDA = 2
_kDLCUDAHost = 3

# castlab's DeviceType values (core/tensor.h).
_CL_CPU = 0
_CL_CUDA = 1

_MAX_VERSION = (1, 1)

_CAPSULE_TYPE = type(_C.to_dlpack(_C.empty([0], "float32", "cpu"), True))


# ---- hooks for the CUDA backend --------------------------------------------------------


def _consumer_stream(device: tuple[int, int]) -> Any:
    """The ``stream`` castlab passes to a producer on ``device`` (a DLPack device pair):
    None on the CPU, as the array API requires; for CUDA producers castlab's own stream
    (as an int), so the producer orders its pending work before castlab's."""
    if device[0] != _kDLCUDA:
        return None
    return cuda.consumer_stream(device[1])


def _producer_sync(tensor: Any, stream: Any) -> None:
    """Make work queued on ``tensor`` visible to the consumer's ``stream`` (CUDA only):
    an event recorded on castlab's stream that the consumer's stream waits on (no host
    synchronisation). ``stream=-1`` means the consumer asks for no synchronisation."""
    cuda.producer_sync(tensor, stream)


# ---- helpers ---------------------------------------------------------------------------


def _device_pair(t: Any) -> tuple[int, int]:
    if t._device_type == _CL_CPU:
        return (_kDLCPU, 0)
    return (_kDLCUDA, int(t._device_index))


def _normalize_device(device: Any) -> tuple[int, int]:
    """A DLPack (type, id) pair from a device given as a pair, a string or a device object."""
    if isinstance(device, tuple) and len(device) == 2:
        return (int(device[0]), int(device[1]))
    if hasattr(device, "__dlpack_device__"):
        return tuple(device.__dlpack_device__())
    d = as_device(device)
    return (_kDLCPU, 0) if d.type == "cpu" else (_kDLCUDA, d.index)


def _clone(t: Any) -> Any:
    """A contiguous, writable copy of a tensor on its own device (bit-exact)."""
    return t.clone()


_ML_DTYPE_NAMES = {"bfloat16", "float8_e4m3fn", "float8_e5m2"}


def _from_numpy_fallback(a: np.ndarray) -> Any:
    """Zero-copy import of a NumPy array NumPy cannot export through DLPack (ml_dtypes)."""
    name = a.dtype.name
    if name not in _ML_DTYPE_NAMES:
        raise TypeError(f"unsupported NumPy dtype {a.dtype} for castlab.from_dlpack")
    isz = a.dtype.itemsize
    if any(s % isz for s in a.strides):
        raise BufferError("array strides are not a multiple of the itemsize")
    return _C.from_pointer(a.ctypes.data, list(a.shape), [s // isz for s in a.strides], name,
                           a, not a.flags.writeable, "cpu")


def _producer_device(x: Any, src: tuple[int, int]) -> Any:
    """A context in which ``x``'s library has ``x``'s CUDA device current, for the
    ``__dlpack__`` call: the stream castlab passes belongs to that device, and PyTorch
    refuses to export a tensor of another device than its current one (BufferError).
    Only libraries already imported by the caller are used (their tensor exists)."""
    if src[0] != _kDLCUDA:
        return contextlib.nullcontext()
    mod = type(x).__module__.split(".")[0]
    if mod == "torch" and "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.current_device() != src[1]:
            return torch.cuda.device(src[1])
    elif mod == "cupy" and "cupy" in sys.modules:
        return sys.modules["cupy"].cuda.Device(src[1])
    return contextlib.nullcontext()


def _numpy_buffer_bounds(a: np.ndarray) -> tuple[int, int] | None:
    """The [start, end) addresses of the memory that owns ``a``'s data (the base array
    or buffer at the end of its ``.base`` chain), or None when that cannot be known."""
    b: Any = a
    for _ in range(64):
        base = getattr(b, "base", None)
        if base is None:
            if isinstance(b, np.ndarray) and b.flags.owndata:
                lo = b.__array_interface__["data"][0]
                return (lo, lo + b.nbytes)
            return None
        if not isinstance(base, np.ndarray) and not hasattr(base, "__array_interface__"):
            try:  # a buffer-protocol object (bytes, bytearray, mmap, memoryview, ...)
                whole = np.frombuffer(base, dtype=np.uint8)
            except (TypeError, ValueError, BufferError):
                return None
            lo = whole.__array_interface__["data"][0] if whole.size else 0
            return (lo, lo + whole.nbytes)
        b = base
    return None


def _check_numpy_bounds(x: np.ndarray, t: Any, fn: str = "from_dlpack",
                        exc: type[Exception] = BufferError) -> None:
    """Refuse a NumPy view that reaches outside the memory it was made from (NumPy's
    ``as_strided`` builds such views without a check, and exports them as they are)."""
    if t.numel() == 0:
        return
    bounds = _numpy_buffer_bounds(x)
    if bounds is None:
        return
    lo, hi = t._storage_ptr, t._storage_ptr + t._storage_nbytes
    if lo < bounds[0] or hi > bounds[1]:
        raise exc(f"{fn}: the NumPy array (shape {x.shape}, strides {x.strides}) "
                          f"reaches bytes [{lo - bounds[0]}, {hi - bounds[0]}) of a buffer of "
                          f"{bounds[1] - bounds[0]} bytes")


def _resolve_torch_bits(x: Any, copy: bool | None) -> tuple[Any, bool]:
    """A torch tensor with its lazy negation/conjugation bits applied (``resolve_neg``,
    ``resolve_conj``): DLPack has no such bits, so exporting as it is would import the
    un-negated values. Returns (tensor, whether it is now a copy)."""
    if type(x).__module__.split(".")[0] != "torch":
        return x, False
    flags = [name for name in ("is_neg", "is_conj") if getattr(x, name, lambda: False)()]
    if not flags:
        return x, False
    if copy is False:
        raise BufferError(f"from_dlpack: the torch tensor is a lazy view ({', '.join(flags)}) "
                          f"that needs a copy to import, and copy=False was given")
    return x.resolve_neg().resolve_conj(), True


# ---- consumer --------------------------------------------------------------------------


_EXTERNAL_STREAMS: dict = {}


def from_torch_tracked(t: Any) -> Any:
    """castlab.torch's import of a torch tensor that PyTorch's caching allocator made (an
    op's output, a parameter): as :func:`from_dlpack`, and on a GPU the allocator is told
    (``Tensor.record_stream``) that castlab's stream reads the memory, so it reuses it only
    after castlab's queued work; releasing castlab's view then needs no host
    synchronisation. Not for tensors whose memory another library allocated (record_stream
    does nothing there): those go through :func:`from_dlpack`."""
    return _import(t, None, None, track_stream=True)


def from_torch_region(ts: list, made_by_torch: list, streams: dict | None = None) -> list:
    """castlab.torch's import of one region's inputs, zero-copy: as
    :func:`from_torch_tracked` for tensors PyTorch's allocator made (`made_by_torch`) and
    :func:`from_dlpack` for the others, with the stream order of the GPU tensors of
    PyTorch's allocator set once per device (castlab's stream waits for PyTorch's current
    stream, which queued their writers) instead of one event per tensor. `streams`: device
    index -> PyTorch's current stream there, filled as needed and shared by the imports and
    exports of one run (the current stream is read once per device, not twice a region)."""
    import torch

    # torch.utils.dlpack.to_dlpack is what Tensor.__dlpack__(stream=-1) returns after its
    # checks (requires_grad, the conjugate bit, the layout: tensors that fail one take
    # the long way below; stream -1: no synchronisation, ordered by the wait below),
    # without their ~2 us a tensor. (Its one other check, that a GPU tensor is on torch's
    # current device, is not needed: the capsule names the device.)
    to_dlpack = torch.utils.dlpack.to_dlpack
    strided = torch.strided
    out = []
    waited: set = set()
    imp = _C.from_dlpack_capsule
    for t, mine in zip(ts, made_by_torch):
        if (not isinstance(t, torch.Tensor) or t.is_neg() or t.is_conj() or t.requires_grad
                or t.layout != strided):
            out.append(_import(t, None, None, track_stream=mine))
            continue
        if not t.is_cuda:
            out.append(imp(to_dlpack(t), False))
            continue
        idx = t.device.index
        if idx not in waited:
            cuda.wait_on_stream(_torch_stream(streams, idx), idx)
            waited.add(idx)
        capsule = to_dlpack(t)  # ordered above
        if mine:
            _record_castlab_stream(t, idx)
        out.append(imp(capsule, mine))
    return out


def _torch_stream(streams: dict | None, idx: int) -> int:
    """PyTorch's current stream on device idx (its handle), read once per `streams` dict."""
    s = None if streams is None else streams.get(idx)
    if s is None:
        import torch

        s = torch.cuda.current_stream(idx).cuda_stream
        if streams is not None:
            streams[idx] = s
    return s


def to_torch_region(xs: list, streams: dict | None = None) -> list:
    """castlab.torch's export of one region's outputs to PyTorch, zero-copy: as
    ``torch.utils.dlpack.from_dlpack`` of each, with PyTorch's current stream made to wait
    for castlab's once per device instead of once per tensor (`streams`: as
    :func:`from_torch_region`'s)."""
    import torch

    out = []
    waited: dict = {}
    for x in xs:
        if any(st < 0 for st in x._strides):  # (PyTorch takes no negative strides: a copy)
            out.append(torch.utils.dlpack.from_dlpack(x))
            continue
        kind, idx = _device_pair(x)
        if kind != _kDLCUDA:
            out.append(torch.utils.dlpack.from_dlpack(_C.to_dlpack(x, False)))
            continue
        s = waited.get(idx)
        if s is None:  # PyTorch's current stream (1: the legacy default one, as it passes)
            s = waited[idx] = _torch_stream(streams, idx) or 1
            _producer_sync(x, s)
        # the capsule's release makes castlab wait for that stream, as __dlpack__(stream=s)
        out.append(torch.utils.dlpack.from_dlpack(_C.to_dlpack(x, False, consumer_stream=s)))
    return out


def _record_castlab_stream(x: Any, idx: int) -> None:
    """x.record_stream(castlab's stream on device idx), the stream wrapped once per device."""
    import torch

    s = _EXTERNAL_STREAMS.get(idx)
    if s is None:
        s = _EXTERNAL_STREAMS[idx] = torch.cuda.ExternalStream(
            cuda.consumer_stream(idx), device=torch.device("cuda", idx))
    x.record_stream(s)


def from_dlpack(x: Any, *, device: Any = None, copy: bool | None = None) -> Any:
    """A castlab Tensor sharing memory with ``x`` (zero-copy), per the array API standard.

    ``x`` is any object with ``__dlpack__``/``__dlpack_device__`` (a torch tensor, a NumPy
    array, ...) or a raw DLPack capsule. ``copy=True`` returns a copy, ``copy=False``
    guarantees there is none (this import never needs one). ``device`` must be the source's
    device (moving between devices is not supported here: BufferError).

    >>> import torch, castlab as cl
    >>> t = torch.arange(4.0)
    >>> x = cl.from_dlpack(t)          # shares t's memory
    >>> x.data_ptr() == t.data_ptr()
    True
    """
    if copy is not None and not isinstance(copy, (bool, np.bool_)):
        raise TypeError(f"from_dlpack: copy must be None, True or False, got "
                        f"{type(copy).__name__} {copy!r}")
    return _import(x, device, copy)


def _import(x: Any, device: Any, copy: bool | None, track_stream: bool = False) -> Any:
    """from_dlpack's import; `track_stream`: a torch CUDA tensor of PyTorch's caching
    allocator, told to wait for castlab's stream (from_torch_tracked)."""
    if isinstance(x, _CAPSULE_TYPE):
        t = _C.from_dlpack_capsule(x)
        src = _device_pair(t)
        if device is not None and _normalize_device(device) != src:
            raise BufferError(f"cannot import a DLPack tensor on device {src} to device {device!r}")
        return _clone(t) if copy else t

    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack needs an object with __dlpack__ or a DLPack capsule, "
                        f"got {type(x).__name__}")

    src = tuple(x.__dlpack_device__()) if hasattr(x, "__dlpack_device__") else (_kDLCPU, 0)
    if device is not None:
        want = _normalize_device(device)
        norm_src = (_kDLCPU, 0) if src[0] == _kDLCUDAHost else src
        if want != norm_src:
            raise BufferError(f"castlab.from_dlpack cannot move data from DLPack device {src} "
                              f"to {device!r}")
    stream = _consumer_stream(src) if src[0] == _kDLCUDA else None
    x, resolved = _resolve_torch_bits(x, copy)
    if resolved:
        copy = False  # already a fresh tensor

    try:
        with _producer_device(x, src):
            capsule = x.__dlpack__(max_version=_MAX_VERSION, stream=stream)
    except TypeError:
        # A producer older than the 2023.12 array API: no max_version keyword.
        try:
            with _producer_device(x, src):
                capsule = x.__dlpack__(stream=stream) if stream is not None else x.__dlpack__()
        except BufferError:
            if isinstance(x, np.ndarray) and x.dtype.name in _ML_DTYPE_NAMES:
                t = _from_numpy_fallback(x)
                return _clone(t) if copy else t
            raise
    except BufferError:
        # NumPy cannot export ml_dtypes (bfloat16, fp8) through DLPack.
        if isinstance(x, np.ndarray) and x.dtype.name in _ML_DTYPE_NAMES:
            t = _from_numpy_fallback(x)
            return _clone(t) if copy else t
        raise
    track_stream = track_stream and src[0] == _kDLCUDA
    if track_stream:
        _record_castlab_stream(x, src[1])
    t = _C.from_dlpack_capsule(capsule, track_stream)
    if isinstance(x, np.ndarray):
        _check_numpy_bounds(x, t)
    return _clone(t) if copy else t


# ---- producer --------------------------------------------------------------------------


#: ``__dlpack__``'s default ``copy``: not passed, by a consumer older than the 2023.12 protocol
COPY_UNSET: Any = object()


def _consumer_takes_negative_strides(copy_passed: bool) -> bool:
    """Whether the consumer calling ``__dlpack__`` can take negative strides. NumPy (and
    other consumers of the 2023.12 protocol, which pass ``copy``) can; PyTorch cannot (its
    ``from_dlpack`` passes no ``copy`` and aborts the process on a negative stride)."""
    if not copy_passed:
        return False
    # frames: 0 here, 1 tensor_dlpack, 2 Tensor.__dlpack__ (castlab._tensor), 3 the consumer
    caller = sys._getframe(3).f_globals.get("__name__", "")
    return not str(caller).startswith("torch")


def tensor_dlpack(self: Any, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                  dl_device: Any = None, copy: Any = COPY_UNSET) -> Any:
    """The body of ``Tensor.__dlpack__`` (castlab._tensor), its only caller: export as a
    DLPack capsule (array API semantics).

    A versioned capsule ("dltensor_versioned", DLPack 1.1) when ``max_version[0] >= 1``,
    else a legacy "dltensor" one. ``copy=True`` exports a copy (flag IS_COPIED); otherwise
    the capsule shares the tensor's memory, except that a tensor with negative strides is
    copied for consumers that cannot take them (those that pass no ``copy``, such as
    PyTorch; ``copy=False`` then raises BufferError). ``dl_device`` other than the tensor's device
    raises BufferError, except a copy to the CPU (``dl_device=(1, 0)``, not ``copy=False``).
    """
    copy_passed = copy is not COPY_UNSET
    if not copy_passed:
        copy = None
    versioned = max_version is not None and int(max_version[0]) >= 1
    here = _device_pair(self)
    if dl_device is not None:
        want = (int(dl_device[0]), int(dl_device[1]))
        if want != here:
            if copy is False:
                raise BufferError(f"cannot export to DLPack device {want} without a copy "
                                  f"(tensor is on {here}) and copy=False was given")
            if want == (_kDLCPU, 0) and here[0] == _kDLCUDA:
                # A host copy (the device -> host copy waits for castlab's pending work).
                return _C.to_dlpack(self.cpu(), versioned, copied=True)
            raise BufferError(f"unsupported device requested: {want} (tensor is on {here})")
    consumer = 0  # the stream whose work castlab waits for when the capsule is released
    if here[0] == _kDLCPU:
        if stream is not None and stream != -1:
            raise BufferError(f"stream must be None for a CPU tensor, got {stream!r}")
    else:
        _producer_sync(self, stream)
        consumer = 1 if stream is None else (0 if stream == -1 else int(stream))
    if copy:
        return _C.to_dlpack(_clone(self), versioned, copied=True, consumer_stream=consumer)
    if (any(st < 0 and n > 1 for st, n in zip(self._strides, self.shape))
            and not (versioned and _consumer_takes_negative_strides(copy_passed))):
        # This consumer cannot take negative strides (PyTorch aborts): export a copy.
        if copy is False:
            raise BufferError(f"cannot export a tensor with negative strides {self._strides} "
                              f"through DLPack without a copy, and copy=False was given")
        return _C.to_dlpack(_clone(self), versioned, copied=True, consumer_stream=consumer)
    return _C.to_dlpack(self, versioned, consumer_stream=consumer)


def tensor_dlpack_device(self: Any) -> tuple[int, int]:
    """``Tensor.__dlpack_device__``: ``(1, 0)`` on the CPU, ``(2, index)`` on CUDA."""
    return _device_pair(self)
