"""Argument validation of creation functions, devices, dtypes, Tensor.to, DLPack and
castlab.cuda: TypeError for a wrong type, ValueError for a bad value, messages naming the
argument."""

import numpy as np
import pytest

import castlab as cl

NO_GPU = not cl.cuda.is_available()


@pytest.mark.parametrize("fn", [cl.empty, cl.zeros, cl.ones, cl.rand, cl.randn])
@pytest.mark.parametrize("dev", [1.5, [1], object()])
def test_creation_device_wrong_type(fn, dev):
    with pytest.raises(TypeError, match="(?i)device"):
        fn(2, device=dev)


@pytest.mark.parametrize("spec", [None, 3.5, [1], b"cpu"])
def test_device_wrong_type(spec):
    with pytest.raises(TypeError, match="(?i)device"):
        cl.device(spec)


@pytest.mark.parametrize("spec", ["cuda:99999999999999999999", "cuda:2147483648", "tpu", "",
                                  "cuda:0x", "cpu:1"])
def test_device_bad_value(spec):
    with pytest.raises(ValueError, match="(?i)device"):
        cl.device(spec)


def test_device_index_argument():
    assert cl.device("cuda", 3) == "cuda:3"
    assert cl.device("cuda:2147483647").index == 2**31 - 1
    with pytest.raises(TypeError, match="index"):
        cl.device("cuda", 1.5)
    with pytest.raises(ValueError, match="index"):
        cl.device("cuda", -1)
    with pytest.raises(ValueError, match="index"):
        cl.device("cuda", 2**40)
    assert cl.zeros(1, device=None).device == "cpu"


@pytest.mark.parametrize("fn", [cl.rand, cl.randn])
@pytest.mark.parametrize("seed", [1.0, "1", None, True])
def test_seed_wrong_type(fn, seed):
    with pytest.raises(TypeError, match="seed"):
        fn(2, seed=seed)


@pytest.mark.parametrize("fn", [cl.rand, cl.randn])
def test_seed_values(fn):
    with pytest.raises(ValueError, match="seed"):
        fn(2, seed=-1)
    with pytest.raises(ValueError, match="seed"):
        fn(2, seed=2**64)
    assert fn(3, seed=np.int64(5)).tolist() == fn(3, seed=5).tolist()
    assert fn(3, seed=2**64 - 1).shape == (3,)


@pytest.mark.parametrize("value", ["a", None, 1 + 2j, [1.0], b"x"])
def test_full_fill_value_type(value):
    with pytest.raises(TypeError, match="fill value must be a number"):
        cl.full((2,), value)
    with pytest.raises(TypeError, match="fill value must be a number"):
        cl.full_like(cl.zeros(2), value)


def test_full_accepts_numbers():
    assert cl.full((2,), np.float32(1.5)).tolist() == [1.5, 1.5]
    assert cl.full((2,), np.int32(3), dtype=cl.int32).tolist() == [3, 3]
    assert cl.full((1,), True).tolist() == [True]
    assert cl.full((2,), cl.tensor(2.5)).tolist() == [2.5, 2.5]
    assert cl.full_like(cl.zeros(2, dtype=cl.int64), 4).tolist() == [4, 4]


@pytest.mark.parametrize("fn", [cl.empty_like, cl.zeros_like, cl.ones_like])
@pytest.mark.parametrize("arg", [None, [1, 2], np.zeros(2)])
def test_like_needs_a_tensor(fn, arg):
    with pytest.raises(TypeError, match="expected a castlab Tensor"):
        fn(arg)
    with pytest.raises(TypeError, match="expected a castlab Tensor"):
        cl.full_like(arg, 1.0)


@pytest.mark.parametrize("args", [(0, float("inf")), (float("-inf"), 0), (0, 1, float("nan")),
                                  (float("nan"),)])
def test_arange_non_finite(args):
    with pytest.raises(ValueError, match="(?i)finite"):
        cl.arange(*args)


@pytest.mark.parametrize("args", [(2**63,), (0, 2**70, 1), (-(2**63), 2**63 - 1), (0, 1e30)])
def test_arange_huge(args):
    with pytest.raises(ValueError, match="too large"):
        cl.arange(*args)


def test_arange_types_and_values():
    with pytest.raises(TypeError, match="number"):
        cl.arange("a")
    with pytest.raises(TypeError, match="step"):
        cl.arange(0, 3, None)
    assert cl.arange(np.int64(3)).tolist() == [0, 1, 2]
    assert cl.arange(5, 0, -2).tolist() == [5, 3, 1]
    with pytest.raises(ValueError, match="int64"):
        cl.arange(0, 2**70, 2**69)
    assert cl.arange(2**63 - 2, 2**63 - 1).tolist() == [2**63 - 2]
    assert cl.arange(0, 1, 0.25).tolist() == [0.0, 0.25, 0.5, 0.75]
    assert cl.arange(0).shape == (0,)


@pytest.mark.parametrize("copy", ["yes", 1, 0.0])
def test_from_dlpack_copy_type(copy):
    with pytest.raises(TypeError, match="copy"):
        cl.from_dlpack(np.arange(3.0), copy=copy)


def test_from_dlpack_copy_values():
    a = np.arange(3.0)
    assert cl.from_dlpack(a, copy=np.bool_(True)).tolist() == [0.0, 1.0, 2.0]
    assert cl.from_dlpack(a, copy=False).data_ptr() == a.ctypes.data


def test_to_argument_kinds():
    t = cl.zeros(2)
    with pytest.raises(ValueError, match="(?i)device"):
        t.to("tpu")
    with pytest.raises(ValueError, match="(?i)device"):
        t.to("cudax")
    with pytest.raises(TypeError, match="(?i)device"):
        t.to([1])
    with pytest.raises(TypeError, match="(?i)device"):
        t.to(device=1.5)
    with pytest.raises(TypeError):
        t.to("cpu", cl.float16, "x")
    assert t.to("float16").dtype == cl.float16
    assert t.to("bf16").dtype == cl.bfloat16
    assert t.to(np.float64).dtype == cl.float64
    assert t.to(np.dtype("int32")).dtype == cl.int32
    assert t.to(int).dtype == cl.int64
    assert t.to("cpu", "float64").dtype == cl.float64
    assert t.to(cl.device("cpu")).device == "cpu"


def test_promote_types_names():
    assert cl.promote_types("bfloat16", "float16") == cl.float32
    assert cl.promote_types(cl.int32, "bool") == cl.int32
    for bad in ("nope", "float33", [1]):
        with pytest.raises((TypeError, ValueError), match="(?i)dtype"):
            cl.promote_types(cl.float32, bad)


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without a usable GPU")
def test_cuda_calls_without_gpu_raise():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        cl.cuda.synchronize()
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        cl.cuda.synchronize("cuda:0")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        cl.cuda.memory_stats(0)
    # a malformed device is still reported as such
    with pytest.raises(ValueError, match="index"):
        cl.cuda.memory_stats(-1)
    with pytest.raises(ValueError, match="CUDA device"):
        cl.cuda.synchronize("cpu")
    assert cl.cuda.empty_cache() is None


@pytest.mark.skipif(NO_GPU, reason="no CUDA GPU for castlab")
def test_cuda_calls_with_gpu():
    cl.cuda.synchronize()
    assert "allocated_bytes" in cl.cuda.memory_stats(0)
