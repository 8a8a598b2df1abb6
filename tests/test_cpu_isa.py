"""castlab vs torch CPU under each build of PyTorch's CPU kernels this machine can run
(issue 49 item 4): ATEN_CPU_CAPABILITY=default, avx2 and avx512, each in a child process
(torch reads it once, at import), with Math.cpu_isa "auto" following it. The cases are
scripts/cpu_isa_report.py's quick set: elementwise ops (SLEEF bodies, glibc tails), the
backward kernels, SwiGLU and RoPE gradients, sum/mean/var/amax over the last dim, dim 0 and
all dims, softmax/log_softmax over both and their gradients, layer_norm and HF RMSNorm with
its gradient; fp32, bf16, fp16 and fp64 at 4,097 and 70,001 elements (thread chunks), and
every element bit for bit (oneDNN's gelu forward and backward included). A capability the
CPU lacks (/proc/cpuinfo flags) is skipped and says why.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch")

_SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "cpu_isa_report.py"
_spec = importlib.util.spec_from_file_location("cpu_isa_report", _SCRIPT)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

SUPPORTED = report.supported_isas()


@pytest.mark.parametrize("isa", report.ISAS)
def test_castlab_equals_torch_cpu_under_each_capability(isa):
    if SUPPORTED[isa] is not None:
        pytest.skip(f"ATEN_CPU_CAPABILITY={isa}: {SUPPORTED[isa]}")
    rows = report.run([isa], quick=True, timeout=600)
    assert len(rows) > 600  # every case ran
    bad = [r for r in rows if r["bad"]]
    assert not bad, "\n" + report.table(bad)


def test_capabilities_are_detected_from_the_cpu_flags():
    flags = report.cpu_flags()
    assert SUPPORTED["default"] is None
    has_avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    assert (SUPPORTED["avx512"] is None) == has_avx512
    if SUPPORTED["avx512"] is None:
        assert SUPPORTED["avx2"] is None
