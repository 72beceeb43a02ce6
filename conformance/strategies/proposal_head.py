"""The proposal_head strategy: full and indexed heads, padded rows, duplicate winners, near ties."""

from __future__ import annotations

from conformance.strategies.base import Strategy, _composite, salt, st


@_composite
def _head_params(draw):
    b, k = draw(st.integers(1, 3)), draw(st.integers(1, 15))
    ties = draw(st.integers(0, min(b * k, 6)))
    indexed = draw(st.booleans())
    near = draw(st.booleans())
    rows = max(draw(st.sampled_from([64, 16, 32, 128, 256])), 2 * (b * k + ties) + 8)
    if indexed:
        vocab = rows + draw(st.integers(0, 400))
        traps = draw(st.booleans())
        pad = 0
    else:
        pad = draw(st.integers(0, rows // 4))
        vocab, traps = rows, draw(st.booleans()) and pad > 0
        rows = rows + pad
    return {"b": b, "k": k, "h": draw(st.sampled_from([32, 16, 64])), "rows": rows, "vocab": vocab,
            "indexed": indexed, "pad_traps": traps and not indexed, "shortlist_traps": traps and indexed,
            "ties": ties, "near_ties": near, "salt": draw(salt())}


def _build_head(cid, p):
    from conformance.cases import proposal_head as m

    return m.make(cid, [], b=p["b"], k=p["k"], h=p["h"], rows=p["rows"], vocab=p["vocab"], indexed=p["indexed"],
                  pad_traps=p["pad_traps"], ties=p["ties"], shortlist_traps=p["shortlist_traps"],
                  near_ties=p["near_ties"])


STRATEGY = Strategy(
    "proposal_head", lambda: _head_params(), _build_head,
    "B 1..3, K 1..15, H 16..64; full heads with 0..rows/4 padded rows (trapped: twice a winner) and "
    "indexed heads (shortlist remap, trapped ids past the vocabulary); exact duplicate winners; BF16 "
    "near ties")
