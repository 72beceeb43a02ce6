"""Full-width checks at the spec's official geometries.

The committed vectors are small (reduced widths) so that they can live in the
repository. This module builds the same Ops at the two geometries of the spec's
table with random weights — 35B-A3B DFlash (H 2048, five local layers and one
full, S 4096) and 27B DFlash2 (H 5120, five local layers, S 2048, conv, selector
rank 256, top-16) — at batch B, width W and a context of F positions, computes
the float64 reference, the float32 baseline and the bounds in memory
(``generate.case_vector``: the same path as a stored vector) and runs an
implementation on them.

Per geometry and (B, W): ``masked_block`` over the full stack, then the
proposal path on the reference's mask hidden columns (``proposal_head`` for
DFlash; ``candidate_topk`` and ``candidate_selector`` for DFlash2, each fed the
reference outputs of the step before: teacher forcing across Ops). Once per
geometry: ``context_kv`` materializing the whole context as one chunk (for
DFlash2 that chunk is longer than the ring, S < F).

The weights are random BF16 (scaled by 1/sqrt(fan-in) so activations stay of
order one). They are shared by every (B, W) of a geometry, so a run costs one
weight draw per geometry. Memory: the float64 reference of the DFlash2 stack
holds about 15 GB; run this on a large host (the GPU machine), or with
``--reduced`` for a small shape of the same structure.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np

from conformance import registry
from conformance.compare import CaseResult
from conformance.generate import case_vector
from conformance.registry import Case
from conformance.runner import run_case
from reference.config import PRESETS, DraftConfig, reduced

GEOMETRIES = {"dflash-35b-a3b": "qwen3.5-35b-a3b-dflash", "dflash2-27b": "qwen3.5-27b-dflash2"}
PUBLIC_VOCAB_MARGIN = 192  # padded head rows beyond the public vocabulary (never chosen)


def small(cfg: DraftConfig) -> DraftConfig:
    """The same structure (layer pattern, GQA ratio, conv, selector) at a size a laptop runs."""
    return reduced(cfg, hidden=128, intermediate=384, heads=8, kv_heads=2, head_dim=32, vocab=4096,
                   window=min(cfg.sliding_window or 64, 64), rank=32 if cfg.selector_rank else None)


_BLOCK = 1 << 24  # elements drawn from one generator; larger tensors are drawn block by block in threads


def _bf16(rng: np.random.Generator, shape, scale: float) -> np.ndarray:
    """Normal(0, scale) drawn in float32 and cast once to BF16 (any BF16 value is a valid input).

    A tensor larger than one block (the full-width weights: 6 GB at the 27B geometry, about a
    minute on one core) takes one seed from ``rng`` and draws each block from its own generator
    (SeedSequence.spawn) in a thread pool: NumPy's generators release the GIL while they fill, so
    the draw scales with the cores, and the values do not depend on how many there are."""
    n = int(np.prod(shape))
    if n <= _BLOCK:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(ml_dtypes.bfloat16)
    out = np.empty(n, ml_dtypes.bfloat16)
    starts = range(0, n, _BLOCK)
    seeds = np.random.SeedSequence(int(rng.integers(2**63))).spawn(len(starts))

    def fill(j: int) -> None:
        a = starts[j]
        block = np.random.default_rng(seeds[j]).standard_normal(min(_BLOCK, n - a), dtype=np.float32)
        out[a:a + block.size] = (block * np.float32(scale)).astype(ml_dtypes.bfloat16)

    with ThreadPoolExecutor(max(1, min(len(starts), os.cpu_count() or 1))) as pool:
        list(pool.map(fill, range(len(starts))))
    return out.reshape(shape)


def _gain(rng, shape) -> np.ndarray:
    return rng.uniform(0.5, 1.5, shape).astype(np.float32).astype(ml_dtypes.bfloat16)


def weights(cfg: DraftConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Stacked draft-layer weights, final norm and one shared head/embedding table."""
    rng = np.random.default_rng(seed)
    L, h, i = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
    hq, hk, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    w = {
        "input_norm": _gain(rng, (L, h)), "wq": _bf16(rng, (L, hq * d, h), h**-0.5),
        "wk": _bf16(rng, (L, hk * d, h), h**-0.5), "wv": _bf16(rng, (L, hk * d, h), h**-0.5),
        "q_norm": _gain(rng, (L, d)), "k_norm": _gain(rng, (L, d)), "wo": _bf16(rng, (L, h, hq * d), (hq * d) ** -0.5),
        "post_norm": _gain(rng, (L, h)), "w_gate": _bf16(rng, (L, i, h), h**-0.5),
        "w_up": _bf16(rng, (L, i, h), h**-0.5), "w_down": _bf16(rng, (L, h, i), i**-0.5),
        "final_norm": _gain(rng, (h,)),
        # the draft has no embedding or head of its own: one table stands for the target's two
        "head": _bf16(rng, (cfg.vocab_size, h), 1.0),
    }
    if cfg.variant == "dflash2":
        g = h // 16
        for side in ("attn", "mlp"):
            base = np.empty((L, 2, 2, h), np.float32)
            base[:, :, 0] = 1.0 + 0.2 * rng.standard_normal((L, 2, h), dtype=np.float32)
            base[:, :, 1] = 0.5 * rng.standard_normal((L, 2, h), dtype=np.float32)
            w[f"{side}_conv_base"] = base.astype(ml_dtypes.bfloat16)
            w[f"{side}_conv_proj"] = _bf16(rng, (L, 4 * g, h), 0.2 * h**-0.5)
        r = cfg.selector_rank
        w["w_hidden"] = _bf16(rng, (r, h), h**-0.5)
        w["w_pred"] = _bf16(rng, (cfg.vocab_size, r), 1.0)
        w["w_succ"] = _bf16(rng, (cfg.vocab_size, r), r**-0.5)
    return w


def _capacity(cfg: DraftConfig, context: int) -> int:
    """One ring capacity for every layer: a full layer needs C >= F; all-local stacks use C = S."""
    return context if cfg.full_pool else int(cfg.sliding_window)


def _context(rng, shape) -> tuple[np.ndarray, np.ndarray]:
    """Context K (BF16) and V (FP16 holding BF16 values, as context_kv stores them)."""
    k = _bf16(rng, shape, 1.0)
    v = np.abs(_bf16(rng, shape, 1.0)).astype(np.float16)  # BF16 -> FP16 exact at this scale
    return k, v


def _ids(name: str, batch: int, width: int, context: int) -> str:
    return f"{name}_B{batch}_W{width}_F{context}"


def masked_block_case(name, cfg, w, batch, width, context, seed=1) -> Case:
    rng = np.random.default_rng([seed, batch, width])
    cap = _capacity(cfg, context)
    L, hk, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    frontier = context - 3 * np.arange(batch, dtype=np.int64)  # mixed frontiers in one batch
    k_ctx, v_ctx = _context(rng, (L, batch, cap, hk, d))
    mask_id = int(cfg.mask_token_id if cfg.mask_token_id is not None else cfg.vocab_size - 1)
    anchor = rng.integers(0, cfg.vocab_size - PUBLIC_VOCAB_MARGIN, batch).astype(np.int32)
    if cfg.variant == "dflash":  # DFlash attends only its live P+1 columns: sweep tails across rows
        live = np.maximum(width - (np.arange(batch) % 4), 1).astype(np.int32)
    else:
        live = np.full(batch, width, np.int32)
    layer = {k: w[k] for k in ("input_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_norm", "w_gate",
                               "w_up", "w_down")}
    if cfg.variant == "dflash2":
        layer.update({k: w[k] for k in ("attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj")})
    inputs = dict(anchor=anchor, embed=w["head"], frontier=frontier, live=live, context_k=k_ctx, context_v=v_ctx,
                  final_norm=w["final_norm"], **layer)
    params = {"mask_token_id": mask_id, "windows": [int(x) for x in cfg.windows], "eps": cfg.rms_norm_eps,
              "theta": cfg.rope_theta, "head_dim": d, "variant": cfg.variant, "num_drafts": width - 1}
    cols = np.arange(1, width)[None, :] < live[:, None]
    mask = np.broadcast_to(cols[:, :, None], (batch, width - 1, cfg.hidden_size)).copy()
    return Case(f"masked_block/full_{_ids(name, batch, width, context)}", inputs, params, ("full_geometry",),
                {"hidden": mask})


def head_cases(name, cfg, w, batch, width, context, hidden, seed=2) -> list[Case]:
    """The proposal path on the reference's mask hidden columns (BF16)."""
    tag = _ids(name, batch, width, context)
    vocab = cfg.vocab_size - PUBLIC_VOCAB_MARGIN
    if cfg.variant == "dflash":
        return [Case(f"proposal_head/full_{tag}", {"hidden": hidden, "head": w["head"]}, {"vocab_size": vocab},
                     ("full_geometry", "vocab_padding"))]
    return [Case(f"candidate_topk/full_{tag}", {"hidden": hidden, "head": w["head"]},
                 {"vocab_size": vocab, "top_k": int(cfg.selector_top_k),
                  "output_multiplier": float(cfg.output_multiplier or 0.0),
                  "softcap": float(cfg.final_logit_softcapping or 0.0)}, ("full_geometry", "vocab_padding"))]


def selector_case(name, cfg, w, batch, width, context, hidden, topk_ref, anchor, seed=3) -> Case:
    rng = np.random.default_rng([seed, batch, width])
    temperature = np.where(np.arange(batch) % 2 == 0, 0.0, 1.0).astype(np.float32)  # greedy and sampled rows
    seeds = rng.integers(0, 2**63, batch, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    inputs = {"hidden": hidden, "scores": topk_ref["scores"], "ids": topk_ref["ids"], "anchor": anchor,
              "w_hidden": w["w_hidden"], "w_pred": w["w_pred"], "w_succ": w["w_succ"], "temperature": temperature,
              "seed": seeds, "frontier": context - 3 * np.arange(batch, dtype=np.int64)}
    return Case(f"candidate_selector/full_{_ids(name, batch, width, context)}", inputs, {},
                ("full_geometry", "rng_key"))


def context_kv_case(name, cfg, w, context, seed=4) -> Case:
    rng = np.random.default_rng(seed)
    cap = _capacity(cfg, context)
    hk, d, h = cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    k0, v0 = _context(rng, (cap, hk, d))
    inputs = {"context": _bf16(rng, (context, h), 1.0), "k_cache": k0, "v_cache": v0,
              "wk": w["wk"][0], "wv": w["wv"][0], "k_norm": w["k_norm"][0]}
    params = {"start": 0, "eps": cfg.rms_norm_eps, "theta": cfg.rope_theta, "head_dim": d, "storage": "ring"}
    flags = ("full_geometry",) + (("chunk_longer_than_S",) if context > cap else ())
    return Case(f"context_kv/full_{name}_F{context}_C{cap}", inputs, params, flags)


BLOCK_PATH_OPS = ("masked_block", "proposal_head", "candidate_topk", "candidate_selector")  # per (B, W)


def parts(names=tuple(GEOMETRIES), batches=(1, 8), widths=(8, 16), ops=None, per_geometry=False) -> list[dict]:
    """The run split into independent parts (``dflash-conformance geometry --jobs``): one per
    geometry and (B, W) proposal path, or (``per_geometry``) one per geometry with all of its paths,
    each with the Ops it runs (``batches`` / ``widths``: the lists a part runs, None: only
    context_kv); a geometry's context_kv goes with its first part (alone where no block Op is wanted).
    Together the parts run exactly the cases of ``run(names, batches, widths, ops=ops)``, in its order.
    A part is one process that draws its geometry's weights and warms its kernels: per geometry, a run
    pays that once a geometry instead of once a path."""
    wanted = list(ops) if ops else ["context_kv", *BLOCK_PATH_OPS]
    block = [op for op in wanted if op != "context_kv"]
    out = []
    for name in names:
        first = "context_kv" in wanted
        chains = [(b, w) for b in batches for w in widths] if block else []
        if not chains and first:
            out.append({"geometry": name, "batches": None, "widths": None, "ops": ["context_kv"]})
        elif per_geometry:
            out.append({"geometry": name, "batches": list(batches), "widths": list(widths),
                        "ops": (["context_kv"] if first else []) + block})
            continue
        for b, w in chains:
            out.append({"geometry": name, "batches": [b], "widths": [w],
                        "ops": (["context_kv"] if first else []) + block})
            first = False
    return out


def run(impl, names=tuple(GEOMETRIES), batches=(1, 8), widths=(8, 16), context=4096, reduce=False,
        timeout: float | None = 1800, log=print, on_result=None, ops=None) -> list[CaseResult]:
    """Build and run every full-width case; ``log`` gets one line per case and
    ``on_result(results so far)`` is called after each (a long run keeps its report)."""
    specs = registry.ops()
    results = []
    wanted = set(ops) if ops else set(specs)  # Op names to run; the proposal path needs masked_block first
    block_path = wanted & set(BLOCK_PATH_OPS)

    def one(case: Case):
        spec = specs[case.op]
        t0 = time.perf_counter()
        vec = case_vector(spec, case)
        t1 = time.perf_counter()
        res = run_case(impl, vec, timeout, spec.force, spec.independent)
        results.append(res)
        if on_result:
            on_result(results)
        log(f"{res.result.name:<15} {case.id}  (reference+baseline {t1 - t0:.1f} s, implementation "
            f"{res.seconds:.2f} s) {res.detail}")
        return vec

    for name in names:
        cfg = PRESETS[GEOMETRIES[name]]
        cfg = small(cfg) if reduce else cfg
        ctx = min(context, 256) if reduce else context
        log(f"{name}: H {cfg.hidden_size}, {cfg.num_hidden_layers} layers {list(cfg.windows)}, I "
            f"{cfg.intermediate_size}, heads {cfg.num_attention_heads}/{cfg.num_key_value_heads}/{cfg.head_dim}, "
            f"vocab {cfg.vocab_size}, context {ctx}")
        t0 = time.perf_counter()
        w = weights(cfg)
        log(f"{name}: weights drawn in {time.perf_counter() - t0:.1f} s")
        if "context_kv" in wanted:
            one(context_kv_case(name, cfg, w, ctx))
        for b in batches if block_path else ():
            for width in widths:
                mb = one(masked_block_case(name, cfg, w, b, width, ctx))
                hidden, anchor = mb.expected["hidden"], mb.inputs["anchor"]
                for case in head_cases(name, cfg, w, b, width, ctx, hidden):
                    vec = one(case)
                    if case.op == "candidate_topk":
                        one(selector_case(name, cfg, w, b, width, ctx, hidden, vec.expected, anchor))
    return results
