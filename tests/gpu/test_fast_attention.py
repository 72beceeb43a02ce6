"""The fast draft attention (kernels_cu/fast/attention.py) on a GPU.

- the conformance suite over every committed draft_attention vector, the Op on
  ``FastCudaBackend`` (FastAttentionMixin composed): no FAIL, no ERROR (C2 v2), with the split
  count chosen by the heuristic and forced to 3 (the combine kernel on small cases, empty splits
  included), and with q/k/v handed to ``attention_fast`` as FP32 (masked_block's path);
- draft_layer and masked_block vectors with attention_fast in place of ops_attention.attention
  inside the exact mode's layers (a drop-in for masked_block's fast path): no FAIL, no ERROR;
- randomized geometries the vectors do not reach (F 4096, ring wrap, windows of 2048 / 100 / 5,
  GQA 4:1, B 8 W 16, positions past 2^31 / 2^32 / 2^40), against reference.draft_attention in
  float64 with a bound derived from the kernel's arithmetic (``derived_bound``); planted keys of
  large score at the window edge, the ring's ends and tile edges make a mask error visible above
  that bound;
- a non-finite V that a window gives to one row and not the next (context tile and block tile);
- masked_block's inputs (FP32 arrays holding BF16 values) give the BF16-bit path's bits, at the proposal
  round's shapes; 2, 3 and 4 K/V stages give the same bits; split counts 1 .. 64 (more splits than tiles too)
  within the bound, repeated calls and a captured graph's replays give the eager bits;
- the wgmma form (FastOptions.attention_wgmma) against the reference and the mma.sync kernel's bits.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers.
FAST_ATTENTION_REPORT=<path> writes the suite counts and the bound ratios as JSON.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from reference.draft_attention import allowed, attend

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
REPORT: dict = {"suite": {}, "random": {}}
U = 2.0**-24  # FP32 unit roundoff


class _Attention:
    """kernels_cu.fast.attention under the options a test sets (``set``, on FastOptions' attention_* fields):
    ``attention_fast`` runs with them unless a call passes its own; every other name is the module's."""

    def __init__(self, module, options):
        self.module, self.options = module, options

    def set(self, **changes):
        self.options = self.options.replace(**changes)

    def attention_fast(self, *a, **kw):
        kw.setdefault("options", self.options)
        return self.module.attention_fast(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.module, name)


@pytest.fixture(scope="module")
def fa_module(cupy):
    from kernels_cu.fast import attention as fast_attention

    yield fast_attention
    path = os.environ.get("FAST_ATTENTION_REPORT")
    if path:
        Path(path).write_text(json.dumps(REPORT, indent=1, default=str))


@pytest.fixture
def fa(fa_module):
    """The module with the wgmma form off (attention_wgmma False): the tests below that name no form check the
    mma.sync kernels; the wgmma form's tests (the last section) turn it on."""
    from kernels_cu.fast import FastOptions

    return _Attention(fa_module, FastOptions(attention_wgmma=False))


@pytest.fixture(scope="module")
def composed(fa_module):
    """The Op's backends, made per options: "bf16" (the Op as the fast backend runs it) and "fp32" (q/k/v converted
    to FP32 first: attention_fast's FP32 (split BF16) path)."""
    from kernels_cu.fast import FastCudaBackend

    class _F32Inputs(FastCudaBackend):
        def draft_attention(self, *, q, k, v, k_cache, v_cache, frontier, live, window=0):
            from kernels_cu.exact.attention import bf16_bits, device, f16_bits, f32

            _, out = fa_module.attention_fast(f32(q), f32(k), f32(v), bf16_bits(k_cache), f16_bits(v_cache),
                                              device(frontier), device(live), int(window), f32_out=False,
                                              bf16_out=True, options=self.options)
            return {"out": out}

    return {"bf16": FastCudaBackend, "fp32": _F32Inputs}


@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("inputs", ["bf16", "fp32"])
def test_suite_draft_attention_no_fail(fa, composed, monkeypatch, inputs, splits):
    from conformance.compare import Result
    from conformance.runner import run_suite

    fa.set(attention_splits=splits)
    paths = Counter()
    impl = composed[inputs](options=fa.options)
    real = fa.module.attention_fast

    def counted(*a, **kw):
        out = real(*a, **kw)
        paths[fa.last_path()] += 1
        return out

    monkeypatch.setattr(fa.module, "attention_fast", counted)
    results = run_suite(impl, ROOT / "vectors", ops_pattern="draft_attention")
    counts = Counter(r.result.name for r in results)
    REPORT["suite"][f"{inputs}_splits{splits}"] = {"counts": dict(counts), "paths": dict(paths)}
    bad = [r for r in results if r.result in (Result.FAIL, Result.ERROR)]
    assert not bad, f"{counts}: " + "; ".join(f"{r.case} {r.result.name}: {r.detail}" for r in bad[:10])
    assert len(results) >= 40 and paths == Counter({"fast": len(results)}), (counts, paths)


def test_drop_in_for_the_layer_ops(fa, monkeypatch):
    """attention_fast in place of ops_attention.attention inside the exact mode's draft_layer and
    masked_block (FP32 q/k/v from the layer, the caches as bits): the suite gives no FAIL, no ERROR."""
    from conformance.compare import Result
    from conformance.runner import run_suite
    from kernels_cu.exact import attention as ops_attention
    from kernels_cu.exact.backend import CudaBackend

    paths = Counter()

    def counted(*a, **kw):
        out = fa.attention_fast(*a, **kw)
        paths[fa.last_path()] += 1
        return out

    monkeypatch.setattr(ops_attention, "attention", counted)
    results = run_suite(CudaBackend(), ROOT / "vectors", ops_pattern="draft_layer,masked_block")
    counts = Counter(r.result.name for r in results)
    REPORT["suite"]["layers_with_attention_fast"] = {"counts": dict(counts), "paths": dict(paths)}
    bad = [r for r in results if r.result in (Result.FAIL, Result.ERROR)]
    assert not bad, f"{counts}: " + "; ".join(f"{r.case} {r.result.name}: {r.detail}" for r in bad[:10])
    assert paths and set(paths) == {"fast"}, paths


# ------------------------------------------------------------------------ randomized, float64 reference


def derived_bound(q, k, v, kc, vc, frontier, live, window, *, fp32_inputs: bool, ns_max: int):
    """Per-element bound on |y_fast - y| for the FP32 output y_fast of attention_fast, y the float64
    attention (rows < live). Each line is one step of the kernel (fast/attention.cu), u = 2^-24:

    scores, log2 units sigma_k = c q.k, c = fl(log2(e) / sqrt(D)): the BF16 x BF16 products are exact
      in FP32; the tensor core's FP32 sums over D terms are allowed 2u per addition (its alignment may
      truncate), plus u for c and u for the product:  d_sigma_k <= 2u (D + 1) A_k,  A_k = c sum|q_d k_d|.
      FP32 inputs are split x = hi + lo (BF16 each): |x - hi - lo| <= 2^-9 2^-9 |x|, for q, for block k
      and the dropped q_lo k_lo: + 3 * 2^-18 A_k.  Let dS = max_k d_sigma_k over the row's keys.
    weights W_k = 2^sigma_k / sum_j 2^sigma_j: d ln W_k = ln2 (d_sigma_k - sum_j W_j d_sigma_j), so
      |dW_k| <= 2 ln2 dS W_k;
    evaluation: p = exp2f(fl(s - m)): the subtraction u |s - m| <= u R (R: the row's score spread in
      log2 units), exp2f 2 ulp = 4u; in P and in the row sum: 2 (ln2 u R + 4u) W_k;
    rescales: o and l are multiplied by the same corr (cancels in o / l) with one rounding each, at
      most once per 16-key step plus the merges: n_rs u on each, n_rs = N / 16 + 16;
    PV operand: context P rounded to FP16, relative 2^-11 above 2^-14 and absolute <= 2^-24 below
      (subnormals; positive P under 2^-25 is kept at 2^-24); block P = P_hi + P_lo (2^-17) and, for
      FP32 inputs, V = V_hi + V_lo (2^-17): 2^-11 S1 + N 2^-24 Vmax, with S1 = sum_k W_k |v_k| and
      Vmax = max_k |v_k| (the row sum is >= 1 in units of the final maximum);
    PV and row-sum accumulation in FP32 (tensor-core sums, 2u per addition, N keys in a chain at worst,
      plus the slice merges and the ns split combine): 2u (N + 16 + ns) on S1 and on |y|;
    the final division: u |y|; FTZ: 2^-126.
    Returns (bound [B,W,Hq,D], y [B,W,Hq,D])."""
    f64 = lambda x: np.asarray(x, np.float64)
    q, k, v, kc, vc = (f64(x) for x in (q, k, v, kc, vc))
    b, w, hq, d = q.shape
    hk, cap = k.shape[2], kc.shape[1]
    g = hq // hk
    keys = np.concatenate([kc, k], axis=1)  # [B, C+W, Hk, D]
    vals = np.concatenate([vc, v], axis=1)
    mask = allowed(frontier, live, cap, w, window)  # [B, W, C+W]
    c = math.log2(math.e) / math.sqrt(d)
    # per KV head: rows (i, g) x keys, batched matmuls
    qg = q.reshape(b, w, hk, g, d).transpose(0, 2, 1, 3, 4).reshape(b, hk, w * g, d)
    kt = keys.transpose(0, 2, 3, 1)  # [B, Hk, D, C+W]
    vt = vals.transpose(0, 2, 1, 3)  # [B, Hk, C+W, D]
    m = np.repeat(mask, g, axis=1)[:, None]  # [B, 1, W*G, C+W], row r = i * G + g
    sig = np.where(m, (qg @ kt) * c, -np.inf)
    amag = np.where(m, (np.abs(qg) @ np.abs(kt)) * c, 0.0)
    mx = sig.max(axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    p = np.where(m, np.exp2(sig - mx), 0.0)
    wts = p / np.maximum(p.sum(axis=-1, keepdims=True), 1e-300)
    y = wts @ vt  # [B, Hk, W*G, D]
    s1 = wts @ np.abs(vt)
    vmax = np.max(np.where(m[..., None], np.abs(vt)[:, :, None], 0.0), axis=-2)  # [B, Hk, W*G, D]
    n = m.sum(axis=-1)[..., None].astype(np.float64)  # keys per row
    spread = np.max(np.where(m, mx - sig, 0.0), axis=-1)[..., None]
    d_sig = (2 * U * (d + 1) + (3 * 2.0**-18 if fp32_inputs else 0.0)) * amag.max(axis=-1)[..., None]
    n_rs = n / 16 + 16
    rel_s1 = (2 * math.log(2) * d_sig + 2 * (math.log(2) * U * spread + 4 * U) + 2.0**-11
              + 2 * U * (n + 16 + ns_max) + n_rs * U)
    rel_y = 2 * U * (n + 16 + ns_max) + n_rs * U + U
    bound = rel_s1 * s1 + rel_y * np.abs(y) + n * 2.0**-24 * vmax + 2.0**-126
    back = lambda x: x.reshape(b, hk, w, g, d).transpose(0, 2, 1, 3, 4).reshape(b, w, hq, d)
    return back(bound), back(y)


def _need_wg(fa):
    """Skip (with the reason) where the wgmma form cannot run."""
    if not fa.wg_capable():
        pytest.skip("the wgmma form needs a compute-capability 9.0 GPU (sm_90a)")


def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


CASES = {
    # name: B, W, Hq, Hk, D, C, window, frontiers, lives
    "full_B1_W8_Hq32_Hk8_F4096": (1, 8, 32, 8, 128, 4096, 0, [4096], [8]),
    "full_B8_W16_Hq8_Hk2_ring_wrap": (8, 16, 8, 2, 128, 4096, 0, [4096, 5000, 0, 1, 4095, 8191, 2**32 + 17, 100],
                                      [16, 1, 5, 16, 8, 16, 3, 12]),
    "local_S2048_C2048_B8_W16": (8, 16, 8, 2, 128, 2048, 2048, [2048, 3000, 5, 2047, 2049, 10000, 2**31 + 3, 4096],
                                 [16, 16, 16, 1, 16, 9, 16, 4]),
    "local_S100_C300_D64_Hq4_Hk1": (2, 16, 4, 1, 64, 300, 100, [1000, 150], [16, 11]),
    "local_S5_C64_D32_window_lt_W": (2, 16, 8, 2, 32, 64, 5, [2**40, 3], [16, 16]),
    # two row chunks (W G = 128 rows: two blocks of 64 query rows a split, the combine over both) and one m-tile at
    # D 120 (8 rows)
    "full_B2_W16_Hq8_Hk1_two_chunks": (2, 16, 8, 1, 128, 1024, 0, [1024, 700], [16, 10]),
    "full_B3_W8_Hq4_Hk4_D120_one_mtile": (3, 8, 4, 4, 120, 512, 0, [512, 300, 2**33], [8, 5, 1]),
}
SPIKE_Q, SPIKE_K = 8.0, 8.0


def make_case(name, rng, fp32_inputs):
    b, w, hq, hk, d, cap, window, frontier, live = CASES[name]
    frontier, live = np.asarray(frontier, np.int64), np.asarray(live, np.int32)
    q = rng.standard_normal((b, w, hq, d)) * 1.5
    k = rng.standard_normal((b, w, hk, d))
    v = np.exp(0.5 * rng.standard_normal((b, w, hk, d)))
    kc = rng.standard_normal((b, cap, hk, d))
    vc = np.exp(0.5 * rng.standard_normal((b, cap, hk, d)))
    # planted keys: q[..., 0] = 8 and k[0] = 8 at chosen positions adds 64 / sqrt(D) to their scores; V at
    # dim 1 + s marks planted key s (40), so each shows in its own output dimension if (and only if) attended
    q[..., 0] = SPIKE_Q
    for bi in range(b):
        f = int(frontier[bi])
        n_ctx = min(f, cap, window - 1) if window > 0 else min(f, cap)
        lo = f - n_ctx
        spots = [lo, f - 1, lo + 63, lo + 64, f - window, f - window + 1, f - window + 6,
                 f - (f % cap) - 1, f - (f % cap)]  # union ends, tile edge, window edge, ring seam
        for s, pos in enumerate(spots):
            if 0 <= pos < f and pos >= f - cap and 1 + s < d:
                kc[bi, pos % cap, :, 0] = SPIKE_K
                vc[bi, pos % cap, :, 1 + s] = 40.0
    # FP32 inputs: values off the BF16 grid (the split path); BF16 inputs: BF16 values
    if fp32_inputs:
        q, k, v = (x.astype(np.float32) for x in (q, k, v))
    else:
        q, k, v = (_bf16(x) for x in (q, k, v))
    kc = _bf16(kc)
    vc = _bf16(vc).astype(np.float16)  # context V = FP16_RNE(BF16(v)), as context_kv stores it
    return {"q": q, "k": k, "v": v, "k_cache": kc, "v_cache": vc, "frontier": frontier, "live": live, "window": window}


@pytest.fixture(scope="module", params=sorted(CASES))
def random_case(request):
    return request.param, _prepared(request.param)


@functools.cache
def _prepared(name):
    """{fp32_inputs: (case, float64 reference, derived bound, float64 pass)} of CASES[name]."""
    out = {}
    for fp32_inputs in (False, True):
        rng = np.random.default_rng(sum(map(ord, name)))
        case = make_case(name, rng, fp32_inputs)
        ref = attend(case["q"], case["k"], case["v"], case["k_cache"], case["v_cache"], case["frontier"],
                     case["live"], case["window"])
        bound, y = derived_bound(case["q"], case["k"], case["v"], case["k_cache"], case["v_cache"], case["frontier"],
                                 case["live"], case["window"], fp32_inputs=fp32_inputs, ns_max=64)
        out[fp32_inputs] = (case, ref, bound, y)
    return out


def _device_args(cp, case, fp32_inputs):
    if fp32_inputs:
        q, k, v = (cp.asarray(case[n]) for n in ("q", "k", "v"))
    else:
        q, k, v = (cp.asarray(case[n].view(np.uint16)) for n in ("q", "k", "v"))
    return (q, k, v, cp.asarray(case["k_cache"].view(np.uint16)), cp.asarray(case["v_cache"].view(np.uint16)),
            cp.asarray(case["frontier"]), cp.asarray(case["live"]), case["window"])


@pytest.mark.parametrize("stages", [None, 2, 4])
@pytest.mark.parametrize("splits", [None, 5, 64])
@pytest.mark.parametrize("fp32_inputs", [False, True], ids=["bf16_inputs", "fp32_inputs"])
def test_random_against_float64_reference(cupy, fa, random_case, fp32_inputs, splits, stages):
    name, by_mode = random_case
    fa.set(attention_splits=splits)
    fa.set(attention_stages=stages or 2)
    _against_reference(cupy, fa, by_mode[fp32_inputs], fp32_inputs, "fast",
                       f"{name}/{'fp32' if fp32_inputs else 'bf16'}/splits{splits}/stages{stages}")


def _against_reference(cupy, fa, prepared, fp32_inputs, path, key):
    """One attention_fast call on a prepared random case (case, reference, bound, float64 pass): the path taken,
    every live element within the derived bound, rows >= live zero, the BF16 output the FP32 one rounded once."""
    case, ref, bound, y = prepared
    name = key.split("/")[0]
    of, ob = fa.attention_fast(*_device_args(cupy, case, fp32_inputs), f32_out=True, bf16_out=True)
    assert fa.last_path() == path
    out = cupy.asnumpy(of).astype(np.float64)
    rows = np.arange(ref.shape[1])[None, :] < case["live"][:, None]
    # my float64 pass is the reference's math (same masks): it must agree before it sets the bound
    np.testing.assert_allclose(y[rows], ref[rows], rtol=1e-12, atol=1e-12)
    err = np.abs(out - ref)[rows]
    ratio = float((err / bound[rows]).max())
    REPORT["random"][key] = {
        "max_err_over_bound": ratio, "max_abs_err": float(err.max()), "max_rel_err": float((err / np.abs(ref[rows])).max())}
    assert ratio <= 1.0, f"{name}: error {ratio:.3g} x the derived bound (max abs {err.max():.3g})"
    assert not np.any(out[~rows]) and not np.any(cupy.asnumpy(ob)[~rows]), "rows >= live must be zero"
    # the BF16 output is the FP32 one rounded once (RNE)
    assert np.array_equal(cupy.asnumpy(ob), _bf16(cupy.asnumpy(of)).view(np.uint16))


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("where", ["ctx_cut", "block_cut"])
@pytest.mark.parametrize("splits", [None, 2])
@pytest.mark.parametrize("fp32_inputs", [False, True], ids=["bf16_inputs", "fp32_inputs"])
@pytest.mark.parametrize("hq,d,form", [(4, 128, "mma"), (8, 120, "mma"), (8, 128, "wgmma")],
                         ids=["mt2_d128", "mt4_d120", "mt4_d128_wgmma"])
def test_nonfinite_v_given_to_one_row_only(cupy, fa, where, splits, stages, fp32_inputs, hq, d, form):
    """An inf V allowed for one row and not for the next: the allowed rows are inf there, the others
    finite and within the bound (a masked 0 * inf on the tensor cores would be NaN). mt4_d128_wgmma asks for the
    wgmma form (attention_wgmma True): it takes BF16 bits (the slow PV reads V from the core-matrix layout), and
    leaves FP32 inputs to the mma.sync kernel."""
    if form == "wgmma":
        _need_wg(fa)
        fa.set(attention_wgmma=True)
    fa.set(attention_splits=splits)
    fa.set(attention_stages=stages or 2)
    rng = np.random.default_rng(5)
    b, w, hk, cap, f = 1, 8, 1, 200, 500
    window = 70 if where == "ctx_cut" else 3
    case = {"q": _bf16(rng.standard_normal((b, w, hq, d))), "k": _bf16(rng.standard_normal((b, w, hk, d))),
            "v": _bf16(np.exp(0.5 * rng.standard_normal((b, w, hk, d)))),
            "k_cache": _bf16(rng.standard_normal((b, cap, hk, d))),
            "v_cache": _bf16(np.exp(0.5 * rng.standard_normal((b, cap, hk, d)))).astype(np.float16),
            "frontier": np.asarray([f], np.int64), "live": np.asarray([w], np.int32), "window": window}
    if where == "ctx_cut":  # position F - S + 1: distance S - 1 from row 0 (allowed), S from row 1 (not)
        case["v_cache"][0, (f - window + 1) % cap, 0, :4] = np.float16(np.inf)
        case["v_cache"][0, (f - window + 1) % cap, 0, 4:8] = np.float16(-np.inf)
        hit_rows = [0]
    else:  # block row 0, window 3: rows 0..2 see it
        case["v"] = case["v"].copy()
        case["v"][0, 0, 0, :4] = np.inf
        hit_rows = [0, 1, 2]
    ref = attend(case["q"], case["k"], case["v"], case["k_cache"], case["v_cache"], case["frontier"], case["live"],
                 window)
    args = _device_args(cupy, case, False)
    if fp32_inputs:  # the same values as FP32 arrays: the split path (fast_attn_*_f)
        args = (*(cupy.asarray(case[n].astype(np.float32)) for n in ("q", "k", "v")), *args[3:])
    of, _ = fa.attention_fast(*args, f32_out=True)
    assert fa.last_path() == ("fast-wgmma" if form == "wgmma" and not fp32_inputs else "fast")
    out = cupy.asnumpy(of).astype(np.float64)
    fin = np.isfinite(ref)
    assert not fin[0, hit_rows].all() and fin[0, [i for i in range(w) if i not in hit_rows]].all()
    assert np.array_equal(out[~fin], ref[~fin]), "attended non-finite V: the output must be that inf"
    # the bound of the finite elements: an inf (key, d) is attended by none of their rows (else they
    # would be inf), so it weighs 0 there and may be read as 0 for S1 and Vmax
    zero_inf = lambda x: np.where(np.isfinite(np.asarray(x, np.float64)), np.asarray(x, np.float64), 0.0)
    bound, _ = derived_bound(case["q"], case["k"], zero_inf(case["v"]), case["k_cache"], zero_inf(case["v_cache"]),
                             case["frontier"], case["live"], window, fp32_inputs=fp32_inputs, ns_max=64)
    assert np.isfinite(out[fin]).all()
    assert float((np.abs(out[fin] - ref[fin]) / bound[fin]).max()) <= 1.0


# ------------------------------------------------------------------------ masked_block's shapes and the splits


def _round_case(cp, b, w, cap, window, tails, seed=3):
    """An attention call of masked_block's (Hq 32, Hk 8, D 128, F 4096, frontiers F - 3 b): q/k/v as FP32
    arrays holding BF16 values (fb_qkv_post rounds them) and as the same BF16 bits."""
    rng = np.random.default_rng([seed, b, w, cap, window])
    hq, hk, d, front = 32, 8, 128, 4096
    q, k, v = (_bf16(rng.standard_normal(s)) for s in ((b, w, hq, d), (b, w, hk, d), (b, w, hk, d)))
    kc = _bf16(rng.standard_normal((b, cap, hk, d)))
    vc = np.abs(_bf16(rng.standard_normal((b, cap, hk, d)))).astype(np.float16)
    frontier = front - 3 * np.arange(b, dtype=np.int64)
    live = np.maximum(w - np.arange(b) % 4, 1).astype(np.int32) if tails else np.full(b, w, np.int32)
    rest = (cp.asarray(kc.view(np.uint16)), cp.asarray(vc.view(np.uint16)), cp.asarray(frontier), cp.asarray(live),
            window)
    f32 = tuple(cp.asarray(x.astype(np.float32)) for x in (q, k, v))
    bits = tuple(cp.asarray(x.view(np.uint16)) for x in (q, k, v))
    return f32, bits, rest, {"q": q, "k": k, "v": v, "k_cache": kc, "v_cache": vc, "frontier": frontier,
                             "live": live, "window": window}


ROUND_SHAPES = {"27B_B1_W8": (1, 8, 2048, 2048, False), "27B_B2_W16": (2, 16, 2048, 2048, False),
                "35B_local_B2_W16": (2, 16, 4096, 4096, True), "35B_full_B1_W8": (1, 8, 4096, 0, True)}


@pytest.mark.parametrize("splits", [None, 1, 7])
@pytest.mark.parametrize("shape", sorted(ROUND_SHAPES))
def test_fp32_holding_bf16_values_gives_the_bf16_bits(cupy, fa, shape, splits):
    """masked_block hands FP32 q/k/v that hold BF16 values: Q_lo = K_lo = V_lo = 0, so the FP32 path
    (fast_attn_*_f) must give the BF16-bit path's (fast_attn_*_b) bits, FP32 and BF16 outputs alike."""
    fa.set(attention_splits=splits)
    f32, bits, rest, _ = _round_case(cupy, *ROUND_SHAPES[shape])
    a32, a16 = fa.attention_fast(*f32, *rest, f32_out=True, bf16_out=True)
    b32, b16 = fa.attention_fast(*bits, *rest, f32_out=True, bf16_out=True)
    assert fa.last_path() == "fast"
    assert np.array_equal(cupy.asnumpy(a32).view(np.uint32), cupy.asnumpy(b32).view(np.uint32))
    assert np.array_equal(cupy.asnumpy(a16), cupy.asnumpy(b16))


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("shape", ["35B_local_B2_W16", "27B_B1_W8"])
def test_split_counts_and_repeats(cupy, fa, shape, stages):
    """Every split count 1 .. 64 (more splits than context tiles too) within the derived bound of the float64
    attention, with 2, 3 and 4 K/V stages (the block tile loaded in the loop or after it: splits of fewer tiles
    than stages, and of none); a call repeated gives the same bits."""
    fa.set(attention_stages=stages)
    _split_sweep(cupy, fa, ROUND_SHAPES[shape], "fast")


def _split_sweep(cupy, fa, shape, path):
    _, bits, rest, case = _round_case(cupy, *shape)
    ref = attend(case["q"], case["k"], case["v"], case["k_cache"], case["v_cache"], case["frontier"], case["live"],
                 case["window"])
    bound, _ = derived_bound(case["q"], case["k"], case["v"], case["k_cache"], case["v_cache"], case["frontier"],
                             case["live"], case["window"], fp32_inputs=False, ns_max=64)
    rows = np.arange(ref.shape[1])[None, :] < case["live"][:, None]
    for ns in (1, 2, 3, 5, 16, 33, 64):
        fa.set(attention_splits=ns)
        first = cupy.asnumpy(fa.attention_fast(*bits, *rest, f32_out=True)[0])
        assert fa.last_path() == path
        for _ in range(2):
            again = cupy.asnumpy(fa.attention_fast(*bits, *rest, f32_out=True)[0])
            assert np.array_equal(first.view(np.uint32), again.view(np.uint32)), f"splits {ns}: a repeat differs"
        err = np.abs(first.astype(np.float64) - ref)[rows]
        assert float((err / bound[rows]).max()) <= 1.0, f"splits {ns}"
        assert not np.any(first[~rows])


@pytest.mark.parametrize("splits", [1, 7, 16])
@pytest.mark.parametrize("shape", sorted(ROUND_SHAPES))
def test_stage_count_does_not_change_the_bits(cupy, fa, shape, splits):
    """2, 3 and 4 K/V stages run the same operations in the same order (only when tiles and the block tile land
    differs): the same bits, FP32 and BF16 outputs, BF16-bit and FP32 inputs, at a given split count (the
    heuristic's count follows the occupancy, which the stage count changes)."""
    fa.set(attention_splits=splits)
    f32, bits, rest, _ = _round_case(cupy, *ROUND_SHAPES[shape])
    outs = {}
    for stages in (2, 3, 4):
        fa.set(attention_stages=stages)
        for name, inputs in (("bits", bits), ("f32", f32)):
            a32, a16 = fa.attention_fast(*inputs, *rest, f32_out=True, bf16_out=True)
            outs[(stages, name)] = (cupy.asnumpy(a32).view(np.uint32), cupy.asnumpy(a16))
    base = outs[(2, "bits")]
    for key, (a32, a16) in outs.items():
        assert np.array_equal(a32, base[0]) and np.array_equal(a16, base[1]), f"stages {key[0]}, {key[1]} inputs"


@pytest.mark.parametrize("form", ["mma_fp32_inputs", "wgmma_bf16_bits"])
def test_graph_replay_gives_the_eager_bits(cupy, fa, form):
    """A call captured in a CUDA graph (after an eager call on that stream, as FastRound and masked_block
    capture) and replayed several times gives the eager call's bits (split kernel and combine): the mma.sync
    kernel on FP32 inputs, and the wgmma form on BF16 bits (attention_wgmma True)."""
    f32, bits, rest, _ = _round_case(cupy, *ROUND_SHAPES["35B_local_B2_W16"])
    inputs = f32
    if form.startswith("wgmma"):
        _need_wg(fa)
        fa.set(attention_wgmma=True)
        inputs = bits
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        eager = cupy.asnumpy(fa.attention_fast(*inputs, *rest, f32_out=False, bf16_out=True)[1])
        assert fa.last_path() == ("fast-wgmma" if form.startswith("wgmma") else "fast")
        s.synchronize()
        s.begin_capture()
        out = fa.attention_fast(*inputs, *rest, f32_out=False, bf16_out=True)[1]
        g = s.end_capture()
        for _ in range(3):
            out.fill(0)
            g.launch(s)
            s.synchronize()
            assert np.array_equal(cupy.asnumpy(out), eager)


# ---------------------------------------------------------- the wgmma form (FastOptions.attention_wgmma)

# the random cases the form takes: D 128 and more than 32 query rows (W x Hq / Hk = 64: one warpgroup)
WG_CASES = [n for n, c in sorted(CASES.items()) if c[4] == 128 and c[1] * c[2] // c[3] > 32]
WG_ROUND_SHAPES = {"27B_B2_W16": ROUND_SHAPES["27B_B2_W16"], "35B_local_B2_W16": ROUND_SHAPES["35B_local_B2_W16"],
                   "35B_local_B8_W16": (8, 16, 4096, 4096, True), "35B_full_B8_W16": (8, 16, 4096, 0, True)}


@pytest.fixture
def wg(fa):
    _need_wg(fa)
    fa.set(attention_wgmma=True)
    return fa


def test_wgmma_cases_exist():
    assert WG_CASES == ["full_B2_W16_Hq8_Hk1_two_chunks", "full_B8_W16_Hq8_Hk2_ring_wrap",
                        "local_S2048_C2048_B8_W16"], WG_CASES


@pytest.mark.parametrize("stages", [None, 3])
@pytest.mark.parametrize("splits", [None, 5, 64])
@pytest.mark.parametrize("name", WG_CASES)
def test_wgmma_form_against_float64_reference(cupy, wg, name, splits, stages):
    """The wgmma form on the random cases it takes (ring wrap, frontiers past 2^31 / 2^32, a window of 2048 cutting
    tiles, planted keys at the edges, live tails), BF16 bits: every live element within the same derived bound as
    the mma.sync kernel (its sums are FP32 tensor-core chains over the same D and key counts), 2 and 3 stages."""
    wg.set(attention_splits=splits)
    wg.set(attention_stages=stages or 2)
    _against_reference(cupy, wg, _prepared(name)[False], False, "fast-wgmma",
                       f"{name}/bf16/wgmma/splits{splits}/stages{stages}")


@pytest.mark.parametrize("stages", [2, 3])
def test_wgmma_form_split_counts_and_repeats(cupy, wg, stages):
    """Split counts 1 .. 64 within the derived bound, each repeated with the same bits, at 2 and 3 stages."""
    wg.set(attention_stages=stages or 2)
    _split_sweep(cupy, wg, ROUND_SHAPES["35B_local_B2_W16"], "fast-wgmma")


@pytest.mark.parametrize("splits", [None, 1, 7])
@pytest.mark.parametrize("shape", sorted(WG_ROUND_SHAPES))
def test_wgmma_form_gives_the_mma_kernels_bits(cupy, fa, shape, splits):
    """At masked_block's shapes of 64 query rows the wgmma form and the mma.sync kernel run the same products in the
    same order: every tile's QK^T as 8 k16 steps over D accumulated in FP32 from 0, its PV as 4 k16 steps of 16 keys
    into the running output, the softmax and the epilogue unchanged. The tensor cores' k16 step is one operation in
    both, so the outputs are the same bits (FP32 and BF16), at 2 stages and (at a forced split count) 3 stages of the
    wgmma form. The heuristic's split count follows the occupancy (3 stages hold one block a multiprocessor: 2 splits
    at B8 against 4), and another partition of the keys is another sum in the combine, so 3 stages are compared at
    forced counts only (at the heuristic's counts 126,058 to 473,674 elements differ, all of them from 2 splits
    against 4)."""
    _need_wg(fa)
    fa.set(attention_splits=splits)
    _, bits, rest, _ = _round_case(cupy, *WG_ROUND_SHAPES[shape])
    outs = {}
    for form, stages in (("mma", 2), ("wgmma", 2), *((("wgmma", 3),) if splits else ())):
        fa.set(attention_wgmma=form == "wgmma")
        fa.set(attention_stages=stages or 2)
        a32, a16 = fa.attention_fast(*bits, *rest, f32_out=True, bf16_out=True)
        assert fa.last_path() == ("fast-wgmma" if form == "wgmma" else "fast")
        outs[(form, stages)] = (cupy.asnumpy(a32).view(np.uint32), cupy.asnumpy(a16))
    base = outs[("mma", 2)]
    for key, (a32, a16) in outs.items():
        differ = int((a32 != base[0]).sum())
        REPORT.setdefault("wgmma_vs_mma", {})[f"{shape}/splits{splits}/{key}"] = differ
        assert differ == 0 and np.array_equal(a16, base[1]), f"{key}: {differ} FP32 elements differ"


def test_wgmma_form_holds_two_blocks_a_multiprocessor_at_two_stages(cupy, wg):
    """Two blocks a multiprocessor at 2 stages (D 128, 4 m-tiles: 83,968 B each with the alignment slack), by the
    occupancy calculator (registers included), as the split heuristic assumes; one at 3 where the H200's 228 KB
    holds one 116,736-byte block and not two."""
    attrs = cupy.cuda.Device().attributes
    per_sm = int(attrs.get("MaxSharedMemoryPerMultiprocessor", 0))
    assert wg.resident_blocks(128, 4, False, 2, wg=True) == 2
    if 116736 + 1024 <= per_sm < 2 * (116736 + 1024):
        assert wg.resident_blocks(128, 4, False, 3, wg=True) == 1
