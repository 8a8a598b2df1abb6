"""Devices: ``castlab.device`` (a type and an index), parsed in one place.

A leaf module (it imports nothing from castlab): the graph, the lowering, plans, creation
functions, ``Tensor.to`` and DLPack all carry a :class:`device` made by :func:`as_device`.
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["device", "as_device", "CPU"]

_SPEC = re.compile(r"(cpu|cuda)(?::(\d+))?")
_MAX_INDEX = 2**31 - 1  # CUDA device ordinals are C ints


class device:
    """Where a tensor lives: ``device('cpu')``, ``device('cuda')`` (= ``cuda:0``),
    ``device('cuda:1')``, ``device('cuda', 1)``; a ``torch.device`` or another device
    object is accepted too.

    >>> cl.device("cuda:1")
    device(type='cuda', index=1)
    >>> cl.device("cuda") == "cuda:0"
    True
    """

    __slots__ = ("type", "index")

    def __init__(self, spec: Any, index: int | None = None):
        if isinstance(spec, tuple) and index is None and len(spec) == 2:
            spec, index = spec
        if isinstance(spec, device):
            typ, idx = spec.type, spec.index
        elif isinstance(spec, str) or hasattr(spec, "type"):
            typ, idx = _parse(str(spec) if not isinstance(spec, str) else spec)
        else:
            raise TypeError(f"device must be a string ('cpu', 'cuda', 'cuda:N'), ('cuda', N) or a "
                            f"device object, got {type(spec).__name__} {spec!r}")
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(f"device index must be a non-negative integer, got "
                                f"{type(index).__name__} {index!r}")
            if index < 0 or index > _MAX_INDEX:
                raise ValueError(f"device index must be a non-negative integer below 2**31, "
                                 f"got {index!r}")
            if typ == "cpu" and index != 0:
                raise ValueError(f"cpu has no device {index}")
            if typ == "cuda" and idx is not None and idx != index:
                raise ValueError(f"device {spec!r} given with a different index {index}")
            idx = index if typ == "cuda" else None
        if typ == "cuda" and idx is None:
            idx = 0
        self.type, self.index = typ, idx

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"cuda:{self.index}"

    def __repr__(self) -> str:
        return f"device(type='{self.type}'" + (f", index={self.index})" if self.type == "cuda" else ")")

    def __eq__(self, other: object) -> bool:
        return str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))


@functools.lru_cache(maxsize=64)
def _parse(spec: str) -> tuple[str, int | None]:
    m = _SPEC.fullmatch(spec.strip())
    if m is None:
        raise ValueError(f"unknown device {spec!r} (expected 'cpu', 'cuda' or 'cuda:N' with "
                         "N a non-negative integer)")
    typ, idx = m.group(1), m.group(2)
    if typ == "cpu":
        if idx is not None and int(idx) != 0:
            raise ValueError(f"unknown device {spec!r}: cpu has no index other than 0")
        return "cpu", None
    if idx is not None and (len(idx) > 10 or int(idx) > _MAX_INDEX):
        raise ValueError(f"unknown device {spec!r}: the device index is out of range "
                         "(it must be below 2**31)")
    return "cuda", int(idx) if idx is not None else None  # bare "cuda": cuda:0 (or the index given)


@functools.lru_cache(maxsize=64)
def _from_str(spec: str) -> device:
    return device(spec)


def as_device(spec: Any) -> device:
    """The :class:`device` for ``spec`` (None means the CPU); TypeError for a wrong type,
    ValueError when malformed."""
    if spec is None:
        return CPU
    if isinstance(spec, device):
        return spec
    if isinstance(spec, str):
        return _from_str(spec)
    if isinstance(spec, int) and not isinstance(spec, bool):
        return device("cuda", spec)
    return device(spec)


CPU = device("cpu")
