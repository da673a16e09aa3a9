"""One loaded copy of a program: its arena, its bound instructions, `execute`.

Everything that can be decided at load time is: each intermediate value's view
into the arena, each instruction's kernel and scratch view. A call only fills
in the input arrays and the output arrays, then runs the instructions in order.
A copy runs one call at a time (the Model hands copies out one per call).
Binding trusts the ids, offsets and kinds that runtime/validate.py checked when
the executable was read.

On the native engine, each instruction is first offered to oneDNN
(runtime/native/); the ones it takes run there, consecutive ones in a single
foreign call with the GIL released, and the others run on their numpy reference
kernel in between, reading and writing the very same arena, constant and I/O
buffers (nothing is copied between engines).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from . import profiler
from .errors import ExecutionError
from .executable import Executable
from .kernels import KERNELS
from .kernels.registry import KernelFn
from .native.program import NativeProgram
from .native.spec import WINDOWED, Ref
from .validate import value_nbytes


@dataclass(frozen=True)
class _Bound:
    fn: KernelFn
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: dict
    scratch: np.ndarray | None
    kind: str
    source: tuple[str, ...]


@dataclass(frozen=True)
class _NativeRun:
    """Engine instructions [first, last): program instructions `indices`."""

    first: int
    last: int
    indices: tuple[int, ...]


def aligned_empty(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes]


class LoadedProgram:
    def __init__(self, exe: Executable, constants: dict[int, np.ndarray],
                 native: ctypes.CDLL | None = None, threads: int = 1):
        self.exe = exe
        self.arena = aligned_empty(max(exe.arena_bytes, 1))
        n_values = 1 + max([*exe.values, *constants, -1])
        slots: list[np.ndarray | None] = [None] * n_values
        for vid, array in constants.items():
            slots[vid] = array
        for vid, offset in exe.offsets.items():
            shape, dtype = exe.values[vid]
            slots[vid] = self.arena[offset:offset + value_nbytes(shape, dtype)].view(
                dtype).reshape(shape)
        self.slots = slots
        flat = [i for program in exe.programs for i in program]
        self.instructions = [
            _Bound(KERNELS[i.kind].fn, i.inputs, i.outputs, i.attrs,
                   self.arena[i.scratch[0]:i.scratch[0] + i.scratch[1]] if i.scratch else None,
                   i.kind, i.source)
            for i in flat
        ]
        self.native: NativeProgram | None = None
        self.steps: list[_Bound | _NativeRun] = list(self.instructions)
        self.blocked: frozenset[int] = frozenset()  # values the engine keeps nChw16c
        if native is not None:
            self._build_native(native, threads, constants)

    # -- the native engine -----------------------------------------------------
    def _build_native(self, lib: ctypes.CDLL, threads: int,
                      constants: dict[int, np.ndarray]) -> None:
        blocked = self._blockable(constants)
        while True:
            prog, steps = self._native_program(lib, threads, constants, blocked)
            # A value stays blocked only if the engine took its producer and every reader,
            # each with a real kernel (oneDNN falls back to its slow reference kernel for
            # layout mixes it has no kernel for).
            slow = [i for i, k in prog.engine_index.items()
                    if prog.implementation(k).startswith("ref")]
            refused = {v for i in (*prog.rejected, *slow)
                       for v in (*self.instructions[i].inputs, *self.instructions[i].outputs)
                       if v in blocked}
            if not refused:
                break
            blocked -= refused
        prog.finalize()
        self.native, self.steps, self.blocked = prog, steps, frozenset(blocked)

    def _blockable(self, constants: dict[int, np.ndarray]) -> set[int]:
        """Values the compiler marked for a channel-blocked layout (docs/isa.md, `layout`)
        whose producer and readers the native engine implements."""
        marked = {ins.outputs[0]: ins for ins in self.instructions
                  if ins.attrs.get("layout", "nhwc") != "nhwc" and len(ins.outputs) == 1}
        readers: dict[int, list[_Bound]] = {}
        for ins in self.instructions:
            for v in ins.inputs:
                if v in marked:
                    readers.setdefault(v, []).append(ins)
        external = {s.value for s in (*self.exe.inputs, *self.exe.outputs)}
        return {v for v, producer in marked.items()
                if v not in external and readers.get(v)
                and all(r.kind in WINDOWED for r in readers[v])
                and producer.kind in WINDOWED}

    def _native_program(self, lib: ctypes.CDLL, threads: int, constants: dict[int, np.ndarray],
                        blocked: set[int]) -> tuple[NativeProgram, list[_Bound | _NativeRun]]:
        exe = self.exe
        const_ids = sorted(constants)
        self._first_call_slot = 1 + len(const_ids)
        call_ids = [s.value for s in exe.inputs] + [s.value for s in exe.outputs]
        prog = NativeProgram(lib, self._first_call_slot + len(call_ids), threads)
        prog.bind(0, self.arena)
        place: dict[int, tuple[int, int]] = {vid: (0, off) for vid, off in exe.offsets.items()}
        for k, vid in enumerate(const_ids):
            prog.bind(1 + k, np.asarray(constants[vid], order="C"))
            place[vid] = (1 + k, 0)
        for k, vid in enumerate(call_ids):
            place.setdefault(vid, (self._first_call_slot + k, 0))

        def ref(vid: int) -> Ref:
            slot, offset = place[vid]
            array = self.slots[vid]
            if array is not None:
                return Ref(slot, offset, array.dtype.name, tuple(array.shape), vid in blocked)
            shape, dtype = exe.values[vid]
            return Ref(slot, offset, dtype, tuple(shape), vid in blocked)

        steps: list[_Bound | _NativeRun] = []
        for index, ins in enumerate(self.instructions):
            k = prog.add(index, ins.kind, ins.attrs, [ref(v) for v in ins.inputs],
                         [ref(v) for v in ins.outputs], [v in constants for v in ins.inputs])
            if k is None:
                steps.append(ins)
            elif steps and isinstance(steps[-1], _NativeRun):
                last = steps[-1]
                steps[-1] = _NativeRun(last.first, k + 1, (*last.indices, index))
            else:
                steps.append(_NativeRun(k, k + 1, (index,)))
        return prog, steps

    def bytes_per_core(self) -> list[int]:
        """Device memory each core of the group holds for this copy: the constants its
        program reads where they are read as they are, the weights the native engine
        reordered in their place, the arena, and the engine's working buffers."""
        out = []
        index = 0
        for program in self.exe.programs:
            consts: set[int] = set()
            engine = 0
            for ins in program:
                reordered = self.native.weight_bytes.get(index, 0) if self.native else 0
                engine += reordered
                consts.update(v for k, v in enumerate(ins.inputs)
                              if v in self.exe.constants and not (reordered and k == 1))
                index += 1
            buffers = self.native.buffer_bytes if self.native else 0
            out.append(sum(self.exe.constants[v].nbytes for v in consts) + engine
                       + self.exe.arena_bytes + buffers)
        return out

    # -- a call ----------------------------------------------------------------
    def execute(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        """Run once: `inputs` in signature order (already validated, compiled shapes);
        results are written into `outputs` (compiled shapes, preallocated)."""
        slots = list(self.slots)
        for sig, x in zip(self.exe.inputs, inputs):
            slots[sig.value] = x
        for sig, out in zip(self.exe.outputs, outputs):
            if sig.value in self.exe.constants:
                out[...] = self.slots[sig.value]
            else:
                slots[sig.value] = out
        if self.native is not None:
            inputs = [np.asarray(x, order="C") for x in inputs]  # keeps 0-d arrays 0-d
            for sig, x in zip(self.exe.inputs, inputs):
                slots[sig.value] = x
            self.native.set_call_buffers([*inputs, *outputs])
        for step in profiler.steps(self.steps, self.instructions):  # timed if profiling
            if isinstance(step, _NativeRun):
                try:
                    self.native.run(step.first, step.last, self._first_call_slot)
                except ExecutionError as e:
                    names = sorted({n for i in step.indices for n in self.instructions[i].source})
                    raise ExecutionError(f"{e} (in the instructions from TF node(s) "
                                         f"{', '.join(names[:8]) or '?'})") from None
                continue
            try:
                step.fn([slots[i] for i in step.inputs], [slots[o] for o in step.outputs],
                        step.attrs, step.scratch)
            except Exception as e:  # report which model node failed, never crash
                raise ExecutionError(
                    f"device instruction {step.kind} (from TF node(s) "
                    f"{', '.join(step.source) or '?'}) failed: {type(e).__name__}: {e}") from e


def one_instruction_program(kind: str, inputs: list[np.ndarray], attrs: dict,
                            out_types: list[tuple[tuple[int, ...], str]], *,
                            constant: frozenset[int] = frozenset(),
                            native: ctypes.CDLL | None = None, threads: int = 1
                            ) -> tuple[LoadedProgram, list[np.ndarray]]:
    """One instruction as a loaded program on either engine, and its call inputs.

    Inputs whose positions are in `constant` are program constants (as weights are),
    the others call inputs (the second value returned, in order)."""
    from .executable import Instruction, TensorSig

    ins = [np.asarray(x, order="C") for x in inputs]
    scratch = KERNELS[kind].scratch_bytes([x.shape for x in ins], [x.dtype.name for x in ins],
                                          attrs)
    sig_in, consts, values = [], {}, {}
    for v, x in enumerate(ins):
        if v in constant:
            consts[v] = x
        else:
            sig_in.append(TensorSig(f"in{v}", v, x.shape, x.dtype.name, -1))
            values[v] = (x.shape, x.dtype.name)
    out_ids = list(range(len(ins), len(ins) + len(out_types)))
    for v, (shape, dtype) in zip(out_ids, out_types):
        values[v] = (tuple(shape), dtype)
    exe = Executable(
        compiler={}, inputs=sig_in,
        outputs=[TensorSig(f"out{k}", v, tuple(s), d, -1)
                 for k, (v, (s, d)) in enumerate(zip(out_ids, out_types))],
        constants=consts, values=values, arena_bytes=scratch, offsets={},
        programs=[[Instruction(kind, tuple(range(len(ins))), tuple(out_ids), attrs,
                               (0, scratch) if scratch else None, ())]])
    return LoadedProgram(exe, consts, native, threads), [x for k, x in enumerate(ins)
                                                          if k not in constant]


def evaluate_one(kind: str, inputs: list[np.ndarray], attrs: dict,
                 out_types: list[tuple[tuple[int, ...], str]], *,
                 constant: frozenset[int] = frozenset(), native: ctypes.CDLL | None = None,
                 threads: int = 1) -> tuple[list[np.ndarray], str]:
    """Run one instruction on either engine; returns the outputs and the engine that ran
    it ("native" or "numpy"); the per-op tests run every kind both ways."""
    program, call_inputs = one_instruction_program(kind, inputs, attrs, out_types,
                                                   constant=constant, native=native,
                                                   threads=threads)
    outs = [np.empty(s, d) for s, d in out_types]
    program.execute(call_inputs, outs)
    ran = "native" if program.native is not None and not program.native.rejected else "numpy"
    return outs, ran
