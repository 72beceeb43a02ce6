"""Cases for target_distribution (CONTRACTS C5; docs/ops.md sweep: every filter alone
and together, penalties, padded vocabulary).

Rows are redrawn from the case's generator until every filter decision is at
least GAP from its boundary (top-k: the value gap between ranks k-1 and k;
top-p: the prefix masses around top_p; min-p: the ratios p/p_max around min_p;
greedy: the argmax lead), so the fp32 baseline cannot flip one; the exact_tie
cases instead plant exactly equal logits, which the C4 order decides.
Flags name the pitfall a case guards: vocab_padding (no public-vocabulary mask),
penalties_missing and min_p_missing (the z-lab omission of docs/pitfalls.md).
"""

from __future__ import annotations

import numpy as np

from conformance.registry import FP32_OUTPUT, REPRESENTED, Case, OpSpec, Output, case_rng, register
from reference import scales
from reference.target_distribution import _softmax_kept, c4_order, penalized_logits, target_distribution

OP = "target_distribution"
GAP = 1e-3  # in probability (top-p, min-p ratio) or scaled-logit (top-k, argmax) units; fp32 errs ~1e-6
PARAMS = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}


def td_inputs(logits, *, prompt_mask=None, output_counts=None, vocab_size=None, **params) -> tuple[dict, dict]:
    """(inputs in storage dtypes, params); per-row params broadcast from scalars."""
    logits = np.asarray(logits, dtype=np.float32)
    N, Vr = logits.shape
    inputs = {
        "logits": logits,
        "prompt_mask": np.zeros((N, Vr), np.uint8) if prompt_mask is None else np.asarray(prompt_mask, np.uint8),
        "output_counts": np.zeros((N, Vr), np.int32) if output_counts is None else np.asarray(output_counts, np.int32),
    }
    for name in PARAMS:
        inputs[name] = np.broadcast_to(np.asarray(params.pop(name, DEFAULTS.get(name, 0.0)), np.float32), (N,)).copy()
    inputs["top_k"] = np.broadcast_to(np.asarray(params.pop("top_k", 0), np.int32), (N,)).copy()
    if params:
        raise TypeError(f"td_inputs: unknown params {sorted(params)}")
    return inputs, {"vocab_size": int(Vr if vocab_size is None else vocab_size)}


def boundary_distance(inputs, params, n) -> float:
    """How far row n's filter decisions are from flipping (inf when no filter decides)."""
    g = {k: float(inputs[k][n]) for k in PARAMS}
    z = penalized_logits(
        inputs["logits"][n],
        inputs["prompt_mask"][n],
        inputs["output_counts"][n],
        params["vocab_size"],
        g["repetition_penalty"],
        g["frequency_penalty"],
        g["presence_penalty"],
    )
    order = c4_order(z)
    fin = order[np.isfinite(z[order])]
    if g["temperature"] <= 0:
        return float(z[fin[0]] - z[fin[1]]) if fin.size > 1 else np.inf
    z = z / np.float64(np.float32(g["temperature"]))
    dist = np.inf
    keep = np.isfinite(z)
    k = int(inputs["top_k"][n])
    if 0 < k < fin.size:
        dist = min(dist, float(z[fin[k - 1]] - z[fin[k]]))
        keep[fin[k:]] = False
    top_p = float(np.float32(g["top_p"]))
    if top_p < 1:
        kept = order[keep[order]]
        cum = np.cumsum(_softmax_kept(z, keep)[kept])
        dist = min(dist, float(np.abs(cum - top_p).min()))
        keep[kept[int(np.searchsorted(cum, top_p)) + 1 :]] = False
    min_p = float(np.float32(g["min_p"]))
    if min_p > 0:
        p = _softmax_kept(z, keep)
        dist = min(dist, float(np.abs(p[keep] / p.max() - min_p).min()))
    return dist


def _bites(inputs, params, flags) -> bool:
    """Each flagged omission (no vocab mask, no penalties, no min-p) moves some probability by > 10 GAP."""
    ref = target_distribution(**inputs, **params)["probs"]
    for flag in flags:
        kw = {**inputs, **params}
        if flag == "vocab_padding":
            kw["vocab_size"] = inputs["logits"].shape[1]
        elif flag == "penalties_missing":
            kw["repetition_penalty"] = np.ones_like(inputs["repetition_penalty"])
            kw["frequency_penalty"] = kw["presence_penalty"] = np.zeros_like(inputs["presence_penalty"])
        elif flag == "min_p_missing":
            kw["min_p"] = np.zeros_like(inputs["min_p"])
        else:
            from conformance.mutants import for_flag

            for m in for_flag(OP, flag):  # the catalog's mutant for the flag (every case bites)
                if np.abs(np.asarray(m.target_distribution(**inputs, **params)["probs"], np.float64) - ref).max() \
                        <= 10 * GAP:
                    return False
            continue
        if np.abs(target_distribution(**kw)["probs"] - ref).max() <= 10 * GAP:
            return False
    return True


def _drawn(case_id, N=4, Vr=32, vocab=None, scale=2.0, prompt=0.0, history=0.0, flags=(), ties=False, **params):
    """Rows drawn until every decision is clear (ties=True: exact ties are planted and allowed)."""
    rng = case_rng(case_id)
    for _ in range(2000):
        logits = rng.standard_normal((N, Vr)) * scale
        if ties:
            # a run of exactly equal values straddling every rank boundary up to 8
            top = np.sort(logits, axis=1)[:, -1:] + 0.5
            for n in range(N):
                logits[n, rng.permutation(vocab or Vr)[:8]] = top[n]
        if vocab is not None:
            logits[:, vocab:] = rng.uniform(10, 30, (N, Vr - vocab))  # would dominate if unmasked
        pm = rng.random((N, Vr)) < prompt
        oc = np.where(rng.random((N, Vr)) < history, rng.integers(1, 4, (N, Vr)), 0)
        inputs, p = td_inputs(logits, prompt_mask=pm, output_counts=oc, vocab_size=vocab, **params)
        clear = ties or all(boundary_distance(inputs, p, n) > GAP for n in range(N))
        if clear and _bites(inputs, p, flags):
            return Case(id=case_id, inputs=inputs, params=p, flags=tuple(flags))
    raise RuntimeError(f"{case_id}: no clear draw")


def generate() -> list[Case]:
    c = f"{OP}/"
    T = np.array([0.3, 0.7, 1.0, 2.5], np.float32)
    pen = {"repetition_penalty": 1.4, "frequency_penalty": 0.3, "presence_penalty": 0.5}
    return [
        _drawn(f"{c}plain_softmax_temperature_sweep", temperature=T),
        _drawn(f"{c}greedy_T0_and_negative", temperature=np.array([0.0, -1.0, 0.0, -0.5])),
        _drawn(f"{c}greedy_exact_tie_lowest_id", temperature=0.0, ties=True, flags=("exact_tie",)),
        _drawn(
            f"{c}greedy_after_penalties",
            temperature=0.0,
            prompt=0.3,
            history=0.3,
            scale=1.0,
            flags=("penalties_missing",),
            **pen,
        ),
        _drawn(f"{c}top_k_1_5_20_31", top_k=np.array([1, 5, 20, 31]), temperature=T),
        # "More bugs that shipped": the C5 order (temperature before the filters; min-p on probabilities)
        _drawn(f"{c}temperature_after_filters__top_p_min_p_T0.3_2.5", scale=1.0,
               top_p=np.array([0.6, 0.9, 1.0, 0.8]), min_p=np.array([0.0, 0.0, 0.2, 0.1]),
               temperature=np.array([0.3, 2.5, 0.4, 3.0], np.float32), flags=("temperature_after_filters",)),
        _drawn(f"{c}min_p_on_logits__min_p_0.1_0.3_0.5_0.7", scale=1.0, min_p=np.array([0.1, 0.3, 0.5, 0.7]),
               temperature=T, flags=("min_p_on_logits",)),
        _drawn(f"{c}top_k_at_and_above_vocab", top_k=np.array([32, 33, 1000, 2**31 - 1])),
        # top_k_keeps_ties: a threshold on value (FlashInfer) keeps every token tied with the k-th
        _drawn(f"{c}top_k_exact_ties_at_boundary", top_k=np.array([2, 3, 5, 7]), ties=True,
               flags=("exact_tie", "top_k_keeps_ties")),
        _drawn(f"{c}top_p_0.5_0.9_0.99_0.01", scale=1.0, top_p=np.array([0.5, 0.9, 0.99, 0.01]), temperature=T),
        _drawn(
            f"{c}min_p_0.01_0.05_0.3_0.9",
            scale=1.0,
            min_p=np.array([0.01, 0.05, 0.3, 0.9]),
            temperature=T,
            flags=("min_p_missing",),
        ),
        _drawn(
            f"{c}disabled_filter_values",
            top_k=np.array([0, -1, -7, 0]),
            top_p=np.array([1.0, 1.5, 1.0, 2.0]),
            min_p=np.array([0.0, -0.5, 0.0, -1.0]),
            repetition_penalty=1.0,
            history=0.5,
            prompt=0.5,
        ),
        _drawn(
            f"{c}all_filters_together",
            scale=1.0,
            top_k=np.array([4, 12, 24, 8]),
            top_p=np.array([0.8, 0.95, 0.9, 0.6]),
            min_p=np.array([0.02, 0.1, 0.05, 0.2]),
            temperature=T,
            flags=("min_p_missing",),
        ),
        _drawn(
            f"{c}repetition_prompt_only",
            prompt=0.4,
            repetition_penalty=np.array([1.2, 2.0, 0.8, 5.0]),
            flags=("penalties_missing",),
        ),
        _drawn(
            f"{c}repetition_output_only",
            history=0.4,
            repetition_penalty=np.array([1.2, 2.0, 0.8, 5.0]),
            flags=("penalties_missing",),
        ),
        _drawn(
            f"{c}frequency_presence_output_only",
            prompt=0.5,
            history=0.4,
            frequency_penalty=np.array([0.0, 0.5, 1.0, -0.3]),
            presence_penalty=np.array([0.7, 0.0, 0.4, 1.0]),
            flags=("penalties_missing",),
        ),
        _drawn(
            f"{c}penalties_and_filters",
            N=6,
            Vr=48,
            prompt=0.3,
            history=0.3,
            top_k=10,
            top_p=0.9,
            min_p=0.05,
            temperature=0.8,
            flags=("penalties_missing", "min_p_missing"),
            **pen,
        ),
        _drawn(
            f"{c}vocab_padding_V256_vocab250",
            Vr=256,
            vocab=250,
            N=3,
            top_k=np.array([0, 40, 300]),
            flags=("vocab_padding",),
        ),
        _drawn(
            f"{c}vocab_padding_V64_vocab50_penalized",
            Vr=64,
            vocab=50,
            prompt=0.3,
            history=0.3,
            top_p=0.9,
            flags=("vocab_padding", "penalties_missing"),
            **pen,
        ),
        _drawn(f"{c}vocab_padding_greedy", Vr=40, vocab=33, temperature=0.0, flags=("vocab_padding",)),
        _drawn(f"{c}large_logits_80", scale=40.0, temperature=np.array([1.0, 0.5, 3.0, 10.0])),
        _drawn(f"{c}small_vocab_2", Vr=2, N=3, top_p=np.array([1.0, 0.6, 0.2]), min_p=np.array([0.0, 0.0, 0.5])),
        _drawn(f"{c}single_row_V7", N=1, Vr=7, top_k=3, top_p=0.8),
        # the filters family: the order of penalties, temperature and the filters
        _drawn(f"{c}filter_order__penalties_T_top_k_top_p", scale=1.0, prompt=0.3, history=0.4,
               temperature=np.array([0.4, 2.5, 0.5, 3.0], np.float32), top_k=np.array([4, 8, 6, 10]),
               top_p=np.array([0.7, 0.8, 0.75, 0.85]), frequency_penalty=0.8, presence_penalty=0.6,
               flags=("filter_order",)),
        _filter_boundary(f"{c}filter_boundary__top_p_reached_exactly_min_p_at_threshold"),
    ]


def _filter_boundary(case_id) -> Case:
    """The filters' boundary rules. Row 0: four equal logits and the rest 200 below, so p = 1/4 exactly
    and the prefix mass reaches top_p = 1/2 exactly at two tokens (kept: two; a rule that needs the mass
    to exceed top_p keeps three). Row 1: top_p halfway between two prefix masses (kept: the token that
    crosses top_p). Row 2: two equal maximal logits and min_p = 1, so both sit exactly at the threshold
    (kept: both). Row 3: ordinary. Every value is exact in FP32, so no legitimate rounding moves a boundary."""
    rng = case_rng(case_id)
    vr = 32
    logits = rng.standard_normal((4, vr))
    logits[0] = -200.0
    logits[0, rng.permutation(vr)[:4]] = 0.0
    z1 = np.asarray(logits[1], np.float32).astype(np.float64)
    p1 = np.exp(z1 - z1.max())
    cum = np.cumsum(np.sort(p1 / p1.sum())[::-1])
    top_p1 = float(np.float32((cum[2] + cum[3]) / 2))
    logits[2] = rng.uniform(-6.0, -1.0, vr)
    logits[2, rng.permutation(vr)[:2]] = 0.0
    inputs, params = td_inputs(logits, top_p=np.array([0.5, top_p1, 1.0, 1.0]), min_p=np.array([0.0, 0.0, 1.0, 0.0]))
    # exact_tie: which two of row 0's four equal tokens top-p keeps is C4's tie rule (the lower ids)
    return Case(id=case_id, inputs=inputs, params=params, flags=("filter_boundary", "exact_tie"))


register(
    OpSpec(
        name=OP,
        reference=target_distribution,
        inputs=("logits", "prompt_mask", "output_counts", *PARAMS, "top_k"),
        params=("vocab_size",),
        outputs=(Output("probs", REPRESENTED, "fp32"),),
        generate=generate,
        envelope={"probs": FP32_OUTPUT},
        scales=scales.target_distribution,
        doc="Target distribution p: vocab mask, penalties, temperature, top-k, top-p, min-p, softmax (C5)",
    )
)
