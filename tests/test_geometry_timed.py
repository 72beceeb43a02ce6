"""The timed full-geometry run (conformance.geometry_jobs.timed_run, gpu_bench --geometry), on the CPU:
the same code path with the float32 baseline at the reduced geometries."""

from __future__ import annotations

from conformance.geometry_jobs import timed_run

BASELINE = "conformance.baseline:Float32Baseline"


def test_a_complete_run_reports_its_time_and_every_verdict():
    geo = timed_run(1, limit=600, impl=BASELINE, extra=("--reduced", "--batch", "1", "--width", "8"))
    assert geo["complete"] and geo["exit_status"] == 0, geo
    assert geo["seconds"] > 0 and sum(geo["verdicts"].values()) >= 2  # context_kv and the block path, two geometries
    assert set(geo["verdicts"]) <= {"PASS", "ACCEPTABLE"}


def test_a_run_cut_short_is_incomplete_not_a_pass():
    geo = timed_run(1, limit=0.5, impl=BASELINE, extra=("--reduced",))
    assert not geo["complete"] and geo["exit_status"] is None
    assert "stopped after" in geo["last_line"]
