"""Float64 NumPy reference of the DFlash / DFlash2 Ops.

One module per Op, pure functions, no I/O and no knowledge of the conformance
harness. Shared pieces: ``numerics`` (represented formats, C1), ``rng`` (C3),
``norms`` (RMSNorm, head norm, RoPE, SiLU), ``config`` (draft config.json),
``precision`` (the float64 / float32-baseline switch, C2).
"""
