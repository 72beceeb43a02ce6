"""The speculative_accept strategy: greedy and sampled rows, retained q, every tail extent, the designs."""

from __future__ import annotations

import numpy as np

from conformance.strategies.base import Reject, Strategy, _composite, _per_row, positions, salt, seeds, st

_DESIGNS = ["plain", "swapped", "bonus_rows_differ", "correction_from_p", "history", "residual_zero", "tie",
            "same_request", "repeats"]


@_composite
def _accept_params(draw):
    design = draw(st.sampled_from(_DESIGNS))
    if design in ("history",):
        return {"design": design, "greedy": draw(st.booleans()), "retained": draw(st.booleans()), "salt": draw(salt())}
    if design in ("residual_zero", "tie"):
        return {"design": design, "salt": draw(salt())}
    if design == "repeats":  # a small vocabulary and a long accepted prefix: tokens recur in the history
        k = draw(st.integers(3, 7))
        return {"design": design, "b": 1, "k": k, "p": [k], "a": [draw(st.integers(2, k))], "v": 8, "pad": 0,
                "greedy": [draw(st.booleans())], "retained": False, "seed": [draw(seeds())],
                "frontier": [draw(positions(small=5000, wide=k + 2))], "temperature": None, "top_k": [0],
                "top_p": [1.0], "min_p": [0.0], "repetition_penalty": [draw(st.sampled_from([2.0, 1.5, 3.0]))],
                "frequency_penalty": [draw(st.sampled_from([0.0, 0.5]))], "presence_penalty": [0.0],
                "salt": draw(salt())}
    b = draw(st.integers(1, 4)) if design in ("plain", "same_request") else 1
    if design == "same_request":
        b = max(b, 2)
    k = draw(st.integers(1, 8))
    if design == "swapped":
        k = max(k, 2)
    if design == "bonus_rows_differ":
        k = max(k, 2)
    p_live = draw(_per_row(b, st.integers(0, k)))
    if design == "same_request":
        p_live = [p_live[0]] * b
    if design == "bonus_rows_differ":
        p_live = [min(max(p_live[0], 1), k - 1)]
    if design == "swapped":
        p_live = [max(p_live[0], 2)]
    accepted = [draw(st.integers(0, x)) for x in p_live]
    if design == "same_request":
        accepted = [accepted[0]] * b
    if design == "swapped":
        accepted = [1]
    if design == "bonus_rows_differ":
        accepted = p_live
    if design == "correction_from_p":
        p_live = [max(p_live[0], 1)]
        accepted = [min(accepted[0], p_live[0] - 1)]
    retained = draw(st.booleans())
    v = draw(st.sampled_from([64, 24, 256] if retained else [64, 8, 16, 24, 256]))  # retained q: top-16 ids
    greedy = draw(_per_row(b, st.booleans()))
    if design == "bonus_rows_differ":
        greedy = [True]
    if design in ("swapped", "correction_from_p"):
        greedy = [False]
    row = lambda values: _per_row(b, st.sampled_from(values))
    same = design == "same_request"
    p = {"design": design, "b": b, "k": k, "p": p_live, "a": accepted, "v": v,
         "pad": draw(st.sampled_from([0, 6])) if v >= 16 else 0, "greedy": greedy if not same else [greedy[0]] * b,
         "retained": retained,
         "seed": [draw(seeds())] * b if same else draw(_per_row(b, seeds())),
         "frontier": [draw(positions(small=5000, wide=k + 2))] * b if same
         else draw(_per_row(b, positions(small=5000, wide=k + 2))),
         "temperature": draw(st.one_of(st.none(), row([1.0, 0.5, 1.7, 0.3]))),
         "top_k": draw(row([0, 4, 8, 20])), "top_p": draw(row([1.0, 0.8, 0.95])),
         "min_p": draw(row([0.0, 0.1, 0.05, 0.02])), "repetition_penalty": draw(row([1.0, 1.3, 1.5, 2.0])),
         "frequency_penalty": draw(row([0.0, 0.3, 0.5])), "presence_penalty": draw(row([0.0, 0.2, 0.5])),
         "salt": draw(salt())}
    if same:
        for key in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
                    "presence_penalty"):
            if p[key] is not None:
                p[key] = [p[key][0]] * b
    return p


def _build_accept(cid, p):
    from conformance.cases import speculative_accept as m

    try:
        if p["design"] == "history":
            return m._history_case(cid, p["greedy"], retained=p["retained"])
        if p["design"] == "residual_zero":
            return m._residual_zero_case(cid)
        if p["design"] == "tie":
            return m._tie_case(cid)
        check = None
        if p["design"] == "swapped":
            def check(inputs, params, out):
                pr = m._row_p(inputs, params, 0, 1, inputs["proposals"][0, :1])
                d = int(inputs["proposals"][0, 1])
                qd = 1.0 if "q" not in inputs else float(inputs["q"][0, 1][inputs["q_ids"][0, 1] == d].sum())
                return pr[d] < qd - m.MARGIN
        elif p["design"] == "bonus_rows_differ":
            check = m._bonus_rows_differ
        elif p["design"] == "correction_from_p":
            check = m._correction_from_p_differs
        sampling = {k: np.asarray(p[k]) for k in m.SAMPLING if k != "temperature"}
        sampling["top_k"] = np.asarray(p["top_k"])
        if p["temperature"] is not None:
            sampling["temperature"] = np.where(np.asarray(p["greedy"]), 0.0, np.asarray(p["temperature"]))
        return m._designed(cid, B=p["b"], K=p["k"], P=np.asarray(p["p"]), A=np.asarray(p["a"]), V=p["v"],
                           vocab=p["v"] - p["pad"], greedy=np.asarray(p["greedy"]), retained=p["retained"],
                           check=check, seeds=np.asarray(p["seed"], np.uint64),
                           frontiers=np.asarray(p["frontier"], np.int64), same_request=p["design"] == "same_request",
                           attempts=150, **sampling)
    except (RuntimeError, AssertionError) as exc:
        raise Reject(str(exc).splitlines()[0] if str(exc) else "no draw met the design") from None


STRATEGY = Strategy(
    "speculative_accept", lambda: _accept_params(), _build_accept,
    "greedy and sampled rows, DFlash (q = 1) and DFlash2 (retained top-16 q); B 1..4, K 1..8, P per row "
    "0..K and accept counts 0..P (every tail extent, P = 0 and P = K); vocab 8..256 with padding; seeds "
    "(edges and any), frontiers near 2^24..2^63; temperatures, top-k/top-p/min-p, repetition/frequency/"
    "presence penalties; designs: p < q at the rejecting step, distinct rows P-1/P/K, correction from p, "
    "history repetition, zero-mass residual, exact ties with q = 0, one request repeated over rows")
