"""3x3 float32 convolutions on the native engine: oneDNN's direct kernel against the
engine's Winograd loop (runtime/native/engine_winograd.cc), one process, alternating,
medians; and each side's error against a float64 reference.

    python benchmarks/winograd.py [--threads 2] [--rounds 21] [--markdown]

Each case (the stride-1 3x3 convolutions of ResNet50, VGG16 and InceptionV3, at batch 1
and 8, with bias and ReLU, weights constant) becomes one one-instruction program per side:
NEURONISH_NATIVE_WINOGRAD=off, then =on (the engine reads it when the instruction is
added). Every round times one call of each, the order alternating. Printed per case: both
medians, direct/Winograd (above 1: Winograd faster), whether the default (auto) takes
Winograd on this CPU, and each side's largest error relative to the largest output.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neuronish.runtime.native import library  # noqa: E402
from neuronish.runtime.program import one_instruction_program  # noqa: E402

# (label, batch, height and width, input channels, output channels)
SHAPES = [
    ("ResNet50 conv2", 56, 64, 64), ("ResNet50 conv3", 28, 128, 128),
    ("ResNet50 conv4", 14, 256, 256), ("ResNet50 conv5", 7, 512, 512),
    ("VGG16 block1", 224, 64, 64), ("VGG16 block3", 56, 256, 256),
    ("InceptionV3 35x35", 35, 64, 96), ("InceptionV3 17x17", 17, 192, 192),
]


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """relu(conv(x, w) + b) in float64, SAME padding: nine shifted matmuls."""
    n, h, wd, _ = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = np.zeros((n, h, wd, w.shape[3]))
    for i in range(3):
        for j in range(3):
            y += xp[:, i:i + h, j:j + wd, :] @ w[i, j].astype(np.float64)
    return np.maximum(y + b, 0.0)


def program(setting: str, x: np.ndarray, w: np.ndarray, b: np.ndarray,
            threads: int) -> tuple[object, list, bool]:
    os.environ["NEURONISH_NATIVE_WINOGRAD"] = setting
    attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1],
             "activation": "relu"}
    prog, call = one_instruction_program("conv2d", [x, w, b], attrs,
                                         [(x.shape[:3] + (w.shape[3],), "float32")],
                                         native=library.load(), threads=threads,
                                         constant=frozenset({1, 2}))
    if any(st.native is None or st.native.rejected for st in prog.stages):
        raise SystemExit(f"not run natively with NEURONISH_NATIVE_WINOGRAD={setting}")
    impls = prog.implementations()
    return prog, call, "neuronish:winograd_conv" in impls.values()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    if library.load() is None:
        raise SystemExit(f"the native engine is not available: {library.why_not()}")
    saved = os.environ.get("NEURONISH_NATIVE_WINOGRAD")
    rng = np.random.default_rng(0)
    rows = []
    for batch in args.batches:
        for label, size, ic, oc in SHAPES:
            x = rng.standard_normal((batch, size, size, ic)).astype(np.float32)
            w = (rng.standard_normal((3, 3, ic, oc)) / np.sqrt(9 * ic)).astype(np.float32)
            b = rng.standard_normal(oc).astype(np.float32)
            os.environ.pop("NEURONISH_NATIVE_WINOGRAD", None)
            _, _, by_default = program("auto", x, w, b, args.threads)
            sides = [program(s, x, w, b, args.threads) for s in ("off", "on")]
            ys = [np.empty((batch, size, size, oc), np.float32) for _ in sides]
            times: list[list[float]] = [[], []]
            for r in range(args.rounds + 1):
                for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                    prog, call, _ = sides[k]
                    start = time.perf_counter()
                    prog.execute(call, [ys[k]])
                    if r:  # (the first round warms both)
                        times[k].append(time.perf_counter() - start)
            want = reference(x, w, b)
            scale = float(np.abs(want).max())
            errs = [float(np.abs(y - want).max()) / scale for y in ys]
            direct, wino = (statistics.median(t) * 1e3 for t in times)
            rows.append((f"{label} {size}x{size}x{ic}->{oc}", batch, direct, wino,
                         direct / wino, by_default, *errs))
            taken = "winograd" if by_default else "direct"
            print(f"{rows[-1][0]:38s} b{batch}: direct {direct:8.3f} ms  winograd "
                  f"{wino:8.3f} ms  {direct / wino:5.2f}x  default {taken}"
                  f"  error {errs[0]:.1e} / {errs[1]:.1e}", flush=True)
    if saved is None:
        os.environ.pop("NEURONISH_NATIVE_WINOGRAD", None)
    else:
        os.environ["NEURONISH_NATIVE_WINOGRAD"] = saved
    if args.markdown:
        print("\n| convolution | batch | direct ms | Winograd ms | speed | default here | "
              "error direct / Winograd |\n|---|---|---|---|---|---|---|")
        for name, batch, d, wg, s, dflt, e0, e1 in rows:
            print(f"| {name} | {batch} | {d:.3f} | {wg:.3f} | {s:.2f}x | "
                  f"{'Winograd' if dflt else 'direct'} | {e0:.1e} / {e1:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
