"""The CPU code generator: a program compiled as one fused C++ loop (ops/cpu/jit.h).

castlab's CPU executor interprets a program instruction by instruction over blocks of
512 elements. Where a C++ compiler is found at run time, a program over enough elements
is also compiled as one loop that keeps every value in registers, as Inductor's C++
backend does, from the same scalar functions and with the executor's flags: the same bits
(tests/test_cpu_jit.py), faster where an op's arithmetic and the memory traffic can
overlap (SwiGLU, RoPE).
"""

from __future__ import annotations

from typing import Any

from . import _C

_MODES = {"off": 0, "async": 1, "sync": 2}


def cpu_codegen(mode: str | None = None, min_elements: int | None = None,
                wait: bool = False) -> dict[str, Any]:
    """Configure the CPU code generator and return its status.

    mode: ``"async"`` (the default; also ``CASTLAB_CPU_CODEGEN``): a program's first
    calls run in the interpreter while a background thread compiles it, later calls run
    the compiled loop; ``"sync"``: compile before the call; ``"off"``: never compile.
    min_elements: programs writing fewer elements stay interpreted (default 262144, or
    ``CASTLAB_CPU_CODEGEN_MIN``). wait: return once nothing is queued or compiling.
    Results are the same bits whichever runs. The compiler is ``$CASTLAB_CXX``, else
    ``$CXX``, else ``c++``/``g++``/``clang++`` (flags may follow the name; the disk cache's
    key holds the whole command and its ``--version`` line); compiled libraries live in the
    kernel disk cache (``CASTLAB_CACHE_DIR``). Every compiler run (its ``--version`` check
    and each compile) is stopped after ``CASTLAB_CXX_TIMEOUT`` seconds (a positive number
    up to 86400, default 120; other values are ignored): then one warning goes to stderr, ``why_not`` says which run timed out, and the interpreter
    runs every program for the rest of the process, with the same bits. Programs that do
    not compile never wait for the compiler's check while another thread runs it.

    The status: ``mode``, ``min_elements``, ``compiler`` (its ``--version`` line),
    ``why_not`` (why nothing compiles, else ""), ``compiled``, ``disk_hits``,
    ``failures``, ``last_error`` (the log of the last failure), ``pending``, ``runs`` (executor calls that ran a compiled loop) and
    ``compile_seconds``.

    >>> import castlab as cl
    >>> cl.cpu_codegen()["mode"] in ("async", "sync", "off")
    True
    >>> old = cl.cpu_codegen()
    >>> cl.cpu_codegen("sync", min_elements=0)["min_elements"]
    0
    >>> _ = cl.cpu_codegen(old["mode"], old["min_elements"])
    """
    if mode is not None and (not isinstance(mode, str) or mode not in _MODES):
        raise ValueError(f"cpu_codegen: mode must be one of {sorted(_MODES)}, got {mode!r}")
    if min_elements is not None:
        if isinstance(min_elements, bool) or not isinstance(min_elements, int):
            raise TypeError("cpu_codegen: min_elements must be an int, got "
                            f"{type(min_elements).__name__}")
        if min_elements < 0:
            raise ValueError(f"cpu_codegen: min_elements must be >= 0, got {min_elements}")
    status = _C._cpu_codegen(_MODES[mode] if mode is not None else -1,
                             -1 if min_elements is None else min_elements)
    if wait:
        _C._cpu_codegen_wait()
        status = _C._cpu_codegen()
    return dict(status)
