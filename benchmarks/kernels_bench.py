"""Device conv/pool instructions vs TensorFlow on ResNet50's layer shapes (batch 8).

Also ResNet50's max pool and a few MobileNet depthwise layers.

    python benchmarks/kernels_bench.py [--batch-size 8] [--rounds 7]
                                       [--engine native|numpy] [--compute bfloat16]

Each instruction runs as a one-instruction program loaded on the device's engine
(weights reordered at load, as in a compiled model). Each line: its median time,
TF's (a tf.function of the same op with bias-add + relu, which TF fuses into its
conv), and their ratio (TF time / ours; higher is better, 1.0 = parity). Calls
alternate between the two so machine noise hits both alike. `--compute bfloat16`
runs the convolutions from bf16 operands (as `--auto-cast matmult`) against TF's
float32.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--engine", choices=["native", "numpy"], default="native")
    p.add_argument("--compute", choices=["float32", "bfloat16", "float16"], default="float32")
    args = p.parse_args()

    import tensorflow as tf

    from neuronish.runtime import get_device
    from neuronish.runtime.native import library
    from neuronish.runtime.program import one_instruction_program

    native = library.load() if args.engine == "native" else None
    if args.engine == "native" and native is None:
        raise SystemExit(f"native engine unavailable: {library.why_not()}")
    threads = get_device().config.core_threads

    n = args.batch_size
    rng = np.random.default_rng(0)

    def same(size: int, k: int, s: int) -> list[int]:
        total = max((-(-size // s) - 1) * s + k - size, 0)
        return [total // 2, total - total // 2]

    cases = []  # (name, kind, inputs, attrs, TF function of the same inputs)
    # (name, x shape, w shape, stride, TF padding)
    for name, xs, ws, s, padding in [
        ("stem 7x7/2", (n, 224, 224, 3), (7, 7, 3, 64), 2, "SAME"),
        ("1x1 56 64->64", (n, 56, 56, 64), (1, 1, 64, 64), 1, "VALID"),
        ("3x3 56 64->64", (n, 56, 56, 64), (3, 3, 64, 64), 1, "SAME"),
        ("1x1 56 64->256", (n, 56, 56, 64), (1, 1, 64, 256), 1, "VALID"),
        ("1x1 56 256->64", (n, 56, 56, 256), (1, 1, 256, 64), 1, "VALID"),
        ("1x1/2 56 256->128", (n, 56, 56, 256), (1, 1, 256, 128), 2, "VALID"),
        ("3x3 28 128->128", (n, 28, 28, 128), (3, 3, 128, 128), 1, "SAME"),
        ("1x1 28 512->128", (n, 28, 28, 512), (1, 1, 512, 128), 1, "VALID"),
        ("3x3 14 256->256", (n, 14, 14, 256), (3, 3, 256, 256), 1, "SAME"),
        ("1x1 14 1024->256", (n, 14, 14, 1024), (1, 1, 1024, 256), 1, "VALID"),
        ("3x3 7 512->512", (n, 7, 7, 512), (3, 3, 512, 512), 1, "SAME"),
        ("1x1 7 512->2048", (n, 7, 7, 512), (1, 1, 512, 2048), 1, "VALID"),
        ("dw 3x3 112 x32", (n, 112, 112, 32), (3, 3, 32, 1), 1, "SAME"),
        ("dw 3x3/2 112 x96", (n, 112, 112, 96), (3, 3, 96, 1), 2, "SAME"),
        ("dw 3x3 14 x512", (n, 14, 14, 512), (3, 3, 512, 1), 1, "SAME"),
    ]:
        depthwise = name.startswith("dw")
        inputs = [rng.standard_normal(xs, dtype=np.float32),
                  rng.standard_normal(ws, dtype=np.float32),
                  rng.standard_normal(ws[3] * (ws[2] if depthwise else 1), dtype=np.float32)]
        pads = same(xs[1], ws[0], s) + same(xs[2], ws[1], s) if padding == "SAME" else [0] * 4
        attrs = {"strides": [s, s], "dilations": [1, 1], "pads": pads, "activation": "relu"}
        if args.compute != "float32":
            attrs["compute"] = args.compute
        if depthwise:
            def op(x, w, b, s=s, p=padding):
                return tf.nn.relu(tf.nn.bias_add(tf.nn.depthwise_conv2d(x, w, [1, s, s, 1], p),
                                                 b))
        else:
            def op(x, w, b, s=s, p=padding):
                return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, s, p), b))
        cases.append((name, "depthwise_conv2d" if depthwise else "conv2d", inputs, attrs, op))
    cases.append(("maxpool 3x3/2 112", "pool",
                  [rng.standard_normal((n, 112, 112, 64), dtype=np.float32)],
                  {"mode": "max", "ksize": [3, 3], "strides": [2, 2],
                   "pads": same(112, 3, 2) * 2},
                  lambda x: tf.nn.max_pool2d(x, 3, 2, "SAME")))

    total_ours = total_tf = 0.0
    print(f"{'layer':<20}{'ours ms':>9}{'tf ms':>9}{'tf/ours':>9}")
    for name, kind, inputs, attrs, op in cases:
        tf_fn = tf.function(op)
        tf_args = [tf.constant(x) for x in inputs]
        want = tf_fn(*tf_args).numpy()
        y = np.empty_like(want)
        weights = inputs[:]
        if attrs.get("compute"):
            weights[1] = inputs[1].astype(attrs["compute"])
        program, call = one_instruction_program(
            kind, weights, attrs, [(want.shape, "float32")],
            constant=frozenset({1, 2}) if kind != "pool" else frozenset(), native=native,
            threads=threads)

        def ours() -> None:
            program.execute(call, [y])  # noqa: B023 (called in this iteration)

        def theirs() -> None:
            tf_fn(*tf_args).numpy()  # noqa: B023

        ours()
        if attrs.get("compute"):  # 16-bit operands: about 2^-9 of the output's scale
            assert np.abs(y - want).max() <= 1e-2 * np.abs(want).max(), name
        else:
            np.testing.assert_allclose(y, want, rtol=1e-3, atol=1e-2)
        times: dict[str, list[float]] = {"ours": [], "tf": []}
        for r in range(args.rounds):
            order = [("ours", ours), ("tf", theirs)]
            for key, fn in order if r % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - start)
        t_ours, t_tf = (statistics.median(times[key]) * 1e3 for key in ("ours", "tf"))
        total_ours += t_ours
        total_tf += t_tf
        print(f"{name:<20}{t_ours:9.2f}{t_tf:9.2f}{t_tf / t_ours:9.2f}", flush=True)
    print(f"{'sum':<20}{total_ours:9.2f}{total_tf:9.2f}{total_tf / total_ours:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
