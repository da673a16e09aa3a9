"""The compiler's view of the device instruction set (declared in `neuronish.runtime.isa`).

`infer(kind, input_types, attrs) -> output_types` checks the instruction against its
declaration (arity, attribute schema, shape rule) and returns the output types as the
IR's `TensorType`s; a violation is a `NodeError` (the caller adds the TF node). The
declarations themselves, and the trait sets the passes ask, live in the runtime
module, which both the compiler and the device read.
"""

from __future__ import annotations

from neuronish.runtime import isa

from .errors import NodeError
from .ir import TensorType

INFER = isa.KINDS  # kind name -> declaration (`name in INFER` asks "is it a device kind?")


def infer(name: str, types: list[TensorType], attrs: dict) -> list[TensorType]:
    try:
        out = isa.check(name, types, attrs)
    except isa.IsaError as e:
        if name not in isa.KINDS:
            raise NodeError(f"no device instruction {name!r} (compiler bug)") from None
        raise NodeError(e.reason) from None
    return [TensorType(t.shape, t.dtype) for t in out]

