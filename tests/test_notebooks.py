"""The notebooks: committed with outputs, their sources equal notebooks/_cells.py's, and
every one runs top to bottom (its cells assert the key numbers it prints).

Rebuild after editing _cells.py: PYTHONPATH=$PWD/python python notebooks/_build.py --execute
"""

import copy
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NB_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
REBUILD = "edit notebooks/_cells.py and run `python notebooks/_build.py --execute`"
# Notebooks without a plot.
NO_PLOTS = {"03_torch_interop.ipynb"}


def _build():
    sys.path.insert(0, str(NB_DIR))
    try:
        import _build
        import _cells
    finally:
        sys.path.remove(str(NB_DIR))
    return _build, _cells


def _images(nb) -> int:
    return sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if "image/png" in o.get("data", {}))


def test_all_notebooks_present():
    names = {p.name for p in NOTEBOOKS}
    _, cells = _build()
    assert names == set(cells.NOTEBOOKS), f"notebooks/*.ipynb and _cells.NOTEBOOKS differ; {REBUILD}"
    assert {"01_bf16_rounding.ipynb", "02_eager_vs_fused.ipynb", "03_torch_interop.ipynb",
            "04_ab_study.ipynb", "05_training_gradients.ipynb",
            "06_attribution.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_matches_cells_and_has_outputs(path):
    build, cells = _build()
    nb = nbformat.read(path, as_version=4)
    got = [(c.cell_type, c.source) for c in nb.cells]
    assert got == build.sources(cells.NOTEBOOKS[path.name]), \
        f"{path.name} differs from notebooks/_cells.py (hand-edited?); {REBUILD}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), \
        f"{path.name} is not saved executed top to bottom in one run; {REBUILD}"
    assert sum(bool(c.outputs) for c in code) >= len(code) // 2, f"{path.name} has no outputs; {REBUILD}"
    errors = [c.id for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: cells {errors} were saved with an error"
    if path.name not in NO_PLOTS:
        assert _images(nb) >= 1, f"{path.name}: its plots are not saved; {REBUILD}"
    assert build.clean(copy.deepcopy(nb)) == [], \
        f"{path.name}: outputs that change from run to run (addresses, paths)"


@pytest.mark.slow  # a Jupyter kernel each: 3-15 s
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()
    if path.name not in NO_PLOTS:
        assert _images(nb) >= 1, "plots should render"
