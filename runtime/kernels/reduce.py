"""Reductions: reduce, softmax, masked_softmax, layer_norm, argminmax.

Reductions always write through a keepdims-shaped view of the output (a free
reshape of the contiguous buffer), so `keepdims` never changes the code path.
float16 accumulates in float32 (as TF's reducers do for half); integer sums wrap
in their own dtype and integer means truncate, as in TF.
"""

from __future__ import annotations

import numpy as np

from .common import bf16_via_float32
from .registry import kernel


def _acc(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float16 else dtype


@kernel("reduce")
@bf16_via_float32
def reduce(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
           scratch: np.ndarray | None) -> None:
    x, y = ins[0], outs[0]
    fn, axes = attrs["fn"], tuple(attrs["axes"])
    if not axes:
        np.copyto(y, x.reshape(y.shape))
        return
    yk = y.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    if fn in ("sum", "prod"):
        f = np.sum if fn == "sum" else np.prod
        if _acc(y.dtype) == y.dtype:
            f(x, axis=axes, keepdims=True, dtype=y.dtype, out=yk)
        else:
            np.copyto(yk, f(x, axis=axes, keepdims=True, dtype=_acc(y.dtype)), casting="unsafe")
    elif fn == "mean":
        if y.dtype.kind == "f":
            np.mean(x, axis=axes, keepdims=True, out=yk)  # float16: float32 intermediates
        else:
            count = int(np.prod([x.shape[a] for a in axes]))
            total = np.sum(x, axis=axes, keepdims=True, dtype=y.dtype)
            # C division: truncate toward zero. (Not via abs: the sum may be the type's
            # minimum, whose negation wraps to itself.)
            q = total // count
            q += ((total % count != 0) & (total < 0)).astype(q.dtype)
            np.copyto(yk, q, casting="unsafe")
    elif fn in ("max", "min"):
        (np.max if fn == "max" else np.min)(x, axis=axes, keepdims=True, out=yk)
    elif fn in ("any", "all"):
        (np.any if fn == "any" else np.all)(x, axis=axes, keepdims=True, out=yk)
    else:
        raise ValueError(f"unknown reduction {fn!r}")


@kernel("softmax")
@bf16_via_float32
def softmax(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
            scratch: np.ndarray | None) -> None:
    x, y = ins[0], outs[0]
    axis = attrs["axis"]
    work = y if _acc(y.dtype) == y.dtype else np.empty(y.shape, _acc(y.dtype))
    with np.errstate(all="ignore"):
        # Subtracting the max keeps exp from overflowing (TF does the same).
        np.subtract(x, np.max(x, axis=axis, keepdims=True), out=work)
        if attrs.get("log"):
            total = np.sum(np.exp(work), axis=axis, keepdims=True)
            np.subtract(work, np.log(total, out=total), out=work)
        else:
            np.exp(work, out=work)
            np.divide(work, np.sum(work, axis=axis, keepdims=True), out=work)
    if work is not y:
        np.copyto(y, work, casting="unsafe")



@kernel("masked_softmax")
@bf16_via_float32
def masked_softmax(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
                   scratch: np.ndarray | None) -> None:
    x, mask = ins
    # The three TF ops it stands for: select, softmax over the last axis, select.
    z = np.where(mask, x, np.float32(attrs["fill"]))
    softmax([z], outs, {"axis": x.ndim - 1, "log": False}, None)
    np.copyto(outs[0], np.float32(attrs["masked"]), where=~np.broadcast_to(mask, x.shape))


@kernel("layer_norm")
def layer_norm(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
               scratch: np.ndarray | None) -> None:
    x, scale, shift = ins
    y = outs[0]
    acc = _acc(y.dtype)
    xa = x.astype(acc, copy=False)
    mean = np.mean(xa, axis=-1, keepdims=True, dtype=acc)
    centered = xa - mean
    var = np.mean(np.square(centered), axis=-1, keepdims=True, dtype=acc)
    with np.errstate(divide="ignore", invalid="ignore"):  # epsilon 0 on a constant row: inf
        np.multiply(centered, 1 / np.sqrt(var + acc.type(attrs["epsilon"])), out=centered)
    np.multiply(centered, scale, out=centered)
    np.add(centered, shift, out=centered)
    np.copyto(y, centered, casting="unsafe")


@kernel("argminmax")
def argminmax(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
              scratch: np.ndarray | None) -> None:
    x, y = ins[0], outs[0]
    fn = attrs["fn"]
    if fn not in ("argmax", "argmin"):
        raise ValueError(f"unknown function {fn!r}")
    f = np.argmax if fn == "argmax" else np.argmin  # both return the first extreme
    if y.dtype == np.intp:
        f(x, axis=attrs["axis"], out=y)
    else:
        np.copyto(y, f(x, axis=attrs["axis"]), casting="unsafe")
