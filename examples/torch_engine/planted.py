"""The PyTorch engine (engine.py) with one realistic bug planted per bug family of the mutant catalog.

Each class below is ``TorchEngine`` with one slip written in torch, the way an engine team gets
it wrong (a mask tested with ``<=``, ``torch.topk`` for a stable sort, ``repeat`` for
``repeat_interleave``, ...). It names its ``family`` (the catalog's, conformance/mutants), the
``bug`` in one line and the ``ops`` the slip reaches (the Ops whose vectors show it). They measure
how well the diagnosis names a bug the catalog did not write (tools/diagnosis_torch.py); none is
used on engine.py's normal path. ``PLANTED`` maps each family to its class.

Families with no Op in this engine (the accept test, the residual, the bonus row, preview_commit's:
those Ops delegate to the float32 baseline) have no planted bug here.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from examples.torch_engine.engine import BF, GROUP, TorchEngine
from reference.draft_attention import key_positions

M32 = np.uint64(0xFFFFFFFF)


class PlantedEngine(TorchEngine):
    family = ""
    bug = ""
    ops: tuple[str, ...] = ()

    def __init__(self, device: str = "cpu"):
        super().__init__(device)
        self.key = f"torch_planted_{self.family}"

    @property
    def name(self) -> str:
        return f"torch engine with a {self.family} bug ({self.bug}) on {self.device}"


# --- the attention's mask and heads (draft_attention, draft_layer, masked_block) ----------------

_ATTN = ("draft_attention", "draft_layer", "masked_block")


class WindowLe(PlantedEngine):
    family, bug, ops = "window", "the local window's mask built with abs(p_k - p_q) <= S instead of < S", _ATTN

    def mask(self, frontier, live, capacity, width, window):
        pos, present = (torch.from_numpy(a).to(self.device) for a in key_positions(frontier, live, capacity, width))
        pq = torch.as_tensor(np.asarray(frontier, np.int64), device=self.device)[:, None] + \
            torch.arange(width, device=self.device)
        m = present[:, None, :].expand(pos.shape[0], width, pos.shape[1])
        if window > 0:
            m = m & ((pos[:, None, :] - pq[:, :, None]).abs() <= window)
        return m


class LiveIgnored(PlantedEngine):
    family, bug, ops = "extent", "the mask built from the block's width, not the live extent (every row present)", _ATTN

    def mask(self, frontier, live, capacity, width, window):
        return super().mask(frontier, np.full(np.shape(live), width), capacity, width, window)


class GqaRepeat(PlantedEngine):
    family, bug, ops = "gqa_head_mapping", \
        "repeat_kv with x.repeat (head h reads KV head h % Hk), not repeat_interleave", _ATTN

    @staticmethod
    def repeat_kv(x, groups):
        return x.repeat(1, 1, groups, 1)


# --- RoPE (context_kv, draft_layer, masked_block) ------------------------------------------------

_ROPE = ("context_kv", "draft_layer", "masked_block")


class RopeInterleaved(PlantedEngine):
    family, bug, ops = "rope", "RoPE on interleaved pairs (x[2i], x[2i+1]) where the weights expect rotate_half", _ROPE

    def rope(self, x, positions, theta):
        cos, sin = self.cos_sin(positions, x.shape[-1], theta, x.dtype)
        half = x.shape[-1] // 2
        c, s = cos[..., :half].unsqueeze(-2), sin[..., :half].unsqueeze(-2)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Fp32Positions(PlantedEngine):
    family, bug, ops = "positions", \
        "RoPE angles from float32 positions at every position (HF's path, past 2^24 too)", _ROPE

    def cos_sin(self, positions, d, theta, dtype):
        inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=self.device).float() / d))
        f = positions.to(self.device).float()[..., None] * inv
        emb = torch.cat([f, f], -1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


# --- feature_capture --------------------------------------------------------------------------------


class CaptureIndexBase(PlantedEngine):
    family, bug, ops = "capture", "target layer ids read one-based: block_outputs[i - 1] (id 0 wraps to the last)", \
        ("feature_capture",)

    def feature_capture(self, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        ids = [int(i) - 1 for i in target_layer_ids]  # torch's negative index wraps id 0 to the last block
        return super().feature_capture(block_outputs, fc_weight, hidden_norm, ids, eps)


class NormEpsOutsideSqrt(PlantedEngine):
    family, bug, ops = "norm", "the feature RMSNorm as x / (sqrt(mean(x^2)) + eps): eps outside the square root", \
        ("feature_capture",)

    def feature_capture(self, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        r = self.t(block_outputs)
        s = torch.cat([r[int(i)] for i in target_layer_ids], dim=-1)
        x = F.linear(s, self.t(fc_weight))
        h = x.float()
        h = h / (h.pow(2).mean(-1, keepdim=True).sqrt() + eps)
        return {"context": self.np_bf16(self.t(hidden_norm) * h.to(x.dtype))}


# --- grouped_conv -------------------------------------------------------------------------------------


class ConvTapsExchanged(PlantedEngine):
    family, bug, ops = "conv", \
        "the conv kernel's two taps exchanged (coef[1] on the current column, coef[0] on the previous)", \
        ("grouped_conv",)

    @staticmethod
    def _conv(x, base_side, delta_side):
        b, w, h = x.shape
        g = h // GROUP
        xg = x.reshape(b, w, g, GROUP)
        coef = base_side.reshape(1, 1, 2, g, GROUP) + delta_side[..., None]
        prev = torch.cat([torch.zeros_like(xg[:, :1]), xg[:, :-1]], dim=1)
        out = coef[:, :, 1] * xg
        tap0 = coef[:, :, 0] * prev
        tap0[:, 0] = 0
        return (out + tap0).reshape(b, w, h)

    def grouped_conv(self, x, z, base, proj):
        base, x = self.t(base), self.t(x)
        b, w, h = x.shape
        delta = F.linear(x, self.t(proj)).reshape(b, w, 2, 2, h // GROUP)
        prepared, finish_delta = self._conv(x, base[0], delta[:, :, 0]), delta[:, :, 1]
        finished = self._conv(self.t(z), base[1], finish_delta)
        return {"prepared": self.np_bf16(prepared), "finish_delta": self.np_bf16(finish_delta),
                "finished": self.np_bf16(finished)}


# --- masked_block -------------------------------------------------------------------------------------


class AnchorAsMask(PlantedEngine):
    family, bug, ops = "anchor_as_mask", \
        "the block's input ids built as torch.full(mask_token_id): the anchor embedded as MASK", \
        ("masked_block",)

    def masked_block(self, anchor, mask_token_id, **kw):
        return super().masked_block(anchor=np.full_like(np.asarray(anchor), int(mask_token_id)),
                                    mask_token_id=mask_token_id, **kw)


# --- proposal_head ------------------------------------------------------------------------------------


class NextTokenShift(PlantedEngine):
    family, bug, ops = "next_token_shift", \
        "hidden rolled one column (torch.roll(h, 1, 1)), read as next-token logits", \
        ("proposal_head",)

    def proposal_head(self, hidden, head, vocab_size, shortlist=None):
        h = torch.roll(self.t(hidden), 1, dims=1)
        return super().proposal_head(self.np_bf16(h), head, vocab_size, shortlist)


class Bf16HeadLogits(PlantedEngine):
    family, bug, ops = "rounding", \
        "the proposal head's logits left in BF16 (F.linear on BF16 tensors) before the argmax", \
        ("proposal_head",)

    def proposal_head(self, hidden, head, vocab_size, shortlist=None):
        logits = F.linear(self.t(hidden), self.t(head))  # BF16 out: the model dtype
        gid = self._gid(head.shape[0], shortlist)
        eligible = (gid >= 0) & (gid < int(vocab_size))
        best = torch.argmax(torch.where(eligible, logits, torch.tensor(float("-inf"), dtype=BF)), dim=-1)
        return {"tokens": self.np_(gid[best].to(torch.int32))}


# --- candidate_topk -----------------------------------------------------------------------------------


class _Topk(PlantedEngine):
    ops = ("candidate_topk",)

    def order(self, z, gid, eligible, vocab_size):
        """Rows of ``z`` in rank order (engine.py's two stable sorts)."""
        nan = torch.isnan(z)
        key = torch.where(eligible & ~nan, z, float("-inf"))
        rows = self.first_sort(key)
        group = torch.where(eligible, nan.to(torch.int8), torch.full_like(nan, 2, dtype=torch.int8))
        _, regroup = torch.sort(torch.gather(group, -1, rows), dim=-1, stable=True)
        return torch.gather(rows, -1, regroup)

    @staticmethod
    def first_sort(key):
        return torch.sort(key, dim=-1, descending=True, stable=True)[1]

    def eligible(self, gid, vocab_size):
        return (gid >= 0) & (gid < int(vocab_size))

    def ids(self, gid, rows):
        return gid[rows]

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        z = F.linear(self.t(hidden).float(), self.t(head).float())
        gid = self._gid(head.shape[0], shortlist)
        rows = self.order(z, gid, self.eligible(gid, vocab_size), vocab_size)[..., : int(top_k)]
        u = torch.gather(z, -1, rows)
        if output_multiplier > 0:
            u = u * output_multiplier
        if softcap > 0:
            u = softcap * torch.tanh(u / softcap)
        return {"scores": self.np_(u.float()), "ids": self.np_(self.ids(gid, rows).to(torch.int32))}


class TopkUnstable(_Topk):
    family, bug = "ties", "the ranking by torch.topk (ties in no particular row order) instead of a stable sort"

    @staticmethod
    def first_sort(key):
        return torch.topk(key, key.shape[-1], dim=-1).indices


class NanFirst(_Topk):
    family, bug = "nan_order", "top-k by torch.sort(descending=True) alone: NaN ranked above every number"

    def order(self, z, gid, eligible, vocab_size):
        return torch.sort(torch.where(eligible, z, float("-inf")), dim=-1, descending=True, stable=True)[1]


class VocabPadLe(_Topk):
    family, bug = "vocab_pad", "the public-vocabulary mask as gid <= vocab_size (the first padding row eligible)"

    def eligible(self, gid, vocab_size):
        return (gid >= 0) & (gid <= int(vocab_size))


class ShortlistRows(_Topk):
    family, bug = "shortlist_remap", "the shortlist's row indices returned as ids, not shortlist[row]"

    def ids(self, gid, rows):
        return rows


# --- candidate_selector --------------------------------------------------------------------------------


class PhiloxKeyWordsSwapped(PlantedEngine):
    family, bug, ops = "rng", "the Philox key packed (seed >> 32, seed & 0xffffffff): its two words swapped", \
        ("candidate_selector",)

    def candidate_selector(self, seed, **kw):
        s = np.asarray(seed, np.uint64)
        return super().candidate_selector(seed=((s & M32) << np.uint64(32)) | (s >> np.uint64(32)), **kw)


class CodebooksSwapped(PlantedEngine):
    family, bug, ops = "selector_first", "the predecessor and successor codebooks loaded under each other's names", \
        ("candidate_selector",)

    def candidate_selector(self, w_pred, w_succ, **kw):
        return super().candidate_selector(w_pred=w_succ, w_succ=w_pred, **kw)


# --- target_distribution --------------------------------------------------------------------------------


class TopPDropsCrossing(PlantedEngine):
    family, bug, ops = "filters", "top-p keeps a token while cumsum <= top_p: the token crossing top_p dropped", \
        ("target_distribution",)

    @staticmethod
    def top_p_keep(cum, p_sorted, tp):
        return cum <= tp

PLANTED = {c.family: c for c in (WindowLe, LiveIgnored, GqaRepeat, RopeInterleaved, Fp32Positions, CaptureIndexBase,
                                 NormEpsOutsideSqrt, ConvTapsExchanged, AnchorAsMask, NextTokenShift, Bf16HeadLogits,
                                 TopkUnstable, NanFirst, VocabPadLe, ShortlistRows, PhiloxKeyWordsSwapped,
                                 CodebooksSwapped, TopPDropsCrossing)}
