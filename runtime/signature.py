"""`TensorSignature`: what a caller must feed or will get back for one tensor.

One record, read and written by every part that states a tensor's signature:
the io-config the compiler reads (`cc/ioconfig.py`), the executable's inputs and
outputs (`runtime/executable.py`), the `NeuronOp` attributes (written by
`neuronish/neuron_op.py`, checked against the executable by
`neuronish/kernel_bridge.py`) and the model server's request checks
(`neuronish/serving/signatures.py`). It lives in the runtime because the
runtime is the one package all three sides may import (the compiler imports
the executable-format module from here; nothing here imports TensorFlow).

Conventions, stated once:
- `dtype` is the dtype's name as numpy and TensorFlow both spell it
  ("float32", "int64", "bool"); TensorFlow-only types keep TensorFlow's name
  ("bfloat16", "string"). Code on the TensorFlow side converts with
  `tf.as_dtype(sig.dtype)` where it talks to TensorFlow, and nowhere else.
- `shape` is a tuple of sizes; -1 is a dimension of any size (a SignatureDef's
  unknown size, a `NeuronOp` free dimension); None is an unknown rank. A
  compiled signature (io-config, executable) has neither.
- `batch_axis` is the axis calls may be split and concatenated along, or -1
  for none.
- `bounds` gives, per dimension, (low, high) of a free dimension's accepted
  sizes, or None; empty when no dimension is bounded.

What is deliberately not here: an executable's value ids (where the program
reads an input or leaves an output) are the program's own wiring, which no
caller sees, so `Executable` keeps them beside its signature lists
(`input_values`, `output_values`); whether an io-config *stated* a batch axis
or took the default is a fact about that file (`IOConfig.given_batch_axes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NO_BATCH_AXIS = -1


@dataclass(frozen=True)
class TensorSignature:
    name: str  # a tensor name ("x:0"), or a signature's key on the server
    dtype: str
    shape: tuple[int, ...] | None
    batch_axis: int = NO_BATCH_AXIS
    bounds: tuple[tuple[int, int] | None, ...] = ()

    @property
    def shape_text(self) -> str:
        """`[1,-1,3]`, or `[?]` for an unknown rank."""
        return shape_text(self.shape)

    def accepts_shape(self, shape: Sequence[int]) -> bool:
        """Whether `shape` has this rank and every size that is not free."""
        if self.shape is None:
            return True
        # (any negative size is open, as TensorFlow's TensorShapeProto reads one)
        return len(shape) == len(self.shape) and all(
            want < 0 or got == want for got, want in zip(shape, self.shape))

    def out_of_bounds(self, shape: Sequence[int]) -> tuple[int, int, int] | None:
        """(dimension, low, high) of the first dimension of `shape` outside its bounds."""
        for axis, (size, bound) in enumerate(zip(shape, self.bounds)):
            if bound is not None and not bound[0] <= size <= bound[1]:
                return axis, *bound
        return None

    def describe(self) -> str:
        """`'x:0' float32[1,4] batch axis 0`: how errors name it."""
        return f"{self.name!r} {self.dtype}{self.shape_text} batch axis {self.batch_axis}"


def shape_text(shape: Sequence[int] | None) -> str:
    return "[?]" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"


def first_difference(stated: Sequence[TensorSignature], actual: Sequence[TensorSignature]
                     ) -> tuple[int, str] | None:
    """(index, field) of the first place where `stated` says something other than
    `actual`, index -1 with field "count" when the lengths differ; None when equal."""
    if len(stated) != len(actual):
        return -1, "count"
    for i, (a, b) in enumerate(zip(stated, actual)):
        for field in ("name", "dtype", "shape", "batch_axis", "bounds"):
            if getattr(a, field) != getattr(b, field):
                return i, field
    return None
