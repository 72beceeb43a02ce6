"""The masked_block strategy: DFlash and DFlash2 layer stacks, tails, rings, frontiers, GQA."""

from __future__ import annotations

from conformance.strategies import base
from conformance.strategies.base import Strategy, _composite, _heads, _per_row, positions, salt, st


@_composite
def _block_params(draw):
    variant = draw(st.sampled_from(["dflash", "dflash2"]))
    b = draw(st.integers(1, 3))
    k = draw(st.integers(1, 15))
    s = draw(st.integers(2, 16))
    if variant == "dflash" and draw(st.booleans()):  # a full layer: the ring holds every position
        windows = draw(st.sampled_from([[s, 0], [0, 0], [0, s]]))
        frontier = draw(_per_row(b, st.integers(0, 40)))
        capacity = max(s, max(frontier)) + draw(st.integers(0, 8))
    else:
        windows = [s, draw(st.sampled_from([s, max(2, s // 2)]))]
        edge = st.integers(-2, 2).map(lambda d: max(0, s + d))
        frontier = draw(_per_row(b, st.one_of(st.integers(0, 4 * s), edge,
                                              positions(wide=k + 1, top=base.ROPE_NEAR_2P63))))
        capacity = s + draw(st.integers(0, 8))
    hk, hq = draw(_heads())
    return {"variant": variant, "windows": windows, "capacity": capacity, "frontier": frontier,
            "live": draw(_per_row(b, st.integers(1, k + 1))), "num_drafts": k, "hq": hq, "hk": hk,
            "d": draw(st.sampled_from([16, 8])), "h": draw(st.sampled_from([64, 32, 96])), "salt": draw(salt())}


def _build_block(cid, p):
    from conformance.cases import masked_block as m

    return m.make(cid, [], variant=p["variant"], windows=p["windows"], capacity=p["capacity"], frontier=p["frontier"],
                  live=p["live"], num_drafts=p["num_drafts"], h=p["h"], hq=p["hq"], hk=p["hk"], d=p["d"], inter=128)


STRATEGY = Strategy(
    "masked_block", lambda: _block_params(), _build_block,
    "DFlash (local/full layer stacks) and DFlash2 (two local layers with convs), K 1..15, live per row "
    "1..K+1 (P < K tails), B 1..3, S 2..16, ring capacity S..S+8, frontiers around S, to 4S, near "
    "2^24..2^63; GQA Hq/Hk in {1, 2, 4}, Hk 1..3")
