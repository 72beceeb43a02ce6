"""GPU benchmark: each Op at the official geometries in the exact mode, the fast mode and the
same math in PyTorch BF16 eager.

Method: CUDA events around the call only, 3 warm-ups, the
median of 25 timed calls, the L2 (60 MB on an H200) flushed before every call by writing a
256 MB buffer; inputs are created once in PyTorch and shared with CuPy through DLPack (no
copies), so the three versions read the same device memory. Reported with each Op: the floor
(bytes that must move at the measured copy bandwidth), ours / floor and ours / torch.

    python -m benchmarks.gpu_bench [--ops candidate_topk,proposal_head,...] [--quick] [--geometry]
                                   [--json out.json]

Prints a table last; --json writes every number with the environment (versions, compile
options). --geometry also times the full-geometry conformance run (both official geometries, the
fast mode, the float64 reference on the GPU) after the Op rows, as a user runs it: the CLI in a
subprocess, wall clock from start to report. Needs CuPy and PyTorch on a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time

import numpy as np

from kernels_cu.fast.perf import ring_bytes

WARMUP, REPS = 3, 25
FLUSH_BYTES = 256 << 20


def _imports():
    import cupy
    import torch

    return cupy, torch


class Timer:
    def __init__(self, cp, torch):
        self.cp, self.torch = cp, torch
        self.flush = cp.empty(FLUSH_BYTES // 4, dtype=cp.float32)

    def __call__(self, fn, warmup=WARMUP, reps=REPS) -> float:
        """Median milliseconds of fn() over reps calls, L2 flushed before each."""
        cp = self.cp
        for _ in range(warmup):
            fn()
        cp.cuda.Device().synchronize()
        times = []
        for i in range(reps):
            self.flush.fill(float(i))
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        return statistics.median(times)


def bits(cp, torch_bf16):
    """A CuPy uint16 view (BF16 bits) of a torch bfloat16 tensor, through DLPack (no copy)."""
    return cp.from_dlpack(torch_bf16.contiguous().view(__import__("torch").int16)).view(cp.uint16)


def measure_ceilings(cp, torch, timer) -> dict:
    n = 1 << 30  # 1 GiB copy
    a = torch.empty(n // 2, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    t_copy = timer(lambda: b.copy_(a), reps=10)
    bw = 2 * n / (t_copy * 1e-3)  # bytes read + written
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t_mm = timer(lambda: x @ y, reps=10)
    del a, b, x, y
    return {"copy_bandwidth_TBps": bw / 1e12, "bf16_gemm_TFLOPs_8192": 2 * 8192**3 / (t_mm * 1e-3) / 1e12}


def gemm_stream_rate(cp, torch, timer) -> dict:
    """Our BF16 gemmEx at a weight-streaming shape (16 x 5120 @ 5120 x 17408) against copy speed."""
    from kernels_cu.fast.gemm import gemm_bf16

    x = torch.randn(16, 5120, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(17408, 5120, dtype=torch.bfloat16, device="cuda") * 0.01
    xb, wb = bits(cp, x), bits(cp, w)
    out = cp.empty((16, 17408), dtype=cp.float32)
    t = timer(lambda: gemm_bf16(xb, wb, out))
    tt = timer(lambda: x @ w.T)
    return {"gemmEx_16x5120x17408_ms": t, "torch_16x5120x17408_ms": tt, "bytes": w.numel() * 2}


# --- Ops -----------------------------------------------------------------------------------


def bench_candidate_topk(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    for name, vr, h in [("27B", 248320, 5120)]:
        head = torch.randn(vr, h, dtype=torch.bfloat16, device="cuda") * (h**-0.5)
        hb = bits(cp, head)
        fast.prepare(head=hb)
        for b, w in shapes:
            kd = w - 1
            hid = torch.randn(b, kd, h, dtype=torch.bfloat16, device="cuda")
            hidb = bits(cp, hid)
            kw = dict(hidden=hidb, head=hb, vocab_size=vr - 192, top_k=16)

            def tor():
                z = (hid.reshape(-1, h) @ head.T).float()
                z[:, vr - 192:] = -math.inf
                return torch.topk(z, 16, dim=1)

            t_exact = timer(lambda: exact.candidate_topk(**kw), warmup=1, reps=5) if exact else None
            rows.append(row("candidate_topk", f"{name} B{b} K{kd}", t_exact, timer(lambda: fast.candidate_topk(**kw)),
                            timer(tor), vr * h * 2 / floor_bw * 1e3))
            # the two parts of the fast mode, each against its torch counterpart
            from kernels_cu.fast.gemm import gemm_bf16

            m = b * kd
            x2 = hidb.reshape(m, h)
            logits = cp.empty((m, vr), dtype=cp.float32)
            rows.append(row("candidate_topk[gemm]", f"{name} M{m}", None, timer(lambda: gemm_bf16(x2, hb, logits)),
                            timer(lambda: hid.reshape(-1, h) @ head.T), vr * h * 2 / floor_bw * 1e3))
            zt = torch.from_dlpack(logits)
            rows.append(row("candidate_topk[select]", f"{name} M{m}", None,
                            timer(lambda: fast._topk_rows(logits, None, vr - 192, 16)),
                            timer(lambda: torch.topk(zt, 16, dim=1)), m * vr * 4 / floor_bw * 1e3))
        del head


def bench_proposal_head(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    for name, vr, h in [("35B", 248320, 2048)]:
        head = torch.randn(vr, h, dtype=torch.bfloat16, device="cuda") * (h**-0.5)
        hb = bits(cp, head)
        fast.prepare(head=hb)
        for b, w in shapes:
            kd = w - 1
            hid = torch.randn(b, kd, h, dtype=torch.bfloat16, device="cuda")
            hidb = bits(cp, hid)
            kw = dict(hidden=hidb, head=hb, vocab_size=vr - 192)

            def tor():
                z = (hid.reshape(-1, h) @ head.T).float()
                z[:, vr - 192:] = -math.inf
                return torch.argmax(z, dim=1)

            rows.append(row("proposal_head", f"{name} B{b} K{kd}",
                            timer(lambda: exact.proposal_head(**kw), warmup=1, reps=5) if exact else None,
                            timer(lambda: fast.proposal_head(**kw)), timer(tor), vr * h * 2 / floor_bw * 1e3))
        del head


def bench_target_distribution(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    vr = 248320
    for n in sorted({b * w for b, w in shapes}):
        for label, top_k, top_p in [("top-p 0.9", 0, 0.9), ("top-k 50 + top-p 0.9", 50, 0.9)]:
            g = torch.Generator(device="cuda").manual_seed(n)
            logits = torch.randn(n, vr, device="cuda", generator=g) * 3
            prompt = (torch.rand(n, vr, device="cuda", generator=g) < 0.001).to(torch.uint8)
            counts = (torch.rand(n, vr, device="cuda", generator=g) < 0.0005).to(torch.int32)
            temp = torch.full((n,), 0.8, device="cuda")
            kw = dict(logits=cp.from_dlpack(logits), prompt_mask=cp.from_dlpack(prompt),
                      output_counts=cp.from_dlpack(counts), temperature=cp.from_dlpack(temp),
                      top_p=cp.full(n, top_p, cp.float32), min_p=cp.zeros(n, cp.float32),
                      repetition_penalty=cp.full(n, 1.1, cp.float32), frequency_penalty=cp.full(n, 0.1, cp.float32),
                      presence_penalty=cp.full(n, 0.1, cp.float32), top_k=cp.full(n, top_k, cp.int32),
                      vocab_size=vr - 192)

            def tor():
                z = logits.clone()
                z[:, vr - 192:] = -math.inf
                seen = counts > 0
                pen = (prompt > 0) | seen
                z = torch.where(pen, torch.where(z > 0, z / 1.1, z * 1.1), z)
                z = z - 0.1 * counts - 0.1 * seen
                z = z / temp[:, None]
                if top_k > 0:  # top-k first, then top-p over the k survivors
                    vals, idx = torch.topk(z, top_k, dim=1)
                else:
                    vals, idx = torch.sort(z, dim=1, descending=True)
                p = torch.softmax(vals, dim=1)
                cum = torch.cumsum(p, dim=1)
                keep = (cum - p) < top_p
                p = torch.where(keep, p, 0)
                p = p / p.sum(dim=1, keepdim=True)
                return torch.zeros_like(z).scatter_(1, idx, p)

            floor = n * vr * (4 + 1 + 4 + 4) / floor_bw * 1e3
            rows.append(row("target_distribution", f"N{n} V{vr} {label}",
                            timer(lambda: exact.target_distribution(**kw), warmup=1, reps=5) if exact else None,
                            timer(lambda: fast.target_distribution(**kw)), timer(tor), floor))


def bench_context_kv(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    for name, h, cap in [("27B", 5120, 2048), ("35B", 2048, 4096)]:
        t, hk, d = 4096, 8, 128
        ctx = torch.randn(t, h, dtype=torch.bfloat16, device="cuda")
        wk = torch.randn(hk * d, h, dtype=torch.bfloat16, device="cuda") * h**-0.5
        wv = torch.randn(hk * d, h, dtype=torch.bfloat16, device="cuda") * h**-0.5
        kn = torch.rand(d, device="cuda").to(torch.bfloat16) + 0.5
        kc = torch.zeros(cap, hk, d, dtype=torch.bfloat16, device="cuda")
        vc = torch.zeros(cap, hk, d, dtype=torch.float16, device="cuda")
        kw = dict(context=bits(cp, ctx), wk=bits(cp, wk), wv=bits(cp, wv), k_norm=bits(cp, kn), start=5,
                  eps=1e-6, theta=1e7, head_dim=d)
        kcb, vcb = bits(cp, kc), cp.from_dlpack(vc)
        fast.prepare(wk=kw["wk"], wv=kw["wv"])
        first = max(0, t - cap)
        pos = torch.arange(5 + first, 5 + t, device="cuda", dtype=torch.float64)
        inv = 1e7 ** (-torch.arange(0, d // 2, device="cuda", dtype=torch.float64) * 2 / d)
        ang = pos[:, None] * inv[None, :]
        cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
        slots = (torch.arange(5 + first, 5 + t, device="cuda") % cap)
        wkv = torch.cat([wk, wv], 0)

        def tor():
            kv = (ctx[first:] @ wkv.T).float()
            k = kv[:, : hk * d].view(-1, hk, d)
            v = kv[:, hk * d:].view(-1, hk, d)
            k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * kn.float()
            k1, k2 = k[..., : d // 2], k[..., d // 2:]
            c, s = cos[:, None, :], sin[:, None, :]
            k = torch.cat([k1 * c - k2 * s, k2 * c + k1 * s], -1)
            kc.index_copy_(0, slots, k.to(torch.bfloat16))
            vc.index_copy_(0, slots, v.to(torch.bfloat16).to(torch.float16))

        floor = (t - first) * h * 2 + 2 * hk * d * h * 2 + (t - first) * hk * d * 4
        rows.append(row("context_kv", f"{name} T{t} C{cap}",
                        timer(lambda: exact.context_kv(k_cache=kcb, v_cache=vcb, **kw), warmup=1, reps=5)
                        if exact else None,
                        timer(lambda: fast.context_kv(k_cache=kcb, v_cache=vcb, **kw)), timer(tor),
                        floor / floor_bw * 1e3))


def bench_draft_attention(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    import torch.nn.functional as F

    for name, cap, window in [("35B full", 4096, 0), ("27B local", 2048, 2048)]:
        for b, w in shapes:
            hq, hk, d, front = 32, 8, 128, 4096
            q = torch.randn(b, w, hq, d, dtype=torch.bfloat16, device="cuda")
            k = torch.randn(b, w, hk, d, dtype=torch.bfloat16, device="cuda")
            v = torch.randn(b, w, hk, d, dtype=torch.bfloat16, device="cuda")
            kc = torch.randn(b, cap, hk, d, dtype=torch.bfloat16, device="cuda")
            vc = torch.randn(b, cap, hk, d, dtype=torch.bfloat16, device="cuda").to(torch.float16)
            frontier = torch.full((b,), front, dtype=torch.int64, device="cuda")
            live = torch.full((b,), w, dtype=torch.int32, device="cuda")
            kw = dict(q=bits(cp, q), k=bits(cp, k), v=bits(cp, v), k_cache=bits(cp, kc), v_cache=cp.from_dlpack(vc),
                      frontier=cp.from_dlpack(frontier), live=cp.from_dlpack(live), window=window)
            # positions of the ring slots and of the block; the mask as the spec's |pk - pq| < S
            slot = torch.arange(cap, device="cuda")
            lo = max(0, front - cap)
            pos_c = slot + ((lo - slot + cap - 1) // cap) * cap  # the position p >= lo with p mod C = slot
            pos_q = front + torch.arange(w, device="cuda")
            pk = torch.cat([pos_c, pos_q])
            valid = torch.cat([pos_c < front, torch.ones(w, dtype=torch.bool, device="cuda")])
            mask = valid[None, :] & ((pk[None, :] - pos_q[:, None]).abs() < window if window else True)
            mask = mask[None, None].expand(b, 1, w, cap + w)

            def tor():
                kk = torch.cat([kc, k], 1).transpose(1, 2)
                vv = torch.cat([vc.to(torch.bfloat16), v], 1).transpose(1, 2)
                return F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=mask, enable_gqa=True)

            floor = b * cap * hk * d * 4 + 2 * b * w * hq * d * 2 + 2 * b * w * hk * d * 2
            t_exact = timer(lambda: exact.draft_attention(**kw)) if exact else None
            t_fast = timer(lambda: fast.draft_attention(**kw))
            rows.append(row("draft_attention", f"{name} B{b} W{w} F{front}", t_exact, t_fast, timer(tor),
                            floor / floor_bw * 1e3))


# --- masked_block (fast/block.py) ----------------------------------------------------------


def _block_weights(torch, cfg, seed=0) -> tuple[dict, dict]:
    """(layer weights, {embed, final_norm}): random full-width BF16 weights of one official
    geometry, built on the device with the scales of conformance.geometry.weights (which builds the
    same on the host)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    L, h, inter = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
    hq, hk, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def gauss(shape, scale):
        return (torch.randn(shape, device="cuda", generator=g) * scale).to(torch.bfloat16)

    def gain(shape):
        return (torch.rand(shape, device="cuda", generator=g) + 0.5).to(torch.bfloat16)

    w = {"input_norm": gain((L, h)), "wq": gauss((L, hq * d, h), h**-0.5), "wk": gauss((L, hk * d, h), h**-0.5),
         "wv": gauss((L, hk * d, h), h**-0.5), "q_norm": gain((L, d)), "k_norm": gain((L, d)),
         "wo": gauss((L, h, hq * d), (hq * d) ** -0.5), "post_norm": gain((L, h)),
         "w_gate": gauss((L, inter, h), h**-0.5), "w_up": gauss((L, inter, h), h**-0.5),
         "w_down": gauss((L, h, inter), inter**-0.5)}
    if cfg.variant == "dflash2":
        for side in ("attn", "mlp"):
            base = torch.empty((L, 2, 2, h), device="cuda")
            base[:, :, 0] = 1.0 + 0.2 * torch.randn((L, 2, h), device="cuda", generator=g)
            base[:, :, 1] = 0.5 * torch.randn((L, 2, h), device="cuda", generator=g)
            w[f"{side}_conv_base"] = base.to(torch.bfloat16)
            w[f"{side}_conv_proj"] = gauss((L, 4 * (h // 16), h), 0.2 * h**-0.5)
    extra = {"embed": gauss((cfg.vocab_size, h), 1.0), "final_norm": gain((h,))}
    return w, extra


def _torch_block(torch, F, tw, kc, vc, anchor, frontier, attn_live, cfg, w, attention=True, x_in=None):
    """The masked block in PyTorch BF16 (F.linear through the concatenated [Wq;Wk;Wv] and
    [Wgate;Wup], FP32 RMSNorm and RoPE, SDPA with a boolean mask and enable_gqa, SiLU-mul, the
    DFlash2 conv); ``attention=False`` puts q where the attention output goes (no SDPA). ``x_in``: start from
    these BF16 rows [b, w, H] instead of the embedding and return the BF16 residual stream (draft_layer)."""
    bf = torch.bfloat16
    b = anchor.shape[0] if x_in is None else x_in.shape[0]
    h, hq, hk, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps, conv, G = cfg.rms_norm_eps, cfg.variant == "dflash2", cfg.hidden_size // 16
    if x_in is None:
        tokens = torch.full((b, w), cfg.mask_token_id, dtype=torch.long, device="cuda")
        tokens[:, 0] = anchor
        x = tw["embed"][tokens].float()
    else:
        x = x_in.float()
    cols = torch.arange(w, device="cuda")
    pq = frontier[:, None] + cols[None, :]
    ang = pq.double()[..., None] * tw["inv_freq"]
    cos, sin = ang.cos().float()[:, :, None, :], ang.sin().float()[:, :, None, :]
    cap = kc.shape[2]
    lo = frontier[:, None] - cap
    p_ctx = lo + torch.remainder(torch.arange(cap, device="cuda")[None, :] - lo, cap)
    pk = torch.cat([p_ctx, pq], 1)
    present = torch.cat([p_ctx >= 0, cols[None, :] < attn_live[:, None]], 1)
    masks = {}
    for s in set(cfg.windows):
        m = present[:, None, :].expand(b, w, cap + w)
        if s > 0:
            m = m & ((pk[:, None, :] - pq[:, :, None]).abs() < s)
        masks[s] = m[:, None]

    def rms(t, g):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * g.float()

    def head(t, g, nh):
        t = rms(t.float().reshape(b, w, nh, d), g)
        t1, t2 = t[..., : d // 2], t[..., d // 2:]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1).to(bf)

    def gconv(t, base_side, delta):
        tg = t.view(b, w, G, 16)
        c = base_side.float().view(1, 1, 2, G, 16) + delta[..., None]
        prev = torch.cat([torch.zeros_like(tg[:, :1]), c[:, 1:, 1] * tg[:, :-1]], 1)
        return (c[:, :, 0] * tg + prev).reshape(b, w, h)

    def branch_in(t, side, l):
        if not conv:
            return t.to(bf), None
        dl = F.linear(t.to(bf), tw[f"{side}_conv_proj"][l]).float().view(b, w, 2, 2, G)
        return gconv(t, tw[f"{side}_conv_base"][l, 0], dl[:, :, 0]).to(bf), dl[:, :, 1].to(bf).float()

    def branch_out(t, side, l, fd):
        return gconv(t, tw[f"{side}_conv_base"][l, 1], fd).to(bf).float() if conv else t

    for l, s in enumerate(cfg.windows):
        nb, fda = branch_in(rms(x, tw["input_norm"][l]), "attn", l)
        q, k, v = F.linear(nb, tw["wqkv"][l]).split([hq * d, hk * d, hk * d], -1)
        q, k = head(q, tw["q_norm"][l], hq), head(k, tw["k_norm"][l], hk)
        if attention:
            kk = torch.cat([kc[l], k], 1).transpose(1, 2)
            vv = torch.cat([vc[l].to(bf), v.reshape(b, w, hk, d)], 1).transpose(1, 2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=masks[s], enable_gqa=True)
            a = a.transpose(1, 2).reshape(b, w, hq * d)
        else:
            a = q.reshape(b, w, hq * d)
        y = x + branch_out(F.linear(a, tw["wo"][l]).float(), "attn", l, fda)
        mb, fdm = branch_in(rms(y, tw["post_norm"][l]), "mlp", l)
        gate, up = F.linear(mb, tw["wgu"][l]).chunk(2, -1)
        x = y + branch_out(F.linear(F.silu(gate) * up, tw["w_down"][l]).float(), "mlp", l, fdm)
    if x_in is not None:
        return x.to(bf)
    return rms(x[:, 1:], tw["final_norm"]).to(bf)


def _torch_graph(torch, fn):
    """torch.cuda.CUDAGraph capture of fn (two warm-ups on a side stream first)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def _torch_graph_ms(torch, timer, fn, checks) -> float:
    """The median replay time of fn captured into a torch.cuda.CUDAGraph; NaN (and the reason in
    checks["torch_graph_error"]) when the capture fails."""
    try:
        tgraph, _ = _torch_graph(torch, fn)
        return timer(lambda: tgraph.replay())
    except Exception as exc:  # noqa: BLE001
        checks["torch_graph_error"] = f"{type(exc).__name__}: {exc}"
        return math.nan


def _cupy_graph(cp, fn):
    """A CUDA graph of fn captured on a CuPy stream after one warm-up call there (weights
    resident, workspace made). Returns (graph, captured output, stream): keep the stream, whose
    memory-pool arena holds what the capture allocated."""
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        fn()
        s.synchronize()
        s.begin_capture()
        try:
            out = fn()
        except BaseException:
            try:
                s.end_capture()
            except Exception:  # noqa: BLE001,S110 - the capture's own error is the one to report
                pass
            raise
        g = s.end_capture()
    return g, out, s


def _safe(label, fn):
    """fn() or NaN with the error printed: one failing measurement must not lose the row."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        print(f"{label}: {type(exc).__name__}: {exc}", flush=True)
        return math.nan


def bench_masked_block(cp, torch, timer, exact, fast, shapes, rows, floor_bw, context=4096):
    """masked_block at both official geometries (reference/config.py PRESETS via
    conformance/geometry.py: 27B DFlash2, 35B DFlash), full width, random weights built on the
    device, F = context with geometry.masked_block_case's frontiers and live extents. Rows:
    masked_block (exact / fast / torch eager / floor = weights + caches at copy bandwidth),
    masked_block[graph] (fast captured with CuPy stream capture / torch.cuda.CUDAGraph replay),
    masked_block[no attention] (both without the attention: the GEMMs and glue alone)."""
    import torch.nn.functional as F

    from conformance.geometry import GEOMETRIES, PUBLIC_VOCAB_MARGIN, _capacity
    from kernels_cu.fast.block import CudaEngine, FastBlockMixin
    from reference.config import PRESETS

    if isinstance(fast, FastBlockMixin):
        make = type(fast)
    else:
        make = type("FastBlock", (FastBlockMixin, type(fast)), {})
    keep = []  # capture streams (their pool arenas hold the graphs' buffers)
    for label, geo in [("27B DFlash2", "dflash2-27b"), ("35B DFlash", "dflash-35b-a3b")]:
        cfg = PRESETS[GEOMETRIES[geo]]
        L, hq, hk, d = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        tw, extra = _block_weights(torch, cfg)
        wbits = {k: bits(cp, v) for k, v in tw.items()}
        weight_bytes = sum(v.numel() * 2 for k, v in tw.items() if not k.endswith("norm") and "base" not in k)
        tw.update(extra, wqkv=torch.cat([tw["wq"], tw["wk"], tw["wv"]], 1), wgu=torch.cat([tw["w_gate"], tw["w_up"]], 1),
                  inv_freq=cfg.rope_theta ** (-torch.arange(d // 2, device="cuda", dtype=torch.float64) * 2 / d))
        fb = make()
        cap = _capacity(cfg, context)
        for b, w in shapes:
            g = torch.Generator(device="cuda").manual_seed(b * 100 + w)
            frontier = context - 3 * torch.arange(b, device="cuda", dtype=torch.int64)
            if cfg.variant == "dflash":  # DFlash attends only its live columns: tails across rows
                live = torch.clamp(w - torch.arange(b, device="cuda") % 4, min=1).to(torch.int32)
            else:
                live = torch.full((b,), w, dtype=torch.int32, device="cuda")
            attn_live = live
            kc = torch.randn((L, b, cap, hk, d), device="cuda", generator=g).to(torch.bfloat16)
            vc = torch.randn((L, b, cap, hk, d), device="cuda", generator=g).to(torch.bfloat16).abs().to(torch.float16)
            anchor = torch.randint(0, cfg.vocab_size - PUBLIC_VOCAB_MARGIN, (b,), device="cuda", generator=g,
                                   dtype=torch.int32)
            kw = dict(anchor=cp.from_dlpack(anchor), embed=bits(cp, tw["embed"]), frontier=cp.from_dlpack(frontier),
                      live=cp.from_dlpack(live), context_k=bits(cp, kc), context_v=cp.from_dlpack(vc),
                      final_norm=bits(cp, tw["final_norm"]), mask_token_id=cfg.mask_token_id,
                      windows=list(cfg.windows), eps=cfg.rms_norm_eps, theta=cfg.rope_theta, head_dim=d,
                      variant=cfg.variant, num_drafts=w - 1, **wbits)
            shape = f"{label} B{b} W{w} F{context}"
            floor_w = weight_bytes / floor_bw * 1e3
            floor = (weight_bytes + ring_bytes(cfg, b, cap)) / floor_bw * 1e3

            def tor(attention=True):
                return _torch_block(torch, F, tw, kc, vc, anchor, frontier, attn_live, cfg, w, attention)

            t_exact = _safe(f"{shape} exact", lambda: timer(lambda: exact.masked_block(**kw), warmup=1, reps=5)) \
                if exact else None
            t_fast = _safe(f"{shape} fast", lambda: timer(lambda: fb.masked_block(**kw)))
            t_torch = _safe(f"{shape} torch", lambda: timer(tor))
            rows.append(row("masked_block", shape, t_exact, t_fast, t_torch, floor))
            # checks: fast against torch and the exact mode (relative normwise over the compared mask
            # columns, i + 1 < live: the others are unspecified), graph against eager
            checks = {"shape": shape, "attention": fb._fb_engine().attention_name}
            try:
                cmp = (torch.arange(1, w, device="cuda")[None, :] < live[:, None])[..., None]
                cmp = cmp.expand(b, w - 1, cfg.hidden_size)

                def rel(x, y):
                    return float((x - y)[cmp].norm() / y[cmp].norm())

                hf = torch.from_dlpack(fb.masked_block(**kw)["hidden"].view(cp.int16)).view(torch.bfloat16).float()
                ht = tor().float()
                checks["fast_vs_torch_rel"] = rel(hf, ht)
                if exact:
                    he = torch.from_dlpack(exact.masked_block(**kw)["hidden"].view(cp.int16)).view(torch.bfloat16)
                    he = he.float()
                    checks["fast_vs_exact_rel"] = rel(hf, he)
                    checks["torch_vs_exact_rel"] = rel(ht, he)
            except Exception as exc:  # noqa: BLE001
                checks["check_error"] = f"{type(exc).__name__}: {exc}"
            # graph replay: fast through CuPy stream capture, torch through torch.cuda.CUDAGraph
            t_fast_graph = math.nan
            try:
                graph, captured, stream = _cupy_graph(cp, lambda: fb.masked_block(**kw)["hidden"])
                keep.append((graph, captured, stream))
                t_fast_graph = timer(lambda: graph.launch())
                checks["fast_graph_equals_eager"] = bool(cp.array_equal(captured, fb.masked_block(**kw)["hidden"]))
            except Exception as exc:  # noqa: BLE001
                checks["fast_graph_error"] = f"{type(exc).__name__}: {exc}"
            t_torch_graph = _torch_graph_ms(torch, timer, tor, checks)
            rows.append(row("masked_block[graph]", shape, None, t_fast_graph, t_torch_graph, floor))
            # without the attention: the GEMMs (weight streaming) and the glue kernels alone
            zero_a = cp.zeros((b, w, hq, d), dtype=cp.uint16)
            na = make()
            na.resident, na._freqs = fb.resident, fb._freqs
            na._fb_eng = CudaEngine(attention=(lambda *a, **k: (None, zero_a), "none (zeros)"))
            rows.append(row("masked_block[no attention]", shape, None,
                            _safe(f"{shape} fast no attention", lambda: timer(lambda: na.masked_block(**kw))),
                            _safe(f"{shape} torch no attention", lambda: timer(lambda: tor(False))), floor_w))
            print(json.dumps(checks), flush=True)
            del na, kc, vc
        fb.resident.clear()
        del fb, tw, wbits, extra
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()


# --- proposal_round (fast_round.py) --------------------------------------------------------


def _torch_round_head(torch, F, hidden, tr, cfg, vocab, anchor):
    """The round's head in PyTorch BF16 on the block's hidden [b, K, H]: DFlash argmax over the head
    logits; DFlash2 top-k of the head logits (no multiplier / softcap at this geometry), g = F.linear
    BF16, then the greedy selector walk as gathers and an argmax per position (temperature 0)."""
    z = F.linear(hidden, tr["head"]).float()
    z[..., vocab:] = -math.inf
    if cfg.variant == "dflash":
        return z.argmax(-1)
    u, ids = torch.topk(z, cfg.selector_top_k, dim=-1)
    return torch_greedy_walk(torch, F, hidden, u, ids, anchor, tr["w_hidden"], tr["w_pred"], tr["w_succ"])


def torch_greedy_walk(torch, F, hidden, u, ids, anchor, w_hidden, w_pred, w_succ):
    """The DFlash2 selector's greedy walk in PyTorch (temperature 0): g = F.linear BF16, then per
    position the predecessor's codebook row times g against the candidates' successor rows, plus
    their scores u, and an argmax; hidden [b, K, H], u / ids [b, K, k] -> tokens [b, K]."""
    g = F.linear(hidden, w_hidden).float()
    pred = anchor.long()
    tokens = []
    for i in range(hidden.shape[1]):
        pg = w_pred[pred].float() * g[:, i]  # [b, R]
        e = u[:, i] + torch.einsum("bkr,br->bk", w_succ[ids[:, i].long()].float(), pg)
        pred = ids[:, i].long().gather(1, e.argmax(-1, keepdim=True))[:, 0]
        tokens.append(pred)
    return torch.stack(tokens, 1)


def round_drafter(cp, torch, cfg):
    """A FastRound loaded with random full-width weights of one official geometry (the block's as
    _block_weights, the head, DFlash2's selector codebooks). Returns (fr, torch block weights, torch
    head weights, block weight bits, {embed, final_norm}, bytes of block + head weights)."""
    from conformance.geometry import PUBLIC_VOCAB_MARGIN
    from kernels_cu.fast.round import FastRound

    d, h = cfg.head_dim, cfg.hidden_size
    vr, vocab = cfg.vocab_size, cfg.vocab_size - PUBLIC_VOCAB_MARGIN
    tw, extra = _block_weights(torch, cfg)
    wbits = {k: bits(cp, v) for k, v in tw.items()}
    block_bytes = sum(v.numel() * 2 for k, v in tw.items() if not k.endswith("norm") and "base" not in k)
    tw.update(extra, wqkv=torch.cat([tw["wq"], tw["wk"], tw["wv"]], 1),
              wgu=torch.cat([tw["w_gate"], tw["w_up"]], 1),
              inv_freq=cfg.rope_theta ** (-torch.arange(d // 2, device="cuda", dtype=torch.float64) * 2 / d))
    g0 = torch.Generator(device="cuda").manual_seed(7)
    tr = {"head": (torch.randn(vr, h, device="cuda", generator=g0) * h**-0.5).to(torch.bfloat16)}
    sel = {}
    if cfg.variant == "dflash2":
        r = cfg.selector_rank
        tr.update(w_hidden=(torch.randn(r, h, device="cuda", generator=g0) * h**-0.5).to(torch.bfloat16),
                  w_pred=torch.randn(vr, r, device="cuda", generator=g0).to(torch.bfloat16),
                  w_succ=torch.randn(vr, r, device="cuda", generator=g0).to(torch.bfloat16))
        sel = {"top_k": cfg.selector_top_k, **{k: bits(cp, tr[k]) for k in ("w_hidden", "w_pred", "w_succ")}}
    fr = FastRound()
    fr.load(variant=cfg.variant, weights=wbits, embed=bits(cp, tw["embed"]), final_norm=bits(cp, tw["final_norm"]),
            head=bits(cp, tr["head"]), vocab_size=vocab, windows=list(cfg.windows), eps=cfg.rms_norm_eps,
            theta=cfg.rope_theta, head_dim=d, mask_token_id=cfg.mask_token_id, **sel)
    return fr, tw, tr, wbits, extra, block_bytes + tr["head"].numel() * 2


def round_inputs(cp, torch, cfg, b, w, context):
    """One round's inputs at (B, W, context) (rings at the geometry's capacity, frontiers context -
    3 b, DFlash live tails across rows): (FastRound.step keywords, (k ring, v ring, anchor,
    frontier, live) as torch tensors)."""
    from conformance.geometry import PUBLIC_VOCAB_MARGIN, _capacity

    L, hk, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    vocab, cap = cfg.vocab_size - PUBLIC_VOCAB_MARGIN, _capacity(cfg, context)
    g = torch.Generator(device="cuda").manual_seed(b * 100 + w)
    frontier = context - 3 * torch.arange(b, device="cuda", dtype=torch.int64)
    if cfg.variant == "dflash":
        live = torch.clamp(w - torch.arange(b, device="cuda") % 4, min=1).to(torch.int32)
    else:
        live = torch.full((b,), w, dtype=torch.int32, device="cuda")
    kc = torch.randn((L, b, cap, hk, d), device="cuda", generator=g).to(torch.bfloat16)
    vc = torch.randn((L, b, cap, hk, d), device="cuda", generator=g).to(torch.bfloat16).abs().to(torch.float16)
    anchor = torch.randint(0, vocab, (b,), device="cuda", generator=g, dtype=torch.int32)
    temperature = torch.zeros(b, device="cuda")
    seed = torch.arange(b, device="cuda", dtype=torch.int64)
    kw = {"anchor": cp.from_dlpack(anchor), "frontier": cp.from_dlpack(frontier), "live": cp.from_dlpack(live),
          "context_k": bits(cp, kc), "context_v": cp.from_dlpack(vc), "num_drafts": w - 1,
          "temperature": cp.from_dlpack(temperature), "seed": cp.from_dlpack(seed).view(cp.uint64)}
    return kw, (kc, vc, anchor, frontier, live)


def bench_proposal_round(cp, torch, timer, exact, fast, shapes, rows, floor_bw, context=4096):
    """The round's device part (masked_block, then DFlash proposal_head / DFlash2 candidate_topk +
    candidate_selector, temperature 0) at both official geometries, full width, random weights, F =
    context: kernels_cu.fast_round.FastRound's captured graph replayed (the step's graph, launched on
    the timer's stream) against torch.cuda.CUDAGraph replay of the same math (_torch_block then
    _torch_round_head). Rows: proposal_round (eager: FastRound.step(graph=False) / torch eager) and
    proposal_round[graph]; floor = the bytes the round must move at the copy bandwidth: the block's
    and the head's weights once plus the rings (each layer's K and V of every batch row read once), as
    masked_block's floor (the selector's codebook rows, 2.6 MB, are left out). The weights-only floor
    is in the checks (floor_weights_ms)."""
    import torch.nn.functional as F

    from conformance.geometry import GEOMETRIES, PUBLIC_VOCAB_MARGIN, _capacity
    from reference.config import PRESETS

    for label, geo in [("27B DFlash2", "dflash2-27b"), ("35B DFlash", "dflash-35b-a3b")]:
        cfg = PRESETS[GEOMETRIES[geo]]
        vocab = cfg.vocab_size - PUBLIC_VOCAB_MARGIN
        fr, tw, tr, wbits, extra, weight_bytes = round_drafter(cp, torch, cfg)
        cap = _capacity(cfg, context)
        for b, w in shapes:
            kw, (kc, vc, anchor, frontier, live) = round_inputs(cp, torch, cfg, b, w, context)
            shape = f"{label} B{b} W{w} F{context}"
            rings = ring_bytes(cfg, b, cap)
            floor = (weight_bytes + rings) / floor_bw * 1e3
            checks = {"shape": shape, "weight_bytes": weight_bytes, "ring_bytes": rings,
                      "floor_weights_ms": weight_bytes / floor_bw * 1e3}

            def tor():
                hid = _torch_block(torch, F, tw, kc, vc, anchor, frontier, live, cfg, w)
                return _torch_round_head(torch, F, hid, tr, cfg, vocab, anchor)

            t_eager = t_graph = t_torch_graph = math.nan
            try:
                ws = fr.workspace(b, w, cap)
                eager = {k: v.copy() for k, v in fr.step(**kw, graph=False).items()}  # copies the rings in
                kw_ws = dict(kw, context_k=ws.ck, context_v=ws.cv)  # from now on the rings are in place
                paths = []
                for _ in range(3):  # the eager call above warmed this shape: capture, then replays
                    out = fr.step(**kw_ws)
                    paths.append(fr.last_path)
                checks["paths"] = paths
                checks["head_tuning_us"] = fr.head_timings  # FastRound's head GEMM choices so far (fast_lt)
                checks["graph_equals_eager"] = all(bool(cp.array_equal(out[k], eager[k])) for k in eager)
                tt = torch.from_dlpack(out["tokens"]).long()
                checks["tokens_equal_torch"] = float((tt == tor().long()).float().mean())
                t_eager = _safe(f"{shape} fast eager", lambda: timer(lambda: fr.step(**kw_ws, graph=False)))
                t_graph = timer(lambda: ws.graph.launch())
                # the whole step (its input copies, events and Python) replaying the graph
                checks["fast_step_ms"] = timer(lambda: fr.step(**kw_ws))
            except Exception as exc:  # noqa: BLE001
                checks["fast_graph_error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row("proposal_round", shape, None, t_eager, _safe(f"{shape} torch", lambda: timer(tor)),
                            floor))
            t_torch_graph = _torch_graph_ms(torch, timer, tor, checks)
            rows.append(row("proposal_round[graph]", shape, None, t_graph, t_torch_graph, floor))
            print(json.dumps(checks), flush=True)
            del kc, vc
        fr.drop()
        fr.resident.clear()
        del fr, tw, tr, wbits, extra
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()


# --- feature_capture, grouped_conv, candidate_selector ---------------------------------------------
# At the official geometries, exact and fast mode against the same math in PyTorch BF16 eager, in the same process and
# with the same Timer. Shapes: the decode round's rows (B x W from the shapes) and, for feature_capture, a 4096-row
# prefill chunk.


def bench_feature_capture(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    """Both geometries: the target's chosen block outputs [n, T, Ht] concatenated per row, fc
    [H, n Ht], hidden RMSNorm, BF16 out. T = B x W of each decode shape, then 4096 (prefill)."""
    import torch.nn.functional as F

    for name, h, n in [("27B", 5120, 5), ("35B", 2048, 8)]:
        fc = torch.randn(h, n * h, dtype=torch.bfloat16, device="cuda") * (n * h) ** -0.5
        norm = torch.rand(h, device="cuda").to(torch.bfloat16) + 0.5
        fcb = bits(cp, fc)  # device BF16 bits: used as is (resident), no conversion per call
        for t in sorted({b * w for b, w in shapes} | {4096}):
            blocks = torch.randn(n, t, h, dtype=torch.bfloat16, device="cuda")
            kw = dict(block_outputs=bits(cp, blocks), fc_weight=fcb, hidden_norm=bits(cp, norm),
                      target_layer_ids=list(range(n)), eps=1e-6)

            def tor():
                s = blocks.permute(1, 0, 2).reshape(t, n * h)
                y = F.linear(s, fc).float()
                y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.float()
                return y.to(torch.bfloat16)

            floor = (fc.numel() + blocks.numel() + t * h) * 2
            rows.append(row("feature_capture", f"{name} T{t} n{n}",
                            timer(lambda: exact.feature_capture(**kw), warmup=1, reps=5) if exact else None,
                            timer(lambda: fast.feature_capture(**kw)), timer(tor), floor / floor_bw * 1e3))
            del blocks


def bench_grouped_conv(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    """27B (DFlash2, H 5120, groups of 16): prepare on x (delta = W_delta x, side 0 conv) and finish
    on z with prepare's side-1 delta; torch forms (base + delta) and multiplies once, as the spec."""
    import torch.nn.functional as F

    h = 5120
    g = h // 16
    base = (torch.randn(2, 2, h, device="cuda") * 0.1 + 0.5).to(torch.bfloat16)
    proj = torch.randn(4 * g, h, dtype=torch.bfloat16, device="cuda") * h**-0.5
    for b, w in shapes:
        x = torch.randn(b, w, h, dtype=torch.bfloat16, device="cuda")
        z = torch.randn(b, w, h, dtype=torch.bfloat16, device="cuda")
        kw = dict(x=bits(cp, x), z=bits(cp, z), base=bits(cp, base), proj=bits(cp, proj))

        def conv(t, base_side, delta):  # t [b,w,h] fp32, base_side [2,h], delta [b,w,2,g]
            coef = base_side.float().view(1, 1, 2, g, 16) + delta.float()[..., None]
            tg = t.view(b, w, g, 16)
            out = coef[:, :, 0] * tg
            out[:, 1:] += coef[:, 1:, 1] * tg[:, :-1]
            return out.reshape(b, w, h)

        def tor():
            delta = F.linear(x, proj).view(b, w, 2, 2, g)
            prepared = conv(x.float(), base[0], delta[:, :, 0]).to(torch.bfloat16)
            fd = delta[:, :, 1]
            finished = conv(z.float(), base[1], fd).to(torch.bfloat16)
            return prepared, fd, finished

        floor = (proj.numel() + 3 * x.numel() + base.numel()) * 2
        rows.append(row("grouped_conv", f"27B B{b} W{w}", timer(lambda: exact.grouped_conv(**kw)) if exact else None,
                        timer(lambda: fast.grouped_conv(**kw)), timer(tor), floor / floor_bw * 1e3))


def bench_candidate_selector(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    """27B (DFlash2: rank 256, top-16, vocab 248320), K = W - 1 positions, greedy rows and sampled
    rows half and half on our side; torch runs the greedy walk for every row (gathers of the
    codebook rows, g = F.linear BF16, an argmax per position): no cheaper than what ours does."""
    import torch.nn.functional as F

    from benchmarks.gpu_bench import torch_greedy_walk

    h, r, top, vr = 5120, 256, 16, 248320
    w_hidden = torch.randn(r, h, dtype=torch.bfloat16, device="cuda") * h**-0.5
    w_pred = torch.randn(vr, r, dtype=torch.bfloat16, device="cuda")
    w_succ = torch.randn(vr, r, dtype=torch.bfloat16, device="cuda")
    for b, w in shapes:
        k = w - 1
        hidden = torch.randn(b, k, h, dtype=torch.bfloat16, device="cuda")
        scores = torch.randn(b, k, top, device="cuda").sort(-1, descending=True).values
        ids = torch.randint(0, vr, (b, k, top), device="cuda", dtype=torch.int32)
        anchor = torch.randint(0, vr, (b,), device="cuda", dtype=torch.int32)
        temperature = (torch.arange(b, device="cuda") % 2).float()
        seed = torch.arange(1, b + 1, device="cuda", dtype=torch.int64)
        frontier = torch.full((b,), 4096, device="cuda", dtype=torch.int64)
        kw = dict(hidden=bits(cp, hidden), scores=cp.from_dlpack(scores), ids=cp.from_dlpack(ids),
                  anchor=cp.from_dlpack(anchor), w_hidden=bits(cp, w_hidden), w_pred=bits(cp, w_pred),
                  w_succ=bits(cp, w_succ), temperature=cp.from_dlpack(temperature),
                  seed=cp.from_dlpack(seed).view(cp.uint64), frontier=cp.from_dlpack(frontier))

        def tor():
            return torch_greedy_walk(torch, F, hidden, scores, ids, anchor, w_hidden, w_pred, w_succ)

        floor = (w_hidden.numel() + b * k * (top + 1) * r + b * k * h) * 2
        rows.append(row("candidate_selector", f"27B B{b} K{k}",
                        timer(lambda: exact.candidate_selector(**kw)) if exact else None,
                        timer(lambda: fast.candidate_selector(**kw)), timer(tor), floor / floor_bw * 1e3))


# --- per-call plans and the torch entry points (kernels_cu/fast/block.py OpGraph, kernels_cu/torch_ops.py) -------


def bench_op_plans(cp, torch, timer, exact, fast, shapes, rows, floor_bw, context=4096):
    """Each Op called as a user calls it (host work included) against its CUDA-graph replay and its torch entry
    point, at the 35B / 27B geometries. Rows (fast_ms / torch_ms columns reused, the ratio is the last column):
    masked_block[call vs graph] (the Op call through its OpGraph / a CuPy capture of the plain launches replayed: the
    target is <= 1.5), draft_layer[call] (fast / torch eager, one layer), and <op>[torch op vs cupy] (the dflash::
    custom op / the CuPy Op call, same inputs: the torch layer's overhead)."""
    import torch.nn.functional as F

    import kernels_cu.torch_ops  # noqa: F401 - registers torch.ops.dflash
    from conformance.geometry import GEOMETRIES, PUBLIC_VOCAB_MARGIN, _capacity
    from kernels_cu.fast import FastCudaBackend
    from kernels_cu.torch_ops import CONV_NAMES, LAYER_NAMES, set_backend
    from reference.config import PRESETS

    set_backend(fast)
    plain = FastCudaBackend(options=fast.options.replace(op_graphs=False))
    keep = []
    # proposal_head 35B: torch op against the CuPy Op
    vr, h = 248320, 2048
    head = torch.randn(vr, h, dtype=torch.bfloat16, device="cuda") * (h**-0.5)
    for b, w in shapes:
        hid = torch.randn(b, w - 1, h, dtype=torch.bfloat16, device="cuda")
        kw = dict(hidden=bits(cp, hid), head=bits(cp, head), vocab_size=vr - 192)
        rows.append(row("proposal_head[torch op vs cupy]", f"35B B{b} K{w - 1}", None,
                        _safe("torch op", lambda: timer(lambda: torch.ops.dflash.proposal_head(hid, head, vr - 192))),
                        _safe("cupy", lambda: timer(lambda: fast.proposal_head(**kw))), vr * h * 2 / floor_bw * 1e3))
    del head
    for label, geo in [("35B DFlash", "dflash-35b-a3b"), ("27B DFlash2", "dflash2-27b")]:
        cfg = PRESETS[GEOMETRIES[geo]]
        L, d = cfg.num_hidden_layers, cfg.head_dim
        tw, extra = _block_weights(torch, cfg)
        names = LAYER_NAMES + (CONV_NAMES if cfg.variant == "dflash2" else ())
        wbits = {k: bits(cp, v) for k, v in tw.items()}
        weight_bytes = sum(v.numel() * 2 for k, v in tw.items() if not k.endswith("norm") and "base" not in k)
        cap = _capacity(cfg, context)
        tl = {k: v[0].contiguous() for k, v in tw.items()}  # draft_layer: layer 0's weights
        tl_bits = {k: bits(cp, v) for k, v in tl.items()}
        for b, w in shapes:
            g = torch.Generator(device="cuda").manual_seed(b * 100 + w)
            frontier = context - 3 * torch.arange(b, device="cuda", dtype=torch.int64)
            live = torch.full((b,), w, dtype=torch.int32, device="cuda")
            kc = torch.randn((L, b, cap, cfg.num_key_value_heads, d), device="cuda", generator=g).to(torch.bfloat16)
            vc = torch.randn((L, b, cap, cfg.num_key_value_heads, d), device="cuda",
                             generator=g).to(torch.float16)
            anchor = torch.randint(0, cfg.vocab_size - PUBLIC_VOCAB_MARGIN, (b,), device="cuda", generator=g,
                                   dtype=torch.int32)
            scal = dict(mask_token_id=cfg.mask_token_id, windows=list(cfg.windows), eps=cfg.rms_norm_eps,
                        theta=cfg.rope_theta, head_dim=d, variant=cfg.variant, num_drafts=w - 1)
            kw = dict(anchor=cp.from_dlpack(anchor), embed=bits(cp, extra["embed"]), frontier=cp.from_dlpack(frontier),
                      live=cp.from_dlpack(live), context_k=bits(cp, kc), context_v=cp.from_dlpack(vc),
                      final_norm=bits(cp, extra["final_norm"]), **scal, **wbits)
            shape = f"{label} B{b} W{w} F{context}"
            floor = (weight_bytes + ring_bytes(cfg, b, cap)) / floor_bw * 1e3
            t_call = _safe(f"{shape} call", lambda: timer(lambda: fast.masked_block(**kw)))
            t_graph = math.nan
            try:
                graph, captured, stream = _cupy_graph(cp, lambda: plain.masked_block(**kw)["hidden"])
                keep.append((graph, captured, stream))
                t_graph = timer(lambda: graph.launch())
                same = bool(cp.array_equal(captured, fast.masked_block(**kw)["hidden"]))
                print(json.dumps({"shape": shape, "op_graph_equals_plain_graph": same,
                                  "op_graph_path": fast.op_graph_path()}), flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"{shape} graph: {type(exc).__name__}: {exc}", flush=True)
            rows.append(row("masked_block[call vs graph]", shape, None, t_call, t_graph, floor))
            targs = [anchor, extra["embed"], frontier, live, kc, vc, extra["final_norm"],
                     *[tw.get(n) for n in LAYER_NAMES + CONV_NAMES]]
            tscal = [cfg.mask_token_id, list(cfg.windows), cfg.rms_norm_eps, cfg.rope_theta, d, cfg.variant, w - 1]
            rows.append(row("masked_block[torch op vs cupy]", shape, None,
                            _safe("torch op", lambda: timer(lambda: torch.ops.dflash.masked_block(*targs, *tscal))),
                            t_call, floor))
            # draft_layer: one layer (layer 0's weights, ring 0)
            x = torch.randn(b, w, cfg.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
            lkw = dict(x=bits(cp, x), k_cache=bits(cp, kc[0]), v_cache=cp.from_dlpack(vc[0]),
                       frontier=cp.from_dlpack(frontier), live=cp.from_dlpack(live), eps=cfg.rms_norm_eps,
                       theta=cfg.rope_theta, head_dim=d, window=cfg.windows[0], variant=cfg.variant,
                       **{n: tl_bits[n] for n in names})
            t1 = {k: v[:1] for k, v in tw.items()}
            t1.update(extra, wqkv=torch.cat([t1["wq"], t1["wk"], t1["wv"]], 1),
                      wgu=torch.cat([t1["w_gate"], t1["w_up"]], 1),
                      inv_freq=cfg.rope_theta ** (-torch.arange(d // 2, device="cuda", dtype=torch.float64) * 2 / d))
            layer_bytes = weight_bytes / L

            def tor_layer():
                return _torch_layer(torch, F, t1, kc[:1], vc[:1], x, frontier, live, cfg, w)

            t_layer = _safe(f"{shape} draft_layer", lambda: timer(lambda: fast.draft_layer(**lkw)))
            rows.append(row("draft_layer[call]", shape, None, t_layer,
                            _safe(f"{shape} torch layer", lambda: timer(tor_layer)), layer_bytes / floor_bw * 1e3))
            targl = [x, kc[0], vc[0], frontier, live, *[tl.get(n) for n in LAYER_NAMES + CONV_NAMES]]
            rows.append(row("draft_layer[torch op vs cupy]", shape, None,
                            _safe("torch op", lambda: timer(lambda: torch.ops.dflash.draft_layer(
                                *targl, cfg.rms_norm_eps, cfg.rope_theta, d, cfg.windows[0], cfg.variant))),
                            t_layer, layer_bytes / floor_bw * 1e3))
            # draft_attention at this geometry's layer-0 shapes: torch op against the CuPy Op
            hq, hk = cfg.num_attention_heads, cfg.num_key_value_heads
            q = torch.randn(b, w, hq, d, device="cuda", generator=g).to(torch.bfloat16)
            k = torch.randn(b, w, hk, d, device="cuda", generator=g).to(torch.bfloat16)
            akw = dict(q=bits(cp, q), k=bits(cp, k), v=bits(cp, k), k_cache=bits(cp, kc[0]),
                       v_cache=cp.from_dlpack(vc[0]), frontier=cp.from_dlpack(frontier), live=cp.from_dlpack(live),
                       window=cfg.windows[0])
            rows.append(row("draft_attention[torch op vs cupy]", shape, None,
                            _safe("torch op", lambda: timer(lambda: torch.ops.dflash.draft_attention(
                                q, k, k, kc[0], vc[0], frontier, live, cfg.windows[0]))),
                            _safe("cupy", lambda: timer(lambda: fast.draft_attention(**akw))),
                            ring_bytes(cfg, b, cap) / L / floor_bw * 1e3))
            del kc, vc
        del tw, wbits, extra, tl, tl_bits
        fast.resident.clear()
        plain.resident.clear()
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    del keep


def _torch_layer(torch, F, t1, kc, vc, x, frontier, live, cfg, w):
    """One draft layer in PyTorch BF16: _torch_block's layer loop on one layer from x (no embedding, no final norm),
    the BF16 x_next."""
    import dataclasses

    one = dataclasses.replace(cfg, num_hidden_layers=1, layer_types=cfg.layer_types[:1]) \
        if dataclasses.is_dataclass(cfg) and hasattr(cfg, "layer_types") else cfg
    tw = dict(t1)
    tw["embed"] = None
    return _torch_block(torch, F, tw, kc, vc, None, frontier, live, one, w, x_in=x)


BENCHES = {
    "candidate_topk": bench_candidate_topk,
    "proposal_head": bench_proposal_head,
    "target_distribution": bench_target_distribution,
    "context_kv": bench_context_kv,
    "draft_attention": bench_draft_attention,
    "masked_block": bench_masked_block,
    "proposal_round": bench_proposal_round,
}


BENCHES.update(feature_capture=bench_feature_capture, grouped_conv=bench_grouped_conv,
               candidate_selector=bench_candidate_selector, op_plans=bench_op_plans)


def row(op, shape, exact_ms, fast_ms, torch_ms, floor_ms):
    r = {"op": op, "shape": shape, "exact_ms": exact_ms, "fast_ms": fast_ms, "torch_ms": torch_ms,
         "floor_ms": floor_ms}
    print(json.dumps(r), flush=True)
    return r


def _fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def table(rows) -> str:
    head = "| Op | shape | exact ms | fast ms | torch ms | floor ms | fast/floor | fast/torch |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['shape']} | {_fmt(r['exact_ms'])} | {_fmt(r['fast_ms'])} | {_fmt(r['torch_ms'])} | "
            f"{_fmt(r['floor_ms'])} | {r['fast_ms'] / r['floor_ms']:.1f}x | {r['fast_ms'] / r['torch_ms']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(BENCHES))
    ap.add_argument("--quick", action="store_true", help="B8 W16 only")
    ap.add_argument("--no-exact", action="store_true", help="skip the exact mode (slow at full width)")
    ap.add_argument("--geometry", action="store_true",
                    help="also time the full-geometry conformance run (both geometries, CuPy float64 reference)")
    ap.add_argument("--geometry-jobs", type=int, default=2,
                    help="--jobs of that run (default 2: a process per geometry; its output is written to "
                         "<--json>.geometry.log)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    cp, torch = _imports()
    from kernels_cu.backend import CudaBackend
    from kernels_cu.fast import FastCudaBackend

    timer = Timer(cp, torch)
    exact = None if args.no_exact else CudaBackend()
    fast = FastCudaBackend()
    env = {k: str(v) for k, v in fast.environment().items()}
    env.update(torch=torch.__version__, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command=" ".join([sys.executable.split("/")[-1], "-m", "benchmarks.gpu_bench", *(argv or sys.argv[1:])]),
               host=platform.node(), method=f"CUDA events, {WARMUP} warm-ups, median of {REPS} "
               f"(exact mode at full width: 1 warm-up, median of 5), L2 flushed by a {FLUSH_BYTES >> 20} MB write")
    t0 = time.time()
    ceil = measure_ceilings(cp, torch, timer)
    ceil.update(gemm_stream_rate(cp, torch, timer))
    print(json.dumps(ceil), flush=True)
    floor_bw = ceil["copy_bandwidth_TBps"] * 1e12
    shapes = [(8, 16)] if args.quick else [(1, 8), (8, 16)]
    rows = []
    for op in args.ops.split(","):
        try:
            BENCHES[op](cp, torch, timer, exact, fast, shapes, rows, floor_bw)
        except Exception as exc:  # noqa: BLE001 - one Op's failure must not lose the others' numbers
            print(f"{op}: {type(exc).__name__}: {exc}", flush=True)
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    env["proposal_head_gemm"] = str(fast.environment().get("proposal_head_gemm"))  # with the tunings made
    geo = None
    if args.geometry:
        fast.resident.clear()
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
        from conformance.geometry_jobs import timed_run

        geo = timed_run(args.geometry_jobs, limit=900,
                        log_path=f"{args.json}.geometry.log" if args.json else None)
        print(json.dumps({"geometry": geo}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "ceilings": ceil, "rows": rows, "geometry": geo,
                       "seconds": time.time() - t0}, f, indent=1)
    print(f"\ncopy {ceil['copy_bandwidth_TBps']:.2f} TB/s, bf16 GEMM {ceil['bf16_gemm_TFLOPs_8192']:.0f} TFLOP/s, "
          f"gemmEx 16x5120x17408 {ceil['gemmEx_16x5120x17408_ms'] * 1e3:.1f} us "
          f"(torch {ceil['torch_16x5120x17408_ms'] * 1e3:.1f} us); floor = bytes at the measured copy bandwidth")
    print(table(rows))
    if geo is not None:
        verdicts = ", ".join(f"{n} {k}" for k, n in sorted(geo["verdicts"].items())) or "no report"
        print(f"\nfull-geometry conformance, both geometries ({geo['command']}): {geo['seconds']:.0f} s, "
              f"{verdicts}, exit status {geo['exit_status']}{'' if geo['complete'] else ', INCOMPLETE'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
