"""One loaded copy of a program: its stages, its arenas, `execute`.

Everything that can be decided at load time is: each intermediate value's view
into an arena, each instruction's kernel and scratch. A call only binds its input
and output arrays, then runs the instructions in order. Binding trusts the ids,
offsets and kinds that runtime/validate.py checked when the executable was read.

An executable holds one program per core of its core group (pipeline stages,
`--neuroncore-pipeline-cores`). Each stage runs on its own core: one call at a time
per stage, so successive calls (or the chunks of a split batch) flow through the
stages concurrently, call k in stage 1 while call k+1 is in stage 0. Each call in
flight has its own arena (a copy holds one per stage), and each stage takes as many
of the host's CPUs as its widest team only while it computes (runtime/host.py).

On the native engine, each instruction is first offered to oneDNN
(runtime/native/); the ones it takes run there, consecutive ones in a single
foreign call with the GIL released, and the others run on their numpy reference
kernel in between, reading and writing the very same arena, constant and I/O
buffers (nothing is copied between engines).
"""

from __future__ import annotations

import contextlib
import ctypes
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import profiler
from .cutoff import Cutoff
from .errors import ExecutableError, ExecutionError
from .executable import Executable
from .host import HostCPUs, Slot
from .isa import MATMUL_LIKE
from .kernels import KERNELS
from .kernels.registry import KernelFn
from .native.engine_program import NativeProgram, Offer, WeightPool
from .native.spec import WINDOWED, Ref
from .validate import value_nbytes

_MID_CALL = "while its instructions ran"  # where a Cutoff stopped a call


def _take(lock: threading.Lock | Slot, cutoff: Cutoff) -> None:
    """`lock.acquire()`, giving up once `cutoff` says stop (Cancelled, DeadlineExceeded)."""
    if lock.acquire(False):  # (free: the common case, without a timed wait)
        return
    if isinstance(lock, Slot):  # waits in line for the host's CPUs, keeping its place
        while not lock.host.acquire(lock.width, give_up=cutoff.stopped):
            cutoff.check("while it waited for the host's CPUs (busy with other calls)")
        return
    while True:
        wait = cutoff.wait_slice()
        if lock.acquire(timeout=-1 if wait is None else wait):
            return
        cutoff.check("while it waited for a core (busy with other calls)")


@dataclass(frozen=True)
class _Bound:
    """One instruction on its numpy kernel."""

    fn: KernelFn
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: dict
    scratch: tuple[int, int] | None  # (arena offset, bytes)
    kind: str
    source: tuple[str, ...]


@dataclass(frozen=True)
class _NativeRun:
    """Engine instructions [first, last) of a stage: program instructions `indices`."""

    first: int
    last: int
    indices: tuple[int, ...]


def aligned_empty(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes]


class _Arena:
    """One call's working memory, and every value's array: constants, and views of
    the intermediates at their planned offsets."""

    def __init__(self, exe: Executable, constants: dict[int, np.ndarray]):
        self.buf = aligned_empty(max(exe.arena_bytes, 1))
        self.address = self.buf.ctypes.data
        slots: list[np.ndarray | None] = [None] * (1 + max([*exe.values, *constants, -1]))
        for vid, array in constants.items():
            slots[vid] = array
        for vid, offset in exe.offsets.items():
            shape, dtype = exe.values[vid]
            slots[vid] = self.buf[offset:offset + value_nbytes(shape, dtype)].view(
                dtype).reshape(shape)
        self.slots = slots


class _Stage:
    """One core's program: its steps, and the native program running its share."""

    def __init__(self, index: int, span: range):
        self.index = index
        self.span = span  # its instructions' indices in the flat list
        self.steps: list[_Bound | _NativeRun] = []
        self.native: NativeProgram | None = None
        self.lock = threading.Lock()  # a core runs one call at a time
        self.host: contextlib.AbstractContextManager = contextlib.nullcontext()  # its CPUs


class LoadedProgram:
    def __init__(self, exe: Executable, constants: dict[int, np.ndarray],
                 native: ctypes.CDLL | None = None, threads: int = 1,
                 host: HostCPUs | None = None, weights: WeightPool | None = None):
        self.exe = exe
        self.instructions = [
            _Bound(KERNELS[i.kind].fn, i.inputs, i.outputs, i.attrs,
                   tuple(i.scratch) if i.scratch else None, i.kind, i.source)
            for program in exe.programs for i in program
        ]
        self._check_scratch(constants)
        self.stages: list[_Stage] = []
        start = 0
        for k, program in enumerate(exe.programs):
            self.stages.append(_Stage(k, range(start, start + len(program))))
            start += len(program)
        # One arena per call in flight: as many as there are stages.
        self.depth = max(1, len(self.stages))
        self._arenas: queue.SimpleQueue[_Arena] = queue.SimpleQueue()
        arenas = [_Arena(exe, constants) for _ in range(self.depth)]
        for arena in arenas:
            self._arenas.put(arena)
        self.slots = arenas[0].slots  # the value types, for the engine's references
        for stage in self.stages:
            stage.steps = [self.instructions[i] for i in stage.span]
        self.blocked: frozenset[int] = frozenset()  # values the engine keeps nChw16c
        self.widenable: frozenset[int] = frozenset()  # bf16 values kept in float32
        self._native = native is not None
        if native is not None:
            self._build_native(native, threads, constants, weights)
        # Decided once here, not on every call:
        if host is not None:
            for stage in self.stages:
                stage.host = host.take(self._width(stage, threads))
        self._constant_outputs = [(k, vid) for k, vid in enumerate(exe.output_values)
                                  if vid in exe.constants]
        self._numpy_steps = any(isinstance(step, _Bound) for step in self.steps)

    @staticmethod
    def _width(stage: _Stage, threads: int) -> int:
        """The host CPUs a stage computes on: its widest native team, and `threads` if a
        numpy kernel that spreads over threads runs in it (BLAS GEMMs, the windowed
        kernels' lanes); numpy's other kernels run on the calling thread."""
        width = stage.native.widest if stage.native is not None else 1
        for step in stage.steps:
            if isinstance(step, _Bound) and (step.kind in MATMUL_LIKE or step.kind in WINDOWED):
                width = threads
        return max(width, 1)

    def _check_scratch(self, constants: dict[int, np.ndarray]) -> None:
        """Each instruction's planned scratch holds what its reference kernel will use
        (a file can be consistent and still plan too little: refuse it now, not mid-call)."""
        def typ(v: int) -> tuple[tuple[int, ...], str]:
            if v in constants:
                return tuple(constants[v].shape), constants[v].dtype.name
            return self.exe.values[v]

        for index, ins in enumerate(self.instructions):
            types = [typ(v) for v in ins.inputs]
            need = KERNELS[ins.kind].scratch_bytes([t[0] for t in types], [t[1] for t in types],
                                                   ins.attrs)
            have = ins.scratch[1] if ins.scratch else 0
            if need > have:
                raise ExecutableError(
                    f"instruction {index} ({ins.kind}, from TF node(s) "
                    f"{', '.join(ins.source) or '?'}) has {have} bytes of scratch memory; its "
                    f"kernel needs {need}. Recompile the model with this neuronish")

    @property
    def steps(self) -> list[_Bound | _NativeRun]:
        return [step for stage in self.stages for step in stage.steps]

    # -- the native engine -----------------------------------------------------
    def _build_native(self, lib: ctypes.CDLL, threads: int, constants: dict[int, np.ndarray],
                      weights: WeightPool | None) -> None:
        # Every stage's engine slots: the constants, then a call's arena, inputs, outputs.
        self._first_call_slot = len(constants)
        blocked = self._blockable()
        widenable = self._widenable()
        while True:
            built = [self._native_stage(lib, threads, constants, blocked, widenable, st, weights)
                     for st in self.stages]
            if widenable and any(prog.rejected for prog, _ in built):
                widenable = set()  # a numpy kernel reads the arena: every value stays there
                continue
            # A value stays blocked only if the engine took its producer and every reader,
            # each with a real kernel (oneDNN falls back to its slow reference kernel for
            # layout mixes it has no kernel for).
            refused = set()
            for prog, _ in built:
                slow = [i for i, k in prog.engine_index.items()
                        if prog.implementation(k).startswith("ref")]
                refused |= {v for i in (*prog.rejected, *slow)
                            for v in (*self.instructions[i].inputs,
                                      *self.instructions[i].outputs) if v in blocked}
            if not refused:
                break
            blocked -= refused
        for stage, (prog, steps) in zip(self.stages, built):
            prog.finalize()
            stage.native, stage.steps = prog, steps
        self.blocked = frozenset(blocked)
        self.widenable = frozenset(widenable)

    def _widenable(self) -> set[int]:
        """The bfloat16 values the engine may keep in float32 (engine.cc `widened_slot`):
        those in the arena of a one-stage program, so only its native instructions touch
        them (a call's inputs and outputs and a pipeline's hand-offs are left as they are)."""
        if len(self.stages) != 1:
            return set()
        external = {*self.exe.input_values, *self.exe.output_values}
        return {v for v in self.exe.offsets
                if v not in external and self.exe.values[v][1] == "bfloat16"}

    def _blockable(self) -> set[int]:
        """Values the compiler marked for a channel-blocked layout (docs/isa.md, `layout`)
        whose producer and readers are windowed instructions."""
        marked = {ins.outputs[0]: ins for ins in self.instructions
                  if ins.attrs.get("layout", "nhwc") != "nhwc" and len(ins.outputs) == 1}
        readers: dict[int, list[_Bound]] = {}
        for ins in self.instructions:
            for v in ins.inputs:
                if v in marked:
                    readers.setdefault(v, []).append(ins)
        external = {*self.exe.input_values, *self.exe.output_values}
        return {v for v, producer in marked.items()
                if v not in external and readers.get(v)
                and all(r.kind in WINDOWED for r in readers[v])
                and producer.kind in WINDOWED}

    def _native_stage(self, lib: ctypes.CDLL, threads: int, constants: dict[int, np.ndarray],
                      blocked: set[int], widenable: set[int], stage: _Stage,
                      weights: WeightPool | None = None
                      ) -> tuple[NativeProgram, list[_Bound | _NativeRun]]:
        """A stage's native program. Slots: the constants, then per call the arena, the
        call's inputs and its outputs."""
        exe = self.exe
        const_ids = sorted(constants)
        call_ids = [*exe.input_values, *exe.output_values]
        arena_slot = self._first_call_slot
        place: dict[int, tuple[int, int]] = {vid: (arena_slot, off)
                                             for vid, off in exe.offsets.items()}
        for k, vid in enumerate(const_ids):
            place[vid] = (k, 0)
        for k, vid in enumerate(call_ids):
            place.setdefault(vid, (arena_slot + 1 + k, 0))

        def ref(vid: int) -> Ref:
            slot, offset = place[vid]
            array = self.slots[vid]
            if array is not None:
                return Ref(slot, offset, array.dtype.name, tuple(array.shape), vid in blocked,
                           vid in widenable)
            shape, dtype = exe.values[vid]
            return Ref(slot, offset, dtype, tuple(shape), vid in blocked, vid in widenable)

        offers = [Offer(index, ins.kind, ins.attrs, tuple(ref(v) for v in ins.inputs),
                        tuple(ref(v) for v in ins.outputs),
                        tuple(v in constants for v in ins.inputs))
                  for index, ins in ((i, self.instructions[i]) for i in stage.span)]
        prog = NativeProgram(lib, self._first_call_slot + 1 + len(call_ids), threads, offers,
                             weights)
        for k, vid in enumerate(const_ids):
            prog.bind(k, np.asarray(constants[vid], order="C"))
        steps: list[_Bound | _NativeRun] = []
        for offer in offers:
            index, ins = offer.index, self.instructions[offer.index]
            k = prog.add(offer)
            if k is None:
                steps.append(ins)
            elif steps and isinstance(steps[-1], _NativeRun):
                last = steps[-1]
                steps[-1] = _NativeRun(last.first, k + 1, (*last.indices, index))
            else:
                steps.append(_NativeRun(k, k + 1, (index,)))
        return prog, steps

    def implementations(self) -> dict[int, str]:
        """Instruction index -> the native kernel oneDNN chose (natively run ones only)."""
        return {i: stage.native.implementation(k) for stage in self.stages if stage.native
                for i, k in stage.native.engine_index.items()}

    def bytes_per_core(self) -> list[int]:
        """Device memory each core of the group holds for this copy: the constants its
        stage reads where they are read as they are, the weights the native engine
        reordered in their place, its engine buffers, and the arenas (one per call in
        flight)."""
        out = []
        for stage, program in zip(self.stages, self.exe.programs):
            weights = stage.native.weight_bytes if stage.native else {}
            consts: set[int] = set()
            for index, ins in zip(stage.span, program):
                consts.update(v for k, v in enumerate(ins.inputs)
                              if v in self.exe.constants and not (weights.get(index) and k == 1))
            out.append(sum(self.exe.constants[v].nbytes for v in consts)
                       + sum(weights.values())
                       + (stage.native.buffer_bytes if stage.native else 0)
                       + self.exe.arena_bytes * self.depth)
        return out

    # -- a call ----------------------------------------------------------------
    def execute(self, inputs: list[np.ndarray], outputs: list[np.ndarray],
                cutoff: Cutoff | None = None) -> None:
        """Run once: `inputs` in signature order (already validated, compiled shapes);
        results are written into `outputs` (compiled shapes, preallocated). Up to
        `depth` calls may run at once, each in a different stage. Once `cutoff` says
        stop (its deadline passed, or its caller cancelled), the instructions not yet
        started are abandoned: DeadlineExceeded or Cancelled."""
        arena = self._arenas.get()
        try:
            inputs = [np.asarray(x, order="C") for x in inputs]  # keeps 0-d arrays 0-d
            for k, vid in self._constant_outputs:
                outputs[k][...] = arena.slots[vid]
            slots = None  # values by id, for the numpy steps (a native-only call has none)
            if self._numpy_steps:
                slots = list(arena.slots)
                for vid, x in zip(self.exe.input_values, inputs):
                    slots[vid] = x
                for vid, out in zip(self.exe.output_values, outputs):
                    if vid not in self.exe.constants:
                        slots[vid] = out
            call_buffers = [arena.address, *(a.ctypes.data for a in inputs),
                            *(a.ctypes.data for a in outputs)] if self._native else ()
            for stage in self.stages:
                if cutoff is None:
                    with stage.lock, stage.host:
                        self._run_stage(stage, slots, arena, call_buffers, None)
                    continue
                cutoff.check("before its next stage could start")
                _take(stage.lock, cutoff)
                try:
                    host = stage.host if isinstance(stage.host, Slot) else None
                    if host is not None:
                        _take(host, cutoff)
                    try:
                        self._run_stage(stage, slots, arena, call_buffers, cutoff)
                    finally:
                        if host is not None:
                            host.release()
                finally:
                    stage.lock.release()
        finally:
            self._arenas.put(arena)

    def _run_stage_profiled(self, stage: _Stage, slots: list | None, arena: _Arena,
                            cutoff: Cutoff | None) -> None:
        """`_run_stage` with every instruction timed: numpy ones here, native ones by the
        engine itself (one clock read per instruction in C++); the stage is recorded as
        one entry, expanded into spans only when the trace is built."""
        clock = time.perf_counter
        native = stage.native
        timing = profiler.native_timing(native) if native is not None else None
        marks: list[float] = []  # each numpy step's start and end
        try:
            for step in stage.steps:
                if isinstance(step, _NativeRun):
                    self._run_native(stage, step, cutoff)
                    continue
                if cutoff is not None:
                    cutoff.check(_MID_CALL)
                marks.append(clock())
                self._run_numpy(step, slots, arena)
                marks.append(clock())
        finally:
            times = timing.copy() if timing is not None else None
        profiler.stage_done(self, stage, times, marks)

    def _run_stage(self, stage: _Stage, slots: list | None, arena: _Arena,
                   call_buffers: Sequence[int], cutoff: Cutoff | None) -> None:
        if stage.native is not None:
            stage.native.set_call_buffers(call_buffers)
        if profiler.active():
            self._run_stage_profiled(stage, slots, arena, cutoff)
            return
        for step in stage.steps:
            if isinstance(step, _NativeRun):
                self._run_native(stage, step, cutoff)
                continue
            if cutoff is not None:
                cutoff.check(_MID_CALL)
            self._run_numpy(step, slots, arena)

    def _run_native(self, stage: _Stage, step: _NativeRun, cutoff: Cutoff | None) -> None:
        try:
            stage.native.run(step.first, step.last, self._first_call_slot, cutoff)
        except ExecutionError as e:
            names = sorted({n for i in step.indices for n in self.instructions[i].source})
            raise ExecutionError(f"{e} (in the instructions from TF node(s) "
                                 f"{', '.join(names[:8]) or '?'})") from None

    @staticmethod
    def _run_numpy(step: _Bound, slots: list, arena: _Arena) -> None:
        scratch = None
        if step.scratch:
            offset, nbytes = step.scratch
            scratch = arena.buf[offset:offset + nbytes]
        try:
            step.fn([slots[i] for i in step.inputs], [slots[o] for o in step.outputs],
                    step.attrs, scratch)
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
    from .executable import Instruction
    from .signature import TensorSignature

    ins = [np.asarray(x, order="C") for x in inputs]
    scratch = KERNELS[kind].scratch_bytes([x.shape for x in ins], [x.dtype.name for x in ins],
                                          attrs)
    sig_in, in_ids, consts, values = [], [], {}, {}
    for v, x in enumerate(ins):
        if v in constant:
            consts[v] = x
        else:
            sig_in.append(TensorSignature(f"in{v}", x.dtype.name, x.shape))
            in_ids.append(v)
            values[v] = (x.shape, x.dtype.name)
    out_ids = list(range(len(ins), len(ins) + len(out_types)))
    for v, (shape, dtype) in zip(out_ids, out_types):
        values[v] = (tuple(shape), dtype)
    exe = Executable(
        compiler={}, inputs=sig_in, input_values=in_ids,
        outputs=[TensorSignature(f"out{k}", d, tuple(s)) for k, (s, d) in enumerate(out_types)],
        output_values=out_ids,
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
    native_ran = [st.native for st in program.stages if st.native is not None]
    ran = "native" if native_ran and not any(n.rejected for n in native_ran) else "numpy"
    return outs, ran
