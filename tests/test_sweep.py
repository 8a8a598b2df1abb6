"""castlab.sweep: study cells on a Dask LocalCluster (2 CPU worker processes here)."""

from __future__ import annotations

import math

import pytest

from castlab.sweep import CellFailure, run_cells, worker_device

pytest.importorskip("distributed")


def test_in_process_and_on_two_workers_give_the_same_results():
    cells = list(range(20))
    serial = run_cells(cells, pow, args=(3,), workers=0)
    seen = []
    dask = run_cells(cells, pow, args=(3,), workers=2, on_result=lambda c, r: seen.append(c))
    assert serial == dask == [(c, c ** 3) for c in cells]
    assert sorted(seen) == cells and not dask.interrupted


def test_a_failing_cell_is_reported_and_the_others_kept():
    out = run_cells([4.0, -1.0, 9.0], math.sqrt, workers=2)
    assert [r for _, r in out if not isinstance(r, CellFailure)] == [2.0, 3.0]
    (bad,) = [r for _, r in out if isinstance(r, CellFailure)]
    assert bad.cell == -1.0 and "math domain error" in bad.error


def test_each_local_worker_gets_its_device():
    out = run_cells(list(range(8)), worker_device, workers=2, devices=["cuda:0", "cuda:1"])
    assert {r for _, r in out} <= {"cuda:0", "cuda:1"}
    assert worker_device("cpu") == "cpu"  # outside a worker: the default


@pytest.mark.slow  # ~10 s (Dask clusters)
def test_bad_arguments():
    with pytest.raises(ValueError, match="workers must be"):
        run_cells([1], pow, args=(2,), workers=-1)
    with pytest.raises(ConnectionError, match="cannot reach the Dask scheduler"):
        run_cells([1], pow, args=(2,), scheduler="tcp://127.0.0.1:9")
