"""`--quantize int8`: post-training quantization from a calibration set (docs/int8.md).

The compiler calibrates itself: it runs the graph (as the passes before this one left
it, so every range belongs to a value the device will hold) on the calibration samples
with the numpy reference kernels, and records each value's range. Then every float32
conv2d (one group), depthwise_conv2d and matmul with constant weights becomes
`conv2d_int8` (`depthwise` for the second) / `matmul_int8`, except where `stays_float`
gives a reason (a convolution writing one pixel per image); the report lists those too:

- weights: int8, symmetric, one step per output channel (max |w| / 127); with
  `weight_bits=7` (`--int8-weight-bits 7`), max |w| / 64, so every weight is in
  [-64, 64] and oneDNN's int8 kernels are exact on CPUs without VNNI too (their int16
  pair sums, at most 2·255·64 in magnitude, cannot saturate; docs/int8.md);
- activations: one step per tensor, uint8 when the calibrated range is non-negative
  (after a ReLU: all 256 levels), else symmetric int8; no zero points;
- biases corrected (as NNCF's fast bias correction): each quantized instruction's bias
  absorbs the shift that quantization gives its output's mean per channel on the
  calibration set (`_BiasShift`), so later layers see the float32 means;
- a `quantize` instruction only where a quantized instruction reads a float value (the
  edge of an int8 region); an instruction whose every reader is a quantized instruction
  reading it as its input or as its residual writes 8 bits itself (requantized in its
  epilogue), so a chain of convolutions, ResNet's shortcuts included, passes uint8 from
  one to the next; the rest write float32 (dequantized in the epilogue, with bias,
  residual and activation in float32).

Accuracy control (like NNCF's `quantize_with_accuracy_control`): each instruction's
cost is the relative error of its own output when it alone is quantized (from float32
inputs); with `max_error`, the costliest are kept in float32 (then `--auto-cast`
applies to them) until the outputs' error on the calibration set is within the bound.
Errors are relative: max |quantized − float32| / max |float32| over the calibration
set, the worst output. The result, per instruction, is the executable's
`stats["quantization"]` (`neuronish-cc inspect`, the compile report).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from neuronish.runtime.kernels import evaluate
from neuronish.runtime.kernels.quantized import inverse, quantize_into

from ..errors import InvalidGraph
from ..host import int8_note
from ..interpret import run_node
from ..ir import Graph, Node, TensorType, Value, constant
from .choices import WHY as DECIDES
from .choices import deciding
from .dtypes import assign_dtypes

QUANTIZABLE = ("conv2d", "depthwise_conv2d", "matmul")


@dataclass
class QuantizeReport:
    """What the pass decided, for the executable's stats (filled in by `quantize_int8`)."""

    samples: int = 0
    max_error: float | None = None
    output_error: float = 0.0        # of the graph as compiled, on the calibration set
    all_int8_error: float = 0.0      # had every candidate been quantized
    bias_correction: dict | None = None  # how many biases, the errors with and without
    rows: list[dict] = field(default_factory=list)
    kept: dict[int, Node] = field(default_factory=dict)  # row -> its float node (for auto-cast)

    weight_bits: int = 8
    note: str | None = None  # about the compiling CPU (cc/host.py int8_note)

    def to_stats(self) -> dict:
        rows = []
        for i, row in enumerate(self.rows):
            node = self.kept.get(i)
            precision = row["precision"] if node is None else \
                node.attrs.get("compute", "float32")
            rows.append({**row, "precision": precision})
        weights = "s8" if self.weight_bits == 8 else f"s8 holding {self.weight_bits} bits"
        return {"scheme": f"int8: weights per output channel ({weights}, symmetric), "
                          "activations per tensor (u8 or s8, no zero point)",
                "weight_bits": self.weight_bits,
                "samples": self.samples, "max_error": self.max_error,
                "output_error": self.output_error, "all_int8_error": self.all_int8_error,
                "bias_correction": self.bias_correction,
                "instructions": rows, **({"note": self.note} if self.note else {})}


@dataclass(frozen=True)
class QParams:
    scale: float
    dtype: str  # uint8 or int8


def qparams(lo: float, hi: float) -> QParams:
    """One step per tensor from a calibrated range [lo, hi]."""
    if lo >= 0:
        return QParams(_step(hi / 255.0), "uint8")
    return QParams(_step(max(-lo, hi) / 127.0), "int8")


def _step(s: float) -> float:
    return float(s) if np.isfinite(s) and s > 1e-30 else 1.0


WEIGHT_BITS = (8, 7)


def quantize_weights(w: np.ndarray, axes: tuple[int, ...],
                     bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """int8 weights and their float32 step per output channel: symmetric, max |w| / 127
    (or / 64 for `bits` 7: 7-bit magnitudes)."""
    top = 127 if bits == 8 else 2 ** (bits - 1)
    amax = np.max(np.abs(w), axis=axes).astype(np.float64)
    scale = np.where(amax > 0, amax / top, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale), -top, top).astype(np.int8)
    return q, scale


def quantizable(graph: Graph) -> list[Node]:
    """The instructions int8 can take: float32 conv2d (one group), depthwise_conv2d and
    matmul whose weights are constants."""
    out = []
    for n in graph.nodes:
        if n.kind not in QUANTIZABLE or n.inputs[0].dtype != "float32" or \
                not n.inputs[1].is_const or n.inputs[1].dtype != "float32" or \
                n.attrs.get("compute", "float32") != "float32":
            continue
        if n.kind == "conv2d" and n.attrs.get("groups", 1) == 1 or n.kind == "depthwise_conv2d":
            out.append(n)
        elif n.kind == "matmul" and len(n.inputs[1].shape) == 2 and \
                not n.attrs.get("transpose_a") and len(n.inputs[0].shape) >= 2:
            out.append(n)
    return out


ONE_PIXEL = ("one pixel per image: as fast in float and more accurate; int8 would need a "
             "quantize of its input (docs/performance.md, EfficientNetB0 int8)")


def stays_float(n: Node) -> str | None:
    """Why the quantizable `n` is left in float (then `--auto-cast` applies to it), or None.

    A convolution writing one pixel per image (EfficientNet's squeeze-excite pairs on the
    pooled [N, 1, 1, C]): a few hundred thousand products at most, ~10-30 us each in
    bf16 or int8 alike, while in int8 the first of a pair needs a `quantize` of the
    pooled mean (one more instruction per block). EfficientNetB0 at batch 8 with all 32
    in int8 was no faster (whole model and one block alone, docs/performance.md), and
    where the excitation is active bf16 gave each of them 2.5-5x less error."""
    if n.kind in ("conv2d", "depthwise_conv2d"):
        _, h, w, _ = n.outputs[0].shape
        if h * w == 1:
            return ONE_PIXEL
    return None


# --- the calibration set ----------------------------------------------------------------

def load_calibration(path: str, input_names: Sequence[str]) -> list[list[np.ndarray]]:
    """Samples from an .npz file holding, per graph input name, an array [S, *shape]: S
    samples, each one call's input at the compiled shape."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise InvalidGraph(f"--calibration {path}: not a readable .npz file ({e})") from None
    missing = [n for n in input_names if n not in arrays]
    if missing:
        raise InvalidGraph(f"--calibration {path} has no array for input(s) {missing} "
                           f"(it has {sorted(arrays)}); it needs one [samples, *shape] "
                           "array per io-config input")
    counts = {n: arrays[n].shape[0] if arrays[n].ndim else 0 for n in input_names}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise InvalidGraph(f"--calibration {path}: every input needs the same number (>= 1) "
                           f"of samples along axis 0, got {counts}")
    n = next(iter(counts.values())) if counts else 0
    return [[arrays[name][k] for name in input_names] for k in range(n)]


def check_calibration(graph: Graph, samples: Sequence[Sequence[np.ndarray]]) -> None:
    """Every sample has one array per graph input, of its compiled shape (cast to its
    dtype in place of the list); a mismatch names the input."""
    if not samples:
        raise InvalidGraph("calibration needs at least one sample")
    for k, sample in enumerate(samples):
        if len(sample) != len(graph.inputs):
            raise InvalidGraph(f"calibration sample {k} has {len(sample)} arrays for "
                               f"{len(graph.inputs)} inputs")
        for j, (v, a) in enumerate(zip(graph.inputs, sample)):
            a = np.asarray(a)
            if tuple(a.shape) != tuple(v.shape):
                raise InvalidGraph(f"calibration sample {k}, input {v.name!r}: shape "
                                   f"{list(a.shape)}, but the graph is compiled for "
                                   f"{list(v.shape)}")
            if not np.can_cast(a.dtype, v.dtype, "same_kind"):
                raise InvalidGraph(f"calibration sample {k}, input {v.name!r}: dtype "
                                   f"{a.dtype}, expected {v.dtype}")
            sample[j] = a.astype(v.dtype, copy=False)  # type: ignore[index]


# --- running the graph on the calibration set --------------------------------------------

def _run(graph: Graph, feeds: Sequence[np.ndarray], on_node: Callable | None = None
         ) -> list[np.ndarray]:
    """The graph's outputs; `on_node(index, node, args, outs)` sees every node run. Values
    are dropped after their last reader (a large model's activations do not all fit)."""
    last: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v.id] = i
    keep = {v.id for v in graph.outputs}
    env = {v.id: np.asarray(x) for v, x in zip(graph.inputs, feeds)}

    def get(v: Value) -> np.ndarray:
        return v.data if v.is_const else env[v.id]

    for i, node in enumerate(graph.nodes):
        args = [get(v) for v in node.inputs]
        outs = run_node(node, args)
        if on_node is not None:
            on_node(i, node, args, outs)
        for v in node.inputs:
            if last.get(v.id) == i and v.id not in keep and not v.is_const:
                env.pop(v.id, None)
        for out, arr in zip(node.outputs, outs):
            env[out.id] = arr
    return [np.array(get(v)) for v in graph.outputs]


class _Ranges:
    """Each watched value's range on the calibration set: its extremes over the whole
    set, or with `mean` the mean over images of each image's minimum and maximum (NNCF's
    default for per-tensor activations, MEAN_MINMAX; an image is one entry along axis 0
    of a 4-D NHWC value, else one calibration sample). The extremes are the default:
    averaging narrows the step but saturates each image's outliers, and on ResNet50
    (peers.py's input) it raised the int8 error from 9.7e-3 to 1.1e-2 (7.6e-3 against
    7.0e-3 with bias correction), on the small CNN of tests/runtime/test_int8.py from
    6e-3 to 5e-2 (docs/performance.md). NaN and inf are ignored."""

    def __init__(self, mean: bool = False) -> None:
        self.mean = mean
        self.lo: dict[int, float] = {}
        self.hi: dict[int, float] = {}
        self.seen: dict[int, int] = {}
        self.floor: dict[int, float] = {}  # the least value seen: is the value signed?

    def see(self, v: Value, a: np.ndarray) -> None:
        a = np.asarray(a)
        if a.size == 0:
            return
        rows = a.reshape(a.shape[0] if a.ndim == 4 else 1, -1)
        finite = np.isfinite(rows)
        ok = finite.any(axis=1)
        if not ok.any():
            return
        lows = np.where(finite, rows, np.inf).min(axis=1)[ok].astype(np.float64)
        highs = np.where(finite, rows, -np.inf).max(axis=1)[ok].astype(np.float64)
        self.floor[v.id] = min(self.floor.get(v.id, np.inf), float(lows.min()))
        if self.mean:  # running sums, divided by the count in params()
            self.lo[v.id] = self.lo.get(v.id, 0.0) + float(lows.sum())
            self.hi[v.id] = self.hi.get(v.id, 0.0) + float(highs.sum())
            self.seen[v.id] = self.seen.get(v.id, 0) + int(ok.sum())
        else:
            self.lo[v.id] = min(self.lo.get(v.id, np.inf), float(lows.min()))
            self.hi[v.id] = max(self.hi.get(v.id, -np.inf), float(highs.max()))
            self.seen[v.id] = 1

    def params(self, v: Value) -> QParams:
        n = self.seen.get(v.id, 0)
        if not n:
            return qparams(0.0, 0.0)
        lo, hi = self.lo[v.id] / n, self.hi[v.id] / n
        if self.floor[v.id] < 0 <= lo:  # negative on some image only: still signed
            return QParams(_step(hi / 127.0), "int8")
        return qparams(lo, hi)


class _ErrorMeter:
    """max |got − want| / max |want| over samples, the worst of several outputs."""

    def __init__(self, n: int) -> None:
        self.diff = [0.0] * n
        self.ref = [0.0] * n

    def add(self, k: int, got: np.ndarray, want: np.ndarray) -> None:
        g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
        fin = np.isfinite(w)
        self.diff[k] = max(self.diff[k], float(np.max(np.abs(g - w)[fin], initial=0.0)))
        self.ref[k] = max(self.ref[k], float(np.max(np.abs(w[fin]), initial=0.0)))

    def value(self) -> float:
        return max((d / r if r > 0 else d for d, r in zip(self.diff, self.ref)), default=0.0)


# --- the rewrite -----------------------------------------------------------------------------

def _int8_node(n: Node, x: Value, xp: QParams, out: QParams | None,
               bias: np.ndarray | None = None, weight_bits: int = 8) -> Node:
    """n (conv2d or matmul) as its int8 instruction reading the quantized `x`; `bias`,
    when given, replaces n's constant bias (its bias-corrected value)."""
    a = n.attrs
    common = {"activation": a.get("activation", "none"), "alpha": a.get("alpha", 0.2),
              "out": out.dtype if out else "float32", "y_scale": out.scale if out else 1.0}
    if n.kind in ("conv2d", "depthwise_conv2d"):
        depthwise = n.kind == "depthwise_conv2d"  # w [KH, KW, C, M]: a step per (c, m)
        wq, ws = quantize_weights(n.inputs[1].data, (0, 1) if depthwise else (0, 1, 2),
                                  weight_bits)
        attrs = {k: a[k] for k in ("strides", "dilations", "pads")}
        attrs.update(x_scale=xp.scale, depthwise=depthwise, residual=bool(a.get("residual")),
                     **common)
        ws = ws.reshape(-1)
        kind = "conv2d_int8"
    else:
        w = n.inputs[1].data
        wq, ws = quantize_weights(w.T if a.get("transpose_b") else w, (0,), weight_bits)
        attrs = {"a_scale": xp.scale, "residual": bool(a.get("residual")), **common}
        kind = "matmul_int8"
    extras = list(n.inputs[2:])
    if bias is not None:
        extras[0] = constant(bias)
    node = Node(kind, [x, constant(wq), constant(ws), *extras], [], attrs, n.origin)
    dtype = out.dtype if out else "float32"
    node.outputs = [Value(TensorType(n.outputs[0].shape, dtype), producer=node)]
    return node


def rewrite(graph: Graph, chosen: set[int], ranges: _Ranges,
            biases: dict[int, np.ndarray] | None = None,
            weight_bits: int = 8) -> tuple[Graph, dict[int, Node]]:
    """A new graph with the nodes at indices `chosen` quantized (with the corrected
    `biases` by node index); the originals are left untouched. Also returns index -> new
    node for the nodes not chosen."""
    biases = biases or {}
    chosen_nodes = {id(graph.nodes[i]) for i in chosen}
    readers = graph.consumers()
    outputs = {v.id for v in graph.outputs}

    def eight_bit_use(u: Node, v: Value) -> bool:
        """u reads v only as its input, or (a conv) as its residual; or u is a max pool
        that can pass v on in 8 bits."""
        if passes_8_bit(u):
            return True
        residual = u.kind == "conv2d" and bool(u.attrs.get("residual"))
        uses = [k for k, w in enumerate(u.inputs) if w is v]
        return id(u) in chosen_nodes and all(
            k == 0 or (residual and k == len(u.inputs) - 1) for k in uses)

    def eight_bit_out(n: Node) -> bool:
        v = n.outputs[0]
        users = readers.get(v.id, [])
        return v.id not in outputs and bool(users) and all(eight_bit_use(u, v) for u in users)

    def passes_8_bit(u: Node) -> bool:
        """A max pool whose output only 8-bit readers take: it pools the 8-bit values as
        they are, at their producer's step (the max of quantized values is the quantized
        max, the quantization being monotone), so ResNet's stem writes uint8 and its pool
        reads half the bytes, with no `quantize` after it."""
        return u.kind == "pool" and u.attrs["mode"] == "max" and eight_bit_out(u)

    mapped: dict[int, Value] = {}
    quantized: dict[int, Value] = {}  # float value id -> its quantize node's output
    steps: dict[int, QParams] = {}  # 8-bit value id (in the new graph) -> its step
    nodes: list[Node] = []
    copies: dict[int, Node] = {}

    def m(v: Value) -> Value:
        return mapped.get(v.id, v)

    for i, n in enumerate(graph.nodes):
        if id(n) in chosen_nodes:
            x = n.inputs[0]
            mx = m(x)
            xp = steps.get(mx.id) or ranges.params(x)
            if mx.dtype == "float32":
                if x.id not in quantized:
                    q = Node("quantize", [mx], [], {"scale": xp.scale, "to": xp.dtype},
                             n.origin)
                    q.outputs = [Value(TensorType(x.shape, xp.dtype), producer=q)]
                    nodes.append(q)
                    quantized[x.id] = q.outputs[0]
                mx = quantized[x.id]
            out = ranges.params(n.outputs[0]) if eight_bit_out(n) else None
            new = _int8_node(n, mx, xp, out, biases.get(i), weight_bits)
            new.inputs = [new.inputs[0], new.inputs[1], new.inputs[2],
                          *(m(v) for v in new.inputs[3:])]
            if new.attrs.get("residual") and new.inputs[-1].dtype != "float32":
                # a quantized shortcut: read as it is, at its step
                res = new.inputs[-1]
                new.attrs["residual_scale"] = (steps.get(res.id)
                                               or ranges.params(n.inputs[-1])).scale
            if out is not None:
                steps[new.outputs[0].id] = out
        else:
            new = Node(n.kind, [m(v) for v in n.inputs], [], dict(n.attrs), n.origin)
            new.outputs = [Value(o.type, producer=new, name=o.name) for o in n.outputs]
            x8 = new.inputs[0] if n.kind == "pool" else None
            if x8 is not None and x8.id in steps:  # a max pool passing 8 bits on
                y = new.outputs[0]
                y.type = TensorType(y.shape, x8.dtype)
                steps[y.id] = steps[x8.id]
            copies[i] = new
        for old, o in zip(n.outputs, new.outputs):
            mapped[old.id] = o
        nodes.append(new)
    g = Graph(list(graph.inputs), [m(v) for v in graph.outputs], nodes,
              list(graph.input_batch_axes), list(graph.output_batch_axes))
    for old, new_v in zip(graph.outputs, g.outputs):
        new_v.name = new_v.name or old.name
    return g, copies


# --- bias correction ------------------------------------------------------------------------

def _bias_index(n: Node) -> int | None:
    """Where n's bias is among its inputs, when it has a constant one the correction can
    shift (float32 per output channel, the output's last axis)."""
    has_bias = len(n.inputs) - bool(n.attrs.get("residual")) == 3
    if not has_bias or not n.inputs[2].is_const or \
            (n.kind == "matmul" and (n.attrs.get("perm_y") or n.attrs.get("transpose_a"))):
        return None
    return 2


def _linear(attrs: dict) -> dict:
    """attrs of the same instruction without its activation and residual: the part of its
    output that a bias shifts one for one."""
    out = {**attrs, "activation": "none"}
    if "residual" in out:
        out["residual"] = False
    return out


class _BiasShift:
    """Bias correction (as NNCF's fast bias correction, from the data instead of from a
    mean input): quantizing a layer's input and weights moves the mean of its output per
    channel, and the layers after it see a shifted activation (ResNet50: ~1e-2 of the
    channel's spread in the 1x1 projections). On the calibration set, each candidate runs
    on its float32 input once as float32 and once as its int8 instruction (before
    activation and residual, which a bias does not pass through linearly); the mean
    difference per output channel, added to its bias, makes the int8 output's mean the
    float32 one's. The float32 nodes keep their bias (max_error's kept ones too)."""

    def __init__(self) -> None:
        self.sums: dict[int, np.ndarray] = {}
        self.count: dict[int, int] = {}

    def see(self, i: int, node: Node, args: list, xp: QParams) -> None:
        b = _bias_index(node)
        if b is None:
            return
        lin = _linear(node.attrs)
        y_type = [(node.outputs[0].shape, "float32")]
        args = args[:3]
        want = evaluate(node.kind, args, lin, y_type)[0]
        xq = np.empty(node.inputs[0].shape, xp.dtype)
        quantize_into(args[0], inverse(xp.scale), xq)
        q = _int8_node(node, constant(xq), xp, None)
        q_attrs = _linear(q.attrs)
        got = evaluate(q.kind, [xq, q.inputs[1].data, q.inputs[2].data, args[2]], q_attrs,
                       y_type)[0]
        axes = tuple(range(want.ndim - 1))
        diff = np.mean(want.astype(np.float64) - got, axis=axes)
        self.sums[i] = self.sums.get(i, 0.0) + diff
        self.count[i] = self.count.get(i, 0) + 1

    def biases(self, graph: Graph) -> dict[int, np.ndarray]:
        out = {}
        for i, total in self.sums.items():
            b = graph.nodes[i].inputs[2].data
            out[i] = (b.astype(np.float64) + total / self.count[i]).astype(np.float32)
        return out


# --- the pass --------------------------------------------------------------------------------

def quantize_int8(graph: Graph, samples: Sequence[Sequence[np.ndarray]] | None,
                  max_error: float | None = None,
                  report: QuantizeReport | None = None, *, weight_bits: int = 8,
                  mean_ranges: bool = False, bias_correction: bool = True) -> Graph:
    """Quantize the graph's convolutions and matmuls to int8 from `samples` (each a list
    of arrays in graph-input order); with `max_error`, keep the costliest in float32
    until the outputs' relative error on the samples is at most that. `weight_bits` 7
    quantizes weights to [-64, 64] (the module's docstring). `bias_correction`
    (on by default) is _BiasShift; `mean_ranges` (off) is _Ranges' averaging."""
    if weight_bits not in WEIGHT_BITS:
        raise InvalidGraph(f"int8 weight bits must be one of {WEIGHT_BITS}, got {weight_bits}")
    if not samples:
        return graph
    report = report if report is not None else QuantizeReport()
    report.weight_bits, report.note = weight_bits, int8_note(weight_bits)
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    # every quantizable instruction is calibrated and its cost measured, so the report
    # shows those left in float (`stays_float`) beside the candidates
    every_idx = [index[id(n)] for n in quantizable(graph)]
    left_float = {i: why for i in every_idx if (why := stays_float(graph.nodes[i]))}
    # scores a top_k / argmax chooses from (MoE routers): cc/passes/choices.py
    quantizable_idx = set(every_idx)
    left_float.update({index[id(n)]: DECIDES for n in deciding(graph)[0]
                       if index[id(n)] in quantizable_idx})
    cand_idx = [i for i in every_idx if i not in left_float]
    ranges = _Ranges(mean_ranges)
    is_cand, is_quantizable = set(cand_idx), set(every_idx)

    def observe(i: int, node: Node, args: list, outs: list) -> None:
        if i in is_quantizable:
            ranges.see(node.inputs[0], args[0])
            ranges.see(node.outputs[0], outs[0])

    want = [_run(graph, s, observe) for s in samples]
    report.samples, report.max_error = len(samples), max_error
    if not every_idx:
        return graph

    def error_of(chosen: set[int], biases: dict[int, np.ndarray]) -> float:
        g, _ = rewrite(graph, chosen, ranges, biases, weight_bits)
        meter = _ErrorMeter(len(graph.outputs))
        for s, ref in zip(samples, want):
            for k, (got, w) in enumerate(zip(_run(g, s), ref)):
                if w.dtype.kind == "f":
                    meter.add(k, got, w)
        return meter.value()

    # Bias correction is kept where it lowers the all-int8 error on the calibration set
    # (ResNet50 1.1e-2 -> 8.4e-3); where it does not (MobileNetV2: 2.1e-2 -> 2.4e-2, its
    # relu6 clips the shifted means), the program keeps the biases it had.
    biases: dict[int, np.ndarray] = {}
    report.all_int8_error = error_of(set(cand_idx), {})
    if bias_correction:
        shift = _BiasShift()

        def correct(i: int, node: Node, args: list, outs: list) -> None:
            if i in is_cand:
                shift.see(i, node, args, ranges.params(node.inputs[0]))

        for s in samples:
            _run(graph, s, correct)
        corrected = shift.biases(graph)
        error = error_of(set(cand_idx), corrected)
        report.bias_correction = {"corrected": len(corrected), "error": error,
                                  "error_without": report.all_int8_error,
                                  "kept": bool(corrected) and error < report.all_int8_error}
        if report.bias_correction["kept"]:
            biases, report.all_int8_error = corrected, error

    # Each candidate's own cost: its output quantized alone, from float32 inputs.
    local = {i: _ErrorMeter(1) for i in every_idx}

    def probe(i: int, node: Node, args: list, outs: list) -> None:
        if i not in is_quantizable:
            return
        xp = ranges.params(node.inputs[0])
        xq = np.empty(node.inputs[0].shape, xp.dtype)
        quantize_into(args[0], inverse(xp.scale), xq)
        q = _int8_node(node, constant(xq), xp, None, biases.get(i), weight_bits)
        extras = list(args[2:])
        if i in biases:
            extras[0] = biases[i]
        got = run_node(q, [xq, q.inputs[1].data, q.inputs[2].data, *extras])[0]
        local[i].add(0, got, outs[0])

    for s in samples:
        _run(graph, s, probe)
    cost = {i: local[i].value() for i in every_idx}

    order = sorted(cand_idx, key=lambda i: -cost[i])  # costliest first
    kept_float = 0
    if max_error is not None and report.all_int8_error > max_error:
        lo, hi = 0, len(order)  # error(keep hi costliest in float32) = 0 <= bound
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if error_of(set(order[mid:]), biases) <= max_error:
                hi = mid
            else:
                lo = mid
        kept_float = hi
    chosen = set(order[kept_float:])
    final, copies = rewrite(graph, chosen, ranges, biases, weight_bits)
    report.output_error = report.all_int8_error if kept_float == 0 else \
        error_of(chosen, biases)
    for i in every_idx:
        n = graph.nodes[i]
        row = {"instruction": n.kind, "tf": list(n.origin[:3]), "error": cost[i],
               "precision": "int8" if i in chosen else "float32"}
        if i not in chosen:
            row["why"] = left_float.get(i, "kept: among the costliest, for max_error")
            report.kept[len(report.rows)] = copies[i]
        report.rows.append(row)
    return final


# --- int8 next to bf16 (`--quantize int8` with `--auto-cast` to bf16) ------------------------

_INT8 = ("conv2d_int8", "matmul_int8")


def assign_dtypes_with_int8(graph: Graph, mode: str, cast_type: str) -> Graph:
    """cc/passes/dtypes.py's `assign_dtypes` with the int8 instructions taking part: they
    write bf16 before it runs (`int8_writes_bf16`) and lose the conversions it leaves at
    their edges after (`int8_dtype_edges`). One pass: in between, a reader of an int8
    instruction's bf16 output is still typed float32. Without int8 instructions it is
    `assign_dtypes` alone."""
    int8_writes_bf16(graph, mode, cast_type)
    assign_dtypes(graph, mode, cast_type)
    return int8_dtype_edges(graph)


def int8_writes_bf16(graph: Graph, mode: str, cast_type: str) -> Graph:
    """With auto-cast to bf16, an int8 instruction that dequantizes (its readers are not
    all int8) writes bfloat16 from its epilogue, so the float region after it (a
    depthwise conv, pooling, a residual add, attention) runs in bf16 from its first
    instruction on, without a float32 value and a cast in between. Runs right before
    `assign_dtypes`, which then sees a bf16 value like any other.

    Left float32: a matmul with a residual (the transformer's residual stream, read by
    layer norm in float32, as assign_dtypes keeps it), a value an int8 instruction adds
    as its residual, and the graph's outputs."""
    if mode == "none" or cast_type != "bf16":
        return graph
    outputs = {v.id for v in graph.outputs}
    # values an int8 instruction adds as a float32 residual stay float32
    residuals = {n.inputs[-1].id for n in graph.nodes
                 if n.kind in _INT8 and n.attrs.get("residual")}
    for n in graph.nodes:
        y = n.outputs[0] if n.outputs else None
        if n.kind not in _INT8 or y.dtype != "float32" or y.id in outputs or \
                y.id in residuals or (n.kind == "matmul_int8" and n.attrs.get("residual")):
            continue
        n.attrs = {**n.attrs, "out": "bfloat16"}
        y.type = TensorType(y.shape, "bfloat16")
    return graph


def int8_dtype_edges(graph: Graph) -> Graph:
    """After `assign_dtypes`, remove the conversions its float32 defaults left at int8
    edges:

    - a `quantize` reading a bf16 value converted to float32 reads the bf16 value (the
      instruction widens it exactly, so the result is the same);
    - an int8 instruction writing bf16 whose every reader converts it back to float32
      writes float32 instead (one rounding fewer; the conversions fall out as dead code).
    """
    for n in graph.nodes:
        if n.kind == "quantize":
            src = n.inputs[0].producer
            if src is not None and src.kind == "cast" and src.inputs[0].dtype == "bfloat16":
                n.inputs = [src.inputs[0]]
    readers = graph.consumers()
    for n in list(graph.nodes):
        if n.kind not in _INT8 or n.attrs.get("out") != "bfloat16":
            continue
        y = n.outputs[0]
        users = list(readers.get(y.id, []))
        if not users or graph.is_output(y) or not all(
                u.kind == "cast" and u.attrs["to"] == "float32" for u in users):
            continue
        n.attrs = {**n.attrs, "out": "float32"}
        y.type = TensorType(y.shape, "float32")
        for cast in users:
            c = cast.outputs[0]
            if graph.is_output(c):
                y.name = y.name or c.name
            graph.replace_uses(c, y)
    return graph
