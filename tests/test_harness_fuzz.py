"""Issue 9, fuzz: damaged vector files and manifests, expectations files, command lines and
misbehaving implementations never put a traceback in front of the user; every error is one
line; exit codes stay 0, 1, 2 or 3 (broken suite data).

The default run tries a few hundred inputs. The slow test tries 10,000 (2,000 per kind):

    python -m pytest -q -m slow tests/test_harness_fuzz.py -p no:cacheprovider
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance import vectors
from conformance.cli import main
from tests.conftest import TOYS, ToyImpl

DEFAULT_EXAMPLES = 40
SLOW_EXAMPLES = 2000
COUNT = {"inputs": 0}
CASES = ["toy/basic", "toy/exact_tie", "toy/masked", "toy/near_tie", "toy_noforce/basic"]


def _check(capsys, argv):
    COUNT["inputs"] += 1
    try:
        code = main(argv, specs=TOYS)
    except BaseException as exc:  # noqa: BLE001 - the CLI must never raise
        pytest.fail(f"main({argv!r}) raised {type(exc).__name__}: {exc}")
    out, err = capsys.readouterr()
    assert code in (0, 1, 2, 3), (argv, code, err)
    assert "Traceback" not in out + err, (argv, out, err)
    assert "internal error" not in err, (argv, err)
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)
    if code == 3:  # broken suite data: at most one line on stderr (run names the file in its case's ERROR line)
        assert err.count("\n") <= 1, (argv, err)
    return code, out, err


class Workdir:
    """A copy of the toy vectors, restored before each input."""

    def __init__(self, src: Path, root: Path):
        self.src, self.root = src, root
        self.dir = root / "v"
        if self.dir.exists():
            shutil.rmtree(self.dir)
        shutil.copytree(src, self.dir)
        self.manifest = (self.dir / "manifest.json").read_bytes()
        self.files = {e["case"]: (self.dir / e["path"]).read_bytes() for e in json.loads(self.manifest)["files"]}

    def reset(self):
        (self.dir / "manifest.json").write_bytes(self.manifest)
        for case, data in self.files.items():
            path = vectors.case_path(self.dir, case)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def put(self, case: str, data: bytes, fix_sha: bool):
        vectors.case_path(self.dir, case).write_bytes(data)
        if fix_sha:
            m = json.loads(self.manifest)
            for e in m["files"]:
                if e["case"] == case:
                    e["sha256"] = vectors.sha256(data)
            (self.dir / "manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def work(toy_vectors, tmp_path_factory):
    return Workdir(toy_vectors, tmp_path_factory.mktemp("fuzz"))


def _split(data: bytes):
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def _join(header, body: bytes) -> bytes:
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + body


json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                        st.text(max_size=12))
json_value = st.recursive(json_scalar, lambda c: st.one_of(st.lists(c, max_size=4),
                                                           st.dictionaries(st.text(max_size=8), c, max_size=4)),
                          max_leaves=12)
dtypes = st.sampled_from(["F32", "F64", "BF16", "F16", "I32", "I64", "U8", "BOOL", "X", "", "f32"]) | json_value
shapes = st.one_of(st.lists(st.integers(-3, 2**62), max_size=6), json_value,
                   st.just([2**31, 2**31]), st.just([2**40]), st.just([0, 2**62]))


@st.composite
def damaged_file(draw):
    case = draw(st.sampled_from(CASES))
    kind = draw(st.sampled_from(["truncate", "bitflip", "tensor", "metadata", "header", "garbage"]))
    return case, kind, draw(st.randoms(use_true_random=False)), draw(st.booleans()), draw(json_value), \
        draw(dtypes), draw(shapes)


def _damage(data: bytes, kind, rnd, value, dtype, shape) -> bytes:
    if kind == "truncate":
        return data[:rnd.randrange(len(data))]
    if kind == "bitflip":
        b = bytearray(data)
        for _ in range(rnd.randint(1, 8)):
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        return bytes(b)
    if kind == "garbage":
        return rnd.randbytes(rnd.randrange(64))
    header, body = _split(data)
    if kind == "tensor":
        key = rnd.choice([k for k in header if k != "__metadata__"])
        field = rnd.choice(["dtype", "shape", "data_offsets", "drop", "whole"])
        if field == "drop":
            del header[key]
        elif field == "whole":
            header[key] = value
        else:
            header[key][field] = {"dtype": dtype, "shape": shape, "data_offsets": value}[field]
    elif kind == "metadata":
        meta = header["__metadata__"]
        key = rnd.choice(sorted(meta))
        action = rnd.choice(["drop", "json", "raw"])
        if action == "drop":
            del meta[key]
        elif action == "json":
            meta[key] = json.dumps(value)
        else:
            meta[key] = value
    else:
        header = value
    return _join(header, body)


def _fuzz_settings(n):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def _vector_files(capsys, work, spec):
    case, kind, rnd, fix_sha, value, dtype, shape = spec
    work.reset()
    work.put(case, _damage(work.files[case], kind, rnd, value, dtype, shape), fix_sha)
    cmd = rnd.choice(["run", "verify", "dump", "list"])
    argv = {"run": ["run", "--impl", "tests.conftest:ToyImpl", "--in-process", "--ops", f"{case},toy/basic"],
            "verify": ["verify", "--ops", case], "list": ["list"],
            "dump": ["dump", case, "--impl", "tests.conftest:ToyImpl", "--in-process", "--out",
                     str(work.root / "dump")]}[cmd]
    code, out, _ = _check(capsys, [argv[0], "--vectors", str(work.dir), *argv[1:]])
    if cmd == "run" and code in (1, 3) and case != "toy/basic":  # a bad file is its case's ERROR; the other ran
        assert ": 2 cases: " in out.strip().splitlines()[-1], out


def _manifests(capsys, work, value, cmd, raw):
    work.reset()
    m = json.loads(work.manifest)
    if raw is not None:
        (work.dir / "manifest.json").write_bytes(raw)
    else:
        m["files"] = value if isinstance(value, list) else m["files"][:1] + [value]
        (work.dir / "manifest.json").write_text(json.dumps(m))
    argv = {"run": ["run", "--impl", "tests.conftest:ToyImpl", "--in-process"], "list": ["list"],
            "verify": ["verify"]}[cmd]
    _check(capsys, [argv[0], "--vectors", str(work.dir), *argv[1:]])


TOKENS = ["run", "list", "verify", "generate", "dump", "geometry", "--impl", "--vectors", "--ops", "--json", "--junit",
          "--timeout", "--deadline", "--require", "--expect", "--strict", "--shard", "--in-process", "--out", "--help",
          "tests.conftest:ToyImpl", "x:y", "nocolon", ":", "toy", "toy/*", "*", "", ",", "1/2", "0/0", "inf", "-1",
          "nan", "1e309", "/nonexistent", "--bogus", "-", "--context", "0", "--geometry", "toy/basic"]


def _argv(capsys, work, tokens):
    work.reset()
    argv = [t.replace("@V", str(work.dir)) for t in tokens]
    if argv and argv[0] in ("run", "verify", "list") and "--vectors" not in argv:
        argv[1:1] = ["--vectors", str(work.dir)]
    if argv and argv[0] == "run" and "--impl" not in argv:
        argv += ["--impl", "tests.conftest:ToyImpl", "--in-process"]
    if argv and argv[0] in ("generate", "geometry"):  # would write or build large cases: their parsing only
        argv = [a for a in argv if a != "--help"] + ["--bogus-stop"]
    if "--json" in argv or "--junit" in argv or "--out" in argv:  # keep outputs inside the work dir
        argv = [str(work.root / "o" / a.strip("/").replace("/", "_")) if i and argv[i - 1] in
                ("--json", "--junit", "--out") else a for i, a in enumerate(argv)]
    _check(capsys, argv)


def _expectations(capsys, work, text: bytes):
    work.reset()
    path = work.root / "expect.txt"
    path.write_bytes(text)
    _check(capsys, ["run", "--vectors", str(work.dir), "--impl", "tests.conftest:ToyImpl", "--in-process",
                    "--ops", "toy", "--expect", str(path)])


# --- misbehaving implementations (in-process: their outputs and exceptions) ---

class _Raises:
    def __init__(self, exc):
        self.exc = exc

    def __array__(self, *a, **k):
        raise self.exc

    def __len__(self):
        raise self.exc


def _array(dt, shape, fill):
    with np.errstate(all="ignore"):  # nan/inf/1e30 cast to integers or float16: garbage is the point
        return np.full(shape, fill).astype(dt)


arrays = st.builds(
    _array,
    st.sampled_from([np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.int8, np.int32, np.int64,
                     np.uint16, np.uint64, np.bool_, np.complex64]),
    st.sampled_from([(), (3,), (3, 4), (4, 3), (2,), (2, 4), (1, 3, 4), (0,), (3, 0)]),
    st.sampled_from([0, 1, -1, 0.5, 1e30, float("nan"), float("inf"), 2**20]))
exceptions = st.builds(lambda t, msg: t(msg), st.sampled_from([ValueError, RuntimeError, TypeError, MemoryError,
                                                               OSError, AssertionError, SystemExit, ZeroDivisionError,
                                                               NotImplementedError, IndexError]),
                       st.text(max_size=40))
outputs = st.one_of(arrays, json_value, exceptions.map(_Raises), st.just(object()))
returns = st.one_of(st.dictionaries(st.sampled_from(["y", "pick", "total", "extra", 1]), outputs, max_size=4),
                    outputs, st.just(None), exceptions)

CURRENT = {"impl": None}


def current():
    return CURRENT["impl"]


class Fuzzed(ToyImpl):
    def __init__(self, ret, keep_good):
        super().__init__("float32")
        self.ret, self.keep_good, self.name = ret, keep_good, "fuzzed"

    def toy(self, **kw):
        if isinstance(self.ret, BaseException):
            raise self.ret
        if self.keep_good and isinstance(self.ret, dict):
            return {**ToyImpl.toy(self, **kw), **self.ret}
        return self.ret

    def environment(self):
        return self.ret if not isinstance(self.ret, BaseException) else {"x": b"\xff"}


def _implementations(capsys, work, ret, keep_good):
    work.reset()
    CURRENT["impl"] = Fuzzed(ret, keep_good)
    _check(capsys, ["run", "--vectors", str(work.dir), "--impl", "tests.test_harness_fuzz:current", "--in-process",
                    "--ops", "toy/basic,toy/masked", "--json", str(work.root / "r.json"), "--junit",
                    str(work.root / "r.xml")])
    json.loads((work.root / "r.json").read_text())  # the reports stay readable


def _make_tests(n, marks=()):
    @settings(parent=_fuzz_settings(n))
    @given(damaged_file())
    def vector_files(capsys, work, spec):
        _vector_files(capsys, work, spec)

    @settings(parent=_fuzz_settings(n))
    @given(json_value, st.sampled_from(["run", "list", "verify"]), st.none() | st.binary(max_size=64))
    def manifests(capsys, work, value, cmd, raw):
        _manifests(capsys, work, value, cmd, raw)

    @settings(parent=_fuzz_settings(n))
    @given(st.lists(st.sampled_from(TOKENS) | st.text(max_size=10), max_size=8))
    def command_lines(capsys, work, tokens):
        _argv(capsys, work, tokens)

    @settings(parent=_fuzz_settings(n))
    @given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode) |
           st.lists(st.tuples(st.sampled_from(["toy/*", "*", "toy/basic", "[", "nothing", "#", ""]),
                              st.text(max_size=20)), max_size=5).map(
               lambda rows: "\n".join(f"{a} {b}" for a, b in rows).encode("utf-8", "surrogatepass")))
    def expectation_files(capsys, work, text):
        _expectations(capsys, work, text)

    @settings(parent=_fuzz_settings(n))
    @given(returns, st.booleans())
    def implementations(capsys, work, ret, keep_good):
        _implementations(capsys, work, ret, keep_good)

    tests = {"vector_files": vector_files, "manifests": manifests, "command_lines": command_lines,
             "expectation_files": expectation_files, "implementations": implementations}
    for t in tests.values():
        for m in marks:
            t = m(t)
    return tests


_DEFAULT = _make_tests(DEFAULT_EXAMPLES)
_SLOW = _make_tests(SLOW_EXAMPLES)


@pytest.mark.parametrize("kind", sorted(_DEFAULT))
def test_fuzz(kind, capsys, work):
    _DEFAULT[kind](capsys, work)


@pytest.mark.slow
def test_fuzz_10000(capsys, work, request):
    """2,000 inputs of each of the five kinds; the count is printed (docs/reports/harness-fuzz.md)."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("10,000 inputs take minutes: select them with -m slow")
    start = COUNT["inputs"]
    for kind in sorted(_SLOW):
        _SLOW[kind](capsys, work)
    n = COUNT["inputs"] - start
    with capsys.disabled():
        print(f"\nharness fuzz: {n} inputs, 0 tracebacks, every exit code in 0/1/2/3")
    assert n >= 10_000
