"""CUDA implementations of the selection, sampling and verification Ops (docs/ops.md;
CONTRACTS C1, C3, C4, C5, C6, C9): ``SelectionOps``, a mixin composed into
``kernels_cu.backend.CudaBackend``.

Kernels: kernels_cu/exact/select.cu (candidate_topk, candidate_selector) and
kernels_cu/exact/accept.cu (target_distribution, speculative_accept, tree_verify, RNG probes), with the
Philox generator in kernels_cu/device/philox.cuh. preview_commit is host NumPy: it is a few
integer comparisons per request and has no arithmetic a kernel could get wrong
differently. tree_verify builds its tree on one thread per request (at most 64 nodes) and
verifies block-wide over the vocabulary.

Array convention: BF16 tensors travel as uint16 bit patterns (NumPy ml_dtypes.bfloat16
is read as its bits), fp32 as float32, ids int32, positions int64, seeds uint64, flags
uint8. Outputs are CuPy arrays (preview_commit: NumPy).
"""

from __future__ import annotations

import numpy as np

from kernels_cu.loader import load_module

_NULL = np.uint64(0)  # a null pointer argument: kernels test it before use
_DOT_WARPS = 8  # warps per block of bf16_rowdot: one output element per warp
_ROW_THREADS = 512  # accept.cu ROW_THREADS
_TOPK_THREADS = 256  # select.cu TOPK_THREADS
_SEL_THREADS = 256  # select.cu SEL_THREADS
_TOPK_MAX = 64  # select.cu DFLASH_TOPK_MAX, accept.cu MAX_QK
_MAX_DRAFTS = 64  # accept.cu MAX_DRAFTS: the acceptance history of one scan
_MAX_GRID_Y = 65535
_TREE_MAX_NODES = 64  # accept.cu TREE_MAX_NODES
_TREE_MAX_K = 16  # accept.cu TREE_MAX_K: the best-first candidate pool is (64 + 1) * 16


def cp():
    import cupy

    return cupy


def _fn(module: str, name: str):
    return load_module(module).get_function(name)


def _dev(a, dtype=None):
    """C-contiguous CuPy array in ``dtype``; NumPy bfloat16 arrives as its uint16 bits."""
    if isinstance(a, np.ndarray) and a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    a = cp().asarray(a)
    if dtype is not None and a.dtype != dtype:
        a = a.astype(dtype)
    return cp().ascontiguousarray(a)


def _bf16(a):
    """uint16 BF16 bits. A float input is rounded RNE from its fp32 value (a convenience;
    the harness always sends BF16 tensors as bits)."""
    if isinstance(a, np.ndarray) and a.dtype.name == "bfloat16":
        return _dev(a)
    a = _dev(a)
    if a.dtype == np.uint16:
        return a
    u = a.astype(np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return cp().where(nan, ((u >> 16) | np.uint32(0x40)).astype(np.uint16), r)


def _per_row(a, n: int, dtype, name: str):
    a = _dev(a, dtype).reshape(-1)
    if a.size != n:
        raise ValueError(f"{name}: expected {n} values (one per row), got {a.size}")
    return a


def _rowdot(x, w, *, bits_out: bool, out=None):
    """x [M, H] @ w [N, H].T, accumulated in double and rounded once: fp32 [M, N] (the head
    logits) or BF16 bits (the represented g), into ``out`` when given (no allocation: the fast
    round's captured graph). select.cu bf16_rowdot says why not fp32."""
    M, H = x.shape
    N = w.shape[0]
    if w.shape[1] != H:
        raise ValueError(f"inner dimensions differ: {x.shape} and {w.shape}")
    if out is None:
        out = cp().empty((M, N), dtype=np.uint16 if bits_out else np.float32)
    fn = _fn("exact/select", "bf16_rowdot")
    blocks_x = (N + _DOT_WARPS - 1) // _DOT_WARPS
    for m0 in range(0, M, _MAX_GRID_Y):
        m1 = min(M, m0 + _MAX_GRID_Y)
        if N and m1 > m0:
            o = out[m0:m1]
            fn((blocks_x, m1 - m0), (32 * _DOT_WARPS,),
               (x[m0:m1], w, np.int32(m1 - m0), np.int32(N), np.int32(H), _NULL if bits_out else o,
                o if bits_out else _NULL))
    return out


_SAMPLING = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")


def _sampling_args(n: int, kw: dict) -> tuple:
    f = tuple(_per_row(kw[name], n, np.float32, name) for name in _SAMPLING)
    return (*f, _per_row(kw["top_k"], n, np.int32, "top_k"))


class SelectionOps:
    """candidate_topk, candidate_selector, target_distribution, speculative_accept,
    tree_verify, preview_commit. Mixed into CudaBackend (which sets array_module = "cupy")."""

    def candidate_topk(self, *, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0,
                       shortlist=None):
        """Stable top-k of the head logits (fp32 logits, each rounded once from a double
        sum; selection on the raw logits, value descending, ties to the lower head row,
        C4), then the shortlist remap and u = c tanh(m z / c) on the selected logits
        (scores fp32)."""
        hidden, head = _bf16(hidden), _bf16(head)
        *lead, H = hidden.shape
        Vr = head.shape[0]
        k = int(top_k)
        if not 0 < k <= _TOPK_MAX:
            raise ValueError(f"candidate_topk: top_k = {k} outside 1..{_TOPK_MAX}")
        if shortlist is None:
            n_eligible = min(Vr, max(int(vocab_size), 0))
            sl = _NULL
        else:
            sl = _dev(shortlist, np.int32)
            if sl.shape != (Vr,):
                raise ValueError(f"candidate_topk: shortlist has shape {sl.shape}, head has {Vr} rows")
            n_eligible = int(((sl >= 0) & (sl < int(vocab_size))).sum())
        if n_eligible < k:
            raise ValueError(f"candidate_topk: {n_eligible} eligible rows, top_k = {k}")
        M = int(np.prod(lead)) if lead else 1
        logits = _rowdot(hidden.reshape(M, H), head, bits_out=False)
        scores = cp().empty((M, k), dtype=np.float32)
        ids = cp().empty((M, k), dtype=np.int32)
        if M:
            _fn("exact/select", "topk_select")(
                (M,), (_TOPK_THREADS,),
                (logits, sl, np.int32(shortlist is not None), np.int32(M), np.int32(Vr), np.int32(vocab_size),
                 np.int32(k), np.float32(output_multiplier), np.float32(softcap), scores, ids),
            )
        return {"scores": scores.reshape(*lead, k), "ids": ids.reshape(*lead, k)}

    def candidate_selector(self, *, hidden, scores, ids, anchor, w_hidden, w_pred, w_succ, temperature, seed,
                           frontier):
        """g = BF16(W_hidden h) (double accumulation, one rounding), then the left-to-right
        conditional walk over E_i[j_(i-1), c] (fp32 accumulation; greedy lowest-rank argmax,
        or q = softmax(E/T) and the exponential race at (seed, frontier + i, DFLASH2_PROPOSAL,
        rank))."""
        hidden = _bf16(hidden)
        B, K, H = hidden.shape
        w_hidden, w_pred, w_succ = _bf16(w_hidden), _bf16(w_pred), _bf16(w_succ)
        R = w_hidden.shape[0]
        scores = _dev(scores, np.float32)
        ids = _dev(ids, np.int32)
        k = scores.shape[-1]
        if scores.shape != (B, K, k) or ids.shape != (B, K, k):
            raise ValueError(f"candidate_selector: scores {scores.shape} / ids {ids.shape}, expected {(B, K, k)}")
        if not 0 < k <= _TOPK_MAX:
            raise ValueError(f"candidate_selector: k = {k} outside 1..{_TOPK_MAX}")
        if w_pred.shape[1] != R or w_succ.shape[1] != R:
            raise ValueError(f"candidate_selector: codebooks {w_pred.shape}, {w_succ.shape} need rank {R}")
        g = _rowdot(hidden.reshape(B * K, H), w_hidden, bits_out=True).reshape(B, K, R)
        path = cp().empty((B, K), dtype=np.int32)
        tokens = cp().empty((B, K), dtype=np.int32)
        q = cp().empty((B, K, k), dtype=np.float32)
        if B and K:
            _fn("exact/select", "selector_walk")(
                (B,), (_SEL_THREADS,),
                (g, scores, ids, _per_row(anchor, B, np.int32, "anchor"), w_pred, w_succ,
                 _per_row(temperature, B, np.float32, "temperature"), _per_row(seed, B, np.uint64, "seed"),
                 _per_row(frontier, B, np.int64, "frontier"), np.int32(B), np.int32(K), np.int32(k), np.int32(R),
                 path, tokens, q),
            )
        return {"g": g, "path": path, "tokens": tokens, "q": q}

    def target_distribution(self, *, logits, prompt_mask, output_counts, temperature, top_p, min_p,
                            repetition_penalty, frequency_penalty, presence_penalty, top_k, vocab_size):
        """C5 p per logit row: penalties in fp32 (the baseline's operations), filters and
        softmax in double from those values, probs rounded once to fp32."""
        logits = _dev(logits, np.float32)
        N, Vr = logits.shape
        prompt = _dev(prompt_mask, np.uint8)
        counts = _dev(output_counts, np.int32)
        if prompt.shape != (N, Vr) or counts.shape != (N, Vr):
            raise ValueError(f"target_distribution: prompt_mask {prompt.shape} / output_counts {counts.shape}")
        kw = {"temperature": temperature, "top_p": top_p, "min_p": min_p, "repetition_penalty": repetition_penalty,
              "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty, "top_k": top_k}
        probs = cp().empty((N, Vr), dtype=np.float32)
        if N and Vr:
            scratch = cp().empty((N, Vr), dtype=np.float32)
            _fn("exact/accept", "target_distribution_rows")(
                (N,), (_ROW_THREADS,),
                (logits, prompt, counts, *_sampling_args(N, kw), np.int32(N), np.int32(Vr), np.int32(vocab_size),
                 scratch, probs),
            )
        return {"probs": probs}

    def speculative_accept(self, *, logits, proposals, live_proposals, frontier, seed, prompt_mask, output_counts,
                           temperature, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty, top_k,
                           vocab_size, q=None, q_ids=None):
        """The acceptance scan (one block per request): accepted [B], tokens [B, W]
        (-1 past L), num_out [B]."""
        if (q is None) != (q_ids is None):
            raise ValueError("speculative_accept: q and q_ids come together (retained q) or not at all (one-hot q)")
        logits = _dev(logits, np.float32)
        B, W, Vr = logits.shape
        K = W - 1
        if K >= _MAX_DRAFTS:
            raise ValueError(f"speculative_accept: K = {K} exceeds {_MAX_DRAFTS - 1}")
        proposals = _dev(proposals, np.int32).reshape(B, K)
        live = _per_row(live_proposals, B, np.int32, "live_proposals")
        P = cp().asnumpy(live)
        if np.any((P < 0) | (P > K)):
            raise ValueError(f"speculative_accept: live_proposals {P.tolist()} outside 0..{K}")
        if q is None:
            qd, qi, kq = _NULL, _NULL, 0
        else:
            qd, qi = _dev(q, np.float32), _dev(q_ids, np.int32)
            kq = qd.shape[-1]
            if qd.shape != (B, K, kq) or qi.shape != (B, K, kq) or kq > _TOPK_MAX:
                raise ValueError(f"speculative_accept: q {qd.shape} / q_ids {qi.shape}, expected {(B, K)} + (k <= 64,)")
        prompt = _dev(prompt_mask, np.uint8)
        counts = _dev(output_counts, np.int32)
        if prompt.shape != (B, Vr) or counts.shape != (B, Vr):
            raise ValueError(f"speculative_accept: prompt_mask {prompt.shape} / output_counts {counts.shape}")
        kw = {"temperature": temperature, "top_p": top_p, "min_p": min_p, "repetition_penalty": repetition_penalty,
              "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty, "top_k": top_k}
        accepted = cp().zeros(B, dtype=np.int32)
        tokens = cp().full((B, W), -1, dtype=np.int32)
        num_out = cp().zeros(B, dtype=np.int32)
        if B:
            zs = cp().empty((B, Vr), dtype=np.float32)
            ps = cp().empty((B, Vr), dtype=np.float32)
            _fn("exact/accept", "speculative_accept_rows")(
                (B,), (_ROW_THREADS,),
                (logits, proposals, live, qd, qi, np.int32(q is not None), np.int32(kq),
                 _per_row(frontier, B, np.int64, "frontier"), _per_row(seed, B, np.uint64, "seed"), prompt, counts,
                 *_sampling_args(B, kw), np.int32(B), np.int32(K), np.int32(Vr), np.int32(vocab_size), zs, ps,
                 accepted, tokens, num_out),
            )
        return {"accepted": accepted, "tokens": tokens, "num_out": num_out}

    def tree_verify(self, *, anchor, ids, energies, temperature, seed, frontier, target_bigram, tree_nodes):
        """DFlash2 tree verification (reference/tree_verify.py): the tree from the lattice
        (main chain, then best-first by path score) and its verification against the
        bigram target, one block per request."""
        ids = _dev(ids, np.int32)
        B, K, k = ids.shape
        energies = _dev(energies, np.float32)
        bigram = _dev(target_bigram, np.float32)
        V = bigram.shape[0]
        N = int(tree_nodes)
        if not 1 <= N <= _TREE_MAX_NODES:
            raise ValueError(f"tree_verify: tree_nodes = {N} outside 1..{_TREE_MAX_NODES}")
        if not 0 < k <= _TREE_MAX_K or K >= _MAX_DRAFTS:
            raise ValueError(f"tree_verify: k = {k} (at most {_TREE_MAX_K}) and K = {K} (at most {_MAX_DRAFTS - 1})")
        if energies.shape != (B, K, k, k) or bigram.shape != (V, V):
            raise ValueError(f"tree_verify: energies {energies.shape}, expected {(B, K, k, k)}; bigram {bigram.shape}")
        W = K + 1
        parent = cp().full((B, N), -1, dtype=np.int32)
        node_tokens = cp().full((B, N), -1, dtype=np.int32)
        tree_mask = cp().zeros((B, N, N), dtype=np.uint8)
        tokens = cp().full((B, W), -1, dtype=np.int32)
        accepted = cp().zeros(B, dtype=np.int32)
        num_out = cp().zeros(B, dtype=np.int32)
        if B:
            _fn("exact/accept", "tree_verify_rows")(
                (B,), (_ROW_THREADS,),
                (_per_row(anchor, B, np.int32, "anchor"), ids, energies,
                 _per_row(temperature, B, np.float32, "temperature"), _per_row(seed, B, np.uint64, "seed"),
                 _per_row(frontier, B, np.int64, "frontier"), bigram, np.int32(B), np.int32(K), np.int32(k),
                 np.int32(V), np.int32(N), cp().empty((B, V), dtype=np.float64), cp().empty((B, V), dtype=np.float64),
                 parent, node_tokens, tree_mask, tokens, accepted, num_out),
            )
        return {"parent": parent, "node_tokens": node_tokens, "tree_mask": tree_mask, "tokens": tokens,
                "accepted": accepted, "num_out": num_out}

    def preview_commit(self, *, tokens, num_out, anchor, frontier, ctx_frontier, budget, cancel, eos_ids, stop_ids,
                       mask_token_id=None):
        """Preview and commit (C6), on the host in NumPy: N = L, 0 if cancelled, cut after
        the first EOS/stop token (kept), then min(N, budget). The mask token id publishes
        like any other token, so mask_token_id is accepted and unused."""
        tok = _host(tokens, np.int32)
        B, W = tok.shape
        L = _host(num_out, np.int64).reshape(B)
        a = _host(anchor, np.int32).reshape(B)
        F = _host(frontier, np.int64).reshape(B)
        Fc = _host(ctx_frontier, np.int64).reshape(B)
        if np.any(Fc != F):
            raise ValueError(f"preview_commit: a proposed block starts from a caught-up context, got frontier "
                             f"{F.tolist()} and ctx_frontier {Fc.tolist()}")
        if np.any((L < 1) | (L > W)):
            raise ValueError(f"preview_commit: num_out {L.tolist()} outside 1..{W}")
        col = np.arange(W)
        licensed = col[None, :] < L[:, None]
        if np.any(licensed & (tok < 0)):
            raise ValueError("preview_commit: a licensed token is negative")
        ends = licensed & np.isin(tok, np.concatenate([_host(eos_ids, np.int64).ravel(),
                                                       _host(stop_ids, np.int64).ravel()]))
        first_end = np.where(ends.any(axis=1), ends.argmax(axis=1) + 1, L)
        n = np.minimum(first_end, np.maximum(_host(budget, np.int64).reshape(B), 0))
        n = np.where(_host(cancel, np.uint8).reshape(B) != 0, 0, n)
        published = np.where(col[None, :] < n[:, None], tok, -1).astype(np.int32)
        committed = np.full((B, W), -1, dtype=np.int32)
        live = n > 0
        committed[live, 0] = a[live]
        shifted = np.concatenate([np.full((B, 1), -1, np.int32), tok[:, :-1]], axis=1)
        committed = np.where((col[None, :] >= 1) & (col[None, :] < n[:, None]), shifted, committed).astype(np.int32)
        rows = np.arange(B)
        next_anchor = np.where(live, tok[rows, np.maximum(n - 1, 0)], -1).astype(np.int32)
        new_frontier = F + n
        return {
            "n": n.astype(np.int32),
            "committed": committed,
            "published": published,
            "next_anchor": next_anchor,
            "frontier": new_frontier.astype(np.int64),
            "ctx_frontier": Fc.copy(),
            "pending": (new_frontier - Fc).astype(np.int64),
        }


def _host(a, dtype) -> np.ndarray:
    if hasattr(a, "get") and not isinstance(a, np.ndarray):
        a = a.get()
    return np.asarray(a).astype(dtype, copy=False)


# --- RNG probes (tests/gpu/test_philox_gpu.py) ----------------------------------------------


def philox_words(counter, key):
    """Philox4x32-10 on the GPU: counter [n, 4] uint32, key [n, 2] uint32 -> [n, 4] uint32."""
    c = _dev(counter, np.uint32).reshape(-1, 4)
    k = _dev(key, np.uint32).reshape(-1, 2)
    n = c.shape[0]
    if k.shape[0] != n:
        raise ValueError(f"philox_words: {n} counters and {k.shape[0]} keys")
    out = cp().empty((n, 4), dtype=np.uint32)
    if n:
        _fn("exact/accept", "philox_words")(((n + 255) // 256,), (256,), (c, k, np.int32(n), out))
    return out


def keyed_uniforms(seed, position, purpose, index):
    """U(seed, position, purpose, index) on the GPU, element-wise over equal-length 1-D inputs."""
    s = _dev(seed, np.uint64).reshape(-1)
    p = _dev(position, np.uint64).reshape(-1)
    u = _dev(purpose, np.uint32).reshape(-1)
    i = _dev(index, np.uint32).reshape(-1)
    n = s.size
    if not p.size == u.size == i.size == n:
        raise ValueError("keyed_uniforms: inputs must have one length")
    out = cp().empty(n, dtype=np.float32)
    if n:
        _fn("exact/accept", "philox_uniforms")(((n + 255) // 256,), (256,), (s, p, u, i, np.int32(n), out))
    return out


def race_winners(weights, seed, position, purpose):
    """The exponential race of C3 on the GPU, one fp32 weight row [rows, V] per request."""
    w = _dev(weights, np.float32)
    rows, V = w.shape
    out = cp().empty(rows, dtype=np.int32)
    if rows:
        _fn("exact/accept", "race_rows")(
            (rows,), (_ROW_THREADS,),
            (w, np.int32(rows), np.int32(V), _per_row(seed, rows, np.uint64, "seed"),
             _per_row(position, rows, np.int64, "position"), _per_row(purpose, rows, np.uint32, "purpose"), out),
        )
    return out
