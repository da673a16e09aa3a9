"""`neuronish benchmark`: throughput and latency of SavedModels, side by side in one run.

    neuronish benchmark compiled/ --compare original/ --batch-size 1 8 --concurrency 1 4
    python -m neuronish.benchmark MODEL_DIR ...          # the same, without the CLI

For every batch size, each model at each concurrency runs `--rounds` short slices
that alternate between the models and the concurrency levels (A1 B1 A4 B4, then
B4 A4 B1 A1, ...), so that machine noise hits every setting alike: the ratio between
models, and between 1 and 4 clients of one model, are both measured side by side. In
a slice, N client threads call the signature back to back on random
inputs (the same inputs for both models), or on the examples of `--inputs`: a TF
Serving REST predict request (the JSON a serving client posts, `{"instances": ...}`
or `{"inputs": ...}`, binary strings as `{"b64": ...}`), its rows cycled to fill each
batch size; models with string inputs (image bytes, text) need it. Reported per
model and setting: the median over slices of the throughput (samples/s), the p50
and p99 latency of single calls, and the throughput ratio of each model to the
first (MODEL_DIR).
`--duration` is the measured time per model and setting, split over the rounds;
`--requests` is instead a number of calls per model and setting.

Exit status: 0 done; 1 a model could not be loaded or run (the message says
which and why); 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from neuronish.progress import ProgressBar

DEFAULT_DURATION = 10.0
DEFAULT_ROUNDS = 5
# Random integer inputs are drawn from [0, INT_HIGH): valid token ids, segment
# ids and class indices for any model, since we cannot see the vocabulary size.
INT_HIGH = 2


class BenchmarkError(Exception):
    """A problem the user can fix: reported as one line, exit status 1."""


@dataclass
class Row:
    """One model at one batch size and concurrency."""

    model: str
    path: str
    batch_size: int
    concurrency: int
    requests: int
    throughput: float  # samples/s, median over the slices
    p50_ms: float
    p99_ms: float
    ratio: float | None  # throughput / the first model's; None for the first


@dataclass
class _Model:
    label: str
    path: str
    loaded: object  # keeps the SavedModel's variables alive for `fn`
    fn: Callable[..., dict]
    specs: dict  # input name -> tf.TensorSpec


# --------------------------------------------------------------------------- command line


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", metavar="MODEL_DIR", help="SavedModel directory")
    p.add_argument("--compare", metavar="OTHER_DIR",
                   help="a second SavedModel with the same inputs, measured in the same run")
    p.add_argument("--batch-size", type=_positive_int, nargs="+", default=[8], metavar="N",
                   help="batch sizes to measure (default 8)")
    p.add_argument("--concurrency", type=_positive_int, nargs="+", default=[1], metavar="N",
                   help="numbers of client threads calling the model at once (default 1)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--duration", type=_positive_float, metavar="SECONDS",
                        help=f"measured time per model and setting (default {DEFAULT_DURATION:g})")
    budget.add_argument("--requests", type=_positive_int, metavar="N",
                        help="calls per model and setting, instead of --duration")
    p.add_argument("--rounds", type=_positive_int, default=DEFAULT_ROUNDS, metavar="N",
                   help=f"slices per model and setting, alternating models (default "
                        f"{DEFAULT_ROUNDS})")
    p.add_argument("--warmup", type=_non_negative_int, default=3, metavar="N",
                   help="unmeasured calls per model and setting first (default 3)")
    p.add_argument("--inter-op-threads", type=_non_negative_int, default=0, metavar="N",
                   help="TensorFlow's inter-op threads for both models (default 0: "
                        "TensorFlow's choice). 1 suits models compiled whole onto the device: "
                        "idle inter-op threads spin and take CPU from it")
    p.add_argument("--intra-op-threads", type=_non_negative_int, default=0, metavar="N",
                   help="TensorFlow's intra-op threads for both models (default 0: "
                        "TensorFlow's choice)")
    p.add_argument("--signature", default="serving_default", help="signature to call")
    p.add_argument("--inputs", metavar="REQUEST_JSON",
                   help="call on these examples instead of random inputs: a TF Serving REST "
                        "predict request body, its rows cycled to each batch size")
    add_input_shape_argument(p)
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `benchmark` to the `neuronish` command's subparsers; dispatch to `run`."""
    p = subparsers.add_parser("benchmark", help="measure throughput and latency of SavedModels",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the benchmark the parsed `args` describe; print a table or JSON. Exit status."""
    try:
        report = benchmark([args.model_dir] + ([args.compare] if args.compare else []),
                           batch_sizes=args.batch_size, concurrency=args.concurrency,
                           duration=args.duration, requests=args.requests, rounds=args.rounds,
                           warmup=args.warmup, signature=args.signature,
                           inter_op_threads=args.inter_op_threads,
                           intra_op_threads=args.intra_op_threads, inputs=args.inputs,
                           input_shapes=parse_input_shapes(args.input_shape))
    except BenchmarkError as e:
        print(f"neuronish benchmark: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="neuronish benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(p)
    return run(p.parse_args(argv))


# --------------------------------------------------------------------------- the benchmark


def benchmark(model_dirs: list[str], *, batch_sizes: list[int], concurrency: list[int],
              duration: float | None = None, requests: int | None = None,
              rounds: int = DEFAULT_ROUNDS, warmup: int = 3,
              signature: str = "serving_default", progress: bool = True,
              inter_op_threads: int = 0, intra_op_threads: int = 0,
              inputs: str | None = None,
              input_shapes: dict[str, list[int]] | None = None) -> dict:
    """Measure the SavedModels in `model_dirs` side by side; the report `--json` prints.
    `inputs`: a TF Serving REST predict request file whose rows the calls cycle through
    (random inputs without it). `input_shapes` (key -> shape, the batch -1) gives the
    random inputs' free dimensions.

    Raises BenchmarkError naming the model directory or input that is wrong.
    """
    if duration is None and requests is None:
        duration = DEFAULT_DURATION
    for path in model_dirs:  # before paying seconds for TensorFlow's import
        _check_saved_model_dir(path)
    _set_tf_threads(inter_op_threads, intra_op_threads)
    models = [_load(path, label, signature) for path, label in zip(model_dirs,
                                                                     _labels(model_dirs))]
    for other in models[1:]:
        _check_same_inputs(models[0], other)
    examples = None if inputs is None else inputs_from_request(inputs, models[0].specs)
    if requests is not None:
        rounds = min(rounds, requests)

    settings = [(b, c) for b in batch_sizes for c in concurrency]
    rows: list[Row] = []
    output_diff: dict[str, float | None] = {}
    bar = ProgressBar(len(settings) * rounds * len(models), "benchmark", enabled=progress)
    with bar:
        for batch in batch_sizes:
            feeds = _to_tensors(make_inputs(models[0].specs, batch, shapes=input_shapes)
                                if examples is None
                                else cycle_rows(examples, batch))
            if len(models) > 1:
                output_diff[str(batch)] = _max_relative_difference(models, feeds)
            rows += _measure(models, feeds, batch, concurrency, duration, requests, rounds,
                             warmup, bar)
    return {
        "signature": signature,
        "models": [{"label": m.label, "path": m.path} for m in models],
        # What TensorFlow was given (0: its own choice).
        **_tf_threads(),
        "duration_s": duration, "requests": requests, "rounds": rounds, "warmup": warmup,
        "results": [asdict(r) for r in rows],
        # Per batch size: largest |other - first| / max |first| over float outputs.
        "output_max_relative_difference": output_diff,
    }


def _measure(models: list[_Model], feeds: dict, batch: int, concurrency: list[int],
             duration: float | None, requests: int | None, rounds: int, warmup: int,
             bar: ProgressBar) -> list[Row]:
    """All models at every concurrency, one batch size, in alternating slices."""
    settings = [(c, m) for c in concurrency for m in models]
    throughputs: dict[tuple[int, str], list[float]] = {(c, m.label): [] for c, m in settings}
    latencies: dict[tuple[int, str], list[float]] = {(c, m.label): [] for c, m in settings}
    pools = {c: ThreadPoolExecutor(max_workers=c, thread_name_prefix="client")
             for c in concurrency}
    try:
        if warmup:
            for c, m in settings:
                _slice(m, feeds, pools[c], c, requests=warmup, seconds=None)
            # (a free dimension's new size ran on TensorFlow while it compiled: timed
            # calls run on its executable)
            from .shape_specialize import wait_for_compiles

            wait_for_compiles()
        for r in range(rounds):
            # Alternate the order: no setting always follows the same other one.
            for c, m in settings if r % 2 == 0 else settings[::-1]:
                # requests split as evenly as possible over the rounds
                share = None if requests is None else (requests * (r + 1) // rounds
                                                        - requests * r // rounds)
                wall, times = _slice(m, feeds, pools[c], c, requests=share,
                                     seconds=None if duration is None else duration / rounds)
                throughputs[c, m.label].append(len(times) * batch / wall)
                latencies[c, m.label] += times
                bar.update(note=f"batch {batch}, {c} client(s), {m.label}")
    finally:
        for pool in pools.values():
            pool.shutdown()
    rows = []
    for c in concurrency:
        first = None
        for m in models:
            p50, p99 = np.percentile(np.array(latencies[c, m.label]) * 1000, [50, 99])
            row = Row(m.label, m.path, batch, c, len(latencies[c, m.label]),
                      statistics.median(throughputs[c, m.label]), float(p50), float(p99), None)
            if first is None:
                first = row
            else:
                row.ratio = row.throughput / first.throughput
            rows.append(row)
    return rows


def _slice(model: _Model, feeds: dict, pool: ThreadPoolExecutor, clients: int, *,
           requests: int | None, seconds: float | None) -> tuple[float, list[float]]:
    """`clients` threads call the model until `requests` calls are made or `seconds`
    have passed. Returns (wall seconds, latency of each call in seconds)."""
    lock = threading.Lock()
    remaining = requests
    start = time.perf_counter()
    deadline = None if seconds is None else start + seconds

    def client() -> list[float]:
        nonlocal remaining
        times = []
        while True:
            if deadline is not None:
                if time.perf_counter() >= deadline and times:
                    return times
            else:
                with lock:
                    if remaining <= 0:
                        return times
                    remaining -= 1
            t0 = time.perf_counter()
            model.fn(**feeds)  # eager call: returns when the outputs are computed
            times.append(time.perf_counter() - t0)

    futures = [pool.submit(client) for _ in range(clients)]
    try:
        times = [t for f in futures for t in f.result()]
    except Exception as e:  # the model failed: name it, don't dump a TF traceback
        raise BenchmarkError(f"model {model.label} ({model.path}) failed: "
                             f"{type(e).__name__}: {_first_line(e)}") from e
    return time.perf_counter() - start, times


# --------------------------------------------------------------------------- models and inputs


def _set_tf_threads(inter_op: int, intra_op: int) -> None:
    """Size TensorFlow's thread pools (0 = leave TensorFlow's default). Only possible
    before TensorFlow has started running anything in this process."""
    if not inter_op and not intra_op:
        return
    import tensorflow as tf

    try:
        if inter_op:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op)
        if intra_op:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    except RuntimeError as e:
        raise BenchmarkError(f"cannot set TensorFlow's thread counts: {e} (TensorFlow was "
                             "already initialized in this process)") from None


def _tf_threads() -> dict[str, int]:
    import tensorflow as tf

    return {"inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}


def _check_saved_model_dir(path: str) -> None:
    p = Path(path)
    if not p.exists():
        raise BenchmarkError(f"model directory {path} does not exist")
    if not p.is_dir():
        raise BenchmarkError(f"{path} is a file; pass a SavedModel directory")
    if not (p / "saved_model.pb").exists() and not (p / "saved_model.pbtxt").exists():
        raise BenchmarkError(f"{path} is not a SavedModel directory (no saved_model.pb in it)")


def _labels(paths: list[str]) -> list[str]:
    names = [Path(p).resolve().name or p for p in paths]
    return names if len(set(names)) == len(names) else list(paths)


def _load(path: str, label: str, signature: str) -> _Model:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TensorFlow's start-up chatter
    import tensorflow as tf

    # A compiled model holds NeuronOp nodes, which TensorFlow knows once
    # `neuronish` is imported (it is: this module is part of it).
    import neuronish  # noqa: F401

    try:
        loaded = tf.saved_model.load(path)
    except Exception as e:  # TF raises many types here; all mean "cannot load"
        hint = ""
        if "NeuronOp" in str(e):
            hint = " (the NeuronOp kernel is not available: check that `import neuronish` works)"
        raise BenchmarkError(f"cannot load the SavedModel in {path}: {type(e).__name__}: "
                             f"{_first_line(e)}{hint}") from e
    if signature not in loaded.signatures:
        have = ", ".join(sorted(loaded.signatures)) or "none"
        raise BenchmarkError(f"{path} has no signature {signature!r} (it has: {have}); "
                             "choose one with --signature")
    fn = loaded.signatures[signature]
    _, specs = fn.structured_input_signature
    return _Model(label, str(Path(path).resolve()), loaded, fn, dict(specs))


def _check_same_inputs(first: _Model, other: _Model) -> None:
    def describe(specs: dict) -> str:
        return ", ".join(f"{k}: {v.dtype.name}{v.shape}" for k, v in sorted(specs.items()))

    a, b = first.specs, other.specs
    same = set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape.is_compatible_with(b[k].shape) for k in a)
    if not same:
        raise BenchmarkError(f"{other.path} and {first.path} take different inputs, so they "
                             f"cannot be compared: ({describe(b)}) vs ({describe(a)})")


def add_input_shape_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-shape", action="append", default=[], metavar="KEY=?,D1,...",
                   help="shape of one input's random values where the signature leaves "
                        "dimensions other than the batch free (? = the batch size)")


def parse_input_shapes(items: list[str]) -> dict[str, list[int]]:
    """--input-shape KEY=?,D1,..., repeatable (as `neuronish compile` takes it)."""
    shapes = {}
    for item in items:
        key, sep, dims = item.partition("=")
        try:
            shapes[key] = [-1 if d.strip() in ("?", "None", "-1") else int(d)
                           for d in dims.split(",")] if dims else []
        except ValueError:
            sep = ""
        if not sep or not key:
            raise BenchmarkError(f"--input-shape {item!r}: expected KEY=?,D1,... (? for the "
                                 "batch), e.g. token_ids=?,128")
    return shapes


def make_inputs(specs: dict, batch_size: int, seed: int = 0,
                shapes: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """Random inputs for a signature's `{name: tf.TensorSpec}`; dimension 0 is the batch.
    `shapes` (key -> shape, -1 for the batch) sets dimensions the signature leaves free.

    Floats are standard normal, integers uniform in [0, INT_HIGH), booleans fair
    coin flips. Raises BenchmarkError for an input it cannot fill (unknown
    non-batch dimensions, strings, a fixed batch other than `batch_size`).
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    shapes = dict(shapes or {})
    unknown = sorted(set(shapes) - set(specs))
    if unknown:
        raise BenchmarkError(f"--input-shape names {unknown}; the signature's inputs are "
                             f"{sorted(specs)}")
    for name, spec in sorted(specs.items()):
        dims = spec.shape.as_list() if spec.shape.rank is not None else None
        if name in shapes:
            given = shapes.pop(name)
            if dims is not None and (len(given) != len(dims) or any(
                    d is not None and g >= 0 and g != d for g, d in zip(given[1:], dims[1:]))):
                raise BenchmarkError(f"--input-shape {name}={','.join(map(str, given))}: the "
                                     f"signature takes {dims}")
            dims = [None if i == 0 else g for i, g in enumerate(given)]
        if dims is None:
            raise BenchmarkError(f"input {name!r} has an unknown rank; the benchmark needs "
                                 "every dimension but the batch to be fixed")
        if dims and dims[0] is not None and dims[0] != batch_size:
            raise BenchmarkError(f"input {name!r} has a fixed batch of {dims[0]} (shape {dims}); "
                                 f"pass --batch-size {dims[0]}")
        shape = [batch_size, *dims[1:]] if dims else []
        if None in shape or any(d < 0 for d in shape):
            k = next(i for i, d in enumerate(shape) if d is None or d < 0)
            example = ",".join("?" if i == 0 else "N" if d is None or d < 0 else str(d)
                               for i, d in enumerate(dims))
            raise BenchmarkError(f"input {name!r} has shape {dims}: dimension {k} is free, "
                                 f"and random inputs need a size for it: pass --input-shape "
                                 f"{name}={example} with N replaced (or --inputs with a "
                                 "TF Serving predict request holding examples)")
        dtype = np.dtype(spec.dtype.as_numpy_dtype)
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[name] = rng.integers(0, INT_HIGH, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise BenchmarkError(f"input {name!r} has dtype {spec.dtype.name}; the benchmark "
                                 "only generates numbers and booleans: pass --inputs with a "
                                 "TF Serving predict request (JSON) holding examples")
    return feeds


def inputs_from_request(path: str, specs: dict) -> dict[str, np.ndarray]:
    """The examples in a TF Serving REST predict request body at `path`, decoded for the
    signature's `{name: tf.TensorSpec}` by the model server's own rules; every input
    needs a batch (dimension 0) of at least one row."""
    from neuronish.runtime.signature import TensorSignature
    from neuronish.serving.json_codec import decode_predict, parse_body
    from neuronish.serving.status import ServingError

    try:
        body = Path(path).read_bytes()
    except OSError as e:
        raise BenchmarkError(f"--inputs {path}: {e.strerror or e}") from None
    wanted = {name: TensorSignature(name, spec.dtype.name, None if spec.shape.rank is None
                                    else tuple(-1 if d is None else d
                                               for d in spec.shape.as_list()))
              for name, spec in specs.items()}
    try:
        examples, _ = decode_predict(parse_body(body), wanted)
    except ServingError as e:
        raise BenchmarkError(f"--inputs {path}: not a predict request for this signature: "
                             f"{e.message}") from None
    for name, array in examples.items():
        dims = specs[name].shape
        if array.ndim == 0 or array.shape[0] == 0 or (
                dims.rank is not None and not dims[1:].is_compatible_with(array.shape[1:])):
            raise BenchmarkError(f"--inputs {path}: input {name!r} has shape "
                                 f"{list(array.shape)}; the signature takes {dims}, with a "
                                 "batch (dimension 0) of at least one row")
    return examples


def cycle_rows(examples: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """A batch of `batch_size` rows cycled from the examples' rows (dimension 0)."""
    return {name: np.take(a, np.arange(batch_size) % a.shape[0], axis=0)
            for name, a in examples.items()}


def _to_tensors(feeds: dict[str, np.ndarray]) -> dict:
    # Made once per batch size, so host-to-TF conversion is not part of a call.
    import tensorflow as tf

    return {name: tf.constant(value) for name, value in feeds.items()}


def _max_relative_difference(models: list[_Model], feeds: dict) -> float | None:
    """How far the other models' float outputs are from the first's (a sanity check:
    a fast model computing garbage is no win). None if no output could be compared."""
    want = {k: np.asarray(v) for k, v in _call(models[0], feeds).items()}
    worst = None
    for m in models[1:]:
        got = _call(m, feeds)
        for key, w in want.items():
            g = np.asarray(got[key]) if key in got else None
            if g is None or g.shape != w.shape or w.dtype.kind != "f" or not w.size:
                continue
            scale = max(float(np.max(np.abs(w))), 1e-30)
            diff = float(np.max(np.abs(g.astype(np.float64) - w))) / scale
            worst = diff if worst is None else max(worst, diff)
    return worst


def _call(model: _Model, feeds: dict) -> dict:
    try:
        return {k: v.numpy() for k, v in model.fn(**feeds).items()}
    except Exception as e:
        raise BenchmarkError(f"model {model.label} ({model.path}) failed: "
                             f"{type(e).__name__}: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


# --------------------------------------------------------------------------- output


def format_report(report: dict) -> str:
    """The human-readable table of a `benchmark` report."""
    models = report["models"]
    budget = (f"{report['duration_s']:g} s" if report["requests"] is None
              else f"{report['requests']} requests")
    lines = [f"signature {report['signature']!r}; per model and setting: {budget} in "
             f"{report['rounds']} alternating rounds, after {report['warmup']} warm-up calls"]
    threads = [f"{kind}-op threads {report[f'{kind}_op_threads']}"
               for kind in ("inter", "intra") if report.get(f"{kind}_op_threads")]
    if threads:
        lines.append("TensorFlow " + ", ".join(threads))
    for m in models:
        lines.append(f"  {m['label']}: {m['path']}")
    width = max(len(m["label"]) for m in models)
    lines.append(f"{'batch':>5} {'clients':>7}  {'model':<{width}} {'requests':>8} "
                 f"{'samples/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>6}")
    for r in report["results"]:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else ""
        lines.append(f"{r['batch_size']:>5} {r['concurrency']:>7}  {r['model']:<{width}} "
                     f"{r['requests']:>8} {r['throughput']:>10.1f} {r['p50_ms']:>8.2f} "
                     f"{r['p99_ms']:>8.2f} {ratio:>6}")
    if len(models) > 1:
        lines.append(f"ratio: samples/s relative to {models[0]['label']} (medians over rounds; "
                     "higher is better)")
        for batch, diff in report["output_max_relative_difference"].items():
            shown = "n/a (no float outputs in common)" if diff is None else f"{diff:.2e}"
            lines.append(f"outputs at batch {batch}: max relative difference to "
                         f"{models[0]['label']}: {shown}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
