"""Vector files, manifest, derived bounds, generate and verify (CONTRACTS C2, C8)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from conformance import GENERATOR_VERSION, bounds, vectors
from conformance.generate import GenerationError, case_bytes, generate, verify
from conformance.registry import DECISION, REPRESENTED, Case, Output
from conformance.vectors import InputError
from reference.numerics import storage
from tests.conftest import TOY, TOYS, toy_cases, toy_reference

REPO = Path(__file__).resolve().parents[1]


def _all_dtypes():
    return {
        "bf16": storage(np.array([[1.0078125, -3.5], [np.inf, 2.0**-130]]), "bf16"),
        "f16": np.array([65504, 2.0**-24], np.float16), "f32": np.float32(1.5).reshape(()),
        "f64": np.array([np.nan, -0.0]), "i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        "i64": np.array(7, np.int64), "u8": np.array([0, 255], np.uint8), "u64": np.array([2**64 - 1], np.uint64),
        "b": np.array([True, False]), "empty": np.zeros((0, 3), np.float32),
    }


def test_files_are_standard_safetensors_and_roundtrip(tmp_path):
    tensors = _all_dtypes()
    meta = {"op": "toy", "params": '{"a":1}'}
    data = vectors.encode(tensors, meta)
    back, back_meta = vectors.decode(data, "x")
    assert back_meta == meta
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert back[k].tobytes() == v.tobytes(), k
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    lib = load_file(str(path))  # BF16 readable here because ml_dtypes is imported
    assert lib["bf16"].dtype == ml_dtypes.bfloat16 and lib["bf16"].tobytes() == tensors["bf16"].tobytes()
    assert lib["i64"].shape == ()
    with safe_open(str(path), "np") as f:
        assert f.metadata() == meta


def test_bytes_do_not_depend_on_insertion_order():
    t = _all_dtypes()
    meta = {"op": "toy", "case": "toy/x", "flags": "[]"}
    rev_t = dict(reversed(list(t.items())))
    rev_m = dict(reversed(list(meta.items())))
    assert vectors.encode(t, meta) == vectors.encode(rev_t, rev_m)


@pytest.mark.parametrize("damage", ["truncate", "header", "offsets"])
def test_corrupt_bytes_are_input_errors_naming_the_file(damage):
    data = vectors.encode({"a": np.arange(4, dtype=np.int32)}, {})
    if damage == "truncate":
        data = data[:5]
    elif damage == "header":
        data = data[:8] + b"{not json" + data[17:]
    else:
        data = data.replace(b"[0,16]", b"[0,99]")
    with pytest.raises(InputError, match=r"^vec/a\.safetensors: "):
        vectors.decode(data, "vec/a.safetensors")


def test_case_file_holds_what_the_contract_lists(toy_vectors):
    case = toy_cases("toy")[3]  # toy/masked
    vec = vectors.parse_vector((toy_vectors / "toy/masked.safetensors").read_bytes(), "f")
    ref = toy_reference(**case.kwargs())
    assert vec.op == "toy" and vec.case == "toy/masked" and vec.params == {} and vec.flags == []
    assert vec.outputs["y"] == Output("y", REPRESENTED, "bf16") and vec.outputs["pick"].cls == DECISION
    assert vec.expected["y"].dtype == ml_dtypes.bfloat16
    assert np.array_equal(vec.expected["y"].astype(np.float64), ref["y"])
    assert np.array_equal(vec.expected["pick"], ref["pick"]) and vec.expected["pick"].dtype == np.int32
    # margins are stored rounded down to two significant bits (C8: no BLAS reordering moves them)
    assert np.array_equal(vec.expected["pick.margin"], bounds.round_out(ref["pick.margin"], up=False))
    assert bounds.round_out(ref["pick.margin"], up=False).tolist() != ref["pick.margin"].tolist()  # it did round
    assert vec.inputs["a"].dtype == ml_dtypes.bfloat16 and vec.inputs["logits"].dtype == np.float32
    assert vec.masks["y"].tolist() == [[True] * 4, [True] * 4, [False] * 4]
    assert set(vec.masks) == {"y"}
    manifest = json.loads((toy_vectors / "manifest.json").read_text())
    assert manifest["generator_version"] == GENERATOR_VERSION
    entry = next(e for e in manifest["files"] if e["case"] == "toy/near_tie")
    assert entry["path"] == "toy/near_tie.safetensors" and entry["flags"] == ["near_tie"]
    assert entry["sha256"] == vectors.sha256((toy_vectors / entry["path"]).read_bytes())


def test_regeneration_is_byte_identical_in_another_process(toy_vectors, tmp_path):
    code = ("import sys; from tests.conftest import TOYS; from conformance.generate import generate; "
            "generate(sys.argv[1], TOYS)")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, cwd=REPO, timeout=60)
    assert (tmp_path / "manifest.json").read_bytes() == (toy_vectors / "manifest.json").read_bytes()


def test_round_out_keeps_two_significant_bits():
    # 1.2345e-3 = 0.632 * 2**-9: mantissas of two bits are 0.5 and 0.75
    assert bounds.ceil_sig(1.2345e-3) == 0.75 * 2.0**-9
    assert bounds.round_out(1.2345e-3, up=False) == 0.5 * 2.0**-9
    assert [bounds.round_out(x) for x in (3.0, 5.0, 6.0, 7.0, 9.0)] == [3.0, 6.0, 6.0, 8.0, 12.0]
    assert [bounds.round_out(x, up=False) for x in (3.0, 5.0, 7.0, 9.0)] == [3.0, 4.0, 6.0, 8.0]
    assert bounds.ceil_sig(0.0) == 0.0 and bounds.round_out(np.inf) == np.inf
    a = bounds.round_out(np.array([0.0, 1e-300, 2.5, np.inf]), up=False)
    assert a.tolist() == [0.0, bounds.round_out(1e-300, up=False), 2.0, np.inf] and a[1] > 0
    # a last-bit change (another BLAS order) does not move the stored value
    assert bounds.round_out(2.9) == bounds.round_out(np.nextafter(2.9, 3.0)) == 3.0


def _hand_outputs():
    return {"y": Output("y", REPRESENTED, "bf16"), "d": Output("d", DECISION)}


def test_bounds_follow_the_baseline_by_hand():
    ref = {"y": np.array([1.0, 2.0, 4.0]), "d": np.array([0, 1]), "d.margin": np.array([0.5, 2.0])}
    base = {"y": np.array([1.0 + 2.0**-7, 2.0, 4.0]), "d": np.array([0, 3]), "d.margin": np.array([0.25, 0.1])}
    masks = {"y": np.ones(3, bool), "d": np.ones(2, bool)}
    b = bounds.derive(_hand_outputs(), ref, base, masks)
    # y: one BF16 ulp at 1.0 -> bound 2 * 1 + 1; normwise 2**-7 / sqrt(21) rounded up, floor 2**-8
    # (stored numbers rounded up to two significant bits: 2**-7 / sqrt(21) = 0.87 * 2**-9 -> 2**-9)
    assert b["y"]["baseline_ulp"] == 1.0 and b["y"]["bound_ulp"] == 3.0
    assert b["y"]["baseline_norm"] == 2.0**-9
    assert b["y"]["bound_norm"] == bounds.ceil_sig(2 * 2.0**-9 + 2.0**-8) == 2.0**-7
    # d: agreeing 0.5 vs 0.25 -> 0.25; disagreeing at 1: 2.0 + 0.1 -> 2.1, rounded up to 3
    assert b["d"]["margin_err"] == 3.0 and b["d"]["floor"] == "fp32 spacing at |d.margin|"
    masks["y"][0] = False
    assert bounds.derive(_hand_outputs(), ref, base, masks)["y"]["bound_ulp"] == 1.0


def test_infinite_bound_is_refused():
    ref = {"y": np.array([1.0, 2.0, 4.0]), "d": np.array([0]), "d.margin": np.array([1.0])}
    base = {**ref, "y": np.array([np.inf, 2.0, 4.0])}
    with pytest.raises(bounds.BoundError, match="output y"):
        bounds.derive(_hand_outputs(), ref, base, {"y": np.ones(3, bool), "d": np.ones(1, bool)})


def _variant(**changes):
    return dataclasses.replace(TOY, **changes)


def test_generation_refuses_unrounded_outputs_and_undeclared_inputs():
    case = toy_cases("toy")[0]

    def unrounded(**kw):
        return {**toy_reference(**kw), "y": np.full((3, 4), 1.0 + 2.0**-20)}

    with pytest.raises(GenerationError, match="toy/basic: output y is not rounded to bf16"):
        case_bytes(_variant(reference=unrounded), case)
    bad = Case("toy/extra", {**case.inputs, "typo": np.zeros(1)})
    with pytest.raises(GenerationError, match="'typo' is not an input or param of toy"):
        case_bytes(TOY, bad)


def test_generate_reports_broken_cases_and_keeps_the_manifest(toy_vectors, tmp_path):
    out = tmp_path / "v"
    shutil.copytree(toy_vectors, out)
    before = (out / "manifest.json").read_bytes()

    def boom(**kw):
        raise ZeroDivisionError("oops")

    written, errors = generate(out, {"toy": _variant(reference=boom)})
    assert written == 0 and len(errors) == 4 and errors[0] == "toy/basic: ZeroDivisionError: oops"
    assert (out / "manifest.json").read_bytes() == before


def test_generate_ops_regenerates_only_the_selection(toy_vectors, tmp_path):
    out = tmp_path / "v"
    shutil.copytree(toy_vectors, out)
    before = {e["case"]: e for e in vectors.read_manifest(out)["files"]}
    fewer = {**TOYS, "toy": _variant(generate=lambda: toy_cases("toy")[:2])}
    written, errors = generate(out, fewer, "toy")
    assert (written, errors) == (2, [])
    after = {e["case"]: e for e in vectors.read_manifest(out)["files"]}
    assert sorted(after) == ["toy/basic", "toy/near_tie", "toy_noforce/basic", "toy_noforce/exact_tie",
                             "toy_noforce/masked", "toy_noforce/near_tie"]
    assert all(after[c] == before[c] for c in after)
    assert not (out / "toy/masked.safetensors").exists()  # no longer generated: removed
    assert verify(out, fewer) == []


def test_select_globs_match_op_names_and_case_ids():
    ids = ["toy/basic", "toy/near_tie", "other/near_tie"]
    assert vectors.select("toy", ids, "m") == ["toy/basic", "toy/near_tie"]
    assert vectors.select("*/near_tie, other", ids, "m") == ["toy/near_tie", "other/near_tie"]
    assert vectors.select(None, ids, "m") == ids
    with pytest.raises(InputError, match="'tyo' matches no Op or case id"):
        vectors.select("toy,tyo", ids, "m")
    with pytest.raises(InputError, match="no cases"):
        vectors.select(None, [], "m")


def test_verify_names_each_bad_file(toy_vectors, tmp_path):
    out = tmp_path / "v"
    shutil.copytree(toy_vectors, out)
    assert verify(out, TOYS) == []
    tampered = out / "toy/basic.safetensors"
    data = bytearray(tampered.read_bytes())
    data[-1] ^= 1
    tampered.write_bytes(bytes(data))
    (out / "toy/masked.safetensors").unlink()
    (out / "toy/stray.safetensors").write_bytes(b"x")
    # a file whose sha matches the manifest but that the generator no longer makes this way
    other = toy_cases("toy")[1]
    changed = case_bytes(TOY, Case(other.id, {**other.inputs, "trans": other.inputs["trans"] * 2}))
    (out / "toy/near_tie.safetensors").write_bytes(changed)
    manifest = json.loads((out / "manifest.json").read_text())
    for e in manifest["files"]:
        if e["case"] == other.id:
            e["sha256"] = vectors.sha256(changed)
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = verify(out, {"toy": TOY})
    assert sorted(p.split(": ", 1)[0].replace(str(out) + "/", "") for p in problems) == [
        "toy/basic.safetensors", "toy/masked.safetensors", "toy/near_tie.safetensors", "toy/stray.safetensors",
        "toy_noforce/basic.safetensors", "toy_noforce/exact_tie.safetensors", "toy_noforce/masked.safetensors",
        "toy_noforce/near_tie.safetensors"]
    text = "\n".join(problems)
    assert "basic.safetensors: sha256 differs" in text and "masked.safetensors: missing" in text
    assert "stray.safetensors: not listed" in text and "toy/near_tie.safetensors: regenerating gives other in.trans" in text
    assert "Op 'toy_noforce' is not registered" in text
