"""Time fb_resid_norm (kernels_cu/fast_block.cu) the way the round calls it, per path and per
source mode, at the round's row counts (H200 probe, issue 12). Each configuration is one CUDA graph
of ``--calls`` launches, replayed; microseconds per call (CUDA events, median of the replays).

    python -m benchmarks.glue_probe [--only M,H,mode,path]   (the latter runs one configuration
                                                               once, e.g. under ncu)
    python -m benchmarks.glue_probe --cold                     (the block path at 128 rows, inputs
        rotated over > 128 MB so they come from DRAM as in the round; branch as 1 or 2 K-slice
        partials; block sizes swept through fast_block.RESID_NORM_THREADS; fb_conv_prepare with the
        delta whole or in 4 partials)
modes: conv (resid_in + branch + conv finish, DFlash2's post-attention update), branch (resid_in +
branch, DFlash's), embed (BF16 source rows, the first norm). Outputs as block_forward's.
"""

from __future__ import annotations

import argparse

CASES = [(8, 5120), (128, 5120), (8, 2048), (128, 2048)]
MODES = ("conv", "branch")
PATHS = ("block", "cluster", "strided")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--only", default=None)
    ap.add_argument("--cold", action="store_true")
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np

    from benchmarks.graph_timer import graph_us
    from kernels_cu import fast_block as fb

    eng = fb.CudaEngine(attention=(None, "none"))
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)

    def arrays(M, H, mode, parts=1):
        f = lambda *s: cp.asarray(rng.standard_normal(s).astype(np.float32))
        G = H // 16
        a = {"resid_in": f(M, H), "branch": f(M, H) if parts == 1 else f(parts, M, H), "resid_out": None,
             "norm_w": f(H)}
        a["resid_out"] = a["resid_in"]
        if mode == "conv":
            a["conv_base"] = f(2, H)
            a["fd"] = cp.asarray(rng.integers(0, 1 << 14, (M, 2 * G)).astype(np.uint16))
            a["norm_f32"] = f(M, H)
            nb = cp.empty((2 * M, H), np.uint16)
            a["norm_hi"], a["norm_lo"] = nb[:M], nb[M:]
        else:
            a["norm_hi"] = cp.empty((M, H), np.uint16)
        return a

    def launch(M, H, W, a):
        eng.resid_norm(M, H, W, eps=1e-6, **a)

    def timed(M, H, mode, path):
        fb.RESID_NORM_PATH = path
        a = arrays(M, H, mode)
        W = 8 if M == 8 else 16
        us = graph_us(cp, stream, lambda _j: launch(M, H, W, a), calls=args.calls, replays=args.replays)
        fb.RESID_NORM_PATH = "auto"
        return us

    def cold(launch_j, n_sets):
        return graph_us(cp, stream, launch_j, calls=args.calls, replays=args.replays, sets=n_sets)

    if args.cold:
        M, W = 128, 16
        args.calls = max(args.calls, 16)  # every one of the 16 input sets at least once
        print(f"{'H':>5} {'mode':>7} {'parts':>5} " + " ".join(f"{'T' + str(t):>7}" for t in (320, 448, 640, 1024))
              + "   fb_resid_norm us per call, inputs from DRAM")
        for H in (5120, 2048):
            for mode, parts in (("conv", 1), ("conv", 2), ("branch", 1), ("branch", 2)):
                sets = [arrays(M, H, mode, parts) for _ in range(16)]
                row = []
                for t in (320, 448, 640, 1024):
                    if -(-H // 4 // t) > 4:
                        row.append(float("nan"))
                        continue
                    fb.RESID_NORM_THREADS = t
                    fb.RESID_NORM_PATH = "block"
                    row.append(cold(lambda j, H=H, sets=sets: launch(M, H, W, sets[j]), 16))
                fb.RESID_NORM_THREADS, fb.RESID_NORM_PATH = None, "auto"
                print(f"{H:5d} {mode:>7} {parts:5d} " + " ".join(f"{v:7.2f}" for v in row), flush=True)
                del sets
        H = 5120
        for dparts in (1, 4):
            ins = [(cp.asarray(rng.standard_normal((M, H)).astype(np.float32)),
                    cp.asarray(rng.standard_normal((dparts, 2 * M, H // 4) if dparts > 1 else (2 * M, H // 4))
                               .astype(np.float32)),
                    cp.asarray(rng.standard_normal((2, H)).astype(np.float32)),
                    cp.empty((M, H), np.uint16), cp.empty((M, H // 8), np.uint16)) for _ in range(16)]
            us = cold(lambda j, ins=ins: eng.conv_prepare(*ins[j][:3], W, M, H, *ins[j][3:]), 16)
            print(f"fb_conv_prepare 128 x 5120, delta in {dparts} part(s): {us:.2f} us per call, inputs from DRAM")
        return 0
    if args.only:
        m, h, mode, path = args.only.split(",")
        fb.RESID_NORM_PATH = path
        a = arrays(int(m), int(h), mode)
        for _ in range(3):
            launch(int(m), int(h), 16, a)
        cp.cuda.Device().synchronize()
        return 0
    print(f"{'M':>4} {'H':>5} {'mode':>7} " + " ".join(f"{p:>8}" for p in PATHS) + "   us per call (graph)")
    for M, H in CASES:
        for mode in MODES:
            print(f"{M:4d} {H:5d} {mode:>7} " + " ".join(f"{timed(M, H, mode, p):8.2f}" for p in PATHS), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
