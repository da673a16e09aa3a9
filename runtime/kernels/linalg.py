"""matmul: y = act(op(a) @ op(b) + bias + residual), straight into the output through BLAS."""

from __future__ import annotations

import numpy as np

from .common import reduced_precision
from .elementwise import activate
from .registry import kernel


@kernel("matmul")
@reduced_precision
def matmul(ins: list[np.ndarray], outs: list[np.ndarray], attrs: dict,
           scratch: np.ndarray | None) -> None:
    a, b, y = ins[0], ins[1], outs[0]
    # perm_a/perm_b/perm_y: the operands and the result through numpy transposes (views:
    # y is written through the inverse permutation of the array it is stored in).
    if attrs.get("perm_a"):
        a = np.transpose(a, attrs["perm_a"])
    if attrs.get("perm_b"):
        b = np.transpose(b, attrs["perm_b"])
    if attrs.get("perm_y"):
        y = np.transpose(y, np.argsort(attrs["perm_y"]))
    # Transposed views cost nothing: numpy hands BLAS the transpose flag.
    if attrs.get("transpose_a"):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    if y.dtype == np.float16:
        # numpy has no float16 BLAS (its loop is ~100x slower); compute in float32.
        np.copyto(y, np.matmul(a.astype(np.float32), b.astype(np.float32)), casting="unsafe")
    else:
        np.matmul(a, b, out=y)
    residual = bool(attrs.get("residual"))
    if len(ins) - residual == 3:
        np.add(y, ins[2], out=y)
    if residual:
        np.add(y, ins[-1], out=y)
    activate(y, attrs)
