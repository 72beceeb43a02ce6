"""What the fast mode's performance checks compute from shapes and traces alone (no GPU): the bytes a round must
move (the floors benchmarks/gpu_bench.py divides by) and, for a traced call, how far each kernel moves its
completion frontier (benchmarks/profile_round.py)."""

from __future__ import annotations


def ring_bytes(cfg, b: int, cap: int) -> int:
    """Bytes of the KV rings the block's attention must read once: every layer's K (BF16) and V (FP16) of b batch
    rows at capacity cap (the masked_block and proposal_round floors). ``cfg``: a reference.config preset."""
    return cfg.num_hidden_layers * b * cap * cfg.num_key_value_heads * cfg.head_dim * (2 + 2)


def advances(call: list[dict]) -> list[float]:
    """Per kernel (in start order, each {"ts", "dur"} in us), how far its end moves the call's completion frontier:
    its end less the latest end of the kernels before it (0 if it ends earlier; the first kernel: its duration).
    Under programmatic dependent launch a kernel's duration includes the time it waits after an early start, so
    durations overlap; the advances do not, and they add up to the span."""
    out, frontier = [], None
    for k in call:
        end = k["ts"] + k["dur"]
        out.append(k["dur"] if frontier is None else max(0.0, end - frontier))
        frontier = end if frontier is None else max(frontier, end)
    return out
