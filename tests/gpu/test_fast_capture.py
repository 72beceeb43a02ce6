"""The fast mode's feature_capture gather and grouped_conv (kernels_cu/fast/capture.py) on a GPU.

The gather is a copy of BF16 bits, so it must equal an independent formulation (CuPy fancy
indexing, transpose, reshape) bit for bit: the 16-byte path (Ht % 8 == 0, aligned), the 2-byte
path (Ht % 8 != 0, and an aligned width read through a view 2 bytes off alignment), repeated and
out-of-order ids. feature_capture and grouped_conv as a whole are judged by the suite over their
vectors with the derived bounds (tests/gpu/test_fast_backend.py, the CLI run): their FP32
accumulation order differs from the exact mode's, so no bitwise or hand-picked closeness is
asserted here; only the outputs' names, shapes and dtypes against the exact mode, and the errors.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def fast(cupy):
    from kernels_cu.fast import FastCudaBackend

    return FastCudaBackend()


def _bits(cp, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return cp.asarray((x.view(np.uint32) >> 16).astype(np.uint16))


@pytest.mark.parametrize("ht, ids, offset", [(5120, [0, 1, 2, 3, 4], 0), (2048, [7, 2, 2, 5], 0),
                                             (100, [1, 0], 0), (64, [3, 1], 1)])
def test_gather_equals_fancy_indexing(cupy, ht, ids, offset):
    from kernels_cu.fast.capture import gather_blocks

    cp = cupy
    rng = np.random.default_rng(ht)
    flat = _bits(cp, rng, (8 * 37 * ht + offset,))
    blocks = flat[offset:].reshape(8, 37, ht)  # offset 1: the data pointer is 2 bytes off alignment
    got = gather_blocks(blocks, ids)
    want = cp.ascontiguousarray(blocks[cp.asarray(ids)].transpose(1, 0, 2).reshape(37, -1))
    assert got.shape == want.shape and bool(cp.array_equal(got, want))


def test_feature_capture_outputs_as_exact(cupy, fast, backend):
    cp = cupy
    rng = np.random.default_rng(5)
    n, t, ht, h = 3, 19, 256, 128
    kw = dict(block_outputs=_bits(cp, rng, (6, t, ht)),
              fc_weight=_bits(cp, rng, (h, n * ht)),
              hidden_norm=_bits(cp, rng, (h,)), target_layer_ids=[5, 0, 3], eps=1e-6)
    a = fast.feature_capture(**kw)["context"]
    b = backend.feature_capture(**kw)["context"]
    assert a.shape == b.shape == (t, h) and a.dtype == b.dtype
    with pytest.raises(ValueError, match="fc_weight"):
        fast.feature_capture(**dict(kw, target_layer_ids=[5, 0]))


def test_grouped_conv_outputs_as_exact(cupy, fast, backend):
    cp = cupy
    rng = np.random.default_rng(6)
    b, w, h = 2, 5, 64
    base = cp.asarray((((rng.standard_normal((2, 2, h)) * 0.1 + 0.5).astype(np.float32)).view(np.uint32) >> 16)
                      .astype(np.uint16))
    kw = dict(x=_bits(cp, rng, (b, w, h)), z=_bits(cp, rng, (b, w, h)), base=base,
              proj=_bits(cp, rng, (4 * h // 16, h)))
    a, e = fast.grouped_conv(**kw), backend.grouped_conv(**kw)
    for name in ("prepared", "finish_delta", "finished"):
        assert a[name].shape == e[name].shape and a[name].dtype == e[name].dtype, name
    with pytest.raises(ValueError, match="proj"):
        fast.grouped_conv(**dict(kw, proj=kw["proj"][:-1]))
