"""kernels_cu/fast/round.py's launches into given buffers (no GPU: CuPy is replaced by NumPy and
every kernel by a recorder that keeps the grid, block and arguments, arrays by shape and dtype).

- the split top-k's plan and launches (kernels_cu.fast.topk_plan / topk_into, shared by the Ops and
  FastRound): the in-block merge flag, the partial buffer and the merge's list count;
- the selector's launches: rowdot_bits_into and selector_walk_into launch kernels_cu/fast/selector.cu
  (fast_selector.rowdot_plan / walk_plan; tests/test_fast_selector_plan.py checks the plans), and
  with exact=True (FastOptions.exact_selector) exactly the Op's launches: ops_select._rowdot(bits_out=True)
  and SelectionOps.candidate_selector's walk;
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels_cu.exact import select as sel
from kernels_cu.fast import backend as fast
from kernels_cu.fast import round as fr
from kernels_cu.fast import selector as fast_selector
from kernels_cu.fast.options import DEFAULT_OPTIONS


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
    for mod in (fast, fr, sel, fast_selector):
        monkeypatch.setattr(mod, "_fn", r)
        monkeypatch.setattr(mod, "cp", lambda: np)
    monkeypatch.setattr(fr, "cluster_capable", lambda: True)  # an sm_90 device, as the H200
    return r


@pytest.mark.parametrize("M,Vr,k,scores,merged", [
    (7, 248320, 16, True, True),     # few rows, k 16: the warps' lists merged in the block
    (120, 248320, 16, True, False),  # many rows: 8 lists per block (measured faster there)
    (8, 248320, 1, False, False),    # argmax (proposal_head): nothing to merge
    (3, 60, 4, True, True), (2, 5000, 40, True, False),  # k 40: the per-thread kernel
    (1, 1, 1, False, False)])
def test_topk_plan_and_launches(rec, M, Vr, k, scores, merged):
    """The split top-k's plan (kernels_cu.fast.topk_plan, which the Op and FastRound share): the
    chunks cover the row once; the partial buffer holds one list per block when the block merged
    its warps (or ran the per-thread kernel), eight otherwise; the launches pass that flag and the
    merge kernel reads exactly the lists the buffer holds."""
    S, chunk, warp, got_merged, lists = fr.topk_plan(M, Vr, k)
    assert S * chunk >= Vr and (S - 1) * chunk < Vr and warp == (k <= 32) and got_merged == merged
    assert lists == (S if merged or not warp else 8 * S)
    backend = fast.FastSelectBackend.__new__(fast.FastSelectBackend)
    backend.options = fast.DEFAULT_OPTIONS
    backend._topk_rows(np.zeros((M, Vr), np.float32), None, Vr - 1, k, 0.5, 30.0, want_scores=scores)
    vec = warp and Vr % 4 == 0  # NumPy's allocations here are 16-byte aligned, no shortlist
    calls = [(c[1], c[2], c[4]) for c in rec.calls]
    if vec:  # the per-row bound first: (logits, M, Vr, vocab_size, k, bound [M])
        (bound_name, bound_grid, bound_args), *calls = calls
        assert bound_name == "fast_topk_bound" and bound_grid == (M,)
        assert bound_args[1:] == (("int32", M), ("int32", Vr), ("int32", Vr - 1), ("int32", k),
                                  ("array", (M,), "uint64"))
    (name, grid, args), (merge_name, merge_grid, merge_args) = calls
    assert name == ("fast_topk_partial_vec" if vec else "fast_topk_partial_warp" if warp else "fast_topk_partial")
    assert grid == (S, M) and chunk % 4 == 0
    assert merge_name == ("fast_topk_merge_warp" if warp else "fast_topk_merge") and merge_grid == (M,)
    if vec:  # no shortlist: (logits, bound, M, Vr, vocab_size, k, chunk, merged, partial)
        assert args[1:7] == (("array", (M,), "uint64"), ("int32", M), ("int32", Vr), ("int32", Vr - 1), ("int32", k),
                             ("int32", chunk))
    assert merge_args[5] == ("int32", lists)  # (partial, logits, shortlist, M, Vr, lists, k, ...)
    assert args[-1] == ("array", (M, lists, k), "uint64")
    if warp:
        assert args[-2] == ("int32", int(merged))


@pytest.mark.parametrize("M,R,H", [(7, 256, 5120), (120, 256, 5120), (3, 4, 32)])
def test_rowdot_bits_into_launches_as_the_op(rec, M, R, H):
    x, w = np.zeros((M, H), np.uint16), np.zeros((R, H), np.uint16)
    sel._rowdot(x, w, bits_out=True)
    op_calls, rec.calls = rec.calls, []
    out = np.empty((M, R), np.uint16)
    fr.rowdot_bits_into(x, w, out, exact=True)
    assert rec.calls == op_calls and op_calls
    rec.calls = []
    fr.rowdot_bits_into(x, w, out)  # the fast kernel: one launch, g into out, bits (fp32 out null)
    [(module, name, grid, block, args, kw)] = rec.calls
    want_name, bm, grid_xy, want_block = fast_selector.rowdot_plan(M, R, H, x.ctypes.data, w.ctypes.data)
    assert (module, name, grid, block) == ("fast/selector", want_name, (*grid_xy, -(-M // bm)), want_block)
    assert args == (("array", (M, H), "uint16"), ("array", (R, H), "uint16"), ("int32", M), ("int32", R),
                    ("int32", H), ("uint64", 0), ("array", (M, R), "uint16")) and kw == ()


def test_exact_selector_flag_routes_both_launches_to_select_cu(rec):
    B, K, k, R, H = 2, 3, 4, 8, 32
    fr.rowdot_bits_into(np.zeros((B * K, H), np.uint16), np.zeros((R, H), np.uint16), np.empty((B * K, R), np.uint16),
                        exact=True)
    fr.selector_walk_into(np.zeros((B, K, R), np.uint16), np.zeros((B, K, k), np.float32), np.zeros((B, K, k), np.int32),
                          np.zeros(B, np.int32), np.zeros((9, R), np.uint16), np.zeros((9, R), np.uint16),
                          np.zeros(B, np.float32), np.zeros(B, np.uint64), np.zeros(B, np.int64),
                          np.empty((B, K), np.int32), np.empty((B, K), np.int32), np.empty((B, K, k), np.float32),
                          exact=True)
    assert [(c[0], c[1]) for c in rec.calls] == [("exact/select", "bf16_rowdot"), ("exact/select", "selector_walk")]


@pytest.mark.parametrize("B,K,k,R,H", [(1, 7, 16, 256, 64), (8, 15, 16, 8, 32), (2, 3, 4, 4, 32),
                                       (1, 2, 40, 8, 32), (1, 3, 8, 300, 32)])
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
    outs = (np.empty((B, K), np.int32), np.empty((B, K), np.int32), np.empty((B, K, k), np.float32))
    walk_args = (g.reshape(B, K, R), scores, ids, anchor, w_pred, w_succ, temperature, seed, frontier, *outs)
    fr.rowdot_bits_into(hidden.reshape(B * K, H), w_hidden, g, exact=True)
    fr.selector_walk_into(*walk_args, exact=True)
    assert rec.calls == op_calls and [c[1] for c in op_calls] == ["bf16_rowdot", "selector_walk"]
    rec.calls = []
    fr.selector_walk_into(*walk_args)
    [(module, name, grid, block, args, kw)] = rec.calls
    if fast_selector.walk_supported(K, k, R):  # the fast walk: the Op's arguments, its grid and smem
        want_name, want_grid, want_block, smem = fast_selector.walk_plan(B, K, k, R)
        assert (module, name, grid, block, kw) == ("fast/selector", want_name, want_grid, want_block,
                                                   (("shared_mem", smem),))
        assert args == op_calls[1][4]
    else:  # k > 32 or R > 256: selector_walk itself
        assert rec.calls == op_calls[1:]


# --- FastRound.step's control flow on a stand-in for CuPy streams and graphs ----------------------
#
# The device calls of a step (block_forward, the head GEMM, the top-k, g, the walk) are replaced by
# NumPy stand-ins whose outputs follow their inputs (hidden from anchor and frontier, ids from the
# hidden, tokens from ids and seed). A stream records what is launched while it captures; a graph
# launch re-runs those launches. Checked: eager on the first call per (B, W, C), capture on the
# second, replay after; a replay reads the inputs copied into the captured buffers; a new shape gets
# its own workspace, stream and graph; a failing capture falls back to eager and says why; every
# device call runs on the workspace's stream; no device synchronisation inside a step.


class _Fake:
    def __init__(self):
        self.current = [None]
        self.syncs = 0
        self.calls = []  # (name, stream, capturing)
        fake = self

        class Stream:
            def __init__(self, non_blocking=False):
                self.capturing, self.ops = False, []

            def __enter__(self):
                fake.current.append(self)
                return self

            def __exit__(self, *exc):
                fake.current.pop()

            def begin_capture(self, mode=None):
                self.capturing, self.ops = True, []

            def end_capture(self):
                self.capturing = False
                return Graph(self.ops)

            def is_capturing(self):
                return self.capturing

            def record(self, event=None):
                return event

            def wait_event(self, event):
                pass

            def synchronize(self):
                fake.syncs += 1

        class Graph:
            def __init__(self, ops):
                self.ops = list(ops)

            def launch(self, stream=None):
                for op in self.ops:
                    op()

        class Device:
            def synchronize(self):
                fake.syncs += 1

        class Cuda:
            pass

        cuda = Cuda()
        cuda.Stream, cuda.Event, cuda.Device = Stream, (lambda **kw: object()), Device
        cuda.get_current_stream = lambda: fake.current[-1] or Stream()
        self.cuda = cuda

    def __getattr__(self, name):
        return getattr(np, name)

    def launch(self, name, effect):
        s = self.current[-1]
        capturing = bool(s is not None and s.capturing)
        self.calls.append((name, s, capturing))
        if capturing:
            s.ops.append(effect)
        else:
            effect()


class _Eng:
    empty = staticmethod(lambda shape, dtype: np.zeros(shape, dtype))
    full = staticmethod(lambda shape, value, dtype: np.full(shape, value, dtype))
    gemv_takes = staticmethod(lambda M, N, K: False)  # the workspace's whole-or-split choice: split_k's
    options = DEFAULT_OPTIONS

    def __init__(self, fake):
        self.fake, self.fail_capture = fake, False
        self.capture_gemm_always, self._capture_gemm = True, True

    def gemm(self, x, w, out):
        def effect():
            out[...] = x[:, :1].astype(np.float32)

        self.fake.launch("gemm", effect)


@pytest.fixture
def flow(monkeypatch):
    fake = _Fake()
    monkeypatch.setattr(fr, "cp", lambda: fake)
    monkeypatch.setattr(fr.fast_head, "applies", lambda *a, **kw: False)  # GEMM + top-k, also on a GPU machine

    def block_forward(eng, ws, dm, wts, layers, *, frontier, live, eps, freqs, entry, exit):
        if eng.fail_capture and fake.current[-1].capturing:
            raise RuntimeError("planted capture failure")
        assert len(layers) == 2 and live.shape == (dm.B,)
        hidden = exit["norm_hi"]

        def effect():
            hidden[...] = (entry["tok"][:, None, None] + 10 * frontier[:, None, None]).astype(np.uint16)

        fake.launch("block", effect)

    def topk_into(logits, sl, vocab, k, mult, cap, partial, scores, ids, bound, options):
        assert bound.shape == (logits.shape[0],) and bound.dtype == np.uint64  # the workspace's, not allocated

        def effect():
            ids[...] = logits[:, :1].astype(np.int32) + np.arange(k, dtype=np.int32)
            if scores is not None:
                scores[...] = 1.0

        fake.launch("topk", effect)

    def rowdot_bits_into(x, w, out, *, exact):
        fake.launch("rowdot", lambda: out.fill(1))

    def selector_walk_into(g, scores, ids, anchor, w_pred, w_succ, temperature, seed, frontier, path, tokens, q, *,
                           exact):
        def effect():
            tokens[...] = ids[..., 0] + 1000 * seed[:, None].astype(np.int32)
            q[...] = 0.25

        fake.launch("walk", effect)

    for name, f in [("block_forward", block_forward), ("topk_into", topk_into), ("rowdot_bits_into", rowdot_bits_into),
                    ("selector_walk_into", selector_walk_into)]:
        monkeypatch.setattr(fr, name, f)
    rnd = fr.FastRound()
    rnd._round_eng = _Eng(fake)
    H, V = 32, 50
    rnd.drafter = fr.Drafter(variant="dflash2", wts={}, embed=np.zeros((V, H), np.uint16), final_norm=None,
                             head=np.zeros((V, H), np.uint16), freqs=None, vocab_size=V - 2, windows=[4, 0], eps=1e-6,
                             head_dim=8, mask_token_id=V - 1, hq=4, hk=2, inter=64, top_k=4,
                             w_hidden=np.zeros((8, H), np.uint16), w_pred=np.zeros((V, 8), np.uint16),
                             w_succ=np.zeros((V, 8), np.uint16))
    return rnd, fake


def _args(B, K, C=16, anchor0=3, seed0=0):
    return {"anchor": np.arange(anchor0, anchor0 + B, dtype=np.int32), "frontier": np.full(B, 5, np.int64),
            "live": np.full(B, K + 1, np.int32), "context_k": np.zeros((2, B, C, 2, 8), np.uint16),
            "context_v": np.zeros((2, B, C, 2, 8), np.float16), "num_drafts": K,
            "temperature": np.zeros(B, np.float32), "seed": np.full(B, seed0, np.uint64)}


def _want(a):
    return (a["anchor"] + 10 * a["frontier"]).astype(np.int32)[:, None] + 1000 * a["seed"].astype(np.int32)[:, None]


def _three_steps(rnd, a):
    """Three steps on one shape: each one's path and tokens."""
    paths, outs = [], []
    for _ in range(3):
        out = rnd.step(**a)
        paths.append(rnd.last_path)
        outs.append(out["tokens"].copy())
    return paths, outs


def test_step_runs_eager_then_captures_then_replays(flow):
    rnd, fake = flow
    a = _args(2, 3)
    paths, outs = _three_steps(rnd, a)
    assert paths == ["eager", "capture", "graph"]
    ws = rnd._ws[(2, 4, 16)]
    assert all(np.array_equal(o, np.broadcast_to(_want(a), (2, 3))) for o in outs)
    assert fake.syncs == 0
    assert {c[1] for c in fake.calls} == {ws.stream}  # every device call on the workspace's stream
    assert [c[0] for c in fake.calls if c[2]] == ["block", "gemm", "topk", "rowdot", "walk"]  # one capture
    n = len(fake.calls)
    b = _args(2, 3, anchor0=11, seed0=2)  # new inputs into the captured buffers
    out = rnd.step(**b)
    assert rnd.last_path == "graph" and len(fake.calls) == n  # replayed: nothing launched from Python
    assert np.array_equal(out["tokens"], np.broadcast_to(_want(b), (2, 3)))
    assert np.array_equal(out["q_ids"][..., 0], out["tokens"] - 1000 * 2)
    eager = rnd.step(**b, graph=False)
    assert rnd.last_path == "eager" and np.array_equal(eager["tokens"], out["tokens"])


def test_new_shape_gets_its_own_graph_and_the_old_one_replays(flow):
    rnd, fake = flow
    a, big, wide = _args(2, 3), _args(4, 3, seed0=1), _args(2, 5)
    for _ in range(3):
        rnd.step(**a)
    paths = []
    for args in (big, big, big, wide, wide, wide):
        out = rnd.step(**args)
        paths.append(rnd.last_path)
        assert np.array_equal(out["tokens"], np.broadcast_to(_want(args), out["tokens"].shape))
    assert paths == ["eager", "capture", "graph"] * 2
    assert set(rnd._ws) == {(2, 4, 16), (4, 4, 16), (2, 6, 16)}
    assert len({ws.stream for ws in rnd._ws.values()}) == 3
    out = rnd.step(**a)
    assert rnd.last_path == "graph" and np.array_equal(out["tokens"], np.broadcast_to(_want(a), (2, 3)))
    assert fake.syncs == 0


def test_fused_head_replaces_gemm_and_topk_with_device_resident_maps(flow, monkeypatch):
    """Where fast_head.applies (the Ops' rule), the round runs the fused head instead of the GEMM and the split
    top-k: no logits buffer, the tensor maps made once with the workspace (from its own hidden buffer and the
    drafter's head, not per step: a capture cannot copy from the host), and the same flow eager / capture / replay."""
    rnd, fake = flow
    asked, made, maps_made = [], [], []
    monkeypatch.setattr(fr.fast_head, "applies",
                        lambda M, Vr, H, k, sl, op, options: asked.append((M, Vr, H, k, sl, op)) or options.fused_head)
    monkeypatch.setattr(fr.fast_head, "grid", lambda Vr: 5)
    monkeypatch.setattr(fr.fast_head, "device_maps",
                        lambda x, w: made.append((x, w)) or maps_made.append(np.zeros(32, np.uint64)) or maps_made[-1])

    def head_topk_into(x, w, maps, vocab, k, mult, cap, partial, scores, ids, options):
        assert maps is maps_made[-1] and w is rnd.drafter.head and vocab == rnd.drafter.vocab_size
        assert partial.shape == (x.shape[0], 5, k) and partial.dtype == np.uint64

        def effect():
            ids[...] = x[:, :1].astype(np.int32) + np.arange(k, dtype=np.int32)
            scores[...] = 1.0

        fake.launch("head_topk", effect)

    monkeypatch.setattr(fr, "head_topk_into", head_topk_into)
    a = _args(2, 3)
    paths, outs = _three_steps(rnd, a)
    assert paths == ["eager", "capture", "graph"]
    ws = rnd._ws[(2, 4, 16)]
    assert asked == [(6, 50, 32, 4, None, "candidate_topk")]  # once, at the workspace, by the Ops' rule
    assert len(made) == 1 and made[0][1] is rnd.drafter.head and made[0][0].base is ws.hidden  # once, its buffers
    assert ws.fused and ws.logits is None and ws.partial is None
    assert all(np.array_equal(o, np.broadcast_to(_want(a), (2, 3))) for o in outs)
    assert [c[0] for c in fake.calls if c[2]] == ["block", "head_topk", "rowdot", "walk"]  # one capture
    rnd.options = fr.DEFAULT_OPTIONS.replace(fused_head=False)  # the Ops off: a new workspace keeps GEMM + top-k
    rnd.step(**_args(1, 3))
    assert not rnd._ws[(1, 4, 16)].fused and rnd._ws[(1, 4, 16)].logits is not None


def test_failed_capture_falls_back_to_eager(flow):
    rnd, _fake = flow
    rnd._round_eng.fail_capture = True
    a = _args(1, 2)
    paths = []
    for _ in range(3):
        out = rnd.step(**a)
        paths.append(rnd.last_path)
        assert np.array_equal(out["tokens"], np.broadcast_to(_want(a), (1, 2)))
    assert paths[0] == "eager" and all(p.startswith("eager (capture failed: RuntimeError: planted") for p in paths[1:])
    assert rnd._ws[(1, 3, 16)].graph is None


def test_rings_passed_as_the_workspace_arrays_are_not_copied(flow, monkeypatch):
    rnd, _fake = flow
    a = _args(2, 3)
    rnd.step(**a)
    ws = rnd._ws[(2, 4, 16)]
    copied = []
    real = fr._put
    monkeypatch.setattr(fr, "_put", lambda dst, src, dtype=None: (copied.append(src is not dst and src is not None),
                                                                  real(dst, src)))
    rnd.step(**dict(a, context_k=ws.ck, context_v=ws.cv))
    assert copied == [True, True, True, False, False, True, True]  # anchor, frontier, live, rings, temp, seed


def test_below_sm90_both_selector_launches_are_select_cu(rec, monkeypatch):
    """fast/selector.cu's kernels use thread-block clusters (sm_90+; below it the module is built
    without them): on such a device g and the walk take select.cu's launches, as exact=True."""
    B, K, k, R, H = 2, 3, 4, 8, 32
    hidden = np.zeros((B, K, H), np.uint16)
    w_hidden = np.zeros((R, H), np.uint16)
    g = np.zeros((B * K, R), np.uint16)
    walk_args = (g.reshape(B, K, R), np.zeros((B, K, k), np.float32), np.zeros((B, K, k), np.int32),
                 np.zeros(B, np.int32), np.zeros((16, R), np.uint16), np.zeros((16, R), np.uint16),
                 np.zeros(B, np.float32), np.zeros(B, np.uint64), np.zeros(B, np.int64), np.zeros((B, K), np.int32),
                 np.zeros((B, K), np.int32), np.zeros((B, K, k), np.float32))
    fr.rowdot_bits_into(hidden.reshape(B * K, H), w_hidden, g, exact=True)
    fr.selector_walk_into(*walk_args, exact=True)
    exact_calls, rec.calls = rec.calls, []
    monkeypatch.setattr(fr, "cluster_capable", lambda: False)
    fr.rowdot_bits_into(hidden.reshape(B * K, H), w_hidden, g)
    fr.selector_walk_into(*walk_args)
    assert rec.calls == exact_calls and [c[1] for c in exact_calls] == ["bf16_rowdot", "selector_walk"]
