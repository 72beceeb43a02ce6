"""Golden vector files and their manifest (CONTRACTS C8).

Layout::

    <dir>/manifest.json                    generator/contract version; per file: path, sha256, op, case, flags
    <dir>/<op>/<case-name>.safetensors     one case (case id ``<op>/<case-name>``)

Tensor keys of a case file:

    in.<name>      an input, in the storage dtype the Case holds
    out.<name>     the float64 reference output: represented outputs in their format's storage dtype
                   (exact: the reference already rounded them), decisions and exact outputs as integers
    margin.<name>  float64, decision outputs: winner minus runner-up (inf: no contest, 0: exact tie)
    scale.<name>   float64, decision outputs whose reference returns ``<name>.scale`` (tolerance floor)
    mask.<name>    uint8 (1 = compared); absent: every element is compared

Header metadata (all strings, JSON where structured): op, case (the id), contract_version,
generator_version, params, flags, classes (output -> {cls, fmt}), bounds (see conformance.bounds).

The files are standard safetensors, but written and read here: ``safetensors.numpy.save``
serialises the metadata from a Rust HashMap, so its key order (and the file's bytes) change
from process to process, which breaks C8's byte-identical regeneration. Reading is done here
too because ``safetensors.numpy.load`` cannot read BF16 from bytes, and the bytes are in
hand already for the sha256 check.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from conformance import CONTRACT_VERSION, GENERATOR_VERSION
from conformance import registry
from conformance.registry import Output

SUFFIX = ".safetensors"
MANIFEST = "manifest.json"
METADATA_KEYS = ("op", "case", "contract_version", "generator_version", "params", "flags", "classes", "bounds")

_DTYPES = {
    np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16", np.dtype(np.int16): "I16", np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.uint32): "U32", np.dtype(np.int32): "I32",
    np.dtype(np.float32): "F32", np.dtype(np.uint64): "U64", np.dtype(np.int64): "I64",
    np.dtype(np.float64): "F64",
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class InputError(Exception):
    """Bad input (vectors, selection, --impl): the message is one line naming the file or field."""


class DataError(InputError):
    """The suite's own data is broken: a vector file missing, unreadable or not matching its manifest
    entry, or a manifest that cannot be read. The CLI exits with ``DATA_ERROR_EXIT`` (not 1, a FAIL,
    nor 2, bad usage), so CI can tell broken suite data from failing kernels."""


DATA_ERROR_EXIT = 3


def dumps(obj) -> str:
    """The one JSON spelling used in headers and the manifest (sorted keys: deterministic bytes)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_jsonable)


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (tuple, frozenset, set)):
        return sorted(x) if isinstance(x, (set, frozenset)) else list(x)
    raise TypeError(f"{type(x).__name__} is not JSON-serialisable")


def encode(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """A safetensors file as bytes; equal inputs give equal bytes in any process."""
    arrays = {k: np.asarray(v, order="C") for k, v in tensors.items()}  # ascontiguousarray makes 0-d 1-d
    # Largest items first, as safetensors itself orders them, so every tensor stays aligned.
    order = sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k))
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    chunks, offset = [], 0
    for k in order:
        a = arrays[k]
        if a.dtype not in _DTYPES:
            raise TypeError(f"tensor {k}: dtype {a.dtype} has no safetensors spelling")
        raw = a.tobytes()
        header[k] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + b"".join(chunks)


def decode(data: bytes, where: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) of safetensors bytes; InputError naming ``where`` if malformed."""
    try:
        n = int.from_bytes(data[:8], "little")
        if len(data) < 8 or n > len(data) - 8:
            raise ValueError("truncated header")
        header = json.loads(bytes(data[8:8 + n]))
        if not isinstance(header, dict):
            raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
        meta = header.pop("__metadata__", {}) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise ValueError("__metadata__ must map strings to strings")
        body = memoryview(data)[8 + n:]
        tensors = {}
        for k, info in header.items():
            if not isinstance(info, dict):
                raise ValueError(f"tensor {k}: its entry is not an object")
            dt = _NAMES.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
            if dt is None:
                raise ValueError(f"tensor {k}: unknown dtype {info.get('dtype')!r}")
            offsets, shape = info.get("data_offsets"), info.get("shape")
            if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(x) for x in offsets)):
                raise ValueError(f"tensor {k}: data_offsets must be two integers")
            if not (isinstance(shape, list) and len(shape) <= 32 and all(_is_int(x) and x >= 0 for x in shape)):
                raise ValueError(f"tensor {k}: shape must be a list of at most 32 non-negative integers")
            lo, hi = offsets
            size = 1
            for x in shape:
                size *= x  # Python integers: no overflow
            if not 0 <= lo <= hi <= len(body) or hi - lo != dt.itemsize * size:
                raise ValueError(f"tensor {k}: data offsets {lo}..{hi} do not fit shape {list(shape)}")
            tensors[k] = np.frombuffer(body[lo:hi], dtype=dt).reshape(tuple(shape))
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise InputError(f"{where}: not a readable safetensors file ({type(exc).__name__}: {exc})"
                         .splitlines()[0][:400]) from None
    return tensors, meta


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class Vector:
    """One case as stored: what the runner hands to an implementation and compares against."""

    op: str
    case: str
    params: dict
    flags: list
    outputs: dict[str, Output]
    bounds: dict
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]  # reference-shaped: name, name.margin, name.scale
    masks: dict[str, np.ndarray] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        return {**self.inputs, **self.params}


def parse_vector(data: bytes, where: str) -> Vector:
    return vector_from(*decode(data, where), where)


def vector_from(tensors: dict[str, np.ndarray], meta: dict[str, str], where: str) -> Vector:
    """A Vector from a file's tensors and header metadata (also used in memory, without bytes)."""
    missing = [k for k in METADATA_KEYS if k not in meta]
    if missing:
        raise InputError(f"{where}: header metadata lacks {', '.join(missing)}")
    try:
        fields = {k: json.loads(meta[k]) for k in ("params", "flags", "classes", "bounds")}
        for k, kind in (("params", dict), ("flags", list), ("classes", dict), ("bounds", dict)):
            if not isinstance(fields[k], kind):
                raise TypeError(f"{k} is a JSON {type(fields[k]).__name__}, expected {kind.__name__}")
        if not all(isinstance(v, dict) for v in fields["bounds"].values()):
            raise TypeError("bounds must map each output to an object")
        if not all(isinstance(f, str) for f in fields["flags"]):
            raise TypeError("flags must be strings")
        outputs = {n: _output(n, c, meta["op"]) for n, c in fields["classes"].items()}
        for k in ("op", "case"):
            if not meta[k] or not meta[k].isprintable():
                raise ValueError(f"{k} is empty or not printable")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise InputError(f"{where}: bad header metadata ({exc})".splitlines()[0][:400]) from None
    inputs, expected, masks = {}, {}, {}
    for key, arr in tensors.items():
        kind, _, name = key.partition(".")
        if kind == "in":
            inputs[name] = arr
        elif kind == "out":
            expected[name] = arr
        elif kind in ("margin", "scale"):
            expected[f"{name}.{kind}"] = arr
        elif kind == "mask":
            masks[name] = arr.astype(bool)
    absent = [n for n in outputs if n not in expected]
    if absent:
        raise InputError(f"{where}: no out.{absent[0]} tensor for a declared output")
    for name, o in outputs.items():
        if o.cls == "decision" and f"{name}.margin" not in expected:
            raise InputError(f"{where}: no margin.{name} tensor for a decision output")
        if name in masks:
            try:
                np.broadcast_to(masks[name], np.shape(expected[name]))
            except ValueError:
                raise InputError(f"{where}: mask.{name} does not fit out.{name}") from None
    return Vector(meta["op"], meta["case"], fields["params"], fields["flags"], outputs, fields["bounds"],
                  inputs, expected, masks)


def _output(name: str, c, op: str | None = None) -> Output:
    """An output's class from the header (``values``: the format its values follow, when
    narrower than the storage format); what decides its exact ties is the registered Op's (not
    stored: it changes no byte and no verdict, only a FAIL's message)."""
    if not isinstance(c, dict) or not isinstance(c.get("cls"), str):
        raise TypeError(f"classes.{name} must be an object with a cls")
    extra = {}
    if c.get("values") is not None and "values" in getattr(Output, "__dataclass_fields__", {}):
        extra["values"] = c["values"]
    spec = registry.ops().get(op) if op else None
    rule = next((o.tie_rule for o in spec.outputs if o.name == name), None) if spec else None
    if rule is not None:
        extra["tie_rule"] = rule
    return Output(name, c["cls"], c.get("fmt"), **extra)


def case_path(root: Path, case_id: str) -> Path:
    op, name = case_id.split("/", 1)
    return Path(root) / op / f"{name}{SUFFIX}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_manifest(root: Path) -> dict:
    path = Path(root) / MANIFEST
    if not Path(root).is_dir():
        raise InputError(f"vectors: no directory {root} (run dflash-conformance generate, or set --vectors)")
    if not path.is_file():
        raise InputError(f"vectors: no {MANIFEST} in {root} (run dflash-conformance generate)")
    try:
        manifest = json.loads(path.read_bytes())
        if not isinstance(manifest, dict):
            raise TypeError(f"a JSON {type(manifest).__name__}, not an object")
        files = manifest["files"]
        if not isinstance(files, list):
            raise TypeError("files is not a list")
        bad = [e for e in files if not isinstance(e, dict)
               or not all(isinstance(e.get(k), str) and e.get(k) for k in ("path", "sha256", "op", "case"))]
        if bad:
            raise KeyError(f"entry {str(bad[0])[:200]} lacks path, sha256, op or case (strings)")
        cases = [e["case"] for e in files]
        if len(set(cases)) != len(cases):
            raise ValueError("a case is listed twice")
        odd = [e for e in files if not e["case"].startswith(e["op"] + "/") or Path(e["path"]).is_absolute()
               or ".." in Path(e["path"]).parts]
        if odd:
            raise ValueError(f"entry {odd[0]['case']!r}: its case id, Op and path do not agree")
    except OSError as exc:
        raise DataError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise DataError(f"{path}: not a dflash-conformance manifest ({type(exc).__name__}: {exc})") from None
    return manifest


def manifest_bytes(files: list[dict]) -> bytes:
    import platform

    # the platform is recorded, never part of a case file: regenerating elsewhere gives the same case bytes (C8)
    body = {"contract_version": CONTRACT_VERSION, "generator_version": GENERATOR_VERSION,
            "generated_on": {"platform": platform.platform(), "machine": platform.machine(), "numpy": np.__version__},
            "files": sorted(files, key=lambda e: e["path"])}
    return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()


def default_dir(for_writing: bool = False) -> Path:
    """$DFLASH_VECTORS, else ./vectors if it has a manifest, else the checkout's vectors/.

    For writing outside a source checkout (an installed package), ./vectors rather
    than a directory inside site-packages.
    """
    env = os.environ.get("DFLASH_VECTORS")
    if env:
        return Path(env)
    local = Path("vectors")
    if (local / MANIFEST).is_file():
        return local
    import conformance

    repo = Path(conformance.__file__).resolve().parents[1]
    checkout = (repo / "pyproject.toml").is_file()
    if for_writing and not checkout:
        return local
    bundled = Path(conformance.__file__).resolve().parent / "vectors"  # a wheel that ships them
    if not checkout and (bundled / MANIFEST).is_file():
        return bundled
    if not checkout and not (repo / "vectors" / MANIFEST).is_file():
        raise InputError("vectors: this installed package has no vectors; pass --vectors DIR or set DFLASH_VECTORS "
                         "to a checkout's vectors/, or write them to ./vectors with `dflash-conformance generate` "
                         "(the same bytes; `dflash-conformance verify` checks them)")
    return repo / "vectors"


def split_globs(pattern: str | None) -> list[str]:
    return [g.strip() for g in (pattern or "").split(",") if g.strip()]


def _matches(globs: list[str], case_id: str) -> bool:
    op = case_id.split("/", 1)[0]
    return any(fnmatch.fnmatchcase(op, g) or fnmatch.fnmatchcase(case_id, g) for g in globs)


def select(pattern: str | None, case_ids: list[str], where: str) -> list[str]:
    """The case ids PATTERN selects (comma-separated fnmatch globs, each tried on the Op
    name and on the case id; None selects all). A glob that matches nothing is a typo,
    and an empty selection is an error, never a silent pass."""
    globs = split_globs(pattern)
    if pattern is not None and not globs:
        raise InputError(f"--ops: empty pattern {pattern!r}; leave --ops out to select every case")
    for g in globs:
        if not any(_matches([g], i) for i in case_ids):
            raise InputError(f"--ops: {g!r} matches no Op or case id in {where}")
    chosen = [i for i in case_ids if not globs or _matches(globs, i)]
    if not chosen:
        raise InputError(f"--ops: no cases to select from in {where}")
    return chosen
