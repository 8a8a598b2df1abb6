"""The README's quick start runs as written, and its trace listing is what castlab prints."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_quick_start_runs():
    pytest.importorskip("torch")
    block = re.search(r"## Quick start\n\n```python\n(.*?)```", README, re.S).group(1)
    exec(compile(block, "README quick start", "exec"), {})


# The function of the README's listing, as saved in swiglu.py (the listing names its lines).
SWIGLU_PY = """import castlab as cl

@cl.jit
def swiglu(x):
    a, b = cl.chunk(x, 2, dim=-1)
    return cl.silu(a) * b
"""


def test_trace_listing_is_current():
    import castlab as cl

    ns: dict = {}
    exec(compile(SWIGLU_PY, "swiglu.py", "exec"), ns)
    swiglu = ns["swiglu"]
    x = cl.randn(512, 256, seed=0, dtype=cl.bfloat16)
    for policy in ("eager", "fused"):
        assert str(swiglu.trace(x, policy=policy)) in README


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text()
    assert "<!-- test-command -->" in ci and "<!-- test-command -->" in README


def test_reductions_example_runs():
    block = re.search(r"### Reductions and norms\n.*?```python\n(.*?)```", README, re.S).group(1)
    ns: dict = {}
    exec(compile("import castlab as cl\n" + block, "README reductions", "exec"), ns)
    assert ns["hf"].shape == (1024, 3584) and ns["te"].dtype == ns["hf"].dtype


def test_readme_losses_block_runs(capsys):
    block = re.search(r"### Log-probabilities and losses over the vocabulary\n.*?```python\n"
                      r"(.*?)```\nprints `(.*?)`", README, re.S)
    exec(compile(block.group(1), "README losses", "exec"), {})
    assert capsys.readouterr().out.strip() == block.group(2)
