"""The fast mode of the CUDA backend (kernels_cu/fast/backend.py) on a GPU.

- over every committed vector it gives no FAIL and no ERROR (CONTRACTS C2; ACCEPTABLE allowed);
  FAST_SUITE_REPORT=<path> writes the per-case results there as JSON;
- candidate_topk / proposal_head: where the float64 margins are clear the fast ids equal the
  float64 top-k / argmax, and the scores are within FP32-accumulation error of float64;
- target_distribution: the filtering kernel selects exactly what the exact kernel's bisection
  selects (bitwise-equal probabilities, ties included);
- context_kv writes the caller's caches in place and agrees with the exact mode to BF16 rounding.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fast(cupy):
    from kernels_cu.fast import FastCudaBackend

    return FastCudaBackend()


def _bf16_bits(cp, rng, shape, scale=1.0):
    x = (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
    u = x.view(np.uint32)
    bits = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return cp.asarray(bits)


def _bits_to_f64(cp, bits):
    return (bits.astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)


def test_fast_suite_has_no_fail_or_error(fast):
    from conformance.compare import Result
    from conformance.runner import run_suite

    results = run_suite(fast, ROOT / "vectors")
    counts = Counter(r.result.name for r in results)
    bad = [r for r in results if r.result in (Result.FAIL, Result.ERROR)]
    path = os.environ.get("FAST_SUITE_REPORT")
    if path:
        Path(path).write_text(json.dumps({
            "counts": dict(counts),
            "environment": {k: str(v) for k, v in fast.environment().items()},
            "cases": [{"op": r.op, "case": r.case, "result": r.result.name, "detail": r.detail} for r in results],
        }, indent=1))
    assert not bad, f"{counts}: " + "; ".join(f"{r.op}/{r.case} {r.result.name}: {r.detail}" for r in bad[:20])


@pytest.mark.parametrize(("vr", "h", "b", "kd"), [(248320, 1024, 8, 15), (5000, 256, 1, 7)])
def test_candidate_topk_equals_float64_where_clear(cupy, fast, vr, h, b, kd):
    cp = cupy
    rng = np.random.default_rng(vr + h)
    k = 16
    hidden = _bf16_bits(cp, rng, (b, kd, h), 1.0)
    head = _bf16_bits(cp, rng, (vr, h), h**-0.5)
    out = fast.candidate_topk(hidden=hidden, head=head, vocab_size=vr - 3, top_k=k)
    z = _bits_to_f64(cp, hidden).reshape(-1, h) @ _bits_to_f64(cp, head).T  # float64 logits on the GPU
    z[:, vr - 3:] = -np.inf
    order = cp.argsort(-z, axis=1, kind="stable")[:, : k + 1]
    top = cp.take_along_axis(z, order, axis=1)
    hx, wx = _bits_to_f64(cp, hidden).reshape(-1, h), _bits_to_f64(cp, head)
    scale = (cp.abs(hx) @ cp.abs(wx).T).max(axis=1)  # sum |h||w| bounds every logit's terms
    ids = out["ids"].reshape(-1, k)
    scores = out["scores"].reshape(-1, k).astype(cp.float64)
    gaps = top[:, :-1] - top[:, 1:]  # rank r vs r + 1 (the last: the k-th vs the first left out)
    thr = 1e-5 * scale[:, None]  # FP32 accumulation error is far below this
    after = gaps > thr
    before = cp.concatenate([cp.ones((gaps.shape[0], 1), bool), after[:, :-1]], axis=1)
    clear = before & after  # rank r is decided: clear of its neighbours on both sides
    assert int(clear.sum()) >= clear.size // 2, "too few ranks with clear margins to check"
    assert bool((ids[clear] == order[:, :k].astype(cp.int32)[clear]).all())
    err = cp.abs(scores - top[:, :k])
    assert float((err / scale[:, None]).max()) < 3e-5


def test_proposal_head_equals_float64_where_clear(cupy, fast):
    cp = cupy
    rng = np.random.default_rng(7)
    vr, h = 100_000, 2048
    hidden = _bf16_bits(cp, rng, (8, 15, h))
    head = _bf16_bits(cp, rng, (vr, h), h**-0.5)
    tokens = fast.proposal_head(hidden=hidden, head=head, vocab_size=vr)["tokens"].reshape(-1)
    z = _bits_to_f64(cp, hidden).reshape(-1, h) @ _bits_to_f64(cp, head).T
    best = cp.argmax(z, axis=1)
    srt = cp.sort(z, axis=1)
    clear = (srt[:, -1] - srt[:, -2]) > 1e-3
    assert bool((tokens[clear] == best[clear].astype(cp.int32)).all())


@pytest.mark.parametrize("ties", [False, True])
def test_target_distribution_selects_as_exact(cupy, fast, backend, ties):
    cp = cupy
    rng = np.random.default_rng(11 + ties)
    n, vr = 12, 50_000
    logits = rng.standard_normal((n, vr)).astype(np.float32) * 3
    if ties:  # massive ties: values on a 0.5 grid
        logits = np.round(logits * 2) / 2
    kw = dict(
        logits=cp.asarray(logits),
        prompt_mask=cp.asarray((rng.random((n, vr)) < 0.01).astype(np.uint8)),
        output_counts=cp.asarray((rng.random((n, vr)) < 0.01).astype(np.int32) * 2),
        temperature=cp.asarray(np.array([0.7, 1.0, 1.3, 0.0, 0.5, 1.0, 2.0, 1.0, 0.9, 1.1, 1.0, 0.3], np.float32)),
        top_p=cp.asarray(np.array([0.9, 1.0, 0.5, 0.9, 0.99, 0.01, 0.8, 1.0, 0.95, 0.7, 0.6, 0.3], np.float32)),
        min_p=cp.asarray(np.array([0, 0, 0.05, 0, 0, 0, 0.1, 0, 0, 0.01, 0, 0], np.float32)),
        repetition_penalty=cp.asarray(np.full(n, 1.1, np.float32)),
        frequency_penalty=cp.asarray(np.full(n, 0.1, np.float32)),
        presence_penalty=cp.asarray(np.full(n, 0.2, np.float32)),
        top_k=cp.asarray(np.array([0, 50, 0, 5, 1000, 0, 20, 7, 0, 40000, 3, 0], np.int32)),
        vocab_size=vr - 10,
    )
    a = fast.target_distribution(**kw)["probs"]
    b = backend.target_distribution(**kw)["probs"]
    assert bool(cp.array_equal(a, b)), f"rows differ: {cp.nonzero((a != b).any(axis=1))[0].tolist()}"


def test_context_kv_in_place_and_close_to_exact(cupy, fast, backend):
    cp = cupy
    rng = np.random.default_rng(3)
    t, h, hk, d, cap = 300, 512, 2, 64, 256
    kw = dict(context=_bf16_bits(cp, rng, (t, h)), wk=_bf16_bits(cp, rng, (hk * d, h), h**-0.5),
              wv=_bf16_bits(cp, rng, (hk * d, h), h**-0.5), k_norm=_bf16_bits(cp, rng, (d,), 0.1) + cp.uint16(0),
              start=1000, eps=1e-6, theta=1e7, head_dim=d)
    kc = cp.zeros((cap, hk, d), cp.uint16)
    vc = cp.zeros((cap, hk, d), cp.float16)
    ref = backend.context_kv(k_cache=kc.copy(), v_cache=vc.copy(), **kw)
    out = fast.context_kv(k_cache=kc, v_cache=vc, **kw)
    assert out["k_cache"].data.ptr == kc.data.ptr and out["v_cache"].data.ptr == vc.data.ptr
    assert int(out["frontier"]) == 1300
    kf = _bits_to_f64(cp, kc)
    kr = _bits_to_f64(cp, ref["k_cache"])
    assert float(cp.abs(kf - kr).max()) <= 0.05 * float(cp.abs(kr).max())
    assert float(cp.abs(vc.astype(cp.float64) - ref["v_cache"].astype(cp.float64)).max()) <= 0.02 * float(
        cp.abs(ref["v_cache"].astype(cp.float64)).max())
