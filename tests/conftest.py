"""Shared fixtures: a toy Op for testing the harness without the real Ops.

The toy Op has one output of each comparison class (C2):

    y     = BF16(a @ b)                                          represented bf16
    pick  [R, S]: pick[r, s] = argmax_v logits[r, s, v] + trans[pick[r, s-1], v]
          (lowest index on ties; no trans term at s = 0)         decision
    total [R] = sum_s pick[r, s]                                 exact

``pick`` is a chain, so one divergence changes every later step: the case for
teacher forcing. ``toy_noforce`` is the same Op without ``force``.

The toy specs are never registered: tests hand them to the harness explicitly
(``specs=TOYS``; ``conformance.cli.main(argv, specs=TOYS)``), so the registry and
``dflash-conformance list`` never show them.
"""

from __future__ import annotations

import shutil
import time

import ml_dtypes
import numpy as np
import pytest

from conformance.registry import DECISION, EXACT, REPRESENTED, Case, OpSpec, Output, case_rng
from reference.numerics import storage
from reference.precision import represent, work


def _walk(logits, trans, follow=None):
    """The pick chain; ``follow`` (the implementation's picks) drives the history when forcing."""
    lg, tr = work(logits), work(trans)
    r, s, _ = lg.shape
    pick = np.zeros((r, s), np.int32)
    margin = np.zeros((r, s))
    scale = np.zeros((r, s))
    history = pick if follow is None else np.asarray(follow)
    for i in range(s):
        score = lg[:, i] + (tr[history[:, i - 1]] if i else 0)
        pick[:, i] = np.argmax(score, axis=-1)
        top = np.sort(score, axis=-1)
        margin[:, i] = top[:, -1] - top[:, -2]
        scale[:, i] = np.abs(score).max(axis=-1)
    return pick, margin, scale, history.sum(axis=-1).astype(np.int64)


def toy_reference(a, b, logits, trans):
    pick, margin, scale, total = _walk(logits, trans)
    return {"y": represent(work(a) @ work(b), "bf16"), "pick": pick, "pick.margin": margin, "pick.scale": scale,
            "total": total}


def toy_force(kwargs, impl):
    out = toy_reference(**kwargs)
    out["pick"], out["pick.margin"], out["pick.scale"], out["total"] = _walk(kwargs["logits"], kwargs["trans"],
                                                                              impl["pick"])
    return out


def _inputs(rng, m=3, k=5, n=4, r=2, s=4, v=6):
    return {"a": storage(rng.standard_normal((m, k)), "bf16"), "b": storage(rng.standard_normal((k, n)), "bf16"),
            "logits": (4 * rng.standard_normal((r, s, v))).astype(np.float32),
            "trans": rng.standard_normal((v, v)).astype(np.float32)}


def toy_cases(op: str) -> list[Case]:
    cid = f"{op}/basic"
    cases = [Case(cid, _inputs(case_rng(cid)))]
    # Row 0, step 1: candidates 2 and 4 score 1 + 2**-30 and 1 in float64, both 1.0 in
    # float32; 2 wins by 2**-30. From 4 the chain goes elsewhere (trans[4, 5] = 8).
    cid = f"{op}/near_tie"
    x = _inputs(case_rng(cid))
    x["logits"][0, 0] = -5
    x["logits"][0, 0, 0] = 10
    x["logits"][0, 1] = -5
    x["logits"][0, 1, [2, 4]] = 1
    x["trans"][0] = 0
    x["trans"][0, 2] = 2.0**-30
    x["trans"][2, 0], x["trans"][4, 5] = 8, 8
    cases.append(Case(cid, x, flags=("near_tie",)))
    # Row 1, step 0: an exact tie of 3.0 at 1 and 3: the tie rule (lowest index) decides.
    cid = f"{op}/exact_tie"
    x = _inputs(case_rng(cid))
    x["logits"][1, 0] = np.minimum(x["logits"][1, 0], 2)
    x["logits"][1, 0, [1, 3]] = 3
    cases.append(Case(cid, x, flags=("tie_rule",)))
    cid = f"{op}/masked"
    cases.append(Case(cid, _inputs(case_rng(cid)), masks={"y": np.arange(3)[:, None] < 2}))
    return cases


def _spec(name, force):
    return OpSpec(name=name, reference=toy_reference, inputs=("a", "b", "logits", "trans"),
                  outputs=(Output("y", REPRESENTED, "bf16"), Output("pick", DECISION), Output("total", EXACT)),
                  generate=lambda: toy_cases(name), force=force, doc="toy Op for harness tests")


TOY = _spec("toy", toy_force)
TOY_NOFORCE = _spec("toy_noforce", None)
TOYS = {"toy": TOY, "toy_noforce": TOY_NOFORCE}


class ToyImpl:
    """A hand-written float32 implementation of the toy Ops, with switchable bugs."""

    def __init__(self, mode: str = "float32"):
        self.mode = mode
        self.name = f"toy impl ({mode})"

    def toy(self, a, b, logits, trans):
        mode = self.mode
        if mode == "raise":
            raise RuntimeError("kernel exploded\nsecond line")
        if mode == "notimpl":
            raise NotImplementedError("toy variant not supported")
        if mode == "sleep":
            time.sleep(5)
        y = (a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16)
        r, s, v = logits.shape
        pick = np.zeros((r, s), np.int32)
        for i in range(s):
            score = logits[:, i] + (trans[pick[:, i - 1]] if i else 0)
            if mode in ("neartie", "neartie_late"):  # ties to the highest index
                pick[:, i] = v - 1 - np.argmax(score[:, ::-1], axis=-1)
            else:
                pick[:, i] = np.argmax(score, axis=-1)
            if mode == "pick" and i == 2:
                pick[1, i] = np.argsort(score[1])[-2]
            if mode == "neartie_late" and i == 3:  # a real bug after the acceptable divergence at [0, 1]
                pick[0, i] = np.argsort(score[0])[-2]
        out = {"y": y, "pick": pick, "total": pick.sum(axis=-1)}
        if mode == "mutate":
            for arr in (a, b, logits, trans):
                arr[...] = 0
        elif mode == "ulp":
            out["y"] = (y.astype(np.float64) * (1 + 2.0**-5)).astype(ml_dtypes.bfloat16)
        elif mode == "nan":
            out["y"][0, 0] = np.nan
        elif mode == "masked_garbage":
            out["y"][2:] = np.nan
        elif mode == "total":
            out["total"] = out["total"] + 1
        elif mode == "missing":
            del out["total"]
        elif mode == "shape":
            out["y"] = y.T
        elif mode == "dtype":
            out["pick"] = pick.astype(np.float32)
        elif mode == "uint16":
            out["y"] = y.view(np.uint16)
        return out

    toy_noforce = toy


@pytest.fixture(scope="session")
def toy_vectors(tmp_path_factory):
    """The toy Ops' vectors, generated once per session; copy before changing them."""
    from conformance.generate import generate

    out = tmp_path_factory.mktemp("toy_vectors")
    written, errors = generate(out, TOYS)
    assert errors == [] and written == 8
    return out


def toy_cli(capsys, *argv):
    """The CLI on the toy Ops: (exit code, stdout, stderr)."""
    from conformance.cli import main

    code = main(list(argv), specs=TOYS)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def vec(toy_vectors, tmp_path):
    """A writable copy of the toy vectors."""
    out = tmp_path / "v"
    shutil.copytree(toy_vectors, out)
    return out
