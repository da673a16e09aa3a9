"""The profiler: what each call did on the device, as a Chrome trace / Perfetto JSON.

Off unless `NEURONISH_PROFILE=DIR` is set (any process: scripts, TensorFlow with
NeuronOps, the model server) or `start()` is called (`neuronish profile`).
When off, every hook is one global test.

Recorded, all as trace-event "complete" spans (ph "X", microseconds):

    tf             the NeuronOp kernel's call into the device (TensorFlow's side)
    call           one Model.run: batch, chunks of the compiled batch
    queue          a chunk waiting for an idle copy of the program and a host slot
    execute        a chunk executing on a core group (track per core group)
    instruction    each step of the program on that track, measured host time; a
                   native-engine run of several instructions is one span listing them
    modelled       the same chunk's instructions in *modelled device time*
                   (stats.device_model, docs/device-model.md) on a track of its own

The trace is written to DIR/neuronish-<pid>.json at exit (or by `stop()`);
`top_instructions` gives the per-instruction table `neuronish profile` prints.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ENV_VAR = "NEURONISH_PROFILE"
_MAX_EVENTS = 2_000_000  # ~ a few hundred MB of JSON; beyond it, recording stops

_active = False
# Raw spans (name, cat, tid, start, end, args) and, per chunk, (exe, model, start, tid)
# for its modelled track: turned into trace events only by stop(), off the hot path.
_events: list[tuple] = []
_modelled_chunks: list[tuple] = []
_lock = threading.Lock()
_t0 = time.perf_counter()
_track_ids: dict[str, int] = {}
_dropped = 0


def active() -> bool:
    return _active


def start() -> None:
    global _active, _dropped
    with _lock:
        _events.clear()
        _modelled_chunks.clear()
        _track_ids.clear()
        _dropped = 0
        _active = True


def stop(path: str | os.PathLike | None = None) -> dict:
    """Stop recording; return the trace recorded since `start()` (and write it to `path`,
    atomically, if given)."""
    global _active
    with _lock:
        _active = False
        for chunk_args in _modelled_chunks:
            _expand_modelled(*chunk_args)
        pid = os.getpid()
        spans = [{"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": _us(start),
                  "dur": max(round((end - start) * 1e6, 3), 0.0), "args": args}
                 for name, cat, tid, start, end, args in _spans(_events)]
        trace = {"traceEvents": _metadata() + spans, "displayTimeUnit": "ms",
                 "otherData": {"producer": "neuronish", "dropped_events": _dropped}}
        _events.clear()  # handed over: the next start() begins afresh
        _modelled_chunks.clear()
        _track_ids.clear()
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(trace, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return trace


def _metadata() -> list[dict]:
    pid = os.getpid()
    out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": f"neuronish (pid {pid})"}}]
    for name, tid in _track_ids.items():
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"name": name}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"sort_index": tid}})
    return out


def _track(name: str) -> int:
    tid = _track_ids.get(name)
    if tid is None:
        tid = _track_ids[name] = len(_track_ids) + 1
    return tid


def _us(t: float) -> float:
    return round((t - _t0) * 1e6, 3)


def record(name: str, cat: str, track: str, start: float, end: float, **args: object) -> None:
    """One complete span; `start`/`end` from time.perf_counter()."""
    global _dropped
    with _lock:
        if not _active:
            return
        if len(_events) >= _MAX_EVENTS:
            _dropped += 1
            return
        _events.append((name, cat, _track(track), start, end, args))


def _thread_track(prefix: str) -> str:
    return f"{prefix} ({threading.current_thread().name})"


@contextlib.contextmanager
def span(name: str, cat: str, track: str | None = None, **args: object) -> Iterator[None]:
    """Time the block as one span (on the calling thread's track unless `track`)."""
    if not _active:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        record(name, cat, track or _thread_track("host"), start, time.perf_counter(), **args)


# -- hooks (runtime/model.py, runtime/program.py) ----------------------------------

_local = threading.local()


def _name(model: object) -> str:
    """The model's `label` (a NeuronOp's node name), else its output tensor names."""
    return getattr(model, "label", None) or \
        ", ".join(s.name for s in model.exe.outputs)[:60]  # type: ignore[attr-defined]


def traced_call(fn: Callable) -> Callable:
    """Decorates Model.run_list: one `call` span per call."""
    @functools.wraps(fn)
    def wrapper(model: object, *args: object, **kwargs: object) -> object:
        if not _active:
            return fn(model, *args, **kwargs)
        with span("call", "call", model=_name(model)):
            return fn(model, *args, **kwargs)
    return wrapper


@contextlib.contextmanager
def chunk(model: object, queued_since: float) -> Iterator[None]:
    """Around one chunk's execution, once it holds a program copy and a host slot."""
    if not _active:
        yield
        return
    from .telemetry import current_group

    name, group = _name(model), current_group()
    # A track per core group and model (chunks of one model on one group never overlap);
    # per thread when telemetry is off and the group is not known.
    where = f"cores {list(group)}" if group else threading.current_thread().name
    start = time.perf_counter()
    track = f"device {where}: {name}"
    record("queue", "queue", _thread_track("host"), queued_since, start, model=name)
    with _lock:
        # Steps are timed only while there is room for them (see _MAX_EVENTS).
        _local.tid = _track(track) if len(_events) < _MAX_EVENTS else None
    try:
        yield
    finally:
        _local.tid = None
        record("execute", "execute", track, start, time.perf_counter(), model=name,
               batch=model.batch_size)  # type: ignore[attr-defined]
        _modelled(model.exe, name, start,  # type: ignore[attr-defined]
                  f"device {where}: {name} (modelled time)")


def _modelled(exe: object, name: str, start: float, track: str) -> None:
    """Note the chunk; stop() lays its instructions end to end in modelled device time."""
    if not getattr(exe, "stats", {}).get("device_model"):
        return
    with _lock:
        if _active:
            _modelled_chunks.append((exe, name, start, _track(track)))


def _expand_modelled(exe: object, name: str, start: float, tid: int) -> None:
    global _dropped
    t = start
    seconds_per_core = exe.stats["device_model"]["instruction_seconds"]  # type: ignore[attr-defined]
    for core, (program, seconds) in enumerate(zip(exe.programs, seconds_per_core)):  # type: ignore[attr-defined]
        for ins, s in zip(program, seconds):
            if len(_events) >= _MAX_EVENTS:
                _dropped += 1
                continue
            _events.append((ins.kind, "modelled", tid, t, t + s,
                            {"core": core, "tf": list(ins.source), "model": name}))
            t += s


def step_done(step: object, instructions: list, start: float, end: float) -> None:
    """Record one numpy step timed by its caller."""
    tid = getattr(_local, "tid", None)
    if _active and tid is not None:
        _events.append((_STEP, step, instructions, tid, start, end))


_NATIVE = object()  # marks a native run with the engine's per-instruction times


def native_run_done(indices: tuple[int, ...], instructions: list, times: object) -> None:
    """Record a native run: `times` ([n, 2] start/end per instruction, perf_counter
    seconds, measured by the engine) is expanded into one span each at stop(), so the hot
    path is one append per run, whatever its length."""
    tid = getattr(_local, "tid", None)
    if _active and tid is not None:
        _events.append((_NATIVE, indices, instructions, tid, times))


def _spans(events: list) -> Iterator[tuple]:
    for entry in events:
        if entry[0] is _NATIVE:
            _, indices, instructions, tid, times = entry
            for i, (start, end) in zip(indices, times.tolist()):
                ins = instructions[i]
                yield (ins.kind, "instruction", tid, start, end,
                       {"tf": list(ins.source), "engine": "native",
                        "parts": [list(ins.source)]})
        else:
            yield _step_span(entry)


_STEP = object()  # marks a numpy step's entry in _events, expanded by _step_span at stop()


def _step_span(entry: tuple) -> tuple:
    """A raw entry as (name, cat, tid, start, end, args)."""
    if entry[0] is not _STEP:
        return entry
    _, step, _instructions, tid, start, end = entry  # one numpy-engine instruction
    return (step.kind, "instruction", tid, start, end,
            {"tf": list(step.source), "engine": "numpy", "parts": [list(step.source)]})


def top_instructions(trace: dict, n: int = 10) -> list[dict]:
    """Instruction spans grouped by (name, TF nodes): total and mean measured host time,
    with the modelled device time of the same instructions when recorded."""
    measured: dict[tuple[str, tuple[str, ...]], list[float]] = {}
    parts_of: dict[tuple[str, tuple[str, ...]], list[list[str]]] = {}
    modelled: dict[tuple[str, ...], list[float]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        nodes = tuple(args.get("tf", ()))
        if e["cat"] == "instruction":
            measured.setdefault((e["name"], nodes), []).append(e["dur"])
            parts_of[(e["name"], nodes)] = args.get("parts", [list(nodes)])
        elif e["cat"] == "modelled":
            modelled.setdefault(nodes, []).append(e["dur"])
    rows = []
    for key, durs in measured.items():
        # A native run spans several instructions: its modelled time is theirs summed.
        means = [modelled.get(tuple(p)) for p in parts_of[key]]
        model_us = sum(sum(m) / len(m) for m in means if m) if all(means) else None
        rows.append({"instruction": key[0], "tf_nodes": list(key[1]), "calls": len(durs),
                     "total_ms": sum(durs) / 1e3, "mean_us": sum(durs) / len(durs),
                     "modelled_us": model_us})
    rows.sort(key=lambda r: -r["total_ms"])
    return rows[:n]


def _forget_in_child() -> None:
    """A forked child records its own spans only (with a lock no parent thread holds)."""
    global _lock
    _lock = threading.Lock()
    _events.clear()
    _modelled_chunks.clear()
    _track_ids.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _from_env() -> None:
    directory = os.environ.get(ENV_VAR)
    if not directory:
        return
    start()

    def write_at_exit() -> None:
        if _events or _modelled_chunks:  # tools that never used the device write nothing
            stop(Path(directory) / f"neuronish-{os.getpid()}.json")

    atexit.register(write_at_exit)


_from_env()
