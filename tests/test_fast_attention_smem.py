"""CPU check of fast_attention.smem_bytes and alias_for (no GPU needed): the aliased shared-memory layout
(fast_attention.ALIAS, fast_attention.cu -DFA_ALIAS=1) is what lets 3 K/V stages hold two blocks a
multiprocessor at D 128 on an H200 (228 KB a multiprocessor, 1 KB reserved per block)."""

from __future__ import annotations

H200_SMEM_PER_SM = 233472
RESERVED_PER_BLOCK = 1024


def test_smem_bytes_by_hand():
    from kernels_cu import fast_attention as fa

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
    from kernels_cu import fast_attention as fa

    monkeypatch.setattr(fa, "ALIAS", False)
    assert not any(fa.alias_for(dp) for dp in (16, 32, 64, 128))
    monkeypatch.setattr(fa, "ALIAS", True)
    assert [fa.alias_for(dp) for dp in (16, 32, 64, 128)] == [False, False, False, True]
