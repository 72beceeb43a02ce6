"""What a newcomer hit: an interrupted run's summary that read like a pass, exit codes that did not
tell broken suite data from failing kernels, help texts that contradicted the behaviour, output
printed twice, per-Op times of 0.0 s, and numpy warnings in front of a clean verify."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance import registry, report, vectors
from tests.conftest import ToyImpl, toy_cli

REPO = Path(__file__).resolve().parents[1]
cli = toy_cli  # (exit code, stdout, stderr) of the CLI on the toy Ops


def _flat(text: str) -> str:
    """Help text with argparse's line wrapping undone."""
    return " ".join(text.split())


# ----------------------------------------------------------------------------- implementations the tests load

class _InterruptedAtNoforce(ToyImpl):
    """Ctrl-C while the fifth case runs (in-process, the KeyboardInterrupt reaches the CLI)."""

    def toy_noforce(self, **kw):
        raise KeyboardInterrupt


def interrupted():
    return _InterruptedAtNoforce()


class _SlowNoforce(ToyImpl):
    def toy_noforce(self, **kw):
        time.sleep(0.4)
        return ToyImpl.toy(self, **kw)


def slow_noforce():
    return _SlowNoforce()


class _SlowFirstCall(ToyImpl):
    """The first call of each Op is slow (a GPU backend compiling its kernels), the rest instant."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def _maybe_wait(self, op):
        if op not in self.seen:
            self.seen.add(op)
            time.sleep(0.4)

    def toy(self, **kw):
        self._maybe_wait("toy")
        return ToyImpl.toy(self, **kw)

    def toy_noforce(self, **kw):
        self._maybe_wait("toy_noforce")
        return ToyImpl.toy(self, **kw)


def slow_first_call():
    return _SlowFirstCall()


def near_tie():
    return ToyImpl("neartie")


def _corrupt(vec: Path, case: str = "toy/basic") -> Path:
    """A vector file that cannot be parsed, its manifest sha256 updated to match."""
    bad = vectors.case_path(vec, case)
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken header!!")
    manifest = json.loads((vec / "manifest.json").read_text())
    for e in manifest["files"]:
        if e["case"] == case:
            e["sha256"] = vectors.sha256(bad.read_bytes())
    (vec / "manifest.json").write_text(json.dumps(manifest))
    return bad


# ----------------------------------------------------------------------------- item 2: incomplete runs

def test_an_interrupted_runs_summary_counts_the_cases_not_run(capsys, vec, tmp_path):
    js, xml = tmp_path / "r.json", tmp_path / "r.xml"
    code, _, err = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.test_newcomer:interrupted",
                       "--in-process", "--json", str(js), "--junit", str(xml))
    assert code == 130 and "interrupted" in err
    body = json.loads(js.read_text())
    s = body["summary"]
    assert body["complete"] is False
    assert s["complete"] is False and s["verdict"] == "INCOMPLETE"
    assert (s["planned"], s["PASS"], s["FAIL"], s["ERROR"], s["NOT_RUN"]) == (8, 4, 0, 0, 4)
    root = ET.parse(xml).getroot()
    assert int(root.get("errors")) >= 1  # a JUnit consumer sees the incomplete run as an error
    inc = root.find(".//testcase[@classname='dflash.run'][@name='incomplete']/error")
    assert inc is not None and "4 of 8 case(s) not run" in inc.get("message")


def test_a_run_cut_by_the_deadline_counts_the_cases_not_run(capsys, vec, tmp_path):
    js = tmp_path / "r.json"
    code, out, _ = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.test_newcomer:slow_noforce",
                       "--in-process", "--deadline", "1", "--json", str(js))
    assert code == 1
    body = json.loads(js.read_text())
    s = body["summary"]
    not_run = sum(r["detail"].startswith("not run:") for r in body["results"])
    assert not_run >= 1 and s["NOT_RUN"] == not_run
    assert body["complete"] is False and s["complete"] is False and s["verdict"] == "INCOMPLETE"
    assert out.strip().splitlines()[-1].startswith("INCOMPLETE: 8 cases:")


def test_a_complete_run_says_so_beside_its_counts(capsys, vec, tmp_path):
    js = tmp_path / "r.json"
    assert cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.conftest:ToyImpl", "--in-process",
               "--json", str(js))[0] == 0
    s = json.loads(js.read_text())["summary"]
    assert (s["complete"], s["verdict"], s["planned"], s["NOT_RUN"], s["PASS"]) == (True, "PASSED", 8, 0, 8)


def test_a_report_written_while_running_reads_as_incomplete():
    # what geometry writes after every case: the number planned is not known there
    s = json.loads(report.json_bytes([], "x", {}, "", {}, "", complete=False))["summary"]
    assert s["complete"] is False and s["verdict"] == "INCOMPLETE" and s["NOT_RUN"] is None


# ----------------------------------------------------------------------------- item 7: exit codes, warnings

def test_a_corrupt_vector_exits_3_not_1(capsys, vec, tmp_path):
    bad = _corrupt(vec)
    js = tmp_path / "r.json"
    code, out, err = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.conftest:ToyImpl", "--in-process",
                         "--json", str(js))
    assert code == 3 and err == ""
    assert f"ERROR toy/basic: bad vector file: {bad}: not a readable safetensors file" in out
    assert out.strip().splitlines()[-1].startswith("BAD VECTORS: 8 cases: 7 PASS")
    assert json.loads(js.read_text())["summary"]["verdict"] == "BAD_VECTORS"
    # a failing kernel on sound vectors still exits 1
    vec2 = tmp_path / "v2"
    assert cli(capsys, "generate", "--out", str(vec2))[0] == 0
    assert cli(capsys, "run", "--vectors", str(vec2), "--impl", "tests.test_newcomer:near_tie", "--in-process")[0] == 1


def test_a_vector_changed_behind_the_manifest_exits_3(capsys, vec):
    vectors.case_path(vec, "toy/masked").write_bytes(b"changed")
    code, out, _ = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.conftest:ToyImpl", "--in-process")
    assert code == 3 and "sha256 differs from manifest.json" in out
    code, out, _ = cli(capsys, "verify", "--vectors", str(vec))
    assert code == 3 and out.splitlines() == [f"{vec}/toy/masked.safetensors: sha256 differs from manifest.json"]


def test_dump_of_a_broken_vector_exits_3_in_one_line(capsys, vec, tmp_path):
    bad = _corrupt(vec)
    code, _, err = cli(capsys, "dump", "toy/basic", "--vectors", str(vec), "--impl", "tests.conftest:ToyImpl",
                       "--in-process", "--out", str(tmp_path / "d"))
    assert code == 3 and err.count("\n") == 1 and err.startswith(f"error: {bad}: not a readable safetensors file")
    vectors.case_path(vec, "toy/basic").unlink()
    code, _, err = cli(capsys, "dump", "toy/basic", "--vectors", str(vec), "--impl", "tests.conftest:ToyImpl",
                       "--in-process", "--out", str(tmp_path / "d"))
    assert code == 3 and err.count("\n") == 1 and str(bad) in err


@pytest.mark.parametrize("cmd", ["run", "list", "verify"])
def test_a_corrupt_manifest_exits_3_naming_it(capsys, vec, cmd):
    (vec / "manifest.json").write_text("{not json")
    extra = ["--impl", "tests.conftest:ToyImpl", "--in-process"] if cmd == "run" else []
    code, _, err = cli(capsys, cmd, "--vectors", str(vec), *extra)
    assert code == 3 and err.count("\n") == 1 and f"{vec}/manifest.json: not a dflash-conformance manifest" in err


def test_bad_usage_keeps_exit_2(capsys, tmp_path):
    code, _, err = cli(capsys, "run", "--vectors", str(tmp_path / "absent"))
    assert code == 2 and err.count("\n") == 1


def test_the_help_documents_exit_3(capsys):
    code, out, _ = cli(capsys, "--help")
    text = _flat(out)
    assert code == 0 and "3 the suite's own data is broken" in text
    for cmd in ("run", "verify", "dump", "list"):
        code, out, _ = cli(capsys, cmd, "--help")
        assert code == 0 and "3 the suite's own data is broken" in _flat(out), cmd


def test_generating_every_case_warns_nothing():
    """verify and generate regenerate every case: no numpy RuntimeWarning may reach the terminal
    (a reference that divides inf by inf on purpose says so where it does it)."""
    from conformance.generate import case_bytes

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for name, spec in sorted(registry.ops().items()):
            for case in spec.generate():
                case_bytes(spec, case)


# ----------------------------------------------------------------------------- item 8: help texts and diagnosis

def test_deadline_help_says_it_limits_the_whole_run(capsys):
    _, out, _ = cli(capsys, "run", "--help")
    text = _flat(out)
    assert "--deadline S overall limit in seconds for the whole run" in text
    assert "not the per-example limit that fuzz --deadline sets" in text


def test_verify_help_promises_what_verify_checks(capsys):
    _, out, _ = cli(capsys, "verify", "--help")
    text = _flat(out)
    assert "same platform" not in text
    assert "byte-identical on any platform" in text


def test_list_works_without_vectors(capsys, monkeypatch):
    def no_vectors(for_writing=False):
        raise vectors.InputError("vectors: this installed package has no vectors")

    monkeypatch.setattr(vectors, "default_dir", no_vectors)
    monkeypatch.delenv("DFLASH_VECTORS", raising=False)
    code, out, err = cli(capsys, "list")
    assert code == 0 and err == ""
    assert out.splitlines()[0].startswith("case counts from running the generators (no vectors:")
    assert "toy\t4\ttoy Op for harness tests" in out.splitlines()
    _, out, _ = cli(capsys, "list", "--help")
    assert "without vectors, from the case generators" in _flat(out)


def test_dump_prints_the_diagnosis_and_the_unit_of_its_error_files(capsys, vec, tmp_path):
    out_dir = tmp_path / "d"
    code, out, _ = cli(capsys, "dump", "toy/exact_tie", "--vectors", str(vec), "--impl",
                       "tests.test_newcomer:near_tie", "--in-process", "--out", str(out_dir))
    assert code == 1
    assert re.search(r"^FAIL toy/exact_tie: pick: differs at \[1, 0\].* \| matches no catalog pitfall; "
                     r"first divergence: pick\[1, 0\]", out, re.M), out
    summary = (out_dir / "summary.txt").read_text()
    for text in (out, summary):
        assert "error/y.npy: per element |actual - expected| in ulp of bf16 (the spacing of the output's " \
               "storage format at the expected value); 0 where masked out" in text
        assert "error/pick.npy: per element 1 where actual differs from expected, else 0" in text
    assert "diagnosis: matches no catalog pitfall; first divergence: pick[1, 0]" in summary


def test_in_process_is_refused_for_a_ci_gate(capsys, vec, tmp_path):
    exp = tmp_path / "known.txt"
    exp.write_text("toy/exact_tie  tie rule (ENG-1)\n")
    for extra in (["--require", "toy"], ["--expect", str(exp)]):
        code, out, err = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.conftest:ToyImpl",
                             "--in-process", *extra)
        assert code == 2 and err.count("\n") == 1 and "implementation:" not in out
        assert err.startswith(f"error: --in-process cannot be combined with {extra[0]}"), err


# ----------------------------------------------------------------------------- item 9: smaller

def test_a_fail_is_printed_once_in_a_log(capsys, vec):
    code, out, _ = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.test_newcomer:near_tie",
                       "--in-process")
    assert code == 1
    assert len([line for line in out.splitlines() if line.startswith("FAIL toy/exact_tie:")]) == 1


def test_per_op_times_include_the_first_case(capsys, vec):
    code, out, _ = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.test_newcomer:slow_first_call",
                       "--in-process")
    assert code == 0
    times = dict(re.findall(r"^\[\d+/8\] (\w+): 4 cases: .*\((\d+\.\d) s\)$", out, re.M))
    assert set(times) == {"toy", "toy_noforce"} and all(float(t) >= 0.3 for t in times.values()), out


def test_an_unexpected_pass_matched_by_a_glob_names_the_pattern(capsys, vec, tmp_path):
    exp = tmp_path / "known.txt"
    exp.write_text("# known\ntoy/*tie   tie rule broken (ENG-1)\ntoy_noforce/basic  fixed since?\n")
    code, out, _ = cli(capsys, "run", "--vectors", str(vec), "--impl", "tests.conftest:ToyImpl", "--expect",
                       str(exp))
    assert code == 0
    assert (f"UNEXPECTED PASS toy/exact_tie (listed: tie rule broken (ENG-1)): matched by 'toy/*tie' "
            f"({exp}:2); narrow that pattern so it no longer matches this case") in out
    assert f"UNEXPECTED PASS toy_noforce/basic (listed: fixed since?): remove line 3 from {exp}" in out


def test_fuzz_without_hypothesis_says_how_to_install_it():
    code = ("import sys; sys.modules['hypothesis'] = None\n"
            "from conformance.cli import main\n"
            "sys.exit(main(['fuzz', '--max-examples', '1']))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "pip install 'dflash-conformance[test]'" in proc.stderr


def test_an_accept_test_tie_names_the_accept_rule_not_the_ranking_tie_rule():
    """U q(d) = p(d) exactly is decided by the strict accept test (C3), not by C4's ranking ties: an
    accept test written ``u*q <= p`` FAILs on the tie case with a message that names the right rule."""
    from conformance.compare import Result
    from conformance.mutants import MUTANTS
    from conformance.runner import run_suite

    bug = next(m for m in MUTANTS if m.key == "coin_le_ratio")
    res = run_suite(bug, Path(__file__).resolve().parents[1] / "vectors", ops_pattern=bug.op)
    ties = [r for r in res if r.result == Result.FAIL and "exact tie" in r.detail]
    assert ties, "coin_le_ratio must FAIL some case on an exact accept tie"
    assert all("strict accept test" in r.detail and "C4" not in r.detail for r in ties), ties[0].detail


def test_which_accept_test_forms_the_vectors_tell_apart():
    """docs/contracts.md (C3): ``u*q <= p`` (coin_le_ratio) FAILs the exact-tie cases, while ``u <= p/q``
    cannot be told from the strict test: where p = q = 0 it compares with NaN, which is False (reject,
    as the strict test), and the vectors have no U q(d) = p(d) tie with q(d) > 0. The docs promised the
    opposite once; this pins what they now say."""
    from conformance.compare import Result
    from conformance.mutants import MUTANTS
    from conformance.mutants.speculative_accept import CoinLeRatio
    from conformance.runner import run_suite

    root = Path(__file__).resolve().parents[1] / "vectors"
    le = next(m for m in MUTANTS if m.key == "coin_le_ratio")
    assert any(r.result == Result.FAIL for r in run_suite(le, root, ops_pattern=le.op))
    divided = CoinLeRatio(bug={"bug": "coin_le_divided"})
    results = run_suite(divided, root, ops_pattern="speculative_accept")
    assert results and all(r.result in (Result.PASS, Result.ACCEPTABLE) for r in results), \
        [(r.case, r.detail) for r in results if r.result not in (Result.PASS, Result.ACCEPTABLE)][:3]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "contracts.md").read_text()
    assert "`U <= p(d)/q(d)`" in doc and "`U*q(d) <= p(d)` (mutant `coin_le_ratio`)" in doc and "not caught" in doc
