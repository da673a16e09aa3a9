"""What recording a timeline costs: calls/s with the profiler off and on, one run.

    python benchmarks/profiler_overhead.py [--models bert_encoder,mobilenet_v2]
                                           [--batch-size 4] [--rounds 9] [--calls 20]

Each model is compiled by `neuronish-cc` and loaded once; rounds of `--calls`
calls alternate between profiler off and on, each first in every other round (so
machine noise and warm-up hit both alike),
and the medians of the rounds' calls/s are compared. Spans recorded in a round
are dropped between rounds, as a long recording would write them out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert_encoder,mobilenet_v2")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args()

    import neuronish.runtime as rt
    from models.cache import cached_frozen_graph
    from neuronish.runtime import profiler

    cc = str(Path(sys.executable).parent / "neuronish-cc")
    results = []
    for name in args.models.split(","):
        frozen = cached_frozen_graph(name, args.batch_size)
        with tempfile.TemporaryDirectory() as tmp:
            graph, out = Path(tmp) / "g.pb", Path(tmp) / "m.neff"
            graph.write_bytes(frozen.graph_def)
            io = {"inputs": {k: [list(s), d] for k, (s, d) in frozen.inputs.items()},
                  "outputs": frozen.outputs}
            subprocess.run([cc, "compile", str(graph), "--framework", "TENSORFLOW",
                            "--io-config", json.dumps(io), "--output", str(out)], check=True)
            model = rt.load(out)
        feeds = {s.name: np.zeros(s.shape, s.dtype) for s in model.inputs}
        for _ in range(3):
            model.run(feeds)
        rates: dict[bool, list[float]] = {False: [], True: []}
        for k in range(args.rounds):
            for on in ((False, True) if k % 2 == 0 else (True, False)):  # neither always first
                if on:
                    profiler.start()
                start = time.perf_counter()
                for _ in range(args.calls):
                    model.run(feeds)
                rates[on].append(args.calls / (time.perf_counter() - start))
                if on:
                    profiler.stop()
        model.unload()
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        results.append({"model": name, "batch": args.batch_size, "engine": model.engine,
                        "off_calls_per_second": off, "on_calls_per_second": on,
                        "on_over_off": on / off})
    print(f"{'model':<14} {'batch':>5} {'engine':>7} {'off calls/s':>12} {'on calls/s':>11} "
          f"{'on/off':>7}")
    for r in results:
        print(f"{r['model']:<14} {r['batch']:>5} {r['engine']:>7} "
              f"{r['off_calls_per_second']:12.1f} {r['on_calls_per_second']:11.1f} "
              f"{r['on_over_off']:7.3f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
