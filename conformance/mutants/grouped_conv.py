"""Mutants of grouped_conv (DFlash2): the memory order of the grouped convolution.

The products base*x and delta*x rounded separately are no bug (CONTRACTS C2 v3): that form is a
legitimate control (conformance.controls.variants, ``conv_separate_products``), not a mutant."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from conformance import registry
from conformance.baseline import storage_outputs
from conformance.mutants.base import Mutant
from reference import numerics
from reference.grouped_conv import GROUP, project_delta


def _conv(x, base_side, delta_side, *, wrap=False, per_channel=False):
    """x [B,W,H]; base_side [2 taps, H]; delta_side [B,W,2 taps,G], float64, with the bugs as switches."""
    b, w, h = x.shape
    g = h // GROUP
    xg = x.reshape(b, w, g, GROUP)
    if per_channel:  # delta tiled across channels (c -> c mod G) instead of repeated within each group
        d = delta_side[..., np.arange(h) % g].reshape(b, w, 2, g, GROUP)
    else:
        d = np.broadcast_to(delta_side[..., None], (b, w, 2, g, GROUP))
    bs = base_side.reshape(1, 1, 2, g, GROUP)
    # torch.roll-style shift: column 0 reads column W-1 instead of nothing
    prev = np.roll(xg, 1, axis=1) if wrap else np.concatenate([np.zeros_like(xg[:, :1]), xg[:, :-1]], axis=1)
    out = (bs[:, :, 0] + d[:, :, 0]) * xg + (bs[:, :, 1] + d[:, :, 1]) * prev
    return out.reshape(b, w, h)


class _ConvMutant(Mutant):
    op = "grouped_conv"

    def grouped_conv(self, x, z, base, proj):
        x, z, base = (np.asarray(a, np.float64) for a in (x, z, base))
        delta = project_delta(x, proj)
        finish_delta = numerics.to_bf16(delta[:, :, 1])
        out = {
            "prepared": _conv(x, base[0], delta[:, :, 0], **self.bug),
            "finish_delta": finish_delta,
            "finished": _conv(z, base[1], finish_delta, **self.bug),
        }
        return storage_outputs(registry.get(self.op), out)


class ConvCol0Tap(_ConvMutant):
    """Column 0 reads a preceding tap (the last column, by wrap-around)."""

    pitfall = "conv_col0_tap"
    BUG: ClassVar[dict] = {"wrap": True}


class ConvDeltaPerChannel(_ConvMutant):
    """The dynamic delta indexed per channel instead of shared by each group of 16."""

    pitfall = "conv_delta_per_channel"
    BUG: ClassVar[dict] = {"per_channel": True}

