"""Reference-mutation check: does every reference bug fail a test after the vectors
are regenerated from the buggy reference?

    python tools/reference_mutation.py --out docs/reports/reference-mutation.md
    python tools/reference_mutation.py --check                 # every bug still applies, no run
    python tools/reference_mutation.py --bugs min_p_on_logits,philox_7_rounds --tests tests/test_guard_*.py

For each bug of tools/reference_mutants.py, one at a time:
  1. extract the committed tree (``git archive HEAD``, or ``--rev``) to a temporary directory:
     other people's uncommitted edits stay out; ``--overlay`` adds working-tree files on top;
  2. apply the bug (its ``old`` text must occur exactly once in its file, else the run stops);
  3. regenerate the golden vectors there: ``python -m conformance.cli generate --out vectors``
     (a generator error also counts as caught: the reference cannot make its own vectors);
  4. run the test subset there with ``PYTHONPATH`` at the copy, without ``-x`` so that every
     failing test is counted, under a per-bug timeout, and read the failures from JUnit XML.
A bug is *caught* when pytest exits non-zero (or generation failed); it *survives* otherwise. The
report lists the failing test functions per bug; "independent" counts distinct test functions
(parametrizations of one function count once). A control run of the unmutated copy comes
first and must pass, so a failure is the bug's and not the tree's.

Results are kept in a JSON state file (``--state``) keyed by bug name and definition, so an
interrupted run resumes where it stopped (``--fresh`` discards it). Progress goes to stdout.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).absolute().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from reference_mutants import BUGS, Bug  # noqa: E402

# The test subset: every CPU test of the reference, its cases and the harness's use of them.
# Left out: GPU and nvcc tests (no device here), the control sets (tests/controls, tests/mutants:
# implementations judged against the vectors, not tests of the reference), tests marked slow
# (statistical sweeps of minutes), and the harness-mechanics files below, which never call the
# reference's arithmetic (process isolation, output plumbing, CI ergonomics, fuzzing of the
# command line, the pytest plugin) and take a third of the run.
IGNORED = [
    "tests/gpu", "tests/controls", "tests/mutants",
    "tests/test_harness_isolation.py", "tests/test_harness_outputs.py", "tests/test_harness_ci.py",
    "tests/test_harness_fuzz.py", "tests/test_harness_example.py", "tests/test_plugin.py",
    "tests/test_nvcc_compile.py",
]
MARKERS = "not slow and not gpu and not nvcc"
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-m", MARKERS, "--hypothesis-seed=0"] + [
    f"--ignore={p}" for p in IGNORED]
# A test module whose import generates the cases (CASES = generate()) fails to collect when the
# bug breaks its generator; without this flag that one error would stop the whole session.
# It changes nothing for a run without collection errors, so saved results without one stay valid.
COLLECT = "--continue-on-collection-errors"


def bug_key(bug: Bug) -> str:
    return hashlib.sha256(json.dumps([bug.name, bug.file, bug.old, bug.new]).encode()).hexdigest()[:16]


def check(bugs, committed: str = "HEAD") -> list[str]:
    """Problems with the list against the file contents at ``committed``: an ``old`` that does not
    occur exactly once, a no-op, a duplicate name."""
    problems, seen = [], set()
    for b in bugs:
        if b.name in seen:
            problems.append(f"{b.name}: duplicate name")
        seen.add(b.name)
        shown = subprocess.run(["git", "show", f"{committed}:{b.file}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode:
            problems.append(f"{b.name}: {b.file} does not exist at {committed}")
            continue
        n = shown.stdout.count(b.old)
        if n != 1:
            problems.append(f"{b.name}: the old text occurs {n} times in {b.file} (must be exactly once)")
        if b.old == b.new:
            problems.append(f"{b.name}: old and new are the same")
    return problems


def copy_tree(dst: Path, rev: str, overlay=()) -> None:
    """The committed tree at ``rev`` (``git archive``: other people's uncommitted edits in the
    working tree stay out), plus ``overlay`` files copied from the working tree (trying tests
    that are not committed yet)."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
    for rel in overlay:
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, out)


def apply(bug: Bug, tree: Path) -> None:
    path = tree / bug.file
    text = path.read_text()
    n = text.count(bug.old)
    if n != 1:
        raise SystemExit(f"reference_mutation: bug {bug.name}: old text occurs {n} times in {bug.file}")
    path.write_text(text.replace(bug.old, bug.new))


def failures(junit: Path) -> list[str]:
    """Node ids (file::function[param]) of failed or errored test cases in a JUnit XML report."""
    if not junit.exists():
        return []
    out = []
    for tc in ET.parse(junit).getroot().iter("testcase"):
        if tc.find("failure") is not None or tc.find("error") is not None:
            cls, name = tc.get("classname", ""), tc.get("name", "")
            out.append(f"{cls.replace('.', '/')}.py::{name}" if cls else name)
    return out


def function_of(node: str) -> str:
    return node.split("[", 1)[0]


def run_one(bug: Bug | None, tests: list[str], timeout: float, rev: str, overlay=(), keep: bool = False,
            deselect=()) -> dict:
    """Apply ``bug`` (None: the control) to a fresh copy, regenerate, run the tests."""
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="refmut-"))
    env = {**os.environ, "PYTHONPATH": str(tmp), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    res: dict = {"name": bug.name if bug else "(control)"}
    try:
        copy_tree(tmp, rev, overlay)
        if bug:
            apply(bug, tmp)
        gen = subprocess.run([sys.executable, "-m", "conformance.cli", "generate", "--out", "vectors"], cwd=tmp,
                             env=env, capture_output=True, text=True, timeout=timeout)
        res["generate_rc"] = gen.returncode
        res["generate_tail"] = (gen.stdout + gen.stderr).strip().splitlines()[-3:]
        junit = tmp / "junit.xml"
        left = max(30.0, timeout - (time.time() - t0))
        try:
            args = [*PYTEST_ARGS, COLLECT, *(f"--deselect={d}" for d in deselect), f"--junitxml={junit}", *tests]
            pt = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=tmp,
                                env=env, capture_output=True, text=True, timeout=left)
            res["pytest_rc"] = pt.returncode
            res["summary"] = (pt.stdout.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            res["pytest_rc"] = "timeout"
            res["summary"] = f"pytest killed after {left:.0f} s"
        res["failed"] = failures(junit)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    res["functions"] = sorted({function_of(n) for n in res.get("failed", []) if "::" in n})
    res["collection_errors"] = sorted(n for n in res.get("failed", []) if "::" not in n)
    res["caught"] = res.get("generate_rc") != 0 or res.get("pytest_rc") != 0
    res["commit"] = rev
    res["seconds"] = round(time.time() - t0, 1)
    return res


def render(results: list[dict], control: dict, tests: list[str], total_s: float) -> str:
    caught = [r for r in results if r["caught"]]
    survived = [r for r in results if not r["caught"]]
    weak = [r for r in caught if len(r["functions"]) < 2]
    by_name = {b.name: b for b in BUGS}
    lines = [
        "# Reference mutation check",
        "",
        "Generated by `python tools/reference_mutation.py --out docs/reports/reference-mutation.md`",
        f"on {datetime.date.today().isoformat()} ({platform.machine()}, Python {platform.python_version()}),"
        f" at commit {control.get('commit', '?')[:10]} (the committed tree, `git archive`); {total_s / 60:.0f} minutes"
        " of runs (summed over parallel jobs).",
        "",
        "Each bug of `tools/reference_mutants.py` is applied alone to a temporary copy of the"
        " repository (its committed files), the golden vectors are regenerated there from the buggy"
        " reference (`python -m conformance.cli generate --out vectors`), and the test subset below runs"
        " against that copy. Because the vectors then agree with the bug, only hand-derived values,"
        " independent oracles, property cross-checks and known-answer tests can catch it. A bug is"
        " *caught* when pytest fails (or generation errors), and *survives* otherwise.",
        "",
        "Tests run (the same for every bug and the control):",
        "",
        f"    python -m pytest {' '.join(shlex.quote(x) for x in PYTEST_ARGS)} {COLLECT} {' '.join(tests)}",
        "",
        "that is every test file under `tests/` except the GPU/nvcc tests, the two control sets"
        " (`tests/controls`, `tests/mutants`), the harness-mechanics files that never call the"
        " reference's arithmetic (isolation, outputs, CI ergonomics, fuzz, example, plugin), and"
        " tests marked `slow`; hypothesis runs with seed 0 so the report is repeatable. A test module"
        " that cannot be collected (its import generates the cases and the bug broke the generator) is"
        " listed as a collection error and not counted as a test function.",
        f"Control (no bug): {control.get('summary', '?')} (generate rc {control.get('generate_rc')})."
        + (" Tests failing on the unmutated commit (other work in progress) are deselected for every bug: "
           + ", ".join(f"`{n}`" for n in control["failed"]) + "." if control.get("failed") else ""),
        "",
        f"**{len(results)} bugs: {len(caught)} caught, {len(survived)} survived.**"
        f" Bugs failing fewer than two distinct test functions: {len(weak)}"
        + (" (" + ", ".join(r['name'] for r in weak) + ")" if weak else "") + ".",
        "",
        "| bug | what | caught | failing test functions | failing tests (functions) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        b = by_name.get(r["name"])
        fn = r["functions"]
        shown = ", ".join(f"`{f}`" for f in fn[:6]) + (f", ... (+{len(fn) - 6})" if len(fn) > 6 else "")
        if r.get("collection_errors"):
            shown += "; collection errors: " + ", ".join(f"`{n}`" for n in r["collection_errors"])
        if r.get("generate_rc") not in (0, None):
            shown = "generate failed; " + shown
        what = (b.what if b else "").replace("|", "\\|")
        lines.append(f"| `{r['name']}` | {what} | {'yes' if r['caught'] else '**SURVIVED**'} "
                     f"| {len(fn)} | {len(r.get('failed', []))} ({shown}) |")
    lines += [
        "",
        "The guards written for this check (hand-derived values and independent oracles; none computes its"
        " expected value with the function under test):",
        "",
        "- `tests/test_guard_numerics.py`: exact half-way values for BF16, FP16 and FP32 (both signs,"
        " subnormal, the normal/subnormal boundary, the overflow edge), runs of consecutive ties, and"
        " `numerics` against single-rounding oracles (NumPy float64 -> float32/float16 casts, `ml_dtypes`"
        " bfloat16 of float32 inputs), with generated half-way and double-rounding-trap inputs.",
        "- `tests/test_guard_rng.py`: Random123 known answers on `reference.rng.philox4x32`, hand uniforms"
        " with the forced low bit visible, `word_to_uniform` by hand, the race's per-index counters, and"
        " committed exact collisions of 24-bit uniforms (seed 14: purpose 1 at position 3134, ranks 2/6;"
        " purpose 3 at 7584, tokens 6/35; purpose 4 at 8916, tokens 8/19): the lowest index wins in the"
        " race, the selector walk, the correction and the bonus.",
        "- `tests/test_guard_reference.py`: RoPE on every pair at positions up to 2^40 + 5 (directly and"
        " through context_kv), RMSNorm with eps dominating (directly, per head, through context_kv), C5"
        " orders (penalties before temperature, min-p and top-p on the tempered distribution, min-p on"
        " probabilities, min-p keeping the maxima), trees whose best path is not the best local step and"
        " the tree's tie rules (depth, parent, rank), a sibling's accept test on its own uniform, strict"
        " accept at 0 < 0, the empty residual drawing from p, selector greedy ties.",
    ]
    lines += ["", "Each bug (file, and the one line it changes):", ""]
    for r in results:
        b = by_name.get(r["name"])
        if b:
            new_line = next((ln for ln in b.new.splitlines() if ln not in b.old.splitlines()), b.new)
            lines.append(f"- `{b.name}` ({b.file}): `{new_line.strip()}`")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bugs", help="comma-separated bug names (default: all)")
    ap.add_argument("--tests", nargs="*", default=["tests"], help="test paths (default: tests)")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per bug (generate + tests)")
    ap.add_argument("--state", default=str(ROOT / "build" / "reference-mutation.json"), help="resume file")
    ap.add_argument("--jobs", type=int, default=1, help="bugs run side by side (each uses one core)")
    ap.add_argument("--fresh", action="store_true", help="ignore saved results")
    ap.add_argument("--out", help="write the markdown report here")
    ap.add_argument("--check", action="store_true", help="only check that every bug applies exactly once")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies (debugging)")
    ap.add_argument("--rev", default="HEAD", help="the commit to mutate (default: HEAD)")
    ap.add_argument("--overlay", nargs="*", default=[],
                    help="working-tree files copied over the commit (trying tests not yet committed)")
    a = ap.parse_args(argv)

    problems = check(BUGS, committed=a.rev)
    if problems:
        print("reference_mutation: the bug list does not apply to this tree:", *problems, sep="\n  ", file=sys.stderr)
        return 2
    if a.check:
        print(f"{len(BUGS)} bugs, each applies exactly once")
        return 0
    bugs = BUGS
    if a.bugs:
        names = a.bugs.split(",")
        unknown = set(names) - {b.name for b in BUGS}
        if unknown:
            print(f"reference_mutation: unknown bugs {sorted(unknown)}", file=sys.stderr)
            return 2
        bugs = [b for b in BUGS if b.name in names]

    state_path = Path(a.state)
    rev = subprocess.run(["git", "rev-parse", a.rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    sig = json.dumps([a.tests, PYTEST_ARGS, rev, a.overlay])
    state = {}
    if state_path.exists() and not a.fresh:
        saved = json.loads(state_path.read_text())
        if saved.get("sig") == sig:
            state = saved
    state["sig"] = sig
    state.setdefault("results", {})
    t0 = time.time()

    def save():
        state_path.parent.mkdir(parents=True, exist_ok=True)
        state_path.write_text(json.dumps(state, indent=1))

    if "control" not in state:
        print("control run (no bug) ...", flush=True)
        state["control"] = run_one(None, a.tests, a.timeout, rev, a.overlay, a.keep)
        save()
    control = state["control"]
    print(f"control: {control['summary']} ({control['seconds']} s)", flush=True)
    if control.get("generate_rc") != 0 or control.get("pytest_rc") not in (0, 1):
        print("reference_mutation: the unmutated tree cannot generate its vectors or run its tests:",
              *control["generate_tail"], control["summary"], sep="\n  ", file=sys.stderr)
        return 2
    # Tests that already fail on the unmutated commit (other work in progress) are deselected for
    # every bug, so that "caught" means a failure the bug caused; the report lists them.
    deselect = control["failed"]
    if deselect:
        print("failing without any bug (deselected for every bug):", *deselect, sep="\n  ", flush=True)

    lock = threading.Lock()

    def one(i_bug):
        i, bug = i_bug
        key = bug_key(bug)
        with lock:
            r = state["results"].get(key)
        if r is not None and any("::" not in n for n in r.get("failed", [])) and "collection_errors" not in r:
            r = None  # saved before COLLECT: a collection error hid the other modules' tests
        if r is None:
            print(f"[{i}/{len(bugs)}] {bug.name} ...", flush=True)
            r = run_one(bug, a.tests, a.timeout, rev, a.overlay, a.keep, deselect)
            with lock:
                state["results"][key] = r
                save()
        verdict = "caught" if r["caught"] else "SURVIVED"
        print(f"[{i}/{len(bugs)}] {bug.name}: {verdict}, {len(r['functions'])} test functions "
              f"({len(r['failed'])} tests), {r['seconds']} s", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:  # each job is a pair of subprocesses
        results = list(pool.map(one, enumerate(bugs, 1)))

    survived = [r["name"] for r in results if not r["caught"]]
    weak = [r["name"] for r in results if r["caught"] and len(r["functions"]) < 2]
    print(f"{len(results)} bugs: {len(results) - len(survived)} caught, {len(survived)} survived"
          + (f" ({', '.join(survived)})" if survived else "") + f"; fewer than two test functions: {weak or 'none'}")
    if a.out:
        total = sum(r["seconds"] for r in results) + control["seconds"]
        Path(a.out).write_text(render(results, control, a.tests, total))
        print(f"wrote {a.out}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
