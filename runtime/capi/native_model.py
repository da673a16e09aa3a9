"""Models on the C runtime's process-wide device, with the Python runtime's Model surface
(`run_list`, `unload`, `duplicates`, `label`): what the Python host's NeuronOp loads when
the C runtime can run its executable, so its kernel calls `nr_execute_with` directly,
without the GIL (neuronish/ops/neuron_op.cc; `entry` is what it calls).

One C device per process (`nr_device_open`, configured from NEURONISH_* as the Python
device is), opened on first use and kept. A load that the C runtime refuses for any
reason (an instruction it lacks, a build failure, too little device memory) returns None:
the caller then loads on the Python runtime, which keeps its own rules (and its fallback
to TensorFlow). `NEURONISH_KERNEL=python` turns this path off; so do the settings only the
Python runtime honours: `NEURONISH_ENGINE=numpy`, `NEURONISH_NATIVE_EXCLUDE`, and a
profile (`NEURONISH_PROFILE`), which the C runtime does not record yet.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from ..errors import (
    Cancelled,
    DeadlineExceeded,
    DeviceError,
    ExecutableError,
    ExecutionError,
    InvalidInput,
    OutOfDeviceMemory,
)

ENV_KERNEL = "NEURONISH_KERNEL"

# nr_status -> the Python runtime's exception (neuronish_runtime.h's codes).
_ERRORS: dict[int, type[DeviceError]] = {
    1: InvalidInput, 3: ExecutableError, 4: ExecutableError, 8: DeviceError,
    9: OutOfDeviceMemory, 10: InvalidInput, 11: ExecutionError, 12: Cancelled,
    13: DeadlineExceeded,
}

_lock = threading.Lock()
_device = None  # binding.Device, opened on first use; None until then
_unusable: str | None = None  # why the C runtime cannot be used in this process
_log = logging.getLogger(__name__)


def wanted() -> bool:
    """Whether a NeuronOp should try the C runtime (the settings above allow it)."""
    from .. import profiler

    if os.environ.get(ENV_KERNEL, "").strip().lower() == "python":
        return False
    if os.environ.get("NEURONISH_ENGINE", "").strip().lower() == "numpy":
        return False
    if os.environ.get("NEURONISH_NATIVE_EXCLUDE", "").strip():
        return False
    return not profiler.active()


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


class NativeModel:
    """An executable loaded on the C device; runs with the Python runtime's signature."""

    def __init__(self, model, label: str = ""):  # model: binding.Model
        from .. import telemetry

        self._model = model
        self.label = label
        self.batch_size = int(model.batch_size)
        self.duplicates = int(model.lib.nr_model_duplicates(model.handle))
        self.core_groups = [tuple(c[0]) for c in model.copies()]
        # `neuronish ls/top` show it with the C runtime's counters (nr_model_copy).
        self._telemetry = telemetry.get_telemetry()
        if self._telemetry is not None:
            self._telemetry.track_native(self)
        _loaded.add(self)

    def copies(self) -> list[tuple[list[int], list[int], int, int]]:
        """Each copy's (cores, bytes per core, runs, busy ns), from the C runtime."""
        return self._model.copies()

    @property
    def entry(self) -> tuple[int, int] | None:
        """(nr_model*, nr_execute_with's address): what the kernel calls without the GIL;
        None once unloaded."""
        model = self._model.handle.value
        fn = ctypes.cast(self._model.lib.nr_execute_with, ctypes.c_void_p).value
        return (int(model), int(fn)) if model and fn else None

    def run_list(self, values: Sequence[object], out: list[np.ndarray] | None = None, *,
                 timeout: float | None = None, cancel: bytearray | None = None
                 ) -> list[np.ndarray]:
        try:
            return self._model.run([np.asarray(v) for v in values], outputs=out,
                                   timeout=timeout, cancel=cancel)
        except Exception as e:  # noqa: BLE001 - re-raised as the runtime's error
            raise_from(e)
            raise  # (unreachable: raise_from raises)

    def unload(self) -> None:
        _loaded.discard(self)  # (first: a snapshot lists it no more, then waits for one
        if self._telemetry is not None:  # listing it already to finish reading its copies)
            self._telemetry.untrack_native(self)
        self._model.unload()

    def __repr__(self) -> str:
        return f"<NativeModel {self.label!r}: {self.duplicates} duplicate(s) on the C device>"


def load(data: bytes | memoryview, want_duplicates: int, label: str = "") -> NativeModel | None:
    """`data` loaded on the C device with `want_duplicates` copies, or as many as fit
    (down to one); None when the C runtime cannot load it (why: logged at debug)."""
    from .binding import CRuntimeError, Model

    device = shared_device()
    if device is None:
        return None
    blob = bytes(data)
    for n in range(want_duplicates, 0, -1):
        try:
            return NativeModel(Model(device, blob, duplicates=n), label)
        except CRuntimeError as e:
            if e.status in (8, 9) and n > 1:  # too few core groups, or too little memory
                continue
            _log.debug("NeuronOp '%s': the C runtime does not load it (%s); it runs on the "
                       "Python runtime", label, e)
            return None
    return None


_loaded: weakref.WeakSet[NativeModel] = weakref.WeakSet()
