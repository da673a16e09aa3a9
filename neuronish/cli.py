"""The `neuronish` command.

    neuronish compile model/ model_neuron/ --batch-size 2     # SavedModel -> compiled SavedModel
    neuronish benchmark model/ --compare model_neuron/        # side by side, one run
    neuronish run model.neff --input x:0=batch.npy --output-dir out/

TensorFlow is imported only by the subcommands that need it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from neuronish import benchmark, device_tools  # TensorFlow only when a benchmark runs


def output_file_name(tensor_name: str) -> str:
    """`predictions/Softmax:0` -> `predictions_Softmax_0.npy`."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tensor_name) + ".npy"


def _run(args: argparse.Namespace) -> int:
    from neuronish.runtime import DeviceError, load
    from neuronish.runtime.files import FileRefused, replace_atomically

    feeds = {}
    for item in args.input:
        name, sep, path = item.rpartition("=")
        if not sep or not name:
            print(f"neuronish: error: --input {item!r}: expected NAME=FILE.npy", file=sys.stderr)
            return 2
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            print(f"neuronish: error: cannot read input {name!r} from {path}: {e}", file=sys.stderr)
            return 1
    try:
        model = load(args.executable, duplicates=args.duplicates)
        start = time.perf_counter()
        outputs = model.run(feeds)
        seconds = time.perf_counter() - start
        model.unload()
    except DeviceError as e:
        print(f"neuronish: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, value in outputs.items():
        path = out_dir / output_file_name(name)
        try:
            replace_atomically(path, lambda f, v=value: np.save(f, v), f"output {name!r}",
                               mode=0o644)
        except FileRefused as e:
            print(f"neuronish: error: {e}", file=sys.stderr)
            return 1
        print(f"{name}: {value.dtype}{list(value.shape)} -> {path}")
    print(f"ran in {seconds * 1000:.1f} ms", file=sys.stderr)
    return 0


def _parse_shapes(items: list[str]) -> dict[str, list[int]]:
    shapes = {}
    for item in items:
        key, sep, dims = item.partition("=")
        try:
            # "?", "None" or -1 for the batch, as TensorFlow prints a free dimension
            shapes[key] = [-1 if d.strip() in ("?", "None") else int(d)
                           for d in dims.split(",")] if dims else []
        except ValueError:
            sep = ""
        if not sep or not key:
            raise SystemExit(f"neuronish: error: --input-shape {item!r}: expected KEY=D0,D1,...")
    return shapes


def _free_dims_text(report: dict) -> str:
    """The report's free dimensions, for the terminal: what sizes each call may have."""
    lines = ["free dimensions (each call within the bounds runs on an executable for its "
             "shape, compiled at its first call unless compiled ahead):"]
    for d in report["free_dims"]:
        lines.append(f"  {d['input']}[{d['axis']}]: {d['low']}..{d['high']} "
                     f"(bound from {d['bound_from']}); compiled at {d['compiled_at']}")
    if report.get("shapes_compiled_ahead"):
        lines.append("  compiled ahead: " + "; ".join(report["shapes_compiled_ahead"]))
    return "\n".join(lines)


def parse_shape_bounds(items: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
    """--shape-bounds KEY:AXIS=LOW:HIGH, repeatable: compile()'s shape_bounds."""
    bounds: dict[str, dict[int, tuple[int, int]]] = {}
    for item in items:
        where, _, sizes = item.partition("=")
        key, _, axis = where.rpartition(":")
        low, _, high = sizes.partition(":")
        try:
            bounds.setdefault(key, {})[int(axis)] = (int(low), int(high))
        except ValueError:
            key = ""
        if not key:
            raise SystemExit(f"neuronish: error: --shape-bounds {item!r}: expected "
                             "KEY:AXIS=LOW:HIGH, e.g. token_ids:1=1:512")
    return bounds


def parse_shape_buckets(items: list[str]) -> dict[str, dict[int, list[int]]]:
    """--shape-buckets KEY:AXIS=S1,S2,..., repeatable: compile()'s shape_buckets."""
    buckets: dict[str, dict[int, list[int]]] = {}
    for item in items:
        where, _, sizes = item.partition("=")
        key, _, axis = where.rpartition(":")
        try:
            buckets.setdefault(key, {})[int(axis)] = [int(v) for v in sizes.split(",")]
        except ValueError:
            key = ""
        if not key:
            raise SystemExit(f"neuronish: error: --shape-buckets {item!r}: expected "
                             "KEY:AXIS=S1,S2,..., e.g. token_ids:1=16,64,128")
    return buckets


def _load_examples(items: list[str]) -> dict[str, np.ndarray]:
    """--example KEY=FILE.npy, repeatable: model_feed_dict."""
    from neuronish.errors import SavedModelError

    examples = {}
    for item in items:
        key, sep, path = item.partition("=")
        if not sep or not key:
            raise SavedModelError(f"--example {item!r}: expected KEY=FILE.npy")
        try:
            examples[key] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise SavedModelError(f"--example {key}: cannot read {path}: {e}") from None
    return examples


def _compile(args: argparse.Namespace) -> int:
    import json
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from neuronish.compile_driver import CompileResult
    from neuronish.errors import CompileWarning, NeuronishError
    from neuronish.progress import ProgressBar
    from neuronish.saved_model import compile as compile_saved_model
    from neuronish.saved_model import format_report

    bar: ProgressBar | None = None

    def progress(done: int, total: int, result: CompileResult) -> None:
        nonlocal bar
        if bar is None:  # one bar per round: recovery rounds compile again
            bar = ProgressBar(total, "compiling subgraphs")
        bar.update(done, note=f"{result.name}: {result.outcome}")
        if done == total:
            bar.close()
            bar = None

    def show_warning(message: Warning | str, category: type[Warning], *_: object) -> None:
        line = f"neuronish: warning: {message}"
        if bar is not None:
            bar.write(line)  # above the bar, which is redrawn underneath
        else:
            print(line, file=sys.stderr)

    from neuronish import keras_files, tfn_compat

    shapes = _parse_shapes(args.input_shape) or None
    try:
        # The modules first: loading a Keras file needs the custom objects they register.
        tfn_compat.import_modules(args.imports)
        source = keras_files.as_saved_model(args.model_dir, shapes) \
            if keras_files.is_keras_file(args.model_dir) \
            else contextlib.nullcontext(args.model_dir)
        with warnings.catch_warnings(), source as model_dir:
            warnings.simplefilter("always", CompileWarning)
            warnings.showwarning = show_warning
            report = compile_saved_model(
                model_dir, args.new_model_dir, batch_size=args.batch_size,
                model_shape_feed_dict=shapes,
                shape_bounds=parse_shape_bounds(args.shape_bounds) or None,
                shape_buckets=parse_shape_buckets(args.shape_buckets) or None,
                model_feed_dict=_load_examples(args.example) or None,
                warmup_requests=args.warmup_requests,
                tags=args.tags.split(",") if args.tags else None,
                signature_def_key=args.signature_def_key,
                minimum_segment_size=args.minimum_segment_size, no_fuse_ops=args.no_fuse_ops,
                force_fuse_ops=args.force_fuse_ops, compiler_args=args.compiler_args,
                compiler_workdir=args.compiler_workdir, compiler_timeout=args.compiler_timeout,
                max_num_compilers=args.max_num_compilers,
                dynamic_batch_size=not args.fixed_batch_size,
                compiler_recovery=not args.no_compiler_recovery, progress=progress,
                graph=args.graph, verify=args.verify,
                quantize=None if args.quantize == "none" else args.quantize,
                calibration_data=_calibration_feeds(args.calibration_data, args.batch_size),
                max_error=args.max_error)
    except NeuronishError as e:
        if bar is not None:
            bar.close()
        print(f"neuronish: error: {e}", file=sys.stderr)
        return 1
    report["model_dir"] = args.model_dir  # (not the temporary export of a Keras file)
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    if not args.json and report.get("free_dims"):
        print(_free_dims_text(report))
    if args.graph:
        print(f"neuronish: partition picture written to {args.graph} (Graphviz: .dot alongside)",
              file=sys.stderr)
    return 0


def _calibration_feeds(path: str | None, batch: int) -> list[dict] | None:
    """--calibration-data FILE.npz: per signature input key, the calibration inputs stacked
    along the batch axis (e.g. [100, 224, 224, 3]); fed `batch` rows at a time."""
    if path is None:
        return None
    from neuronish.errors import SavedModelError

    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise SavedModelError(f"--calibration-data {path}: not a readable .npz ({e})") from None
    rows = {k: a.shape[0] if a.ndim else 0 for k, a in arrays.items()}
    if not arrays or len(set(rows.values())) != 1 or 0 in rows.values():
        raise SavedModelError(f"--calibration-data {path}: needs one array per signature input "
                              f"key, all with the same number (>= 1) of rows, got {rows}")
    n = next(iter(rows.values()))
    return [{k: a[i:i + batch] for k, a in arrays.items()} for i in range(0, n, batch)]


def _add_compile_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("compile", help="compile a SavedModel (or a .keras/.h5 model file) "
                                        "for the device",
                       description="Partition a SavedModel, compile every supported subgraph "
                       "with neuronish-cc and write a SavedModel whose compiled parts run as "
                       "NeuronOps. Prints the compile report.")
    c.add_argument("model_dir", help="a SavedModel directory, or a Keras model file "
                                      "(.keras, .h5: loaded and exported with model.export)")
    c.add_argument("new_model_dir", help="must not exist; written atomically")
    c.add_argument("--batch-size", type=int, default=1, help="compiled batch size (default 1)")
    c.add_argument("--input-shape", action="append", default=[], metavar="KEY=D0,D1,...",
                   help="compile shape of one signature input (model_shape_feed_dict); "
                        "? or -1 in dim 0: the batch size")
    c.add_argument("--shape-bounds", action="append", default=[],
                   metavar="KEY:AXIS=LOW:HIGH", help="sizes a free dimension of an input "
                   "may take (shape_bounds); default: what the model implies, else 1:1024")
    c.add_argument("--shape-buckets", action="append", default=[],
                   metavar="KEY:AXIS=S1,S2,...", help="sizes of a free dimension to compile "
                   "ahead, stored in the SavedModel (shape_buckets), e.g. token_ids:1=16,64,128")
    c.add_argument("--tags", help="MetaGraph tags, comma-separated (default: serve)")
    c.add_argument("--signature-def-key", help="default: serving_default")
    c.add_argument("--minimum-segment-size", type=int, default=2)
    c.add_argument("--no-fuse-ops", nargs="*", default=[], metavar="NAME_OR_TYPE")
    c.add_argument("--force-fuse-ops", nargs="*", default=[], metavar="NAME_OR_TYPE")
    c.add_argument("--compiler-args", default="", help="extra neuronish-cc flags, quoted")
    c.add_argument("--compiler-workdir", help="keep each subgraph's .pb, io-config, "
                   "command line and log here")
    c.add_argument("--compiler-timeout", type=float, help="seconds per subgraph")
    c.add_argument("--max-num-compilers", type=int)
    c.add_argument("--fixed-batch-size", action="store_true",
                   help="no batch splitting: calls must use the compiled batch size")
    c.add_argument("--no-compiler-recovery", action="store_true",
                   help="fail instead of leaving subgraphs that do not compile on TensorFlow")
    c.add_argument("--verify", action="store_true", help="run each compiled subgraph on "
                   "TensorFlow and on the device with example inputs; one beyond tolerance "
                   "stays on TensorFlow")
    c.add_argument("--quantize", default="none", choices=["none", "int8"],
                   help="int8: post-training quantization from --calibration-data "
                   "(docs/int8.md)")
    c.add_argument("--calibration-data", metavar="FILE.npz", help="per signature input key, "
                   "calibration inputs stacked along the batch axis")
    c.add_argument("--max-error", type=float, metavar="X", help="with --quantize int8: keep the "
                   "costliest instructions in float32 until the outputs' relative error on the "
                   "calibration data is at most X")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--example", action="append", default=[], metavar="KEY=FILE.npy",
                   help="an example input (model_feed_dict): its shape is compiled")
    c.add_argument("--warmup-requests", action="store_true",
                   help="write TF Serving's assets.extra/tf_serving_warmup_requests: a "
                        "Predict on the --example inputs, replayed by the server at load")
    c.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (repeatable): the module that registers a Keras "
                        "model's custom layers (keras.saving.register_keras_serializable); "
                        "the current directory is searched")
    c.add_argument("--graph", metavar="FILE.html", help="draw the partition: each node coloured "
                   "by where it runs and why (HTML page; Graphviz .dot alongside)")


class _ExactParser(argparse.ArgumentParser):
    """An ArgumentParser that takes flags only as spelled: no prefix abbreviations, so
    `--out` is an error rather than whichever flag it happens to start today (a flag
    added later would silently change its meaning). The subcommands' parsers, built in
    other modules, are of this class too."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    from neuronish import __version__

    p = _ExactParser(prog="neuronish", description="neuronish tools")
    p.add_argument("--version", action="version", version=f"neuronish {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_ExactParser)
    _add_compile_parser(sub)
    benchmark.add_parser(sub)
    r = sub.add_parser("run", help="run an executable on .npy inputs")
    r.add_argument("executable")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    r.add_argument("--output-dir", required=True)
    r.add_argument("--duplicates", type=int, default=1)
    device_tools.add_parsers(sub)
    o = sub.add_parser("op-library", help="print the path of the NeuronOp library for hosts "
                       "without Python, building it if needed",
                       description="The NeuronOp library whose kernel calls the C runtime: "
                       "TF_LoadLibrary it from a TensorFlow host that is not Python (the C "
                       "API, TF Serving) before loading a compiled SavedModel "
                       "(docs/c-api.md, \"The NeuronOp without Python\").")
    o.add_argument("--json", action="store_true",
                   help="print JSON: the op library, the runtime library, its header directory, "
                   "TensorFlow's library and include directories")
    from neuronish import profile  # its TensorFlow import waits until it runs

    profile.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        # Ctrl-C: the compile's outputs are written to temporary names and renamed at the
        # end, so nothing half-written is left; one line says so, not a traceback.
        print("\nneuronish: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`neuronish benchmark ... | head`): stop quietly, as
        # Unix tools do, and keep the interpreter's last flush from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # killed by SIGPIPE, by shell convention


def _op_library(args: argparse.Namespace) -> int:
    from neuronish import native_op_library
    from neuronish.op_library import OpLibraryError

    try:
        path = native_op_library.build()
    except OpLibraryError as e:
        print(f"neuronish op-library: {e}", file=sys.stderr)
        return 1
    if not args.json:
        print(path)
        return 0
    import json

    import tensorflow as tf  # (already imported by the build)

    from neuronish.runtime.capi import library

    print(json.dumps({"op_library": str(path), "runtime_library": str(library.build()),
                      "include": str(library.INCLUDE), "tensorflow_lib": tf.sysconfig.get_lib(),
                      "tensorflow_include": tf.sysconfig.get_include()}, indent=2))
    return 0


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "compile":
        return _compile(args)
    if args.command == "benchmark":
        return benchmark.run(args)
    if args.command == "op-library":
        return _op_library(args)
    if args.command in ("ls", "top", "profile"):
        return args.handler(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
