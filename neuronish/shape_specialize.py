"""Executables specialised per shape, for a `NeuronOp` whose dimensions are free.

A NeuronOp whose `dynamic_shapes` attr is set (JSON, written by
`neuronish.saved_model.compile` for a signature with free dimensions) holds the
executable compiled at its probe shape, and `graph_def`, its subgraph with the free
dimensions (and the batch) left unknown. `ShapeTable` answers each call:

- a shape is compiled at a batch: the op's compiled batch for calls of that batch,
  else the call's batch rounded up to a power of two (`batch_for`), so a call is one
  device program (the runtime pads the rest of the batch exactly, as for any op);
- a shape loaded at that batch runs on its executable;
- a shape compiled ahead (`shape_buckets`) has its executable stored in the
  SavedModel's assets and listed in the attr (`StoredShape`): its first call loads it
  from there (and waits for that, fallback or not: a load, not a compile), so no
  compiler runs for it, in this process or any other;
- a new shape within the op's bounds is queued for the op's compile thread (one
  compile at a time per op; a shape queued or compiling is never queued again):
  `neuronish-cc` runs as a subprocess on `graph_def` with an io-config at that shape
  and batch (the compiler folds the subgraph's shape computations for it), through
  the compile cache, so a restarted server or another process finds it there.
  Meanwhile the call runs on the same shape loaded at another batch if there is one
  (split or padded); else, with the runtime fallback on (NEURONISH_FALLBACK), on
  TensorFlow, counted as a fallback call; else it waits for the compile until its
  deadline or cancellation (then DeadlineExceeded/Cancelled naming the op and the
  shape; the compile goes on). A shape whose compile (or load) failed is remembered:
  its calls fail (or fall back) without compiling it again. Calls that do not wait
  queue at most `NEURONISH_MAX_SHAPES` shapes; past that they run on TensorFlow and a
  later call queues its shape;
- a shape outside the bounds is refused naming the input, the dimension and the
  bounds, or, with the runtime fallback on, runs the subgraph on TensorFlow, counted
  as a fallback call.

At most `NEURONISH_MAX_SHAPES` (default 8) executables stay loaded per op; the least
recently used one not running is unloaded first. Each is labelled `op@shape`, which
`neuronish ls` shows with its device memory. `wait_for_compiles` waits until no
op has a shape queued or compiling.

No TensorFlow here (the fallback imports it only when it runs).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from neuronish import contracts
from neuronish.external import PREFIX
from neuronish.runtime import Cancelled, DeadlineExceeded, DeviceError, InvalidInput, Model
from neuronish.runtime.cutoff import Cutoff
from neuronish.runtime.executable import Executable, from_bytes

ENV_MAX_SHAPES = "NEURONISH_MAX_SHAPES"
# In a compiled SavedModel: {signature: {input: {axis: [low, high]}}}, the bounds of
# its free dimensions, which the model server shows (serving/signatures.py)
SHAPES_FILE = os.path.join("assets.extra", "neuronish_shapes.json")
DEFAULT_MAX_SHAPES = 8
MAX_RUNTIME_BATCH = 64  # a larger call is split into chunks of this batch (`batch_for`)
# A run-time compile still running after this is killed and its shape failed: a hung
# compiler must not hold the op's compile thread (and every later shape) for ever.
COMPILE_TIMEOUT_S = 600.0


class ShapeCompileError(DeviceError):
    """The compiler could not compile the op's subgraph at a call's shape."""


@dataclass(frozen=True)
class StoredShape:
    """An executable compiled ahead (`shape_buckets`) and stored in the SavedModel's
    assets: the op's input shapes it was compiled at (the op's compiled batch), and the
    external reference (neuronish/external.py) naming its file."""

    shapes: list[list[int]]
    executable: str


@dataclass(frozen=True)
class DynamicSpec:
    """The `dynamic_shapes` attr: per op input, its free axes with (low, high, why);
    how errors name each input; the compiler flags the op was compiled with; the
    executables stored for the shapes compiled ahead."""

    bounds: list[dict[int, tuple[int, int, str]]]
    labels: list[str]
    compiler_args: list[str]
    stored: list[StoredShape] = field(default_factory=list)

    def to_json(self) -> str:
        raw: dict = {"version": 1, "compiler_args": self.compiler_args,
                     "inputs": [{"label": label, "free": {str(a): list(b) for a, b in
                                                          bounds.items()}}
                                for label, bounds in zip(self.labels, self.bounds)]}
        if self.stored:  # (absent otherwise: an attr written before it parses the same)
            raw["stored"] = [{"shapes": s.shapes, "executable": s.executable}
                             for s in self.stored]
        return json.dumps(raw, sort_keys=True)

    @staticmethod
    def parse(text: str, node_name: str, n_inputs: int) -> DynamicSpec:
        try:
            raw = json.loads(text)
            if raw.get("version") != 1 or len(raw["inputs"]) != n_inputs:
                raise ValueError(f"version {raw.get('version')} (1 expected), "
                                 f"{len(raw['inputs'])} input(s) for an op with {n_inputs}")
            bounds = [{int(a): (int(b[0]), int(b[1]), str(b[2])) for a, b in i["free"].items()}
                      for i in raw["inputs"]]
            stored = [StoredShape(_shapes(s["shapes"], n_inputs), _reference(s["executable"]))
                      for s in raw.get("stored", [])]
            return DynamicSpec(bounds, [str(i["label"]) for i in raw["inputs"]],
                               [str(a) for a in raw["compiler_args"]], stored)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise InvalidInput(f"NeuronOp '{node_name}': its dynamic_shapes attr is not what "
                               f"neuronish writes ({e}); recompile the model") from None


def _shapes(raw: object, n_inputs: int) -> list[list[int]]:
    if not isinstance(raw, list) or len(raw) != n_inputs or not all(
            isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)
            for shape in raw):
        raise ValueError(f"a stored shape must list {n_inputs} shape(s) of sizes >= 0, "
                         f"got {str(raw)[:100]}")
    return raw


def _reference(raw: object) -> str:
    if not isinstance(raw, str) or not raw.startswith(PREFIX.decode()):
        raise ValueError(f"a stored executable must be an external reference "
                         f"({PREFIX.decode()}...), got {str(raw)[:100]}")
    return raw


def max_shapes() -> int:
    try:
        return max(1, int(os.environ.get(ENV_MAX_SHAPES, DEFAULT_MAX_SHAPES)))
    except ValueError:
        return DEFAULT_MAX_SHAPES


def batch_for(calls: int, compiled: int) -> int:
    """The batch a shape is compiled at for a call of `calls` rows: the op's compiled
    batch for a call of that batch (so the probe's executable and the shapes compiled
    ahead serve it), else the next power of two, at most MAX_RUNTIME_BATCH. Powers of
    two bound the executables per shape (a server batching up to 32 needs six, not 32)
    and pad a call by less than its own size; the pad rows are exact (the runtime
    repeats the last row, and the compiler proved the subgraph keeps samples apart)."""
    if calls == compiled:
        return compiled
    return min(MAX_RUNTIME_BATCH, 1 << max(0, calls - 1).bit_length())


class _Entry:
    def __init__(self, model: Model, exe: Executable):
        self.model, self.exe, self.running, self.calls = model, exe, 0, 0
        self.reload_failed = False  # load_again found no working core (not tried again)


_tables: weakref.WeakSet[ShapeTable] = weakref.WeakSet()


def live_tables() -> list[ShapeTable]:
    """Every op with free dimensions loaded in this process (for counters and tests)."""
    return list(_tables)


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait until no op has a shape queued or compiling (a server's warm-up, or a test,
    then knows later calls at the shapes seen run on the device); False if `timeout`
    passed first."""
    end = None if timeout is None else time.monotonic() + timeout
    for table in live_tables():
        if not table.wait_idle(None if end is None else max(0.0, end - time.monotonic())):
            return False
    return True


class ShapeTable:
    """One op's executables by shape (module doc)."""

    def __init__(self, node_name: str, spec: DynamicSpec, exe: Executable, model: Model,
                 graph_def: Callable[[], bytes], load: Callable[[Executable], Model],
                 read_stored: Callable[[str], Executable] | None = None):
        """`read_stored` reads (and checks) the executable a StoredShape's reference
        names."""
        self.node_name, self.spec = node_name, spec
        self.first = exe
        self._graph_def, self._load, self._read_stored = graph_def, load, read_stored
        self._graph: bytes | None = None
        batches = {s.shape[s.batch_axis] for s in exe.inputs if s.batch_axis >= 0}
        # (an op without batch axes compiles and runs every shape at its fixed sizes)
        self.compiled_batch: int | None = batches.pop() if len(batches) == 1 else None
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._pending: dict[tuple, threading.Event] = {}  # queued or compiling
        self._queue: deque[tuple] = deque()
        self._failed: dict[tuple, BaseException] = {}  # not compiled again
        # Models load_again replaced: kept loaded (calls may be inside one) until unload_all.
        self._retired: list[Model] = []
        self._reloading = threading.Lock()  # one load_again at a time, outside _lock
        self._worker: threading.Thread | None = None
        self._idle = threading.Condition(threading.Lock())
        self._lock = threading.Lock()
        self._closed = False
        # Shapes compiled (or taken from the compile cache) at run time, in order.
        self.compiled: list[str] = []
        # Executables stored in the SavedModel (compiled ahead), by key; loaded by the
        # first call at their shape (a load is short: callers wait for it, fallback or
        # not), again after an eviction; being loaded, with the event set when done.
        self._stored = {self._key(s.shapes, self.compiled_batch): s for s in spec.stored}
        self._loading: dict[tuple, threading.Event] = {}
        self.loaded_stored: list[str] = []  # their labels, in the order they were loaded
        key = self._key([s.shape for s in exe.inputs], self.compiled_batch)
        model.label = self.label(key)
        self._entries[key] = _Entry(model, exe)
        _tables.add(self)

    def _key(self, shapes: Sequence[Sequence[int]], batch: int | None) -> tuple:
        """(the batch compiled at, or -1 without batch axes; the shapes with the batch
        axis left out as -1)."""
        return (-1 if batch is None else batch,
                tuple(tuple(-1 if d == s.batch_axis else int(n) for d, n in enumerate(shape))
                      for s, shape in zip(self.first.inputs, shapes)))

    def key(self, shapes: Sequence[Sequence[int]]) -> tuple:
        """The executable a call at `shapes` is best served by: its shape, compiled at
        `batch_for` the call's batch."""
        calls = next((shape[s.batch_axis] for s, shape in zip(self.first.inputs, shapes)
                      if s.batch_axis >= 0), None)
        batch = None if calls is None or self.compiled_batch is None else \
            batch_for(int(calls), self.compiled_batch)
        return self._key(shapes, batch)

    def label(self, key: tuple) -> str:
        """`neuron_op_0@4x128;4x128`: the op's own name (its scope left out, so that
        `neuronish ls`, which shows 40 characters, shows the shape) and the shape it is
        compiled at."""
        batch, shapes = key
        return f"{self.node_name.rsplit('/', 1)[-1]}@" + ";".join(
            "x".join(str(batch) if n < 0 else str(n) for n in shape) for shape in shapes)

    def shapes_loaded(self) -> list[tuple]:
        with self._lock:
            return list(self._entries)

    def calls(self) -> dict[str, int]:
        """Per executable loaded (by label): the calls it has run since it was loaded."""
        with self._lock:
            return {self.label(k): e.calls for k, e in self._entries.items()}

    def compiling(self) -> list[str]:
        """The shapes queued or compiling (labels)."""
        with self._lock:
            return [self.label(k) for k in self._pending]

    def unload_all(self) -> None:
        """Free every shape's device memory (the op is going away); a compile under way
        finishes, and its executable is not loaded."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            entries, self._entries = list(self._entries.values()), OrderedDict()
            retired, self._retired = self._retired, []
        for model in [e.model for e in entries] + retired:
            model.unload()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no shape is queued or compiling; False if `timeout` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    # -- what the bridge calls (kernel_bridge.output_shapes / run) --------------------

    def out_of_bounds(self, shapes: Sequence[Sequence[int]]) -> str | None:
        """Why a call at `shapes` is outside the op's bounds; None if it is within."""
        for i, (bounds, shape) in enumerate(zip(self.spec.bounds, shapes)):
            for axis, (low, high, why) in bounds.items():
                size = shape[axis]
                if not low <= size <= high:
                    return (f"NeuronOp '{self.node_name}': {self.spec.labels[i]} has size "
                            f"{size} in dimension {axis}; the model accepts {low} to {high} "
                            f"there (bound from {why}). Recompile with "
                            f"shape_bounds={{KEY: {{AXIS: (LOW, HIGH)}}}} (neuronish compile "
                            "--shape-bounds KEY:AXIS=LOW:HIGH) to serve other sizes")
        return None

    def entry(self, shapes: Sequence[Sequence[int]], wait: bool = True,
              cutoff: Cutoff | None = None) -> _Entry | None:
        """The executable to run a call at `shapes` on, marked running until `done`.

        Its own (the shape at `batch_for` the call's batch) if loaded; else, while that
        one compiles in the background, the same shape at another batch if loaded (the
        runtime splits or pads the call, exactly); else, with `wait`, the compile is
        waited for until `cutoff` (DeadlineExceeded or Cancelled naming the op and the
        shape; the compile goes on for later calls), and without it None: the caller
        computes this call elsewhere (TensorFlow). A shape stored in the SavedModel is
        loaded from there first, by this call (others at that shape wait for it), with or
        without `wait`. A shape whose compile (or load) failed raises that error
        (ShapeCompileError, OutOfDeviceMemory, ...), every time, without compiling it
        again."""
        want = self.key(shapes)
        while True:
            loading = None
            with self._lock:
                if self._closed:
                    raise DeviceError(f"NeuronOp '{self.node_name}' was unloaded")
                entry = self._entries.get(want)
                stored = self._stored_for(want) if entry is None else None
                if stored is not None:
                    loading = self._loading.get(stored)
                    mine = loading is None
                    if mine:
                        self._loading[stored] = loading = threading.Event()
                elif entry is None:
                    # A caller that does not wait queues no more than max_shapes()
                    # compiles (a later call queues its shape when there is room): a
                    # burst of new shapes cannot line up more than the op can hold.
                    if want not in self._failed and (wait or want in self._pending or
                                                     len(self._queue) < max_shapes()):
                        pending = self._request(want)
                    entry = self._other_batch(want)
                if entry is not None:
                    self._entries.move_to_end(self._key_of(entry))
                    entry.running += 1
                    entry.calls += 1
                    return entry
                failed = self._failed.get(want)
                if loading is None and failed is not None:
                    raise type(failed)(*failed.args)
            if loading is not None:
                if mine:
                    self._load_stored(stored, loading)
                else:
                    self._wait(loading, stored, cutoff, "load")
                continue
            if not wait:
                return None
            self._wait(pending, want, cutoff, "compile")

    @staticmethod
    def output_shapes(entry: _Entry, shapes: Sequence[Sequence[int]]) -> list[list[int]]:
        batch = next((shape[s.batch_axis] for s, shape in zip(entry.exe.inputs, shapes)
                      if s.batch_axis >= 0), None)
        return [[batch if d == s.batch_axis and batch is not None else n
                 for d, n in enumerate(s.shape)] for s in entry.exe.outputs]

    def load_again(self, entry: _Entry, lost: Model) -> Model | None:
        """Failed cores took every copy of `lost`, `entry`'s model: its executable is loaded
        anew onto the cores that still work (the device's loads avoid failed ones) and is
        the entry's model from now on. The entry's model now (another caller's reload, or
        this one), or None if none of the working cores can take it."""
        log = logging.getLogger("neuronish.kernel_bridge")
        # (the device load outside _lock: other shapes' calls and compiles go on; the
        # caller's `running` keeps the entry from eviction)
        with self._reloading:
            if entry.model is not lost:
                return entry.model
            if self._closed or entry.reload_failed:
                return None
            try:
                again = self._load(entry.exe)
            except (DeviceError, MemoryError) as e:
                entry.reload_failed = True  # (cores do not come back: not tried every call)
                log.warning("NeuronOp '%s': failed cores took every copy of the executable "
                            "of a shape, and loading it again failed: %s; its calls run on "
                            "TensorFlow (with NEURONISH_FALLBACK=0 they fail)",
                            self.node_name, e)
                return None
            again.label = lost.label
            with self._lock:
                self._retired.append(lost)
                entry.model = again
        log.warning("NeuronOp '%s': failed cores took every copy of the executable of a "
                    "shape; loaded it again on core group(s) %s", self.node_name,
                    again.core_groups)
        return again

    def done(self, entry: _Entry) -> None:
        with self._lock:
            entry.running -= 1
        self._evict()

    # -- inside ---------------------------------------------------------------------

    def _key_of(self, entry: _Entry) -> tuple:
        return next(k for k, e in self._entries.items() if e is entry)

    def _stored_for(self, want: tuple) -> tuple | None:
        """The key of the stored executable of `want`'s shape (at the op's compiled
        batch) if it is to be loaded: not loaded, and not failed (under the lock)."""
        key = (-1 if self.compiled_batch is None else self.compiled_batch, want[1])
        if key in self._stored and key not in self._entries and key not in self._failed:
            return key
        return None

    def _load_stored(self, key: tuple, loading: threading.Event) -> None:
        """Load the stored executable of `key` from the SavedModel (its file checked)."""
        try:
            stored = self._stored[key]
            if self._read_stored is None:
                raise ShapeCompileError(f"NeuronOp '{self.node_name}': this host cannot "
                                        "read executables stored in the SavedModel")
            exe = self._read_stored(stored.executable)
            got = [list(s.shape) for s in exe.inputs]
            if got != stored.shapes:
                raise ShapeCompileError(f"NeuronOp '{self.node_name}': it is compiled at "
                                        f"{got}, not {stored.shapes} as its dynamic_shapes "
                                        "attr lists; recompile the model")
            self._install(key, exe, self.loaded_stored)
        except DeviceError as e:  # (its kind kept: it says what failed)
            why = str(e).removeprefix(f"NeuronOp '{self.node_name}': ")
            self._remember(key, type(e)(f"NeuronOp '{self.node_name}': loading its stored "
                                        f"shape {self.label(key)} failed: {why}"))
        except Exception as e:  # noqa: BLE001 - its callers get it, every time
            self._fail(key, e, "loading its stored")
        finally:
            with self._lock:
                self._loading.pop(key, None)
            loading.set()
        self._evict()

    def _install(self, key: tuple, exe: Executable, made: list[str]) -> None:
        """Load `exe` as `key`'s executable (unloaded again if the op was meanwhile)."""
        model = self._load(exe)
        model.label = self.label(key)
        with self._lock:
            closed = self._closed
            if not closed:
                self._entries[key] = _Entry(model, exe)
                made.append(self.label(key))
        if closed:
            model.unload()

    def _fail(self, key: tuple, e: BaseException, doing: str) -> None:
        """`_remember` `e`, a device's error as it is, any other as a ShapeCompileError
        saying what was being done."""
        if not isinstance(e, DeviceError | MemoryError):
            e = ShapeCompileError(f"NeuronOp '{self.node_name}': {doing} shape "
                                  f"{self.label(key)} failed: {type(e).__name__}: {e}")
        self._remember(key, e)

    def _remember(self, key: tuple, e: BaseException) -> None:
        """Why `key` has no executable: its callers get it, every time."""
        with self._lock:
            self._failed[key] = e

    def _other_batch(self, want: tuple) -> _Entry | None:
        """A loaded executable of `want`'s shape at another batch (under the lock): the
        smallest batch at least `want`'s (one program), else the largest."""
        batches = sorted(k[0] for k in self._entries if k[1] == want[1])
        if not batches:
            return None
        batch = next((b for b in batches if b >= want[0]), batches[-1])
        return self._entries[(batch, want[1])]

    def _request(self, key: tuple) -> threading.Event:
        """Queue `key` for the op's compile thread unless it is queued or compiling
        (under the lock); its event is set once it is loaded or has failed."""
        pending = self._pending.get(key)
        if pending is None:
            with self._idle:
                self._pending[key] = pending = threading.Event()
            self._queue.append(key)
            if self._worker is None:
                self._worker = threading.Thread(target=self._compile_queued, daemon=True,
                                                name=f"neuronish-shapes:{self.node_name}")
                self._worker.start()
        return pending

    def _wait(self, pending: threading.Event, key: tuple, cutoff: Cutoff | None,
              what: str) -> None:
        """Wait for `key`'s compile (or load: `what`), honouring the call's deadline and
        cancel flag."""
        while not pending.wait(None if cutoff is None else cutoff.wait_slice()):
            assert cutoff is not None
            if cutoff.flag is not None and cutoff.flag[0]:
                raise Cancelled(f"NeuronOp '{self.node_name}': the call was cancelled by its "
                                f"caller while it waited for its new shape {self.label(key)} "
                                f"to {what}; the {what} goes on for later calls")
            if cutoff.deadline is not None and time.monotonic() >= cutoff.deadline:
                raise DeadlineExceeded(f"NeuronOp '{self.node_name}': the call's deadline "
                                       f"passed while it waited for its new shape "
                                       f"{self.label(key)} to {what}; the {what} goes on "
                                       "for later calls")

    def _compile_queued(self) -> None:
        """The op's compile thread: one shape at a time, until the queue is empty."""
        while True:
            with self._lock:
                if not self._queue or self._closed:
                    self._worker = None
                    left, self._queue = list(self._queue), deque()
                    break
                key = self._queue.popleft()
            self._compile_one(key)
        for key in left:  # (the op was unloaded)
            self._finished(key)

    def _compile_one(self, key: tuple) -> None:
        try:
            self._install(key, self._compile(key), self.compiled)
        except Exception as e:  # noqa: BLE001 - its callers get it, every time
            self._fail(key, e, "loading its new")
        finally:
            self._finished(key)
        self._evict()

    def _finished(self, key: tuple) -> None:
        with self._lock, self._idle:
            pending = self._pending.pop(key, None)
            self._idle.notify_all()
        if pending is not None:
            pending.set()

    def _evict(self) -> None:
        limit = max_shapes()
        gone = []
        with self._lock:
            for key in list(self._entries):
                if len(self._entries) - len(gone) <= limit:
                    break
                if self._entries[key].running == 0:
                    gone.append(self._entries.pop(key))
        for entry in gone:
            entry.model.unload()

    def _compile(self, key: tuple) -> Executable:
        """The subgraph compiled at `key` (its batch and shape), through the compile
        cache."""
        from neuronish.compile_cache import CacheStats, CompileCache, compile_with_cache
        from neuronish.compile_driver import CompileJob

        if self._graph is None:
            self._graph = bytes(self._graph_def())
        batch, shapes = key
        io_config = contracts.io_config(
            ((s.name, [(batch if batch > 0 else s.shape[d]) if n < 0 else n
                       for d, n in enumerate(k)], s.dtype, s.batch_axis)
             for s, k in zip(self.first.inputs, shapes)),
            {s.name: s.batch_axis for s in self.first.outputs})
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.node_name)
        (result,) = compile_with_cache([CompileJob(name, self._graph, io_config,
                                                   tuple(self.spec.compiler_args))],
                                       CompileCache.from_env(), CacheStats(),
                                       max_num_compilers=1, timeout=COMPILE_TIMEOUT_S)
        if not result.ok:
            raise ShapeCompileError(f"NeuronOp '{self.node_name}': compiling it for the new "
                                    f"shape {self.label(key)} failed: {result.error}")
        return from_bytes(bytes(result.executable))  # type: ignore[arg-type]
