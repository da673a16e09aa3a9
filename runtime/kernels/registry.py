"""The table of numpy (reference) kernels, keyed by the instruction kinds that
`runtime/isa.py` declares: a kernel for an undeclared kind is refused when it
registers, and `check_complete` (run once every kernel module is imported) refuses
to start when a declared kind has no kernel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .. import isa

KernelFn = Callable[[list[np.ndarray], list[np.ndarray], dict, "np.ndarray | None"], None]


@dataclass(frozen=True)
class Kernel:
    kind: str
    fn: KernelFn

    def scratch_bytes(self, in_shapes: Sequence[tuple[int, ...]], in_dtypes: Sequence[str],
                      attrs: dict) -> int:
        """The scratch runtime/isa.py grants this kind (the kernel blocks its work to fit)."""
        return isa.scratch_bytes(self.kind, in_shapes, in_dtypes, attrs)


KERNELS: dict[str, Kernel] = {}


def kernel(kind: str) -> Callable[[KernelFn], KernelFn]:
    def register(fn: KernelFn) -> KernelFn:
        if kind not in isa.KINDS:
            raise RuntimeError(f"kernel for {kind!r}, which runtime/isa.py does not declare")
        if kind in KERNELS:
            raise RuntimeError(f"kernel {kind!r} registered twice")
        KERNELS[kind] = Kernel(kind, fn)
        return fn
    return register


def check_complete() -> None:
    """Every declared kind has its reference kernel (the numpy engine runs them all)."""
    missing = sorted(set(isa.KINDS) - set(KERNELS))
    if missing:
        raise RuntimeError(f"declared instruction kind(s) {', '.join(missing)} have no numpy "
                           "kernel (runtime/kernels/): the reference engine cannot start")


def evaluate(kind: str, inputs: Sequence[np.ndarray], attrs: dict,
             out_types: Sequence[tuple[tuple[int, ...], str]]) -> list[np.ndarray]:
    """Run one kernel on fresh buffers (constant folding, reference checks)."""
    k = KERNELS[kind]
    ins = [np.asarray(x, order="C") for x in inputs]  # keeps 0-d arrays 0-d
    outs = [np.empty(shape, dtype=dtype) for shape, dtype in out_types]
    nbytes = k.scratch_bytes([x.shape for x in ins], [x.dtype.name for x in ins], attrs)
    scratch = np.empty(nbytes, dtype=np.uint8) if nbytes else None
    k.fn(ins, outs, attrs, scratch)
    return outs
