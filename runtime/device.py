"""The simulated device: cores, their memory, and the threads that run work.

There is one device per process (`get_device()`), configured from the
environment (runtime/config.py). Memory is accounted per core: loading a model
charges each core of each core group it lands on; the bytes themselves are host
memory (numpy arrays), shared between duplicates where they are read-only.

The process's device is one device with one memory limit even when models load on the
C runtime (runtime/capi/native_model.py: `load` and the NeuronOp put models there when
it can run them): once the C runtime's device is open, it keeps the process's ledger
(`attach_ledger`), and this device charges its own models' memory there too, so either
runtime sees what the other holds. Failing a core of the process's device (`fail_core`,
or NEURONISH_FAILED_CORES when it is made) fails it on the C runtime's device too.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .config import ConfigError, DeviceConfig
from .errors import DeviceError, OutOfDeviceMemory
from .host import HostCPUs
from .kernels import parallel

_MIB = 1 << 20

ENV_FAILED_CORES = "NEURONISH_FAILED_CORES"
_WHITESPACE = " \t\n\r\f\v"  # (what the C runtime trims: the two read it alike)


def failed_cores_from_env(visible_cores: Sequence[int],
                          env: Mapping[str, str] | None = None) -> dict[int, str]:
    """NEURONISH_FAILED_CORES: cores that have failed from the start, each with why, as
    `fail_core` takes them: '1', '0,1', '1:ECC error,0' (a reason after ':', no commas in
    it). The C runtime's device reads it in the same words (runtime/capi/device.cc);
    ConfigError names the variable, what it expects and what came."""
    text = (os.environ if env is None else env).get(ENV_FAILED_CORES)
    if text is None or not text.strip(_WHITESPACE):
        return {}
    where = f"{ENV_FAILED_CORES}='{text}': "
    failed: dict[int, str] = {}
    for entry in (e.strip(_WHITESPACE) for e in text.split(",")):
        core, _, why = (part.strip(_WHITESPACE) for part in entry.partition(":"))
        if not (core.isascii() and core.isdigit() and len(core) < 10):
            raise ConfigError(f"{where}expected visible cores separated by commas, each with an "
                              f"optional reason after ':' (e.g. '1' or '0:ECC error,1'); got "
                              f"'{entry}'")
        if int(core) not in visible_cores:
            raise ConfigError(f"{where}core {int(core)} is not one of the visible cores "
                              f"{list(visible_cores)}")
        if int(core) in failed:
            raise ConfigError(f"{where}core {int(core)} is named twice")
        failed[int(core)] = why or f"named in {ENV_FAILED_CORES}"
    return failed


@dataclass(frozen=True)
class Reservation:
    """Memory held on a set of cores by one loaded copy of a model."""

    cores: tuple[int, ...]
    bytes_per_core: tuple[int, ...]


class Device:
    def __init__(self, config: DeviceConfig):
        self.config = config
        self._used = {c: 0 for c in config.visible_cores}
        self._lock = threading.Lock()
        # Chunks of one call run in parallel on a model's duplicates; one worker
        # per visible core is enough to keep every core busy...
        self.pool = ThreadPoolExecutor(max_workers=len(config.visible_cores),
                                       thread_name_prefix="neuronish-core")
        # ...but the host computes only as many programs at once as its CPUs hold, each
        # taking as many as its widest team (runtime/host.py); the others queue.
        self.host_cpus = HostCPUs(config.host_parallelism * config.core_threads,
                                  None if config.share_by_width else config.core_threads)
        self._failed: dict[int, str] = {}  # core -> its message (fail_core)
        self._why: dict[int, str] = {}  # core -> the reason fail_core was given
        self._models: weakref.WeakSet = weakref.WeakSet()  # loaded models, for fail_core

    @property
    def cores(self) -> tuple[int, ...]:
        return self.config.visible_cores

    _ledger = None  # the C runtime's device (binding.Device) once it keeps the ledger

    def attach_ledger(self, ledger) -> bool:  # ledger: binding.Device
        """Keep this device's memory on `ledger`, the C runtime's device of the same
        configured cores, from now on: what this device's models hold is charged there
        (at once for those loaded already), and room is what it has free. False (and
        separate budgets, logged) if its cores or memory differ from this device's."""
        with self._lock:
            if self._ledger is not None:
                return self._ledger is ledger
            memory = ledger.memory()
            if set(memory) != set(self._used) or any(
                    total != self.config.core_memory for _, total in memory.values()):
                logging.getLogger(__name__).warning(
                    "the C runtime's device (cores %s) is not configured as this device "
                    "(cores %s, %d bytes each): the two keep separate memory budgets",
                    {c: t for c, (_, t) in memory.items()}, list(self._used),
                    self.config.core_memory)
                return False
            held = {c: b for c, b in self._used.items() if b}
            if held:
                from .capi.binding import CRuntimeError

                try:  # (the C device is new when this runs: it has the room)
                    ledger.charge(held)
                except CRuntimeError as e:
                    logging.getLogger(__name__).warning(
                        "the C runtime's device cannot take this device's models' memory "
                        "(%s): the two keep separate memory budgets", e)
                    return False
            self._ledger = ledger
            return True

    def _free(self) -> dict[int, int]:
        """Free bytes per core, of the one budget (under self._lock)."""
        if self._ledger is not None:
            return {c: total - used for c, (used, total) in self._ledger.memory().items()}
        return {c: self.config.core_memory - u for c, u in self._used.items()}

    def _charge(self, deltas: dict[int, int]) -> None:
        """Record `deltas` (bytes per core) on the ledger, if any: all or nothing (under
        self._lock). A C model loaded meanwhile may have taken the room: OutOfDeviceMemory."""
        if self._ledger is None or not any(deltas.values()):
            return
        from .capi.binding import CRuntimeError

        try:
            self._ledger.charge(deltas)
        except CRuntimeError as e:
            raise (OutOfDeviceMemory if e.status == 9 else DeviceError)(e.message) from None

    def free_bytes(self, core: int) -> int:
        with self._lock:
            return self._free()[core]

    def memory_report(self) -> dict[int, dict[str, int]]:
        """Per core: bytes in use and free, of the one budget (the C runtime's models
        included once its device keeps the ledger)."""
        with self._lock:
            if self._ledger is not None:
                return {c: {"used": used, "free": total - used}
                        for c, (used, total) in self._ledger.memory().items()}
            used = dict(self._used)
        if self is _device:  # (a C device configured otherwise: its own budget, added)
            from .capi.native_model import device_used

            for core, size in device_used().items():
                if core in used:
                    used[core] += size
        return {c: {"used": u, "free": self.config.core_memory - u} for c, u in used.items()}

    def _candidate_groups(self, size: int) -> list[tuple[int, ...]]:
        groups = [g[:size] for g in self.config.core_groups if len(g) >= size]
        if not groups and all(len(g) == 1 for g in self.config.core_groups):
            cores = self.config.visible_cores  # default layout: consecutive runs of cores
            groups = [cores[i:i + size] for i in range(0, len(cores) - size + 1, size)]
        return [g for g in groups if not any(c in self._failed for c in g)]

    def fail_core(self, core: int, why: str = "hardware error") -> None:
        """Simulate core `core` failing, as a real device's core can in service: a model
        with a copy on it retires that copy and runs on its others; a model with no other
        copy fails its next calls with a DeviceError naming the core (a NeuronOp then
        runs on TensorFlow, neuronish/fallback.py). Loads avoid the core from now on.
        Failing it again changes nothing (its first reason stays, as in the C runtime).
        On the process's device (`get_device()`), the C runtime's device loses the core
        too, with its models there (runtime/capi/native_model.py)."""
        if core not in self._used:
            raise DeviceError(f"core {core} is not one of the visible cores "
                              f"{list(self.config.visible_cores)}")
        message = f"core {core} failed ({why})"
        with self._lock:
            if core in self._failed:
                return
            self._failed[core] = message
            self._why[core] = why
            hit = [m for m in self._models if any(core in g for g in m.core_groups)]
        for model in hit:
            model.lose_core(core, message)
        if self is _device:
            from .capi import native_model

            native_model.fail_core(core, why)

    def failed_cores(self) -> dict[int, str]:
        """core -> "core <core> failed (<why>)", for each failed core."""
        with self._lock:
            return dict(self._failed)

    def failure_reasons(self) -> dict[int, str]:
        """core -> the reason `fail_core` was given, for each failed core."""
        with self._lock:
            return dict(self._why)

    def loaded_models(self) -> list[object]:
        """The models loaded onto this device now (a server labels its own with the
        model name and version it serves them under)."""
        with self._lock:
            return list(self._models)

    def track(self, model: object) -> None:
        """A model loaded onto this device (so fail_core can reach it)."""
        with self._lock:
            self._models.add(model)

    def reserve(self, group_size: int, bytes_per_core: list[int], copies: int) -> list[Reservation]:
        """Place `copies` copies of a model needing `bytes_per_core[k]` on the k-th core
        of a core group of `group_size` cores; all or nothing."""
        groups = self._candidate_groups(group_size)
        if copies > len(groups):
            failed = f"; failed: {', '.join(self._failed.values())}" if self._failed else ""
            raise DeviceError(
                f"cannot load {copies} duplicate(s) of a model that needs {group_size} core(s) "
                f"per copy: the device has {len(groups)} such core group(s) (visible cores "
                f"{list(self.config.visible_cores)}, groups "
                f"{[list(g) for g in self.config.core_groups]}{failed})"
                "; set NEURONISH_NUM_CORES / NEURONISH_CORE_GROUP_SIZES or ask for fewer")
        with self._lock:
            free = self._free()
            fits = [g for g in groups
                    if all(free[c] >= b for c, b in zip(g, bytes_per_core))]
            if len(fits) < copies:
                best = max(groups, key=lambda g: min(free[c] for c in g))
                need = max(bytes_per_core)
                raise OutOfDeviceMemory(
                    f"out of device memory: loading needs {need / _MIB:.1f} MiB on each core of "
                    f"{copies} core group(s); {len(fits)} group(s) have room, the freest core "
                    f"group {list(best)} has "
                    f"{min(free[c] for c in best) / _MIB:.1f} MiB free of "
                    f"{self.config.core_memory / _MIB:.0f} MiB per core. Unload a model, load "
                    "fewer duplicates, or raise NEURONISH_CORE_MEMORY")
            # Spread load: freest groups first.
            fits.sort(key=lambda g: -min(free[c] for c in g))
            deltas: dict[int, int] = {}
            for g in fits[:copies]:
                for c, b in zip(g, bytes_per_core):
                    deltas[c] = deltas.get(c, 0) + b
            self._charge(deltas)
            out = []
            for g in fits[:copies]:
                for c, b in zip(g, bytes_per_core):
                    self._used[c] += b
                out.append(Reservation(tuple(g), tuple(bytes_per_core)))
            return out

    def resize(self, reservation: Reservation, bytes_per_core: list[int]) -> Reservation:
        """The same cores holding `bytes_per_core` instead; OutOfDeviceMemory (and the
        old reservation kept) if a core lacks the room."""
        with self._lock:
            free = self._free()
            deltas: dict[int, int] = {}
            for c, old, new in zip(reservation.cores, reservation.bytes_per_core,
                                   bytes_per_core):
                if new - old > free[c]:
                    raise OutOfDeviceMemory(
                        f"out of device memory: the loaded model needs {new / _MIB:.1f} MiB on "
                        f"core {c}, which has {(free[c] + old) / _MIB:.1f} MiB free "
                        f"of {self.config.core_memory / _MIB:.0f} MiB. Unload a model, load "
                        "fewer duplicates, or raise NEURONISH_CORE_MEMORY")
                deltas[c] = deltas.get(c, 0) + new - old
            self._charge(deltas)
            for c, old, new in zip(reservation.cores, reservation.bytes_per_core,
                                   bytes_per_core):
                self._used[c] += new - old
            return Reservation(reservation.cores, tuple(bytes_per_core))

    def release(self, reservation: Reservation) -> None:
        with self._lock:
            deltas: dict[int, int] = {}
            for c, b in zip(reservation.cores, reservation.bytes_per_core):
                self._used[c] -= b
                deltas[c] = deltas.get(c, 0) - b
            self._charge(deltas)


_device: Device | None = None
_device_lock = threading.Lock()


def get_device() -> Device:
    """The process's device, created from the environment on first use."""
    global _device
    with _device_lock:
        if _device is None:
            config = DeviceConfig.from_env()
            failed = failed_cores_from_env(config.visible_cores)
            _device = Device(config)
            from .capi import native_model

            if (ledger := native_model.opened_device()) is not None:  # (see attach_ledger)
                _device.attach_ledger(ledger)
            for core, why in failed.items():
                _device.fail_core(core, why)
            # Kernel lanes are a property of the host, set by the process's device (a
            # Device built by hand, as tests do, leaves them alone).
            parallel.configure(config.kernel_threads, config.host_parallelism)
        return _device
