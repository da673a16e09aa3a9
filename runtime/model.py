"""A model on the device: load, validate inputs, split batches, spread over duplicates.

A call whose batch differs from the compiled batch is split into chunks of the
compiled size (the last one padded by repeating its last row, so padding never
introduces values the model has not seen), the chunks run in parallel on the
model's duplicates, and the outputs are assembled and trimmed.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import queue
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import profiler, telemetry
from .calls import Calls
from .cutoff import Cutoff
from .device import Device, Reservation, get_device
from .errors import (
    Cancelled,
    DeadlineExceeded,
    DeviceError,
    ExecutableError,
)
from .executable import Executable, ExecutableFile, from_bytes
from .native import native_library
from .native.engine_program import WeightPool
from .program import LoadedProgram, aligned_empty

if TYPE_CHECKING:
    from .capi.native_model import NativeModel


# A constant of at least this many bytes is placed once per process, by content, as the C
# runtime places it (engine_program.cc `shared_block`): a NeuronOp's shapes and a server's
# versions of one model load the same weights. Loads that share a constant share the
# weights the engine reorders from it too (_process_weight_pool keys them by address,
# which holds the same bytes while a program holding them lives: it keeps its arrays).
SHARE_CONSTANT_BYTES = 64 << 10
_shared_constants: weakref.WeakValueDictionary[tuple, np.ndarray] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()
_weight_pool: WeightPool | None = None


def _device_copy(a: np.ndarray) -> np.ndarray:
    """Place a constant in (simulated) device memory: aligned, read-only."""
    key = None
    if a.nbytes >= SHARE_CONSTANT_BYTES:
        digest = hashlib.sha256(np.ascontiguousarray(a).reshape(-1).view(np.uint8)).digest()
        key = (digest, a.dtype.name, a.shape)
        with _shared_lock:
            found = _shared_constants.get(key)
        if found is not None:
            return found
    out = aligned_empty(a.nbytes).view(a.dtype).reshape(a.shape)
    out[...] = a
    out.flags.writeable = False
    if key is not None:
        with _shared_lock:
            return _shared_constants.setdefault(key, out)
    return out


def _process_weight_pool(lib: ctypes.CDLL) -> WeightPool:
    """The engine's pool of reordered weights every load of this process shares."""
    global _weight_pool
    with _shared_lock:
        if _weight_pool is None:
            _weight_pool = WeightPool(lib)
        return _weight_pool


class Model(Calls):
    """A loaded executable. `run` is safe to call from many threads at once."""

    engine = "numpy"  # or "native": set when it loads
    runtime_note = ""  # why `load` left it on the Python runtime (not the C one)

    def __init__(self, exe: Executable, device: Device, duplicates: int = 1):
        """`exe` as `from_bytes` returns it, which checked its consistency once (the
        NeuronOp bridge tries several duplicate counts with one executable)."""
        if duplicates < 1:
            raise DeviceError(f"duplicates must be >= 1, got {duplicates}")
        self.exe = exe
        self.device = device
        self.inputs = exe.inputs
        self.outputs = exe.outputs
        batches = {s.shape[s.batch_axis] for s in exe.inputs if s.batch_axis >= 0}
        # Splitting needs one compiled batch size shared by every batched tensor.
        self.batch_size: int | None = batches.pop() if len(batches) == 1 else None
        per_core = self._bytes_per_core(exe)
        self._reservations: list[Reservation] = device.reserve(exe.num_cores, per_core, duplicates)
        try:
            constants = {vid: _device_copy(a) for vid, a in exe.constants.items()}
            # The device's copies replace the parsed ones (copies of the file's bytes), so
            # a loaded model holds its weights once, not twice.
            exe.constants.update(constants)
            # Idle copies last in, first out: the copy given back last has its arena and
            # weights likeliest still in the CPU's caches (first in, first out, back-to-back
            # calls went round every copy and each found its bytes evicted).
            self._idle: queue.LifoQueue[LoadedProgram] = queue.LifoQueue()
            lib = native_library()
            self.engine = "native" if lib is not None else "numpy"
            weights = _process_weight_pool(lib) if lib is not None else None
            programs = [LoadedProgram(exe, constants, lib, device.config.core_threads,
                                      device.host_cpus, weights)  # (weights held once)
                        for _ in self._reservations]
            # The native engine's reordered weights and buffers are known only now.
            actual = programs[0].bytes_per_core() if programs else per_core
            if actual != per_core:
                for k, r in enumerate(self._reservations):  # in place: a failure releases
                    self._reservations[k] = device.resize(r, actual)  # exactly what is held
            for program in programs:  # a pipelined copy takes a call per stage at once
                for _ in range(program.depth):
                    self._idle.put(program)
            # Each copy and the cores it holds; a copy whose core fails is retired.
            self._copies = list(zip(programs, self._reservations))
            self._retired: set[LoadedProgram] = set()
        except BaseException as e:
            # A load that fails must not keep the device memory it reserved.
            for r in self._reservations:
                device.release(r)
            # The host running out of memory is not a damaged executable.
            if isinstance(e, Exception) and not isinstance(e, (DeviceError, MemoryError)):
                raise ExecutableError(f"cannot load the executable: {type(e).__name__}: {e}; "
                                      "recompile the model with this neuronish") from e
            raise
        self._unloaded = False
        self._lock = threading.Lock()
        # What a call's arguments must be to pass as they are (the common case, checked
        # first and cheaply; anything else goes through _as_input's full reading).
        self._exact_inputs = [(np.dtype(s.dtype), tuple(s.shape)) for s in self.inputs]
        self._exact_outputs = [(np.dtype(s.dtype), tuple(s.shape)) for s in self.outputs]
        device.track(self)
        self._telemetry = telemetry.model_loaded(self)  # counters for `neuronish ls` / `top`

    @staticmethod
    def _bytes_per_core(exe: Executable) -> list[int]:
        """Core k of a group holds the constants program k reads, plus working memory."""
        out = []
        for program in exe.programs:
            used = {v for i in program for v in i.inputs if v in exe.constants}
            out.append(sum(exe.constants[v].nbytes for v in used) + exe.arena_bytes)
        return out

    @property
    def duplicates(self) -> int:
        return len(self._reservations)

    @property
    def core_groups(self) -> list[tuple[int, ...]]:
        return [r.cores for r in self._reservations]

    @property
    def lost(self) -> bool:
        """Whether failed cores took every copy (the device lost the model: `fail`)."""
        return self._failure is not None

    # -- calls -----------------------------------------------------------------
    @profiler.traced_call
    def run_list(self, values: list[object], out: list[np.ndarray] | None = None, *,
                 timeout: float | None = None,
                 cancel: bytearray | None = None) -> list[np.ndarray]:
        """Run on inputs in signature order; returns outputs in signature order.

        `out`, if given, are the arrays to write the results into (C-contiguous,
        each output's dtype, its shape with this call's batch); they are returned.
        At the compiled batch size the device writes into them directly. `timeout` and
        `cancel` as in `run`."""
        cutoff = Cutoff.of(timeout, cancel)
        if self._unloaded:
            raise DeviceError(self._failure or "the model was unloaded")
        arrays, batch = self._validate(values)
        if out is not None:
            self._check_out(out, batch)
        if batch is None or batch == self.batch_size:
            outs = out if out is not None else [np.empty(s.shape, s.dtype) for s in self.outputs]
            self._run_one(arrays, outs, cutoff)
            return outs
        results = self._run_split(arrays, batch, cutoff)
        if out is None:
            return results
        for dest, result in zip(out, results):
            np.copyto(dest, result, casting="no")
        return out

    def _run_one(self, inputs: list[np.ndarray], outputs: list[np.ndarray],
                 cutoff: Cutoff | None = None) -> None:
        queued = time.perf_counter() if profiler.active() else None  # None: not profiled
        program = self._idle.get() if cutoff is None else self._wait_for_copy(cutoff)
        while program in self._retired:  # (its core failed: taken out of circulation)
            program = self._idle.get() if cutoff is None else self._wait_for_copy(cutoff)
        if self._failure is not None:  # (failed while this call waited)
            self._idle.put(program)
            raise DeviceError(self._failure)
        busy = self._telemetry.begin(self) if self._telemetry is not None else None
        try:
            # (each stage takes its share of the host's CPUs while it computes: execute)
            if queued is not None:
                with profiler.chunk(self, queued):
                    program.execute(inputs, outputs, cutoff)
            else:
                program.execute(inputs, outputs, cutoff)
        finally:
            if busy is not None:
                self._telemetry.end(busy)  # type: ignore[union-attr]
            if program not in self._retired:
                self._idle.put(program)

    def _wait_for_copy(self, cutoff: Cutoff) -> LoadedProgram:
        """An idle copy of the program, or Cancelled / DeadlineExceeded once `cutoff` says
        stop first."""
        cutoff.check("before it started")
        try:
            return self._idle.get_nowait()  # (a copy is idle: the common case)
        except queue.Empty:
            pass
        while True:
            try:
                return self._idle.get(timeout=cutoff.wait_slice())
            except queue.Empty:
                cutoff.check("while it waited for the model's cores (all busy with other "
                             "calls)")

    def _run_split(self, arrays: list[np.ndarray], batch: int,
                   cutoff: Cutoff | None = None) -> list[np.ndarray]:
        size = self.batch_size
        assert size is not None
        if batch == 0:
            return [np.empty([0 if i == s.batch_axis else d for i, d in enumerate(s.shape)],
                             s.dtype) for s in self.outputs]
        chunks = max(1, math.ceil(batch / size))
        # Batched outputs on axis 0 are written by each chunk straight into its slice
        # of the result; other axes are assembled afterwards.
        full = []
        for s in self.outputs:
            shape = list(s.shape)
            if s.batch_axis >= 0:
                shape[s.batch_axis] = chunks * size
            full.append(np.empty(shape, s.dtype))

        def chunk_io(k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
            lo, hi = k * size, min((k + 1) * size, batch)
            ins = []
            for sig, x in zip(self.inputs, arrays):
                if sig.batch_axis < 0:
                    ins.append(x)
                    continue
                part = np.take(x, np.arange(lo, hi), axis=sig.batch_axis) if hi - lo < size \
                    else x[(slice(None),) * sig.batch_axis + (slice(lo, hi),)]
                if hi - lo < size:  # pad by repeating the last real row
                    pad_idx = np.full(size - (hi - lo), hi - lo - 1)
                    part = np.concatenate([part, np.take(part, pad_idx, axis=sig.batch_axis)],
                                          axis=sig.batch_axis)
                ins.append(np.ascontiguousarray(part))
            outs = []
            for sig, f in zip(self.outputs, full):
                if sig.batch_axis == 0:
                    outs.append(f[k * size:(k + 1) * size])
                elif sig.batch_axis > 0:
                    outs.append(np.empty(sig.shape, sig.dtype))
                else:
                    outs.append(f if k == 0 else np.empty(sig.shape, sig.dtype))
            return ins, outs

        jobs = [chunk_io(k) for k in range(chunks)]
        if chunks == 1 or self.duplicates == 1:
            for ins, outs in jobs:
                self._run_one(ins, outs, cutoff)
        else:
            futures = [self.device.pool.submit(self._run_one, ins, outs, cutoff)
                       for ins, outs in jobs]
            try:
                for f in futures:
                    f.result()
            except (DeadlineExceeded, Cancelled):
                for f in futures:  # chunks not started are dropped
                    f.cancel()
                raise
        result = []
        for i, (sig, f) in enumerate(zip(self.outputs, full)):
            if sig.batch_axis > 0:
                f = np.concatenate([outs[i] for _, outs in jobs], axis=sig.batch_axis)
            if sig.batch_axis >= 0:
                f = f[(slice(None),) * sig.batch_axis + (slice(0, batch),)]
            result.append(f)
        return result

    # -- lifetime --------------------------------------------------------------
    _failure: str | None = None  # why the device lost the model (fail), else None

    def lose_core(self, core: int, why: str) -> None:
        """Core `core` failed under this model: its copies there are retired (a call
        computing on one finishes; none starts there again, their memory is freed) and
        the model goes on with its other copies. With none left it fails (`fail`)."""
        with self._lock:
            if self._unloaded:
                return
            hit = [(p, r) for p, r in self._copies if core in r.cores]
            keep = [(p, r) for p, r in self._copies if core not in r.cores]
            if hit and keep:
                self._copies = keep
                for program, reservation in hit:
                    self._retired.add(program)
                    self._reservations.remove(reservation)
                    self.device.release(reservation)
                return
        if hit:
            self.fail(why)

    def fail(self, why: str) -> None:
        """The device lost this model: release it; every later call raises
        DeviceError(why) (a NeuronOp then runs on TensorFlow, neuronish/fallback.py)."""
        self._failure = why
        self.unload()

    def unload(self) -> None:
        """Free the model's device memory; further calls fail."""
        with self._lock:
            if self._unloaded:
                return
            self._unloaded = True
            for r in self._reservations:
                self.device.release(r)
            telemetry.model_unloaded(self)

def load(source: str | Path | bytes | bytearray | memoryview, *, duplicates: int = 1,
         device: Device | None = None, runtime: str | None = None) -> Model | NativeModel:
    """Load an executable (a path or its bytes) onto the process's device.

    The process has one device with one memory budget, served by two runtimes: the C
    runtime (runtime/capi/, no Python on a call's path) takes the model when it can run
    it, the Python runtime (this module) otherwise: with NEURONISH_KERNEL=python or
    NEURONISH_ENGINE=numpy or NEURONISH_NATIVE_EXCLUDE, when the C runtime refuses it (an
    instruction it lacks), or on a `device` made by hand. Why a model stayed on Python is
    its `runtime_note` (also logged at info, and shown by `neuronish ls`). `runtime` = "c"
    or "python" insists on one (for tests and tools)."""
    if runtime not in (None, "c", "python"):
        raise ValueError(f"runtime must be 'c', 'python' or None, got {runtime!r}")
    on_c = device is None and runtime != "python"
    note = "a device was given" if device is not None else ""
    if on_c:
        from .capi import native_model
    file = None  # a file's bytes were hashed as read: parsed without hashing them again
    if isinstance(source, (str, Path)):
        if on_c:  # (the C library reads the file itself: once, and no copy held here)
            native, note = native_model.load_file(source, duplicates)
            if native is not None:
                return native
        try:  # (after a C refusal too: a damaged file is refused with Python's error)
            file = ExecutableFile.read(source)
        except OSError as e:
            raise DeviceError(f"cannot read executable {source}: {e.strerror}") from None
        data = file.data
    else:
        data = bytes(source)
        if on_c:
            native, note = native_model.load(data, duplicates)
            if native is not None:
                return native
    if on_c:
        if runtime == "c":
            raise DeviceError(f"cannot load on the C runtime: {note}")
        logging.getLogger(__name__).info("the model runs on the Python runtime: %s", note)
    model = Model(file.parse() if file else from_bytes(data), device or get_device(), duplicates)
    model.runtime_note = note or "runtime='python' was asked for"
    return model
