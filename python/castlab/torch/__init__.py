"""castlab.torch: run a PyTorch model through castlab, and ask where its numerics drift.

``capture(model, *example_inputs)`` turns a PyTorch forward into a castlab program;
``drift(model, inputs, a=..., b=...)`` reports, per captured node, the error of two
configurations against the fp64 run; ``torch.compile(model, backend=backend(policy=,
math=))`` runs a model through castlab from inside PyTorch; ``versus_compiled(captured,
*inputs)`` counts, at every value castlab hands to PyTorch, the bits that differ from
``torch.compile``'s; ``inductor_stores(captured, *inputs)`` says where torch.compile's
Inductor stores, loads and recomputes each value (read from its compiled program).

Regions and kernels (the ground of stacks): ``captured.regions()`` lists the model's
SwiGLU/GeGLU, RoPE, RMSNorm, attention and matmul instances, recognised by the dataflow
of the ATen graph (:mod:`castlab.torch._regions`: kind, module path, source line, FX
nodes); ``captured.run(..., kernels={"swiglu": "liger", "rope": cl.library("liger")
["rope"]})`` runs a kernel-library preset in place of every instance of a kind, under the
preset's own policy and math, on the storage-dtype tensors that reach it (a kernel
boundary). ``policy="fp64"`` ignores kernels (it is the reference); a kind the model
lacks is an error naming it (``regions().inert(kernels)`` lists those); ``vjp`` refuses
kernels.

Stacks (:mod:`castlab.torch._stacks`, docs/stacks.md): ``Stack`` is a named, immutable
set of choices over a captured model (the regions' policy and math, a kernel-library
preset per region kind, the SDPA backend, PyTorch's matmul flags); ``stacks()`` lists the
built-in ones (``hf_eager``, ``torch_compile``, ``torch_compile_emulate``, ``liger``,
``unsloth``, ``vllm``, ``transformer_engine``); ``captured.run(..., stack="liger")`` runs one in one call.
``compare_stacks(model, inputs, a=, b=, labels=, align=)`` runs two stacks and fp64 and
returns a ``StackComparison``: per token the log-probability difference, KL(A||B) and
top-1 flips; per node and layer where the two first differ; which is closer to fp64; and
with ``align=True`` the ``Alignment``: the smallest set of B's choices whose switch to
A's makes the logits bit-identical (:mod:`castlab.torch._align`).

Capture: ``torch.export`` (non-strict), not Dynamo. export gives one whole-graph ATen
program or an error that names the line (Dynamo would split the model at graph breaks
and fall back to Python silently), records each node's module path and source line,
and its default (training) IR keeps ``linear``, ``embedding`` and
``scaled_dot_product_attention`` whole, so those run as the very PyTorch kernels eager
runs. No decomposition table is applied: a decomposition (silu into ``x*sigmoid(x)``,
softmax into exp/sum/div) would change the numerics castlab is asked to reproduce.

* ATen elementwise ops, casts, views, ``cat``, ``sum``/``mean``/``amax``/``amin`` and
  ``softmax``/``log_softmax`` over floating tensors are built with castlab's own op
  functions (PyTorch's type promotion and scalar rules, the eager kernels' formulas, one
  rounding per PyTorch kernel), grouped into castlab regions run under a policy.
* Everything else (matmul/linear, embedding, attention, indexing, integer and bool
  mask arithmetic, ...) is an external node: the ATen op called through PyTorch on the
  same device, tensors shared with DLPack. Under ``fp64`` it runs on float64 values.
* The captured graph is checked against the model on the example inputs. Where tracing
  changed an attention call (Hugging Face builds an explicit causal mask and repeats K/V
  per head when traced, but calls SDPA with ``is_causal=True`` eagerly, and on a GPU
  the two run other kernels), ``capture`` restores the eager call when that makes the
  graph give the model's outputs bit for bit (``attention="traced"`` keeps the traced
  call: the program torch.compile compiles).

>>> import torch, castlab.torch as ct
>>> lin = torch.nn.Linear(8, 8).to(torch.bfloat16)
>>> x = torch.randn(4, 8).to(torch.bfloat16)
>>> f = ct.capture(lambda x: torch.nn.functional.silu(lin(x)) * 2, x)
>>> with torch.no_grad():
...     torch.equal(f.run(x, policy="eager"), torch.nn.functional.silu(lin(x)) * 2)
True
>>> f.run(x, policy="fp64").dtype
torch.float64
"""

try:
    import torch as _torch  # noqa: F401  (PyTorch itself, not this package)
except ImportError as e:  # pragma: no cover - CI installs torch
    raise ImportError("castlab.torch captures PyTorch models and needs PyTorch: "
                      "pip install 'castlab[torch]' (or torch)") from e

from ._align import Alignment
from ._backend import CastlabBackend, backend
from ._compare_stacks import StackComparison, compare_stacks
from ._drift import ModelDrift, drift
from ._inductor import InductorPlacement, inductor_stores
from ._program import CapturedModel, CaptureError, Segment, capture
from ._regions import Region, Regions
from ._stacks import Matmul, Stack, stacks
from ._versus import CompiledComparison, versus_compiled

__all__ = ["capture", "CapturedModel", "CaptureError", "Segment", "drift", "ModelDrift",
           "backend", "CastlabBackend", "versus_compiled", "CompiledComparison", "Region",
           "Regions", "Stack", "Matmul", "stacks", "compare_stacks", "StackComparison",
           "Alignment", "inductor_stores", "InductorPlacement"]
