"""How the compiler's front end scales: seconds to parse, lower and batch-check graphs
of 20k and 100k nodes (the pass pipeline is not run; `neuronish-cc compile` times the
whole).

    .venv/bin/python benchmarks/lowering_scale.py                 # 20000 100000
    .venv/bin/python benchmarks/lowering_scale.py --nodes 5000 --graphs relu_chain --profile

Graphs, built as GraphDefs with the compiler's own protobuf module (no TensorFlow):

    relu_chain   x -> Relu -> ... (N Relus), one output
    addn         AddN of N inputs, each x * c_i (N Muls by a constant)
    fusable      N/4 blocks of MatMul -> Mul by a constant -> Add of a constant -> Relu

Printed per graph: wall seconds for `parse_graph_def`, and for `lower` (which includes
the batch-safety check, a second lowering at the compiled batch + 1) with the check's
own share, and the CPU seconds of `lower` (steadier on a shared machine). One run each,
in this process; nothing is asserted; note the load average.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler_scale import FEATURES, GRAPHS  # noqa: E402 (a sibling script: the same graphs)

from cc import lower as lower_mod  # noqa: E402
from cc.graphdef import parse_graph_def  # noqa: E402
from cc.ioconfig import parse_io_config  # noqa: E402
from neuronish.cc.proto import tf_graph_pb2 as pb  # noqa: E402


def measure(graph: pb.GraphDef, profile: bool) -> dict[str, float]:
    """Seconds to parse and to lower `graph` (batch 4, batch axis 0 given), and the
    batch check's share of the lowering."""
    data = graph.SerializeToString()
    io = parse_io_config({"inputs": {"x:0": [[4, FEATURES], "float32", 0]},
                          "outputs": [f"{graph.node[-1].name}:0"]})
    start = time.perf_counter()
    nodes = parse_graph_def(data)
    parsed = time.perf_counter()
    check_seconds = 0.0
    real = lower_mod._batch_problems

    def timed(*args: object, **kwargs: object) -> object:
        nonlocal check_seconds
        t = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            check_seconds += time.perf_counter() - t

    lower_mod._batch_problems = timed
    profiler = cProfile.Profile() if profile else None
    try:
        t = time.perf_counter()
        if profiler:
            profiler.enable()
        cpu = time.process_time()
        lower_mod.lower(nodes, io)
        if profiler:
            profiler.disable()
        lowered = time.perf_counter() - t
        lowered_cpu = time.process_time() - cpu
    finally:
        lower_mod._batch_problems = real
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return {"parse": parsed - start, "lower": lowered, "lower_cpu": lowered_cpu,
            "batch_check": check_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=list(GRAPHS))
    parser.add_argument("--profile", action="store_true", help="print a cProfile of lower")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    for n in args.nodes:
        for name in args.graphs:
            r = measure(GRAPHS[name](n), args.profile)
            print(f"{name:11s} {n:7d} nodes  parse {r['parse']:6.2f} s  lower {r['lower']:6.2f} s"
                  f"  (batch check {r['batch_check']:5.2f} s; lower CPU {r['lower_cpu']:6.2f} s)",
                  flush=True)


if __name__ == "__main__":
    main()
