"""The third-party adapters (examples/torch_sdpa, examples/flashinfer) and their GPU-host script,
as far as they can be checked without a GPU: the modules import without torch or FlashInfer, the
mask both adapters hand their kernels equals the reference's allowed mask (every vector, and drawn
shapes), the packed-mask and RoPE-table helpers, the summary table, the script's usage, dry run and
a run on a host with neither GPU nor FlashInfer. Where torch is installed (CPU is enough), SDPA's
MATH backend and the FlashInfer adapter's glue (over a stand-in for FlashInfer's kernels that
checks the same dtypes, head dims and layouts FlashInfer 0.5.3 does) run over the golden vectors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.vectors import parse_vector
from examples.flashinfer import adapter
from examples.torch_sdpa import summary
from examples.torch_sdpa.mask import allowed_mask, key_positions, pack_mask_rows, ring_positions
from reference.draft_attention import allowed as reference_allowed
from reference.draft_attention import key_positions as reference_key_positions
from reference.norms import rope_angles

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "third_party_check.sh"
REPORTS = ("sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flashinfer", "flashinfer_torch_norm")


def vectors_of(op: str):
    files = sorted((ROOT / "vectors" / op).glob("*.safetensors"))
    assert files, op
    return [parse_vector(f.read_bytes(), str(f)) for f in files]


# --- importable without torch or FlashInfer ------------------------------------------------------

BLOCKED_IMPORT = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'flashinfer', 'tvm_ffi'):
            raise ImportError('blocked: ' + name)
        return None
sys.meta_path.insert(0, Block())
import examples.torch_sdpa.sdpa as sdpa, examples.torch_sdpa.mask, examples.torch_sdpa.summary
import examples.flashinfer.adapter as fi, examples.flashinfer.warmup
assert not any(m.split('.')[0] in ('torch', 'flashinfer') for m in sys.modules), 'imported torch/flashinfer'
for cls in (sdpa.Math, sdpa.Flash, sdpa.Efficient, sdpa.Cudnn, fi.FlashInfer, fi.FlashInferTorchNorm):
    try:
        cls()
    except ImportError as exc:
        print(cls.__name__, exc)
    else:
        raise SystemExit(cls.__name__ + ' instantiated without torch')
"""


def test_modules_import_without_torch_or_flashinfer():
    proc = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT], cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 6
    assert all("needs PyTorch" in line for line in lines), lines  # torch is asked for before FlashInfer


def test_classes_offer_the_ops_they_cover():
    from examples.torch_sdpa import sdpa

    for cls, backend in ((sdpa.Math, "MATH"), (sdpa.Flash, "FLASH_ATTENTION"),
                         (sdpa.Efficient, "EFFICIENT_ATTENTION"), (sdpa.Cudnn, "CUDNN_ATTENTION")):
        assert cls.backend == backend and callable(cls.draft_attention)
    for op in ("draft_attention", "context_kv", "target_distribution"):
        assert callable(getattr(adapter.FlashInfer, op))
    # FlashInfer's speculative kernel draws its own uniforms: the Op is left NOT_IMPLEMENTED
    assert not hasattr(adapter.FlashInfer, "speculative_accept")
    assert adapter.FlashInferTorchNorm.normalized_k is not adapter.FlashInfer.normalized_k


# --- the mask ------------------------------------------------------------------------------------

def test_mask_equals_reference_on_every_draft_attention_vector():
    vecs = vectors_of("draft_attention")
    assert len(vecs) >= 40
    for vec in vecs:
        i = vec.inputs
        width, capacity, window = i["q"].shape[1], i["k_cache"].shape[1], int(vec.params["window"])
        ours = allowed_mask(i["frontier"], i["live"], capacity, width, window)
        theirs = reference_allowed(i["frontier"], i["live"], capacity, width, window)
        assert ours.dtype == bool and ours.shape == theirs.shape, vec.case
        assert np.array_equal(ours, theirs), vec.case


BASES = (0, 3, 17, 2**24, 2**31 - 5, 2**31, 2**32 - 3, 2**40)


@settings(max_examples=300, deadline=None)
@given(batch=st.integers(1, 3), capacity=st.integers(1, 12), width=st.integers(1, 9), data=st.data())
def test_mask_equals_reference_on_drawn_shapes(batch, capacity, width, data):
    frontier = np.array([data.draw(st.sampled_from(BASES)) + data.draw(st.integers(0, 20)) for _ in range(batch)],
                        dtype=np.int64)
    live = np.array(data.draw(st.lists(st.integers(0, width), min_size=batch, max_size=batch)), dtype=np.int32)
    window = data.draw(st.integers(0, capacity + width + 2))
    ours = allowed_mask(frontier, live, capacity, width, window)
    assert np.array_equal(ours, reference_allowed(frontier, live, capacity, width, window))
    pos, present = key_positions(frontier, live, capacity, width)
    ref_pos, ref_present = reference_key_positions(frontier, live, capacity, width)
    assert np.array_equal(pos, ref_pos) and np.array_equal(present, ref_present)


def test_ring_positions_follow_the_ops_example():
    # docs/ops.md: C 4, F 5: slots 0..3 hold positions 4, 1, 2, 3; F 0: nothing written yet
    assert ring_positions([5], 4).tolist() == [[4, 1, 2, 3]]
    assert (ring_positions([0], 4) < 0).all()
    assert ring_positions([2**32 + 1], 4).tolist() == [[2**32, 2**32 - 3, 2**32 - 2, 2**32 - 1]]
    mask = allowed_mask([5], [2], 4, 2, 3)
    assert mask.astype(int).tolist() == [[[1, 0, 0, 1, 1, 1], [1, 0, 0, 0, 1, 1]]]


def test_packed_mask_is_flashinfers_little_bit_order():
    rng = np.random.default_rng(0)
    for rows, keys in ((1, 1), (3, 5), (8, 24), (16, 80), (7, 13)):
        mask = rng.random((rows, keys)) < 0.5
        packed = pack_mask_rows(mask)
        assert packed.dtype == np.uint8 and packed.size == -(-rows * keys // 8)
        flat = mask.reshape(-1)
        for i in range(flat.size):
            assert bool((packed[i // 8] >> (i % 8)) & 1) == flat[i]


def test_rope_table_is_the_ops_float64_angles():
    positions = np.array([0, 1, 1001, 2**24 + 1, 2**31 + 7, 2**32 + 3], dtype=np.int64)
    for d, theta in ((16, 1e7), (32, 1e4), (64, 1e6)):
        table = adapter.rope_table(positions, d, theta)
        ang = rope_angles(positions, d, theta)
        assert table.dtype == np.float32 and table.shape == (positions.size, d)
        assert np.array_equal(table[:, : d // 2], np.cos(ang).astype(np.float32))
        assert np.array_equal(table[:, d // 2:], np.sin(ang).astype(np.float32))


def test_kernel_head_dim_pads_to_flashinfers_sizes():
    assert [adapter.kernel_head_dim(d) for d in (16, 32, 64, 80, 128, 200, 256, 512)] == \
        [64, 64, 64, 128, 128, 256, 256, 512]
    with pytest.raises(ValueError, match="larger"):
        adapter.kernel_head_dim(576)


# --- the summary table ---------------------------------------------------------------------------

def fake_report(path: Path) -> None:
    results = [
        {"op": "draft_attention", "case": "draft_attention/a", "result": "PASS", "detail": "ok",
         "envelope_frac": 0.1},
        {"op": "draft_attention", "case": "draft_attention/b", "result": "FAIL",
         "detail": "out: 256 non-finite mismatch(es), first at [0, 0, 0, 0]",
         "diagnosis": {"note": "", "matches": ["fp16_overflow"]}},
        {"op": "context_kv", "case": "context_kv/c", "result": "ERROR", "detail": "RuntimeError: boom\nmore"},
        {"op": "speculative_accept", "case": "speculative_accept/d", "result": "NOT_IMPLEMENTED", "detail": ""},
    ]
    ops = {"draft_attention": {"PASS": 1, "ACCEPTABLE": 0, "FAIL": 1, "ERROR": 0, "NOT_IMPLEMENTED": 0,
                               "worst_envelope_frac": "inf"},
           "context_kv": {"PASS": 0, "ACCEPTABLE": 0, "FAIL": 0, "ERROR": 1, "NOT_IMPLEMENTED": 0,
                          "worst_envelope_frac": None},
           "speculative_accept": {"PASS": 0, "ACCEPTABLE": 0, "FAIL": 0, "ERROR": 0, "NOT_IMPLEMENTED": 1,
                                  "worst_envelope_frac": None}}
    path.write_text(json.dumps({
        "implementation": "FlashInfer 0.5.3", "complete": True,
        "environment": {"library": "flashinfer", "flashinfer": "0.5.3", "jit_compiled": ["norm", "sampling"]},
        "summary": {"verdict": "FAILED", "complete": True, "planned": 4, "reported": 4, "ops": ops},
        "results": results}))


def test_summary_table_rows_and_first_failure(tmp_path):
    fake_report(tmp_path / "flashinfer.json")
    text = summary.render([tmp_path / "flashinfer.json", tmp_path / "sdpa_cudnn.json"])
    lines = text.splitlines()
    assert "flashinfer: FlashInfer 0.5.3: verdict FAILED, complete, 4 of 4 cases reported" in lines[0]
    assert "jit_compiled ['norm', 'sampling']" in text
    assert "sdpa_cudnn: no readable report" in text
    row = next(line for line in lines if line.startswith("flashinfer") and "draft_attention" in line)
    assert row.split()[2:9] == ["2", "1", "0", "1", "0", "0", "inf"]
    assert "FAIL b [diagnosis: fp16_overflow]: out: 256 non-finite" in row
    row = next(line for line in lines if "context_kv" in line)
    assert "ERROR c: RuntimeError: boom more" in row
    row = next(line for line in lines if "speculative_accept" in line)
    assert row.split()[2:8] == ["1", "0", "0", "0", "0", "1"]
    assert summary.main([]) == 2


def test_summary_reads_a_real_cli_report(tmp_path):
    report = tmp_path / "baseline.json"
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--in-process", "--ops",
                           "target_distribution", "--json", str(report)], cwd=ROOT, capture_output=True, text=True,
                          check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = summary.render([report])
    row = next(line for line in text.splitlines() if "target_distribution" in line)
    n = len(vectors_of("target_distribution"))
    assert row.split()[1:4] == ["target_distribution", str(n), str(n)]


# --- the script ----------------------------------------------------------------------------------

def run_script(*args, env=None, timeout=120):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          check=False,
                          env={**os.environ, **(env or {})})


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, check=False).returncode == 0


def test_script_usage():
    for args in ((), ("--bogus", "out"), ("a", "b")):
        proc = run_script(*args)
        assert proc.returncode == 2 and "usage: examples/third_party_check.sh OUT [--dry-run]" in proc.stderr


def test_script_dry_run_plans_every_run_and_runs_nothing(tmp_path):
    out = tmp_path / "out"
    proc = run_script(str(out), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert not out.exists()
    text = proc.stdout
    assert ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "
            "/tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH") in text
    for cls, name in (("Math", "sdpa_math"), ("Flash", "sdpa_flash"), ("Efficient", "sdpa_efficient"),
                      ("Cudnn", "sdpa_cudnn")):
        assert (f"--impl examples.torch_sdpa.sdpa:{cls} --vectors vectors --ops draft_attention --json "
                f"{out}/{name}.json --timeout 300") in text
    assert ("--impl examples.flashinfer.adapter:FlashInfer --vectors vectors --ops "
            f"draft_attention,context_kv,target_distribution,speculative_accept --json {out}/flashinfer.json") in text
    assert "--impl examples.flashinfer.adapter:FlashInferTorchNorm --vectors vectors --ops context_kv" in text
    assert "python3 -m examples.flashinfer.warmup all" in text
    # the SDPA runs come first, the FlashInfer runs get what remains of the budget
    assert text.index("sdpa:Cudnn") < text.index("adapter:FlashInfer ")
    limits = [int(line.split()[2]) for line in text.splitlines() if "conformance.cli run" in line]
    assert limits[:4] == [75] * 4 and all(limit <= 440 for limit in limits)


def test_script_runs_only_what_is_asked_for(tmp_path):
    """THIRD_PARTY_SDPA / THIRD_PARTY_FI_OPS narrow a rerun: one FlashInfer Op warms only its modules,
    no SDPA run, no FP32-norm run without context_kv; empty FlashInfer Ops: no FlashInfer at all."""
    out = tmp_path / "out"
    proc = run_script(str(out), "--dry-run", env={"THIRD_PARTY_SDPA": "", "THIRD_PARTY_FI_OPS": "target_distribution"})
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "sdpa:" not in text and "FlashInferTorchNorm" not in text
    assert "python3 -m examples.flashinfer.warmup target_distribution" in text
    assert f"--impl examples.flashinfer.adapter:FlashInfer --vectors vectors --ops target_distribution --json " \
        f"{out}/flashinfer.json" in text
    proc = run_script(str(out), "--dry-run", env={"THIRD_PARTY_SDPA": "Math", "THIRD_PARTY_FI_OPS": ""})
    assert proc.returncode == 0, proc.stderr
    assert "sdpa:Math" in proc.stdout and "sdpa:Flash" not in proc.stdout and "flashinfer" not in proc.stdout


def test_script_without_gpu_or_flashinfer_still_reports(tmp_path):
    """On a host with neither (this one, where torch may be absent too) every step fails fast and
    OUT still gets the summary, naming every run, and the logs: at most 8 files."""
    out = tmp_path / "out"
    fi_ws = tmp_path / "fi_ws"
    proc = run_script(str(out), env={"THIRD_PARTY_BUDGET": "200", "FLASHINFER_WORKSPACE_BASE": str(fi_ws),
                                     "PYTHONPATH": str(ROOT)}, timeout=400)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert "summary.txt" in files and "logs.tar.gz" in files and len(files) <= 8, files
    text = (out / "summary.txt").read_text()
    for name in REPORTS:
        assert name in text
    if not (out / "flashinfer.json").exists():
        assert "flashinfer: import failed" in text
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("versions.txt") for n in names) and any(n.endswith("sdpa_math.log") for n in names)


# --- with torch (CPU is enough): SDPA MATH and the FlashInfer glue over the golden vectors ---------

def fake_flashinfer(torch):
    """A stand-in for FlashInfer 0.5.3's kernels: the same argument checks (16-bit q/k/v, one K/V
    dtype, head dims 64/128/256/512 for prefill and RoPE, FP32 cos/sin cache, NHD layout, packed
    little-endian mask) and plain torch arithmetic (FP32 scores, P in the input dtype for PV)."""
    half = (torch.float16, torch.bfloat16)
    dims = (64, 128, 256, 512)

    def single_prefill_with_kv_cache(q, k, v, packed_custom_mask=None, kv_layout="NHD", pos_encoding_mode="NONE",
                                     sm_scale=None, backend="auto"):
        assert kv_layout == "NHD" and pos_encoding_mode == "NONE" and backend in ("auto", "fa2")
        assert q.dtype in half and k.dtype == v.dtype == q.dtype and q.shape[-1] in dims, (q.dtype, q.shape)
        assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        w, hq, _ = q.shape
        n, hk, _ = k.shape
        bits = np.unpackbits(packed_custom_mask.cpu().numpy(), bitorder="little")[: w * n].reshape(w, n)
        mask = torch.from_numpy(bits.astype(bool)).to(q.device)
        kk = k.float().repeat_interleave(hq // hk, dim=1)
        vv = v.float().repeat_interleave(hq // hk, dim=1)
        s = torch.einsum("whd,nhd->hwn", q.float(), kk) * sm_scale
        s = s.masked_fill(~mask, float("-inf"))
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        o = torch.einsum("hwn,nhd->whd", p.to(q.dtype).float(), vv) / p.sum(-1).transpose(0, 1)[..., None]
        return o.to(q.dtype)

    def rmsnorm(x, w, eps=1e-6, out=None, enable_pdl=None):
        assert x.dtype in half and w.dtype == x.dtype and x.dim() in (2, 3) and w.shape[-1] == x.shape[-1]
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    def apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=True):
        assert cos_sin_cache.dtype == torch.float32 and head_size in dims and query.dtype in half and is_neox
        assert positions.dtype in (torch.int32, torch.int64) and query.dim() == 2 and key.dim() == 2
        r = cos_sin_cache.shape[1]
        cos, sin = cos_sin_cache[positions, : r // 2][:, None], cos_sin_cache[positions, r // 2:][:, None]

        def rotate(x):
            x = x.view(x.shape[0], -1, head_size).float()
            x1, x2 = x[..., : r // 2], x[..., r // 2: r]
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]], -1).to(query.dtype)

        return rotate(query).reshape(query.shape), rotate(key).reshape(key.shape)

    def softmax(logits, temperature=None, enable_pdl=None):
        assert logits.dtype == torch.float32 and temperature.shape == logits.shape[:1]
        return torch.softmax(logits * (1.0 / temperature.float())[:, None], dim=-1)

    def top_k_renorm_probs(probs, top_k):
        assert probs.dtype == torch.float32 and top_k.dtype == torch.int32 and top_k.shape == probs.shape[:1]
        pivot = torch.sort(probs, -1, descending=True).values.gather(1, top_k.long()[:, None] - 1)
        kept = torch.where(probs >= pivot, probs, 0)  # a threshold: ties at the boundary stay
        return kept / kept.sum(-1, keepdim=True)

    def top_p_renorm_probs(probs, top_p):
        assert probs.dtype == torch.float32 and top_p.dtype == torch.float32 and top_p.shape == probs.shape[:1]
        sorted_p = torch.sort(probs, -1, descending=True).values
        before = torch.cumsum(sorted_p, -1) - sorted_p
        pivot = torch.where(before < top_p[:, None], sorted_p, 2.0).amin(-1, keepdim=True)
        kept = torch.where(probs >= pivot, probs, 0)
        return kept / kept.sum(-1, keepdim=True)

    fi = types.ModuleType("flashinfer")
    fi.__version__ = "0.5.3+stand-in"
    fi.single_prefill_with_kv_cache = single_prefill_with_kv_cache
    fi.apply_rope_with_cos_sin_cache = apply_rope_with_cos_sin_cache
    fi.norm = types.SimpleNamespace(rmsnorm=rmsnorm)
    fi.sampling = types.SimpleNamespace(softmax=softmax, top_k_renorm_probs=top_k_renorm_probs,
                                        top_p_renorm_probs=top_p_renorm_probs)
    return fi


def verdicts(impl, ops: str) -> dict:
    from conformance.runner import run_suite

    return {r.case: r for r in run_suite(impl, ROOT / "vectors", ops_pattern=ops, diagnose=True)}


def test_sdpa_math_over_the_vectors():
    pytest.importorskip("torch")
    from examples.torch_sdpa.sdpa import Math

    res = verdicts(Math(), "draft_attention")
    bad = {c: (r.result.name, r.detail) for c, r in res.items() if r.result.name not in ("PASS", "ACCEPTABLE")}
    # SDPA multiplies the zero weight of a masked key by its infinite V (FP16 overflow): NaN
    assert set(bad) == {"draft_attention/fp16_overflow__v_inf_outside_window_S4_C12_F30_W4"}, bad
    assert bad.popitem()[1][0] == "FAIL"


def test_flashinfer_glue_over_the_vectors(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer(torch))
    res = verdicts(adapter.FlashInfer(), "draft_attention,context_kv,target_distribution,speculative_accept")
    counts = {}
    for r in res.values():
        counts[r.result.name] = counts.get(r.result.name, 0) + 1
    assert counts.get("ERROR", 0) == 0, [(c, r.detail) for c, r in res.items() if r.result.name == "ERROR"]
    assert counts["NOT_IMPLEMENTED"] == len(vectors_of("speculative_accept"))
    fails = {c for c, r in res.items() if r.result.name == "FAIL"}
    # what the stand-in shares with FlashInfer by design: 0 * inf at a masked key, and top-k / top-p
    # as thresholds that keep every token tied at the boundary (the diagnosis names those two mutants)
    thresholds = {"target_distribution/top_k_exact_ties_at_boundary": "top_k_keeps_ties",
                  "target_distribution/filter_boundary__top_p_reached_exactly_min_p_at_threshold":
                      "filter_boundary-top_p_keeps_ties"}
    allowed = {"draft_attention/fp16_overflow__v_inf_outside_window_S4_C12_F30_W4", *thresholds}
    assert fails <= allowed, {c: res[c].detail for c in fails - allowed}
    assert set(thresholds) <= fails, {c: res[c].result.name for c in thresholds}
    named = {c: res[c].diagnosis[0]["mutant"] if res[c].diagnosis else res[c].diagnosis_note for c in thresholds}
    assert named == thresholds, named
    assert sum(r.result.name in ("PASS", "ACCEPTABLE") for r in res.values()) >= \
        len(vectors_of("draft_attention")) + len(vectors_of("context_kv")) + len(vectors_of("target_distribution")) \
        - len(allowed)


def test_warmup_runs_each_op_on_its_first_vector(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    from examples.flashinfer import warmup

    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer(torch))
    # the stand-in has no JIT: the build step says so and the Ops still run
    assert warmup.main(["all", "--vectors", str(ROOT / "vectors")]) == 1
    text = capsys.readouterr().out
    assert "warmup build: cannot list FlashInfer's JIT specs" in text
    for op in warmup.OPS:
        assert f"warmup {op}: " in text and "second call" in text
        line = next(x for x in text.splitlines() if x.startswith(f"warmup {op}: ") and "ran (JIT included)" in x)
        assert "max |diff|" in line
    assert warmup.main(["target_distribution", "--vectors", str(ROOT / "vectors")]) == 0
    assert "warmup build" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        warmup.main(["speculative_accept"])


def test_adapter_calls_bind_to_flashinfers_signatures():
    """Where FlashInfer itself is importable, every call the adapter makes binds to its API."""
    import inspect

    fi = pytest.importorskip("flashinfer")
    calls = [(fi.single_prefill_with_kv_cache, ("q", "k", "v"),
              {"packed_custom_mask": 0, "kv_layout": "NHD", "pos_encoding_mode": "NONE", "sm_scale": 0.25,
               "backend": "fa2"}),
             (fi.norm.rmsnorm, ("x", "w"), {"eps": 1e-6}),
             (fi.apply_rope_with_cos_sin_cache, ("rows", "x", "x", 64, "table"), {"is_neox": True}),
             (fi.sampling.softmax, ("z",), {"temperature": "t"}),
             (fi.sampling.top_k_renorm_probs, ("p", "k"), {}),
             (fi.sampling.top_p_renorm_probs, ("p", "top_p"), {})]
    for fn, args, kwargs in calls:
        inspect.signature(fn).bind(*args, **kwargs)
