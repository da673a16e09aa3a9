"""Consistency of an executable's contents, checked once when it is read
(`from_bytes`); the Model, the program binder and the kernels trust what passed.

A checksum proves the body is what some writer wrote, not that the writer was a
compatible neuronish-cc: an executable is untrusted input. Everything the loader
and the kernels index by or loop over is checked here, before any device memory is
reserved or any kernel runs: value ids and types (within `isa`'s limits), arena
offsets and scratch ranges, and every instruction against its declaration in
`runtime/isa.py` (arity, every attribute against its schema, and its output types
re-derived from its input types by the kind's shape rule and compared with the
types the file declares). So no kernel ever sees a negative stride, a window
outside its buffer, a loop sized by a hostile number, or shapes it did not expect.
A bad file is refused with an `ExecutableError` naming the instruction (index,
core, kind, TF node) and the field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import isa
from .errors import ExecutableError

if TYPE_CHECKING:
    from .executable import Executable, Instruction
    from .signature import TensorSignature


def _fail(what: str) -> ExecutableError:
    return ExecutableError(f"executable is inconsistent: {what}. It was not written by a "
                           "compatible neuronish-cc; recompile the model")


def _is_count(x: object) -> bool:
    return type(x) is int and x >= 0


def value_nbytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of one value of `shape` and `dtype` (its place in the arena)."""
    return isa.nbytes(shape, dtype)


def constant_type(exe: Executable, vid: int) -> isa.Type:
    """The declared type of constant `vid`."""
    a = exe.constants[vid]
    return isa.Type(tuple(a.shape), a.dtype.name)


def _plain(x: object, depth: int = 0) -> bool:
    """JSON-like data (what `neuronish-cc inspect --json` prints)."""
    if depth > 8:
        return False
    if x is None or isinstance(x, (str, bool, int, float)):
        return True
    if isinstance(x, list):
        return all(_plain(v, depth + 1) for v in x)
    if isinstance(x, dict):
        return all(isinstance(k, (str, int)) and not isinstance(k, bool) and _plain(v, depth + 1)
                   for k, v in x.items())
    return False


# What the compiler records (and `inspect` and the device model read) has these types.
_COMPILER_TYPES = {"name": str, "version": str}
_OPTION_TYPES = {"auto_cast": str, "auto_cast_type": str, "pipeline_cores": int,
                 "command_line": list, "output_names": list, "disabled_passes": list}


def _check_metadata(exe: Executable) -> None:
    """`compiler` and `stats` are only described, never executed, but they are still
    read: maps of plain data, the compiler's known fields of their types."""
    for name, value in (("compiler", exe.compiler), ("stats", exe.stats)):
        if not isinstance(value, dict) or not _plain(value):
            raise _fail(f"its {name!r} field is not a map of plain data")
    options = exe.compiler.get("options", {})
    if not isinstance(options, dict):
        raise _fail("its compiler options are not a map")
    for where, fields, types in (("compiler", exe.compiler, _COMPILER_TYPES),
                                 ("compiler option", options, _OPTION_TYPES)):
        for key, want in types.items():
            if key in fields and not (isinstance(fields[key], want)
                                      and not isinstance(fields[key], bool)):
                raise _fail(f"{where} {key!r} is {fields[key]!r}, not a {want.__name__}")


def _check_types(exe: Executable) -> None:
    if not _is_count(exe.arena_bytes):
        raise _fail(f"arena size {exe.arena_bytes!r} is not a byte count")
    if not exe.programs:
        raise _fail("it holds no program")
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
        shape, dtype = constant_type(exe, vid)
        try:
            isa.check_type(shape, dtype)
        except isa.IsaError as e:
            raise _fail(f"constant %{vid}: {e.reason}") from None
    # Ids are dense (the compiler numbers them 0..n-1); the loader sizes a table by the
    # largest, so a huge one must not get that far.
    limit = len(exe.values) + len(exe.constants)
    if (big := max([*exe.values, *exe.constants], default=-1)) >= limit:
        raise _fail(f"value id %{big} is out of range (the file holds {limit} values)")


def _check_sig(sig: TensorSignature, value: object, exe: Executable, what: str,
               allow_const: bool) -> None:
    where = f"{what} {sig.name!r}"
    if not isinstance(sig.name, str):
        raise _fail(f"{what} name {sig.name!r} is not a string")
    if type(value) is not int:
        raise _fail(f"{where} names value {value!r}, which is not a value id")
    if value in exe.values:
        shape, dtype = exe.values[value]
    elif allow_const and value in exe.constants:
        shape, dtype = constant_type(exe, value)
    else:
        raise _fail(f"{where} names value %{value}, which the file does not define")
    if tuple(sig.shape) != tuple(shape) or sig.dtype != dtype:
        declared = sig.dtype if isinstance(sig.dtype, str) else repr(sig.dtype)
        raise _fail(f"{where} is {declared}{list(sig.shape)} but its value %{value} is "
                    f"{dtype}{list(shape)}")
    if type(sig.batch_axis) is not int or not -1 <= sig.batch_axis < max(len(shape), 1):
        raise _fail(f"{where} has batch axis {sig.batch_axis!r} for shape {list(shape)}")


def _value_type(exe: Executable, vid: int) -> isa.Type:
    if vid in exe.values:
        shape, dtype = exe.values[vid]
        return isa.Type(tuple(shape), dtype)
    return constant_type(exe, vid)


def _check_instruction(ins: Instruction, exe: Executable, where: str) -> None:
    """`ins` against its kind's declaration: arity, attributes, and output types
    re-derived from the input types."""
    try:
        derived = isa.check(ins.kind, [_value_type(exe, v) for v in ins.inputs], ins.attrs)
    except isa.IsaError as e:
        field = f"attrs.{e.field}" if e.field in isa.KINDS[ins.kind].attr_index else e.field
        raise _fail(f"{where}: {e.reason} (field {field!r})") from None
    declared = [_value_type(exe, v) for v in ins.outputs]
    if declared != derived:
        raise _fail(f"{where} declares outputs "
                    f"{', '.join(f'{t.dtype}{list(t.shape)}' for t in declared) or 'none'} but "
                    f"its inputs and attributes give "
                    f"{', '.join(f'{t.dtype}{list(t.shape)}' for t in derived)} (field 'out')")


def _check_programs(exe: Executable, external: set[int]) -> set[int]:
    """Instruction kinds, operands defined before use, scratch inside the arena, and each
    instruction against its declaration; returns the ids the instructions produce."""
    defined = set(exe.input_values) | set(exe.constants)
    produced: set[int] = set()
    index = 0
    for core, program in enumerate(exe.programs):
        for n, ins in enumerate(program):
            named = all(isinstance(s, str) for s in ins.source)
            where = f"instruction {index} (#{n} of core {core}, {ins.kind!r}, from TF node(s) " \
                    f"{', '.join(ins.source) if named else '?'})"
            index += 1
            if not named:  # errors, profiles and telemetry quote them
                raise _fail(f"{where} names its TF nodes {list(ins.source)!r}, not strings "
                            "(field 'tf')")
            if not isinstance(ins.kind, str) or ins.kind not in isa.KINDS:
                raise ExecutableError(
                    f"{where}: instruction kind {ins.kind!r} is not one this runtime has "
                    "(docs/isa.md); upgrade neuronish or recompile the model with this version")
            if not isinstance(ins.attrs, dict):
                raise _fail(f"{where} has attrs {ins.attrs!r}, not a map (field 'attrs')")
            for vid in ins.inputs:
                if type(vid) is not int or vid not in defined:
                    raise _fail(f"{where} reads value %{vid}, which is not an input, a constant "
                                "or the output of an earlier instruction (field 'in')")
            for vid in ins.outputs:
                if type(vid) is not int or vid not in exe.values or vid in defined:
                    raise _fail(f"{where} writes value %{vid}, which is " + (
                        "an input, a constant or written earlier" if vid in defined
                        else "not defined") + " (field 'out')")
                if vid not in external and vid not in exe.offsets:
                    raise _fail(f"{where} writes value %{vid}, which has no place in the arena "
                                "(field 'out')")
                defined.add(vid)
                produced.add(vid)
            if ins.scratch is not None:
                if len(ins.scratch) != 2 or not all(map(_is_count, ins.scratch)) or \
                        ins.scratch[0] + ins.scratch[1] > exe.arena_bytes:
                    raise _fail(f"{where} has scratch {list(ins.scratch)!r} outside the "
                                f"{exe.arena_bytes}-byte arena (field 'scratch')")
            _check_instruction(ins, exe, where)
    return produced


def _aliasing_reshape(ins: Instruction, exe: Executable) -> bool:
    """A reshape whose output the memory plan put exactly on its input's bytes: one buffer,
    alive from the input's producer to the last reader of either."""
    if ins.kind != "reshape" or len(ins.inputs) != 1 or len(ins.outputs) != 1:
        return False
    x, y = ins.inputs[0], ins.outputs[0]
    return x in exe.offsets and y in exe.offsets and exe.offsets[x] == exe.offsets[y] \
        and value_nbytes(*exe.values[x]) == value_nbytes(*exe.values[y])


def _in_place_residual(ins: Instruction, exe: Executable) -> bool:
    """A convolution whose output the memory plan put exactly on its residual's bytes
    (cc/memory.py `in_place_residual`). Legal only where the residual is read by nothing
    after it: `_check_overlaps` ends the residual's life before the instruction, so any
    later reader makes it overlap the output."""
    if ins.kind not in ("conv2d", "conv2d_int8") or not ins.attrs.get("residual") \
            or len(ins.inputs) < 3 or len(ins.outputs) != 1:
        return False
    r, y = ins.inputs[-1], ins.outputs[0]
    return r in exe.offsets and y in exe.offsets and exe.offsets[r] == exe.offsets[y] \
        and value_nbytes(*exe.values[r]) == value_nbytes(*exe.values[y]) \
        and r not in ins.inputs[:-1]


def _check_overlaps(exe: Executable) -> None:
    """No two arena buffers alive at the same instruction share bytes: an intermediate
    from its producer to its last reader, a scratch range during its instruction (the
    compiler's planner guarantees it; a file that breaks it would compute garbage
    silently). Run after `_check_programs`, so every id and range is known good."""
    spans: dict[int, list[int]] = {}  # value -> [first, last] instruction index
    shares: dict[int, int] = {}  # a reshape's output on its input's bytes -> that buffer
    buffers = []  # (first, last, start, end, what)
    t = 0
    for program in exe.programs:
        for ins in program:
            in_place = _in_place_residual(ins, exe)
            for vid in ins.inputs[:-1] if in_place else ins.inputs:
                vid = shares.get(vid, vid)
                if vid in spans:
                    spans[vid][1] = t
            if _aliasing_reshape(ins, exe):  # the same bytes under other dims (cc/memory.py)
                shares[ins.outputs[0]] = shares.get(ins.inputs[0], ins.inputs[0])
                t += 1
                continue
            for vid in ins.outputs:
                if vid in exe.offsets:
                    spans[vid] = [t, t]
            if ins.scratch is not None and ins.scratch[1]:
                buffers.append((t, t, ins.scratch[0], ins.scratch[0] + ins.scratch[1],
                                f"the scratch of instruction {t}"))
            t += 1
    for vid, (first, last) in spans.items():
        start = exe.offsets[vid]
        end = start + value_nbytes(*exe.values[vid])
        if end > start:
            buffers.append((first, last, start, end, f"value %{vid}"))
    buffers.sort()
    live: list[tuple] = []
    for buf in buffers:
        live = [b for b in live if b[1] >= buf[0]]
        for other in live:
            if other[2] < buf[3] and buf[2] < other[3]:
                raise _fail(f"the memory plan puts {buf[4]} (bytes {buf[2]}..{buf[3]}) over "
                            f"{other[4]} (bytes {other[2]}..{other[3]}) while both are in use "
                            f"(instructions {max(buf[0], other[0])}..{min(buf[1], other[1])})")
        live.append(buf)


def check_executable(exe: Executable) -> None:
    """Raise `ExecutableError` naming the first inconsistency in `exe`."""
    _check_metadata(exe)
    _check_types(exe)
    if len(exe.input_values) != len(exe.inputs) or len(exe.output_values) != len(exe.outputs):
        raise _fail(f"{len(exe.inputs)} input(s) and {len(exe.outputs)} output(s) but "
                    f"{len(exe.input_values)} and {len(exe.output_values)} value ids")
    for sig, value in zip(exe.inputs, exe.input_values):
        _check_sig(sig, value, exe, "input", allow_const=False)
    for sig, value in zip(exe.outputs, exe.output_values):
        _check_sig(sig, value, exe, "output", allow_const=True)
    inputs = set(exe.input_values)
    if len(inputs) != len(exe.inputs):
        raise _fail("two inputs share one value")
    outputs = set(exe.output_values)
    if len(outputs) != len(exe.outputs):
        raise _fail("two outputs share one value (the compiler copies one of them)")
    external = inputs | outputs
    for vid, offset in exe.offsets.items():
        if type(vid) is not int or vid not in exe.values:
            raise _fail(f"the memory plan places value %{vid}, which the file does not define")
        if vid in external:
            raise _fail(f"the memory plan places value %{vid}, an input or output, in the arena "
                        "(those live outside it)")
        nbytes = value_nbytes(*exe.values[vid])
        if not _is_count(offset) or offset + nbytes > exe.arena_bytes:
            raise _fail(f"the memory plan places value %{vid} ({nbytes} bytes) at offset "
                        f"{offset!r}, outside the {exe.arena_bytes}-byte arena")
    produced = _check_programs(exe, external)
    _check_overlaps(exe)
    for sig, value in zip(exe.outputs, exe.output_values):
        if value not in exe.constants and value not in produced:
            raise _fail(f"output {sig.name!r} (value %{value}) is never written by any "
                        "instruction")
