"""Issue 9, isolation: implementations that exit, crash, hang or raise oddly, run in the
worker process (real subprocesses), and through the CLI as a process. Each is an ERROR
of the case it held, naming the cause, and the run goes on."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.compare import Result
from conformance.runner import run_suite
from tests.conftest import TOYS, ToyImpl

REPO = Path(__file__).resolve().parents[1]


class Misbehaving(ToyImpl):
    """The toy implementation, except that ``toy`` (not ``toy_noforce``) misbehaves."""

    def __init__(self, how: str):
        super().__init__("float32")
        self.how = how
        self.name = f"misbehaving ({how})"

    def toy(self, **kw):
        how = self.how
        if how == "sys_exit":
            sys.exit(0)
        if how == "raise_systemexit":
            raise SystemExit
        if how == "os_exit0":
            os._exit(0)
        if how == "os_exit3":
            os._exit(3)
        if how == "segfault":
            ctypes.string_at(0)
        if how == "c_sleep":  # blocked inside C: SIGALRM could not interrupt it
            ctypes.CDLL(None).sleep(30)
        if how == "keyboard":
            raise KeyboardInterrupt
        if how == "multiline":
            raise ValueError("first line of the message\nsecond line\nthird line")
        if how == "chatty":
            print("hello from the kernel")
        return ToyImpl.toy(self, **kw)

    def toy_noforce(self, **kw):
        if self.how == "hang_all":
            ctypes.CDLL(None).sleep(30)
        return ToyImpl.toy(self, **kw)

    def environment(self):
        return {"device": b"NVIDIA H200", "nested": {"bytes": b"\xff\xfe"}, "count": 1}


def _factory(how):
    def make():
        return Misbehaving(how)

    make.__name__ = how
    return make


for _how in ("sys_exit", "raise_systemexit", "os_exit0", "os_exit3", "segfault", "c_sleep", "keyboard", "multiline",
             "chatty", "hang_all"):
    globals()[_how] = _factory(_how)


def _run(toy_vectors, how, timeout=20.0, **kw):
    return {r.case: r for r in run_suite(f"tests.test_harness_isolation:{how}", toy_vectors, timeout=timeout,
                                         specs=TOYS, isolate=True, **kw)}


@pytest.mark.parametrize(("how", "detail"), [
    ("sys_exit", "SystemExit(0): the implementation called sys.exit"),
    ("raise_systemexit", "SystemExit(None): the implementation called sys.exit"),
    ("keyboard", "KeyboardInterrupt"),
    ("os_exit0", "the implementation ended the worker process (exit status 0)"),
    ("os_exit3", "the implementation ended the worker process (exit status 3)"),
    ("segfault", "the implementation ended the worker process (killed by SIGSEGV (a crash in native code))"),
])
def test_an_exit_or_a_crash_is_an_error_of_that_case_and_the_run_goes_on(toy_vectors, how, detail):
    res = _run(toy_vectors, how)
    assert len(res) == 8
    for case, r in res.items():
        if case.startswith("toy/"):
            assert r.result == Result.ERROR and r.detail == detail, (case, r.detail)
        else:  # toy_noforce runs after four deaths, in a fresh worker
            assert r.result in (Result.PASS, Result.ACCEPTABLE), (case, r.detail)


def test_a_segfault_leaves_its_faulthandler_dump_in_the_trace(toy_vectors):
    r = _run(toy_vectors, "segfault")["toy/basic"]
    assert "Fatal Python error: Segmentation fault" in r.trace and "in toy" in r.trace


def test_a_hang_inside_c_code_is_killed_at_the_deadline(toy_vectors):
    start = time.monotonic()
    res = _run(toy_vectors, "c_sleep", timeout=1.0, entries=None)
    elapsed = time.monotonic() - start
    assert res["toy/basic"].result == Result.ERROR
    assert res["toy/basic"].detail == "timed out after 1 s (the worker was killed)"
    assert elapsed < 4 * 1.0 + 15  # four kills at 1 s each, plus worker starts; not 4 x 30 s
    assert res["toy_noforce/basic"].result == Result.PASS


def test_an_overall_deadline_bounds_a_run_that_hangs_everywhere(toy_vectors):
    start = time.monotonic()
    res = _run(toy_vectors, "hang_all", timeout=60.0, deadline_s=2.0)
    assert time.monotonic() - start < 12
    details = [r.detail for c, r in sorted(res.items()) if c.startswith("toy_noforce/")]
    assert details[0] == "timed out: the overall deadline of 2 s was reached"
    assert all(d == "not run: the overall deadline of 2 s was reached" for d in details[1:])


def test_a_multi_line_message_keeps_its_first_line_and_the_whole_traceback(toy_vectors):
    r = _run(toy_vectors, "multiline")["toy/basic"]
    assert r.detail == "ValueError: first line of the message [...]"
    assert "second line\nthird line" in r.trace and "Traceback (most recent call last)" in r.trace
    assert 'in toy\n    raise ValueError("first line of the message' in r.trace


def test_what_an_implementation_prints_is_kept_per_case(toy_vectors):
    r = _run(toy_vectors, "chatty")["toy/basic"]
    assert r.result == Result.PASS and r.output == "hello from the kernel\n"


def test_the_parent_never_imports_the_implementations_modules(toy_vectors, tmp_path, monkeypatch):
    (tmp_path / "fake_gpu_lib_q.py").write_text("import tests.conftest as c\nclass B(c.ToyImpl):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    res = run_suite("fake_gpu_lib_q:B", toy_vectors, "toy/basic", specs=TOYS, isolate=True)
    assert res[0].result == Result.PASS
    assert "fake_gpu_lib_q" not in sys.modules and "cupy" not in sys.modules


def test_an_object_is_sent_to_the_worker_by_pickle(toy_vectors):
    res = run_suite(ToyImpl("ulp"), toy_vectors, "toy/basic", specs=TOYS, isolate=True)
    assert res[0].result == Result.FAIL and "ulp" in res[0].detail


def _cli(*argv, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "conformance.cli", *argv], check=False, capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=timeout)


@pytest.mark.parametrize(("how", "detail"), [
    ("sys_exit", "SystemExit(0): the implementation called sys.exit"),
    ("os_exit0", "the implementation ended the worker process (exit status 0)"),
    ("os_exit3", "the implementation ended the worker process (exit status 3)"),
    ("segfault", "killed by SIGSEGV"),
])
def test_the_cli_process_reports_every_case_and_exits_1(toy_vectors, tmp_path, how, detail):
    js, xml = tmp_path / "out" / "r.json", tmp_path / "out" / "r.xml"
    proc = _cli("run", "--vectors", str(toy_vectors), "--impl", f"tests.test_harness_isolation:{how}",
                "--json", str(js), "--junit", str(xml))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "ERROR toy/basic: " in proc.stdout and detail in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("FAILED: 8 cases: 4 PASS, 0 ACCEPTABLE, 0 FAIL, 4 ERROR")
    body = json.loads(js.read_text())
    assert body["complete"] is True and body["summary"]["ERROR"] == 4 and body["summary"]["PASS"] == 4
    assert body["environment"]["device"] == "NVIDIA H200"  # bytes from environment() are decoded
    errors = ET.parse(xml).getroot().findall(".//testcase/error")
    assert len(errors) == 4 and all(detail in e.get("message") for e in errors)


def test_a_c_hang_is_killed_at_the_cli_timeout(toy_vectors):
    start = time.monotonic()
    proc = _cli("run", "--vectors", str(toy_vectors), "--impl", "tests.test_harness_isolation:c_sleep",
                "--ops", "toy/basic,toy_noforce/basic", "--timeout", "2")
    assert time.monotonic() - start < 20
    assert proc.returncode == 1 and "ERROR toy/basic: timed out after 2 s (the worker was killed)" in proc.stdout
    assert "PASS" in proc.stdout.strip().splitlines()[-1]


def test_sigterm_leaves_valid_reports_marked_incomplete(toy_vectors, tmp_path):
    js, xml = tmp_path / "r.json", tmp_path / "r.xml"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "conformance.cli", "run", "--vectors", str(toy_vectors), "--impl",
                             "tests.test_harness_isolation:hang_all", "--json", str(js), "--junit", str(xml),
                             "--timeout", "60"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the four toy cases pass quickly; then toy_noforce hangs (30 s)
            try:
                if len(json.loads(js.read_text())["results"]) >= 4:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        body = json.loads(js.read_text())  # on disk while the fifth case hangs
        assert body["complete"] is False and len(body["results"]) == 4
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in out + err
    body = json.loads(js.read_text())
    assert body["complete"] is False and len(body["results"]) == 4 and body["run"]["cases_selected"] == 8
    root = ET.parse(xml).getroot()
    assert root.find(".//testcase[@classname='dflash.run'][@name='incomplete']/error") is not None
