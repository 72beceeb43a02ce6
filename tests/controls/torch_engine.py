"""The PyTorch BF16 control engine (a legitimate variant for tools/calibration.py and
tests/controls): the engine itself lives in examples/torch_engine/engine.py, where the PyTorch
capture example (examples/torch_capture_engine.py) uses the same kernels."""

from examples.torch_engine.engine import BF, CONV_WEIGHTS, GROUP, LAYER_WEIGHTS, TWO24, TorchEngine

__all__ = ["BF", "CONV_WEIGHTS", "GROUP", "LAYER_WEIGHTS", "TWO24", "TorchEngine"]
