"""The fast Ops' per-call plans on a GPU (kernels_cu/fast/block.py OpGraph, the fused head's kept maps) and the
torch entry points (kernels_cu/torch_ops.py).

- masked_block / draft_layer through their OpGraph (eager, capture, then replays) give the plain launches' bits
  (FastOptions(op_graphs=False)), call after call; new input values (anchor, frontier, live, x) and new ring contents
  written in place reach the replay (no stale static buffer);
- every fast Op called while a CuPy stream captures does not raise (a host synchronisation, a host copy or a
  pageable upload would end the capture with an error) and the replay gives the eager bits;
- the torch ops equal the CuPy Ops bit for bit, and inside a torch.cuda.graph capture their replay follows new
  input values written in place.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers (torch tests also without torch).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_fast_block_plan import larger_case, larger_layer_case


def _dev(cupy, kw: dict) -> dict:
    """The case's inputs as device arrays (BF16 as uint16 bits, the rings in place: uint16 K, float16 V)."""
    out = {}
    for k, v in kw.items():
        if isinstance(v, np.ndarray):
            v = cupy.asarray(v.view(np.uint16) if v.dtype.name == "bfloat16" else v)
        out[k] = v
    return out


def _inputs(impl, case, cupy):
    from conformance.runner import _inputs_for

    return _dev(cupy, _inputs_for(impl, case.inputs, case.params))


@pytest.fixture(scope="module")
def pair(cupy):
    from kernels_cu.fast import FastCudaBackend
    from kernels_cu.fast.options import FastOptions

    return FastCudaBackend(), FastCudaBackend(options=FastOptions(op_graphs=False))


def _same(a, b) -> bool:
    return np.array_equal(a.get().view(np.uint8), b.get().view(np.uint8))


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_masked_block_plan_equals_the_plain_launches(cupy, pair, variant):
    planned, plain = pair
    kw = _inputs(planned, larger_case(variant, seed=3), cupy)
    ring_k = "context_k"
    assert kw[ring_k].dtype == np.uint16 and kw["context_v"].dtype == np.float16, "rings must be read in place"
    paths = []
    for call in range(4):
        if call == 3:  # new values in the same arrays and new small inputs: the replay must follow them
            kw["anchor"] = cupy.roll(kw["anchor"], 1)  # the case's own token ids, in another order
            kw[ring_k][...] = cupy.asarray(np.flip(kw[ring_k].get(), axis=2).copy())
            kw["frontier"] = kw["frontier"] + 1
        got = planned.masked_block(**kw)["hidden"]
        paths.append(planned.op_graph_path())
        want = plain.masked_block(**kw)["hidden"]
        assert _same(got, want), f"call {call} ({paths[-1]}): the plan's bits differ from the plain launches'"
    assert paths == ["eager", "capture", "graph", "graph"], paths
    # the output is the caller's own: a later call does not overwrite it
    first = planned.masked_block(**kw)["hidden"]
    keep = first.get()
    kw["anchor"] = cupy.roll(kw["anchor"], 1)
    planned.masked_block(**kw)
    assert np.array_equal(first.get(), keep)


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_draft_layer_plan_equals_the_plain_launches(cupy, pair, variant):
    planned, plain = pair
    kw = _inputs(planned, larger_layer_case(variant, seed=4), cupy)
    paths = []
    for call in range(4):
        if call == 3:
            kw["x"] = cupy.asarray(np.flip(kw["x"].get(), axis=1).copy())
            kw["live"] = cupy.maximum(kw["live"] - 2, 1).astype(kw["live"].dtype)
        got = planned.draft_layer(**kw)["x_next"]
        paths.append(planned.op_graph_path())
        assert _same(got, plain.draft_layer(**kw)["x_next"]), f"call {call} ({paths[-1]})"
    assert paths == ["eager", "capture", "graph", "graph"], paths


def _capture_replays(cupy, fn):
    """fn() eagerly on a stream, then captured on it (raises where fn synchronises or copies from the host) and
    replayed: (eager output, replayed output) as host arrays."""
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        eager = fn()
        s.synchronize()
        s.begin_capture()
        try:
            out = fn()
        finally:
            graph = s.end_capture()
        graph.launch(s)
        s.synchronize()
    return eager, out


def _head_inputs(cupy, m, vr, h, seed):
    from tests.gpu.bf16 import truncate

    rng = np.random.default_rng(seed)
    return (cupy.asarray(truncate(rng.standard_normal((m, h)))),
            cupy.asarray(truncate(rng.standard_normal((vr, h)) / np.sqrt(h))))


@pytest.mark.parametrize("m", [7, 120])
def test_head_ops_under_a_stream_capture(cupy, pair, m):
    planned, _ = pair
    x, w = _head_inputs(cupy, m, 40_000, 256, seed=m)
    for op, key in (("proposal_head", "tokens"), ("candidate_topk", "ids")):
        extra = {"top_k": 8} if op == "candidate_topk" else {}
        fn = lambda: getattr(planned, op)(hidden=x, head=w, vocab_size=39_000, **extra)[key]  # noqa: E731
        eager, replayed = _capture_replays(cupy, fn)
        assert np.array_equal(eager.get(), replayed.get()), op
        again = fn()  # the kept maps (a second eager call at this address) give the same ids
        assert np.array_equal(again.get(), eager.get()), op


def test_block_and_attention_ops_under_a_stream_capture(cupy, pair):
    planned, _ = pair
    kw = _inputs(planned, larger_case("dflash", seed=5), cupy)
    eager, replayed = _capture_replays(cupy, lambda: planned.masked_block(**kw)["hidden"])
    assert _same(eager, replayed)
    lk = _inputs(planned, larger_layer_case("dflash2", seed=6), cupy)
    eager, replayed = _capture_replays(cupy, lambda: planned.draft_layer(**lk)["x_next"])
    assert _same(eager, replayed)


def test_target_distribution_under_a_stream_capture(cupy, pair):
    planned, _ = pair
    rng = np.random.default_rng(11)
    n, v = 8, 5000
    kw = dict(logits=cupy.asarray(rng.standard_normal((n, v)).astype(np.float32) * 3),
              prompt_mask=cupy.zeros((n, v), np.uint8), output_counts=cupy.zeros((n, v), np.int32),
              temperature=cupy.full(n, 0.8, np.float32), top_p=cupy.full(n, 0.9, np.float32),
              min_p=cupy.zeros(n, np.float32), repetition_penalty=cupy.ones(n, np.float32),
              frequency_penalty=cupy.zeros(n, np.float32), presence_penalty=cupy.zeros(n, np.float32),
              top_k=cupy.full(n, 50, np.int32), vocab_size=v - 10)
    eager, replayed = _capture_replays(cupy, lambda: planned.target_distribution(**kw)["probs"])
    assert _same(eager, replayed)


# --- the torch entry points --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tops(cupy, pair):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    import kernels_cu.torch_ops as to

    to.set_backend(pair[0])
    return torch, to


def _t(torch, cupy, a):
    """A torch tensor sharing a CuPy array's memory (uint16 as bfloat16)."""
    if a.dtype == np.uint16:
        return torch.from_dlpack(a.view(cupy.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


def _c(cupy, t):
    import torch

    if t.dtype == torch.bfloat16:
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(t)


def test_torch_ops_equal_the_cupy_ops(cupy, pair, tops):
    torch, _ = tops
    planned, plain = pair
    # draft_attention
    rng = np.random.default_rng(2)
    b, w, hq, hk, d, cap = 2, 8, 8, 2, 64, 256

    def b16(shape):
        return cupy.asarray((rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))

    q, k, v, kc = b16((b, w, hq, d)), b16((b, w, hk, d)), b16((b, w, hk, d)), b16((b, cap, hk, d))
    vc = cupy.asarray(rng.standard_normal((b, cap, hk, d)).astype(np.float16))
    fr, lv = cupy.asarray([200, 300], np.int64), cupy.asarray([8, 5], np.int32)
    want = plain.draft_attention(q=q, k=k, v=v, k_cache=kc, v_cache=vc, frontier=fr, live=lv, window=0)["out"]
    got = torch.ops.dflash.draft_attention(*(_t(torch, cupy, a) for a in (q, k, v, kc, vc, fr, lv)), 0)
    assert _same(_c(cupy, got), want)
    # the head
    x, head = _head_inputs(cupy, 7, 40_000, 256, seed=9)
    got = torch.ops.dflash.proposal_head(_t(torch, cupy, x), _t(torch, cupy, head), 39_000)
    assert np.array_equal(_c(cupy, got).get(), plain.proposal_head(hidden=x, head=head, vocab_size=39_000)["tokens"].get())
    s, i = torch.ops.dflash.candidate_topk(_t(torch, cupy, x), _t(torch, cupy, head), 39_000, 8)
    r = plain.candidate_topk(hidden=x, head=head, vocab_size=39_000, top_k=8)
    assert _same(_c(cupy, s), r["scores"]) and np.array_equal(_c(cupy, i).get(), r["ids"].get())
    # masked_block (twice: the second call through the OpGraph the torch views' identities find again)
    kw = _inputs(planned, larger_case("dflash2", seed=8), cupy)
    want = plain.masked_block(**kw)["hidden"]
    names = ("input_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_norm", "w_gate", "w_up", "w_down",
             "attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj")
    args = [_t(torch, cupy, kw[n]) for n in ("anchor", "embed", "frontier", "live", "context_k", "context_v",
                                             "final_norm", *names)]
    for _ in range(3):
        got = torch.ops.dflash.masked_block(*args, int(kw["mask_token_id"]), [int(s) for s in kw["windows"]],
                                            float(kw["eps"]), float(kw["theta"]), int(kw["head_dim"]),
                                            kw["variant"], int(kw["num_drafts"]))
        assert _same(_c(cupy, got), want), planned.op_graph_path()
    assert planned.op_graph_path() == "graph"


def test_torch_ops_inside_a_torch_cuda_graph(cupy, pair, tops):
    torch, _ = tops
    _, plain = pair
    x, head = _head_inputs(cupy, 7, 40_000, 256, seed=12)
    tx, th = _t(torch, cupy, x.copy()), _t(torch, cupy, head)
    rng = np.random.default_rng(3)
    b, w, hq, hk, d, cap = 2, 8, 8, 2, 64, 256

    def b16(shape):
        return cupy.asarray((rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))

    att = [b16((b, w, hq, d)), b16((b, w, hk, d)), b16((b, w, hk, d)), b16((b, cap, hk, d)),
           cupy.asarray(rng.standard_normal((b, cap, hk, d)).astype(np.float16)), cupy.asarray([200, 300], np.int64),
           cupy.asarray([8, 5], np.int32)]
    targs = [_t(torch, cupy, a) for a in att]

    def step():
        return (torch.ops.dflash.proposal_head(tx, th, 39_000), torch.ops.dflash.draft_attention(*targs, 0))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tok, out = step()
    for seed in (21, 22):
        x2, _ = _head_inputs(cupy, 7, 40_000, 256, seed=seed)
        tx.copy_(_t(torch, cupy, x2))
        targs[0].copy_(targs[0].flip(1))
        g.replay()
        torch.cuda.synchronize()
        assert np.array_equal(_c(cupy, tok).get(), plain.proposal_head(hidden=x2, head=head, vocab_size=39_000)
                              ["tokens"].get())
        want = plain.draft_attention(q=_c(cupy, targs[0]), k=att[1], v=att[2], k_cache=att[3], v_cache=att[4],
                                     frontier=att[5], live=att[6], window=0)["out"]
        assert _same(_c(cupy, out), want)


def test_torch_views_share_the_tensors_memory(cupy, tops):
    """_dl's view of a tensor is the tensor's own memory (an offset slice, a non-contiguous one made contiguous, BF16
    as its bits, bool as uint8), equal to the DLPack view, and writing through it reaches the tensor."""
    torch, to = tops
    base = torch.arange(64, dtype=torch.float32, device="cuda").reshape(8, 8)
    for t in (base[2:5], base.to(torch.bfloat16)[1:3], base.to(torch.float16), base.to(torch.int64)[3],
              (base > 20)[2:4], base.to(torch.int32).t()):
        v = to._dl(t)
        want = _c(cupy, t.contiguous()) if t.dtype != torch.bool else cupy.from_dlpack(t.contiguous().view(torch.uint8))
        assert v.shape == tuple(t.shape) and v.dtype == want.dtype
        assert np.array_equal(v.get(), want.get())
    t = base[3:5]
    to._dl(t)[1, 2] = -1.0
    assert float(base[4, 2]) == -1.0
    assert to._dl(base[:0]).shape == (0, 8)  # empty: the DLPack path
