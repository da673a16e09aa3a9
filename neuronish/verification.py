"""Compile-time verification (`compile(..., verify=True)`, `neuronish compile --verify`):
run every compiled subgraph on TensorFlow and on the device with the same example
inputs, and send back to TensorFlow each one whose outputs differ by more than
the tolerance for their dtype and the executable's auto-cast mode.

The example inputs are the model's (`model_feed_dict`), else random ones of the
compile shapes (floats ~N(0,1), integers in [0, 2), booleans); each subgraph's
own inputs are what TensorFlow computes for them from those, so a subgraph deep
in the model sees realistic values.

Error of one output: max |device - TensorFlow| / max(max |TensorFlow|, 1e-30),
the figure docs/auto-cast.md measures; any NaN or infinity where TensorFlow has
a finite value (an fp16 overflow) is an infinite error. Integer and boolean
outputs must match exactly. Tolerances (`TOLERANCES`, relative):

    output dtype       auto-cast none   matmult/all bf16   matmult/all fp16
    float32, float64   1e-4             5e-2               1e-2
    float16            1e-2             5e-2               1e-2
    integers, bool     0                0                  0

(measured on the reference models: at most 1e-6 without auto-cast, 2.4e-2 with
bf16, 3.3e-3 with fp16, so a failure is a real difference, not rounding.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import SavedModelError

TOLERANCES: dict[tuple[str, str], float] = {
    ("float", "none"): 1e-4, ("float", "bf16"): 5e-2, ("float", "fp16"): 1e-2,
    ("float16", "none"): 1e-2, ("float16", "bf16"): 5e-2, ("float16", "fp16"): 1e-2,
}


# An int8 subgraph's outputs on random example inputs: its calibrated error, doubled
# (inputs unlike the calibration set), and never below this.
INT8_TOLERANCE = 5e-2


def tolerance(dtype: str, auto_cast: str, auto_cast_type: str) -> float:
    """The largest relative error accepted for an output of `dtype` under that mode."""
    kind = np.dtype(dtype)
    if kind.kind not in "fc":
        return 0.0
    mode = "none" if auto_cast in ("none", "", None) else auto_cast_type
    return TOLERANCES[("float16" if kind == np.float16 else "float", mode)]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if want.dtype.kind not in "fc":
        return 0.0 if np.array_equal(got, want) else float("inf")
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(want64)
    if not np.array_equal(np.isfinite(got64), finite) or \
            not np.array_equal(got64[~finite], want64[~finite], equal_nan=True):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = max(float(np.max(np.abs(want64[finite]))), 1e-30)
    return float(np.max(np.abs(got64[finite] - want64[finite]))) / scale


@dataclass
class Verdict:
    """One subgraph's comparison."""

    subgraph: str
    passed: bool
    outputs: dict[str, dict]  # output name -> dtype, error, tolerance
    auto_cast: str
    reason: str = ""

    def as_dict(self) -> dict:
        return {"subgraph": self.subgraph, "passed": self.passed, "auto_cast": self.auto_cast,
                "outputs": self.outputs, **({"reason": self.reason} if self.reason else {})}


def example_feeds(placeholders: Mapping[str, tuple[Sequence[int], str]],
                  given: Mapping[str, object] | None, seed: int = 0) -> dict[str, np.ndarray]:
    """One array per input tensor: the given one, else random of its shape and dtype."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for tensor, (shape, dtype) in placeholders.items():
        if given and tensor in given:
            feeds[tensor] = np.asarray(given[tensor])
            continue
        dt = np.dtype(dtype)
        if dt.kind == "b":
            feeds[tensor] = rng.integers(0, 2, shape).astype(bool)
        elif dt.kind in "iu":
            feeds[tensor] = rng.integers(0, 2, shape).astype(dt)
        else:
            feeds[tensor] = rng.standard_normal(shape).astype(dt)
    return feeds


def tensorflow_values(graph_def: bytes, feeds: Mapping[str, np.ndarray],
                      fetches: Sequence[str]) -> dict[str, np.ndarray]:
    """`fetches` computed by TensorFlow from `feeds` in the (frozen) graph."""
    import tensorflow as tf

    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(graph_def)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        values = session.run(list(fetches), dict(feeds))
    return dict(zip(fetches, values, strict=True))


def verify_subgraph(name: str, executable: bytes, graph_def: bytes,
                    input_names: Sequence[str], output_names: Sequence[str],
                    inputs: Sequence[np.ndarray],
                    expected: Sequence[np.ndarray] | None = None) -> Verdict:
    """Run one subgraph both ways on `inputs` (in `input_names` order) and compare; with
    `expected` (TensorFlow's outputs, from the whole graph), only on the device."""
    from neuronish.runtime import DeviceError, load
    from neuronish.runtime.executable import from_bytes

    exe = from_bytes(executable)
    options = exe.compiler.get("options", {}) if isinstance(exe.compiler, dict) else {}
    auto_cast = str(options.get("auto_cast", "none") or "none")
    cast_type = str(options.get("auto_cast_type", "bf16") or "bf16")
    mode = auto_cast if auto_cast == "none" else f"{auto_cast} {cast_type}"
    int8 = exe.stats.get("quantization") if options.get("quantize") == "int8" else None
    if int8:  # (docs/int8.md) judged by what calibration measured, not by float rounding
        mode = "int8" if auto_cast == "none" else f"int8 + {mode}"
    want = dict(zip(output_names, expected, strict=True)) if expected is not None else \
        tensorflow_values(graph_def, dict(zip(input_names, inputs, strict=True)), output_names)
    try:
        model = load(executable)
        try:
            got = model.run(dict(zip(input_names, inputs, strict=True)))
        finally:
            model.unload()
    except DeviceError as e:
        return Verdict(name, False, {}, mode, f"the device could not run it: "
                                              f"{type(e).__name__}: {e}")
    outputs, worst = {}, []
    for out in output_names:
        w = np.asarray(want[out])
        err = relative_error(got[out], w)
        tol = tolerance(w.dtype.name, auto_cast, cast_type)
        if int8 and w.dtype.kind == "f":
            tol = max(tol, INT8_TOLERANCE, 2 * float(int8["output_error"]))
        outputs[out] = {"dtype": w.dtype.name, "error": err, "tolerance": tol}
        if not err <= tol:
            worst.append(f"{out} ({w.dtype.name}) relative error {err:.3g} > {tol:g}")
    reason = ("verify: " + "; ".join(worst) + f" (auto-cast {mode}); left on TensorFlow"
              if worst else "")
    return Verdict(name, not worst, outputs, mode, reason)


def _tensor(name: str) -> str:
    return name if ":" in name else f"{name}:0"


def verify_compiled(frozen_graph_def: bytes,
                    placeholders: Mapping[str, tuple[Sequence[int], str]],
                    given: Mapping[str, object] | None, compiled: list[tuple],
                    excluded: dict[str, str], batch: int = 1,
                    batched: set[str] | None = None) -> tuple[list[tuple], list[Verdict]]:
    """Check each compiled `(subgraph, CompileResult)`; returns those that passed and every
    verdict. The nodes of a failed subgraph get its reason in `excluded` (the report's
    OnTensorFlow reasons); it is not spliced, so they stay on TensorFlow. A subgraph with
    a dynamic batch is checked at the compiled `batch` and at `2 * batch + 1` (the
    placeholders in `batched` carry the batch on axis 0)."""
    import warnings

    from .errors import CompileWarning

    if not compiled:
        return compiled, []
    feeds = example_feeds(placeholders, given)
    fetches = sorted({_tensor(t) for sg, _ in compiled for t in sg.inputs})
    values = tensorflow_values(frozen_graph_def, feeds, fetches)
    # The subgraphs' own GraphDefs fix the compiled batch in their placeholders, so at
    # the other batch TensorFlow's answer for a subgraph is the whole graph's.
    other = _other_batch_values(
        frozen_graph_def, placeholders, feeds, set(given or ()), batched or set(), batch,
        sorted(set(fetches) | {_tensor(t) for sg, _ in compiled for t in sg.outputs}))
    kept, verdicts = [], []
    for sg, result in compiled:
        verdict = verify_subgraph(sg.name, result.executable, sg.serialize(), sg.input_names,
                                  sg.output_names, [values[_tensor(t)] for t in sg.inputs])
        if verdict.passed and other and any(a >= 0 for a in sg.input_batch_axes):
            # A dynamic batch runs in chunks of the compiled one: check that too, at a
            # batch that is not a multiple of it (the last chunk padded).
            again = verify_subgraph(sg.name, result.executable, sg.serialize(),
                                    sg.input_names, sg.output_names,
                                    [other[_tensor(t)] for t in sg.inputs],
                                    [other[_tensor(t)] for t in sg.outputs])
            if not again.passed:
                verdict = Verdict(sg.name, False, again.outputs, again.auto_cast,
                                  again.reason.replace("verify: ", f"verify at batch "
                                                       f"{2 * batch + 1}: ", 1))
        verdicts.append(verdict)
        if verdict.passed:
            kept.append((sg, result))
            continue
        for node in sg.node_names:
            excluded[node] = verdict.reason
        warnings.warn(f"subgraph {sg.name} ({len(sg.node_names)} nodes) failed verification, "
                      f"its nodes stay on TensorFlow: {verdict.reason}", CompileWarning,
                      stacklevel=3)
    return kept, verdicts


def _other_batch_values(frozen_graph_def: bytes,
                        placeholders: Mapping[str, tuple[Sequence[int], str]],
                        feeds: Mapping[str, np.ndarray], given: set[str], batched: set[str],
                        batch: int, fetches: Sequence[str]) -> dict[str, np.ndarray] | None:
    """TensorFlow's values of `fetches` with every batched input at batch `2 * batch + 1`:
    the given examples' rows repeated, or fresh random rows. None if nothing is batched
    or the graph refuses that batch (its batch is fixed, so it never splits)."""
    if not batched:
        return None
    other = 2 * batch + 1
    rows = np.arange(other) % batch
    shapes = {t: ((other, *shape[1:]) if t in batched else shape, dtype)
              for t, (shape, dtype) in placeholders.items()}
    fresh = example_feeds(shapes, None, seed=1)
    grown = {t: (np.take(np.asarray(v), rows, axis=0) if t in given else fresh[t])
             if t in batched else v for t, v in feeds.items()}
    try:
        return tensorflow_values(frozen_graph_def, grown, fetches)
    except Exception:  # noqa: BLE001 (TensorFlow's own refusal of that batch)
        return None


def _random_example_possible(dtype: str) -> bool:
    try:
        return np.dtype(dtype).kind in "biuf"
    except TypeError:  # string, or a dtype numpy does not name
        return False


def verify_signature(signature: object, shapes: Mapping[str, Sequence[int]],
                     model_feed_dict: Mapping[str, object] | None, compiled: list[tuple],
                     excluded: dict[str, str]) -> tuple[list[tuple], list[Verdict]]:
    """`verify_compiled` for a frozen signature (freeze.FrozenSignature) compiled at
    `shapes` (by tensor name); `model_feed_dict` is keyed by signature input key."""
    inputs = signature.inputs  # type: ignore[attr-defined]
    placeholders = {i.tensor: (shapes[i.tensor], i.dtype) for i in inputs}
    given = {i.tensor: model_feed_dict[i.key] for i in inputs
             if model_feed_dict and i.key in model_feed_dict}
    for i in inputs:
        if i.tensor not in given and not _random_example_possible(i.dtype):
            raise SavedModelError(
                f"verify=True runs the model on example inputs, and input {i.key!r} is "
                f"{i.dtype}: random values of it would not be valid input (image bytes, "
                f"text). Give an example in model_feed_dict={{{i.key!r}: ...}}")
    batch = next((int(shapes[i.tensor][0]) for i in inputs if _batched(i)), 1)
    return verify_compiled(signature.graph_def.SerializeToString(),  # type: ignore[attr-defined]
                           placeholders, given, compiled, excluded, batch,
                           {i.tensor for i in inputs if _batched(i)})


def _batched(i: object) -> bool:
    """A signature input whose first dimension is free: the batch."""
    shape = i.shape  # type: ignore[attr-defined]
    return bool(shape) and shape[0] is None
