"""Fast mode of the CUDA backend: ``FastCudaBackend`` (``--impl kernels_cu.fast:FastCudaBackend``).

kernels_cu/fast/backend.py composes it: the selection, head, target and context Ops (backend.py), the block
(block.py), the attention (attention.py), feature_capture and grouped_conv (capture.py), over the exact mode's
backend for every other Op. Its tunables are one frozen ``FastOptions`` (options.py). Importing this package does
not import CuPy.
"""

from kernels_cu.fast.backend import FastCudaBackend, FastSelectBackend
from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions

__all__ = ["DEFAULT_OPTIONS", "FastCudaBackend", "FastOptions", "FastSelectBackend"]
