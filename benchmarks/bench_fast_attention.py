"""Benchmark of the fast draft attention (kernels_cu/fast_attention.py, issue 12) at the shapes of the
proposal round's masked_block.

Shapes: the attention inside masked_block at both official geometries (Hq 32, Hk 8, D 128, F 4096,
frontiers F - 3 b as conformance.geometry.masked_block_case): 27B DFlash2 (ring C 2048, window 2048, every
row live), 35B DFlash (ring C 4096; window 4096 and full; live tails W - b % 4), at B1 W8 and B8 W16. q/k/v
are FP32 arrays holding BF16 values (what fast_block.cu's fb_qkv_post hands over), the rings BF16 / FP16
bits; the output is BF16 bits only (masked_block's call).

Method (/work/.library/device/METHOD.md): each variant's call is captured once in a CUDA graph on a CuPy
stream (after an eager warm-up there) and its replays are timed with CUDA events (benchmarks.gpu_bench.Timer:
3 warm-ups, the median of 25, the L2 flushed by a 256 MB write before each replay); with --cupti, the
kernels' own durations from a CUPTI trace of 20 replays (torch.profiler, medians), as benchmarks.profile_round
reads them. Floor: the K and V ring rows a query can see, B x n_ctx x Hk x D x 2 bytes x 2, at the measured
copy bandwidth.

Variants: new f / new b (this tree's mma.sync kernel with FP32 q/k/v or BF16 bits); wg b s2 / wg b s3 (the wgmma
form, fast_attention.WGMMA, at 2 and 3 K/V stages, where it takes the shape: 64 query rows); with --before PATH,
v4 f / v4 b (the kernel source at PATH, e.g. `git show 86941ea:kernels_cu/fast_attention.cu`, launched as 86941ea's
attention_fast did: its split heuristic and its combine kernel). Checks printed with the table: new f and
new b give the same bits; the wgmma form against new b (bits equal, elements differing, largest difference); new and
v4 give the same bits (one split, and their default splits).

    python -m benchmarks.bench_fast_attention [--before PATH] [--sweep] [--cupti] [--draft-attention]
                                              [--json out.json]

--sweep adds a split count (SPLITS) sweep for new b (masked_block's call since v5); --draft-attention the
former benchmark (gpu_bench.bench_draft_attention, the Op with BF16 inputs, against torch SDPA).
Prints the tables last. Needs CuPy and PyTorch on a CUDA GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

HQ, HK, D, CONTEXT = 32, 8, 128, 4096
GEOMS = [("27B DFlash2 S2048", 2048, 2048, False), ("35B DFlash S4096", 4096, 4096, True),
         ("35B DFlash full", 4096, 0, True)]
SHAPES = [(1, 8), (8, 16)]


def make_inputs(cp, torch, b, w, cap, window, tails, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed * 1000 + b * 100 + w)
    bf = lambda *s: torch.randn(s, device="cuda", generator=g).to(torch.bfloat16)
    q, k, v = bf(b, w, HQ, D), bf(b, w, HK, D), bf(b, w, HK, D)
    kc = bf(b, cap, HK, D)
    vc = bf(b, cap, HK, D).abs().to(torch.float16)
    frontier = CONTEXT - 3 * torch.arange(b, device="cuda", dtype=torch.int64)
    if tails:
        live = torch.clamp(w - torch.arange(b, device="cuda") % 4, min=1).to(torch.int32)
    else:
        live = torch.full((b,), w, dtype=torch.int32, device="cuda")
    bits = lambda t: cp.from_dlpack(t.contiguous().view(torch.int16)).view(cp.uint16)
    f32 = lambda t: cp.from_dlpack(t.float().contiguous())
    return {"f32": (f32(q), f32(k), f32(v)), "bits": (bits(q), bits(k), bits(v)), "kc": bits(kc),
            "vc": cp.from_dlpack(vc).view(cp.uint16), "frontier": cp.from_dlpack(frontier),
            "live": cp.from_dlpack(live), "window": window, "keep": (q, k, v, kc, vc, frontier, live)}


def floor_bytes(b, cap, window):
    n_ctx = min(CONTEXT, cap, window - 1) if window > 0 else min(CONTEXT, cap)
    return b * n_ctx * HK * D * 2 * 2


# --- the v4 kernel (--before): 86941ea's launch, for the before / after table --------------------


class V4:
    """kernels_cu/fast_attention.cu as of 86941ea (source given), launched as its attention_fast did:
    ns = max(1, min(ceil(SMs / (B Hk chunks)), tiles // 4)), then fast_attn_combine_d{DP} when ns > 1."""

    def __init__(self, cp, path):
        self.cp, self.code = cp, Path(path).read_text()
        self.sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])

    @functools.cache  # noqa: B019 - one instance per run
    def kernels(self, dp, mt, f32_inputs):
        from kernels_cu.loader import KERNEL_DIR, NVRTC_OPTIONS

        opts = (*NVRTC_OPTIONS, f"-I{KERNEL_DIR}", "-DFA_SINGLE", f"-DFA_DP={dp}", f"-DFA_MT={mt}",
                f"-DFA_F32={int(f32_inputs)}")
        mod = self.cp.RawModule(code=self.code, options=opts)
        main = mod.get_function(f"fast_attn_d{dp}_m{mt}_{'f' if f32_inputs else 'b'}")
        smem = 2 * 2 * 64 * (dp + 8) * 2 + 4 * 16 * (16 * mt) * 4
        main.max_dynamic_shared_size_bytes = smem
        return main, mod.get_function(f"fast_attn_combine_d{dp}"), smem

    def __call__(self, q, k, v, kc, vc, frontier, live, window, ns=None):
        cp = self.cp
        b, w, hq, d = q.shape
        hk, cap = k.shape[2], kc.shape[1]
        m_rows = w * (hq // hk)
        chunks = -(-m_rows // 64)
        dp, mt = 128, (1 if min(m_rows, 64) <= 16 else 2 if min(m_rows, 64) <= 32 else 4)
        main, combine, smem = self.kernels(dp, mt, q.dtype == np.float32)
        if ns is None:
            n_ctx = min(cap, window - 1) if window > 0 else cap
            ns = max(1, min(-(-self.sms // (b * hk * chunks)), (-(-n_ctx // 64)) // 4))
        ob = cp.empty(q.shape, dtype=np.uint16)
        part_o = cp.empty(ns * b * hk * m_rows * dp, dtype=np.float32) if ns > 1 else None
        part_ml = cp.empty(ns * b * hk * m_rows * 2, dtype=np.float32) if ns > 1 else None
        null = np.uint64(0)
        main((ns, b * hk, chunks), (128,),
             (q, k, v, kc, vc, frontier, live, np.int32(b), np.int32(w), np.int32(hq), np.int32(hk), np.int32(d),
              np.int64(cap), np.int64(window), np.float32(1.4426950408889634 / math.sqrt(d)), np.int32(ns),
              null if part_o is None else part_o, null if part_ml is None else part_ml, null, ob), shared_mem=smem)
        if ns > 1:
            rows = b * hk * m_rows
            combine((-(-rows // 4),), (128,), (part_o, part_ml, live, np.int32(b), np.int32(w), np.int32(hq),
                                                np.int32(hk), np.int32(d), np.int32(ns), null, ob))
        return ob


# --- timing ---------------------------------------------------------------------------------------


def _bf16_values(bits):
    """BF16 bits (uint16) as float64 values (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def with_settings(mod, settings, fn):
    """fn() with the module's switches set as given (launch-time settings: a graph captured inside keeps them)."""
    old = {k: getattr(mod, k) for k in settings}
    try:
        for k, v in settings.items():
            setattr(mod, k, v)
        return fn()
    finally:
        for k, v in old.items():
            setattr(mod, k, v)


def graph_of(cp, fn):
    """(graph, output, stream): fn captured on a fresh CuPy stream after one eager call there."""
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        fn()
        s.synchronize()
        s.begin_capture()
        out = fn()
        g = s.end_capture()
    return g, out, s


def time_graph(cp, timer, fn):
    """Median ms of the graph replay of fn (L2 flushed before each), and the replay's output."""
    g, out, s = graph_of(cp, fn)
    with s:
        ms = timer(lambda: g.launch(s))
        s.synchronize()
    return ms, out, (g, s)


def cupti_us(cp, torch, g, s, reps=20):
    """Median per-replay sum of the graph's kernel durations (us) and their names, from a CUPTI trace."""
    from benchmarks.profile_round import trace_kernels

    with s:
        calls = trace_kernels(torch, lambda: g.launch(s), reps)
    names = [k["name"] for k in calls[0]]
    per = [statistics.median(c[i]["dur"] for c in calls) for i in range(len(names))]
    return sum(per), [f"{n[:40]} {t:.1f}" for n, t in zip(names, per)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=None, help="the v4 kernel source (fast_attention.cu of 86941ea)")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--cupti", action="store_true")
    ap.add_argument("--draft-attention", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--wg-extra", action="append", default=[],
                    help="a further wgmma variant 'wg b x<i>' built with these NVRTC options (probes: -DFA_WG_FENCE=0)")
    args = ap.parse_args(argv)
    from benchmarks import gpu_bench as gb

    cp, torch = gb._imports()
    from kernels_cu import fast_attention as fa

    timer = gb.Timer(cp, torch)
    ceil = gb.measure_ceilings(cp, torch, timer)
    bw = ceil["copy_bandwidth_TBps"] * 1e12
    v4 = V4(cp, args.before) if args.before else None
    rows, sweep, checks = [], [], []

    for label, cap, window, tails in GEOMS:
        for b, w in SHAPES:
            x = make_inputs(cp, torch, b, w, cap, window, tails)
            common = (x["kc"], x["vc"], x["frontier"], x["live"], window)
            shape = f"{label} B{b} W{w}"
            floor_us = floor_bytes(b, cap, window) / bw * 1e6
            outs = {}
            newf = functools.partial(fa.attention_fast, *x["f32"], *common, f32_out=False, bf16_out=True)
            newb = functools.partial(fa.attention_fast, *x["bits"], *common, f32_out=False, bf16_out=True)
            mma = {"WGMMA": False}
            variants = [("new f", lambda f=newf: f()[1], mma), ("new b", lambda f=newb: f()[1], mma)]
            mt = fa._mt(min(w * HQ // HK, 64))
            if fa.wg_shape(fa._dp(D), D, mt, True, False):  # the wgmma form (fast_attention.WGMMA), 2 and 3 stages
                variants += [(f"wg b s{st}", lambda f=newb: f()[1], {"WGMMA": True, "STAGES": st}) for st in (2, 3)]
                variants += [(f"wg b x{i}", lambda f=newb: f()[1], {"WGMMA": True, "EXTRA_OPTIONS": tuple(o.split())})
                             for i, o in enumerate(args.wg_extra)]
            if v4:
                variants += [("v4 f", functools.partial(v4, *x["f32"], *common), {}),
                             ("v4 b", functools.partial(v4, *x["bits"], *common), {})]
            for name, fn, settings in variants:
                ms, out, (g, s) = with_settings(fa, settings, lambda fn=fn: time_graph(cp, timer, fn))
                outs[name] = cp.asnumpy(out)
                r = {"shape": shape, "variant": name, "graph_us": ms * 1e3, "floor_us": floor_us}
                if args.cupti:
                    r["kernels_us"], r["kernels"] = cupti_us(cp, torch, g, s)
                if not name.startswith("v4"):
                    wg = bool(settings.get("WGMMA"))
                    r["stages"] = settings.get("STAGES") or fa.stages_for()
                    r["resident"] = fa.resident_blocks(fa._dp(D), mt, name == "new f", r["stages"], wg=wg)
                    r["splits"] = fa.splits_for(b, HK, -(-(w * HQ // HK) // 64), cap, window, r["resident"])
                rows.append(r)
                print(json.dumps(r), flush=True)
            c = {"shape": shape, "new f == new b (bits)": bool(np.array_equal(outs["new f"], outs["new b"]))}
            for name in (n for n in outs if n.startswith("wg")):
                c[f"{name} == new b (bits)"] = bool(np.array_equal(outs[name], outs["new b"]))
                c[f"{name} vs new b: differing elements"] = int((outs[name] != outs["new b"]).sum())
                diff = _bf16_values(outs[name]) - _bf16_values(outs["new b"])
                c[f"{name} vs new b: max |diff|"] = float(np.nanmax(np.abs(diff)))
            if v4:
                diff = _bf16_values(outs["new f"]) - _bf16_values(outs["v4 f"])
                c["max |new - v4| (bf16 out)"] = float(np.nanmax(np.abs(diff)))
                c["new - v4 differing elements"] = int((outs["new f"] != outs["v4 f"]).sum())
                c["new == v4 (bits)"] = bool(np.array_equal(outs["new f"], outs["v4 f"]))
                fa.SPLITS = 1
                try:
                    one5 = cp.asnumpy(fa.attention_fast(*x["f32"], *common, f32_out=False, bf16_out=True)[1])
                    one4 = cp.asnumpy(v4(*x["f32"], *common, ns=1))
                finally:
                    fa.SPLITS = None
                c["one split: new == v4 (bits)"] = bool(np.array_equal(one5, one4))
            checks.append(c)
            print(json.dumps(c), flush=True)
            if args.sweep:
                for ns in (None, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32):
                    fa.SPLITS = ns
                    try:
                        ms, out, _ = time_graph(cp, timer, lambda f=newb: f()[1])
                    finally:
                        fa.SPLITS = None
                    sweep.append({"shape": shape, "splits": ns or "auto", "graph_us": ms * 1e3})
                print(f"sweep {shape}: " + " ".join(f"{r['splits']}:{r['graph_us']:.1f}" for r in sweep
                                                     if r["shape"] == shape), flush=True)

    drafts = []
    if args.draft_attention:
        from kernels_cu.fast import FastCudaBackend

        class _B(FastCudaBackend):  # FastAttentionMixin composed in kernels_cu.fast
            pass

        gb.bench_draft_attention(cp, torch, timer, None, _B(), SHAPES, drafts, bw)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceilings": ceil, "rows": rows, "checks": checks, "sweep": sweep, "draft_attention": drafts,
                       "defaults": {"SPLITS": fa.SPLITS, "BLOCKS_PER_SM": fa.BLOCKS_PER_SM,
                                    "MIN_TILES_PER_SPLIT": fa.MIN_TILES_PER_SPLIT}}, f, indent=1)
    print(f"\ncopy {ceil['copy_bandwidth_TBps']:.2f} TB/s; BLOCKS_PER_SM={fa.BLOCKS_PER_SM} "
          f"MIN_TILES_PER_SPLIT={fa.MIN_TILES_PER_SPLIT}")
    if drafts:
        print(gb.table(drafts))
    for c in checks:
        print("check", json.dumps(c))
    print(f"\n{'shape':32s} {'variant':8s} {'graph us':>9s} {'kernels us':>10s} {'floor us':>8s} {'x floor':>7s} splits")
    for r in rows:
        k = f"{r['kernels_us']:10.1f}" if "kernels_us" in r else f"{'-':>10s}"
        print(f"{r['shape']:32s} {r['variant']:8s} {r['graph_us']:9.1f} {k} {r['floor_us']:8.1f} "
              f"{r['graph_us'] / r['floor_us']:7.2f} {r.get('splits', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
