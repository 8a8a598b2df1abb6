"""Cell sources of the notebooks (see _build.py)."""

NB03 = [
    ("md", """
# 03 · Zero-copy interop with PyTorch and NumPy

castlab tensors share memory with NumPy arrays (through NumPy's array interface; bf16 and
fp8 appear as `ml_dtypes` dtypes) and with PyTorch/CuPy tensors (through DLPack). Nothing
is copied: the pointers are the same and a write on one side is seen on the other.
"""),
    ("code", """
import numpy as np
import torch

import castlab as cl

try:
    HAS_GPU = cl.cuda.is_available()
except AttributeError:
    HAS_GPU = False
print(cl.__version__, "GPU:", HAS_GPU)
"""),
    ("md", "## NumPy: the same memory, both ways"),
    ("code", """
a = np.arange(6, dtype=np.float32).reshape(2, 3)
t = cl.from_numpy(a)
print(hex(a.ctypes.data), hex(t.data_ptr()))
a[0, 0] = 42.0          # write through NumPy ...
t[1, 2] = -1.0          # ... and through castlab
print(t)
print(a)
assert t.data_ptr() == a.ctypes.data
assert t[0, 0].item() == 42.0 and a[1, 2] == -1.0
"""),
    ("code", """
# bf16 tensors show up in NumPy as ml_dtypes.bfloat16, still without a copy
x = cl.randn(2, 4, seed=0, dtype=cl.bfloat16)
n = x.numpy()
print(n.dtype, hex(n.ctypes.data) == hex(x.data_ptr()))
n[0, 0] = 0.1           # NumPy rounds 0.1 to bf16: 0.10009765625
print(x[0, 0].item())
assert x[0, 0].item() == 0.10009765625
"""),
    ("md", "## PyTorch: DLPack both ways, strided views included"),
    ("code", """
xt = torch.randn(4, 8).to(torch.bfloat16)
xc = cl.from_dlpack(xt)                 # or cl.asarray(xt)
print("same pointer:", xc.data_ptr() == xt.data_ptr())
xt[0, 0] = 3.0
print("castlab sees torch's write:", xc[0, 0].item())
view = torch.from_dlpack(xc[1:, ::2])   # a strided castlab view, back into torch
print(view.shape, view.stride(), view.data_ptr() == xt[1:, ::2].data_ptr())
xc[1, 0] = -2.0
assert view[0, 0].item() == -2.0 and xc[0, 0].item() == 3.0
"""),
    ("md", """
## castlab policies on torch tensors

A `cl.jit` function takes torch tensors directly (zero-copy). Under the `eager` policy it
reproduces PyTorch eager bit for bit; `fused` rounds once; `fp64` is the golden reference.
"""),
    ("code", """
@cl.jit
def swiglu(x):
    a, b = cl.chunk(x, 2, dim=-1)
    return cl.silu(a) * b

torch.manual_seed(0)
x = torch.randn(256, 512).to(torch.bfloat16)
y_torch = torch.nn.functional.silu(x[:, :256]) * x[:, 256:]
y_eager = torch.from_dlpack(swiglu.run(x, policy="eager"))
y_fused = torch.from_dlpack(swiglu(x))
mism_eager = (y_eager.view(torch.int16) != y_torch.view(torch.int16)).sum().item()
mism_fused = (y_fused.view(torch.int16) != y_torch.view(torch.int16)).sum().item()
print(f"castlab eager vs torch eager: {mism_eager} of {y_torch.numel()} differ")
print(f"castlab fused vs torch eager: {mism_fused} of {y_torch.numel()} differ")
assert mism_eager == 0
assert mism_fused > 0
"""),
    ("md", """
## On a GPU: castlab vs torch eager and torch.compile

With a GPU, castlab's eager kernels (`torch_eager` preset) are compared with torch eager
CUDA and its fused kernels (`inductor` preset) with `torch.compile`, bit for bit.
"""),
    ("code", """
if HAS_GPU:
    xg = x.cuda()
    ref_eager = torch.nn.functional.silu(xg[:, :256]) * xg[:, 256:]
    compiled = torch.compile(lambda v: torch.nn.functional.silu(v[:, :256]) * v[:, 256:],
                             dynamic=False)
    ref_comp = compiled(xg)
    ce = torch.from_dlpack(swiglu.run(xg, policy="eager"))
    cf = torch.from_dlpack(swiglu.run(xg, policy="fused", math="inductor"))
    torch.cuda.synchronize()
    print("eager vs torch eager:", (ce.view(torch.int16) != ref_eager.view(torch.int16)).sum().item())
    print("fused/inductor vs torch.compile:", (cf.view(torch.int16) != ref_comp.view(torch.int16)).sum().item())
else:
    print("no GPU here: the GPU comparison is skipped")
"""),
]

NOTEBOOKS = {"03_torch_interop.ipynb": NB03}
