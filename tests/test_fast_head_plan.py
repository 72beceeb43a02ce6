"""CPU checks of kernels_cu/fast_head.py (the fused head's host side; the kernel itself: tests/gpu/test_fast_head.py
and tests/test_nvcc_compile.py)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from kernels_cu.fast import head as fast_head

# An H200 (and H100) block may opt in to 227 KiB of shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin 232448).
H200_SMEM_OPTIN = 232448


def test_n_rounds_rows_up_to_the_wgmma_n():
    assert [fast_head.n_for(m) for m in (1, 7, 8, 9, 15, 120, 128)] == [8, 8, 8, 16, 16, 120, 128]


def _cu_value(n: int, name: str = "HT_SMEM_BYTES") -> int:
    """A constant of fast_head.cu (HT_SMEM_BYTES, the ping-pong kernel's HP_SMEM_BYTES, ...) for HT_N = n: its
    #defines read from the source and evaluated."""
    defines = {"HT_N": str(n)}
    for line in (fast_head.KERNEL_DIR / "fast" / "head.cu").read_text().splitlines():
        m = re.match(r"#define (H[TP]_\w+) (.+?)\s*(//.*)?$", line)
        if m and m.group(1) not in defines:
            defines[m.group(1)] = m.group(2)
    expr = defines[name]
    while re.search(r"H[TP]_\w+", expr):
        expr = re.sub(r"H[TP]_\w+", lambda m: f"({defines[m.group(0)]})", expr)
    return int(eval(expr, {"__builtins__": {}}))  # integer arithmetic of the source's own constants


def test_shared_memory_fits_one_block_at_every_n():
    """Every N the Ops can ask for fits an H200 block, and fast_head.smem_bytes (what the launch asks for) is the
    kernel source's HT_SMEM_BYTES (what its layout uses) at every N."""
    for n in range(8, fast_head.NMAX + 1, 8):
        assert fast_head.smem_bytes(n) <= H200_SMEM_OPTIN, n
        assert fast_head.smem_bytes(n) == _cu_value(n), n
        assert fast_head.smem_bytes_pp(n) <= H200_SMEM_OPTIN, n  # the ping-pong kernel's stages and staged logits
        assert fast_head.smem_bytes_pp(n) == _cu_value(n, "HP_SMEM_BYTES"), n


def test_probe_reads_the_clocks_as_the_kernel_writes_them():
    """benchmarks/fast_head_probe.py sizes and parses the ping-pong kernel's clock words by its own constants: they
    must be the kernel's (HP_PC words a warpgroup: the 8 sums, then 8 tiles x 4 events)."""
    from benchmarks import fast_head_probe

    assert fast_head_probe.PP_CLOCK_WORDS == _cu_value(8, "HP_PC") == len(fast_head_probe.PP_CLOCKS) + 8 * 4


def test_probe_and_round_switches_are_the_kernels():
    """Every define a probe variant (benchmarks/fast_head_probe.py) or round_ab's head_warp_rows builds with is a
    switch fast_head.cu tests (#ifdef / #ifndef / #if): a misspelt one would build the default kernel silently and
    time it under another name."""
    from benchmarks import fast_head_probe, round_ab

    src = (fast_head.KERNEL_DIR / "fast" / "head.cu").read_text()
    switches = set(re.findall(r"^#\s*(?:ifdef|ifndef|if)\s+(\w+)", src, re.MULTILINE))
    names = {name for _, _, defines in fast_head_probe.VARIANTS for name, _ in defines}
    names |= {name for name, _ in round_ab.CONFIGS["head_warp_rows"]["kernels_cu.fast.head.SELECT_DEFINES"]}
    names |= {name for name, _ in fast_head.WARP_FORM}
    assert {"HP_WARP_ROWS", "HP_TILE_COMPACT", "HP_PAIR", "HP_SET", "HP_AHEAD"} <= names
    assert names <= switches, sorted(names - switches)


@pytest.mark.parametrize("n", [8, 64, 120, 256])
def test_wgmma_wrapper_names_n_over_2_accumulators(n):
    src = fast_head.wgmma_wrapper(n)
    assert f"m64n{n}k16" in src
    assert f"float (&d)[{n // 2}]" in src
    regs = re.search(r"\{(%0[^}]*)\}", src).group(1).split(", ")
    assert regs == [f"%{i}" for i in range(n // 2)]
    assert f"%{n // 2}, %{n // 2 + 1}, p" in src  # the two descriptors follow the accumulators
    assert f"setp.ne.b32 p, %{n // 2 + 2}" in src


@pytest.mark.parametrize("n", [0, 4, 12, 264])
def test_wgmma_wrapper_refuses_an_n_wgmma_has_not(n):
    with pytest.raises(ValueError, match="multiple of 8"):
        fast_head.wgmma_wrapper(n)


def test_source_defines_n_and_puts_the_wrapper_inside_the_sm90a_guard():
    src = fast_head.source(24, (("HT_STAGES", 3),))
    assert src.startswith("#define HT_N 24\n#define HT_STAGES 3\n")
    guard = src.index("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)")
    assert guard < src.index("void ht_wgmma(") < src.index("fast_head_topk(")


def test_routing_rules_without_a_gpu(monkeypatch):
    """applies() is False without a compute-capability 9.0 GPU; with one (stood in), the Op's row limit, k, H and a
    shortlist decide."""
    assert fast_head.applies(7, 1000, 128, 16, op="candidate_topk") is False or fast_head._device_ok()
    monkeypatch.setattr(fast_head, "_device_ok", lambda: True)
    monkeypatch.setattr(fast_head, "MAX_ROWS", {"candidate_topk": 16, "proposal_head": 0})
    assert fast_head.applies(16, 1000, 128, 16, op="candidate_topk")
    assert not fast_head.applies(17, 1000, 128, 16, op="candidate_topk")
    assert not fast_head.applies(7, 1000, 128, 1, op="proposal_head")
    assert not fast_head.applies(7, 1000, 128, 17, op="candidate_topk")  # k past the buffers
    assert not fast_head.applies(7, 1000, 96, 16, op="candidate_topk")  # H not a multiple of 64
    assert not fast_head.applies(7, 1000, 128, 16, shortlist=object(), op="candidate_topk")
    assert fast_head.applies(128, 1000, 128, 16) and not fast_head.applies(129, 1000, 128, 16)
    monkeypatch.setattr(fast_head, "ENABLED", False)
    assert not fast_head.applies(7, 1000, 128, 16, op="candidate_topk")


def test_fast_round_routes_its_head_as_the_ops_do(monkeypatch):
    """FastRound's per-Op composition (graph=False, speculative_step) calls the Op methods and its graph round
    decides per workspace by the same rule (fast_head.applies with the Op's name: kernels_cu/fast_round.py
    RoundWorkspace), so both run the same kernels (tests/gpu/test_fast_round.py compares them bit for bit)."""
    from kernels_cu.fast import FastCudaBackend
    from kernels_cu.fast.round import FastRound

    monkeypatch.setattr(fast_head, "_device_ok", lambda: True)
    for be in (FastCudaBackend(), FastRound()):
        assert be._head_route(7, 248320, 5120, 16, None, "candidate_topk")
        assert be._head_route(120, 248320, 5120, 16, None, "candidate_topk")
        assert be._head_route(120, 248320, 2048, 1, None, "proposal_head")
        assert not be._head_route(129, 248320, 2048, 1, None, "proposal_head")
    monkeypatch.setattr(FastRound, "fused_head", False)  # off for the round: its Ops off too
    assert not FastRound()._head_route(7, 248320, 5120, 16, None, "candidate_topk")


def test_the_ops_take_the_warp_form_up_to_its_rows(monkeypatch):
    """fast_head.select_defines: v14's warp form up to WARP_FORM_MAX_ROWS hidden rows (faster there, session v15),
    the lane form above; SELECT_DEFINES, where set, at every row count; WARP_FORM_MAX_ROWS 0, the lane form
    everywhere."""
    assert fast_head.select_defines(1) == fast_head.select_defines(8) == fast_head.WARP_FORM
    assert fast_head.select_defines(9) == fast_head.select_defines(128) == ()
    monkeypatch.setattr(fast_head, "WARP_FORM_MAX_ROWS", 0)
    assert fast_head.select_defines(1) == ()
    monkeypatch.setattr(fast_head, "SELECT_DEFINES", (("HP_PAIR", 1),))
    assert fast_head.select_defines(1) == fast_head.select_defines(128) == (("HP_PAIR", 1),)


def test_shared_threshold_words_are_the_kernels(monkeypatch):
    """device_maps' words after the maps are fast_head.cu's: HP_GTHR_ROWS thresholds (NMAX, a u64 a hidden row) and
    the count of blocks done with them at gthr[HP_GTHR_ROWS] (HP_CLEAN), so MAPS_WORDS = MAP_WORDS + NMAX + 1; and
    the zeroing switch reaches the build (CLEAN False adds HP_CLEAN 0) and the launch (a memset exactly where CLEAN is
    off, so no launch runs with neither)."""
    src = (fast_head.KERNEL_DIR / "fast" / "head.cu").read_text()
    assert _cu_value(8, "HP_GTHR_ROWS") == fast_head.NMAX
    assert fast_head.MAPS_WORDS == fast_head.MAP_WORDS + fast_head.NMAX + 1
    assert "gthr + HP_GTHR_ROWS" in src and re.search(r"^#if HP_SHARED_THR && HP_CLEAN\b", src, re.MULTILINE)
    assert fast_head.CLEAN  # the default: the kernel zeroes, no memset
    assert ("HP_CLEAN", 0) not in fast_head.select_defines(120)
    monkeypatch.setattr(fast_head, "CLEAN", False)
    assert ("HP_CLEAN", 0) in fast_head.select_defines(120) and ("HP_CLEAN", 0) in fast_head.select_defines(7)
    calls = []
    monkeypatch.setattr(fast_head, "_zero_shared_thresholds", calls.append)
    monkeypatch.setattr(fast_head, "grid", lambda vr: 1)  # no device here
    maps = np.arange(fast_head.MAPS_WORDS, dtype=np.uint64)  # stands in for device_maps' array: only sliced here
    x, w = SimpleNamespace(shape=(8, 64)), SimpleNamespace(shape=(100, 64))
    memsets = {}
    for clean in (True, False):
        monkeypatch.setattr(fast_head, "CLEAN", clean)
        calls.clear()
        fast_head.launch(lambda *a, **kw: None, 8, x, w, 100, 4, None, None, 0, maps=maps)
        assert len(calls) <= 1 and all(np.array_equal(c, maps[fast_head.MAP_WORDS:]) for c in calls)
        memsets[clean] = bool(calls)
    assert memsets == {True: False, False: True}  # the memset exactly where the kernel does not zero
