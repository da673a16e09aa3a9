"""Compiled SavedModels of one model (e.g. compiled by main and by a branch) timed on this
process's runtime, calls alternating, so machine noise hits all alike.

    python benchmarks/ab_executables.py OLD_DIR NEW_DIR [--model bert_small_s128] \
        [--batch 8] [--rounds 15] [--calls 5] [--tensorflow]

Each directory is a `neuronish.saved_model.compile` output; its largest NeuronOp
executable is loaded with `neuronish.runtime.load` (no TensorFlow around the call). Inputs:
the model's example inputs (`models/peer_models.py` for the peer BERT, else uniform
[0, 255) floats of the executable's input shapes at the batch). With --tensorflow the
original SavedModel from the model cache alternates too and ratios are against it.
Prints each one's median and best time per call, its speed against the first directory,
and each output's max relative difference from the first's (or from TensorFlow's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _feeds(model: str, sigs: list, batch: int) -> dict[str, np.ndarray]:
    from models import peer_models

    if model in peer_models.BUILDERS:
        return {k + ":0": v for k, v in peer_models.bert_inputs(batch, 0).items()}
    rng = np.random.default_rng(0)
    return {s.name: rng.uniform(0, 255, (batch, *s.shape[1:])).astype(s.dtype) for s in sigs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dirs", nargs="+")
    p.add_argument("--model", default="bert_small_s128", help="for inputs and --tensorflow")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=5, help="calls per turn (median taken)")
    p.add_argument("--tensorflow", action="store_true")
    args = p.parse_args()

    from neuronish.cc.saved_model_executables import neuron_op_executables
    from neuronish.runtime import load

    runners: dict[str, Callable[[], dict]] = {}
    models = {d: load(max(neuron_op_executables(d), key=lambda o: len(o.executable)).executable)
              for d in args.dirs}
    feeds = _feeds(args.model, models[args.dirs[0]].inputs, args.batch)  # (either runtime)
    if args.tensorflow:
        import tensorflow as tf

        from models.cache import cached_saved_model

        sig = tf.saved_model.load(cached_saved_model(args.model)).signatures["serving_default"]
        tf_feeds = {k.removesuffix(":0"): tf.constant(v) for k, v in feeds.items()}
        runners["tensorflow"] = lambda: {k: v.numpy() for k, v in sig(**tf_feeds).items()}
    for d, m in models.items():
        runners[d] = lambda m=m: m.run(feeds)
    outs = {name: fn() for name, fn in runners.items()}
    ref = next(iter(outs.values()))
    for name, got in outs.items():
        diffs = {k: float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30))
                 for (k, g), w in zip(sorted(got.items()), [ref[k] for k in sorted(ref)])}
        print(f"{name}: max rel. difference from {next(iter(outs))}: {diffs}")
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, fn in runners.items():
            turn = []
            for _ in range(args.calls):
                start = time.perf_counter()
                fn()
                turn.append(time.perf_counter() - start)
            times[name].append(statistics.median(turn))
    first = statistics.median(next(iter(times.values())))
    for name, t in times.items():
        print(f"{name:50s} median {statistics.median(t) * 1e3:9.2f} ms  best "
              f"{min(t) * 1e3:9.2f} ms  speed vs first {first / statistics.median(t):.3f}x")
    print(f"load average {os.getloadavg()[0]:.2f} (2-CPU machine: above ~1 the figures are "
          "noisy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
