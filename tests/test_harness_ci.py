"""Issue 9, CI ergonomics: progress lines in logs, --require, --expect, --strict, --shard,
rerun commands, dump, report paths checked first, verify listing every problem, and the
exit codes of list/run/verify agreeing."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import conformance
from conformance import runner, vectors
from conformance.compare import Result
from tests.conftest import TOYS, ToyImpl, toy_cli

cli = toy_cli  # (exit code, stdout, stderr) of the CLI on the toy Ops; the `vec` fixture: tests/conftest.py


def near_tie():
    return ToyImpl("neartie")


class SameError:
    """Every call raises the same error (a CUDA backend on a machine without a GPU)."""

    name = "no gpu"

    def toy(self, **kw):
        raise ImportError("No module named 'cupy'")

    toy_noforce = toy


class Chatty(ToyImpl):
    def environment(self):
        return {"device": b"NVIDIA H200\x00", "bad": float("nan")}


def run(capsys, vec, *extra, impl="tests.conftest:ToyImpl"):
    # --require and --expect make a CI gate: the implementation runs in the worker (--in-process is refused)
    where = [] if "--require" in extra or "--expect" in extra else ["--in-process"]
    return cli(capsys, "run", "--vectors", str(vec), "--impl", impl, *where, *extra)


def test_logs_get_a_line_per_op_and_each_failure_with_its_rerun_command(capsys, vec):
    code, out, _ = run(capsys, vec, impl="tests.test_harness_ci:near_tie")
    lines = out.splitlines()
    assert code == 1
    assert "[4/8] toy: 4 cases: 2 PASS, 1 ACCEPTABLE (ambiguous 1), 1 FAIL" in out
    assert "[8/8] toy_noforce: 4 cases:" in out
    fail = [line for line in lines if line.startswith("FAIL toy/exact_tie: pick: differs")]
    assert len(fail) == 1  # as it happens, not again above the table
    assert fail[0].endswith(f"| rerun: dflash-conformance run --impl tests.test_harness_ci:near_tie --vectors {vec} "
                            "--in-process --ops toy/exact_tie")
    assert lines.index(fail[0]) < lines.index(next(line for line in lines if line.startswith("[4/8] toy:")))


def test_one_error_shared_by_every_case_is_printed_three_times_then_counted(capsys, vec):
    code, out, _ = run(capsys, vec, impl="tests.test_harness_ci:SameError")
    assert code == 1
    assert out.count("ERROR toy") == 3  # three as they happen, not again above the table
    assert "(more ERROR with this detail are counted, not printed: ImportError: No module named 'cupy')" in out
    assert "... and 5 more ERROR with the same detail: ImportError: No module named 'cupy'" in out


def test_acceptable_is_counted_by_flag_and_the_fractions_are_reported(capsys, vec, tmp_path):
    js = tmp_path / "r.json"
    code, out, _ = run(capsys, vec, "--json", str(js), impl="tests.test_harness_ci:near_tie")
    body = json.loads(js.read_text())
    near = next(r for r in body["results"] if r["case"] == "toy/near_tie")
    assert near["result"] == "ACCEPTABLE" and near["acceptable_flags"] == ["ambiguous"]
    assert body["summary"]["acceptable_by_flag"] == {"ambiguous": 2}
    assert "2 ACCEPTABLE (ambiguous 2)" in out.splitlines()[-1]
    basic = next(r for r in body["results"] if r["case"] == "toy/basic")
    assert basic["tight_frac"] == 0.0 and "envelope_frac" in basic
    assert body["summary"]["ops"]["toy"]["worst_tight_frac"] is not None
    assert "worst/tight" in out and "worst/envelope" in out


def test_require_fails_a_run_that_does_not_implement_a_listed_op(capsys, vec):
    code, out, _ = run(capsys, vec, impl="builtins:object")
    assert code == 0 and "NOTHING IMPLEMENTED" in out
    code, out, _ = run(capsys, vec, "--require", "toy", impl="builtins:object")
    assert code == 1 and "REQUIRED toy: NOT_IMPLEMENTED in 4 case(s) (--require toy)" in out
    assert "ERROR toy/basic: required (--require) but NOT_IMPLEMENTED: the implementation has no method toy" in out
    assert out.strip().splitlines()[-1].startswith("FAILED: 8 cases: 0 PASS, 0 ACCEPTABLE, 0 FAIL, 4 ERROR, "
                                                   "4 NOT_IMPLEMENTED")
    for bad, msg in (("zzz", "--require: 'zzz' matches no Op in the vectors"), ("", "--require: empty")):
        code, _, err = run(capsys, vec, "--require", bad)
        assert code == 2 and err.startswith(f"error: {msg}") and err.count("\n") == 1


def test_expectations_mark_known_failures_and_report_unexpected_passes(capsys, vec, tmp_path):
    exp = tmp_path / "known.txt"
    exp.write_text("# known\n*/exact_tie   tie rule broken (ENG-1)\ntoy/basic  fixed since?\nnothing/here  stale\n")
    js, xml = tmp_path / "r.json", tmp_path / "r.xml"
    code, out, _ = run(capsys, vec, "--expect", str(exp), "--json", str(js), "--junit", str(xml),
                       impl="tests.test_harness_ci:near_tie")
    assert code == 0, out
    assert f"expectations ({exp}): 2 expected failure(s), 1 unexpected pass(es)" in out
    assert f"UNEXPECTED PASS toy/basic (listed: fixed since?): remove line 3 from {exp}" in out
    assert f"stale expectation {exp}:4: 'nothing/here' matches no case in the vectors" in out
    assert "FAIL (expected: tie rule broken (ENG-1)) toy/exact_tie" in out
    body = json.loads(js.read_text())
    assert body["summary"]["expected_failures"] == 2 and body["summary"]["unexpected_passes"] == 1
    skipped = ET.parse(xml).getroot().findall(".//testcase[@name='toy/exact_tie']/skipped")
    assert skipped and skipped[0].get("message") == "expected FAIL: tie rule broken (ENG-1)"
    code, out, _ = run(capsys, vec, "--expect", str(exp), "--strict", impl="tests.test_harness_ci:near_tie")
    assert code == 1 and "(--strict: the run fails)" in out
    exp.write_text("toy/basic\n")
    code, _, err = run(capsys, vec, "--expect", str(exp))
    assert code == 2 and err == f"error: --expect: {exp}:1: 'toy/basic' has no reason (write: <case id or glob> " \
                                "<why it fails>)\n"


def test_strict_fails_on_acceptable(capsys, vec):
    assert run(capsys, vec, "--ops", "toy/near_tie", impl="tests.test_harness_ci:near_tie")[0] == 0
    code, out, _ = run(capsys, vec, "--ops", "toy/near_tie", "--strict", impl="tests.test_harness_ci:near_tie")
    assert code == 1 and "--strict: 1 ACCEPTABLE case(s) fail the run" in out


def test_shards_split_by_case_id_deterministically(capsys, vec, tmp_path):
    seen = []
    for i in (1, 2, 3):
        js = tmp_path / f"s{i}.json"
        code, _, _ = run(capsys, vec, "--shard", f"{i}/3", "--json", str(js))
        assert code == 0
        seen.append([r["case"] for r in json.loads(js.read_text())["results"]])
    flat = sorted(c for s in seen for c in s)
    assert flat == sorted(e["case"] for e in vectors.read_manifest(vec)["files"])  # disjoint and complete
    entries = vectors.read_manifest(vec)["files"]
    assert runner.shard(entries, 2, 3) == runner.shard(list(reversed(entries)), 2, 3)[::-1]
    for bad in ("0/3", "4/3", "a/b", "3"):
        code, _, err = run(capsys, vec, "--shard", bad)
        assert code == 2 and err.startswith("error: --shard: expected i/n") and err.count("\n") == 1


def test_report_paths_are_checked_before_the_first_case(capsys, vec, tmp_path):
    deep = tmp_path / "a" / "b" / "r.json"
    assert run(capsys, vec, "--json", str(deep), "--junit", str(tmp_path / "c" / "r.xml"))[0] == 0
    assert json.loads(deep.read_text())["complete"] is True
    (tmp_path / "file").write_text("")
    code, out, err = run(capsys, vec, "--json", str(tmp_path / "file" / "r.json"))
    assert code == 2 and err.startswith(f"error: --json: cannot create the directory {tmp_path / 'file'}")
    assert "implementation:" not in out  # nothing ran
    code, _, err = run(capsys, vec, "--junit", str(tmp_path))
    assert code == 2 and err == f"error: --junit: {tmp_path} is a directory\n"


def test_environment_bytes_and_nan_are_written_as_text(capsys, vec, tmp_path):
    js = tmp_path / "r.json"
    assert run(capsys, vec, "--json", str(js), impl="tests.test_harness_ci:Chatty")[0] == 0
    env = json.loads(js.read_text())["environment"]
    assert env["device"] == "NVIDIA H200\x00" and env["bad"] == "nan"


@pytest.mark.parametrize(("argv", "names"), [
    (["run", "--ops", ""], "--ops: empty pattern ''"),
    (["run", "--ops", " , "], "--ops: empty pattern"),
    (["run", "--deadline", "0"], "--deadline: must be a positive number"),
    (["run", "--timeout", "nan"], "--timeout: must be a positive number"),
    (["run", "--expect", "/no/such/file"], "--expect: cannot read /no/such/file"),
    (["verify", "--ops", ""], "--ops: empty pattern"),
    (["dump", "toy/nothing", "--out", "/tmp/x"], "dump: no case 'toy/nothing'"),
])
def test_more_bad_usage_is_one_line_and_exit_2(capsys, vec, argv, names):
    code, _, err = cli(capsys, *argv[:1], "--vectors", str(vec), *argv[1:])
    assert code == 2 and err.count("\n") == 1 and names in err, err


def test_timeout_inf_means_no_limit(capsys, vec):
    code, out, _ = run(capsys, vec, "--timeout", "inf")
    assert code == 0 and out.strip().splitlines()[-1].startswith("PASSED: 8 cases: 8 PASS")


def test_list_run_and_verify_agree_on_a_missing_directory(capsys, tmp_path):
    for cmd in ("list", "run", "verify"):
        code, _, err = cli(capsys, cmd, "--vectors", str(tmp_path / "missing"))
        assert code == 2 and "missing" in err and err.count("\n") == 1, cmd


def _edit(vec, case, data):
    path = vec / vectors.case_path(vec, case).relative_to(vec)
    path.write_bytes(data)
    manifest = json.loads((vec / "manifest.json").read_text())
    for e in manifest["files"]:
        if e["case"] == case:
            e["sha256"] = vectors.sha256(data)
    (vec / "manifest.json").write_text(json.dumps(manifest))


def test_verify_lists_every_problem(capsys, vec):
    _edit(vec, "toy/basic", b"\x07\x00\x00\x00\x00\x00\x00\x00[1,2,3]")
    _edit(vec, "toy/masked", b"\x01")
    (vec / "toy_noforce/masked.safetensors").unlink()
    (vec / "toy/near_tie.safetensors").write_bytes(b"changed")
    code, out, err = cli(capsys, "verify", "--vectors", str(vec))
    assert code == 3 and "Traceback" not in out + err
    lines = out.splitlines()
    assert lines == [
        f"{vec}/toy/basic.safetensors: not a readable safetensors file (ValueError: the header is a JSON list, "
        "not an object)",
        f"{vec}/toy/masked.safetensors: not a readable safetensors file (ValueError: truncated header)",
        f"{vec}/toy/near_tie.safetensors: sha256 differs from manifest.json",
        f"{vec}/toy_noforce/masked.safetensors: missing"], lines


def test_dump_writes_one_case(capsys, vec, tmp_path):
    out_dir = tmp_path / "dump"
    code, out, _ = cli(capsys, "dump", "toy/basic", "--vectors", str(vec), "--impl", "tests.conftest:ToyImpl",
                       "--out", str(out_dir), "--in-process")
    assert code == 0 and "PASS toy/basic" in out
    names = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())
    assert names == ["actual/pick.npy", "actual/total.npy", "actual/y.npy", "error/pick.npy", "error/total.npy",
                     "error/y.npy", "expected/pick.margin.npy", "expected/pick.npy", "expected/pick.scale.npy",
                     "expected/total.npy", "expected/y.npy", "inputs/a.npy", "inputs/b.npy", "inputs/logits.npy",
                     "inputs/trans.npy", "summary.txt"]
    assert np.load(out_dir / "inputs/a.npy").dtype == np.float32  # BF16 written as float32 (exact)
    impl = "tests.test_harness_ci:ulp_impl"
    code, out, _ = cli(capsys, "dump", "toy/basic", "--vectors", str(vec), "--impl", impl, "--out", str(out_dir))
    summary = (out_dir / "summary.txt").read_text()
    assert code == 1 and "result FAIL: y: max 8.0 ulp" in summary
    assert "output y (represented bf16): worst 8 ulp of bf16 at" in summary
    assert np.load(out_dir / "error/y.npy").max() == 8.0


def ulp_impl():
    return ToyImpl("ulp")


def test_an_installed_package_without_vectors_says_where_to_find_them(tmp_path, monkeypatch):
    site = tmp_path / "site-packages" / "conformance"
    site.mkdir(parents=True)
    monkeypatch.setattr(conformance, "__file__", str(site / "__init__.py"))
    monkeypatch.delenv("DFLASH_VECTORS", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(vectors.InputError, match="this installed package has no vectors; pass --vectors DIR or set "
                                                 "DFLASH_VECTORS"):
        vectors.default_dir()
    assert vectors.default_dir(for_writing=True) == vectors.Path("vectors")
    (site / "vectors").mkdir()
    (site / "vectors" / "manifest.json").write_text("{}")
    assert vectors.default_dir() == site / "vectors"  # a wheel that ships them


def test_run_suite_keeps_its_api(toy_vectors):
    res = runner.run_suite(ToyImpl(), toy_vectors, "toy", None, 10.0, TOYS)  # positional, as before
    assert [r.result for r in res] == [Result.PASS] * 4
    assert all(isinstance(r, runner.RunResult) for r in res)
