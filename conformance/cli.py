"""The dflash-conformance command line.

    list      the Ops and their case counts (from the vectors' manifest when there is one)
    generate  write the golden vectors and their manifest
    verify    check the vectors: sha256 against the manifest, missing or extra files,
              and that regenerating each case gives the same bytes
    run       run an implementation over the vectors and report
    dump      run one case and write its inputs, expected and actual outputs and errors as .npy
    geometry  run an implementation at the spec's two official geometries, full width
    check-capture  judge a folder of an engine's capture files (C10), naming a failing round's first bad Op
    fuzz      property-based conformance: hypothesis strategies over every Op, failures shrunk and saved

Exit status:
  0 success
  1 a FAIL or ERROR of the implementation (run, dump, fuzz; with --require a required Op
    NOT_IMPLEMENTED; with --strict also an ACCEPTABLE or an expected failure that passes),
    or a case that cannot be generated (generate)
  2 bad usage or bad input, reported as one line on stderr naming the field or file
  3 the suite's own data is broken: a vector file missing, unreadable or not matching
    its manifest entry, or a manifest that cannot be read (run, dump, list, verify:
    every problem verify finds); one line naming the file
  130 interrupted (the reports say "complete": false and "verdict": "INCOMPLETE")
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shlex
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from conformance import CONTRACT_VERSION, GENERATOR_VERSION, registry, vectors
from conformance.vectors import InputError

CUDA_IMPL = "kernels_cu.backend:CudaBackend"
EXIT_STATUS = __doc__[__doc__.index("Exit status:"):]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump (the CLI's bad-usage rule)
        raise InputError(f"{self.prog}: {message}".splitlines()[0])

    def exit(self, status=0, message=None):  # --help: print and stop, without SystemExit reaching a caller
        if message:
            print(message, file=sys.stderr, end="")
        raise _Exit(status)


class _Exit(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


def _console(stderr=False):
    from rich.console import Console

    con = Console(stderr=stderr)
    if not con.is_terminal:  # logs and pipes: wide enough for the table, no wrapping of one-line details
        con = Console(stderr=stderr, width=max(con.width, 160))
    return con


class _Bar:
    """A rich progress bar on stderr, shown only on a terminal."""

    def __init__(self, label: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        con = _console(stderr=True)
        self.is_terminal = con.is_terminal
        self._p = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("{task.description}"), console=con, transient=True,
                           disable=not con.is_terminal)
        self._task = None

    def __enter__(self):
        self._p.__enter__()
        return self

    def __exit__(self, *exc):
        return self._p.__exit__(*exc)

    def __call__(self, done: int, total: int, what: str) -> None:
        if self._task is None:
            self._task = self._p.add_task(what, total=total)
        self._p.update(self._task, completed=done, description=what)

    def print(self, line: str) -> None:
        if self.is_terminal:
            self._p.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, flush=True)


class _Live:
    """Progress while a run goes: every FAIL/ERROR as it happens (a detail shared by many
    cases is shown three times, then counted) and, when stdout is not a terminal (CI
    logs), one line per finished Op."""

    PER_DETAIL = 3

    def __init__(self, bar: _Bar, total: int):
        self.bar, self.total = bar, total
        self.done = 0
        # an Op's time runs from the previous result (its first case started then) to its own last result
        self.op, self.op_results, self.op_start = None, [], time.monotonic()
        self.last = self.op_start
        self.seen = Counter()
        self.plain = not sys.stdout.isatty()

    def result(self, r) -> None:
        from conformance import report

        if self.op is not None and r.op != self.op:
            self.finish_op()
        if self.op is None:
            self.op, self.op_start = r.op, self.last
        self.op_results.append(r)
        self.last = time.monotonic()
        self.done += 1
        if r.result.failed:
            key = (r.result, r.detail)
            self.seen[key] += 1
            if self.seen[key] <= self.PER_DETAIL:
                self.bar.print(report.failure_line(r))
            elif self.seen[key] == self.PER_DETAIL + 1:
                self.bar.print(f"(more {r.result.name} with this detail are counted, not printed: {r.detail})")

    def finish_op(self) -> None:
        from conformance import report

        if self.op is not None and self.plain:
            parts = [p for p in report.totals_parts(self.op_results) if not p.startswith("0 ")]
            print(f"[{self.done}/{self.total}] {self.op}: {len(self.op_results)} cases: {', '.join(parts)} "
                  f"({self.last - self.op_start:.1f} s)", flush=True)
        self.op, self.op_results = None, []

    def counted(self) -> list[str]:
        """For each detail shown PER_DETAIL times: how many more cases had it."""
        return [f"... and {n - self.PER_DETAIL} more {res.name} with the same detail: {detail}"
                for (res, detail), n in self.seen.items() if n > self.PER_DETAIL]


def _specs(args):
    return args.specs if args.specs is not None else registry.ops()


def _cmd_list(args) -> int:
    specs = _specs(args)
    try:
        root = Path(args.vectors) if args.vectors else vectors.default_dir()
    except InputError as exc:  # no vectors anywhere (an installed package): the generators still count
        root, no_vectors = None, str(exc)
    if root is None:
        counts = _generated_counts(specs)
        print(f"case counts from running the generators (no vectors: "
              f"{no_vectors.split(';')[0].removeprefix('vectors: ')})")
    elif args.vectors and not root.is_dir():  # as run and verify: a named directory that is absent is bad input
        raise InputError(f"--vectors: no directory {root}")
    elif (root / vectors.MANIFEST).is_file():
        counts = Counter(e["op"] for e in vectors.read_manifest(root)["files"])
        print(f"case counts from {root / vectors.MANIFEST}")
    elif args.vectors:
        raise InputError(f"--vectors: no {vectors.MANIFEST} in {root} (run dflash-conformance generate)")
    else:
        counts = _generated_counts(specs)
        print(f"case counts from running the generators (no {vectors.MANIFEST} in {root})")
    for name in sorted(set(specs) | set(counts)):
        doc = specs[name].doc.splitlines()[0] if name in specs and specs[name].doc else ""
        if name not in specs:
            doc = "(in the vectors, not registered)"
        print(f"{name}\t{counts.get(name, 0)}\t{doc}")
    return 0


def _generated_counts(specs) -> Counter:
    from conformance.generate import cases_of

    return Counter({name: len(cases_of(spec)) for name, spec in specs.items()})


def _cmd_generate(args) -> int:
    from conformance.generate import generate

    out = Path(args.out) if args.out else vectors.default_dir(for_writing=True)
    with _Bar("generate") as bar:
        written, errors = generate(out, _specs(args), args.ops, bar)
    for line in errors:
        print(line, file=sys.stderr)
    if errors:
        print(f"{len(errors)} case(s) could not be generated; {out / vectors.MANIFEST} left unchanged",
              file=sys.stderr)
        return 1
    print(f"wrote {written} vector file(s) and {out / vectors.MANIFEST}")
    return 0


def _unreadable(root: Path, entries: list[dict]) -> dict[str, str]:
    """case id -> why, for listed files that cannot be read or parsed although their sha256
    matches (an edited manifest): generate.verify stops at such a file, so they are found first."""
    bad = {}
    for e in entries:
        path = root / e["path"]
        if not path.exists():
            continue  # verify reports it as missing
        try:
            data = path.read_bytes()
        except OSError as exc:
            bad[e["case"]] = f"{path}: cannot be read: {exc.strerror or exc}"
            continue
        if vectors.sha256(data) != e["sha256"]:
            continue  # verify reports the sha256
        try:
            vec = vectors.parse_vector(data, str(path))
            import json

            if not isinstance(vec.bounds, dict) or not all(isinstance(v, dict) for v in vec.bounds.values()):
                raise InputError(f"{path}: bad header metadata (bounds)")
            json.loads(vectors.decode(data, str(path))[1]["bounds"])
        except InputError as exc:
            bad[e["case"]] = str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever else a damaged file does, it is that file's problem
            bad[e["case"]] = f"{path}: not a readable vector ({type(exc).__name__}: {exc})".splitlines()[0]
    return bad


def _verify_all(root: Path, specs, pattern, bar, strict: bool, notes: list) -> list[str]:
    """generate.verify, but every problem is listed: unreadable files are found first and the
    rest is verified without them."""
    from conformance.generate import verify

    manifest = vectors.read_manifest(root)
    entries = manifest["files"]
    if pattern is not None:
        chosen = set(vectors.select(pattern, [e["case"] for e in entries], str(root / vectors.MANIFEST)))
        entries = [e for e in entries if e["case"] in chosen]
    bad = _unreadable(root, entries)
    problems = list(bad.values())
    good = [e["case"] for e in entries if e["case"] not in bad]
    if bad:
        listed = {(root / e["path"]).resolve() for e in manifest["files"]}
        if pattern is None:
            problems += [f"{p}: not listed in {vectors.MANIFEST}" for p in sorted(root.rglob(f"*{vectors.SUFFIX}"))
                         if p.resolve() not in listed]
        pattern = ",".join(good)
        if not good:
            return problems
    try:
        problems += verify(root, specs, pattern, bar, strict=strict, notes=notes)
    except InputError as exc:
        problems.append(str(exc))
    except OSError as exc:
        problems.append(f"{exc.filename or root}: {exc.strerror or exc}")
    except Exception as exc:  # noqa: BLE001 - one more line, never a traceback
        problems.append(f"{root}: verify stopped: {type(exc).__name__}: {exc}".splitlines()[0])
    return problems


def _cmd_verify(args) -> int:
    root = Path(args.vectors) if args.vectors else vectors.default_dir()
    notes: list[str] = []
    with _Bar("verify") as bar:
        problems = _verify_all(root, _specs(args), args.ops, bar, args.strict, notes)
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s) in {root}", file=sys.stderr)
        return vectors.DATA_ERROR_EXIT
    if notes:
        for line in notes:
            print(line)
        print(f"{root}: every file matches {vectors.MANIFEST} and regenerates; {len(notes)} differ only in "
              "platform float noise (bounds derived on this BLAS, last bits of margins; --strict refuses that)")
        return 0
    print(f"{root}: every file matches {vectors.MANIFEST} and regenerates byte for byte")
    return 0


def _default_impl(specs):
    """(implementation, why): the CUDA backend where CuPy and a GPU are present, else the baseline."""
    from conformance.worker import default_impl

    return default_impl(specs)


def _add_reference_backend(s) -> None:
    s.add_argument("--reference-backend", choices=["numpy", "cupy"], default="numpy",
                   help="the array module the float64 reference, its float32 baseline and its magnitudes run on "
                        "(numpy, the reference of record; cupy: float64 on the GPU, same decisions and represented "
                        "outputs within float64 summation noise)")


def _reference_backend(args):
    """The reference backend the command asked for, selected for a with block; a one-line InputError
    when it cannot run here (no CuPy, no GPU)."""
    from reference import backend

    try:
        mod = backend.load(getattr(args, "reference_backend", None) or "numpy")
    except backend.BackendError as exc:
        raise InputError(f"--reference-backend {exc}") from None
    return backend.use(mod)


def _seconds(opt: str, value: float | None) -> float | None:
    """A positive number of seconds; inf means no limit (None)."""
    if value is None:
        return None
    if not value > 0:
        raise InputError(f"{opt}: must be a positive number of seconds (or inf), got {value}")
    return None if math.isinf(value) else value


def _shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    i, sep, n = text.partition("/")
    try:
        i, n = int(i), int(n)
    except ValueError:
        i = n = 0
    if not sep or not 1 <= i <= n:
        raise InputError(f"--shard: expected i/n with 1 <= i <= n (e.g. 2/4), got {text!r}")
    return i, n


def _rerun(args, case_id: str, command: str = "run") -> str:
    parts = ["dflash-conformance", command]
    if getattr(args, "impl", None):
        parts += ["--impl", args.impl]
    if getattr(args, "vectors", None):
        parts += ["--vectors", args.vectors]
    if getattr(args, "in_process", False):
        parts.append("--in-process")
    if getattr(args, "timeout", 60.0) not in (60.0, None):
        parts += ["--timeout", f"{args.timeout:g}"]
    parts += ["--ops", case_id]
    return shlex.join(parts)


def _open_impl(args, ops=()):
    """(handle, display name), printing which implementation and why. In a worker process
    unless --in-process."""
    from conformance import runner

    isolate = not getattr(args, "in_process", False)
    handle = runner.open_impl(args.impl, isolate, args.specs, ops=ops)
    name = handle.name if isolate else runner.impl_name(handle.impl, args.impl)
    where = "" if isolate else ", in-process"
    if args.impl:
        print(f"implementation: {name} ({args.impl}{where})", flush=True)
    else:
        print(f"implementation: {name} [{handle.why}{where}]", flush=True)
    return handle, name


def _require(args, manifest) -> list[str]:
    globs = vectors.split_globs(args.require)
    if args.require is not None and not globs:
        raise InputError("--require: empty; name the Ops that must be implemented (comma-separated globs)")
    ops = sorted({e["op"] for e in manifest["files"]})
    import fnmatch

    for g in globs:
        if not any(fnmatch.fnmatchcase(op, g) for op in ops):
            raise InputError(f"--require: {g!r} matches no Op in the vectors ({', '.join(ops)})")
    return globs


def _cmd_run(args) -> int:
    import fnmatch

    from conformance import expect, report, runner
    from conformance.compare import Result

    timeout = _seconds("--timeout", args.timeout)
    deadline = _seconds("--deadline", args.deadline)
    shard = _shard(args.shard)
    for opt, value in (("--require", args.require), ("--expect", args.expect)):
        if args.in_process and value is not None:  # os._exit(0) in-process would end a CI gate with exit 0
            raise InputError(f"--in-process cannot be combined with {opt}: a gate needs the worker process, where an "
                             "implementation that exits or crashes is an ERROR, not the end of the run")
    root = Path(args.vectors) if args.vectors else vectors.default_dir()
    manifest, entries = runner.load_selection(root, args.ops)  # before anything runs: bad selection 2, bad manifest 3
    required = _require(args, manifest)
    expectations = expect.load(args.expect) if args.expect else []
    if shard:
        entries = runner.shard(entries, *shard)
    written_by = (manifest.get("generator_version"), manifest.get("contract_version"))
    if written_by != (GENERATOR_VERSION, CONTRACT_VERSION):
        print(f"warning: {root / vectors.MANIFEST} was written by generator/contract {written_by[0]}/{written_by[1]}, "
              f"this package is {GENERATOR_VERSION}/{CONTRACT_VERSION}", file=sys.stderr)
    command = "dflash-conformance " + " ".join(shlex.quote(a) for a in args.argv)
    try:
        sha = vectors.sha256((root / vectors.MANIFEST).read_bytes())
    except OSError as exc:
        raise InputError(f"{root / vectors.MANIFEST}: {exc.strerror or exc}") from None
    run_info = {"isolated": not args.in_process, "timeout": timeout, "deadline": deadline,
                "shard": args.shard, "ops": args.ops, "require": required, "expect": args.expect,
                "strict": args.strict}
    sink = report.Reports(args.json, args.junit, "", report.environment(None, command), root, manifest, sha,
                          len(entries), run_info, args.strict)
    sink.check()  # before any case: a report path that cannot be written is found now
    if getattr(args, "html", None):
        from conformance.diagnosis import picture

        if not picture.have_matplotlib():
            print(f"error: --html: {picture.EXTRA}", file=sys.stderr)
            return 2
    handle, name = _open_impl(args, ops=sorted({e["op"] for e in entries}))
    sink.implementation = name
    previous = signal.signal(signal.SIGTERM, _terminate) if _main_thread() else None
    complete = False
    results = []
    try:
        sink.env = report.environment(None, command, handle.environment())
        sink.write(False)
        with _Bar("run") as bar:
            live = _Live(bar, len(entries))

            def on_result(r):
                if r.result == Result.NOT_IMPLEMENTED and any(fnmatch.fnmatchcase(r.op, g) for g in required):
                    r.result, r.detail = Result.ERROR, f"required (--require) but NOT_IMPLEMENTED: {r.detail}"
                r.expected_failure = expect.reason_for(expectations, r.case) if expectations else None
                if r.result.failed:
                    r.rerun = _rerun(args, r.case)
                results.append(r)
                sink.add(r)
                live.result(r)

            runner.run_suite(handle, root, progress=bar, timeout=timeout, specs=args.specs, deadline_s=deadline,
                             on_result=on_result, entries=entries, diagnose=getattr(args, "diagnose", True))
            live.finish_op()
        complete = not any(r.detail.startswith("not run: the overall deadline") for r in results)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        handle.close()
        try:
            sink.close(complete)
        except OSError as exc:
            print(f"error: cannot write a report: {exc.strerror or exc}", file=sys.stderr)
    if getattr(args, "html", None):
        from conformance.diagnosis.html import write_html

        try:
            write_html(args.html, results, name, complete, args.strict)
        except OSError as exc:
            print(f"error: cannot write {args.html}: {exc.strerror or exc}", file=sys.stderr)
    notes = _run_notes(results, expectations, manifest, args, deadline) + live.counted()
    report.print_table(results, name, _console(), failures=False, strict=args.strict, notes=notes,
                       complete=complete)  # the failures were printed as they happened
    if report.bad_vectors(results):
        return vectors.DATA_ERROR_EXIT
    return 1 if report.failed(results, args.strict) else 0


def _run_notes(results, expectations, manifest, args, deadline) -> list[str]:
    from conformance import expect
    from conformance.compare import Result

    notes = []
    if expectations:
        xfail = [r for r in results if r.expected_failure and r.result.failed]
        xpass = [r for r in results if r.expected_failure and r.result in (Result.PASS, Result.ACCEPTABLE)]
        notes.append(f"expectations ({args.expect}): {len(xfail)} expected failure(s), {len(xpass)} unexpected "
                     f"pass(es){' (--strict: the run fails)' if xpass and args.strict else ''}")
        notes += [f"UNEXPECTED PASS {r.case} (listed: {r.expected_failure}): "
                  f"{expect.unexpected_pass_advice(expectations, r.case, args.expect)}" for r in xpass]
        notes += [f"stale expectation {args.expect}:{e.line}: {e.pattern!r} matches no case in the vectors"
                  for e in expect.stale(expectations, [e["case"] for e in manifest["files"]])]
    missing = Counter(r.op for r in results if r.detail.startswith("required (--require)"))
    notes += [f"REQUIRED {op}: NOT_IMPLEMENTED in {n} case(s) (--require {args.require})" for op, n in missing.items()]
    skipped = sum(r.detail.startswith("not run: the overall deadline") for r in results)
    if skipped:
        notes.append(f"DEADLINE: {skipped} case(s) not run: --deadline {deadline:g} s reached; the reports are "
                     "marked incomplete")
    if args.strict:
        acc = sum(r.result == Result.ACCEPTABLE for r in results)
        if acc:
            notes.append(f"--strict: {acc} ACCEPTABLE case(s) fail the run")
    if getattr(args, "diagnose", False):
        from conformance.diagnose import summary_text

        text = summary_text(results)
        if text:
            notes += text.splitlines()
    return notes


def _terminate(signum, frame):
    raise KeyboardInterrupt


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _choose_impl(args):
    """(implementation, display name) for --impl or the default, in this process (geometry)."""
    from conformance import runner

    if args.impl:
        impl = runner.load_impl(args.impl)
        print(f"implementation: {runner.impl_name(impl, args.impl)} ({args.impl})")
        return impl, runner.impl_name(impl, args.impl)
    impl, why = _default_impl(args.specs)
    print(f"implementation: {runner.impl_name(impl)} [{why}]")
    return impl, runner.impl_name(impl)


def _cmd_dump(args) -> int:
    from conformance import dump, runner

    timeout = _seconds("--timeout", args.timeout)
    root = Path(args.vectors) if args.vectors else vectors.default_dir()
    manifest = vectors.read_manifest(root)
    by_case = {e["case"]: e for e in manifest["files"]}
    if args.case not in by_case:
        near = [c for c in by_case if c.startswith(args.case.split("/")[0] + "/")][:5]
        hint = f"; cases of that Op include {', '.join(near)}" if near else ""
        raise InputError(f"dump: no case {args.case!r} in {root / vectors.MANIFEST}{hint}")
    vec = runner.read_entry(root, by_case[args.case])
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out: cannot create {out}: {exc.strerror or exc}") from None
    handle, _name = _open_impl(args, ops=[vec.op])
    try:
        res, lines = dump.dump(handle, vec, out, timeout, _specs(args).get(vec.op))
    finally:
        handle.close()
    from conformance import report

    for line in lines:
        print(line)
    print(report.failure_line(res))  # as run prints it: the diagnosis of a FAIL included
    print(f"wrote {out}")
    return 1 if res.result.failed else 0


def _cmd_geometry(args) -> int:
    from conformance import geometry, report

    unknown = [g for g in args.geometry if g not in geometry.GEOMETRIES]
    if unknown:
        raise InputError(f"--geometry: unknown {unknown[0]!r}; known: {', '.join(geometry.GEOMETRIES)}")
    bad = [n for n in args.batch if not 1 <= n <= 8] + [n for n in args.width if not 2 <= n <= 16]
    if bad or args.context < 1:
        raise InputError(f"--batch/--width/--context: B must be 1..8, W 2..16 (K 1..15), context >= 1; got {bad}")
    if args.jobs < 1:
        raise InputError(f"--jobs: at least 1, got {args.jobs}")
    where = f"generated in memory: {', '.join(args.geometry)}, B {args.batch}, W {args.width}, context {args.context}"
    _reference_backend(args)  # a backend that cannot run: one error before anything runs (not one per part)
    if args.jobs > 1:
        return _geometry_jobs(args, where)
    impl, name = _choose_impl(args)
    env = report.environment(impl, "dflash-conformance " + " ".join(args.argv))

    def save(results):  # after every case, so a run cut short still leaves its report
        if args.json:
            report.write_json(Path(args.json), results, name, env, where, {}, "", complete=False)

    with _reference_backend(args):
        results = geometry.run(impl, args.geometry, args.batch, args.width, args.context, args.reduced,
                               log=lambda line: print(line, flush=True), on_result=save, ops=args.ops)
    if args.json:
        report.write_json(Path(args.json), results, name, env, where, {}, "", complete=True)
    if not args.part:  # a part of a --jobs run: the parent prints the merged table
        report.print_table(results, name, _console())
    return 1 if report.failed(results) else 0


def _geometry_jobs(args, where: str) -> int:
    """geometry --jobs N: the parts (geometry.parts) as N processes at once, merged (conformance/geometry_jobs.py)."""
    from conformance import geometry, geometry_jobs, report

    # a process per geometry where the jobs allow no more (each part draws its weights and warms its kernels once)
    parts = geometry.parts(args.geometry, args.batch, args.width, args.ops,
                           per_geometry=args.jobs <= len(args.geometry))
    print(f"{len(parts)} parts, {min(args.jobs, len(parts))} at once: "
          + ", ".join(geometry_jobs.label(p) for p in parts), flush=True)
    results, name, part_env = geometry_jobs.run(parts, args.jobs, impl=args.impl, context=args.context,
                                                reduced=args.reduced, log=lambda line: print(line, flush=True),
                                                reference_backend=args.reference_backend)
    name = name or (args.impl or "default implementation")
    if args.json:  # the parts' environment (the implementation's record), this command, the parts
        env = {**part_env, **report.environment(None, "dflash-conformance " + " ".join(args.argv),
                                                {"geometry_parts": parts, "jobs": args.jobs})}
        report.write_json(Path(args.json), results, name, env, where, {}, "", complete=True)
    report.print_table(results, name, _console())
    return 1 if report.failed(results) else 0


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dflash-conformance", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    vec_help = "vectors directory (default: $DFLASH_VECTORS, ./vectors with a manifest, else the checkout's vectors/)"
    ops_help = "comma-separated fnmatch globs, each matched against the Op name and the case id"
    impl_help = (f"implementation object, class or factory (default: {CUDA_IMPL} with a GPU, else the float32 "
                 "baseline)")
    s = sub.add_parser("list", help="list the registered Ops and their case counts",
                       description="The registered Ops and their case counts: from the vectors' manifest, or, "
                                   "without vectors, from the case generators. A --vectors directory that is "
                                   "absent or has no manifest is bad input (exit 2).",
                       epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--vectors", help=vec_help)
    s.set_defaults(func=_cmd_list)
    s = sub.add_parser("generate", help="write the golden vectors and manifest")
    s.add_argument("--out", help="output directory (default: as --vectors)")
    s.add_argument("--ops", metavar="PATTERN", help=ops_help + "; other Ops' manifest entries are kept")
    s.set_defaults(func=_cmd_generate)
    s = sub.add_parser("verify", help="check sha256, missing/extra files and byte-identical regeneration",
                       epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--vectors", help=vec_help)
    s.add_argument("--ops", metavar="PATTERN", help=ops_help)
    s.add_argument("--strict", action="store_true",
                   help="regeneration must be byte-identical on any platform (the vectors are built to be: "
                        "contract C8); the default also accepts a difference in the derived bounds and float64 "
                        "margins only, listed as platform float noise")
    s.set_defaults(func=_cmd_verify)
    s = sub.add_parser("run", help="run an implementation over the vectors", epilog=EXIT_STATUS,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--impl", metavar="package.module:attribute", help=impl_help)
    s.add_argument("--vectors", help=vec_help)
    s.add_argument("--ops", metavar="PATTERN", help=ops_help)
    s.add_argument("--json", metavar="FILE", help="write a JSON report (rewritten as results arrive)")
    s.add_argument("--junit", metavar="FILE", help="write a JUnit XML report (rewritten as results arrive)")
    s.add_argument("--timeout", metavar="S", type=_float, default=60.0,
                   help="per-case limit in seconds (60; inf: none); the worker is killed when it passes")
    s.add_argument("--deadline", metavar="S", type=_float, default=None,
                   help="overall limit in seconds for the whole run (the per-case limit is --timeout; this is not "
                        "the per-example limit that fuzz --deadline sets): cases not run by then are ERRORs "
                        "'not run', counted as NOT_RUN, and the reports incomplete")
    s.add_argument("--in-process", action="store_true",
                   help="call the implementation in this process (no worker: faster to start, but a crash or "
                        "exit ends the run, even with exit status 0, and a hang in C code cannot be stopped; "
                        "refused with --require and --expect)")
    s.add_argument("--require", metavar="OPS",
                   help="comma-separated globs of Op names that must be implemented (NOT_IMPLEMENTED fails the run)")
    s.add_argument("--expect", metavar="FILE", help="known failures: lines of '<case id or glob> <reason>'")
    s.add_argument("--strict", action="store_true",
                   help="also fail on ACCEPTABLE and on an expected failure that now passes")
    s.add_argument("--shard", metavar="I/N", help="run shard I of N (a deterministic split by case id)")
    s.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=True,
                   help="name, for every FAIL, the catalog pitfalls whose one-bug reference reproduces it, with "
                        "ranked hypotheses where none does (default: on)")
    s.add_argument("--html", metavar="FILE",
                   help="write a one-file HTML report: the per-Op table, each FAIL's diagnosis and a picture of "
                        "|error| / allowance for the first FAILs (needs the [report] extra: matplotlib)")
    s.set_defaults(func=_cmd_run)
    s = sub.add_parser("dump", help="run one case and write inputs, expected, actual and per-element error as .npy",
                       epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("case", help="the case id, e.g. draft_attention/window_le_S")
    s.add_argument("--impl", metavar="package.module:attribute", help=impl_help)
    s.add_argument("--vectors", help=vec_help)
    s.add_argument("--out", required=True, metavar="DIR", help="directory to write (created)")
    s.add_argument("--timeout", metavar="S", type=_float, default=60.0, help="per-case limit in seconds (60)")
    s.add_argument("--in-process", action="store_true", help="as for run")
    s.set_defaults(func=_cmd_dump)
    s = sub.add_parser("geometry", help="run an implementation at the spec's official geometries, full width")
    s.add_argument("--impl", metavar="package.module:attribute", help="as for run")
    s.add_argument("--geometry", nargs="+", default=["dflash-35b-a3b", "dflash2-27b"],
                   help="dflash-35b-a3b and/or dflash2-27b (default both)")
    s.add_argument("--batch", nargs="+", type=int, default=[1, 8], help="batch sizes B (default 1 8)")
    s.add_argument("--width", nargs="+", type=int, default=[8, 16], help="block widths W = K+1 (default 8 16)")
    s.add_argument("--context", type=int, default=4096, help="context positions F (default 4096)")
    s.add_argument("--reduced", action="store_true", help="same structure at a small size (a quick check)")
    s.add_argument("--ops", nargs="+", choices=["context_kv", "masked_block", "proposal_head", "candidate_topk",
                   "candidate_selector"], help="run only these Ops (the proposal path always runs masked_block)")
    s.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="run the parts (one per geometry and B, W) as N processes at once, each with 1/N of the "
                        "cores for its BLAS threads, and merge their reports (default 1: one process)")
    s.add_argument("--part", action="store_true", help=argparse.SUPPRESS)  # a part of a --jobs run: no table
    _add_reference_backend(s)
    s.add_argument("--json", metavar="FILE", help="write a JSON report")
    s.set_defaults(func=_cmd_geometry)
    s = sub.add_parser("check-capture", help="judge a folder of capture files (C10) against the reference")
    s.add_argument("folder", help="a folder of capture .safetensors files (conformance.capture)")
    _add_reference_backend(s)
    s.set_defaults(func=_cmd_check_capture)
    _add_fuzz_parser(sub, impl_help).set_defaults(func=_cmd_fuzz)
    return p


FUZZ_OUT = "fuzz-failures"


def _add_fuzz_parser(sub, impl_help: str):
    s = sub.add_parser("fuzz", help="property-based conformance: hypothesis strategies over every Op's parameters, "
                                    "a failure shrunk, saved as a vector and reported with its rerun command")
    s.add_argument("--impl", metavar="package.module:attribute", help=impl_help)
    s.add_argument("--ops", metavar="PATTERN", help="comma-separated fnmatch globs over Op names (default: every Op)")
    s.add_argument("--max-examples", type=int, default=100, metavar="N", help="examples per Op (100)")
    s.add_argument("--seed", type=int, default=None, metavar="S",
                   help="the search's seed (default: a random one, printed); the same seed gives the same examples")
    s.add_argument("--deadline", metavar="SECONDS", type=_float, default=60.0,
                   help="per-example limit for the implementation in seconds, as run's --timeout (60; inf: none): the worker "
                        "is killed; the overall limit is --budget (run --deadline, by contrast, limits the whole run)")
    s.add_argument("--budget", metavar="MINUTES", type=_float, default=None,
                   help="overall limit in minutes: no example starts after it (the Ops not reached say so)")
    s.add_argument("--out", metavar="DIR", default=FUZZ_OUT,
                   help=f"where shrunk failures are written as vectors with a manifest ({FUZZ_OUT}); "
                        "`run --vectors DIR` replays them")
    s.add_argument("--in-process", action="store_true", help="as for run")
    s.add_argument("--strict", action="store_true", help="also count ACCEPTABLE as a failure (as run --strict)")
    s.add_argument("--diagnose", action="store_true", default=True, help=argparse.SUPPRESS)
    s.add_argument("--no-diagnose", dest="diagnose", action="store_false",
                   help="do not name catalog pitfalls for a shrunk FAIL")
    _add_reference_backend(s)
    return s


def _cmd_fuzz(args, log=print) -> int:
    """``dflash-conformance fuzz``: exit 0 (no failure), 1 (a FAIL or ERROR; --strict: also ACCEPTABLE), 2 bad
    input (an InputError, as for every command)."""
    from conformance import fuzz  # hypothesis is needed only when this command runs

    if not fuzz.HAVE_HYPOTHESIS:
        raise InputError(fuzz.MISSING)
    specs = args.specs if args.specs is not None else registry.ops()
    ops = fuzz.select_ops(args.ops, specs)
    if args.max_examples < 1:
        raise InputError(f"--max-examples: must be at least 1, got {args.max_examples}")
    if args.budget is not None and not args.budget > 0:
        raise InputError(f"--budget: must be a positive number of minutes, got {args.budget}")
    timeout = _seconds("--deadline", args.deadline)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    out = Path(args.out)
    handle, _ = _open_impl(args, ops=ops)

    def rerun(f) -> str:
        parts = ["dflash-conformance", "run"] + (["--impl", args.impl] if args.impl else [])
        parts += ["--vectors", str(out), "--ops", f.case.id]
        again = ["dflash-conformance", "fuzz"] + (["--impl", args.impl] if args.impl else [])
        again += ["--ops", f.op, "--seed", str(seed), "--max-examples", str(args.max_examples)]
        return f"{shlex.join(parts)}   (or the whole search: {shlex.join(again)})"

    log(f"fuzz: {len(ops)} Op(s), up to {args.max_examples} examples each, seed {seed}"
        + (f", budget {args.budget:g} min" if args.budget else "") + f"; shrunk failures go to {out}/")
    try:
        with _reference_backend(args):
            runs = fuzz.run(handle, ops=ops, max_examples=args.max_examples, seed=seed, timeout=timeout,
                            budget_s=args.budget * 60 if args.budget else None, specs=specs, out=out, log=log,
                            diagnose=args.diagnose, rerun=rerun, strict=args.strict)
    finally:
        handle.close()
    return 1 if any(r.found is not None for r in runs) else 0


def _cmd_check_capture(args) -> int:
    from conformance import capture

    with _reference_backend(args):
        return capture.main(args.folder)


def main(argv=None, specs=None) -> int:
    """Entry point. ``specs`` replaces the registry (tests use it for a toy Op)."""
    try:
        args = build_parser().parse_args(argv)
        args.specs = specs
        args.argv = list(sys.argv[1:] if argv is None else argv)
        return args.func(args)
    except _Exit as exc:
        return exc.status
    except vectors.DataError as exc:
        print(f"error: {str(exc).splitlines()[0] if str(exc) else 'broken suite data'}", file=sys.stderr)
        return vectors.DATA_ERROR_EXIT
    except InputError as exc:
        print(f"error: {str(exc).splitlines()[0] if str(exc) else 'bad input'}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted (the reports written so far are marked incomplete)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed (| head): nothing more to say
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the interpreter's final flush is quiet
        except OSError:
            pass
        return 1
    except OSError as exc:  # a file the command needed: bad input, not a harness bug
        where = exc.filename or "a file"
        print(f"error: {where}: {exc.strerror or exc}".splitlines()[0], file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the CLI never shows a traceback unless asked
        if os.environ.get("DFLASH_TRACEBACK"):
            traceback.print_exc()
        if type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError):  # CuPy, torch or the host
            print(f"error: out of memory ({type(exc).__name__}: {exc})".splitlines()[0] + "; with --jobs N, fewer "
                  "processes share the device (--jobs 1), or --reference-backend numpy keeps the reference off the GPU",
                  file=sys.stderr)
            return 2
        print(f"error: internal error (a bug of dflash-conformance, please report it): {type(exc).__name__}: {exc}"
              .splitlines()[0] + " (DFLASH_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
