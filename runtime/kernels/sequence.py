"""Kernels along one axis of a sequence: cumulative (running sums and products) and top_k."""

from __future__ import annotations

import numpy as np

from .registry import kernel


@kernel("cumulative")
def cumulative(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
               scratch: np.ndarray | None) -> None:
    x, y, axis = ins[0], outs[0], attrs["axis"]
    scan, identity = (np.cumsum, 0) if attrs["fn"] == "sum" else (np.cumprod, 1)
    if attrs["reverse"]:
        x = np.flip(x, axis)
    n = x.shape[axis]
    with np.errstate(all="ignore"):  # integers wrap, floats overflow to inf, as in TF
        if attrs["exclusive"]:
            run = np.empty_like(x)
            head = [slice(None)] * x.ndim
            head[axis] = slice(0, 1)
            run[tuple(head)] = identity
            if n > 1:
                head[axis] = slice(1, None)
                scan(np.take(x, range(n - 1), axis=axis), axis=axis, dtype=x.dtype,
                     out=run[tuple(head)])
        else:
            run = scan(x, axis=axis, dtype=x.dtype)
    np.copyto(y, np.flip(run, axis) if attrs["reverse"] else run)


@kernel("top_k")
def top_k(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
          scratch: np.ndarray | None) -> None:
    x, y, k = ins[0], outs[0], attrs["k"]
    n = x.shape[-1]
    # Descending, equal values in index order: a stable ascending sort of the reversed
    # row, read backwards, lists equal values from the lowest original index.
    order = np.argsort(x[..., ::-1], axis=-1, kind="stable")[..., ::-1][..., :k]
    index = (n - 1) - order
    if attrs["indices"]:
        np.copyto(y, index, casting="unsafe")
    else:
        np.copyto(y, np.take_along_axis(x, index, axis=-1))
