"""kernels_cu/fast/round.py on a GPU: the proposal round's device part as one CUDA graph
per (B, W).

- the suite over the committed proposal_round vectors with ``FastRound`` (every device part through
  a captured graph): no FAIL, no ERROR; FAST_ROUND_REPORT=<path> writes the per-case results;
- every vector: the graph path's outputs equal, bit for bit, the per-Op fast composition with the
  host between Ops (``FastRound(graph=False)``, kernels_cu/round.py's composition over the fast Ops),
  and the proposals equal the exact composed round's (``CudaRound``) at every compared position
  (i < P) except where the suite calls the fast round's decision ambiguous (a near tie);
- graph replay equals the eager step bitwise; a replay after changing the inputs gives the new
  result (the eager one for those inputs); a new (B, W) captures its own graph and the old one
  still replays.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTS = ("tokens", "q", "q_ids", "k_cache", "v_cache")


def _vectors():
    from conformance import vectors

    paths = sorted((ROOT / "vectors" / "proposal_round").glob("*.safetensors"))
    return [vectors.parse_vector(p.read_bytes(), str(p)) for p in paths]


VECTORS = _vectors()


def _variant(vec) -> str:
    from reference.proposal_round import parse_config

    return parse_config(vec.params["config"], vec.case, K=int(vec.params["num_drafts"]),
                        B=int(np.shape(vec.inputs["anchor"])[0])).variant


BY_VARIANT = {v: next(x for x in VECTORS if _variant(x) == v) for v in ("dflash", "dflash2")}


def _kw(impl, vec):
    from conformance.runner import _inputs_for

    return _inputs_for(impl, vec.inputs, vec.params)


def _host(out):
    from conformance.runner import to_numpy

    return {k: np.ascontiguousarray(to_numpy(out[k])) for k in OUTS if k in out}


def _same_bits(a, b) -> bool:
    """Equal shapes, item sizes and bytes (BF16 as uint16 bits or ml_dtypes.bfloat16 alike)."""
    return a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize and np.array_equal(a.view(np.uint8),
                                                                                          b.view(np.uint8))


@pytest.fixture(scope="module")
def rnd(cupy):
    from kernels_cu.fast.round import FastRound

    return FastRound()


@pytest.fixture(scope="module")
def per_op(cupy):
    from kernels_cu.fast.round import FastRound

    return FastRound(graph=False)


@pytest.fixture(scope="module")
def exact(cupy):
    from kernels_cu.exact.round import CudaRound

    return CudaRound()


def test_suite_has_no_fail_or_error(rnd):
    from conformance.compare import Result
    from conformance.runner import run_suite

    results = run_suite(rnd, ROOT / "vectors", "proposal_round")
    counts = Counter(r.result.name for r in results)
    path = os.environ.get("FAST_ROUND_REPORT")
    if path:
        Path(path).write_text(json.dumps({
            "counts": dict(counts), "environment": {k: str(v) for k, v in rnd.environment().items()},
            "cases": [{"case": r.case, "result": r.result.name, "detail": r.detail, "flags": list(r.acceptable_flags),
                       "envelope_frac": r.envelope_frac} for r in results]}, indent=1))
    print(f"fast round suite: {dict(counts)}")
    bad = [r for r in results if r.result in (Result.FAIL, Result.ERROR, Result.NOT_IMPLEMENTED)]
    assert len(results) == len(VECTORS) and not bad, \
        f"{counts}: " + "; ".join(f"{r.case} {r.result.name}: {r.detail}" for r in bad[:10])


@pytest.mark.parametrize("vec", VECTORS, ids=[v.case for v in VECTORS])
def test_graph_round_equals_the_composed_rounds(rnd, per_op, exact, vec):
    from conformance.runner import run_case

    got = _host(rnd.proposal_round(**_kw(rnd, vec)))
    assert rnd.round_paths == ["eager", "capture"], rnd.round_paths
    ref = _host(per_op.proposal_round(**_kw(per_op, vec)))
    for k in OUTS:  # the same kernels in the same order: the same bits
        assert _same_bits(got[k], ref[k]), k
    ex = _host(exact.proposal_round(**_kw(exact, vec)))
    live = np.asarray(vec.inputs["live"]).astype(np.int64)
    compared = np.arange(got["tokens"].shape[1])[None, :] < (live - 1)[:, None]
    differ = compared & (got["tokens"] != ex["tokens"])
    if differ.any():
        res = run_case(rnd, vec)
        assert "ambiguous" in res.acceptable_flags, (vec.case, np.argwhere(differ).tolist(), res.result, res.detail)


def _step_inputs(rnd, vec):
    """The device inputs of one round's step after the catch-up (through proposal_round once)."""
    kw = _kw(rnd, vec)
    rnd.proposal_round(**kw)
    B = int(kw["anchor"].shape[0])
    ws = rnd.workspace(B, int(vec.params["num_drafts"]) + 1, int(kw["k_cache"].shape[2]))
    return {"anchor": kw["anchor"], "frontier": kw["frontier"], "live": kw["live"], "context_k": ws.ck.copy(),
            "context_v": ws.cv.copy(), "num_drafts": int(vec.params["num_drafts"]),
            "temperature": kw["temperature"], "seed": kw["seed"]}


def _snap(out):
    return {k: out[k].get().copy() for k in ("tokens", "q", "q_ids", "hidden")}


def _equal(a, b):
    return all(np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a)


@pytest.mark.parametrize("launch_order_rows", [None, 0], ids=["default", "launch_order_always"])
@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_replay_equals_eager_and_follows_new_inputs(cupy, variant, launch_order_rows):
    """launch_order_always: the graph's PDL edges relaxed to launch order at these small shapes too
    (FastOptions.launch_order_min_rows 0; by default only blocks of 64+ rows get it)."""
    from kernels_cu import pdl
    from kernels_cu.fast import FastOptions
    from kernels_cu.fast.round import FastRound

    cp = cupy
    opts = FastOptions() if launch_order_rows is None else FastOptions(launch_order_min_rows=launch_order_rows)
    rnd = FastRound(options=opts)
    vec = BY_VARIANT[variant]
    args = _step_inputs(rnd, vec)
    eager = _snap(rnd.step(**args, graph=False))
    assert rnd.last_path == "eager"
    first = _snap(rnd.step(**args))  # the workspace exists: this call replays the proposal_round's graph
    assert rnd.last_path == "graph" and _equal(first, eager)
    if launch_order_rows == 0 and pdl.active():
        assert next(iter(rnd._ws.values())).graph.relaxed > 0
    # new inputs into the captured buffers: another anchor, frontiers one back, a new seed
    V = int(vec.params["vocab_size"])
    new = dict(args, anchor=(args["anchor"] + 7) % (V - 1), frontier=cp.maximum(args["frontier"] - 1, 0),
               seed=args["seed"] + 1)
    replay = _snap(rnd.step(**new))
    assert rnd.last_path == "graph"
    want = _snap(rnd.step(**new, graph=False))
    assert _equal(replay, want)
    assert not np.array_equal(replay["hidden"], first["hidden"])
    again = _snap(rnd.step(**args))  # and back
    assert rnd.last_path == "graph" and _equal(again, eager)
    cp.cuda.Device().synchronize()


def test_new_batch_shape_captures_its_own_graph(cupy):
    from kernels_cu.fast.round import FastRound

    cp = cupy
    rnd = FastRound()
    vec = BY_VARIANT["dflash2"]
    args = _step_inputs(rnd, vec)
    base = _snap(rnd.step(**args))
    assert rnd.last_path == "graph"
    # twice the rows: the same requests again
    big = {k: (cp.concatenate([v, v], axis=1 if k.startswith("context") else 0) if hasattr(v, "shape") else v)
           for k, v in args.items()}
    paths = []
    for _ in range(3):
        out = _snap(rnd.step(**big))
        paths.append(rnd.last_path)
    assert paths == ["eager", "capture", "graph"]
    assert len(rnd._ws) == 2
    assert _equal(out, _snap(rnd.step(**big, graph=False)))
    # a wider block (W + 1): its own graph too
    wide = dict(args, num_drafts=args["num_drafts"] + 1, live=args["live"])
    paths = []
    for _ in range(3):
        rnd.step(**wide)
        paths.append(rnd.last_path)
    assert paths == ["eager", "capture", "graph"] and len(rnd._ws) == 3
    assert _equal(_snap(rnd.step(**args)), base) and rnd.last_path == "graph"


def test_round_replays_do_not_share_the_fused_heads_thresholds(cupy):
    """FastRound's graph keeps the fused head's tensor maps and shared thresholds (fast/head.cu HP_SHARED_THR) from
    replay to replay; the kernel's last block zeroes the thresholds at its end, with no memset in the graph. Replays
    alternating two inputs (anchors A, B) must each equal that input's eager step. The committed round vectors have
    H 32, which the fused head does not take, so this runs the 35B geometry's round (random weights) at B2 W8: 14
    hidden rows, the lane form, which shares thresholds; the thresholds and the kernel's count must end at zero (a
    replay that kept the other input's thresholds would lose the rows whose best logit is below them)."""
    from conformance.geometry import GEOMETRIES, PUBLIC_VOCAB_MARGIN, _capacity
    from kernels_cu.fast import head as fast_head
    from reference.config import PRESETS
    from tests.gpu.round_setup import random_round, random_round_inputs

    cp = cupy
    cfg = PRESETS[GEOMETRIES["dflash-35b-a3b"]]
    b, w = 2, 8
    fr, _ = random_round(cp, cfg)
    kw = random_round_inputs(cp, cfg, b, w, 4096)
    cap = _capacity(cfg, 4096)
    V = cfg.vocab_size - PUBLIC_VOCAB_MARGIN  # the anchors' range
    try:
        ws = fr.workspace(b, w, cap)
        if not ws.fused:
            pytest.skip("the fused head does not take the 35B head here (fast_head.applies)")
        assert b * (w - 1) > fr.options.head_warp_form_max_rows  # the lane form: the one that shares thresholds
        fr.step(**kw, graph=False)  # copies the rings in
        args = {"A": dict(kw, context_k=ws.ck, context_v=ws.cv)}
        args["B"] = dict(args["A"], anchor=(args["A"]["anchor"] + 1) % V)
        want = {n: _snap(fr.step(**a, graph=False)) for n, a in args.items()}
        # the rows differ, so their best logits do (the tokens of random weights may not)
        assert not np.array_equal(want["A"]["hidden"], want["B"]["hidden"])
        fr.step(**args["A"])  # the capture
        for n in "BABA":
            assert _equal(_snap(fr.step(**args[n])), want[n]), n
            assert fr.last_path == "graph"
        assert not ws.fh_maps[fast_head.MAP_WORDS:].any()  # the kernel left the thresholds and its count at zero
    finally:
        fr.drop()
        cp.cuda.Device().synchronize()
