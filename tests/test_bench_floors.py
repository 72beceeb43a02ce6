"""The byte floors benchmarks/gpu_bench.py divides by (kernels_cu/fast/perf.py; CPU, no GPU needed).

The KV rings the block's attention reads are part of the masked_block and proposal_round floors
(both count the same bytes: each layer's K and V of every batch row read once).
Expected values worked by hand from the spec's geometry table: K is BF16 and V FP16 (2 bytes
each), one ring per layer and batch row, capacity S where S < F (DFlash2 27B: S 2048) else F.
"""

from __future__ import annotations

import pytest

from conformance.geometry import GEOMETRIES, _capacity
from kernels_cu.fast.perf import ring_bytes
from reference.config import PRESETS


@pytest.mark.parametrize("geo,b,expected", [
    # 5 layers x 2048 slots x 8 KV heads x 128 x (2 + 2) bytes = 41,943,040 per batch row
    ("dflash2-27b", 1, 41_943_040), ("dflash2-27b", 8, 335_544_320),
    # 6 layers x 4096 slots x 8 x 128 x 4 = 100,663,296 per batch row
    ("dflash-35b-a3b", 1, 100_663_296), ("dflash-35b-a3b", 8, 805_306_368),
])
def test_ring_bytes_at_the_official_geometries(geo, b, expected):
    cfg = PRESETS[GEOMETRIES[geo]]
    assert ring_bytes(cfg, b, _capacity(cfg, 4096)) == expected


def test_ring_bytes_grow_with_batch_and_capacity_only():
    cfg = PRESETS[GEOMETRIES["dflash2-27b"]]
    one = ring_bytes(cfg, 1, 100)
    assert ring_bytes(cfg, 3, 100) == 3 * one and ring_bytes(cfg, 1, 300) == 3 * one
    assert ring_bytes(cfg, 0, 100) == 0
