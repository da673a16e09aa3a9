"""Where the time of `neuronish.saved_model.compile` goes, stage by stage.

    .venv/bin/python benchmarks/compile_time.py                      # ResNet50 VGG16 NASNetMobile
    .venv/bin/python benchmarks/compile_time.py ConvNeXtLarge --batch-size 1
    PYTHONPATH=. .venv/bin/python -c \
        "from benchmarks.recovery_rounds import build; build('DIR', False)"
    .venv/bin/python benchmarks/compile_time.py DIR --batch-size 2  # partitioned again

Each model (a zoo name: `models/third_party.py`, built once into the model cache, or a
SavedModel directory) is compiled once in its own process, with the compile cache off,
as a new user would: `compile(src, dst, batch_size=B)` on a `model.export`ed SavedModel.
Printed per model: the end-to-end seconds and the wall seconds of each stage,

    freeze      tf.saved_model.load + variables to constants + inlining (TensorFlow's)
    rewrite     before partitioning: constants folded, fixed loops unrolled, complex
                values as real pairs (neuronish/rewrites/rewrite.py)
    support     `neuronish-cc list-operators --check`: what the compiler would refuse
    partition   shape inference, mark, cluster, encapsulate (large constants held back)
    neuronish-cc  the compiler processes (of which `in cc` is its own compile_graph
                time from the executables' stats; the rest is its start, mapping
                the GraphDef and writing the executable)
    read exe    parsing the executables (signature, cores, modelled figures; the
                checksum reads every byte)
    splice      NeuronOps into the outer graph
    export      tf.saved_model.save; executables and subgraphs linked into assets/
    other       the rest: input shapes, writing each subgraph's file (its weights),
                the report

and the machine's load average, because the machine may be shared. Nothing is
asserted: compare runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = ("ResNet50", "VGG16", "NASNetMobile")
# neuronish.saved_model's names of the stage functions it calls, by stage.
STAGES = {"freeze": "freeze_signatures", "rewrite": "rewrite_for_device",
          "support": "compiler_support",
          "partition": "partition", "neuronish-cc": "compile_with_cache",
          "read exe": "from_bytes", "splice": "splice", "export": "write_saved_model"}


def measure(name: str, batch: int) -> dict:
    """One model's stage times (runs in the model's own process)."""
    os.environ["NEURONISH_COMPILE_CACHE"] = "off"
    import tensorflow as tf  # noqa: F401  (imported before the clock starts)

    import neuronish.saved_model as sm
    from models.cache import cached_saved_model

    src = name if os.path.isdir(name) else cached_saved_model(name)
    seconds: dict[str, float] = defaultdict(float)

    def timed(stage: str, fn):  # noqa: ANN001, ANN202
        @functools.wraps(fn)
        def wrapper(*a, **k):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[stage] += time.perf_counter() - start
        return wrapper

    for stage, fn_name in STAGES.items():
        setattr(sm, fn_name, timed(stage, getattr(sm, fn_name)))
    in_cc: list[float] = []  # compile_graph's own seconds, from each executable's stats
    read = sm.from_bytes

    def from_bytes(data):  # noqa: ANN001, ANN202
        exe = read(data)
        in_cc.append(exe.stats.get("compile_seconds", 0.0))
        return exe

    sm.from_bytes = from_bytes
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="neuronish-compile-time-") as tmp:
        start = time.perf_counter()
        report = sm.compile(src, os.path.join(tmp, "compiled"), batch_size=batch)
        total = time.perf_counter() - start
    stages = {k: seconds.get(k, 0.0) for k in STAGES}
    stages["other"] = total - sum(stages.values())
    return {"model": name, "batch": batch, "total": total, "stages": stages, "in_cc": sum(in_cc),
            "neuron_ops": len(report["NeuronOps"]), "executable_bytes": sum(
                op.get("executable_bytes", 0) for op in report["NeuronOps"]),
            "load": [load, os.getloadavg()[0]]}


def format_row(row: dict) -> str:
    if "error" in row:
        return f"{row['model']}: failed: {row['error']}"
    parts = [f"{k} {v:.1f}" for k, v in row["stages"].items()]
    return (f"{row['model']} (batch {row['batch']}, {row['neuron_ops']} NeuronOp(s), "
            f"{row['executable_bytes'] / 2**20:.0f} MiB executable): {row['total']:.1f} s = "
            + ", ".join(parts) + f" (in cc {row['in_cc']:.1f}); load average "
            f"{row['load'][0]:.1f} -> {row['load'][1]:.1f} on {os.cpu_count()} CPUs")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help=f"default: {' '.join(DEFAULT_MODELS)}")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per model")
    p.add_argument("--json", metavar="FILE", help="also append the rows as JSON lines here")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.one:
        print(json.dumps(measure(args.one, args.batch_size)))
        return 0
    failed = False
    for name in args.models or DEFAULT_MODELS:
        done = subprocess.run([sys.executable, __file__, "--one", name, "--batch-size",
                               str(args.batch_size)], capture_output=True, text=True,
                              timeout=args.timeout)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            row = {"model": name, "error": tail[:300]}
            failed = True
        else:
            row = json.loads(lines[-1])
        print(format_row(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
