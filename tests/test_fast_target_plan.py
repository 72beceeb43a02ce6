"""The split path of the fast target_distribution (kernels_cu/fast.py _ftd_split_plan): launch
shapes planned on the CPU (no GPU, no CuPy needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels_cu import fast

SRC = (Path(fast.__file__).resolve().parent / "fast_target.cu").read_text()


def _define(name: str) -> int:
    return int(re.search(rf"#define {name} (\d+)", SRC).group(1))


def test_constants_match_the_kernel():
    assert fast._FTD_THREADS == _define("FTD_THREADS")
    assert fast._FTD_BINS == _define("FTD_BINS")
    assert fast._FTD_CAP == _define("FTD_CAP")
    assert fast._FTD_CHAINS == _define("FTD_CHAINS")
    # the chains are the exact kernel's 512 threads (accept.cu ROW_THREADS): 32 per block
    assert fast._FTD_CHAINS * 32 == 512 == _define("FTD_THREADS")
    assert f"sizeof(RowState) <= {fast._FTD_STATE_BYTES}" in SRC


@pytest.mark.parametrize("n", [1, 2, 3, 8, 12, 33, 63, 64, 128, 1000])
@pytest.mark.parametrize("vr", [1, 511, 512, 513, 1000, 4096, 50_000, 151_936, 248_320, 262_144])
def test_plan_covers_every_token_once(n, vr):
    p = fast._ftd_split_plan(n, vr)
    for chunk, blocks in [(p["chunk"], p["C"]), (p["hchunk"], p["HC"])]:
        assert chunk % 512 == 0 and chunk > 0
        assert blocks >= 1 and (blocks - 1) * chunk < vr <= blocks * chunk  # no empty block, none missing
        assert blocks <= 65535
    assert p["HC"] <= 32  # partial histograms merged by one block per row
    assert p["chains"] * 32 == 512


def test_plan_spreads_few_rows_over_the_gpu():
    for n in (1, 2, 4, 8):
        p = fast._ftd_split_plan(n, 248_320)
        assert n * p["C"] >= min(2 * 132 - n, 61 * n) and n * p["HC"] >= min(132, 31 * n)  # chunks >= 4096 / 8192
    p = fast._ftd_split_plan(8, 248_320)
    assert (p["C"], p["HC"]) == (33, 17)


def test_plan_rejects_empty():
    with pytest.raises(ValueError):
        fast._ftd_split_plan(0, 100)
    with pytest.raises(ValueError):
        fast._ftd_split_plan(4, 0)


def test_dispatch_keeps_the_single_block_kernel_where_it_wins():
    assert fast.FastCudaBackend.target_split_max_rows == fast._FTD_SPLIT_MAX_ROWS
    assert 8 <= fast._FTD_SPLIT_MAX_ROWS < 128  # N 8 splits, N 128 keeps one block per row
