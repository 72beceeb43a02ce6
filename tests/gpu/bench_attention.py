"""Timings of the attention-path Ops at the official geometries (spec table), plus one full-geometry
accuracy check of draft_attention and draft_layer against the float64 reference with the C2 bound.

Not a test (pytest does not collect it): ``python3 -m tests.gpu.bench_attention [out.json]`` from the
repository root on a GPU machine. Times are CUDA-event means over repeated calls of the backend methods (inputs
already on the device), so they include the per-call BF16 -> FP32 weight expansion.
"""

from __future__ import annotations

import json
import sys

import ml_dtypes
import numpy as np

from kernels_cu.exact import attention as ops
from kernels_cu.exact.backend import CudaBackend
from reference import numerics, precision
from reference.draft_attention import draft_attention as ref_attention
from reference.draft_layer import BF16_INTERMEDIATES as LAYER_BF16
from reference.draft_layer import draft_layer as ref_layer

GEOMETRY = {  # spec table: hidden, layers, intermediate, heads, window
    "dflash_35b": {"h": 2048, "layers": 6, "inter": 6144, "hq": 32, "hk": 8, "d": 128, "s": 4096},
    "dflash2_27b": {"h": 5120, "layers": 5, "inter": 17408, "hq": 32, "hk": 8, "d": 128, "s": 2048},
}


def bf16(rng, shape, scale=1.0):
    # BF16-valued inputs are all that is needed here; float32 -> BF16 is one RNE step (fast at 10^8)
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(ml_dtypes.bfloat16)


def timed(cp, fn, *args, reps=10, **kwargs):
    fn(*args, **kwargs)
    cp.cuda.Device().synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn(*args, **kwargs)
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / reps  # ms


def dev(cp, kw):
    return {
        k: cp.asarray(v.view(np.uint16))
        if isinstance(v, np.ndarray) and v.dtype == ml_dtypes.bfloat16
        else cp.asarray(v)
        if isinstance(v, np.ndarray)
        else v
        for k, v in kw.items()
    }


def layer_weights(rng, g, variant, lead=()):
    h, hq, hk, d, i = g["h"], g["hq"], g["hk"], g["d"], g["inter"]
    w = {
        "input_norm": numerics.storage(rng.uniform(0.5, 1.5, lead + (h,)), "bf16"),
        "post_norm": numerics.storage(rng.uniform(0.5, 1.5, lead + (h,)), "bf16"),
        "q_norm": numerics.storage(rng.uniform(0.5, 1.5, lead + (d,)), "bf16"),
        "k_norm": numerics.storage(rng.uniform(0.5, 1.5, lead + (d,)), "bf16"),
        "wq": bf16(rng, lead + (hq * d, h), h**-0.5),
        "wk": bf16(rng, lead + (hk * d, h), h**-0.5),
        "wv": bf16(rng, lead + (hk * d, h), h**-0.5),
        "wo": bf16(rng, lead + (h, hq * d), (hq * d) ** -0.5),
        "w_gate": bf16(rng, lead + (i, h), h**-0.5),
        "w_up": bf16(rng, lead + (i, h), h**-0.5),
        "w_down": bf16(rng, lead + (h, i), i**-0.5),
    }
    if variant == "dflash2":
        for side in ("attn", "mlp"):
            base = np.concatenate(
                [1 + 0.25 * rng.standard_normal(lead + (2, 1, h)), 0.25 * rng.standard_normal(lead + (2, 1, h))],
                axis=-2,
            )
            w[f"{side}_conv_base"] = numerics.storage(base, "bf16")
            w[f"{side}_conv_proj"] = bf16(rng, lead + (4 * h // 16, h), 0.2 * h**-0.5)
    return w


def bound_check(name, ref_fn, kwargs, out, inter, mask):
    ref = ref_fn(**kwargs)[name]
    with precision.baseline(inter):
        base = ref_fn(**kwargs)[name]
    x = np.asarray(out.get().view(ml_dtypes.bfloat16), np.float64)
    bu = float(numerics.ulp_error(base, ref, "bf16")[mask].max())
    bn = numerics.normwise_error(np.asarray(base, np.float64)[mask], ref[mask])
    u = float(numerics.ulp_error(x, ref, "bf16")[mask].max())
    n = numerics.normwise_error(x[mask], ref[mask])
    return {
        "ulp": u,
        "bound_ulp": 2 * bu + 1,
        "norm": n,
        "bound_norm": 2 * bn + 2.0**-8,
        "pass": bool(u <= 2 * bu + 1 and n <= 2 * bn + 2.0**-8),
    }


def bench_geometry(cp, be, rng, gname, g, res, b=8, w=16):
    hq, hk, d, s, h = g["hq"], g["hk"], g["d"], g["s"], g["h"]
    variant = "dflash2" if gname.startswith("dflash2") else "dflash"
    f = 3 * s + 5  # a full ring, wrapped
    att = {
        "q": bf16(rng, (b, w, hq, d), 1.5),
        "k": bf16(rng, (b, w, hk, d)),
        "v": numerics.storage(np.exp(0.5 * rng.standard_normal((b, w, hk, d))), "bf16"),
        "k_cache": bf16(rng, (b, s, hk, d)),
        "v_cache": numerics.storage(numerics.context_v(np.exp(0.5 * rng.standard_normal((b, s, hk, d)))), "fp16"),
        "frontier": np.full(b, f, np.int64),
        "live": np.full(b, w, np.int32),
        "window": s,
    }
    da = dev(cp, att)
    q, k, v = ops.f32(da["q"]), ops.f32(da["k"]), ops.f32(da["v"])
    vc = ops.f16_bits(da["v_cache"])
    kv_bytes = b * s * hk * d * 4  # BF16 K + FP16 V
    for kernel in ("draft_attention_fwd", "draft_attention_gqa"):
        t = timed(cp, ops.attention, q, k, v, da["k_cache"], vc, da["frontier"], da["live"], s, kernel=kernel)
        res["timings_ms"][f"{gname}/{kernel}_B{b}_W{w}_S{s}"] = {
            "ms": t,
            "kv_cache_GBps_if_read_once": kv_bytes / t / 1e6,
        }
    out = be.draft_attention(**da)["out"]
    one = {k2: (v2[:1] if isinstance(v2, np.ndarray) else v2) for k2, v2 in att.items()}
    res["full_geometry_checks"][f"{gname}/draft_attention_row0"] = bound_check(
        "out", ref_attention, one, out[:1], frozenset({"probs"}), np.ones((1, w, hq, d), bool)
    )

    lay = {
        **{n: att[n] for n in ("k_cache", "v_cache", "frontier", "live")},
        "x": bf16(rng, (b, w, h)),
        "eps": 1e-6,
        "theta": 1e7,
        "head_dim": d,
        "window": s,
        "variant": variant,
        **layer_weights(rng, g, variant),
    }
    dl = dev(cp, lay)
    res["timings_ms"][f"{gname}/draft_layer_B{b}_W{w}"] = {"ms": timed(cp, be.draft_layer, reps=5, **dl)}
    out = be.draft_layer(**dl)["x_next"]
    rows = ("x", "k_cache", "v_cache", "frontier", "live")
    one = {k2: (v2[:1] if k2 in rows else v2) for k2, v2 in lay.items()}
    res["full_geometry_checks"][f"{gname}/draft_layer_row0"] = bound_check(
        "x_next", ref_layer, one, out[:1], LAYER_BF16, np.ones((1, w, h), bool)
    )

    t_rows = 2048
    ckv = dev(
        cp,
        {
            "context": bf16(rng, (t_rows, h)),
            "k_cache": bf16(rng, (s, hk, d)),
            "v_cache": numerics.storage(rng.standard_normal((s, hk, d)), "fp16"),
            "wk": bf16(rng, (hk * d, h), h**-0.5),
            "wv": bf16(rng, (hk * d, h), h**-0.5),
            "k_norm": numerics.storage(rng.uniform(0.5, 1.5, d), "bf16"),
        },
    )
    res["timings_ms"][f"{gname}/context_kv_T{t_rows}"] = {
        "ms": timed(cp, be.context_kv, **ckv, start=f, eps=1e-6, theta=1e7, head_dim=d, storage="ring")
    }
    conv = dev(
        cp,
        {
            "x": bf16(rng, (b, w, h)),
            "z": bf16(rng, (b, w, h)),
            "base": bf16(rng, (2, 2, h), 0.5),
            "proj": bf16(rng, (4 * h // 16, h), h**-0.5),
        },
    )
    res["timings_ms"][f"{gname}/grouped_conv_B{b}_W{w}"] = {"ms": timed(cp, be.grouped_conv, **conv)}

    vocab = 151936
    head = ops.round_bf16(cp.random.standard_normal((vocab, h), dtype=cp.float32) * np.float32(h**-0.5))
    hidden = cp.asarray(bf16(rng, (b, w - 1, h)).view(np.uint16))
    res["timings_ms"][f"{gname}/proposal_head_vocab{vocab}_B{b}_K{w - 1}"] = {
        "ms": timed(cp, be.proposal_head, reps=5, hidden=hidden, head=head, vocab_size=vocab - 7)
    }


def main(out_path=None):
    import cupy as cp

    be = CudaBackend()
    rng = np.random.default_rng(0)
    res = {"environment": be.environment(), "timings_ms": {}, "full_geometry_checks": {}}
    for gname, g in GEOMETRY.items():
        bench_geometry(cp, be, rng, gname, g, res)
        cp.get_default_memory_pool().free_all_blocks()
    print(json.dumps(res, indent=1, default=str))
    if out_path:
        with open(out_path, "w") as fh:
            json.dump(res, fh, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
