"""CPU check of the fast attention's shared memory (kernels_cu/fast/attention.py smem_bytes, no GPU needed): how many
blocks of each variant an H200 multiprocessor holds (228 KB a multiprocessor, 1 KB reserved per block)."""

from __future__ import annotations

H200_SMEM_PER_SM = 233472
RESERVED_PER_BLOCK = 1024


def test_smem_bytes_by_hand():
    from kernels_cu.fast import attention as fa

    stage = 2 * 64 * 136 * 2  # K and V tiles [64][128 + 8] u16
    assert stage == 34816
    # default: one more region, the larger of q's rows [64][136] u16 (17,408 B) and the P scratch [4][16][64] fp32
    # (16,384 B)
    assert fa.smem_bytes(128, 4, 3) == 3 * stage + 17408 == 121856
    assert 2 * (121856 + RESERVED_PER_BLOCK) > H200_SMEM_PER_SM
    assert fa.smem_bytes(128, 4) == 2 * stage + 17408  # 2 stages, the default: two blocks a multiprocessor
    assert 2 * (fa.smem_bytes(128, 4) + RESERVED_PER_BLOCK) <= H200_SMEM_PER_SM
    for mt, region in ((1, 4352), (2, 8704), (4, 17408)):  # q's rows [16 mt][136] u16 > the P scratch [4][16][16 mt]
        for stages in (2, 3, 4):
            assert fa.smem_bytes(128, mt, stages) == stages * stage + region


def test_wgmma_form_smem_and_its_shapes():
    """The wgmma form's tiles are [64][128] without padding (128-byte swizzle): 32 KiB a K/V stage against 34 KiB,
    after 1 KiB of alignment slack, plus the q / P-scratch region: two blocks a multiprocessor of 228 KB (1 KB
    reserved each) at 2 stages, one at 3 (the slack tips it). It takes only D 128 (no padded columns), 4 m-tiles,
    BF16 bits; options.attention_wgmma False turns it off, True asks for it wherever the shape takes it."""
    from kernels_cu.fast import FastOptions
    from kernels_cu.fast import attention as fa

    stage = 2 * 64 * 128 * 2
    assert fa.smem_bytes(128, 4, 2, wg=True) == 1024 + 2 * stage + 17408 == 83968
    assert fa.smem_bytes(128, 4, 3, wg=True) == 1024 + 3 * stage + 17408 == 116736
    assert 2 * (83968 + RESERVED_PER_BLOCK) <= H200_SMEM_PER_SM < 2 * (116736 + RESERVED_PER_BLOCK)
    assert fa.wg_shape(128, 128, 4, True)
    assert not fa.wg_shape(128, 120, 4, True)  # D 120 pads to 128
    assert not fa.wg_shape(128, 128, 2, True)  # 32 rows: two warps' m-tiles, not a warpgroup's 64
    assert not fa.wg_shape(128, 128, 4, False)  # FP32 q/k/v: the split path
    assert not fa.wg_for(128, 128, 4, True, FastOptions(attention_wgmma=False))
    on = FastOptions(attention_wgmma=True)
    assert fa.wg_for(128, 128, 4, True, on) and not fa.wg_for(128, 128, 2, True, on)
