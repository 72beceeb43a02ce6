"""CPU check of the wgmma form's K/V tile layout in kernels_cu/fast/attention.cu (no GPU needed).

The kernel's element offset ``tile_el(row, col)`` (attn_body's ``el``) for the wgmma form is read from the .cu as text and evaluated here (its
C expression is also a Python expression), so these properties are the kernel's own:

- it places the 64 x 128 tile's elements one to one in 16 KiB (no padding);
- it is the 128-byte swizzle that the descriptors name (layout type 1): two halves of 64 columns, each 64 rows of
  128 bytes, 16-byte chunk c of row r at chunk c ^ (r % 8), which is Swizzle<3,4,3> applied to the row-major half
  (byte-address bits 4-6 XOR bits 7-9);
- the copies (a thread per 16-byte chunk: lch = t % 16, lrow = t / 16, as the kernel computes them) give each warp
  two whole ring rows, and the warp's 32 writes of 16 bytes meet every 4-byte bank exactly 4 times, the least that
  512 bytes allow (no bank conflict);
- the unswizzled 8 x 8 core-matrix layout (measured about 1.5x slower) fails that bank
  check under the same copy mapping: 16 chunks of a row land in the same 4 banks.
"""

from __future__ import annotations

import re
from collections import Counter

from kernels_cu.loader import source_path

SRC = source_path("fast/attention").read_text()
FA_NT, DP, THREADS = 64, 128, 128


def _kernel_el():
    """The WG branch of tile_el (attn_body's el), as a Python function of (row, col) -> element offset."""
    m = re.search(r"int tile_el\(int row, int col\) \{\s*return WG \? (.+?)\s*:\s*row \* ST \+ col;", SRC, re.DOTALL)
    assert m, "tile_el not found in fast/attention.cu"
    expr = " ".join(m.group(1).split())
    return eval(f"lambda row, col: {expr}", {"FA_NT": FA_NT})  # the kernel's own arithmetic, no outside input


def _copy_mapping():
    """(lch, lrow) of thread t, from the kernel's text."""
    assert "const int lch = threadIdx.x % CPRC, lrow = threadIdx.x / CPRC;" in SRC
    cprc = DP // 8
    return lambda t: (t % cprc, t // cprc)


def _banks_of_warp_writes(el, warp: int, j: int = 0) -> Counter:
    """4-byte banks hit by warp `warp`'s 16-byte copies of its j-th pass (rows lrow + RPP j), counted."""
    mapping, rpp = _copy_mapping(), THREADS // (DP // 8)
    hits = Counter()
    for t in range(32 * warp, 32 * warp + 32):
        lch, lrow = mapping(t)
        byte = 2 * el(lrow + rpp * j, lch * 8)
        assert byte % 16 == 0
        for word in range(4):
            hits[(byte // 4 + word) % 32] += 1
    return hits


def test_el_is_a_one_to_one_unpadded_tile():
    el = _kernel_el()
    offs = {el(r, c) for r in range(FA_NT) for c in range(DP)}
    assert offs == set(range(FA_NT * DP))
    for r in range(FA_NT):  # 16-byte chunks stay whole: 8 consecutive columns are 8 consecutive elements
        for c in range(0, DP, 8):
            assert [el(r, c + i) for i in range(8)] == list(range(el(r, c), el(r, c) + 8))


def test_el_is_the_128_byte_swizzle_of_each_half():
    el = _kernel_el()
    for r in range(FA_NT):
        for c in range(DP):
            half, cc = divmod(c, 64)
            linear = half * FA_NT * 128 + r * 128 + cc * 2  # bytes, row-major half, unswizzled
            swizzled = linear ^ (((linear >> 7) & 7) << 4)  # Swizzle<3,4,3>
            assert 2 * el(r, c) == swizzled, (r, c)


def test_each_warps_copies_meet_no_bank_twice_per_wavefront():
    el = _kernel_el()
    for warp in range(THREADS // 32):
        for j in range(FA_NT // (THREADS // (DP // 8))):
            assert set(_banks_of_warp_writes(el, warp, j).values()) == {4}, (warp, j)


def test_the_unswizzled_core_matrix_layout_fails_the_bank_check():
    def core(row, col):  # the unswizzled layout: 8 x 8 core matrices, the 16 of 8 rows in a row, no swizzle
        return (row >> 3) * (8 * DP) + (col >> 3) * 64 + (row & 7) * 8 + (col & 7)

    hits = _banks_of_warp_writes(core, 0)
    # each row's 16 chunks sit 128 bytes apart, so in the same 4 banks: the two rows hit 8 banks, 16 times each
    assert set(hits.values()) == {16} and len(hits) == 8
