"""The speculative_step strategy: steps from mid-stream states, greedy and sampled rows, budgets, EOS."""

from __future__ import annotations

from conformance.strategies.base import Reject, Strategy, _composite, _per_row, salt, st


@_composite
def _step_params(draw):
    variant = draw(st.sampled_from(["dflash", "dflash2"]))
    b, k = draw(st.integers(1, 3)), draw(st.integers(1, 7))
    return {"variant": variant, "k": k, "prompts": draw(_per_row(b, st.integers(1, 12))),
            "budget": draw(_per_row(b, st.sampled_from([1, 2, 3, k, k + 1, k + 2, 20]))),
            "temperature": draw(_per_row(b, st.sampled_from([0.0, 0.0, 0.7, 1.0, 2.0]))),
            "warm": draw(st.integers(0, 2)), "penalties": draw(st.booleans()), "eos": draw(st.booleans()),
            "top_k": draw(st.sampled_from([0, 5, 20])), "top_p": draw(st.sampled_from([1.0, 0.9])),
            "min_p": draw(st.sampled_from([0.0, 0.05])),
            "ids": draw(st.sampled_from([[1, 3], [3, 0], [2, 4], [4, 1], [0, 2]])), "salt": draw(salt())}


def _build_step(cid, p):
    from conformance.cases import speculative_step as m

    try:
        return m.build(cid, variant=p["variant"], K=p["k"], prompts=p["prompts"], budget=p["budget"], warm=p["warm"],
                       temperature=p["temperature"], penalties=p["penalties"], eos=p["eos"], top_k=p["top_k"],
                       top_p=p["top_p"], min_p=p["min_p"], ids=tuple(p["ids"]), tries=12)
    except RuntimeError as exc:
        raise Reject(str(exc).splitlines()[0]) from None


STRATEGY = Strategy(
    "speculative_step", lambda: _step_params(), _build_step,
    "DFlash and DFlash2 steps from real mid-stream states (0..2 warm rounds), B 1..3, K 1..7, prompts "
    "1..12 tokens, remaining budgets 1 (P = 0) .. 20, greedy and sampled rows (temperature 0.7..2, "
    "top-k, top-p, min-p, penalties), an EOS among the outputs, target layer ids in any order")
