"""A text progress bar for long runs (``castlab.study.run(progress=True)``) that suits
both a terminal and a log file.

On a terminal (a stream whose ``isatty()`` is true) the bar redraws itself in place with
``\\r`` and ends its line when it reaches ``n``. Anywhere else (a log file, a pipe, CI
output) a ``\\r`` would pile every update onto one line, so it writes whole lines
instead: at the start, each time another tenth of the work is done, and at the end.

>>> import io
>>> from castlab._progress import bar
>>> log = io.StringIO()
>>> for i in range(21):
...     bar(i, 20, f"job {i}", stream=log)
>>> lines = log.getvalue().splitlines()
>>> len(lines), lines[-1]
(11, '[############################] 20/20 job 20')
>>> "\\r" in log.getvalue()
False
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["bar", "is_tty"]

WIDTH = 28


def is_tty(stream: Any) -> bool:
    """Whether `stream` is an interactive terminal (False when it cannot tell)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def _render(i: int, n: int, label: str) -> str:
    fill = int(WIDTH * min(max(i, 0), n) / max(n, 1))
    return f"[{'#' * fill}{' ' * (WIDTH - fill)}] {i}/{n} {label}"


def bar(i: int, n: int, label: str = "", stream: Any = None, prev: int | None = None) -> None:
    """Show that `i` of `n` steps are done, the next being `label` (on ``sys.stderr`` by
    default). Call it with ``i = 0 .. n``; the call with ``i == n`` ends the line. `prev`:
    the `i` of the previous call, when the steps come in jumps (default ``i - 1``)."""
    stream = sys.stderr if stream is None else stream
    done = i >= n
    if is_tty(stream):
        stream.write(f"\r{_render(i, n, f'{label:<40.40}')}" + ("\n" if done else ""))
    else:
        tenth = (lambda k: (10 * k) // max(n, 1))
        if not (i <= 0 or done or tenth(i) != tenth(i - 1 if prev is None else prev)):
            return
        stream.write(_render(i, n, label).rstrip() + "\n")
    stream.flush()
