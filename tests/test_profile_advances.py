"""kernels_cu.fast.perf.advances (what benchmarks/profile_round.py reports) by hand: how far each kernel's end
moves the completion frontier of a traced call, for overlapping (PDL) and sequential kernels."""

from __future__ import annotations

from kernels_cu.fast.perf import advances


def test_sequential_kernels_advance_by_their_durations_plus_gaps():
    call = [{"ts": 0.0, "dur": 3.0}, {"ts": 4.0, "dur": 2.0}, {"ts": 6.0, "dur": 1.0}]
    assert advances(call) == [3.0, 3.0, 1.0]  # the 1 us gap before the second kernel is its advance too


def test_overlapping_kernels_count_only_past_the_frontier():
    # a kernel started early (PDL) that ends 1 us after the one ahead; one that ends inside it; the last
    call = [{"ts": 0.0, "dur": 10.0}, {"ts": 2.0, "dur": 9.0}, {"ts": 3.0, "dur": 4.0}, {"ts": 5.0, "dur": 8.0}]
    adv = advances(call)
    assert adv == [10.0, 1.0, 0.0, 2.0]
    assert sum(adv) == 13.0  # the span: first start to last end
