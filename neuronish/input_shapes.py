"""The compile-time shape of every signature input (`neuronish.saved_model.compile`).

Shapes come from `model_feed_dict` (example arrays), else `model_shape_feed_dict`
(shapes), else the signature with its batch dimension set to `batch_size`; both dicts
are keyed by signature input key.

Dimensions other than the batch that stay free (`[None, None]` token ids, an image of
any side) are not refused: `plan_shapes` returns them as `FreeDim`s, with the bounds
the model's own shape logic implies (`shape_bounds.py`) or the user gives, and a
probe value inside them at which the graph is partitioned and first compiled. Each
NeuronOp then gets an executable per shape it is called at (`shape_specialize.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import SavedModelError
from .freeze import FrozenSignature


@dataclass(frozen=True)
class FreeDim:
    """One free dimension of a signature input. Dimensions that must agree (the sequence
    axis of token ids and of their mask) share a `symbol`: the axis, among inputs of one
    rank (an image's height and width are two symbols)."""

    key: str      # signature input key
    tensor: str   # its placeholder ("token_ids:0")
    axis: int
    symbol: str   # "rank2/axis1"

    def label(self) -> str:
        return f"{self.key!r} dimension {self.axis}"


@dataclass(frozen=True)
class ShapePlan:
    """The shapes a signature is compiled at. `shapes` are concrete: free dimensions at
    their symbol's probe value. `free` lists the free dimensions; `bounds[symbol]` is
    (low, high, where the bound comes from)."""

    shapes: dict[str, list[int]]
    free: tuple[FreeDim, ...] = ()
    probe: dict[str, int] | None = None
    bounds: dict[str, tuple[int, int, str]] | None = None

    def at(self, values: Mapping[str, int | None]) -> dict[str, list[int | None]]:
        """The shapes with each free symbol set to `values[symbol]` (None: unknown)."""
        out: dict[str, list[int | None]] = {k: list(v) for k, v in self.shapes.items()}
        for f in self.free:
            out[f.tensor][f.axis] = values[f.symbol]
        return out

    def unknown(self) -> dict[str, list[int | None]]:
        """The shapes with every free dimension unknown (None)."""
        return self.at({f.symbol: None for f in self.free})

    def symbols(self) -> list[str]:
        return list(dict.fromkeys(f.symbol for f in self.free))


def plan_shapes(signature: FrozenSignature, batch_size: int,
                model_shape_feed_dict: Mapping[str, Sequence[int]] | None = None,
                model_feed_dict: Mapping[str, object] | None = None) -> ShapePlan:
    """`compile_shapes`, with free dimensions other than the batch kept as `FreeDim`s
    (their shapes hold -1 there until `shape_bounds.settle` picks probes and bounds)."""
    shapes, free = _shapes(signature, batch_size, model_shape_feed_dict, model_feed_dict)
    dims = []
    for key, declared, shape in free:
        tensor = next(i.tensor for i in signature.inputs if i.key == key)
        if declared is None or any(d is None for d in shape[:1]) and declared[:1] != (None,):
            raise SavedModelError(_free_dims_message(free, signature.signature_key))
        shapes[tensor] = [-1 if d is None else d for d in shape]
        dims += [FreeDim(key, tensor, axis, f"rank{len(shape)}/axis{axis}")
                 for axis, d in enumerate(shape) if d is None or d < 0]
    return ShapePlan(shapes, tuple(dims))


def compile_shapes(signature: FrozenSignature, batch_size: int,
                   model_shape_feed_dict: Mapping[str, Sequence[int]] | None = None,
                   model_feed_dict: Mapping[str, object] | None = None) -> dict[str, list[int]]:
    """Compile-time shape of each input placeholder, keyed by its tensor name; free
    dimensions other than the batch are an error naming them and what to pass."""
    shapes, free = _shapes(signature, batch_size, model_shape_feed_dict, model_feed_dict)
    if free:
        raise SavedModelError(_free_dims_message(free, signature.signature_key))
    return shapes


def _shapes(signature: FrozenSignature, batch_size: int,
            model_shape_feed_dict: Mapping[str, Sequence[int]] | None,
            model_feed_dict: Mapping[str, object] | None
            ) -> tuple[dict[str, list[int]], list[tuple[str, tuple, list[int | None]]]]:
    keys = {i.key for i in signature.inputs}
    for arg, given in (("model_feed_dict", model_feed_dict),
                       ("model_shape_feed_dict", model_shape_feed_dict)):
        unknown = sorted(set(given or ()) - keys)
        if unknown:
            raise SavedModelError(f"{arg} names {unknown}, which signature "
                                  f"{signature.signature_key!r} does not have; its inputs "
                                  f"are {sorted(keys)}")
    shapes: dict[str, list[int]] = {}
    free: list[tuple[str, tuple, list[int | None]]] = []  # key, declared, shape so far
    for inp in signature.inputs:
        if model_feed_dict and inp.key in model_feed_dict:
            value = np.asarray(model_feed_dict[inp.key])
            if not _same_dtype(value.dtype, inp.dtype):
                raise SavedModelError(f"model_feed_dict[{inp.key!r}] has dtype {value.dtype}; "
                                      f"the signature expects {inp.dtype}")
            shape = list(value.shape)
            source = "model_feed_dict"
        elif model_shape_feed_dict and inp.key in model_shape_feed_dict:
            shape = _given_shape(inp.key, model_shape_feed_dict[inp.key], inp.shape, batch_size)
            source = "model_shape_feed_dict"
        else:
            if inp.shape is None:
                raise SavedModelError(
                    f"input {inp.key!r} has an unknown rank; pass its shape in "
                    f"model_shape_feed_dict={{{inp.key!r}: [...]}} or an example in "
                    "model_feed_dict")
            shape = [batch_size if i == 0 and d is None else d for i, d in enumerate(inp.shape)]
            source = "the signature"
        if inp.shape is not None and (len(shape) != len(inp.shape) or any(
                s is not None and d != s for d, s in zip(shape, inp.shape, strict=True))):
            raise SavedModelError(f"{source} gives input {inp.key!r} the shape {shape}; the "
                                  f"signature declares {_fmt_shape(inp.shape)}")
        if any(d is None or d < 0 for d in shape):
            free.append((inp.key, inp.shape, shape))
            continue
        shapes[inp.tensor] = shape
    return shapes, free


def _free_dims_message(free: list[tuple[str, tuple, list[int | None]]],
                       signature_key: str) -> str:
    """Every input whose non-batch dimensions are free, and the argument that fixes them,
    ready to fill in (images: H, W; other dims: d1, d2, ...)."""
    def template(shape: list[int | None]) -> list[str]:
        image = len(shape) == 4 and shape[1] is None and shape[2] is None
        return [str(d) if d is not None and d >= 0 else
                ("H" if i == 1 else "W") if image and i in (1, 2) else f"d{i}"
                for i, d in enumerate(shape)]

    listed = ", ".join(f"{k!r} {_fmt_shape(declared)}" for k, declared, _ in free)
    python = ", ".join(f"{k!r}: [{', '.join(template(s))}]" for k, _, s in free)
    cli = " ".join(f"--input-shape {k}={','.join(template(s))}" for k, _, s in free)
    return (f"signature {signature_key!r}: {listed} {'has' if len(free) == 1 else 'have'} "
            "dimensions other than the batch left free, and the device compiles static "
            "shapes (the batch stays dynamic). Pass the size you will serve: "
            f"model_shape_feed_dict={{{python}}} with each letter replaced (`neuronish "
            f"compile ... {cli}`), or example arrays in model_feed_dict. A call of another "
            "size is then refused naming the compiled shape: compile once per size you "
            "serve")


def _given_shape(key: str, given: object, declared: tuple | None,
                 batch_size: int) -> list[int | None]:
    """A `model_shape_feed_dict` entry as a shape: None or -1 in dim 0 of an input whose
    batch the signature leaves free is `batch_size` (users write the batch as free, as
    TensorFlow does); elsewhere it stays free, for the error that lists such inputs."""
    try:
        dims = list(given)  # type: ignore[call-overload]
        shape = [None if d is None or int(d) < 0 else int(d) for d in dims]
    except (TypeError, ValueError):
        raise SavedModelError(f"model_shape_feed_dict[{key!r}] is {given!r}; expected a list "
                              "of integers (None or -1 for the batch)") from None
    if shape and shape[0] is None and declared is not None and declared[:1] == (None,):
        shape[0] = batch_size
    return shape


def _same_dtype(given: np.dtype, want: str) -> bool:
    """Whether an example array of numpy dtype `given` feeds an input of TensorFlow dtype
    `want` ("float32", "string", "bfloat16", ...)."""
    if want == "string":  # bytes or str, as TensorFlow takes them
        return given.kind in "OSU"
    try:
        return given == np.dtype(want)
    except TypeError:  # a TensorFlow-only dtype (bfloat16): numpy has no name for it
        return given.name == want


def _fmt_shape(shape: Sequence[int | None] | None) -> str:
    return "<unknown rank>" if shape is None else \
        "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def batch_of(shapes: dict[str, list[int]], batch_size: int) -> int:
    """The compile batch: dim 0 the inputs agree on (shapes given explicitly may set it),
    else `batch_size`."""
    firsts = {s[0] for s in shapes.values() if s}
    return firsts.pop() if len(firsts) == 1 else batch_size
