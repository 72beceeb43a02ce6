"""Does prefetching a GEMM's BF16 weight into L2 on a side stream, while latency-bound kernels leave
DRAM idle, make the cuBLAS GEMM that follows faster? (H200 probe, issue 12: should the proposal
round's graph, kernels_cu/fast_round.py, get a side-stream chain of L2 prefetches?)

Kernels (kernels_cu/fast_prefetch.cu): l2_prefetch issues cp.async.bulk.prefetch.L2 over a weight,
``--pf-blocks`` x 32 threads, one instruction per ``--chunk`` bytes, plain or with an L2::evict_last
policy ("EL"); spin_ns(T) holds ``--spin-blocks`` x 128 threads for T ns of %globaltimer without
touching memory, standing in for the round's attention and glue kernels. GEMMs: CaptureGemm
(cublasGemmEx as the round launches it), out [M, N] fp32 = x [M, K] @ w [N, K]^T, BF16 bits.

Timing: each variant is one CUDA graph of ``--calls`` launch sequences captured on a non-blocking
stream s, uploaded and replayed ``--replays`` times (CUDA events around each replay, median); the
time per call is the replay time over the calls. Sequence j reads weight copy j % sets, with enough
copies (> 200 MiB in all) that a weight has left L2 by the time its call comes back, unless it was
prefetched. A side-stream prefetch is forked from s (an event) at the start of its sequence and
joined back (an event) at the end of it: the GEMM never waits for the prefetch kernel (a prefetch
is a hint), only the next sequence does.

  a      idle -> GEMM: spin_ns(--idle-us) then GEMM(W). Variants: spin alone; GEMM alone; none
         (spin, GEMM); W hot (one copy, so W stays in L2: what a perfect prefetch could give; only
         for W <= 32 MiB); pf full / pf half (all / the first half of W prefetched on the side
         stream beside the spin), plain and EL; none after EL (the baseline again: do evict_last
         lines linger and cost later calls?). saving = none - variant.
  b      GEMM -> GEMM: GEMM(W_a) then GEMM(W_b), 35B gate/up -> down and qkv -> o. Variants: a
         alone, b alone, none, pf b (all of W_b on the side stream beside GEMM(W_a)), pf b EL.
  sweep  35B o, M 8, idle: pf full at pf-blocks {1, 4, 16} x chunk {16, 256} KiB (and the
         defaults); none / pf full at idle 4, 8, 20, 40 us (how long until the prefetch lands).
  rate   prefetch of 256 MiB then a one-warp kernel on one stream, against the one-warp kernel
         alone: issue_GBps = 256 MiB / the difference. The kernel does not wait for the data, so
         this is how fast the SMs hand prefetches to the TMA units, not a DRAM rate.
  check  16 MiB W (35B o): GEMM cold (baseline); pf -> GEMM on one stream (plain, EL); GEMM hot
         (one copy). Bounds what L2 residency can give a GEMM.
floor = the GEMMs' weight bytes (rate rows: the prefetched bytes) at the copy bandwidth measured in
the run (gpu_bench.measure_ceilings). --quick runs scenario a for 35B o and gate/up only.

    python -m benchmarks.l2_prefetch_probe [--json out.json] [--quick]
    python -m benchmarks.l2_prefetch_probe --list      (the configurations; no GPU needed)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

LAYERS = {  # (model, layer): (N, K) of w [N, K], H 2048 (35B DFlash) and 5120 (27B DFlash2)
    ("35B", "qkv"): (6144, 2048), ("35B", "o"): (2048, 4096), ("35B", "gate/up"): (12288, 2048),
    ("35B", "down"): (2048, 6144), ("27B", "o"): (5120, 4096), ("27B", "down"): (5120, 17408),
}
MS = (8, 128)
PAIRS = ((("35B", "gate/up"), ("35B", "down")), (("35B", "qkv"), ("35B", "o")))
QUICK_LAYERS = (("35B", "o"), ("35B", "gate/up"))
SWEEP_KEY, SWEEP_M = ("35B", "o"), 8
SWEEP_BLOCKS = (1, 4, 16)
SWEEP_CHUNKS = (16384, 262144)
SWEEP_IDLE_US = (4.0, 8.0, 20.0, 40.0)
CHECK_KEY = ("35B", "o")  # 2048 x 4096 BF16: 16 MiB
RATE_KEY = ("-", "256 MiB")
BUFFERS = {**LAYERS, RATE_KEY: (32768, 4096)}  # the rate buffer as [N, K] BF16: 256 MiB
MIN_TOTAL_BYTES = 200 << 20  # the copies of one weight together exceed this
HOT_MAX_BYTES = 32 << 20  # "W hot" only where one copy fits in L2 with room to spare
REUSE_MIN_BYTES = 100 << 20  # warn when fewer bytes than this pass between two uses of one copy
MAX_CHUNK = 65535 * 16  # ptxas keeps a bulk prefetch's size / 16 in 16 bits (fast_prefetch.cu)
SPIN_THREADS, PF_THREADS = 128, 32


def wbytes(key) -> int:
    n, k = BUFFERS[key]
    return n * k * 2


def sets_for(nbytes: int) -> int:
    """Copies of a weight of nbytes so that all of them together exceed MIN_TOTAL_BYTES (at least 2)."""
    return max(2, MIN_TOTAL_BYTES // nbytes + 1)


def chunk_label(chunk: int) -> str:
    return f"{chunk // 1024}K" if chunk % 1024 == 0 else f"{chunk}B"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write all rows and the environment here")
    ap.add_argument("--calls", type=int, default=8, help="launch sequences per graph")
    ap.add_argument("--replays", type=int, default=7, help="timed replays per graph (median)")
    ap.add_argument("--warm", type=int, default=2, help="eager sequences before each capture")
    ap.add_argument("--idle-us", type=float, default=14.0, help="spin_ns time before the GEMM (scenario a)")
    ap.add_argument("--spin-blocks", type=int, default=128, help="spin_ns blocks (x 128 threads)")
    ap.add_argument("--pf-blocks", type=int, default=8, help="l2_prefetch blocks (x 32 threads)")
    ap.add_argument("--chunk", type=int, default=65536, help="bytes per bulk prefetch instruction")
    ap.add_argument("--quick", action="store_true", help="scenario a for 35B o and gate/up only")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit (no GPU)")
    args = ap.parse_args(argv)
    if args.chunk % 16 or not 16 <= args.chunk <= MAX_CHUNK:
        ap.error(f"--chunk {args.chunk}: a multiple of 16 from 16 to {MAX_CHUNK}")
    for name in ("calls", "replays", "warm", "spin_blocks", "pf_blocks"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.idle_us > 0:
        ap.error("--idle-us must be positive")
    return args


def plan(args) -> list[dict]:
    """The probe's configurations, in run order. Each job: scenario, group (the rows a saving is
    taken within), model, layer, M, N, K, variant, baseline (the group's variant it is compared
    with, or None), hot (every weight from copy 0), steps (one launch sequence), floor_bytes."""
    jobs: list[dict] = []
    idle_ns = round(args.idle_us * 1000)

    def pf(key, frac=1.0, el=0, side=True, blocks=None, chunk=None):
        return {"op": "pf", "w": list(key), "frac": frac, "el": el, "side": side,
                "blocks": blocks or args.pf_blocks, "chunk": chunk or args.chunk}

    def spin(ns):
        return {"op": "spin", "ns": ns, "blocks": args.spin_blocks}

    def gemm(key):
        return {"op": "gemm", "w": list(key)}

    def add(scenario, group, keys, m, variant, steps, baseline="none", hot=False):
        g_keys = [tuple(st["w"]) for st in steps if st["op"] == "gemm"]
        p_bytes = sum(int(wbytes(tuple(st["w"])) * st["frac"]) for st in steps if st["op"] == "pf")
        floor = sum(wbytes(k) for k in dict.fromkeys(g_keys)) or p_bytes or None
        ns_ = [BUFFERS[k][0] for k in keys]
        ks_ = [BUFFERS[k][1] for k in keys]
        jobs.append({"scenario": scenario, "group": group, "model": keys[0][0],
                     "layer": "->".join(k[1] for k in keys), "M": m,
                     "N": ns_[0] if len(keys) == 1 else ns_, "K": ks_[0] if len(keys) == 1 else ks_,
                     "variant": variant, "baseline": baseline, "hot": hot, "steps": steps,
                     "floor_bytes": floor})

    for key in (QUICK_LAYERS if args.quick else LAYERS):
        for m in MS:
            group = f"a {key[0]} {key[1]} M{m} idle {args.idle_us:g}"
            sp = spin(idle_ns)
            add("a", group, [key], m, "spin alone", [sp], baseline=None)
            add("a", group, [key], m, "GEMM alone", [gemm(key)], baseline=None)
            add("a", group, [key], m, "none", [sp, gemm(key)], baseline=None)
            if wbytes(key) <= HOT_MAX_BYTES:
                add("a", group, [key], m, "W hot (bound)", [sp, gemm(key)], hot=True)
            for el in (0, 1):
                for frac in (1.0, 0.5):
                    name = f"pf {'full' if frac == 1.0 else 'half'}{' EL' if el else ''}"
                    add("a", group, [key], m, name, [pf(key, frac, el), sp, gemm(key)])
            add("a", group, [key], m, "none after EL", [sp, gemm(key)])
    if args.quick:
        return jobs

    for ka, kb in PAIRS:
        for m in MS:
            group = f"b {ka[0]} {ka[1]}->{kb[1]} M{m}"
            add("b", group, [ka, kb], m, "a alone", [gemm(ka)], baseline=None)
            add("b", group, [ka, kb], m, "b alone", [gemm(kb)], baseline=None)
            add("b", group, [ka, kb], m, "none", [gemm(ka), gemm(kb)], baseline=None)
            add("b", group, [ka, kb], m, "pf b", [pf(kb), gemm(ka), gemm(kb)])
            add("b", group, [ka, kb], m, "pf b EL", [pf(kb, el=1), gemm(ka), gemm(kb)])

    key, m = SWEEP_KEY, SWEEP_M
    group = f"sweep {key[0]} {key[1]} M{m} idle {args.idle_us:g}"
    add("sweep", group, [key], m, "none", [spin(idle_ns), gemm(key)], baseline=None)
    configs = list(dict.fromkeys([(args.pf_blocks, args.chunk)] + [(b, c) for b in SWEEP_BLOCKS
                                                                    for c in SWEEP_CHUNKS]))
    for b, c in configs:
        add("sweep", group, [key], m, f"pf full b{b} c{chunk_label(c)}",
            [pf(key, blocks=b, chunk=c), spin(idle_ns), gemm(key)])
    for idle in SWEEP_IDLE_US:
        group = f"sweep {key[0]} {key[1]} M{m} idle {idle:g}"
        ns = round(idle * 1000)
        add("sweep", group, [key], m, "none", [spin(ns), gemm(key)], baseline=None)
        add("sweep", group, [key], m, "pf full", [pf(key), spin(ns), gemm(key)])

    tiny = {"op": "tiny"}
    group = "rate 256 MiB"
    add("rate", group, [RATE_KEY], None, "tiny alone", [tiny], baseline=None)
    for b, c in configs:
        add("rate", group, [RATE_KEY], None, f"pf b{b} c{chunk_label(c)} + tiny",
            [pf(RATE_KEY, side=False, blocks=b, chunk=c), tiny], baseline=None)
    add("rate", group, [RATE_KEY], None, f"pf EL b{args.pf_blocks} c{chunk_label(args.chunk)} + tiny",
        [pf(RATE_KEY, el=1, side=False), tiny], baseline=None)

    key = CHECK_KEY
    for m in MS:
        group = f"check {key[0]} {key[1]} M{m}"
        add("check", group, [key], m, "GEMM cold", [gemm(key)], baseline=None)
        add("check", group, [key], m, "pf -> GEMM", [pf(key, side=False), gemm(key)], baseline="GEMM cold")
        add("check", group, [key], m, "pf EL -> GEMM", [pf(key, el=1, side=False), gemm(key)], baseline="GEMM cold")
        add("check", group, [key], m, "GEMM hot", [gemm(key)], baseline="GEMM cold", hot=True)
    return jobs


def steps_text(steps) -> str:
    out = []
    for st in steps:
        if st["op"] == "pf":
            out.append(f"{'side:' if st['side'] else ''}pf({st['w'][1]}{' half' if st['frac'] != 1.0 else ''}"
                       f"{' EL' if st['el'] else ''} b{st['blocks']} c{chunk_label(st['chunk'])})")
        elif st["op"] == "spin":
            out.append(f"spin({st['ns'] / 1000:g}us x{st['blocks']})")
        elif st["op"] == "gemm":
            out.append(f"gemm({st['w'][1]})")
        else:
            out.append(st["op"])
    return " ; ".join(out)


def finish(rows: list[dict]) -> None:
    """saving_us against each row's baseline in its group; issue_GBps for the rate rows."""
    by = {(r["group"], r["variant"]): r for r in rows}
    for r in rows:
        base = by.get((r["group"], r["baseline"])) if r["baseline"] else None
        if base is not None and r.get("us") is not None and base.get("us") is not None:
            r["saving_us"] = round(base["us"] - r["us"], 2)
        if r["scenario"] == "rate" and r["variant"] != "tiny alone":
            tiny = by.get((r["group"], "tiny alone"))
            if tiny and r.get("us") is not None and tiny.get("us") is not None and r["us"] > tiny["us"]:
                pf_bytes = sum(int(wbytes(tuple(st["w"])) * st["frac"]) for st in r["steps"] if st["op"] == "pf")
                r["issue_GBps"] = round(pf_bytes / ((r["us"] - tiny["us"]) * 1e-6) / 1e9, 1)


def table(rows: list[dict]) -> str:
    def num(v, w, d=1):
        return f"{v:{w}.{d}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"

    def dim(v):
        return ",".join(map(str, v)) if isinstance(v, list) else str(v)

    lines = [(f"{'scen':<6}{'model':<6}{'layer':<14}{'M':>4} {'N':>11} {'K':>11}  {'variant':<26}{'us':>8}"
              f"{'saving':>8}{'floor':>8}  note")]
    prev = None
    for r in rows:
        if prev is not None and r["group"] != prev:
            lines.append("")
        prev = r["group"]
        spins = [st["ns"] for st in r["steps"] if st["op"] == "spin"]
        note = (r.get("error") or (f"issue {r['issue_GBps']} GB/s" if r.get("issue_GBps") else "")
                or r.get("reuse_note") or (f"idle {spins[0] / 1000:g} us" if spins else ""))
        m = "-" if r["M"] is None else r["M"]
        lines.append(f"{r['scenario']:<6}{r['model']:<6}{r['layer']:<14}{m:>4} {dim(r['N']):>11} "
                     f"{dim(r['K']):>11}  {r['variant']:<26}{num(r.get('us'), 8)}{num(r.get('saving_us'), 8)}"
                     f"{num(r.get('floor_us'), 8)}  {note}")
    return "\n".join(lines)


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.splitlines()[0][:200] if text else type(exc).__name__


class Runner:
    """Weights, activations, outputs, the two streams and the graph timing of one job."""

    def __init__(self, cp, np, args):
        from kernels_cu.fast_block import CaptureGemm
        from kernels_cu.loader import load_module

        self.cp, self.np, self.args = cp, np, args
        mod = load_module("fast_prefetch")
        self.k_pf, self.k_spin = mod.get_function("l2_prefetch"), mod.get_function("spin_ns")
        self.gemm = CaptureGemm()
        self.s = cp.cuda.Stream(non_blocking=True)
        self.side = cp.cuda.Stream(non_blocking=True)
        self._w: dict = {}
        self._x: dict = {}
        self._out: dict = {}

    def bits(self, *shape):
        """Random BF16 bits (normal floats truncated: no NaN or Inf patterns)."""
        cp, np = self.cp, self.np
        return (cp.random.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)

    def weights(self, key) -> list:
        if key not in self._w:
            n, k = BUFFERS[key]
            sets = sets_for(wbytes(key))
            block = self.bits(sets, n, k)  # one allocation, copy i at i * N * K * 2 bytes (256-aligned)
            self._w[key] = [block[i] for i in range(sets)]
            self.cp.cuda.Device().synchronize()
        return self._w[key]

    def weight(self, key, j: int, hot: bool):
        ws = self.weights(key)
        return ws[0] if hot else ws[j % len(ws)]

    def x(self, m: int, k: int):
        if (m, k) not in self._x:
            self._x[(m, k)] = self.bits(m, k)
        return self._x[(m, k)]

    def out(self, m: int, n: int):
        if (m, n) not in self._out:
            self._out[(m, n)] = self.cp.empty((m, n), self.np.float32)
        return self._out[(m, n)]

    def launch(self, job: dict, j: int, events) -> None:
        """Sequence j of a job on the current stream (self.s): fork to the side stream if a step
        runs there, the steps in order, join at the end."""
        np, s, side = self.np, self.s, self.side
        forked = any(st["op"] == "pf" and st["side"] for st in job["steps"])
        if forked:
            e = next(events)
            e.record(s)
            side.wait_event(e)
        for st in job["steps"]:
            op = st["op"]
            if op == "pf":
                w = self.weight(tuple(st["w"]), j, job["hot"])
                nbytes = int(w.nbytes * st["frac"]) // 16 * 16
                kargs = (w, np.uint64(nbytes), np.uint32(st["chunk"]), np.int32(st["el"]))
                if st["side"]:
                    with side:
                        self.k_pf((st["blocks"],), (PF_THREADS,), kargs)
                else:
                    self.k_pf((st["blocks"],), (PF_THREADS,), kargs)
            elif op == "spin":
                self.k_spin((st["blocks"],), (SPIN_THREADS,), (np.uint64(st["ns"]),))
            elif op == "tiny":
                self.k_spin((1,), (32,), (np.uint64(0),))
            elif op == "gemm":
                w = self.weight(tuple(st["w"]), j, job["hot"])
                n, k = w.shape
                self.gemm(self.x(job["M"], k), w, self.out(job["M"], n))
            else:
                raise ValueError(f"unknown step {op}")
        if forked:
            e = next(events)
            e.record(side)
            s.wait_event(e)

    def time_us(self, job: dict) -> float:
        """Median microseconds per sequence: one graph of args.calls sequences, replayed (graph_timer.graph_us;
        the fork / join events are made before the capture and handed out in launch order)."""
        from benchmarks.graph_timer import graph_us

        a = self.args
        events = iter([self.cp.cuda.Event(disable_timing=True) for _ in range(2 * (a.warm + a.calls))])
        return graph_us(self.cp, self.s, lambda j: self.launch(job, j, events), calls=a.calls, replays=a.replays,
                        sets=max(a.calls, a.warm, 1), warm=a.warm)


def _reuse_note(job: dict, calls: int) -> str | None:
    """Where fewer than REUSE_MIN_BYTES of other copies pass between two uses of one weight copy,
    the 'cold' weight may still be in L2: say so."""
    if job["hot"]:
        return None
    keys = list(dict.fromkeys(tuple(st["w"]) for st in job["steps"] if st["op"] in ("gemm", "pf")))
    for key in keys:
        sets = sets_for(wbytes(key))
        between = (min(calls, sets) - 1) * sum(wbytes(k) for k in keys)
        if between < REUSE_MIN_BYTES:
            return f"warning: {between >> 20} MiB between reuses of a copy of {key[1]}"
    return None


def environment(cp, torch, copy_bw) -> dict:
    from kernels_cu.loader import compile_record

    env = {"compile": compile_record(), "cupy": cp.__version__, "torch": getattr(torch, "__version__", None),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "copy_bandwidth_TBps": None if copy_bw is None else round(copy_bw / 1e12, 3)}
    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"]
        env["device"] = name.decode() if isinstance(name, bytes) else name
        env["compute_capability"] = f"{props['major']}.{props['minor']}"
        env["sms"] = props.get("multiProcessorCount")
        env["l2_bytes"] = props.get("l2CacheSize")
        env["persisting_l2_max_bytes"] = props.get("persistingL2CacheMaxSize")
        env["prefetch_path"] = ("cp.async.bulk.prefetch.L2" if props["major"] >= 9
                                else "prefetch.global.L2 per 128-byte line (below sm_90)")
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        env["device_error"] = _first_line(exc)
    try:
        env["persisting_l2_limit_bytes"] = cp.cuda.runtime.deviceGetLimit(0x06)  # cudaLimitPersistingL2CacheSize
    except Exception as exc:  # noqa: BLE001 - older CuPy: recorded, not fatal
        env["persisting_l2_limit_bytes"] = _first_line(exc)
    return env


def main(argv=None) -> int:
    args = parse_args(argv)
    jobs = plan(args)
    if args.list:
        for jb in jobs:
            print(f"{jb['group']:<34} {jb['variant']:<26} {'hot ' if jb['hot'] else ''}{steps_text(jb['steps'])}")
        keys = {tuple(st["w"]) for jb in jobs for st in jb["steps"] if "w" in st}
        total = sum(wbytes(k) * sets_for(wbytes(k)) for k in keys)
        print(f"{len(jobs)} graphs of {args.calls} sequences, {args.replays} replays each; weights {total >> 20} MiB")
        return 0
    try:
        import cupy as cp

        n_dev = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - no CuPy, no driver or no device: one line, nonzero
        print(f"l2_prefetch_probe: no CUDA device ({_first_line(exc)})", file=sys.stderr)
        return 2
    if n_dev == 0:
        print("l2_prefetch_probe: no CUDA device (getDeviceCount() == 0)", file=sys.stderr)
        return 2
    import numpy as np

    from kernels_cu.fast_gemm import gemm_bf16

    gemm_bf16(cp.zeros((2, 8), np.uint16), cp.zeros((2, 8), np.uint16))  # loads libcublas
    try:
        import torch

        from benchmarks.gpu_bench import Timer, measure_ceilings

        copy_bw = measure_ceilings(cp, torch, Timer(cp, torch))["copy_bandwidth_TBps"] * 1e12
    except ImportError as exc:  # torch missing: no floors, the rest still runs
        torch, copy_bw = None, None
        print(f"l2_prefetch_probe: no copy bandwidth, floors left out ({_first_line(exc)})", file=sys.stderr)
    env = environment(cp, torch, copy_bw)
    print(json.dumps({"env": env}), flush=True)
    runner = Runner(cp, np, args)
    rows = []
    for jb in jobs:
        row = {k: v for k, v in jb.items() if k != "floor_bytes"}
        row["sets"] = 1 if jb["hot"] else {st["w"][1]: sets_for(wbytes(tuple(st["w"])))
                                          for st in jb["steps"] if "w" in st}
        row["floor_us"] = (round(jb["floor_bytes"] / copy_bw * 1e6, 2)
                           if copy_bw and jb["floor_bytes"] else None)
        note = _reuse_note(jb, args.calls)
        if note:
            row["reuse_note"] = note
        try:
            row["us"] = round(runner.time_us(jb), 2)
        except Exception as exc:  # noqa: BLE001 - a configuration that fails is a row that says why
            row["us"] = None
            row["error"] = _first_line(exc)
            try:
                cp.cuda.Device().synchronize()
            except Exception:  # noqa: BLE001,S110 - a sticky error shows in the next rows
                pass
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "steps"}), flush=True)
    finish(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "args": vars(args), "rows": rows}, f, indent=1)
    print(f"\nus per call (graph of {args.calls}, median of {args.replays} replays); saving = baseline - variant "
          f"(a, b, sweep: 'none'; check: 'GEMM cold'); floor = weight bytes / "
          f"{env['copy_bandwidth_TBps']} TB/s copy")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
