"""Where a call through TensorFlow's NeuronOp spends its time, against the same executable
on the C runtime called from a Python thread, alternating in one process, medians.

    python benchmarks/tf_path.py COMPILED_DIR [--rounds 41] [--turn 1] [--crowd DIR ...]

COMPILED_DIR is a `neuronish.saved_model.compile` output (its serving signature takes one
input, batch on axis 0). Ways of calling, alternating:

- through TensorFlow: the serving signature, whose NeuronOp loaded its model with as
  many copies as the kernel takes (kernel_bridge.DEFAULT_MAX_DUPLICATES, the device's
  core groups permitting);
- the same executable on the C runtime, loaded with that many copies, called from a
  Python thread (the engine-thread hand-over a TensorFlow thread's call takes too);
- and, when the NeuronOp's model has more than one copy, the same from a one-copy model
  (`--no-one-copy` leaves it out). (No call from the main thread: it would open a second
  libgomp pool, and with more pool threads than CPUs libgomp throttles its spinning for
  every call in the process: ~100 context switches per call instead of ~10.)

- and TensorFlow's own cost of such a call: an empty signature (the same input, zeros
  of the outputs' shapes, no NeuronOp) saved, loaded and called the same way
  (`--no-empty` leaves it out). Its wall time is what any SavedModel called so pays
  (the eager function call, the inter-op thread's hand-over, `.numpy()`); the last line
  splits "outside" through TensorFlow into that and the NeuronOp's own share (its
  checks, output allocation and the engine thread's hand-over).

For each: wall time per call, the time inside the C runtime (the model's own `busy_ns`
counter, nr_model_copy), the rest ("outside": the caller's side, TensorFlow's function
call and thread hand-overs), context switches per call over the process's threads (a
libgomp pool too many shows as ~one per primitive: workers sleeping instead of
spinning), and how many of the model's copies the measured calls ran on (first in,
first out they went round all of them, each call finding its arena out of the caches).
`--turn N` makes each turn N calls back to back (benchmarks/peers.py's turns are ~0.5 s);
the figures are per call. Run it at real-time priority (`chrt -f 1`) on a shared host;
plain runs there measure the other processes.

--crowd loads more compiled SavedModels through TensorFlow into the process after the
first table and measures again, each round calling every one of them once before the
measured calls (as benchmarks/peers.py's rotation does): whether a process holding
several models slows this one (the thread count is printed with each table).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

EMPTY = "TF, empty signature"


def context_switches() -> int:
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--turn", type=int, default=1, help="calls back to back per turn")
    p.add_argument("--no-one-copy", action="store_true",
                   help="leave out the one-copy model on the main thread")
    p.add_argument("--no-empty", action="store_true",
                   help="leave out the empty signature (TensorFlow's own cost of a call)")
    p.add_argument("--crowd", nargs="+", default=[], metavar="DIR",
                   help="compiled SavedModels to load and call too, for a second table")
    args = p.parse_args()
    import tensorflow as tf

    from neuronish.cc.saved_model_executables import neuron_op_executables
    from neuronish.runtime.capi import native_model

    fn = tf.saved_model.load(args.dir).signatures["serving_default"]
    (name, spec), = fn.structured_input_signature[1].items()
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, [8, *spec.shape[1:]]).astype(spec.dtype.as_numpy_dtype)
    feed = {name: tf.constant(x)}
    fn(**feed)  # loads the op's model on the C runtime
    (through_tf,) = native_model.loaded_models()
    copies = through_tf.duplicates
    exe = max(neuron_op_executables(args.dir), key=lambda o: len(o.executable)).executable
    pool = concurrent.futures.ThreadPoolExecutor(1)  # loads and calls off the main thread

    def on_a_thread(n: int) -> tuple:
        model = pool.submit(native_model.load, exe, n, f"{n} copies").result().model
        return model, lambda: pool.submit(model.run_list, [x]).result()

    calls = {"through TensorFlow": (through_tf, lambda: [v.numpy() for v in fn(**feed).values()]),
             "C runtime, a thread": on_a_thread(copies)}
    if copies > 1 and not args.no_one_copy:
        calls["a thread, one copy"] = on_a_thread(1)
    if not args.no_empty:
        # (loaded whole into memory: it has no variables or assets to read later)
        with tempfile.TemporaryDirectory(prefix="tf_path-empty-") as where:
            empty = empty_signature(tf, fn, where, len(x))
        calls[EMPTY] = (None, lambda: [v.numpy() for v in empty(**feed).values()])
    for _, call in calls.values():
        for _ in range(3):
            call()

    def busy(model) -> int:
        return 0 if model is None else sum(c[3] for c in model.copies())

    def runs(model) -> list[int]:
        return [] if model is None else [c[2] for c in model.copies()]

    def measure(between: list) -> None:
        wall: dict[str, list[float]] = {k: [] for k in calls}
        inside: dict[str, list[float]] = {k: [] for k in calls}
        switches: dict[str, list[float]] = {k: [] for k in calls}
        before = {k: runs(m) for k, (m, _) in calls.items()}
        keys = list(calls)
        for r in range(args.rounds):
            for other in between:
                other()
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                model, call = calls[k]
                b, c, t = busy(model), context_switches(), time.perf_counter()
                for _ in range(args.turn):
                    call()
                wall[k].append((time.perf_counter() - t) * 1e3 / args.turn)
                switches[k].append((context_switches() - c) / args.turn)
                inside[k].append((busy(model) - b) / 1e6 / args.turn)
        threads = len(os.listdir("/proc/self/task"))
        print(f"{'':22s} {'wall ms':>8s} {'inside':>8s} {'outside':>8s} {'ctx sw':>7s} "
              f"{'copies':>6s}   ({threads} threads, {len(between)} other models called per "
              f"round, {args.turn} calls per turn)")
        outside: dict[str, float] = {}
        for k, (model, _) in calls.items():
            outside[k] = statistics.median([w - i for w, i in zip(wall[k], inside[k])])
            used = sum(a > b for a, b in zip(runs(model), before[k]))
            copies = "" if model is None else f"{used:3d}/{model.duplicates}"
            print(f"{k:22s} {statistics.median(wall[k]):8.2f} "
                  f"{statistics.median(inside[k]):8.2f} {outside[k]:8.2f} "
                  f"{statistics.median(switches[k]):7.1f} {copies}", flush=True)
        if EMPTY in outside:
            own = outside[EMPTY]
            print(f"outside through TensorFlow: {own:.2f} ms TensorFlow's own call (the empty "
                  f"signature), {outside['through TensorFlow'] - own:.2f} ms the NeuronOp's",
                  flush=True)

    measure([])
    if args.crowd:
        crowd = [_caller(tf, d, rng) for d in args.crowd]
        for other in crowd:
            for _ in range(3):
                other()
        measure(crowd)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


def empty_signature(tf: object, fn: object, directory: str, batch: int) -> object:
    """A loaded SavedModel signature that takes `fn`'s input and returns zeros of its
    outputs' shapes (batch `batch`) and dtypes, saved to `directory`: TensorFlow's own
    cost of a signature call, without a NeuronOp. Each output adds one element of the
    input, so nothing is folded into a constant."""
    (name, spec), = fn.structured_input_signature[1].items()
    outputs = {k: ([batch if d is None else d for d in t.shape], t.dtype)
               for k, t in fn.structured_outputs.items()}

    class Empty(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec(spec.shape, spec.dtype, name=name)])
        def serve(self, x: object) -> dict:
            first = tf.reshape(x, [-1])[0]
            return {k: tf.zeros(shape, dtype) + tf.cast(first, dtype)
                    for k, (shape, dtype) in outputs.items()}

    module = Empty()
    tf.saved_model.save(module, directory, signatures={"serving_default": module.serve})
    return tf.saved_model.load(directory).signatures["serving_default"]


def _caller(tf: object, directory: str, rng: np.random.Generator) -> object:
    """A call of another compiled SavedModel's serving signature at batch 8."""
    fn = tf.saved_model.load(directory).signatures["serving_default"]
    feed = {k: tf.constant(rng.uniform(0, 255, [8, *s.shape[1:]]).astype(s.dtype.as_numpy_dtype))
            for k, s in fn.structured_input_signature[1].items()}
    return lambda: fn(**feed)


if __name__ == "__main__":
    raise SystemExit(main())
