"""The same model compiled with different neuronish-cc flags, timed on the device in one run.

    python benchmarks/compare_flags.py resnet50 "" "--disable-pass assign_layouts" \
        [--batch-size 8] [--rounds 9]

Each flag set (one quoted argument each; "" for the defaults) compiles the model's
frozen graph with the real `neuronish-cc` subprocess; the executables are loaded on
this process's engine and called in alternation, so machine noise hits all alike.
Prints each one's median time per call and its speed relative to the first.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("flags", nargs="+", help="one quoted neuronish-cc flag set per executable")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()

    import neuronish.runtime as rt
    from models.cache import cached_frozen_graph
    from models.freeze import example_inputs

    frozen = cached_frozen_graph(args.model, args.batch_size)
    cc = Path(sys.executable).parent / "neuronish-cc"
    models = []
    with tempfile.TemporaryDirectory() as tmp:
        pb = Path(tmp) / "graph.pb"
        pb.write_bytes(frozen.graph_def)
        for k, flags in enumerate(args.flags):
            out = Path(tmp) / f"{k}.neff"
            subprocess.run([str(cc), "compile", str(pb), "--framework", "TENSORFLOW",
                            "--io-config", json.dumps(frozen.io_config()), "--output",
                            str(out), *shlex.split(flags)], check=True)
            models.append(rt.load(out))
    feeds = example_inputs(frozen, args.batch_size, seed=0)
    for m in models:
        m.run(feeds)
    times: list[list[float]] = [[] for _ in models]
    for r in range(args.rounds):
        order = list(range(len(models)))
        for k in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            models[k].run(feeds)
            times[k].append(time.perf_counter() - start)
    first = statistics.median(times[0])
    print(f"model {args.model}, batch {args.batch_size}, {args.rounds} rounds")
    for flags, t in zip(args.flags, times):
        med = statistics.median(t)
        print(f"  {flags or '(defaults)':<40} {med * 1e3:9.1f} ms/call  {first / med:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
