"""keras.applications models in bf16 (`--auto-cast matmult`) against TensorFlow fp32.

    python benchmarks/bf16_models.py                         # ResNet50 MobileNetV2 EfficientNetB0
    python benchmarks/bf16_models.py ResNet50 --fp32         # also the fp32 compile

Per model (random weights, built once into the model cache as `benchmarks/zoo.py` does),
compiled with `neuronish.saved_model.compile(..., batch_size=8, compiler_args=["--auto-cast",
"matmult"])`; TensorFlow and the compiled model are called alternately in timed slices
(medians), and the compiled outputs are compared with TensorFlow's fp32 outputs (max
|compiled - TF| / max |TF| over all outputs, inputs ~N(0, 1) as the zoo feeds them).
One line per model and precision: throughput ratio vs TF (above 1: faster), both
sides' median ms per call, the error.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bert_backbone import timed_slices  # noqa: E402 (sibling scripts)
from zoo import max_rel_error  # noqa: E402

MODELS = ("ResNet50", "MobileNetV2", "EfficientNetB0")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=list(MODELS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--fp32", action="store_true", help="also compile and time in fp32")
    p.add_argument("--slices", type=int, default=5)
    p.add_argument("--seconds", type=float, default=3.0, help="per slice and side")
    args = p.parse_args()

    import tensorflow as tf

    import neuronish  # noqa: F401 (makes NeuronOp loadable)
    import neuronish.saved_model
    from models import third_party
    from models.cache import cached_saved_model

    settings = ([("fp32", [])] if args.fp32 else []) + [
        ("bf16", ["--auto-cast", "matmult", "--auto-cast-type", "bf16"])]
    for name in args.models:
        src = cached_saved_model(name)
        original = tf.saved_model.load(src).signatures["serving_default"]
        feeds = {k: tf.constant(v) for k, v in
                 third_party.example_inputs(name, original, args.batch, seed=0).items()}
        want = original(**feeds)
        for label, flags in settings:
            with tempfile.TemporaryDirectory(prefix="bf16-models-") as tmp:
                dst = os.path.join(tmp, "compiled")
                neuronish.saved_model.compile(src, dst, batch_size=args.batch,
                                              compiler_args=flags)
                compiled = tf.saved_model.load(dst).signatures["serving_default"]
                error = max_rel_error(compiled(**feeds), want)
                times = timed_slices({"tf": original, "neuronish": compiled}, feeds,
                                     args.slices, args.seconds)
                ratio = statistics.median(t / n for t, n in zip(times["tf"],
                                                                 times["neuronish"]))
                print(f"{name} batch {args.batch} {label}: {ratio:.2f}x TF fp32 "
                      f"(TF {statistics.median(times['tf']) * 1e3:.1f} ms, neuronish "
                      f"{statistics.median(times['neuronish']) * 1e3:.1f} ms per call, "
                      f"median of {args.slices}); max rel error vs TF fp32 {error:.1e}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
