"""What reading attention's heads through strides saves, instruction by instruction.

    python benchmarks/attention_strides.py                 # BERT-small's shapes, fp32
    python benchmarks/attention_strides.py --heads 8 --head-dim 64 --rounds 21

On the native engine, one layer's scores (q·kᵀ) and context (probabilities·v, heads merged
back) as compiled now — matmuls with perm_a / perm_b / perm_y (cc/passes/matmul_transposes.py)
— against what they were: transpose copies around plain matmuls. Also one reshape copy of
[B, S, H·D], which the memory plan now turns into an alias (cc/memory.py), and the padding
mask's select over the scores (run this under another checkout's venv to compare its
engine's select loop). The variants
take turns, `--calls` calls each per round; prints the median and best ms per variant.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np

from neuronish.runtime.native import library
from neuronish.runtime.program import one_instruction_program

HEADS_SPLIT, KEYS_SPLIT = [0, 2, 1, 3], [0, 2, 3, 1]


def _instruction(lib: object, threads: int, kind: str, inputs: list[np.ndarray], attrs: dict,
                 out_shape: tuple[int, ...]) -> Callable[[], None]:
    program, call_inputs = one_instruction_program(kind, inputs, attrs,
                                                   [(out_shape, "float32")], native=lib,
                                                   threads=threads)
    out = np.empty(out_shape, np.float32)
    assert not any(st.native.rejected for st in program.stages if st.native), kind
    return lambda: program.execute(call_inputs, [out])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=10)
    args = p.parse_args()
    lib = library.load()
    if lib is None:
        raise SystemExit(f"native engine unavailable: {library.why_not()}")
    b, h, s, d = args.batch, args.heads, args.seq, args.head_dim
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, s, h, d)).astype(np.float32)  # a dense's output, heads split
    probs = rng.standard_normal((b, h, s, s)).astype(np.float32)
    split = np.transpose(x, HEADS_SPLIT).copy()
    keys = np.transpose(x, KEYS_SPLIT).copy()
    keep = rng.uniform(size=(b, 1, 1, s)) < 0.8  # the padding mask, as attention reads it

    def one(*spec: object) -> Callable[[], None]:
        return _instruction(lib, args.threads, *spec)  # type: ignore[arg-type]

    variants = {
        "scores, strided": [one("matmul", [x, x], {"perm_a": HEADS_SPLIT,
                                                   "perm_b": KEYS_SPLIT}, (b, h, s, s))],
        "scores, 2 transposes": [one("transpose", [x], {"perm": HEADS_SPLIT}, (b, h, s, d)),
                                 one("transpose", [x], {"perm": KEYS_SPLIT}, (b, h, d, s)),
                                 one("matmul", [split, keys], {}, (b, h, s, s))],
        "context, strided": [one("matmul", [probs, x], {"perm_b": HEADS_SPLIT,
                                                        "perm_y": HEADS_SPLIT}, (b, s, h, d))],
        "context, 2 transposes": [one("transpose", [x], {"perm": HEADS_SPLIT}, (b, h, s, d)),
                                  one("matmul", [probs, split], {}, (b, h, s, d)),
                                  one("transpose", [split], {"perm": HEADS_SPLIT}, (b, s, h, d))],
        "reshape copy": [one("reshape", [x], {"shape": [b, s, h * d]}, (b, s, h * d))],
        "mask select": [one("select", [keep, probs, np.array(-1e9, np.float32)], {},
                            (b, h, s, s))],
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, steps in variants.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                for step in steps:
                    step()
            times[name].append((time.perf_counter() - start) / args.calls * 1e3)
    print(f"batch {b}, seq {s}, heads {h}, head dim {d}, {args.threads} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    for name, ts in times.items():
        print(f"  {name:24s} median {np.median(ts):7.3f} ms   best {min(ts):7.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
