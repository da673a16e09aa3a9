"""The performance table of docs/performance.md: compiled SavedModels vs the originals.

    python benchmarks/performance.py [--duration 20] [--models resnet50 ...] [--out table.md]

For each row, the reference model is built (random weights, cached), compiled in one
call with `neuronish.saved_model.compile` (the row's compiler flags), and both
SavedModels are measured side by side in one run by `neuronish benchmark`
(alternating slices, medians; TensorFlow's thread settings left at its defaults).
Ratios are compiled / original throughput (higher is better). The tiny model's row
compares per-call latency (p50) at batch 1 instead: original / compiled (higher is
better, 1.0 = the same). A second table gives each SavedModel's throughput with 4
clients over 1 client (every setting is measured in alternating slices).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (row label, model, batch size, compiler flags, concurrency levels)
ROWS = [
    ("ResNet50 fp32", "resnet50", 8, [], [1, 4]),
    ("ResNet50 bf16 (--auto-cast matmult)", "resnet50", 8,
     ["--auto-cast", "matmult", "--auto-cast-type", "bf16"], [1]),
    ("MobileNetV2 fp32", "mobilenet_v2", 8, [], [1, 4]),
    ("BERT-style encoder fp32", "bert_encoder", 8, [], [1, 4]),
    ("tiny MLP, batch 1 (latency)", "mlp", 1, [], [1]),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=20.0, help="seconds per model and setting")
    p.add_argument("--models", nargs="*", default=None, help="only rows of these models")
    p.add_argument("--out", default=None, help="also write the markdown table here")
    args = p.parse_args()

    import neuronish
    from models.cache import cached_saved_model
    from neuronish.benchmark import benchmark
    from neuronish.runtime.native import engine_name

    lines = ["| model | batch | clients | original | compiled | ratio | max rel. diff |",
             "|---|---|---|---|---|---|---|"]
    # Throughput with 4 clients over 1 client, of each SavedModel (measured in alternating
    # slices, like the models): the device must not lose throughput under concurrency.
    scaling = ["| model | compiled: 4 clients / 1 | original: 4 clients / 1 |", "|---|---|---|"]
    print(f"engine: {engine_name()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for label, name, batch, flags, clients in ROWS:
            if args.models and name not in args.models:
                continue
            src = cached_saved_model(name)
            dst = str(Path(tmp) / f"{name}-{len(flags)}")
            neuronish.saved_model.compile(src, dst, batch_size=batch, compiler_args=flags)
            report = benchmark([src, dst], batch_sizes=[batch], concurrency=clients,
                               duration=args.duration, progress=False)
            diff = report["output_max_relative_difference"][str(batch)]
            results = report["results"]
            for c in clients:
                orig, comp = [r for r in results if r["concurrency"] == c]
                if name == "mlp":
                    ratio = orig["p50_ms"] / comp["p50_ms"]
                    cells = (f"{orig['p50_ms']:.3f} ms p50", f"{comp['p50_ms']:.3f} ms p50")
                else:
                    ratio = comp["throughput"] / orig["throughput"]
                    cells = (f"{orig['throughput']:.1f}/s", f"{comp['throughput']:.1f}/s")
                line = (f"| {label} | {batch} | {c} | {cells[0]} | {cells[1]} | "
                        f"**{ratio:.2f}x** | {diff:.1e} |")
                lines.append(line)
                print(line, flush=True)
            if len(clients) > 1:
                by = {(r["concurrency"], r["path"] == dst): r["throughput"] for r in results}
                lo, hi = clients[0], clients[-1]
                line = (f"| {label} | **{by[hi, True] / by[lo, True]:.2f}x** | "
                        f"{by[hi, False] / by[lo, False]:.2f}x |")
                scaling.append(line)
                print(line, flush=True)
            print(json.dumps(results), file=sys.stderr, flush=True)
    table = "\n".join(lines) + "\n\n" + "\n".join(scaling) + "\n"
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
