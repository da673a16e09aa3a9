"""What loading a compiled SavedModel costs a TensorFlow process: its NeuronOp attributes
(executable and fallback subgraph) inline in saved_model.pb, against in assets/
(neuronish/external.py, `NEURONISH_EXTERNAL_THRESHOLD`).

    python benchmarks/load_memory.py                        # ResNet50, MobileNetV2; bf16
    python benchmarks/load_memory.py --models EfficientNetB0 --precision fp32 --rounds 3

Per model: compiled at the batch once per threshold (`--thresholds`: by default every
attribute in the graph, the old default of 64 MiB, and today's). Then, alternating, each
in a fresh process:
seconds to `tf.saved_model.load` it, seconds for the first call (the NeuronOps load),
resident MiB after three calls, and the process's peak (VmHWM). Medians over the rounds;
MiB are the process's, TensorFlow's own ~600 MiB included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# 1024GiB: no attribute reaches it, so everything stays in saved_model.pb (up to 2 GiB)
THRESHOLDS = ("1024GiB", "64MiB", "default")


def _status_mib(field: str) -> int:
    """VmRSS or VmHWM (the peak, which unlike getrusage's starts afresh at exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) // 1024


def _child(model_dir: str, batch: int) -> None:
    """Loads and calls the model in this process; prints its figures as JSON."""
    import time

    import numpy as np
    import tensorflow as tf

    import neuronish  # noqa: F401  (registers the NeuronOp)

    start = time.perf_counter()
    fn = tf.saved_model.load(model_dir).signatures["serving_default"]
    loaded = time.perf_counter()
    rng = np.random.default_rng(0)
    feeds = {name: tf.constant(rng.uniform(0, 1, (batch, *spec.shape[1:])).astype(
        spec.dtype.as_numpy_dtype)) for name, spec in fn.structured_input_signature[1].items()}
    fn(**feeds)
    called = time.perf_counter()
    for _ in range(2):
        fn(**feeds)
    print(json.dumps({"load_s": loaded - start, "first_call_s": called - loaded,
                      "rss_mib": _status_mib("VmRSS"), "peak_mib": _status_mib("VmHWM")}))


def _compile(model: str, precision: str, batch: int, dst: Path, threshold: str) -> None:
    import peers

    import neuronish.saved_model
    from models.cache import cached_saved_model

    old = os.environ.get("NEURONISH_EXTERNAL_THRESHOLD")
    if threshold == "default":
        os.environ.pop("NEURONISH_EXTERNAL_THRESHOLD", None)
    else:
        os.environ["NEURONISH_EXTERNAL_THRESHOLD"] = threshold
    try:
        neuronish.saved_model.compile(
            cached_saved_model(model), str(dst), batch_size=batch,
            compiler_args=peers.neuronish_flags(precision, peers.cpu_flags()))
    finally:
        if old is None:
            os.environ.pop("NEURONISH_EXTERNAL_THRESHOLD", None)
        else:
            os.environ["NEURONISH_EXTERNAL_THRESHOLD"] = old


def _in_graph_mib(model_dir: Path) -> float:
    return (model_dir / "saved_model.pb").stat().st_size / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["ResNet50", "MobileNetV2"])
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--thresholds", nargs="+", default=list(THRESHOLDS),
                    help="NEURONISH_EXTERNAL_THRESHOLD values; 'default': unset")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.batch)
        return
    print("| model | threshold | saved_model.pb MiB | load s | first call s | resident MiB | "
          "peak MiB |\n|---|---|---|---|---|---|---|")
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="load_memory-") as tmp:
            dirs = {t: Path(tmp) / f"t{k}" for k, t in enumerate(args.thresholds)}
            for threshold, d in dirs.items():
                _compile(model, args.precision, args.batch, d, threshold)
            runs: dict[str, list[dict]] = {k: [] for k in dirs}
            for _ in range(args.rounds):
                for kind, d in dirs.items():
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", str(d), "--batch", str(args.batch)],
                        capture_output=True, text=True, check=True).stdout
                    runs[kind].append(json.loads(out.strip().splitlines()[-1]))
            for kind, d in dirs.items():
                med = {k: statistics.median(r[k] for r in runs[kind]) for k in runs[kind][0]}
                print(f"| {model} {args.precision} b{args.batch} | {kind} | "
                      f"{_in_graph_mib(d):.1f} | {med['load_s']:.2f} | "
                      f"{med['first_call_s']:.2f} | {med['rss_mib']:.0f} | "
                      f"{med['peak_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
