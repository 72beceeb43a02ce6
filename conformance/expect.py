"""Expectations files (``run --expect FILE``): known failures, each with a reason.

One entry per line: a case id or an fnmatch glob (matched against the case id and
the Op name, as ``--ops``), whitespace, then the reason (required). ``#`` starts a
comment line; blank lines are ignored::

    # known failures of mypkg's kernels
    draft_attention/window_le_S*   ring keeps distance S instead of S-1 (ENG-1234)
    speculative_accept             not wired up yet (ENG-1300)

A FAIL or ERROR of a listed case is an expected failure: reported, not failing
the run. A listed case that now PASSes (or is ACCEPTABLE) is an unexpected pass:
reported, and it fails the run under ``--strict`` (update the file). An entry
that matches no case in the vectors is reported as stale.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from conformance.vectors import InputError

MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Expectation:
    pattern: str
    reason: str
    line: int


def parse(text: str, where: str) -> list[Expectation]:
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        pattern = parts[0]
        reason = parts[1].strip() if len(parts) > 1 else ""
        if not reason:
            raise InputError(f"{where}:{n}: {pattern!r} has no reason (write: <case id or glob> <why it fails>)")
        if not pattern.isprintable() or not reason.isprintable():
            raise InputError(f"{where}:{n}: unprintable characters")
        out.append(Expectation(pattern, reason, n))
    return out


def load(path) -> list[Expectation]:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"--expect: cannot read {p}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise InputError(f"--expect: {p} is larger than {MAX_BYTES} bytes; not an expectations file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"--expect: {p}: not UTF-8 text (byte {exc.start})") from None
    return parse(text, f"--expect: {p}")


def matches(pattern: str, case_id: str) -> bool:
    op = case_id.split("/", 1)[0]
    return fnmatch.fnmatchcase(case_id, pattern) or fnmatch.fnmatchcase(op, pattern)


def reason_for(expectations: list[Expectation], case_id: str) -> str | None:
    for e in expectations:
        if matches(e.pattern, case_id):
            return e.reason
    return None


def stale(expectations: list[Expectation], case_ids) -> list[Expectation]:
    """Entries that match no case id at all (in the whole manifest)."""
    ids = list(case_ids)
    return [e for e in expectations if not any(matches(e.pattern, i) for i in ids)]


def entry_for(expectations: list[Expectation], case_id: str) -> Expectation | None:
    """The entry that names ``case_id`` (the first that matches, as ``reason_for``)."""
    for e in expectations:
        if matches(e.pattern, case_id):
            return e
    return None


def unexpected_pass_advice(expectations: list[Expectation], case_id: str, where) -> str:
    """What to change in the file for a listed case that now passes: the line that names exactly
    it goes; a glob that matched it (and may match cases that still fail) is narrowed."""
    e = entry_for(expectations, case_id)
    if e is None:
        return f"remove it from {where}"
    if e.pattern == case_id:
        return f"remove line {e.line} from {where}"
    return f"matched by {e.pattern!r} ({where}:{e.line}); narrow that pattern so it no longer matches this case"
