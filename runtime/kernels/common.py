"""Helpers shared by the kernel modules: carving the scratch buffer, padding, sizes."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import ml_dtypes  # noqa: F401 (gives numpy the "bfloat16" dtype)
import numpy as np

ALIGN = 64  # every carved region starts on a cache line (what numpy's SIMD loops like)


def nbytes(*regions: tuple[Sequence[int], object]) -> int:
    """Scratch bytes for regions (shape, dtype) carved in order by `Scratch.take`;
    each may lose up to ALIGN bytes to alignment."""
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize + ALIGN
               for shape, dtype in regions)


class Scratch:
    """Hands out aligned, non-overlapping arrays from the flat uint8 scratch buffer."""

    def __init__(self, buf: np.ndarray | None):
        self.buf = buf if buf is not None else np.empty(0, np.uint8)
        self.pos = 0

    def take(self, shape: Sequence[int], dtype: object) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        start = self.pos + (-(self.buf.ctypes.data + self.pos)) % ALIGN
        if start + n > self.buf.size:
            raise RuntimeError(f"kernel scratch too small: need {start + n} bytes, "
                               f"have {self.buf.size} (scratch size function out of date?)")
        self.pos = start + n
        return self.buf[start:start + n].view(dtype).reshape(tuple(shape))


def lane_slices(region: np.ndarray, lanes: int, size: int) -> list[np.ndarray]:
    """`lanes` disjoint `size`-element pieces of the flat `region`, each starting on a
    cache line when the region has room for that (else packed)."""
    per_line = max(1, ALIGN // region.itemsize)
    stride = -(-size // per_line) * per_line
    if stride * lanes > region.size:
        stride = size
    return [region[i * stride:i * stride + size] for i in range(lanes)]


def spatial_out(size: int, k: int, stride: int, dilation: int, before: int, after: int) -> int:
    """Output extent of a window sweep (same rule as cc/kinds.py)."""
    return (size + before + after - ((k - 1) * dilation + 1)) // stride + 1


def lowest(dtype: np.dtype) -> object:
    """The identity of max: -inf for floats, the minimum for integers."""
    floating = dtype.kind == "f" or dtype.name == "bfloat16"  # (ml_dtypes' kind is "V")
    return -np.inf if floating else np.iinfo(dtype).min


def pad_hw(x: np.ndarray, pads: Sequence[int], fill: object, out: np.ndarray) -> np.ndarray:
    """NHWC `x` padded by pads [t, b, l, r] with `fill`, written into `out` (its padded
    shape). Only the border is filled, so the cost is one copy of `x`."""
    top, bottom, left, right = pads
    _, hp, wp, _ = out.shape
    h, w = x.shape[1], x.shape[2]
    if top:
        out[:, :top] = fill
    if bottom:
        out[:, hp - bottom:] = fill
    if left:
        out[:, top:top + h, :left] = fill
    if right:
        out[:, top:top + h, wp - right:] = fill
    out[:, top:top + h, left:left + w] = x
    return out


def flat2d(out: np.ndarray, cols: int) -> np.ndarray:
    """`out` as a [rows, cols] view; outputs are contiguous by the interface, so this
    never copies (a copy would silently drop the result)."""
    if not out.flags.c_contiguous:
        raise RuntimeError("kernel output buffer is not contiguous")
    return out.reshape(-1, cols)


def reduced_precision(fn: Callable) -> Callable:
    """For matmul-like kernels: with attribute `compute` (bfloat16 or float16), both
    operands are rounded to that precision (round to nearest even; weights arrive
    already stored in it) and the kernel computes in float32 from there, the way a
    matrix unit reads 16-bit operands and accumulates in float32 (docs/isa.md)."""

    @functools.wraps(fn)
    def run(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
            scratch: np.ndarray | None) -> None:
        compute = attrs.get("compute", "float32")
        if compute != "float32":
            ins = [_through(x, compute) for x in ins[:2]] + [
                x.astype(np.float32) if x.dtype.name in ("bfloat16", "float16") else x
                for x in ins[2:]]
            attrs = {k: v for k, v in attrs.items() if k != "compute"}
        if compute == "float32" or outs[0].dtype.name not in ("bfloat16", "float16"):
            fn(ins, outs, attrs, scratch)
            return
        # A 16-bit output (cc/passes/dtypes.py): the float32 result, epilogue included,
        # rounded once to nearest even, as the native engine's primitives write it.
        wide = [np.empty(o.shape, np.float32) for o in outs]
        fn(ins, wide, attrs, scratch)
        for o, w in zip(outs, wide):
            np.copyto(o, w.astype(o.dtype))

    return run


def bf16_via_float32(fn: Callable) -> Callable:
    """For element-wise and reducing kernels: bfloat16 operands are computed in float32
    and each result rounded once to nearest even, the way oneDNN's bf16 primitives do
    (numpy's bfloat16 ufuncs would round every intermediate of a formula)."""

    @functools.wraps(fn)
    def run(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
            scratch: np.ndarray | None) -> None:
        if not any(x.dtype.name == "bfloat16" for x in (*ins, *outs)):
            fn(ins, outs, attrs, scratch)
            return
        wide_ins = [x.astype(np.float32) if x.dtype.name == "bfloat16" else x for x in ins]
        wide = [np.empty(o.shape, np.float32) if o.dtype.name == "bfloat16" else o
                for o in outs]
        fn(wide_ins, wide, attrs, scratch)
        for o, w in zip(outs, wide):
            if w is not o:
                np.copyto(o, w.astype(o.dtype))

    return run


def _through(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` as float32 after a round trip through `dtype` (exact when it already is one)."""
    if x.dtype == np.float32:
        return x.astype(dtype).astype(np.float32)
    return x.astype(np.float32)
