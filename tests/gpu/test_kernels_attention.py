"""GPU: the attention-path kernels (kernels_cu.exact.attention via CudaBackend) against the float64
reference, with bounds derived from the float32 baseline (CONTRACTS C2).

For each case the reference runs twice on the same inputs: in float64 (the expected values) and
under ``precision.baseline`` with the Op's allowed BF16 intermediates (a plain low-precision
implementation of the same math). A represented output passes when

    max ulp error <= 2 * (baseline max ulp error) + 1        (the FlashAttention rule, C2)
    normwise error <= 2 * (baseline normwise error) + u      (u: unit roundoff of the format)

over the compared elements (the case's masks: live rows, live cache slots). Exact outputs must
be equal. A decision (proposal_head tokens) may differ from the reference only where the
reference margin is positive and within 2x the baseline's margin error plus an FP32-spacing
floor; an exact tie (margin 0) must follow the C4 tie rule.

Cases: every ``generate()`` case of conformance/cases/<op>.py that exists, plus hand-built
cases here for what the kernels add (ring wrap, 2^31/2^32 positions, tail extents, shortlist,
both layer variants, composed blocks), plus hypothesis sweeps of the mask boundaries. When
DFLASH_GPU_RESULTS names a file, every comparison's numbers and the backend's environment are
written there as JSON.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable, Mapping

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.registry import DECISION, EXACT, REPRESENTED, Output
from reference import numerics, precision
from reference.context_kv import context_kv as ref_context_kv
from reference.context_kv import live_mask
from reference.draft_attention import draft_attention as ref_draft_attention
from reference.draft_layer import BF16_INTERMEDIATES as LAYER_BF16
from reference.draft_layer import draft_layer as ref_draft_layer
from reference.feature_capture import feature_capture as ref_feature_capture
from reference.grouped_conv import grouped_conv as ref_grouped_conv
from reference.masked_block import BF16_INTERMEDIATES as BLOCK_BF16
from reference.masked_block import masked_block as ref_masked_block
from reference.proposal_head import proposal_head as ref_proposal_head

pytestmark = pytest.mark.gpu

RESULTS: list[dict] = []
HYPO = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ----------------------------------------------------------------------------- comparison


def host(x) -> np.ndarray:
    """NumPy view of an implementation output; uint16 is BF16 bits (the array convention)."""
    if hasattr(x, "get"):
        x = x.get()
    a = np.asarray(x)
    return a.view(ml_dtypes.bfloat16) if a.dtype == np.uint16 else a


STORAGE_DTYPE = {"bf16": np.uint16, "fp16": np.float16, "fp32": np.float32}


def _represented(o: Output, ref, base, out, mask) -> list[str]:
    raw = out.get() if hasattr(out, "get") else np.asarray(out)
    problems = []
    if raw.dtype != STORAGE_DTYPE[o.fmt]:
        problems.append(f"{o.name}: dtype {raw.dtype}, the convention for {o.fmt} is {np.dtype(STORAGE_DTYPE[o.fmt])}")
    r = np.asarray(ref, np.float64)
    b = np.asarray(base, np.float64)
    x = np.asarray(host(out), np.float64)
    if x.shape != r.shape:
        return [*problems, f"{o.name}: shape {x.shape}, expected {r.shape}"]
    m = np.ones(r.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), r.shape)
    base_ulp = float(numerics.ulp_error(b, r, o.fmt)[m].max(initial=0.0))
    base_norm = numerics.normwise_error(b[m], r[m])
    # C2: twice the float32 baseline's error against float64, plus a one-ulp (unit roundoff) floor
    bound_ulp = 2.0 * base_ulp + 1.0
    bound_norm = 2.0 * base_norm + 2.0 ** -numerics.get_format(o.fmt).precision
    err = numerics.ulp_error(x, r, o.fmt)
    ulp = float(err[m].max(initial=0.0))
    norm = numerics.normwise_error(x[m], r[m])
    RESULTS[-1]["outputs"][o.name] = {
        "ulp": ulp,
        "bound_ulp": bound_ulp,
        "norm": norm,
        "bound_norm": bound_norm,
        "baseline_ulp": base_ulp,
        "baseline_norm": base_norm,
    }
    if not ulp <= bound_ulp or not norm <= bound_norm:
        at = np.unravel_index(int(np.argmax(np.where(m, err, -1.0))), r.shape)
        problems.append(
            f"{o.name}: max {ulp:.3g} ulp (bound {bound_ulp:.3g}) at {tuple(map(int, at))} "
            f"[got {x[at]!r}, expected {r[at]!r}]; normwise {norm:.3g} (bound {bound_norm:.3g})"
        )
    return problems


def _exact(o: Output, ref, out, mask) -> list[str]:
    r, x = np.asarray(ref), np.asarray(host(out))
    if x.shape != r.shape:
        return [f"{o.name}: shape {x.shape}, expected {r.shape}"]
    m = np.ones(r.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), r.shape)
    diff = (x != r) & m
    RESULTS[-1]["outputs"][o.name] = {"mismatches": int(diff.sum())}
    if diff.any():
        at = tuple(np.argwhere(diff)[0])
        return [f"{o.name}: {int(diff.sum())} differ, first at {at} (got {x[at]}, expected {r[at]})"]
    return []


def _decision(o: Output, ref: Mapping, base: Mapping, out, mask) -> list[str]:
    r, x = np.asarray(ref[o.name]), np.asarray(host(out))
    if x.shape != r.shape:
        return [f"{o.name}: shape {x.shape}, expected {r.shape}"]
    m = np.ones(r.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), r.shape)
    margin = np.asarray(ref[f"{o.name}.margin"], np.float64)
    mb = np.asarray(base[f"{o.name}.margin"], np.float64)
    same = np.asarray(base[o.name]) == r
    # the baseline's margin error: |m_base - m_ref| where it chose alike, m_ref + m_base where it
    # did not (conformance/bounds.py), so its own divergences are within tolerance
    fin = m & np.isfinite(margin) & np.isfinite(mb)
    margin_err = float(np.where(same, np.abs(mb - margin), margin + mb)[fin].max(initial=0.0))
    tol = 2.0 * margin_err + numerics.quantum(np.abs(margin), "fp32")
    diff = (x != r) & m
    ok = diff & (margin > 0) & (margin <= tol)
    bad = diff & ~ok
    RESULTS[-1]["outputs"][o.name] = {
        "divergences": int(diff.sum()),
        "acceptable": int(ok.sum()),
        "margin_err": margin_err,
    }
    if bad.any():
        at = tuple(np.argwhere(bad)[0])
        why = "exact tie (C4 tie rule)" if margin[at] == 0 else f"margin {margin[at]:.3g} > tol {tol[at]:.3g}"
        return [f"{o.name}: differs at {at} (got {x[at]}, expected {r[at]}; {why})"]
    return []


def check(
    op: str, case_id: str, outputs, ref_fn: Callable, kwargs: Mapping, masks: Mapping, bf16_inter, impl: Callable
) -> list[str]:
    """Run reference, baseline and implementation on one case; return its problems (empty: PASS)."""
    ref = dict(ref_fn(**kwargs))
    with precision.baseline(bf16_inter):
        base = dict(ref_fn(**kwargs))
    RESULTS.append({"op": op, "case": case_id, "outputs": {}})
    try:
        out = impl(**kwargs)
    except Exception as exc:  # noqa: BLE001 - an ERROR of one case is reported with the others
        RESULTS[-1]["error"] = f"{type(exc).__name__}: {exc}"
        return [f"{case_id}: raised {type(exc).__name__}: {exc}"]
    problems = []
    missing = [o.name for o in outputs if o.name not in out]
    if missing:
        return [f"{case_id}: outputs {missing} missing"]
    for o in outputs:
        mask = masks.get(o.name)
        if o.cls == REPRESENTED:
            problems += _represented(o, ref[o.name], base[o.name], out[o.name], mask)
        elif o.cls == EXACT:
            problems += _exact(o, ref[o.name], out[o.name], mask)
        elif o.cls == DECISION:
            problems += _decision(o, ref, base, out[o.name], mask)
    return [f"{case_id}: {p}" for p in problems]


def run_all(op: str, backend, cases, outputs, ref_fn, bf16_inter) -> None:
    """cases: iterable of (case_id, kwargs, masks); fails with every problem listed."""
    problems, n = [], 0
    for case_id, kwargs, masks in cases:
        n += 1
        problems += check(op, case_id, outputs, ref_fn, kwargs, masks, bf16_inter, getattr(backend, op))
    assert n > 0
    assert not problems, f"{len(problems)} problem(s) in {n} {op} case(s):\n" + "\n".join(problems)


def generated(op: str):
    """(spec, [(id, kwargs, masks)]) from conformance/cases/<op>.py, or (None, []) before it exists."""
    try:
        mod = importlib.import_module(f"conformance.cases.{op}")
    except ModuleNotFoundError as exc:
        if exc.name == f"conformance.cases.{op}":
            return None, []
        raise
    return mod.SPEC, [(c.id, c.kwargs(), dict(c.masks)) for c in mod.generate()]


@pytest.fixture(scope="module", autouse=True)
def results_file():
    yield
    path = os.environ.get("DFLASH_GPU_RESULTS")
    if path:
        from kernels_cu.exact.backend import CudaBackend

        with open(path, "w") as fh:
            json.dump({"environment": CudaBackend().environment(), "results": RESULTS}, fh, indent=1, default=str)


# ----------------------------------------------------------------------------- inputs


def bf16(x) -> np.ndarray:
    return numerics.storage(x, "bf16")


def fp16_of_bf16(x) -> np.ndarray:
    return numerics.storage(numerics.context_v(x), "fp16")


def positive(rng, shape) -> np.ndarray:
    """Values in about [0.2, 5]: attention outputs (convex mixes) then stay away from 0, where any
    absolute error is thousands of ulps and the max-ulp comparison says nothing."""
    return np.exp(0.5 * rng.standard_normal(shape))


def rows_mask(live, shape) -> np.ndarray:
    rows = np.arange(shape[1])[None, :] < np.asarray(live)[:, None]
    return np.broadcast_to(rows.reshape(rows.shape + (1,) * (len(shape) - 2)), shape).copy()


def ring_caches(rng, b, capacity, hk, d, v_positive=True):
    k = bf16(rng.standard_normal((b, capacity, hk, d)))
    v = fp16_of_bf16(positive(rng, (b, capacity, hk, d)) if v_positive else rng.standard_normal((b, capacity, hk, d)))
    return k, v


def attention_case(seed, *, frontier, live, width, window, capacity, hq=4, hk=2, d=16, q_scale=1.5):
    rng = np.random.default_rng(seed)
    b = len(frontier)
    kc, vc = ring_caches(rng, b, capacity, hk, d)
    kwargs = {
        "q": bf16(rng.standard_normal((b, width, hq, d)) * q_scale),
        "k": bf16(rng.standard_normal((b, width, hk, d))),
        "v": bf16(positive(rng, (b, width, hk, d))),
        "k_cache": kc,
        "v_cache": vc,
        "frontier": np.asarray(frontier, np.int64),
        "live": np.asarray(live, np.int32),
        "window": int(window),
    }
    return kwargs, {"out": rows_mask(live, (b, width, hq, d))}


def layer_weights(rng, *, h, hq, hk, d, inter, variant, layers=None):
    lead = () if layers is None else (layers,)

    def normal(*shape, scale=1.0):
        return bf16(rng.standard_normal(lead + shape) * scale)

    def around_one(*shape):
        return bf16(rng.uniform(0.5, 1.5, lead + shape))

    w = {
        "input_norm": around_one(h),
        "wq": normal(hq * d, h, scale=h**-0.5),
        "wk": normal(hk * d, h, scale=h**-0.5),
        "wv": normal(hk * d, h, scale=h**-0.5),
        "q_norm": around_one(d),
        "k_norm": around_one(d),
        "wo": normal(h, hq * d, scale=(hq * d) ** -0.5),
        "post_norm": around_one(h),
        "w_gate": normal(inter, h, scale=h**-0.5),
        "w_up": normal(inter, h, scale=h**-0.5),
        "w_down": normal(h, inter, scale=inter**-0.5),
    }
    if variant == "dflash2":
        g = h // 16
        for side in ("attn", "mlp"):
            base = np.empty(lead + (2, 2, h))
            base[..., 0, :] = 1.0 + 0.25 * rng.standard_normal(lead + (2, h))
            base[..., 1, :] = 0.25 * rng.standard_normal(lead + (2, h))
            w[f"{side}_conv_base"] = bf16(base)
            w[f"{side}_conv_proj"] = normal(4 * g, h, scale=0.2 * h**-0.5)
    return w


def layer_case(
    seed, *, variant, frontier, live, width, window, capacity, h=48, hq=4, hk=2, d=16, inter=80, theta=1e7, eps=1e-6
):
    rng = np.random.default_rng(seed)
    b = len(frontier)
    kc, vc = ring_caches(rng, b, capacity, hk, d, v_positive=False)
    kwargs = {
        "x": bf16(rng.standard_normal((b, width, h))),
        "k_cache": kc,
        "v_cache": vc,
        "frontier": np.asarray(frontier, np.int64),
        "live": np.asarray(live, np.int32),
        "eps": eps,
        "theta": theta,
        "head_dim": d,
        "window": int(window),
        "variant": variant,
    }
    kwargs.update(layer_weights(rng, h=h, hq=hq, hk=hk, d=d, inter=inter, variant=variant))
    return kwargs, {"x_next": rows_mask(live, (b, width, h))}


def block_case(
    seed,
    *,
    variant,
    frontier,
    live,
    num_drafts,
    windows,
    capacity,
    h=32,
    hq=4,
    hk=2,
    d=8,
    inter=48,
    vocab_rows=40,
    mask_token_id=7,
):
    rng = np.random.default_rng(seed)
    b, n_layers = len(frontier), len(windows)
    ck = bf16(rng.standard_normal((n_layers, b, capacity, hk, d)))
    cv = fp16_of_bf16(rng.standard_normal((n_layers, b, capacity, hk, d)))
    anchor = rng.choice(np.setdiff1d(np.arange(vocab_rows), [mask_token_id]), b, replace=False).astype(np.int32)
    kwargs = {
        "anchor": anchor,
        "embed": bf16(rng.standard_normal((vocab_rows, h))),
        "frontier": np.asarray(frontier, np.int64),
        "live": np.asarray(live, np.int32),
        "context_k": ck,
        "context_v": cv,
        "final_norm": bf16(rng.uniform(0.5, 1.5, h)),
        "mask_token_id": mask_token_id,
        "windows": list(windows),
        "eps": 1e-6,
        "theta": 1e7,
        "head_dim": d,
        "variant": variant,
        "num_drafts": num_drafts,
    }
    kwargs.update(layer_weights(rng, h=h, hq=hq, hk=hk, d=d, inter=inter, variant=variant, layers=n_layers))
    cols = np.arange(num_drafts)[None, :] + 1 < np.asarray(live)[:, None]  # mask column i compared when i+1 < live
    return kwargs, {"hidden": np.broadcast_to(cols[..., None], (b, num_drafts, h)).copy()}


def context_case(seed, *, start, rows, capacity=None, page_size=None, pages=None, hk=2, d=16, h=40, v_scale=1.0):
    rng = np.random.default_rng(seed)
    n = hk * d
    kwargs = {
        "context": bf16(rng.standard_normal((rows, h))),
        "wk": bf16(rng.standard_normal((n, h)) / np.sqrt(h)),
        "wv": bf16(rng.standard_normal((n, h)) * v_scale / np.sqrt(h)),
        "k_norm": bf16(rng.uniform(0.5, 1.5, d)),
        "start": int(start),
        "eps": 1e-6,
        "theta": 1e7,
        "head_dim": d,
    }
    if page_size is None:
        shape, table = (capacity, hk, d), None
        kwargs["storage"] = "ring"
    else:
        shape = (pages, page_size, hk, d)
        table = rng.permutation(pages)[: -(-(start + rows) // page_size)].astype(np.int32)
        kwargs.update(storage="paged", page_size=int(page_size), page_table=table)
    # garbage everywhere: only the live slots are compared, and those are all rewritten or were live before
    kwargs["k_cache"] = bf16(1000.0 * rng.standard_normal(shape))
    kwargs["v_cache"] = fp16_of_bf16(1000.0 * rng.standard_normal(shape))
    live = live_mask(start + rows, shape, kwargs["storage"], table, page_size)
    old = live_mask(start, shape, kwargs["storage"], table, page_size)
    # slots live before and after this chunk keep their old (compared) bytes: give them sane values
    keep = old & live
    kwargs["k_cache"] = np.where(keep, bf16(rng.standard_normal(shape)), kwargs["k_cache"]).astype(ml_dtypes.bfloat16)
    kwargs["v_cache"] = np.where(keep, fp16_of_bf16(rng.standard_normal(shape)), kwargs["v_cache"]).astype(np.float16)
    return kwargs, {"k_cache": live, "v_cache": live}


# ----------------------------------------------------------------------------- Op outputs

OUT_CONTEXT = (Output("context", REPRESENTED, "bf16"),)
OUT_CKV = (Output("k_cache", REPRESENTED, "bf16"), Output("v_cache", REPRESENTED, "fp16"), Output("frontier", EXACT))
OUT_ATT = (Output("out", REPRESENTED, "bf16"),)
OUT_LAYER = (Output("x_next", REPRESENTED, "bf16"),)
OUT_BLOCK = (Output("hidden", REPRESENTED, "bf16"),)
OUT_HEAD = (Output("tokens", DECISION),)
OUT_CONV = tuple(Output(n, REPRESENTED, "bf16") for n in ("prepared", "finish_delta", "finished"))


def _spec_or(op, outputs, inter):
    spec, cases = generated(op)
    return (spec.outputs, spec.bf16_intermediates, cases) if spec is not None else (outputs, inter, [])


# ----------------------------------------------------------------------------- represented rounding


def _conversion_module(cupy, variant):
    from kernels_cu import loader

    if variant == "headers":
        return loader.load_module("exact/norm_rope")
    src = loader.source_path("exact/norm_rope").read_text()
    opts = (*loader.NVRTC_OPTIONS, *loader.include_options(), "-DDFLASH_NO_CUDA_FP_HEADERS")
    return cupy.RawModule(code=src, options=opts)


def _fp32_samples() -> np.ndarray:
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    # BF16 halfway points (low half exactly 0x8000, both parities) and their neighbours
    hi = rng.integers(0, 2**16, 4096, dtype=np.uint64).astype(np.uint32) << 16
    ties = np.concatenate([hi | 0x8000, hi | 0x7FFF, hi | 0x8001])
    specials = np.array(
        [
            65504.0,
            65519.99,
            65520.0,
            65536.0,
            2.0**-24,
            2.0**-25,
            1.5 * 2.0**-25,
            2.0**-14,
            3.0 * 2.0**-26,
            1e-40,
            -1e-40,
            1.17e-38,
            np.inf,
            -np.inf,
            np.nan,
            0.0,
            -0.0,
            3.3895e38,
            3.4e38,
        ],
        dtype=np.float32,
    ).view(np.uint32)
    return np.concatenate([bits, ties, specials]).view(np.float32)


@pytest.mark.parametrize("variant", ["headers", "ptx_fallback"])
def test_represented_rounding_matches_numerics(cupy, variant):
    """f32 -> BF16, -> FP16 and FP16_RNE(BF16(.)) round exactly as reference/numerics.py (C1),
    through the CUDA intrinsics and through common.cuh's PTX fallback, ties and edges included."""
    mod = _conversion_module(cupy, variant)
    path = cupy.zeros(1, dtype=np.int32)
    mod.get_function("fp_conversion_path")((1,), (1,), (path,))
    if variant == "ptx_fallback":
        assert int(path[0]) == 0, "DFLASH_NO_CUDA_FP_HEADERS did not select the PTX path"
    x = _fp32_samples()
    xd = cupy.asarray(x)
    n = np.int64(x.size)
    for kernel, fmt, expect in (
        ("f32_to_bf16_kernel", "bf16", lambda v: numerics.to_bf16(v)),
        ("f32_to_f16_kernel", "fp16", lambda v: numerics.to_fp16(v)),
        ("context_v_kernel", "fp16", lambda v: numerics.context_v(v)),
    ):
        out = cupy.empty(x.size, dtype=np.uint16)
        mod.get_function(kernel)(((x.size + 255) // 256,), (256,), (xd, out, n))
        got = out.get().view(ml_dtypes.bfloat16 if fmt == "bf16" else np.float16).astype(np.float64)
        with np.errstate(invalid="ignore"):  # NaN inputs: NaN stays NaN (C1), its sign and payload are free
            want = numerics.storage(expect(x.astype(np.float64)), fmt).astype(np.float64)
        nan = np.isnan(got) & np.isnan(want)
        same = nan | ((got == want) & (np.signbit(got) == np.signbit(want)))
        bad = np.flatnonzero(~same)
        assert bad.size == 0, (
            f"{kernel} ({variant}): {bad.size} mismatches, e.g. x={x[bad[:5]]!r} "
            f"got {got[bad[:5]]!r} want {want[bad[:5]]!r}"
        )


def test_16bit_expansions_are_exact(cupy):
    from kernels_cu.exact import attention as ops

    bits = np.arange(1 << 16, dtype=np.uint16)
    got = ops.f32(bits).get()
    want = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    h = bits.view(np.float16)
    got16 = ops.f32(h).get()
    fin = ~np.isnan(h)
    assert np.array_equal(got16[fin].view(np.uint32), h[fin].astype(np.float32).view(np.uint32))


# ----------------------------------------------------------------------------- per Op


def test_feature_capture(backend):
    outputs, inter, cases = _spec_or("feature_capture", OUT_CONTEXT, frozenset({"projected"}))
    rng = np.random.default_rng(11)
    for ids, blocks, t, ht, h in (
        ([3, 0, 5], 6, 9, 48, 80),
        ([1, 6, 11, 16, 22, 27, 32, 37], 40, 5, 32, 272),
        ([0], 1, 1, 16, 16),
        ([4, 2], 5, 33, 64, 520),
    ):
        r = rng.standard_normal((blocks, t, ht)) * 2.0 ** (np.arange(blocks) / 4.0)[:, None, None]
        kwargs = {
            "block_outputs": bf16(r),
            "fc_weight": bf16(rng.standard_normal((h, len(ids) * ht)) / np.sqrt(ht)),
            "hidden_norm": bf16(rng.uniform(0.5, 1.5, h)),
            "target_layer_ids": ids,
            "eps": 1e-6,
        }
        cases.append((f"feature_capture/hand_ids{'_'.join(map(str, ids))}_T{t}_Ht{ht}_H{h}", kwargs, {}))
    run_all("feature_capture", backend, cases, outputs, ref_feature_capture, inter)


def test_context_kv(backend):
    outputs, inter, cases = _spec_or("context_kv", OUT_CKV, frozenset())
    hand = [
        ("ring_T3_lt_C8_start0", {"start": 0, "rows": 3, "capacity": 8}),
        ("ring_T8_eq_C8_start5_wrap", {"start": 5, "rows": 8, "capacity": 8}),
        ("ring_T29_gt_C8_start3_final_window_only", {"start": 3, "rows": 29, "capacity": 8}),
        ("ring_T6_C7_start2p31-3", {"start": 2**31 - 3, "rows": 6, "capacity": 7}),
        ("ring_T9_C16_start2p32-4_D128", {"start": 2**32 - 4, "rows": 9, "capacity": 16, "hk": 1, "d": 128, "h": 160}),
        ("ring_T5_C4_start2p40+1", {"start": 2**40 + 1, "rows": 5, "capacity": 4}),
        ("ring_T4_C8_start17_D6_Hk3", {"start": 17, "rows": 4, "capacity": 8, "hk": 3, "d": 6}),
        ("ring_v_overflow_and_subnormal", {"start": 1, "rows": 12, "capacity": 16, "v_scale": 3.0e4}),
        ("ring_v_subnormal", {"start": 1, "rows": 12, "capacity": 16, "v_scale": 3.0e-6}),
        ("paged_ps4_T10_start3", {"start": 3, "rows": 10, "page_size": 4, "pages": 6}),
        ("paged_ps8_T3_start13_one_page_D128", {"start": 13, "rows": 3, "page_size": 8, "pages": 4, "hk": 1, "d": 128}),
    ]
    for i, (name, kw) in enumerate(hand):
        kwargs, masks = context_case(100 + i, **kw)
        cases.append((f"context_kv/hand_{name}", kwargs, masks))
    run_all("context_kv", backend, cases, outputs, ref_context_kv, inter)


def test_context_kv_paged_near_2p31(backend):
    """Paged write at positions across 2^31 (page index 2^19 - 1 -> 2^19 at page_size 4096): the
    64-bit position divides and wraps correctly; only the pages the table names exist."""
    start, rows, ps, hk, d, h = 2**31 - 20, 40, 4096, 1, 8, 24
    rng = np.random.default_rng(7)
    n_logical = -(-(start + rows) // ps)
    pages = 4
    table = np.full(n_logical, -1, np.int32)
    first = start // ps
    table[first:] = rng.permutation(pages)[: n_logical - first]
    shape = (pages, ps, hk, d)
    kwargs = {
        "context": bf16(rng.standard_normal((rows, h))),
        "wk": bf16(rng.standard_normal((hk * d, h)) / 7),
        "wv": bf16(rng.standard_normal((hk * d, h)) / 7),
        "k_norm": bf16(rng.uniform(0.5, 1.5, d)),
        "k_cache": bf16(np.zeros(shape)),
        "v_cache": fp16_of_bf16(np.zeros(shape)),
        "start": start,
        "eps": 1e-6,
        "theta": 1e7,
        "head_dim": d,
        "storage": "paged",
        "page_size": ps,
        "page_table": table,
    }
    written = np.zeros(shape[:2], bool)
    p = start + np.arange(rows)
    written[table[p // ps], p % ps] = True
    masks = {
        "k_cache": np.broadcast_to(written[..., None, None], shape),
        "v_cache": np.broadcast_to(written[..., None, None], shape),
    }
    problems = check(
        "context_kv",
        "context_kv/hand_paged_ps4096_T40_start2p31-20",
        OUT_CKV,
        ref_context_kv,
        kwargs,
        masks,
        frozenset(),
        backend.context_kv,
    )
    assert not problems, "\n".join(problems)


def test_context_kv_leaves_inputs_untouched(backend, cupy):
    kwargs, _ = context_case(5, start=4, rows=6, capacity=8)
    kc = cupy.asarray(kwargs["k_cache"].view(np.uint16))
    vc = cupy.asarray(kwargs["v_cache"])
    before = (kc.copy(), vc.copy())
    out = backend.context_kv(**{**kwargs, "k_cache": kc, "v_cache": vc})
    assert bool((kc == before[0]).all()) and bool((vc.view(np.uint16) == before[1].view(np.uint16)).all())
    assert int(out["frontier"]) == 10 and out["frontier"].dtype == np.int64 and out["frontier"].ndim == 0


@pytest.fixture(params=["draft_attention_fwd", "draft_attention_gqa"])
def attention_kernel(request, monkeypatch):
    """Both attention kernels answer every draft_attention, draft_layer and masked_block case,
    so either may be the automatic choice (ops_attention.attention_kernel)."""
    from kernels_cu.exact import attention as ops_attention

    monkeypatch.setattr(ops_attention, "ATTENTION_KERNEL", request.param)
    return request.param


def test_draft_attention(backend, attention_kernel):
    outputs, inter, cases = _spec_or("draft_attention", OUT_ATT, frozenset({"probs"}))
    hand = [
        ("local_S8_C8_F30_W16_live1", {"frontier": [30], "live": [1], "width": 16, "window": 8, "capacity": 8}),
        ("local_S8_C8_F30_W16_live16", {"frontier": [30], "live": [16], "width": 16, "window": 8, "capacity": 8}),
        ("local_S3_C3_F0_W16_no_context", {"frontier": [0], "live": [16], "width": 16, "window": 3, "capacity": 3}),
        ("full_C64_F0_W2", {"frontier": [0], "live": [2], "width": 2, "window": 0, "capacity": 64}),
        ("local_S16_C16_F2p31-5_W8", {"frontier": [2**31 - 5], "live": [8], "width": 8, "window": 16, "capacity": 16}),
        (
            "local_S16_C16_F2p32-3_W8_B2",
            {"frontier": [2**32 - 3, 2**32 + 40], "live": [8, 3], "width": 8, "window": 16, "capacity": 16},
        ),
        (
            "full_C300_F257_W16_D128_Hq8_Hk2",
            {"frontier": [257], "live": [16], "width": 16, "window": 0, "capacity": 300, "hq": 8, "hk": 2, "d": 128},
        ),
        (
            "local_S64_C64_F1000_W16_D256",
            {"frontier": [1000], "live": [11], "width": 16, "window": 64, "capacity": 64, "hq": 2, "hk": 1, "d": 256},
        ),
        (
            "local_S5_C9_F40_W7_D24",
            {"frontier": [40], "live": [7], "width": 7, "window": 5, "capacity": 9, "hq": 3, "hk": 1, "d": 24},
        ),
        ("local_S1_C4_F10_W4_only_itself", {"frontier": [10], "live": [4], "width": 4, "window": 1, "capacity": 4}),
    ]
    for i, (name, kw) in enumerate(hand):
        kwargs, masks = attention_case(200 + i, **kw)
        cases.append((f"draft_attention/hand_{name}", kwargs, masks))
    run_all(
        "draft_attention",
        backend,
        [(f"{c}@{attention_kernel}", kw, m) for c, kw, m in cases],
        outputs,
        ref_draft_attention,
        inter,
    )


def test_draft_attention_wide_group_falls_back(backend):
    """Hq/Hk = 16 at D = 128 exceeds the gqa kernel's tiles: the automatic choice is the
    per-query-head kernel, and it answers within the bound."""
    from kernels_cu.exact import attention as ops_attention

    assert ops_attention.attention_kernel(16, 1, 128) == "draft_attention_fwd"
    assert ops_attention.attention_kernel(32, 8, 128) == "draft_attention_gqa"  # both official geometries
    kwargs, masks = attention_case(12, frontier=[70], live=[9], width=9, window=32, capacity=32, hq=16, hk=1, d=128)
    problems = check(
        "draft_attention",
        "draft_attention/hand_Hq16_Hk1_D128_fallback",
        OUT_ATT,
        ref_draft_attention,
        kwargs,
        masks,
        frozenset({"probs"}),
        backend.draft_attention,
    )
    assert not problems, "\n".join(problems)


def test_draft_attention_window_edge(backend, attention_kernel):
    """Distance S-1 kept, S dropped: every context key has the same dominant score and its own value
    (value = position - F + S + 1, and 1000 at the position S before the first query), so each row's
    output is the mean over exactly its allowed positions and any off-by-one moves it visibly."""
    s, f, w, d = 6, 20, 4, 16
    kwargs, masks = attention_case(9, frontier=[f], live=[w], width=w, window=s, capacity=s, hq=1, hk=1, d=d)
    q = np.zeros((1, w, 1, d))
    q[..., 0] = 1.0
    kc, vc = np.zeros((1, s, 1, d)), np.zeros((1, s, 1, d))
    for p in range(f - s, f):  # the ring holds positions F-S .. F-1 at slot p mod S
        kc[0, p % s, 0, 0] = 8.0
        vc[0, p % s, 0, :] = 1000.0 if p == f - s else p - f + s + 1
    kwargs.update(
        q=bf16(q),
        k=bf16(np.zeros((1, w, 1, d))),
        v=bf16(np.ones((1, w, 1, d))),
        k_cache=bf16(kc),
        v_cache=fp16_of_bf16(vc),
    )
    ref = ref_draft_attention(**kwargs)["out"]
    # the design holds: no row sees the poisoned position, and each row's mean moves by > 0.1 per step
    assert np.all(ref < 10.0) and np.all(np.diff(ref[0, :, 0, 0]) > 0.1)
    problems = check(
        "draft_attention",
        "draft_attention/hand_window_edge_S6_F20_W4",
        OUT_ATT,
        ref_draft_attention,
        kwargs,
        masks,
        frozenset({"probs"}),
        backend.draft_attention,
    )
    assert not problems, "\n".join(problems)


@st.composite
def attention_geometry(draw):
    b = draw(st.integers(1, 2))
    width = draw(st.integers(1, 16))
    window = draw(st.one_of(st.just(0), st.integers(1, 12)))
    capacity = draw(st.integers(1, 20))
    frontier = draw(st.lists(st.integers(0, 60), min_size=b, max_size=b))
    live = draw(st.lists(st.integers(1, width), min_size=b, max_size=b))
    hk = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 3, 4, 8]))
    d = draw(st.sampled_from([8, 16, 40, 64]))
    seed = draw(st.integers(0, 2**31))
    return {
        "frontier": frontier,
        "live": live,
        "width": width,
        "window": window,
        "capacity": capacity,
        "hq": hk * group,
        "hk": hk,
        "d": d,
    }, seed


@pytest.mark.parametrize("kernel", ["draft_attention_fwd", "draft_attention_gqa"])
@HYPO
@given(geometry=attention_geometry())
def test_draft_attention_property(backend, kernel, geometry):
    """Tail extents (live 1..W), window edges S-1/S, ring wrap and short contexts, GQA ratios 1..8."""
    from kernels_cu.exact import attention as ops_attention

    kw, seed = geometry
    kwargs, masks = attention_case(seed, **kw)
    saved, ops_attention.ATTENTION_KERNEL = ops_attention.ATTENTION_KERNEL, kernel
    try:
        problems = check(
            "draft_attention",
            f"draft_attention/property_{kw}",
            OUT_ATT,
            ref_draft_attention,
            kwargs,
            masks,
            frozenset({"probs"}),
            backend.draft_attention,
        )
    finally:
        ops_attention.ATTENTION_KERNEL = saved
    assert not problems, "\n".join(problems)


@st.composite
def ring_chunk(draw):
    capacity = draw(st.integers(1, 12))
    rows = draw(st.integers(1, 30))
    start = draw(st.one_of(st.integers(0, 40), st.integers(2**31 - 40, 2**31 + 40), st.integers(2**32 - 40, 2**32)))
    return {
        "start": start,
        "rows": rows,
        "capacity": capacity,
        "hk": draw(st.integers(1, 3)),
        "d": draw(st.sampled_from([2, 8, 32])),
    }, draw(st.integers(0, 2**31))


@HYPO
@given(ring_chunk())
def test_context_kv_ring_property(backend, chunk):
    """Chunks shorter than, equal to and longer than C, at positions around 0, 2^31 and 2^32."""
    kw, seed = chunk
    kwargs, masks = context_case(seed, **kw)
    problems = check(
        "context_kv",
        f"context_kv/property_{kw}",
        OUT_CKV,
        ref_context_kv,
        kwargs,
        masks,
        frozenset(),
        backend.context_kv,
    )
    assert not problems, "\n".join(problems)


def test_grouped_conv(backend):
    outputs, inter, cases = _spec_or("grouped_conv", OUT_CONV, frozenset({"delta"}))
    rng = np.random.default_rng(21)
    for b, w, h in ((3, 16, 80), (1, 1, 16), (2, 9, 5120 // 4)):
        g = h // 16
        kwargs = {
            "x": bf16(rng.standard_normal((b, w, h))),
            "z": bf16(rng.standard_normal((b, w, h))),
            "base": bf16(rng.standard_normal((2, 2, h)) * 0.5),
            "proj": bf16(rng.standard_normal((4 * g, h)) / np.sqrt(h)),
        }
        cases.append((f"grouped_conv/hand_B{b}_W{w}_H{h}", kwargs, {}))
    run_all("grouped_conv", backend, cases, outputs, ref_grouped_conv, inter)


def test_draft_layer(backend, attention_kernel):
    outputs, inter, cases = _spec_or("draft_layer", OUT_LAYER, LAYER_BF16)
    hand = [
        (
            "dflash_local_S8_C8_F13_W6",
            {"variant": "dflash", "frontier": [13], "live": [6], "width": 6, "window": 8, "capacity": 8},
        ),
        (
            "dflash_local_S8_C8_F30_W16_live2_B2",
            {"variant": "dflash", "frontier": [30, 3], "live": [2, 16], "width": 16, "window": 8, "capacity": 8},
        ),
        (
            "dflash_full_C32_F20_W5",
            {"variant": "dflash", "frontier": [20], "live": [5], "width": 5, "window": 0, "capacity": 32},
        ),
        (
            "dflash_local_S16_F2p32-3_W4",
            {"variant": "dflash", "frontier": [2**32 - 3], "live": [4], "width": 4, "window": 16, "capacity": 16},
        ),
        (
            "dflash2_local_S8_C8_F2p31-2_W4",
            {"variant": "dflash2", "frontier": [2**31 - 2], "live": [4], "width": 4, "window": 8, "capacity": 8},
        ),
        (
            "dflash2_full_C24_F5_W16_H64",
            {"variant": "dflash2", "frontier": [5], "live": [16], "width": 16, "window": 0, "capacity": 24, "h": 64},
        ),
        (
            "dflash2_local_S4_C4_F9_W3_B3",
            {"variant": "dflash2", "frontier": [9, 0, 100], "live": [3, 3, 3], "width": 3, "window": 4, "capacity": 4},
        ),
        (
            "dflash_D128_Hq4_Hk1_H256_local_S32_F70_W16",
            {
                "variant": "dflash",
                "frontier": [70],
                "live": [16],
                "width": 16,
                "window": 32,
                "capacity": 32,
                "h": 256,
                "hq": 4,
                "hk": 1,
                "d": 128,
                "inter": 384,
            },
        ),
    ]
    for i, (name, kw) in enumerate(hand):
        kwargs, masks = layer_case(300 + i, **kw)
        cases.append((f"draft_layer/hand_{name}", kwargs, masks))
    cases = [(f"{c}@{attention_kernel}", kw, m) for c, kw, m in cases]
    run_all("draft_layer", backend, cases, outputs, ref_draft_layer, inter)


def test_masked_block(backend, attention_kernel):
    outputs, inter, cases = _spec_or("masked_block", OUT_BLOCK, BLOCK_BF16)
    hand = [
        (
            "dflash_local8_full_B2_K5_live3_6",
            {
                "variant": "dflash",
                "frontier": [9, 14],
                "live": [3, 6],
                "num_drafts": 5,
                "windows": [8, 0],
                "capacity": 16,
            },
        ),
        (
            "dflash2_local8_local8_B2_K7_live2_8",
            {
                "variant": "dflash2",
                "frontier": [20, 2**31 - 1],
                "live": [2, 8],
                "num_drafts": 7,
                "windows": [8, 8],
                "capacity": 8,
            },
        ),
        (
            "dflash_single_full_B1_K15_live16",
            {"variant": "dflash", "frontier": [40], "live": [16], "num_drafts": 15, "windows": [0], "capacity": 48},
        ),
        (
            "dflash2_three_layers_B1_K3",
            {"variant": "dflash2", "frontier": [6], "live": [4], "num_drafts": 3, "windows": [4, 4, 4], "capacity": 4},
        ),
    ]
    for i, (name, kw) in enumerate(hand):
        kwargs, masks = block_case(400 + i, **kw)
        cases.append((f"masked_block/hand_{name}", kwargs, masks))
    cases = [(f"{c}@{attention_kernel}", kw, m) for c, kw, m in cases]
    run_all("masked_block", backend, cases, outputs, ref_masked_block, inter)


def test_kernels_are_deterministic(backend):
    """Same inputs, same bits: the reductions have a fixed order (no atomics)."""
    kwargs, _ = layer_case(55, variant="dflash2", frontier=[40], live=[8], width=8, window=16, capacity=16)
    a = backend.draft_layer(**kwargs)["x_next"]
    b = backend.draft_layer(**kwargs)["x_next"]
    assert bool((a == b).all())


def test_proposal_head(backend):
    outputs, inter, cases = _spec_or("proposal_head", OUT_HEAD, frozenset())
    rng = np.random.default_rng(31)
    for b, k, h, rows, vocab, indexed in (
        (2, 3, 64, 1000, 990, False),
        (1, 15, 128, 4099, 4000, False),
        (3, 4, 32, 700, 5000, True),
    ):
        head = rng.standard_normal((rows, h))
        winners = rng.choice(min(rows - 3, vocab), b * k, replace=False)
        hidden = head[winners].reshape(b, k, h) + 0.2 * rng.standard_normal((b, k, h))
        head[-3:] = 3.0 * head[winners[:3]]  # padded rows (or out-of-vocab shortlist ids) that would win
        head[5] = head[winners[0]]  # an exact duplicate: the lower row must win
        kwargs = {"hidden": bf16(hidden), "head": bf16(head), "vocab_size": vocab}
        if indexed:
            sl = rng.choice(vocab, rows, replace=False).astype(np.int32)
            sl[-3:] = vocab + np.arange(3)
            kwargs["shortlist"] = sl
        cases.append(
            (f"proposal_head/hand_B{b}_K{k}_H{h}_rows{rows}_vocab{vocab}{'_indexed' if indexed else ''}", kwargs, {})
        )
    run_all("proposal_head", backend, cases, outputs, ref_proposal_head, inter)


def test_numpy_and_cupy_inputs_agree(backend, cupy):
    """The array convention: BF16 as ml_dtypes (NumPy) or as uint16 bits (CuPy) give identical bits."""
    kwargs, _ = attention_case(3, frontier=[11], live=[5], width=5, window=4, capacity=4)
    a = backend.draft_attention(**kwargs)["out"]
    dev = {
        k: (
            cupy.asarray(v.view(np.uint16))
            if isinstance(v, np.ndarray) and v.dtype == ml_dtypes.bfloat16
            else cupy.asarray(v)
            if isinstance(v, np.ndarray)
            else v
        )
        for k, v in kwargs.items()
    }
    b = backend.draft_attention(**dev)["out"]
    assert a.dtype == np.uint16 and bool((a == b).all())


def test_environment_records_the_build(backend):
    env = backend.environment()
    keys = (
        "nvrtc_options",
        "cupy",
        "device",
        "cuda_runtime_version",
        "cuda_driver_version",
        "numpy",
        "fp_conversion_path",
    )
    for key in keys:
        assert key in env, f"environment() lacks {key}: {env}"
    assert "-ftz=true" in env["nvrtc_options"]
