"""castlab.device: one parser (python/castlab/_device.py, and core's Device::parse for
strings reaching C++)."""

from __future__ import annotations

import pytest

import castlab as cl
from castlab import _C


@pytest.mark.parametrize("spec", ["cudax", "cuda:-1", "cuda:x", "tpu", "cuda:", "cuda:1:2",
                                  "CPU", "cpu:1", " cuda:1x", "", "cuda:+1"])
def test_malformed_devices_raise(spec):
    with pytest.raises(ValueError, match="device"):
        cl.device(spec)
    with pytest.raises(ValueError, match="device"):
        cl.zeros(2, device=spec)


@pytest.mark.parametrize("spec", ["cudax", "cuda:-1", "cuda:x", "tpu", "cuda:"])
def test_cpp_parser_rejects_malformed(spec):
    with pytest.raises(ValueError, match="device"):
        _C.empty([2], "float32", spec)


@pytest.mark.parametrize("spec,want", [
    ("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:0", "cuda:0"), ("cuda:3", "cuda:3"),
    (("cuda", 2), "cuda:2"), (("cpu", 0), "cpu"), (cl.device("cuda:1"), "cuda:1"),
])
def test_device_forms(spec, want):
    d = cl.device(spec)
    assert str(d) == want and d == want and hash(d) == hash(cl.device(want))
    assert d.type == want.split(":")[0]
    assert d.index == (None if want == "cpu" else int(want[5:]))


def test_device_with_index_and_torch():
    assert cl.device("cuda", 1) == "cuda:1"
    assert repr(cl.device("cuda", 1)) == "device(type='cuda', index=1)"
    with pytest.raises(ValueError):
        cl.device("cuda:0", 1)
    torch = pytest.importorskip("torch")
    assert cl.device(torch.device("cuda", 1)) == "cuda:1"
    assert cl.device(torch.device("cpu")) == "cpu"


def test_tensor_device_is_a_device():
    t = cl.zeros(2)
    assert isinstance(t.device, cl.device) and t.device == "cpu" and t.device.type == "cpu"
    assert t.to("cpu") is t
    with pytest.raises(ValueError, match="device"):
        t.to("cuda:x")


def test_lowering_carries_the_graph_device():
    from castlab._lower import Lowering
    from castlab.policy import Math, Policy

    low = Lowering(Policy.eager(), Math(), "cuda:1", [])
    assert low.device == cl.device("cuda:1") and low.cuda
    low = Lowering(Policy.eager(), Math(), None, [])
    assert low.device == "cpu" and not low.cuda
