"""The whole proposal round of the fast mode as one CUDA graph per (B, W): ``FastRound``.

``FastRound`` is ``FastCudaBackend`` holding one drafter's prepared, device-resident weights
(``load(...)``) and one device workspace per (B, W, C) (C: the context ring capacity). Its
``step(...)`` runs the device part of a round with no host synchronisation:

    masked_block (kernels_cu/fast/block.py: block_forward on the fast engine, fast attention)
      -> DFlash2: head -> top-k -> g = BF16(W_hidden h) (fast/selector.cu fast_rowdot_*)
                  -> selector walk (fast/selector.cu fast_selector_walk)
      -> DFlash:  head -> top-k with k = 1

where head -> top-k is the fused head (kernels_cu/fast/head.py: the GEMM with the top-k in its epilogue, then
fast/topk.cu's merge; its tensor maps made once per workspace in device memory) wherever fast_head.applies, as
for the Ops (the same routing, so the per-Op composition runs the same kernels), and otherwise the head GEMM and the
split stable top-k (fast/topk.cu)

i.e. the kernels of the fast Ops (masked_block, candidate_topk, proposal_head), launched into buffers
the workspace owns (the Op methods allocate their outputs per call; ``topk_into`` (kernels_cu.fast,
the Ops' own launcher) launches them into given buffers with the Ops' grids and arguments), and the
selector's own fast kernels (kernels_cu/fast/selector.cu through ``rowdot_bits_into`` and
``selector_walk_into`` below), which give the exact candidate_selector's outputs: the walk bit for
bit given the same g, and g equal to bf16_rowdot's wherever both double sums are exact (nearly every
real row), otherwise unless the exact sum lies within the double sums' rounding error (about
H 2^-53 sum |x w|) of a BF16 rounding boundary (a double sum in another order, one rounding;
fast/selector.cu's header says why). ``FastOptions(exact_selector=True)`` (or ``exact=True`` per call)
launches select.cu's bf16_rowdot and selector_walk with the exact Op's grids and arguments instead;
tests/test_fast_round_plan.py checks the launches on the CPU. No other Op's numerics change: same
kernels, same arguments, the same cuBLAS gemmEx call, except the head GEMM of a head of fast_lt.MIN_BYTES
or more (FastOptions.round_head_lt): there the cuBLASLt algorithm fast_lt timed fastest for the shape, so above that size the
graph round and the per-Op composition (FastRound(graph=False): candidate_topk on gemmEx,
proposal_head tuned on its own) may differ in the logits' last bits.

Graphs. Per workspace: the first ``step`` runs eagerly on the workspace's own CuPy stream (weights
resident, kernels compiled, the attention helper's scratch cached in that stream's pool arena, the
capture GEMM's workspace made); the second captures the same sequence on that stream into a CUDA
graph and launches it; later calls copy the inputs into the captured buffers (skipped when the
caller passes the workspace's own arrays, e.g. rings it caught up in place) and replay. The step
is ordered after the caller's current stream and the caller's stream after it (events, no host
wait). What the capture relies on (fast_block.CAPTURE_NOTES, plus):

- every GEMM of the round goes through ``fast_block.CaptureGemm`` (cublasGemmEx through ctypes on
  CuPy's handle with its own 32 MiB workspace) in the eager calls too (``gemm="capture"``, the
  default), so the eager step and the replay make the same cuBLAS call in the same handle state;
  ``gemm="ops"`` uses the Ops' ``gemm_bf16`` eagerly instead (as FastCudaBackend.masked_block);
- the attention helper allocates its outputs / split scratch per call from the current stream's
  pool arena: each workspace has its own stream, used only by its steps, so nothing else allocates
  from the arena whose blocks the graph keeps;
- the workspace, the drafter's weights and the capture GEMM's workspace are held while the graph
  lives (a new drafter drops every graph first).

``proposal_round`` (CONTRACTS C10, ``--impl kernels_cu.fast.round:FastRound --ops proposal_round``):
the catch-up stays per Op (the fast mode's feature_capture and context_kv, in place into the
workspace's rings), then the device part runs through the graph: an eager warm-up step and the
captured step (a round's checkpoint is loaded per call, so each call captures; an engine keeps
the drafter and replays). ``last_path`` says which path produced the latest outputs ("graph",
"capture", "eager", or "eager (capture failed: ...)"). ``FastRound(graph=False)`` composes the
fast mode's Op methods with the host between them (kernels_cu/round.py's composition), the
per-Op baseline the graph path is compared with; speculative_step is always that composition.
"""

from __future__ import annotations

import json

import numpy as np

from kernels_cu import pdl
from kernels_cu.exact.round import CudaRound
from kernels_cu.exact.select import _SEL_THREADS, _rowdot
from kernels_cu.fast import head as fast_head
from kernels_cu.fast import lt as fast_lt
from kernels_cu.fast import selector as fast_selector
from kernels_cu.fast.backend import _TOPK_MAX, FastCudaBackend, head_topk_into, topk_into, topk_plan
from kernels_cu.fast.block import CaptureGemm, CudaEngine, Dims, Workspace, block_forward, cluster_capable
from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions
from kernels_cu.loader import load_module
from reference import proposal_round as pr
from reference import state_dict as sdm
from reference.rounds import ComposedRounds

# The captured graph's PDL edges are relaxed to launch order (kernels_cu/pdl.py end_capture) for blocks of at least
# options.launch_order_min_rows rows (B * W): at B8 W16 (128 rows) it made the rounds faster (35B 1.077 -> 1.052 ms),
# at B1 W8 (8 rows) slower (0.719 -> 0.733); the threshold sits between the two shapes measured.


def cp():
    import cupy

    return cupy


def _fn(module: str, name: str):
    return load_module(module).get_function(name)


# --- launches of the Ops' kernels into given buffers (no allocation, no host sync) -----------------


# The DFlash2 selector's kernels: kernels_cu/fast/selector.cu (the same numbers as the exact Op's, see there) unless
# options.exact_selector (or a call's exact=True) asks for the exact mode's select.cu kernels.
# The head GEMM (options.round_head_lt): a cuBLASLt algorithm timed against cublasGemmEx's default at a shape's first
# eager step (then cached per shape on the FastRound) and kept where it is faster by more than fast_lt.MARGIN, for
# heads of at least fast_lt.MIN_BYTES (a small GEMM's few-percent differences are timing noise, and below it the round
# keeps the per-Op composition's bits).


def rowdot_bits_into(x, w, out, *, exact: bool = False):
    """g = BF16(x @ w.T) (the selector's g) into ``out`` [M, N] uint16: fast_selector.rowdot_into
    (double sum on the FP64 tensor cores in another order, one rounding: bf16_rowdot's result except
    where the exact sum lies within the double sums' rounding error of a BF16 boundary, see
    fast/selector.cu), or with ``exact`` ops_select._rowdot(x, w, bits_out=True), the exact Op's
    bf16_rowdot launch."""
    if exact or not cluster_capable():  # fast/selector.cu: sm_90+
        _rowdot(x, w, bits_out=True, out=out)
    else:
        fast_selector.rowdot_into(x, w, out, bits_out=True)


def selector_walk_into(g, scores, ids, anchor, w_pred, w_succ, temperature, seed, frontier, path, tokens, q, *,
                       exact: bool = False):
    """The selector walk (after g) into given buffers; anchor int32, temperature fp32, seed uint64,
    frontier int64, one per row: fast_selector.walk_into (selector_walk's outputs bit for bit)
    where walk_supported, else, or with ``exact``, SelectionOps.candidate_selector's own
    selector_walk launch."""
    B, K, k = ids.shape
    R = g.shape[-1]
    if (not exact and cluster_capable()
            and fast_selector.walk_supported(K, k, R)):
        fast_selector.walk_into(g, scores, ids, anchor, w_pred, w_succ, temperature, seed, frontier, path, tokens, q)
    elif B and K:
        _fn("exact/select", "selector_walk")(
            (B,), (_SEL_THREADS,),
            (g, scores, ids, anchor, w_pred, w_succ, temperature, seed, frontier, np.int32(B), np.int32(K),
             np.int32(k), np.int32(R), path, tokens, q))


# --- the engine, the drafter, the workspace --------------------------------------------------------


class RoundEngine(CudaEngine):
    """fast_block's engine; with ``capture_gemm`` every GEMM (eager too) is the CaptureGemm call."""

    def __init__(self, capture_gemm: bool = True, options: FastOptions = DEFAULT_OPTIONS):
        super().__init__(options=options)
        self.capture_gemm_always = capture_gemm

    def gemm(self, x_bits, w_bits, out):
        if not self.capture_gemm_always:
            return super().gemm(x_bits, w_bits, out)
        if not self._capture_gemm:
            cp().cuda.device.get_cublas_handle()  # loads libcublas (CaptureGemm finds it in this process)
            self._capture_gemm = CaptureGemm()
        self._capture_gemm(cp().ascontiguousarray(x_bits), w_bits, out)


class Drafter:
    """One drafter's prepared weights (device-resident, held here) and its shapes and params."""

    def __init__(self, *, variant, wts, embed, final_norm, head, freqs, vocab_size, windows, eps, head_dim,
                 mask_token_id, hq, hk, inter, top_k=1, output_multiplier=0.0, softcap=0.0, w_hidden=None,
                 w_pred=None, w_succ=None, sources=()):
        self.variant, self.wts, self.embed, self.final_norm, self.head = variant, wts, embed, final_norm, head
        self.freqs, self.vocab_size, self.windows = freqs, int(vocab_size), [int(s) for s in windows]
        self.eps, self.D, self.mask_token_id = float(eps), int(head_dim), int(mask_token_id)
        self.Hq, self.Hk, self.I = int(hq), int(hk), int(inter)
        self.H, self.Vr, self.L = int(embed.shape[1]), int(head.shape[0]), len(self.windows)
        self.top_k, self.multiplier, self.softcap = int(top_k), float(output_multiplier), float(softcap)
        self.w_hidden, self.w_pred, self.w_succ = w_hidden, w_pred, w_succ
        self.sources = tuple(sources)  # the arrays it was loaded from (held: their ids stay unique)

    @property
    def conv(self) -> bool:
        return self.variant == "dflash2"


class RoundWorkspace:
    """Everything one (B, W, C) step reads and writes, allocated once; its stream and graph."""

    def __init__(self, eng, d: Drafter, B: int, W: int, C: int, route=None):
        """route: the owner's FastSelectBackend._head_route (whether the Op would take the fused head); None: never."""
        c = cp()
        K, M = W - 1, B * (W - 1)
        self.key = (B, W, C)
        self.stream = c.cuda.Stream(non_blocking=True)
        self.graph = None
        self.calls = 0
        self.capture_error = None
        # inputs (copied in by step, or written in place by the caller)
        self.anchor = c.zeros(B, dtype=np.int32)
        self.frontier = c.zeros(B, dtype=np.int64)
        self.live = c.full(B, W, dtype=np.int32)
        self.temperature = c.zeros(B, dtype=np.float32)
        self.seed = c.zeros(B, dtype=np.uint64)
        self.ck = c.zeros((d.L, B, C, d.Hk, d.D), dtype=np.uint16)  # BF16 bits
        self.cv = c.zeros((d.L, B, C, d.Hk, d.D), dtype=np.float16)
        # the block
        self.dims = Dims(B, W, d.H, d.Hq, d.Hk, d.D, d.I, d.conv)
        self.block = Workspace(eng, self.dims)
        self.hidden = c.empty((B, K, d.H), dtype=np.uint16)
        # the head: the fused head where the Op would take it (the owner's _head_route), else GEMM + top-k
        k = d.top_k if d.conv else 1
        self.fused = bool(route and route(M, d.Vr, d.H, k, None, "candidate_topk" if d.conv else "proposal_head"))
        if self.fused:  # no logits: the blocks' lists, and the tensor maps of the hidden buffer and the head
            self.fh_partial = c.empty((M, fast_head.grid(d.Vr), k), dtype=np.uint64)
            self.fh_maps = fast_head.device_maps(self.hidden.reshape(M, d.H), d.head)
            self.logits = self.partial = self.topk_bound = None
        else:
            self.fh_partial = self.fh_maps = None
            self.logits = c.empty((M, d.Vr), dtype=np.float32)
            self.partial = c.empty((M, topk_plan(M, d.Vr, k, eng.options)[4], k), dtype=np.uint64)
            self.topk_bound = c.empty(M, dtype=np.uint64)  # fast_topk_bound's per-row bound
        self.ids = c.empty((M, k), dtype=np.int32)
        if d.conv:
            self.scores = c.empty((M, k), dtype=np.float32)
            self.g = c.empty((M, d.w_hidden.shape[0]), dtype=np.uint16)
            self.path = c.empty((B, K), dtype=np.int32)
            self.tokens = c.empty((B, K), dtype=np.int32)
            self.q = c.empty((B, K, k), dtype=np.float32)
            self.q_ids = self.ids.reshape(B, K, k)
        else:
            self.scores = None
            self.tokens = self.ids.reshape(B, K)
            self.q = c.ones((B, K, 1), dtype=np.float32)
            self.q_ids = self.ids.reshape(B, K, 1)

    def outputs(self) -> dict:
        return {"tokens": self.tokens, "q": self.q, "q_ids": self.q_ids, "hidden": self.hidden}


def _put(dst, src, dtype=None):
    """Copy src into dst unless src is dst itself (the caller wrote the workspace's array)."""
    if src is None or src is dst:
        return
    c = cp()
    if isinstance(src, np.ndarray) and src.dtype.name == "bfloat16":
        src = src.view(np.uint16)
    if dst.dtype == np.float16 and getattr(src, "dtype", None) == np.uint16:
        from kernels_cu.exact.attention import f16_bits

        src = f16_bits(src).view(np.float16)  # a uint16 input is BF16 bits (kernels_cu convention)
    src = c.asarray(src)
    if src.shape != dst.shape:
        src = src.reshape(dst.shape)
    if src.dtype != dst.dtype:
        src = src.astype(dst.dtype)
    dst[...] = src


# --- the round -------------------------------------------------------------------------------------


class FastRound(ComposedRounds, FastCudaBackend):
    """FastCudaBackend with the proposal round's device part as one CUDA graph per (B, W, C)
    (module docstring). ``graph=False``: the per-Op composition with the host between Ops."""

    name = "kernels_cu-fast (proposal_round as one CUDA graph per (B, W))"
    # the graph round routes its head as the Op methods do (RoundWorkspace, by options.fused_head and the Op's rule),
    # so the per-Op composition (graph=False, speculative_step) runs the same kernels and gives the same bits

    def __init__(self, graph: bool = True, gemm: str = "capture", max_workspaces: int = 16, **kw):
        super().__init__(**kw)
        if gemm not in ("capture", "ops"):
            raise ValueError(f"gemm must be 'capture' or 'ops', got {gemm!r}")
        self.graph = bool(graph)
        self.max_workspaces = int(max_workspaces)
        self._round_eng = RoundEngine(capture_gemm=gemm == "capture", options=self.options)
        self.drafter: Drafter | None = None
        self._ws: dict = {}
        self.last_path: str | None = None
        self._head_lt: dict = {}  # fast_lt.tuned's cache: (M, N, K) -> LtGemm (or None: gemmEx), kept across
        # workspaces and drafters (the choice depends on the shape only)

    # the per-Op composition (speculative_step; proposal_round with graph=False): CudaRound's hooks
    _round_ops = CudaRound._round_ops
    _round_inputs = CudaRound._round_inputs

    # --- drafter -----------------------------------------------------------------------------

    def load(self, *, variant, weights: dict, embed, final_norm, head, vocab_size, windows, eps, theta, head_dim,
             mask_token_id, top_k=None, output_multiplier=0.0, softcap=0.0, w_hidden=None, w_pred=None, w_succ=None,
             sources=()) -> Drafter:
        """Prepare a drafter (replacing the current one and dropping its graphs): ``weights`` are
        masked_block's layer weights stacked on a leading layer axis (names as masked_block's
        inputs), ``head`` the target's head [Vr, H]; DFlash2 also top_k, output_multiplier,
        softcap and the selector's w_hidden, w_pred, w_succ. BF16 arrays as uint16 bits (device or
        host) or ml_dtypes.bfloat16."""
        self.drop()
        wts = self._fb_weights(weights, variant, stacked=True)
        d = int(head_dim)
        hq, hk = np.shape(weights["wq"])[-2] // d, np.shape(weights["wk"])[-2] // d
        inter = np.shape(weights["w_gate"])[-2]
        emb = self._bits(embed)
        head_b = self._bits(head)
        n_layers = len(windows)
        if wts["wqkv"].shape[0] != n_layers:
            raise ValueError(f"FastRound.load: {n_layers} windows, {wts['wqkv'].shape[0]} layers")
        if head_b.shape[1] != emb.shape[1]:
            raise ValueError(f"FastRound.load: head {head_b.shape} and embed {emb.shape} widths differ")
        Dims(1, 2, emb.shape[1], hq, hk, d, inter, variant == "dflash2")  # refuses unusable shapes now
        self._fb_dims(wts, weights, 1, 2, emb.shape[1], d, variant)
        extra = {}
        if variant == "dflash2":
            k = int(top_k)
            if not 0 < k <= _TOPK_MAX:
                raise ValueError(f"candidate_topk: top_k = {k} outside 1..{_TOPK_MAX}")
            if min(head_b.shape[0], max(int(vocab_size), 0)) < k:
                raise ValueError(f"candidate_topk: fewer eligible rows than top_k = {k}")
            extra = {"top_k": k, "output_multiplier": float(output_multiplier or 0.0), "softcap": float(softcap or 0.0),
                     "w_hidden": self._bits(w_hidden), "w_pred": self._bits(w_pred), "w_succ": self._bits(w_succ)}
            if extra["w_pred"].shape[1] != extra["w_hidden"].shape[0] or extra["w_succ"].shape[1] != \
                    extra["w_hidden"].shape[0]:
                raise ValueError(f"candidate_selector: codebooks {extra['w_pred'].shape}, {extra['w_succ'].shape} "
                                 f"need rank {extra['w_hidden'].shape[0]}")
        elif min(head_b.shape[0], int(vocab_size)) <= 0:
            raise ValueError("proposal_head: no head row has a global id below vocab_size")
        eng = self._round_eng
        if eng.capture_gemm_always and not eng._capture_gemm:  # its workspace from no capture stream's arena
            cp().cuda.device.get_cublas_handle()
            eng._capture_gemm = CaptureGemm()
        self.drafter = Drafter(variant=variant, wts=wts, embed=emb, final_norm=self._fb_weight_f32(final_norm),
                               head=head_b, freqs=self._inv_freq(d, theta), vocab_size=vocab_size, windows=windows,
                               eps=eps, head_dim=d, mask_token_id=mask_token_id, hq=hq, hk=hk, inter=inter,
                               sources=sources, **extra)
        return self.drafter

    @property
    def head_timings(self) -> dict:
        """The head GEMM's tunings so far: 'M x N x K' -> us per call of gemmEx and each algorithm, the choice
        (or the cuBLASLt error that left the shape on gemmEx)."""
        return fast_lt.describe(self._head_lt)

    def drop(self):
        """Forget the drafter, its workspaces and graphs."""
        if self._ws:
            cp().cuda.Device().synchronize()
        self._ws.clear()
        self.drafter = None

    def workspace(self, B: int, W: int, C: int) -> RoundWorkspace:
        """The (B, W, C) workspace (made on first use): an engine may catch its rings up in place
        in ``ws.ck`` / ``ws.cv`` and pass them to step (then nothing is copied)."""
        if self.drafter is None:
            raise RuntimeError("FastRound: load a drafter first")
        key = (int(B), int(W), int(C))
        ws = self._ws.get(key)
        if ws is None:
            if W < 2:
                raise ValueError(f"FastRound: W = {W} < 2 (num_drafts >= 1)")
            if len(self._ws) >= self.max_workspaces:  # the oldest goes, with its graph
                cp().cuda.Device().synchronize()
                self._ws.pop(next(iter(self._ws)))
            ws = self._ws[key] = RoundWorkspace(self._round_eng, self.drafter, *key, route=self._head_route)
        return ws

    def environment(self) -> dict:
        rec = super().environment()
        rec["fast_round"] = ("proposal_round: catch-up per Op (feature_capture, fast context_kv in place), then "
                             "masked_block + head (+ selector) as one CUDA graph per (B, W, C), captured on the second "
                             "step; GEMMs " + ("CaptureGemm (cublasGemmEx via ctypes, 32 MiB workspace) eager and "
                                               "captured" if self._round_eng.capture_gemm_always else
                                               "gemm_bf16 eager, CaptureGemm captured"))
        rec["fast_round_head"] = (f"round_head_lt={self.options.round_head_lt}: the head GEMM on the fastest of cublasGemmEx and up to 8 "
                                  f"cuBLASLt heuristic algorithms (FP32 reductions only), timed at a shape's first "
                                  f"eager step, kept if faster by > {fast_lt.MARGIN:.0%}, heads of >= "
                                  f"{fast_lt.MIN_BYTES >> 20} MiB; tunings so far: "
                                  + json.dumps(self.head_timings))
        rec["fast_round_pdl"] = (f"the block's glue and attention kernels under programmatic dependent launch "
                                 f"(kernels_cu/pdl.py, active={pdl.active()}); the captured graph's PDL edges "
                                 f"relaxed to launch order: LAUNCH_ORDER={pdl.LAUNCH_ORDER} from B * W >= "
                                 f"{self.options.launch_order_min_rows} rows")
        capable = cluster_capable()
        rec["fast_round_selector"] = (
            "select.cu (options.exact_selector)" if self.options.exact_selector else
            "fast/selector.cu (fast_rowdot_*, fast_selector_walk where walk_supported)" if capable else
            "select.cu (no sm_90+ device here: no thread-block clusters)")
        return rec

    # --- the device step -----------------------------------------------------------------------

    def _device_step(self, ws: RoundWorkspace, tune: bool = False):
        """The round's device part on the current stream, from ws's inputs into ws's outputs. ``tune``
        (an eager call, never a capture): the head GEMM's shape may be tuned now (kernels_cu.fast.lt,
        options.round_head_lt) if it was not yet; a capture replays the choice made for the shape."""
        d, eng, dm = self.drafter, self._round_eng, ws.dims
        layers = [(n, win, ws.ck[n], ws.cv[n].view(np.uint16)) for n, win in enumerate(d.windows)]
        # DFlash attends only the live columns; DFlash2 computes all W (as FastBlockMixin.masked_block)
        attn_live = ws.block.LIVE_ALL if dm.conv else ws.live
        block_forward(eng, ws.block, dm, d.wts, layers, frontier=ws.frontier, live=attn_live, eps=d.eps,
                      freqs=d.freqs, entry={"src_bits": d.embed, "tok": ws.anchor, "mask_id": d.mask_token_id},
                      exit={"norm_w": d.final_norm, "norm_hi": ws.hidden, "skip_first": True})
        B, K = dm.B, dm.W - 1
        x = ws.hidden.reshape(B * K, d.H)
        # candidate_topk (k, the multiplier and softcap on the scores) or proposal_head (k = 1, no scores)
        k, mult, cap = (d.top_k, d.multiplier, d.softcap) if dm.conv else (1, 0.0, 0.0)
        if ws.fused:  # the head with the top-k in its epilogue
            head_topk_into(x, d.head, ws.fh_maps, d.vocab_size, k, mult, cap, ws.fh_partial, ws.scores, ws.ids,
                           self.options)
        else:
            shape = (x.shape[0], d.head.shape[0], x.shape[1])
            lt = self.options.round_head_lt and eng.capture_gemm_always and d.head.nbytes >= fast_lt.MIN_BYTES
            if lt and (tune or shape in self._head_lt):  # a capture only replays a choice made eagerly
                fast_lt.tuned(self._head_lt, x, d.head, ws.logits, eng._capture_gemm)
            else:
                eng.gemm(x, d.head, ws.logits)
            topk_into(ws.logits, None, d.vocab_size, k, mult, cap, ws.partial, ws.scores, ws.ids, ws.topk_bound,
                      self.options)
        if dm.conv:  # then candidate_selector
            rowdot_bits_into(x, d.w_hidden, ws.g, exact=self.options.exact_selector)
            selector_walk_into(ws.g.reshape(B, K, -1), ws.scores.reshape(B, K, k), ws.ids.reshape(B, K, k),
                               ws.anchor, d.w_pred, d.w_succ, ws.temperature, ws.seed, ws.frontier, ws.path,
                               ws.tokens, ws.q, exact=self.options.exact_selector)

    def step(self, *, anchor, frontier, live, context_k, context_v, num_drafts, temperature=None, seed=None,
             graph: bool | None = None) -> dict:
        """One round's device part: masked_block and the head (and the DFlash2 selector) on the
        loaded drafter. Inputs: anchor [B], frontier [B], live [B], context_k [L, B, C, Hk, D] BF16
        bits, context_v FP16 (the caught-up rings), temperature / seed [B] (DFlash2). Returns the
        workspace's output arrays (tokens [B, K], q, q_ids, hidden), overwritten by the next step of
        the same (B, W, C): copy what must outlive it. ``graph`` (default: the object's) False runs
        eagerly. ``self.last_path`` says how it ran."""
        c = cp()
        B, W, C = int(np.shape(anchor)[0]), int(num_drafts) + 1, int(np.shape(context_k)[2])
        ws = self.workspace(B, W, C)
        use_graph = self.graph if graph is None else bool(graph)
        caller = c.cuda.get_current_stream()
        s = ws.stream
        s.wait_event(caller.record(c.cuda.Event(disable_timing=True)))
        with s:
            _put(ws.anchor, anchor)
            _put(ws.frontier, frontier)
            _put(ws.live, live)
            _put(ws.ck, context_k)
            _put(ws.cv, context_v)
            if self.drafter.conv:
                _put(ws.temperature, temperature)
                _put(ws.seed, seed)
            if use_graph and ws.graph is not None:
                ws.graph.launch(s)
                self.last_path = "graph"
            elif use_graph and ws.calls >= 1 and ws.capture_error is None:
                self.last_path = self._capture(ws)
            else:
                self._device_step(ws, tune=True)
                self.last_path = "eager" if ws.capture_error is None else f"eager (capture failed: {ws.capture_error})"
            ws.calls += 1
        caller.wait_event(s.record(c.cuda.Event(disable_timing=True)))
        return ws.outputs()

    def _capture(self, ws: RoundWorkspace) -> str:
        s = ws.stream
        s.begin_capture()
        try:
            self._device_step(ws)
        except Exception as exc:  # noqa: BLE001 - fall back to eager, saying why
            try:
                s.end_capture()
            except Exception:  # noqa: BLE001,S110 - the capture's own error is the one to keep
                pass
            return self._capture_failed(ws, exc)
        try:  # the capture ends here whatever happens next (cuStreamEndCapture ends it on an error too)
            # PDL edges relaxed to launch order where PDL is on and the block has options.launch_order_min_rows rows or
            # more (kernels_cu/pdl.py end_capture: the driver's end of capture, the edge rewrite, instantiation),
            # else as captured; CuPy's graph without PDL
            if pdl.active():
                ws.graph = pdl.end_capture(s, launch_order=pdl.LAUNCH_ORDER and ws.dims.M >= self.options.launch_order_min_rows)
            else:
                ws.graph = s.end_capture()
        except Exception as exc:  # noqa: BLE001 - e.g. a driver without the graph edge API: eager, saying why
            return self._capture_failed(ws, exc)
        ws.graph.launch(s)
        return "capture"

    def _capture_failed(self, ws: RoundWorkspace, exc: Exception) -> str:
        """No graph for this workspace (later steps run eagerly); this step runs eagerly now."""
        ws.graph = None
        ws.capture_error = f"{type(exc).__name__}: {exc}"
        self._device_step(ws)
        return f"eager (capture failed: {ws.capture_error})"

    # --- the Op ---------------------------------------------------------------------------------

    def _drafter_for(self, kw: dict, cfg, sd: dict) -> Drafter:
        """The loaded drafter if it was loaded from these very arrays, else a new one."""
        srcs = tuple(kw[k] for k in sorted(kw) if k.startswith(pr.PREFIX)) + (kw["embed"], kw["head"])
        tag = json.dumps(kw["config"], sort_keys=True, default=str), int(kw["vocab_size"])
        d = self.drafter
        if d is not None and len(d.sources) == len(srcs) + 1 and d.sources[-1] == tag and \
                all(a is b for a, b in zip(d.sources, srcs)):
            return d
        self.resident.clear()  # the previous checkpoint's weights
        c = cp()
        names = dict(sdm.LAYER_KEYS)
        if cfg.variant == "dflash2":
            names.update(sdm.CONV_KEYS)

        def dev(a):
            return c.asarray(a.view(np.uint16) if isinstance(a, np.ndarray) and a.dtype.name == "bfloat16" else a)

        weights = {name: c.stack([dev(sd[sdm.layer_key(n, suffix)]) for n in range(cfg.num_hidden_layers)])
                   for name, suffix in names.items()}
        head = pr.head_inputs(cfg, dev(kw["head"]), kw["vocab_size"])
        extra = {}
        if cfg.variant == "dflash2":
            sel = sdm.candidate_selector_inputs(sd, cfg)
            extra = {k: head[k] for k in ("top_k", "output_multiplier", "softcap")}
            extra.update({k: dev(v) for k, v in sel.items()})
        return self.load(variant=cfg.variant, weights=weights, embed=dev(kw["embed"]),
                         final_norm=dev(sd["norm.weight"]), head=head["head"], vocab_size=head["vocab_size"],
                         windows=list(cfg.windows), eps=cfg.rms_norm_eps, theta=cfg.rope_theta, head_dim=cfg.head_dim,
                         mask_token_id=cfg.mask_token_id, sources=(*srcs, tag), **extra)

    def catch_up(self, ws: RoundWorkspace, cfg, sd, *, block_outputs, frontier, ctx_frontier, context_wk=None,
                 context_wv=None):
        """The round's catch-up per Op (reference.proposal_round.run's step 1) in place into the
        workspace's rings: feature_capture per request, then context_kv per layer (the fast mode's,
        which writes the given ring views). Reads the frontiers on the host."""
        frontier = np.asarray(cp().asnumpy(cp().asarray(frontier)), np.int64)
        ctx_frontier = np.asarray(cp().asnumpy(cp().asarray(ctx_frontier)), np.int64)
        feature = sdm.feature_capture_inputs(sd, cfg)
        ctx = [sdm.context_kv_inputs(sd, cfg, n, context_wk, context_wv) for n in range(cfg.num_hidden_layers)]
        T = int(np.shape(block_outputs)[2])
        for b in range(frontier.shape[0]):
            rows = int(frontier[b] - ctx_frontier[b])
            if rows < 0 or rows > T:
                raise ValueError(f"proposal_round: row {b} has {rows} pending rows, block_outputs holds {T}")
            if not rows:
                continue
            context = self.feature_capture(block_outputs=block_outputs[b][:, :rows], **feature)["context"]
            for n in range(cfg.num_hidden_layers):
                out = self.context_kv(context=context, k_cache=ws.ck[n, b], v_cache=ws.cv[n, b],
                                      start=int(ctx_frontier[b]), storage="ring", **ctx[n])
                if out["k_cache"].data.ptr != ws.ck[n, b].data.ptr:  # not in place: bring it back
                    ws.ck[n, b] = out["k_cache"]
                    ws.cv[n, b] = out["v_cache"]

    def proposal_round(self, **kw):
        if not self.graph:
            return super().proposal_round(**kw)
        extra = sorted(k for k in kw if not k.startswith(pr.PREFIX) and k not in pr.INPUTS + pr.PARAMS)
        if extra:
            raise TypeError(f"proposal_round: unexpected argument {extra[0]!r}")
        c = cp()
        anchor = c.asarray(kw["anchor"])
        B = int(anchor.shape[0])
        cfg, sd = pr.unpack(kw, kw["num_drafts"], B)
        self._drafter_for(kw, cfg, sd)
        k_cache, v_cache = c.asarray(kw["k_cache"]), c.asarray(kw["v_cache"])
        ws = self.workspace(B, cfg.K + 1, int(k_cache.shape[2]))
        _put(ws.ck, k_cache)
        _put(ws.cv, v_cache)
        self.catch_up(ws, cfg, sd, block_outputs=c.asarray(kw["block_outputs"]), frontier=kw["frontier"],
                      ctx_frontier=kw["ctx_frontier"], context_wk=kw.get("context_wk"), context_wv=kw.get("context_wv"))
        args = {"anchor": anchor, "frontier": kw["frontier"], "live": kw["live"], "context_k": ws.ck,
                "context_v": ws.cv, "num_drafts": cfg.K, "temperature": kw["temperature"], "seed": kw["seed"]}
        paths = []
        for _ in range(3):  # eager warm-up, then the capture (later calls of this shape replay)
            out = self.step(**args)
            paths.append(self.last_path)
            if self.last_path in ("graph", "capture") or self.last_path.startswith("eager (capture failed"):
                break
        self.round_paths = paths
        return {"tokens": out["tokens"].copy(), "q": out["q"].copy(), "q_ids": out["q_ids"].copy(),
                "k_cache": ws.ck.copy(), "v_cache": ws.cv.copy()}
