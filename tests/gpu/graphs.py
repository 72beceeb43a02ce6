"""A helper shared by the GPU tests: one call's output bits eager, then replayed from a CUDA graph."""

from __future__ import annotations

import numpy as np


def eager_and_replayed(cupy, run, out):
    """run() on a non-blocking stream (its output array ``out``), then captured into a graph whose replay
    follows ``out`` zeroed: (eager bits, replayed bits) as uint32 arrays. The caller's uploads must have
    landed (a non-blocking stream does not wait for the legacy stream)."""
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        run()
        eager = cupy.asnumpy(out).view(np.uint32).copy()
        s.begin_capture()
        run()
        graph = s.end_capture()
        out.fill(0)
        graph.launch(s)
        s.synchronize()
    return eager, cupy.asnumpy(out).view(np.uint32)
