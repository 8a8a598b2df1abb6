"""Writes the notebooks from the cell sources below (outputs stripped).

Run `python notebooks/_build.py` after editing; CI executes the .ipynb files.
"""

import sys
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


def build(name: str, cells: list) -> None:
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, src in cells:
        src = src.strip("\n")
        nb.cells.append(nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src))
    nbf.write(nb, HERE / name)


if __name__ == "__main__":
    from _cells import NOTEBOOKS

    for name, cells in NOTEBOOKS.items():
        build(name, cells)
        print("wrote", name)
