"""kernels_cu/fast_round.py's launches into given buffers make the same kernel launches as the Op
methods they stand for (no GPU: CuPy is replaced by NumPy and every kernel by a recorder that keeps
the grid, block and arguments, arrays by shape and dtype).

- topk_into == FastSelectBackend._topk_rows (candidate_topk, k <= 32 and k > 32; proposal_head k = 1);
- rowdot_bits_into == ops_select._rowdot(bits_out=True) (the selector's g);
- selector_walk_into == SelectionOps.candidate_selector's walk launch.
"""

from __future__ import annotations

import numpy as np
import pytest

import kernels_cu.fast_round as fr
import kernels_cu.ops_select as sel
from kernels_cu import fast


def _desc(a):
    if isinstance(a, np.ndarray):
        return ("array", a.shape, str(a.dtype))
    if isinstance(a, np.generic):
        return (type(a).__name__, a.item())
    return a


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, module, name):
        def launch(grid, block, args, **kw):
            self.calls.append((module, name, tuple(grid), tuple(block), tuple(_desc(a) for a in args),
                               tuple(sorted(kw.items()))))

        return launch


@pytest.fixture
def rec(monkeypatch):
    r = _Recorder()
    for mod in (fast, fr, sel):
        monkeypatch.setattr(mod, "_fn", r)
        monkeypatch.setattr(mod, "cp", lambda: np)
    return r


@pytest.mark.parametrize("M,Vr,k,scores", [(7, 248320, 16, True), (120, 248320, 16, True), (8, 248320, 1, False),
                                            (3, 60, 4, True), (2, 5000, 40, True), (1, 1, 1, False)])
def test_topk_into_launches_as_the_op(rec, M, Vr, k, scores):
    logits = np.zeros((M, Vr), np.float32)
    backend = fast.FastSelectBackend.__new__(fast.FastSelectBackend)
    backend._topk_rows(logits, None, Vr - 1, k, 0.5, 30.0, want_scores=scores)
    op_calls, rec.calls = rec.calls, []
    S, chunk, warp, lists = fr.topk_plan(M, Vr, k)
    assert S * chunk >= Vr and (S - 1) * chunk < Vr and warp == (k <= 32)
    fr.topk_into(logits, None, Vr - 1, k, 0.5, 30.0, np.empty((M, lists, k), np.uint64),
                 np.empty((M, k), np.float32) if scores else None, np.empty((M, k), np.int32))
    assert rec.calls == op_calls and len(op_calls) == 2


@pytest.mark.parametrize("M,R,H", [(7, 256, 5120), (120, 256, 5120), (3, 4, 32)])
def test_rowdot_bits_into_launches_as_the_op(rec, M, R, H):
    x, w = np.zeros((M, H), np.uint16), np.zeros((R, H), np.uint16)
    sel._rowdot(x, w, bits_out=True)
    op_calls, rec.calls = rec.calls, []
    fr.rowdot_bits_into(x, w, np.empty((M, R), np.uint16))
    assert rec.calls == op_calls and op_calls


@pytest.mark.parametrize("B,K,k,R,H", [(1, 7, 16, 256, 64), (8, 15, 16, 8, 32), (2, 3, 4, 4, 32)])
def test_selector_walk_into_launches_as_the_op(rec, B, K, k, R, H):
    V = 50
    hidden = np.zeros((B, K, H), np.uint16)
    scores, ids = np.zeros((B, K, k), np.float32), np.zeros((B, K, k), np.int32)
    anchor, temperature = np.zeros(B, np.int32), np.zeros(B, np.float32)
    seed, frontier = np.zeros(B, np.uint64), np.zeros(B, np.int64)
    w_hidden, w_pred, w_succ = np.zeros((R, H), np.uint16), np.zeros((V, R), np.uint16), np.zeros((V, R), np.uint16)
    sel.SelectionOps().candidate_selector(hidden=hidden, scores=scores, ids=ids, anchor=anchor, w_hidden=w_hidden,
                                          w_pred=w_pred, w_succ=w_succ, temperature=temperature, seed=seed,
                                          frontier=frontier)
    op_calls, rec.calls = rec.calls, []
    g = np.empty((B * K, R), np.uint16)
    fr.rowdot_bits_into(hidden.reshape(B * K, H), w_hidden, g)
    fr.selector_walk_into(g.reshape(B, K, R), scores, ids, anchor, w_pred, w_succ, temperature, seed, frontier,
                          np.empty((B, K), np.int32), np.empty((B, K), np.int32), np.empty((B, K, k), np.float32))
    assert rec.calls == op_calls and [c[1] for c in op_calls] == ["bf16_rowdot", "selector_walk"]
