"""Compiled executables on the runtime alone (no TensorFlow call in the process) against
OpenVINO, calls alternating in one process, medians.

    python benchmarks/runtime_vs_openvino.py MODEL PRECISION DIR [DIR ...] [--rounds 11]
        [--one-thread]

Each DIR is a `neuronish.saved_model.compile` output of MODEL (a `models.cache` name) at
batch 8; its largest NeuronOp executable is loaded with `neuronish.runtime.load`.
OpenVINO converts the same SavedModel (`ov.convert_model`, PERFORMANCE_HINT LATENCY,
INFERENCE_PRECISION_HINT f32 or bf16 for PRECISION fp32 or bf16). Inputs: uniform
[0, 255) floats. Prints each one's median and best wall time per call and its speed
against OpenVINO. --one-thread runs both on one thread and times process CPU, which
other processes' load barely moves (a measure of work, not of threading).

Unlike benchmarks/peers.py no TensorFlow call runs between the contenders: its threads,
still spinning after its own call, do not land in the next contender's time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("precision", choices=["fp32", "bf16"])
    p.add_argument("dirs", nargs="+")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--one-thread", action="store_true")
    args = p.parse_args()
    if args.one_thread:
        os.environ["NEURONISH_KERNEL_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"
    import openvino as ov

    from models.cache import cached_saved_model
    from neuronish.cc.saved_model_executables import neuron_op_executables
    from neuronish.runtime import load

    models = {d: load(max(neuron_op_executables(d), key=lambda o: len(o.executable)).executable)
              for d in args.dirs}
    rng = np.random.default_rng(0)
    first = models[args.dirs[0]]
    feeds = {s.name: rng.uniform(0, 255, (args.batch, *s.shape[1:])).astype(s.dtype)
             for s in first.inputs}  # (either runtime)
    by_name = {k.removesuffix(":0"): v for k, v in feeds.items()}
    ov_model = ov.convert_model(cached_saved_model(args.model))
    ov_model.reshape({i.get_any_name(): list(by_name[i.get_any_name()].shape)
                      for i in ov_model.inputs})
    config = {"PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_PRECISION_HINT": {"fp32": "f32", "bf16": "bf16"}[args.precision]}
    if args.one_thread:
        config["INFERENCE_NUM_THREADS"] = "1"
    request = ov.Core().compile_model(ov_model, "CPU", config).create_infer_request()
    ov_in = {i.get_any_name(): by_name[i.get_any_name()] for i in ov_model.inputs}
    runs = {"openvino": lambda: request.infer(ov_in)}
    runs.update({d: (lambda m=m: m.run(feeds)) for d, m in models.items()})
    want = np.asarray(next(iter(request.infer(ov_in).values())))
    for d, m in models.items():
        got = next(iter(m.run(feeds).values()))
        print(f"{d}: max rel. difference from OpenVINO "
              f"{np.max(np.abs(got - want)) / np.max(np.abs(want)):.1e}")
    clock = time.process_time if args.one_thread else time.perf_counter
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    base = statistics.median(times["openvino"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:45s} median {1e3 * med:8.2f} ms  best {1e3 * min(ts):8.2f} ms  "
              f"vs OpenVINO {base / med:.3f}x")
    print(f"{'process CPU' if args.one_thread else 'wall'} time; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
