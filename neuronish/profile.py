"""`neuronish profile MODEL_DIR -o trace.json`: run a SavedModel and record a
Chrome-trace / Perfetto timeline of what its NeuronOps did on the device
(runtime/profiler.py), then print the instructions that took the most time.
`neuronish profile --read TRACE.json` prints the same table from a trace recorded
already: by `NEURONISH_PROFILE=DIR` in any process, a C host of the C runtime's included."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from neuronish.benchmark import (
    BenchmarkError,
    _check_saved_model_dir,
    _load,
    _to_tensors,
    add_input_shape_argument,
    inputs_from_request,
    make_inputs,
    parse_input_shapes,
)
from neuronish.runtime import profiler
from neuronish.runtime.files import FileRefused, check_write_target


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="record a timeline (Chrome trace / Perfetto JSON) of a "
                       "SavedModel's device calls and print the top instructions")
    p.add_argument("model_dir", nargs="?")
    p.add_argument("-o", "--output", help="trace file to write (JSON)")
    p.add_argument("--read", metavar="TRACE_JSON", help="print the table of a trace recorded "
                   "already (NEURONISH_PROFILE=DIR writes DIR/neuronish-<pid>.json) instead "
                   "of running a model")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--requests", type=int, default=10, help="calls recorded (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="calls before recording (default 2)")
    p.add_argument("--signature", default="serving_default")
    p.add_argument("--top", type=int, default=10, help="instructions listed (default 10)")
    add_input_shape_argument(p)
    p.add_argument("--inputs", metavar="REQUEST_JSON", help="a TF Serving REST predict "
                   "request whose rows are the inputs (instead of random values)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.read is not None:
        if args.model_dir is not None or args.output is not None:
            print("neuronish: error: --read takes no MODEL_DIR and no -o", file=sys.stderr)
            return 2
        return read(args.read, args.top)
    if args.model_dir is None or args.output is None:
        print("neuronish: error: MODEL_DIR and -o TRACE_JSON are needed (or --read "
              "TRACE_JSON)", file=sys.stderr)
        return 2
    if args.batch_size < 1 or args.requests < 1 or args.warmup < 0 or args.top < 0:
        print("neuronish: error: --batch-size and --requests must be >= 1, --warmup and "
              "--top >= 0", file=sys.stderr)
        return 2
    try:  # before the model runs: a mistake costs nothing
        check_write_target(args.output, "trace")
    except FileRefused as e:
        print(f"neuronish: error: -o {e}", file=sys.stderr)
        return 2
    # Recording from before the model loads: a model is timed if it loads while a profile
    # records (its NeuronOps load at their first call, on the runtime that serves them).
    profiler.start()
    try:
        _check_saved_model_dir(args.model_dir)
        model = _load(args.model_dir, args.model_dir, args.signature)
        if args.inputs is not None:
            rows = inputs_from_request(args.inputs, model.specs)
            feeds = _to_tensors({k: np.take(v, np.arange(args.batch_size) % v.shape[0], axis=0)
                                 for k, v in rows.items()})
        else:
            feeds = _to_tensors(make_inputs(model.specs, args.batch_size,
                                            shapes=parse_input_shapes(args.input_shape)))
    except BenchmarkError as e:
        profiler.stop()
        print(f"neuronish: error: {e}", file=sys.stderr)
        return 1
    for _ in range(args.warmup):
        model.fn(**feeds)
    from neuronish.shape_specialize import wait_for_compiles

    wait_for_compiles()  # (a free dimension's new size: profile its executable)
    profiler.start()  # (again: the warm-up's spans go)
    try:
        for i in range(args.requests):
            start = time.perf_counter()
            model.fn(**feeds)
            profiler.record("request", "tf", "TensorFlow: signature calls", start,
                            time.perf_counter(), index=i, batch=args.batch_size)
    finally:
        trace = profiler.stop(args.output)
    print(format_top(profiler.top_instructions(trace, args.top)))
    n = sum(e.get("ph") == "X" for e in trace["traceEvents"])
    print(f"wrote {args.output}: {n} spans over {args.requests} request(s) of batch "
          f"{args.batch_size}; open it in https://ui.perfetto.dev or chrome://tracing",
          file=sys.stderr)
    return 0


_MAX_TRACE_BYTES = 1 << 30  # the profiler stops at ~2M events, a few hundred MB


def check_trace(trace: object) -> str | None:
    """Why `trace` is not a trace the profiler writes (the fields the table reads), or
    None."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return "expected a JSON object with a 'traceEvents' list"
    for i, e in enumerate(trace["traceEvents"]):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            return f"traceEvents[{i}] is not an event with a name"
        if e.get("ph") != "X":
            continue
        dur = e.get("dur")
        if not isinstance(e.get("cat"), str) or isinstance(dur, bool) or \
                not isinstance(dur, (int, float)) or not isinstance(e.get("args", {}), dict):
            return f"traceEvents[{i}] ({e['name'][:40]!r}) needs a string cat, a number dur " \
                   f"and an args object"
        nodes = e.get("args", {}).get("tf", [])
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            return f"traceEvents[{i}] ({e['name'][:40]!r}): args.tf must be a list of strings"
    return None


def read(path: str, top: int) -> int:
    """Print the top instructions of a trace file and what it holds."""
    from neuronish.runtime.files import read_json

    try:
        trace = read_json(path, _MAX_TRACE_BYTES, "trace")
    except FileRefused as e:
        print(f"neuronish: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"neuronish: error: cannot read {path}: {e.strerror or e}", file=sys.stderr)
        return 1
    if (why := check_trace(trace)) is not None:
        print(f"neuronish: error: {path} is not a neuronish trace: {why}", file=sys.stderr)
        return 1
    print(format_top(profiler.top_instructions(trace, top)))
    spans: dict[str, int] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            spans[e["cat"]] = spans.get(e["cat"], 0) + 1
    counts = ", ".join(f"{n} {cat}" for cat, n in sorted(spans.items())) or "no spans"
    print(f"{path}: {counts}", file=sys.stderr)
    return 0


def format_top(rows: list[dict]) -> str:
    if not rows:
        return ("no device instructions were recorded: nothing in this model runs in a "
                "NeuronOp (was it compiled with `neuronish compile`?)")
    lines = [f"{'total ms':>9} {'calls':>6} {'mean us':>10} {'modelled us':>12} "
             f"{'engine':<6}  {'instruction':<28} TF nodes"]
    for r in rows:
        modelled = f"{r['modelled_us']:12.1f}" if r["modelled_us"] is not None else \
            f"{'-':>12}"
        nodes = ", ".join(r["tf_nodes"][:3]) + (", ..." if len(r["tf_nodes"]) > 3 else "")
        lines.append(f"{r['total_ms']:9.2f} {r['calls']:>6} {r['mean_us']:10.1f} {modelled} "
                     f"{r.get('engine', '?'):<6}  "
                     f"{r['instruction'][:28]:<28} {nodes}")
    lines.append("(mean us: measured on this host; modelled us: the device model's estimate, "
                 "docs/device-model.md; engine: native (oneDNN) or numpy (the reference "
                 "kernels, a slow path))")
    return "\n".join(lines)
