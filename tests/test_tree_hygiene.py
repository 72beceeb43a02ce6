"""The tree is the product, not the lab notebook: limits a change can break without noticing.

Raw run output belongs under an output folder (``make gpu-check OUT=...``), not in docs/; a
comment or document says why, not which session or experiment produced it; the docs stay a
reference set a newcomer can read; and nothing the repository ships points outside it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A session tag: "session v17", "v22-b", "h200-v21-c", "before session v11". Contract and spec
# versions ("C2 v3", "catalog v2", "Philox4x32-10") are not sessions and do not match.
SESSION_TAG = re.compile(r"(?i)\bsession\s+v?\d+\b|\bh200-v\d+|\bv\d{1,2}-[a-h]\b")
OUTSIDE = re.compile(r"\.\./shared\b|\bshared/(design|spec|configs)\b|\b(PITFALLS|CONTRACTS|OPS|ARCHITECTURE|STYLE)\.md\b")
CHECKED = ("reference", "conformance", "kernels_cu", "benchmarks", "tools", "examples", "docs", "README.md",
           "Makefile", "pyproject.toml", ".ci")


def tracked(*paths: str) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return [ROOT / p for p in out.splitlines() if p]


def test_docs_are_a_reference_set():
    docs = tracked("docs")
    raw = [p.relative_to(ROOT) for p in docs if p.suffix in (".log", ".json", ".tgz", ".gz", ".csv")]
    assert not raw, f"raw run output under docs/ (write it under an output folder): {raw}"
    assert len(docs) <= 25, f"{len(docs)} files under docs/ (at most 25): {[str(p.relative_to(ROOT)) for p in docs]}"
    perf = ROOT / "docs" / "performance.md"
    assert perf.exists() and len(perf.read_text().splitlines()) <= 300, "docs/performance.md: at most 300 lines"


def test_no_session_tags_in_code_or_docs():
    hits = []
    for p in tracked(*CHECKED):
        if p.suffix in (".py", ".cu", ".cuh", ".md", ".sh", ".toml", "") and p.is_file():
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if SESSION_TAG.search(line):
                    hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "session tags (say why, not which session):\n" + "\n".join(hits[:40])


def test_nothing_points_outside_the_repository():
    """Code, docs and messages (.ci/run may hand CI's published originals to the config tests)."""
    hits = []
    for p in tracked(*(c for c in CHECKED if c != ".ci")):
        if p.suffix in (".py", ".cu", ".cuh", ".md", ".sh", ".toml") and p.is_file():
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if OUTSIDE.search(line):
                    hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "references outside the repository:\n" + "\n".join(hits[:40])


def test_patterns_catch_what_they_are_for():
    assert SESSION_TAG.search("# measured in session v17") and SESSION_TAG.search("(v22-b)")
    assert SESSION_TAG.search("docs/reports/h200-v21-a.log")
    assert not SESSION_TAG.search("CONTRACTS C2 v3 amends the conv") and not SESSION_TAG.search("Philox4x32-10")
    assert OUTSIDE.search("see ../shared/design/CONTRACTS.md") and OUTSIDE.search("(PITFALLS.md row 4)")
    assert not OUTSIDE.search("docs/contracts.md, docs/pitfalls.md") and not OUTSIDE.search("CONTRACTS C2")
