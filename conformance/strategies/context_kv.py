"""The context_kv strategy: ring and paged layouts, chunks, starts, RoPE and V representation designs."""

from __future__ import annotations

from conformance.strategies import base
from conformance.strategies.base import Strategy, _composite, _near, positions, salt, st


@_composite
def _context_params(draw):
    design = draw(st.sampled_from(["random", "k_cancel", "v_offset", "fp16_overflow", "fp16_subnormal"]))
    paged = draw(st.booleans())
    rows = draw(st.integers(1, 40))
    hk = draw(st.integers(1, 2))
    d = draw(st.sampled_from([16, 32, 64]))
    n = hk * d
    h = max(draw(st.sampled_from([64, 96, 128])), 2 * n + (16 if design != "random" else 0))
    theta = draw(st.sampled_from([1e7, 1e4]))
    p = {"design": design, "storage": "paged" if paged else "ring", "rows": rows, "hk": hk, "d": d, "h": h,
         "theta": theta}
    if paged:
        ps = draw(st.sampled_from([4, 2, 8, 16]))
        start = draw(st.integers(0, 48))
        p.update(start=start, page_size=ps, pages=-(-(start + rows) // ps) + draw(st.integers(0, 3)))
    else:
        cap = draw(st.integers(2, 16))
        p.update(start=draw(st.one_of(st.integers(0, 64), _near(10**6), positions(wide=rows, top=base.ROPE_NEAR_2P63))),
                 capacity=cap)
    p["salt"] = draw(salt())
    return p


def _build_context(cid, p):
    from conformance.cases import context_kv as m

    kw = {"start": p["start"], "rows": p["rows"], "hk": p["hk"], "d": p["d"], "h": p["h"], "design": p["design"],
          "theta": p["theta"]}
    if p["storage"] == "paged":
        kw.update(page_size=p["page_size"], pages=p["pages"])
    else:
        kw["capacity"] = p["capacity"]
    return m.make(cid, [], **kw)


STRATEGY = Strategy(
    "context_kv", lambda: _context_params(), _build_context,
    "ring (capacity 2..16, not only powers of two) and paged (page size 2..16, permuted tables) "
    "layouts; chunks 1..40 rows (shorter, equal, longer than the ring); starts near 10^6, 2^24, 2^31, "
    "2^32, 2^40, 2^63; Hk 1..2, D 16..64, theta 1e7 / 1e4; designs: random, RoPE-cancelling K, V two or "
    "three FP16 ulps off BF16, V at the FP16 overflow and subnormal edges")
