"""conformance/round_e2e.py on the CPU: greedy speculative decoding whose proposals come from an
implementation's proposal round (here the float32 baseline's Op methods composed by
reference.proposal_round.run, the composition kernels_cu/round.py runs over the CUDA kernels)
publishes exactly plain greedy decoding of the toy target (the H200 run is
docs/reports/h200-round-e2e.md). What the tests show:

- the loop equals plain decoding for a few prompts at K = 1, 5 and 15, both drafter kinds, and the
  runs are not trivial: proposals are accepted, DFlash2's rings wrap (capacity S), and the
  baseline's proposals agree with the float64 round on the same inputs (--check) but for rare
  near-ties;
- CudaRound's host-side composition (kernels_cu/round.py: BF16 as uint16 bit patterns into the
  backend's Op methods and back) runs the same loop, with a CPU stand-in backend that speaks the
  CuPy convention, and gets the same outputs and proposals as the baseline composition;
- the harness can fail: proposals outside the public vocabulary are counted as errors, a planted
  commit bug (the loop publishing one token too many) makes outputs differ, and proposals that are
  not the round's show as disagreements under --check.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from conformance import registry
from conformance import round_e2e as e2e
from conformance.baseline import Float32Baseline
from reference import proposal_round as pr

BF16 = np.dtype(ml_dtypes.bfloat16)
KS = (1, 5, 15)
PROMPTS = 4


def baseline():
    return e2e.load_impl("baseline")[0]


@pytest.fixture(scope="module")
def swept():
    return e2e.sweep(baseline(), prompts=PROMPTS, ks=KS, check=True)


def test_loop_equals_plain_greedy_decoding(swept):
    cells, meta = swept
    assert meta["units_skipped"] == 0
    assert [(c.kind, c.K) for c in cells] == [(k, K) for k in e2e.KINDS for K in KS]
    for c in cells:
        assert (c.prompts, c.differ, c.errors) == (PROMPTS, 0, 0), (c.kind, c.K, c.first_error, c.first_diff)


def test_runs_are_not_trivial(swept):
    cells, _ = swept
    by = {(c.kind, c.K): c.tally for c in cells}
    assert all(t.verified > 0 for t in by.values())
    for kind in e2e.KINDS:
        assert sum(by[kind, K].accepted for K in KS) > 0, kind  # proposals do get accepted
    assert all(by["dflash2", K].ring_wraps > 0 for K in KS)  # rings of capacity S wrap
    assert all(by["dflash", K].ring_wraps == 0 for K in KS)  # the full layer's ring never does
    compared = sum(t.compared for t in by.values())
    disagree = sum(t.disagree for t in by.values())
    assert compared > 1000 and disagree <= 0.01 * compared  # near-ties only


def test_prompts_cover_the_edges():
    cases = e2e.make_requests(40, e2e.make_target(0), 0)
    assert min(len(r.prompt) for r, _ in cases) == 1  # F = 0: the first anchor is the only prompt token
    assert max(len(r.prompt) for r, _ in cases) > e2e.S  # a first catch-up longer than the ring
    assert any(r.budget == 1 for r, _ in cases) or min(r.budget for r, _ in cases) <= 3  # P = 0 rounds
    assert any(r.eos_ids for r, _ in cases) and any(len(p) < r.budget for r, p in cases)  # EOS cuts
    assert any(r.sampling.repetition_penalty != 1 for r, _ in cases)
    assert e2e.make_requests(3, e2e.make_target(0), 0, start=5) == cases[5:8]  # a sample is a prefix


class HostConventionBackend:
    """A CPU stand-in for CudaBackend that speaks its convention: BF16 in and out as uint16 bit
    patterns (a bfloat16 array arriving is refused), everything else as NumPy."""

    OPS = ("feature_capture", "context_kv", "masked_block", "proposal_head", "candidate_topk", "candidate_selector")

    def __init__(self):
        self.base = Float32Baseline()
        self.calls = 0

    def __getattr__(self, op):
        if op not in self.OPS:
            raise AttributeError(op)

        def method(**kw):
            self.calls += 1
            for k, v in kw.items():
                if isinstance(v, np.ndarray) and v.dtype == BF16:
                    raise TypeError(f"{op}.{k} arrived as bfloat16, not uint16 bits")
            kw = {k: v.view(BF16) if isinstance(v, np.ndarray) and v.dtype == np.uint16 else v for k, v in kw.items()}
            out = getattr(self.base, op)(**kw)
            fmt = {o.name: o.fmt for o in registry.get(op).outputs}
            return {k: np.asarray(v).view(np.uint16) if fmt.get(k) == "bf16" else v for k, v in out.items()}

        return method


def test_cuda_round_host_composition_on_the_cpu():
    from kernels_cu.round import CudaRound

    class StandIn(CudaRound):
        def __init__(self):
            self.backend = HostConventionBackend()

        def __getattribute__(self, name):
            if name in HostConventionBackend.OPS:
                return getattr(object.__getattribute__(self, "backend"), name)
            return object.__getattribute__(self, name)

    impl = StandIn()
    cells, _ = e2e.sweep(impl.proposal_round, prompts=2, ks=(2, 9), check=True)
    ref, _ = e2e.sweep(baseline(), prompts=2, ks=(2, 9), check=True)
    assert impl.backend.calls > 0
    for c, r in zip(cells, ref):
        assert (c.differ, c.errors) == (0, 0), (c.first_error, c.first_diff)
        assert dataclasses.asdict(c.tally) == dataclasses.asdict(r.tally)  # the same proposals, round by round


def test_out_of_vocabulary_proposals_are_errors():
    inner = baseline()

    def padded(**kw):
        out = dict(inner(**kw))
        out["tokens"] = np.full_like(np.asarray(out["tokens"]), e2e.VOCAB)  # a padding row
        return out

    cells, _ = e2e.sweep(padded, prompts=2, ks=(3,), kinds=("dflash",))
    assert cells[0].errors == 2 and "outside the public vocabulary" in cells[0].first_error


def test_a_commit_bug_makes_outputs_differ(monkeypatch):
    real = e2e.add_to_history

    def run_round(states, draft, K, impl, target, tally, check=False):
        before = [len(s.outputs) for s in states]
        original(states, draft, K, impl, target, tally, check)
        for s, n in zip(states, before):  # publish the first token of every round twice
            if not s.done and len(s.outputs) > n:
                s.outputs.insert(n, s.outputs[n])
                s.history = real(s.history, [s.outputs[n]])

    original = e2e.run_round
    monkeypatch.setattr(e2e, "run_round", run_round)
    cells, _ = e2e.sweep(baseline(), prompts=3, ks=(2,), kinds=("dflash",))
    assert cells[0].differ > 0 and cells[0].first_diff


def test_foreign_proposals_show_as_disagreements():
    inner = baseline()

    def shifted(**kw):
        out = dict(inner(**kw))
        out["tokens"] = (np.asarray(out["tokens"]) + 1) % e2e.VOCAB
        return out

    cells, _ = e2e.sweep(shifted, prompts=2, ks=(4,), kinds=("dflash",), check=True)
    t = cells[0].tally
    assert cells[0].differ == cells[0].errors == 0  # greedy output does not depend on the proposals
    assert t.compared > 0 and t.disagree == t.compared


def test_reference_composition_is_the_reference_op():
    cells, _ = e2e.sweep(lambda **kw: pr.run(pr.ReferenceOps, **kw), prompts=1, ks=(3,), check=True)
    assert all(c.tally.disagree == 0 and c.tally.compared > 0 for c in cells)


def test_cli_prints_a_table_and_a_final_line(tmp_path, capsys):
    path = tmp_path / "r.json"
    rc = e2e.main(["--impl", "baseline", "--prompts", "2", "--ks", "1,2", "--kinds", "dflash2", "--json", str(path)])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and out[-1].startswith("round_e2e PASS") and "differ=0 errors=0" in out[-1]
    assert any(line.startswith("| dflash2 | 2 | 2 | 0 | 0 |") for line in out)
    import json

    data = json.loads(path.read_text())
    assert [c["K"] for c in data["cells"]] == [1, 2] and data["meta"]["units_skipped"] == 0
