"""Error, size and speed of `--auto-cast`, per zoo model, against TensorFlow float32.

    python benchmarks/auto_cast_error.py [--speed] [mlp small_cnn bert_encoder resnet50 ...]

Prints, per model, mode and cast type, the max absolute error of each output
relative to that output's max absolute value (batch 4, fixed seeds), the
executable's size, and with `--speed` the device's median time per call at that
batch (the model loaded on this process's engine; calls of all modes alternate).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str]) -> int:
    import statistics
    import time

    import neuronish.runtime as rt
    from models.cache import cached_frozen_graph
    from models.freeze import example_inputs
    from neuronish.cc.compiler import compile_graph

    speed = "--speed" in argv
    names = [a for a in argv if a != "--speed"]
    print(f"{'model':<14}{'mode':<9}{'type':<6}{'exe MiB':>8}{'ms/call':>9}  "
          "max relative error per output")
    for name in names or ["mlp", "small_cnn", "bert_encoder", "mobilenet_v2", "resnet50"]:
        frozen = cached_frozen_graph(name, 4)
        feeds = example_inputs(frozen, 4, seed=0)
        want = frozen.run_tf(feeds)
        rows = []
        for mode, cast in [("none", "bf16"), ("matmult", "bf16"), ("matmult", "fp16"),
                           ("all", "bf16"), ("all", "fp16")]:
            exe = compile_graph(frozen.graph_def, frozen.io_config(), auto_cast=mode,
                                auto_cast_type=cast)
            model = rt.load(exe)
            got = model.run(feeds)
            errs = [float(np.max(np.abs(got[k] - want[k])) / np.max(np.abs(want[k])))
                    for k in frozen.outputs]
            rows.append((mode, cast, len(exe), model, errs, []))
        for _ in range(9 if speed else 0):  # alternate the modes so noise hits all alike
            for *_, model, _, times in rows:
                start = time.perf_counter()
                model.run(feeds)
                times.append(time.perf_counter() - start)
        for mode, cast, size, model, errs, times in rows:
            ms = f"{statistics.median(times) * 1e3:9.2f}" if times else f"{'-':>9}"
            print(f"{name:<14}{mode:<9}{cast if mode != 'none' else '-':<6}"
                  f"{size / 2**20:8.2f}{ms}  " + "  ".join(f"{e:.1e}" for e in errs))
            model.unload()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
