"""The Python side of the `NeuronOp` C++ kernel: the only module the kernel calls.

The kernel (neuronish/ops/neuron_op.cc) takes the GIL and calls four functions:

    handle = load(node_name, executable, input_names, input_dtypes, input_shapes,
                  input_batch_axis, output_names, output_dtypes, output_shapes,
                  output_batch_axis, model_config, graph_def,
                  external_files)                      # once per op instance
    shapes = output_shapes(handle, inputs, cancel)      # every call, ops with free dims
    run(handle, inputs, outputs, cancel)               # every call
    unload(handle)                                     # kernel destructor (queued)
    code, message = error_status(exc)                  # when any of them raised

`inputs` and `outputs` are buffer objects over the TensorFlow tensors' own memory
(typed and shaped, PEP 3118), so `np.asarray` wraps them without copying; the
kernel has already checked ranks and sizes against the compiled shapes and
allocated the outputs with the call's batch size. `cancel` is a bytearray(1) that
TensorFlow's cancellation callback sets when the caller gives up on the call (None
when TensorFlow gave the kernel no cancellation manager); the device then abandons
the call before its next instruction (runtime/cutoff.py). An op with free dimensions
(its `dynamic_shapes` attr) is first asked `output_shapes` for each call: its
`shape_specialize.ShapeTable` picks, or compiles, the executable for that shape, and
the kernel allocates the outputs it says. When the device cannot load or
run the executable, the op computes `graph_def` on TensorFlow instead
(neuronish/fallback.py; NEURONISH_FALLBACK=0 turns that off). Keeping this surface to plain
values and buffers is what would let an out-of-process device (a daemon behind
a socket and shared memory) replace it without touching the C++ side.

No TensorFlow here: this module runs inside TensorFlow's kernel threads and
must stay importable (and testable) on its own.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from neuronish.runtime import (
    Cancelled,
    DeadlineExceeded,
    Device,
    DeviceError,
    InvalidInput,
    Model,
    OutOfDeviceMemory,
    OutputBufferError,
    get_device,
    profiler,
)
from neuronish.runtime.capi import native_model
from neuronish.runtime.cutoff import Cutoff
from neuronish.runtime.executable import Executable, from_bytes, header_digest
from neuronish.runtime.signature import TensorSignature

# When model_config does not bound the duplicates (max_num_duplicates = -1), load
# this many copies, or as many as the device's core groups hold if fewer: enough
# to run the chunks of a split batch in parallel without one model taking a
# whole large device.
DEFAULT_MAX_DUPLICATES = 4

# TensorFlow's error codes (tensorflow/core/protobuf/error_codes.proto); the
# kernel turns (code, message) into a Status.
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
INTERNAL = 13


class AttrMismatch(ValueError):
    """The NeuronOp's attributes disagree with its executable (a broken rewrite)."""


@dataclass(frozen=True)
class ModelConfig:
    """`model_config` attr: `[global_opt_num_cores, this_opt_num_cores,
    max_num_duplicates, timeout_s, core_group_index]`, -1 = unbound.

    `max_num_duplicates` bounds the copies loaded; `timeout_s` (> 0) is each call's
    deadline on the device (a call still queued or between stages when it passes is
    abandoned with DEADLINE_EXCEEDED). The runtime places copies on its freest core
    groups itself (so `core_group_index` is not honoured). The core counts are
    recorded for reports."""

    global_opt_num_cores: int = -1
    this_opt_num_cores: int = -1
    max_num_duplicates: int = -1
    timeout_s: int = -1
    core_group_index: int = -1

    @staticmethod
    def from_list(values: Sequence[int]) -> ModelConfig:
        if len(values) > 5:
            raise AttrMismatch(f"model_config has {len(values)} entries; expected at most 5: "
                               "[global_opt_num_cores, this_opt_num_cores, max_num_duplicates, "
                               "timeout_s, core_group_index]")
        return ModelConfig(*(int(v) for v in values))


class Handle:
    """One NeuronOp instance: its model on the device (the Python runtime's, or the C
    runtime's: native_model.NativeModel), or (after a device failure, see
    neuronish/fallback.py) its subgraph on TensorFlow."""

    def __init__(self, node_name: str, model: Model | native_model.NativeModel | None,
                 config: ModelConfig,
                 fallback: FallbackSource | None = None, op_id: str = ""):
        self.node_name = node_name
        # What the fallback counters call this op (fallback.op_id): node and executable.
        self.op_id = op_id or f"{node_name}@"
        self.model = model
        self.config = config
        # Each call's deadline on the device, in seconds (None: no deadline).
        self.timeout: float | None = config.timeout_s if config.timeout_s > 0 else None
        self.fallback = fallback
        self.runner = None  # fallback.GraphRunner once the op runs on TensorFlow
        self.shapes = None  # shape_specialize.ShapeTable for an op with free dimensions
        # Models the op stopped using (a C runtime model when it fell back; either kind when
        # failed cores took every copy and it loaded again): kept loaded until the op
        # unloads, since the kernel's threads may still be inside a call on one.
        self._retired: list[Model | native_model.NativeModel] = []
        self._reload_failed = False  # load_again found no working core (not tried again)
        self._unloaded = False
        self._lock = threading.Lock()

    def unload(self) -> None:
        with self._lock:
            if not self._unloaded:
                self._unloaded = True
                if self.shapes is not None:
                    self.shapes.unload_all()
                elif self.model is not None:
                    self.model.unload()
                for retired in self._retired:
                    retired.unload()
                if self.runner is not None:
                    self.runner.close()

    def fall_back(self, reason: str) -> None:
        """Run this op on TensorFlow from now on (the device failed it); warns once."""
        from neuronish import fallback

        self.tensorflow_runner()
        with self._lock:
            if isinstance(self.model, native_model.NativeModel):
                self._retired.append(self.model)
            elif self.model is not None:
                self.model.unload()
            self.model = None
        fallback.record_fallback(self.op_id, reason)

    def load_again(self, lost: Model | native_model.NativeModel
                   ) -> Model | native_model.NativeModel | None:
        """Failed cores retired every copy of `lost`, the op's model: load its executable
        again onto the cores that still work (as many copies as model_config wants and fit).
        The op's model on the device now (loaded here, or by another thread that got here
        first); None if no working core can take it (not tried again: cores do not come
        back) or the op left the device."""
        with self._lock:
            if self._unloaded:
                return None
            if self.model is not lost:
                return self.model
            if self._reload_failed:
                return None
            try:
                if isinstance(lost, native_model.NativeModel):
                    again = lost.load_again(_duplicates_wanted(self.config))
                else:
                    again = load_model(lost.exe, self.config)
                    again.label = lost.label
            except (DeviceError, MemoryError) as e:
                self._reload_failed = True
                logging.getLogger(__name__).warning(
                    "NeuronOp '%s': failed cores took every copy of its model, and loading "
                    "it again failed: %s; its calls run on TensorFlow (with "
                    "NEURONISH_FALLBACK=0 they fail)", self.node_name, e)
                return None
            self._retired.append(lost)
            self.model = again
        logging.getLogger(__name__).warning(
            "NeuronOp '%s': failed cores took every copy of its model; loaded it again on "
            "core group(s) %s", self.node_name, again.core_groups)
        return again

    @property
    def native_entry(self) -> tuple[int, int] | None:
        """(nr_model*, nr_execute_with) when the op's model is on the C runtime: the kernel
        then runs each call there itself, without the GIL; None: it calls `run`."""
        model = self.model
        return model.entry if isinstance(model, native_model.NativeModel) else None

    def tensorflow_runner(self):  # -> fallback.GraphRunner
        """The op's subgraph on TensorFlow, built on first use."""
        from neuronish import fallback

        with self._lock:
            if self.runner is None:
                assert self.fallback is not None
                self.runner = fallback.GraphRunner(self.node_name, *self.fallback)
            return self.runner

    def __repr__(self) -> str:
        if self.model is None:
            return f"<NeuronOp '{self.node_name}': on TensorFlow (fallback)>"
        return (f"<NeuronOp '{self.node_name}': {self.model.duplicates} duplicate(s) on core "
                f"groups {self.model.core_groups}>")


class _LazyBytes:
    """The graph_def attr, read from its external file only if the fallback needs it."""

    def __init__(self, value: bytes, files: list[str], node_name: str):
        self.value, self.files, self.node_name = value, files, node_name

    def __bytes__(self) -> bytes:
        from neuronish import external

        return external.resolve(self.value, self.files, self.node_name, "graph_def")


# What fallback.GraphRunner needs besides the node name: graph_def, input_names,
# output_names, input_shapes, input_batch_axis, output_batch_axis.
FallbackSource = tuple


def _check_signature(kind: str, sigs: list[TensorSignature], names: Sequence[str],
                     dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
                     axes: Sequence[int]) -> None:
    """The attrs (the kernel hands them over column by column) must describe the
    executable's signature exactly: the kernel sizes its outputs and checks its inputs
    from them without asking the device."""
    if len(names) != len(sigs):
        raise AttrMismatch(f"the op has {len(names)} {kind}s {list(names)} but the executable "
                           f"has {len(sigs)}: {[s.name for s in sigs]}")
    for i, (sig, name, dtype, shape, axis) in enumerate(zip(sigs, names, dtypes, shapes, axes)):
        if dtype != sig.dtype and kind == "input":
            # The one mismatch a caller can cause: the op's Tin follows what was fed.
            raise InvalidInput(f"input '{sig.name}' has dtype {dtype}; the model was compiled "
                               f"for {sig.dtype}. Cast it to {sig.dtype} before the NeuronOp")
        # -1 (a free dimension, `dynamic_shapes`) matches the size compiled at
        shape = [s if d < 0 else d for d, s in zip(shape, sig.shape)] \
            if len(shape) == len(sig.shape) else shape
        stated = TensorSignature(name, dtype, tuple(shape), axis)
        if stated != sig:
            raise AttrMismatch(
                f"{kind} {i} is {stated.describe()} in the op's attributes but "
                f"{sig.describe()} in its executable; rebuild the node with "
                "neuronish.neuron_op.neuron_op_node_def from the same executable")


def _duplicates_wanted(config: ModelConfig) -> int:
    """max_num_duplicates if bound, else DEFAULT_MAX_DUPLICATES."""
    return config.max_num_duplicates if config.max_num_duplicates >= 1 else \
        DEFAULT_MAX_DUPLICATES


def load_model(exe: Executable, config: ModelConfig, device: Device | None = None) -> Model:
    """Load `exe` with `config.max_num_duplicates` copies if bound, else
    DEFAULT_MAX_DUPLICATES; when fewer fit (too few core groups, or too little free
    memory), with fewer, down to one. Only if one copy does not fit does it raise
    (the runtime's OutOfDeviceMemory or DeviceError)."""
    device = device or get_device()
    for n in range(_duplicates_wanted(config), 0, -1):
        try:
            return Model(exe, device, duplicates=n)
        except OutOfDeviceMemory:
            if n == 1:
                raise
        except DeviceError as e:
            # `reserve` says "cannot load N duplicate(s)" with a plain DeviceError when
            # the device has fewer core groups than N; anything more specific
            # (a bad executable) is final.
            if type(e) is not DeviceError or n == 1:
                raise
    raise AssertionError("unreachable")


def load(node_name: str, executable: bytes | memoryview, input_names: Sequence[str],
         input_dtypes: Sequence[str], input_shapes: Sequence[Sequence[int]],
         input_batch_axis: Sequence[int], output_names: Sequence[str],
         output_dtypes: Sequence[str], output_shapes: Sequence[Sequence[int]],
         output_batch_axis: Sequence[int], model_config: Sequence[int],
         graph_def: bytes | memoryview | None = None,
         external_files: Sequence[str] = (), dynamic_shapes: str = "") -> Handle:
    """Parse the executable, check it against the op's attributes, load it.

    `executable` and `graph_def` may be memoryviews over the NodeDef's attrs (not
    kept after this call). Dtypes are numpy names (`float32`); TensorFlow-only
    dtypes arrive as TensorFlow's names (`bfloat16`, `string`) and are refused.

    With `graph_def` (the kernel passes it), a device that refuses the executable
    (out of memory, too few cores, a damaged file) makes the op run its subgraph on
    TensorFlow instead (neuronish/fallback.py), unless NEURONISH_FALLBACK=0.

    Either attr may be a reference to a file in the SavedModel's assets
    (neuronish/external.py); `external_files` are the paths the op was fed.
    `dynamic_shapes` (JSON, `shape_specialize.DynamicSpec`) marks an op with free
    dimensions: -1 in its shape attrs."""
    from neuronish import external
    from neuronish.fallback import fallback_enabled
    from neuronish.fallback import op_id as fallback_op_id

    config = ModelConfig.from_list(model_config)
    files = list(external_files)
    source = None if graph_def is None else (
        _LazyBytes(bytes(graph_def), files, node_name), list(input_names), list(output_names),
        [list(s) for s in input_shapes], list(input_batch_axis), list(output_batch_axis))
    op_id = fallback_op_id(node_name, _executable_digest(executable))
    def check_signatures(inputs: list[TensorSignature], outputs: list[TensorSignature]) -> None:
        _check_signature("input", inputs, input_names, input_dtypes, input_shapes,
                         input_batch_axis)
        _check_signature("output", outputs, output_names, output_dtypes, output_shapes,
                         output_batch_axis)

    try:
        data = external.resolve(executable, files, node_name, "executable")
        if not dynamic_shapes:
            # On the C runtime, when it takes the executable: the kernel then runs every
            # call there without the GIL. It reads, hashes and checks the bytes itself, so
            # Python parses them only when it refuses (and then in Python's words).
            native, why_not = native_model.load(data, _duplicates_wanted(config), node_name,
                                                step_down=True)
            if native is not None:
                try:
                    check_signatures(native.inputs, native.outputs)
                except BaseException:
                    native.unload()
                    raise
                return Handle(node_name, native, config, source, op_id)
            logging.getLogger(__name__).debug("NeuronOp '%s' runs on the Python runtime: %s",
                                              node_name, why_not)
        exe = from_bytes(data)
        check_signatures(exe.inputs, exe.outputs)
        model = load_model(exe, config)
        model.label = node_name  # how `neuronish ls` / `top` / profiles name it
        if dynamic_shapes:
            from neuronish.shape_specialize import DynamicSpec, ShapeTable

            spec = DynamicSpec.parse(dynamic_shapes, node_name, len(exe.inputs))
            handle = Handle(node_name, model, config, source, op_id)
            # Each shape's executable holds its own copy of the weights: one copy per
            # shape compiled at run time, unless model_config bounds the duplicates.
            one = config if config.max_num_duplicates >= 1 else \
                dataclasses.replace(config, max_num_duplicates=1)
            handle.shapes = ShapeTable(
                node_name, spec, exe, model, lambda: bytes(source[0]),
                lambda e: load_model(e, one),
                lambda ref: from_bytes(external.resolve(ref.encode(), files, node_name,
                                                        "executable")))
            return handle
    except (DeviceError, MemoryError) as e:
        if source is None or isinstance(e, InvalidInput) or not fallback_enabled():
            raise
        handle = Handle(node_name, None, config, source, op_id)
        handle.fall_back(f"the device could not load its executable "
                         f"({type(e).__name__}: {e})")
        return handle
    return Handle(node_name, model, config, source, op_id)


def _executable_digest(value: bytes | memoryview) -> str:
    """A name for the op's executable without reading it: the SHA-256 an external
    reference names, else the one the inline executable's header records (unchecked:
    a damaged executable still gets a name, and the load then refuses it)."""
    from neuronish import external

    try:
        reference = external.parse_reference(value)
    except DeviceError:  # a malformed reference: the load names it
        reference = None
    return reference[0] if reference else header_digest(value)


def output_shapes(handle: Handle, inputs: Sequence[object],
                  cancel: bytearray | None = None) -> list[list[int]]:
    """An op with free dimensions: the shapes of the outputs of a call on `inputs`
    (buffers, as `run` gets them); the kernel then allocates them and calls `run`.
    Picks the executable for the call's shape (shape_specialize.py). A shape not loaded
    yet is compiled in the background; with the runtime fallback on, this call is
    computed on TensorFlow here meanwhile, counted as a fallback call; with it off, the
    call waits for the compile until its deadline (`model_config`'s timeout_s) or
    `cancel` (as `run`'s; older kernels pass none). A shape outside the op's bounds, or
    one the compiler refuses, is an error, or with the runtime fallback on is computed
    on TensorFlow. What was chosen waits for `run` on this thread (the kernel calls
    both from one Compute), with the call's cutoff."""
    from neuronish import fallback

    ins = [np.asarray(x) for x in inputs]
    table = handle.shapes
    shapes = [x.shape for x in ins]
    use_tensorflow = handle.fallback is not None and fallback.fallback_enabled()
    cutoff = Cutoff.of(handle.timeout, cancel)
    why = "the op runs on TensorFlow" if table is None or handle.model is None else \
        table.out_of_bounds(shapes)
    if why is None:
        try:
            entry = table.entry(shapes, wait=not use_tensorflow,  # type: ignore[union-attr]
                                cutoff=cutoff)
            if entry is not None:
                _chosen.value = ("device", entry, cutoff)
                return table.output_shapes(entry, shapes)  # type: ignore[union-attr]
            why = (f"its shape {table.label(table.key(shapes))} "  # type: ignore[union-attr]
                   "was new and compiles in the background")
        except (DeadlineExceeded, Cancelled):
            raise  # (a call given up is not computed on TensorFlow either)
        except DeviceError as e:
            if isinstance(e, InvalidInput) or not use_tensorflow:
                raise
            why = f"{type(e).__name__}: {e}"
    elif not use_tensorflow:
        raise InvalidInput(why)
    results = _on_tensorflow(handle, ins, why, cutoff)
    _chosen.value = ("tensorflow", results, cutoff)
    return [list(r.shape) for r in results]


def _on_tensorflow(handle: Handle, ins: list[np.ndarray], why: str,
                   cutoff: Cutoff | None = None) -> list[np.ndarray]:
    """A call of an op with free dimensions computed on TensorFlow (its subgraph takes
    any shape and batch), warned once and counted as a fallback call."""
    from neuronish import fallback

    fallback.record_fallback(handle.op_id, f"calls it cannot run on the device run on "
                             f"TensorFlow (the first: {why})")
    fallback.count_call(handle.op_id)
    runner = handle.tensorflow_runner()
    # (its placeholders take any shape: one chunk, the call's deadline bounding it)
    return runner._run_chunk(ins, cutoff, "before TensorFlow could start it")


_chosen = threading.local()  # output_shapes -> run, per kernel thread


def run(handle: Handle, inputs: Sequence[object], outputs: Sequence[object],
        cancel: bytearray | None = None) -> None:
    """Run one call: read `inputs`, write every element of `outputs` (buffer objects
    in signature order, or anything `np.asarray` takes; outputs must be writable).
    At the compiled batch size the device writes straight into `outputs`. Once
    `cancel[0]` is set the rest of the call is abandoned (Cancelled)."""
    # (An OutputBufferError here would be a kernel bug: it sizes the outputs from the
    # attrs, which load() checked against the executable. It surfaces as INTERNAL.)
    if handle.shapes is not None or getattr(_chosen, "value", None):
        _run_shaped(handle, inputs, outputs, cancel)
        return
    model = handle.model
    if model is not None:
        ins, outs = [np.asarray(x) for x in inputs], [np.asarray(o) for o in outputs]
        error = _on_device(lambda m: _run_on(handle, m, ins, outs, cancel), model,
                           handle.load_again)
        if error is None:
            return
        from neuronish import fallback

        if handle.fallback is None or not fallback.fallback_enabled():
            raise error
        fallback.run_failed_call(handle, error, inputs, outputs,
                                 Cutoff.of(handle.timeout, cancel))
        return
    from neuronish.fallback import count_call

    count_call(handle.op_id)
    handle.runner.run([np.asarray(x) for x in inputs], [np.asarray(o) for o in outputs],
                      Cutoff.of(handle.timeout, cancel))


def _on_device(call: Callable[[Model | native_model.NativeModel], None],
               model: Model | native_model.NativeModel,
               load_again: Callable[[Model | native_model.NativeModel],
                                    Model | native_model.NativeModel | None]
               ) -> BaseException | None:
    """`call(model)`; when the device fails it because failed cores took every copy of
    `model`, `load_again(model)` puts it on the working cores and `call` runs once more
    there, before the fallback has a say. None if a call succeeded, else the device's
    error (DeviceError or MemoryError) for the caller's fallback. A bad input, a deadline
    or a cancel is raised: such a call is not retried, on the device or on TensorFlow."""
    error = _device_error(call, model)
    again = load_again(model) if error is not None and model.lost else None
    return error if again is None else _device_error(call, again)


def _device_error(call: Callable[[Model | native_model.NativeModel], None],
                  model: Model | native_model.NativeModel) -> BaseException | None:
    """`call(model)`: None if it succeeded, the device's error if the device failed it."""
    try:
        call(model)
        return None
    except (InvalidInput, OutputBufferError, DeadlineExceeded, Cancelled):
        raise
    except (DeviceError, MemoryError) as e:
        return e


def _run_on(handle: Handle, model: Model | native_model.NativeModel, ins: list[np.ndarray],
            outs: list[np.ndarray], cancel: bytearray | None) -> None:
    if not profiler.active():  # (the common case, kept free of the span's cost)
        model.run_list(ins, out=outs, timeout=handle.timeout, cancel=cancel)
        return
    with profiler.span(f"NeuronOp {handle.node_name}", "tf"):  # TF's side of the call
        model.run_list(ins, out=outs, timeout=handle.timeout, cancel=cancel)


def _run_shaped(handle: Handle, inputs: Sequence[object], outputs: Sequence[object],
                cancel: bytearray | None) -> None:
    """`run` for an op with free dimensions: on what `output_shapes` chose."""
    where, chosen, cutoff = getattr(_chosen, "value", None) or (None, None, None)
    _chosen.value = None
    if where is None:
        raise AttrMismatch(f"NeuronOp '{handle.node_name}': run before output_shapes; the "
                           "kernel is older than the model (rebuild the op library)")
    outs = [np.asarray(o) for o in outputs]
    if where == "tensorflow":
        for r, o in zip(chosen, outs):  # type: ignore[call-overload]
            np.copyto(o, r, casting="no")
        return
    ins = [np.asarray(x) for x in inputs]
    # The call's deadline began in output_shapes (it may have waited for a compile).
    timeout = None if cutoff is None or cutoff.deadline is None else \
        max(0.0, cutoff.deadline - time.monotonic())
    try:
        error = _on_device(
            lambda m: m.run_list(ins, out=outs, timeout=timeout, cancel=cancel),
            chosen.model,  # type: ignore[union-attr]
            lambda lost: handle.shapes.load_again(chosen, lost))  # type: ignore[union-attr, arg-type]
        if error is None:
            return
        from neuronish.fallback import fallback_enabled

        if handle.fallback is None or not fallback_enabled():
            raise error
        results = _on_tensorflow(handle, ins, f"{type(error).__name__}: {error}",
                                 Cutoff.of(timeout, cancel))
        for r, o in zip(results, outs, strict=True):
            np.copyto(o, r, casting="no")
    finally:
        handle.shapes.done(chosen)  # type: ignore[union-attr, arg-type]


def unload(handle: Handle) -> None:
    """Free the model's device memory (idempotent), on the unloader thread.

    The kernel's destructor calls this, and TensorFlow destroys kernels wherever a
    function is garbage-collected: on any thread, inside whatever that thread was doing,
    holding TensorFlow's function-library lock. Unloading takes the model's, the device's
    and telemetry's locks; a thread collected while holding one of them would wait for
    itself, and every other thread would then wait for TensorFlow's lock (seen: the
    telemetry thread, mid-snapshot). So this only queues the handle: SimpleQueue.put
    waits for no lock. `wait_for_unloads` waits until the queue is empty."""
    if not _unloader.is_alive():  # (a forked child: the thread did not come along)
        handle.unload()
        return
    _unloads.put(handle)


def wait_for_unloads(timeout: float | None = None) -> bool:
    """Wait until every unload queued so far is done; False if `timeout` passed first."""
    if not _unloader.is_alive():
        return True
    done = threading.Event()
    _unloads.put(done)
    return done.wait(timeout)


def _unload_queued() -> None:
    while True:
        item = _unloads.get()
        if isinstance(item, threading.Event):
            item.set()
            continue
        try:
            item.unload()
        except Exception as e:  # noqa: BLE001 - one model's failure must not stop the rest
            logging.getLogger(__name__).warning("NeuronOp '%s': unloading failed: %s: %s",
                                                item.node_name, type(e).__name__, e)


# Started at import, from the kernel's first load(): never from inside a destructor.
_unloads: queue.SimpleQueue = queue.SimpleQueue()
_unloader = threading.Thread(target=_unload_queued, name="neuronish-unload", daemon=True)
_unloader.start()


def error_status(exc: BaseException) -> tuple[int, str]:
    """The TensorFlow error code and message for an exception raised by the above."""
    if isinstance(exc, (InvalidInput, AttrMismatch)):
        return INVALID_ARGUMENT, str(exc)
    if isinstance(exc, DeadlineExceeded):
        return DEADLINE_EXCEEDED, f"{type(exc).__name__}: {exc}"
    if isinstance(exc, Cancelled):
        return CANCELLED, f"{type(exc).__name__}: {exc}"
    if isinstance(getattr(exc, "status_code", None), int):  # fallback.TensorFlowRefused
        return exc.status_code, str(exc)  # type: ignore[attr-defined]
    from neuronish.fallback import ENV_FALLBACK, fallback_enabled

    hint = "" if fallback_enabled() else (f" ({ENV_FALLBACK}=0: the op did not fall back to "
                                          "TensorFlow)")
    if isinstance(exc, (OutOfDeviceMemory, MemoryError)):  # device, or the host under it
        return RESOURCE_EXHAUSTED, f"{type(exc).__name__}: {exc}{hint}"
    if isinstance(exc, DeviceError):  # ExecutableError, ExecutionError, ...
        return INTERNAL, f"{type(exc).__name__}: {exc}{hint}"
    return UNKNOWN, f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
