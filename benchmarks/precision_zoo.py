"""The zoo in reduced precision: bf16 (`--auto-cast matmult`) and int8 (`quantize="int8"`)
compiled and compared with TensorFlow fp32.

    python benchmarks/precision_zoo.py                          # a representative set
    python benchmarks/precision_zoo.py bert_tiny MobileNetV3Small --json rows.jsonl
    python benchmarks/precision_zoo.py --hub --json rows.jsonl  # every keras_hub model
    python benchmarks/precision_zoo.py --table-from rows.jsonl  # the table in docs/int8.md

Per model, in its own process with a time limit (a crash, a hang or an
exhausted memory stays contained): the model's SavedModel from the model cache
(`models/cache.py`), compiled at batch 1 by `neuronish.saved_model.compile` with
`compiler_args=["--auto-cast", "matmult"]` (bf16) or `quantize="int8"` and
`calibration_data` = `--calibration` example feeds of seeds 1..N (int8); then the
compiled and the original signature are called on a held-out feed (seed 0) and one JSON
line is printed: compiles?, max relative error against TensorFlow fp32 (the zoo's
metric, `benchmarks/zoo.py`), whether the compiled outputs hold NaN or inf where
TensorFlow's do not, compile seconds, the instructions left on the numpy engine, for
int8 how many instructions were quantized and the error the compiler calibrated, and
the exception text if anything failed.
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

PRECISIONS = ("bf16", "int8")  # the default
ORDER = ("fp32", "bf16", "int8", "int8-bf16", "int8-w7")
# A cheap cross-section: encoders, decoders, vision transformers, CNNs of each family.
DEFAULT = ("bert_tiny", "gpt2_tiny", "llama_tiny", "t5_tiny", "vit_tiny", "swin_tiny",
           "resnet_hub_tiny", "mobilenet_hub_tiny", "mobilenetv5_tiny", "cspdarknet_tiny",
           "MobileNetV3Small", "DenseNet121")
EVAL_SEED = 0  # the held-out feed; calibration uses seeds 1..N


def compile_args(precision: str, name: str, signature: object, calibration: int,
                 batch: int) -> dict:
    """`neuronish.saved_model.compile`'s keyword arguments for `precision`."""
    from models import third_party

    if precision == "bf16":
        return {"compiler_args": ["--auto-cast", "matmult"]}
    if precision in ("int8", "int8-bf16", "int8-w7"):
        # (int8-bf16: what int8 leaves in float runs in bf16; int8-w7: 7-bit weights, the
        # int8 kernels of CPUs without VNNI; docs/int8.md)
        cast = {"compiler_args": {"int8-bf16": ["--auto-cast", "matmult"],
                                  "int8-w7": ["--int8-weight-bits", "7"]}[precision]} \
            if precision != "int8" else {}
        return {"quantize": "int8", "calibration_data": [
            third_party.example_inputs(name, signature, batch, seed=seed)
            for seed in range(1, calibration + 1)], **cast}
    if precision == "fp32":
        return {}
    raise ValueError(f"unknown precision {precision!r}; known: {', '.join(ORDER)}")


def nonfinite_outputs(got: dict, want: dict) -> list[str]:
    """Outputs where the compiled model has NaN or inf and TensorFlow has a finite value
    (the zoo's error would not show them: a NaN compares false)."""
    import numpy as np

    bad = []
    for key, w in want.items():
        g, w = np.asarray(got[key]), np.asarray(w)
        if g.dtype.kind == "f" and g.shape == w.shape and \
                np.any(~np.isfinite(g) & np.isfinite(w)):
            bad.append(key)
    return bad


def _quantization_summary(neuron_ops: list[dict]) -> dict:
    """Over all NeuronOps: instructions by precision, reasons for float, calibrated error."""
    counts: dict[str, int] = {}
    why: dict[str, int] = {}
    calibrated = 0.0
    for op in neuron_ops:
        q = op.get("quantization")
        if not q:
            continue
        calibrated = max(calibrated, q.get("output_error", 0.0))
        for row in q["instructions"]:
            counts[row["precision"]] = counts.get(row["precision"], 0) + 1
            if "why" in row:
                why[row["why"][:80]] = why.get(row["why"][:80], 0) + 1
    return {"precisions": counts, "why_float": why, "calibrated_error": calibrated}


def measure(name: str, precision: str, batch: int = 1, calibration: int = 4) -> dict:
    """One row: `name` compiled in `precision` against TensorFlow fp32 (in this process)."""
    import tensorflow as tf

    import neuronish  # noqa: F401  (makes NeuronOp loadable)
    import neuronish.saved_model
    from models import third_party
    from models.cache import cached_saved_model

    row: dict = {"model": name, "precision": precision, "batch": batch}
    src = cached_saved_model(name)
    original = tf.saved_model.load(src).signatures["serving_default"]
    kwargs = compile_args(precision, name, original, calibration, batch)
    with tempfile.TemporaryDirectory(dir=os.environ.get("PROBE_TMP")) as tmp:
        dst = os.path.join(tmp, "compiled")
        start = time.perf_counter()
        try:
            report = neuronish.saved_model.compile(src, dst, batch_size=batch, **kwargs)
        except Exception as e:  # noqa: BLE001 - the benchmark reports whatever breaks
            row.update(compiles=False, compile_s=round(time.perf_counter() - start, 1),
                       exception=f"compile: {type(e).__name__}: {e}"[:1500])
            return row
        ops = report["NeuronOps"]
        row.update(compiles=True, compile_s=round(time.perf_counter() - start, 1),
                   ratio=report["OnNeuronRatio"], neuron_ops=len(ops),
                   failures=[f"{f['subgraph']}: {f.get('outcome')}: "
                             f"{str(f.get('error', ''))[:300]}"
                             for f in report["compile_failures"]],
                   numpy=sorted({f"{i['kind']}{':' + i['fn'] if i.get('fn') else ''}"
                                 f"({','.join(i.get('dtypes', []))})"
                                 for op in ops for i in op["numpy_instructions"]}))
        if precision.startswith("int8"):
            row["quantization"] = _quantization_summary(ops)
        compiled = tf.saved_model.load(dst).signatures["serving_default"]
        feeds = {k: tf.constant(v) for k, v in
                 third_party.example_inputs(name, original, batch, seed=EVAL_SEED).items()}
        try:
            got, want = compiled(**feeds), original(**feeds)
            row["error"] = max_rel_error(got, want)
            row["nonfinite"] = nonfinite_outputs(got, want)
        except Exception as e:  # noqa: BLE001
            row["exception"] = f"call: {type(e).__name__}: {e}"[:1500]
    return row


def run_model(name: str, args: argparse.Namespace) -> list[dict]:
    """`measure` of every precision of `args` in one process of its own (one TensorFlow
    start-up per model), within `args.timeout` seconds; the compile cache is off, so each
    compile is timed and runs the compiler of this tree. A row the process did not print
    (a timeout, a crash) says what happened."""
    cmd = [sys.executable, __file__, "--one", name, "--precisions", *args.precisions,
           "--batch-size", str(args.batch_size), "--calibration", str(args.calibration)]
    env = {**os.environ, "NEURONISH_COMPILE_CACHE": "off"}
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env=env)
        stdout, why = done.stdout, f"process exited {done.returncode}"
        stderr = done.stderr
    except subprocess.TimeoutExpired as e:
        stdout, stderr = _text(e.stdout), _text(e.stderr)
        why = f"timeout after {args.timeout:.0f} s"
    rows = {}
    for line in stdout.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "precision" in row:
            rows[row["precision"]] = row
    tail = " | ".join((stderr.strip().splitlines() or ["(no output)"])[-3:])
    for precision in args.precisions:
        rows.setdefault(precision, {
            "model": name, "precision": precision, "compiles": False,
            "exception": f"{why} after {time.perf_counter() - start:.0f} s: {tail}"[:1500]})
    return [rows[p] for p in args.precisions]


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _one_line(text: str) -> str:
    """`text` fit for a markdown cell."""
    return " ".join(text.split()).replace("|", "/")


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if not row.get("compiles"):
        return f"fails: {_one_line(row.get('exception', '?'))[:110]}"
    if "error" not in row:
        return f"call fails: {_one_line(row.get('exception', '?'))[:110]}"
    cell = f"{row['error']:.1e}"
    if row.get("nonfinite"):
        cell += " (NaN/inf)"
    return cell


def _compiles(row: dict | None) -> str:
    """yes; no; or "on TF" when a subgraph the compiler refused stayed on TensorFlow."""
    if row is None:
        return "-"
    return "no" if not row.get("compiles") else "on TF" if row.get("failures") else "yes"


def _notes(rows: dict[str, dict]) -> str:
    notes = []
    for precision, r in rows.items():
        if r.get("numpy"):
            notes.append(f"{precision} numpy: {', '.join(r['numpy'])}")
        if r.get("failures"):
            notes.append(f"{precision} left on TF: {_one_line('; '.join(r['failures']))[:120]}")
        q = r.get("quantization")
        if q and not q["precisions"]:
            notes.append(f"{precision}: nothing to quantize on the device")
        elif q:
            p = q["precisions"]
            notes.append(f"{precision}: {p.get('int8', 0)}/{sum(p.values())} in int8 "
                         f"(calibrated {q['calibrated_error']:.1e})")
    return "; ".join(notes) or "-"


def markdown(rows: list[dict]) -> str:
    """model | error per precision | compiles | notes, one line per model (the precisions
    the rows have, in ORDER)."""
    by_model: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["precision"]] = r
    present = [p for p in ORDER if any(p in found for found in by_model.values())]
    out = [f"| model | {' | '.join(f'{p} error' for p in present)} | compiles "
           f"({', '.join(present)}) | notes |", "|---|" + "---|" * (len(present) + 2)]
    for model, found in by_model.items():
        compiles = ", ".join(_compiles(found.get(p)) for p in present)
        cells = " | ".join(_cell(found.get(p)) for p in present)
        out.append(f"| {model} | {cells} | {compiles} | {_notes(found)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help=f"default: {' '.join(DEFAULT)}")
    p.add_argument("--hub", action="store_true", help="every keras_hub model (HUB_MODELS)")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS),
                   choices=ORDER)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--calibration", type=int, default=4,
                   help="int8: calibration feeds (seeds 1..N; the error is on seed 0)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per model")
    p.add_argument("--json", metavar="FILE", help="append the rows as JSON lines here")
    p.add_argument("--table-from", metavar="FILE",
                   help="print the table of the rows a --json run wrote")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.table_from:
        with open(args.table_from) as f:
            print(markdown([json.loads(line) for line in f if line.strip()]))
        return 0
    if args.one:
        for precision in args.precisions:
            try:
                row = measure(args.one, precision, args.batch_size, args.calibration)
            except Exception as e:  # noqa: BLE001
                row = {"model": args.one, "precision": precision, "compiles": False,
                       "exception": f"{type(e).__name__}: {e}"[:1500],
                       "trace": traceback.format_exc()[-1500:]}
            print(json.dumps(row), flush=True)
        return 0
    from models import third_party

    names = args.models or (list(third_party.HUB_MODELS) if args.hub else list(DEFAULT))
    unknown = [n for n in names if n not in third_party.ALL]
    if unknown:
        p.error(f"unknown models {unknown}")
    rows = []
    for name in names:
        for row in run_model(name, args):
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
