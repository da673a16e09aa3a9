"""Models with free dimensions other than the batch, compiled in one call, against TensorFlow.

    python benchmarks/free_dims.py                 # BERT and ResNet50
    python benchmarks/free_dims.py --only bert     # or resnet50
    python benchmarks/free_dims.py --only bert --by-kind   # and where each shape's time goes

BERT: a keras_hub `BertBackbone` (4 layers, hidden 256, 4 heads, intermediate 1024,
vocabulary 8192, position table 512) exported with `model.export`, so its three inputs
are `[None, None]`; compiled with no shape arguments; called at (batch, length) (1,7),
(3,16), (2,64), (1,100), (4,128), (1,384), with a padding mask leaving the last quarter of
sample 0 padded. ResNet50: `keras.applications.ResNet50(weights=None, include_top=False,
pooling="avg", input_shape=(None, None, 3))` at sides 97, 160, 224, 288.

Per shape: the first call's latency and where it ran (with the runtime fallback on, the
default, a new shape's first call runs on TensorFlow while the shape compiles in the
background; `NEURONISH_FALLBACK=0` makes it wait for the compile), the seconds until the
shape's executable was ready (the compile, unless the compile cache has it: the script
runs with a fresh cache, NEURONISH_COMPILE_CACHE set to a temporary directory), the max
absolute difference against TensorFlow (of the first call and of a call on the device),
each side's median call time over alternating timed slices and the throughput ratio
(above 1: the compiled model is faster), for BERT's calls of batch > 1 the same call run
as before run-time shapes were compiled at the call's batch (on the shape's batch-1
executable: one program per sample) and how many times slower that is, and the host's
1-minute load average when the shape's timing ended (the machine is shared: a ratio
means little without it). With `--by-kind`, each shape's profiled ms per call by
instruction kind follows its row. At the end: the device memory the op holds with every
shape loaded (NEURONISH_MAX_SHAPES=8) and the fallback calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bert_backbone import print_by_kind, timed_slices  # noqa: E402 (a sibling script)

BERT_SHAPES = ((1, 7), (3, 16), (2, 64), (1, 100), (4, 128), (1, 384))
RESNET_SIDES = (97, 160, 224, 288)


def _bert(target: str) -> None:
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    keras_hub.models.BertBackbone(vocabulary_size=8192, num_layers=4, num_heads=4,
                                  hidden_dim=256, intermediate_dim=1024,
                                  max_sequence_length=512).export(target, verbose=False)


def _resnet(target: str) -> None:
    import keras

    keras.utils.set_random_seed(0)
    keras.applications.ResNet50(weights=None, include_top=False, pooling="avg",
                                input_shape=(None, None, 3)).export(target, verbose=False)


def _bert_feeds(batch: int, length: int) -> dict:
    import tensorflow as tf

    rng = np.random.default_rng(length)
    mask = np.ones((batch, length), np.int32)
    mask[0, length - length // 4:] = 0
    return {"token_ids": tf.constant(rng.integers(0, 8192, (batch, length)), tf.int32),
            "segment_ids": tf.constant(rng.integers(0, 2, (batch, length)), tf.int32),
            "padding_mask": tf.constant(mask)}


def _image_feeds(side: int) -> dict:
    import tensorflow as tf

    rng = np.random.default_rng(side)
    return {"": tf.constant(rng.standard_normal((1, side, side, 3)), tf.float32)}


def _device_bytes() -> int:
    from neuronish.runtime import get_device

    return sum(c["used"] for c in get_device().memory_report().values())


def _load_average() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:  # not Linux
        return "?"


def _one_batch(compiled):
    """`compiled` as it ran before run-time shapes compiled at the call's batch: every
    shape at the op's compiled batch (1), a call of 4 split into four programs."""
    from neuronish import shape_specialize

    def call(**feeds):
        policy = shape_specialize.batch_for
        shape_specialize.batch_for = lambda calls, compiled_batch: compiled_batch
        try:
            return compiled(**feeds)
        finally:
            shape_specialize.batch_for = policy
    return call


def run(name: str, build, shapes, feeds_of, work: str, slices: int, seconds: float,
        by_kind: bool = False) -> None:
    import tensorflow as tf

    import neuronish.saved_model
    from neuronish import fallback
    from neuronish.shape_specialize import wait_for_compiles

    src, out = os.path.join(work, name), os.path.join(work, name + "_neuron")
    build(src)
    start = time.perf_counter()
    report = neuronish.saved_model.compile(src, out)
    print(f"\n{name}: compiled in {time.perf_counter() - start:.1f} s, OnNeuronRatio "
          f"{report['OnNeuronRatio']:.3f}, free dims " + ", ".join(
              f"{d['input']}[{d['axis']}] {d['low']}..{d['high']} (compiled at "
              f"{d['compiled_at']})" for d in report["free_dims"]))
    original = tf.saved_model.load(src).signatures["serving_default"]
    compiled = tf.saved_model.load(out).signatures["serving_default"]
    memory_before = _device_bytes()
    print(f"{'shape':>12} {'first call s':>12} {'on':>6} {'ready s':>7} {'max abs diff':>12} "
          f"{'TF ms':>8} {'neuronish ms':>12} {'ratio':>6} {'batch-1 ms':>10} "
          f"{'one/split':>9} {'load':>5}")
    (key, *_) = original.structured_input_signature[1]
    for shape in shapes:
        feeds = {k or key: v for k, v in feeds_of(*shape).items()}  # "": the only input
        fell_back = sum(c["calls"] for c in fallback.fallback_counts().values())
        t = time.perf_counter()
        got = compiled(**feeds)
        first = time.perf_counter() - t
        where = "tf" if sum(c["calls"] for c in fallback.fallback_counts().values()) > \
            fell_back else "device"
        wait_for_compiles()
        ready = time.perf_counter() - t
        want = original(**feeds)
        diff = max(float(np.max(np.abs(got[k].numpy() - want[k].numpy()))) for k in want)
        got = compiled(**feeds)  # on the device now
        diff = max([diff, *(float(np.max(np.abs(got[k].numpy() - want[k].numpy())))
                            for k in want)])
        fns = {"tf": original, "neuronish": compiled}
        if shape[0] > 1 and name == "bert":  # the same call as batch-1 programs
            fns["split"] = _one_batch(compiled)
            fns["split"](**feeds)
            wait_for_compiles()
        times = timed_slices(fns, feeds, slices, seconds)
        tf_ms, nn_ms = (statistics.median(times[k]) * 1000 for k in ("tf", "neuronish"))
        split = f"{statistics.median(times['split']) * 1000:10.2f} " \
            f"{statistics.median(times['split']) * 1000 / nn_ms:9.2f}" if "split" in times \
            else f"{'-':>10} {'-':>9}"
        print(f"{str(shape):>12} {first:12.2f} {where:>6} {ready:7.2f} {diff:12.2e} "
              f"{tf_ms:8.2f} {nn_ms:12.2f} {tf_ms / nn_ms:6.2f} {split} {_load_average():>5}")
        if by_kind:
            print_by_kind({"neuronish": compiled}, feeds)
    held = _device_bytes() - memory_before
    print(f"device memory held at {len(shapes)} shape(s) (plus the probe's and the batch-1 "
          f"ones of the split column): {held / 2**20:.1f} MiB; fallback calls: "
          f"{fallback.fallback_counts() or 'none'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("bert", "resnet50"))
    p.add_argument("--slices", type=int, default=6)
    p.add_argument("--seconds", type=float, default=0.5, help="per timed slice")
    p.add_argument("--by-kind", action="store_true",
                   help="after each shape, its profiled ms per call by instruction kind")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="neuronish-free-dims-") as work:
        os.environ["NEURONISH_COMPILE_CACHE"] = os.path.join(work, "cache")
        os.environ.setdefault("NEURONISH_MAX_SHAPES", "8")
        if args.only in (None, "bert"):
            run("bert", _bert, BERT_SHAPES, _bert_feeds, work, args.slices, args.seconds,
                args.by_kind)
        if args.only in (None, "resnet50"):
            run("resnet50", _resnet, [(s,) for s in RESNET_SIDES], _image_feeds, work,
                args.slices, args.seconds, args.by_kind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
