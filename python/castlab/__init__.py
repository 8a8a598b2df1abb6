"""castlab: eager vs fused low-precision numerics, bit by bit.

>>> import castlab as cl
>>> x = cl.randn(4, 8, seed=0, dtype=cl.bfloat16)
>>> a, b = cl.chunk(x, 2, dim=-1)
>>> y = cl.silu(a) * b          # eager: rounds to bf16 after each op
"""

# Layers (each module imports only from layers below it; no import inside a function
# targets a castlab module; tests/test_layering.py checks this):
#   0  _C, _debug, _progress, _dtype, _device, _optable, _torch_vml, _onednn, _cpu_codegen
#                                         leaves (C++ core, debug level, progress bar, dtypes,
#                                         devices, ops, torch's MKL VML when torch is loaded,
#                                         where PyTorch's gelu calls oneDNN, the CPU's
#                                         compiled loops)
#   1  _policy -> policy, _graph, cuda, _runrecord  rounding policies, math variants, the
#                                         graph IR, CUDA runtime,
#                                         a command's run record (first line, run.json)
#   2  _lower_steps -> _rounding -> _lower_views -> _schedule -> _inductor_cpp
#      -> _torch_kernels -> _lower_reduce
#      -> _lower_build -> _lower              graph -> Programs -> a Plan: plan steps, rounding
#                                         placement, view push-down, schedule (tiles, row
#                                         fusion), Inductor's C++ reductions,
#                                         PyTorch-kernel reproduction, reductions,
#                                         the program builder, the driver
#   3  _dlpack -> _creation -> ops -> _composite -> _reduce -> _index -> _loss  interchange,
#                                         creation, the op functions, eager composites (their
#                                         plan cache), reductions and norms, gather, losses
#   4  _tensor, _autodiff                     Tensor/Proxy methods (one class body each, copied
#                                         onto _C.Tensor and Proxy); derivative rules,
#                                         backward graphs
#   5  _listing -> _jit                       the trace listing (from the lowering's record);
#                                         tracing and fused execution
#   6  numerics -> _presets_norm -> presets -> torch, sweep -> _study_chains -> _study_inputs
#      -> _study_cells -> _study_rows -> _study_library -> study -> _plot_draw -> _plot_labels -> plot
#      -> testing -> _cli_parser -> _cli_config -> _cli_files -> _cli_exhaustive -> _cli_stacks
#      -> cli
#                                         analysis, kernel-library presets, PyTorch
#                                         model capture (castlab.torch: imported on its
#                                         own, it needs torch; its kernels= reads
#                                         presets), Dask sweeps, studies (built-in
#                                         chains, inputs, cells, their rows, the library
#                                         matrix; study.run), plots (drawing, labels;
#                                         castlab.plot), proven bounds and kernel checks
#                                         (castlab.testing), the CLI (parser, --config,
#                                         --out files, exhaustive and bounds, stacks
#                                         (castlab.torch, loaded when it runs); castlab.cli)
#   7  castlab (this file), __main__
# Tensor methods are written in _tensor (TensorMethods, ConcreteTensorMethods; _C.pyi
# declares them on _C.Tensor for static tools); modules below it may call them on tensors
# (t.clone(), t.astype()) at run time, but never import it.

from . import _C, _debug, cli, cuda, numerics, presets, study, testing
from ._cpu_codegen import cpu_codegen
from ._creation import (
    arange,
    asarray,
    empty,
    empty_like,
    from_numpy,
    full,
    full_like,
    ones,
    ones_like,
    rand,
    randn,
    tensor,
    zeros,
    zeros_like,
)
from ._device import device
from ._dlpack import from_dlpack
from ._dtype import (
    as_dtype,
    bfloat16,
    dtype,
    float8_e4m3fn,
    float8_e5m2,
    float16,
    float32,
    float64,
    int32,
    int64,
    promote_types,
)
from ._dtype import bool_ as _bool
from ._index import gather, take_along_dim
from ._jit import JitFunction, grad, jit, vjp
from ._loss import cross_entropy, nll_loss
from ._reduce import (  # noqa: A004  (castlab.sum, as torch.sum)
    amax,
    amin,
    layer_norm,
    log_softmax,
    mean,
    rms_norm,
    softmax,
    sum,
    var,
)
from ._tensor import Tensor
from .ops import *  # noqa: F403  (the op table's functions and the shape functions)
from .ops import __all__ as _ops_all
from .policy import Math, Policy, use_math
from .presets import libraries, library

__version__ = _C.__version__
_debug.level()  # pass CASTLAB_DEBUG on to C++
bool = _bool  # noqa: A001  (castlab.bool, as torch.bool)

__all__ = [
    "Tensor", "device", "dtype", "float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
    "float8_e5m2", "bool", "int32", "int64", "as_dtype", "promote_types",
    "tensor", "asarray", "from_numpy", "empty", "zeros", "ones", "full", "arange", "rand",
    "randn", "empty_like", "zeros_like", "ones_like", "full_like",
    *(n for n in _ops_all if n != "copy_"),
    "sum", "mean", "amax", "amin", "var", "softmax", "log_softmax", "rms_norm", "layer_norm",
    "gather", "take_along_dim", "nll_loss", "cross_entropy",
    "Math", "Policy", "use_math", "jit", "JitFunction", "vjp", "grad", "from_dlpack", "cuda",
    "numerics",
    "study", "testing", "info", "presets", "library", "libraries", "cpu_codegen",
]


def info() -> str:
    """Versions (castlab, Python, NumPy, ml_dtypes, torch) and the devices found (GPU
    name, compute capability, driver and NVRTC versions), as ``castlab info`` prints them.

    >>> print(cl.info())          # doctest: +SKIP
    """
    return cli.info_text()
