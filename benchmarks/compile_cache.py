"""How long a second compile of the same model takes with the compile cache, and where
the time goes.

    .venv/bin/python benchmarks/compile_cache.py [--model resnet50] [--batch-size 1]

Compiles the model twice into a fresh cache (a temporary NEURONISH_COMPILE_CACHE),
then prints, for each compile, the cache's hits and misses and the seconds spent
in each stage: freezing (TensorFlow loads the SavedModel and folds its variables
into constants), partitioning, compiling (neuronish-cc processes, or cache
lookups), splicing and writing the SavedModel (tf.saved_model.save). "neuronish's
own time" is the total less the two TensorFlow stages (freeze, export).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=1)
    args = p.parse_args()

    from models.cache import cached_saved_model

    src = cached_saved_model(args.model)
    import neuronish.saved_model as sm

    stages = {"freeze": "freeze_signature", "partition": "partition",
              "compile (cc or cache)": "compile_with_cache", "export": "write_saved_model"}
    seconds: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)  # process CPU time: less shaken by a busy host

    def timed(stage: str, fn):  # noqa: ANN001, ANN202
        @functools.wraps(fn)
        def wrapper(*a, **k):  # noqa: ANN002, ANN003, ANN202
            start, start_cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                seconds[stage] += time.perf_counter() - start
                cpu[stage] += time.process_time() - start_cpu
        return wrapper

    for stage, name in stages.items():
        setattr(sm, name, timed(stage, getattr(sm, name)))

    with tempfile.TemporaryDirectory(prefix="neuronish-cache-bench-") as tmp:
        os.environ["NEURONISH_COMPILE_CACHE"] = str(Path(tmp) / "cache")
        for run in ("first", "second"):
            seconds.clear()
            cpu.clear()
            start, start_cpu = time.perf_counter(), time.process_time()
            report = sm.compile(src, str(Path(tmp) / run), batch_size=args.batch_size)
            total = time.perf_counter() - start
            total_cpu = time.process_time() - start_cpu
            own = total - seconds["freeze"] - seconds["export"]
            own_cpu = total_cpu - cpu["freeze"] - cpu["export"]
            cache = report["compile_cache"]
            print(f"{args.model} batch {args.batch_size}, {run} compile: {total:.2f} s total, "
                  f"{own:.2f} s neuronish's own (total - freeze - export; CPU {own_cpu:.2f} s); "
                  "cache "
                  f"{cache['hits']} hit(s), {cache['misses']} miss(es); "
                  f"{len(report['NeuronOps'])} NeuronOp(s), OnNeuronRatio "
                  f"{report['OnNeuronRatio']}")
            print("    wall: " + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items()))
            print("    CPU:  " + ", ".join(f"{k} {v:.2f} s" for k, v in cpu.items()))
        print(f"load average while measuring: {os.getloadavg()[0]:.1f} "
              f"({os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
