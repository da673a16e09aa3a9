"""A model of the device: what one instruction would cost on a real accelerator.

The simulated device computes real results on the host's CPUs; how long that
takes says nothing about the accelerator it stands for. This module gives each
instruction a *modelled* device time from a `DeviceDescription` by a roofline:

    seconds = overhead + max(flops / peak[unit][dtype], bytes_moved / bandwidth)

- unit: `matmul` and `conv2d` run on the matrix (tensor) unit, everything else
  on the vector unit.
- dtype: the operands' dtype, or the `--auto-cast` type for the instructions
  auto-cast rounds (matrix ones with `matmult`, every float one with `all`), so
  bf16 is faster than fp32 as on the hardware (higher peak, half the bytes).
- bytes moved: weights (constants), the executable's inputs and outputs, and
  intermediates too large for the on-core buffer travel over device memory;
  intermediates that fit stay on-core and cost nothing.

A program runs on one core; a model compiled for N pipeline cores has N
programs, one per core of its core group. Latency of one call = sum of the
stage times; throughput of the group = batch / the slowest stage (stages
overlap in steady state). Nothing here is measured: see docs/device-model.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from neuronish.runtime import isa
from neuronish.runtime.executable import Executable, Instruction
from neuronish.runtime.files import FileRefused, read_json

from .errors import CompilerError
from .signature import attrs_key

ENV_VAR = "NEURONISH_DEVICE_MODEL"
MAX_DEVICE_MODEL_BYTES = 1 << 20  # a dozen numbers; a file past this is not one
MATRIX_KINDS = frozenset({"matmul", "conv2d"})
_CAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


class DeviceModelError(CompilerError):
    """A device description file is missing, malformed or has impossible figures."""


@dataclass(frozen=True)
class DeviceDescription:
    name: str
    source: str  # where the figures come from
    cores: int
    memory_per_core: int  # bytes of device memory per core
    matrix_flops: dict[str, float]  # per core: dtype -> peak FLOP/s of the matrix unit
    vector_flops: dict[str, float]  # per core: dtype -> peak FLOP/s of the vector unit
    memory_bandwidth: float  # bytes/s between device memory and one core
    on_core_buffer: int  # bytes of on-core SRAM (intermediates that fit stay there)
    instruction_overhead: float  # seconds every instruction costs before any work

    def peak(self, unit: str, dtype: str) -> float:
        """Peak FLOP/s; a dtype the unit has no figure for runs at its slowest listed rate."""
        table = self.matrix_flops if unit == "matrix" else self.vector_flops
        return table.get(dtype, min(table.values()))


# AWS Inferentia2 (one chip: two NeuronCore-v2), from AWS's published figures
# (Neuron documentation, "Inferentia2 Architecture" and "NeuronCore-v2
# Architecture"): per chip 190 TFLOPS FP16/BF16, 47.5 TFLOPS FP32, 380 INT8 TOPS,
# 32 GiB HBM at 820 GB/s; per core a VectorEngine of 2.3 FP32 TFLOPS and 24 MiB
# of on-chip SRAM (SBUF). Per core is per chip / 2. The vector unit has one
# published figure (FP32), used for every dtype. The per-instruction overhead is
# not published: 2 us is our assumption for one instruction (a whole layer here)
# to be issued and its engines synchronised.
INFERENTIA2 = DeviceDescription(
    name="inferentia2-like",
    source="AWS Inferentia2 / NeuronCore-v2 published figures; overhead assumed",
    cores=2,
    memory_per_core=16 * 2**30,
    matrix_flops={"float32": 23.75e12, "bfloat16": 95e12, "float16": 95e12, "int8": 190e12},
    vector_flops={"float32": 2.3e12},
    memory_bandwidth=410e9,
    on_core_buffer=24 * 2**20,
    instruction_overhead=2e-6,
)


def load_device(path: str | os.PathLike | None = None) -> DeviceDescription:
    """The description in `path`, else in `$NEURONISH_DEVICE_MODEL`, else `INFERENTIA2`.

    A file is JSON with any of `DeviceDescription`'s fields; fields it leaves out
    keep the default's values."""
    path = path or os.environ.get(ENV_VAR)
    if not path:
        return INFERENTIA2
    try:
        raw = read_json(path, MAX_DEVICE_MODEL_BYTES, "device model")
    except FileRefused as e:
        raise DeviceModelError(f"device model {path}: {e.strerror}") from None
    except OSError as e:
        raise DeviceModelError(f"device model {path}: cannot read: {e.strerror}") from None
    if not isinstance(raw, dict):
        raise DeviceModelError(f"device model {path}: expected a JSON object of fields, "
                               f"got {type(raw).__name__}")
    known = {f.name for f in fields(DeviceDescription)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise DeviceModelError(f"device model {path}: unknown field(s) {unknown}; the fields "
                               f"are {sorted(known)}")
    merged = {**asdict(INFERENTIA2), "name": Path(path).stem, "source": str(path), **raw}
    _check(merged, str(path))
    return DeviceDescription(**merged)


def _check(d: dict, where: str) -> None:
    def positive(name: str, value: object) -> None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value > 0
        if not ok:
            raise DeviceModelError(f"device model {where}: {name} must be a positive number, "
                                   f"got {value!r}")

    for name in ("cores", "memory_per_core", "memory_bandwidth", "on_core_buffer"):
        positive(name, d[name])
    if not isinstance(d["instruction_overhead"], (int, float)) or d["instruction_overhead"] < 0:
        raise DeviceModelError(f"device model {where}: instruction_overhead must be >= 0 "
                               f"seconds, got {d['instruction_overhead']!r}")
    for table in ("matrix_flops", "vector_flops"):
        if not isinstance(d[table], dict) or not d[table]:
            raise DeviceModelError(f"device model {where}: {table} must be a non-empty object "
                                   f"of dtype -> FLOP/s, got {d[table]!r}")
        for dtype, value in d[table].items():
            positive(f"{table}[{dtype!r}]", value)


@dataclass(frozen=True)
class Cost:
    """The modelled cost of one instruction."""

    seconds: float
    flops: int
    bytes: int  # moved over device memory
    unit: str  # matrix or vector
    dtype: str  # the dtype it computes in
    bound: str  # compute, memory or overhead: what sets the time


@dataclass(frozen=True)
class Estimate:
    device: str
    batch: int  # the compiled batch (1 when no input has a batch axis)
    costs: list[list[Cost]]  # per program (core), per instruction

    @property
    def stage_seconds(self) -> list[float]:
        return [sum(c.seconds for c in program) for program in self.costs]

    @property
    def latency(self) -> float:
        """Seconds from a call's start to its end, through every stage."""
        return sum(self.stage_seconds)

    @property
    def throughput(self) -> float:
        """Inferences (batch rows) per second of one core group, stages overlapping."""
        slowest = max(self.stage_seconds, default=0.0)
        return self.batch / slowest if slowest > 0 else 0.0

    def to_stats(self) -> dict:
        """The executable's optional `stats.device_model` entry."""
        return {"device": self.device, "batch": self.batch,
                "latency_seconds": self.latency, "throughput_per_second": self.throughput,
                "stage_seconds": self.stage_seconds,
                "instruction_seconds": [[c.seconds for c in p] for p in self.costs]}


def estimate(exe: Executable, device: DeviceDescription) -> Estimate:
    options = exe.compiler.get("options", {})
    cast = _CAST_DTYPES.get(options.get("auto_cast_type", "bf16"), "bfloat16")
    mode = options.get("auto_cast", "none")
    boundary = {*exe.input_values, *exe.output_values}
    types = ValueTypes(exe)
    # An instruction's cost follows from its kind, attributes, operand types and which
    # operands travel anyway (constants, inputs, outputs): a large graph repeats a few.
    seen: dict[object, Cost] = {}
    costs = []
    for program in exe.programs:
        row = []
        for ins in program:
            in_types = [types[v] for v in ins.inputs]
            out_types = [types[v] for v in ins.outputs]
            key = _cost_key(ins, in_types, out_types, exe, boundary)
            cost = seen.get(key) if key is not None else None
            if cost is None:
                cost = _cost(ins, in_types, out_types, exe, device, mode, cast, boundary)
                if key is not None:
                    seen[key] = cost
            row.append(cost)
        costs.append(row)
    batch = next((s.shape[s.batch_axis] for s in exe.inputs if s.batch_axis >= 0), 1)
    return Estimate(device.name, int(batch), costs)


class ValueTypes(dict):
    """value id -> (shape, dtype name), constants' read from their arrays (a dtype's
    name is slow to ask numpy for: asked once per dtype). A plain dict, filled once:
    looked up a few times per instruction, a Python-level `__getitem__` cost a
    200,000-instruction executable ~0.5 s in each of the device model and the numpy
    report."""

    def __init__(self, exe: Executable):
        super().__init__(exe.values)
        names: dict[np.dtype, str] = {}
        for vid, a in exe.constants.items():  # (a constant's own type wins, as it did)
            name = names.get(a.dtype)
            if name is None:
                name = names[a.dtype] = a.dtype.name
            self[vid] = (tuple(a.shape), name)


def _cost_key(ins: Instruction, in_types: list, out_types: list, exe: Executable,
              boundary: set[int]) -> tuple | None:
    """What `_cost` depends on besides the device and the auto-cast options (the same for
    a whole executable); None if some part cannot be keyed (a list-valued shape from a
    file, an array attribute)."""
    attrs = attrs_key(ins.attrs)
    if attrs is None:
        return None
    constants = exe.constants
    travels = tuple([v in constants or v in boundary for v in (*ins.inputs, *ins.outputs)])
    key = (ins.kind, attrs, tuple(in_types), tuple(out_types), travels)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _cost(ins: Instruction, in_types: list, out_types: list, exe: Executable,
          device: DeviceDescription, mode: str, cast: str, boundary: set[int]) -> Cost:
    unit = "matrix" if ins.kind in MATRIX_KINDS else "vector"
    dtype = in_types[0][1] if in_types else out_types[0][1]
    rounded = (mode == "matmult" and unit == "matrix") or mode == "all"
    if rounded and dtype == "float32":
        dtype = cast
    moved = 0
    for v, (shape, dt) in zip((*ins.inputs, *ins.outputs), (*in_types, *out_types)):
        stored = cast if rounded and dt == "float32" else dt  # the device keeps 16 bits
        itemsize = 2 if stored == "bfloat16" else np.dtype(stored).itemsize
        size = int(np.prod(shape, dtype=np.int64)) * itemsize
        if v in exe.constants or v in boundary or size > device.on_core_buffer:
            moved += size
    work = _flops(ins, in_types, out_types)
    compute = work / device.peak(unit, dtype)
    memory = moved / device.memory_bandwidth
    busy = max(compute, memory)
    bound = "overhead" if busy < device.instruction_overhead else \
        ("compute" if compute >= memory else "memory")
    return Cost(device.instruction_overhead + busy, work, moved, unit, dtype, bound)


def _flops(ins: Instruction, in_types: list, out_types: list) -> int:
    """Arithmetic of one instruction (runtime/isa.py's rule)."""
    return isa.flops(ins.kind, [shape for shape, _ in in_types],
                     [shape for shape, _ in out_types], ins.attrs)
