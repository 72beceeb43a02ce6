"""kernels_cu/fast/lt.py on a GPU : the head GEMM on a timed cuBLASLt algorithm.

- every algorithm the heuristic offers (FP32 reductions only) computes x @ w^T within the FP32
  summation bound of the float64 product, in any order: BF16 x BF16 products are exact in FP32, so
  |fl(sum) - sum| <= gamma_(K-1) sum |x_k w_k| (gamma_n = n u / (1 - n u), u = 2^-24; a bound for
  round-to-nearest FP32 additions, which the tensor cores' accumulation is taken to match), per element;
  a wrong transposition or a dropped K slice is far outside it. An output rounded to BF16 is not always
  (at K 5120 the bound is near BF16's own spacing), so that is checked apart: FP32 outputs whose low 16
  bits are all zero are rare (about 1 in 65536 by chance);
- each algorithm gives the same bits on every call (no order that changes from call to call), and an
  offered algorithm's call captured into a CUDA graph replays its eager bits;
- ``tune`` keeps the path it timed fastest (gemmEx unless an algorithm beats it by the margin), and
  its call gives that path's bits, eagerly and replayed from a CUDA graph;
- proposal_head on a head of >= fast_lt.MIN_BYTES, forced onto a cuBLASLt algorithm (margin -1), gives
  the float64 argmax where the top-2 margin clears the bound; a cuBLASLt failure leaves it on gemmEx;
- FastRound's environment names the head GEMM's policy.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.bf16 import gauss_bits as _bits
from tests.gpu.bf16 import to_f64 as _f64
from tests.gpu.graphs import eager_and_replayed

pytestmark = pytest.mark.gpu
U = 2.0**-24


@pytest.fixture(scope="module", params=[(7, 65536, 2048), (120, 32768, 5120)], ids=["M7", "M120"])
def case(cupy, request):
    from kernels_cu.fast.block import CaptureGemm
    from kernels_cu.fast.gemm import gemm_bf16
    from kernels_cu.fast.lt import LtGemm

    M, N, K = request.param
    gemm_bf16(cupy.zeros((2, 8), np.uint16), cupy.zeros((2, 8), np.uint16))  # loads libcublas (and Lt)
    xh, wh = _bits(1, (M, K)), _bits(2, (N, K))
    x, w = cupy.asarray(xh), cupy.asarray(wh)
    out = cupy.empty((M, N), np.float32)
    g = LtGemm(M, N, K, CaptureGemm())
    cols = np.random.default_rng(3).choice(N, 1024, replace=False)
    xf, wf = _f64(xh), _f64(wh[cols])
    exact = xf @ wf.T
    gamma = (K - 1) * U / (1 - (K - 1) * U)
    bound = gamma * (np.abs(xf) @ np.abs(wf).T)
    return {"g": g, "x": x, "w": w, "out": out, "cols": cols, "exact": exact, "bound": bound}


def test_every_offered_algorithm_within_the_fp32_bound_and_repeatable(cupy, case):
    g, x, w, out = case["g"], case["x"], case["w"], case["out"]
    algos = g.heuristics(8)
    assert algos, "the heuristic offered no algorithm"
    ran = 0
    for i, h in enumerate(algos):
        try:
            g.run_algo(h.algo, x, w, out)
        except RuntimeError:  # an offered algorithm the call refuses: tune skips it too
            continue
        ran += 1
        first = cupy.asnumpy(out).copy()
        err = np.abs(first[:, case["cols"]].astype(np.float64) - case["exact"])
        assert (err <= case["bound"]).all(), f"algorithm {i}: {float((err / case['bound']).max()):.3g} x the bound"
        low_zero = float(((first.view(np.uint32) & 0xFFFF) == 0).mean())
        assert low_zero < 1e-3, f"algorithm {i}: {low_zero:.2%} of the outputs are BF16 values (a BF16 output?)"
        for _ in range(2):
            out.fill(0)
            g.run_algo(h.algo, x, w, out)
            assert np.array_equal(cupy.asnumpy(out).view(np.uint32), first.view(np.uint32)), f"algorithm {i} repeat"
    assert ran, f"none of the {len(algos)} offered algorithms ran"


def test_an_offered_algorithm_replays_its_eager_bits_from_a_graph(cupy, case):
    """cublasLtMatmul with an offered algorithm, captured: the replay gives the eager call's bits (the path
    FastRound's graph takes whenever the tuning keeps an algorithm)."""
    g, x, w, out = case["g"], case["x"], case["w"], case["out"]
    algo = g.heuristics(8)[0].algo
    eager, replayed = eager_and_replayed(cupy, lambda: g.run_algo(algo, x, w, out), out)
    assert np.array_equal(replayed, eager)


def test_tuned_call_gives_the_chosen_paths_bits_eager_and_replayed(cupy, case):
    g, x, w, out = case["g"], case["x"], case["w"], case["out"]
    g.tune(x, w, out, margin=0.0)
    t = g.timings
    assert t["chosen"] == "gemmEx" or (g.algo is not None and isinstance(t[t["chosen"]], float)
                                       and t[t["chosen"]] < t["gemmEx"])
    g(x, w, out)
    eager = cupy.asnumpy(out).copy()
    ref = cupy.empty_like(out)
    if g.algo is None:
        g.fallback(x, w, ref)
    else:
        g.run_algo(g.algo, x, w, ref)
    assert np.array_equal(cupy.asnumpy(ref).view(np.uint32), eager.view(np.uint32))
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        g(x, w, out)
        s.synchronize()
        s.begin_capture()
        g(x, w, out)
        graph = s.end_capture()
        out.fill(0)
        graph.launch(s)
        s.synchronize()
    assert np.array_equal(cupy.asnumpy(out).view(np.uint32), eager.view(np.uint32))


def test_round_environment_names_the_head_policy(cupy):
    from kernels_cu.fast.round import FastRound

    rec = FastRound().environment()
    assert "round_head_lt=" in rec["fast_round_head"] and "cuBLASLt" in rec["fast_round_head"]


def test_proposal_head_on_the_tuned_gemm_gives_the_float64_argmax(cupy, monkeypatch):
    """FastCudaBackend.proposal_head with a head of >= fast_lt.MIN_BYTES (65536 x 2048 BF16, 256 MiB), its
    tuning forced onto a cuBLASLt algorithm (margin -1: any algorithm under twice gemmEx's time is kept),
    tunes the shape once and returns the float64 argmax on every row whose top-2 margin exceeds twice the
    FP32 summation bound; the second call reuses the tuning and gives the same ids."""
    from kernels_cu.fast import FastCudaBackend, FastOptions
    from kernels_cu.fast import lt as fast_lt

    monkeypatch.setattr(fast_lt, "MARGIN", -1.0)
    M, N, K = 7, 65536, 2048
    be = FastCudaBackend(options=FastOptions(fused_head=False))  # the GEMM path (the fused head takes these rows)
    hh, wh = _bits(4, (M, K)), _bits(5, (N, K))
    assert wh.nbytes >= fast_lt.MIN_BYTES
    head = cupy.asarray(wh)
    ids = cupy.asnumpy(be.proposal_head(hidden=cupy.asarray(hh), head=head, vocab_size=N)["tokens"])
    assert be._head_lt[(M, N, K)] is not None and be._head_lt[(M, N, K)].algo is not None  # cuBLASLt ran
    assert be._head_lt[(M, N, K)].timings["chosen"].startswith("lt")
    again = cupy.asnumpy(be.proposal_head(hidden=cupy.asarray(hh), head=head, vocab_size=N)["tokens"])
    assert np.array_equal(ids, again)
    xf, wf = _f64(hh), _f64(wh)
    exact = xf @ wf.T
    bound = (K - 1) * U / (1 - (K - 1) * U) * (np.abs(xf) @ np.abs(wf).T)
    top2 = np.sort(exact, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * bound.max(axis=1)
    assert clear.any()
    assert np.array_equal(ids[clear], exact.argmax(axis=1)[clear])
    assert "proposal_head_lt=True" in be.environment()["proposal_head_gemm"]


def test_proposal_head_falls_back_to_gemmex_when_cublaslt_fails(cupy, monkeypatch):
    """A cuBLASLt failure (here: the tuning raises) leaves the shape on gemmEx: the ids are gemmEx's, the
    error is recorded, and the next call does not try again."""
    from kernels_cu.fast import FastCudaBackend, FastOptions
    from kernels_cu.fast import lt as fast_lt
    from kernels_cu.fast.gemm import gemm_bf16

    calls = []

    def broken(self, *a, **k):
        calls.append(1)
        raise RuntimeError("LtGemm: cublasLtMatmul returned cuBLAS status 7")

    monkeypatch.setattr(fast_lt.LtGemm, "tune", broken)
    M, N, K = 3, 65536, 2048
    hh, wh = cupy.asarray(_bits(6, (M, K))), cupy.asarray(_bits(7, (N, K)))
    be = FastCudaBackend(options=FastOptions(fused_head=False))  # the GEMM path (the fused head takes these rows)
    for _ in range(2):
        ids = cupy.asnumpy(be.proposal_head(hidden=hh, head=wh, vocab_size=N)["tokens"])
        ref = cupy.asnumpy(gemm_bf16(hh, wh).argmax(axis=1))
        assert np.array_equal(ids, ref)
    assert calls == [1] and be._head_lt[(M, N, K)] is None and "status 7" in be._head_lt[("error", M, N, K)]
