"""CPU check of fast_attention.smem_bytes and alias_for (no GPU needed): the aliased shared-memory layout
(fast_attention.ALIAS, fast_attention.cu -DFA_ALIAS=1) is what lets 3 K/V stages hold two blocks a
multiprocessor at D 128 on an H200 (228 KB a multiprocessor, 1 KB reserved per block)."""

from __future__ import annotations

H200_SMEM_PER_SM = 233472
RESERVED_PER_BLOCK = 1024


def test_smem_bytes_by_hand():
    from kernels_cu.fast import attention as fa

    stage = 2 * 64 * 136 * 2  # K and V tiles [64][128 + 8] u16
    assert stage == 34816
    # aliased: the stages only
    assert fa.smem_bytes(128, 4, 3, alias=True) == 3 * stage == 104448
    assert 2 * (104448 + RESERVED_PER_BLOCK) <= H200_SMEM_PER_SM
    # default: one more region, the larger of q's rows [64][136] u16 (17,408 B) and the P scratch [4][16][64] fp32
    # (16,384 B)
    assert fa.smem_bytes(128, 4, 3) == fa.smem_bytes(128, 4, 3, alias=False) == 3 * stage + 17408 == 121856
    assert 2 * (121856 + RESERVED_PER_BLOCK) > H200_SMEM_PER_SM
    assert fa.smem_bytes(128, 4) == 2 * stage + 17408  # 2 stages, the default: two blocks either way
    for mt in (1, 2, 4):
        for stages in (2, 3, 4):
            assert fa.smem_bytes(128, mt, stages, alias=True) == stages * stage


def test_alias_only_at_d128(monkeypatch):
    from kernels_cu.fast import attention as fa

    monkeypatch.setattr(fa, "ALIAS", False)
    assert not any(fa.alias_for(dp) for dp in (16, 32, 64, 128))
    monkeypatch.setattr(fa, "ALIAS", True)
    assert [fa.alias_for(dp) for dp in (16, 32, 64, 128)] == [False, False, False, True]


def test_wgmma_form_smem_and_its_shapes(monkeypatch):
    """The wgmma form's tiles are [64][128] without padding (128-byte swizzle): 32 KiB a K/V stage against 34 KiB,
    after 1 KiB of alignment slack, plus the q / P-scratch region: two blocks a multiprocessor of 228 KB (1 KB
    reserved each) at 2 stages, one at 3 (the slack tips it). It takes only D 128 (no padded columns), 4 m-tiles,
    BF16 bits and the default layout; WGMMA False turns it off, True asks for it wherever the shape takes it."""
    from kernels_cu.fast import attention as fa

    stage = 2 * 64 * 128 * 2
    assert fa.smem_bytes(128, 4, 2, wg=True) == 1024 + 2 * stage + 17408 == 83968
    assert fa.smem_bytes(128, 4, 3, wg=True) == 1024 + 3 * stage + 17408 == 116736
    assert 2 * (83968 + RESERVED_PER_BLOCK) <= H200_SMEM_PER_SM < 2 * (116736 + RESERVED_PER_BLOCK)
    assert fa.wg_shape(128, 128, 4, True, False)
    assert not fa.wg_shape(128, 120, 4, True, False)  # D 120 pads to 128
    assert not fa.wg_shape(128, 128, 2, True, False)  # 32 rows: two warps' m-tiles, not a warpgroup's 64
    assert not fa.wg_shape(128, 128, 4, False, False)  # FP32 q/k/v: the split path
    assert not fa.wg_shape(128, 128, 4, True, True)  # the aliased layout
    monkeypatch.setattr(fa, "WGMMA", False)
    assert not fa.wg_for(128, 128, 4, True, False)
    monkeypatch.setattr(fa, "WGMMA", True)
    assert fa.wg_for(128, 128, 4, True, False) and not fa.wg_for(128, 128, 2, True, False)
