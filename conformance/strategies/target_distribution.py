"""The target_distribution strategy: temperatures, filters, penalties, padding, planted ties."""

from __future__ import annotations

import numpy as np

from conformance import registry
from conformance.registry import Case
from conformance.strategies.base import Reject, Strategy, _composite, _per_row, salt, st

_T_VALUES = [1.0, 0.0, -1.0, 0.3, 0.7, 2.5]


@_composite
def _target_params(draw):
    n = draw(st.integers(1, 6))
    vr = draw(st.sampled_from([32, 2, 7, 48, 64, 256]))
    pad = draw(st.sampled_from([0, 0, 1, vr // 4]))
    row = lambda values: _per_row(n, st.sampled_from(values))
    return {"n": n, "vr": vr, "pad": pad if vr - pad >= 2 else 0, "scale": draw(st.sampled_from([2.0, 1.0, 40.0])),
            "prompt": draw(st.sampled_from([0.0, 0.3])), "history": draw(st.sampled_from([0.0, 0.3])),
            "ties": draw(st.booleans()),
            "temperature": draw(row(_T_VALUES)),
            "top_k": draw(row([0, -1, 1, 2, 5, vr - 1, vr, vr + 1, 2**31 - 1])),
            "top_p": draw(row([1.0, 1.5, 0.01, 0.5, 0.6, 0.8, 0.9, 0.99])),
            "min_p": draw(row([0.0, -0.5, 0.01, 0.05, 0.1, 0.3, 0.9])),
            "repetition_penalty": draw(row([1.0, 0.8, 1.2, 1.4, 2.0, 5.0])),
            "frequency_penalty": draw(row([0.0, 0.3, 0.5, 1.0, -0.3])),
            "presence_penalty": draw(row([0.0, 0.5, 0.7, 1.0])), "salt": draw(salt())}


def _build_target(cid, p):
    from conformance.cases import target_distribution as m

    rng = registry.case_rng(cid)
    n, vr = p["n"], p["vr"]
    vocab = vr - p["pad"] if p["pad"] else None
    filt = {k: np.asarray(p[k], np.float32) for k in m.PARAMS}
    filt["top_k"] = np.asarray(p["top_k"], np.int64).astype(np.int32)
    for _ in range(100):  # as the generator's _drawn: redrawn until every filter decision is clear
        logits = rng.standard_normal((n, vr)) * p["scale"]
        if p["ties"]:
            top = np.sort(logits, axis=1)[:, -1:] + 0.5
            for i in range(n):
                logits[i, rng.permutation(vocab or vr)[: min(8, vocab or vr)]] = top[i]
        if vocab is not None:
            logits[:, vocab:] = rng.uniform(10, 30, (n, vr - vocab))
        pm = rng.random((n, vr)) < p["prompt"]
        oc = np.where(rng.random((n, vr)) < p["history"], rng.integers(1, 4, (n, vr)), 0)
        inputs, params = m.td_inputs(logits, prompt_mask=pm, output_counts=oc, vocab_size=vocab, **filt)
        if p["ties"] or all(m.boundary_distance(inputs, params, i) > m.GAP for i in range(n)):
            return Case(id=cid, inputs=inputs, params=params)
    raise Reject("no clear draw")


STRATEGY = Strategy(
    "target_distribution", lambda: _target_params(), _build_target,
    "N 1..6 rows, vocab 2..256 with padding; per row temperature (<= 0 greedy, 0.3..2.5), top-k (<= 0, "
    "1, k at and above the vocabulary, 2^31-1), top-p (0.01..0.99, 1, 1.5), min-p (<= 0, 0.01..0.9), "
    "repetition (0.8..5), frequency (-0.3..1), presence penalties, prompt and output history; planted "
    "exact ties; logit scales 1..40")
