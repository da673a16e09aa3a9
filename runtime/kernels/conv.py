"""conv2d (as GEMM) and depthwise_conv2d (as per-tap multiply-adds), NHWC.

conv2d: a 1x1 stride-1 unpadded convolution is one GEMM on the input as is.
Anything else is im2col: the (zero-padded, in scratch) input is seen through a
strided window view [N, OH, OW, KH, KW, C] and copied into a column matrix
[rows, KH*KW*C] that one GEMM multiplies with the filter [KH*KW*C, O]. The
columns are built a block of output rows at a time: a block of a few MiB stays
in cache between the copy and the GEMM that reads it (and so does the output
block for the bias/activation epilogue), which beats one huge column matrix by
up to 1.4x on ResNet's layers (~15% over all of them). Blocks keep at least a
couple of thousand rows: each GEMM must stay large for BLAS to run at full speed,
and every call costs a synchronization of BLAS's threads.

With `residual`, the last input is added to each output block after the bias and
before the activation (a ResNet shortcut fused by the compiler): one pass over
cache-resident blocks instead of two more passes over the whole activation.

float16 is computed in float32 (numpy has no float16 BLAS) and rounded once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import isa
from ..isa import Geometry
from . import parallel
from .common import (
    Scratch,
    flat2d,
    lane_slices,
    pad_hw,
    reduced_precision,
)
from .elementwise import activate
from .registry import kernel


def compute_dtype(dtype: object) -> np.dtype:
    """isa.compute_dtype as a numpy dtype."""
    return np.dtype(isa.compute_dtype(np.dtype(dtype).name))


def blocks(n: int, oh: int, rows: int) -> Iterator[tuple[int, int, int, int]]:
    """(n0, n1, oh0, oh1) blocks covering [n, oh], `rows` output rows at a time:
    whole images when a block holds at least one, else bands of one image."""
    if rows >= oh:
        per = rows // oh
        for n0 in range(0, n, per):
            yield n0, min(n, n0 + per), 0, oh
    else:
        for i in range(n):
            for o0 in range(0, oh, rows):
                yield i, i + 1, o0, min(oh, o0 + rows)


def windows(xp: np.ndarray, g: Geometry) -> np.ndarray:
    """Read-only [N, OH, OW, KH, KW, C] view of every receptive field of padded `xp`."""
    s_n, s_h, s_w, s_c = xp.strides
    return as_strided(xp, (g.n, g.oh, g.ow, g.kh, g.kw, g.c),
                      (s_n, s_h * g.sh, s_w * g.sw, s_h * g.dh, s_w * g.dw, s_c),
                      writeable=False)


# --- conv2d -------------------------------------------------------------------

def has_bias(n_inputs: int, attrs: dict) -> bool:
    """conv2d's inputs are x, w [, bias] [, residual]."""
    return n_inputs - bool(attrs.get("residual")) == 3


def _conv2d_layout(in_shapes: Sequence[Sequence[int]], in_dtypes: Sequence[str],
                   attrs: dict) -> tuple[Geometry, np.dtype, int, list]:
    g, cd, rows, regions = isa.conv2d_layout(in_shapes, in_dtypes, attrs)
    return g, np.dtype(cd), rows, regions


def _grouped_conv2d(ins: list[np.ndarray], y: np.ndarray, attrs: dict,
                    scratch: np.ndarray | None) -> None:
    """Each group is a plain conv2d on its slice of the input channels, writing its
    slice of the output channels; the epilogue then runs once over the whole output."""
    x, w = ins[0], ins[1]
    g, x_shape, w_shape, plain = isa.conv2d_group([x.shape, w.shape], attrs)
    s = Scratch(scratch)
    xg = s.take(x_shape, x.dtype)
    yg = s.take((g.n, g.oh, g.ow, w_shape[3]), y.dtype)
    wg = s.take(w_shape, w.dtype)
    inner_bytes = isa.scratch_bytes("conv2d", [x_shape, w_shape], [x.dtype.name], plain)
    inner = s.take((inner_bytes,), np.uint8) if inner_bytes else None
    cg, og = x_shape[3], w_shape[3]
    for k in range(attrs["groups"]):
        np.copyto(xg, x[..., k * cg:(k + 1) * cg])
        np.copyto(wg, w[..., k * og:(k + 1) * og])
        conv2d([xg, wg], [yg], plain, inner)
        y[..., k * og:(k + 1) * og] = yg
    if has_bias(len(ins), attrs):
        np.add(y, ins[2], out=y)
    if attrs.get("residual"):
        np.add(y, ins[-1], out=y)
    activate(y, attrs)


@kernel("conv2d")
@reduced_precision
def conv2d(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
           scratch: np.ndarray | None) -> None:
    x, w, y = ins[0], ins[1], outs[0]
    if attrs.get("residual") and np.shares_memory(ins[-1], y):
        # The memory plan put the output on the residual's bytes (cc/memory.py); this
        # kernel writes blocks of the output before adding the residual to them.
        ins = [*ins[:-1], ins[-1].copy()]
    if attrs.get("groups", 1) > 1:
        _grouped_conv2d(ins, y, attrs, scratch)
        return
    bias = ins[2] if has_bias(len(ins), attrs) else None
    residual = ins[-1].reshape(-1, w.shape[3]) if attrs.get("residual") else None
    g, cd, rows, _ = _conv2d_layout([i.shape for i in ins], [i.dtype.name for i in ins], attrs)
    k = g.kh * g.kw * g.c
    w2 = w.reshape(k, g.oc).astype(cd, copy=False)
    s = Scratch(scratch)
    if g.direct:
        src = x.reshape(-1, g.c)  # rows of the column matrix, in output order
        win = None
    else:
        xp = pad_hw(x, g.pads, 0, s.take(g.padded_shape, cd)) if g.padded else x
        win = windows(xp, g)
        cols = s.take((rows * g.ow, k), cd)
    tmp = s.take((rows * g.ow, g.oc), cd) if cd != y.dtype else None
    todo = list(blocks(g.n, g.oh, rows))
    if bias is not None and len(todo) > 1:
        tiled = s.take((rows * g.ow, g.oc), y.dtype)
        np.copyto(tiled, bias)
        bias = tiled
    y2 = flat2d(y, g.oc)
    for n0, n1, o0, o1 in todo:
        if win is None:
            a = src[(n0 * g.oh + o0) * g.ow:((n1 - 1) * g.oh + o1) * g.ow]
        else:
            m = (n1 - n0) * (o1 - o0) * g.ow
            a = cols[:m]
            np.copyto(a.reshape(n1 - n0, o1 - o0, g.ow, g.kh, g.kw, g.c),
                      win[n0:n1, o0:o1])
        span = slice((n0 * g.oh + o0) * g.ow, ((n1 - 1) * g.oh + o1) * g.ow)
        out = y2[span]
        if tmp is None:
            np.matmul(a, w2, out=out)
        else:
            np.copyto(out, np.matmul(a, w2, out=tmp[:len(out)]), casting="unsafe")
        # Epilogue while the block is still in cache.
        if bias is not None:
            np.add(out, bias if bias.ndim == 1 else bias[:len(out)], out=out)
        if residual is not None:
            np.add(out, residual[span], out=out)
        activate(out, attrs)


# --- depthwise_conv2d ---------------------------------------------------------
# Each filter tap is a multiply-add of a shifted view of the input. numpy is only
# fast when the inner loop is long, so the taps are arranged to read OW*s*C
# contiguous values, s being the column stride: the padded input [N, Hp, G*s, C]
# is seen as [N, Hp, G, s*C] (groups of s adjacent columns), output column ow
# reads groups ow, ow+1, ... and a "group tap" multiplies a whole group by the
# weights of the filter columns that land in each of its s slots (zero where
# none does). The s slots of the accumulator are summed at the end. With s = 1
# this is the plain per-tap loop. Weights are tiled along OW to match. (The zero
# weights do multiply real inputs: an inf there would give a NaN that TF avoids.)

def _depthwise_layout(in_shapes: Sequence[Sequence[int]], in_dtypes: Sequence[str],
                      attrs: dict) -> tuple[Geometry, np.dtype, int, list]:
    g, cd, rows, regions = isa.depthwise_layout(in_shapes, in_dtypes, attrs)
    return g, np.dtype(cd), rows, regions


@kernel("depthwise_conv2d")
@reduced_precision
def depthwise_conv2d(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
                     scratch: np.ndarray | None) -> None:
    x, w, y = ins[0], ins[1], outs[0]
    bias = ins[2] if len(ins) == 3 else None
    g, cd, rows, _ = _depthwise_layout([x.shape, w.shape], [x.dtype.name], attrs)
    s, m, sc = g.sw, g.oc, g.sw * g.c
    buf = Scratch(scratch)
    xp = x
    if isa.depthwise_needs_copy(g, cd.name, x.dtype.name):
        n, hp, wp, c = g.padded_shape
        xp = buf.take((n, hp, -(-wp // s) * s, c), cd)
        top, bottom, left, right = g.pads  # (right: plus up to s-1 columns to fill a group)
        pad_hw(x, (top, bottom, left, right + xp.shape[2] - wp), 0, xp)
    groups = xp.reshape(xp.shape[0], xp.shape[1], -1, sc)
    # Per output column: [OW, s*C, M] values, flattened when M = 1 (the common
    # case) so every operand is one long contiguous run per output row.
    tail = (g.ow * sc,) if m == 1 else (g.ow, sc, m)
    taps = []  # (input view [N, OH, *tail], weights broadcasting to tail)
    for i in range(g.kh):
        rows_i = slice(i * g.dh, i * g.dh + (g.oh - 1) * g.sh + 1, g.sh)
        for q in range(((g.kw - 1) * g.dw) // s + 1):
            hits = [j for j in range(g.kw) if (j * g.dw) // s == q]
            if not hits:  # (dilation can skip whole groups)
                continue
            wq = np.zeros((s, g.c, m), cd)
            for j in hits:
                wq[(j * g.dw) % s] = w[i, j]
            view = groups[:, rows_i, q:q + g.ow]
            if m == 1:
                taps.append((view.reshape(g.n, g.oh, *tail), np.tile(wq.reshape(-1), g.ow)))
            else:
                taps.append((view[..., None], wq.reshape(sc, m)))
    # The scratch holds `rows` output rows of products (and accumulators); lanes
    # split it evenly, each working on blocks of its share.
    lanes_used = min(parallel.lanes(), rows)
    lane_rows = rows // lanes_used
    size = lane_rows * g.ow * sc * m
    prod = lane_slices(buf.take((rows * g.ow * sc * m,), cd), lanes_used, size)
    acc_bufs = lane_slices(buf.take((rows * g.ow * sc * m,), cd), lanes_used, size) \
        if s > 1 or cd != y.dtype else None
    y_view = y.reshape(g.n, g.oh, *tail) if s == 1 else None

    def run_block(lane: int, block: tuple[int, int, int, int]) -> None:
        n0, n1, o0, o1 = block
        shape = (n1 - n0, o1 - o0, *tail)
        count = int(np.prod(shape))
        acc = y_view[n0:n1, o0:o1] if acc_bufs is None else \
            acc_bufs[lane][:count].reshape(shape)
        p = prod[lane][:count].reshape(shape)
        for k, (view, wt) in enumerate(taps):
            if k == 0:
                np.multiply(view[n0:n1, o0:o1], wt, out=acc)
            else:
                np.multiply(view[n0:n1, o0:o1], wt, out=p)
                np.add(acc, p, out=acc)
        out = y[n0:n1, o0:o1]
        if acc_bufs is not None:
            # Sum the s slots: [.., OW, s, C*M] -> [.., OW, C*M].
            slots = acc.reshape(n1 - n0, o1 - o0, g.ow, s, g.c * m)
            if s == 1:
                np.copyto(out, slots[:, :, :, 0], casting="unsafe")
            elif cd == y.dtype:
                np.add(slots[:, :, :, 0], slots[:, :, :, 1], out=out)
                for k in range(2, s):
                    np.add(out, slots[:, :, :, k], out=out)
            else:
                np.copyto(out, slots.sum(axis=3), casting="unsafe")
        if bias is not None:
            np.add(out, bias, out=out)
        activate(out, attrs)

    parallel.for_each_block(run_block, list(blocks(g.n, g.oh, lane_rows)), lanes_used)
