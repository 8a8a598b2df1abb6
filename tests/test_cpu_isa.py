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


@pytest.mark.slow  # 6-20 s a build (a torch subprocess)
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


_BEFORE_AND_AFTER_IMPORT = r"""
import sys
import castlab as cl
assert "torch" not in sys.modules
x, g = cl.randn(1 << 16, seed=3), cl.randn(1 << 16, seed=4)
f = cl.jit(lambda a: cl.silu(a) * a)
y0 = f(x).numpy().copy()                              # lowered before torch is imported
d0 = f.vjp(x, policy="eager")[1](g)[0].numpy().copy()
import os
os.environ["ATEN_CPU_CAPABILITY"] = "default"  # torch's build differs from castlab's guess
import torch
xt, gt = torch.from_numpy(x.numpy()), torch.from_numpy(g.numpy())
xr = xt.clone().requires_grad_()
ref_d = torch.autograd.grad(torch.nn.functional.silu(xr) * xr, xr, gt)[0].numpy()
ref_y = (torch.nn.functional.silu(xt) * xt).numpy()
y1 = f(x).numpy()
d1 = f.vjp(x, policy="eager")[1](g)[0].numpy()
print(int((y0 != ref_y).sum()), int((d0 != ref_d).sum()), int((y1 != ref_y).sum()),
      int((d1 != ref_d).sum()))
"""


def test_a_jit_plan_lowered_before_torch_is_imported_is_not_reused_after(tmp_path):
    # issue 51 item 5: Math's bits follow the loaded torch (its CPU capability); the jit's
    # plan cache keyed only on (policy, math) and kept the plan lowered without torch.
    # ATEN_CPU_CAPABILITY=default differs from what castlab assumes without torch on any
    # AVX2 or AVX512 machine.
    import os
    import subprocess
    import sys

    import castlab as cl

    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(cl.__file__)))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _BEFORE_AND_AFTER_IMPORT], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    y0, d0, y1, d1 = map(int, out.stdout.split())
    if y0 == 0 and d0 == 0:
        pytest.skip("this CPU's own build is torch's default one: nothing to tell apart")
    assert (y1, d1) == (0, 0), out.stdout


_PREDICT = r"""
import sys
import castlab as cl
from castlab import policy
assert "torch" not in sys.modules
before = cl.Math.preset("torch_eager").torch_cpu_isa()
import torch
print(before, torch.backends.cpu.get_cpu_capability().lower(),
      cl.Math.preset("torch_eager").torch_cpu_isa())
"""


@pytest.mark.slow  # a torch subprocess each
@pytest.mark.parametrize("isa", [None, *report.ISAS])
def test_auto_predicts_torchs_capability_before_torch_is_imported(isa):
    # issue 49 item 4: Math(cpu_isa="auto") follows torch's choice; castlab never imports
    # torch, so without it, it predicts what torch would choose (ATEN_CPU_CAPABILITY, else
    # the CPU's flags), and the prediction is what torch then reports
    import os
    import subprocess
    import sys

    import castlab as cl

    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if isa is not None:
        if SUPPORTED[isa] is not None:
            pytest.skip(f"ATEN_CPU_CAPABILITY={isa}: {SUPPORTED[isa]}")
        env["ATEN_CPU_CAPABILITY"] = isa
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(cl.__file__)))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _PREDICT], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    before, torch_says, after = out.stdout.split()
    assert before == torch_says == after, out.stdout
