"""Every code block of README.md runs as written, in a fresh interpreter, and prints what the
README shows after it.

How the README is written (and what this file checks):

* A ```python block is a complete program. It runs as a file of its own in a new ``python``
  process (the castlab these tests imported: the installed package in CI), in a new empty
  folder. Its standard output must match the ```text block that follows it (only blank
  lines between); a block that prints nothing has no ```text block after it.
* A ```sh block runs in ``bash -e -o pipefail`` in such a folder, where ``castlab`` and
  ``python`` are that castlab and interpreter. Its standard output and standard error
  together (what a terminal shows; castlab's errors, warnings and progress go to standard
  error) must match the ```text block that follows it.
* Matching: lines are compared without trailing whitespace, and trailing blank lines are
  ignored. A line that is only ``...`` matches any number of lines (none included); ``...``
  inside a line matches any text in that line. Use them only for what varies between
  machines or runs (timings, a version suffix, PyTorch's matmul kernels), or to leave out
  a long table.
* Markers: HTML comments on the lines right before a block.
  ``<!-- file: PATH -->``: the block (python, toml, json, ...) is also written to PATH in the
  folder of every block before it runs (so a shell block can use ``study.toml``); a python
  block with a file marker runs from that file, so its traces name it.
  ``<!-- needs torch -->`` / ``<!-- needs transformers -->``: skipped when that module
  cannot be imported (transformers implies torch). ``<!-- gpu -->``: marked ``cuda`` (so
  ``scripts/gpu_check.sh`` runs it) and skipped without a CUDA GPU. ``<!-- skip: REASON
  -->``: not run.
  ``<!-- slow -->``: marked ``slow`` (over ~5 s: left out of CONTRIBUTING.md's fast loop;
  CI runs it).
  ``<!-- main-command -->`` and ``<!-- test-command -->`` mark the install command and CI's
  test command (``.ci/run`` runs the latter); they are checked for form, not run here.
* A block without a language (```) is literal text (a command shown but not run: a long
  one, or one that installs); ```text blocks after no code block are literal too. Any other
  language fails ``test_every_block_is_accounted_for``.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import pathlib
import re
import stat
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

import castlab as cl

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# The folder castlab was imported from (the installed package in CI, python/ in a
# development build): children import the same castlab.
PKG = os.path.dirname(os.path.dirname(os.path.abspath(cl.__file__)))
TIMEOUT = 300

RUN_LANGS = {"python", "sh"}
LITERAL_LANGS = {"", "text", "toml", "json"}


@dataclass
class Block:
    index: int          # position among the README's fenced blocks
    line: int           # 1-based line of the opening fence
    lang: str
    code: str
    markers: dict = field(default_factory=dict)
    expected: str | None = None   # the ```text block that follows, if any

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.lang}"


_FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*(/?[\w-]+)(?:\s*:\s*|\s+|)(.*?)\s*-->")


def _blocks(text: str) -> list[Block]:
    blocks, ends = [], []
    for i, m in enumerate(_FENCE.finditer(text)):
        before = text[:m.start()].rstrip("\n").split("\n")
        markers = {}
        for ln in reversed(before):           # the comment lines right before the fence
            mm = _MARKER.fullmatch(ln.strip())
            if not mm:
                break
            markers[mm.group(1)] = mm.group(2) or ""
        blocks.append(Block(i, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                            markers))
        ends.append((m.start(), m.end()))
    # a ```text block directly after a code block (blank lines between) is its output
    for k in range(len(blocks) - 1):
        a, b = blocks[k], blocks[k + 1]
        if a.lang in RUN_LANGS and b.lang == "text" and not text[ends[k][1]:ends[k + 1][0]].strip():
            a.expected = b.code
    return blocks


BLOCKS = _blocks(README)
RUN = [b for b in BLOCKS if b.lang in RUN_LANGS]
FILES = {b.markers["file"]: b.code for b in BLOCKS if "file" in b.markers}


def _match_line(expected: str, actual: str) -> bool:
    if "..." not in expected:
        return expected == actual
    pattern = ".*".join(re.escape(p) for p in expected.split("..."))
    return re.fullmatch(pattern, actual) is not None


def _match(expected: list[str], actual: list[str]) -> bool:
    """expected against actual, `...` lines matching any number of lines."""
    memo: dict = {}

    def go(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i == len(expected):
                r = j == len(actual)
            elif expected[i] == "...":
                r = any(go(i + 1, k) for k in range(j, len(actual) + 1))
            else:
                r = j < len(actual) and _match_line(expected[i], actual[j]) and go(i + 1, j + 1)
            memo[i, j] = r
        return memo[i, j]

    return go(0, 0)


def _lines(s: str) -> list[str]:
    out = [ln.rstrip() for ln in s.replace("\r\n", "\n").split("\n")]
    while out and not out[-1]:
        out.pop()
    return out


def _skip_reason(b: Block) -> str | None:
    m = b.markers
    if "skip" in m:
        return m["skip"] or "marked skip"
    needs = {"torch": ["torch"], "transformers": ["torch", "transformers"]}.get(m.get("needs"), [])
    for mod in needs:
        if importlib.util.find_spec(mod) is None:
            return f"needs {mod}, which is not installed"
    if "gpu" in m and not cl.cuda.is_available():
        return "needs a CUDA GPU"
    # scripts/sanitize_check.sh leaves the command line (as it does tests/test_study.py)
    # and Hugging Face models to the plain suite, to keep .ci/run inside its time
    if os.environ.get("CASTLAB_SANITIZE_RUN") and (b.lang == "sh" or m.get("needs") == "transformers"):
        return "left to the plain suite under the sanitizers (scripts/sanitize_check.sh)"
    return None


def _prepare(folder: pathlib.Path) -> dict:
    """Write the README's file blocks and the `castlab`/`python` shims; return the env."""
    for name, code in FILES.items():
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(code)
    bin_dir = folder / ".readme-bin"
    bin_dir.mkdir()
    # `castlab` as pip's console script is (sys.path[0] is its folder, not the working one)
    shims = {"castlab": f"#!{sys.executable}\nimport sys\nfrom castlab.cli import main\n"
                        "sys.exit(main())\n",
             "python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'}
    shims["python3"] = shims["python"]
    for name, text in shims.items():
        shim = bin_dir / name
        shim.write_text(text)
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [PKG, env.get("PYTHONPATH", "")] if p)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env["MPLBACKEND"] = "Agg"
    env.pop("CASTLAB_DEBUG", None)
    return env


def _param(b: Block):
    marks = ([pytest.mark.cuda] if "gpu" in b.markers else []) + (
        [pytest.mark.slow] if "slow" in b.markers else [])
    return pytest.param(b, id=b.id, marks=marks)


@pytest.mark.parametrize("block", [_param(b) for b in RUN])
def test_readme_block(block: Block, tmp_path):
    reason = _skip_reason(block)
    if reason:
        pytest.skip(reason)
    env = _prepare(tmp_path)
    if block.lang == "python":
        script = tmp_path / block.markers.get("file", "readme_example.py")
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(block.code)
        p = subprocess.run([sys.executable, str(script.relative_to(tmp_path))], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=TIMEOUT)
        out, shown = p.stdout, p.stdout + p.stderr
    else:
        p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=tmp_path,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=TIMEOUT)
        out = shown = p.stdout
    assert p.returncode == 0, (f"README block at line {block.line} exited {p.returncode}:\n"
                               f"{shown[-4000:]}")
    expected = _lines(block.expected or "")
    actual = _lines(out)
    if not _match(expected, actual):
        diff = "\n".join(difflib.unified_diff(expected, actual, "README", "printed", lineterm=""))
        pytest.fail(f"README block at line {block.line} printed what the README does not "
                    f"show:\n{diff}")


def test_every_block_is_accounted_for():
    langs = {b.lang for b in BLOCKS}
    assert langs <= RUN_LANGS | LITERAL_LANGS, langs - RUN_LANGS - LITERAL_LANGS
    # every runnable block either runs here or says why not
    assert len(RUN) >= 15, len(RUN)
    for b in RUN:
        assert set(b.markers) <= {"file", "needs", "gpu", "skip", "slow"}, (b.id, b.markers)
        if "needs" in b.markers:
            assert b.markers["needs"] in ("torch", "transformers"), (b.id, b.markers)
    # a file block whose name a shell block uses exists
    for b in RUN:
        if b.lang == "sh":
            for name in re.findall(r"[\w/.-]+\.(?:toml|py|json)\b", b.code):
                if not name.startswith("-"):
                    assert name in FILES, (b.id, name)


def _marked(name: str) -> str:
    """The block between <!-- name --> and <!-- /name -->, as .ci/run extracts it."""
    m = re.search(rf"<!-- {name} -->\n(.*?)<!-- /{name} -->", README, re.S)
    assert m, f"README has no <!-- {name} --> block"
    return "\n".join(ln for ln in m.group(1).splitlines()
                     if not ln.startswith("<!--") and not ln.startswith("```")).strip()


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text()
    assert "<!-- test-command -->" in ci and "/test-command" in ci
    cmd = _marked("test-command")
    assert len(cmd.splitlines()) == 1, cmd
    # it runs every test, the ones marked slow included (the fast loop is CONTRIBUTING's)
    pytest_cmd = cmd[cmd.index("-m pytest"):]
    pytest_cmd = pytest_cmd[:pytest_cmd.index("&&")]
    assert " -m " not in pytest_cmd[len("-m pytest"):] and "slow" not in cmd, cmd
    assert pytest_cmd.rstrip().endswith(" tests"), cmd


def test_main_command_is_the_short_path():
    assert _marked("main-command") == "pip install . && castlab study"


def test_readme_sections_come_in_order():
    heads = [h for h in re.findall(r"^## (.+)$", README, re.M)]
    order = ["Install and run the main job", "A first example", "Concepts",
             "The command line", "The Python API, by example", "Run the tests"]
    assert [h for h in heads if h in order] == order, heads


def test_readme_links_exist():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_matcher():
    assert _match(["a", "...", "d"], ["a", "b", "c", "d"])
    assert _match(["a", "...", "b"], ["a", "b"])
    assert not _match(["a", "...", "d"], ["a", "b"])
    assert _match(["castlab 0.1.0..."], ["castlab 0.1.0+dev"])
    assert not _match(["x ... y"], ["x y"])
    assert _match(["x ... y"], ["x 12 y"])
