"""How the device's cores share the host's CPUs, measured (docs/performance.md, Threads).

    python benchmarks/threads.py [--model resnet50] [--batch-size 8] [--rounds 9]

1. One call in flight uses every host CPU: the device's time per call with its cores'
   programs on 1 host thread and on all of them (NEURONISH_CORE_THREADS).
2. Concurrent calls never oversubscribe the host: throughput with 1 and with 4 client
   threads calling the same loaded model (2 duplicates) back to back.
3. The device does not slow TensorFlow's own ops around it: TensorFlow's 3x3 conv
   (56x56x64, batch 8) alone, and alternating with device calls in the same process
   (the native engine's OpenMP threads must not spin while TensorFlow computes). The
   same in a child process with OMP_WAIT_POLICY=active, to show what passive buys.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _median_ms(fn, rounds: int) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def tf_alongside_device(rounds: int) -> tuple[float, float]:
    """TF conv ms alone, and when each TF call follows a device call."""
    import tensorflow as tf

    import neuronish.runtime as rt
    from tests.graphs import conv_bn_relu

    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((8, 56, 56, 64), dtype=np.float32))
    w = tf.constant(rng.standard_normal((3, 3, 64, 64), dtype=np.float32))
    conv = tf.function(lambda: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME")))
    from neuronish.cc.compiler import compile_graph

    g = conv_bn_relu(batch=8)
    model = rt.load(compile_graph(g.graph_def, g.io_config))
    feeds = {n: rng.standard_normal(s, dtype=np.float32)
             for n, (s, _) in g.io_config["inputs"].items()}
    alone = _median_ms(lambda: conv().numpy(), rounds)
    times = []
    for _ in range(rounds):
        model.run(feeds)
        start = time.perf_counter()
        conv().numpy()
        times.append(time.perf_counter() - start)
    return alone, statistics.median(times) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--tf-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tf_only:  # the child of part 3
        alone, mixed = tf_alongside_device(args.rounds)
        print(f"{alone} {mixed}")
        return 0

    import neuronish.runtime as rt
    from models.cache import cached_frozen_graph
    from models.freeze import example_inputs
    from neuronish.cc.compiler import compile_graph
    from neuronish.runtime.executable import from_bytes
    from neuronish.runtime.native import engine_name, native_library
    from neuronish.runtime.program import LoadedProgram

    cpus = len(os.sched_getaffinity(0))
    print(f"engine {engine_name()}, {cpus} host CPUs, model {args.model} batch "
          f"{args.batch_size}")
    frozen = cached_frozen_graph(args.model, args.batch_size)
    exe_bytes = compile_graph(frozen.graph_def, frozen.io_config())
    exe = from_bytes(exe_bytes)
    feeds = example_inputs(frozen, args.batch_size, seed=0)
    inputs = [feeds[s.name] for s in exe.inputs]
    outs = [np.empty(s.shape, s.dtype) for s in exe.outputs]

    print("1. one call in flight (ms per call, median):")
    lib = native_library()
    per_threads = {}
    for threads in sorted({1, cpus}):
        program = LoadedProgram(exe, exe.constants, lib, threads)
        per_threads[threads] = _median_ms(lambda p=program: p.execute(inputs, outs),
                                          args.rounds)
        print(f"   {threads} host thread(s): {per_threads[threads]:8.1f} ms")
    if cpus > 1:
        print(f"   all CPUs vs one: {per_threads[1] / per_threads[cpus]:.2f}x faster")

    print("2. concurrent calls (samples/s, 2 duplicates):")
    model = rt.load(exe_bytes, duplicates=2)
    model.run(feeds)
    for clients in (1, 4):
        calls = max(4, args.rounds)
        with ThreadPoolExecutor(clients) as pool:
            start = time.perf_counter()
            list(pool.map(lambda _: model.run(feeds), range(calls * clients)))
            wall = time.perf_counter() - start
        rate = calls * clients * args.batch_size / wall
        print(f"   {clients} client(s): {rate:8.1f} samples/s")
    model.unload()

    print("3. TensorFlow's 3x3 conv alone vs right after a device call (ms, median):")
    for policy in ("passive (default)", "active"):
        env = dict(os.environ)
        if policy == "active":
            env["OMP_WAIT_POLICY"] = "active"
        out = subprocess.run([sys.executable, __file__, "--tf-only", "--rounds",
                              str(args.rounds)], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        alone, mixed = float(out[-2]), float(out[-1])
        print(f"   OMP_WAIT_POLICY {policy}: alone {alone:.2f}, after a device call "
              f"{mixed:.2f} ({mixed / alone:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
