"""CUDA implementations of the Ops, run through CuPy (RawModule / NVRTC, cuBLAS).

Arranged by role: exact/ (the exact mode, ``kernels_cu.backend:CudaBackend`` and ``kernels_cu.round:CudaRound``),
fast/ (the fast mode, ``kernels_cu.fast:FastCudaBackend`` and ``kernels_cu.fast_round:FastRound``, its tunables in
``kernels_cu.fast.FastOptions``), device/ (the .cuh headers both share), and the shared host modules loader.py
(compile options, module loading) and pdl.py (programmatic dependent launch). backend.py, round.py and fast_round.py
here only keep those documented --impl names. Importing this package does not import CuPy; the backends do.
"""
