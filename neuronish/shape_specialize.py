"""Executables specialised per shape, for a `NeuronOp` whose dimensions are free.

A NeuronOp whose `dynamic_shapes` attr is set (JSON, written by
`neuronish.saved_model.compile` for a signature with free dimensions) holds the
executable compiled at its probe shape, and `graph_def`, its subgraph with the free
dimensions (and the batch) left unknown. `ShapeTable` answers each call:

- a shape seen before runs on its executable;
- a new shape within the op's bounds gets one: `neuronish-cc` runs as a subprocess
  on `graph_def` with an io-config at that shape (the compiler folds the subgraph's
  shape computations for it), through the compile cache, so a restarted server or
  another process finds it there. The call waits for it (synchronous: measured in
  docs/saved-model-compile.md);
- a shape outside the bounds is refused naming the input, the dimension and the
  bounds, or, with the runtime fallback on (NEURONISH_FALLBACK), runs the subgraph on
  TensorFlow, counted as a fallback call.

At most `NEURONISH_MAX_SHAPES` (default 8) executables stay loaded per op; the least
recently used one not running is unloaded first. Each is labelled `op@shape`, which
`neuronish ls` shows with its device memory.

No TensorFlow here (the fallback imports it only when it runs).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from neuronish.runtime import DeviceError, InvalidInput, Model
from neuronish.runtime.executable import Executable, from_bytes

ENV_MAX_SHAPES = "NEURONISH_MAX_SHAPES"
# In a compiled SavedModel: {signature: {input: {axis: [low, high]}}}, the bounds of
# its free dimensions, which the model server shows (serving/signatures.py)
SHAPES_FILE = os.path.join("assets.extra", "neuronish_shapes.json")
DEFAULT_MAX_SHAPES = 8


class ShapeCompileError(DeviceError):
    """The compiler could not compile the op's subgraph at a call's shape."""


@dataclass(frozen=True)
class DynamicSpec:
    """The `dynamic_shapes` attr: per op input, its free axes with (low, high, why);
    how errors name each input; the compiler flags the op was compiled with."""

    bounds: list[dict[int, tuple[int, int, str]]]
    labels: list[str]
    compiler_args: list[str]

    def to_json(self) -> str:
        return json.dumps({"version": 1, "compiler_args": self.compiler_args,
                           "inputs": [{"label": label, "free": {str(a): list(b) for a, b in
                                                                bounds.items()}}
                                      for label, bounds in zip(self.labels, self.bounds)]},
                          sort_keys=True)

    @staticmethod
    def parse(text: str, node_name: str, n_inputs: int) -> DynamicSpec:
        try:
            raw = json.loads(text)
            if raw.get("version") != 1 or len(raw["inputs"]) != n_inputs:
                raise ValueError(f"version {raw.get('version')} (1 expected), "
                                 f"{len(raw['inputs'])} input(s) for an op with {n_inputs}")
            bounds = [{int(a): (int(b[0]), int(b[1]), str(b[2])) for a, b in i["free"].items()}
                      for i in raw["inputs"]]
            return DynamicSpec(bounds, [str(i["label"]) for i in raw["inputs"]],
                               [str(a) for a in raw["compiler_args"]])
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise InvalidInput(f"NeuronOp '{node_name}': its dynamic_shapes attr is not what "
                               f"neuronish writes ({e}); recompile the model") from None


def max_shapes() -> int:
    try:
        return max(1, int(os.environ.get(ENV_MAX_SHAPES, DEFAULT_MAX_SHAPES)))
    except ValueError:
        return DEFAULT_MAX_SHAPES


class _Entry:
    def __init__(self, model: Model, exe: Executable):
        self.model, self.exe, self.running = model, exe, 0


class ShapeTable:
    """One op's executables by shape (module doc)."""

    def __init__(self, node_name: str, spec: DynamicSpec, exe: Executable, model: Model,
                 graph_def: Callable[[], bytes], load: Callable[[Executable], Model]):
        self.node_name, self.spec = node_name, spec
        self.first = exe
        self._graph_def, self._load = graph_def, load
        self._graph: bytes | None = None
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._compiling: dict[tuple, threading.Event] = {}
        self._lock = threading.Lock()
        model.label = self._label(self.key([s.shape for s in exe.inputs]))
        self._entries[self.key([s.shape for s in exe.inputs])] = _Entry(model, exe)

    def key(self, shapes: Sequence[Sequence[int]]) -> tuple:
        """A call's shapes with the batch left out (the runtime splits the batch)."""
        return tuple(tuple(-1 if d == s.batch_axis else int(n) for d, n in enumerate(shape))
                     for s, shape in zip(self.first.inputs, shapes))

    def _label(self, key: tuple) -> str:
        """`neuron_op_0@*x128;*x128`: the op's own name (its scope left out, so that
        `neuronish ls`, which shows 40 characters, shows the shape) and the shape."""
        return f"{self.node_name.rsplit('/', 1)[-1]}@" + ";".join(
            "x".join("*" if n < 0 else str(n) for n in shape) for shape in key)

    def shapes_loaded(self) -> list[tuple]:
        with self._lock:
            return list(self._entries)

    def unload_all(self) -> None:
        """Free every shape's device memory (the op is going away)."""
        with self._lock:
            entries, self._entries = list(self._entries.values()), OrderedDict()
        for entry in entries:
            entry.model.unload()

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

    def entry(self, shapes: Sequence[Sequence[int]]) -> _Entry:
        """The executable for `shapes`, compiled and loaded if new; marked running
        until `done`."""
        return self._entry(self.key(shapes))

    @staticmethod
    def output_shapes(entry: _Entry, shapes: Sequence[Sequence[int]]) -> list[list[int]]:
        batch = next((shape[s.batch_axis] for s, shape in zip(entry.exe.inputs, shapes)
                      if s.batch_axis >= 0), None)
        return [[batch if d == s.batch_axis and batch is not None else n
                 for d, n in enumerate(s.shape)] for s in entry.exe.outputs]

    def done(self, entry: _Entry) -> None:
        with self._lock:
            entry.running -= 1
        self._evict()

    # -- inside ---------------------------------------------------------------------

    def _entry(self, key: tuple) -> _Entry:
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    entry.running += 1
                    return entry
                pending = self._compiling.get(key)
                if pending is None:
                    self._compiling[key] = pending = threading.Event()
                    mine = True
                else:
                    mine = False
            if not mine:  # another thread compiles this shape: wait for it, look again
                pending.wait()
                continue
            try:
                exe = self._compile(key)
                model = self._load(exe)
                model.label = self._label(key)
                with self._lock:
                    self._entries[key] = _Entry(model, exe)
            finally:
                with self._lock:
                    del self._compiling[key]
                pending.set()
            self._evict()

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
        """The subgraph compiled at `key` (batch at the compiled batch), through the
        compile cache."""
        from neuronish.compile_cache import CacheStats, CompileCache, compile_with_cache
        from neuronish.compile_driver import CompileJob

        if self._graph is None:
            self._graph = bytes(self._graph_def())
        io_config = {"inputs": {s.name: [[s.shape[d] if n < 0 else n for d, n in enumerate(k)],
                                         s.dtype, s.batch_axis]
                                for s, k in zip(self.first.inputs, key)},
                     "outputs": {s.name: s.batch_axis for s in self.first.outputs}}
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.node_name)
        (result,) = compile_with_cache([CompileJob(name, self._graph, io_config,
                                                   tuple(self.spec.compiler_args))],
                                       CompileCache.from_env(), CacheStats(),
                                       max_num_compilers=1)
        if not result.ok:
            raise ShapeCompileError(f"NeuronOp '{self.node_name}': compiling it for the new "
                                    f"shape {self._label(key)} failed: {result.error}")
        return from_bytes(bytes(result.executable))  # type: ignore[arg-type]
