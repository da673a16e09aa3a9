"""Compile time of a model the partitioner must partition again: the compiler's batch check
(cc/batch.py) refuses a cumulative sum over the batch, which then stays on TensorFlow.

    .venv/bin/python benchmarks/recovery_rounds.py             # ResNet50 body + cumsum(x, 0)
    .venv/bin/python benchmarks/recovery_rounds.py --small     # three dense layers instead

The model (random weights, built in a temporary directory) is compiled once with the
compile cache off, at batch 2 with a dynamic batch. Printed: the end-to-end seconds, the
`partition` calls (one per round) and their seconds, TensorFlow shape inferences
(`shapes.infer`, each an import of the whole graph) and their seconds, OnNeuronRatio,
and the load average. Nothing is asserted: compare runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from collections import defaultdict


def build(export_dir: str, small: bool) -> None:
    import tensorflow as tf

    if small:
        weight = tf.Variable(tf.random.stateless_normal([64, 64], seed=[1, 2]))

        def body(x: tf.Tensor) -> tf.Tensor:
            h = tf.nn.relu(tf.matmul(x, weight))
            return tf.nn.relu(tf.matmul(h, weight)) + 1.0

        spec = tf.TensorSpec([None, 64], tf.float32, name="x")
    else:
        net = tf.keras.applications.ResNet50(weights=None, include_top=False, pooling="avg",
                                             input_shape=(224, 224, 3))

        def body(x: tf.Tensor) -> tf.Tensor:
            return net(x, training=False)

        spec = tf.TensorSpec([None, 224, 224, 3], tf.float32, name="x")

    module = tf.Module()
    module.variables_owner = weight if small else net  # saved with the module

    @tf.function(input_signature=[spec])
    def serve(x: tf.Tensor) -> tf.Tensor:
        features = body(x)
        # Sums over the batch: the device must not run it, or a call of another batch
        # size would give other numbers; the rest is per sample.
        return tf.cumsum(features, 0) + tf.tanh(features)

    module.serve = serve
    tf.saved_model.save(module, export_dir, signatures=serve)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="three dense layers, not ResNet50")
    args = p.parse_args(argv)
    os.environ["NEURONISH_COMPILE_CACHE"] = "off"
    import neuronish.partition as partition_package
    import neuronish.saved_model as sm
    import neuronish.shape_inference.shapes as shapes

    calls: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)

    def counted(module: object, name: str, key: str) -> None:
        fn = getattr(module, name)

        @functools.wraps(fn)
        def wrapper(*a, **k):  # noqa: ANN002, ANN003, ANN202
            calls[key] += 1
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[key] += time.perf_counter() - start
        setattr(module, name, wrapper)

    counted(shapes, "infer", "infer")  # batch_axes' own call
    counted(partition_package, "infer", "infer")
    counted(sm, "partition", "partition")
    with tempfile.TemporaryDirectory(prefix="neuronish-recovery-rounds-") as tmp:
        build(os.path.join(tmp, "model"), args.small)
        load = os.getloadavg()[0]
        start = time.perf_counter()
        report = sm.compile(os.path.join(tmp, "model"), os.path.join(tmp, "compiled"),
                            batch_size=2)
        total = time.perf_counter() - start
    print(json.dumps({
        "model": "dense+cumsum" if args.small else "ResNet50+cumsum", "total_s": round(total, 2),
        "partition_calls": calls["partition"], "partition_s": round(seconds["partition"], 2),
        "infer_calls": calls["infer"], "infer_s": round(seconds["infer"], 2),
        "OnNeuronRatio": report.get("OnNeuronRatio"),
        "load": [round(load, 1), round(os.getloadavg()[0], 1)], "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
