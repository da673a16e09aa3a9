"""NeuronOps with free dimensions, at compile time (`neuronish.saved_model.compile`).

The graph is partitioned at the plan's probe shapes (`shape_bounds.settle`). Then
each subgraph whose inputs or outputs have dimensions that vary with a free
dimension of the signature (TensorFlow's shape inference with those left unknown
says which) becomes a dynamic op:

- its subgraph's Placeholders leave those dimensions and the batch unknown, so the
  compiler can compile it at any shape (it folds the shape computations inside for
  the shape it is given) and TensorFlow can run it at any shape (fallback);
- sizes given in `shape_buckets` are compiled ahead (`compile_ahead`); their
  executables go into the SavedModel's assets, listed in the op's `dynamic_shapes`
  attr, where both hosts find them (the C one has no compile cache, and a serving
  container may have no compiler), and into the compile cache;
- the NeuronOp's `input_shapes`/`output_shapes` hold -1 there, and its
  `dynamic_shapes` attr (`shape_specialize.DynamicSpec`) the bounds of each free
  input dimension, from the shapes at the plan's low and high bounds, and the
  compiler flags, for the executables compiled at run time.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from . import contracts
from .compile_cache import CacheStats, CompileCache, compile_with_cache
from .compile_driver import CompileJob
from .errors import CompileWarning, SavedModelError
from .external import BlobFile
from .graph import PartitionError, producer
from .input_shapes import ShapePlan
from .partition.encapsulate import Subgraph
from .shape_inference.shapes import TensorInfo, infer
from .shape_specialize import DynamicSpec

_UNBOUNDED = 2**31 - 1


@dataclass(frozen=True)
class FreeShapes:
    """Shapes of every tensor with the free dimensions unknown, and at the low and high
    bounds (None where TensorFlow could not import the graph there)."""

    unknown: dict[str, TensorInfo]
    low: dict[str, TensorInfo] | None
    high: dict[str, TensorInfo] | None
    plan: ShapePlan

    @staticmethod
    def infer(graph_def: graph_pb2.GraphDef, plan: ShapePlan) -> FreeShapes:
        assert plan.bounds is not None
        ends = []
        for end in (0, 1):
            try:
                ends.append(infer(graph_def, plan.at({s: b[end] for s, b in
                                                      plan.bounds.items()})))
            except PartitionError:
                ends.append(None)
        return FreeShapes(infer(graph_def, plan.unknown()), ends[0], ends[1], plan)

    def free_axes(self, tensor: str, batch_axis: int) -> list[int]:
        info = self.unknown.get(tensor)
        if info is None or info.shape is None:
            return []
        return [k for k, d in enumerate(info.shape) if d is None and k != batch_axis]

    def bound(self, tensor: str, axis: int) -> tuple[int, int]:
        ends = []
        for infos, default in ((self.low, 1), (self.high, _UNBOUNDED)):
            info = infos.get(tensor) if infos is not None else None
            size = info.shape[axis] if info is not None and info.shape is not None and \
                len(info.shape) > axis else None
            ends.append(default if size is None else size)
        return min(ends), max(ends)


@dataclass(frozen=True)
class DynamicOp:
    """What makes one subgraph's NeuronOp dynamic (module doc)."""

    input_free: list[list[int]]
    output_free: list[list[int]]
    spec: DynamicSpec

    def patch(self, node: node_def_pb2.NodeDef) -> None:
        """Set -1 at the free dimensions of the node's shape attrs, and its spec."""
        for attr, free in (("input_shapes", self.input_free), ("output_shapes",
                                                                self.output_free)):
            for shape, axes in zip(node.attr[attr].list.shape, free):
                for k in axes:
                    shape.dim[k].size = -1
        node.attr["dynamic_shapes"].s = self.spec.to_json().encode()


def make_dynamic(sg: Subgraph, shapes: FreeShapes, signature_inputs: Mapping[str, str],
                 compiler_args: Sequence[str]) -> tuple[Subgraph, DynamicOp | None]:
    """`sg` ready to compile at any shape, and how its op is made dynamic; `sg` and
    None when none of its inputs and outputs has a free dimension. `signature_inputs`
    maps placeholder tensors to their signature keys (for the op's errors)."""
    input_free = [shapes.free_axes(t, a) for t, a in zip(sg.inputs, sg.input_batch_axes)]
    output_free = [shapes.free_axes(t, a) for t, a in zip(sg.outputs, sg.output_batch_axes)]
    if not any(input_free) and not any(output_free):
        return sg, None
    plan = shapes.plan
    assert plan.bounds is not None
    bounds, labels = [], []
    for tensor, axes in zip(sg.inputs, input_free):
        key = signature_inputs.get(tensor)
        mine = {f.axis: f.symbol for f in plan.free if f.tensor == tensor}
        entry = {}
        for k in axes:
            low, high = shapes.bound(tensor, k)
            if k in mine:
                low, high, why = plan.bounds[mine[k]]
            else:
                why = ("the signature's bounds " + ", ".join(
                    f"{f.label()} {plan.bounds[f.symbol][0]}..{plan.bounds[f.symbol][1]}"
                    for f in plan.free))
            entry[k] = (low, high, why)
        bounds.append(entry)
        labels.append(f"input {key!r}" if key is not None else
                      f"tensor {tensor!r} (computed from the signature's inputs)")
    graph_def = graph_pb2.GraphDef()
    graph_def.CopyFrom(sg.graph_def)
    placeholders = {producer(name): (axes, batch) for name, axes, batch in
                    zip(sg.input_names, input_free, sg.input_batch_axes)}
    for node in graph_def.node:
        if node.op == "Placeholder" and node.name in placeholders:
            axes, batch = placeholders[node.name]
            dims = tf.TensorShape(node.attr["shape"].shape).as_list()
            for k in [*axes, *([batch] if batch >= 0 else [])]:
                dims[k] = None
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(dims).as_proto())
    spec = DynamicSpec(bounds, labels, list(compiler_args))
    return replace(sg, graph_def=graph_def), DynamicOp(input_free, output_free, spec)



MAX_BUCKETS = 64  # shapes compiled ahead per signature


@dataclass(frozen=True)
class AheadExecutable:
    """A subgraph compiled ahead at `shapes` (its inputs', at the op's compiled batch)."""

    subgraph: str
    shapes: list[list[int]]
    executable: BlobFile


def compile_ahead(plan: ShapePlan, buckets: Mapping[str, Mapping[int, Sequence[int]]],
                  graph_def: graph_pb2.GraphDef, subgraphs: Sequence[Subgraph],
                  files: Mapping[str, str], compiler_args: Sequence[str],
                  cache: CompileCache | None, stats: CacheStats,
                  max_num_compilers: int | None, timeout: float | None,
                  executables_dir: str) -> tuple[list[str], list[AheadExecutable]]:
    """Compile each dynamic subgraph at every combination of the sizes `buckets` gives
    (`{key: {axis: [sizes]}}`; symbols not named stay at the probe), through the
    compile cache: the job is the one the op's run-time compile makes (same graph
    bytes, io-config and flags), so it is found there too. Returns the shapes, as
    "token_ids[1]=16" labels, and the executables (files in `executables_dir`) to
    store in the SavedModel; a shape the compiler refuses is a CompileWarning (its
    calls then go as any new shape does)."""
    assert plan.bounds is not None and plan.probe is not None
    sizes: dict[str, list[int]] = {}
    for key, axes in buckets.items():
        for axis, values in dict(axes).items():
            dim = next((f for f in plan.free if f.key == key and f.axis == int(axis)), None)
            if dim is None:
                raise SavedModelError(f"shape_buckets names {key!r} dimension {axis}, which "
                                      "is not a free dimension of the signature; its free "
                                      f"ones are {[f.label() for f in plan.free]}")
            low, high, _ = plan.bounds[dim.symbol]
            for v in values:
                if not low <= int(v) <= high:
                    raise SavedModelError(f"shape_buckets gives {dim.label()} the size {v}, "
                                          f"outside its bounds {low}..{high}")
            sizes.setdefault(dim.symbol, [])
            sizes[dim.symbol] += [int(v) for v in values if int(v) not in sizes[dim.symbol]]
    combos = [dict(zip(sizes, c)) for c in itertools.product(*sizes.values())]
    if len(combos) > MAX_BUCKETS:
        raise SavedModelError(f"shape_buckets makes {len(combos)} shapes to compile ahead; "
                              f"at most {MAX_BUCKETS}")
    jobs, labels, made = [], [], []
    for i, combo in enumerate(combos):
        infos = infer(graph_def, plan.at({**plan.probe, **combo}))
        label = ", ".join(f"{f.label()}={combo[f.symbol]}" for f in plan.free
                          if f.symbol in combo)
        for sg in subgraphs:
            io_config = contracts.io_config(
                ((name, infos[t].shape, infos[t].dtype, axis) for name, t, axis in
                 zip(sg.input_names, sg.inputs, sg.input_batch_axes)),
                sg.io_config["outputs"])
            if io_config == sg.io_config:
                continue  # the probe's: compiled already
            jobs.append(CompileJob(f"{sg.name}.ahead{i}", Path(files[sg.name]), io_config,
                                   tuple(compiler_args)))
            labels.append(label)
            made.append((sg.name, [list(infos[t].shape) for t in sg.inputs]))
    results = compile_with_cache(jobs, cache, stats, max_num_compilers=max_num_compilers,
                                 timeout=timeout, executables_dir=executables_dir)
    ahead = []
    for job, result, (name, shapes) in zip(jobs, results, made, strict=True):
        if not result.ok:
            warnings.warn(f"shape_buckets: {job.name} did not compile ahead ({result.error}); "
                          "its calls compile at run time", CompileWarning, stacklevel=3)
            continue
        assert result.executable is not None and result.executable_file is not None
        ahead.append(AheadExecutable(name, shapes, BlobFile(result.executable_file,
                                                            len(result.executable))))
        result.executable = None  # (a memory map of the file, which export links)
    return list(dict.fromkeys(label for label, r in zip(labels, results) if r.ok)), ahead

