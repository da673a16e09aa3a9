"""Kernels over volumes (NDHWC): conv3d and pool3d, as sums over the window's offsets."""

from __future__ import annotations

import itertools

import numpy as np

from .common import lowest
from .conv import compute_dtype
from .registry import kernel


def _offsets(ksize: list[int], dilations: list[int]) -> list[tuple[int, int, int]]:
    return [tuple(k * d for k, d in zip(ks, dilations))
            for ks in itertools.product(*(range(k) for k in ksize))]


def _window(x: np.ndarray, start: tuple[int, ...], out: tuple[int, ...],
            strides: list[int]) -> np.ndarray:
    """x[:, start + strides * i for each output position i, :] as a strided view."""
    return x[(slice(None), *(slice(s, s + (o - 1) * st + 1, st)
                             for s, o, st in zip(start, out, strides)), slice(None))]


@kernel("conv3d")
def conv3d(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
           scratch: np.ndarray | None) -> None:
    x, w, y = ins[0], ins[1], outs[0]
    p = attrs["pads"]
    padded = np.pad(x, [(0, 0), (p[0], p[1]), (p[2], p[3]), (p[4], p[5]), (0, 0)])
    acc = np.zeros(y.shape, dtype=np.float32 if y.dtype == np.float16 else y.dtype)
    for index, start in zip(itertools.product(*(range(k) for k in w.shape[:3])),
                            _offsets(list(w.shape[:3]), attrs["dilations"])):
        acc += _window(padded, start, y.shape[1:4], attrs["strides"]) @ w[index]
    np.copyto(y, acc, casting="unsafe")


@kernel("pool3d")
def pool3d(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
           scratch: np.ndarray | None) -> None:
    x, y = ins[0], outs[0]
    p, ksize, strides = attrs["pads"], attrs["ksize"], attrs["strides"]
    widths = [(0, 0), (p[0], p[1]), (p[2], p[3]), (p[4], p[5]), (0, 0)]
    starts = _offsets(ksize, [1, 1, 1])
    if attrs["mode"] == "max":
        fill = lowest(x.dtype)
        padded = np.pad(x, widths, constant_values=fill)
        best = _window(padded, starts[0], y.shape[1:4], strides).copy()
        for start in starts[1:]:
            np.maximum(best, _window(padded, start, y.shape[1:4], strides), out=best)
        np.copyto(y, best)
        return
    # As 2-D pooling: 16-bit floats accumulate in float32, integers in float64 (exact below
    # 2**53; the mean truncated toward zero), float32 and float64 in themselves.
    acc_type = np.float64 if x.dtype.kind in "iub" else compute_dtype(x.dtype)
    padded = np.pad(x.astype(acc_type, copy=False), widths)
    ones = np.pad(np.ones((1, *x.shape[1:4], 1), acc_type), widths)
    total = np.zeros(y.shape, acc_type)
    count = np.zeros((1, *y.shape[1:4], 1), acc_type)
    for start in starts:
        total += _window(padded, start, y.shape[1:4], strides)
        count += _window(ones, start, y.shape[1:4], strides)
    np.copyto(y, total / count, casting="unsafe")
