"""Calibration controls (CONTRACTS C2 v2): legitimate variants, the mirror image of tests/mutants.

A legitimate variant differs from the reference only in a choice a production engine makes
(accumulation order, FP32 instead of BF16 intermediates, an extra BF16 rounding at a kernel
boundary, BF16/FP32 cos-sin tables, FP32 angles below 2^24, a different libm). The suite must give
every one of them no FAIL; one that FAILs is a defect of the suite (or a variant that is not
legitimate after all), never a reason to drop the control.
"""
