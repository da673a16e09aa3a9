"""The one registry of TF op lowerings, keyed by TF op type.

`list-operators`, the partitioner's support check and the conformance tests all
read `LOWERINGS`, so they cannot disagree. A lowering is a small function
`(ctx, node) -> list[Value]` (one Value per TF output, in order); its docstring
states the TF semantics it implements. A lowering that takes only some
attribute values declares `supports(node) -> str | None` returning the reason
it cannot take a node (None: fine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from neuronish.runtime import isa

from .. import kinds
from ..batch import BatchRule
from ..errors import NodeError
from ..graphdef import TENSOR_TYPES, TensorRef, TFNode, tensor_to_numpy
from ..interpret import MAX_FOLD_BYTES, fold_fits
from ..ir import Node, TensorType, Value, constant
from ..signature import signature_key, value_key

LowerFn = Callable[["LowerCtx", TFNode], list[Value]]
SupportsFn = Callable[[TFNode], "str | None"]


@dataclass(frozen=True)
class Lowering:
    op_type: str
    fn: LowerFn
    supports: SupportsFn | None = None
    # How the op treats the batch axis (`batch.py`); None: undeclared, taken as mixing.
    batch: BatchRule | None = None

    def check(self, node: TFNode) -> str | None:
        return self.supports(node) if self.supports else None


LOWERINGS: dict[str, Lowering] = {}


def tf_op(*op_types: str, supports: SupportsFn | None = None,
          batch: BatchRule | None = None) -> Callable[[LowerFn], LowerFn]:
    """Register `fn` as the lowering of each TF op type in `op_types`; `batch` is how
    the op treats a per-sample input (`batch.py`)."""

    def register(fn: LowerFn) -> LowerFn:
        for op_type in op_types:
            if op_type in LOWERINGS:
                raise RuntimeError(f"TF op {op_type!r} has two lowerings")
            LOWERINGS[op_type] = Lowering(op_type, fn, supports, batch)
        return fn

    return register


def refused_nodes(nodes: list[TFNode]) -> dict[str, str]:
    """node name -> why its lowering refuses its attribute values (`supports`), for the
    nodes of supported op types that it refuses; the same check `compile` makes."""
    refused = {}
    for node in nodes:
        lowering = LOWERINGS.get(node.op)
        if lowering is not None and (reason := lowering.check(node)) is not None:
            refused[node.name] = reason
    return refused


class LowerCtx:
    """What a lowering may use: its node's inputs, constants, and `emit`."""

    def __init__(self, values: dict[TensorRef, Value], fold: Callable[[Node], list[Value]]):
        self._values = values
        self._fold = fold
        self.nodes: list[Node] = []
        self.node: TFNode | None = None

    # inputs -----------------------------------------------------------------
    def _value(self, ref: TensorRef) -> Value:
        v = self._values.get(ref)
        if v is None:  # the producer ran (or is fed) but has no such output
            have = sorted(str(r) for r in self._values if r.node == ref.node)
            raise NodeError(
                f"reads tensor {ref}, which does not exist: node {ref.node!r} provides "
                f"{', '.join(have) or 'no outputs'}",
                "fix the GraphDef's input name, or feed that tensor in the io-config")
        return v

    def input(self, node: TFNode, i: int) -> Value:
        if i >= len(node.inputs):
            raise NodeError(f"expected at least {i + 1} inputs, the node has {len(node.inputs)}")
        return self._value(node.inputs[i])

    def inputs(self, node: TFNode) -> list[Value]:
        return [self._value(r) for r in node.inputs]

    def const_input(self, node: TFNode, i: int, what: str) -> np.ndarray:
        """The value of input `i`, which must be known at compile time."""
        v = self.input(node, i)
        if v.data is None:
            raise NodeError(
                f"input {i} ({what}) must be a compile-time constant, but it is computed "
                f"from the graph's inputs",
                "compute it from constants or shapes only, or keep this node on TensorFlow")
        return v.data

    # building ---------------------------------------------------------------
    def const(self, array: np.ndarray | float | int, dtype: str | None = None) -> Value:
        return constant(np.asarray(array, dtype=dtype))

    def check_const_size(self, shape: tuple[int, ...] | list[int], dtype: str,
                         what: str) -> None:
        """Refuse, before allocating it, a constant the lowering would compute whose
        size comes from the graph (a Range's count, a mask of a tensor's shape) and
        exceeds what folding may compute (`interpret.MAX_FOLD_BYTES`)."""
        nbytes = isa.nbytes([int(d) for d in shape], dtype)
        if nbytes > MAX_FOLD_BYTES:
            raise NodeError(
                f"{what} would be a {dtype}{list(shape)} constant of {nbytes} bytes, more "
                f"than the {MAX_FOLD_BYTES >> 20} MiB the compiler computes at compile time",
                "make it smaller, or keep this node on TensorFlow")

    def emit(self, kind: str, inputs: list[Value], attrs: dict | None = None) -> list[Value]:
        """Append one instruction; returns its outputs (constant-folded when every
        input is a constant and the result is within `interpret.fold_fits`)."""
        attrs = dict(attrs) if attrs else {}
        out_types = _output_types(kind, [v._type for v in inputs], attrs)
        origin = (self.node.name,) if self.node else ()
        node = Node(kind, inputs, [], attrs, origin)
        # (a new node is in no graph: its outputs are set directly, not by the property)
        node._outputs = [Value(t, node) for t in out_types]
        if inputs and all([v.data is not None for v in inputs]) and fold_fits(node):
            folded = self._fold(node)
            node._outputs = []  # (no node <-> output cycle left for the collector)
            return folded
        self.nodes.append(node)
        return node.outputs

    def emit1(self, kind: str, inputs: list[Value], attrs: dict | None = None) -> Value:
        return self.emit(kind, inputs, attrs)[0]


# (kind, input types, attrs) -> output types, for instructions already checked: a large
# graph repeats a few signatures many times, and checking one costs ~50 µs.
_CHECKED: dict[tuple, list[TensorType]] = {}
_CHECKED_MAX = 1 << 16  # emptied when full: a cache, never a leak


def _output_types(kind: str, types: list[TensorType], attrs: dict) -> list[TensorType]:
    """The instruction's output types, checked against its declaration (`kinds.infer`)
    and the device's size limits; NodeError if either refuses it."""
    key = signature_key(kind, types, attrs)
    if key is not None and (hit := _CHECKED.get(key)) is not None:
        return hit
    out_types = kinds.infer(kind, types, attrs)
    for t in out_types:  # what the executable's validator would refuse, refused here
        try:
            isa.check_type(list(t.shape), t.dtype)
        except isa.IsaError as e:
            raise NodeError(f"{kind} output: {e.reason}", "the graph asks for a tensor "
                            "larger than the device holds") from None
    if key is not None:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = out_types
    return out_types


def attr_tensor(node: TFNode, key: str = "value") -> np.ndarray:
    """Decode a tensor-valued attribute (e.g. Const's `value`)."""
    value = node.attr.get(key)
    if not isinstance(value, TENSOR_TYPES):  # missing, or another kind (a damaged GraphDef)
        raise NodeError(f"attribute {key!r} is {'missing' if value is None else 'not a tensor'}",
                        "the GraphDef is damaged: export it again")
    return tensor_to_numpy(value)


def require_type(v: Value, *dtypes: str, what: str = "input") -> None:
    if v.dtype not in dtypes:
        raise NodeError(f"{what} has dtype {v.dtype}; the device supports {', '.join(dtypes)} here")


__all__ = ["LOWERINGS", "LowerCtx", "Lowering", "TensorType", "attr_tensor", "refused_nodes",
           "require_type", "signature_key", "tf_op", "value_key"]
