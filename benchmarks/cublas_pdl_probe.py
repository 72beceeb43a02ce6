"""Does a cuBLAS GEMM wait for the kernel ahead when its graph edge lets it start early? (H200, issue 12 v21)

The block's cuBLAS GEMMs start only once the glue kernel ahead has exited: cuBLAS launches them the ordinary
way, and kernels_cu/pdl.end_capture relaxes only the edges into our own kernels. If cuBLAS's kernels call
``griddepcontrol.wait`` (as CUTLASS kernels built with GDC do), an edge into them may be made programmatic and
they would start while the glue kernel still runs, waiting for its completion before they read.

The probe, per GEMM shape (the 35B and 27B B8 W16 layer GEMMs, whole and split over K as the block runs them):
- capture [a kernel that triggers its dependents at once, spins SPIN_NS, then writes x] -> [the GEMM on x];
- rewrite that edge to ``programmatic`` (from the programmatic port, or the launch-order port);
- x holds other values before the fill: the GEMM's output equals the GEMM of the filled x only if the GEMM
  waited for the fill (or the driver kept the edge a full dependency);
- the control: the same graph with a probe kernel of ours that reads x without waiting must see the old x,
  which shows that the rewritten edge really lets the consumer start early.

    python -m benchmarks.cublas_pdl_probe
Prints a line a case: shape, port, "waits" / "READ EARLY" for the GEMM and the control's verdict.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

_SRC = r"""
extern "C" __global__ void trigger_spin_fill(unsigned short* dst, long long n, unsigned short value,
                                          long long spin_ns) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < spin_ns);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = value;
}
extern "C" __global__ void read_now(const unsigned short* x, float* y) {  // no wait: the control
    if (threadIdx.x == 0 && blockIdx.x == 0) y[0] = (float)x[0];
}
"""
SPIN_NS = 5_000_000
ONE, TWO = 0x3F80, 0x4000  # BF16 1.0 and 2.0


def _rewrite(graph, from_port: int) -> int:
    """Every edge of the graph between two kernel nodes becomes programmatic from ``from_port``; returns how many."""
    from kernels_cu import pdl

    edges = frm, to, _ = pdl.graph_edges(graph)
    sel = [i for i in range(len(frm)) if pdl._kernel_of(to[i]) and pdl._kernel_of(frm[i])]
    return pdl.make_programmatic(graph, edges, sel, from_port)


def _run(cp, fill, consumer, x, from_port: int | None):
    """Capture fill -> consumer, rewrite the edge (None: as captured), launch once; returns the edge count."""
    from kernels_cu import pdl

    s = cp.cuda.get_current_stream()
    x.fill(ONE)
    s.synchronize()
    s.begin_capture()
    fill((2,), (128,), (x, np.int64(x.size), np.uint16(TWO), np.int64(SPIN_NS)))
    consumer()
    g = ctypes.c_void_p()
    api = pdl._graph_api()
    pdl._check(api["cuStreamEndCapture"](ctypes.c_void_p(s.ptr), ctypes.byref(g)), "cuStreamEndCapture")
    m = _rewrite(g, from_port) if from_port is not None else 0
    ge = ctypes.c_void_p()
    pdl._check(api["cuGraphInstantiateWithFlags"](ctypes.byref(ge), g, 0), "cuGraphInstantiate")
    cg = pdl.CapturedGraph(int(g.value), int(ge.value), m)
    cg.launch(s)
    s.synchronize()
    return m


def main(argv=None) -> int:
    import cupy as cp

    from kernels_cu import pdl
    from kernels_cu.fast_block import CaptureGemm

    mod = cp.RawModule(code=_SRC, options=("-std=c++17",))
    fill, read_now = mod.get_function("trigger_spin_fill"), mod.get_function("read_now")
    shapes = [(128, 6144, 2048, 1), (128, 2048, 4096, 4), (128, 12288, 2048, 1), (128, 2048, 6144, 4),
              (128, 12288, 5120, 1), (128, 5120, 17408, 2), (8, 6144, 2048, 1)]
    gemm = CaptureGemm()
    bad = 0
    with cp.cuda.Stream(non_blocking=True):
        for M, N, K, S in shapes:
            x = cp.empty((M, K), np.uint16)
            w = cp.full((N, K), ONE, np.uint16)
            out = cp.empty((S, M, N) if S > 1 else (M, N), np.float32)
            gemm(x, w, out)  # eager warm-up (cuBLAS picks and loads its kernel)
            cp.cuda.get_current_stream().synchronize()
            want = 2.0 * (K // S)  # every output element: the filled x (2.0) times w (1.0) over K / S
            for port, pname in ((None, "as captured"), (pdl._PORT_PROGRAMMATIC, "programmatic"),
                                (pdl._PORT_LAUNCH_ORDER, "launch order")):
                out.fill(-1)
                try:
                    m = _run(cp, fill, lambda: gemm(x, w, out), x, port)
                except Exception as exc:  # noqa: BLE001 - the driver may refuse the edge: say so
                    print(f"M{M} N{N} K{K} S{S} {pname:>13}: refused: {exc}", flush=True)
                    continue
                vals = cp.asnumpy(out).ravel()
                ok = bool(np.all(vals == want))
                y = cp.zeros(1, np.float32)
                _run(cp, fill, lambda: read_now((1,), (32,), (x, y)), x, port)
                early = float(cp.asnumpy(y)[0]) == float(ONE)  # x[0]'s bits before the fill
                print(f"M{M} N{N} K{K} S{S} {pname:>13}: edges {m}, GEMM {'waits' if ok else 'READ EARLY'} "
                      f"(min {vals.min():g} max {vals.max():g}, want {want:g}); control "
                      f"{'read early (edge lets it start)' if early else 'read late'}", flush=True)
                bad += port is not None and not ok
    print(f"\n{bad} case(s) where a cuBLAS GEMM behind a programmatic edge read x before the kernel ahead wrote it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
