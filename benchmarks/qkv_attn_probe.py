"""The attention with q / k normalized in it (fast_attention.attention_qkv) against fb_qkv_post + attention_fast,
alone, at the round's shapes (H200 probe, issue 12 session v21).

For 35B B8 W16 (the wgmma form) and B1 W8 (mma.sync), F 4096, random inputs: microseconds a call (CUDA events,
L2 flushed, median of --reps) of
  two      fb_qkv_post then attention_fast (BF16 bits), and attention_fast alone (attn);
  fused    attention_qkv (its RoPE table made before the timing);
plus each main kernel's registers, dynamic shared memory, blocks a multiprocessor (the driver's occupancy
calculator) and split count. --extra adds NVRTC options to the fused build (e.g. -DFA_QKV_PROBE=1: the q / k rows
rounded without the norm and RoPE, wrong bits, to time the rest).

    python -m benchmarks.qkv_attn_probe [--reps 25] [--extra -DFA_QKV_PROBE=1]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np


def _time(cp, fn, reps: int, flush) -> float:
    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    ts = []
    for i in range(reps):
        flush.fill(float(i))
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--extra", default="", help="NVRTC options added to the fused build (space-separated)")
    args = ap.parse_args(argv)
    import cupy as cp

    from kernels_cu import fast_attention as fa
    from kernels_cu.fast_block import CudaEngine

    flush = cp.empty(64 << 20, dtype=cp.float32)
    rng = np.random.default_rng(0)
    hq, hk, d, cap = 32, 8, 128, 4096
    for b, w in ((8, 16), (1, 8)):
        qkv = cp.asarray(rng.standard_normal((b, w, hq + 2 * hk, d)).astype(np.float32))
        qn = cp.asarray((0.5 + rng.random(d)).astype(np.float32))
        kn = cp.asarray((0.5 + rng.random(d)).astype(np.float32))
        kc = cp.asarray(rng.standard_normal((b, cap, hk, d)).astype(np.float32)).view(np.uint32) >> 16
        kc = kc.astype(np.uint16)
        vc = cp.asarray(rng.standard_normal((b, cap, hk, d)).astype(np.float16).view(np.uint16))
        frontier = cp.full((b,), 4096, np.int64)
        live = cp.full((b,), w, np.int32)
        inv = cp.asarray(1.0 / (1e7 ** (np.arange(0, d, 2, dtype=np.float64) / d)))
        rope = cp.empty((b * w, d), np.float32)
        CudaEngine.rope_table(frontier, inv, b * w, w, d, rope)
        q = cp.empty((b, w, hq, d), np.uint16)
        k = cp.empty((b, w, hk, d), np.uint16)
        v = cp.empty((b, w, hk, d), np.uint16)
        shape = (fa.qkv_chunks(w, hq, hk), b, w, hk, d)
        kw, vw = cp.zeros(shape, np.uint16), cp.zeros(shape, np.uint16)

        def post():
            CudaEngine.qkv_post(qkv.reshape(b * w, -1), b * w, w, hq, hk, d, qn, kn, inv, frontier, 1e-6, q, k, v)

        def attn():
            fa.attention_fast(q, k, v, kc, vc, frontier, live, 0, f32_out=False, bf16_out=True)

        def fused():
            fa.attention_qkv(qkv, qn, kn, rope, 1e-6, kw, vw, kc, vc, frontier, live, 0, hq=hq, hk=hk)

        post()
        t_two = _time(cp, lambda: (post(), attn()), args.reps, flush)
        t_attn = _time(cp, attn, args.reps, flush)
        extra = tuple(x for x in args.extra.split() if x)
        saved = fa.EXTRA_OPTIONS
        fa.EXTRA_OPTIONS = (*saved, *extra)
        t_fused = _time(cp, fused, args.reps, flush)
        path = fa.last_path()
        fa.EXTRA_OPTIONS = saved
        m_rows = w * hq // hk
        mt = fa._mt(min(m_rows, 64))
        for name, qk in (("attn", False), ("fused", True)):
            wg = fa.wg_for(128, d, mt, True, False)
            opts = (*fa.EXTRA_OPTIONS, *(extra if qk else ()))
            main_k, _, smem = fa._kernels_opts(128, mt, False, opts, 2, False, wg, qk)
            try:
                occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(main_k.kernel.ptr, 128, smem)
            except Exception as exc:  # noqa: BLE001
                occ = f"? ({exc})"
            ns = fa.splits_for(b, hk, -(-m_rows // 64), cap, 0, fa.resident_blocks(128, mt, False, 2, False, wg, qk))
            print(f"B{b} W{w} {name:>5}: regs {main_k.attributes['num_regs']}, smem {smem}, blocks/SM {occ}, "
                  f"splits {ns}", flush=True)
        print(f"B{b} W{w}: two kernels {t_two:.1f} us (attention alone {t_attn:.1f}); fused {t_fused:.1f} us "
              f"({path}); extra {args.extra or '-'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
