"""Set-up shared by every test file, before any of them imports torch."""

from __future__ import annotations

import getpass
import os
import tempfile

# torch.compile's on-disk cache does not tell ATen's CPU builds apart. Measured with torch
# 2.13.0 on an AVX512 machine: a graph compiled under the default build, run again in a new
# process with ATEN_CPU_CAPABILITY=avx2, returned wrong values (the row maxima of 9 of 16
# rows, every softmax element) until the cache was emptied; with a fresh cache castlab's
# model of the AVX2 kernel equalled it. Each capability gets its own cache here, so that
# the suite can be run under each build torch can run on one machine.
# Inductor placements are read by compiling in every test (tests count those compiles);
# test_inductor_placement.py turns the disk cache on in a folder of its own.
os.environ.setdefault("CASTLAB_PLACEMENT_DIR", "")
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _cap = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() or "native"
    try:
        _user = getpass.getuser()
    except (KeyError, OSError):
        _user = str(os.getuid())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{_user}_castlab_tests_{_cap}")
