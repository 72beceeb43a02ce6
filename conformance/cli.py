"""The dflash-conformance command line.

    list      the Ops and their case counts (from the vectors' manifest when there is one)
    generate  write the golden vectors and their manifest
    verify    check the vectors: sha256 against the manifest, missing or extra files,
              and that regenerating each case gives the same bytes
    run       run an implementation over the vectors and report
    geometry  run an implementation at the spec's two official geometries, full width

Exit status: 0 success; 1 a FAIL or ERROR (run), a bad vector file (verify) or a case
that cannot be generated (generate); 2 bad usage or bad input, reported as one line
on stderr naming the field or file.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections import Counter
from pathlib import Path

from conformance import CONTRACT_VERSION, GENERATOR_VERSION, registry, vectors
from conformance.vectors import InputError

CUDA_IMPL = "kernels_cu.backend:CudaBackend"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump (the CLI's bad-usage rule)
        raise InputError(f"{self.prog}: {message}")


def _console(stderr=False):
    from rich.console import Console

    con = Console(stderr=stderr)
    if not con.is_terminal:  # logs and pipes: wide enough for the table, no wrapping of one-line details
        con = Console(stderr=stderr, width=max(con.width, 140))
    return con


class _Bar:
    """A rich progress bar on stderr, shown only on a terminal."""

    def __init__(self, label: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        con = _console(stderr=True)
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


def _specs(args):
    return args.specs if args.specs is not None else registry.ops()


def _cmd_list(args) -> int:
    specs = _specs(args)
    root = Path(args.vectors) if args.vectors else vectors.default_dir()
    if (root / vectors.MANIFEST).is_file():
        counts = Counter(e["op"] for e in vectors.read_manifest(root)["files"])
        print(f"case counts from {root / vectors.MANIFEST}")
    else:
        from conformance.generate import cases_of

        counts = Counter({name: len(cases_of(spec)) for name, spec in specs.items()})
        print(f"case counts from running the generators (no {vectors.MANIFEST} in {root})")
    for name in sorted(set(specs) | set(counts)):
        doc = specs[name].doc.splitlines()[0] if name in specs and specs[name].doc else ""
        if name not in specs:
            doc = "(in the vectors, not registered)"
        print(f"{name}\t{counts.get(name, 0)}\t{doc}")
    return 0


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


def _cmd_verify(args) -> int:
    from conformance.generate import verify

    root = Path(args.vectors) if args.vectors else vectors.default_dir()
    notes: list[str] = []
    with _Bar("verify") as bar:
        problems = verify(root, _specs(args), args.ops, bar, strict=args.strict, notes=notes)
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s) in {root}", file=sys.stderr)
        return 1
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
    from conformance.baseline import Float32Baseline

    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
        from conformance.runner import load_impl

        return load_impl(CUDA_IMPL), f"no --impl: CuPy and a GPU are present, so {CUDA_IMPL}"
    except Exception as exc:  # noqa: BLE001 - any reason the GPU path is unusable selects the baseline, and is said
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return Float32Baseline(specs), f"no --impl and the CUDA backend is unavailable ({why}), so the float32 baseline"


def _cmd_run(args) -> int:
    from conformance import report, runner

    if args.timeout is not None and not args.timeout > 0:
        raise InputError(f"--timeout: must be a positive number of seconds, got {args.timeout}")
    root = Path(args.vectors) if args.vectors else vectors.default_dir()
    manifest, _ = runner.load_selection(root, args.ops)  # bad vectors or selection: exit 2 before anything runs
    written_by = (manifest.get("generator_version"), manifest.get("contract_version"))
    if written_by != (GENERATOR_VERSION, CONTRACT_VERSION):
        print(f"warning: {root / vectors.MANIFEST} was written by generator/contract {written_by[0]}/{written_by[1]}, "
              f"this package is {GENERATOR_VERSION}/{CONTRACT_VERSION}", file=sys.stderr)
    impl, name = _choose_impl(args)
    with _Bar("run") as bar:
        results = runner.run_suite(impl, root, args.ops, bar, args.timeout, args.specs)
    if args.json:
        sha = vectors.sha256((root / vectors.MANIFEST).read_bytes())
        command = "dflash-conformance " + " ".join(args.argv)
        report.write_json(Path(args.json), results, name, report.environment(impl, command), root, manifest, sha)
    if args.junit:
        report.write_junit(Path(args.junit), results, name)
    report.print_table(results, name, _console())
    return 1 if report.failed(results) else 0


def _choose_impl(args):
    """(implementation, display name) for --impl or the default, printing which and why."""
    from conformance import runner

    if args.impl:
        impl = runner.load_impl(args.impl)
        print(f"implementation: {runner.impl_name(impl, args.impl)} ({args.impl})")
        return impl, runner.impl_name(impl, args.impl)
    impl, why = _default_impl(args.specs)
    print(f"implementation: {runner.impl_name(impl)} [{why}]")
    return impl, runner.impl_name(impl)


def _cmd_geometry(args) -> int:
    from conformance import geometry, report

    unknown = [g for g in args.geometry if g not in geometry.GEOMETRIES]
    if unknown:
        raise InputError(f"--geometry: unknown {unknown[0]!r}; known: {', '.join(geometry.GEOMETRIES)}")
    bad = [n for n in args.batch if not 1 <= n <= 8] + [n for n in args.width if not 2 <= n <= 16]
    if bad or args.context < 1:
        raise InputError(f"--batch/--width/--context: B must be 1..8, W 2..16 (K 1..15), context >= 1; got {bad}")
    impl, name = _choose_impl(args)
    env = report.environment(impl, "dflash-conformance " + " ".join(args.argv))
    where = f"generated in memory: {', '.join(args.geometry)}, B {args.batch}, W {args.width}, context {args.context}"

    def save(results):  # after every case, so a run cut short still leaves its report
        if args.json:
            report.write_json(Path(args.json), results, name, env, where, {}, "")

    results = geometry.run(impl, args.geometry, args.batch, args.width, args.context, args.reduced,
                           log=lambda line: print(line, flush=True), on_result=save, ops=args.ops)
    report.print_table(results, name, _console())
    return 1 if report.failed(results) else 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dflash-conformance", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    vec_help = "vectors directory (default: $DFLASH_VECTORS, ./vectors with a manifest, else the checkout's vectors/)"
    ops_help = "comma-separated fnmatch globs, each matched against the Op name and the case id"
    s = sub.add_parser("list", help="list the registered Ops and their case counts")
    s.add_argument("--vectors", help=vec_help)
    s.set_defaults(func=_cmd_list)
    s = sub.add_parser("generate", help="write the golden vectors and manifest")
    s.add_argument("--out", help="output directory (default: as --vectors)")
    s.add_argument("--ops", metavar="PATTERN", help=ops_help + "; other Ops' manifest entries are kept")
    s.set_defaults(func=_cmd_generate)
    s = sub.add_parser("verify", help="check sha256, missing/extra files and byte-identical regeneration")
    s.add_argument("--vectors", help=vec_help)
    s.add_argument("--ops", metavar="PATTERN", help=ops_help)
    s.add_argument("--strict", action="store_true",
                   help="regeneration must be byte-identical (same platform); default allows platform float noise "
                        "in derived bounds and float64 margins")
    s.set_defaults(func=_cmd_verify)
    s = sub.add_parser("run", help="run an implementation over the vectors")
    s.add_argument("--impl", metavar="package.module:attribute",
                   help=f"implementation object, class or factory (default: {CUDA_IMPL} with a GPU, "
                        "else the float32 baseline)")
    s.add_argument("--vectors", help=vec_help)
    s.add_argument("--ops", metavar="PATTERN", help=ops_help)
    s.add_argument("--json", metavar="FILE", help="write a JSON report")
    s.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    s.add_argument("--timeout", metavar="S", type=float, default=60.0, help="per-case timeout in seconds (60)")
    s.set_defaults(func=_cmd_run)
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
    s.add_argument("--json", metavar="FILE", help="write a JSON report")
    s.set_defaults(func=_cmd_geometry)
    return p


def main(argv=None, specs=None) -> int:
    """Entry point. ``specs`` replaces the registry (tests use it for a toy Op)."""
    try:
        args = build_parser().parse_args(argv)
        args.specs = specs
        args.argv = list(sys.argv[1:] if argv is None else argv)
        return args.func(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI never shows a traceback unless asked
        if os.environ.get("DFLASH_TRACEBACK"):
            traceback.print_exc()
        print(f"error: internal: {type(exc).__name__}: {exc} (DFLASH_TRACEBACK=1 shows the traceback)".splitlines()[0],
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
