"""CUDA implementations of the Ops, run through CuPy (RawModule / cupy.matmul).

``kernels_cu.backend.CudaBackend`` is the implementation object (CONTRACTS C9).
Importing this package does not import CuPy; the backend does.
"""
