"""What one call costs around the device's own work, layer by layer, on a tiny model.

    python benchmarks/call_overhead.py [--calls 20000] [--rounds 5]

The tiny MLP of docs/performance.md is compiled and loaded as the NeuronOp kernel
loads it (`kernel_bridge.load`); then, on the same inputs and outputs, the median CPU
time per call (thread time: the machine's other load does not count) of each layer a
NeuronOp call passes through, outermost first:

    kernel_bridge.run    what the NeuronOp's C++ kernel calls (minus its own C++ part),
                         with the cancel flag TensorFlow's calls come with, and without
    Model.run_list       validation, batch handling, profiler hook
    Model._run_one       a program copy from the idle queue, telemetry, the host's CPUs
    LoadedProgram.execute  an arena, binding the call's buffers, the stage loop
    native run           the engine's foreign call alone (ctypes and the kernels)

The differences between rows are what each layer adds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _cpu_us(fn, calls: int, rounds: int) -> float:  # noqa: ANN001
    for _ in range(calls // 20):
        fn()
    times = []
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        times.append((time.thread_time() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()

    from models.cache import cached_frozen_graph
    from neuronish import kernel_bridge
    from neuronish.cc.compiler import compile_graph
    from neuronish.runtime.executable import from_bytes
    from neuronish.runtime.native import engine_name
    from neuronish.runtime.program import _NativeRun

    frozen = cached_frozen_graph("mlp", 1)
    data = compile_graph(frozen.graph_def, frozen.io_config())
    exe = from_bytes(data)
    ins, outs = exe.inputs, exe.outputs
    handle = kernel_bridge.load(
        "mlp", data, [s.name for s in ins], [s.dtype for s in ins], [s.shape for s in ins],
        [s.batch_axis for s in ins], [s.name for s in outs], [s.dtype for s in outs],
        [s.shape for s in outs], [s.batch_axis for s in outs], [])
    model = handle.model
    x = [np.random.default_rng(0).standard_normal(s.shape).astype(s.dtype) for s in ins]
    o = [np.empty(s.shape, s.dtype) for s in outs]
    program = model._idle.get()
    model._idle.put(program)
    stage = program.stages[0]
    runs = [step for step in stage.steps if isinstance(step, _NativeRun)]

    def native_only() -> None:
        for step in runs:
            program._run_native(stage, step, None)

    program.execute(x, o)  # binds the call buffers the native-only row reuses
    rows = [("kernel_bridge.run", lambda: kernel_bridge.run(handle, x, o, bytearray(1))),
            ("  (no cancel flag)", lambda: kernel_bridge.run(handle, x, o)),
            ("Model.run_list", lambda: model.run_list(x, out=o)),
            ("Model._run_one", lambda: model._run_one(x, o)),
            ("LoadedProgram.execute", lambda: program.execute(x, o)),
            ("native run", native_only)]
    print(f"engine {engine_name()}, tiny MLP batch 1, CPU us per call (median of "
          f"{args.rounds} x {args.calls} calls)")
    for name, fn in rows:
        print(f"  {name:24s} {_cpu_us(fn, args.calls, args.rounds):7.1f}")
    handle.unload()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
