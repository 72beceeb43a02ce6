"""The dflash-conformance command line: exit codes, one-line errors, reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance import registry, vectors
from tests.conftest import toy_cli

REPO = Path(__file__).resolve().parents[1]


cli = toy_cli  # (exit code, stdout, stderr) of the CLI on the toy Ops; the `vec` fixture: tests/conftest.py


def test_generate_verify_run_succeed(capsys, tmp_path):
    out = tmp_path / "v"
    assert cli(capsys, "generate", "--out", str(out))[0] == 0
    code, text, _ = cli(capsys, "verify", "--vectors", str(out))
    assert code == 0 and "regenerates byte for byte" in text
    code, text, _ = cli(capsys, "run", "--vectors", str(out), "--impl", "tests.conftest:ToyImpl")
    assert code == 0
    last = text.strip().splitlines()[-1]
    assert last.startswith("PASSED: 8 cases: 8 PASS") and last.endswith("implementation: toy impl (float32)")


def test_run_reports_json_and_junit(capsys, vec, tmp_path):
    js, xml = tmp_path / "r.json", tmp_path / "r.xml"
    code, text, _ = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.test_cli:near_tie_impl",
                        "--json", str(js), "--junit", str(xml))
    assert code == 1  # the exact tie FAILs
    assert "FAIL toy/exact_tie: pick: differs at [1, 0]" in text
    body = json.loads(js.read_text())
    assert body["implementation"] == "toy impl (neartie)"
    assert body["vectors"]["manifest_sha256"] == vectors.sha256((vec / "manifest.json").read_bytes())
    env = body["environment"]
    assert {"python", "numpy", "ml_dtypes", "safetensors", "platform", "command", "date"} <= set(env)
    assert env["command"].startswith("dflash-conformance run --vectors")
    results = {r["case"]: r for r in body["results"]}
    assert results["toy/near_tie"]["result"] == "ACCEPTABLE" and results["toy/near_tie"]["flags"] == ["near_tie"]
    assert results["toy/exact_tie"]["result"] == "FAIL"
    assert results["toy/basic"]["worst_ulp"] == 0.0 and results["toy/basic"]["ulp_bound"] == 1.0

    root = ET.parse(xml).getroot()
    assert root.tag == "testsuites" and (root.get("tests"), root.get("failures")) == ("8", "2")
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert sorted(suites) == ["toy", "toy_noforce"]
    toy = suites["toy"]
    assert (toy.get("tests"), toy.get("failures"), toy.get("errors"), toy.get("skipped")) == ("4", "1", "0", "0")
    cases = {c.get("name"): c for c in toy.iter("testcase")}
    assert {c.get("classname") for c in cases.values()} == {"dflash.toy"}
    assert cases["toy/exact_tie"].find("failure").get("message").startswith("pick: differs")
    near = cases["toy/near_tie"].find("system-out").text
    assert near.startswith("ACCEPTABLE") and "1 acceptable divergence" in near
    assert cases["toy/basic"].find("failure") is None


def near_tie_impl():
    from tests.conftest import ToyImpl

    return ToyImpl("neartie")


def error_impl():
    from tests.conftest import ToyImpl

    return ToyImpl("raise")


def test_junit_marks_errors_and_skips(capsys, vec, tmp_path):
    xml = tmp_path / "r.xml"
    assert cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.test_cli:error_impl", "--ops", "toy",
               "--junit", str(xml))[0] == 1
    suite = ET.parse(xml).getroot().find("testsuite")
    assert suite.get("errors") == "4" and len(suite.findall("testcase/error")) == 4
    assert cli(capsys, "run", "--vectors", str(vec), "--impl", "builtins:object", "--junit", str(xml))[0] == 0
    root = ET.parse(xml).getroot()
    assert root.get("skipped") == "8" and len(root.findall("testsuite/testcase/skipped")) == 8


def test_without_impl_the_baseline_runs_and_says_why(capsys, vec, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError, GPU or not
    code, text, _ = cli(capsys, "run", "--vectors", str(vec))
    first = text.splitlines()[0]
    assert code == 0
    assert first.startswith("implementation: float32 baseline (NumPy) [no --impl and the CUDA backend is unavailable")
    assert "ModuleNotFoundError" in first or "ImportError" in first


@pytest.mark.parametrize(("argv", "names"), [
    (["run", "--impl", "nocolon"], "--impl: expected package.module:attribute"),
    (["run", "--impl", "no_such_mod_q:X"], "--impl: cannot import no_such_mod_q"),
    (["run", "--ops", "zzz*"], "--ops: 'zzz*' matches no Op or case id"),
    (["run", "--timeout", "0"], "--timeout: must be a positive number"),
    (["run", "--timeout", "soon"], "argument --timeout: invalid float value"),
    (["run", "--bogus"], "unrecognized arguments: --bogus"),
    (["verify", "--ops", "nothing"], "--ops: 'nothing' matches no Op or case id"),
])
def test_bad_usage_is_one_line_and_exit_2(capsys, vec, argv, names):
    code, _, err = cli(capsys, *argv[:1], "--vectors", str(vec), *argv[1:])
    assert code == 2 and err.count("\n") == 1 and names in err, err


def test_missing_vectors_exit_2_and_corrupt_ones_3_naming_the_file(capsys, vec, tmp_path):
    code, _, err = cli(capsys, "run", "--vectors", str(tmp_path / "absent"))
    assert code == 2 and err.count("\n") == 1 and "absent" in err
    bad = vec / "toy/basic.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken header!!")
    manifest = json.loads((vec / "manifest.json").read_text())  # sha updated: the file itself is unreadable
    for e in manifest["files"]:
        if e["case"] == "toy/basic":
            e["sha256"] = vectors.sha256(bad.read_bytes())
    (vec / "manifest.json").write_text(json.dumps(manifest))
    # found mid-run, a bad file is an ERROR of its case; the other cases still run and are reported;
    # the exit status says the suite's data is broken (3), not the implementation (1)
    code, out, err = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.conftest:ToyImpl", "--in-process")
    assert code == 3 and err == ""
    assert f"ERROR toy/basic: bad vector file: {bad}: not a readable safetensors file" in out
    assert out.strip().splitlines()[-1].startswith("BAD VECTORS: 8 cases: 7 PASS")


def test_verify_prints_one_line_per_bad_file_and_exits_3(capsys, vec):
    (vec / "toy/basic.safetensors").write_bytes(b"changed")
    (vec / "toy_noforce/masked.safetensors").unlink()
    code, out, _ = cli(capsys, "verify", "--vectors", str(vec))
    assert code == 3
    assert out.splitlines() == [f"{vec}/toy/basic.safetensors: sha256 differs from manifest.json",
                                f"{vec}/toy_noforce/masked.safetensors: missing"]


def test_list_counts_from_the_manifest_or_the_generators(capsys, vec, tmp_path, monkeypatch):
    code, out, _ = cli(capsys, "list", "--vectors", str(vec))
    assert code == 0 and out.splitlines()[0] == f"case counts from {vec}/manifest.json"
    assert "toy\t4\ttoy Op for harness tests" in out.splitlines()
    code, out, err = cli(capsys, "list", "--vectors", str(tmp_path / "none"))  # as run: a named absent dir is bad input
    assert code == 2 and err == f"error: --vectors: no directory {tmp_path / 'none'}\n"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DFLASH_VECTORS", raising=False)
    monkeypatch.setattr(vectors, "default_dir", lambda for_writing=False: tmp_path / "none")
    code, out, _ = cli(capsys, "list")
    assert code == 0 and out.splitlines()[0].startswith("case counts from running the generators")
    assert "toy_noforce\t4\ttoy Op for harness tests" in out.splitlines()


def test_generate_ops_keeps_other_entries(capsys, vec):
    before = json.loads((vec / "manifest.json").read_text())
    assert cli(capsys, "generate", "--out", str(vec), "--ops", "toy_noforce/basic")[0] == 0
    assert json.loads((vec / "manifest.json").read_text()) == before


def test_toy_ops_stay_out_of_the_registry():
    assert not {"toy", "toy_noforce"} & set(registry.ops())


def test_the_cli_runs_as_a_process(toy_vectors):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--vectors", str(toy_vectors),
                           "--impl", "tests.conftest:ToyImpl", "--ops", "toy/basic"],
                          check=False, capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("PASSED: 1 cases: 1 PASS")
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--vectors", str(toy_vectors),
                           "--impl", "x:y"], check=False, capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr == "error: --impl: cannot import x: ModuleNotFoundError: " \
                                                   "No module named 'x'\n"


def test_out_of_device_memory_is_one_line_not_an_internal_error(monkeypatch, capsys):
    """A device that runs out of memory (CuPy's and torch's OutOfMemoryError) is the run's size, not a bug
    of the tool: one line that says so and what to change, exit 2."""
    from conformance import cli as cli_module

    class OutOfMemoryError(Exception):
        pass

    def boom(args):
        raise OutOfMemoryError("Out of memory allocating 10,171,187,200 bytes")

    monkeypatch.setattr(cli_module, "_cmd_list", boom)
    assert cli_module.main(["list"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "out of memory" in err and "--jobs" in err
    assert "internal error" not in err
