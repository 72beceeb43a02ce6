"""``kernels_cu.round:CudaRound``: the exact mode with proposal_round and speculative_step composed from its
Op kernels (kernels_cu/exact/round.py), under the name the documentation's --impl strings use."""

from kernels_cu.exact.round import CudaRound

__all__ = ["CudaRound"]
