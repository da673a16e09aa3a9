"""The native engine of a git ref (engine.cc + spec.py) against this tree's, on the
instructions whose loops engine.cc owns, and on MobileNetV2-sized bf16 and int8
convolutions: one process, alternating, medians.

    python benchmarks/ab_engines.py [--base main] [--threads 1] [--rounds 41] [substring ...]

The base's engine.cc, engine_int8.cc and spec.py are taken with `git show REF:path`; its
engine is built (g++, the same command as runtime/native/library.py) into a temporary
directory and its spec.py loaded beside this tree's, so each side encodes and runs the
instruction the way its own code does. Each case (1M elements; unary, broadcasting
binary and cast over float32, int32, int64, float16 and bool; float32 log-softmax and
int32/bool reductions of a 1024x1024 matrix along either axis; bf16 convolutions, a
depthwise one, a max pool, a squeeze-excite's global mean and multiply, and an int8
convolution with full-range weights, at batch 8 and 112x112, weights constant: the
instructions that compute in float32 where the CPU has no bf16 kernels or no VNNI) becomes
one one-instruction program per side; every round times one call of each, the order
alternating; printed: both medians, new/old, and the geometric mean. Outputs must agree bit
for bit (else it stops), a bf16 mean within a bf16 step (it may sum in another order): a
speed comparison of two encodings of the same results.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neuronish.runtime.native import engine_program, library  # noqa: E402
from neuronish.runtime.program import one_instruction_program  # noqa: E402

N, R, C = 1 << 20, 1024, 1024


Case = tuple[str, dict, list[np.ndarray], list[tuple[tuple[int, ...], str]], frozenset[int]]


def windowed_cases(rng: np.random.Generator) -> list[Case]:
    """MobileNetV2's first block at batch 8 in bf16 (--auto-cast matmult), and an int8
    convolution with full-range weights; the weights are program constants."""
    bf16 = ml_dtypes.bfloat16
    x16 = rng.standard_normal((8, 112, 112, 16)).astype(bf16)
    x96 = rng.standard_normal((8, 112, 112, 96)).astype(bf16)
    x32 = rng.standard_normal((8, 112, 112, 32)).astype(bf16)
    window = {"strides": [1, 1], "dilations": [1, 1], "compute": "bfloat16"}
    u8 = rng.integers(0, 256, (8, 112, 112, 16)).astype(np.uint8)
    x256 = rng.standard_normal((8, 14, 14, 256)).astype(bf16)
    return [
        # ResNet50's conv4 block end: 1x1 to 1024 channels plus the shortcut, then ReLU.
        ("conv2d", {**window, "pads": [0, 0, 0, 0], "activation": "relu", "residual": True},
         [x256, (rng.standard_normal((1, 1, 256, 1024)) * 0.1).astype(bf16),
          rng.standard_normal(1024).astype(np.float32),
          rng.standard_normal((8, 14, 14, 1024)).astype(bf16)],
         [((8, 14, 14, 1024), "bfloat16")], frozenset({1, 2})),
        ("conv2d", {**window, "pads": [0, 0, 0, 0], "activation": "relu"},
         [x16, (rng.standard_normal((1, 1, 16, 96)) * 0.3).astype(bf16),
          rng.standard_normal(96).astype(np.float32)],
         [((8, 112, 112, 96), "bfloat16")], frozenset({1, 2})),
        ("depthwise_conv2d", {**window, "pads": [1, 1, 1, 1], "activation": "relu"},
         [x96, (rng.standard_normal((3, 3, 96, 1)) * 0.3).astype(bf16),
          rng.standard_normal(96).astype(np.float32)],
         [((8, 112, 112, 96), "bfloat16")], frozenset({1, 2})),
        ("pool", {"mode": "max", "ksize": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
         [x96], [((8, 56, 56, 96), "bfloat16")], frozenset()),
        # EfficientNetB0's first squeeze-excite: the global mean and the gate's multiply.
        ("reduce", {"fn": "mean", "axes": [1, 2], "keepdims": True}, [x32],
         [((8, 1, 1, 32), "bfloat16")], frozenset()),
        ("binary", {"fn": "mul", "activation": "none"},
         [x32, rng.uniform(0, 1, (8, 1, 1, 32)).astype(bf16)],
         [((8, 112, 112, 32), "bfloat16")], frozenset()),
        ("binary", {"fn": "add", "activation": "none"},  # one long row, b of a's shape
         [x32.reshape(1, -1), x32.reshape(1, -1)], [((1, 8 * 112 * 112 * 32), "bfloat16")],
         frozenset()),
        ("conv2d_int8", {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0],
                         "x_scale": 0.02, "activation": "relu", "out": "uint8",
                         "y_scale": 0.05},
         [u8, rng.integers(-128, 128, (1, 1, 16, 96)).astype(np.int8),
          rng.uniform(0.001, 0.003, 96).astype(np.float32)],
         [((8, 112, 112, 96), "uint8")], frozenset({1, 2})),
    ]


def cases() -> list[Case]:
    rng = np.random.default_rng(0)
    f32 = (rng.standard_normal(N) * 3).astype(np.float32)
    pos = np.abs(f32) + np.float32(0.1)
    i32 = rng.integers(-1000, 1000, N).astype(np.int32)
    i64, f16, b = i32.astype(np.int64), f32.astype(np.float16), rng.random(N) < 0.5

    def col(x: np.ndarray) -> np.ndarray:
        return x[:R].reshape(R, 1)

    def row(x: np.ndarray) -> np.ndarray:
        return x[:C].reshape(1, C)

    out = [("unary", {"fn": f}, [x], [((N,), x.dtype.name)], frozenset()) for f, x in
           [("erf", f32), ("log", pos), ("softplus", f32), ("floor", f32), ("sign", f32),
            ("round", f32), ("sin", f32), ("round_bf16", f32), ("abs", i32), ("relu", i32),
            ("square", i32), ("logical_not", b)]]
    out += [("binary", {"fn": f}, [col(x), row(y)], [((R, C), od)], frozenset())
            for f, x, y, od in
            [("add", f32, f32, "float32"), ("maximum", f32, f32, "float32"),
             ("pow", pos, f32, "float32"), ("floor_mod", f32, pos, "float32"),
             ("add", i32, i32, "int32"), ("floor_div", i32, i32 | 1, "int32"),
             ("greater", i32, i32, "bool"), ("add", i64, i64, "int64"),
             ("mul", f16, f16, "float16"), ("less", f16, f16, "bool"),
             ("logical_and", b, b, "bool")]]
    out += [("cast", {"to": d}, [x], [((N,), d)], frozenset()) for x, d in
            [(f32, "int32"), (f32, "uint8"), (f32, "bool"), (i64, "float32"), (b, "int32"),
             (i32, "int64"), (f32, "int64")]]
    m32, mb = f32.reshape(R, C), b.reshape(R, C)  # softmax and reductions: either axis
    out += [("softmax", {"axis": a, "log": True}, [m32], [((R, C), "float32")], frozenset())
            for a in (1, 0)]
    out += [("reduce", {"fn": f, "axes": [a]}, [x], [((R, C)[1 - a:][:1], x.dtype.name)],
             frozenset())
            for f, x in [("sum", i32.reshape(R, C)), ("mean", i32.reshape(R, C)),
                         ("max", i32.reshape(R, C)), ("any", mb), ("all", mb)]
            for a in (1, 0)]
    return out + windowed_cases(rng)


def base_engine(ref: str, workdir: Path) -> tuple[ctypes.CDLL, object]:
    """The base's engine library and spec module."""
    native = workdir / "native"
    native.mkdir()
    for name in (*(p.name for p in library.SOURCES), "spec.py"):
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:runtime/native/{name}"],
                               capture_output=True, text=True)
        if shown.returncode == 0:  # (a part the base does not have yet is not included there)
            (native / name).write_text(shown.stdout)
    so = workdir / "engine.so"
    cmd = [str(native / "engine.cc") if a == str(library.SOURCE) else a
           for a in library.build_command(str(so), library.onednn_root())]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(so))
    library._declare(lib)
    spec = importlib.util.spec_from_file_location("neuronish.runtime.native._spec_base",
                                                  native / "spec.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return lib, module


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("only", nargs="*", help="run the cases whose label contains one of these")
    p.add_argument("--base", default="main")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=41)
    args = p.parse_args()
    new_lib, new_encode = library.load(), engine_program.encode
    with tempfile.TemporaryDirectory(prefix="ab-engines-") as tmp:
        old_lib, old_spec = base_engine(args.base, Path(tmp))

    def build(encode: object, lib: ctypes.CDLL, kind: str, attrs: dict, ins: list,
              outs: list, constant: frozenset[int]) -> tuple[object, list]:
        engine_program.encode = encode  # (what NativeProgram.add encodes with)
        try:
            return one_instruction_program(kind, ins, attrs, outs, native=lib,
                                           threads=args.threads, constant=constant)
        finally:
            engine_program.encode = new_encode

    ratios = []
    for kind, attrs, ins, outs, constant in cases():
        axis = attrs.get("axes", [attrs.get("axis")])[0]
        what = attrs.get("fn") or attrs.get("to") or attrs.get("mode") or \
            ("log" if kind == "softmax" else "x".join(map(str, ins[0].shape)))
        label = f"{kind}:{what}" + ("" if axis is None else f"@{axis}") + " " + \
            ",".join(x.dtype.name for x in ins)
        if args.only and not any(s in label for s in args.only):
            continue
        sides = [build(old_spec.encode, old_lib, kind, attrs, ins, outs, constant),
                 build(new_encode, new_lib, kind, attrs, ins, outs, constant)]
        ys = [[np.empty(s, d) for s, d in outs] for _ in sides]
        for (program, call), y in zip(sides, ys):
            if any(st.native is None or st.native.rejected for st in program.stages):
                raise SystemExit(f"{label}: not run natively on one side")
            program.execute(call, y)
        if kind == "reduce" and outs[0][1] == "bfloat16":  # sums in another order: a step
            np.testing.assert_allclose(ys[0][0].astype(np.float32), ys[1][0].astype(np.float32),
                                       rtol=2.0 ** -7, err_msg=label)
        else:
            np.testing.assert_array_equal(ys[0][0], ys[1][0], err_msg=label)
        times: list[list[float]] = [[], []]
        for r in range(args.rounds):
            for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                (program, call), y = sides[k], ys[k]
                start = time.perf_counter()
                program.execute(call, y)
                times[k].append(time.perf_counter() - start)
        old, new = (statistics.median(t) * 1e3 for t in times)
        ratios.append(new / old)
        print(f"{label:34s} {args.base} {old:8.3f} ms  this tree {new:8.3f} ms  "
              f"new/old {new / old:5.2f}", flush=True)
    if ratios:
        print(f"geometric mean new/old {float(np.exp(np.mean(np.log(ratios)))):.3f} "
              f"over {len(ratios)} cases (threads {args.threads}, {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
