"""Which (instruction kind, function, dtypes) the native engine takes: the measured gap.

For every kind `runtime/isa.py` declares, `sample_instructions` builds one small
instruction per combination of its function (`fn`/`mode`/... choice attributes) and
input dtypes that the declaration admits (`isa.check` accepts it); `gaps` asks
`spec.encode` (what the native engine runs, exactly as the loader asks) which of them
it leaves to the numpy reference kernels. `python -m neuronish.runtime.native.coverage`
prints that list; tests/runtime/test_native_gap.py holds it to a recorded one, so a kernel
added or lost shows up as a diff.

Shapes are small and ordinary (no empty tensors, rank <= 4): what is measured is the
dtype/function coverage, not shape limits.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from .. import isa
from .spec import Ref, encode


@dataclass(frozen=True)
class Sample:
    kind: str
    fn: str       # the choice that selects the function ("" when the kind has none)
    dtypes: tuple[str, ...]   # the inputs'
    out: str      # the output's dtype
    attrs: dict   # with defaults filled in
    types: tuple[tuple[tuple[int, ...], str], ...]  # the inputs' (shape, dtype)

    def label(self) -> str:
        name = f"{self.kind}:{self.fn}" if self.fn else self.kind
        compute = self.attrs.get("compute", "float32")
        how = f" (compute {compute})" if compute != "float32" else ""
        return f"{name} {','.join(self.dtypes)}->{self.out}{how}"


_ALL = sorted(isa.DTYPES)
_FLOATS = sorted(isa.FLOATS)
_WIN = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1]}
# What a product's epilogue (`activation`) may hold on float32 (any float unary function:
# executables compiled when the compiler fused others than today's isa.ACTIVATIONS load too).
_FLOAT32_ACTIVATIONS = [fn for fn in isa.UNARY_FNS if "float32" in isa.UNARY_DOMAIN[fn]]


def _cases(kind: str) -> Iterator[tuple[str, list[tuple[tuple[int, ...], str]], dict]]:
    """(fn, input types, attrs) candidates for one kind; isa.check filters them."""
    if kind == "unary":
        for fn, d in itertools.product(isa.UNARY_FNS, _ALL):
            yield fn, [((2, 3, 8), d)], {"fn": fn}
    elif kind == "binary":
        for fn, d in itertools.product(isa.BINARY_FNS, _ALL):
            yield fn, [((2, 3, 8), d), ((3, 8), d)], {"fn": fn}
        # A fused epilogue: every activation after an add, relu after every function
        # that takes one (the broadcasting operand first where the function commutes).
        for act, d in itertools.product(sorted(isa.ACTIVATIONS), ("float32", "bfloat16")):
            yield f"add activation={act}", [((2, 3, 8), d), ((3, 8), d)], {
                "fn": "add", "activation": act, "alpha": 0.3}
        for fn in isa.EPILOGUE_BINARY_FNS:
            first = (3, 8) if fn in isa.SWAPPED else (2, 3, 8)
            yield f"{fn} activation=relu", [(first, "float32"), ((2, 3, 8), "float32")], {
                "fn": fn, "activation": "relu"}
        # An addend c (a BatchNorm's scale and shift): a channel vector, one value and a
        # full tensor (the engine describes these as [rows, channels]), and one broadcasting
        # along a middle axis (which it leaves as they are), each with and without relu.
        for (name, c), d, act in itertools.product(
                (("c=channels", (8,)), ("c=one", (1,)), ("c=full", (2, 3, 8)),
                 ("c=rows", (3, 1))), ("float32", "bfloat16"), ("none", "relu")):
            yield f"mul {name} activation={act}", [((2, 3, 8), d), ((8,), d), (c, d)], {
                "fn": "mul", "activation": act}
        for fn in isa.EPILOGUE_BINARY_FNS:
            yield f"{fn} c=channels", [((2, 3, 8), "float32"), ((2, 3, 8), "float32"),
                                       ((8,), "float32")], {"fn": fn}
    elif kind == "select":
        for d in _ALL:
            yield "", [((2, 3, 8), "bool"), ((2, 3, 8), d), ((8,), d)], {}
    elif kind == "cast":
        for a, b in itertools.product(_ALL, _ALL):
            if a != b:
                yield "", [((2, 3, 8), a)], {"to": b}
    elif kind == "matmul":
        for d in _ALL:
            for compute in ("float32", "bfloat16", "float16"):
                if compute == "float32" or compute == d:
                    yield "", [((2, 3, 8), d), ((8, 5), d)], {"compute": compute}
        for fn in _FLOAT32_ACTIVATIONS:
            yield f"activation={fn}", [((2, 3, 8), "float32"), ((8, 5), "float32")], {
                "activation": fn}
    elif kind in ("conv2d", "depthwise_conv2d"):
        w = (3, 3, 4, 6) if kind == "conv2d" else (3, 3, 4, 2)
        for d in _ALL:
            for compute in ("float32", "bfloat16", "float16"):
                if compute == "float32" or compute == d:
                    yield "", [((1, 6, 6, 4), d), (w, d)], {**_WIN, "compute": compute}
        for fn in _FLOAT32_ACTIVATIONS:
            yield f"activation={fn}", [((1, 6, 6, 4), "float32"), (w, "float32")], {
                **_WIN, "activation": fn}
    elif kind == "pool":
        for mode, d in itertools.product(("max", "avg"), _ALL):
            yield mode, [((1, 6, 6, 4), d)], {"mode": mode, "ksize": [3, 3],
                                              "strides": [2, 2], "pads": [1, 1, 1, 1]}
    elif kind == "reduce":
        for fn, d in itertools.product(("sum", "mean", "max", "min", "prod", "any", "all"),
                                       _ALL):
            yield fn, [((2, 3, 8), d)], {"fn": fn, "axes": [2]}
    elif kind == "softmax":
        for log, d in itertools.product((False, True), _ALL):
            yield ("log" if log else "softmax"), [((2, 3, 8), d)], {"axis": 2, "log": log}
    elif kind == "masked_softmax":
        for d in ("float32", "bfloat16"):
            yield "", [((2, 3, 8), d), ((2, 1, 8), "bool")], {"fill": -1e9, "masked": 0.0}
    elif kind == "layer_norm":
        for d in _ALL:
            yield "", [((2, 3, 8), d), ((8,), d), ((8,), d)], {"epsilon": 1e-5}
    elif kind == "argminmax":
        for fn, d, to in itertools.product(("argmax", "argmin"), _ALL, sorted(isa.INDEX_DTYPES)):
            yield fn, [((2, 3, 8), d)], {"fn": fn, "axis": 2, "to": to}
    elif kind == "cumulative":
        for fn, d in itertools.product(("sum", "prod"), _ALL):
            yield fn, [((2, 3, 8), d)], {"fn": fn, "axis": 1}
    elif kind == "top_k":
        for indices, d in itertools.product((False, True), _ALL):
            yield ("indices" if indices else "values"), [((2, 3, 8), d)], {
                "k": 3, "indices": indices}
    elif kind == "resize":
        for mode, d in itertools.product(("bilinear", "nearest"), _ALL):
            yield mode, [((1, 4, 5, 3), d)], {"mode": mode, "size": [7, 9]}
    elif kind == "one_hot":
        for i, to in itertools.product(sorted(isa.INTEGERS), _ALL):
            yield "", [((2, 3), i)], {"depth": 4, "on_value": 1, "off_value": 0, "axis": -1,
                                      "to": to}
    elif kind == "gather":
        for d, i in itertools.product(_ALL, sorted(isa.INDEX_DTYPES)):
            yield "", [((5, 3, 8), d), ((4,), i)], {"axis": 1}
    elif kind == "pad":
        for mode, d in itertools.product(("constant", "reflect", "symmetric"), _ALL):
            yield mode, [((2, 3, 8), d)], {"paddings": [[0, 1], [1, 1], [2, 0]], "mode": mode}
    elif kind == "conv3d":
        for d in _ALL:
            yield "", [((1, 4, 5, 5, 3), d), ((2, 2, 2, 3, 4), d)], {
                "strides": [1, 1, 1], "dilations": [1, 1, 1], "pads": [0, 1, 0, 1, 0, 1]}
    elif kind == "pool3d":
        for mode, d in itertools.product(("max", "avg"), _ALL):
            yield mode, [((1, 4, 5, 5, 3), d)], {"mode": mode, "ksize": [2, 2, 2],
                                                 "strides": [1, 2, 2], "pads": [0] * 6}
    elif kind == "quantize":
        for to, x in itertools.product(sorted(isa.QUANTIZED), ("float32", "bfloat16")):
            yield "", [((2, 3, 8), x)], {"scale": 0.1, "to": to}
    elif kind == "binary_quantize":
        for fn, x, to in itertools.product(isa.QUANTIZED_BINARY_FNS, _ALL,
                                           sorted(isa.QUANTIZED)):
            yield fn, [((2, 3, 8), x), ((3, 8), x)], {"fn": fn, "scale": 0.1, "to": to}
        # a BatchNorm's scale, shift and ReLU: a channel, one value, a full tensor and a
        # middle-axis addend, with and without the ReLU, each output type
        addends = {"channel": (8,), "one": (), "full": (2, 3, 8), "middle": (3, 1)}
        for (where, c), act, x, to in itertools.product(
                addends.items(), ("none", "relu"), _ALL, sorted(isa.QUANTIZED)):
            yield f"mul+c {where} {act}", [((2, 3, 8), x), ((8,), x), (c, x)], {
                "fn": "mul", "activation": act, "scale": 0.05, "to": to}
    elif kind == "conv2d_int8":
        for x, out in itertools.product(sorted(isa.QUANTIZED),
                                        ("float32", "bfloat16", "uint8", "int8")):
            yield "", [((1, 6, 6, 4), x), ((3, 3, 4, 6), "int8"), ((6,), "float32")], {
                "strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "x_scale": 0.1,
                "out": out}
        yield "depthwise", [((1, 6, 6, 4), "uint8"), ((3, 3, 4, 2), "int8"), ((8,), "float32")], {
            "strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "x_scale": 0.1,
            "depthwise": True}
    elif kind == "matmul_int8":
        for x, out in itertools.product(sorted(isa.QUANTIZED),
                                        ("float32", "bfloat16", "uint8", "int8")):
            yield "", [((2, 3, 8), x), ((8, 5), "int8"), ((5,), "float32")], {
                "a_scale": 0.1, "out": out}
        yield "residual", [((2, 3, 8), "uint8"), ((8, 5), "int8"), ((5,), "float32"),
                           ((2, 3, 5), "float32")], {"a_scale": 0.1, "residual": True}
    else:  # movement kinds: every dtype
        attrs = {"reshape": {"shape": [6, 8]}, "transpose": {"perm": [2, 0, 1]},
                 "concat": {"axis": 1}, "tile": {"multiples": [1, 2, 1]},
                 "broadcast_to": {"shape": [4, 2, 3, 8]}, "copy": {},
                 "strided_slice": {"begin": [0, 1, 0], "end": [2, None, 8],
                                   "strides": [1, 1, 2]}}[kind]
        n = 2 if kind == "concat" else 1
        for d in _ALL:
            yield "", [((2, 3, 8), d)] * n, attrs


def sample_instructions() -> list[Sample]:
    """One sample per admitted (kind, fn, input dtypes) combination, in declaration order.
    A kind without a case above is an error: the tool must cover every declared kind."""
    out = []
    for kind in isa.KINDS:
        seen = set()
        for fn, types, attrs in _cases(kind):
            try:
                result = isa.check(kind, [isa.Type(s, d) for s, d in types], attrs)
            except isa.IsaError:
                continue  # the declaration does not admit this combination
            dtypes = tuple(d for _, d in types)
            key = (fn, dtypes, result[0].dtype, attrs.get("compute", ""))
            if key in seen:
                continue
            seen.add(key)
            full = isa.KINDS[kind].with_defaults(attrs)
            out.append(Sample(kind, fn, dtypes, result[0].dtype, full, tuple(types)))
    return out


def native(sample: Sample) -> bool:
    """Does the native engine take this instruction (its weights, if any, constant)?"""
    types = [isa.Type(shape, dtype) for shape, dtype in sample.types]
    ins = [Ref(i + 1, 0, t.dtype, t.shape) for i, t in enumerate(types)]
    outs = [Ref(0, 0, t.dtype, t.shape) for t in isa.check(sample.kind, types, sample.attrs)]
    constant = [i == 1 and sample.kind in isa.MATMUL_LIKE | {"conv2d_int8", "matmul_int8"}
                for i in range(len(ins))]
    return encode(sample.kind, sample.attrs, ins, outs, constant) is not None


def gaps() -> list[Sample]:
    """The admitted combinations the native engine leaves to numpy."""
    return [s for s in sample_instructions() if not native(s)]


def main() -> int:
    samples = sample_instructions()
    left = [s for s in samples if not native(s)]
    for s in left:
        print(s.label())
    print(f"{len(left)} of {len(samples)} admitted (kind, fn, dtypes) combinations run on "
          "numpy", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
