"""Pipeline cores overlap: a 2-stage model on 2 cores vs the same model on 1 core.

    python benchmarks/pipeline.py [--model resnet50] [--batch-size 1] [--in-flight 8]
                                  [--calls 32] [--rounds 5]

Both run with NEURONISH_NUM_CORES=2 and NEURONISH_CORE_THREADS=1 (each simulated core
computes on one host thread, so the host's share per core is fixed): the model
compiled with `--neuroncore-pipeline-cores 2` on a core group of 2, against it
compiled for one core and loaded once on a group of 1 (group sizes `1,1`). Each round
makes `--calls` calls from `--in-flight` client threads, so that many are in flight at
any time; throughput is calls x batch / wall time, median over rounds, measured
alternately. Each round fills and drains the pipeline once; with `--calls` several
times `--in-flight` that weighs little and the round measures the steady state the
modelled throughput (compiled batch / slowest stage) describes; `--calls` equal to
`--in-flight` measures one burst instead. Outputs are checked identical. The device
model's figures for both executables are printed next to the measured ones.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--in-flight", type=int, default=8)
    p.add_argument("--calls", type=int, default=32, help="calls per round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()

    from models.cache import cached_frozen_graph
    from models.freeze import example_inputs
    from neuronish.cc.compiler import compile_graph
    from neuronish.runtime import Device, load
    from neuronish.runtime.config import DeviceConfig
    from neuronish.runtime.executable import from_bytes
    from neuronish.runtime.native import engine_name

    frozen = cached_frozen_graph(args.model, args.batch_size)
    feeds = example_inputs(frozen, args.batch_size, seed=0)
    setups = {}
    for label, cores, groups in (("1 core", 1, "1,1"), ("2-stage pipeline", 2, "2")):
        exe = compile_graph(frozen.graph_def, frozen.io_config(), pipeline_cores=cores)
        device = Device(DeviceConfig.from_env({"NEURONISH_NUM_CORES": "2",
                                               "NEURONISH_CORE_GROUP_SIZES": groups,
                                               "NEURONISH_CORE_THREADS": "1"}))
        modelled = from_bytes(exe).stats["device_model"]
        setups[label] = (load(exe, device=device), modelled, [])
    outs = {label: m.run(feeds) for label, (m, _, _) in setups.items()}
    first, second = outs.values()
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])

    with ThreadPoolExecutor(args.in_flight) as pool:
        for r in range(args.rounds):
            for label in (list(setups) if r % 2 == 0 else list(setups)[::-1]):
                model, _, rates = setups[label]
                start = time.perf_counter()
                list(pool.map(lambda _, m=model: m.run(feeds), range(args.calls)))
                rates.append(args.calls * args.batch_size / (time.perf_counter() - start))
    print(f"model {args.model}, batch {args.batch_size}, {args.in_flight} calls in flight, "
          f"{args.calls} calls per round, engine {engine_name()}, 1 host thread per core; "
          "outputs identical")
    base = statistics.median(setups["1 core"][2])
    base_model = setups["1 core"][1]["throughput_per_second"]
    for label, (model, modelled, rates) in setups.items():
        rate = statistics.median(rates)
        stages = ", ".join(f"{s * 1e3:.3f}" for s in modelled["stage_seconds"])
        print(f"  {label:<18} measured {rate:8.2f} inferences/s ({rate / base:.2f}x)   "
              f"modelled {modelled['throughput_per_second']:10.0f}/s "
              f"({modelled['throughput_per_second'] / base_model:.2f}x; stages ms: {stages})")
        model.unload()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
