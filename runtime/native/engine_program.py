"""A native program: one executable's instructions as oneDNN primitives in engine.cc.

Built once per loaded copy, for one stage's instructions (`Offer`s: each with its
operands placed). Value placement is the executable's: slot 0 is the copy's arena, then
one slot per constant, then (bound on every call) the call's inputs and outputs. `add`
offers each instruction to the engine and says whether it took it; the caller
(runtime/program.py) runs the rest on numpy, on the same buffers.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ..cutoff import Cutoff
from ..errors import ExecutionError
from .spec import Ref, encode, is_wide, team_size, work

_ERR = 2048
T = TypeVar("T")


class _EngineThread:
    """A persistent thread that makes the engine calls handed to it, one at a time."""

    def __init__(self) -> None:
        self._go, self._done = threading.Semaphore(0), threading.Semaphore(0)
        self._fn: Callable[[], object] | None = None
        self._out: tuple[object, BaseException | None] = (None, None)
        threading.Thread(target=self._loop, name="neuronish-engine", daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            try:
                self._out = (self._fn(), None)  # type: ignore[misc]
            except BaseException as e:  # handed back to the caller
                self._out = (None, e)
            self._fn = None
            self._done.release()

    def call(self, fn: Callable[[], T]) -> T:
        self._fn = fn
        self._go.release()
        self._done.acquire()
        out, error = self._out
        if error is not None:
            raise error
        return out  # type: ignore[return-value]


class _EngineThreads:
    """Where engine calls run: the main thread's own calls on it, every other thread's on
    a few persistent engine threads (one per call in flight).

    libgomp gives each thread that starts a parallel region a pool of workers of its own,
    and once its threads outnumber the CPUs it stops spinning between regions (its
    "throttled" spin count). A NeuronOp runs on whichever of TensorFlow's inter-op
    threads (a server on whichever of its request threads) picks it up, so each of them
    grew a pool, and every call paid the ~80 us wake-ups the spin is there to avoid:
    MobileNetV2 bf16 batch 8 on the runtime 14.8 ms alone, 19.4 ms once a second thread
    had made a call (at real-time priority, 2 CPUs). Handing calls to the same few
    threads keeps one pool per call in flight."""

    def __init__(self) -> None:
        self._idle: list[_EngineThread] = []
        self._lock = threading.Lock()
        # A forked child has none of these threads: it starts its own.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._idle, self._lock = [], threading.Lock()

    def call(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is threading.main_thread():
            return fn()
        with self._lock:
            worker = self._idle.pop() if self._idle else _EngineThread()
        try:
            return worker.call(fn)
        finally:
            with self._lock:
                self._idle.append(worker)


_threads = _EngineThreads()


@dataclass(frozen=True)
class Offer:
    """One instruction of a stage, its operands placed for the engine."""

    index: int  # in the executable's flat instruction list
    kind: str
    attrs: dict
    ins: tuple[Ref, ...]
    outs: tuple[Ref, ...]
    constant: tuple[bool, ...]  # per input: a program constant

    @property
    def work(self) -> int:
        return work(self.kind, self.attrs, self.ins, self.outs)


class WeightPool:
    """A pool of the engine's reordered weights (engine.cc `WeightPool`): a program built
    with it takes each weight another one already reordered from the same constant into
    the same layout, so a model's copies (and loads of equal constants) hold it once."""

    def __init__(self, lib: ctypes.CDLL):
        # (never destroyed: runtime/model.py keeps one for the process, as the C runtime does)
        self.handle = lib.ne_pool_create()


class NativeProgram:
    def __init__(self, lib: ctypes.CDLL, n_slots: int, threads: int, stage: Sequence[Offer],
                 pool: WeightPool | None = None):
        """A program for `stage`'s instructions (offered one by one with `add`), sharing
        reordered weights through `pool` if given."""
        self._lib = lib
        self._err = ctypes.create_string_buffer(_ERR)
        self._handle = lib.ne_create(n_slots, threads, self._err, _ERR)
        if not self._handle:
            raise ExecutionError(f"native engine: {self._err.value.decode()}")
        if pool is not None and pool.handle:
            lib.ne_use_pool(self._handle, pool.handle)
        self._keep: list[np.ndarray] = []  # arrays whose memory fixed slots point into
        self.rejected: dict[int, str] = {}  # instruction index -> why numpy runs it
        self.weight_bytes: dict[int, int] = {}  # instruction index -> reordered weights held
        self.engine_index: dict[int, int] = {}  # instruction index -> its engine index
        self.teams: dict[int, int] = {}  # instruction index -> the threads it runs on
        self._call_ptrs: ctypes.Array | None = None
        self._n_call = 0
        self._timing: np.ndarray | None = None  # see timings()
        self.threads = threads
        # Whether the program takes every CPU anyway, which decides every instruction's
        # team (spec.team_size): so it is known from the whole stage before any is added.
        self.wide = is_wide(offer.work for offer in stage)
        self.widest = 0  # the widest team any instruction taken runs on (host CPUs it needs)
        self._timing_ptr: object = None

    def bind(self, slot: int, array: np.ndarray) -> None:
        """Point a fixed slot (the arena, a constant) at `array`, kept alive here."""
        if not array.flags.c_contiguous:
            raise ValueError("engine buffers must be C-contiguous")
        self._keep.append(array)
        if self._lib.ne_bind(self._handle, slot, array.ctypes.data, self._err, _ERR) < 0:
            raise ExecutionError(f"native engine: {self._err.value.decode()}")

    def add(self, offer: Offer) -> int | None:
        """Offer an instruction of the stage; returns its engine index, or None (it runs
        on numpy)."""
        index = offer.index
        spec = encode(offer.kind, offer.attrs, offer.ins, offer.outs, offer.constant)
        if spec is None:
            self.rejected[index] = "no native kernel for these dtypes/attributes"
            return None
        ints, floats = spec
        team = team_size(offer.work, self.wide, self.threads)
        self._lib.ne_set_threads(self._handle, team)
        int_arr = (ctypes.c_int64 * len(ints))(*ints)
        float_arr = (ctypes.c_float * max(len(floats), 1))(*floats)
        held = self.held_bytes
        # (on the engine threads: adding reorders the weights, a parallel region)
        k = _threads.call(lambda: self._lib.ne_add(self._handle, int_arr, len(ints), float_arr,
                                                   len(floats), self._err, _ERR))
        if k < 0:  # oneDNN has no implementation for this case: numpy runs it
            self.rejected[index] = self._err.value.decode()
            return None
        self.weight_bytes[index] = self.held_bytes - held
        self.widest = max(self.widest, team)
        self.teams[index] = team
        self.engine_index[index] = int(k)
        return int(k)

    def finalize(self) -> None:
        if _threads.call(lambda: self._lib.ne_finalize(self._handle, self._err, _ERR)) < 0:
            raise ExecutionError(f"native engine: {self._err.value.decode()}")

    @property
    def buffer_bytes(self) -> int:
        """The engine's working buffers (shared by the program's primitives)."""
        return self.held_bytes - sum(self.weight_bytes.values())

    @property
    def held_bytes(self) -> int:
        """Reordered weights and working buffers the engine holds for this program."""
        return int(self._lib.ne_bytes(self._handle))

    def implementation(self, k: int) -> str:
        buf = ctypes.create_string_buffer(256)
        return buf.value.decode() if self._lib.ne_impl(self._handle, k, buf, 256) >= 0 else "?"

    def set_call_buffers(self, addresses: Sequence[int]) -> None:
        """The call's buffers (the arena, inputs, outputs) by address, for `run`."""
        if self._call_ptrs is None or len(self._call_ptrs) < len(addresses):
            self._call_ptrs = (ctypes.c_void_p * max(len(addresses), 1))()
        for k, address in enumerate(addresses):  # (a ctypes array reused: no allocation)
            self._call_ptrs[k] = address
        self._n_call = len(addresses)

    def timings(self, enabled: bool) -> np.ndarray | None:
        """Record each instruction's [start, end] (time.perf_counter seconds) on every run
        while enabled; returns the [n, 2] array runs write into (one per program, kept:
        switching is one foreign call)."""
        if self._timing is None:
            n = max(self.engine_index.values(), default=-1) + 1
            self._timing = np.zeros((max(n, 1), 2), np.float64)
            self._timing_ptr = self._timing.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
        self._lib.ne_set_timing(self._handle, self._timing_ptr if enabled else None)
        return self._timing if enabled else None

    def run(self, first: int, last: int, first_slot: int, cutoff: Cutoff | None = None) -> None:
        """Run engine instructions [first, last) on the call buffers last set (the GIL is
        released meanwhile: ctypes drops it around foreign calls). With a `cutoff`, the
        engine looks at it before every instruction and stops there: Cancelled or
        DeadlineExceeded."""
        flag, deadline = (cutoff.flag_address(), cutoff.deadline or 0.0) if cutoff else (0, 0.0)
        def run() -> int:
            return self._lib.ne_run(self._handle, first, last, first_slot, self._call_ptrs,
                                    self._n_call, flag or None, deadline, self._err, _ERR)

        # A program of one-thread instructions starts no parallel region: no hand-over.
        rc = _threads.call(run) if self.widest > 1 else run()
        if rc < 0:
            raise ExecutionError(f"native engine: {self._err.value.decode()}")
        if rc:
            assert cutoff is not None
            cutoff.check("while its instructions ran")  # (raises: the engine saw it)
            raise AssertionError(f"native engine stopped ({rc}) with no reason to")

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.ne_destroy(handle)
