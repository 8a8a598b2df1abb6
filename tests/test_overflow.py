"""Size, stride and offset overflow (issue 14, items 7, 8 and 10): every reproducer runs in
a subprocess, so a crash fails one test instead of killing pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import castlab

# The folder castlab was imported from (the source tree in development, site-packages
# after `pip install .`, the sanitizer copy under scripts/sanitize_check.sh): children
# import the same castlab.
_PY = os.path.dirname(os.path.dirname(os.path.abspath(castlab.__file__)))


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = _PY + os.pathsep + env.get("PYTHONPATH", "")
    prog = "import castlab as cl, numpy as np\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True,
                          timeout=300)


def _expect(code: str, exc: str, match: str) -> None:
    wrapped = ("try:\n" + textwrap.indent(textwrap.dedent(code), "    ") +
               "\nexcept Exception as e:\n    print('RAISED', type(e).__name__, e)\n"
               "else:\n    print('NO ERROR')\n")
    r = _run(wrapped)
    assert r.returncode == 0, f"crashed (rc={r.returncode}): {r.stderr[-2000:]}"
    out = r.stdout.strip().splitlines()[-1]
    assert out.startswith(f"RAISED {exc} "), out
    assert match in out, out


RAISES = [
    # item 7: sizes that do not fit in 64 bits
    ("empty_2_32_squared", "cl.empty(2**32, 2**32)", "ValueError",
     "empty: shape [4294967296, 4294967296] has more elements than fit in 64 bits"),
    ("reshape_overflow", "cl.zeros(4).reshape(2**62 + 1, 4)", "ValueError",
     "has more elements than fit in 64 bits"),
    ("view_overflow", "cl.zeros(4).view(2**62 + 1, 4)", "ValueError",
     "has more elements than fit in 64 bits"),
    ("reshape_infer_overflow", "cl.zeros(4).reshape(-1, 2**62, 4)", "ValueError",
     "has more elements than fit in 64 bits"),
    # item 8: heap corruption reproducers
    ("exp_of_huge_view", "x = cl.empty(2**62 + 1, 4); cl.exp(x[:, 0])", "ValueError",
     "more elements than fit in 64 bits"),
    ("setitem_huge", "cl.zeros(2**62, 4)[100] = 7.0", "ValueError",
     "more elements than fit in 64 bits"),
    ("bytes_overflow", "cl.empty(2**62, dtype=cl.float32)", "ValueError",
     "more bytes than fit in 64 bits"),
    ("expand_overflow", "cl.zeros(1, 1).expand(2**32, 2**32)", "ValueError",
     "more elements than fit in 64 bits"),
    ("ones_overflow", "cl.ones(2**31, 2**31, 4)", "ValueError", "more elements than fit"),
    ("empty_strides_overflow", "cl.empty(0, 2**62, 4)", "ValueError",
     "contiguous strides do not fit in 64 bits"),
    ("dim_beyond_int64", "cl.empty(2**64)", "ValueError", "does not fit in 64 bits"),
    ("allocation_failure", "cl.empty(2**60, dtype=cl.float32)", "MemoryError", ""),
    ("reshape_beyond_int64", "cl.zeros(4).reshape(2**64)", "ValueError",
     "reshape: size 18446744073709551616 in [18446744073709551616] does not fit in 64 bits"),
    ("expand_beyond_int64", "cl.zeros(1).expand(2**64)", "ValueError", "does not fit in 64 bits"),
    ("index_beyond_int64", "cl.zeros(4)[2**70]", "IndexError", "out of bounds"),
    # item 10: private entry points
    ("bits_beyond_storage", "cl.zeros(4)._bits(10**9)", "IndexError",
     "_bits: element 1000000000 is outside the storage"),
    ("bits_negative", "cl.zeros(4)._bits(-1)", "IndexError", "outside the storage"),
    ("bits_view_end", "cl.zeros(8)[4:]._bits(4)", "IndexError", "outside the storage"),
    ("C_empty_negative", "cl._C.empty([-1, 2], 'float32', 'cpu')", "ValueError",
     "empty: negative dimension in shape [-1, 2]"),
    ("C_empty_overflow", "cl._C.empty([2**40, 2**40], 'float32', 'cpu')", "ValueError",
     "more elements than fit in 64 bits"),
    ("C_expand_negative", "cl._C.empty([1], 'float32', 'cpu')._expand([-5])", "ValueError",
     "negative"),
    ("C_slice_huge_step_of_long_dim",
     "x = cl._C.empty([1], 'float32', 'cpu')._expand([2**62]); x._slice(0, 0, 2**62, 2**62)",
     "NO", ""),
    ("from_pointer_overflow",
     "a = np.zeros(2); cl._C.from_pointer(a.ctypes.data, [3], [2**62], 'float64', a)",
     "ValueError", "fit in 64 bits"),
    ("from_pointer_wraps_address",
     "a = np.zeros(2); cl._C.from_pointer(2**64 - 8, [4], [1], 'float64', a)",
     "ValueError", "spans more memory than exists"),
    ("from_numpy_outside_buffer",
     "cl.from_numpy(np.lib.stride_tricks.as_strided(np.zeros(2), shape=(4,), strides=(2**40,)))",
     "ValueError", "from_numpy: the NumPy array"),
    ("cuda_generate_no_dtypes",
     "from castlab._optable import instr, output\n"
     "p = cl._C.Program([instr('load', True, 0, dtype=0)], 1, [output(0)], 0)\n"
     "cl._C._cuda_generate(p, [], 1, 1, True, 1, True)",
     "ValueError", "_cuda_generate: n_out must be in"),
    ("program_unknown_dtype",
     "from castlab._optable import instr, output\n"
     "cl._C.Program([instr('load', True, 0, dtype=200)], 1, [output(0)], 0)",
     "ValueError", "unknown dtype code 200"),
    ("program_load_dtype_mismatch",
     "from castlab._optable import instr, output\n"
     "p = cl._C.Program([instr('load', True, 0, dtype=0)], 1, [output(0)], 0)\n"
     "x = cl.zeros(4, dtype=cl.int32); p.run([x], [cl.zeros(4)])",
     "ValueError", "dtype mismatch"),
]


@pytest.mark.slow  # a subprocess per case: ~1 s each
@pytest.mark.sanitize
@pytest.mark.parametrize("code,exc,match", [c[1:] for c in RAISES], ids=[c[0] for c in RAISES])
def test_overflow_raises(code, exc, match):
    if exc == "NO":
        r = _run(code)
        assert r.returncode == 0, r.stderr[-2000:]
        return
    _expect(code, exc, match)


def test_full_slice_of_a_dimension_beyond_2_62():
    r = _run("""
        x = cl.zeros(1)._expand([2**62 + 5])
        assert tuple(x[:].shape) == (2**62 + 5,), x[:].shape
        assert tuple(x[2**62:].shape) == (5,)
        assert tuple(x[-3:].shape) == (3,)
        assert tuple(x[::2**62].shape) == (2,)
        assert tuple(x[-2**80:2**80].shape) == (2**62 + 5,)
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_cli_study_huge_shape_does_not_crash():
    r = _run("""
        import sys
        from castlab.cli import main
        sys.argv = ["castlab", "study", "--shape", "swiglu=4611686018427387905x4"]
        try:
            main()
        except SystemExit:
            pass
    """)
    assert r.returncode == 0, r.stderr[-2000:]  # no crash (the CLI's own exit code: test_study)
    assert "too large for a study" in r.stderr + r.stdout


def test_views_of_valid_tensors_still_work():
    import castlab as cl  # noqa: PLC0415
    x = cl.arange(24.0).reshape(2, 3, 4)
    assert x.permute(2, 0, 1).contiguous().reshape(-1).shape == (24,)
    assert x[:, 1, ::3].tolist() == [[4.0, 7.0], [16.0, 19.0]]
    assert x[0:0].reshape(0, 12).shape == (0, 12)
    assert cl.empty(0, 2**40, 4).shape == (0, 2**40, 4)
    assert cl.zeros(1).expand(2**40).shape == (2**40,)
