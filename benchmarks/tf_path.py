"""Where a call through TensorFlow's NeuronOp spends its time, against the same executable
on the C runtime called from a Python thread, alternating in one process, medians.

    python benchmarks/tf_path.py COMPILED_DIR [--rounds 41] [--crowd DIR ...]

COMPILED_DIR is a `neuronish.saved_model.compile` output (its serving signature takes one
input, batch on axis 0). For each way of calling: wall time per call, the time inside the
C runtime (the model's own `busy_ns` counter, nr_model_copy), the rest ("outside": the
caller's side, TensorFlow's function call and thread hand-overs), and context switches
per call over the process's threads (a libgomp pool too many shows as ~one per
primitive: workers sleeping instead of spinning). Run it at real-time priority
(`chrt -f 1`) on a shared host; plain runs there measure the other processes.

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
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


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
    exe = max(neuron_op_executables(args.dir), key=lambda o: len(o.executable)).executable
    pool = concurrent.futures.ThreadPoolExecutor(1)  # loads and calls off the main thread
    alone = pool.submit(native_model.load, exe, 1, "alone").result().model
    calls = {"through TensorFlow": (through_tf, lambda: [v.numpy() for v in fn(**feed).values()]),
             "C runtime, a thread": (alone, lambda: pool.submit(alone.run_list, [x]).result())}
    for _, call in calls.values():
        for _ in range(3):
            call()

    def busy(model) -> int:
        return sum(c[3] for c in model.copies())

    def measure(between: list) -> None:
        wall: dict[str, list[float]] = {k: [] for k in calls}
        inside: dict[str, list[float]] = {k: [] for k in calls}
        switches: dict[str, list[int]] = {k: [] for k in calls}
        for r in range(args.rounds):
            for other in between:
                other()
            for k in (list(calls) if r % 2 else list(calls)[::-1]):
                model, call = calls[k]
                b, c, t = busy(model), context_switches(), time.perf_counter()
                call()
                wall[k].append((time.perf_counter() - t) * 1e3)
                switches[k].append(context_switches() - c)
                inside[k].append((busy(model) - b) / 1e6)
        threads = len(os.listdir("/proc/self/task"))
        print(f"{'':22s} {'wall ms':>8s} {'inside':>8s} {'outside':>8s} {'ctx sw':>7s}"
              f"   ({threads} threads, {len(between)} other models called per round)")
        for k in calls:
            outside = [w - i for w, i in zip(wall[k], inside[k])]
            print(f"{k:22s} {statistics.median(wall[k]):8.2f} "
                  f"{statistics.median(inside[k]):8.2f} {statistics.median(outside):8.2f} "
                  f"{statistics.median(switches[k]):7.0f}", flush=True)

    measure([])
    if args.crowd:
        crowd = [_caller(tf, d, rng) for d in args.crowd]
        for other in crowd:
            for _ in range(3):
                other()
        measure(crowd)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


def _caller(tf: object, directory: str, rng: np.random.Generator) -> object:
    """A call of another compiled SavedModel's serving signature at batch 8."""
    fn = tf.saved_model.load(directory).signatures["serving_default"]
    feed = {k: tf.constant(rng.uniform(0, 255, [8, *s.shape[1:]]).astype(s.dtype.as_numpy_dtype))
            for k, s in fn.structured_input_signature[1].items()}
    return lambda: fn(**feed)


if __name__ == "__main__":
    raise SystemExit(main())
