"""The diagnosis in the reports: JSON and JUnit carry each FAIL's top hypotheses (no matplotlib
needed); ``run --html`` writes the one-file report with pictures, or refuses in one line naming the
[report] extra where matplotlib is absent; ``dump`` writes the picture where it is present."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance import report
from conformance.cli import main
from conformance.compare import Result
from conformance.diagnosis import picture
from conformance.runner import run_suite

VECTORS = Path(__file__).parents[2] / "vectors"
IMPL = "tests.diagnosis.engines:WindowLeS"
HAVE_MPL = picture.have_matplotlib()


@pytest.fixture(scope="module")
def results():
    from tests.diagnosis.engines import ScaledAttention

    return run_suite(ScaledAttention(), VECTORS, ops_pattern="draft_attention", diagnose=True)


def test_json_carries_the_top_hypotheses(results):
    body = json.loads(report.json_bytes(results, "x", {}, VECTORS, {}, ""))
    fails = [r for r in body["results"] if r["result"] == "FAIL"]
    assert fails
    for r in fails:
        hyps = r["diagnosis"]["hypotheses"]
        assert 1 <= len(hyps) <= 3, r["case"]
        assert all({"kind", "text", "evidence", "confidence"} <= set(h) for h in hyps)
        assert r["diagnosis"]["matches"] == [] and "note" in r["diagnosis"]  # the existing fields stay
    assert fails[0]["diagnosis"]["hypotheses"][0]["signature"] == "constant scale"


def test_junit_carries_the_top_hypotheses(results):
    root = ET.fromstring(report.junit_bytes(results, "x"))
    failing = [c for c in root.iter("testcase") if c.find("failure") is not None]
    assert len(failing) == sum(r.result == Result.FAIL for r in results)
    for c in failing:
        props = {p.get("name"): p.get("value") for p in c.iter("property")}
        assert "hypothesis.1" in props and "confidence" in props["hypothesis.1"]
        assert "hypotheses:\n1. [" in c.find("failure").text


def test_html_without_matplotlib_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(picture, "have_matplotlib", lambda: False)
    out = tmp_path / "r.html"
    code = main(["run", "--impl", IMPL, "--in-process", "--ops", "draft_attention", "--html", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists()
    assert len(err) == 1 and "[report]" in err[0] and "matplotlib" in err[0]


@pytest.mark.skipif(not HAVE_MPL, reason="matplotlib is not installed (the [report] extra): no pictures to draw")
def test_html_report_has_the_table_the_diagnosis_and_capped_pictures(tmp_path):
    out = tmp_path / "r.html"
    code = main(["run", "--impl", IMPL, "--in-process", "--ops", "draft_attention", "--html", str(out)])
    assert code == 1
    text = out.read_text()
    assert "<table>" in text and "draft_attention" in text and "window_le_S" in text
    from conformance.diagnose import MAX_PICTURES

    assert text.count("data:image/png;base64,") == MAX_PICTURES  # 32 FAILs, pictures capped
    assert f"Pictures for the first {MAX_PICTURES} FAIL(s) only" in text


@pytest.mark.skipif(not HAVE_MPL, reason="matplotlib is not installed (the [report] extra): no pictures to draw")
def test_dump_writes_the_picture(tmp_path):
    case = "draft_attention/window_le_S__local_S4_F42_W8"
    assert main(["dump", case, "--impl", IMPL, "--in-process", "--out", str(tmp_path)]) == 1
    png = tmp_path / "picture" / "out.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "picture/out.png" in (tmp_path / "summary.txt").read_text()


def test_grid_pools_large_outputs_without_losing_the_worst():
    import numpy as np

    err = np.zeros((4, 300, 700))
    err[3, 299, 699] = 7.0
    g, m, shape = picture.grid(err, np.ones(err.shape, bool))
    assert shape == (4, 300, 700) and max(g.shape) <= picture.MAX_SIDE and g.max() == 7.0 and m.all()
