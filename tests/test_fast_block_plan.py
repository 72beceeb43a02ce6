"""The fast masked_block / draft_layer plan (kernels_cu/fast/block.py) on the CPU.

``FastBlockMixin``'s Op methods and ``block_forward`` run unchanged here with a NumPy twin of
the engine: each method of ``NumpyEngine`` is what one fast/block.cu kernel (or the BF16 GEMM)
computes, in float32 with the same BF16 rounding points, and the attention is the reference's
float64 attend rounded to BF16 (the GPU test runs the real kernels and the real attention). It
checks the plan (where the pipeline rounds, the hi/lo conv delta GEMM, the embedding gather, the
layer chaining, the final mask-column norm) against the suite: every masked_block and
draft_layer vector gives no FAIL or ERROR, and a larger random case stays inside the bound that
tests/gpu/test_fast_block.py asserts for the GPU (derivation there, in ``error_ratio``).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels_cu.fast.block import FastBlockMixin
from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions
from reference.draft_attention import attend

ROOT = Path(__file__).resolve().parents[1]
BF16 = ml_dtypes.bfloat16


def to_bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16).view(np.uint16)


def from_bits(b) -> np.ndarray:
    return np.asarray(b).view(BF16).astype(np.float32)


def rbf(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == BF16:
        return np.ascontiguousarray(a.view(np.uint16))
    if a.dtype == np.uint16:
        return np.ascontiguousarray(a)
    return to_bits(a)


def _prev_rows(a, W):
    """a[r - 1] for rows with column r % W >= 1, else 0 (the conv's preceding tap)."""
    prev = np.zeros_like(a)
    prev[1:] = a[:-1]
    prev[np.arange(a.shape[0]) % W == 0] = 0
    return prev


def _part_sum(a):
    """A GEMM output [M, N], or its K-slice partials [S, M, N] summed in slice order in fp32 (as
    fb_resid_norm / fb_conv_prepare read them)."""
    a = np.asarray(a, np.float32)
    if a.ndim == 2:
        return a
    t = a[0].copy()
    for p in a[1:]:
        t = (t + p).astype(np.float32)
    return t


class NumpyEngine:
    options = DEFAULT_OPTIONS  # the K splits of the GEMM outputs (_split_out reads them from the engine)
    """What each fast/block.cu kernel computes, in NumPy float32."""

    attention_name = "reference attend (float64) rounded to BF16"

    @staticmethod
    def empty(shape, dtype):
        return np.zeros(shape, dtype)

    @staticmethod
    def full(shape, value, dtype):
        return np.full(shape, value, dtype)

    @staticmethod
    def gemv_takes(M, N, K):  # CudaEngine's small-M kernel: none here (every GEMM is ``gemm``)
        return False

    def layer_gemm(self, x_bits, w_bits, out):
        self.gemm(x_bits, w_bits, out)

    def mlp_act(self, x_bits, w_bits, gu, act, M, inter):
        self.layer_gemm(x_bits, w_bits, gu)
        self.silu_mul(gu, M, inter, act)

    @staticmethod
    def gemm(x_bits, w_bits, out):
        # FP32 accumulation of BF16 products: within a few FP32 ulps of the float64 sum. out [S, M, N]:
        # the S K-slice partials (fast_block.split_k), each a float64 sum rounded once
        x, w = from_bits(x_bits).astype(np.float64), from_bits(w_bits).astype(np.float64)
        if out.ndim == 2:
            out[...] = (x @ w.T).astype(np.float32)
            return
        k = x.shape[1] // out.shape[0]
        for s in range(out.shape[0]):
            out[s] = (x[:, s * k: (s + 1) * k] @ w[:, s * k: (s + 1) * k].T).astype(np.float32)

    @staticmethod
    def resid_norm(M, H, W, *, resid_in=None, src_bits=None, tok=None, mask_id=0, branch=None, conv_base=None,
                   fd=None, resid_out=None, resid_bits=None, norm_w=None, eps=0.0, norm_f32=None, norm_hi=None,
                   norm_lo=None, skip_first=False):
        r = np.arange(M)
        i, b = r % W, r // W
        if resid_in is not None:
            x = np.array(resid_in, np.float32)
        else:
            rows = r if tok is None else np.where(i == 0, np.asarray(tok, np.int64)[b], int(mask_id))
            x = from_bits(np.asarray(src_bits).reshape(-1, H)[rows])
        if branch is not None:
            branch = _part_sum(branch)
            if conv_base is not None:
                f = from_bits(fd).reshape(M, 2, H // 16)
                c0 = conv_base[0][None, :] + np.repeat(f[:, 0], 16, axis=1)
                c1 = conv_base[1][None, :] + np.repeat(f[:, 1], 16, axis=1)
                z = rbf(c0 * branch + c1 * _prev_rows(branch, W))
            else:
                z = branch
            x = (x + z).astype(np.float32)
        if resid_out is not None:
            resid_out[...] = x
        if resid_bits is not None:
            resid_bits.reshape(M, H)[...] = to_bits(x)
        if norm_w is None:
            return
        denom = np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps))
        y = (norm_w[None, :] * (x / denom)).astype(np.float32)
        if skip_first:
            y = y[i != 0]  # rows stay in (b, i) order: row b * (W - 1) + i - 1
        hi = to_bits(y)
        if norm_f32 is not None:
            norm_f32.reshape(y.shape)[...] = y
        if norm_hi is not None:
            norm_hi.reshape(y.shape)[...] = hi
        if norm_lo is not None:
            norm_lo.reshape(y.shape)[...] = to_bits(y - from_bits(hi))

    @staticmethod
    def qkv_post(qkv, M, W, hq, hk, d, q_norm, k_norm, freqs, frontier, eps, q, k, v):
        t = qkv.reshape(M, hq + 2 * hk, d)
        pos = np.asarray(frontier, np.int64)[np.arange(M) // W] + np.arange(M) % W
        ang = pos[:, None].astype(np.float64) * np.asarray(freqs)[None, :]
        cos, sin = np.cos(ang).astype(np.float32)[:, None], np.sin(ang).astype(np.float32)[:, None]

        def norm_rope(x, w):
            nx = w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)))
            lo, hi = nx[..., : d // 2], nx[..., d // 2:]
            return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1)

        def put(dst, x):  # one BF16 rounding, stored as bits (fp32 values where a stand-in hands fp32 arrays)
            dst[...] = (to_bits(x) if dst.dtype == np.uint16 else rbf(x)).reshape(dst.shape)

        put(q, norm_rope(t[:, :hq], q_norm))
        put(k, norm_rope(t[:, hq: hq + hk], k_norm))
        put(v, t[:, hq + hk:])

    @staticmethod
    def conv_prepare(x, dl, base0, W, M, H, prepared, fd):
        g = H // 16
        dl = _part_sum(dl)
        delta = dl[:M] + dl[M:]
        c0 = base0[0][None, :] + np.repeat(delta[:, :g], 16, axis=1)
        c1 = base0[1][None, :] + np.repeat(delta[:, g: 2 * g], 16, axis=1)
        prepared[...] = to_bits(c0 * x + c1 * _prev_rows(x, W))
        fd[...] = to_bits(delta[:, 2 * g:])

    @staticmethod
    def silu_mul(gu, M, inter, act):
        g, u = gu[:, :inter], gu[:, inter:]
        act[...] = to_bits(g / (1 + np.exp(-g)) * u)

    @staticmethod
    def attention(q, k, v, kc, vc, frontier, live, window):
        q, k, v = (from_bits(a) if a.dtype == np.uint16 else a for a in (q, k, v))
        out = attend(q, k, v, from_bits(kc), np.asarray(vc).view(np.float16), frontier, live, int(window))
        return to_bits(out)


class NumpyBlock(FastBlockMixin):
    """The fast block's Op methods with NumPy arrays (inputs as the harness gives a NumPy impl)."""

    array_module = "numpy"
    options = DEFAULT_OPTIONS

    def __init__(self):
        self._fb_eng = NumpyEngine()

    def _fb_weight_bits(self, a):
        return bits(a)

    def _fb_weight_f32(self, a):
        return np.asarray(a).astype(np.float32)

    def _fb_cat(self, tag, arrays):
        return np.ascontiguousarray(np.concatenate([bits(a) for a in arrays], axis=-2))

    _fb_bits = staticmethod(bits)

    @staticmethod
    def _fb_f16_bits(a):
        return np.ascontiguousarray(np.asarray(a, np.float16).view(np.uint16))

    @staticmethod
    def _fb_int(a, dtype=None):
        a = np.asarray(a)
        if dtype is None:
            return a if a.dtype in (np.int32, np.int64) else a.astype(np.int64)
        return a.astype(dtype)

    def _fb_freqs(self, d, theta):
        return float(theta) ** (-np.arange(d // 2, dtype=np.float64) * 2.0 / d)


def test_plan_gives_no_fail_over_the_vectors():
    from conformance.compare import Result
    from conformance.runner import run_suite

    results = run_suite(NumpyBlock(), ROOT / "vectors", ops_pattern="masked_block,draft_layer")
    counts = Counter(r.result.name for r in results)
    bad = [r for r in results if r.result in (Result.FAIL, Result.ERROR, Result.NOT_IMPLEMENTED)]
    assert len(results) == 40, counts
    assert not bad, f"{counts}: " + "; ".join(f"{r.op}/{r.case} {r.result.name}: {r.detail}" for r in bad[:10])


def larger_case(variant: str, seed: int = 0):
    """A random masked_block case larger than the vectors (H 256, 8/2 heads of 32, I 768, three
    layers, B 3, K 15), built by the vector generator's own ``make``."""
    from conformance.cases.masked_block import make

    windows = [16, 16, 0] if variant == "dflash" else [16, 16, 16]
    cap = 64 if variant == "dflash" else 16
    return make(f"masked_block/larger_{variant}_{seed}", [], variant=variant, windows=windows, capacity=cap,
                frontier=[61, 37, 2**32 - 5] if variant == "dflash2" else [61, 37, 20], live=[16, 9, 3],
                num_drafts=15, h=256, hq=8, hk=2, d=32, inter=768)


def larger_layer_case(variant: str, seed: int = 0):
    """A random draft_layer case larger than the vectors (H 256, 8/2 heads of 32, I 768, B 2, W 16)."""
    from conformance.cases.draft_layer import make

    return make(f"draft_layer/larger_{variant}_{seed}", [], variant=variant, window=16 if variant == "dflash2" else 0,
                capacity=32, frontier=[45, 2**31 + 7], live=[16, 11], width=16, h=256, hq=8, hk=2, d=32, inter=768)


def error_ratio(case, out_bits, op: str = "masked_block", name: str = "hidden"):
    """(max |out - ref| / (u s), ||out - ref|| / (u ||s||)) over the compared elements: s the suite's
    running error magnitude of the output (reference/scales.py), u = 2^-8 (BF16)."""
    from conformance import registry

    spec = registry.get(op)
    kw = case.kwargs()
    ref = np.asarray(spec.reference(**kw)[name], np.float64)
    s = np.asarray(spec.scales(kw, {name: ref})[name], np.float64)
    out = from_bits(out_bits).astype(np.float64)
    mask = np.broadcast_to(case.masks[name], ref.shape)
    u = 2.0**-8
    err = np.where(mask, np.abs(out - ref), 0.0)
    return float((err / (u * s + 2.0**-126)).max()), float(np.sqrt((err**2).sum() / ((u * s)[mask] ** 2).sum()))


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_plan_larger_random_case_inside_the_derived_bound(variant):
    case = larger_case(variant)
    out = NumpyBlock().masked_block(**{**case.inputs, **case.params})["hidden"]
    comp, norm = error_ratio(case, out)
    # the bound of tests/gpu/test_fast_block.py (derived there)
    assert comp <= 4.0 and norm <= 1.5, (comp, norm)


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_plan_larger_random_layer_inside_the_derived_bound(variant):
    case = larger_layer_case(variant)
    out = NumpyBlock().draft_layer(**{**case.inputs, **case.params})["x_next"]
    comp, norm = error_ratio(case, out, "draft_layer", "x_next")
    assert comp <= 4.0 and norm <= 1.5, (comp, norm)


# The K-split GEMMs (fast_block.split_k): the larger case's o (256 x 256), down (256 x 768) and conv
# delta (64 x 256) weights split into 4, 2 and 4 slices, the consumers (fb_resid_norm's branch,
# fb_conv_prepare's delta) summing the partials.
_SPLITS = (((256, 256), 4), ((256, 768), 2), ((64, 256), 4))


def _split_shapes(monkeypatch):
    """Run with _SPLITS and record the shapes of the split GEMM outputs."""
    monkeypatch.setattr(NumpyEngine, "options", FastOptions(gemm_splits=_SPLITS))
    seen = []
    gemm = NumpyEngine.gemm

    def spy(x_bits, w_bits, out):
        if out.ndim == 3:
            seen.append(tuple(out.shape))
        gemm(x_bits, w_bits, out)

    monkeypatch.setattr(NumpyEngine, "gemm", staticmethod(spy))
    return seen


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_plan_split_gemms_stay_inside_the_derived_bound(monkeypatch, variant):
    seen = _split_shapes(monkeypatch)
    case = larger_case(variant, seed=5)
    out = NumpyBlock().masked_block(**{**case.inputs, **case.params})["hidden"]
    expect = {(4, 48, 256), (2, 48, 256)} | ({(4, 96, 64)} if variant == "dflash2" else set())
    assert set(seen) == expect, seen
    comp, norm = error_ratio(case, out)
    assert comp <= 4.0 and norm <= 1.5, (comp, norm)  # the bound of the test above


def test_plan_split_gemms_a_consumer_reading_one_part_fails(monkeypatch):
    """Negative control: a consumer that reads only the first K slice leaves the bound far behind."""
    _split_shapes(monkeypatch)
    monkeypatch.setattr(sys.modules[__name__], "_part_sum",
                        lambda a: np.asarray(a, np.float32)[0] if np.ndim(a) == 3 else np.asarray(a, np.float32))
    case = larger_case("dflash2", seed=5)
    out = NumpyBlock().masked_block(**{**case.inputs, **case.params})["hidden"]
    comp, norm = error_ratio(case, out)
    assert comp > 4.0 and norm > 1.5, (comp, norm)


def test_split_k_table_and_alignment():
    from kernels_cu.fast import block as fb

    assert fb.split_k(256, 1280, 5120) == 4 and fb.split_k(8, 5120, 17408) == 2
    assert fb.split_k(512, 1280, 5120) == 1  # more rows than measured: one GEMM
    assert fb.split_k(128, 6144, 5120) == 1  # not in the table
    opts = FastOptions(gemm_splits=(((64, 40), 4), ((64, 64), 4)))
    assert fb.split_k(8, 64, 40, opts) == 1  # 40 / 4 = 10 columns: not 16-byte slices
    assert fb.split_k(8, 64, 64, opts) == 4
    assert fb.split_k(8, 64, 64) == 1  # the default options do not split this shape
    assert fb.split_k(300, 64, 64, opts) == 1  # more rows than options.split_max_m


@given(st.integers(1, 16384))
def test_resid_norm_threads_cover_the_row_in_at_most_four_groups(h):
    from kernels_cu.fast.block import resid_norm_threads

    t = resid_norm_threads(h)
    groups = -(-h // 4)
    assert t % 32 == 0 and 32 <= t <= 1024
    assert -(-groups // t) <= 4  # fast/block.cu FB_RN_MAXV4: the registers path holds the row
    assert t < groups + 32 or t == 32  # no whole idle warp beyond the row's groups


# fast_gemv's routing (CudaEngine.gemv_takes / layer_gemm): a shape the engine's small-M GEMM takes gets a whole
# output in the workspace (_split_out) even where options.gemm_splits splits it, and layer_gemm writes it whole. The
# twin engine below takes the o and down shapes of the larger case (which _SPLITS splits) and records what it ran.
class GemvEngine(NumpyEngine):
    def __init__(self, takes):
        self.takes, self.ran = takes, []

    def gemv_takes(self, M, N, K):
        return (N, K) in self.takes

    def layer_gemm(self, x_bits, w_bits, out):
        if out.ndim == 2 and self.gemv_takes(out.shape[0], out.shape[1], x_bits.shape[1]):
            self.ran.append(("whole", tuple(out.shape)))
        self.gemm(x_bits, w_bits, out)

    def mlp_act(self, x_bits, w_bits, gu, act, M, inter):
        # CudaEngine's rule: the fused kernel where the [gate; up] shape is taken (the twin of its bits: the whole
        # GEMM, then SiLU-mul), else layer_gemm and silu_mul
        if self.gemv_takes(M, 2 * inter, x_bits.shape[1]):
            self.ran.append(("act", (M, inter)))
            self.gemm(x_bits, w_bits, gu)
            self.silu_mul(gu, M, inter, act)
            return
        super().mlp_act(x_bits, w_bits, gu, act, M, inter)


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_plan_gemv_routing_whole_outputs_inside_the_derived_bound(monkeypatch, variant):
    seen = _split_shapes(monkeypatch)
    block = NumpyBlock()
    block._fb_eng = GemvEngine(takes={(256, 256), (256, 768)})  # o and down; the conv delta stays split
    case = larger_case(variant, seed=5)
    out = block.masked_block(**{**case.inputs, **case.params})["hidden"]
    # no split partials for the taken shapes, and each of them ran whole, once per layer
    assert set(seen) == ({(4, 96, 64)} if variant == "dflash2" else set()), seen
    layers = np.shape(case.inputs["input_norm"])[0]  # stacked [L, H]
    assert sorted(set(block._fb_eng.ran)) == [("whole", (48, 256))], block._fb_eng.ran
    assert len(block._fb_eng.ran) == 2 * layers
    comp, norm = error_ratio(case, out)
    assert comp <= 4.0 and norm <= 1.5, (comp, norm)  # the bound of the split test above


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_plan_gemv_act_routing(monkeypatch, variant):
    """Where the engine's small-M kernel takes the [gate; up] shape (2I x H), block_forward's MLP goes through
    mlp_act's fused path once per layer, and its gate/up GEMM never through layer_gemm; inside the bound."""
    _split_shapes(monkeypatch)
    block = NumpyBlock()
    block._fb_eng = GemvEngine(takes={(1536, 256)})
    case = larger_case(variant, seed=6)
    out = block.masked_block(**{**case.inputs, **case.params})["hidden"]
    layers = np.shape(case.inputs["input_norm"])[0]
    assert block._fb_eng.ran == [("act", (48, 768))] * layers, block._fb_eng.ran
    comp, norm = error_ratio(case, out)
    assert comp <= 4.0 and norm <= 1.5, (comp, norm)  # the bound of the split test above


def test_block_workspace_cached_per_shape():
    """One workspace per shape, reused while it is among the last few shapes (the options are the backend's, fixed)."""
    from kernels_cu.fast import block as fb

    block = NumpyBlock()
    dm = fb.Dims(1, 8, 256, 4, 2, 64, 768, False)
    first = block._fb_workspace(dm)
    assert block._fb_workspace(dm) is first
    other = block._fb_workspace(fb.Dims(2, 8, 256, 4, 2, 64, 768, False))
    assert other is not first and block._fb_workspace(dm) is first
