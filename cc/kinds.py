"""Shape and dtype inference for each device instruction kind (see docs/isa.md).

One function per kind: `infer(input_types, attrs) -> output_types`. It raises
`NodeError` when the inputs cannot go together (the caller adds the TF node).
The runtime's kernel table (`neuronish.runtime.kernels.KERNELS`) has exactly the
same keys; `tests/test_isa.py` checks that.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import NodeError
from .ir import TensorType

InferFn = Callable[[list[TensorType], dict], list[TensorType]]
INFER: dict[str, InferFn] = {}


def kind(name: str) -> Callable[[InferFn], InferFn]:
    def register(fn: InferFn) -> InferFn:
        if name in INFER:
            raise RuntimeError(f"kind {name!r} registered twice")
        INFER[name] = fn
        return fn
    return register


def infer(name: str, types: list[TensorType], attrs: dict) -> list[TensorType]:
    if name not in INFER:
        raise NodeError(f"no device instruction {name!r} (compiler bug)")
    return INFER[name](types, attrs)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy/TF broadcasting of static shapes."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise NodeError(f"shapes {' and '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


# --- the inference rules ----------------------------------------------------
# (one per kind in docs/isa.md; kept in this one module so they read together)

_COMPARISONS = {"greater", "greater_equal", "less", "less_equal", "equal", "not_equal"}
_FLOAT = ("float16", "float32", "float64")


def _one(t: TensorType) -> list[TensorType]:
    return [t]


def _spatial(size: int, k: int, stride: int, dilation: int, before: int, after: int) -> int:
    effective = (k - 1) * dilation + 1
    out = (size + before + after - effective) // stride + 1
    if out <= 0:
        raise NodeError(f"window {effective} (dilated) is larger than the padded input {size}")
    return out


@kind("unary")
def _unary(t: list[TensorType], a: dict) -> list[TensorType]:
    return _one(t[0])


@kind("binary")
def _binary(t: list[TensorType], a: dict) -> list[TensorType]:
    if t[0].dtype != t[1].dtype:
        raise NodeError(f"operands have dtypes {t[0].dtype} and {t[1].dtype}; they must match")
    shape = broadcast_shapes(t[0].shape, t[1].shape)
    return [TensorType(shape, "bool" if a["fn"] in _COMPARISONS else t[0].dtype)]


@kind("select")
def _select(t: list[TensorType], a: dict) -> list[TensorType]:
    if t[0].dtype != "bool" or t[1].dtype != t[2].dtype:
        raise NodeError(f"select wants a bool condition and equal branch dtypes, got "
                        f"{t[0].dtype}, {t[1].dtype}, {t[2].dtype}")
    return [TensorType(broadcast_shapes(t[0].shape, t[1].shape, t[2].shape), t[1].dtype)]


@kind("cast")
def _cast(t: list[TensorType], a: dict) -> list[TensorType]:
    return [TensorType(t[0].shape, a["to"])]


@kind("matmul")
def _matmul(t: list[TensorType], a: dict) -> list[TensorType]:
    x, w = t[0], t[1]
    if len(x.shape) < 2 or len(w.shape) < 2:
        raise NodeError(f"matmul operands must have rank >= 2, got {x} and {w}")
    m, k = x.shape[-2:][::-1] if a.get("transpose_a") else x.shape[-2:]
    k2, n = w.shape[-2:][::-1] if a.get("transpose_b") else w.shape[-2:]
    if k != k2:
        raise NodeError(f"matmul inner dimensions differ: {x} and {w}")
    batch = broadcast_shapes(x.shape[:-2], w.shape[:-2])
    if len(t) == 3 and t[2].shape != (n,):
        raise NodeError(f"bias {t[2]} does not match the {n} output columns")
    return [TensorType(batch + (m, n), x.dtype)]


def _conv_like(t: list[TensorType], a: dict, depthwise: bool) -> list[TensorType]:
    x, w = t[0], t[1]
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise NodeError(f"conv wants NHWC input and a 4-D filter, got {x} and {w}")
    n, h, wd, c = x.shape
    kh, kw, ci, co = w.shape
    groups = a.get("groups", 1)
    if ci * groups != c or co % groups:
        raise NodeError(f"filter {w} in {groups} group(s) expects {ci * groups} input channels "
                        f"and a multiple of {groups} output channels; the input {x} has {c}")
    out_c = c * co if depthwise else co
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = a["strides"], a["dilations"], a["pads"]
    oh, ow = _spatial(h, kh, sh, dh, pt, pb), _spatial(wd, kw, sw, dw, pl, pr)
    out = TensorType((n, oh, ow, out_c), x.dtype)
    if a.get("residual"):
        if t[-1] != out:
            raise NodeError(f"residual {t[-1]} must have the output's type {out}")
        t = t[:-1]
    if len(t) == 3 and t[2].shape != (out_c,):
        raise NodeError(f"bias {t[2]} does not match the {out_c} output channels")
    return [out]


@kind("conv2d")
def _conv2d(t: list[TensorType], a: dict) -> list[TensorType]:
    return _conv_like(t, a, depthwise=False)


@kind("depthwise_conv2d")
def _depthwise(t: list[TensorType], a: dict) -> list[TensorType]:
    return _conv_like(t, a, depthwise=True)


@kind("pool")
def _pool(t: list[TensorType], a: dict) -> list[TensorType]:
    n, h, w, c = t[0].shape
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = a["ksize"], a["strides"], a["pads"]
    return [TensorType((n, _spatial(h, kh, sh, 1, pt, pb), _spatial(w, kw, sw, 1, pl, pr), c),
                       t[0].dtype)]


@kind("reduce")
def _reduce(t: list[TensorType], a: dict) -> list[TensorType]:
    axes = set(a["axes"])
    shape = tuple((1 if i in axes else d) for i, d in enumerate(t[0].shape)
                  if a["keepdims"] or i not in axes)
    return [TensorType(shape, t[0].dtype)]


@kind("softmax")
def _softmax(t: list[TensorType], a: dict) -> list[TensorType]:
    return _one(t[0])


@kind("argminmax")
def _argminmax(t: list[TensorType], a: dict) -> list[TensorType]:
    shape = tuple(d for i, d in enumerate(t[0].shape) if i != a["axis"])
    return [TensorType(shape, a["to"])]


@kind("reshape")
def _reshape(t: list[TensorType], a: dict) -> list[TensorType]:
    shape = tuple(a["shape"])
    out = TensorType(shape, t[0].dtype)
    if out.size != t[0].size:
        raise NodeError(f"cannot reshape {t[0]} ({t[0].size} elements) to {list(shape)}")
    return [out]


@kind("transpose")
def _transpose(t: list[TensorType], a: dict) -> list[TensorType]:
    return [TensorType(tuple(t[0].shape[p] for p in a["perm"]), t[0].dtype)]


@kind("concat")
def _concat(t: list[TensorType], a: dict) -> list[TensorType]:
    axis = a["axis"]
    first = t[0]
    for other in t[1:]:
        if other.dtype != first.dtype or len(other.shape) != len(first.shape) or any(
                x != y for i, (x, y) in enumerate(zip(first.shape, other.shape)) if i != axis):
            raise NodeError(f"cannot concatenate {first} and {other} on axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in t)
    return [TensorType(tuple(shape), first.dtype)]


@kind("strided_slice")
def _strided_slice(t: list[TensorType], a: dict) -> list[TensorType]:
    shape = tuple(len(range(*slice(b, e, s).indices(d)))
                  for d, b, e, s in zip(t[0].shape, a["begin"], a["end"], a["strides"]))
    return [TensorType(shape, t[0].dtype)]


@kind("pad")
def _pad(t: list[TensorType], a: dict) -> list[TensorType]:
    shape = tuple(d + b + e for d, (b, e) in zip(t[0].shape, a["paddings"]))
    return [TensorType(shape, t[0].dtype)]


@kind("tile")
def _tile(t: list[TensorType], a: dict) -> list[TensorType]:
    return [TensorType(tuple(d * m for d, m in zip(t[0].shape, a["multiples"])), t[0].dtype)]


@kind("broadcast_to")
def _broadcast_to(t: list[TensorType], a: dict) -> list[TensorType]:
    shape = tuple(a["shape"])
    if broadcast_shapes(t[0].shape, shape) != shape:
        raise NodeError(f"{t[0]} does not broadcast to {list(shape)}")
    return [TensorType(shape, t[0].dtype)]


@kind("gather")
def _gather(t: list[TensorType], a: dict) -> list[TensorType]:
    params, indices = t
    axis, bd = a["axis"], a["batch_dims"]
    if indices.dtype not in ("int32", "int64"):
        raise NodeError(f"gather indices must be int32 or int64, got {indices.dtype}")
    shape = params.shape[:axis] + indices.shape[bd:] + params.shape[axis + 1:]
    return [TensorType(shape, params.dtype)]


@kind("one_hot")
def _one_hot(t: list[TensorType], a: dict) -> list[TensorType]:
    shape = list(t[0].shape)
    axis = a["axis"] if a["axis"] >= 0 else len(shape)
    shape.insert(axis, a["depth"])
    return [TensorType(tuple(shape), a["to"])]


@kind("resize")
def _resize(t: list[TensorType], a: dict) -> list[TensorType]:
    n, _, _, c = t[0].shape
    dtype = "float32" if a["mode"] == "bilinear" else t[0].dtype
    return [TensorType((n, a["size"][0], a["size"][1], c), dtype)]


@kind("copy")
def _copy(t: list[TensorType], a: dict) -> list[TensorType]:
    return _one(t[0])
