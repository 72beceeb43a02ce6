"""``kernels_cu.fast_round:FastRound``: the fast mode's proposal round as one CUDA graph per (B, W, C)
(kernels_cu/fast/round.py), under the name the documentation's --impl strings use."""

from kernels_cu.fast.round import FastRound

__all__ = ["FastRound"]
