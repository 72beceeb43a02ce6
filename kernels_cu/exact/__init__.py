"""Exact mode of the CUDA backend: ``CudaBackend`` (backend.py; ``--impl kernels_cu.backend:CudaBackend``) and
``CudaRound`` (round.py), the Op kernels (*.cu) and their host modules (attention.py, proposal_head.py, select.py).
It rounds where the reference rounds and accumulates the decisive dot products in double."""
