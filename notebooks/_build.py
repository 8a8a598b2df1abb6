"""Writes the notebooks from the cell sources in _cells.py and, with --execute, runs them.

    python notebooks/_build.py --execute          # every notebook, written with outputs
    python notebooks/_build.py --execute 02 06    # only the notebooks whose name has 02 or 06
    python notebooks/_build.py                    # sources only, outputs stripped

The notebooks are committed *with* their outputs (executed on the CPU), so that a reader
browsing the repository sees the results. Edit _cells.py, never the .ipynb files:
tests/test_notebooks.py checks that each committed notebook's sources equal _cells.py's
and that it has outputs, and re-executes every notebook (its cells assert the key numbers).

The kernel needs castlab importable: export PYTHONPATH=/abs/path/to/python first.
Rebuilding gives a stable diff: cell ids are numbered, execution timestamps are not
recorded, the notebook metadata keeps only the kernel and the language name, and the
notebooks seed every random draw. Outputs that still move between machines (bf16 GEMMs
on CPUs with other instruction sets) change numbers, never the asserted conclusions.
"""

import argparse
import importlib.util
import os
import re
import sys
import time
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
# Output text that would differ between two runs or two machines: object addresses, the
# absolute paths of the checkout or of site-packages.
VOLATILE = re.compile(r"\bat 0x[0-9a-fA-F]{6,}|site-packages|/tmp/|"
                      + re.escape(str(HERE.resolve().parent)))


def sources(cells: list) -> list:
    """[(cell type, source)] as the notebook stores them."""
    return [("markdown" if kind == "md" else "code", src.strip("\n")) for kind, src in cells]


def notebook(name: str, cells: list):
    nb = nbf.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    stem = name.split("_")[0]
    for i, (kind, src) in enumerate(sources(cells)):
        cell = nbf.v4.new_markdown_cell(src) if kind == "markdown" else nbf.v4.new_code_cell(src)
        cell.id = f"nb{stem}-{i:02d}"          # stable ids (nbformat draws random ones)
        nb.cells.append(cell)
    return nb


def execute(nb, timeout: int = 600) -> None:
    """Runs `nb` in a fresh python3 kernel with the notebooks folder as working directory."""
    import nbclient

    os.environ.setdefault("PYTHONHASHSEED", "0")
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     record_timing=False,
                                     resources={"metadata": {"path": str(HERE)}})
    client.execute()


def coalesce_streams(outputs: list) -> list:
    """Joins consecutive stdout (or stderr) outputs: where the kernel splits a cell's
    printing into several messages depends on timing, the joined text does not."""
    merged = []
    for out in outputs:
        if (out.get("output_type") == "stream" and merged
                and merged[-1].get("output_type") == "stream" and merged[-1].name == out.name):
            merged[-1].text += out.text
        else:
            merged.append(out)
    return merged


def clean(nb) -> list:
    """Drops the metadata an execution adds and returns the volatile output lines left."""
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    bad = []
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)
        for out in cell.get("outputs", []):
            out.get("metadata", {}).pop("execution", None)
            texts = [out.get("text", "")] + [out.get("data", {}).get(k, "")
                                             for k in ("text/plain", "text/html")]
            for t in texts:
                t = "".join(t) if isinstance(t, list) else t
                bad += [f"{cell.id}: {ln.strip()[:120]}" for ln in t.splitlines()
                        if VOLATILE.search(ln)]
    return bad


def main(argv=None) -> int:
    from _cells import NOTEBOOKS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--execute", action="store_true", help="run each notebook and save its outputs")
    ap.add_argument("only", nargs="*", help="build only the notebooks whose name contains one of these")
    args = ap.parse_args(argv)
    if args.execute and importlib.util.find_spec("castlab") is None:
        print("castlab is not importable: export PYTHONPATH=/abs/path/to/python", file=sys.stderr)
        return 2
    rc = 0
    for name, cells in NOTEBOOKS.items():
        if args.only and not any(s in name for s in args.only):
            continue
        nb = notebook(name, cells)
        if args.execute:
            t0 = time.perf_counter()
            execute(nb)
            bad = clean(nb)
            print(f"executed {name} in {time.perf_counter() - t0:.1f} s")
            for line in bad:
                print(f"  volatile output in {name}, cell {line}", file=sys.stderr)
            rc |= bool(bad)
        nbf.write(nb, HERE / name)
        print("wrote", name)
    if not args.execute:
        print("note: written without outputs; CI expects executed notebooks "
              "(python notebooks/_build.py --execute)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
