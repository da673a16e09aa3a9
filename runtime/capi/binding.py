"""A ctypes binding of the C runtime's device, model and execute calls
(runtime/include/neuronish_runtime.h), for tests and tools: numpy arrays in, numpy arrays
out, every non-OK status raised as CRuntimeError with its code and message. It holds no
logic of its own: what it checks, the C library checks again.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from collections.abc import Sequence

import numpy as np

from ..native import library as engine_library
from . import library

# nr_dtype's order (neuronish_runtime.h)
DTYPES = ("bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16",
          "float32", "float64")
_ERR = 4096


class CRuntimeError(RuntimeError):
    """A call into the C runtime returned a status other than NR_OK."""

    def __init__(self, status: int, name: str, message: str):
        super().__init__(f"{name} ({status}): {message}")
        self.status, self.name, self.message = status, name, message


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_size_t),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p),
                ("bytes", ctypes.c_size_t)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int),
                ("dtype_name", ctypes.c_char_p), ("rank", ctypes.c_size_t),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("batch_axis", ctypes.c_int64)]


class ExecuteOptions(ctypes.Structure):
    _fields_ = [("deadline_ns", ctypes.c_int64), ("cancel", ctypes.c_void_p)]


class CopyInfo(ctypes.Structure):
    _fields_ = [("cores", ctypes.POINTER(ctypes.c_int32)),
                ("bytes_per_core", ctypes.POINTER(ctypes.c_uint64)),
                ("num_cores", ctypes.c_size_t), ("runs", ctypes.c_uint64),
                ("busy_ns", ctypes.c_uint64)]


class CoreInfo(ctypes.Structure):
    _fields_ = [("core", ctypes.c_int32), ("used", ctypes.c_uint64), ("total", ctypes.c_uint64)]


def load_library(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    engine_library.set_wait_policy()  # (the C runtime links the engine and its libgomp)
    lib = ctypes.CDLL(str(library.build(extra_flags)))
    vp, sz, err = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    pvp = ctypes.POINTER(vp)
    signatures = {
        "nr_status_name": ([ctypes.c_int], ctypes.c_char_p),
        "nr_executable_load_bytes": ([ctypes.c_char_p, sz, pvp, err, sz], ctypes.c_int),
        "nr_executable_load_file": ([ctypes.c_char_p, pvp, err, sz], ctypes.c_int),
        "nr_executable_unload": ([vp], None),
        "nr_executable_num_tensors": ([vp, ctypes.c_int], sz),
        "nr_executable_tensor": ([vp, ctypes.c_int, sz, ctypes.POINTER(TensorInfo)], ctypes.c_int),
        "nr_device_open": ([pvp, err, sz], ctypes.c_int),
        "nr_device_close": ([vp], None),
        "nr_device_num_cores": ([vp], sz),
        "nr_device_core": ([vp, sz, ctypes.POINTER(CoreInfo)], ctypes.c_int),
        "nr_device_charge": ([vp, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64),
                              sz, err, sz], ctypes.c_int),
        "nr_device_fail_core": ([vp, ctypes.c_int32, ctypes.c_char_p, err, sz], ctypes.c_int),
        "nr_device_core_state": ([vp, ctypes.c_int32, ctypes.POINTER(ctypes.c_int), err, sz],
                                 ctypes.c_int),
        "nr_model_load": ([vp, vp, ctypes.c_uint32, pvp, err, sz], ctypes.c_int),
        "nr_model_load_bytes": ([vp, ctypes.c_char_p, sz, ctypes.c_uint32, pvp, err, sz],
                                ctypes.c_int),
        "nr_model_load_file": ([vp, ctypes.c_char_p, ctypes.c_uint32, pvp, err, sz], ctypes.c_int),
        "nr_model_unload": ([vp], None),
        "nr_model_executable": ([vp], vp),
        "nr_model_batch_size": ([vp], ctypes.c_int64),
        "nr_model_duplicates": ([vp], sz),
        "nr_model_copy": ([vp, sz, ctypes.POINTER(CopyInfo)], ctypes.c_int),
        "nr_execute": ([vp, ctypes.POINTER(Tensor), sz, ctypes.POINTER(Tensor), sz, err, sz],
                       ctypes.c_int),
        "nr_execute_with": ([vp, ctypes.POINTER(Tensor), sz, ctypes.POINTER(Tensor), sz,
                             ctypes.POINTER(ExecuteOptions), err, sz], ctypes.c_int),
        "nr_model_instruction_spec": ([vp, sz, ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
                                       ctypes.POINTER(sz),
                                       ctypes.POINTER(ctypes.POINTER(ctypes.c_double)),
                                       ctypes.POINTER(sz)], ctypes.c_int),
        "nr_model_instruction_team": ([vp, sz], ctypes.c_int32),
        "nr_model_stage_thread": ([vp, sz, sz], ctypes.c_int64),
        "nr_model_narrow_runs": ([vp, sz], ctypes.c_int64),
        "nr_model_set_label": ([vp, ctypes.c_char_p], ctypes.c_int),
        "nr_model_id": ([vp], ctypes.c_uint64),
        "nr_profile_start": ([err, sz], ctypes.c_int),
        "nr_profile_stop": ([pvp, ctypes.POINTER(sz), err, sz], ctypes.c_int),
        "nr_profile_free": ([vp], None),
        "nr_profile_recording": ([], ctypes.c_int),
    }
    for name, (args, res) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    # Python records the profile and publishes the counters of this process, the C
    # runtime's models included (runtime/profiler.py, runtime/telemetry.py): the library
    # must not do it a second time into the same files.
    lib.nr_host_observes.argtypes, lib.nr_host_observes.restype = [], None
    lib.nr_host_observes()
    # ... but while it records, the library records its models' spans for it
    # (nr_profile_start), which stop() merges into the one trace.
    with _recorders_lock:
        if lib._name not in _recorders:
            from .. import profiler

            _recorders[lib._name] = ProfileRecorder(lib)
            profiler.add_recorder(_recorders[lib._name])
    return lib


_recorders: dict[str, ProfileRecorder] = {}  # library path -> its recorder (one each)
_recorders_lock = threading.Lock()


class ProfileRecorder:
    """The C library's on-demand profile (nr_profile_start / nr_profile_stop), as
    runtime/profiler.py starts and stops it."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    def start(self) -> None:
        buf = ctypes.create_string_buffer(_ERR)
        _check(self.lib, self.lib.nr_profile_start(buf, _ERR), buf)

    def stop(self) -> dict:
        """Stop; the spans recorded since start(): {"clock", "dropped_events", "spans"}
        (neuronish_runtime.h describes each span)."""
        text, size = ctypes.c_void_p(), ctypes.c_size_t()
        buf = ctypes.create_string_buffer(_ERR)
        _check(self.lib, self.lib.nr_profile_stop(ctypes.byref(text), ctypes.byref(size), buf,
                                                  _ERR), buf)
        try:
            return json.loads(ctypes.string_at(text, size.value))
        finally:
            self.lib.nr_profile_free(text)

    def recording(self) -> bool:
        """Whether the library records a profile now (nr_profile_recording)."""
        return bool(self.lib.nr_profile_recording())


def _check(lib: ctypes.CDLL, status: int, buf: ctypes.Array | None) -> None:
    if status != 0:
        message = buf.value.decode("utf-8", "replace") if buf is not None else ""
        raise CRuntimeError(status, lib.nr_status_name(status).decode(), message)


class Device:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.handle = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(_ERR)
        _check(lib, lib.nr_device_open(ctypes.byref(self.handle), buf, _ERR), buf)

    def memory(self) -> dict[int, tuple[int, int]]:
        """core -> (used, total) bytes."""
        out = {}
        for k in range(self.lib.nr_device_num_cores(self.handle)):
            info = CoreInfo()
            _check(self.lib, self.lib.nr_device_core(self.handle, k, ctypes.byref(info)), None)
            out[info.core] = (info.used, info.total)
        return out

    def charge(self, deltas: dict[int, int]) -> None:
        """Bytes held (positive) or given back (negative) per core by models this device
        does not run (nr_device_charge): all or nothing."""
        n = len(deltas)
        cores = (ctypes.c_int32 * max(n, 1))(*deltas.keys())
        sizes = (ctypes.c_int64 * max(n, 1))(*deltas.values())
        buf = ctypes.create_string_buffer(_ERR)
        _check(self.lib, self.lib.nr_device_charge(self.handle, cores, sizes, n, buf, _ERR), buf)

    def fail_core(self, core: int, why: str = "hardware error") -> None:
        """Core `core` fails, for good (nr_device_fail_core): copies on it retire, loads
        avoid it."""
        buf = ctypes.create_string_buffer(_ERR)
        _check(self.lib, self.lib.nr_device_fail_core(self.handle, core, why.encode(), buf,
                                                      _ERR), buf)

    def failed_cores(self) -> dict[int, str]:
        """core -> "core <core> failed (<why>)", for each failed core (nr_device_core_state)."""
        out = {}
        for core in self.memory():
            state, buf = ctypes.c_int(), ctypes.create_string_buffer(_ERR)
            _check(self.lib, self.lib.nr_device_core_state(self.handle, core, ctypes.byref(state),
                                                           buf, _ERR), buf)
            if state.value:
                out[core] = buf.value.decode("utf-8", "replace")
        return out

    def close(self) -> None:
        if self.handle:
            self.lib.nr_device_close(self.handle)
            self.handle = ctypes.c_void_p()


class Model:
    """An executable (its bytes) loaded onto a C device."""

    def __init__(self, device: Device, data: bytes, duplicates: int = 1):
        self.device = device
        lib = self.lib = device.lib
        buf = ctypes.create_string_buffer(_ERR)
        self.handle = ctypes.c_void_p()
        self._handle_lock = threading.Lock()  # set_label against unload (see set_label)
        _check(lib, lib.nr_model_load_bytes(device.handle, data, len(data), duplicates,
                                            ctypes.byref(self.handle), buf, _ERR), buf)
        self._describe()

    @classmethod
    def from_file(cls, device: Device, path: str | os.PathLike, duplicates: int = 1) -> Model:
        """The executable file at `path` loaded onto `device` (nr_model_load_file: the
        library reads it once and hashes it as it reads; its refusals name the file)."""
        self = cls.__new__(cls)
        self.device, self.lib = device, device.lib
        buf = ctypes.create_string_buffer(_ERR)
        self.handle = ctypes.c_void_p()
        self._handle_lock = threading.Lock()
        _check(self.lib, self.lib.nr_model_load_file(device.handle, os.fsencode(path), duplicates,
                                                     ctypes.byref(self.handle), buf, _ERR), buf)
        self._describe()
        return self

    @classmethod
    def load_again(cls, source: Model, duplicates: int) -> Model:
        """The executable `source` holds, loaded again on its device as a new model with
        `duplicates` copies (onto the cores that still work, once failed cores retired
        every copy of `source`); no bytes are read again."""
        self = cls.__new__(cls)
        self.device, self.lib = source.device, source.lib
        lib = self.lib
        buf = ctypes.create_string_buffer(_ERR)
        self.handle = ctypes.c_void_p()
        self._handle_lock = threading.Lock()
        exe = lib.nr_model_executable(source.handle)
        _check(lib, lib.nr_model_load(source.device.handle, exe, duplicates,
                                      ctypes.byref(self.handle), buf, _ERR), buf)
        self._describe()
        return self

    def _describe(self) -> None:
        """The loaded model's signature and what every call's tensors carry."""
        lib = self.lib
        exe = lib.nr_model_executable(self.handle)
        self.inputs = [self._info(exe, 0, k) for k in range(lib.nr_executable_num_tensors(exe, 0))]
        self.outputs = [self._info(exe, 1, k)
                        for k in range(lib.nr_executable_num_tensors(exe, 1))]
        self.batch_size = lib.nr_model_batch_size(self.handle)
        # What every call's tensors carry, worked out once (numpy's dtype names and
        # ctypes' string encoding cost microseconds a call).
        self._in_tags = [(n.encode(), DTYPES.index(d), _np_dtype(d))
                         for n, d, _, _ in self.inputs]
        self._out_tags = [(n.encode(), DTYPES.index(d), _np_dtype(d))
                          for n, d, _, _ in self.outputs]
        self._errors = threading.local()  # a message buffer per calling thread

    def _info(self, exe: int, which: int, k: int) -> tuple[str, str, tuple[int, ...], int]:
        info = TensorInfo()
        _check(self.lib, self.lib.nr_executable_tensor(exe, which, k, ctypes.byref(info)), None)
        return (info.name.decode(), info.dtype_name.decode(),
                tuple(info.shape[i] for i in range(info.rank)), info.batch_axis)

    @staticmethod
    def _tensor(a: np.ndarray, name: str | bytes | None, dtype: str | None = None,
                code: int | None = None) -> Tensor:
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        if code is None:
            code = DTYPES.index(dtype or a.dtype.name)
        t = Tensor(name.encode() if isinstance(name, str) else name, code, a.ndim, shape,
                   a.ctypes.data, a.nbytes)
        t._keep = shape  # type: ignore[attr-defined]
        return t

    def _error_buffer(self) -> ctypes.Array:
        buf = getattr(self._errors, "buf", None)
        if buf is None:
            buf = self._errors.buf = ctypes.create_string_buffer(_ERR)
        return buf

    def run(self, inputs: Sequence[np.ndarray], names: bool = True,
            outputs: Sequence[np.ndarray] | None = None, *, timeout: float | None = None,
            cancel: bytearray | None = None) -> list[np.ndarray]:
        """Run on arrays in signature order; returns the outputs (allocated here unless
        given, each with the call's batch on its batch axis). `timeout` (seconds) and
        `cancel` (a bytearray(1) another thread may set) as in runtime.Model.run."""
        # (not np.ascontiguousarray on a scalar: it returns shape [1], which the C runtime
        # then refuses against the signature's [])
        arrays = [a if (a := np.asarray(x)).flags.c_contiguous else np.ascontiguousarray(a)
                  for x in inputs]
        batch = None
        for (_, _, _, axis), x in zip(self.inputs, arrays):
            if axis >= 0 and self.batch_size >= 0 and x.ndim > axis:
                batch = x.shape[axis]
        if outputs is None:
            outputs = []
            for _, dtype, shape, axis in self.outputs:
                dims = list(shape)
                if axis >= 0 and batch is not None:
                    dims[axis] = batch
                outputs.append(np.empty(dims, _np_dtype(dtype)))
        # (a dtype other than the signature's is the caller's to get refused by name)
        ins = (Tensor * max(len(arrays), 1))(*[
            self._tensor(x, tag[0] if names else None,
                         code=tag[1] if x.dtype == tag[2] else None)
            for tag, x in zip(self._in_tags, arrays)])
        outs = (Tensor * max(len(outputs), 1))(*[
            self._tensor(o, tag[0] if names else None,
                         code=tag[1] if o.dtype == tag[2] else None)
            for tag, o in zip(self._out_tags, outputs)])
        buf = self._error_buffer()
        buf[0] = b"\0"
        if timeout is None and cancel is None:
            _check(self.lib, self.lib.nr_execute(self.handle, ins, len(arrays), outs,
                                                 len(outputs), buf, _ERR), buf)
            return list(outputs)
        flag = ctypes.c_uint8.from_buffer(cancel) if cancel is not None else None
        options = ExecuteOptions(
            0 if timeout is None else time.monotonic_ns() + int(timeout * 1e9),
            ctypes.addressof(flag) if flag is not None else None)
        _check(self.lib, self.lib.nr_execute_with(self.handle, ins, len(arrays), outs,
                                                  len(outputs), ctypes.byref(options), buf,
                                                  _ERR), buf)
        return list(outputs)

    def raw_run(self, ins: Sequence[Tensor], outs: Sequence[Tensor]) -> None:
        """nr_execute on hand-made tensors (for tests of what the C side refuses)."""
        a = (Tensor * max(len(ins), 1))(*ins)
        b = (Tensor * max(len(outs), 1))(*outs)
        buf = ctypes.create_string_buffer(_ERR)
        _check(self.lib, self.lib.nr_execute(self.handle, a, len(ins), b, len(outs), buf, _ERR),
               buf)

    def spec(self, index: int) -> tuple[list[int], list[float]] | None:
        """The engine spec the C loader built for instruction `index` (None: not given)."""
        ints = ctypes.POINTER(ctypes.c_int64)()
        floats = ctypes.POINTER(ctypes.c_double)()
        n, nf = ctypes.c_size_t(), ctypes.c_size_t()
        status = self.lib.nr_model_instruction_spec(self.handle, index, ctypes.byref(ints),
                                                    ctypes.byref(n), ctypes.byref(floats),
                                                    ctypes.byref(nf))
        if status == 4:  # NR_UNSUPPORTED
            return None
        _check(self.lib, status, None)
        return [ints[i] for i in range(n.value)], [floats[i] for i in range(nf.value)]

    def team(self, index: int) -> int:
        """The threads the C loader runs instruction `index` on (0: not given)."""
        return int(self.lib.nr_model_instruction_team(self.handle, index))

    def stage_thread(self, copy: int, stage: int) -> int:
        """For tests: the native id of the thread that last ran `stage` of copy `copy` (0:
        it has not run; -1: no such copy or stage)."""
        return int(self.lib.nr_model_stage_thread(self.handle, copy, stage))

    def narrow_runs(self, copy: int = 0) -> int:
        """For tests: runs of copy `copy` on its one-thread twin (-1: no such copy)."""
        return int(self.lib.nr_model_narrow_runs(self.handle, copy))

    def copies(self) -> list[tuple[list[int], list[int], int, int]]:
        """Each copy's (cores, bytes per core, runs, busy ns): nr_model_copy (copies retired
        by a failed core included)."""
        out = []
        for k in range(self.lib.nr_model_duplicates(self.handle) if self.handle else 0):
            info = CopyInfo()
            _check(self.lib, self.lib.nr_model_copy(self.handle, k, ctypes.byref(info)), None)
            n = info.num_cores
            out.append(([info.cores[i] for i in range(n)],
                        [info.bytes_per_core[i] for i in range(n)], info.runs, info.busy_ns))
        return out

    @property
    def id(self) -> int:
        """A number no other model of this process has had (nr_model_id): the C library's
        profile spans name the model by it (args.model_id) besides its label."""
        return int(self.lib.nr_model_id(self.handle))

    def set_label(self, label: str) -> bool:
        """The model's name in the library's profile spans and telemetry
        (nr_model_set_label), at any time, also while other threads call it; False (and
        nothing done) once it is unloaded, also by another thread at the same moment."""
        # The C API forbids unloading a handle another thread uses; a relabel is quick,
        # so it and unload take turns (calls do not: a caller must not unload a model it
        # is still calling, as in C).
        with self._handle_lock:
            if not self.handle:
                return False
            _check(self.lib, self.lib.nr_model_set_label(self.handle, label.encode()), None)
            return True

    def unload(self) -> None:
        """Frees the model (once: a second unload, from any thread, does nothing)."""
        with self._handle_lock:
            handle, self.handle = self.handle, ctypes.c_void_p()
            if handle:
                self.lib.nr_model_unload(handle)


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
