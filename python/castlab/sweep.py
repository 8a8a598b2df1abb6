"""Sweeps beyond one process: the cells of a study grid on a Dask ``distributed`` cluster.

A study grid is embarrassingly parallel. :func:`run_cells` sends each cell to a Dask
worker (a ``LocalCluster`` of `workers` processes, one per local GPU when there are GPUs,
or an existing cluster at `scheduler`), streams the results back as they finish, retries
a failed cell once and reports it if it fails again, and on Ctrl-C keeps every finished
cell. No scheduler of castlab's own: Dask does the scheduling.

>>> from castlab.sweep import run_cells
>>> run_cells([1, 2, 3], pow, args=(2,), workers=0)    # workers=0: in this process
[(1, 1), (2, 4), (3, 9)]
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["run_cells", "CellFailure", "worker_device"]

#: Environment variable a worker reads for its device (set per worker by run_cells).
DEVICE_ENV = "CASTLAB_WORKER_DEVICE"


class CellFailure:
    """A cell that failed twice (the first attempt and Dask's one retry)."""

    def __init__(self, cell: Any, error: str):
        self.cell = cell
        self.error = error

    def __repr__(self) -> str:
        return f"CellFailure({self.cell!r}: {self.error})"


def worker_device(default: str | None = None) -> str | None:
    """The device this worker was given ("cuda:1", ...), or `default`. Inside a Dask
    worker started by :func:`run_cells` on GPUs, each worker has its own GPU."""
    try:
        from distributed import get_worker

        w = get_worker()
        dev = w.plugins.get("castlab-device")
        if dev is not None:
            return dev.device
    except (ImportError, ValueError):
        pass
    return os.environ.get(DEVICE_ENV, default)


def _device_plugin(devices: list):
    """A Dask WorkerPlugin giving the k-th worker of a LocalCluster devices[k]."""
    from distributed import WorkerPlugin

    class DevicePlugin(WorkerPlugin):
        name = "castlab-device"

        def __init__(self, devices: list):
            self.devices = devices
            self.device = None

        def setup(self, worker):
            try:
                k = int(worker.name)
            except (TypeError, ValueError):
                k = 0
            self.device = self.devices[k % len(self.devices)]

    return DevicePlugin(devices)


def _call(fn, cell, args):
    return fn(cell, *args)


def run_cells(cells: Sequence, fn: Callable, *, args: tuple = (), workers: int | None = None,
              scheduler: str | None = None, devices: Sequence[str] | None = None,
              on_result: Callable | None = None, retries: int = 1) -> list:
    """Run ``fn(cell, *args)`` for every cell; returns ``[(cell, result), ...]`` in the
    order the cells were given (a :class:`CellFailure` as the result of a cell that failed
    after its retries).

    workers: 0 runs in this process (no Dask); N > 0 starts a Dask ``LocalCluster`` of N
        worker processes (one thread each); None: one per entry of `devices`.
    scheduler: the address of an existing Dask scheduler ("tcp://host:8786"); its
        workers run the cells (they must be able to import castlab and `fn`).
    devices: the devices the local workers get, one each ("cuda:0", "cuda:1"); a cell
        reads its worker's with :func:`worker_device`.
    on_result: called as ``on_result(cell, result)`` as each cell finishes (progress,
        incremental saving); results stream back in completion order.
    On KeyboardInterrupt the pending cells are cancelled, the cluster is closed and the
    finished cells are returned (the interrupt is then raised again by the caller's
    choice: the returned list has an ``interrupted`` attribute set to True).
    """
    cells = list(cells)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 0):
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    if workers == 0 and scheduler is None:
        out = _Results()
        try:
            for c in cells:
                try:
                    r = fn(c, *args)
                except Exception as e:  # noqa: BLE001 - reported as the cell's result
                    r = CellFailure(c, f"{type(e).__name__}: {e}")
                out.append((c, r))
                if on_result is not None:
                    on_result(c, r)
        except KeyboardInterrupt:
            out.interrupted = True
        return out
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ImportError("castlab sweeps run on Dask: pip install 'castlab[dask]' "
                          "(or 'dask[distributed]')") from None
    devices = list(devices or [])
    cluster = None
    try:
        if scheduler is not None:
            try:
                client = Client(scheduler, timeout="10s")
            except (OSError, TimeoutError) as e:
                raise ConnectionError(f"cannot reach the Dask scheduler at {scheduler}: {e}") \
                    from None
        else:
            n = workers if workers is not None else max(1, len(devices))
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.CRITICAL)
            client = Client(cluster)
            if devices:
                client.register_plugin(_device_plugin(devices))
        return _gather(client, cells, fn, args, on_result, retries, as_completed)
    finally:
        if cluster is not None:
            try:
                client.close()
            finally:
                cluster.close()
        elif scheduler is not None and "client" in locals():
            client.close()


class _Results(list):
    interrupted = False


def _gather(client, cells, fn, args, on_result, retries, as_completed) -> list:
    futures = [client.submit(_call, fn, c, args, pure=False, retries=retries) for c in cells]
    index = {f.key: i for i, f in enumerate(futures)}
    done: dict = {}
    out = _Results()
    try:
        for fut in as_completed(futures):
            i = index[fut.key]
            if fut.status == "error":
                exc = fut.exception()
                r = CellFailure(cells[i], f"{type(exc).__name__}: {exc}")
            else:
                r = fut.result()
            done[i] = r
            if on_result is not None:
                on_result(cells[i], r)
    except KeyboardInterrupt:
        out.interrupted = True
        for f in futures:
            f.cancel()
    out.extend((cells[i], done[i]) for i in sorted(done))
    return out
