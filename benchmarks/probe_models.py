"""Probe: build models a user would bring, compile each in one call, compare with TF.

    python benchmarks/probe_models.py                 # every model below
    python benchmarks/probe_models.py llama_tiny vit_tiny --json rows.jsonl
    python benchmarks/probe_models.py --table-from rows.jsonl   # the table in docs/models.md

Per model, in its own process: build (random weights, tiny config, no downloads), export
(`model.export` for Keras models, `tf.saved_model.save` for tf.Modules), then
`neuronish.saved_model.compile(src, dst, batch_size=1)`, call original and compiled at
batch 1 and 3, and print one JSON line: compiles? OnNeuronRatio, NeuronOps, max relative
error at each batch, compile seconds, the ops left on TensorFlow and why.
The builders live in `models/third_party.py` (the zoo) and `models/user_models.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo import max_rel_error  # noqa: E402 (a sibling script, found by the line above)


def measure(name: str) -> dict:
    import tensorflow as tf

    import neuronish  # noqa: F401
    import neuronish.saved_model
    from models import third_party

    row: dict = {"model": name}
    with tempfile.TemporaryDirectory(dir=os.environ.get("PROBE_TMP")) as tmp:
        src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
        t = time.perf_counter()
        third_party.build(name, src)
        row["build_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        try:
            report = neuronish.saved_model.compile(src, dst, batch_size=1)
        except Exception as e:  # noqa: BLE001 - the probe reports whatever breaks
            row["error"] = f"compile: {type(e).__name__}: {e}"[:1500]
            return row
        row["compile_s"] = round(time.perf_counter() - t, 1)
        row.update(tf_ops=report["operations"], ratio=report["OnNeuronRatio"],
                   neuron_ops=len(report["NeuronOps"]),
                   dynamic=[op["dynamic_batch_note"] for op in report["NeuronOps"]
                            if not op["dynamic_batch"]],
                   failures=report["compile_failures"],
                   left={op: t["reasons"] for op, t in report["OnTensorFlow"].items()})
        original = tf.saved_model.load(src).signatures["serving_default"]
        compiled = tf.saved_model.load(dst).signatures["serving_default"]
        for b in (1, 3):
            feeds = {k: tf.constant(v) for k, v in
                     third_party.example_inputs(name, original, b, seed=b).items()}
            try:
                row[f"err{b}"] = max_rel_error(compiled(**feeds), original(**feeds))
            except Exception as e:  # noqa: BLE001
                row[f"err{b}"] = f"{type(e).__name__}: {str(e)[:400]}"
    return row


def _err(value: object) -> str:
    return f"{value:.1e}" if isinstance(value, float) else f"fails: {str(value)[:80]}"


def markdown(rows: list[dict]) -> str:
    """model | TF ops | OnNeuronRatio | NeuronOps | err @1 | err @3 | compile s | left on TF."""
    out = ["| model | TF ops | OnNeuronRatio | NeuronOps | max rel err @1 | max rel err @3 | "
           "compile s | left on TensorFlow (why) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | - | - | - | - | - | - | does not compile: "
                       f"{r['error'][:160]} |")
            continue
        left = "; ".join(f"{op} x{sum(why.values())} ({', '.join(why)})"
                         for op, why in r["left"].items()) or "-"
        out.append(f"| {r['model']} | {r['tf_ops']} | {r['ratio']:.4f} | {r['neuron_ops']} | "
                   f"{_err(r['err1'])} | {_err(r['err3'])} | {r['compile_s']:.1f} | {left} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="*")
    p.add_argument("--json")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--table-from", metavar="FILE",
                   help="print the rows a --json run wrote as a markdown table")
    p.add_argument("--one")
    args = p.parse_args(argv)
    if args.table_from:
        with open(args.table_from) as f:
            print(markdown([json.loads(line) for line in f if line.strip()]))
        return 0
    if args.one:
        try:
            print(json.dumps(measure(args.one)))
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"model": args.one, "error": f"{type(e).__name__}: {e}"[:1500],
                              "trace": traceback.format_exc()[-1500:]}))
        return 0
    from models import third_party

    names = args.models or list(third_party.PROBE)
    for name in names:
        cmd = [sys.executable, __file__, "--one", name]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            lines = done.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if lines else {
                "model": name, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        except subprocess.TimeoutExpired:
            row = {"model": name, "error": "timeout"}
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
