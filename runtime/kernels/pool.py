"""pool: max/avg over KHxKW windows, NHWC, separably and without a padded copy.

Both reductions are separable: first fold the KH taps along H (each operand is a
run of whole input rows, W*C contiguous values, so numpy's inner loops are long;
with stride 2 this also halves the data), then the KW taps along W on that
smaller intermediate. A tap only touches the output positions whose source lies
inside the input, so padding is never materialized: max simply never sees it
(TF's semantics) and avg divides by the count of in-bounds elements per window
(TF's semantics). Work goes a block of output rows at a time so the intermediate
stays in cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .. import isa
from ..isa import Geometry
from .common import Scratch, lowest
from .conv import blocks
from .registry import kernel


def _layout(in_shapes: Sequence[Sequence[int]], in_dtypes: Sequence[str],
            attrs: dict) -> tuple[Geometry, np.dtype, int, list]:
    g, cd, rows, regions = isa.pool_layout(in_shapes, in_dtypes, attrs)
    return g, np.dtype(cd), rows, regions


def _fold_axis(src: np.ndarray, dst: np.ndarray, axis: int, k: int, stride: int, before: int,
               first: int, fold: Callable, identity: object) -> None:
    """dst[.., i, ..] = fold over taps t < k of src[.., (first+i)*stride - before + t, ..],
    skipping taps that fall outside src (the padding)."""
    size, count = src.shape[axis], dst.shape[axis]
    spans = []  # (dst range, src start) of each tap's in-bounds outputs
    for t in range(k):
        off = t - before
        lo = max(first, -(off // stride))  # first output whose source is >= 0
        hi = min(first + count, (size - 1 - off) // stride + 1)
        if lo < hi:
            spans.append((lo - first, hi - first, lo * stride + off))

    def at(a: np.ndarray, s: slice) -> np.ndarray:
        return a[(slice(None),) * axis + (s,)]

    # Start from a tap that covers every output (there is one unless a window can
    # lie partly in the padding on both sides), else from the fold's identity.
    full = next((sp for sp in spans if sp[0] == 0 and sp[1] == count), None)
    if full is None:
        dst[...] = identity
    else:
        spans.remove(full)
        spans.insert(0, full)
    for sp in spans:
        lo, hi, start = sp
        part = at(src, slice(start, start + (hi - lo - 1) * stride + 1, stride))
        if sp is full:
            np.copyto(dst, part)
        else:
            out = at(dst, slice(lo, hi))
            fold(out, part, out=out)


def _window_counts(size: int, k: int, stride: int, before: int, out: int) -> np.ndarray:
    """How many of each output position's k taps fall inside the unpadded input."""
    start = np.arange(out) * stride - before
    return np.minimum(start + k, size) - np.maximum(start, 0)


@kernel("pool")
def pool(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
         scratch: np.ndarray | None) -> None:
    x, y = ins[0], outs[0]
    mode = attrs["mode"]
    if mode not in ("max", "avg"):
        raise ValueError(f"unknown pool mode {mode!r}")
    g, cd, rows, _ = _layout([x.shape], [x.dtype.name], attrs)
    fold, identity = (np.maximum, lowest(cd)) if mode == "max" else (np.add, 0)
    s = Scratch(scratch)
    col_buf = s.take((rows * g.w * g.c,), cd)
    acc_buf = s.take((rows * g.ow * g.c,), cd) if cd != y.dtype else None
    if mode == "avg":
        counts = np.multiply.outer(_window_counts(g.h, g.kh, g.sh, g.pads[0], g.oh),
                                   _window_counts(g.w, g.kw, g.sw, g.pads[2], g.ow))
        divisor = counts.astype(cd)[:, :, None]  # [OH, OW, 1]
    for n0, n1, o0, o1 in blocks(g.n, g.oh, rows):
        b, r = n1 - n0, o1 - o0
        cols = col_buf[:b * r * g.w * g.c].reshape(b, r, g.w, g.c)
        acc = y[n0:n1, o0:o1] if acc_buf is None else \
            acc_buf[:b * r * g.ow * g.c].reshape(b, r, g.ow, g.c)
        _fold_axis(x[n0:n1], cols, 1, g.kh, g.sh, g.pads[0], o0, fold, identity)
        _fold_axis(cols, acc, 2, g.kw, g.sw, g.pads[2], 0, fold, identity)
        if mode == "avg":
            np.divide(acc, divisor[o0:o1], out=acc)
        if acc_buf is not None:
            np.copyto(y[n0:n1, o0:o1], acc, casting="unsafe")
