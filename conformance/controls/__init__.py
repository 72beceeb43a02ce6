"""Calibration controls (CONTRACTS C2 v2): legitimate variants, the mirror image of the mutants.

A legitimate variant differs from the reference only in a choice a production engine makes
(accumulation order, FP32 instead of BF16 intermediates, an extra BF16 rounding at a kernel
boundary, BF16/FP32 cos-sin tables, FP32 angles below 2^24, a different libm). The suite must give
every one of them no FAIL; one that FAILs is a defect of the suite (or a variant that is not
legitimate after all), never a reason to drop the control.

``engine.Engine`` is the configurable NumPy engine; ``variants.VARIANTS`` the set the suite is
calibrated against. The PyTorch BF16 engine of the same set lives with the examples
(``examples/torch_engine/engine.py``), since it needs torch.
"""
