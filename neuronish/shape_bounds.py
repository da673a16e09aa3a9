"""Bounds and probe values of a signature's free dimensions (`input_shapes.FreeDim`).

    plan = settle(plan, graph_def, given={"token_ids": {1: (1, 256)}})

Per symbol (dimensions that must agree share one), in this order:

- given: `compile(..., shape_bounds={key: {axis: (low, high)}})` or
  `--shape-bounds key:axis=low:high`;
- implied by the model: a Slice or StridedSlice of a tensor of static shape whose
  output grows one for one with the free dimension (keras_hub's position embedding
  takes the first `length` rows of its table) bounds it by that tensor's size;
- else `DEFAULT_HIGH`. The low bound is 1, or the smallest size TensorFlow's shape
  inference accepts (a network of valid convolutions needs a few pixels).

Both come from TensorFlow's own shape inference (`shape_inference.shapes.infer`) at probe
values, never from running the model. The probe (`DEFAULT_PROBE` clamped into the
bounds) is the size the graph is partitioned and first compiled at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tensorflow.core.framework import graph_pb2

from .errors import SavedModelError
from .graph import PartitionError, canonical
from .input_shapes import ShapePlan
from .shape_inference.shapes import TensorInfo, infer

DEFAULT_HIGH = 1024   # a free dimension nothing in the model bounds
DEFAULT_PROBE = 64    # the size partitioned at, clamped into the bounds
_STEP = 7             # the second probe: odd, so strides of 2 and 4 do not hide it

Bounds = Mapping[str, Mapping[int, tuple[int, int]]]


def settle(plan: ShapePlan, graph_def: graph_pb2.GraphDef, given: Bounds | None = None
           ) -> ShapePlan:
    """`plan` with a probe value and bounds for every free symbol (see the module doc)."""
    if not plan.free:
        return plan
    by_key = _check_given(plan, given or {})
    probe = {s: DEFAULT_PROBE for s in plan.symbols()}
    bounds: dict[str, tuple[int, int, str]] = {}
    for symbol in plan.symbols():
        dims = [f for f in plan.free if f.symbol == symbol]
        told = [by_key[(f.key, f.axis)] for f in dims if (f.key, f.axis) in by_key]
        if told:
            low, high = max(t[0] for t in told), min(t[1] for t in told)
            where = "given (shape_bounds)"
            if low > high:
                raise SavedModelError(f"shape_bounds for {', '.join(f.label() for f in dims)} "
                                      f"(which must agree) leave no size: {told}")
        else:
            low, high, where = _implied(plan, graph_def, probe, symbol)
        bounds[symbol] = (low, high, where)
        probe[symbol] = min(max(DEFAULT_PROBE, low), high)
    try:
        infer(graph_def, plan.at(probe))
    except PartitionError as e:
        raise _no_probe(plan, probe, e) from None
    shapes = {k: [int(d) for d in v] for k, v in plan.at(probe).items()}
    return replace(plan, shapes=shapes, probe=probe, bounds=bounds)


def _no_probe(plan: ShapePlan, probe: Mapping[str, int], error: PartitionError
              ) -> SavedModelError:
    """The graph does not take its free dimensions at the probe sizes: most often the
    model fixes one (a free axis multiplied by a weight matrix), which the signature does
    not say. Ask for the shapes, naming every free dimension."""
    dims = ", ".join(f"{f.label()} (tried {probe[f.symbol]})" for f in plan.free)
    keys = ", ".join(sorted({repr(f.key) for f in plan.free}))
    return SavedModelError(
        f"the signature leaves {dims} free, but the model does not take those sizes: "
        f"{error}. If the model fixes a dimension, give the shapes of {keys} with "
        f"model_shape_feed_dict (CLI --input-shape KEY=?,D1,...), or the sizes it takes "
        f"with shape_bounds")


def _check_given(plan: ShapePlan, given: Bounds) -> dict[tuple[str, int], tuple[int, int]]:
    free = {(f.key, f.axis) for f in plan.free}
    out = {}
    for key, axes in given.items():
        for axis, pair in dict(axes).items():
            try:
                low, high = (int(v) for v in pair)
                axis = int(axis)
            except (TypeError, ValueError):
                raise SavedModelError(f"shape_bounds[{key!r}][{axis!r}] is {pair!r}; expected "
                                      "(low, high)") from None
            if (key, axis) not in free:
                raise SavedModelError(
                    f"shape_bounds names {key!r} dimension {axis}, which is not a free "
                    f"dimension of the signature; its free ones are "
                    f"{sorted(free) or 'none'} (the batch takes any size)")
            if not 1 <= low <= high:
                raise SavedModelError(f"shape_bounds[{key!r}][{axis}] is ({low}, {high}); "
                                      "expected 1 <= low <= high")
            out[(key, axis)] = (low, high)
    return out


def _infer(plan: ShapePlan, graph_def: graph_pb2.GraphDef, values: Mapping[str, int]
           ) -> dict[str, TensorInfo] | None:
    try:
        return infer(graph_def, plan.at(values))
    except PartitionError:
        return None


def _implied(plan: ShapePlan, graph_def: graph_pb2.GraphDef, probe: dict[str, int],
             symbol: str) -> tuple[int, int, str]:
    """(low, high, why) for `symbol` from the graph's shapes (module doc)."""
    at = _infer(plan, graph_def, probe)
    bigger = _infer(plan, graph_def, {**probe, symbol: probe[symbol] + _STEP})
    high, where = DEFAULT_HIGH, f"default ({DEFAULT_HIGH}: nothing in the model bounds it)"
    if at is not None and bigger is not None:
        for node in graph_def.node:
            if node.op not in ("Slice", "StridedSlice") or not node.input:
                continue
            source = canonical(node.input[0])
            out = f"{node.name}:0"
            a, b = at.get(source), bigger.get(source)
            if a is None or b is None or not a.fully_known or a.shape != b.shape or \
                    out not in at or out not in bigger or not at[out].fully_known or \
                    not bigger[out].fully_known or len(at[out].shape) != len(a.shape):
                continue
            for k, (before, after) in enumerate(zip(at[out].shape, bigger[out].shape)):
                if after - before == _STEP:
                    limit = a.shape[k] - (before - probe[symbol])
                    if limit < high:
                        high = limit
                        where = (f"the model: {node.name} takes the first rows of a "
                                 f"{a.shape[k]}-long axis ({node.op} of {list(a.shape)})")
    low = 1
    if _infer(plan, graph_def, {**probe, symbol: 1}) is None:
        lo, hi = 1, min(probe[symbol], high)  # the smallest size shape inference accepts
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if _infer(plan, graph_def, {**probe, symbol: mid}) is None:
                lo = mid
            else:
                hi = mid
        low = hi
    return low, high, where
