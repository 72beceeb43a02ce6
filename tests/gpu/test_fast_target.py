"""The fast target_distribution (kernels_cu/fast/target_distribution.cu) on a GPU, both paths: the split path
(few rows, each row cut over many blocks: ftd_split_*) and the single-block kernel
(fast_target_distribution_rows). Both must give the exact mode's probabilities bit for bit
(kernels_cu/exact/accept.cu target_distribution_rows), over mixed filters (top-k, top-p, min-p,
penalties, temperature including greedy), massive ties (bins too full to compact: the split
path's radix fallback), rows with no finite logit, and repeated calls.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers."""

from __future__ import annotations

import numpy as np
import pytest

# (temperature, top_p, min_p, top_k, repetition, frequency, presence) per row, cycled
CONFIGS = [
    (0.7, 0.9, 0.0, 0, 1.1, 0.1, 0.2),
    (1.0, 1.0, 0.0, 50, 1.0, 0.0, 0.0),
    (1.3, 0.5, 0.05, 0, 0.9, 0.1, 0.0),
    (0.0, 0.9, 0.0, 5, 1.1, 0.1, 0.2),  # greedy
    (0.5, 0.99, 0.0, 1000, 1.1, 0.0, 0.2),
    (1.0, 0.01, 0.0, 0, 1.0, 0.1, 0.1),
    (2.0, 0.8, 0.1, 20, 1.2, 0.1, 0.2),
    (1.0, 1.0, 0.0, 7, 1.0, 0.0, 0.0),
    (0.9, 0.95, 0.0, 0, 1.1, 0.1, 0.2),
    (1.1, 0.7, 0.01, 40000, 1.1, 0.1, 0.2),  # top-k's bin b0 holds far more than 2048 tokens
    (1.0, 0.6, 0.0, 3, 1.0, 0.0, 0.0),
    (0.3, 0.3, 0.0, 0, 1.1, 0.1, 0.2),
    (1.0, 1.0, 0.0, 0, 1.0, 0.0, 0.0),  # no filter
    (0.8, 0.9, 0.0, 50, 1.1, 0.1, 0.1),  # the benchmark's top-k 50 + top-p 0.9
    (1.0, 1.0, 0.2, 0, 1.0, 0.0, 0.0),  # min-p only
    (1.0, 0.9, 0.0, 1, 1.1, 0.1, 0.2),  # top-k 1
    (0.05, 0.999, 0.0, 0, 1.0, 0.0, 0.0),  # nearly greedy: mass on very few tokens
]


@pytest.fixture(scope="module")
def fast(cupy):
    from kernels_cu.fast import FastCudaBackend

    return FastCudaBackend()


def _case(cp, n, vr, seed, ties=False, configs=None, dead_row=None):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, vr)).astype(np.float32) * 3
    if ties:  # massive ties: values on a 0.5 grid
        logits = np.round(logits * 2) / 2
    if dead_row is not None and dead_row < n:
        logits[dead_row] = -np.inf  # no finite logit: the one-hot of the best key
    cfg = np.array([(configs or CONFIGS)[(i + seed) % len(configs or CONFIGS)] for i in range(n)], np.float64)
    return dict(
        logits=cp.asarray(logits),
        prompt_mask=cp.asarray((rng.random((n, vr)) < 0.01).astype(np.uint8)),
        output_counts=cp.asarray((rng.random((n, vr)) < 0.01).astype(np.int32) * rng.integers(1, 4, (n, vr), np.int32)),
        temperature=cp.asarray(cfg[:, 0].astype(np.float32)),
        top_p=cp.asarray(cfg[:, 1].astype(np.float32)),
        min_p=cp.asarray(cfg[:, 2].astype(np.float32)),
        top_k=cp.asarray(cfg[:, 3].astype(np.int32)),
        repetition_penalty=cp.asarray(cfg[:, 4].astype(np.float32)),
        frequency_penalty=cp.asarray(cfg[:, 5].astype(np.float32)),
        presence_penalty=cp.asarray(cfg[:, 6].astype(np.float32)),
        vocab_size=vr - 10,
    )


def _run(fast, kw, split: bool | None):
    """split None: the default dispatch; True / False: force the split / single-block path."""
    keep = fast.options
    try:
        if split is not None:
            fast.options = keep.replace(target_split_max_rows=1 << 30 if split else 0)
        return fast.target_distribution(**kw)["probs"]
    finally:
        fast.options = keep


def _assert_same(cp, a, b, what):
    assert a.shape == b.shape
    bad = cp.nonzero((a.view(cp.uint32) != b.view(cp.uint32)).any(axis=1))[0].tolist()
    assert not bad, f"{what}: rows differ bitwise: {bad[:20]}"


@pytest.mark.parametrize("vr", [1000, 248320])
@pytest.mark.parametrize("n", [1, 8, 33, 128])
@pytest.mark.parametrize("ties", [False, True])
def test_fast_equals_exact(cupy, fast, backend, n, vr, ties):
    cp = cupy
    kw = _case(cp, n, vr, seed=n + 7 * ties, ties=ties, dead_row=2 if ties else None)
    a = _run(fast, kw, None)
    b = backend.target_distribution(**kw)["probs"]
    _assert_same(cp, a, b, f"fast (default dispatch) vs exact, N {n} V {vr} ties {ties}")


@pytest.mark.parametrize("n", [8, 33, 128])
@pytest.mark.parametrize("ties", [False, True])
def test_split_equals_single_block(cupy, fast, backend, n, ties):
    cp = cupy
    kw = _case(cp, n, 248320, seed=100 + n + ties, ties=ties, dead_row=5 if ties else None)
    s = _run(fast, kw, True)
    o = _run(fast, kw, False)
    _assert_same(cp, s, o, f"split vs single-block, N {n} ties {ties}")
    _assert_same(cp, s, backend.target_distribution(**kw)["probs"], f"split vs exact, N {n} ties {ties}")
    _assert_same(cp, s, _run(fast, kw, True), f"split, repeated call, N {n} ties {ties}")


@pytest.mark.parametrize("vr", [1000, 248320])
@pytest.mark.parametrize("ties", [False, True])
def test_one_row_every_config(cupy, fast, backend, vr, ties):
    cp = cupy
    for i, cfg in enumerate(CONFIGS):
        kw = _case(cp, 1, vr, seed=1000 + i, ties=ties, configs=[cfg])
        _assert_same(cp, _run(fast, kw, None), backend.target_distribution(**kw)["probs"],
                     f"N 1 V {vr} ties {ties} config {cfg}")


def test_split_plan_fills_the_gpu_at_few_rows():
    from kernels_cu.fast.backend import _ftd_split_plan

    p = _ftd_split_plan(8, 248320)
    assert 8 * p["C"] >= 132 and 8 * p["HC"] >= 132
