"""Compile FlashInfer's JIT modules ahead of a conformance run, then try each Op once.

    python3 -m examples.flashinfer.warmup [all | build | draft_attention | context_kv | target_distribution]
        [--vectors vectors] [--impl FlashInfer]

FlashInfer 0.5.3 compiles each kernel module with nvcc the first time it is used (minutes for the
prefill, RoPE and sampling modules) and caches it under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer
(default ~/.cache/flashinfer). A conformance run whose first case waits for that compilation may pass
its per-case --timeout, and lazily the modules compile one after another. ``build`` compiles the four
modules the adapter uses (the FA2 single-prefill kernel for BF16 and head dim 64, norm, rope,
sampling) at once, one ninja per module in parallel threads; ``all`` (the default) does that, then
calls the adapter's own Op method on the first golden vector of each Op, which loads exactly the
modules the run needs (compiling any the build step missed) and prints how long it took, the
largest difference from the expected output, and what the JIT cache holds afterwards.
examples/third_party_check.sh runs ``all`` in the background while the SDPA runs go.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

OPS = ("draft_attention", "context_kv", "target_distribution")
PREFILL_HEAD_DIM = 64  # every draft_attention vector (D 16 or 32) is padded to 64 by the adapter


def first_vector(root: Path, op: str):
    from conformance.vectors import parse_vector

    files = sorted((root / op).glob("*.safetensors"))
    if not files:
        raise SystemExit(f"warmup: no vectors under {root / op}")
    return parse_vector(files[0].read_bytes(), str(files[0]))


def max_difference(vec, outputs) -> str:
    """The largest |out - expected| over each output (FP64, compared elements only), as text."""
    from conformance.invoke import to_numpy

    parts = []
    for name, value in outputs.items():
        if name not in vec.expected:
            continue
        got = np.asarray(to_numpy(value), dtype=np.float64)
        want = np.asarray(vec.expected[name], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.abs(got - want)
        mask = vec.masks.get(name)
        if mask is not None:
            diff = np.where(np.broadcast_to(mask, diff.shape), diff, 0)
        finite = diff[np.isfinite(diff)]
        parts.append(f"{name}: max |diff| {finite.max() if finite.size else 0:.3g}"
                     f"{'' if finite.size == diff.size else ' (non-finite entries)'}")
    return "; ".join(parts)


def jit_specs(torch) -> dict:
    """FlashInfer's JIT specs for the modules the adapter calls, keyed by a readable name (the
    arguments are those single_prefill_with_kv_cache passes for BF16, head dim 64, no RoPE, no
    sliding window, no soft cap, FP32 QK reduction, backend fa2)."""
    from flashinfer.jit import gen_single_prefill_module
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.rope import gen_rope_module
    from flashinfer.jit.sampling import gen_sampling_module

    bf = torch.bfloat16
    return {"prefill": gen_single_prefill_module("fa2", bf, bf, bf, PREFILL_HEAD_DIM, PREFILL_HEAD_DIM, 0, False,
                                                 False, False),
            "norm": gen_norm_module(), "rope": gen_rope_module(), "sampling": gen_sampling_module()}


def build(torch) -> bool:
    """Compile every spec of jit_specs concurrently; True when all built."""
    try:
        specs = jit_specs(torch)
    except Exception as exc:  # noqa: BLE001 - the Op calls below still compile lazily
        print(f"warmup build: cannot list FlashInfer's JIT specs ({type(exc).__name__}: {exc}); "
              "the Ops compile their modules lazily", flush=True)
        return False

    def one(item):
        name, spec = item
        start = time.perf_counter()
        try:
            spec.build(verbose=False)
            return name, spec.name, time.perf_counter() - start, None
        except Exception as exc:  # noqa: BLE001 - reported, and the Op call retries it
            return name, spec.name, time.perf_counter() - start, exc

    ok = True
    with ThreadPoolExecutor(len(specs)) as pool:
        for name, uri, seconds, exc in pool.map(one, specs.items()):
            if exc is None:
                print(f"warmup build: {name} ({uri}) compiled in {seconds:.1f} s", flush=True)
                continue
            ok = False
            lines = str(exc).splitlines()
            print(f"warmup build: {name} ({uri}) FAILED after {seconds:.1f} s: {type(exc).__name__}: "
                  f"{lines[0] if lines else ''}", flush=True)
            for line in lines[-40:]:
                print(f"    {line}", flush=True)
    return ok


def sync(impl) -> None:
    if impl.device.type == "cuda":
        impl.torch.cuda.synchronize()


def try_op(impl, op: str, root: Path) -> None:
    vec = first_vector(root, op)
    start = time.perf_counter()
    outputs = getattr(impl, op)(**vec.kwargs())
    sync(impl)
    print(f"warmup {op}: {vec.case} ran (JIT included) in {time.perf_counter() - start:.1f} s; "
          f"{max_difference(vec, outputs)}", flush=True)
    start = time.perf_counter()
    getattr(impl, op)(**vec.kwargs())
    sync(impl)
    print(f"warmup {op}: second call {time.perf_counter() - start:.3f} s", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m examples.flashinfer.warmup")
    parser.add_argument("what", nargs="?", default="all", choices=("all", "build") + OPS)
    parser.add_argument("--vectors", default="vectors")
    parser.add_argument("--impl", default="FlashInfer", help="class in examples.flashinfer.adapter")
    args = parser.parse_args(argv)

    from examples.flashinfer import adapter

    start = time.perf_counter()
    impl = getattr(adapter, args.impl)()
    print(f"warmup: {impl.name}; imported in {time.perf_counter() - start:.1f} s", flush=True)
    status = 0
    if args.what in ("all", "build"):
        start = time.perf_counter()
        status = 0 if build(impl.torch) else 1
        print(f"warmup build: {time.perf_counter() - start:.1f} s", flush=True)
    for op in OPS if args.what == "all" else (args.what,) if args.what in OPS else ():
        try:
            try_op(impl, op, Path(args.vectors))
        except Exception as exc:  # noqa: BLE001 - the conformance run reports it per case
            status = 1
            print(f"warmup {op}: FAILED: {type(exc).__name__}: {exc}".splitlines()[0], flush=True)
    print(f"warmup: JIT cache {impl.environment().get('jit_compiled')}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
