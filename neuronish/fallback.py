"""Runtime fallback: a `NeuronOp` whose executable the device cannot load or run
computes its own `graph_def` (the subgraph it was compiled from) on TensorFlow.

    runner = GraphRunner(node_name, graph_def, input_names, output_names,
                         input_shapes, input_batch_axis, output_batch_axis)
    runner.run(inputs, outputs, cutoff)  # numpy arrays in, writes into `outputs`

kernel_bridge decides when (a load refused with a device error: out of device
memory, too few cores, a damaged executable; or a call the device fails to
run, see `run_failed_call`) and this module does it: it warns once per op, counts every op that fell
back and every call it served (`fallback_counts()`, and as Prometheus text,
`prometheus_lines()`), and with `NEURONISH_FALLBACK=0` refuses, so the device's
error reaches the caller instead.

It imports TensorFlow, which is fine: it only runs inside a `NeuronOp` kernel,
so TensorFlow is already loaded. The subgraph runs in its own
`tf.compat.v1.Session` with its own inter-op thread, so a kernel that blocks one
of TensorFlow's inter-op threads while it waits cannot starve it. Its
placeholders have the compiled (static) shapes, so a call with another batch is
cut into compiled-size chunks (the last padded), as the device does. A call's cutoff
(its deadline and cancel flag, runtime/cutoff.py) is honoured as on the device: checked
before each chunk, and the deadline bounds each chunk's `Session.run` too.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections import Counter
from collections.abc import Sequence

import numpy as np

from neuronish.runtime import DeadlineExceeded, DeviceError
from neuronish.runtime.cutoff import Cutoff

ENV_FALLBACK = "NEURONISH_FALLBACK"


class FallbackWarning(RuntimeWarning):
    """A NeuronOp runs on TensorFlow because the device could not take it."""


_lock = threading.Lock()
# Keyed by op id, `node@executable` (kernel_bridge.Handle.op_id): two models served by
# one process often share node names (`PartitionedCall/model/neuron_op_0`).
_ops: dict[str, str] = {}        # op id -> why it fell back (first reason)
_calls: Counter[str] = Counter()  # op id -> calls served on TensorFlow


def fallback_enabled() -> bool:
    """False when `NEURONISH_FALLBACK` is `0` (or `false`/`off`/`no`)."""
    return os.environ.get(ENV_FALLBACK, "1").strip().lower() not in ("0", "false", "off", "no")


def fallback_counts() -> dict[str, dict]:
    """Per op that fell back in this process, by op id (`node@executable`): its node
    name, executable (the first 12 hex digits of its SHA-256), why, and how many
    calls it served."""
    with _lock:
        return {op_id: {"op": op_id.rpartition("@")[0], "executable": op_id.rpartition("@")[2],
                        "reason": why, "calls": _calls[op_id]} for op_id, why in _ops.items()}


def prometheus_lines() -> list[str]:
    """The fallback counters in Prometheus text format (for a metrics page)."""
    counts = fallback_counts()
    lines = ["# HELP :neuronish:neuron_op:fallback_calls NeuronOp calls computed on "
             "TensorFlow because the device could not load or run the op's executable.",
             "# TYPE :neuronish:neuron_op:fallback_calls counter"]
    for _, c in sorted(counts.items()):
        label = c["op"].replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines.append(f':neuronish:neuron_op:fallback_calls{{op="{label}",'
                     f'executable="{c["executable"]}"}} {c["calls"]}')
    return lines


def op_id(node_name: str, executable_digest: str) -> str:
    """How the counters name an op: its node and its executable's digest (12 hex)."""
    return f"{node_name}@{executable_digest[:12]}"


def count_call(op: str) -> None:
    """One call of op id `op` served on TensorFlow."""
    with _lock:
        _calls[op] += 1


def record_fallback(op: str, reason: str) -> None:
    """Note that op id `op` now runs on TensorFlow; warns the first time per op."""
    with _lock:
        first = op not in _ops
        if first:
            _ops[op] = reason
    if first:
        node_name = op.rpartition("@")[0]
        warnings.warn(f"NeuronOp '{node_name}' runs on TensorFlow instead of the device: "
                      f"{reason}. Set {ENV_FALLBACK}=0 to make this an error",
                      FallbackWarning, stacklevel=2)


def run_failed_call(handle, error: BaseException, inputs: Sequence[object],
                    outputs: Sequence[object], cutoff: Cutoff | None = None) -> None:
    """A call the device failed (not a bad input, not a deadline): compute it on TensorFlow.

    If TensorFlow computes it, the device was at fault (a core failed, say): the op runs
    on TensorFlow from now on, warned once and counted. If TensorFlow refuses the call
    too, its inputs were at fault (an index out of range): TensorFlow's error, with its
    status code, reaches the caller and the op stays on the device, so one bad request
    cannot move a served model off the device. `handle` is a kernel_bridge.Handle."""
    import tensorflow as tf

    why = f"{type(error).__name__}: {error}"
    try:
        runner = handle.tensorflow_runner()
    except FallbackError as e:
        raise FallbackError(f"the device failed the call ({why}); {e}") from None
    try:
        runner.run([np.asarray(x) for x in inputs], [np.asarray(o) for o in outputs], cutoff)
    except tf.errors.OpError as e:
        raise TensorFlowRefused(e.error_code, f"{e.message} (TensorFlow refused the call as "
                                f"well as the device, which said: {why})") from None
    handle.fall_back(f"the device failed to run it ({why})")
    count_call(handle.op_id)


class GraphRunner:
    """The op's subgraph, imported once, run on TensorFlow per call."""

    def __init__(self, node_name: str, graph_def: bytes, input_names: Sequence[str],
                 output_names: Sequence[str], input_shapes: Sequence[Sequence[int]],
                 input_batch_axis: Sequence[int], output_batch_axis: Sequence[int]):
        import tensorflow as tf

        self.node_name = node_name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.input_shapes = [tuple(s) for s in input_shapes]
        self.input_axes = list(input_batch_axis)
        self.output_axes = list(output_batch_axis)
        batches = {s[a] for s, a in zip(self.input_shapes, self.input_axes) if a >= 0}
        self.compiled_batch = batches.pop() if len(batches) == 1 else None
        gd = tf.compat.v1.GraphDef()
        try:
            gd.ParseFromString(bytes(graph_def))
        except Exception as e:  # DecodeError: the attr itself is damaged
            raise FallbackError(f"NeuronOp '{node_name}': its graph_def attr cannot be parsed "
                                f"({e}), so it cannot run on TensorFlow either") from None
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.graph_util.import_graph_def(gd, name="")
        self.session = tf.compat.v1.Session(graph=self.graph, config=tf.compat.v1.ConfigProto(
            use_per_session_threads=True, inter_op_parallelism_threads=1))
        self._tf = tf

    def close(self) -> None:
        self.session.close()

    def _run_chunk(self, feeds: list[np.ndarray], cutoff: Cutoff | None,
                   where: str) -> list[np.ndarray]:
        options = None
        if cutoff is not None:
            cutoff.check(where)
            if cutoff.deadline is not None:
                left_ms = max(1, int((cutoff.deadline - time.monotonic()) * 1000))
                options = self._tf.compat.v1.RunOptions(timeout_in_ms=left_ms)
        try:
            return self.session.run(self.output_names, dict(zip(self.input_names, feeds)),
                                    options=options)
        except self._tf.errors.DeadlineExceededError:
            raise DeadlineExceeded(f"NeuronOp '{self.node_name}' (on TensorFlow): the call's "
                                   "deadline passed while TensorFlow computed it; the rest "
                                   "of it was abandoned") from None

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
            cutoff: Cutoff | None = None) -> None:
        """Compute the subgraph on `inputs` and write each result into `outputs`; stop
        with Cancelled or DeadlineExceeded when `cutoff` says so (outputs then unset)."""
        inputs = [np.asarray(x) for x in inputs]
        batch = next((x.shape[a] for x, a in zip(inputs, self.input_axes) if a >= 0), None)
        size = self.compiled_batch
        if batch is None or size is None or batch == size:
            results = [self._run_chunk(inputs, cutoff, "before TensorFlow could start it")]
            chunks = [(0, batch)]
        else:
            results, chunks = [], []
            for start in range(0, batch, size):
                stop = min(start + size, batch)
                feeds = [x if a < 0 else _pad(np.take(x, range(start, stop), axis=a), a, size)
                         for x, a in zip(inputs, self.input_axes)]
                results.append(self._run_chunk(
                    feeds, cutoff, f"before TensorFlow could start samples {start}-{stop - 1}"))
                chunks.append((start, stop))
        for i, out in enumerate(outputs):
            out = np.asarray(out)
            axis = self.output_axes[i]
            if len(results) == 1:
                out[...] = np.asarray(results[0][i]).reshape(out.shape) if axis < 0 or \
                    batch is None or batch == size else _trim(results[0][i], axis, batch)
                continue
            parts = [_trim(r[i], axis, stop - start) for r, (start, stop) in
                     zip(results, chunks)]
            out[...] = np.concatenate(parts, axis=axis)


def _pad(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    if x.shape[axis] == size:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return np.pad(x, pad)


def _trim(x: np.ndarray, axis: int, n: int) -> np.ndarray:
    return np.take(np.asarray(x), range(n), axis=axis)


class FallbackError(DeviceError):
    """The op could not run on TensorFlow either."""


class TensorFlowRefused(DeviceError):
    """TensorFlow, too, refused a call the device failed: `status_code` is its error code."""

    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code
