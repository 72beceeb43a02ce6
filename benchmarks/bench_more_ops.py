"""GPU benchmark rows for the Ops benchmarks/gpu_bench.py did not time on their own: feature_capture,
grouped_conv and candidate_selector, at the official geometries, exact and fast mode against the
same math in PyTorch BF16 eager, in the same process and with the same Timer (issue 12: "every Op
at least as fast as PyTorch"). Registered in gpu_bench.BENCHES; each function has the signature of
the others there. Shapes: the decode round's rows (B x W from gpu_bench's shapes) and, for
feature_capture, a 4096-row prefill chunk.
"""

from __future__ import annotations


def _helpers():
    from benchmarks import gpu_bench

    return gpu_bench.bits, gpu_bench.row


def bench_feature_capture(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    """Both geometries: the target's chosen block outputs [n, T, Ht] concatenated per row, fc
    [H, n Ht], hidden RMSNorm, BF16 out. T = B x W of each decode shape, then 4096 (prefill)."""
    import torch.nn.functional as F

    bits, row = _helpers()
    for name, h, n in [("27B", 5120, 5), ("35B", 2048, 8)]:
        fc = torch.randn(h, n * h, dtype=torch.bfloat16, device="cuda") * (n * h) ** -0.5
        norm = torch.rand(h, device="cuda").to(torch.bfloat16) + 0.5
        fcb = bits(cp, fc)  # device BF16 bits: used as is (resident), no conversion per call
        for t in sorted({b * w for b, w in shapes} | {4096}):
            blocks = torch.randn(n, t, h, dtype=torch.bfloat16, device="cuda")
            kw = dict(block_outputs=bits(cp, blocks), fc_weight=fcb, hidden_norm=bits(cp, norm),
                      target_layer_ids=list(range(n)), eps=1e-6)

            def tor():
                s = blocks.permute(1, 0, 2).reshape(t, n * h)
                y = F.linear(s, fc).float()
                y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.float()
                return y.to(torch.bfloat16)

            floor = (fc.numel() + blocks.numel() + t * h) * 2
            rows.append(row("feature_capture", f"{name} T{t} n{n}",
                            timer(lambda: exact.feature_capture(**kw), warmup=1, reps=5) if exact else None,
                            timer(lambda: fast.feature_capture(**kw)), timer(tor), floor / floor_bw * 1e3))
            del blocks


def bench_grouped_conv(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    """27B (DFlash2, H 5120, groups of 16): prepare on x (delta = W_delta x, side 0 conv) and finish
    on z with prepare's side-1 delta; torch forms (base + delta) and multiplies once, as the spec."""
    import torch.nn.functional as F

    bits, row = _helpers()
    h = 5120
    g = h // 16
    base = (torch.randn(2, 2, h, device="cuda") * 0.1 + 0.5).to(torch.bfloat16)
    proj = torch.randn(4 * g, h, dtype=torch.bfloat16, device="cuda") * h**-0.5
    for b, w in shapes:
        x = torch.randn(b, w, h, dtype=torch.bfloat16, device="cuda")
        z = torch.randn(b, w, h, dtype=torch.bfloat16, device="cuda")
        kw = dict(x=bits(cp, x), z=bits(cp, z), base=bits(cp, base), proj=bits(cp, proj))

        def conv(t, base_side, delta):  # t [b,w,h] fp32, base_side [2,h], delta [b,w,2,g]
            coef = base_side.float().view(1, 1, 2, g, 16) + delta.float()[..., None]
            tg = t.view(b, w, g, 16)
            out = coef[:, :, 0] * tg
            out[:, 1:] += coef[:, 1:, 1] * tg[:, :-1]
            return out.reshape(b, w, h)

        def tor():
            delta = F.linear(x, proj).view(b, w, 2, 2, g)
            prepared = conv(x.float(), base[0], delta[:, :, 0]).to(torch.bfloat16)
            fd = delta[:, :, 1]
            finished = conv(z.float(), base[1], fd).to(torch.bfloat16)
            return prepared, fd, finished

        floor = (proj.numel() + 3 * x.numel() + base.numel()) * 2
        rows.append(row("grouped_conv", f"27B B{b} W{w}", timer(lambda: exact.grouped_conv(**kw)) if exact else None,
                        timer(lambda: fast.grouped_conv(**kw)), timer(tor), floor / floor_bw * 1e3))


def bench_candidate_selector(cp, torch, timer, exact, fast, shapes, rows, floor_bw):
    """27B (DFlash2: rank 256, top-16, vocab 248320), K = W - 1 positions, greedy rows and sampled
    rows half and half on our side; torch runs the greedy walk for every row (gathers of the
    codebook rows, g = F.linear BF16, an argmax per position): no cheaper than what ours does."""
    import torch.nn.functional as F

    from benchmarks.gpu_bench import torch_greedy_walk

    bits, row = _helpers()
    h, r, top, vr = 5120, 256, 16, 248320
    w_hidden = torch.randn(r, h, dtype=torch.bfloat16, device="cuda") * h**-0.5
    w_pred = torch.randn(vr, r, dtype=torch.bfloat16, device="cuda")
    w_succ = torch.randn(vr, r, dtype=torch.bfloat16, device="cuda")
    for b, w in shapes:
        k = w - 1
        hidden = torch.randn(b, k, h, dtype=torch.bfloat16, device="cuda")
        scores = torch.randn(b, k, top, device="cuda").sort(-1, descending=True).values
        ids = torch.randint(0, vr, (b, k, top), device="cuda", dtype=torch.int32)
        anchor = torch.randint(0, vr, (b,), device="cuda", dtype=torch.int32)
        temperature = (torch.arange(b, device="cuda") % 2).float()
        seed = torch.arange(1, b + 1, device="cuda", dtype=torch.int64)
        frontier = torch.full((b,), 4096, device="cuda", dtype=torch.int64)
        kw = dict(hidden=bits(cp, hidden), scores=cp.from_dlpack(scores), ids=cp.from_dlpack(ids),
                  anchor=cp.from_dlpack(anchor), w_hidden=bits(cp, w_hidden), w_pred=bits(cp, w_pred),
                  w_succ=bits(cp, w_succ), temperature=cp.from_dlpack(temperature),
                  seed=cp.from_dlpack(seed).view(cp.uint64), frontier=cp.from_dlpack(frontier))

        def tor():
            return torch_greedy_walk(torch, F, hidden, scores, ids, anchor, w_hidden, w_pred, w_succ)

        floor = (w_hidden.numel() + b * k * (top + 1) * r + b * k * h) * 2
        rows.append(row("candidate_selector", f"27B B{b} K{k}",
                        timer(lambda: exact.candidate_selector(**kw)) if exact else None,
                        timer(lambda: fast.candidate_selector(**kw)), timer(tor), floor / floor_bw * 1e3))
