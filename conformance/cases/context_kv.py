"""Cases for context_kv: ring chunks shorter than, equal to and longer than C, the frontier crossing
the wrap, positions near 2^31 and across 2^32, paged writes through a permuted page table, V at
the FP16 overflow and subnormal edges, and the two representation pitfalls.

Pitfall designs use a "two-term" projection: W[j, 2j] = 1, W[j, 2j+1] = 2^-8 and c = (BF16(x),
BF16((x - BF16(x)) 2^8)), so W c equals a chosen x to ~16 bits, exactly in FP32 (no baseline error):
- k_bf16_before_norm: x is chosen so that RoPE's x_lo cos - x_hi sin cancels to ~2^-7 of its terms
  wherever both |cos| and |sin| exceed 1/4 (positions near 10^6 and 2^32 rotate every frequency pair
  of D = 16 at theta 1e7); BF16(k_raw) moves each term by up to 2^-9: tens of BF16 ULPs of the result.
- v_fp16_without_bf16: x = BF16 value + 2 or 3 FP16 ULPs, all FP16-exact: FP16(x) keeps the
  offset, FP16(BF16(x)) drops it (2-3 FP16 ULPs against a baseline error of 0).
"""

from __future__ import annotations

import numpy as np

from conformance.registry import BF16_CHAIN, EXACT, REPRESENTED, Case, OpSpec, Output, case_rng, register
from reference import numerics, scales
from reference.context_kv import context_kv, live_mask
from reference.norms import rope_angles

GARBAGE = 1000.0
EPS, THETA = 1e-6, 1e7


def two_term(x) -> tuple[np.ndarray, np.ndarray]:
    """(c [T, 2n], W [n, 2n]) in float64 holding BF16 values with W c ~= x [T, n]."""
    hi = numerics.to_bf16(x)
    lo = numerics.to_bf16((x - hi) * 256.0)
    t, n = x.shape
    c = np.empty((t, 2 * n))
    c[:, 0::2], c[:, 1::2] = hi, lo
    w = np.zeros((n, 2 * n))
    w[np.arange(n), 2 * np.arange(n)] = 1.0
    w[np.arange(n), 2 * np.arange(n) + 1] = 2.0**-8
    return c, w


def cancelling_k(rng, positions, hk: int, d: int, k_norm) -> np.ndarray:
    """k_raw [T, Hk*D] whose normalized, rotated low half is ~2^-7 of its terms where cos a is not small."""
    ang = rope_angles(positions, d, THETA)[:, None, :]  # [T, 1, D/2]
    half = d // 2
    u_hi = rng.uniform(0.5, 1.5, (len(positions), hk, half)) * rng.choice([-1.0, 1.0], (len(positions), hk, half))
    delta = rng.uniform(2.0**-8, 2.0**-6, u_hi.shape) * rng.choice([-1.0, 1.0], u_hi.shape)
    cos, sin = np.cos(ang), np.sin(ang)
    usable = (np.abs(cos) > 0.25) & (np.abs(sin) > 0.25)  # both terms O(1): a slow pair cannot cancel
    u_lo = np.where(usable, (u_hi * sin + delta) / np.where(usable, cos, 1.0), rng.uniform(0.5, 1.5, u_hi.shape))
    u = np.concatenate([u_lo, u_hi], axis=-1)
    return (u / k_norm).reshape(len(positions), hk * d)  # the head norm multiplies k_norm back in


def offset_v(rng, rows: int, n: int) -> np.ndarray:
    """FP16-exact values 2 or 3 FP16 ULPs from a BF16 value (never a BF16 rounding tie)."""
    e = rng.integers(-6, 8, (rows, n)).astype(np.float64)
    m = np.ldexp(1.0 + rng.integers(0, 128, (rows, n)) / 128.0, e.astype(int))
    k = rng.choice([-3.0, -2.0, 2.0, 3.0], (rows, n))
    return rng.choice([-1.0, 1.0], (rows, n)) * (m + k * 2.0 ** (e - 10))


def edge_v(rng, rows: int, n: int, edge: str) -> np.ndarray:
    if edge == "fp16_overflow":
        # 65400 -> BF16 65280 (finite); 65450 -> BF16 65536 -> inf (FP16 alone would give 65440)
        pool = np.array([65280.0, 65400.0, 65450.0, 65530.0, 70000.0, 2.0e5, 40000.0, 1.5])
    else:
        # FP16 subnormals (quantum 2^-24) down to values that round to 0
        pool = np.array([2.0**-15 * 1.37, 2.0**-18 * 1.9, 2.0**-20 * 1.23, 2.0**-23 * 1.5, 2.0**-26, 6.1e-5, 1.0])
    return rng.choice(pool, (rows, n)) * rng.choice([-1.0, 1.0], (rows, n))


def _old_cache(rng, shape, live) -> tuple[np.ndarray, np.ndarray]:
    """Previously stored K/V at the slots that stay live; large garbage elsewhere."""
    k = np.where(live, rng.standard_normal(shape), GARBAGE * rng.standard_normal(shape))
    v = np.where(live, rng.standard_normal(shape), GARBAGE * rng.standard_normal(shape))
    return numerics.storage(k, "bf16"), numerics.storage(numerics.to_bf16(v), "fp16")


def make(cid, flags, *, start, rows, capacity=8, hk=1, d=16, h=64, design="random", theta=THETA,
         page_size=None, pages=None) -> Case:
    rng = case_rng(cid)
    n = hk * d
    positions = start + np.arange(rows, dtype=np.int64)
    k_norm = numerics.to_bf16(rng.uniform(0.5, 1.5, d))
    if design == "random":
        c = rng.standard_normal((rows, h))
        wk, wv = (rng.standard_normal((n, h)) / np.sqrt(h) for _ in range(2))
    elif design == "k_cancel":
        c, wk = two_term(cancelling_k(rng, positions, hk, d, k_norm))
        c = np.concatenate([c, rng.standard_normal((rows, h - 2 * n))], axis=1)
        wk = np.concatenate([wk, np.zeros((n, h - 2 * n))], axis=1)
        wv = rng.standard_normal((n, h)) / np.sqrt(h)
    else:
        target = offset_v(rng, rows, n) if design == "v_offset" else edge_v(rng, rows, n, design)
        c, wv = two_term(target)
        c = np.concatenate([rng.standard_normal((rows, h - 2 * n)), c], axis=1)
        wv = np.concatenate([np.zeros((n, h - 2 * n)), wv], axis=1)
        wk = rng.standard_normal((n, h)) / np.sqrt(h)
    params = {"start": int(start), "eps": EPS, "theta": float(theta), "head_dim": d}
    inputs = {"context": numerics.storage(c, "bf16"), "wk": numerics.storage(wk, "bf16"),
              "wv": numerics.storage(wv, "bf16"), "k_norm": numerics.storage(k_norm, "bf16")}
    if page_size is None:
        shape = (capacity, hk, d)
        params["storage"] = "ring"
        old_live = live_mask(start, shape, "ring")
        new_live = live_mask(start + rows, shape, "ring")
    else:
        shape = (pages, page_size, hk, d)
        logical = -(-(start + rows) // page_size)
        table = rng.permutation(pages)[:logical].astype(np.int32)
        params.update(storage="paged", page_size=int(page_size))
        inputs["page_table"] = table
        old_live = live_mask(start, shape, "paged", table, page_size)
        new_live = live_mask(start + rows, shape, "paged", table, page_size)
    inputs["k_cache"], inputs["v_cache"] = _old_cache(rng, shape, old_live)
    if page_size is None and "ring_wrap" in flags:
        # ring_wrap names a chunk whose stored rows cross the ring's end (a write without mod C differs)
        slots = positions[max(0, rows - capacity):] % capacity
        if not np.any(np.diff(slots) < 0):
            flags = [f for f in flags if f != "ring_wrap"]
    return Case(id=cid, inputs=inputs, params=params, flags=tuple(flags),
                masks={"k_cache": new_live, "v_cache": new_live})


def generate() -> list[Case]:
    p31, p32 = 2**31 - 3, 2**32 - 2
    return [
        make("context_kv/ring_C8_T1_start0", [], start=0, rows=1),
        make("context_kv/ring_C8_T3_start0_shorter", [], start=0, rows=3),
        make("context_kv/ring_C8_T5_start2_shorter", [], start=2, rows=5),
        make("context_kv/ring_C8_T8_start5_equal", ["ring_wrap"], start=5, rows=8),
        # RoPE layout: split halves (i, i + D/2), never GPT-J's interleaved pairs; angles from exact positions
        make("context_kv/rope_interleaved__ring_C8_Hk2_D32_H128_T6_start300", ["rope_interleaved", "ring_wrap"],
             start=300, rows=6, hk=2, d=32, h=128),
        make("context_kv/rope_bf16_table__ring_C8_T6_start1001", ["rope_bf16_table"], start=1001, rows=6),
        make("context_kv/ring_C8_T13_start6_longer", ["chunk_longer_than_S", "ring_wrap"], start=6, rows=13),
        make("context_kv/ring_C16_T40_start3_longer", ["chunk_longer_than_S", "ring_wrap"], start=3, rows=40,
             capacity=16),
        make("context_kv/ring_C16_T6_start13_frontier_wraps", ["ring_wrap"], start=13, rows=6, capacity=16),
        make("context_kv/ring_slot__ring_C8_T3_start21", ["ring_slot", "ring_wrap"], start=21, rows=3),
        # a capacity that is not a power of two: slot = p mod C, never p & (C - 1)
        make("context_kv/ring_slot__ring_C6_T4_start17", ["ring_slot", "ring_wrap"], start=17, rows=4, capacity=6),
        make("context_kv/ring_C12_T20_start40_chunk_longer", ["ring_wrap", "chunk_longer_than_S"], start=40,
             rows=20, capacity=12),
        make("context_kv/ring_C8_Hk2_D32_H128_T7_start30", ["ring_wrap"], start=30, rows=7, hk=2, d=32, h=128),
        make("context_kv/ring_C4_D64_theta1e4_T5_start9", ["ring_wrap", "chunk_longer_than_S"], start=9, rows=5,
             capacity=4, d=64, h=96, theta=1e4),
        make("context_kv/positions_2p31__ring_C8_T6_start2147483645", ["positions_2p31", "ring_wrap"],
             start=p31, rows=6),
        make("context_kv/positions_2p32__ring_C8_T5_start4294967294", ["positions_2p32", "ring_wrap"],
             start=p32, rows=5),
        make("context_kv/positions_2p32__ring_C8_T12_start4294967290_longer",
             ["positions_2p32", "chunk_longer_than_S", "ring_wrap"], start=2**32 - 6, rows=12),
        make("context_kv/fp16_overflow__ring_C8_T4_start2", ["fp16_overflow"], start=2, rows=4,
             design="fp16_overflow"),
        make("context_kv/fp16_subnormal__ring_C8_T4_start9", ["fp16_subnormal", "ring_wrap"], start=9, rows=4,
             design="fp16_subnormal"),
        make("context_kv/k_bf16_before_norm__ring_C16_T6_start1000003", ["k_bf16_before_norm", "ring_wrap"],
             start=1_000_003, rows=6, capacity=16, design="k_cancel"),
        make("context_kv/k_bf16_before_norm__ring_C8_Hk2_T5_start4294967294",
             ["k_bf16_before_norm", "positions_2p32"], start=p32, rows=5, hk=2, h=128, design="k_cancel"),
        make("context_kv/v_fp16_without_bf16__ring_C16_T6_start7", ["v_fp16_without_bf16"], start=7, rows=6,
             capacity=16, design="v_offset"),
        make("context_kv/v_fp16_without_bf16__paged_ps4_T5_start3", ["v_fp16_without_bf16"], start=3, rows=5,
             page_size=4, pages=4, design="v_offset"),
        make("context_kv/paged_ps4_T7_start0", [], start=0, rows=7, page_size=4, pages=3),
        make("context_kv/paged_ps4_T9_start5_crosses_pages", [], start=5, rows=9, page_size=4, pages=6),
        make("context_kv/paged_ps8_T3_start13_in_one_page", [], start=13, rows=3, page_size=8, pages=4),
        make("context_kv/paged_ps16_T20_start30_Hk2", [], start=30, rows=20, page_size=16, pages=5, hk=2, h=96),
        make("context_kv/fp16_overflow__paged_ps4_T6_start2", ["fp16_overflow"], start=2, rows=6, page_size=4,
             pages=3, design="fp16_overflow"),
    ]


SPEC = register(
    OpSpec(
        name="context_kv",
        reference=context_kv,
        inputs=("context", "k_cache", "v_cache", "wk", "wv", "k_norm", "page_table"),
        params=("start", "eps", "theta", "head_dim", "storage", "page_size"),
        outputs=(Output("k_cache", REPRESENTED, "bf16"), Output("v_cache", REPRESENTED, "fp16", values="bf16"),
                 Output("frontier", EXACT)),
        generate=generate,
        envelope={"k_cache": BF16_CHAIN, "v_cache": BF16_CHAIN},
        scales=scales.context_kv,
        bf16_intermediates=frozenset(),
        doc="context K/V: BF16 K after head norm + RoPE, FP16_RNE(BF16(v)) V, ring (slot p mod C) or paged write",
    )
)
