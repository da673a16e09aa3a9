"""Device counters each process publishes, for `neuronish ls` / `neuronish top`.

Every process that loads a model onto the device writes one small JSON file,
`<run dir>/<pid>.json`, rewritten atomically (temp file + rename) every
`PUBLISH_INTERVAL` seconds by a daemon thread and removed when the process
exits normally. Readers skip (and delete) files whose process is gone, so a
killed process leaves nothing behind for long.

The counters are cumulative (busy seconds per core, calls, inferences), so a
reader computes rates from two samples: utilisation of a core = its busy
seconds' increase / wall seconds between the samples. A call's busy time is
charged to every core of the core group that ran it; in-flight calls count up
to the moment of publishing.

Run dir: `NEURONISH_RUN_DIR`, else `$XDG_RUNTIME_DIR/neuronish`, else
`/tmp/neuronish-<uid>`. `NEURONISH_TELEMETRY=0` turns publishing off.

The run dir follows the rule of every neuronish cache (runtime/buildcache.py):
created 0700, and used only if it is a real directory we own that nobody else can
write, its parents safe too; otherwise a publisher warns once and stops, and a
reader refuses it. A reader takes only regular files (no symlinks) of at most
`MAX_RECORD_BYTES` holding the fields below with the types below; any other file
is skipped with one line saying why (`read_all`'s `skipped`).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

from .buildcache import BuildError, Cache
from .files import read_json

PUBLISH_INTERVAL = 0.5  # seconds
FORMAT = 1
MAX_RECORD_BYTES = 1 << 20  # one process's counters: a few KiB


class UntrustedRunDir(BuildError):
    """The run directory could have been written by another user."""


def _trusted(directory: Path) -> Path:
    """`directory`, created 0700 if missing, else checked; raises UntrustedRunDir."""
    return Cache(directory, "device counters", "NEURONISH_RUN_DIR", UntrustedRunDir,
                 risk="could plant or replace the counters that neuronish ls/top show, or "
                      "read this process's", title="the run directory of").secure()


def run_dir() -> Path:
    explicit = os.environ.get("NEURONISH_RUN_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "neuronish" if xdg else Path(tempfile.gettempdir()) / \
        f"neuronish-{os.getuid()}"


def enabled() -> bool:
    return os.environ.get("NEURONISH_TELEMETRY", "1") not in ("0", "false", "no", "off")


class _ModelCounters:
    def __init__(self, model_id: int, model: object):
        exe = model.exe  # type: ignore[attr-defined]
        self.id = model_id
        self.model = weakref.ref(model)  # for its label, which a loader may set later
        self.default_name = ", ".join(s.name for s in exe.outputs)[:80] or f"model-{model_id}"
        self.groups: list[tuple[int, ...]] = list(model.core_groups)  # type: ignore[attr-defined]
        reservations = model._reservations  # type: ignore[attr-defined]
        self.bytes_per_core = list(reservations[0].bytes_per_core) if reservations else []
        self.engine = getattr(model, "engine", "numpy")
        self.batch = model.batch_size or 1  # type: ignore[attr-defined]
        self.loaded_at = time.time()
        self.calls = 0
        self.inferences = 0
        self.busy_seconds = 0.0
        self.busy_groups: dict[tuple[int, ...], float] = {}  # group -> start of current call

    def name(self) -> str:
        """The model's `label` (the NeuronOp's node name, set by neuronish's kernel
        bridge), else its output tensor names."""
        return getattr(self.model(), "label", None) or self.default_name

    def note(self) -> str:
        """Why `runtime.load` left it on the Python runtime ("" for a NeuronOp's)."""
        return getattr(self.model(), "runtime_note", "") or ""


class Telemetry:
    """This process's counters; `publish` writes them, `track`/`busy` update them."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory or run_dir()
        self.pid = os.getpid()
        self.path = self.directory / f"{self.pid}.json"
        self._lock = threading.Lock()
        self._publishing = threading.Lock()  # see publish
        self._models: dict[int, _ModelCounters] = {}  # id(model) -> counters
        # What telemetry adds to each model on the C runtime: (its id here, loaded at).
        # Which models are loaded is native_model.loaded_models()'s to say, not ours.
        self._native: weakref.WeakKeyDictionary[object, tuple[int, float]] = \
            weakref.WeakKeyDictionary()
        self._ids = itertools.count()
        self._core_busy: dict[int, float] = {}
        self._device: object = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.started = time.time()
        self._trusted = False  # the run dir has been checked (see the module doc)

    # -- hooks (runtime/model.py) ---------------------------------------------
    def track(self, model: object) -> None:
        """A model was loaded."""
        with self._lock:
            self._models[id(model)] = _ModelCounters(next(self._ids), model)
            self._device = model.device  # type: ignore[attr-defined]
            self._start()

    def track_native(self, model: object) -> None:
        """A model was loaded on the C runtime (runtime/capi/native_model.py): its
        counters are the C runtime's (nr_model_copy), read when publishing. Its cores are
        the C device's, configured from the same NEURONISH_* as this process's device."""
        from .device import get_device

        with self._lock:
            self._native[model] = (next(self._ids), time.time())
            if self._device is None:
                self._device = get_device()
            self._start()

    def untrack_native(self, model: object) -> None:
        """Before a C-runtime model unloads, after it left native_model.loaded_models():
        a snapshot reading it (under the lock) finishes first, and none reads it after."""
        with self._lock:
            self._native.pop(model, None)

    def _start(self) -> None:  # (under self._lock)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="neuronish-telemetry",
                                            daemon=True)
            self._thread.start()
            atexit.register(self.close)

    def untrack(self, model: object) -> None:
        """A model was unloaded."""
        with self._lock:
            self._models.pop(id(model), None)

    def begin(self, model: object) -> tuple[_ModelCounters, tuple[int, ...], float] | None:
        """One execution of a model's program (a chunk of its compiled batch) starts;
        pass what this returns to `end`. (Two plain calls, not a context manager: this
        is on every call's path, and a generator costs microseconds there.)"""
        counters = self._models.get(id(model))
        if counters is None:
            return None
        with self._lock:  # any idle group of the model: copies are interchangeable
            group = next((g for g in counters.groups if g not in counters.busy_groups),
                         counters.groups[0])
            start = counters.busy_groups[group] = time.perf_counter()
        _current.group = group
        return counters, group, start

    def end(self, token: tuple[_ModelCounters, tuple[int, ...], float] | None) -> None:
        if token is None:
            return
        counters, group, start = token
        _current.group = None
        with self._lock:
            seconds = time.perf_counter() - start
            counters.busy_groups.pop(group, None)
            counters.calls += 1
            counters.inferences += counters.batch
            counters.busy_seconds += seconds
            for core in group:
                self._core_busy[core] = self._core_busy.get(core, 0.0) + seconds

    @contextlib.contextmanager
    def busy(self, model: object) -> Iterator[None]:
        """`begin` ... `end` around the block."""
        token = self.begin(model)
        try:
            yield
        finally:
            self.end(token)

    # -- publishing -------------------------------------------------------------
    def snapshot(self) -> dict:
        now = time.perf_counter()
        with self._lock:
            core_busy = dict(self._core_busy)
            models = []
            for m in self._models.values():
                in_flight = sum(now - t for t in m.busy_groups.values())
                for g, t in m.busy_groups.items():
                    for core in g:
                        core_busy[core] = core_busy.get(core, 0.0) + now - t
                models.append({"id": m.id, "name": m.name(), "core_groups": [list(g) for g in
                                                                           m.groups],
                               "bytes_per_core": m.bytes_per_core, "batch": m.batch,
                               "engine": m.engine, "calls": m.calls,
                               "inferences": m.inferences,
                               "busy_seconds": m.busy_seconds + in_flight,
                               "loaded_at": m.loaded_at, "note": m.note()})
            from .capi.native_model import loaded_models

            for model in loaded_models():
                if (extra := self._native.get(model)) is not None:
                    models.append(self._native_record(*extra, model, core_busy))
            device = self._device
        config = device.config  # type: ignore[attr-defined]
        memory = device.memory_report()  # type: ignore[attr-defined] (C models' memory too)
        failed = device.failed_cores()  # type: ignore[attr-defined]
        return {
            "format": FORMAT, "pid": os.getpid(), "command": " ".join(sys.argv)[:200],
            "started": self.started, "time": time.time(),
            "device": {"num_cores": config.num_cores, "visible_cores": list(config.visible_cores),
                       "core_groups": [list(g) for g in config.core_groups],
                       "core_memory": config.core_memory,
                       "engine": next((m["engine"] for m in models), "-")},
            "cores": {str(c): {"used_bytes": memory[c]["used"],
                               "busy_seconds": core_busy.get(c, 0.0),
                               **({"failed": failed[c]} if c in failed else {})}
                      for c in memory},
            "models": models,
        }

    @staticmethod
    def _native_record(model_id: int, loaded_at: float, model: object,
                       core_busy: dict[int, float]) -> dict:
        """A C-runtime model's entry of the snapshot; adds its copies' busy time to their
        cores'. (Under the lock: it cannot be unloaded meanwhile.)"""
        copies = model.copies()  # type: ignore[attr-defined]
        for cores, _, _, busy_ns in copies:
            for core in cores:
                core_busy[core] = core_busy.get(core, 0.0) + busy_ns * 1e-9
        runs = sum(c[2] for c in copies)
        batch = model.batch_size or 1  # type: ignore[attr-defined]  (None: no batch axis)
        name = (model.label  # type: ignore[attr-defined]
                or ", ".join(s.name for s in model.outputs)[:80]  # type: ignore[attr-defined]
                or f"model-{model_id}")
        return {"id": model_id, "name": name,
                "core_groups": [list(c[0]) for c in copies],
                "bytes_per_core": list(copies[0][1]) if copies else [], "batch": batch,
                "engine": "native (C runtime)", "calls": runs, "inferences": runs * batch,
                "busy_seconds": sum(c[3] for c in copies) * 1e-9, "loaded_at": loaded_at}

    def publish(self) -> None:
        if self._device is None:
            return
        # One publish at a time, snapshot to rename: the background loop's write of an
        # older snapshot must not land after (and over) a newer one.
        with self._publishing:
            data = json.dumps(self.snapshot())
            if not self._trusted:
                _trusted(self.directory)
                self._trusted = True
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{os.getpid()}.",
                                       suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(data)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def close(self) -> None:
        """Stop publishing and remove this process's file (at exit)."""
        if os.getpid() != self.pid:  # a forked child: the file is its parent's
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * PUBLISH_INTERVAL)
        self.path.unlink(missing_ok=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.publish()
            except OSError:  # a full or read-only disk must not stop the device
                pass
            except UntrustedRunDir as e:  # say so once; the device carries on unpublished
                print(f"neuronish: warning: not publishing device counters: {e}",
                      file=sys.stderr)
                return
            self._stop.wait(PUBLISH_INTERVAL)


_current = threading.local()  # the core group this thread is executing on, if any


def current_group() -> tuple[int, ...] | None:
    """The core group the calling thread's chunk runs on (for the profiler's tracks)."""
    return getattr(_current, "group", None)


_telemetry: Telemetry | None = None
_telemetry_lock = threading.Lock()


def _forget_in_child() -> None:
    """A forked child publishes under its own pid, if it uses the device at all."""
    global _telemetry, _telemetry_lock
    _telemetry, _telemetry_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def get_telemetry() -> Telemetry | None:
    """The process's publisher, or None when `NEURONISH_TELEMETRY=0`."""
    global _telemetry
    if not enabled():
        return None
    with _telemetry_lock:
        if _telemetry is None:
            _telemetry = Telemetry()
        return _telemetry


def model_loaded(model: object) -> Telemetry | None:
    """Track `model`; returns the publisher its calls report to (None: publishing off)."""
    if (t := get_telemetry()) is not None:
        t.track(model)
    return t


def model_unloaded(model: object) -> None:
    if (t := get_telemetry()) is not None:
        t.untrack(model)


def publish_now() -> None:
    """Publish at once (after a loader relabelled its models), so a reader started
    right afterwards does not see the snapshot of up to PUBLISH_INTERVAL ago."""
    if (t := get_telemetry()) is not None:
        try:
            t.publish()
        except (OSError, UntrustedRunDir):  # the background loop reports these
            pass


# -- reading (neuronish ls / top) ----------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _number(x: object, integer: bool = False) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    if integer and not isinstance(x, int):
        return False
    return 0 <= x <= 2**53  # finite, and what a float holds exactly


def _ints(x: object) -> bool:
    return isinstance(x, list) and all(_number(i, True) for i in x)


def check_record(d: object) -> str | None:
    """Why a counters file's JSON is not one `neuronish ls`/`top` can show, or None."""
    if not isinstance(d, dict):
        return f"expected a JSON object, got {type(d).__name__}"
    for key, ok in (("pid", lambda v: _number(v, True) and 0 < v < 2**31),
                    ("time", _number), ("command", lambda v: isinstance(v, str)),
                    ("device", lambda v: isinstance(v, dict)),
                    ("cores", lambda v: isinstance(v, dict)),
                    ("models", lambda v: isinstance(v, list))):
        if not ok(d.get(key)):
            return f"field {key!r} is missing or of the wrong type ({str(d.get(key))[:40]!r})"
    dev = d["device"]
    if not (_number(dev.get("num_cores"), True) and _ints(dev.get("visible_cores"))
            and isinstance(dev.get("core_groups"), list) and all(
                _ints(g) for g in dev["core_groups"]) and _number(dev.get("core_memory"))):
        return "field 'device' needs num_cores, visible_cores, core_groups and core_memory"
    for core, c in d["cores"].items():
        if not (core.isdigit() and len(core) < 10 and isinstance(c, dict)
                and _number(c.get("used_bytes")) and _number(c.get("busy_seconds"))):
            return f"core {core[:20]!r} needs a numeric used_bytes and busy_seconds"
        if not isinstance(c.get("failed", ""), str):
            return f"core {core[:20]!r}: 'failed' must be a message string"
    for m in d["models"]:
        if not (isinstance(m, dict) and _number(m.get("id"), True)
                and isinstance(m.get("name"), str) and isinstance(m.get("core_groups"), list)
                and all(_ints(g) for g in m["core_groups"]) and _ints(m.get("bytes_per_core"))
                and m["bytes_per_core"] and _number(m.get("calls"), True)
                and _number(m.get("inferences"), True)):
            return "an entry of 'models' lacks id, name, core_groups, bytes_per_core, calls " \
                   "or inferences of the right types"
    return None


def read_all(directory: Path | None = None, skipped: list[str] | None = None) -> list[dict]:
    """Every live process's latest counters; files of dead processes are removed.
    Files that are not counters are left alone and described in `skipped`. Raises
    UntrustedRunDir if the directory could have been written by another user."""
    directory = directory or run_dir()
    if not os.path.lexists(directory):
        return []
    _trusted(directory)
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = read_json(path, MAX_RECORD_BYTES, "counters file", follow_symlinks=False,
                             max_depth=8)
        except FileNotFoundError:
            continue  # its process exited meanwhile
        except OSError as e:
            if skipped is not None:
                skipped.append(f"{path}: {e.strerror}")
            continue
        if (why := check_record(data)) is not None:
            if skipped is not None:
                skipped.append(f"{path}: {why}")
            continue
        if not _alive(data["pid"]):
            path.unlink(missing_ok=True)
            continue
        out.append(data)
    return out
