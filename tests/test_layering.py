"""The package's layers (python/castlab/__init__.py) and the C++ tree's (core <- ops <-
python/src): nothing imports or includes a layer above its own, and no castlab import is
hidden inside a function to break a cycle."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "python" / "castlab"

# Module -> layer (python/castlab/__init__.py documents the order). Within a layer the
# arrows are listed in SAME_LAYER; everything else must point strictly downward.
LAYERS = {
    "_C": 0, "_debug": 0, "_progress": 0, "_dtype": 0, "_device": 0, "_optable": 0,
    "_torch_vml": 0, "_onednn": 0, "_cpu_codegen": 0,
    "_policy": 1, "policy": 1, "_graph": 1, "cuda": 1, "_runrecord": 1,
    "_lower_steps": 2, "_rounding": 2, "_lower_views": 2, "_schedule": 2, "_inductor_cpp": 2,
    "_torch_kernels": 2,
    "_lower_reduce": 2, "_lower_build": 2, "_lower": 2,
    "_dlpack": 3, "_creation": 3, "ops": 3, "_composite": 3, "_reduce": 3, "_index": 3,
    "_loss": 3,
    "_tensor": 4, "_autodiff": 4,
    "_listing": 5, "_warm": 5, "_jit": 5,
    "numerics": 6, "torch": 6, "_presets_norm": 6, "presets": 6, "sweep": 6,
    "_study_chains": 6, "_study_inputs": 6, "_study_cells": 6, "_study_rows": 6, "_study_library": 6, "study": 6, "_plot_draw": 6,
    "_plot_labels": 6, "plot": 6, "testing": 6, "_cli_parser": 6, "_cli_config": 6,
    "_cli_files": 6, "_cli_exhaustive": 6, "_cli_stacks": 6, "cli": 6,
    "__init__": 7, "__main__": 7,
}
# The order inside a layer (a module may import those listed before it).
SAME_LAYER = {
    0: ["_C", "_debug", "_progress", "_dtype", "_device", "_optable", "_torch_vml", "_onednn",
        "_cpu_codegen"],
    1: ["_policy", "policy", "_graph", "cuda", "_runrecord"],
    2: ["_lower_steps", "_rounding", "_lower_views", "_schedule", "_inductor_cpp", "_torch_kernels",
        "_lower_reduce", "_lower_build", "_lower"],
    3: ["_dlpack", "_creation", "ops", "_composite", "_reduce", "_index", "_loss"],
    4: ["_tensor", "_autodiff"],
    5: ["_listing", "_warm", "_jit"],
    6: ["numerics", "_presets_norm", "presets", "torch", "sweep", "_study_chains", "_study_inputs",
        "_study_cells",
        "_study_rows", "_study_library", "study", "_plot_draw", "_plot_labels", "plot", "testing",
        "_cli_parser", "_cli_config", "_cli_files", "_cli_exhaustive", "_cli_stacks", "cli"],
}


def _modules():
    for p in sorted(PKG.rglob("*.py")):
        yield p, p.relative_to(PKG).with_suffix("").parts


def _params():
    return [pytest.param(p, parts, id="/".join(parts)) for p, parts in _modules()]


def _top(parts: tuple) -> str:
    return parts[0]


def _targets(node: ast.AST, parts: tuple) -> list[str]:
    """castlab top-level modules an import statement refers to ([] for third-party)."""
    pkg_depth = len(parts) - 1  # a module in numerics/ has depth 1
    if isinstance(node, ast.Import):
        out = []
        for a in node.names:
            if a.name == "castlab" or a.name.startswith("castlab."):
                rest = a.name.split(".")[1:]
                out.append(rest[0] if rest else "__init__")
        return out
    assert isinstance(node, ast.ImportFrom)
    if node.level == 0:
        mod = node.module or ""
        if mod == "castlab":
            return [a.name for a in node.names]
        if mod.startswith("castlab."):
            return [mod.split(".")[1]]
        return []
    up = node.level - 1
    if up > pkg_depth:
        return []
    base = list(parts[:pkg_depth - up])  # the package the import is relative to
    if node.module:
        full = base + node.module.split(".")
        if not full:
            return []
        return [full[0]] if base else [node.module.split(".")[0]]
    if base:
        return [base[0]]
    return [a.name for a in node.names]


def _rank(mod: str) -> tuple[int, int]:
    layer = LAYERS[mod]
    order = SAME_LAYER.get(layer, [])
    return (layer, order.index(mod) if mod in order else 0)


def test_every_module_has_a_layer():
    missing = {_top(parts) for _, parts in _modules()} - set(LAYERS)
    assert not missing, f"add these modules to LAYERS (and to castlab/__init__.py): {missing}"


@pytest.mark.parametrize("path,parts", _params())
def test_imports_point_down(path, parts):
    me = _top(parts)
    tree = ast.parse(path.read_text(), str(path))
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for t in _targets(node, parts):
            if t == me:
                continue  # inside one subpackage (numerics/)
            if t not in LAYERS:
                bad.append(f"line {node.lineno}: unknown castlab module {t!r}")
            elif me not in ("__init__", "__main__") and _rank(t) >= _rank(me):
                bad.append(f"line {node.lineno}: {me} (layer {LAYERS[me]}) imports {t} "
                           f"(layer {LAYERS[t]})")
    assert not bad, f"{path.relative_to(ROOT)}:\n" + "\n".join(bad)


#: The one castlab module loaded when a function runs, and why: the CLI works without
#: torch, and only `castlab stacks` needs castlab.torch (which needs torch).
OPTIONAL_IMPORTS = {("_cli_stacks", "castlab.torch")}


def _import_module_target(node: ast.AST) -> str | None:
    """The module an ``importlib.import_module("...")`` call names (None: not such a call)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


@pytest.mark.parametrize("path,parts", _params())
def test_no_castlab_import_inside_functions(path, parts):
    tree = ast.parse(path.read_text(), str(path))
    bad = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and (
                    _targets(node, parts) or (isinstance(node, ast.ImportFrom) and node.level)):
                bad.append(f"line {node.lineno} in {fn.name}()")
            t = _import_module_target(node)   # importlib counts too, unless declared
            if t and t.split(".")[0] == "castlab" and (path.stem, t) not in OPTIONAL_IMPORTS:
                bad.append(f"line {node.lineno} in {fn.name}(): import_module({t!r})")
    assert not bad, f"{path.relative_to(ROOT)} imports castlab modules in functions: {bad}"


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


@pytest.mark.parametrize("tree,forbidden", [("core", ("ops/", "python/")),
                                            ("ops", ("python/",))])
def test_cpp_includes_point_down(tree, forbidden):
    bad = []
    for p in sorted((ROOT / tree).rglob("*")):
        if p.suffix not in (".h", ".cpp", ".cuh"):
            continue
        for inc in _INCLUDE.findall(p.read_text()):
            if inc.startswith(forbidden) or "pybind11" in inc:
                bad.append(f"{p.relative_to(ROOT)} includes {inc}")
        if p.suffix in (".h", ".cpp") and re.search(r"#\s*include\s+<pybind11", p.read_text()):
            bad.append(f"{p.relative_to(ROOT)} includes pybind11")
    assert not bad, "\n".join(bad)


# The backends (issue 51): ops/cpu and ops/cuda never include each other; code generation
# they share lives in ops/codegen, which includes neither; the device-neutral ops/*.h and
# ops/*.cpp (the runtime, row steps, reduce, index, loss...) reach CUDA only through its
# registered backend record (ops/backend.h), never by including ops/cuda or calling cuda::.
_BACKEND_RULES = [("ops/cpu", ("ops/cuda/",)), ("ops/cuda", ("ops/cpu/",)),
                  ("ops/codegen", ("ops/cpu/", "ops/cuda/")), ("ops", ("ops/cuda/",))]


def _cpp_files(folder: str, recursive: bool):
    base = ROOT / folder
    files = base.rglob("*") if recursive else base.glob("*")
    return [p for p in sorted(files) if p.suffix in (".h", ".cpp", ".cuh")]


@pytest.mark.parametrize("folder,forbidden", _BACKEND_RULES,
                         ids=[f"{f}-not-{'-'.join(x.strip('/') for x in b)}"
                              for f, b in _BACKEND_RULES])
def test_backends_do_not_include_each_other(folder, forbidden):
    files = _cpp_files(folder, recursive=False)
    assert files, folder
    bad = [f"{p.relative_to(ROOT)} includes {inc}" for p in files
           for inc in _INCLUDE.findall(p.read_text()) if inc.startswith(forbidden)]
    assert not bad, "\n".join(bad)


def test_device_neutral_ops_call_no_cuda_functions():
    """ops/*.cpp reach a device through device_backend() (ops/backend.h), not cuda::."""
    bad = []
    for p in _cpp_files("ops", recursive=False):
        if p.suffix != ".cpp":
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("//")[0]
            if re.search(r"\bcuda::", code):
                bad.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_device_neutral_headers_declare_nothing_of_cuda():
    """ops/*.h and ops/*.cpp open no `namespace cuda` and the headers name no cuda::
    function or type: CUDA's declarations live in ops/cuda/ (ops/cuda/kernels.h for the
    kernels of the device-neutral steps), so a device-neutral header is the same whatever
    backends are built."""
    bad = []
    for p in _cpp_files("ops", recursive=False):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("//")[0]
            if re.search(r"\bnamespace\s+cuda\b", code) or (
                    p.suffix == ".h" and re.search(r"\bcuda::", code)):
                bad.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_ops_modules_form_no_include_cycle():
    """A module (x.h with x.cpp) of ops/ never includes, directly or not, a module that
    includes it (the runtime and the row steps did: runtime.h <-> row_step.cpp)."""
    graph: dict[str, set[str]] = {}
    for p in _cpp_files("ops", recursive=True):
        me = str(p.relative_to(ROOT).with_suffix(""))
        for inc in _INCLUDE.findall(p.read_text()):
            dep = str(pathlib.PurePosixPath(inc).with_suffix(""))
            if dep != me and inc.startswith("ops/"):
                graph.setdefault(me, set()).add(dep)
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]):
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


# Sizes the next contributor can read (issue 51): no module over 800 lines, no function
# over 120 (docstrings and signatures included).
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 800, 120


def test_modules_and_functions_stay_small():
    big = []
    for p, _parts in _modules():
        text = p.read_text()
        n = text.count("\n")
        if n > MAX_MODULE_LINES:
            big.append(f"{p.relative_to(ROOT)}: {n} lines")
        for fn in ast.walk(ast.parse(text, str(p))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = fn.end_lineno - fn.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    big.append(f"{p.relative_to(ROOT)}:{fn.lineno} {fn.name}: {length} lines")
    assert not big, "split these (by concern, into named helpers):\n" + "\n".join(big)
