"""Consistency of an executable's contents, checked once when it is read
(`from_bytes`); the Model and the program binder trust what passed.

A checksum proves the body is what some writer wrote, not that the writer was a
compatible neuronish-cc. Everything the loader and the program binder index by
(value ids, arena offsets, scratch ranges, instruction kinds) is checked here, so
a bad file is refused with an `ExecutableError` before any device memory is
reserved, instead of failing later with a bare KeyError or an out-of-bounds view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import isa
from .errors import ExecutableError

if TYPE_CHECKING:
    from .executable import Executable, TensorSig


def _fail(what: str) -> ExecutableError:
    return ExecutableError(f"executable is inconsistent: {what}. It was not written by a "
                           "compatible neuronish-cc; recompile the model")


def _is_count(x: object) -> bool:
    return type(x) is int and x >= 0


def value_nbytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of one value of `shape` and `dtype` (its place in the arena)."""
    return isa.nbytes(shape, dtype)


def _check_types(exe: Executable) -> None:
    if not _is_count(exe.arena_bytes):
        raise _fail(f"arena size {exe.arena_bytes!r} is not a byte count")
    for vid, (shape, dtype) in exe.values.items():
        if not _is_count(vid):
            raise _fail(f"value id {vid!r} is not a value id")
        try:
            isa.check_type(shape, dtype)
        except isa.IsaError as e:
            raise _fail(f"value %{vid}: {e.reason}") from None
    for vid in exe.constants:
        if not _is_count(vid):
            raise _fail(f"constant id {vid!r} is not a value id")
        if vid in exe.values:
            raise _fail(f"value %{vid} is both a constant and computed")
    # Ids are dense (the compiler numbers them 0..n-1); the loader sizes a table by the
    # largest, so a huge one must not get that far.
    limit = len(exe.values) + len(exe.constants)
    if (big := max([*exe.values, *exe.constants], default=-1)) >= limit:
        raise _fail(f"value id %{big} is out of range (the file holds {limit} values)")


def _check_sig(sig: TensorSig, exe: Executable, what: str, allow_const: bool) -> None:
    where = f"{what} {sig.name!r}"
    if sig.value in exe.values:
        shape, dtype = exe.values[sig.value]
    elif allow_const and sig.value in exe.constants:
        shape, dtype = exe.constants[sig.value].shape, exe.constants[sig.value].dtype.name
    else:
        raise _fail(f"{where} names value %{sig.value}, which the file does not define")
    if tuple(sig.shape) != tuple(shape) or sig.dtype != dtype:
        raise _fail(f"{where} is {sig.dtype}{list(sig.shape)} but its value %{sig.value} is "
                    f"{dtype}{list(shape)}")
    if type(sig.batch_axis) is not int or not -1 <= sig.batch_axis < max(len(shape), 1):
        raise _fail(f"{where} has batch axis {sig.batch_axis!r} for shape {list(shape)}")


def _check_programs(exe: Executable, external: set[int]) -> set[int]:
    """Instruction kinds, operands defined before use, scratch inside the arena; returns
    the ids the instructions produce."""
    defined = {s.value for s in exe.inputs} | set(exe.constants)
    produced: set[int] = set()
    for core, program in enumerate(exe.programs):
        for n, ins in enumerate(program):
            where = f"instruction {n} of core {core} ({ins.kind!r}, from TF node(s) " \
                    f"{', '.join(map(str, ins.source)) or '?'})"
            if ins.kind not in isa.KINDS:
                raise ExecutableError(
                    f"{where}: instruction kind {ins.kind!r} is not one this runtime has "
                    "(docs/isa.md); upgrade neuronish or recompile the model with this version")
            if not isinstance(ins.attrs, dict):
                raise _fail(f"{where} has attrs {ins.attrs!r}, not a map")
            for vid in ins.inputs:
                if vid not in defined:
                    raise _fail(f"{where} reads value %{vid}, which is not an input, a constant "
                                "or the output of an earlier instruction")
            for vid in ins.outputs:
                if vid not in exe.values or vid in defined:
                    raise _fail(f"{where} writes value %{vid}, which is " + (
                        "an input, a constant or written earlier" if vid in defined
                        else "not defined"))
                if vid not in external and vid not in exe.offsets:
                    raise _fail(f"{where} writes value %{vid}, which has no place in the arena")
                defined.add(vid)
                produced.add(vid)
            if ins.scratch is not None:
                if len(ins.scratch) != 2 or not all(map(_is_count, ins.scratch)) or \
                        ins.scratch[0] + ins.scratch[1] > exe.arena_bytes:
                    raise _fail(f"{where} has scratch {list(ins.scratch)!r} outside the "
                                f"{exe.arena_bytes}-byte arena")
    return produced


def check_executable(exe: Executable) -> None:
    """Raise `ExecutableError` naming the first inconsistency in `exe`."""
    _check_types(exe)
    for sig in exe.inputs:
        _check_sig(sig, exe, "input", allow_const=False)
    for sig in exe.outputs:
        _check_sig(sig, exe, "output", allow_const=True)
    inputs = {s.value for s in exe.inputs}
    if len(inputs) != len(exe.inputs):
        raise _fail("two inputs share one value")
    external = inputs | {s.value for s in exe.outputs}
    for vid, offset in exe.offsets.items():
        if vid not in exe.values:
            raise _fail(f"the memory plan places value %{vid}, which the file does not define")
        if vid in external:
            raise _fail(f"the memory plan places value %{vid}, an input or output, in the arena "
                        "(those live outside it)")
        nbytes = value_nbytes(*exe.values[vid])
        if not _is_count(offset) or offset + nbytes > exe.arena_bytes:
            raise _fail(f"the memory plan places value %{vid} ({nbytes} bytes) at offset "
                        f"{offset!r}, outside the {exe.arena_bytes}-byte arena")
    produced = _check_programs(exe, external)
    for sig in exe.outputs:
        if sig.value not in exe.constants and sig.value not in produced:
            raise _fail(f"output {sig.name!r} (value %{sig.value}) is never written by any "
                        "instruction")
