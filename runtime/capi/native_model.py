"""Models on the C runtime's process-wide device, with the Python runtime's Model surface
(runtime/calls.py: `run`, `run_list`, `unload`, `duplicates`, `label`): what
`neuronish.runtime.load` returns and what the Python host's NeuronOp loads, both through
`load`, when the C runtime can run the executable; the kernel then calls
`nr_execute_with` directly, without the GIL (neuronish/ops/neuron_op.cc; `entry`).

One C device per process (`nr_device_open`, configured from NEURONISH_* as the Python
device is), opened on first use and kept; it keeps the process's one memory ledger, the
Python device charging its models there (runtime/device.py). A load that the C runtime
refuses for any reason (an instruction it lacks, a build failure, too little device
memory) returns no model and the reason: the caller then loads on the Python runtime,
which keeps its own rules (and its fallback to TensorFlow). `NEURONISH_KERNEL=python`
turns this path off; so do the settings only the Python runtime honours:
`NEURONISH_ENGINE=numpy` and `NEURONISH_NATIVE_EXCLUDE`. A profile (`NEURONISH_PROFILE`,
`profiler.start()`) does not: while it records, the C library records its models' calls
too and the profiler merges them into its trace (binding.ProfileRecorder).
`NEURONISH_NATIVE_EXCLUDE` stays the Python runtime's by design: it hands instructions to
the numpy engine, which the C runtime does not have.

A core failing (`get_device().fail_core`, NEURONISH_FAILED_CORES) fails on the C device
too (`fail_core`): its models there retire the copies on it, as the Python runtime's do.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .. import profiler
from ..calls import Calls
from ..errors import (
    Cancelled,
    DeadlineExceeded,
    DeviceError,
    ExecutableError,
    ExecutionError,
    InvalidInput,
    OutOfDeviceMemory,
)
from ..signature import TensorSignature

if TYPE_CHECKING:
    from ..executable import Executable

ENV_KERNEL = "NEURONISH_KERNEL"

# nr_status -> the Python runtime's exception (neuronish_runtime.h's codes).
_ERRORS: dict[int, type[DeviceError]] = {
    1: InvalidInput, 3: ExecutableError, 4: ExecutableError, 8: DeviceError,
    9: OutOfDeviceMemory, 10: InvalidInput, 11: ExecutionError, 12: Cancelled,
    13: DeadlineExceeded,
}

# NR_DEVICE_ERROR (too few core groups), NR_OUT_OF_DEVICE_MEMORY: fewer copies may fit
_TOO_FEW_CORES_OR_MEMORY = (8, 9)

_lock = threading.Lock()
_device = None  # binding.Device, opened on first use; None until then
_unusable: str | None = None  # why the C runtime cannot be used in this process
_log = logging.getLogger(__name__)


def why_not() -> str | None:
    """Why a model should not try the C runtime (a setting above), or None."""
    if os.environ.get(ENV_KERNEL, "").strip().lower() == "python":
        return f"{ENV_KERNEL}=python"
    if os.environ.get("NEURONISH_ENGINE", "").strip().lower() == "numpy":
        return "NEURONISH_ENGINE=numpy (the numpy engine is the Python runtime's)"
    if os.environ.get("NEURONISH_NATIVE_EXCLUDE", "").strip():
        return "NEURONISH_NATIVE_EXCLUDE is set (only the Python runtime honours it)"
    return None


def shared_device():  # -> binding.Device | None
    """The process's C device, opened on first use; None (logged once) if the C runtime
    cannot be built or its device opened here."""
    global _device, _unusable
    with _lock:
        if _device is None and _unusable is None:
            from . import binding

            try:
                _device = binding.Device(binding.load_library())
            except Exception as e:  # noqa: BLE001 - any failure: the Python runtime serves
                _unusable = f"{type(e).__name__}: {e}"
                _log.warning("the C runtime cannot be used in this process (%s); NeuronOps "
                             "run on the Python runtime", _unusable)
            else:
                # One memory budget for the process: the C device keeps the ledger, the
                # Python device (if made already; else get_device attaches it) charges
                # what its models hold there. Before any C model loads: it all fits.
                from .. import device as python_device

                if python_device._device is not None:
                    python_device._device.attach_ledger(_device)
                    # Cores the process's device lost before this one opened (it read
                    # NEURONISH_FAILED_CORES itself).
                    for core, why in python_device._device.failure_reasons().items():
                        fail_core(core, why)
        return _device


def fail_core(core: int, why: str) -> None:
    """Core `core` of the process's device failed (runtime/device.py's fail_core): fail it
    on the C device too, if it is open (one opened later learns it then: shared_device)."""
    from .binding import CRuntimeError

    device = _device
    if device is None:
        return
    try:
        device.fail_core(core, why)
    except CRuntimeError as e:  # (configured otherwise: the core is not one of its own)
        _log.warning("the C runtime's device cannot fail core %d as the process's device "
                     "did: %s", core, e.message)


def opened_device():  # -> binding.Device | None
    """The process's C device if it was opened already (without opening it)."""
    return _device


def device_used() -> dict[int, int]:
    """Bytes in use per core on the C device; {} if it was never opened."""
    with _lock:
        device = _device
    return {} if device is None else {core: used for core, (used, _) in device.memory().items()}


def raise_from(error: Exception) -> None:
    """Re-raise a binding.CRuntimeError as the Python runtime's exception for its code."""
    from .binding import CRuntimeError

    if isinstance(error, CRuntimeError):
        raise _ERRORS.get(error.status, DeviceError)(error.message) from None
    raise error


def loaded_models() -> list[NativeModel]:
    """The models loaded on this process's C device (a server labels those its warm-up
    loaded, as it does the Python device's)."""
    return list(_loaded)


class NativeModel(Calls):
    """An executable loaded on the C device, with the Python runtime's Model surface: the
    same checks of a call's arguments (runtime/calls.py; the C runtime checks again), the
    same errors. What it lacks is the Python runtime's insides (its programs, a parsed
    `exe`); load with runtime="python" to look at those."""

    engine = "native (C runtime)"

    def __init__(self, model, label: str = ""):  # model: binding.Model
        from .. import telemetry
        from .binding import _np_dtype

        self._model = model
        self._label = ""
        if label:
            self.label = label
        self.inputs = [TensorSignature(n, d, shape, axis) for n, d, shape, axis in model.inputs]
        self.outputs = [TensorSignature(n, d, shape, axis) for n, d, shape, axis in model.outputs]
        self._exact_inputs = [(_np_dtype(s.dtype), s.shape) for s in self.inputs]
        self._exact_outputs = [(_np_dtype(s.dtype), s.shape) for s in self.outputs]
        # (the C runtime's -1: calls take only the compiled shapes; the Python one's None)
        self.batch_size = int(model.batch_size) if model.batch_size >= 0 else None
        self._groups = [tuple(c[0]) for c in model.copies()]  # every copy's, as loaded
        # `neuronish ls/top` show it with the C runtime's counters (nr_model_copy).
        self._telemetry = telemetry.get_telemetry()
        if self._telemetry is not None:
            self._telemetry.track_native(self)
        _loaded.add(self)

    @property
    def label(self) -> str:
        """Its name in `neuronish ls/top` and in the profile's tracks ("" until given: its
        outputs' names are shown). Setting it tells the C library at once, also after calls
        ran and while other threads call it (a server labels the models its warm-up loaded
        and called). Once the model is unloaded, also by another thread at the same moment,
        a relabel is a no-op for the library (it has the model no more) and raises nothing:
        only this object keeps the name, so a server relabelling its models while another
        thread retires one needs no lock of its own."""
        return self._label

    @label.setter
    def label(self, label: str) -> None:
        self._label = label
        self._model.set_label(label)

    def copies(self) -> list[tuple[list[int], list[int], int, int]]:
        """Each copy's (cores, bytes per core, runs, busy ns), from the C runtime (copies
        retired by a failed core included, as the Python runtime's telemetry lists them)."""
        return self._model.copies()

    @property
    def core_groups(self) -> list[tuple[int, ...]]:
        """The core groups of the copies that serve calls: a copy on a failed core retired
        (as runtime.Model's do)."""
        failed = self._model.device.failed_cores()
        return [g for g in self._groups if not failed.keys() & set(g)]

    @property
    def duplicates(self) -> int:
        """Copies that serve calls (retired ones not counted, as in runtime.Model)."""
        return len(self.core_groups)

    @property
    def lost(self) -> bool:
        """Whether failed cores retired every copy (calls then fail with DeviceError)."""
        return bool(self._model.handle) and self.duplicates == 0

    @property
    def entry(self) -> tuple[int, int] | None:
        """(nr_model*, nr_execute_with's address): what the kernel calls without the GIL;
        None once unloaded."""
        model = self._model.handle.value
        fn = ctypes.cast(self._model.lib.nr_execute_with, ctypes.c_void_p).value
        return (int(model), int(fn)) if model and fn else None

    @property
    def exe(self):  # noqa: ANN201 - never returns
        raise AttributeError("a model on the C runtime keeps no parsed executable; load it "
                             "with runtime='python' to inspect one")

    def run_list(self, values: Sequence[object], out: list[np.ndarray] | None = None, *,
                 timeout: float | None = None, cancel: bytearray | None = None
                 ) -> list[np.ndarray]:
        """As runtime.Model.run_list: inputs in signature order, outputs returned (written
        into `out` if given); any batch, split and padded by the C runtime."""
        if not self._model.handle:
            raise DeviceError("the model was unloaded")
        arrays, batch = self._validate(list(values))
        if out is not None:
            self._check_out(out, batch)
        if profiler.active():  # (the C library records the call: on this thread's track)
            profiler.note_thread()
        try:
            return self._model.run(arrays, outputs=out, timeout=timeout, cancel=cancel)
        except Exception as e:  # noqa: BLE001 - re-raised as the runtime's error
            raise_from(e)
            raise  # (unreachable: raise_from raises)

    def load_again(self, duplicates: int) -> NativeModel:
        """Its executable loaded again as a new model, with as many copies as fit, up to
        `duplicates`: what a host does when failed cores retired every copy of this one
        (the load avoids failed cores). DeviceError (or OutOfDeviceMemory) if none fits."""
        from .binding import CRuntimeError, Model

        for n in range(max(1, duplicates), 0, -1):
            try:
                return NativeModel(Model.load_again(self._model, n), self.label)
            except CRuntimeError as e:
                if e.status in _TOO_FEW_CORES_OR_MEMORY and n > 1:
                    continue
                raise_from(e)
        raise AssertionError("unreachable: the last attempt raised")

    @property
    def id(self) -> int:
        """nr_model_id: how the C library's profile spans tell this model from others of
        its label (0 once unloaded)."""
        return self._model.id

    def unload(self) -> None:
        _loaded.discard(self)  # (first: a snapshot lists it no more, then waits for one
        if self._telemetry is not None:  # listing it already to finish reading its copies)
            self._telemetry.untrack_native(self)
        profiler.forget_native_model(self.id)
        self._model.unload()

    def __repr__(self) -> str:
        return f"<NativeModel {self.label!r}: {self.duplicates} duplicate(s) on the C device>"


class Loaded(NamedTuple):
    """What `load` gives: the model, or None and why it is not on the C runtime."""

    model: NativeModel | None
    why_not: str


def load(data: bytes | memoryview, duplicates: int, label: str = "", *,
         step_down: bool = False) -> Loaded:
    """`data` on the C device with `duplicates` copies, or (None, why not): a setting
    above, the C runtime unusable here, or what it refused.

    runtime.load asks for exactly `duplicates` (its rule); the NeuronOp passes
    `step_down=True` to take as many as fit, down to one, when the C runtime says there
    are too few core groups or too little memory for more."""
    from .binding import CRuntimeError, Model

    if (why := why_not()) is not None:
        return Loaded(None, why)
    device = shared_device()
    if device is None:
        return Loaded(None, f"the C runtime cannot be used in this process ({_unusable})")
    blob = bytes(data)
    fewest = 1 if step_down else duplicates
    for n in range(duplicates, fewest - 1, -1):
        try:
            model = NativeModel(Model(device, blob, duplicates=n), label)
        except CRuntimeError as e:
            if e.status in _TOO_FEW_CORES_OR_MEMORY and n > fewest:
                continue
            return Loaded(None, f"the C runtime refused it: {e}")
        if profiler.active():
            _describe_for_profile(model, lambda: _from_bytes(blob))
        return Loaded(model, "")
    return Loaded(None, f"duplicates must be at least 1, got {duplicates}")


def load_file(path: str | os.PathLike, duplicates: int, label: str = "") -> Loaded:
    """The executable file at `path` on the C device with `duplicates` copies, or (None,
    why not), as `load`: the library reads the file itself (nr_model_load_file), so its
    body is read and hashed once, in C, and Python holds no copy of it. A file the
    library refuses is the caller's to read again for Python's error (or runtime)."""
    from .binding import CRuntimeError, Model

    if (why := why_not()) is not None:
        return Loaded(None, why)
    device = shared_device()
    if device is None:
        return Loaded(None, f"the C runtime cannot be used in this process ({_unusable})")
    try:
        model = NativeModel(Model.from_file(device, path, duplicates), label)
    except CRuntimeError as e:
        return Loaded(None, f"the C runtime refused it: {e}")
    if profiler.active():  # (only then does Python read the file: for the modelled track)
        _describe_for_profile(model, lambda: _load_file(path))
    return Loaded(model, "")


def _from_bytes(blob: bytes) -> Executable:
    from ..executable import from_bytes

    return from_bytes(blob)


def _load_file(path: str | os.PathLike) -> Executable:
    from ..executable import load_file

    return load_file(path)


def _describe_for_profile(model: NativeModel, parse: Callable[[], Executable]) -> None:
    """The profile's modelled track of the model's chunks needs its executable's stats,
    which the C library does not read: parsed here, once, for the profiler."""
    try:
        exe = parse()
    except ExecutableError as e:  # (the C runtime took it: not expected; the track is lost)
        _log.warning("no modelled track in the profile for %s: %s", model, e)
        return
    # The name the C library gives the model in its spans (observe.cc's About::name: at
    # most 60 bytes, never half a character).
    name = (model.label or ", ".join(s.name for s in model.outputs))
    name = name.encode()[:60].decode("utf-8", "ignore")
    profiler.note_native_model(model.id, name, model.batch_size, exe)


_loaded: weakref.WeakSet[NativeModel] = weakref.WeakSet()
