"""Modelled device time next to measured host time, per model (docs/device-model.md).

    python benchmarks/device_model.py [--models resnet50,mobilenet_v2,bert_encoder]
                                      [--batch-size 1] [--rounds 10] [--auto-cast none]

For each zoo model: the frozen graph is compiled by `neuronish-cc` (a real
subprocess, default device model unless NEURONISH_DEVICE_MODEL is set), the
modelled latency and throughput are read from the executable, and the same
executable is run on this host's simulated device (median of --rounds calls
after warm-up). The two columns answer different questions: the modelled one
what the accelerator described would take, the measured one what this host's
CPUs take to simulate it. Neither predicts the other.
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
    p.add_argument("--models", default="resnet50,mobilenet_v2,bert_encoder")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--auto-cast", default="none", choices=["none", "matmult", "all"])
    args = p.parse_args()

    import neuronish.runtime as rt
    from models.cache import cached_frozen_graph

    cc = str(Path(sys.executable).parent / "neuronish-cc")
    rows = []
    for name in args.models.split(","):
        frozen = cached_frozen_graph(name, args.batch_size)
        with tempfile.TemporaryDirectory() as tmp:
            graph, out = Path(tmp) / "g.pb", Path(tmp) / "m.neff"
            graph.write_bytes(frozen.graph_def)
            io = {"inputs": {k: [list(s), d] for k, (s, d) in frozen.inputs.items()},
                  "outputs": frozen.outputs}
            subprocess.run([cc, "compile", str(graph), "--framework", "TENSORFLOW",
                            "--io-config", json.dumps(io), "--output", str(out),
                            "--auto-cast", args.auto_cast], check=True)
            info = json.loads(subprocess.run([cc, "inspect", str(out), "--json"], check=True,
                                             capture_output=True, text=True).stdout)
            model = rt.load(out)
        rng = np.random.default_rng(0)
        feeds = {s.name: (rng.standard_normal(s.shape).astype(s.dtype) if s.dtype.startswith(
            "float") else np.zeros(s.shape, s.dtype)) for s in model.inputs}
        for _ in range(args.warmup):
            model.run(feeds)
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            model.run(feeds)
            times.append(time.perf_counter() - start)
        model.unload()
        measured = statistics.median(times)
        m = info["modelled"]
        rows.append({"model": name, "batch": args.batch_size, "auto_cast": args.auto_cast,
                     "modelled_ms": m["latency_seconds"] * 1e3,
                     "modelled_per_second": m["throughput_per_second"],
                     "measured_ms": measured * 1e3,
                     "measured_per_second": args.batch_size / measured,
                     "device": m["device"]})
    print(f"{'model':<14} {'batch':>5} {'modelled ms':>12} {'modelled inf/s':>15} "
          f"{'measured ms':>12} {'measured inf/s':>15}")
    for r in rows:
        print(f"{r['model']:<14} {r['batch']:>5} {r['modelled_ms']:12.3f} "
              f"{r['modelled_per_second']:15,.0f} {r['measured_ms']:12.1f} "
              f"{r['measured_per_second']:15,.1f}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
