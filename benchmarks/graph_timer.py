"""Time a captured sequence of launches (the probes' shared timing; H200 probes, issue 12)."""

from __future__ import annotations

import statistics


def graph_us(cp, stream, launch, *, calls: int, replays: int, sets: int = 1, warm: int | None = None) -> float:
    """Median microseconds per call of a CUDA graph of ``calls`` launches, ``launch(j)`` using input
    set ``j % sets`` (more sets than L2 holds: inputs from DRAM), replayed ``replays`` times (CUDA
    events around each replay). ``warm`` eager launches first (default: one per set)."""
    with stream:
        for j in range(sets if warm is None else warm):
            launch(j % sets)
        stream.synchronize()
        stream.begin_capture()
        try:
            for j in range(calls):
                launch(j % sets)
        except BaseException:
            try:
                stream.end_capture()  # leave the stream usable; the launch's own error is the one raised
            except Exception:  # noqa: BLE001,S110
                pass
            raise
        g = stream.end_capture()
        g.upload(stream)
        g.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(replays):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            g.launch(stream)
            e1.record(stream)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / calls)
    return statistics.median(times)
