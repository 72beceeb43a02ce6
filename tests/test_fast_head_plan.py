"""CPU checks of kernels_cu/fast/head.py (the fused head's host side; the kernel itself: tests/gpu/test_fast_head.py
and tests/test_nvcc_compile.py)."""

from __future__ import annotations

import re

import pytest

from kernels_cu.fast import head as fast_head
from kernels_cu.fast.options import FastOptions
from kernels_cu.loader import source_path

# An H200 (and H100) block may opt in to 227 KiB of shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin 232448).
H200_SMEM_OPTIN = 232448


def test_n_rounds_rows_up_to_the_wgmma_n():
    assert [fast_head.n_for(m) for m in (1, 7, 8, 9, 15, 120, 128)] == [8, 8, 8, 16, 16, 120, 128]


def _cu_value(n: int, name: str = "HT_SMEM_BYTES") -> int:
    """A constant of fast/head.cu (HT_SMEM_BYTES, the ping-pong kernel's HP_SMEM_BYTES, ...) for HT_N = n: its
    #defines read from the source and evaluated."""
    defines = {"HT_N": str(n)}
    for line in source_path("fast/head").read_text().splitlines():
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


def test_the_ops_switches_are_the_kernels():
    """Every define the Ops' build adds (select_defines' warp form, the tests' HT_DUMP) is a switch fast/head.cu tests
    (#ifdef / #ifndef / #if): a misspelt one would build the default kernel silently."""
    src = source_path("fast/head").read_text()
    switches = set(re.findall(r"^#\s*(?:ifdef|ifndef|if)\s+(\w+)", src, re.MULTILINE))
    assert {name for name, _ in fast_head.WARP_FORM} | {"HT_DUMP"} <= switches


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
    few = FastOptions(fused_head_max_rows_topk=16, fused_head_max_rows_proposal=0)
    assert fast_head.applies(16, 1000, 128, 16, op="candidate_topk", options=few)
    assert not fast_head.applies(17, 1000, 128, 16, op="candidate_topk", options=few)
    assert not fast_head.applies(7, 1000, 128, 1, op="proposal_head", options=few)
    assert fast_head.applies(7, 1000, 128, 1, op="proposal_head")
    assert not fast_head.applies(7, 1000, 128, 17, op="candidate_topk")  # k past the buffers
    assert not fast_head.applies(7, 1000, 96, 16, op="candidate_topk")  # H not a multiple of 64
    assert not fast_head.applies(7, 1000, 128, 16, shortlist=object(), op="candidate_topk")
    assert fast_head.applies(128, 1000, 128, 16) and not fast_head.applies(129, 1000, 128, 16)
    assert not fast_head.applies(7, 1000, 128, 16, op="candidate_topk", options=FastOptions(fused_head=False))


def test_fast_round_routes_its_head_as_the_ops_do(monkeypatch):
    """FastRound's per-Op composition (graph=False, speculative_step) calls the Op methods and its graph round
    decides per workspace by the same rule (fast_head.applies with the Op's name and the object's options:
    kernels_cu/fast/round.py RoundWorkspace), so both run the same kernels (tests/gpu/test_fast_round.py compares them bit for bit)."""
    from kernels_cu.fast import FastCudaBackend
    from kernels_cu.fast.round import FastRound

    monkeypatch.setattr(fast_head, "_device_ok", lambda: True)
    for be in (FastCudaBackend(), FastRound()):
        assert be._head_route(7, 248320, 5120, 16, None, "candidate_topk")
        assert be._head_route(120, 248320, 5120, 16, None, "candidate_topk")
        assert be._head_route(120, 248320, 2048, 1, None, "proposal_head")
        assert not be._head_route(129, 248320, 2048, 1, None, "proposal_head")
    off = FastOptions(fused_head=False)  # off for the round: its Ops off too
    assert not FastRound(options=off)._head_route(7, 248320, 5120, 16, None, "candidate_topk")
    assert not FastCudaBackend(options=off)._head_route(7, 248320, 5120, 16, None, "candidate_topk")


def test_the_ops_take_the_warp_form_up_to_its_rows():
    """fast_head.select_defines: the warp form up to options.head_warp_form_max_rows hidden rows (faster there), the
    lane form above; 0, the lane form everywhere; 128, the warp form everywhere."""
    assert fast_head.select_defines(1) == fast_head.select_defines(8) == fast_head.WARP_FORM
    assert fast_head.select_defines(9) == fast_head.select_defines(128) == ()
    assert fast_head.select_defines(1, FastOptions(head_warp_form_max_rows=0)) == ()
    assert fast_head.select_defines(128, FastOptions(head_warp_form_max_rows=128)) == fast_head.WARP_FORM


def test_shared_threshold_words_are_the_kernels():
    """device_maps' words after the maps are fast/head.cu's: HP_GTHR_ROWS thresholds (NMAX, a u64 a hidden row) and
    the count of blocks done with them at gthr[HP_GTHR_ROWS] (the kernel's last block zeroes them for the next
    launch), so MAPS_WORDS = MAP_WORDS + NMAX + 1; the Ops' build never turns the zeroing off."""
    src = source_path("fast/head").read_text()
    assert _cu_value(8, "HP_GTHR_ROWS") == fast_head.NMAX
    assert fast_head.MAPS_WORDS == fast_head.MAP_WORDS + fast_head.NMAX + 1
    assert "gthr + HP_GTHR_ROWS" in src and re.search(r"^#if HP_SHARED_THR && HP_CLEAN\b", src, re.MULTILINE)
    assert all(name not in ("HP_CLEAN", "HP_SHARED_THR") for m in (1, 8, 9, 128)
               for name, _ in fast_head.select_defines(m))
