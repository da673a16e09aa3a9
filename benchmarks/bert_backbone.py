"""A keras_hub BERT backbone (approximate GELU, as keras_hub builds it) against TensorFlow.

    python benchmarks/bert_backbone.py                       # batch 8, sequence 128
    python benchmarks/bert_backbone.py --auto-cast matmult   # bf16 matrix units
    python benchmarks/bert_backbone.py --profile 12          # and the 12 slowest instructions

Builds `keras_hub.models.BertBackbone` with random weights (default: 4 layers, hidden 256,
4 heads, intermediate 1024, vocabulary 8192: a BERT-small-sized model), exports it with
`model.export`, compiles it with `neuronish.saved_model.compile` at the batch, then calls
TensorFlow and the compiled model alternately in timed slices and prints the median
throughput ratio (above 1: the compiled model is faster), each side's median call time,
and the max relative error of the compiled outputs against TensorFlow's. Scratch files
live in a temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import max_rel_error  # noqa: E402 (a sibling script, found by the line above)

_INPUTS = ("token_ids", "segment_ids", "padding_mask")


def build(target: str, layers: int, hidden: int, heads: int, intermediate: int,
          vocab: int, seq: int) -> None:
    import keras_hub

    model = keras_hub.models.BertBackbone(
        vocabulary_size=vocab, num_layers=layers, num_heads=heads, hidden_dim=hidden,
        intermediate_dim=intermediate, max_sequence_length=seq)
    model.export(target, verbose=False)


def timed_slices(fns: dict[str, object], feeds: dict, slices: int, seconds: float
                 ) -> dict[str, list[float]]:
    """Per function: seconds per call in each slice, the functions taking turns."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for i in range(slices):
        for name in names[i % 2:] + names[:i % 2]:
            calls, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds or calls < 2:
                fns[name](**feeds)
                calls += 1
            out[name].append(elapsed / calls)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--auto-cast", default="none", choices=("none", "matmult", "all"))
    p.add_argument("--slices", type=int, default=7)
    p.add_argument("--seconds", type=float, default=2.0, help="per slice and side")
    p.add_argument("--profile", type=int, default=0, help="print the N slowest instructions")
    p.add_argument("--by-kind", action="store_true",
                   help="print profiled ms per call by instruction kind (and the baseline's)")
    p.add_argument("--baseline-disable", default="", metavar="PASS,...",
                   help="also time a compile with these passes disabled (--disable-pass), "
                        "in the same alternation: what those passes are worth")
    args = p.parse_args()

    import numpy as np
    import tensorflow as tf

    import neuronish  # noqa: F401 (makes NeuronOp loadable)
    import neuronish.saved_model

    with tempfile.TemporaryDirectory(prefix="bert-backbone-") as tmp:
        src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
        build(src, args.layers, args.hidden, args.heads, args.intermediate, args.vocab,
              args.seq)
        compiler_args = ["--auto-cast", args.auto_cast] if args.auto_cast != "none" else []
        shape = (args.batch, args.seq)
        start = time.perf_counter()
        report = neuronish.saved_model.compile(
            src, dst, model_shape_feed_dict={k: list(shape) for k in _INPUTS},
            compiler_args=compiler_args)
        compile_s = time.perf_counter() - start
        original = tf.saved_model.load(src).signatures["serving_default"]
        compiled = tf.saved_model.load(dst).signatures["serving_default"]
        fns = {"tf": original, "neuronish": compiled}
        if args.baseline_disable:
            base_dst = os.path.join(tmp, "baseline")
            disabled = [a for name in args.baseline_disable.split(",")
                        for a in ("--disable-pass", name)]
            neuronish.saved_model.compile(
                src, base_dst, model_shape_feed_dict={k: list(shape) for k in _INPUTS},
                compiler_args=compiler_args + disabled)
            fns["baseline"] = tf.saved_model.load(base_dst).signatures["serving_default"]
        rng = np.random.default_rng(0)
        feeds = {"token_ids": tf.constant(rng.integers(0, args.vocab, shape), tf.int32),
                 "segment_ids": tf.constant(rng.integers(0, 2, shape), tf.int32),
                 "padding_mask": tf.constant(np.ones(shape, np.int32))}
        error = max_rel_error(compiled(**feeds), original(**feeds))
        times = timed_slices(fns, feeds, args.slices, args.seconds)
        ratio = statistics.median(t / n for t, n in zip(times["tf"], times["neuronish"]))
        print(f"BertBackbone layers={args.layers} hidden={args.hidden} heads={args.heads} "
              f"intermediate={args.intermediate} batch={args.batch} seq={args.seq} "
              f"auto-cast={args.auto_cast}")
        print(f"  OnNeuronRatio {report['OnNeuronRatio']:.3f}, compile {compile_s:.1f} s")
        print(f"  TF {statistics.median(times['tf']) * 1e3:.1f} ms/call, neuronish "
              f"{statistics.median(times['neuronish']) * 1e3:.1f} ms/call, "
              f"throughput vs TF {ratio:.2f}x (median of {args.slices} slices)")
        print(f"  max relative error vs TF: {error:.2e}")
        if args.baseline_disable:
            base = times["baseline"]
            gain = statistics.median(b / n for b, n in zip(base, times["neuronish"]))
            base_ratio = statistics.median(t / b for t, b in zip(times["tf"], base))
            print(f"  without {args.baseline_disable}: {statistics.median(base) * 1e3:.1f} "
                  f"ms/call, throughput vs TF {base_ratio:.2f}x; the passes give {gain:.2f}x")
        if args.profile:
            _print_profile(compiled, feeds, args.profile)
        if args.by_kind:
            print_by_kind({k: f for k, f in fns.items() if k != "tf"}, feeds)
    return 0


def print_by_kind(fns: dict[str, object], feeds: dict, calls: int = 5) -> None:
    """Profiled host time per call by instruction kind, side by side (each compiled model
    profiled over `calls` calls, the models taking turns call by call)."""
    from neuronish.runtime import profiler

    totals: dict[str, dict[str, float]] = {name: {} for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            profiler.start()
            try:
                fn(**feeds)
            finally:
                trace = profiler.stop()
            for row in profiler.top_instructions(trace, 1 << 30):
                kind = row["instruction"]
                totals[name][kind] = totals[name].get(kind, 0.0) + row["total_ms"] / calls
    kinds = sorted({k for t in totals.values() for k in t},
                   key=lambda k: -max(t.get(k, 0.0) for t in totals.values()))
    print("  ms per call by instruction kind: " + ", ".join(fns))
    for kind in kinds:
        print(f"    {kind:28s}" + "".join(f"{totals[n].get(kind, 0.0):9.2f}" for n in fns))
    print(f"    {'total':28s}" + "".join(f"{sum(totals[n].values()):9.2f}" for n in fns))


def _print_profile(compiled: object, feeds: dict, top: int) -> None:
    """The slowest instructions of a few profiled calls, with the engine each ran on."""
    from neuronish.profile import format_top
    from neuronish.runtime import profiler

    profiler.start()
    try:
        for _ in range(3):
            compiled(**feeds)
    finally:
        trace = profiler.stop()
    print(format_top(profiler.top_instructions(trace, top)))


if __name__ == "__main__":
    raise SystemExit(main())
