"""The split path of the fast target_distribution (kernels_cu/fast/backend.py _ftd_split_plan): launch
shapes planned on the CPU (no GPU, no CuPy needed)."""

from __future__ import annotations

import re

import pytest

from kernels_cu.fast import backend as fast
from kernels_cu.loader import source_path

SRC = source_path("fast/target_distribution").read_text()


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
    rows = fast.DEFAULT_OPTIONS.target_split_max_rows
    assert fast.FastCudaBackend().options.target_split_max_rows == rows
    assert 8 <= rows < 128  # N 8 splits, N 128 keeps one block per row


def _launches(monkeypatch, N=8, Vr=248320):
    """The kernels _target_split launches, in order, with their `stage` argument where they take
    one (CuPy stood in by NumPy; no kernel runs)."""
    import numpy as np

    calls = []

    def fn(module, name):
        def launch(grid, block, args):
            calls.append((name, grid, args))
        return launch

    monkeypatch.setattr(fast, "_fn", fn)
    monkeypatch.setattr(fast, "cp", lambda: np)
    sampling = tuple(object() for _ in range(7))
    fast._target_split(None, None, None, sampling, N, Vr, Vr, None, None)
    return calls, sampling


def _stage(name, args, sampling):
    """The `stage` argument of a split kernel: after the sampling pointers, n and v (and chunk)."""
    rest = args[args.index(sampling[-1]) + 1:]
    return int(rest[3] if name in ("ftd_split_hist0", "ftd_split_compact") else rest[2])


def test_each_normaliser_chain_runs_once_in_order(monkeypatch):
    """The top-p total (chain stage 0) after the top-k filter and before the top-p histogram, the
    final total (stage 1) once after the filters: each chain stage has its own ticket counter in
    the row state, so a stage launched twice would never see its last ticket again (the bug the
    H200 found on 2026-12-01: both launches passed stage 1)."""
    calls, sampling = _launches(monkeypatch)
    names = [c[0] for c in calls]
    chains = [_stage(n, a, sampling) for n, _, a in calls if n == "ftd_split_chain"]
    assert chains == [0, 1]
    first_hist_p = next(i for i, (n, _, a) in enumerate(calls)
                        if n == "ftd_split_hist0" and _stage(n, a, sampling) == 1)
    assert names.index("ftd_split_chain") < first_hist_p
    assert names[-2:] == ["ftd_split_chain", "ftd_split_write"]
    for kernel in ("ftd_split_hist0", "ftd_split_compact", "ftd_split_fallback"):
        assert [_stage(n, a, sampling) for n, _, a in calls if n == kernel] == [0, 1]
