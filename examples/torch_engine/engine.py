"""A PyTorch BF16 engine written the Hugging Face / vLLM way, with its spec deviations fixed (the five of issue 8 and NaN ordering).

The numerical style is the eager BF16 model's: ``F.linear`` on BF16 tensors (FP32 accumulation,
BF16 output), HF ``Qwen3RMSNorm`` (``weight * hidden.to(bf16)`` after an FP32 ``rsqrt``), HF
``rotate_half`` RoPE with cos/sin computed in FP32 from FP32 positions and cast to BF16, SDPA for
the attention (FP32 softmax inside the kernel; ``attention="eager"``: HF's eager path, BF16
scores, FP32 softmax cast to BF16, BF16 PV), the SiLU-gated MLP in BF16, the residual stream in
BF16, and the DFlash2 convolution in eager BF16 with (base + delta) formed first.

The six places where such an engine departs from the spec, fixed here as docs/contracts.md requires:

1. raw context K is not cast to BF16 before the head norm: the context projection runs in FP32
   (the head norm, RoPE and its tables then follow in FP32 until K is stored BF16);
2. top-k is stable on ties (``torch.sort(stable=True)``; ``torch.topk`` is not);
3. the candidate (and proposal-head) logits are FP32, never the model dtype;
4. an infinite V (FP16 overflow) outside a query's window gives no 0 * inf: SDPA runs on the
   finite part of V and the infinite entries are added where they are attended;
5. positions at and above 2^24 form their angles from the integer position in float64 (a float32
   position cannot represent them); below 2^24 the HF FP32 path is kept;
6. a NaN logit (``inf * 0`` after an upstream overflow) ranks after every number in the top-k
   (docs/contracts.md, C4): ``torch.sort`` puts NaN first, which the NaN-score case FAILs.

Arrays arrive as NumPy (C9) and outputs go back as NumPy in the storage dtypes (BF16 as
``ml_dtypes.bfloat16`` through its bit pattern). ``TorchEngine(device="cuda")`` runs on a GPU.
It is the legitimate-variant control of tools/calibration.py (imported there directly)
and the kernels of the PyTorch capture example
(examples/torch_capture_engine.py: its six round Ops composed into a proposal round that writes a
capture folder).
speculative_accept, tree_verify and preview_commit delegate to the float32 baseline (discrete);
the selector's random draw uses reference.rng's C3 race on the engine's FP32 q.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from conformance.baseline import Float32Baseline
from conformance.rounds import ComposedRounds
from reference.context_kv import store_rows
from reference.draft_attention import allowed
from reference.masked_block import block_tokens
from reference.rng import Purpose, exponential_race

BF = torch.bfloat16
TWO24 = 2**24
GROUP = 16
LAYER_WEIGHTS = ("input_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_norm", "w_gate", "w_up", "w_down")
CONV_WEIGHTS = ("attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj")


class TorchEngine(ComposedRounds):
    key = "torch_hf_bf16"
    reason = ("a production PyTorch BF16 engine (HF/vLLM style: separate norm and RoPE kernels, BF16 cos/sin, "
              "SDPA, BF16 SiLU MLP and residual, eager BF16 conv) with its six spec deviations fixed")

    def __init__(self, device: str = "cpu", attention: str = "sdpa"):
        if attention not in ("sdpa", "eager"):
            raise ValueError(f"TorchEngine: attention must be 'sdpa' or 'eager', got {attention!r}")
        self.device = torch.device(device)
        self.attn_impl = attention
        if attention == "eager":
            self.key = "torch_hf_bf16_eager_attention"
            self.reason = self.reason.replace("SDPA", "HF eager attention (BF16 scores, FP32 softmax cast to BF16)")
        self._discrete = Float32Baseline()
        if self.device.type == "cuda":  # FP32 GEMMs must stay FP32 (TF32 would round the logits' inputs)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False

    @property
    def name(self) -> str:
        return f"control {self.key} on {self.device}"

    def changed(self) -> dict:
        return {"engine": "torch"}

    # --- NumPy <-> torch ---------------------------------------------------------------------------

    def t(self, x, dtype=None) -> torch.Tensor:
        """A NumPy input as a torch tensor on the device: BF16 by bit pattern, others as they are."""
        a = np.asarray(x)
        if a.dtype == ml_dtypes.bfloat16:
            out = torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(BF)
        else:
            out = torch.from_numpy(np.ascontiguousarray(a).copy())
        out = out.to(self.device)
        return out if dtype is None else out.to(dtype)

    @staticmethod
    def np_bf16(x: torch.Tensor) -> np.ndarray:
        return x.to(BF).contiguous().view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)

    @staticmethod
    def np_(x: torch.Tensor, dtype=None) -> np.ndarray:
        x = x.detach().cpu() if dtype is None else x.detach().to(dtype).cpu()
        return x.numpy()

    # --- HF building blocks -------------------------------------------------------------------------

    @staticmethod
    def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """Qwen3RMSNorm.forward: FP32 statistics, the normalized value back in the input dtype, times w."""
        dt = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + eps)
        return w * h.to(dt)

    def cos_sin(self, positions: torch.Tensor, d: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen3RotaryEmbedding: inv_freq FP32, freqs = pos.float() * inv_freq, emb = cat(freqs, freqs),
        cos/sin in FP32 cast to ``dtype``. Positions >= 2^24 (fix 5): float64 angles from the integer."""
        inv32 = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=self.device).float() / d))
        pos = positions.to(self.device)
        small = pos < TWO24
        f32 = torch.where(small, pos, torch.zeros_like(pos)).float()[..., None] * inv32
        inv64 = float(theta) ** (-torch.arange(0, d // 2, dtype=torch.float64, device=self.device) * 2.0 / d)
        f64 = pos.double()[..., None] * inv64
        emb32, emb64 = torch.cat([f32, f32], -1), torch.cat([f64, f64], -1)
        big = ~small[..., None]
        cos = torch.where(big, emb64.cos().float(), emb32.cos())
        sin = torch.where(big, emb64.sin().float(), emb32.sin())
        return cos.to(dtype), sin.to(dtype)

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope(self, x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
        """apply_rotary_pos_emb on x [..., heads, D] at positions [...] (cos/sin in x's dtype)."""
        cos, sin = self.cos_sin(positions, x.shape[-1], theta, x.dtype)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return (x * cos) + (self.rotate_half(x) * sin)

    def mask(self, frontier, live, capacity: int, width: int, window: int) -> torch.Tensor:
        """[B, W queries, C+W keys]: which key each query row may attend (C7's window and ring)."""
        mask_np = allowed(np.asarray(frontier), np.asarray(live), capacity, width, window)
        return torch.from_numpy(np.array(mask_np, dtype=bool)).to(self.device)

    @staticmethod
    def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
        """[B, N, Hk, D] -> [B, N, Hk * groups, D]: query head h reads KV head h // groups (HF repeat_kv)."""
        return x.repeat_interleave(groups, dim=2)

    def attention(self, q, k, v, k_cache, v_cache, frontier, live, window: int) -> torch.Tensor:
        """q [B,W,Hq,D] BF16, k/v [B,W,Hk,D] BF16, caches [B,C,Hk,D] -> [B,W,Hq,D] BF16 (SDPA)."""
        b, w, hq, d = q.shape
        hk = k.shape[2]
        keys = torch.cat([k_cache.to(BF), k], dim=1)
        vals = torch.cat([v_cache.to(BF), v], dim=1)
        mask = self.mask(frontier, live, k_cache.shape[1], w, int(window))  # [B,W,N]
        keys = self.repeat_kv(keys, hq // hk).transpose(1, 2)  # [B,Hq,N,D]
        vals = self.repeat_kv(vals, hq // hk).transpose(1, 2)
        finite = torch.isfinite(vals)
        vals0 = torch.where(finite, vals, 0).to(BF)
        if self.attn_impl == "sdpa":
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals0, attn_mask=mask[:, None])
        else:  # HF eager_attention_forward: BF16 scores, FP32 softmax cast back to BF16, BF16 PV
            scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3)) * (d ** -0.5)
            scores = scores.masked_fill(~mask[:, None], float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(torch.nan_to_num(probs, nan=0.0), vals0)  # [B,Hq,W,D]
        if not bool(finite.all()):  # fix 4: an infinite V counts only where it is attended
            for bb, h, key, j in torch.nonzero(~finite).tolist():
                rows = mask[bb, :, key]
                out[bb, h, rows, j] = out[bb, h, rows, j].float().add(vals[bb, h, key, j].float()).to(out.dtype)
        out = torch.where(mask.any(-1)[:, None, :, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
        return out.transpose(1, 2)

    @staticmethod
    def conv(x: torch.Tensor, base_side: torch.Tensor, delta_side: torch.Tensor) -> torch.Tensor:
        """Eager BF16 conv: x [B,W,H], base_side [2,H], delta_side [B,W,2,G]; (base + delta) first."""
        b, w, h = x.shape
        g = h // GROUP
        xg = x.reshape(b, w, g, GROUP)
        coef = base_side.reshape(1, 1, 2, g, GROUP) + delta_side[..., None]  # BF16
        out = coef[:, :, 0] * xg
        prev = torch.cat([torch.zeros_like(xg[:, :1]), xg[:, :-1]], dim=1)
        tap1 = coef[:, :, 1] * prev
        tap1[:, 0] = 0  # no preceding tap at column 0
        return (out + tap1).reshape(b, w, h)

    def prepare(self, x: torch.Tensor, base: torch.Tensor, proj: torch.Tensor):
        b, w, h = x.shape
        delta = F.linear(x, proj).reshape(b, w, 2, 2, h // GROUP)  # BF16
        return self.conv(x, base[0], delta[:, :, 0]), delta[:, :, 1]

    # --- Ops ----------------------------------------------------------------------------------------

    def feature_capture(self, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        r = self.t(block_outputs)
        s = torch.cat([r[int(i)] for i in target_layer_ids], dim=-1)
        return {"context": self.np_bf16(self.rmsnorm(F.linear(s, self.t(fc_weight)), self.t(hidden_norm), eps))}

    def context_kv(self, context, k_cache, v_cache, wk, wv, k_norm, start, eps, theta, head_dim, storage,
                   page_size=None, page_table=None):
        c = self.t(context)
        start, rows, d = int(start), c.shape[0], int(head_dim)
        positions = start + torch.arange(rows, dtype=torch.int64, device=self.device)
        k_raw = F.linear(c.float(), self.t(wk).float()).reshape(rows, -1, d)  # fix 1: FP32 into the head norm
        k = self.rope(self.rmsnorm(k_raw, self.t(k_norm), eps), positions, theta)
        k = self.np_bf16(k)
        v = F.linear(c, self.t(wv)).reshape(rows, -1, d).to(torch.float16)  # FP16_RNE(BF16(v_raw))
        v = self.np_(v)
        k_out, v_out = np.array(k_cache, copy=True), np.array(v_cache, copy=True)
        pos = start + np.arange(rows, dtype=np.int64)
        store_rows(k_out, v_out, pos, k, v, storage, page_table, page_size)
        return {"k_cache": k_out, "v_cache": v_out, "frontier": np.asarray(start + rows, dtype=np.int64)}

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        out = self.attention(self.t(q), self.t(k), self.t(v), self.t(k_cache), self.t(v_cache), frontier, live,
                             int(window))
        return {"out": self.np_bf16(out)}

    def grouped_conv(self, x, z, base, proj):
        base = self.t(base)
        prepared, finish_delta = self.prepare(self.t(x), base, self.t(proj))
        finished = self.conv(self.t(z), base[1], finish_delta)
        return {"prepared": self.np_bf16(prepared), "finish_delta": self.np_bf16(finish_delta),
                "finished": self.np_bf16(finished)}

    def _layer(self, x, k_cache, v_cache, frontier, live, input_norm, wq, wk, wv, q_norm, k_norm, wo, post_norm,
               w_gate, w_up, w_down, eps, theta, head_dim, window, variant, attn_conv_base=None,
               mlp_conv_base=None, attn_conv_proj=None, mlp_conv_proj=None) -> torch.Tensor:
        """One decoder layer on BF16 tensors (weights already on the device)."""
        if variant not in ("dflash", "dflash2"):
            raise ValueError(f"draft_layer: variant must be 'dflash' or 'dflash2', got {variant!r}")
        conv = variant == "dflash2"
        b, w, _ = x.shape
        d = int(head_dim)
        positions = torch.as_tensor(np.asarray(frontier, dtype=np.int64), device=self.device)[:, None] + \
            torch.arange(w, dtype=torch.int64, device=self.device)
        n = self.rmsnorm(x, input_norm, eps)
        if conv:
            n, finish_a = self.prepare(n, attn_conv_base, attn_conv_proj)
        q = self.rmsnorm(F.linear(n, wq).reshape(b, w, -1, d), q_norm, eps)
        k = self.rmsnorm(F.linear(n, wk).reshape(b, w, -1, d), k_norm, eps)
        v = F.linear(n, wv).reshape(b, w, -1, d)
        q, k = self.rope(q, positions, theta), self.rope(k, positions, theta)
        a = self.attention(q, k, v, k_cache, v_cache, frontier, live, int(window)).reshape(b, w, -1)
        o = F.linear(a, wo)
        if conv:
            o = self.conv(o, attn_conv_base[1], finish_a)
        y = x + o
        m = self.rmsnorm(y, post_norm, eps)
        if conv:
            m, finish_m = self.prepare(m, mlp_conv_base, mlp_conv_proj)
        z = F.linear(F.silu(F.linear(m, w_gate)) * F.linear(m, w_up), w_down)
        if conv:
            z = self.conv(z, mlp_conv_base[1], finish_m)
        return y + z

    def draft_layer(self, x, k_cache, v_cache, frontier, live, **kw):
        names = LAYER_WEIGHTS + CONV_WEIGHTS
        weights = {n: self.t(kw.pop(n)) for n in names if kw.get(n) is not None}
        kw = {n: v for n, v in kw.items() if n not in names}
        out = self._layer(self.t(x), self.t(k_cache), self.t(v_cache), frontier, live, **weights, **kw)
        return {"x_next": self.np_bf16(out)}

    def masked_block(self, anchor, embed, frontier, live, context_k, context_v, final_norm, mask_token_id, windows,
                     eps, theta, head_dim, variant, num_drafts, **weights):
        names = LAYER_WEIGHTS + (CONV_WEIGHTS if variant == "dflash2" else ())
        stacked = {n: self.t(weights[n]) for n in names}
        ck, cv = self.t(context_k), self.t(context_v)
        tokens = torch.as_tensor(block_tokens(anchor, mask_token_id, int(num_drafts)), device=self.device)
        x = F.embedding(tokens, self.t(embed))
        attn_live = np.asarray(live) if variant == "dflash" else np.full(x.shape[0], x.shape[1])
        for layer, window in enumerate(windows):
            x = self._layer(x, ck[layer], cv[layer], frontier, attn_live, eps=eps, theta=theta, head_dim=head_dim,
                            window=int(window), variant=variant, **{n: w[layer] for n, w in stacked.items()})
        return {"hidden": self.np_bf16(self.rmsnorm(x, self.t(final_norm), eps)[:, 1:])}

    def _gid(self, rows: int, shortlist) -> torch.Tensor:
        if shortlist is None:
            return torch.arange(rows, dtype=torch.int64, device=self.device)
        return self.t(shortlist).to(torch.int64)

    def proposal_head(self, hidden, head, vocab_size, shortlist=None):
        logits = F.linear(self.t(hidden).float(), self.t(head).float())  # fix 3: FP32 logits
        gid = self._gid(head.shape[0], shortlist)
        eligible = (gid >= 0) & (gid < int(vocab_size))
        best = torch.argmax(torch.where(eligible, logits, float("-inf")), dim=-1)  # first maximum
        return {"tokens": self.np_(gid[best].to(torch.int32))}

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        z = F.linear(self.t(hidden).float(), self.t(head).float())  # fix 3: FP32 logits
        gid = self._gid(head.shape[0], shortlist)
        eligible = (gid >= 0) & (gid < int(vocab_size))
        nan = torch.isnan(z)
        key = torch.where(eligible & ~nan, z, float("-inf"))
        _, rows = torch.sort(key, dim=-1, descending=True, stable=True)  # fix 2: stable on ties
        # fix 6: NaN after every number, -inf included, and ineligible rows last (torch.sort puts
        # NaN first); a second stable sort by group keeps the value order inside each group
        group = torch.where(eligible, nan.to(torch.int8), torch.full_like(nan, 2, dtype=torch.int8))
        _, regroup = torch.sort(torch.gather(group, -1, rows), dim=-1, stable=True)
        rows = torch.gather(rows, -1, regroup)[..., : int(top_k)]
        u = torch.gather(z, -1, rows)
        if output_multiplier > 0:
            u = u * output_multiplier
        if softcap > 0:
            u = softcap * torch.tanh(u / softcap)
        return {"scores": self.np_(u.float()), "ids": self.np_(gid[rows].to(torch.int32))}

    def candidate_selector(self, hidden, scores, ids, anchor, w_hidden, w_pred, w_succ, temperature, seed, frontier):
        g = F.linear(self.t(hidden), self.t(w_hidden))  # [B,K,R] BF16
        gf = g.float()
        u = self.t(scores).float()
        ids_t = self.t(ids).to(torch.int64)
        wp, ws = self.t(w_pred).float(), self.t(w_succ).float()
        nb, nk, top = ids.shape
        path = np.zeros((nb, nk), np.int32)
        q = torch.zeros((nb, nk, top), dtype=torch.float32, device=self.device)
        for b in range(nb):
            t = float(np.float32(np.asarray(temperature)[b]))
            pred = int(anchor[b])
            for i in range(nk):
                e = u[b, i] + ws[ids_t[b, i]] @ (wp[pred] * gf[b, i])
                if t <= 0:
                    j = int(torch.argmax(e))  # first maximum: the lowest rank
                    q[b, i, j] = 1
                else:
                    q[b, i] = torch.softmax(e / t, dim=-1)
                    j, _ = exponential_race(self.np_(q[b, i]).astype(np.float64), np.uint64(seed[b]),
                                            int(frontier[b]) + i, Purpose.DFLASH2_PROPOSAL)
                path[b, i] = j
                pred = int(ids[b, i, j])
        tokens = np.take_along_axis(np.asarray(ids, np.int64), path[..., None].astype(np.int64), -1)[..., 0]
        return {"g": self.np_bf16(g), "path": path, "tokens": tokens.astype(np.int32), "q": self.np_(q)}

    def target_distribution(self, logits, prompt_mask, output_counts, temperature, top_p, min_p, repetition_penalty,
                            frequency_penalty, presence_penalty, top_k, vocab_size):
        """vLLM's sampler order in FP32 on the whole batch: penalties, temperature, top-k, top-p, min-p."""
        z = self.t(logits).float().clone()
        n, vr = z.shape
        z[:, int(vocab_size):] = float("-inf")
        counts = self.t(output_counts).to(torch.int64)
        seen_out = counts > 0
        rho = self.t(repetition_penalty).float()[:, None]
        seen = (self.t(prompt_mask) != 0) | seen_out
        pen = torch.where(z > 0, z / rho, z * rho)
        z = torch.where(seen & (rho != 1), pen, z)
        z = z - (self.t(frequency_penalty).float()[:, None] * counts.float()
                 + self.t(presence_penalty).float()[:, None] * seen_out.float())
        temp = self.t(temperature).float()
        probs = torch.zeros_like(z)
        greedy = temp <= 0
        if bool(greedy.any()):
            _, order = torch.sort(z, dim=-1, descending=True, stable=True)
            hot = torch.zeros_like(z).scatter_(1, order[:, :1], 1.0)
            probs = torch.where(greedy[:, None], hot, probs)
        zt = z / torch.where(greedy, torch.ones_like(temp), temp)[:, None]
        sorted_z, order = torch.sort(zt, dim=-1, descending=True, stable=True)
        keep_sorted = torch.isfinite(sorted_z)
        rank = torch.arange(vr, device=self.device)[None, :]
        k = self.t(top_k).to(torch.int64)[:, None]
        keep_sorted &= (k <= 0) | (rank < k)
        tp = self.t(top_p).float()[:, None]
        p_sorted = torch.softmax(torch.where(keep_sorted, sorted_z, float("-inf")), dim=-1)
        cum = torch.cumsum(p_sorted, dim=-1)
        keep_sorted &= (tp >= 1) | self.top_p_keep(cum, p_sorted, tp) | (rank == 0)
        mp = self.t(min_p).float()[:, None]
        p_sorted = torch.softmax(torch.where(keep_sorted, sorted_z, float("-inf")), dim=-1)
        keep_sorted &= (mp <= 0) | ~(p_sorted < mp * p_sorted[:, :1])
        p_sorted = torch.softmax(torch.where(keep_sorted, sorted_z, float("-inf")), dim=-1)
        sampled = torch.zeros_like(z).scatter_(1, order, p_sorted)
        probs = torch.where(greedy[:, None], probs, sampled)
        return {"probs": self.np_(probs.float())}

    @staticmethod
    def top_p_keep(cum: torch.Tensor, p_sorted: torch.Tensor, tp: torch.Tensor) -> torch.Tensor:
        """The shortest prefix reaching top_p: a token stays while the mass before it is < top_p."""
        return (cum - p_sorted) < tp

    def speculative_accept(self, **kw):
        return self._discrete.speculative_accept(**kw)

    def tree_verify(self, **kw):
        return self._discrete.tree_verify(**kw)

    def preview_commit(self, **kw):
        return self._discrete.preview_commit(**kw)

    # --- one level up (CONTRACTS C10): proposal_round and speculative_step come from
    # ComposedRounds, over this engine's Op methods with their outputs on the host

    def _round_ops(self):
        return _OnHost(self)


class _OnHost:
    """An engine's Op methods with their outputs brought to the host as NumPy (BF16 tensors as
    ml_dtypes.bfloat16), the form the reference's composition reads between Ops."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, op):
        from conformance.runner import to_numpy

        fn = getattr(self.engine, op)
        return lambda **kw: {k: to_numpy(v) for k, v in fn(**kw).items()}
