"""The grouped_conv strategy: shapes, delta and base scales, the memory-order and rounding designs."""

from __future__ import annotations

from conformance.strategies.base import Strategy, _composite, salt, st


@_composite
def _conv_params(draw):
    designs = ["random", "col0_tap", "delta_per_channel", "coef_near_cancel", "coef_cancels"]
    return {"design": draw(st.sampled_from(designs)),
            "b": draw(st.integers(1, 4)), "w": draw(st.integers(1, 16)), "groups": draw(st.integers(1, 8)),
            "delta_scale": draw(st.sampled_from([1.0, 0.0, 100.0, 1e4])),
            "base_scale": draw(st.sampled_from([0.5, 0.0])), "salt": draw(salt())}


def _build_conv(cid, p):
    from conformance.cases import grouped_conv as m

    h = 16 * p["groups"]
    if p["design"] == "random":
        return m._random(cid, p["b"], p["w"], h, delta_scale=p["delta_scale"], base_scale=p["base_scale"])
    fn = {"col0_tap": m.col0_tap, "delta_per_channel": m.delta_per_channel,
          "coef_near_cancel": m.coef_near_cancel, "coef_cancels": m.coef_cancels}[p["design"]]
    return fn(cid, p["b"], p["w"], h)


STRATEGY = Strategy(
    "grouped_conv", lambda: _conv_params(), _build_conv,
    "B 1..4, W 1..16, H = 16..128 (1..8 groups), delta scale 0..1e4, base 0 or 0.5; designs: random, "
    "column-0 tap (wrap), deltas per group far apart, (base + delta) nearly cancelling, (base + delta) "
    "exactly 0 with the FP32 delta off the BF16 grid")
