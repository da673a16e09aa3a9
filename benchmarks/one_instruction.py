"""One device instruction on the numpy reference engine and on the native engine, as a
one-instruction program (no TensorFlow graph around it): medians of 15 calls.

    PYTHONPATH=. python benchmarks/one_instruction.py [substring ...]

For kernels whose speed depends on the shape (argmax's contiguous, strided and short-row
paths) and for dtypes the native engine took over from numpy (float16 pooling and
activations). benchmarks/native_loops.py times whole graphs against TensorFlow.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from neuronish.runtime.native import library
from neuronish.runtime.program import one_instruction_program

RNG = np.random.default_rng(0)


def _argmax(shape: tuple[int, ...], axis: int) -> tuple:
    out = tuple(d for i, d in enumerate(shape) if i != axis)
    return (f"argmax {'x'.join(map(str, shape))} axis {axis}", "argminmax",
            [RNG.standard_normal(shape).astype(np.float32)],
            {"fn": "argmax", "axis": axis, "to": "int64"}, [(out, "int64")])


CASES = [
    _argmax((8, 1000), 1), _argmax((64, 30522), 1), _argmax((1, 256, 256, 21), 3),
    _argmax((32, 128, 64), 1), _argmax((8, 512, 768), 1), _argmax((4096, 8), 1),
    _argmax((100000, 3), 0),
    ("float16 max pool 8x56x56x64 3x3/2", "pool",
     [RNG.standard_normal((8, 56, 56, 64)).astype(np.float16)],
     {"mode": "max", "ksize": [3, 3], "strides": [2, 2], "pads": [0, 1, 0, 1]},
     [((8, 28, 28, 64), "float16")]),
    # Keras' Normalization on an RGB image: vectors over 3 channels (rows regrouped)
    ("binary x - v[3] 8x224x224x3", "binary",
     [RNG.standard_normal((8, 224, 224, 3)).astype(np.float32),
      RNG.standard_normal(3).astype(np.float32)], {"fn": "sub"}, [((8, 224, 224, 3), "float32")]),
    ("binary x * s[3] + o[3] 8x224x224x3", "binary",
     [RNG.standard_normal((8, 224, 224, 3)).astype(np.float32),
      RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)],
     {"fn": "mul"}, [((8, 224, 224, 3), "float32")]),
    ("float16 gelu_tanh 8x128x768", "unary",
     [RNG.standard_normal((8, 128, 768)).astype(np.float16)], {"fn": "gelu_tanh"},
     [((8, 128, 768), "float16")]),
]


def _median_ms(fn: object, n: int = 15) -> float:
    fn()  # type: ignore[operator]
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(only: list[str]) -> None:
    lib = library.load()
    assert lib is not None, library.why_not()
    for name, kind, inputs, attrs, out_types in CASES:
        if only and not any(o in name for o in only):
            continue
        ms, got = {}, {}
        for engine in ("numpy", "native"):
            program, call = one_instruction_program(
                kind, inputs, attrs, out_types, native=lib if engine == "native" else None,
                threads=2)
            outs = [np.empty(shape, dtype) for shape, dtype in out_types]
            ms[engine] = _median_ms(lambda p=program, c=call, o=outs: p.execute(c, o))
            got[engine] = outs[0]
            if engine == "native":
                assert not any(st.native.rejected for st in program.stages if st.native)
        np.testing.assert_allclose(got["native"].astype(np.float64),
                                   got["numpy"].astype(np.float64), rtol=2e-3, atol=2e-3)
        print(f"{name:40s} numpy {ms['numpy']:9.3f}  native {ms['native']:9.3f} ms   "
              f"numpy/native {ms['numpy'] / ms['native']:6.2f}x", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
