"""Latency of the native engine's own loops (engine.cc op codes 20-29, and 50-59: every
dtype) against the numpy reference engine and TensorFlow, one graph per kind, medians of
15 calls in ms.

    PYTHONPATH=. python benchmarks/native_loops.py [substring ...]
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from tests.graphs import trace

RNG = np.random.default_rng(0)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CASES = [
    ("resize bilinear 8x64x64x32 -> 128x128", lambda x: tf.image.resize(x, [128, 128]),
     _f32(8, 64, 64, 32)),
    ("cumsum 64x1024 axis 1", lambda x: tf.math.cumsum(x, axis=1), _f32(64, 1024)),
    ("top_k 64x1000 k 5", lambda x: tf.math.top_k(x, 5).values, _f32(64, 1000)),
    ("argmax 64x1000", lambda x: tf.math.argmax(x, axis=1), _f32(64, 1000)),
    ("argmax 64x30522 (logits)", lambda x: tf.math.argmax(x, axis=1), _f32(64, 30522)),
    ("argmax 1x256x256x21 axis 3 (segmentation)", lambda x: tf.math.argmax(x, axis=3),
     _f32(1, 256, 256, 21)),
    ("argmax 8x512x768 axis 1", lambda x: tf.math.argmax(x, axis=1), _f32(8, 512, 768)),
    ("float16 softmax 64x1000", tf.nn.softmax, _f32(64, 1000).astype(np.float16)),
    ("float16 matmul 256x512 @ 512x512", lambda x: tf.matmul(x, tf.constant(
        _f32(512, 512).astype(np.float16))), _f32(256, 512).astype(np.float16)),
    ("float64 matmul 64x256 @ 256x256", lambda x: tf.matmul(x, tf.constant(
        _f32(256, 256).astype(np.float64))), _f32(64, 256).astype(np.float64)),
    ("float64 erf 64x4096", tf.math.erf, _f32(64, 4096).astype(np.float64)),
    ("int64 floor_div 64x4096", lambda x: tf.math.floordiv(tf.cast(x * 100, tf.int64), 7),
     _f32(64, 4096)),
    ("mirror pad reflect 8x64x64x32", lambda x: tf.pad(
        x, [[0, 0], [3, 3], [3, 3], [0, 0]], mode="REFLECT"), _f32(8, 64, 64, 32)),
    ("conv3d 2x16x32x32x16 k3 -> 32", lambda x: tf.nn.conv3d(
        x, tf.constant(_f32(3, 3, 3, 16, 32)), [1] * 5, "SAME"), _f32(2, 16, 32, 32, 16)),
    ("one_hot 4096 depth 1000", lambda i: tf.one_hot(i, 1000),
     RNG.integers(0, 1000, (4096,)).astype(np.int32)),
]


def _median_ms(fn: Callable[[], object], n: int = 15) -> float:
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(only: list[str]) -> None:
    for name, fn, x in CASES:
        if only and not any(o in name for o in only):
            continue
        g = trace(fn, tf.TensorSpec(x.shape, tf.as_dtype(x.dtype), name="in0"))
        exe = compile_graph(g.graph_def, g.io_config)
        feeds = {"in0:0": x}
        ms = {}
        for engine in ("native", "numpy"):
            os.environ["NEURONISH_ENGINE"] = engine
            with load(exe) as model:
                ms[engine] = _median_ms(lambda m=model, f=feeds: m.run(f))
        tf_fn, xt = tf.function(fn), tf.constant(x)
        ms["tf"] = _median_ms(lambda t=tf_fn, v=xt: t(v).numpy())
        print(f"{name:40s} native {ms['native']:8.3f}  numpy {ms['numpy']:8.3f}  "
              f"TF {ms['tf']:8.3f} ms   numpy/native {ms['numpy'] / ms['native']:5.1f}x  "
              f"TF/native {ms['tf'] / ms['native']:5.2f}x", flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
