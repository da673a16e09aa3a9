"""Batch semantics: prove that a graph treats every sample on its own before the
device runs it in chunks of the compiled batch.

A call whose batch differs from the compiled one is split into chunks (the last one
padded) and the outputs are concatenated. That gives TensorFlow's numbers only if
every output row is computed from its own input row alone. Shapes cannot tell: a
cumulative sum over the batch, `x[::-1]`, a `[B, B]` similarity contracted back, or
`tanh(x) * batch_size` all keep a batch-shaped result. So every TF op type the device
takes declares, next to its lowering (`tf_op(..., batch=RULE)`), how it treats the
batch axis, and `check` propagates one `Fact` per tensor through the graph:

    free    the same in every chunk: constants, inputs without a batch axis
    size    a compile-time value that depends on the batch size (`tf.shape(x)[0]`)
    sample  computed per sample; the batch is `axis`, holding `fold` entries per
            sample, sample-major (a `[B * S, D]` reshape of `[B, S, D]` has fold S)
    mixed   depends on more than one sample, or on the batch size as a value

Shapes and compile-time values come from lowering the graph twice: at the compiled
batch B (the real lowering) and at B + 1. A tensor's batch axis is the one axis whose
size goes from B*k to (B+1)*k; a compile-time value is `free` if it is the same at
both, `sample` if it only grows along one axis with identical rows (`tf.zeros([batch,
units])`), and `size` otherwise. An op whose rule finds it mixing samples, or that
reads a `size` value as data (not as a shape operand, which the lowering takes with
`const_input`), is reported by name; the partitioner then keeps it on TensorFlow. An
op type without a declaration is taken as mixing: the default is safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .errors import NodeProblem
from .graphdef import TensorRef, TFNode


@dataclass(frozen=True)
class Fact:
    kind: str  # "free" | "size" | "sample" | "mixed"
    axis: int = -1
    fold: int = 1
    # The batch is the fastest-varying part of a folded axis (entry k * B + b belongs to
    # sample b), as SpaceToBatchND leaves it; only per-image and element-wise ops keep it.
    interleaved: bool = False

    def __hash__(self) -> int:
        # Worked out once: the batch check keys a verdict by its node's input facts, once
        # per node (a dataclass's own hash is Python code, 1.5 us for two facts).
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.kind, self.axis, self.fold, self.interleaved))
            object.__setattr__(self, "_hash", h)
        return h

    def __str__(self) -> str:
        if self.kind != "sample":
            return self.kind
        return f"sample(axis {self.axis}" + (f", {self.fold} per sample)" if self.fold > 1
                                              else ")")


FREE, SIZE, MIXED = Fact("free"), Fact("size"), Fact("mixed")


@dataclass
class OpView:
    """What a batch rule sees of one node: its input facts and shapes, its outputs' batch
    axes (from shapes), and its compile-time inputs at both batch sizes."""

    node: TFNode
    ins: list[Fact]
    in_shapes: list[tuple[int, ...]]
    in_shapes_next: list[tuple[int, ...]]  # at the compiled batch + 1
    outs: list[Fact]  # from shapes: sample(axis, fold), free (no axis grows) or mixed
    out_shapes: list[tuple[int, ...]]
    values: list[np.ndarray | None]  # input values at the compiled batch (None: computed)
    values_next: list[np.ndarray | None]  # the same at the compiled batch + 1
    # Set by a rule that knows its outputs' facts better than shapes do (an interleaved
    # batch looks like a sample-major fold).
    outputs: list[Fact] | None = None
    # Whether the rule looked at input values: a verdict that did not is the same for
    # every node alike in everything else, and `check` reuses it.
    read_values: bool = False

    @property
    def consts(self) -> list[np.ndarray | None]:
        self.read_values = True
        return self.values

    @property
    def consts_next(self) -> list[np.ndarray | None]:
        self.read_values = True
        return self.values_next

    def samples(self) -> list[int]:
        """Indices of the inputs computed per sample."""
        return [i for i, f in enumerate(self.ins) if f.kind == "sample"]

    def const_ints(self, i: int) -> list[int] | None:
        v = self.consts[i] if i < len(self.consts) else None
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]

    def tracks_batch(self, i: int) -> bool:
        """Input i is a compile-time value that changes with the batch size."""
        a, b = self.consts[i], self.consts_next[i]
        return a is not None and b is not None and not _same(a, b)


# A rule returns why the node mixes samples, or None if each output row depends on its
# own sample only (the outputs' facts then come from shapes).
BatchRule = Callable[[OpView], "str | None"]


def _norm(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _out_sample(view: OpView, k: int = 0) -> Fact | None:
    f = view.outs[k] if k < len(view.outs) else None
    return f if f is not None and f.kind == "sample" else None


# --- rule constructors ---------------------------------------------------------------

def elementwise(view: OpView) -> str | None:
    """Element-wise with numpy broadcasting (inputs aligned on their last axes): each
    per-sample input's batch axis must line up with the output's."""
    out = _out_sample(view)
    if out is None:
        return "its result has no batch axis"
    rank = len(view.out_shapes[0])
    interleaved = {view.ins[i].interleaved for i in view.samples()}
    if len(interleaved) > 1:
        return "it combines an interleaved batch with a plain one"
    for i in view.samples():
        f = view.ins[i]
        aligned = f.axis + rank - len(view.in_shapes[i])
        if aligned != out.axis or f.fold != out.fold:
            return (f"input {i}'s batch axis {f.axis} meets output axis {aligned} under "
                    f"broadcasting, not the output's batch axis {out.axis}")
    if interleaved == {True}:
        view.outputs = [replace(o, interleaved=True) if o is not None and o.kind == "sample"
                        else o for o in view.outs]
    return None


def per_output(view: OpView) -> str | None:
    """Output k is input k (IdentityN)."""
    for k, f in enumerate(view.ins):
        if f.kind == "sample" and view.outs[k] is not None and view.outs[k] != f:
            return f"output {k} does not keep input {k}'s batch axis"
    return None


def along(axes: Callable[[OpView], Sequence[int] | None], what: str,
          *, data: Sequence[int] = (0,), keeps_rank: bool = True) -> BatchRule:
    """The op works along `axes(view)` of its data inputs (the rest is per position):
    the batch axis must not be one of them. `keeps_rank`: every output axis stays where
    it was, so the output's batch axis must be the input's."""

    def rule(view: OpView) -> str | None:
        acting = axes(view)
        for i in view.samples():
            if i not in data:
                return f"input {i} ({what} parameter) is computed per sample"
            f = view.ins[i]
            rank = len(view.in_shapes[i])
            if acting is None:
                return f"its {what} axes are not compile-time constants"
            if f.axis in {_norm(a, rank) for a in acting}:
                return f"it works along the batch axis {f.axis} ({what})"
            for k, out in enumerate(view.outs):
                if keeps_rank and out is not None and out.kind == "sample" and out != f:
                    return f"output {k} moves the batch axis"
        return _all_outputs_batched(view)
    return rule


def _all_outputs_batched(view: OpView) -> str | None:
    for k, out in enumerate(view.outs):
        if out is not None and out.kind != "sample":
            return f"output {k} has no batch axis though it is computed from samples"
    return None


def mixes(reason: str) -> BatchRule:
    """The op always mixes samples when one of its inputs is per sample."""
    return lambda view: reason


def by_value(view: OpView) -> str | None:
    """Constants, shapes, sizes and ranks: always compile-time values, judged by comparing
    them at two batch sizes (`check` never asks this rule while they are)."""
    return "a compile-time value was expected here"


def segment_sum(view: OpView) -> str | None:
    """UnsortedSegmentSum sums the entries of data's leading axes (those segment_ids
    covers) into segments: per sample only if the batch lies past them."""
    data, ids = view.ins[0], view.ins[1]
    if ids.kind == "sample" or data.kind != "sample" or data.axis < len(view.in_shapes[1]):
        return "it sums entries of different samples into one segment"
    return _all_outputs_batched(view)


def const_axes(i: int) -> Callable[[OpView], list[int] | None]:
    """The axes given by input i (a scalar or a list)."""
    return lambda view: view.const_ints(i)


def attr_axes(key: str, default: int) -> Callable[[OpView], list[int]]:
    return lambda view: [int(view.node.get(key, default) or default)]


def last_axes(n: int) -> Callable[[OpView], list[int]]:
    return lambda view: list(range(-n, 0))


def reshape(view: OpView) -> str | None:
    """Reshape, Squeeze, ExpandDims: a row-major reshape keeps each sample's elements
    together, in their order, when the axes before the batch axis hold as many entries
    in the output as in the input. Read as [before, batch, per-sample entries], input and
    output are then the same array: a `[E, B * S, D]` (the batch behind a leading expert
    axis) may become `[E, B * S, D, 1]`, but `[E, B * S]` may not become `[E * B * S]`."""
    f = view.ins[0]
    out = _out_sample(view)
    if out is None:
        return "its result has no single batch axis (the batch is folded into another axis)"
    if f.interleaved:  # only the trailing axes may change: axis 0 keeps every entry
        if (f.axis, out.axis) != (0, 0) or view.in_shapes[0][0] != view.out_shapes[0][0]:
            return "it reshapes an axis that holds the batch interleaved with image blocks"
        view.outputs = [f]
        return None
    # (The axes before the batch are the same at every batch: only the batch axis grows.)
    if int(np.prod(view.in_shapes[0][:f.axis])) != int(np.prod(view.out_shapes[0][:out.axis])):
        return "it moves the batch inside another axis (samples interleave)"
    return None


def transpose(view: OpView) -> str | None:
    perm = view.const_ints(1)
    f, out = view.ins[0], _out_sample(view)
    if perm is None or out is None or _norm(perm[out.axis], len(perm)) != f.axis:
        return "the permutation does not carry the batch axis to the output's batch axis"
    return None


def concat(axis_input: Callable[[OpView], int], data: Callable[[OpView], range]
           ) -> BatchRule:
    """ConcatV2 / Concat: joined along an axis that is not the batch axis."""

    def rule(view: OpView) -> str | None:
        out = _out_sample(view)
        axis = view.const_ints(axis_input(view))
        if out is None or axis is None:
            return "its result has no batch axis"
        for i in view.samples():
            if i not in data(view):
                return "its axis is computed per sample"
            f = view.ins[i]
            if f != out:
                return f"input {i} has its batch on axis {f.axis}, the result on {out.axis}"
            if _norm(axis[0], len(view.in_shapes[i])) == f.axis:
                return "it joins along the batch axis"
        return None
    return rule


def pack(view: OpView) -> str | None:
    out = _out_sample(view)
    if out is None or any(view.ins[i].kind != "sample" for i in range(len(view.ins))):
        return "it stacks per-sample tensors with tensors that are not"
    rank = len(view.in_shapes[0])
    axis = _norm(int(view.node.get("axis", 0) or 0), rank + 1)
    for f in view.ins:
        if f.axis + (1 if axis <= f.axis else 0) != out.axis or f.fold != out.fold:
            return "it stacks along the batch axis"
    return None


def split(axis_input: int, data: int) -> BatchRule:
    def rule(view: OpView) -> str | None:
        if view.samples() != [data]:
            return "its sizes or axis are computed per sample"
        axis = view.const_ints(axis_input)
        f = view.ins[data]
        if axis is None or _norm(axis[0], len(view.in_shapes[data])) == f.axis:
            return "it splits along the batch axis"
        return _all_outputs_batched(view)
    return rule


def unpack(view: OpView) -> str | None:
    f = view.ins[0]
    axis = _norm(int(view.node.get("axis", 0) or 0), len(view.in_shapes[0]))
    if axis == f.axis:
        return "it unstacks along the batch axis"
    return _all_outputs_batched(view)


def whole_batch_slice(begin: int, end: int | None, stride: int, dim: int,
                      masked_end: bool, end_tracks: bool) -> str | None:
    """A slice (canonical bounds on a batch axis of size `dim`) keeps every sample, in
    order, at any batch size: `masked_end` (or huge), or an end that follows the batch."""
    if begin != 0 or stride != 1 or (end if end is not None else -1) < dim:
        return "it slices the batch axis (takes, drops, reverses or strides samples)"
    if not (masked_end or end_tracks):
        return ("its end on the batch axis is a fixed number, so it drops samples at a "
                "larger batch")
    return None


def paddings_keep_batch(view: OpView) -> str | None:
    pads = view.consts[1]
    f = view.ins[0]
    if pads is None:
        return "its paddings are computed"
    if np.asarray(pads).reshape(-1, 2)[f.axis].any():
        return "it pads the batch axis (shifting or adding samples)"
    return _all_outputs_batched(view)


def tile(view: OpView) -> str | None:
    reps = view.const_ints(1)
    f = view.ins[0]
    if f.kind != "sample":  # a free tensor repeated once per sample
        return None if _out_sample(view) else "its result has no batch axis"
    if reps is None or reps[f.axis] != 1:
        return "it repeats the batch axis (the whole batch, not each sample)"
    return _all_outputs_batched(view)


def broadcast_to(view: OpView) -> str | None:
    if view.ins[0].kind != "sample":
        return None if _out_sample(view) else "its result has no batch axis"
    return elementwise(view)


def image(view: OpView) -> str | None:
    """Convolutions, pooling, resizing and block moves: images are independent along
    the N axis (axis 0 in both NHWC and NCHW); filters must be free."""
    for i in view.samples():
        if i != _image_input(view.node.op):
            return f"input {i} (filter or sizes) is computed per sample"
        if view.ins[i].axis != 0:
            return f"the batch is on axis {view.ins[i].axis}, which the op mixes (not N)"
        # Images stay where they were along N, however the batch is folded into it.
        view.outputs = [view.ins[i] if o is not None and o.kind == "sample" and
                        (o.axis, o.fold) == (0, view.ins[i].fold) else o for o in view.outs]
    return _all_outputs_batched(view)


def space_to_batch(view: OpView) -> str | None:
    """SpaceToBatchND moves image blocks into N, the batch fastest (entry k * B + b);
    convolutions and element-wise ops on it stay per image, and BatchToSpaceND with the
    same block undoes it: TF's dilated convolution."""
    f, out, block = view.ins[0], _out_sample(view), view.const_ints(1)
    if view.samples() != [0] or f.axis != 0 or f.fold != 1 or f.interleaved or \
            block is None or out is None or (out.axis, out.fold) != (0, int(np.prod(block))):
        return "it moves image blocks into the batch axis in a way that mixes samples"
    view.outputs = [replace(out, interleaved=True)]
    return None


def batch_to_space(view: OpView) -> str | None:
    f, out, block = view.ins[0], _out_sample(view), view.const_ints(1)
    if view.samples() != [0] or f.axis != 0 or block is None or out is None or \
            (f.interleaved, f.fold) != (True, int(np.prod(block))) or \
            (out.axis, out.fold) != (0, 1):
        return "it moves batch entries into image blocks that are not one sample's"
    return None


def _image_input(op: str) -> int:
    return 2 if op == "Conv2DBackpropInput" else 0


def matmul(view: OpView) -> str | None:
    """MatMul: a's rows or b's columns may carry the batch, never both, never the
    contraction."""
    ta, tb = bool(view.node.get("transpose_a")), bool(view.node.get("transpose_b"))
    s = view.samples()
    out = _out_sample(view)
    if len(s) != 1 or out is None:
        return "both operands are per sample (a [B, B] product)"
    f = view.ins[s[0]]
    rows = (1 if ta else 0) if s[0] == 0 else (0 if tb else 1)
    if f.axis != rows or out.axis != s[0]:
        return "the batch axis is the contraction axis"
    return None


def batch_matmul(view: OpView) -> str | None:
    """BatchMatMul: the batch may be a broadcast batch dim (on both operands alike), a's
    rows or b's columns; never the contraction, never rows of both."""
    adj_a = bool(view.node.get("adj_x"))
    adj_b = bool(view.node.get("adj_y"))
    out = _out_sample(view)
    if out is None:
        return "its result has no batch axis"
    rank = len(view.out_shapes[0])
    kinds = set()
    for i in view.samples():
        f, r = view.ins[i], len(view.in_shapes[i])
        if f.axis < r - 2:
            kinds.add("batch")
            if f.axis + rank - r != out.axis:
                return "operands carry the batch on different axes"
        elif (i == 0 and f.axis == (r - 1 if adj_a else r - 2)) or \
                (i == 1 and f.axis == (r - 2 if adj_b else r - 1)):
            kinds.add("rows" if i == 0 else "cols")
        else:
            return "the batch axis is the contraction axis"
    if len(kinds) > 1 or (len(view.samples()) == 2 and kinds != {"batch"}):
        return "both operands are per sample along different axes (a [B, B] product)"
    return None


def einsum(view: OpView) -> str | None:
    eq = str(view.node.get("equation", "")).replace(" ", "")
    if "..." in eq or "->" not in eq:
        return "the batch cannot be followed through an einsum with '...' or no output"
    lhs, out_spec = eq.split("->")
    specs = lhs.split(",")
    out = _out_sample(view)
    letters = set()
    for i in view.samples():
        letters.add(specs[i][view.ins[i].axis])
    if len(letters) != 1 or out is None:
        return "operands carry the batch under different letters"
    letter = letters.pop()
    if out_spec.find(letter) != out.axis:
        return f"it sums over the batch axis ('{letter}')"
    if any(letter in specs[i] for i in range(len(specs)) if i not in view.samples()):
        return f"a free operand also has the batch letter '{letter}'"
    return None


def gather(view: OpView) -> str | None:
    """GatherV2: rows of a free table picked per sample, or per-sample tensors indexed
    along another axis with free indices, or `batch_dims` covering the batch."""
    params, idx = view.ins[0], view.ins[1]
    axis = view.const_ints(2)
    bd = int(view.node.get("batch_dims", 0) or 0)
    if axis is None:
        return "its axis is computed"
    g = _norm(axis[0], len(view.in_shapes[0]))
    if params.kind != "sample":
        return _all_outputs_batched(view)
    if idx.kind == "sample":
        bd = _norm(bd, len(view.in_shapes[1]))
        if params.axis < bd and idx.axis == params.axis:
            return _all_outputs_batched(view)
        return "per-sample indices pick from the whole batch"
    if g == params.axis:
        return "it gathers along the batch axis (indices point across samples)"
    return _all_outputs_batched(view)


def gather_nd(view: OpView) -> str | None:
    if view.ins[0].kind == "sample":
        return "its indices point into the whole batch"
    return _all_outputs_batched(view)


def select_v1(view: OpView) -> str | None:
    """Select with a vector condition picks rows: the condition lines up with axis 0."""
    cond = view.ins[0]
    if len(view.in_shapes[0]) == 1 and len(view.in_shapes[1]) > 1 and cond.kind == "sample":
        out = _out_sample(view)
        if out is None or out.axis != 0:
            return "its row condition is per sample but the rows are not"
        rest = OpView(view.node, [FREE] + view.ins[1:], view.in_shapes, view.in_shapes_next,
                      view.outs, view.out_shapes, view.consts, view.consts_next)
        return elementwise(rest)
    return elementwise(view)


def fused_batch_norm(view: OpView) -> str | None:
    """Inference: element-wise per channel. Training: statistics over every axis but the
    channel, so only a batch folded into the channels (Keras 2's LayerNormalization)
    stays per sample."""
    for i in view.samples():
        if i != 0:
            return f"input {i} (scale, offset or statistics) is computed per sample"
    f = view.ins[0]
    if not view.node.get("is_training"):
        return _all_outputs_batched(view)
    channel = 1 if str(view.node.get("data_format", "NHWC")).startswith("NC") else \
        len(view.in_shapes[0]) - 1
    if f.axis != channel:
        return "it normalizes with statistics over the batch (training mode)"
    return None


# --- the analysis ---------------------------------------------------------------------

@dataclass(frozen=True)
class Lowered:
    """One lowering of the graph: every TF tensor's shape and (if compile-time) value."""

    shapes: dict[TensorRef, tuple[int, ...]]
    values: dict[TensorRef, np.ndarray | None]
    const_reads: dict[str, set[int]]  # node -> inputs the lowering took as constants
    failed: dict[str, str]  # node -> why it could not be lowered at this batch
    output_counts: dict[str, int]  # node -> how many tensors it produces


def check(order: list[TFNode], fed: dict[TensorRef, int], used: set[TensorRef],
          outputs: list[tuple[TensorRef, int]], batch: int, at_batch: Lowered,
          at_next: Lowered, rules: dict[str, BatchRule | None]) -> list[NodeProblem]:
    """Every node that mixes samples, as problems naming it.

    `fed` maps each fed tensor to its batch axis (-1: none); `used` are the tensors some
    needed node or output reads; `outputs` pairs each output with its declared batch
    axis; `at_batch`/`at_next` are lowerings at `batch` and `batch + 1`; `rules` maps op
    types to their declared batch rule (None: undeclared)."""
    walk = start(fed, used, batch, at_batch, at_next, rules)
    fed_nodes = {r.node for r in fed}
    for node in order:
        if node.name not in fed_nodes:
            walk.visit(node)
    return walk.finish(outputs, order)


def start(fed: dict[TensorRef, int], used: set[TensorRef], batch: int, at_batch: Lowered,
          at_next: Lowered, rules: dict[str, BatchRule | None]) -> _Walk:
    """`check`'s walk, for a caller that visits the nodes itself (in topological order,
    fed nodes left out) while it fills `at_next` in: a node's visit reads `at_next` only
    for its own inputs and outputs. `finish` then gives the problems."""
    return _Walk(used, batch, at_batch, at_next, rules,
                 {ref: (Fact("sample", a) if a >= 0 else FREE) for ref, a in fed.items()})


_ONLY_FREE = frozenset({"free"})


@dataclass
class _Walk:
    """One pass over the graph in topological order, giving each tensor its fact."""

    used: set[TensorRef]
    batch: int
    at_batch: Lowered
    at_next: Lowered
    rules: dict[str, BatchRule | None]
    facts: dict[TensorRef, Fact]
    problems: list[NodeProblem] = field(default_factory=list)
    reported: set[str] = field(default_factory=set)
    verdicts: dict[tuple, tuple] = field(default_factory=dict)  # `_apply_rule`'s reuse
    # Whether the last visit's outcome followed from the node's op, attributes, input
    # facts, shapes at both batches and used outputs alone (no value read, nothing
    # reported): the caller may then give a node alike in all of those the same facts.
    pure: bool = False

    def finish(self, outputs: list[tuple[TensorRef, int]], order: list[TFNode]
               ) -> list[NodeProblem]:
        self.check_outputs(outputs, {n.name: n.op for n in order})
        return self.problems

    def visit(self, node: TFNode, refs: list[TensorRef] | None = None) -> None:
        """Give the node's outputs (`refs`, worked out here if not given) their facts."""
        if refs is None:
            refs = _node_outputs(node, self.at_batch)
        ins = [self.facts.get(r, MIXED) for r in node.inputs]
        kinds = {f.kind for f in ins}  # (one set, not four generators: once per node)
        self.pure = True
        if node.name in self.at_next.failed and not kinds <= _ONLY_FREE:
            self._report(node, f"does not accept batch size {self.batch + 1} (compiled for "
                         f"{self.batch}), so chunks of another batch would fail: "
                         f"{self.at_next.failed[node.name]}")
            _set(self.facts, refs, MIXED)
        elif "mixed" in kinds:
            _set(self.facts, refs, MIXED)  # explained where it started
        elif refs and all([self.at_batch.values.get(r) is not None for r in refs]):
            self.pure = False  # (facts from values)
            for r in refs:  # computed at compile time
                self.facts[r] = _static_fact(self.at_batch.values[r],
                                             self.at_next.values.get(r), self.batch)
        elif kinds <= _ONLY_FREE:
            _set(self.facts, refs, FREE)
        else:
            self._judge(node, refs, ins)

    def _judge(self, node: TFNode, refs: list[TensorRef], ins: list[Fact]) -> None:
        """A node some of whose inputs depend on the batch: apply its rule."""
        known: list[Fact] | None = None
        reads = self.at_next.const_reads.get(node.name, set())
        data_size = [i for i, f in enumerate(ins) if f.kind == "size" and i not in reads]
        if data_size:
            reason = (f"reads the batch size as a value (input {data_size[0]}, "
                      f"{node.inputs[data_size[0]]}, is computed from the batch's shape)")
        elif not any(f.kind == "sample" for f in ins):
            reason = _free_but_resized(node, refs, self.at_batch, self.at_next, self.batch)
        else:
            reason, known, by_shape, self.pure = _apply_rule(
                node, refs, ins, self.used, self.at_batch, self.at_next, self.batch,
                self.rules, self.verdicts)
            if reason is None and by_shape is not None:
                for k, r in enumerate(refs):  # what the loop below would find, found already
                    f = known[k] if known and k < len(known) else None
                    self.facts[r] = f or by_shape[k]
                return
        if reason is not None:
            self._report(node, f"mixes samples across the batch: {reason}")
            # Kept on TensorFlow, the node is computed whole and its result comes back
            # with the batch axis its shape shows: judge what reads it on that, so one
            # compile names every mixing node, not one per round.
            known = None
        for k, r in enumerate(refs):
            f = known[k] if known and k < len(known) and known[k] is not None else None
            self.facts[r] = f or _shape_fact(self.at_batch.shapes.get(r),
                                             self.at_next.shapes.get(r), self.batch)

    def check_outputs(self, outputs: list[tuple[TensorRef, int]], ops: dict[str, str]) -> None:
        """Each output's fact against the batch axis the io-config declares for it."""
        for ref, axis in outputs:
            f = self.facts.get(ref, MIXED)
            if f.kind == "mixed" or ref.node in self.reported:
                continue
            want = Fact("sample", axis) if axis >= 0 else FREE
            if f != want and not (axis < 0 and f.kind == "size"):
                self.problems.append(NodeProblem(
                    ref.node, ops.get(ref.node, ""),
                    f"output {ref} is {f}, but the io-config gives it batch axis {axis}", _HINT))

    def _report(self, node: TFNode, reason: str) -> None:
        self.pure = False
        self.problems.append(NodeProblem(node.name, node.op, reason, _HINT))
        self.reported.add(node.name)


_HINT = ("keep this node on TensorFlow (the partitioner does this when it compiles a "
         "SavedModel), or compile with a fixed batch (dynamic batch size off)")


def _apply_rule(node: TFNode, refs: list[TensorRef], ins: list[Fact], used: set[TensorRef],
                at_batch: Lowered, at_next: Lowered, batch: int,
                rules: dict[str, BatchRule | None], verdicts: dict[tuple, tuple]
                ) -> tuple[str | None, list[Fact] | None, list[Fact] | None, bool]:
    """Why the node mixes samples (or None), its outputs' facts if the rule knows them
    better than shapes, (when the rule ran) their facts from shapes, and whether the
    verdict was given without looking at input values.

    A rule sees the node's op, attributes, input facts and shapes, output shapes and
    (maybe) input values: for a verdict given without looking at values, `verdicts`
    keeps it under everything else it saw, and a node alike in all of that gets it
    without the rule running again (a chain of 100,000 Relus asks the rule once)."""
    rule = rules.get(node.op)
    if rule is None:
        return (f"op type {node.op} declares no batch rule, so it is taken as mixing", None,
                None, True)
    if any(f.interleaved for f in ins) and rule not in _KEEPS_INTERLEAVED:
        return ("its input holds the batch interleaved with image blocks (after SpaceToBatchND), "
                "which only per-image and element-wise ops keep apart"), None, None, True
    # (lists made tuples, not generators: this runs once per batched node)
    shapes, shapes_next = at_batch.shapes, at_next.shapes
    in_shapes = tuple([shapes.get(r, ()) for r in node.inputs])
    in_shapes_next = tuple([shapes_next.get(r, ()) for r in node.inputs])
    out_shapes = tuple([shapes.get(r) for r in refs])
    out_shapes_next = tuple([shapes_next.get(r) for r in refs])
    # An output nothing reads decides nothing (FusedBatchNormV3's reserve spaces).
    outputs_used = tuple([r in used for r in refs])
    attrs = node.attr_key()
    key = None if attrs is None else (node.op, attrs, tuple(ins), in_shapes, in_shapes_next,
                                      out_shapes, out_shapes_next, outputs_used)
    if key is not None and (verdict := verdicts.get(key)) is not None:
        return verdict
    outs = [_shape_fact(a, b, batch) for a, b in zip(out_shapes, out_shapes_next)]
    view = OpView(node, ins, list(in_shapes), list(in_shapes_next),
                  [o if u else None for o, u in zip(outs, outputs_used)],
                  [s if s is not None else () for s in out_shapes],
                  [at_batch.values.get(r) for r in node.inputs],
                  [at_next.values.get(r) for r in node.inputs])
    verdict = (rule(view), view.outputs, outs, not view.read_values)
    if key is not None and not view.read_values:
        verdicts[key] = verdict
    return verdict


_KEEPS_INTERLEAVED = (elementwise, image, reshape, batch_to_space)


def _free_but_resized(node: TFNode, refs: list[TensorRef], at_batch: Lowered,
                      at_next: Lowered, batch: int) -> str | None:
    """No input is per sample, but a shape operand depends on the batch size: the result
    grows with the batch. Only repeating a free value once per sample (`tf.zeros([batch,
    n])` of a computed value, `tf.fill`, `tf.broadcast_to`, `tf.tile`) gives every sample
    the same block; anything else (a table sliced to the batch size) differs by row."""
    if node.op not in _REPEATS_PER_SAMPLE:
        return "its result depends on the batch size through a shape operand"
    for r in refs:
        if _shape_fact(at_batch.shapes.get(r), at_next.shapes.get(r), batch).kind != "sample":
            return "its result grows with the batch size but not along one axis"
    return None


_REPEATS_PER_SAMPLE = frozenset({"Fill", "BroadcastTo", "Tile"})


def _node_outputs(node: TFNode, lowered: Lowered) -> list[TensorRef]:
    return [TensorRef(node.name, k) for k in range(lowered.output_counts.get(node.name, 0))]


def _set(facts: dict[TensorRef, Fact], refs: list[TensorRef], fact: Fact) -> None:
    for r in refs:
        facts[r] = fact


def _shape_fact(shape: tuple[int, ...] | None, bigger: tuple[int, ...] | None,
                batch: int) -> Fact:
    """The batch axis read from shapes at `batch` and `batch + 1`."""
    if shape is None or bigger is None or len(shape) != len(bigger):
        return MIXED
    if shape == bigger:
        return FREE
    grown = [i for i, (a, b) in enumerate(zip(shape, bigger)) if a != b]
    if not grown:
        return FREE
    if len(grown) > 1:
        return MIXED
    axis = grown[0]
    fold, rest = divmod(shape[axis], batch)
    if rest or fold < 1 or bigger[axis] != (batch + 1) * fold:
        return MIXED
    fact = _SAMPLES.get((axis, fold))
    if fact is None:  # (one object per fact: verdict keys then compare by identity)
        fact = _SAMPLES[(axis, fold)] = Fact("sample", axis, fold)
    return fact


_SAMPLES: dict[tuple[int, int], Fact] = {}  # (axis, fold) -> its sample fact


def _static_fact(value: np.ndarray, bigger: np.ndarray | None, batch: int) -> Fact:
    """A compile-time value: free if the batch size does not change it, per sample if it
    only grows along one axis whose rows are all alike, else it encodes the batch size."""
    if bigger is None:
        return SIZE
    if bigger is value or _same(value, bigger):  # the same array: a weight no input reaches
        return FREE
    f = _shape_fact(value.shape, bigger.shape, batch)
    if f.kind == "sample" and _rows_alike(value, f.axis) and _rows_alike(bigger, f.axis) \
            and _same(np.take(value, [0], f.axis), np.take(bigger, [0], f.axis)):
        return f
    return SIZE


def _rows_alike(a: np.ndarray, axis: int) -> bool:
    return a.shape[axis] == 0 or bool((a == np.take(a, [0], axis)).all())


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))

