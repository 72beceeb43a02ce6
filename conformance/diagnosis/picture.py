"""|error| / allowance over an output's element grid: the picture of a FAIL.

Each output is laid out as a grid: its last axis across, every other axis flattened down (rows in
index order), so a window edge is a diagonal band, a shifted row a stripe, an interleaved RoPE
layout every other column. A value of 1 is what the suite allows at that element (the tight bound
or the accuracy envelope, whichever is larger, as ``diagnosis.explain`` measures it); elements the
vector does not compare (its mask: keys outside a window, rows past the live extent) are drawn
hatched grey. Large outputs are max-pooled to at most ``MAX_SIDE`` cells a side, so no error hides.

The grids are NumPy only; drawing them needs matplotlib (the ``[report]`` extra).
"""

from __future__ import annotations

import base64
import io

import numpy as np

MAX_SIDE = 256
EXTRA = "matplotlib is not installed: install the report extra, pip install 'dflash-conformance[report]'"


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pool(a: np.ndarray, fn) -> np.ndarray:
    r, c = a.shape
    fr, fc = -(-r // MAX_SIDE), -(-c // MAX_SIDE)
    if fr == 1 and fc == 1:
        return a
    pr, pc = -(-r // fr) * fr, -(-c // fc) * fc
    fill = 0 if a.dtype != bool else False
    b = np.full((pr, pc), fill, a.dtype)
    b[:r, :c] = a
    return fn(b.reshape(pr // fr, fr, pc // fc, fc), axis=(1, 3))


def grid(err: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(grid of |error| / allowance, grid of compared elements, the output's shape)."""
    err, mask = np.asarray(err, np.float64), np.broadcast_to(np.asarray(mask, bool), np.shape(err))
    shape = err.shape
    if err.ndim == 0:
        err, mask = err.reshape(1, 1), mask.reshape(1, 1)
    else:
        err, mask = err.reshape(-1, shape[-1]), mask.reshape(-1, shape[-1])
    return _pool(err, np.max).astype(np.float32), _pool(mask, np.any), shape


def grids(maps, masks) -> dict:
    return {name: grid(maps[name], masks[name]) for name in maps}


def png(name: str, g: tuple, title: str = "") -> bytes:
    """One output's picture as PNG bytes (matplotlib required)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    err, mask, shape = g
    rows, cols = err.shape
    fig, ax = plt.subplots(figsize=(max(6.5, min(12, 3 + cols / 10)), max(4, min(8, 2 + rows / 10))), dpi=90)
    shown = np.where(mask, np.clip(err, 1e-3, 1e6), np.nan)
    im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="magma",
                   norm=LogNorm(vmin=1e-3, vmax=max(10.0, float(np.nanmax(shown)) if mask.any() else 10.0)))
    if (~mask).any():
        ax.contourf(np.arange(cols), np.arange(rows), (~mask).astype(float), levels=[0.5, 1.5], colors="none",
                    hatches=["///"])
        ax.imshow(np.where(mask, np.nan, 1.0), aspect="auto", interpolation="nearest", cmap="Greys", vmin=0,
                  vmax=3, alpha=0.5)
    over = mask & (err > 1.0)
    if over.any() and over.sum() < 2000:
        ys, xs = np.nonzero(over)
        ax.scatter(xs, ys, s=4, facecolors="none", edgecolors="cyan", linewidths=0.4)
    cb = fig.colorbar(im, ax=ax)
    cb.set_label("|error| / allowance (1 = allowed)")
    ax.set_title((title + "\n" if title else "") + f"{name} {list(shape)}: rows = all axes but the last; "
                 "hatched: not compared; circled: over the allowance", fontsize=8)
    ax.set_xlabel(f"last axis ({shape[-1] if shape else 1})")
    ax.set_ylabel("flattened leading axes")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def png_base64(name: str, g: tuple, title: str = "") -> str:
    return base64.b64encode(png(name, g, title)).decode("ascii")
