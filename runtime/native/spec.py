"""Instruction -> native spec: what the oneDNN engine runs, and what it leaves to numpy.

`encode` turns one validated instruction (docs/isa.md) into the flat list of int64s
(and the few floats) that engine.cc's `ne_add` reads, or returns None when the native
engine does not implement that instruction with those dtypes and attributes; the
instruction then runs on the numpy reference kernel inside the same program (today no
admitted combination does: runtime/native/coverage.py measures it). The codes below are
engine.cc's enums; tests/runtime/test_native_codes.py holds the two to each other.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..isa import ITEMSIZE, MATMUL_LIKE, SWAPPED, WINDOWED, elements, flops

OP_CONV, OP_MATMUL, OP_POOL, OP_ELTWISE, OP_BINARY = 1, 2, 3, 4, 5
OP_SOFTMAX, OP_REDUCE, OP_CONCAT, OP_TRANSPOSE, OP_REORDER = 6, 7, 8, 9, 10
OP_LAYER_NORM = 11
# Loops of engine.cc's own, for what oneDNN has no (accurate enough) primitive for.
# (12, 13 and 19 were float32/int32-only element-wise loops, 18 and 27 float32 log-softmax
# and 26 int32/bool reductions: each now the one OP_G_* loop of its kind, below.)
OP_SELECT, OP_GATHER, OP_STRIDED_COPY, OP_PAD = 14, 15, 16, 17
OP_ARGMINMAX, OP_CUMULATIVE, OP_ONE_HOT, OP_TOP_K, OP_MIRROR_PAD, OP_RESIZE = 20, 21, 22, 23, 24, 25
OP_CONV3D, OP_POOL3D = 28, 29
OP_MASKED_SOFTMAX = 30  # select, softmax over the last axis, select: one loop
OP_ALIAS = 60  # a reshape onto its input's own bytes (cc/memory.py): no work

# int64, float64 and int16 have no oneDNN 3.2 type: only engine.cc's own loops take them.
DTYPES = {"float32": 0, "bfloat16": 1, "uint8": 2, "int32": 3, "int8": 4, "float16": 5,
          "int64": 6, "float64": 7, "int16": 8, "bool": 9}

E_RELU, E_CLIP, E_ELU, E_LOGISTIC, E_TANH, E_EXP = 1, 2, 3, 4, 5, 7
E_SQRT, E_SQUARE, E_ABS, E_LINEAR, E_POW, E_GELU_TANH, E_GELU_ERF = 9, 10, 11, 12, 13, 15, 16
E_SWISH, E_HARDSWISH, E_HARDSIGMOID = 17, 18, 19

# TF function -> oneDNN element-wise chain [(code, alpha, beta)]; `alpha` in the
# attributes replaces the first alpha where the function takes one (leaky_relu).
# Not oneDNN's: log (its log is off by up to 3e-6 absolute near 1) and softplus (its
# soft_relu loses TF's relative accuracy for large |x|); erf, erfc, floor, sign and the
# rounding functions have no oneDNN counterpart. Those run on engine.cc's OP_G_UNARY loop
# (libm), as every function does on dtypes oneDNN lacks.
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772, 1.0507009873554805
ELTWISE: dict[str, list[tuple[int, float, float]]] = {
    "relu": [(E_RELU, 0.0, 0.0)],
    "relu6": [(E_CLIP, 0.0, 6.0)],
    "leaky_relu": [(E_RELU, 0.2, 0.0)],
    "elu": [(E_ELU, 1.0, 0.0)],
    "selu": [(E_ELU, _SELU_ALPHA, 0.0), (E_LINEAR, _SELU_SCALE, 0.0)],
    "sigmoid": [(E_LOGISTIC, 0.0, 0.0)],
    "tanh": [(E_TANH, 0.0, 0.0)],
    "exp": [(E_EXP, 0.0, 0.0)],
    "gelu": [(E_GELU_ERF, 0.0, 0.0)],
    "gelu_tanh": [(E_GELU_TANH, 0.0, 0.0)],
    "swish": [(E_SWISH, 1.0, 0.0)],  # x * sigmoid(alpha * x)
    "hard_sigmoid": [(E_HARDSIGMOID, 1 / 6, 0.5)],  # max(0, min(1, alpha * x + beta))
    "hard_swish": [(E_HARDSWISH, 1 / 6, 0.5)],  # x * hard_sigmoid(x)
    "sqrt": [(E_SQRT, 0.0, 0.0)],
    "rsqrt": [(E_POW, 1.0, -0.5)],
    "square": [(E_SQUARE, 0.0, 0.0)],
    "abs": [(E_ABS, 0.0, 0.0)],
    "neg": [(E_LINEAR, -1.0, 0.0)],
    "reciprocal": [(E_POW, 1.0, -1.0)],
}

# binary fn -> engine.cc's LoopFn: OP_G_BINARY's codes, for what oneDNN's binary lacks
# (pow, the floor divisions, integer and bool operands, both operands broadcasting).
LOOP = {"add": 1, "sub": 2, "mul": 3, "div": 4, "maximum": 5, "minimum": 6, "greater": 7,
        "greater_equal": 8, "less": 9, "less_equal": 10, "equal": 11, "not_equal": 12,
        "pow": 13, "floor_div": 14, "floor_mod": 15, "logical_and": 16, "logical_or": 17,
        "squared_difference": 18}
_LOGICAL = frozenset({"logical_and", "logical_or"})
_BOOL_LOOP = _LOGICAL | {"equal", "not_equal"}  # what the loop computes on bool operands
_ITEMSIZE = ITEMSIZE

BINARY = {"add": 1, "sub": 2, "mul": 3, "div": 4, "maximum": 5, "minimum": 6, "greater": 7,
          "greater_equal": 8, "less": 9, "less_equal": 10, "equal": 11, "not_equal": 12}
REDUCE = {"sum": 1, "mean": 2, "max": 3, "min": 4, "prod": 5}

# engine_any_dtype.cc's loops: what oneDNN's primitives above leave out. Binary
# functions and reductions by LOOP's and REDUCE's codes; unary functions by G_UNARY
# (engine.cc's GUnary).
OP_G_UNARY, OP_G_BINARY, OP_G_REDUCE, OP_G_CAST, OP_G_POOL = 50, 51, 52, 53, 54
OP_G_SOFTMAX, OP_G_LAYER_NORM, OP_G_CONCAT, OP_G_MATMUL, OP_G_CONV = 55, 56, 57, 58, 59
G_UNARY = {fn: i + 1 for i, fn in enumerate(
    ("relu", "relu6", "leaky_relu", "elu", "selu", "sigmoid", "tanh", "softplus", "gelu",
     "gelu_tanh", "erf", "erfc", "exp", "log", "sqrt", "rsqrt", "square", "abs", "neg",
     "reciprocal", "floor", "sign", "round_bf16", "round_fp16", "sin", "cos", "tan", "atan",
     "log1p", "expm1", "round", "swish", "logical_not", "hard_sigmoid", "hard_swish"))}
G_UNARY_INT = frozenset({"abs", "neg", "sign", "square", "relu", "relu6"})
_INTS = ("int8", "uint8", "int16", "int32", "int64")
_G_FLOATS = ("float32", "float64", "float16", "bfloat16")
_ONEDNN_FLOATS = ("float32", "bfloat16", "float16")  # what oneDNN's matmul and conv read
# bool's reductions: OP_G_REDUCE's other functions (engine.cc's Red, after REDUCE's)
REDUCE_LOGICAL = {"any": 6, "all": 7}
_MOVABLE = ("float32", "int32", "uint8", "bool", "int8", "bfloat16", "float16")


@dataclass(frozen=True)
class Ref:
    """Where a value lives for the engine: slot, byte offset, dtype name, shape."""

    slot: int
    offset: int
    dtype: str
    shape: tuple[int, ...]
    blocked: bool = False  # kept channel-blocked (nChw16c) between windowed instructions
    # bfloat16 that only this program's native instructions write and read: kept in
    # float32 by the engine where the CPU has no bfloat16 kernels (engine.cc widened_slot)
    widenable: bool = False

    def encode(self, shape: Sequence[int] | None = None) -> list[int]:
        dims = list(self.shape if shape is None else shape)
        flags = int(self.blocked) | 2 * int(self.widenable)
        return [self.slot, self.offset, DTYPES[self.dtype], flags, len(dims), *dims]


def _chain(fn: str, alpha: float) -> list[tuple[int, float, float]] | None:
    chain = ELTWISE.get(fn)
    if chain is None:
        return None
    if fn == "leaky_relu":
        return [(E_RELU, float(alpha), 0.0)]
    return chain


def _epilogue(chain: list[tuple[int, float, float]], ints: list[int], floats: list[float]) -> None:
    ints.append(len(chain))
    for code, alpha, beta in chain:
        ints.append(code)
        floats += [alpha, beta]


def _activation(attrs: dict) -> list[tuple[int, float, float]] | None:
    fn = attrs.get("activation", "none") or "none"
    return [] if fn == "none" else _chain(fn, attrs.get("alpha", 0.2))


def _padded(shape: Sequence[int], rank: int) -> list[int]:
    return [1] * (rank - len(shape)) + list(shape)


def encode(kind: str, attrs: dict, ins: Sequence[Ref], outs: Sequence[Ref],
           constant: Sequence[bool]) -> tuple[list[int], list[float]] | None:
    """The engine spec of one instruction, or None to run it on numpy."""
    if kind in _excluded():
        return None
    fn = _ENCODERS.get(kind)
    if fn is None or any(r.dtype not in DTYPES for r in (*ins, *outs)):
        return None
    if kind not in WINDOWED and any(r.blocked for r in (*ins, *outs)):
        return None  # (the loader never asks: only windowed kinds share blocked values)
    if any(0 in r.shape for r in (*ins, *outs)):
        return None  # empty tensors: nothing to compute, numpy handles the shapes
    return fn(attrs, list(ins), list(outs), list(constant))


def _excluded() -> set[str]:
    """NEURONISH_NATIVE_EXCLUDE=kind[,kind...]: leave these kinds to the numpy reference
    kernels (to bisect a wrong number to one native kernel, or to test a program that
    mixes both engines now that every instruction has a native kernel)."""
    return {k.strip() for k in os.environ.get("NEURONISH_NATIVE_EXCLUDE", "").split(",")
            if k.strip()}


def _io_ok(x: str, y: str, compute: str) -> bool:
    """A matmul-like instruction's activation dtypes: float32, or bfloat16 in and/or out
    when it computes in bfloat16 (cc/passes/dtypes.py keeps such values bf16)."""
    allowed = ("float32", compute)
    return x in allowed and y in allowed


def _compute(attrs: dict, x: Ref, w: Ref) -> str:
    """The dtype a matrix unit reads the operands in: the `compute` attribute, or, for
    16-bit float operands computed "in float32", their own dtype (exact in float32: the
    products and float32 sums are the same)."""
    compute = attrs.get("compute", "float32")
    if compute == "float32" and x.dtype in ("float16", "bfloat16") and w.dtype == x.dtype:
        return x.dtype
    return compute


def _conv(attrs: dict, ins: list[Ref], outs: list[Ref], const: list[bool],
          depthwise: bool) -> tuple[list[int], list[float]] | None:
    x, w, y = ins[0], ins[1], outs[0]
    residual = bool(attrs.get("residual"))
    has_bias = len(ins) - residual == 3
    compute = _compute(attrs, x, w)
    if x.dtype not in _ONEDNN_FLOATS:
        return _generic_conv(attrs, ins, y, depthwise)
    if not _io_ok(x.dtype, y.dtype, compute) or w.dtype != compute:
        return None  # (computed weights in reduced precision: left to numpy)
    act = _activation(attrs)
    if act is None:  # (an epilogue with no oneDNN post-op: the direct loop, in float32 only)
        return _generic_conv(attrs, ins, y, depthwise) if x.dtype == compute == "float32" \
            else None
    ints = [OP_CONV, int(has_bias), int(residual), int(attrs.get("groups", 1)), int(depthwise),
            DTYPES[compute], int(const[1])]
    ints += x.encode() + w.encode()
    if has_bias:
        ints += ins[2].encode()
    if residual:
        ints += ins[-1].encode()
    ints += y.encode()
    ints += [*attrs["strides"], *attrs["dilations"], *attrs["pads"]]
    floats: list[float] = []
    _epilogue(act, ints, floats)
    return ints, floats


def _matmul(attrs: dict, ins: list[Ref], outs: list[Ref],
            const: list[bool]) -> tuple[list[int], list[float]] | None:
    a, b, y = ins[0], ins[1], outs[0]
    compute = _compute(attrs, a, b)
    if a.dtype not in _ONEDNN_FLOATS:
        return _generic_matmul(attrs, ins, y)
    if not _io_ok(a.dtype, y.dtype, compute) or b.dtype not in ("float32", compute):
        return None
    act = _activation(attrs)
    rank = len(y.shape)
    if act is None:  # (an epilogue with no oneDNN post-op: the loop, in float32 only)
        return _generic_matmul(attrs, ins, y) if a.dtype == b.dtype == compute == "float32" \
            else None
    if rank > 6:  # (oneDNN's matmul takes rank <= 6)
        return _generic_matmul(attrs, ins, y)
    residual = bool(attrs.get("residual"))
    has_bias = len(ins) - residual == 3
    # Each operand and the result as the product sees it (perm_a/perm_b/perm_y applied),
    # with the element strides that read it where it is stored: no transpose copies.
    (shape_a, step_a), (shape_b, step_b) = (_view(r, attrs.get(p) or [], rank)
                                            for r, p in ((a, "perm_a"), (b, "perm_b")))
    perm_y = attrs.get("perm_y") or []
    shape_y, step_y = _view(y, [int(i) for i in _inverse(perm_y)], rank)
    if rank > 2 and all(d == 1 for d in shape_b[:-2]) and not attrs.get("transpose_a") \
            and not perm_y and not attrs.get("perm_a") and shape_a[:-2] == shape_y[:-2]:
        # One weight matrix for every leading index ([B, S, K] @ [K, N]): one [B·S, K]
        # product, which oneDNN blocks far better than B small ones.
        rows = math.prod(shape_a[:-1])
        shape_a, shape_b, shape_y = [rows, shape_a[-1]], shape_b[-2:], [rows, shape_y[-1]]
        step_a, step_b, step_y = step_a[-2:], step_b[-2:], step_y[-2:]
    ints = [OP_MATMUL, int(has_bias), int(bool(attrs.get("transpose_a"))),
            int(bool(attrs.get("transpose_b"))), DTYPES[compute], int(const[1]), int(residual)]
    ints += a.encode(shape_a) + step_a + b.encode(shape_b) + step_b
    if has_bias:
        ints += ins[2].encode()
    if residual:
        ints += ins[-1].encode(shape_y)
    ints += y.encode(shape_y) + step_y
    floats: list[float] = []
    _epilogue(act, ints, floats)
    return ints, floats


def _bits(value: float) -> int:
    """A double's bits as an int64 (spec floats are float32: too few for float64)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def _act_code(attrs: dict) -> int | None:
    fn = attrs.get("activation", "none") or "none"
    return 0 if fn == "none" else G_UNARY.get(fn)


def _generic_matmul(attrs: dict, ins: list[Ref], y: Ref) -> tuple[list[int], list[float]] | None:
    if attrs.get("perm_a") or attrs.get("perm_b") or attrs.get("perm_y"):
        return None  # the loop reads dense operands only; numpy reads through the perms
    a, b = ins[0], ins[1]
    act = _act_code(attrs)
    if act is None:
        return None
    residual = bool(attrs.get("residual"))
    has_bias = len(ins) - residual == 3
    ta, tb = bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b"))
    m, n = y.shape[-2], y.shape[-1]
    k = a.shape[-2] if ta else a.shape[-1]
    batch_dims = list(y.shape[:-2])
    pa, pb = _padded(a.shape[:-2], len(batch_dims)), _padded(b.shape[:-2], len(batch_dims))
    offsets_a, offsets_b = [], []
    for index in itertools.product(*[range(d) for d in batch_dims]):
        oa = ob = 0
        for i, d_a, d_b in zip(index, pa, pb):
            oa, ob = oa * d_a + (i if d_a != 1 else 0), ob * d_b + (i if d_b != 1 else 0)
        offsets_a.append(oa * m * k)
        offsets_b.append(ob * k * n)
    ints = [OP_G_MATMUL, len(offsets_a), m, n, k, int(ta), int(tb), int(has_bias),
            int(residual), act, _bits(attrs.get("alpha", 0.2)), *offsets_a, *offsets_b]
    for r in ins:
        ints += r.encode([elements(r.shape)])
    return ints + y.encode([elements(y.shape)]), []


def _generic_conv(attrs: dict, ins: list[Ref], y: Ref, depthwise: bool, dims: int = 2
                  ) -> tuple[list[int], list[float]] | None:
    """conv2d, depthwise_conv2d and conv3d on engine_any_dtype.cc's direct loop (float64,
    integers; float32 when the epilogue has no oneDNN post-op)."""
    x, w = ins[0], ins[1]
    act = _act_code(attrs)
    if act is None or any(r.blocked for r in (x, y)):
        return None
    residual = bool(attrs.get("residual"))
    has_bias = len(ins) - residual == 3
    lift = [1] * (3 - dims)  # a 2-D window is a 3-D one of depth 1
    n, *spatial, c = x.shape
    *kernel, ci, o = w.shape
    groups = c if depthwise else attrs.get("groups", 1)
    pads = [0, 0] * (3 - dims) + list(attrs["pads"])
    ints = [OP_G_CONV, n, *lift, *spatial, c, *lift, *kernel, 1 if depthwise else ci, o,
            *lift, *y.shape[1:-1], groups, int(depthwise), o if depthwise else 1,
            *lift, *attrs["strides"], *lift, *attrs["dilations"], *pads[0::2],
            int(has_bias), int(residual), act, _bits(attrs.get("alpha", 0.2))]
    for r in ins:
        ints += r.encode([elements(r.shape)])
    return ints + y.encode([elements(y.shape)]), []


def _generic_pool(attrs: dict, x: Ref, y: Ref, dims: int = 2
                  ) -> tuple[list[int], list[float]] | None:
    if x.dtype == "bool" or x.blocked or y.blocked:
        return None
    lift = [1] * (3 - dims)
    n, *spatial, c = x.shape
    pads = [0, 0] * (3 - dims) + list(attrs["pads"])
    return [OP_G_POOL, int(attrs["mode"] == "max"), n, *lift, *spatial, c, *lift,
            *y.shape[1:-1], *lift, *attrs["ksize"], *lift, *attrs["strides"], *pads[0::2],
            *x.encode([elements(x.shape)]), *y.encode([elements(y.shape)])], []


def _inverse(perm: Sequence[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _view(r: Ref, perm: Sequence[int], rank: int) -> tuple[list[int], list[int]]:
    """`r` read as transpose(r, perm) ([]: as it is), padded with leading 1s to `rank`:
    its dims and element strides."""
    dense = _dense_strides(r.shape)
    perm = list(perm) or list(range(len(r.shape)))
    dims = [r.shape[p] for p in perm]
    steps = [dense[p] for p in perm]
    pad = rank - len(dims)
    return [1] * pad + dims, [elements(r.shape)] * pad + steps


def _pool(attrs: dict, ins: list[Ref], outs: list[Ref],
          const: list[bool]) -> tuple[list[int], list[float]] | None:
    if ins[0].dtype not in ("float32", "bfloat16", "float16"):
        return _generic_pool(attrs, ins[0], outs[0])
    ints = [OP_POOL, int(attrs["mode"] == "max"), *ins[0].encode(), *outs[0].encode(),
            *attrs["ksize"], *attrs["strides"], *attrs["pads"]]
    return ints, []


def _unary(attrs: dict, ins: list[Ref], outs: list[Ref],
           const: list[bool]) -> tuple[list[int], list[float]] | None:
    fn, x = attrs["fn"], ins[0]
    chain = _chain(fn, attrs.get("alpha", 0.2))
    if chain is None or x.dtype not in _ONEDNN_FLOATS or len(x.shape) > 6:
        return _generic_unary(fn, attrs, x, outs[0])
    ints = [OP_ELTWISE, *x.encode(), *outs[0].encode()]
    floats: list[float] = []
    _epilogue(chain, ints, floats)
    return ints, floats


def _generic_unary(fn: str, attrs: dict, x: Ref, y: Ref) -> tuple[list[int], list[float]] | None:
    if fn == "logical_not":
        takes = x.dtype == "bool"
    else:
        takes = x.dtype in _G_FLOATS or (x.dtype in _INTS and fn in G_UNARY_INT)
    if fn not in G_UNARY or not takes:
        return None
    size = [elements(x.shape)]
    return [OP_G_UNARY, G_UNARY[fn], _bits(attrs.get("alpha", 0.2)), *x.encode(size),
            *y.encode(size)], []


def _binary(attrs: dict, ins: list[Ref], outs: list[Ref],
            const: list[bool]) -> tuple[list[int], list[float]] | None:
    fn, (a, b), y = attrs["fn"], ins[:2], outs[0]
    c = ins[2] if len(ins) == 3 else None  # added before the activation: a binary post-op
    post: list[tuple[int, float, float]] = []
    if fn == "squared_difference":
        fn, post = "sub", [(E_SQUARE, 0.0, 0.0)]
    act = _activation(attrs)
    if act is None:
        return None
    post += act
    rank = max(len(y.shape), 1)
    shape_y = _padded(y.shape, rank)
    sa, sb = _padded(a.shape, rank), _padded(b.shape, rank)
    onednn = fn in BINARY and a.dtype in ("float32", "bfloat16") and len(y.shape) <= 6 and (
        sa == shape_y or (sb == shape_y and fn in SWAPPED))
    if not onednn:  # (oneDNN's binary: float32, only the second operand broadcasting)
        if act or c is not None:
            return None  # (the loops have no epilogue)
        fn = attrs["fn"]
        takes = fn in _BOOL_LOOP if a.dtype == "bool" else fn not in _LOGICAL
        if rank > 8 or fn not in LOOP or not takes:
            return None
        return [OP_G_BINARY, LOOP[fn], *a.encode(sa), *b.encode(sb), *y.encode(shape_y)], []
    if sa != shape_y:
        a, b, sa, sb, fn = b, a, sb, sa, SWAPPED[fn]
    ints = [OP_BINARY, BINARY[fn], int(c is not None), *a.encode(sa), *b.encode(sb)]
    if c is not None:
        ints += c.encode(_padded(c.shape, rank))
    ints += y.encode(shape_y)
    floats: list[float] = []
    _epilogue(post, ints, floats)
    return ints, floats


def _softmax(attrs: dict, ins: list[Ref], outs: list[Ref],
             const: list[bool]) -> tuple[list[int], list[float]] | None:
    x = ins[0]
    if x.dtype == "bfloat16" and outs[0].dtype == x.dtype and not attrs.get("log") \
            and x.shape and len(x.shape) <= 6:  # (oneDNN computes in f32, rounds once)
        return [OP_SOFTMAX, attrs["axis"], 0, *x.encode(), *outs[0].encode()], []
    if not x.shape:
        return None
    # Log-softmax is never oneDNN's (off by up to 3e-6 absolute: its log), but our one loop.
    if x.dtype != "float32" or len(x.shape) > 6 or attrs.get("log"):
        flat = [elements(x.shape)]
        return [OP_G_SOFTMAX, int(bool(attrs.get("log"))), *_around(x.shape, attrs["axis"]),
                *x.encode(flat), *outs[0].encode(flat)], []
    return [OP_SOFTMAX, attrs["axis"], 0, *ins[0].encode(),
            *outs[0].encode()], []



def _masked_softmax(attrs: dict, ins: list[Ref], outs: list[Ref],
                    const: list[bool]) -> tuple[list[int], list[float]] | None:
    # ints: x, mask (padded to x's rank), y; floats: fill, masked.
    x, mask = ins
    if x.dtype not in ("float32", "bfloat16") or outs[0].dtype != x.dtype or not x.shape \
            or len(x.shape) > 8:
        return None
    return [OP_MASKED_SOFTMAX, *x.encode(), *mask.encode(_padded(mask.shape, len(x.shape))),
            *outs[0].encode()], [float(attrs["fill"]), float(attrs["masked"])]


def _reduce(attrs: dict, ins: list[Ref], outs: list[Ref],
            const: list[bool]) -> tuple[list[int], list[float]] | None:
    x = ins[0]
    axes = set(attrs["axes"])
    if not axes or not x.shape:
        return _flat_copy(attrs, ins, outs, const)
    if attrs["fn"] not in REDUCE or x.dtype not in ("float32", "bfloat16") or len(x.shape) > 6:
        return _generic_reduce(attrs, x, outs[0])
    kept = [1 if i in axes else d for i, d in enumerate(x.shape)]
    if len(x.shape) == 4 and axes == {1, 2} and attrs["fn"] in ("mean", "max"):
        # A global pool over NHWC's H and W: oneDNN's reduction has only a reference
        # kernel for that layout (~10x slower than its pooling).
        _, h, w, _ = x.shape
        return [OP_POOL, int(attrs["fn"] == "max"), *x.encode(), *outs[0].encode(kept),
                h, w, 1, 1, 0, 0, 0, 0], []
    if x.dtype != "float32":
        return _generic_reduce(attrs, x, outs[0])
    return [OP_REDUCE, REDUCE[attrs["fn"]], *x.encode(), *outs[0].encode(kept)], []


def _generic_reduce(attrs: dict, x: Ref, y: Ref) -> tuple[list[int], list[float]] | None:
    axes = set(attrs["axes"])
    fns = REDUCE_LOGICAL if x.dtype == "bool" else REDUCE
    if attrs["fn"] not in fns or y.dtype != x.dtype:
        return None
    kept = [1 if i in axes else d for i, d in enumerate(x.shape)]
    return [OP_G_REDUCE, fns[attrs["fn"]], *x.encode(), *y.encode(kept),
            *[int(i in axes) for i in range(len(x.shape))]], []


def _layer_norm(attrs: dict, ins: list[Ref], outs: list[Ref],
                const: list[bool]) -> tuple[list[int], list[float]] | None:
    x, scale, shift = ins
    if x.blocked:
        return None
    if x.dtype != "float32":
        flat = [elements(x.shape)]
        return [OP_G_LAYER_NORM, elements(x.shape[:-1]), x.shape[-1],
                _bits(attrs["epsilon"]), *x.encode(flat), *scale.encode(), *shift.encode(),
                *outs[0].encode(flat)], []
    flat = [elements(x.shape[:-1]), x.shape[-1]]  # oneDNN normalizes the last axis of a 2-5D tensor
    if 0 in flat:
        return None
    return [OP_LAYER_NORM, *x.encode(flat), *scale.encode(), *shift.encode(),
            *outs[0].encode(flat)], [float(attrs["epsilon"])]


def _concat(attrs: dict, ins: list[Ref], outs: list[Ref],
            const: list[bool]) -> tuple[list[int], list[float]] | None:
    y = outs[0]
    if not y.shape:
        return None
    if y.dtype not in _MOVABLE or len(y.shape) > 6:
        axis = attrs["axis"]
        ints = [OP_G_CONCAT, len(ins), elements(y.shape[:axis])]
        for r in ins:
            ints += [elements(r.shape[axis:]), *r.encode([elements(r.shape)])]
        return ints + y.encode([elements(y.shape)]), []
    ints = [OP_CONCAT, attrs["axis"], len(ins)]
    for r in ins:
        ints += r.encode()
    return ints + y.encode(), []


def _transpose(attrs: dict, ins: list[Ref], outs: list[Ref],
               const: list[bool]) -> tuple[list[int], list[float]] | None:
    x = ins[0]
    if (x.dtype not in _MOVABLE or len(x.shape) > 6) and x.shape:  # (oneDNN: rank <= 6)
        strides = _dense_strides(x.shape)
        return _strided(x, outs[0], 0, [x.shape[p] for p in attrs["perm"]],
                        [strides[p] for p in attrs["perm"]])
    if not x.shape or len(x.shape) > 6:
        return None
    return [OP_TRANSPOSE, *ins[0].encode(), *outs[0].encode(), *attrs["perm"]], []


def _flat_copy(attrs: dict, ins: list[Ref], outs: list[Ref],
               const: list[bool]) -> tuple[list[int], list[float]] | None:
    """copy and reshape: the same bytes in a new place."""
    x, y = ins[0], outs[0]
    if x.dtype != y.dtype:
        return None
    if (x.slot, x.offset) == (y.slot, y.offset):
        return [OP_ALIAS], []  # the memory plan made y x's bytes: nothing to copy
    size = elements(x.shape)
    if x.dtype not in _MOVABLE:
        return _strided(x, y, 0, [size], [1])
    return [OP_REORDER, *x.encode([size]), *y.encode([size])], []


def _cast(attrs: dict, ins: list[Ref], outs: list[Ref],
          const: list[bool]) -> tuple[list[int], list[float]] | None:
    # Only conversions where oneDNN's rounding is TF's: integers and bools to float32
    # (float -> int truncates in TF, oneDNN rounds), float32 <-> bfloat16 and float16
    # (to nearest even, as TF).
    src, dst = ins[0].dtype, outs[0].dtype
    ok = (src in ("int32", "int8", "uint8", "bool") and dst == "float32") or \
        {src, dst} in ({"float32", "bfloat16"}, {"float32", "float16"})
    if ok and ins[0].shape and len(ins[0].shape) <= 6:
        return [OP_REORDER, *ins[0].encode(), *outs[0].encode()], []
    if src == dst:
        return _flat_copy(attrs, ins, outs, const)
    size = [elements(ins[0].shape)]
    return [OP_G_CAST, *ins[0].encode(size), *outs[0].encode(size)], []


def _dense_strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return strides[::-1]


def _strided(x: Ref, y: Ref, start: int, dims: Sequence[int], strides: Sequence[int]
             ) -> tuple[list[int], list[float]] | None:
    """y = the view of x at element `start` with these dims and element strides."""
    if x.dtype not in _ITEMSIZE or x.dtype != y.dtype or not 1 <= len(dims) <= 12:
        return None
    ints = [OP_STRIDED_COPY, *x.encode([elements(x.shape)]), *y.encode([elements(y.shape)]),
            len(dims), start]
    for d, st in zip(dims, strides):
        ints += [d, st]
    return ints, []


def _strided_slice(attrs: dict, ins: list[Ref], outs: list[Ref],
                   const: list[bool]) -> tuple[list[int], list[float]] | None:
    x = ins[0]
    if not x.shape:
        return None
    dense = _dense_strides(x.shape)
    start, dims, strides = 0, [], []
    for d, b, e, st, k in zip(x.shape, attrs["begin"], attrs["end"], attrs["strides"], dense):
        first, stop, step = slice(b, e, st).indices(d)
        dims.append(len(range(first, stop, step)))
        start += first * k
        strides.append(step * k)
    return _strided(x, outs[0], start, dims, strides)


def _broadcast_to(attrs: dict, ins: list[Ref], outs: list[Ref],
                  const: list[bool]) -> tuple[list[int], list[float]] | None:
    x, y = ins[0], outs[0]
    if not y.shape:
        return None
    shape_x = _padded(x.shape, len(y.shape))
    dense = _dense_strides(shape_x)
    strides = [0 if dx == 1 and dy != 1 else k for dx, dy, k in zip(shape_x, y.shape, dense)]
    return _strided(x, y, 0, list(y.shape), strides)


def _tile(attrs: dict, ins: list[Ref], outs: list[Ref],
          const: list[bool]) -> tuple[list[int], list[float]] | None:
    # y viewed as [m0, d0, m1, d1, ...]: x repeated (stride 0) along each multiple's axis.
    x = ins[0]
    dims: list[int] = []
    strides: list[int] = []
    for d, m, k in zip(x.shape, attrs["multiples"], _dense_strides(x.shape)):
        dims += [m, d]
        strides += [0, k]
    return _strided(x, outs[0], 0, dims, strides) if dims else None


def _pad(attrs: dict, ins: list[Ref], outs: list[Ref],
         const: list[bool]) -> tuple[list[int], list[float]] | None:
    x, y = ins[0], outs[0]
    if attrs.get("mode", "constant") != "constant" or x.dtype not in _ITEMSIZE \
            or not x.shape:
        return None
    fill = _scalar_bits(attrs.get("value", 0), x.dtype)
    return [OP_PAD, *x.encode(), *y.encode(), fill,
            *[before for before, _ in attrs["paddings"]]], []


def _select(attrs: dict, ins: list[Ref], outs: list[Ref],
            const: list[bool]) -> tuple[list[int], list[float]] | None:
    c, a, b = ins
    y = outs[0]
    rank = max(len(y.shape), 1)
    if c.dtype != "bool" or a.dtype not in _ITEMSIZE or rank > 8:
        return None
    return [OP_SELECT, *[v for r in (c, a, b, y) for v in r.encode(_padded(r.shape, rank))]
            ], []


def _gather(attrs: dict, ins: list[Ref], outs: list[Ref],
            const: list[bool]) -> tuple[list[int], list[float]] | None:
    params, indices = ins
    axis, bd = attrs["axis"], attrs.get("batch_dims", 0)
    if indices.dtype not in ("int32", "int64") or params.dtype not in _ITEMSIZE \
            or not params.shape:
        return None
    batch = elements(params.shape[:bd])
    outer = elements(params.shape[bd:axis])
    inner = elements(params.shape[axis + 1:])
    return [OP_GATHER, batch, outer, params.shape[axis], inner,
            *params.encode([elements(params.shape)]),
            *indices.encode([max(elements(indices.shape), 1)]),
            *outs[0].encode([elements(outs[0].shape)])], []


def _scalar_bits(value: object, dtype: str) -> int:
    """A scalar attribute's bytes in `dtype`, as the int64 the engine copies them from."""
    import ml_dtypes  # noqa: F401 (numpy's "bfloat16")
    import numpy as np

    raw = np.zeros(8, np.uint8)
    v = np.asarray(value).astype(dtype)
    raw[:v.itemsize] = np.frombuffer(v.tobytes(), np.uint8)
    return int(raw.view(np.int64)[0])


def _around(shape: Sequence[int], axis: int) -> list[int]:
    """[outer, n, inner]: the dims before `axis`, it, and those after, multiplied out."""
    return [elements(shape[:axis]), shape[axis], elements(shape[axis + 1:])]


def _argminmax(attrs: dict, ins: list[Ref], outs: list[Ref],
               const: list[bool]) -> tuple[list[int], list[float]] | None:
    x, y = ins[0], outs[0]
    if y.dtype not in ("int32", "int64") or not x.shape:
        return None
    return [OP_ARGMINMAX, int(attrs["fn"] == "argmin"), *_around(x.shape, attrs["axis"]),
            *x.encode([elements(x.shape)]), *y.encode([max(elements(y.shape), 1)])], []


def _cumulative(attrs: dict, ins: list[Ref], outs: list[Ref],
                const: list[bool]) -> tuple[list[int], list[float]] | None:
    x, y = ins[0], outs[0]
    if x.dtype == "bool" or y.dtype != x.dtype or not x.shape:
        return None
    flat = [elements(x.shape)]
    return [OP_CUMULATIVE, int(attrs["fn"] == "prod"), int(bool(attrs.get("exclusive"))),
            int(bool(attrs.get("reverse"))), *_around(x.shape, attrs["axis"]),
            *x.encode(flat), *y.encode(flat)], []


def _one_hot(attrs: dict, ins: list[Ref], outs: list[Ref],
             const: list[bool]) -> tuple[list[int], list[float]] | None:
    idx, y = ins[0], outs[0]
    if idx.dtype not in _INTS or y.dtype not in _ITEMSIZE:
        return None
    axis = attrs["axis"] if attrs["axis"] >= 0 else len(idx.shape)
    outer, inner = elements(idx.shape[:axis]), elements(idx.shape[axis:])
    return [OP_ONE_HOT, outer, attrs["depth"], inner, _scalar_bits(attrs["on_value"], y.dtype),
            _scalar_bits(attrs["off_value"], y.dtype), *idx.encode([max(outer * inner, 1)]),
            *y.encode([elements(y.shape)])], []


def _top_k(attrs: dict, ins: list[Ref], outs: list[Ref],
           const: list[bool]) -> tuple[list[int], list[float]] | None:
    x, y = ins[0], outs[0]
    if x.dtype == "bool" or not x.shape:
        return None
    n, k = x.shape[-1], attrs["k"]
    rows = elements(x.shape[:-1])
    return [OP_TOP_K, int(bool(attrs.get("indices"))), rows, n, k, *x.encode([rows * n]),
            *y.encode([rows * k])], []


def _mirror_pad(attrs: dict, ins: list[Ref], outs: list[Ref],
                const: list[bool]) -> tuple[list[int], list[float]] | None:
    x, y = ins[0], outs[0]
    if x.dtype not in _ITEMSIZE or not x.shape:
        return None
    return [OP_MIRROR_PAD, int(attrs["mode"] == "reflect"), *x.encode(), *y.encode(),
            *[before for before, _ in attrs["paddings"]]], []


def _pad_any(attrs: dict, ins: list[Ref], outs: list[Ref],
             const: list[bool]) -> tuple[list[int], list[float]] | None:
    if attrs.get("mode", "constant") == "constant":
        return _pad(attrs, ins, outs, const)
    return _mirror_pad(attrs, ins, outs, const)


def _resize(attrs: dict, ins: list[Ref], outs: list[Ref],
            const: list[bool]) -> tuple[list[int], list[float]] | None:
    # Source rows/columns and lerps from the reference kernel's own functions (TF's float32
    # arithmetic): the engine only interpolates, in TF's order.
    from ..kernels.image import _bilinear_weights, _nearest_index

    x, y = ins[0], outs[0]
    _, h, w, _ = x.shape
    oh, ow = attrs["size"]
    ac, hp = bool(attrs.get("align_corners")), bool(attrs.get("half_pixel_centers"))
    if attrs["mode"] == "nearest":
        if x.dtype not in _ITEMSIZE:
            return None
        ys, xs = _nearest_index(h, oh, ac, hp), _nearest_index(w, ow, ac, hp)
        return [OP_RESIZE, 0, *x.encode(), *y.encode(), *map(int, ys), *map(int, xs)], []
    if x.dtype == "bool":
        return None
    y_lo, y_hi, y_lerp = _bilinear_weights(h, oh, ac, hp)
    x_lo, x_hi, x_lerp = _bilinear_weights(w, ow, ac, hp)
    return ([OP_RESIZE, 1, *x.encode(), *y.encode(), *map(int, y_lo), *map(int, x_lo),
             *map(int, y_hi), *map(int, x_hi)], [*map(float, y_lerp), *map(float, x_lerp)])


def _conv3d(attrs: dict, ins: list[Ref], outs: list[Ref],
            const: list[bool]) -> tuple[list[int], list[float]] | None:
    x, w, y = ins[0], ins[1], outs[0]
    if x.dtype != "float32" or w.dtype != "float32" or y.dtype != "float32":
        return _generic_conv(attrs, ins, y, depthwise=False, dims=3)
    return [OP_CONV3D, int(const[1]), *x.encode(), *w.encode(), *y.encode(), *attrs["strides"],
            *attrs["dilations"], *attrs["pads"]], []


def _pool3d(attrs: dict, ins: list[Ref], outs: list[Ref],
            const: list[bool]) -> tuple[list[int], list[float]] | None:
    if ins[0].dtype != "float32":
        return _generic_pool(attrs, ins[0], outs[0], dims=3)
    return [OP_POOL3D, int(attrs["mode"] == "max"), *ins[0].encode(), *outs[0].encode(),
            *attrs["ksize"], *attrs["strides"], *attrs["pads"]], []


_ENCODERS = {
    "conv2d": lambda a, i, o, c: _conv(a, i, o, c, depthwise=False),
    "depthwise_conv2d": lambda a, i, o, c: _conv(a, i, o, c, depthwise=True),
    "matmul": _matmul,
    "pool": _pool,
    "unary": _unary,
    "binary": _binary,
    "softmax": _softmax,
    "masked_softmax": _masked_softmax,
    "reduce": _reduce,
    "layer_norm": _layer_norm,
    "concat": _concat,
    "transpose": _transpose,
    "copy": _flat_copy,
    "reshape": _flat_copy,
    "cast": _cast,
    "strided_slice": _strided_slice,
    "broadcast_to": _broadcast_to,
    "tile": _tile,
    "pad": _pad_any,
    "argminmax": _argminmax,
    "cumulative": _cumulative,
    "one_hot": _one_hot,
    "top_k": _top_k,
    "resize": _resize,
    "conv3d": _conv3d,
    "pool3d": _pool3d,
    "select": _select,
    "gather": _gather,
}


def _add_int8() -> None:
    from .spec_int8 import ENCODERS  # (imports this module: added once both exist)

    _ENCODERS.update(ENCODERS)


_add_int8()


# Below this much work (about flops; element counts x16 for data-parallel kinds) an
# instruction runs on the calling thread alone: a sleeping OpenMP team takes longer to
# wake (OMP_WAIT_POLICY=passive), and inside TensorFlow the other CPU is often busy,
# than such an instruction takes. Measured on 2 CPUs: the BERT-style encoder (every
# matmul below this) 2.64 -> 1.71 ms per call through its NeuronOp; MobileNetV2, whose
# small late layers then go single-threaded, ~33 -> ~36 ms per call (noisy).
SMALL_WORK = 12 << 20
# ...unless the program holds every CPU anyway (one of its instructions is above
# SMALL_WORK, so its team's width is all of them, runtime/host.py): then only an
# instruction below TINY_WORK runs alone. Its team spins between primitives
# (GOMP_SPINCOUNT, runtime/native/library.py), so the next primitive finds it awake: on
# 2 CPUs at real-time priority MobileNetV2 bf16 batch 8 ran 1.16x faster with this
# (its nine depthwise convolutions of 14x14 and 7x7 images had run on one thread),
# EfficientNetB0 bf16 1.06x. A program of small instructions only (the BERT-style
# encoder) keeps one thread and one CPU, so two of its calls still compute side by side.
TINY_WORK = 1 << 20


def is_wide(work_sizes: Iterable[int]) -> bool:
    """Whether a program of instructions of these `work_sizes` holds all its threads
    while it computes: one of them reaches SMALL_WORK."""
    return any(w >= SMALL_WORK for w in work_sizes)


def team_size(work_size: int, wide: bool, threads: int) -> int:
    """The threads an instruction of `work_size` runs on, in a program whose `threads`
    are all taken (`wide`: is_wide of its instructions) or not."""
    return threads if work_size >= (TINY_WORK if wide else SMALL_WORK) else 1


def work(kind: str, attrs: dict, ins: Sequence[Ref], outs: Sequence[Ref]) -> int:
    """A rough size of an instruction's work, to choose its thread count."""
    if kind in MATMUL_LIKE or kind in ("conv3d", "conv2d_int8", "matmul_int8"):
        return flops(kind, [r.shape for r in ins], [r.shape for r in outs], attrs)
    out = elements(outs[0].shape)
    return 16 * (out + sum(elements(r.shape) for r in ins))


def numpy_instructions(programs: Sequence[Sequence[object]], values: dict,
                       constants: dict) -> list[dict]:
    """The instructions of an executable's programs that the native engine will leave to
    the numpy reference kernels (as far as `encode` can tell before loading: oneDNN may
    still refuse a rare shape at load). Each: index, kind, fn, dtypes, TF nodes."""
    from ..isa import KINDS

    def ref(v: int) -> Ref:
        if v in constants:  # (an array: constants are not among the values)
            return Ref(0, 0, constants[v].dtype.name, tuple(constants[v].shape))
        return Ref(0, 0, values[v][1], tuple(values[v][0]))

    found = []
    index = 0
    for program in programs:
        for ins in program:
            attrs = KINDS[ins.kind].with_defaults(ins.attrs)
            ins_refs = [ref(v) for v in ins.inputs]
            out_refs = [ref(v) for v in ins.outputs]
            constant = [v in constants for v in ins.inputs]
            # (an instruction whose results are all empty computes nothing: the engines
            # skip it; one that reads an empty operand into a result with elements is the
            # numpy engine's, and the C runtime refuses it)
            if encode(ins.kind, attrs, ins_refs, out_refs, constant) is None \
                    and not all(0 in r.shape for r in out_refs):
                fn = attrs.get("fn") or attrs.get("to") or ""
                found.append({"index": index, "kind": ins.kind, "fn": fn,
                              "dtypes": [r.dtype for r in ins_refs],
                              "tf": list(ins.source)})
            index += 1
    return found
