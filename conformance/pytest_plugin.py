"""pytest plugin (registered through the pytest11 entry point, so it loads in every
pytest run; it does nothing unless ``--dflash-impl`` is given).

    pytest --dflash-impl package.module:attribute [--dflash-vectors DIR] [--dflash-ops PATTERN] [--dflash-fuzz N]

adds one test item per selected case, node id ``dflash::<case id>`` (``dflash::grouped_conv/H16_W1_B1``).
PASS and ACCEPTABLE pass (ACCEPTABLE with a report section saying why),
NOT_IMPLEMENTED skips, FAIL and ERROR fail with the comparison's detail (a FAIL with
its diagnosis, as ``dflash-conformance run`` prints it: the catalog pitfall that
reproduces it, or the first diverging element), the implementation's traceback,
and a command that reruns the case.

The implementation runs in a worker process (one per pytest process, so one per
pytest-xdist worker), as ``dflash-conformance run`` does: a crash, an exit or a hang
past ``--dflash-timeout`` is an ERROR of that case and the session goes on.
``--dflash-in-process`` calls it in the pytest process instead.

Spread over cores with pytest-xdist (the items are the same in every xdist worker,
built from the manifest in case-id order)::

    pytest -n 4 --dflash-impl package.module:attribute
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("dflash-conformance")
    group.addoption("--dflash-impl", default=None, metavar="package.module:attribute",
                    help="a DFlash implementation to run the conformance vectors against")
    group.addoption("--dflash-vectors", default=None, metavar="DIR",
                    help="vectors directory (default: $DFLASH_VECTORS, ./vectors with a manifest, else the checkout's)")
    group.addoption("--dflash-ops", default=None, metavar="PATTERN",
                    help="comma-separated fnmatch globs over Op names and case ids")
    group.addoption("--dflash-timeout", default=60.0, type=float, metavar="S", help="per-case timeout (60 s)")
    group.addoption("--dflash-in-process", action="store_true", default=False,
                    help="call the implementation in the pytest process (default: in a worker process)")
    group.addoption("--dflash-fuzz", default=0, type=int, metavar="N",
                    help="also fuzz every Op (dflash-conformance fuzz): one item per Op, up to N examples each")
    group.addoption("--dflash-fuzz-seed", default=0, type=int, metavar="S", help="the fuzz search's seed (0)")


class _Run:
    """What every item of one session shares: the implementation and the vectors."""

    def __init__(self, config):
        from conformance import runner, vectors

        self.target = config.getoption("dflash_impl")
        self.timeout = config.getoption("dflash_timeout")
        self.isolate = not config.getoption("dflash_in_process")
        opt = config.getoption("dflash_vectors")
        try:
            self.root = Path(opt) if opt else vectors.default_dir()
            _, self.entries = runner.load_selection(self.root, config.getoption("dflash_ops"))
            self.impl = runner.open_impl(self.target, self.isolate, ops=sorted({e["op"] for e in self.entries}))
        except vectors.InputError as exc:
            msg = str(exc).replace("--impl:", "--dflash-impl:", 1).replace("--ops:", "--dflash-ops:", 1)
            raise pytest.UsageError(msg) from None
        config.add_cleanup(self.impl.close)
        self._specs = None
        self._diagnoser = None

    def diagnoser(self):
        """One per session, as one per ``run`` (it caches the mutants' outputs per case)."""
        if self._diagnoser is None:
            from conformance.diagnose import Diagnoser

            self._diagnoser = Diagnoser()
        return self._diagnoser

    def spec(self, op):
        from conformance import registry

        if self._specs is None:
            self._specs = registry.ops()
        return self._specs.get(op)

    def rerun(self, case_id: str) -> str:
        import shlex

        cmd = ["dflash-conformance", "run", "--impl", self.target, "--vectors", str(self.root), "--ops", case_id]
        return shlex.join(cmd)


class _Cases(pytest.Collector):
    """The parent of the case items (node ids ``dflash::<case id>``); built directly, never collected."""

    def collect(self):
        return []


class CaseItem(pytest.Item):
    def __init__(self, *, run: _Run, entry: dict, **kwargs):
        super().__init__(**kwargs)
        self.run, self.entry = run, entry
        for flag in entry.get("flags", ()):
            self.user_properties.append(("flag", flag))

    def runtest(self):
        from conformance import runner
        from conformance.compare import Result
        from conformance.vectors import InputError

        try:
            vec = runner.read_entry(self.run.root, self.entry)
        except InputError as exc:
            raise CaseFailed(f"ERROR: bad vector file: {exc}") from None
        spec = self.run.spec(vec.op)
        outcome = self.run.impl.invoke(vec, runner.finite_timeout(self.run.timeout))
        res = runner.judge(vec, outcome, spec.force if spec else None, spec.independent if spec else (), spec,
                           self.run.diagnoser())
        self.user_properties.append(("result", res.result.name))
        if res.output:
            self.add_report_section("call", "implementation output", res.output)
        if res.result == Result.NOT_IMPLEMENTED:
            pytest.skip(f"NOT_IMPLEMENTED: {res.detail}")
        if res.result.failed:
            text = f"{res.result.name}: {res.detail}"
            if res.diagnosis_note:
                text += f" | {res.diagnosis_note}"
            if res.trace:
                text += f"\n\n{res.trace.rstrip()}"
            raise CaseFailed(f"{text}\n\nrerun: {self.run.rerun(vec.case)}")
        if res.result == Result.ACCEPTABLE:
            flags = ", ".join(res.acceptable_flags or ())
            self.add_report_section("call", "dflash", f"ACCEPTABLE{f' ({flags})' if flags else ''}: {res.detail}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.run.root / self.entry["path"], None, self.entry["case"]


class CaseFailed(Exception):
    pass


class FuzzItem(pytest.Item):
    """``dflash-fuzz::<op>``: up to --dflash-fuzz examples of the Op's strategy (conformance.fuzz); a failure
    is shrunk, saved under the pytest cache (fuzz/) and reported with its rerun command."""

    def __init__(self, *, run: _Run, op: str, **kwargs):
        super().__init__(**kwargs)
        self.run, self.op = run, op

    def runtest(self):
        from conformance import fuzz, registry

        if not fuzz.HAVE_HYPOTHESIS:
            pytest.skip(fuzz.MISSING)
        config = self.config
        n, seed = config.getoption("dflash_fuzz"), config.getoption("dflash_fuzz_seed")
        specs = registry.ops()
        cache = getattr(config, "cache", None)
        out = Path(str(cache.mkdir("dflash-fuzz"))) if cache is not None else Path("fuzz-failures")
        lines = []
        runs = fuzz.run(self.run.impl, ops=[self.op], max_examples=n, seed=seed, timeout=self.run.timeout,
                        budget_s=None, specs=specs, out=out, log=lines.append, diagnose=False,
                        rerun=lambda f: self.run.rerun(f.case.id).replace(f"--vectors {self.run.root}",
                                                                          f"--vectors {out}"))
        r = runs[0]
        self.user_properties.append(("examples", r.examples))
        if r.note.startswith("NOT_IMPLEMENTED"):
            pytest.skip(r.note)
        if r.found is not None:
            raise CaseFailed("\n".join(lines))
        self.add_report_section("call", "dflash-fuzz", "\n".join(lines))

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return Path(__file__), None, f"dflash-fuzz::{self.op}"


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection sees the item list
def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("dflash_impl", None):
        return
    run = _Run(config)
    parent = _Cases.from_parent(session, name="dflash", nodeid="dflash")
    cases = [CaseItem.from_parent(parent, name=e["case"], run=run, entry=e) for e in run.entries]
    if config.getoption("dflash_fuzz", 0) > 0:  # one fuzz item per Op the --dflash-ops globs name
        import fnmatch

        from conformance import fuzz, vectors

        globs = vectors.split_globs(config.getoption("dflash_ops"))
        fuzz_parent = _Cases.from_parent(session, name="dflash-fuzz", nodeid="dflash-fuzz")
        cases += [FuzzItem.from_parent(fuzz_parent, name=op, run=run, op=op) for op in sorted(fuzz.STRATEGIES)
                  if not globs or any(fnmatch.fnmatchcase(op, g) for g in globs)]
    items.extend(cases)
    # as pytest reports any collector's items, so that "collected N items" counts these
    config.hook.pytest_collectreport(report=pytest.CollectReport(parent.nodeid, "passed", None, cases))
