"""The model zoo: every keras.applications model and tiny keras_hub backbones, compiled in
one call each and compared with TensorFlow.

    python benchmarks/zoo.py                       # all models, one table (long: hours on 2 CPUs)
    python benchmarks/zoo.py ResNet50 bert_tiny    # some models
    python benchmarks/zoo.py --markdown            # the table as in docs/models.md

Per model, in its own process (memory and crashes stay contained): build the SavedModel
as a new user would (`models/third_party.py`, cached under $NEURONISH_MODEL_CACHE),
`neuronish.saved_model.compile(src, dst, batch_size=B)` timed end to end, then call the
original and the compiled signature at batch B and at an odd other batch on the same
random inputs. Columns: TF operations of the frozen graph; OnNeuronRatio; NeuronOps;
max relative error (max |compiled - TF| / max |TF| over all outputs) at each batch;
compile seconds; throughput ratio compiled / TF at batch B (median of alternating timed
slices; above 1 the compiled model is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("model", "TF ops", "OnNeuronRatio", "NeuronOps", "max rel err @B", "max rel err @odd",
           "compile s", "throughput vs TF")
# --exact: both float32 results against the float64 twin, at batch B
EXACT_COLUMNS = ("TF vs float64", "compiled vs float64")


def _saved_model(name: str) -> str:
    """The model's SavedModel, built once into the model cache ($NEURONISH_MODEL_CACHE)."""
    from models.cache import cached_saved_model

    return cached_saved_model(name)


def max_rel_error(got: dict, want: dict, *, exact: bool = False) -> float:
    """Over all outputs: max |got - want| / max |finite want| (inf on a shape or dtype
    mismatch, or where one side has a NaN or an infinity the other has not: max() with a
    NaN would have kept the error before it). With `exact`, `want` is the float64 twin's
    answer (`models/float64.py`) and only shapes must agree. `benchmarks/probe_models.py`
    measures with it too."""
    import numpy as np

    worst = 0.0
    for key, w in want.items():
        w = np.asarray(w)
        g = np.asarray(got[key])
        if g.shape != w.shape or (g.dtype != w.dtype and not exact):
            return float("inf")
        if not w.size:
            continue
        g64, w64 = g.astype("float64"), w.astype("float64")
        alike = (np.isnan(g64) & np.isnan(w64)) | (np.isinf(w64) & (g64 == w64))
        with np.errstate(invalid="ignore"):  # (inf - inf: NaN, refused below)
            diff = np.where(alike, 0.0, np.abs(g64 - w64))
        if not np.all(np.isfinite(diff)):
            return float("inf")
        finite = np.abs(w64[np.isfinite(w64)])
        scale = max(float(finite.max()) if finite.size else 0.0, 1e-30)
        worst = max(worst, float(diff.max()) / scale)
    return worst


def _throughput_ratio(original: object, compiled: object, feeds: dict, slices: int,
                      seconds: float) -> float:
    """Compiled throughput / TF throughput: median over alternating timed slices."""
    def rate(fn: object) -> float:
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds or calls < 2:
            fn(**feeds)
            calls += 1
        return calls / elapsed

    ratios = []
    for i in range(slices):
        if i % 2:
            c, o = rate(compiled), rate(original)
        else:
            o, c = rate(original), rate(compiled)
        ratios.append(c / o)
    return statistics.median(ratios)


def measure(name: str, batch: int, other_batch: int, slices: int, seconds: float,
            exact: bool = False) -> dict:
    """One row of the table (runs in the model's own process)."""
    import tensorflow as tf

    import neuronish  # noqa: F401  (makes NeuronOp loadable)
    import neuronish.saved_model
    from models import third_party

    src = _saved_model(name)
    with tempfile.TemporaryDirectory() as tmp:
        dst = os.path.join(tmp, "compiled")
        start = time.perf_counter()
        report = neuronish.saved_model.compile(src, dst, batch_size=batch)
        compile_s = time.perf_counter() - start
        original = tf.saved_model.load(src).signatures["serving_default"]
        compiled = tf.saved_model.load(dst).signatures["serving_default"]
        errors, feeds = [], {}
        for b in (batch, other_batch):
            feeds[b] = {k: tf.constant(v) for k, v in
                        third_party.example_inputs(name, original, b, seed=b).items()}
            errors.append(max_rel_error(compiled(**feeds[b]), original(**feeds[b])))
        ratio = _throughput_ratio(original, compiled, feeds[batch], slices, seconds)
        if exact:
            exact_errors = _errors_vs_float64(name, src, original, compiled, feeds[batch])
    left = {op: t["count"] for op, t in report["OnTensorFlow"].items()}
    row = {"model": name, "tf_ops": report["operations"], "ratio": report["OnNeuronRatio"],
           "neuron_ops": len(report["NeuronOps"]), "err_batch": errors[0],
           "err_other": errors[1], "compile_s": compile_s, "throughput": ratio,
           "left_on_tf": left, "batch": batch, "other_batch": other_batch}
    if exact:
        row["tf_vs_exact"], row["compiled_vs_exact"] = exact_errors
    return row


def _errors_vs_float64(name: str, src: str, original: object, compiled: object,
                       feeds: dict) -> tuple[float, float]:
    """TF's and the compiled model's max relative error against the float64 twin."""
    from models import third_party
    from models.float64 import exact_outputs, float64_twin

    twin = float64_twin(lambda: third_party.keras_model(name), src)
    want = original(**feeds)
    exact = exact_outputs(twin, {k: v.numpy() for k, v in feeds.items()}, list(want))
    return (max_rel_error(want, exact, exact=True),
            max_rel_error(compiled(**feeds), exact, exact=True))


def _run_one(name: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--batch-size", str(args.batch_size),
           "--other-batch", str(args.other_batch), "--slices", str(args.slices),
           "--slice-seconds", str(args.slice_seconds)] + (["--exact"] if args.exact else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"model": name, "error": tail[:300]}
    return json.loads(lines[-1])


def _cells(row: dict, exact: bool) -> list[str]:
    if "error" in row:
        return ([row["model"], "-", "-", "-", "-", "-", "-", f"failed: {row['error']}"]
                + ["-"] * len(EXACT_COLUMNS) * exact)
    cells = [row["model"], str(row["tf_ops"]), f"{row['ratio']:.4f}", str(row["neuron_ops"]),
             f"{row['err_batch']:.1e}", f"{row['err_other']:.1e}", f"{row['compile_s']:.1f}",
             f"{row['throughput']:.2f}x"]
    if exact:
        cells += [f"{row[k]:.1e}" if k in row else "-"
                  for k in ("tf_vs_exact", "compiled_vs_exact")]
    return cells


def format_table(rows: list[dict], markdown: bool) -> str:
    """The table; the float64 columns appear when any row has them (`--exact`)."""
    exact = any("tf_vs_exact" in r for r in rows)
    columns = COLUMNS + EXACT_COLUMNS * exact
    cells = [list(columns)] + [_cells(r, exact) for r in rows]
    if markdown:
        out = ["| " + " | ".join(c) + " |" for c in cells]
        out.insert(1, "|" + "|".join("---" for _ in columns) + "|")
        return "\n".join(out)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from models import third_party

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help=f"default: all {len(third_party.ALL)}")
    p.add_argument("--batch-size", type=int, default=1, help="the compiled batch")
    p.add_argument("--other-batch", type=int, default=3, help="an odd other batch to check")
    p.add_argument("--slices", type=int, default=5, help="timed slices per model and side")
    p.add_argument("--slice-seconds", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per model")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--exact", action="store_true",
                   help="also measure TF and the compiled model against the model built in "
                        "float64 (keras.applications and keras_hub models)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON lines here")
    p.add_argument("--table-from", metavar="FILE", help="print the table of the rows a "
                   "--json run wrote, without running anything")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.table_from:
        with open(args.table_from) as f:
            print(format_table([json.loads(line) for line in f if line.strip()],
                               args.markdown))
        return 0
    if args.one:
        print(json.dumps(measure(args.one, args.batch_size, args.other_batch, args.slices,
                                 args.slice_seconds, args.exact)))
        return 0
    unknown = [m for m in args.models if m not in third_party.ALL]
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(third_party.ALL)}")
    rows = []
    for name in args.models or third_party.ALL:
        row = _run_one(name, args)
        rows.append(row)
        print("  ".join(_cells(row, args.exact)), file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(format_table(rows, args.markdown))
    left = [r for r in rows if r.get("left_on_tf")]
    for r in left:
        print(f"{r['model']} left on TensorFlow: {r['left_on_tf']}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
