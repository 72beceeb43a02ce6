"""`dflash-conformance fuzz`: exit 0 on the baseline with per-Op example counts and the wall time;
exit 1 on a mutant with the shrunk case, its trigger, the saved vector and a rerun command that
`run --vectors DIR` replays; one-line errors (exit 2) for bad options and for a missing hypothesis."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")

from conformance import cli, fuzz


def test_baseline_passes_and_prints_counts(capsys, tmp_path):
    rc = cli.main(["fuzz", "--in-process", "--ops", "grouped_conv,preview_commit", "--max-examples", "15",
                   "--seed", "4", "--out", str(tmp_path / "f")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "grouped_conv: 15 examples: 15 PASS" in out and "preview_commit: 15 examples" in out
    assert "30 examples over 2 Op(s), seed 4" in out and "s wall" in out
    assert not (tmp_path / "f").exists()


def test_mutant_fails_is_saved_and_replays(capsys, tmp_path):
    out_dir = tmp_path / "found"
    rc = cli.main(["fuzz", "--impl", "conformance.mutants:WindowLeS", "--ops", "draft_attention",
                   "--max-examples", "200", "--seed", "0", "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "draft_attention: FAIL at example" in out and "triggered by: window=" in out
    assert "`window_le_S`" in next(line for line in out.splitlines() if "diagnosis:" in line)
    rerun = next(line for line in out.splitlines() if line.strip().startswith("rerun:"))
    assert f"--vectors {out_dir}" in rerun and "--seed 0" in rerun
    case = next(line for line in out.splitlines() if line.strip().startswith("case ")).split()[1].rstrip(":")
    rc = cli.main(["run", "--impl", "conformance.mutants:WindowLeS", "--vectors", str(out_dir), "--ops", case])
    assert rc == 1
    assert cli.main(["run", "--vectors", str(out_dir), "--in-process"]) == 0  # the baseline passes it


def test_bad_options_are_one_line_errors(capsys):
    assert cli.main(["fuzz", "--ops", "no_such_op"]) == 2
    assert "matches no Op" in capsys.readouterr().err
    assert cli.main(["fuzz", "--max-examples", "0"]) == 2


def test_missing_hypothesis_says_how_to_install(capsys, monkeypatch):
    monkeypatch.setattr(fuzz, "HAVE_HYPOTHESIS", False)
    assert cli.main(["fuzz", "--ops", "grouped_conv"]) == 2
    err = capsys.readouterr().err
    assert "pip install hypothesis" in err and len(err.strip().splitlines()) == 1
