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
    family = "conv"
    BUG: ClassVar[dict] = {"wrap": True}


class ConvDeltaPerChannel(_ConvMutant):
    """The dynamic delta indexed per channel instead of shared by each group of 16."""

    pitfall = "conv_delta_per_channel"
    family = "conv"
    BUG: ClassVar[dict] = {"per_channel": True}



# --- variants of the conv family (tap order, shift, group layout) --------------------------------
# Kept apart from the classes above: the grouped conv's other mutants change on their own schedule.


def _conv_layout(x, base_side, delta_side, *, tap_order=False, shift_next=False):
    """x [B,W,H]; base_side [2 taps, H]; delta_side [B,W,2 taps,G]: the spec's conv with its memory
    order slips as switches (all off: tap 0 on column i, tap 1 on column i - 1, none at i = 0)."""
    b, w, h = x.shape
    g = h // GROUP
    xg = x.reshape(b, w, g, GROUP)
    coef = base_side.reshape(1, 1, 2, g, GROUP) + delta_side[..., None]
    t_cur, t_prev = (1, 0) if tap_order else (0, 1)  # tap order: the taps' coefficients exchanged
    zero = np.zeros_like(xg[:, :1])
    if shift_next:  # the second tap reads the next column (the shift taken the other way); none at W - 1
        other = np.concatenate([xg[:, 1:], zero], axis=1)
    else:
        other = np.concatenate([zero, xg[:, :-1]], axis=1)
    return (coef[:, :, t_cur] * xg + coef[:, :, t_prev] * other).reshape(b, w, h)


class _ConvLayoutMutant(Mutant):
    op, pitfall, family = "grouped_conv", "conv_tap_layout", "conv"
    group_major = False

    def grouped_conv(self, x, z, base, proj):
        x, z, base = (np.asarray(a, np.float64) for a in (x, z, base))
        b, w, h = x.shape
        if self.bug.get("group_major"):  # W_delta's rows read as [G, 2 sides, 2 taps] instead of [2, 2, G]
            delta = (x @ np.asarray(proj, np.float64).T).reshape(b, w, h // GROUP, 2, 2).transpose(0, 1, 3, 4, 2)
        else:
            delta = project_delta(x, proj)
        sw = {k: v for k, v in self.bug.items() if k != "group_major"}
        finish_delta = numerics.to_bf16(delta[:, :, 1])
        out = {
            "prepared": _conv_layout(x, base[0], delta[:, :, 0], **sw),
            "finish_delta": finish_delta,
            "finished": _conv_layout(z, base[1], finish_delta, **sw),
        }
        return storage_outputs(registry.get(self.op), out)


class ConvTapOrder(_ConvLayoutMutant):
    """The two taps' coefficients exchanged: column i weighted by tap 1, column i - 1 by tap 0."""

    variant, BUG = "tap_order", {"tap_order": True}


class ConvShiftNext(_ConvLayoutMutant):
    """The second tap reads column i + 1 instead of i - 1 (the shift taken the wrong way)."""

    variant, BUG = "shift_next", {"shift_next": True}


class ConvDeltaGroupMajor(_ConvLayoutMutant):
    """The projected delta read group-major ([G, 2 sides, 2 taps]) instead of [2 sides, 2 taps, G]."""

    variant, BUG = "group_major", {"group_major": True}
