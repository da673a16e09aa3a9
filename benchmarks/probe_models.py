"""Probe: build models a user would bring, compile each in one call, compare with TF.

    python benchmarks/probe_models.py                 # every model below
    python benchmarks/probe_models.py llama_tiny vit_tiny --json rows.jsonl
    python benchmarks/probe_models.py --table-from rows.jsonl   # the table in docs/models.md

Per model, in its own process: build (random weights, tiny config, no downloads), export
(`model.export` for Keras models, `tf.saved_model.save` for tf.Modules), then
`neuronish.saved_model.compile(src, dst, batch_size=1)`, call original and compiled at
batch 1 and 3, then compile again at batch 2 and call at 3 and 5 (not multiples of 2, so
a chunked call pads its last chunk; `--no-batch2` skips this), and print one JSON line:
compiles? OnNeuronRatio, NeuronOps, max relative error at each batch, compile seconds,
the ops left on TensorFlow and why.
The builders live in `models/third_party.py` (the zoo) and `models/user_models.py`.

    python benchmarks/probe_models.py --variants --json variants.jsonl

runs the variants of `models/variants.py` instead (softmax heads, no heads, other input
sizes, free image sides, `tf.saved_model.save`, several signatures, batch 4, keras_hub task
models): each compiled with its own arguments, every signature of the compiled model
compared with TensorFlow at each of its batches (the error columns: the worst signature).
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


def measure(name: str, batch2: bool = True) -> dict:
    import tensorflow as tf

    import neuronish  # noqa: F401
    import neuronish.saved_model
    from models import third_party, variants

    variant = variants.VARIANTS.get(name)
    kwargs = variant.compile_kwargs if variant else {"batch_size": 1}
    batches = variant.batches if variant else (1, 3)
    example_inputs = variants.example_inputs if variant else third_party.example_inputs
    row: dict = {"model": name}
    with tempfile.TemporaryDirectory(dir=os.environ.get("PROBE_TMP")) as tmp:
        src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
        t = time.perf_counter()
        variant.save(src) if variant else third_party.build(name, src)
        row["build_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        try:
            report = neuronish.saved_model.compile(src, dst, **kwargs)
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
        if variant:
            row["batches"] = list(batches)
        originals = tf.saved_model.load(src).signatures
        compiled = tf.saved_model.load(dst).signatures
        keys = list(compiled) if variant else ["serving_default"]
        row["signatures"] = keys
        missing = sorted(set(originals) - set(compiled))
        for b in batches:
            worst: float | str = 0.0
            for key in keys:
                feeds = {k: tf.constant(v) for k, v in
                         example_inputs(name, originals[key], b, seed=b).items()}
                try:
                    err = max_rel_error(compiled[key](**feeds), originals[key](**feeds))
                    worst = max(worst, err) if isinstance(worst, float) else worst
                except Exception as e:  # noqa: BLE001
                    worst = f"{key}: {type(e).__name__}: {str(e)[:400]}"
            row[f"err{b}"] = f"signatures {missing} missing" if missing else worst
        if not variant and batch2:
            _measure_at_batch2(name, src, os.path.join(tmp, "dst2"), originals, row)
    return row


def _measure_at_batch2(name: str, src: str, dst: str, originals: object, row: dict) -> None:
    """Compile again at batch 2 and compare at 3 and 5, batches that are not a multiple of
    the compiled one: a chunked call then pads its last chunk, which batch-1 compiles never
    do. Adds ratio_b2, neuron_ops_b2 and b2_err3 / b2_err5 (or b2_error) to `row`."""
    import tensorflow as tf

    import neuronish.saved_model
    from models import third_party

    try:
        report = neuronish.saved_model.compile(src, dst, batch_size=2)
    except Exception as e:  # noqa: BLE001 - the probe reports whatever breaks
        row["b2_error"] = f"compile: {type(e).__name__}: {e}"[:1500]
        return
    row.update(ratio_b2=report["OnNeuronRatio"], neuron_ops_b2=len(report["NeuronOps"]))
    compiled = tf.saved_model.load(dst).signatures["serving_default"]
    original = originals["serving_default"]
    for b in (3, 5):
        feeds = {k: tf.constant(v) for k, v in
                 third_party.example_inputs(name, original, b, seed=b).items()}
        try:
            row[f"b2_err{b}"] = max_rel_error(compiled(**feeds), original(**feeds))
        except Exception as e:  # noqa: BLE001
            row[f"b2_err{b}"] = f"{type(e).__name__}: {str(e)[:400]}"


def _compile_kwargs(name: str) -> dict:
    from models import variants

    return variants.VARIANTS[name].compile_kwargs


def _is_variant(row: dict) -> bool:
    from models import variants

    return row["model"] in variants.VARIANTS


def _err(value: object) -> str:
    return f"{value:.1e}" if isinstance(value, float) else f"fails: {str(value)[:80]}"


def markdown(rows: list[dict]) -> str:
    """model | TF ops | OnNeuronRatio | NeuronOps | err @1 | err @3 | compile s | left on TF;
    rows measured at batch 2 as well add its ratio and its errors at 3 and 5."""
    b2 = any("ratio_b2" in r or "b2_error" in r for r in rows)
    extra = (" OnNeuronRatio compiled at 2 | err @3 compiled at 2 | err @5 compiled at 2 |"
             if b2 else "")
    out = ["| model | TF ops | OnNeuronRatio | NeuronOps | max rel err @1 | max rel err @3 |"
           f"{extra} compile s | left on TensorFlow (why) |", "|" + "---|" * (8 + 3 * b2)]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | - | - | - | - | - |{' - | - | - |' * b2} - | "
                       f"does not compile: {r['error'][:160]} |")
            continue
        left = "; ".join(f"{op} x{sum(why.values())} ({', '.join(why)})"
                         for op, why in r["left"].items()) or "-"
        at2 = ""
        if b2 and "b2_error" in r:
            at2 = f" fails: {r['b2_error'][:80]} | - | - |"
        elif b2:
            at2 = f" {r['ratio_b2']:.4f} | {_err(r['b2_err3'])} | {_err(r['b2_err5'])} |"
        out.append(f"| {r['model']} | {r['tf_ops']} | {r['ratio']:.4f} | {r['neuron_ops']} | "
                   f"{_err(r['err1'])} | {_err(r['err3'])} |{at2} {r['compile_s']:.1f} | "
                   f"{left} |")
    return "\n".join(out)


def variant_markdown(rows: list[dict]) -> str:
    """variant | compile arguments | signatures | TF ops | ratio | NeuronOps | err per batch."""
    out = ["| variant | compiled with | signatures | TF ops | OnNeuronRatio | NeuronOps | "
           "max rel err by batch | compile s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | - | - | - | - | - | does not compile: "
                       f"{r['error'][:160]} | - |")
            continue
        args = ", ".join(f"{k}={v}" for k, v in _compile_kwargs(r["model"]).items()) or \
            "defaults"
        errs = ", ".join(f"{b}: {_err(r[f'err{b}'])}" for b in r["batches"])
        out.append(f"| {r['model']} | {args} | {', '.join(r['signatures'])} | {r['tf_ops']} | "
                   f"{r['ratio']:.4f} | {r['neuron_ops']} | {errs} | {r['compile_s']:.1f} |")
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
    p.add_argument("--no-batch2", action="store_true",
                   help="skip the second compile at batch 2 compared at batches 3 and 5")
    p.add_argument("--variants", action="store_true",
                   help="run the variants of models/variants.py (all, or those named)")
    args = p.parse_args(argv)
    if args.table_from:
        with open(args.table_from) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        models = [r for r in rows if not _is_variant(r)]
        found = [r for r in rows if _is_variant(r)]
        print("\n\n".join([markdown(models)] * bool(models) +
                          [variant_markdown(found)] * bool(found)))
        return 0
    if args.one:
        try:
            print(json.dumps(measure(args.one, batch2=not args.no_batch2)))
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"model": args.one, "error": f"{type(e).__name__}: {e}"[:1500],
                              "trace": traceback.format_exc()[-1500:]}))
        return 0
    from models import third_party, variants

    names = args.models or list(variants.VARIANTS if args.variants else third_party.PROBE)
    for name in names:
        cmd = [sys.executable, __file__, "--one", name, *["--no-batch2"] * args.no_batch2]
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
