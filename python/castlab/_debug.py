"""CASTLAB_DEBUG: one levelled setting, read here and nowhere else.

0 (or unset): quiet. 1: print each trace listing when a graph is lowered. 2: also the
Programs it lowered to. 3: also the generated CUDA source of each kernel. 4: also the
NVRTC log and PTX of each kernel compiled. Everything goes to stderr. C++ prints levels
3 and 4 and learns the level from :func:`level` (``_C._set_debug_level``); it never reads
the environment itself.
"""

from __future__ import annotations

import os

from . import _C

_override: int | None = None
_sent: int | None = None


def _parse(v: str) -> int:
    v = v.strip()
    if not v:
        return 0
    try:
        return max(0, int(v))
    except ValueError:
        return 1  # any other non-empty value (CASTLAB_DEBUG=yes) turns traces on


def level() -> int:
    """The debug level: :func:`set_level`'s value, else CASTLAB_DEBUG (read on each call).
    Passes a changed level on to C++."""
    global _sent
    lv = _override if _override is not None else _parse(os.environ.get("CASTLAB_DEBUG", ""))
    if lv != _sent:
        _C._set_debug_level(lv)
        _sent = lv
    return lv


def set_level(lv: int | None) -> None:
    """Set the level for this process (None: follow CASTLAB_DEBUG again)."""
    global _override
    _override = None if lv is None else int(lv)
    level()
