"""Per-call latency of the C runtime against the Python runtime and TensorFlow, one process.

    python benchmarks/capi_call.py [--calls 3000] [--rounds 7] [--model mlp] [--batch 1]

The model (the tiny MLP of docs/performance.md by default, from models/zoo.py) is
compiled by neuronish-cc in-process and loaded twice: on the Python runtime
(`neuronish.runtime`, what the NeuronOp calls today) and on the C runtime
(runtime/capi: nr_execute through ctypes, its arguments built once, so the Python side
of a C call is one foreign call). TensorFlow runs the frozen graph as a tf.function. The
three alternate round by round; each figure is the median over rounds of the mean wall
time per call, and the ratios are against TensorFlow. Outputs are checked equal first.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _per_call_us(fn, calls: int) -> float:  # noqa: ANN001
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--model", default="mlp")
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args()

    import tensorflow as tf

    from models.cache import cached_frozen_graph
    from models.freeze import example_inputs
    from neuronish import runtime
    from neuronish.cc.compiler import compile_graph
    from neuronish.runtime.capi import binding

    frozen = cached_frozen_graph(args.model, args.batch)
    data = compile_graph(frozen.graph_def, frozen.io_config())
    feeds = example_inputs(frozen, args.batch, seed=0)
    xs = [feeds[n] for n in frozen.inputs]

    py = runtime.load(data)
    lib = binding.load_library()
    device = binding.Device(lib)
    model = binding.Model(device, data)
    outs = model.run(xs)
    for got, want in zip(outs, py.run_list(xs)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    ins = (binding.Tensor * len(xs))(*[binding.Model._tensor(x, None) for x in xs])
    out_ts = (binding.Tensor * len(outs))(*[binding.Model._tensor(o, None) for o in outs])
    err = ctypes.create_string_buffer(256)
    execute, handle = lib.nr_execute, model.handle

    def c_call() -> None:
        execute(handle, ins, len(xs), out_ts, len(outs), err, 256)

    tf_fn = frozen.tf_function()
    tf_xs = [tf.constant(x) for x in xs]
    runs = {"tensorflow": lambda: tf_fn(*tf_xs), "python runtime": lambda: py.run_list(xs),
            "c runtime": c_call}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():  # warm up
        _per_call_us(fn, args.calls // 10)
    for _ in range(args.rounds):
        for name, fn in runs.items():
            times[name].append(_per_call_us(fn, args.calls))
    tf_us = statistics.median(times["tensorflow"])
    print(f"{args.model} batch {args.batch}: median of {args.rounds} rounds x {args.calls} "
          f"calls; CPUs {len(os.sched_getaffinity(0))}")
    for name, ts in times.items():
        us = statistics.median(ts)
        print(f"  {name:15s} {us:8.1f} us/call   {us / tf_us:5.2f}x TensorFlow")
    model.unload()
    device.close()
    py.unload()
    return 0


if __name__ == "__main__":
    sys.exit(main())
