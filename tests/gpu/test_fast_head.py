"""The head GEMM with the top-k in its epilogue (kernels_cu/fast/head.cu, fast/head.py) on a GPU.

- Selection: the kernel's own logits (written to a dump array, the tests' switch) fed to a NumPy
  statement of C4 (tests/gpu/test_fast_topk.py's c4_topk) give exactly the fused path's ids, and its scores
  are those logits' values: adversarial logits included (exact integer ties everywhere, rows of zeros with
  signed zeros, logits rising with the head row so every tile beats the kept threshold and the candidate
  buffers overflow, Inf and NaN logits), vocab_size below the head's rows, k from 1 to 16, 1 to 128 rows,
  fewer eligible rows than k (id -1, score -inf), heads smaller than one tile a block.
- Logits: within the FP32-accumulation bound of float64 (derived below).
- Both kernels (fast_head_topk and the ping-pong fast_head_topk_pp, FastOptions.head_pingpong) give the same logits;
  the selection test runs the ping-pong kernel's lane form and warp form at every row count.
- Routing: FastCudaBackend.candidate_topk / proposal_head take the kernel where fast_head.applies, and
  give what the dump + C4 gives; a shortlist, k > 16 or more than 128 rows keeps the cuBLAS path.
- Capture: with tensor maps made once in device memory (FastRound's workspaces) a captured launch gives the
  host-copy launch's top k and replays values written in place.
- Shared thresholds (the lane form's, fast/head.cu HP_SHARED_THR): zeroed by each launch's last block (HP_CLEAN),
  so a launch with maps made once never drops keys below an earlier launch's thresholds (and the test fails on a
  build without the zeroing).
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers. The kernel needs a
compute-capability 9.0 GPU (wgmma): elsewhere these tests skip, saying so.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.gpu.test_fast_topk import c4_topk


@pytest.fixture(scope="module")
def fh(cupy):
    from kernels_cu.fast import head as fast_head

    if not fast_head._device_ok():
        pytest.skip("fast_head needs a compute-capability 9.0 GPU with 226 KiB of shared memory a block (wgmma)")
    return fast_head


def _bits(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bits (ml_dtypes: round to nearest even)."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def _f64(bits: np.ndarray) -> np.ndarray:
    return bits.view(ml_dtypes.bfloat16).astype(np.float64)


def _inputs(kind: str, m: int, vr: int, h: int, seed: int):
    rng = np.random.default_rng(seed)
    if kind == "gauss":
        x = rng.standard_normal((m, h)).astype(np.float32)
        w = (rng.standard_normal((vr, h)) * h**-0.5).astype(np.float32)
    elif kind == "grid":  # small integers: every logit exact, ties everywhere
        x = rng.integers(-1, 2, (m, h)).astype(np.float32)
        w = rng.integers(-1, 2, (vr, h)).astype(np.float32)
    elif kind == "zeros":  # some hidden rows all zero (every logit +-0: ties on all rows), the rest a grid
        x = rng.integers(-1, 2, (m, h)).astype(np.float32)
        x[::2] = 0.0
        x[1::4, :1] = -0.0
        w = rng.integers(-2, 3, (vr, h)).astype(np.float32)
    elif kind == "rising":  # logit grows with the head row: each tile beats the kept threshold
        x = np.zeros((m, h), np.float32)
        x[:, 0] = 1.0 + np.arange(m, dtype=np.float32) % 3
        w = np.zeros((vr, h), np.float32)
        w[:, 0] = np.linspace(-4, 4, vr, dtype=np.float32)
    elif kind == "inf":  # Inf inputs: +-Inf and NaN (Inf * 0) logits
        x = rng.integers(-1, 2, (m, h)).astype(np.float32)
        x[::3, 5] = np.inf
        w = rng.integers(-1, 2, (vr, h)).astype(np.float32)
        w[::5, 5] = 0.0
    else:
        raise ValueError(kind)
    return _bits(x), _bits(w)


def _merged(cp, partial, vr, k, multiplier=0.0, softcap=0.0):
    """The blocks' lists merged (fast.py's merge_into): (ids, scores) on the host."""
    from kernels_cu.fast.backend import merge_into

    m = partial.shape[0]
    scores, ids = cp.empty((m, k), np.float32), cp.empty((m, k), np.int32)
    merge_into(partial, None, None, vr, k, multiplier, softcap, scores, ids)
    return cp.asnumpy(ids), cp.asnumpy(scores)


def _same_top_k(a, b) -> bool:
    """Two (ids, scores) pairs equal to the bit (no NaN in the inputs that use this)."""
    return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def _fused(cp, fh, xb, wb, n_elig, k, multiplier=0.0, softcap=0.0, options=None):
    """The backend's fused route (head_topk_into) by hand, with the dump: (ids, scores, logits)."""
    from kernels_cu.fast import DEFAULT_OPTIONS

    x, w = cp.asarray(xb), cp.asarray(wb)
    m, vr = x.shape[0], w.shape[0]
    dump = cp.full((m, vr), np.nan, np.float32)
    partial = cp.zeros((m, fh.grid(vr), k), np.uint64)
    fh.topk_partial_into(x, w, n_elig, k, partial, dump, options=options or DEFAULT_OPTIONS)
    return (*_merged(cp, partial, vr, k, multiplier, softcap), cp.asnumpy(dump))


CASES = [  # (kind, M, Vr, H, k, n_elig)
    ("gauss", 1, 5000, 64, 1, 5000),
    ("gauss", 7, 33_000, 256, 16, 32_990),
    ("gauss", 120, 60_000, 512, 16, 59_999),
    ("grid", 13, 20_000, 128, 5, 19_000),
    ("grid", 128, 70_000, 256, 16, 70_000),
    ("zeros", 8, 9_000, 64, 16, 9_000),
    ("zeros", 64, 40_000, 192, 3, 39_000),
    ("rising", 16, 50_000, 64, 16, 50_000),
    ("rising", 120, 100_000, 128, 16, 99_000),
    ("inf", 24, 30_000, 128, 16, 30_000),
    ("gauss", 8, 300, 64, 16, 300),  # two blocks of 150 rows (under one tile each)
    ("grid", 3, 10, 64, 16, 10),  # 10 eligible rows for k 16: ranks 10.. are id -1, score -inf
]


@pytest.mark.parametrize("form", ["single", "pingpong", "pingpong_warp_rows"])
@pytest.mark.parametrize(("kind", "m", "vr", "h", "k", "n_elig"), CASES)
def test_fused_selection_is_c4_on_its_own_logits(cupy, fh, kind, m, vr, h, k, n_elig, form):
    """Both kernels: fast_head_topk and the ping-pong fast_head_topk_pp (FastOptions.head_pingpong), the latter with
    the lane form (a lane a hidden row, thresholds shared between the blocks) at every row count and with the warp
    form (a warp a hidden row) at every row count (head_warp_form_max_rows 0 / 128; the Ops switch at 8 rows)."""
    from kernels_cu.fast import FastOptions

    options = {"single": FastOptions(head_pingpong=False), "pingpong": FastOptions(head_warp_form_max_rows=0),
               "pingpong_warp_rows": FastOptions(head_warp_form_max_rows=128)}[form]
    xb, wb = _inputs(kind, m, vr, h, seed=m * 7919 + vr)
    ids, scores, z = _fused(cupy, fh, xb, wb, n_elig, k, options=options)
    assert not np.isnan(z).all(axis=1).any(), "the dump missed whole rows"
    for n in range(m):
        ref_ids, ref_scores = c4_topk(z[n], k, n_elig)
        assert np.array_equal(ids[n], ref_ids), f"row {n}: ids {ids[n]} vs C4 {ref_ids}"
        # the scores are the selected logits (no multiplier / softcap here), read back from the keys: a NaN reads
        # back the canonical NaN and a -0 as +0, which equal_nan / == accept
        assert np.array_equal(scores[n], ref_scores, equal_nan=True), f"row {n}: {scores[n]} vs {ref_scores}"


@pytest.mark.parametrize("pingpong", [False, True], ids=["single", "pingpong"])
@pytest.mark.parametrize(("kind", "m", "vr", "h"), [("gauss", 120, 60_000, 512), ("gauss", 7, 20_000, 2048),
                                                     ("grid", 128, 30_000, 256)])
def test_fused_logits_within_fp32_accumulation_bound(cupy, fh, kind, m, vr, h, pingpong):
    """Each logit sums h exact products (BF16 x BF16 fits FP32) in FP32. Whatever the order and grouping, and
    with every addition rounded toward zero (NVIDIA tensor cores have been measured to truncate when they align
    and add: Fasi, Higham, Mikaitis, Pranesh 2021), |fl - exact| <= gamma_h sum |x||w| with unit 2^-23,
    gamma_h = h u / (1 - h u). Integer grids are exact (every partial sum an integer below 2^24). The two kernels
    run the same wgmma chain per logit, so their logits are the same bits."""
    from kernels_cu.fast import FastOptions

    xb, wb = _inputs(kind, m, vr, h, seed=3)
    _, _, z = _fused(cupy, fh, xb, wb, vr, 1, options=FastOptions(head_pingpong=pingpong))
    xf, wf = _f64(xb), _f64(wb)
    exact = xf @ wf.T
    u = 2.0**-23
    bound = h * u / (1 - h * u) * (np.abs(xf) @ np.abs(wf).T)
    err = np.abs(z - exact)
    assert (err <= bound).all(), f"max err / bound {float((err / np.maximum(bound, 1e-300)).max()):.3g}"
    if kind == "grid":
        assert np.array_equal(z, exact)
    if pingpong:  # against the other kernel's logits, once a case
        single = FastOptions(head_pingpong=False)
        assert np.array_equal(_fused(cupy, fh, xb, wb, vr, 1, options=single)[2], z, equal_nan=True)


def test_candidate_topk_and_proposal_head_route_through_the_kernel(cupy, fh, monkeypatch):
    """The Ops take the fused kernel where it applies (a spy counts the launches; the default options route both Ops
    there at 15 rows) and return what its logits give under C4, the multiplier and
    softcap applied to the selected logits in double as the merge does."""
    from kernels_cu.fast import head as fast_head
    from kernels_cu.fast import FastCudaBackend

    cp = cupy
    calls = []
    real = fast_head.topk_partial_into
    monkeypatch.setattr(fast_head, "topk_partial_into", lambda *a, **kw: (calls.append(a[0].shape), real(*a, **kw)))
    fast = FastCudaBackend()
    xb, wb = _inputs("gauss", 15, 20_000, 256, seed=11)
    hid = cp.asarray(xb).reshape(1, 15, 256)
    head = cp.asarray(wb)
    out = fast.candidate_topk(hidden=hid, head=head, vocab_size=19_990, top_k=16, output_multiplier=0.5,
                              softcap=3.0)
    tok = fast.proposal_head(hidden=hid, head=head, vocab_size=19_990)["tokens"]
    assert calls == [(15, 256), (15, 256)]
    _, _, z = _fused(cp, fh, xb, wb, 19_990, 1)
    ids = cp.asnumpy(out["ids"]).reshape(15, 16)
    scores = cp.asnumpy(out["scores"]).reshape(15, 16)
    for n in range(15):
        ref_ids, ref_z = c4_topk(z[n], 16, 19_990)
        assert np.array_equal(ids[n], ref_ids)
        # u = c tanh(m z / c) in double, rounded once to fp32; NumPy's and CUDA's double tanh may differ in the last
        # double bit, which moves the fp32 result by at most one fp32 step
        want = (3.0 * np.tanh(0.5 * ref_z.astype(np.float64) / 3.0)).astype(np.float32)
        assert (np.abs(scores[n] - want) <= np.spacing(np.abs(want))).all(), (scores[n], want)
        assert int(cp.asnumpy(tok).reshape(15)[n]) == ref_ids[0]


def test_shortlist_large_k_and_many_rows_keep_the_gemm_path(cupy, fh, monkeypatch):
    from kernels_cu.fast import head as fast_head
    from kernels_cu.fast import FastCudaBackend

    cp = cupy
    monkeypatch.setattr(fast_head, "topk_partial_into", lambda *a, **kw: pytest.fail("fused path taken"))
    fast = FastCudaBackend()
    xb, wb = _inputs("gauss", 4, 3000, 128, seed=5)
    hid, head = cp.asarray(xb), cp.asarray(wb)
    fast.candidate_topk(hidden=hid, head=head, vocab_size=3000, top_k=17)
    many = cp.asarray(_inputs("gauss", fast.options.fused_head_max_rows_topk + 1, 3000, 128, seed=6)[0])
    fast.candidate_topk(hidden=many, head=head, vocab_size=3000, top_k=4)
    if not fast.options.fused_head_max_rows_proposal:
        fast.proposal_head(hidden=hid, head=head, vocab_size=3000)
    sl = cp.arange(3000, dtype=cp.int32)[::-1].copy()
    fast.candidate_topk(hidden=hid, head=head, vocab_size=3000, top_k=4, shortlist=sl)
    fast.proposal_head(hidden=hid, head=head, vocab_size=3000, shortlist=sl)


def test_refusals_name_the_problem(cupy, fh):
    cp = cupy
    x = cp.zeros((4, 64), cp.uint16)
    w = cp.zeros((500, 64), cp.uint16)
    g = fh.grid(500)
    with pytest.raises(ValueError, match="partial"):
        fh.topk_partial_into(x, w, 500, 4, cp.zeros((4, g + 1, 4), cp.uint64))
    with pytest.raises(ValueError, match="outside"):
        fh.topk_partial_into(x, w, 500, 17, cp.zeros((4, g, 17), cp.uint64))
    with pytest.raises(ValueError, match="outside"):
        fh.topk_partial_into(cp.zeros((4, 96), cp.uint16), cp.zeros((500, 96), cp.uint16), 500, 4,
                             cp.zeros((4, g, 4), cp.uint64))
    with pytest.raises(ValueError, match="BF16"):
        fh.topk_partial_into(x.astype(cp.float32), w, 500, 4, cp.zeros((4, g, 4), cp.uint64))


def test_device_maps_make_the_launch_capturable_with_the_same_top_k(cupy, fh):
    """FastRound's graph launches the kernel with tensor maps made once in device memory (fast_head.device_maps): a
    captured launch gives the top k the host-copy launch gives, and a replay reads new values written in place into
    the same buffers (the maps hold addresses, not values). The merged top k, not the blocks' lists: with shared
    thresholds a block's list depends on when the others published theirs."""
    cp = cupy
    m, vr, h, k, elig = 24, 30_000, 256, 8, 29_000
    x, w = (cp.asarray(a) for a in _inputs("gauss", m, vr, h, seed=21))
    g = fh.grid(vr)

    def host_copy_top_k():
        ref = cp.zeros((m, g, k), cp.uint64)
        fh.topk_partial_into(x, w, elig, k, ref)
        return _merged(cp, ref, vr, k)

    ref = host_copy_top_k()
    maps = fh.device_maps(x, w)
    out = cp.zeros((m, g, k), cp.uint64)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        fh.topk_partial_into(x, w, elig, k, out, maps=maps)
        graph = s.end_capture()
        graph.launch(s)
    s.synchronize()
    assert _same_top_k(_merged(cp, out, vr, k), ref)
    x[...] = cp.asarray(_inputs("gauss", m, vr, h, seed=22)[0])  # new hidden rows, same buffer
    ref2 = host_copy_top_k()
    assert not np.array_equal(ref2[0], ref[0])
    with s:
        graph.launch(s)
    s.synchronize()
    assert _same_top_k(_merged(cp, out, vr, k), ref2)
    with pytest.raises(ValueError, match="maps"):
        fh.topk_partial_into(x, w, elig, k, out, maps=cp.zeros(32, cp.uint64))


@pytest.mark.parametrize("sound", [True, False], ids=["kernel_cleans", "mutant_no_zeroing"])
def test_shared_thresholds_do_not_outlive_a_launch(cupy, fh, sound):
    """Maps made once (FastRound's) carry the shared thresholds from launch to launch: the kernel's last block zeroes
    them at its end (fast/head.cu HP_CLEAN). Launches alternate hidden rows 4096 times larger and smaller through the
    same maps; each must give its rows' own top k (as a launch with maps made anew). The mutant is the kernel built
    with HP_CLEAN 0 (no zeroing): the large rows' thresholds are above every small logit and a small launch's lists
    come back empty, so the check fails: it can."""
    cp = cupy
    m, vr, h, k, elig = 24, 60_000, 256, 8, 60_000  # 24 rows: the lane form (above head_warp_form_max_rows)
    xs, wb = _inputs("gauss", m, vr, h, seed=5)
    x_small = _bits(_f64(xs) / 64.0)
    x_large = _bits(_f64(xs) * 64.0)
    x, w = cp.asarray(x_large), cp.asarray(wb)
    g = fh.grid(vr)
    maps = fh.device_maps(x, w)
    n = fh.n_for(m)
    mutant = fh._kernel(n, fh.select_defines(m) + (("HP_CLEAN", 0),), None, True)[1]

    def own_top_k():
        fresh = cp.zeros((m, g, k), cp.uint64)
        fh.topk_partial_into(x, w, elig, k, fresh, maps=fh.device_maps(x, w))  # the default kernel, maps of its own
        return _merged(cp, fresh, vr, k)

    def each_launch_is_its_own():
        ok = True
        for rows in (x_large, x_small, x_large, x_small):
            out = cp.zeros((m, g, k), cp.uint64)
            x[...] = cp.asarray(rows)
            if sound:
                fh.topk_partial_into(x, w, elig, k, out, maps=maps)
            else:
                fh.launch(mutant, n, x, w, elig, k, out, None, fh.smem_bytes_pp(n), fh.PP_THREADS, maps)
            want = own_top_k()
            assert (want[0] >= 0).all()
            ok = ok and _same_top_k(_merged(cp, out, vr, k), want)
        if sound:  # the kernel left the thresholds and its count at zero
            ok = ok and not maps[fh.MAP_WORDS:].any()
        return ok

    why = "a launch read another launch's thresholds" if sound else "stale thresholds went unnoticed: it cannot fail"
    assert each_launch_is_its_own() == sound, why
