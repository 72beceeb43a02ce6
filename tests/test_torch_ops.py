"""kernels_cu/torch_ops.py on the CPU: the ``dflash`` custom ops register with torch.library, their fake
implementations give the outputs' shapes and dtypes (what torch.compile and FakeTensorMode trace with), they refuse
CPU tensors (CUDA only), and the module says in one ImportError that it needs torch where torch is missing.
The GPU side (the ops equal the CuPy Ops bit for bit, inside a torch CUDA graph too) is tests/gpu/test_op_plans.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch entry points are optional")


@pytest.fixture(scope="module")
def ops():
    import kernels_cu.torch_ops as to

    return to


def _fake():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def test_every_op_is_registered_in_the_dflash_namespace(ops):
    for name in ops.OPS:
        op = getattr(torch.ops.dflash, name)
        assert str(op.default._schema).startswith(f"dflash::{name}(")
    assert set(ops.OPS) >= {"draft_attention", "masked_block", "proposal_head", "candidate_topk",
                            "target_distribution"}


def test_fake_shapes(ops):
    bf, dev = torch.bfloat16, "cuda"
    with _fake():
        q = torch.empty(2, 8, 32, 128, dtype=bf, device=dev)
        k = torch.empty(2, 8, 8, 128, dtype=bf, device=dev)
        kc = torch.empty(2, 64, 8, 128, dtype=bf, device=dev)
        vc = torch.empty(2, 64, 8, 128, dtype=torch.float16, device=dev)
        f = torch.empty(2, dtype=torch.int64, device=dev)
        live = torch.empty(2, dtype=torch.int32, device=dev)
        out = torch.ops.dflash.draft_attention(q, k, k, kc, vc, f, live, 0)
        assert (tuple(out.shape), out.dtype) == ((2, 8, 32, 128), bf)

        h = torch.empty(3, 7, 64, dtype=bf, device=dev)
        head = torch.empty(1000, 64, dtype=bf, device=dev)
        tok = torch.ops.dflash.proposal_head(h, head, 900)
        assert (tuple(tok.shape), tok.dtype) == ((3, 7), torch.int32)
        s, i = torch.ops.dflash.candidate_topk(h, head, 900, 5)
        assert (tuple(s.shape), s.dtype, tuple(i.shape), i.dtype) == ((3, 7, 5), torch.float32, (3, 7, 5), torch.int32)

        z = torch.empty(4, 1000, device=dev)
        row = torch.empty(4, device=dev)
        probs = torch.ops.dflash.target_distribution(z, torch.empty(4, 1000, dtype=torch.bool, device=dev),
                                                     torch.empty(4, 1000, dtype=torch.int32, device=dev),
                                                     row, row, row, row, row, row,
                                                     torch.empty(4, dtype=torch.int32, device=dev), 990)
        assert (tuple(probs.shape), probs.dtype) == ((4, 1000), torch.float32)

        L, H, hq, hk, d, inter = 2, 64, 4, 2, 16, 96
        w = {"input_norm": (L, H), "wq": (L, hq * d, H), "wk": (L, hk * d, H), "wv": (L, hk * d, H), "q_norm": (L, d),
             "k_norm": (L, d), "wo": (L, H, hq * d), "post_norm": (L, H), "w_gate": (L, inter, H),
             "w_up": (L, inter, H), "w_down": (L, H, inter)}
        wt = [torch.empty(s, dtype=bf, device=dev) for s in w.values()]
        anchor = torch.empty(3, dtype=torch.int32, device=dev)
        embed = torch.empty(500, H, dtype=bf, device=dev)
        ck = torch.empty(L, 3, 32, hk, d, dtype=bf, device=dev)
        cv = torch.empty(L, 3, 32, hk, d, dtype=torch.float16, device=dev)
        hid = torch.ops.dflash.masked_block(anchor, embed, f.new_empty(3), live.new_empty(3), ck, cv,
                                            torch.empty(H, dtype=bf, device=dev), *wt, None, None, None, None,
                                            7, [0, 0], 1e-6, 1e4, d, "dflash", 15)
        assert (tuple(hid.shape), hid.dtype) == ((3, 15, H), bf)
        x = torch.empty(3, 16, H, dtype=bf, device=dev)
        layer = [torch.empty(s[1:], dtype=bf, device=dev) for s in w.values()]
        ck1 = torch.empty(3, 32, hk, d, dtype=bf, device=dev)
        cv1 = torch.empty(3, 32, hk, d, dtype=torch.float16, device=dev)
        xn = torch.ops.dflash.draft_layer(x, ck1, cv1, f.new_empty(3), live.new_empty(3), *layer,
                                          None, None, None, None, 1e-6, 1e4, d, 0, "dflash")
        assert (tuple(xn.shape), xn.dtype) == ((3, 16, H), bf)
        with pytest.raises(ValueError, match="num_drafts"):
            torch.ops.dflash.masked_block(anchor, embed, f, live, ck, cv, torch.empty(H, dtype=bf, device=dev), *wt,
                                          None, None, None, None, 7, [0, 0], 1e-6, 1e4, d, "dflash", 0)


def test_cpu_tensors_are_refused(ops):
    with pytest.raises(NotImplementedError, match="CPU"):
        torch.ops.dflash.proposal_head(torch.zeros(2, 64, dtype=torch.bfloat16),
                                       torch.zeros(10, 64, dtype=torch.bfloat16), 9)


def test_without_torch_the_import_says_so():
    """A fresh interpreter where ``import torch`` fails: kernels_cu imports, kernels_cu.torch_ops raises one
    ImportError naming PyTorch."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import kernels_cu, kernels_cu.fast.options\n"
            "try:\n    import kernels_cu.torch_ops\nexcept ImportError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ERR kernels_cu.torch_ops needs PyTorch"), out.stdout
