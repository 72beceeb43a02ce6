"""The pytest plugin, run in a child pytest over a tiny toy vectors directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CONFTEST = """
from conformance import registry
from tests.conftest import TOYS, ToyImpl

for spec in TOYS.values():  # force for teacher forcing comes from the registry
    registry.register(spec)


def near_tie():
    return ToyImpl("neartie")


def not_implemented():
    return ToyImpl("notimpl")
"""


@pytest.fixture
def child(tmp_path, toy_vectors):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    # the entry point may or may not be installed: load the plugin explicitly, once
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}

    def run(*args):
        cmd = [sys.executable, "-m", "pytest", "-p", "conformance.pytest_plugin", "-p", "no:cacheprovider",
               "-rA", "--rootdir", str(tmp_path), *args]
        return subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)

    run.vectors = str(toy_vectors)
    return run


def test_without_the_option_the_plugin_adds_nothing(child):
    proc = child("-q")
    assert proc.returncode == 0 and "1 passed" in proc.stdout and "dflash::" not in proc.stdout


def test_one_item_per_case_with_the_case_id_in_its_node_id(child):
    proc = child("--collect-only", "-q", "--dflash-impl", "tests.conftest:ToyImpl", "--dflash-vectors",
                 child.vectors, "--dflash-ops", "toy", "test_plain.py")
    ids = [line for line in proc.stdout.splitlines() if "dflash::" in line]
    assert [i.split("dflash::")[1] for i in ids] == ["toy/basic", "toy/exact_tie", "toy/masked", "toy/near_tie"]


def test_results_map_to_pass_fail_and_skip(child):
    proc = child("--dflash-impl", "conftest:near_tie", "--dflash-vectors", child.vectors, "test_plain.py")
    out = proc.stdout
    assert proc.returncode == 1
    assert "2 failed, 7 passed" in out
    assert "FAILED dflash::toy/exact_tie" in out and "FAILED dflash::toy_noforce/exact_tie" in out
    assert "FAIL: pick: differs at [1, 0] (got 3, expected 1; exact tie" in out
    assert "ACCEPTABLE" in out and "1 acceptable divergence(s)" in out and "teacher-forced after pick [0, 1]" in out
    assert "rerun: dflash-conformance run --impl conftest:near_tie --vectors" in out
    proc = child("--dflash-impl", "conftest:not_implemented", "--dflash-vectors", child.vectors)
    assert proc.returncode == 0 and "8 skipped" in proc.stdout
    assert "NOT_IMPLEMENTED: NotImplementedError: toy variant not supported" in proc.stdout


def test_bad_options_are_usage_errors(child, tmp_path):
    proc = child("--dflash-impl", "conftest:nothing_here", "--dflash-vectors", child.vectors)
    assert proc.returncode == 4 and "--dflash-impl: conftest has no attribute 'nothing_here'" in proc.stderr
    proc = child("--dflash-impl", "conftest:near_tie", "--dflash-vectors", str(tmp_path / "absent"))
    assert proc.returncode == 4 and "no directory" in proc.stderr
    proc = child("--dflash-impl", "conftest:near_tie", "--dflash-vectors", child.vectors, "--dflash-ops", "nope")
    assert proc.returncode == 4 and "--dflash-ops: 'nope' matches no Op or case id" in proc.stderr


def test_a_fail_names_its_diagnosis_as_the_cli_does(child):
    proc = child("--dflash-impl", "conftest:near_tie", "--dflash-vectors", child.vectors, "--dflash-ops",
                 "toy/exact_tie")
    assert proc.returncode == 1
    line = next(x for x in proc.stdout.splitlines() if x.startswith("FAIL: pick: differs at [1, 0]"))
    assert line.endswith("| matches no catalog pitfall; first divergence: pick[1, 0] (got 3, expected 1; "
                         "1 of 8 compared elements differ)"), line
