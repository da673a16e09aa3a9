"""neuronish against its peers on this CPU: TensorFlow and OpenVINO, in one process.

    python benchmarks/peers.py                                   # every model, batch 8 and 1
    python benchmarks/peers.py --models ResNet50 --batch 8 --precisions fp32 bf16
    python benchmarks/peers.py --quick                           # a smoke run: 3 rounds
    python benchmarks/peers.py --models DenseNet121 gpt2_tiny    # any model of the zoo
    python benchmarks/peers.py --models mine --saved-model mine=DIR [--inputs mine=FEEDS.npz]

For each model (keras.applications with random weights and keras_hub's BERT-small
backbone, as `model.export` writes them, from the model cache; any other model of the zoo,
`models/third_party.py`, with its own valid inputs; or your SavedModel, `--saved-model
NAME=DIR`, fed random inputs of its signature's shapes or the samples of `--inputs
NAME=FEEDS.npz`) and batch size, one process loads every contender at once:

- TensorFlow fp32: the SavedModel's serving signature (the baseline of every ratio);
- neuronish: `neuronish.saved_model.compile` at that batch in fp32, in bf16 with
  `--auto-cast matmult` and with `--auto-cast all`, and in int8 when `compile` takes
  `quantize="int8", calibration_data=...` (said 'not available' otherwise): `int8` with
  `--auto-cast matmult` where the CPU computes bf16 (avx512_bf16 or AMX, where OpenVINO's
  default is bf16 too; what int8 leaves in float runs in bf16), `int8-fp32` without; on a
  CPU without VNNI both with `--int8-weight-bits 7` (weights in [-64, 64], which oneDNN's
  int8 kernels sum exactly there; docs/int8.md);
- OpenVINO: `ov.convert_model` of the same SavedModel, reshaped to the batch, compiled
  for the CPU with `PERFORMANCE_HINT` LATENCY and `INFERENCE_PRECISION_HINT` f32 or bf16
  (OpenVINO's default on a CPU with AMX is bf16, so f32 is asked for), and int8 from
  `nncf.quantize` over the same calibration samples neuronish gets: `int8` with the
  non-quantized layers at OpenVINO's default precision, as a user gets them (bf16 on a
  CPU with AMX), `int8-fp32` with f32 asked for. Like is compared with like: neuronish
  `int8` with OpenVINO `int8`, `int8-fp32` with `int8-fp32`; the "ran as" column says
  what each contender ran (neuronish's compiler flags, and "float32 compute" where this
  CPU has no kernels for the 16-bit type they ask for; OpenVINO's reported inference
  precision).

The calls alternate: each round calls every contender, in an order rotated from round
to round, so noise from the machine falls on all of them alike; the median over rounds
of each one's per-call time is its latency, batch / latency its throughput. Every
contender answers the same inputs and each output is compared with TensorFlow fp32's:
max |got - TF| / max |TF| per output. The CPU time other processes took meanwhile is
printed with each table (2-CPU machines are shared). OpenVINO and NNCF come from the
`bench` extra: `pip install -e '.[bench]'`; without them their rows say so.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODELS = ("ResNet50", "MobileNetV2", "EfficientNetB0", "bert_small_s128")
BATCHES = (8, 1)
# precision -> neuronish compiler flags (int8 is compile's `quantize`, not a flag)
NEURONISH_FLAGS = {
    "fp32": [],
    "bf16": ["--auto-cast", "matmult", "--auto-cast-type", "bf16"],
    "bf16-all": ["--auto-cast", "all", "--auto-cast-type", "bf16"],
    "int8": ["--auto-cast", "matmult", "--auto-cast-type", "bf16"],
    "int8-fp32": [],
}
PRECISIONS = ("fp32", "bf16", "bf16-all", "int8", "int8-fp32")
# neuronish precision -> the OpenVINO precision it is compared with
OV_PEER = {"fp32": "fp32", "bf16": "bf16", "bf16-all": "bf16", "int8": "int8",
           "int8-fp32": "int8-fp32"}
# OpenVINO precision -> INFERENCE_PRECISION_HINT (None: OpenVINO's default for the CPU)
OV_HINT = {"fp32": "f32", "bf16": "bf16", "int8": None, "int8-fp32": "f32"}
CPU_FLAGS = ("avx2", "avx_vnni", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni",
             "amx_bf16", "amx_int8", "amx_tile")


def neuronish_flags(precision: str, flags: Sequence[str]) -> list[str]:
    """The compiler flags of a neuronish contender on a CPU with `flags` (cpu_flags())."""
    if not precision.startswith("int8"):
        return NEURONISH_FLAGS[precision]
    bf16 = {"avx512_bf16", "amx_bf16"} & set(flags)
    vnni = {"avx512_vnni", "avx_vnni"} & set(flags)
    return ([] if precision == "int8-fp32" or not bf16 else NEURONISH_FLAGS["int8"]) + \
        ([] if vnni else ["--int8-weight-bits", "7"])
Feeds = dict[str, np.ndarray]


@dataclass
class Contender:
    """One way of running the model: `call()` answers the benchmark's inputs."""

    runtime: str      # tensorflow | neuronish | openvino
    precision: str    # fp32 | bf16 | bf16-all | int8 | int8-fp32
    call: Callable[[], Feeds] | None
    note: str = ""    # why `call` is None (not available, failed), or how it was set up

    @property
    def label(self) -> str:
        return f"{self.runtime} {self.precision}"


@dataclass
class Result:
    """A contender's measurement and errors against TensorFlow fp32."""

    contender: Contender
    seconds: list[float] = field(default_factory=list)   # per-call time, one per round
    errors: dict[str, float] = field(default_factory=dict)  # output -> max rel. error


def output_errors(got: Feeds, want: Feeds) -> dict[str, float]:
    """Per output of `want`: max |got - want| / max |want| (inf when the output is missing
    or its shape differs), computed in float64."""
    errors = {}
    for key, w in sorted(want.items()):
        w = np.asarray(w, dtype=np.float64)
        g = got.get(key)
        if g is None or np.shape(g) != w.shape:
            errors[key] = float("inf")
            continue
        scale = max(float(np.max(np.abs(w))) if w.size else 0.0, 1e-30)
        diff = np.abs(np.asarray(g, dtype=np.float64) - w)
        errors[key] = float(np.max(diff)) / scale if w.size else 0.0
    return errors


def measure(contenders: Sequence[Contender], *, rounds: int, warmup: int,
            round_seconds: float) -> dict[str, list[float]]:
    """Per-call seconds of each runnable contender, one figure per round.

    A round calls every contender `n` times back to back (n chosen in the warm-up so a
    turn lasts about `round_seconds`) and records the mean; the order rotates each round.
    """
    live = [c for c in contenders if c.call is not None]
    calls = {}
    for c in live:
        start = time.perf_counter()
        for _ in range(max(warmup, 1)):
            c.call()
        each = (time.perf_counter() - start) / max(warmup, 1)
        calls[c.label] = max(1, round(round_seconds / max(each, 1e-6)))
    times: dict[str, list[float]] = {c.label: [] for c in live}
    for r in range(rounds):
        shift = r % len(live) if live else 0
        for c in live[shift:] + live[:shift]:
            n = calls[c.label]
            start = time.perf_counter()
            for _ in range(n):
                c.call()
            times[c.label].append((time.perf_counter() - start) / n)
    return times


@dataclass
class Row:
    """One line of the table."""

    model: str
    batch: int
    runtime: str
    precision: str
    latency_ms: float | None
    throughput: float | None
    vs_tf: float | None
    vs_openvino: float | None
    errors: dict[str, float]
    note: str         # what the contender ran as, or why it has no figures


def summarize(model: str, batch: int, results: Sequence[Result]) -> list[Row]:
    """Medians and ratios: throughput over TensorFlow fp32's, and a neuronish row's over
    OpenVINO's of the matching precision (`OV_PEER`)."""
    tput = {}
    for r in results:
        if r.seconds:
            tput[r.contender.runtime, r.contender.precision] = (
                batch / statistics.median(r.seconds))
    tf = tput.get(("tensorflow", "fp32"))
    rows = []
    for r in results:
        c = r.contender
        t = tput.get((c.runtime, c.precision))
        peer = tput.get(("openvino", OV_PEER[c.precision])) if c.runtime == "neuronish" else None
        rows.append(Row(model, batch, c.runtime, c.precision,
                        batch / t * 1000 if t else None, t,
                        t / tf if t and tf else None,
                        t / peer if t and peer else None, r.errors, c.note))
    return rows


def format_errors(errors: dict[str, float]) -> str:
    if not errors:
        return ""
    if len(errors) == 1:
        return f"{next(iter(errors.values())):.1e}"
    return ", ".join(f"{k} {v:.1e}" for k, v in errors.items())


def format_table(rows: Sequence[Row]) -> str:
    """The markdown table of docs/performance.md."""
    lines = ["| model | batch | runtime | precision | samples/s | latency ms | vs TF | "
             "vs OpenVINO | max rel. error vs TF fp32 | ran as |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def num(v: float | None, fmt: str) -> str:
        return "" if v is None else format(v, fmt)

    for r in rows:
        if r.throughput is None:
            cells = ["", "", "", "", "", r.note]
        else:
            cells = [num(r.throughput, ".1f"), num(r.latency_ms, ".2f"),
                     num(r.vs_tf, ".2f") + "x" * (r.vs_tf is not None),
                     num(r.vs_openvino, ".2f") + "x" * (r.vs_openvino is not None),
                     format_errors(r.errors), r.note]
        lines.append(f"| {r.model} | {r.batch} | {r.runtime} | {r.precision} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- inputs -----------------------------------------------------------------------

def model_inputs(model: str, signature: object, batch: int, seed: int,
                 samples: Feeds | None = None) -> Feeds:
    """Inputs of `batch` for `model`'s serving signature: rows of `samples` (the user's,
    from --inputs) taken from row `seed * batch` on, cycling; else the zoo's valid inputs
    for a model of the zoo (BERT tokens within the vocabulary, images ~N(0, 1)); else
    random ones of the signature's shapes (floats ~N(0, 1), integers 0 or 1)."""
    from models import peer_models, third_party

    if samples is not None:
        rows = len(next(iter(samples.values())))
        take = [(seed * batch + i) % rows for i in range(batch)]
        return {k: v[take] for k, v in samples.items()}
    if model in peer_models.BUILDERS:
        return peer_models.bert_inputs(batch, seed)
    if model in third_party.ALL:
        return third_party.example_inputs(model, signature, batch, seed)
    _, specs = signature.structured_input_signature
    rng = np.random.default_rng(seed)
    feeds = {}
    for key, spec in sorted(specs.items()):
        dims = spec.shape.as_list()
        if None in dims[1:]:
            raise SystemExit(f"{model}: input '{key}' has shape {dims}, free beyond the batch "
                             f"axis; give samples of the size to measure with --inputs "
                             f"{model}=FEEDS.npz (one array per input, samples on axis 0)")
        dtype, shape = spec.dtype, [batch, *dims[1:]]
        if dtype.is_floating:
            feeds[key] = rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
        elif dtype.is_integer or dtype.is_bool:
            feeds[key] = rng.integers(0, 2, shape).astype(dtype.as_numpy_dtype)
        else:
            raise SystemExit(f"{model}: input '{key}' is {dtype.name}; give samples with "
                             f"--inputs {model}=FEEDS.npz")
    return feeds


def calibration_samples(model: str, signature: object, count: int,
                        samples: Feeds | None = None, batch: int = 0) -> list[Feeds]:
    """`count` single samples (batch 1), apart from the measured inputs: other seeds, or
    the user's samples taken from the last row back (the measured `batch` is cut from
    the first), said on stderr when there are too few for the two not to overlap."""
    if samples is None:
        return [model_inputs(model, signature, 1, 1000 + i) for i in range(count)]
    rows = len(next(iter(samples.values())))
    if count + batch > rows:
        print(f"{model}: {rows} samples for a batch of {batch} and {count} calibration "
              "samples: int8 is calibrated on some of the inputs it is measured on",
              file=sys.stderr)
    return [{k: v[[(rows - 1 - i) % rows]] for k, v in samples.items()} for i in range(count)]


def read_samples(path: str, signature: object) -> Feeds:
    """--inputs FEEDS.npz: one array per input of the signature, the same number of
    samples (axis 0) in each, of the input's dtype; refused naming what does not fit."""
    _, specs = signature.structured_input_signature
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    if set(arrays) != set(specs):
        raise SystemExit(f"{path}: has arrays {sorted(arrays)}; the serving signature's inputs "
                         f"are {sorted(specs)}")
    counts = {k: (len(v) if v.ndim else 0) for k, v in arrays.items()}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise SystemExit(f"{path}: every array needs the same number (>= 1) of samples on "
                         f"axis 0; got {counts}")
    for key, spec in specs.items():
        want = spec.dtype.as_numpy_dtype
        if arrays[key].dtype != want:
            raise SystemExit(f"{path}: '{key}' is {arrays[key].dtype}; the signature takes "
                             f"{np.dtype(want).name}")
    return arrays


def batched(samples: Sequence[Feeds], batch: int) -> list[Feeds]:
    """The samples stacked into feeds of `batch` (what neuronish compiles for)."""
    return [{k: np.concatenate([s[k] for s in samples[i:i + batch]]) for k in samples[0]}
            for i in range(0, len(samples) - batch + 1, batch)]


# ---- contenders ---------------------------------------------------------------------

def tensorflow_contender(saved_model: str, feeds: Feeds) -> Contender:
    import tensorflow as tf

    fn = tf.saved_model.load(saved_model).signatures["serving_default"]
    args = {k: tf.constant(v) for k, v in feeds.items()}
    return Contender("tensorflow", "fp32", lambda: {k: v.numpy() for k, v in fn(**args).items()},
                     "float32")


def int8_available() -> bool:
    """Whether this neuronish's `saved_model.compile` quantizes (branch perf-int8)."""
    import neuronish

    params = inspect.signature(neuronish.saved_model.compile).parameters
    return "quantize" in params and "calibration_data" in params


def neuronish_contender(saved_model: str, model: str, workdir: str, batch: int,
                        precision: str, feeds: Feeds,
                        calibration: Sequence[Feeds]) -> Contender:
    import tensorflow as tf

    import neuronish

    int8 = precision.startswith("int8")
    if int8 and not int8_available():
        return Contender("neuronish", precision, None,
                         "not available (saved_model.compile has no quantize=)")
    extra = ({"quantize": "int8", "calibration_data": batched(calibration, batch)}
             if int8 else {})
    dst = compiled_dir(workdir, model, precision, batch)
    flags = neuronish_flags(precision, cpu_flags())
    try:
        # compiled for the measured shapes, as OpenVINO's model is reshaped to them (a
        # signature's free lengths would otherwise compile at run time, in the timed calls)
        neuronish.saved_model.compile(saved_model, dst, batch_size=batch,
                                      model_shape_feed_dict={k: list(v.shape)
                                                             for k, v in feeds.items()},
                                      compiler_args=flags, **extra)
    except Exception as e:  # a contender that cannot be built is a row, not a crash
        return Contender("neuronish", precision, None, f"compile failed: {_first_line(e)}")
    fn = tf.saved_model.load(dst).signatures["serving_default"]
    args = {k: tf.constant(v) for k, v in feeds.items()}
    from neuronish.cc.host import cpu_flags as all_cpu_flags

    return Contender("neuronish", precision,
                     lambda: {k: v.numpy() for k, v in fn(**args).items()},
                     neuronish_ran_as(int8, flags, all_cpu_flags()))


def neuronish_ran_as(int8: bool, flags: Sequence[str], cpu: set[str]) -> str:
    """The "ran as" column of a neuronish contender: its compile flags, and where this CPU
    has no kernels for the 16-bit type they ask for, that it computes in float32 (as the
    compile report notes; OpenVINO's column says "inference precision f32" there)."""
    from neuronish.cc.host import auto_cast_note

    ran = " ".join(["--quantize int8"] * int8 + list(flags)) or "float32"
    if "--auto-cast" in flags:
        cast_type = flags[flags.index("--auto-cast-type") + 1] \
            if "--auto-cast-type" in flags else "bf16"
        if auto_cast_note(cast_type, cpu):
            ran += f" ({cast_type} values, float32 compute: no {cast_type} kernels here)"
    return ran


def compiled_dir(workdir: str, model: str, precision: str, batch: int) -> str:
    """Where neuronish's compiled SavedModel of `model` goes (kept until the run ends)."""
    return os.path.join(workdir, f"{model}-neuronish-{precision}-b{batch}")


def openvino_available() -> str | None:
    """None if OpenVINO and NNCF import, else why not."""
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401
    except ImportError as e:
        return f"not available ({e.name} not installed: pip install -e '.[bench]')"
    return None


def openvino_contender(saved_model: str, model: str, batch: int, precision: str,
                       feeds: Feeds, calibration: Sequence[Feeds]) -> Contender:
    missing = openvino_available()
    if missing:
        return Contender("openvino", precision, None, missing)
    import openvino as ov

    try:
        ov_model = ov.convert_model(saved_model)
        config = {"PERFORMANCE_HINT": "LATENCY"}
        if precision.startswith("int8"):
            ov_model = _nncf_int8(ov_model, model, calibration)  # at free batch
        if OV_HINT[precision]:
            config["INFERENCE_PRECISION_HINT"] = OV_HINT[precision]
        ov_model.reshape({i.get_any_name(): [batch, *feeds[i.get_any_name()].shape[1:]]
                          for i in ov_model.inputs})
        compiled = ov.Core().compile_model(ov_model, "CPU", config)
    except Exception as e:
        return Contender("openvino", precision, None, f"failed: {_first_line(e)}")
    request = compiled.create_infer_request()
    names = {o.get_any_name(): o for o in compiled.outputs}
    inputs = {k: np.ascontiguousarray(v) for k, v in feeds.items()}

    def call() -> Feeds:
        request.infer(inputs)
        return {k: request.get_tensor(o).data.copy() for k, o in names.items()}

    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    hint = hint.get_type_name() if hasattr(hint, "get_type_name") else hint  # (an ov.Type)
    nncf = "NNCF int8, " * precision.startswith("int8")
    return Contender("openvino", precision, call, f"{nncf}inference precision {hint}")


_NNCF: dict[tuple[str, int], object] = {}  # (model, calibration set) -> quantized model


def _nncf_int8(ov_model: object, model: str, calibration: Sequence[Feeds]) -> object:
    """NNCF's int8 of `ov_model`, quantized once per model and calibration set (int8 and
    int8-fp32 differ only in how OpenVINO compiles it)."""
    import nncf

    from models import peer_models

    key = (model, id(calibration))
    if key not in _NNCF:
        kind = nncf.ModelType.TRANSFORMER if model in peer_models.BUILDERS else None
        dataset = nncf.Dataset(list(calibration))
        _NNCF.clear()
        _NNCF[key] = nncf.quantize(ov_model, dataset, subset_size=len(calibration),
                                   model_type=kind)
    return _NNCF[key].clone()  # (the caller reshapes its copy)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:160]


# ---- the run ------------------------------------------------------------------------

class OtherLoad:
    """CPUs' worth of time other processes used while this one measured: the machine's
    busy time (/proc/stat) less this process's own CPU time."""

    def __enter__(self) -> OtherLoad:
        self._start = (time.perf_counter(), _busy_seconds(), _own_seconds())
        return self

    def __exit__(self, *exc: object) -> None:
        wall0, busy0, own0 = self._start
        wall = time.perf_counter() - wall0
        self.cpus = max(0.0, (_busy_seconds() - busy0) - (_own_seconds() - own0)) / wall


def _busy_seconds() -> float:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return float("nan")
    ticks = [int(f) for f in fields]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_flags() -> list[str]:
    """The flags of CPU_FLAGS this CPU has, in that order."""
    from neuronish.cc.host import cpu_flags as present

    have = present()
    return [f for f in CPU_FLAGS if f in have]


def run_model(model: str, batch: int, precisions: Sequence[str], runtimes: Sequence[str],
              workdir: str, *, rounds: int, warmup: int, round_seconds: float,
              calibration_count: int, saved_model: str | None = None,
              samples_file: str | None = None) -> tuple[list[Row], float]:
    """Build every contender for `model` at `batch`, check and time them; the rows and
    the CPUs other processes used meanwhile."""
    import tensorflow as tf

    from models.cache import cached_saved_model

    src = saved_model or cached_saved_model(model)
    signature = tf.saved_model.load(src).signatures["serving_default"]
    samples = read_samples(samples_file, signature) if samples_file else None
    feeds = model_inputs(model, signature, batch, 0, samples)
    calibration = calibration_samples(model, signature, calibration_count, samples, batch)
    contenders = [tensorflow_contender(src, feeds)]
    for p in precisions:
        if "neuronish" in runtimes:
            print(f"  compiling neuronish {p} ...", file=sys.stderr, flush=True)
            contenders.append(neuronish_contender(src, model, workdir, batch, p, feeds,
                                                  calibration))
    for p in dict.fromkeys(OV_PEER[p] for p in precisions):
        if "openvino" in runtimes:
            print(f"  compiling openvino {p} ...", file=sys.stderr, flush=True)
            contenders.append(openvino_contender(src, model, batch, p, feeds, calibration))
    want = contenders[0].call()
    results = []
    for c in contenders:
        errors = {}
        if c.call is not None:
            try:
                errors = output_errors(c.call(), want)
            except Exception as e:
                c.call, c.note = None, f"call failed: {_first_line(e)}"
        results.append(Result(c, errors=errors))
    with OtherLoad() as load:
        times = measure([r.contender for r in results], rounds=rounds, warmup=warmup,
                        round_seconds=round_seconds)
    for r in results:
        r.seconds = times.get(r.contender.label, [])
    return summarize(model, batch, results), load.cpus


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), metavar="MODEL")
    p.add_argument("--batch", nargs="+", type=int, default=list(BATCHES))
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--runtimes", nargs="+", default=["neuronish", "openvino"],
                   choices=["neuronish", "openvino"], help="besides TensorFlow fp32")
    p.add_argument("--rounds", type=int, default=9, help="rounds (medians; at least 7)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per contender")
    p.add_argument("--round-seconds", type=float, default=0.5,
                   help="about how long each contender's turn in a round lasts")
    p.add_argument("--calibration", type=int, default=32,
                   help="calibration samples for int8 (both neuronish and NNCF)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 3 rounds, 1 warm-up call, short turns, 8 samples")
    p.add_argument("--saved-model", action="append", default=[], metavar="NAME=DIR",
                   help="your SavedModel, measured as model NAME (name it in --models)")
    p.add_argument("--inputs", action="append", default=[], metavar="NAME=FEEDS.npz",
                   help="samples for model NAME: one array per serving input, samples on "
                   "axis 0 (the measured batch and the int8 calibration are cut from them)")
    p.add_argument("--out", help="also write the markdown tables and JSON rows here (prefix)")
    args = p.parse_args(argv)
    saved_models = _named_paths(p, "--saved-model", args.saved_model)
    inputs = _named_paths(p, "--inputs", args.inputs)
    for name in (*saved_models, *inputs):
        if name not in args.models:
            p.error(f"{name} is given a path but is not in --models {' '.join(args.models)}")
    if args.quick:
        args.rounds, args.warmup, args.round_seconds, args.calibration = 3, 1, 0.1, 8

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from neuronish.runtime.native import engine_name

    versions = {"tensorflow": tf.__version__, "engine": engine_name()}
    if not openvino_available():
        import nncf
        import openvino

        versions.update(openvino=openvino.get_version(), nncf=nncf.__version__)
    print(f"CPU flags: {' '.join(cpu_flags())}; CPUs: {os.cpu_count()}; "
          + "; ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"load average at start: {os.getloadavg()[0]:.2f}; neuronish int8: "
          f"{'available' if int8_available() else 'not available'}; "
          f"OpenVINO: {openvino_available() or 'available'}", flush=True)
    all_rows, loads = [], []
    with tempfile.TemporaryDirectory(prefix="peers-") as workdir:
        for batch in args.batch:
            for model in args.models:
                print(f"{model} batch {batch}:", file=sys.stderr, flush=True)
                rows, other = run_model(model, batch, args.precisions, args.runtimes, workdir,
                                        rounds=args.rounds, warmup=args.warmup,
                                        round_seconds=args.round_seconds,
                                        calibration_count=args.calibration,
                                        saved_model=saved_models.get(model),
                                        samples_file=inputs.get(model))
                print(format_table(rows))
                print(f"(other processes used {other:.2f} CPUs while this was measured; "
                      f"load average {os.getloadavg()[0]:.2f})\n", flush=True)
                all_rows += rows
                loads.append({"model": model, "batch": batch, "other_cpus": round(other, 2)})
                gc.collect()
    table = format_table(all_rows)
    print(table)
    if args.out:
        Path(args.out + ".md").write_text(table + "\n")
        Path(args.out + ".json").write_text(json.dumps(
            {"versions": versions, "cpu_flags": cpu_flags(), "loads": loads,
             "rows": [r.__dict__ for r in all_rows], "argv": sys.argv[1:]}, indent=1))
    return 0


def _named_paths(parser: argparse.ArgumentParser, flag: str, given: Sequence[str]
                 ) -> dict[str, str]:
    """NAME=PATH arguments as {NAME: PATH}; the path must exist."""
    named = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(f"{flag} {item!r}: expected NAME=PATH")
        if not os.path.exists(path):
            parser.error(f"{flag} {item!r}: {path} does not exist")
        named[name] = path
    return named


if __name__ == "__main__":
    raise SystemExit(main())
