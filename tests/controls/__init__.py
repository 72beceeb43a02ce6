"""Tests of the calibration controls (conformance.controls): every legitimate variant gives no FAIL."""
