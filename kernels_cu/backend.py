"""``kernels_cu.backend:CudaBackend``, the exact mode's implementation object (kernels_cu/exact/backend.py),
under the name the documentation and the CLI's --impl strings use."""

from kernels_cu.exact.backend import CudaBackend

__all__ = ["CudaBackend"]
