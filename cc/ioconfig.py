"""The io-config: which tensors are the compiled graph's inputs and outputs.

JSON, inline or in a file:
  {"inputs": {"x:0": [[1, 224, 224, 3], "float32"]}, "outputs": ["logits:0"]}
An input entry may add a third element, its batch axis (default 0; -1 = none).
`outputs` may instead map names to batch axes: {"logits:0": 0}.

Two kinds of trouble, told apart because they mean different things to the user:
an io-config that is not well-formed (not JSON, wrong structure, a name that is
not `node:index`) is bad usage and raises `BadIOConfig` at once; one that is
well-formed but asks for something the device cannot do (a dim of -1, a dtype it
does not hold, a batch axis past the rank) is recorded in `IOConfig.problems`, so
the compiler reports it together with every problem of the graph.

Sizes are bounded up front: a file is read up to MAX_IO_CONFIG_BYTES (so
`--io-config /dev/zero` is refused, not read forever), JSON nested too deeply or
holding numbers Python refuses to convert is bad usage, and a tensor may declare
at most MAX_TENSOR_ELEMENTS elements and MAX_RANK dims.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np

from neuronish import contracts
from neuronish.runtime.signature import TensorSignature

from .errors import BadIOConfig

DEVICE_DTYPES = contracts.DEVICE_DTYPES
_TENSOR_NAME = re.compile(r"[^:]+:\d+")
MAX_IO_CONFIG_BYTES = 16 << 20
MAX_TENSOR_ELEMENTS = 2**31 - 1
MAX_RANK = 8


@dataclass(frozen=True)
class IOProblem:
    """A well-formed io-config entry the device cannot take."""

    tensor: str
    reason: str
    hint: str = "fix the io-config"


@dataclass(frozen=True)
class IOConfig:
    inputs: tuple[TensorSignature, ...]  # only the entries without problems
    outputs: tuple[str, ...]
    output_batch_axes: tuple[int | None, ...]  # None: decide from shapes
    problems: tuple[IOProblem, ...] = ()
    # The inputs whose entry states its batch axis. When none does (every axis is the
    # default 0), a graph that mixes samples is compiled for a fixed batch instead of
    # refused (cc/lower.py).
    given_batch_axes: frozenset[str] = frozenset()

    def to_json(self) -> dict:
        """The io-config as `parse_io_config` read it (inputs without problems): a batch
        axis only where one was given, `outputs` a map only when it was one."""
        inputs = {s.name: [list(s.shape), s.dtype, s.batch_axis]
                  if s.name in self.given_batch_axes else [list(s.shape), s.dtype]
                  for s in self.inputs}
        outputs: list | dict = list(self.outputs)
        if any(axis is not None for axis in self.output_batch_axes):
            outputs = dict(zip(self.outputs, self.output_batch_axes))
        return {"inputs": inputs, "outputs": outputs}


_EXAMPLE = ('expected e.g. {"inputs": {"x:0": [[1, 224, 224, 3], "float32"]}, '
            '"outputs": ["logits:0"]}')


def _bad(where: str, expected: str, got: object) -> BadIOConfig:
    return BadIOConfig(f"io-config {where}: expected {expected}, got {got!r}")


def _read_file(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_IO_CONFIG_BYTES + 1)
    except OSError as e:
        raise BadIOConfig(f"{path!r} is neither JSON nor a readable file ({e.strerror}); "
                          f"{_EXAMPLE}") from None
    if len(data) > MAX_IO_CONFIG_BYTES:
        raise BadIOConfig(f"io-config file {path!r} is larger than {MAX_IO_CONFIG_BYTES} bytes; "
                          f"{_EXAMPLE}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadIOConfig(f"io-config file {path!r} is not UTF-8 text (byte {e.start}); "
                          f"{_EXAMPLE}") from None


def _read(text_or_path: str | dict) -> object:
    if isinstance(text_or_path, dict):
        return text_or_path
    text = text_or_path.strip()
    if not text.startswith(("{", "[")):  # otherwise a path
        text = _read_file(text_or_path)
    if len(text) > MAX_IO_CONFIG_BYTES:
        raise BadIOConfig(f"io-config is larger than {MAX_IO_CONFIG_BYTES} bytes")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadIOConfig(f"io-config is not valid JSON ({e}); {_EXAMPLE}") from None
    except RecursionError:
        raise BadIOConfig(f"io-config JSON is nested too deeply; {_EXAMPLE}") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise BadIOConfig(f"io-config is not valid JSON ({e}); {_EXAMPLE}") from None


def _input(name: object, entry: object, problems: list[IOProblem]) -> TensorSignature | None:
    where = f'inputs["{name}"]'
    if not isinstance(name, str) or not _TENSOR_NAME.fullmatch(name):
        raise _bad(where, "a tensor name like 'x:0'", name)
    if not isinstance(entry, list) or len(entry) not in (2, 3):
        raise _bad(where, "[shape, dtype] or [shape, dtype, batch_axis]", entry)
    shape, dtype = entry[0], entry[1]
    if not isinstance(shape, list) or not all(type(d) is int for d in shape):
        raise _bad(f"{where} shape", "a list of ints", shape)
    if not isinstance(dtype, str):
        raise _bad(f"{where} dtype", "a dtype name such as 'float32'", dtype)
    batch_axis = entry[2] if len(entry) == 3 else (0 if shape else -1)
    if type(batch_axis) is not int:
        raise _bad(f"{where} batch axis", "an int (-1 for none)", batch_axis)
    before = len(problems)
    if len(shape) > MAX_RANK:
        problems.append(IOProblem(name, f"io-config input {name!r} has rank {len(shape)}; the "
                                  f"device takes at most {MAX_RANK} dims"))
    elif any(d < 0 for d in shape):
        problems.append(IOProblem(name, f"io-config input {name!r} has shape {shape}, which is "
                                  "not fully known",
                                  "give every dim (>= 0): the device compiles static shapes, "
                                  "so give the batch size you will run most"))
    elif math.prod(shape) > MAX_TENSOR_ELEMENTS:
        problems.append(IOProblem(name, f"io-config input {name!r} has shape {shape}: "
                                  f"{math.prod(shape)} elements, more than the device takes in "
                                  f"one tensor ({MAX_TENSOR_ELEMENTS})",
                                  "compile for a smaller batch; larger calls are split"))
    try:
        dtype = np.dtype(dtype).name
    except Exception:  # numpy raises TypeError, ValueError, ... for names it does not know
        pass  # not a numpy name (e.g. "bfloat16", "string"): refused just below
    if dtype not in DEVICE_DTYPES:
        problems.append(IOProblem(name, f"io-config input {name!r} has dtype {dtype!r}, which the "
                                  f"device does not hold ({', '.join(DEVICE_DTYPES)})",
                                  "keep this tensor on TensorFlow, or cast it to one of those "
                                  "first"))
    if not -1 <= batch_axis < len(shape):  # a scalar has no axis to batch on
        problems.append(IOProblem(name, f"io-config input {name!r} has batch axis {batch_axis}, "
                                  f"outside its shape {shape}", f"use -1 (none) or an axis in "
                                  f"[0, {len(shape)})"))
    return TensorSignature(name, dtype, tuple(shape), batch_axis) \
        if len(problems) == before else None


def parse_io_config(text_or_path: str | dict | IOConfig) -> IOConfig:
    """Parse an io-config given as a dict, a JSON string, or a path to a JSON file.

    Raises `BadIOConfig` if it is not well-formed; entries the device cannot take are
    listed in the result's `problems`."""
    if isinstance(text_or_path, IOConfig):
        return text_or_path
    raw = _read(text_or_path)
    if not isinstance(raw, dict) or set(raw) - {"inputs", "outputs"}:
        raise _bad("top level", 'an object with keys "inputs" and "outputs"', raw)
    ins = raw.get("inputs", {})
    if not isinstance(ins, dict):
        raise _bad('"inputs"', "an object mapping tensor names to [shape, dtype]", ins)
    problems: list[IOProblem] = []
    specs = [s for name, entry in ins.items() if (s := _input(name, entry, problems))]
    given = frozenset(s.name for s in specs if len(ins[s.name]) == 3)
    outs = raw.get("outputs")
    if isinstance(outs, dict):
        names, axes = list(outs), list(outs.values())
    elif isinstance(outs, list):
        names, axes = outs, [None] * len(outs)
    else:
        raise _bad('"outputs"', "a list of tensor names", outs)
    if not names:
        raise _bad('"outputs"', "at least one tensor name", outs)
    for name, axis in zip(names, axes):
        if not isinstance(name, str) or not _TENSOR_NAME.fullmatch(name):
            raise _bad('"outputs"', "tensor names like 'y:0'", name)
        if axis is not None and type(axis) is not int:
            raise _bad(f'"outputs"["{name}"] batch axis', "an int (-1 for none)", axis)
    return IOConfig(tuple(specs), tuple(names), tuple(axes), tuple(problems), given)
