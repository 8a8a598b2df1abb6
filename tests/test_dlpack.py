"""DLPack interchange: zero-copy both ways with PyTorch and NumPy, lifetimes, flags, errors.

References: torch (CPU build) and NumPy as producers/consumers, and a hand-built capsule
(ctypes) whose deleter counts its calls.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import weakref

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import castlab  # noqa: E402
from castlab import _C, _dlpack  # noqa: E402

# Use the public API when the package provides it; until then, this module's own functions.
from_dlpack = getattr(castlab, "from_dlpack", _dlpack.from_dlpack)
if not hasattr(_C.Tensor, "__dlpack__"):
    _C.Tensor.__dlpack__ = _dlpack.tensor_dlpack
    _C.Tensor.__dlpack_device__ = _dlpack.tensor_dlpack_device

# ---- ctypes view of the DLPack ABI (independent of castlab's header) -------------------

_api = ctypes.pythonapi
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


_DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER_V), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _DELETER)]

READ_ONLY, IS_COPIED = 1, 2


def capsule_name(cap) -> str:
    return _api.PyCapsule_GetName(cap).decode()


def read_versioned(cap) -> DLManagedTensorVersioned:
    assert capsule_name(cap) == "dltensor_versioned"
    p = _api.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    return DLManagedTensorVersioned.from_address(p)


class HandMadeProducer:
    """A producer built with ctypes: a buffer, any DLTensor fields, a counting deleter.

    The capsule has no destructor of its own, so an unconsumed capsule just leaks the
    (Python-owned) struct; tests check the deleter count instead.
    """

    def __init__(self, nbytes=64, *, shape=(4,), strides=None, code=2, bits=32, lanes=1,
                 device=(1, 0), byte_offset=0, flags=0, major=1, minor=1, versioned=True,
                 data=None):
        self.buf = (ctypes.c_uint8 * nbytes)()
        self.calls = 0
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        dl = DLTensor()
        dl.data = ctypes.addressof(self.buf) if data is None else data
        dl.device = DLDevice(*device)
        dl.ndim = len(shape)
        dl.dtype = DLDataType(code, bits, lanes)
        dl.shape = self.shape
        dl.strides = self.strides if self.strides is not None else None
        dl.byte_offset = byte_offset

        def deleter(_):
            self.calls += 1

        if versioned:
            self._cb = _DELETER_V(deleter)
            self.m = DLManagedTensorVersioned(major, minor, None, self._cb, flags, dl)
            self.name = b"dltensor_versioned"
        else:
            self._cb = _DELETER(deleter)
            self.m = DLManagedTensor(dl, None, self._cb)
            self.name = b"dltensor"

    def capsule(self):
        return _api.PyCapsule_New(ctypes.addressof(self.m), self.name, None)


# ---- helpers ---------------------------------------------------------------------------

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.bool, torch.int32, torch.int64]
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def make_torch(dtype, shape=(6, 8)):
    n = int(np.prod(shape))
    return torch.arange(n, dtype=torch.float32).reshape(shape).remainder(7).to(dtype)


def bits(t):
    """A torch integer view of the same bits (for writes in any dtype, fp8 included)."""
    return t.view(_BITS[t.element_size()])


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---- ABI -------------------------------------------------------------------------------


def test_abi_matches_torch_producer():
    abi = _C._dlpack_abi()
    assert abi["version"] == (1, 1)
    assert abi["sizeof_DLTensor"] == ctypes.sizeof(DLTensor) == 48
    assert abi["sizeof_DLManagedTensor"] == ctypes.sizeof(DLManagedTensor) == 64
    assert abi["sizeof_DLManagedTensorVersioned"] == ctypes.sizeof(DLManagedTensorVersioned) == 80
    assert (abi["flag_read_only"], abi["flag_is_copied"], abi["flag_is_subbyte_type_padded"]) == (1, 2, 4)
    for dt in DTYPES:
        cap = torch.zeros(2, dtype=dt).__dlpack__(max_version=(1, 1))
        d = read_versioned(cap).dl_tensor.dtype
        name = str(dt).removeprefix("torch.")
        assert abi["dtypes"][name] == (d.code, d.bits, d.lanes), name


# ---- zero-copy with torch --------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_roundtrip_zero_copy(dtype):
    t = make_torch(dtype)
    x = from_dlpack(t)
    assert x.data_ptr() == t.data_ptr()
    assert x.shape == tuple(t.shape) and x._strides == t.stride()
    assert x._dtype_name == str(dtype).removeprefix("torch.")
    assert not x.readonly
    back = torch.from_dlpack(x)
    assert back.dtype == dtype and back.data_ptr() == t.data_ptr()
    assert back.stride() == t.stride()
    assert torch.equal(bits(back), bits(t))
    # A write on either side is seen on the other.
    bits(back)[0, 0] = 1
    assert bits(t)[0, 0].item() == 1
    bits(t)[5, 7] = 0
    assert bits(back)[5, 7].item() == 0
    assert x._bits(0) == 1 and x._bits(5 * 8 + 7) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("view", ["slice", "transpose", "select", "expand", "scalar", "empty",
                                  "permute3d"])
def test_torch_views(dtype, view):
    base = make_torch(dtype, (6, 8))
    v = {
        "slice": lambda: base[1:, ::2],
        "transpose": lambda: base.t(),
        "select": lambda: base[:, 3],
        "expand": lambda: base[:1].expand(4, 8),
        "scalar": lambda: base[2, 5],
        "empty": lambda: base[:0, 2:],
        "permute3d": lambda: base.reshape(2, 3, 8).permute(2, 0, 1)[1:, 1:],
    }[view]()
    x = from_dlpack(v)
    assert x.shape == tuple(v.shape)
    if v.numel():
        assert x.data_ptr() == v.data_ptr()
    back = torch.from_dlpack(x)
    assert back.shape == v.shape
    if v.numel():
        assert back.data_ptr() == v.data_ptr()
        assert back.stride() == v.stride()
    assert torch.equal(bits(back), bits(v))
    if v.numel() and view != "expand":
        idx = (0,) * v.dim()
        bits(back)[idx] = 3
        assert bits(v)[idx].item() == 3


def test_numpy_negative_strides():
    a = np.arange(10.0)[::-2]
    x = from_dlpack(a)
    assert x._strides == (-2,)
    assert x.data_ptr() == a.__array_interface__["data"][0]
    n = np.from_dlpack(x)
    np.testing.assert_array_equal(n, a)
    assert n.__array_interface__["data"][0] == a.__array_interface__["data"][0]


# ---- NumPy -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bool,
                                   torch.int32, torch.int64], ids=str)
def test_numpy_consumes_castlab(dtype):
    t = make_torch(dtype)[1:, ::2]
    x = from_dlpack(t)
    n = np.from_dlpack(x)
    assert n.__array_interface__["data"][0] == t.data_ptr()
    assert n.strides == tuple(s * t.element_size() for s in t.stride())
    np.testing.assert_array_equal(n, t.numpy())
    assert n.flags.writeable
    n[0, 0] = 0
    assert t[0, 0].item() == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.bool_, np.int32,
                                   np.int64])
def test_castlab_consumes_numpy(dtype):
    a = (np.arange(24) % 5).astype(dtype).reshape(4, 6)
    x = from_dlpack(a)
    assert x.data_ptr() == a.ctypes.data
    assert x._dtype_name == np.dtype(dtype).name
    t = torch.from_dlpack(x)
    np.testing.assert_array_equal(t.numpy(), a)


@pytest.mark.parametrize("mldt", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                                  ml_dtypes.float8_e5m2])
def test_numpy_ml_dtypes_fallback(mldt):
    # NumPy cannot export ml_dtypes arrays through DLPack; from_dlpack falls back to the
    # NumPy path, still zero-copy.
    a = np.arange(6, dtype=np.float32).astype(mldt)
    x = from_dlpack(a)
    assert x._dtype_name == np.dtype(mldt).name
    assert x.data_ptr() == a.ctypes.data
    t = torch.from_dlpack(x)
    assert t.view(torch.uint8 if a.itemsize == 1 else torch.int16).numpy().tobytes() == a.tobytes()


# ---- lifetimes and the deleter -----------------------------------------------------------


def test_lifetime_producer_deleted_first():
    t = torch.arange(1000, dtype=torch.float32)
    ptr = t.data_ptr()
    x = from_dlpack(t)
    del t
    gc.collect()
    _ = [torch.empty(1000) for _ in range(10)]  # let the allocator reuse freed memory
    back = torch.from_dlpack(x)
    assert back.data_ptr() == ptr
    assert torch.equal(back, torch.arange(1000, dtype=torch.float32))


def test_lifetime_castlab_deleted_first():
    x = from_dlpack(torch.arange(100, dtype=torch.int64))
    back = torch.from_dlpack(x)
    del x
    gc.collect()
    assert torch.equal(back, torch.arange(100))


def test_numpy_producer_released_exactly_once():
    a = np.arange(100.0)
    ref = weakref.ref(a)
    base = sys.getrefcount(a)
    x = from_dlpack(a)
    assert sys.getrefcount(a) == base + 1  # the capsule's manager holds one reference
    y = from_dlpack(x)  # castlab -> castlab keeps the same producer alive
    del x
    gc.collect()
    assert sys.getrefcount(a) == base + 1
    del y
    gc.collect()
    assert sys.getrefcount(a) == base
    del a
    assert ref() is None


def test_reference_cycle_collected():
    a = np.arange(10.0)
    base = sys.getrefcount(a)
    x = from_dlpack(a)
    x.me = x  # _C.Tensor has a __dict__: make a cycle
    del x
    gc.collect()
    assert sys.getrefcount(a) == base


@pytest.mark.parametrize("versioned", [True, False])
def test_deleter_runs_once_when_consumed(versioned):
    p = HandMadeProducer(versioned=versioned)
    x = _C.from_dlpack_capsule(p.capsule())
    assert x.data_ptr() == ctypes.addressof(p.buf)
    assert p.calls == 0
    y = from_dlpack(x)  # a second castlab view through castlab's own export
    del x
    gc.collect()
    assert p.calls == 0
    del y
    gc.collect()
    assert p.calls == 1


def test_unconsumed_castlab_capsule_is_freed():
    a = np.arange(10.0)
    base = sys.getrefcount(a)
    x = from_dlpack(a)
    for versioned in (True, False):
        cap = _C.to_dlpack(x, versioned)
        del cap  # never consumed: the capsule destructor runs the deleter
    del x
    gc.collect()
    assert sys.getrefcount(a) == base


def test_failed_import_leaves_capsule_unconsumed():
    p = HandMadeProducer(code=5, bits=64)  # complex64
    cap = p.capsule()
    with pytest.raises(TypeError, match="complex64"):
        _C.from_dlpack_capsule(cap)
    assert capsule_name(cap) == "dltensor_versioned"
    assert p.calls == 0


def test_capsule_destructor_preserves_exception():
    x = from_dlpack(np.arange(4.0))
    with pytest.raises(KeyError):
        try:
            raise KeyError("k")
        finally:
            del x  # last reference: frees the storage while the exception is in flight
    with pytest.raises(KeyError):
        cap = _C.to_dlpack(from_dlpack(np.arange(4.0)), True)
        try:
            raise KeyError("k")
        finally:
            del cap


# ---- capsule names, versions, flags ----------------------------------------------------


def test_capsule_names_and_versioned_fields():
    x = from_dlpack(torch.arange(12.0).reshape(3, 4)[:, 1:])
    legacy = x.__dlpack__()
    assert capsule_name(legacy) == "dltensor"
    old = x.__dlpack__(max_version=(0, 8))
    assert capsule_name(old) == "dltensor"
    cap = x.__dlpack__(max_version=(1, 0))
    m = read_versioned(cap)
    assert (m.major, m.minor) == (1, 1)
    assert m.flags == 0
    dl = m.dl_tensor
    assert dl.data == x.data_ptr() and dl.byte_offset == 0
    assert (dl.device.device_type, dl.device.device_id) == (1, 0)
    assert dl.ndim == 2 and [dl.shape[i] for i in range(2)] == [3, 3]
    assert [dl.strides[i] for i in range(2)] == [4, 1]
    torch.from_dlpack(cap)
    assert capsule_name(cap) == "used_dltensor_versioned"
    torch.from_dlpack(legacy)
    assert capsule_name(legacy) == "used_dltensor"
    assert x.__dlpack_device__() == (1, 0)


def test_castlab_consumer_renames_capsule():
    cap = torch.arange(3.0).__dlpack__(max_version=(1, 0))
    x = from_dlpack(cap)
    assert capsule_name(cap) == "used_dltensor_versioned"
    assert x.shape == (3,)
    cap = torch.arange(3.0).__dlpack__()
    from_dlpack(cap)
    assert capsule_name(cap) == "used_dltensor"


@pytest.mark.parametrize("versioned", [True, False])
def test_capsule_consumed_twice(versioned):
    cap = torch.arange(3.0).__dlpack__(max_version=(1, 0) if versioned else None)
    from_dlpack(cap)
    with pytest.raises((ValueError, BufferError), match="already consumed"):
        from_dlpack(cap)
    cap2 = _C.to_dlpack(from_dlpack(torch.arange(3.0)), versioned)
    torch.from_dlpack(cap2)
    with pytest.raises((ValueError, BufferError), match="already consumed"):
        _C.from_dlpack_capsule(cap2)


def test_not_a_dlpack_capsule():
    other = _api.PyCapsule_New(ctypes.addressof(ctypes.c_int(0)), b"something_else", None)
    with pytest.raises(TypeError, match="not a DLPack capsule"):
        _C.from_dlpack_capsule(other)
    with pytest.raises(TypeError):
        from_dlpack(3.0)


def test_unsupported_major_version():
    p = HandMadeProducer(major=2, minor=0)
    cap = p.capsule()
    with pytest.raises(BufferError, match="version"):
        _C.from_dlpack_capsule(cap)
    assert capsule_name(cap) == "dltensor_versioned" and p.calls == 0


def test_readonly_numpy_to_castlab():
    a = np.arange(6.0)
    a.flags.writeable = False
    x = from_dlpack(a)
    assert x.readonly
    assert x.data_ptr() == a.ctypes.data
    # ... and back out: NumPy sees the READ_ONLY flag.
    n = np.from_dlpack(x)
    assert not n.flags.writeable
    assert n.ctypes.data == a.ctypes.data
    m = read_versioned(x.__dlpack__(max_version=(1, 1)))
    assert m.flags & READ_ONLY
    # The legacy capsule cannot say "read-only": refused.
    with pytest.raises(BufferError, match="read-only"):
        x.__dlpack__()


def test_readonly_flag_from_handmade_producer():
    p = HandMadeProducer(flags=READ_ONLY)
    x = _C.from_dlpack_capsule(p.capsule())
    assert x.readonly
    w = HandMadeProducer(flags=0)
    assert not _C.from_dlpack_capsule(w.capsule()).readonly


def test_readonly_flag_forced_and_copied_flag():
    x = from_dlpack(torch.arange(4.0))
    m = read_versioned(_C.to_dlpack(x, True, readonly_flag=True))
    assert m.flags == READ_ONLY
    m = read_versioned(_C.to_dlpack(x, True, copied=True))
    assert m.flags == IS_COPIED


def test_export_copy():
    t = torch.arange(12.0).reshape(3, 4)[:, ::2]
    x = from_dlpack(t)
    cap = x.__dlpack__(max_version=(1, 1), copy=True)
    m = read_versioned(cap)
    assert m.flags & IS_COPIED
    assert m.dl_tensor.data != t.data_ptr()
    c = torch.from_dlpack(cap)
    assert torch.equal(c, t) and c.is_contiguous()
    c[0, 0] = 99
    assert t[0, 0].item() == 0
    # torch's own copy=True path
    c2 = torch.from_dlpack(x, copy=True)
    assert c2.data_ptr() != t.data_ptr() and torch.equal(c2, t)


def test_import_copy():
    t = torch.arange(12.0).reshape(3, 4).t()
    x = from_dlpack(t, copy=True)
    assert x.data_ptr() != t.data_ptr() and x.is_contiguous() and not x.readonly
    assert torch.equal(torch.from_dlpack(x), t)
    y = from_dlpack(t, copy=False)
    assert y.data_ptr() == t.data_ptr()
    ro = np.arange(3.0)
    ro.flags.writeable = False
    z = from_dlpack(ro, copy=True)
    assert not z.readonly and z.data_ptr() != ro.ctypes.data


# ---- unsupported dtypes and devices ----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int8, torch.uint8, torch.int16,
                                   torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
                                   torch.complex128, torch.uint16], ids=str)
def test_unsupported_torch_dtypes(dtype):
    t = torch.zeros(4, dtype=dtype)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(TypeError, match=f"unsupported DLPack dtype {name}"):
        from_dlpack(t)


def test_unsupported_lanes():
    p = HandMadeProducer(lanes=4)
    with pytest.raises(TypeError, match="lanes=4"):
        _C.from_dlpack_capsule(p.capsule())


def test_export_to_other_device_raises():
    x = from_dlpack(torch.arange(3.0))
    with pytest.raises(BufferError):
        x.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        x.__dlpack__(dl_device=(4, 0))
    with pytest.raises(BufferError):
        x.__dlpack__(dl_device=(2, 0), copy=True)  # no device copies yet
    x.__dlpack__(dl_device=(1, 0))  # its own device is fine
    with pytest.raises(BufferError):
        x.__dlpack__(stream=7)  # a stream makes no sense on the CPU


def test_import_to_other_device_raises():
    with pytest.raises(BufferError):
        from_dlpack(torch.arange(3.0), device="cuda:0")
    with pytest.raises(BufferError):
        from_dlpack(torch.arange(3.0), device=(2, 0))
    assert from_dlpack(torch.arange(3.0), device="cpu").shape == (3,)
    assert from_dlpack(torch.arange(3.0), device=torch.device("cpu")).shape == (3,)


@pytest.mark.parametrize("dev", [(4, 0), (10, 0), (13, 0), (7, 1)])
def test_unsupported_device_type(dev):
    p = HandMadeProducer(device=dev)
    cap = p.capsule()
    with pytest.raises(BufferError, match=f"unsupported DLPack device type {dev[0]}"):
        _C.from_dlpack_capsule(cap)
    assert capsule_name(cap) == "dltensor_versioned"


def test_cuda_and_cuda_host_devices():
    # castlab wraps CUDA pointers without touching them (CUDA support need not be loaded).
    p = HandMadeProducer(device=(2, 3), data=0x7000_0000_0000)
    x = _C.from_dlpack_capsule(p.capsule())
    assert x._device_type == 1 and x._device_index == 3
    assert x.data_ptr() == 0x7000_0000_0000
    assert x.__dlpack_device__() == (2, 3)
    del x
    gc.collect()
    assert p.calls == 1
    h = HandMadeProducer(device=(3, 0))
    y = _C.from_dlpack_capsule(h.capsule())
    assert y._device_type == 0 and y.__dlpack_device__() == (1, 0)


# ---- hand-made layouts: byte_offset, NULL strides --------------------------------------


def test_byte_offset_and_null_strides():
    p = HandMadeProducer(nbytes=64, shape=(2, 3), strides=None, byte_offset=8)
    arr = np.frombuffer(p.buf, dtype=np.float32)
    arr[:] = np.arange(16)
    x = _C.from_dlpack_capsule(p.capsule())
    assert x._strides == (3, 1)
    assert x.data_ptr() == ctypes.addressof(p.buf) + 8
    np.testing.assert_array_equal(np.from_dlpack(x), np.arange(2, 8, dtype=np.float32).reshape(2, 3))
    q = HandMadeProducer(nbytes=64, shape=(3,), strides=(-2,), byte_offset=40)
    np.frombuffer(q.buf, dtype=np.float32)[:] = np.arange(16)
    y = _C.from_dlpack_capsule(q.capsule())
    np.testing.assert_array_equal(np.from_dlpack(y), [10.0, 8.0, 6.0])
    assert y._storage_ptr == ctypes.addressof(q.buf) + 24 and y._storage_nbytes == 20


# ---- memory --------------------------------------------------------------------------


@pytest.mark.slow  # ~3 s
def test_no_memory_growth_over_many_round_trips():
    t = torch.arange(64, dtype=torch.float32).reshape(8, 8)[:, 1:]
    a = np.arange(64.0)

    def round_trip():
        x = from_dlpack(t)
        back = torch.from_dlpack(x)
        y = from_dlpack(a)
        _C.to_dlpack(y, True)  # unconsumed capsule
        n = np.from_dlpack(y)
        return back, n

    for _ in range(2000):  # warm up allocator pools
        round_trip()
    gc.collect()
    before = rss_bytes()
    base = sys.getrefcount(a)
    for _ in range(100_000):
        round_trip()
    gc.collect()
    growth = rss_bytes() - before
    assert growth < 4 * 1024 * 1024, f"RSS grew by {growth / 1e6:.1f} MB"
    assert sys.getrefcount(a) == base


# ---- consumer protocol details ---------------------------------------------------------


class RecordingProducer:
    """Wraps a torch tensor and records the keywords __dlpack__ was called with."""

    def __init__(self, t, old_style=False):
        self.t, self.old_style, self.calls = t, old_style, []

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        if self.old_style and kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.t.__dlpack__(**kwargs)


def test_consumer_asks_for_versioned_capsule():
    p = RecordingProducer(torch.arange(5.0))
    x = from_dlpack(p)
    assert p.calls == [{"max_version": (1, 1), "stream": None}]
    assert x.data_ptr() == p.t.data_ptr()


def test_consumer_falls_back_for_old_producers():
    p = RecordingProducer(torch.arange(5.0), old_style=True)
    x = from_dlpack(p)
    assert p.calls[-1] == {}
    assert x.data_ptr() == p.t.data_ptr()


# ---- with castlab's public tensor API ------------------------------------------------


@pytest.mark.skipif(not hasattr(castlab, "tensor"), reason="castlab.tensor not available")
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16", "float8_e4m3fn", "int32"])
def test_public_api_tensor_to_torch(name):
    x = castlab.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=getattr(castlab, name))
    t = torch.from_dlpack(x)
    assert t.dtype == getattr(torch, name)
    assert t.data_ptr() == x.data_ptr()
    assert t.float().tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    t[0, 0] = 0
    assert x.tolist()[0][0] == 0
    y = from_dlpack(t)
    assert y.tolist() == x.tolist()


@pytest.mark.skipif(not hasattr(castlab, "device"), reason="castlab.device not available")
def test_public_device_objects():
    t = torch.arange(3.0)
    assert from_dlpack(t, device=castlab.device("cpu")).data_ptr() == t.data_ptr()
    with pytest.raises(BufferError):
        from_dlpack(t, device=castlab.device("cuda:0"))


# ---- hostile producers and consumers (issue 14, item 9) --------------------------------


def _run_child(code: str):
    import subprocess  # noqa: PLC0415
    import textwrap  # noqa: PLC0415
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(castlab.__file__)))  # same castlab
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kw,match", [
    (dict(byte_offset=2**62), "byte_offset"),
    (dict(byte_offset=2**64 - 4), "byte_offset"),
    (dict(shape=(2,), strides=(2**62,)), "spans more"),
    (dict(shape=(3,), strides=(2**61,)), "spans more"),
    (dict(shape=(2,), strides=(-2**62,)), "spans more"),
    (dict(shape=(2**32, 2**32)), "more elements than fit in 64 bits"),
    (dict(shape=(2**62, 2**62), strides=(0, 0)), "more elements than fit in 64 bits"),
    (dict(shape=(-1,)), "negative dimension"),
    (dict(byte_offset=2), "not aligned"),
    (dict(shape=(4,), data=0), "null data pointer"),
], ids=["offset_2_62", "offset_wraps", "stride_2_62", "stride_2_61", "stride_neg_2_62",
        "numel_overflow", "numel_overflow_stride0", "negative_dim", "misaligned", "null_data"])
def test_hostile_capsule_refused(kw, match):
    p = HandMadeProducer(nbytes=16, **kw)
    cap = p.capsule()
    with pytest.raises(BufferError, match=match):
        _C.from_dlpack_capsule(cap)
    assert capsule_name(cap) == "dltensor_versioned"  # not consumed
    assert p.calls == 0


def test_hostile_capsule_in_subprocess_does_not_crash():
    # strides of 2**40 over a 16-byte NumPy buffer: refused, never read.
    r = _run_child("""
        import castlab as cl
        import numpy as np
        a = np.zeros(2)
        from numpy.lib.stride_tricks import as_strided
        v = as_strided(a, shape=(4,), strides=(2**40,))
        try:
            x = cl.from_dlpack(v)
            print(cl.exp(x).tolist())
        except BufferError as e:
            print("refused", e)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused" in r.stdout and "buffer of 16 bytes" in r.stdout


def test_numpy_view_outside_its_buffer_refused():
    a = np.zeros(4)
    v = np.lib.stride_tricks.as_strided(a, shape=(3,), strides=(16,))  # bytes 0..40 of 32
    with pytest.raises(BufferError, match="reaches bytes"):
        from_dlpack(v)
    ok = np.lib.stride_tricks.as_strided(a, shape=(2,), strides=(16,))
    assert from_dlpack(ok).tolist() == [0.0, 0.0]
    b = np.frombuffer(bytearray(16), dtype=np.float32)
    bad = np.lib.stride_tricks.as_strided(b, shape=(5,), strides=(4,))
    with pytest.raises(BufferError, match="reaches bytes"):
        from_dlpack(bad)


def test_castlab_capsule_outside_its_storage_refused():
    x = castlab.zeros(4)
    cap = _C.to_dlpack(x, True)
    m = read_versioned(cap)
    m.dl_tensor.byte_offset = 64
    with pytest.raises(BufferError, match="castlab export"):
        _C.from_dlpack_capsule(cap)
    m.dl_tensor.byte_offset = 0
    assert _C.from_dlpack_capsule(cap).shape == (4,)


def test_negative_stride_export_to_torch_copies():
    # torch aborts the process on a negative stride: castlab hands it a copy.
    r = _run_child("""
        import numpy as np, torch, castlab as cl
        t = cl.from_numpy(np.arange(10.0)[::-1])
        u = torch.from_dlpack(t)
        assert u.tolist() == list(np.arange(10.0)[::-1]), u
        assert u.data_ptr() != t.data_ptr()
        v = torch.from_dlpack(cl.from_numpy(np.arange(12.0).reshape(3, 4)[::-1, ::2]))
        assert v.tolist() == [[8.0, 10.0], [4.0, 6.0], [0.0, 2.0]], v
        print("ok")
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"


def test_negative_stride_export_copy_argument():
    t = castlab.from_numpy(np.arange(10.0)[::-1])
    cap = t.__dlpack__(max_version=(1, 0))  # an older-protocol consumer: a copy
    assert read_versioned(cap).flags & IS_COPIED
    with pytest.raises(BufferError, match="negative strides"):
        t.__dlpack__(max_version=None, copy=False)  # legacy capsule: no copy allowed
    assert read_versioned(t.__dlpack__(max_version=(1, 0), copy=None)).flags & IS_COPIED == 0
    # NumPy takes negative strides: zero-copy (test_numpy_negative_strides)
    n = np.from_dlpack(t)
    assert n.__array_interface__["data"][0] == t.data_ptr()


def test_torch_neg_view_resolved():
    base = torch.arange(4.0)
    nv = torch._neg_view(base)
    assert nv.is_neg()
    assert from_dlpack(nv).tolist() == [-0.0, -1.0, -2.0, -3.0]
    assert castlab.asarray(nv).tolist() == [-0.0, -1.0, -2.0, -3.0]
    assert castlab.tensor(nv).tolist() == [-0.0, -1.0, -2.0, -3.0]
    with pytest.raises(BufferError, match="is_neg"):
        from_dlpack(nv, copy=False)
    assert from_dlpack(base, copy=False).data_ptr() == base.data_ptr()


def test_torch_region_import_and_export():
    """castlab.torch's batched crossing of one region's inputs and outputs: zero-copy for
    plain tensors (PyTorch's and a user's), a resolved copy for a lazily negated view, a
    copy for negative strides on the way out (PyTorch takes none); the torch tensors keep
    castlab's memory alive."""
    from castlab._dlpack import from_torch_region, to_torch_region

    a = torch.arange(6.0).reshape(2, 3)
    b = torch.ones(3, dtype=torch.bfloat16)
    nv = torch._neg_view(torch.arange(3.0))
    xs = from_torch_region([a, b, nv, a.t()], [True, True, False, True])
    assert xs[0].data_ptr() == a.data_ptr() and xs[1].data_ptr() == b.data_ptr()
    assert xs[2].tolist() == [-0.0, -1.0, -2.0]
    assert xs[3].shape == (3, 2) and xs[3]._strides == (1, 3)
    assert xs[3].data_ptr() == a.data_ptr()
    y = castlab.exp(xs[0])
    flipped = castlab.from_numpy(np.arange(4.0)[::-1])
    ta, ty, tf = to_torch_region([xs[0], y, flipped])
    assert ta.data_ptr() == a.data_ptr()
    assert ty.data_ptr() == y.data_ptr()
    del y
    assert ty.tolist() == torch.exp(a).tolist()
    assert tf.tolist() == [3.0, 2.0, 1.0, 0.0] and tf.data_ptr() != flipped.data_ptr()
