"""Complex values between real tensors, rewritten as pairs of real tensors.

The device holds no complex numbers, yet in most models a complex value lives only between
real ones: a magnitude spectrogram is |rfft(frames)| (`tf.signal.stft`), an MFCC is
Re(rfft(padded) * exp(-i pi k / 2n)) (`tf.signal.dct`), FNet's token mixing is
Re(fft2d(x + 0i)). `complex_as_pairs` rewrites each such region, a connected set of ops
with complex outputs computed from real tensors and read back only through Real, Imag,
ComplexAbs, Angle or Shape, into a real and an imaginary part:

- a transform is a product with constant cosine and sine matrices: the DFT matrix of
  length n is F = C - iS (C[j, k] = cos(2 pi jk / n), S likewise with sin), so
  (a + ib) F = (aC + bS) + i(bC - aS); fft2d also multiplies by F from the left, and
  rfft(x, [n]) is x C - i x S over the first n // 2 + 1 columns (rows beyond x's length
  are the zero padding, x's samples beyond n are cut);
- (a + ib)(c + id) = (ac - bd) + i(ad + bc), exp(a + ib) = e^a cos b + i e^a sin b;
- sums, negation, conjugation are per part; slices, reshapes and other moves apply to each
  part with the same arguments.

An imaginary part known to be zero (`tf.complex(x, 0)`, a cast from a real tensor) is not
built, so Re(fft(x + 0i)) costs one matmul. A region holding any other op, or whose complex
value is fetched, is left as it is: it stays on TensorFlow and the report names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from neuronish.graph import Graph, canonical, control_refs, data_refs, producer
from neuronish.shape_inference.shapes import PartitionError, TensorInfo, infer_once

_PART_DTYPE = {tf.complex64.as_datatype_enum: tf.float32.as_datatype_enum,
               tf.complex128.as_datatype_enum: tf.float64.as_datatype_enum}
# Ops that move values about: each part goes through a copy of the op with the same other
# inputs. Their complex data is input 0, but for ConcatV2 (all inputs but the axis) and
# Pack (all inputs).
_MOVES = frozenset({"Identity", "StridedSlice", "Slice", "Reshape", "ExpandDims", "Squeeze",
                    "Transpose", "ConcatV2", "Pack"})
_ARITHMETIC = {"Const", "Complex", "Cast", "RFFT", "FFT", "FFT2D", "Exp", "Mul", "AddV2", "Add",
               "Sub", "Neg", "Conj"}
_EXITS = {"Real", "Imag", "ComplexAbs", "Angle", "Shape"}

Pair = tuple[str, str | None]  # (real part, imaginary part or None when it is zero)


def complex_as_pairs(graph: Graph, input_shapes: Mapping[str, Sequence[int]],
                     fetches: Sequence[str]) -> bool:
    """Rewrite, in `graph`, each complex region it can as pairs of real tensors; whether
    there was one."""
    if not any(n.op in _EXITS and n.op != "Shape" for n in graph.graph_def.node):
        return False  # (cheap: most graphs hold no complex values at all)
    try:
        infos = infer_once(graph, input_shapes)
    except PartitionError:
        return False
    rewriter = _Rewriter(graph, infos)
    exits = rewriter.exits({canonical(f) for f in fetches})
    if not exits:
        return False
    for name in exits:
        rewriter.lower_exit(graph.nodes[name])
    graph.drop_dead(fetches)
    return True


class _Rewriter:
    def __init__(self, graph: Graph, infos: Mapping[str, TensorInfo]) -> None:
        self.graph = graph
        self.infos = infos  # of the graph before the rewrite (edits drop the memo, not this)
        self.nodes = graph.nodes
        self.pairs: dict[str, Pair] = {}

    def readers(self, name: str) -> list[node_def_pb2.NodeDef]:
        """The nodes reading an output of node `name`."""
        return [self.nodes[r] for r in self.graph.data_consumers(name)]

    # --- which regions can be rewritten --------------------------------------------------

    def exits(self, fetched: set[str]) -> list[str]:
        """The exits of every region that can be rewritten whole, by name."""
        complex_nodes = {n.name for n in self.graph.graph_def.node
                         if self._is_complex(f"{n.name}:0")}
        seen: set[str] = set()
        found = []
        for start in sorted(complex_nodes):
            if start in seen:
                continue
            region, stack = set(), [start]
            while stack:  # the connected set of complex ops, through complex edges both ways
                name = stack.pop()
                if name in region:
                    continue
                region.add(name)
                node = self.nodes[name]
                stack += [producer(r) for r in data_refs(node) if producer(r) in complex_nodes]
                stack += [r.name for r in self.readers(name) if r.name in complex_nodes]
            seen |= region
            leaving = [r for name in region for r in self.readers(name)
                       if r.name not in region and r.op in _EXITS]
            if leaving and self._can_rewrite(region, fetched):
                found += sorted(n.name for n in leaving)
        return found

    def _can_rewrite(self, region: set[str], fetched: set[str]) -> bool:
        for name in region:
            node = self.nodes[name]
            if f"{name}:0" in fetched or self.graph.control_consumers(name) or \
                    not self._supported(node):
                return False
            for reader in self.readers(name):
                if reader.name not in region and reader.op not in _EXITS:
                    return False
        return True

    def _supported(self, node: node_def_pb2.NodeDef) -> bool:
        data = data_refs(node)
        if node.op in _MOVES:
            return True
        if node.op not in _ARITHMETIC:
            return False
        if node.op in ("RFFT", "FFT", "FFT2D"):
            shape = self._shape(data[0])
            axes = 2 if node.op == "FFT2D" else 1
            known = shape is not None and len(shape) >= 2 and \
                all(d is not None for d in shape[-axes:])
            return known and (node.op != "RFFT" or self._value(data[1]) is not None)
        if node.op == "Complex":
            return self._shape(data[0]) is not None and self._shape(data[1]) is not None
        if node.op == "Cast":  # from the real type of the same width
            return _PART_DTYPE.get(node.attr["DstT"].type) == node.attr["SrcT"].type
        return True

    # --- rewriting ---------------------------------------------------------------------------

    def lower_exit(self, node: node_def_pb2.NodeDef) -> None:
        """Turn exit `node` into real ops on the pair it reads (its name and output kept)."""
        name, op = node.name, node.op
        controls = control_refs(node)
        source = self.nodes[producer(canonical(node.input[0]))]
        re, im = self.pair(source.name)
        if op == "Shape":  # a part has the shape of the complex tensor
            node.input[0] = re
            node.attr["T"].type = self._part_dtype(source)
            self.graph.updated(name)
            return
        dtype = node.attr["Tout"].type
        if op == "Real":
            op, inputs = "Identity", [re]
        elif op == "Imag":
            op, inputs = ("Identity", [im]) if im else ("ZerosLike", [re])
        elif op == "ComplexAbs" and im is None:
            op, inputs = "Abs", [re]
        elif op == "ComplexAbs":
            re2 = self._add("Square", f"{name}/re_squared", [re], dtype)
            im2 = self._add("Square", f"{name}/im_squared", [im], dtype)
            op, inputs = "Sqrt", [self._add("AddV2", f"{name}/sum_of_squares", [re2, im2], dtype)]
        else:  # Angle
            op, inputs = "Atan2", [im or self._add("ZerosLike", f"{name}/zero", [re], dtype), re]
        node.Clear()
        node.name, node.op = name, op
        node.input.extend([*inputs, *controls])
        node.attr["T"].type = dtype
        self.graph.updated(name)

    def pair(self, tensor: str) -> Pair:
        name = producer(tensor)
        if name not in self.pairs:
            self.pairs[name] = self._lower(self.nodes[name])
        return self.pairs[name]

    def _lower(self, node: node_def_pb2.NodeDef) -> Pair:
        name, op = node.name, node.op
        data = [canonical(r) for r in data_refs(node)]
        dtype = self._part_dtype(node)
        if op == "Const":
            value = tf.make_ndarray(node.attr["value"].tensor)
            return (self._const(f"{name}/re", value.real),
                    self._const(f"{name}/im", value.imag) if value.imag.any() else None)
        if op == "Complex":
            re, im = data
            if self._shape(re) != self._shape(im):  # broadcast each part to the other's shape
                re, im = (self._add("AddV2", f"{name}/{part}", [x, self._add(
                    "ZerosLike", f"{name}/{part}_zeros", [y], dtype)], dtype)
                    for part, x, y in (("re", re, im), ("im", im, re)))
            return re, None if self._is_zero(data[1]) else im
        if op == "Cast":
            return data[0], None
        if op == "RFFT":
            return self._rfft(name, data[0], data[1], dtype)
        if op in ("FFT", "FFT2D"):
            shape = self._shape(data[0])
            pair = self._times_dft(name, self.pair(data[0]), shape[-1], dtype, left=False)
            if op == "FFT2D":
                pair = self._times_dft(f"{name}/rows", pair, shape[-2], dtype, left=True)
            return pair
        if op in _MOVES:
            return self._move(node, data, dtype)
        return self._arithmetic(name, op, [self.pair(t) for t in data], dtype)

    def _move(self, node: node_def_pb2.NodeDef, data: list[str], dtype: int) -> Pair:
        """The same op on each part; the other inputs (shapes, axes, indices) as they are."""
        n = len(data)
        complex_inputs = set(range(n - 1 if node.op == "ConcatV2" else
                                   n if node.op == "Pack" else 1))
        parts = [self.pair(t) if k in complex_inputs else None for k, t in enumerate(data)]
        re = self._copy(node, "re", [p[0] if p else t for p, t in zip(parts, data)], dtype)
        if all(p is None or p[1] is None for p in parts):
            return re, None
        ims = [t if p is None else p[1] or
               self._add("ZerosLike", f"{node.name}/zero_{k}", [p[0]], dtype)
               for k, (p, t) in enumerate(zip(parts, data))]
        return re, self._copy(node, "im", ims, dtype)

    def _arithmetic(self, name: str, op: str, args: list[Pair], dtype: int) -> Pair:
        add = self._add
        if op in ("Neg", "Conj", "Exp"):
            (a, b), = args
            if op == "Neg":
                return add("Neg", f"{name}/re", [a], dtype), \
                    add("Neg", f"{name}/im", [b], dtype) if b else None
            if op == "Conj":
                return a, add("Neg", f"{name}/im", [b], dtype) if b else None
            scale = add("Exp", f"{name}/scale", [a], dtype)  # e^a (cos b + i sin b)
            if b is None:
                return scale, None
            return (add("Mul", f"{name}/re", [scale, add("Cos", f"{name}/cos", [b], dtype)], dtype),
                    add("Mul", f"{name}/im", [scale, add("Sin", f"{name}/sin", [b], dtype)], dtype))
        (a, b), (c, d) = args
        if op in ("AddV2", "Add", "Sub"):
            kind = "Sub" if op == "Sub" else "AddV2"
            re = add(kind, f"{name}/re", [a, c], dtype)
            if b and d:
                return re, add(kind, f"{name}/im", [b, d], dtype)
            if d and kind == "Sub":
                return re, add("Neg", f"{name}/im", [d], dtype)
            return re, b or d
        # Mul: (a + ib)(c + id) = (ac - bd) + i(ad + bc), zero parts left out
        ac = add("Mul", f"{name}/ac", [a, c], dtype)
        bd = add("Mul", f"{name}/bd", [b, d], dtype) if b and d else None
        ad = add("Mul", f"{name}/ad", [a, d], dtype) if d else None
        bc = add("Mul", f"{name}/bc", [b, c], dtype) if b else None
        re = add("Sub", f"{name}/re", [ac, bd], dtype) if bd else ac
        if ad and bc:
            return re, add("AddV2", f"{name}/im", [ad, bc], dtype)
        return re, ad or bc

    def _rfft(self, name: str, x: str, length: str, dtype: int) -> Pair:
        """x C - i x S over the first n // 2 + 1 columns, n the transform's length: rows past
        x's samples are the zero padding, samples past n are cut."""
        n = int(np.asarray(self._value(length)).reshape(-1)[0])
        samples, columns = self._shape(x)[-1], n // 2 + 1
        cos, sin = _dft(n, dtype)
        rows = min(samples, n)
        c = np.zeros((samples, columns), cos.dtype)
        s = np.zeros_like(c)
        c[:rows], s[:rows] = cos[:rows, :columns], -sin[:rows, :columns]
        return (self._add("BatchMatMulV2", f"{name}/re", [x, self._const(f"{name}/dft_cos", c)],
                          dtype),
                self._add("BatchMatMulV2", f"{name}/im", [x, self._const(f"{name}/dft_sin", s)],
                          dtype))

    def _times_dft(self, name: str, pair: Pair, n: int, dtype: int, left: bool) -> Pair:
        """(a + ib) F along the last axis, or F (a + ib) along the one before when `left`:
        (aC + bS) + i(bC - aS) either way, C and S being symmetric."""
        a, b = pair
        cos, sin = _dft(n, dtype)
        c, s = self._const(f"{name}/dft_cos", cos), self._const(f"{name}/dft_sin", sin)

        def times(x: str, matrix: str, suffix: str) -> str:
            return self._add("BatchMatMulV2", f"{name}/{suffix}",
                             [matrix, x] if left else [x, matrix], dtype)

        a_c, a_s = times(a, c, "a_cos"), times(a, s, "a_sin")
        if b is None:
            return a_c, self._add("Neg", f"{name}/im", [a_s], dtype)
        b_c, b_s = times(b, c, "b_cos"), times(b, s, "b_sin")
        return (self._add("AddV2", f"{name}/re", [a_c, b_s], dtype),
                self._add("Sub", f"{name}/im", [b_c, a_s], dtype))

    # --- helpers -----------------------------------------------------------------------------

    def _is_complex(self, tensor: str) -> bool:
        info = self.infos.get(tensor)
        return info is not None and info.dtype.startswith("complex")

    def _shape(self, ref: str) -> tuple[int | None, ...] | None:
        info = self.infos.get(canonical(ref))
        return None if info is None else info.shape

    def _value(self, ref: str) -> np.ndarray | None:
        node = self.nodes.get(producer(canonical(ref)))
        if node is None or node.op != "Const":
            return None
        return tf.make_ndarray(node.attr["value"].tensor)

    def _is_zero(self, ref: str) -> bool:
        node = self.nodes.get(producer(ref))
        if node is not None and node.op == "ZerosLike":
            return True
        value = self._value(ref)
        return value is not None and not np.asarray(value).any()

    @staticmethod
    def _part_dtype(node: node_def_pb2.NodeDef) -> int:
        for key in ("Tcomplex", "T", "dtype", "DstT", "Tout"):
            if key in node.attr and node.attr[key].type in _PART_DTYPE:
                return _PART_DTYPE[node.attr[key].type]
        raise AssertionError(f"{node.name} ({node.op}) has no complex dtype attribute")

    def _const(self, name: str, value: np.ndarray) -> str:
        node = self._new(name, "Const")
        node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.ascontiguousarray(value)))
        return f"{node.name}:0"

    def _add(self, op: str, name: str, inputs: list[str], dtype: int) -> str:
        node = self._new(name, op, inputs)
        node.attr["T"].type = dtype
        return f"{node.name}:0"

    def _copy(self, original: node_def_pb2.NodeDef, part: str, inputs: list[str],
              dtype: int) -> str:
        node = self._new(f"{original.name}/{part}", original.op, inputs)
        for key, value in original.attr.items():
            node.attr[key].CopyFrom(value)
        node.attr["T"].type = dtype
        return f"{node.name}:0"

    def _new(self, name: str, op: str, inputs: Sequence[str] = ()) -> node_def_pb2.NodeDef:
        unique, k = name, 0
        while unique in self.nodes:
            k += 1
            unique = f"{name}_{k}"
        return self.graph.add_node(unique, op, inputs)


def _dft(n: int, dtype: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2 pi jk / n, from jk mod n in float64 (exact angles for large n)."""
    jk = np.outer(np.arange(n), np.arange(n)) % n
    angle = 2 * np.pi * jk / n
    np_dtype = tf.as_dtype(dtype).as_numpy_dtype
    return np.cos(angle).astype(np_dtype), np.sin(angle).astype(np_dtype)
