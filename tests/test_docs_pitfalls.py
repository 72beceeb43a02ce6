"""docs/pitfalls.md names every mutant of the suite and every case flag of the vectors, so the page
cannot fall behind the catalog: a new mutant or flag without its row fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conformance.mutants import MUTANTS, ROUND_MUTANTS

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "pitfalls.md"


def _named() -> set[str]:
    """Every `code span` on the page."""
    return set(re.findall(r"`([^`\n]+)`", PAGE.read_text()))


def test_every_mutant_key_is_on_the_page():
    named = _named()
    missing = sorted(m.key for m in [*MUTANTS, *ROUND_MUTANTS] if m.key not in named)
    assert not missing, f"docs/pitfalls.md lacks the mutant keys {missing}"


def test_every_case_flag_is_on_the_page():
    manifest = json.loads((ROOT / "vectors" / "manifest.json").read_text())
    flags = {flag for entry in manifest["files"] for flag in entry["flags"]}
    assert flags, "no case flags in vectors/manifest.json"
    missing = sorted(flags - _named())
    assert not missing, f"docs/pitfalls.md lacks the case flags {missing}"


def test_the_page_points_nowhere_outside_the_repository():
    text = PAGE.read_text()
    for outside in ("../shared", "shared/design", "PITFALLS.md", "CONTRACTS.md"):
        assert outside not in text, outside


def test_every_mutant_has_a_family_and_the_page_lists_it_there():
    """The "Families" table names each family once and, in its row, every member: a new mutant without
    a family, or listed under another family than its code says, fails here."""
    mutants = [*MUTANTS, *ROUND_MUTANTS]
    assert not [m.key for m in mutants if not m.family], "mutants without a family"
    table = PAGE.read_text().split("\n## Families\n", 1)[1]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[2]))
    singles = next((set(re.findall(r"`([^`]+)`", ln)) for ln in table.splitlines() if "(one member each)" in ln), set())
    wrong = []
    for m in mutants:
        members = rows.get(m.family, singles if m.family == m.pitfall else set())
        if m.key not in members:
            wrong.append(f"{m.key} (family {m.family})")
    assert not wrong, f"docs/pitfalls.md's Families table does not list {wrong} under their family"
