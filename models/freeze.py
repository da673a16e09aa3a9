"""Freeze a SavedModel signature into one self-contained GraphDef.

The result is what the compiler sees: no variables (weights are `Const`
nodes), no function library (every call inlined), a static batch dimension,
and shape arithmetic folded away.

Built on the SavedModel compile's freezer (`neuronish.freeze.freeze_signature`:
variables to constants, every call inlined, call-site prefixes stripped, dead
nodes dropped), so both see the same graph.  How the batch gets fixed: the
signature was traced for a `None` batch, so a re-trace
with a static `TensorSpec` would change nothing but the placeholder shapes;
we therefore freeze once and patch the placeholders' batch dimension.  The
body still computes shapes at run time (`Shape` -> `GatherV2`/`Prod` ->
`Pack` -> `Reshape` in Keras `Dense` on rank-3 inputs, for instance): those
`Shape` nodes are replaced by constants from TensorFlow's static shape
inference, and a Grappler pass with constant folding only folds the rest.
No other Grappler optimizer runs, so no fused or internal ops
(`_FusedConv2D`, `_MklMatMul`, ...) appear.

Cleanup: control edges and NoOps are dropped, pass-through `Identity` nodes
(variable reads) bypassed except the output ones, weights named after the
variable read they replace, and nodes put in a topological order with ties
broken by name: the same model freezes to the same bytes in any process.

The reference for other batch sizes: `freeze_saved_model` keeps the same
signature frozen with a `None` batch, before any optimization
(`FrozenGraph.reference_graph_def`).
`FrozenGraph.run_tf` runs the static graph when the feeds have the frozen
batch size and the dynamic one otherwise, so it accepts any batch size.
"""

from __future__ import annotations

import graphlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import graph_pb2  # noqa: E402
from tensorflow.core.protobuf import meta_graph_pb2  # noqa: E402
from tensorflow.python.grappler import tf_optimizer  # noqa: E402

from neuronish.freeze import VARIABLE_OPS, freeze_signature  # noqa: E402
from neuronish.graph import (  # noqa: E402
    Graph,
    canonical,
    is_control,
    parse_input,
    producer,
    topological_order,
)
from neuronish.inline import called_function  # noqa: E402


@dataclass
class FrozenGraph:
    """A frozen, function-inlined GraphDef plus its I/O description."""

    # Serialized GraphDef with the batch dimension fixed to `batch_size`.
    graph_def: bytes
    # GraphDef input tensor name ("x:0") -> (static shape, numpy dtype name).
    inputs: dict[str, tuple[list[int], str]]
    # GraphDef output tensor names ("Identity:0"), in `output_keys` order.
    outputs: list[str]
    # Signature output keys ("probs"), same order as `outputs`.
    output_keys: list[str]
    batch_size: int | None = None
    # The same signature frozen with a None batch; reference for any batch size.
    reference_graph_def: bytes | None = None
    # Signature input key ("x") for each entry of `inputs`, same order.
    input_keys: list[str] = field(default_factory=list)
    _runners: dict[bool, tf.compat.v1.Session] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _functions: dict[bool, Callable[..., list[tf.Tensor]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # Written last by `save`, so its presence means the directory is complete.
    MARKER: ClassVar[str] = "frozen.json"

    def io_config(self) -> dict:
        """The compiler's io-config JSON form (see docs/contracts.md)."""
        return {
            "inputs": {name: [list(shape), dtype] for name, (shape, dtype) in self.inputs.items()},
            "outputs": list(self.outputs),
        }

    def parsed(self) -> graph_pb2.GraphDef:
        """The static-batch GraphDef as a protobuf message."""
        return graph_pb2.GraphDef.FromString(self.graph_def)

    def op_types(self) -> list[str]:
        """Sorted set of op types in the static-batch GraphDef."""
        return sorted({n.op for n in self.parsed().node})

    def save(self, directory: str) -> None:
        """Write graph.pb, reference.pb, io_config.json and frozen.json.

        graph.pb + io_config.json are exactly what `neuronish-cc compile` takes.
        """
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "graph.pb"), "wb") as f:
            f.write(self.graph_def)
        if self.reference_graph_def is not None:
            with open(os.path.join(directory, "reference.pb"), "wb") as f:
                f.write(self.reference_graph_def)
        with open(os.path.join(directory, "io_config.json"), "w") as f:
            json.dump(self.io_config(), f, indent=1)
        meta = {
            "inputs": {k: [list(s), d] for k, (s, d) in self.inputs.items()},
            "outputs": self.outputs,
            "output_keys": self.output_keys,
            "input_keys": self.input_keys,
            "batch_size": self.batch_size,
        }
        with open(os.path.join(directory, self.MARKER), "w") as f:
            json.dump(meta, f, indent=1)

    @classmethod
    def load(cls, directory: str) -> FrozenGraph:
        """Read a directory written by `save`."""
        with open(os.path.join(directory, cls.MARKER)) as f:
            meta = json.load(f)
        with open(os.path.join(directory, "graph.pb"), "rb") as f:
            graph_def = f.read()
        reference = None
        ref_path = os.path.join(directory, "reference.pb")
        if os.path.exists(ref_path):
            with open(ref_path, "rb") as f:
                reference = f.read()
        return cls(
            graph_def=graph_def,
            inputs={k: (list(s), d) for k, (s, d) in meta["inputs"].items()},
            outputs=list(meta["outputs"]),
            output_keys=list(meta["output_keys"]),
            batch_size=meta["batch_size"],
            reference_graph_def=reference,
            input_keys=list(meta["input_keys"]),
        )

    def run_tf(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the frozen graph in TensorFlow; returns {output tensor name: array}.

        Feeds are keyed by input tensor name ("x:0"); the bare name ("x") is
        accepted too.  Any batch size works: the static graph is used when it
        matches, the None-batch reference graph otherwise.
        """
        arrays = [
            np.asarray(self._feed(feeds, name), dtype=dtype)
            for name, (_, dtype) in self.inputs.items()
        ]
        static = self.batch_size is None or all(
            a.ndim > 0 and a.shape[0] == self.batch_size for a in arrays
        )
        if not static and self.reference_graph_def is None:
            raise ValueError(f"graph frozen for batch {self.batch_size} has no reference graph")
        session = self._session(static)
        results = session.run(self.outputs, dict(zip(self.inputs, arrays, strict=True)))
        return dict(zip(self.outputs, results, strict=True))

    def _feed(self, feeds: dict[str, np.ndarray], name: str) -> np.ndarray:
        if name in feeds:
            return feeds[name]
        bare = producer(name)
        if bare in feeds:
            return feeds[bare]
        raise KeyError(f"missing feed for input {name!r}; got {sorted(feeds)}")

    def tf_function(self, static: bool = True) -> Callable[..., list[tf.Tensor]]:
        """The graph as a TF function: tensors in `inputs` order -> list in `outputs` order.

        For timing TensorFlow (benchmarks): unlike `run_tf`, Grappler's usual
        optimizations run, as they would in a served model.  `static=False`
        gives the None-batch reference graph.
        """
        if static not in self._functions:
            data = self.graph_def if static else self.reference_graph_def
            assert data is not None
            gd = graph_pb2.GraphDef.FromString(data)

            def _import() -> None:
                tf.compat.v1.import_graph_def(gd, name="")

            wrapped = tf.compat.v1.wrap_function(_import, [])
            graph = wrapped.graph
            self._functions[static] = wrapped.prune(
                feeds=[graph.get_tensor_by_name(n) for n in self.inputs],
                fetches=[graph.get_tensor_by_name(n) for n in self.outputs],
            )
        return self._functions[static]

    # Older name, still used by benchmarks/resnet50.py.
    _runner = tf_function

    def _session(self, static: bool) -> tf.compat.v1.Session:
        # A v1 Session starts 3x faster than wrap_function + prune on ResNet50;
        # keep one per graph variant.  Grappler is off so the reference is
        # plain op-by-op TensorFlow kernels (no fused conv+bias+relu rewrites).
        if static not in self._runners:
            data = self.graph_def if static else self.reference_graph_def
            assert data is not None
            graph = tf.Graph()
            with graph.as_default():
                tf.compat.v1.import_graph_def(graph_pb2.GraphDef.FromString(data), name="")
            config = tf.compat.v1.ConfigProto()
            config.graph_options.rewrite_options.disable_meta_optimizer = True
            self._runners[static] = tf.compat.v1.Session(graph=graph, config=config)
        return self._runners[static]


def unfrozen_nodes(graph_def: graph_pb2.GraphDef | bytes) -> list[str]:
    """Nodes that would stop the graph being self-contained: "name (op)" strings.

    Variable access (as `neuronish.freeze` defines it), function calls, and any op
    with a function-valued attribute (functional control flow), plus every library
    function: the compiler takes a single graph.
    """
    if isinstance(graph_def, bytes):
        graph_def = graph_pb2.GraphDef.FromString(graph_def)
    library = {f.signature.name for f in graph_def.library.function}
    bad = [f"{n.name} ({n.op})" for n in graph_def.node
           if n.op in VARIABLE_OPS or called_function(n, library) is not None
           or any(v.HasField("func") or v.list.func for v in n.attr.values())]
    bad += [f"library function {name}" for name in sorted(library)]
    return bad


def assert_fully_frozen(graph_def: graph_pb2.GraphDef | bytes) -> None:
    """Raise AssertionError if the graph still calls functions or reads variables."""
    bad = unfrozen_nodes(graph_def)
    if bad:
        raise AssertionError("graph is not fully frozen: " + ", ".join(bad[:20]))


def _materialize_shapes(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """Replace Shape/Size/Rank of statically shaped tensors with Const nodes.

    Grappler's constant folding should do this itself but, on graphs coming
    out of function inlining, it treats the placeholders as unknown-shape
    feeds and leaves `Shape` alone.  TensorFlow's import-time shape inference
    does know every static shape, so we take them from there; Grappler then
    folds the `GatherV2`/`Prod`/`Pack` arithmetic hanging off the new constants.
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.op not in ("Shape", "Size", "Rank"):
            continue
        shape = graph.get_tensor_by_name(canonical(node.input[0])).shape
        if not shape.is_fully_defined():
            continue
        dims = shape.as_list()
        dtype = tf.as_dtype(node.attr["out_type"].type) if "out_type" in node.attr else tf.int32
        if node.op == "Shape":
            value = np.array(dims)
        elif node.op == "Size":
            value = np.array(int(np.prod(dims)))
        else:
            value = np.array(len(dims))
        del node.input[:]
        node.attr.clear()
        node.op = "Const"
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(
            tf.make_tensor_proto(value.astype(dtype.as_numpy_dtype), dtype=dtype)
        )
    return out


def _constant_fold(graph_def: graph_pb2.GraphDef, keep: list[str]) -> graph_pb2.GraphDef:
    """Run Grappler's constant folding (only) over a frozen GraphDef.

    `keep` are node names that must survive (inputs and outputs).
    """
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    # Grappler treats nodes in the "train_op" collection as fetches and never
    # removes or renames them.
    meta.collection_def["train_op"].node_list.value.extend(keep)
    config = tf.compat.v1.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers[:] = ["constfold"]
    rewrite.min_graph_nodes = -1  # optimize even tiny graphs
    rewrite.meta_optimizer_iterations = rewrite.ONE
    return tf_optimizer.OptimizeGraph(config, meta)


def _clean(graph_def: graph_pb2.GraphDef, keep: list[str]) -> Graph:
    """Drop control edges, pass-through Identity nodes and dead nodes (edits in place);
    returns the cleaned graph, of the nodes and `versions` only.

    Constant folding leaves `^x` control inputs on the constants it made from
    `Shape(x)`; the frozen graph has no stateful ops, so control edges carry
    no meaning.  Identity nodes left over from variable reads and Keras layer
    outputs are bypassed.  Both only burden the compiler.  The nodes in
    `keep` (inputs and the output Identity nodes) stay.
    """
    for part in graph_def.DESCRIPTOR.fields:  # (the library: every call was inlined)
        if part.name not in ("node", "versions"):
            graph_def.ClearField(part.name)
    graph = Graph(graph_def)
    keep_set = set(keep)
    # Identity node name -> the tensor it forwards (resolved through chains).
    forward: dict[str, str] = {}
    for node in graph_def.node:
        data = graph.data_inputs[node.name]
        if node.op == "Identity" and node.name not in keep_set and len(data) == 1:
            forward[node.name] = data[0]

    def resolve(tensor: str) -> str:  # through the forwarding Identities; output 0 bare
        name, port = parse_input(tensor)
        while name in forward and port == 0:
            name, port = parse_input(forward[name])
        return f"{name}:{port}" if port else name

    # A frozen variable is a Const named after the function's captured-input
    # placeholder ("744"): a per-process counter.  Give it the name of the
    # variable read that consumed it ("mlp_1/dense_0_1/Cast/ReadVariableOp")
    # so the graph is readable and byte-identical across processes.
    renamed: dict[str, str] = {}
    for node in graph_def.node:
        if node.op == "Identity" or not node.input:
            continue
        for i in node.input:
            ident = producer(i)
            if is_control(i) or ident not in forward:
                continue
            const = graph.nodes.get(resolve(i))
            if (
                const is not None
                and const.op == "Const"
                and const.name not in keep_set
                and const.name not in renamed
                and ident not in renamed.values()
            ):
                renamed[const.name] = ident
    for node in graph_def.node:
        graph.set_inputs(node.name, [resolve(i) for i in graph.data_inputs[node.name]])
    # Drop the bypassed Identity nodes, then hand their names to the Consts.
    graph.remove(forward)
    graph.rename(renamed)
    # Keep only what the outputs need, plus the placeholders themselves.
    graph.keep_only(graph.needed(keep))
    return graph


def _canonical_order(graph: Graph) -> graph_pb2.GraphDef:
    """Nodes in topological order, ties broken by name.

    The order of the frozen weights follows variable capture order, which
    changes from process to process; a canonical order makes the same model
    serialize to the same bytes everywhere (cache keys, golden files), and
    lets a consumer translate the graph in one forward pass.
    """
    # Ties go to the first by name: the dependencies are listed in name order.
    try:
        order = topological_order({name: set(graph.producers(name))
                                   for name in sorted(graph.nodes)})
    except graphlib.CycleError as e:
        raise ValueError(f"graph has a cycle: {' -> '.join(e.args[1])}") from None
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph.graph_def.versions)
    out.node.extend(graph.nodes[name] for name in order)
    return out


def _freeze_dynamic(
    export_dir: str, signature_key: str
) -> tuple[graph_pb2.GraphDef, list[str], list[str], list[str], list[tuple[str, list, str]]]:
    """The signature frozen by `neuronish.freeze` (None batch): (graph_def, input names,
    output names, output keys, input (key, shape, dtype) in key order)."""
    frozen = freeze_signature(export_dir, signature_key)
    out_keys = sorted(frozen.outputs)
    if any(i.shape is None for i in frozen.inputs):
        raise ValueError(f"{export_dir}: an input of unknown rank cannot get a batch size")
    return (frozen.graph_def, [i.tensor for i in frozen.inputs],
            [frozen.outputs[k] for k in out_keys], out_keys,
            [(i.key, list(i.shape), i.dtype) for i in frozen.inputs])


def _fix_batch(
    graph_def: graph_pb2.GraphDef, in_names: list[str], batch_size: int
) -> graph_pb2.GraphDef:
    """Copy of `graph_def` whose input placeholders have a static batch dimension.

    Re-tracing the signature with a static TensorSpec would give the same
    graph: the inlined body was traced for a None batch either way, and only
    the placeholder shapes differ.  So we patch those and save a second
    (slow, for ResNet50) variable conversion.
    """
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    placeholders = {producer(n) for n in in_names}
    for node in out.node:
        if node.name in placeholders:
            dims = node.attr["shape"].shape.dim
            if not dims:
                raise ValueError(f"input {node.name} has no batch dimension to fix")
            dims[0].size = batch_size
    return out


def freeze_saved_model(
    export_dir: str,
    batch_size: int | None,
    signature_key: str = "serving_default",
) -> FrozenGraph:
    """Freeze a SavedModel signature with the batch dimension fixed to `batch_size`.

    `batch_size=None` keeps the batch dynamic (shape arithmetic such as
    Shape -> StridedSlice -> Reshape then stays in the graph).
    """
    dynamic, in_names, out_names, out_keys, specs = _freeze_dynamic(export_dir, signature_key)
    gd = dynamic if batch_size is None else _fix_batch(dynamic, in_names, batch_size)
    keep = [producer(n) for n in in_names + out_names]
    # Cleaning before folding too halves Grappler's time on ResNet50 (the
    # ~1000 Identity nodes left by variable reads each hold up a fold).
    gd = _constant_fold(_clean(_materialize_shapes(gd), keep).graph_def, keep)
    gd = _canonical_order(_clean(gd, keep))
    assert_fully_frozen(gd)
    assert_fully_frozen(dynamic)

    inputs: dict[str, tuple[list[int], str]] = {}
    for name, (_, shape, dtype) in zip(in_names, specs, strict=True):
        shape = [batch_size, *shape[1:]]
        inputs[name] = ([int(d) if d is not None else -1 for d in shape], dtype)
    keys = [key for key, _, _ in specs]
    return FrozenGraph(
        # deterministic: attr maps in a stable order, so equal graphs are equal bytes.
        graph_def=gd.SerializeToString(deterministic=True),
        inputs=inputs,
        outputs=out_names,
        output_keys=out_keys,
        batch_size=batch_size,
        # Not optimized: it only has to run in TensorFlow.
        reference_graph_def=dynamic.SerializeToString(deterministic=True),
        input_keys=keys,
    )


def _int_input_high(graph_def: graph_pb2.GraphDef, input_node: str) -> int | None:
    """Vocabulary size behind an integer input: rows of the Const it gathers from.

    Follows the input's consumers (through Cast, Identity, Select and friends)
    to the first GatherV2 that uses it as indices.
    """
    graph = Graph(graph_def)
    nodes = graph.nodes
    frontier, seen = [input_node], {input_node}
    while frontier:
        name = frontier.pop(0)
        for c in (nodes[c] for c in graph.consumers(name)):
            if c.op in ("GatherV2", "Gather") and len(c.input) > 1:
                if producer(c.input[1]) == name:
                    params = nodes.get(producer(c.input[0]))
                    if params is not None and params.op == "Const":
                        dims = params.attr["value"].tensor.tensor_shape.dim
                        if dims:
                            return int(dims[0].size)
            if c.name not in seen and len(seen) < 64:
                seen.add(c.name)
                frontier.append(c.name)
    return None


def example_inputs(
    frozen: FrozenGraph,
    batch_size: int | None = None,
    seed: int = 0,
    int_high: dict[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Random feeds keyed by input tensor name.

    Floats: standard normal.  Integers: uniform in [0, high), where `high` is
    `int_high[name]` if given, else the row count of the embedding table the
    input indexes (found in the graph), else 2.
    """
    batch = batch_size if batch_size is not None else (frozen.batch_size or 1)
    rng = np.random.default_rng(seed)
    gd = frozen.parsed()
    feeds: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in frozen.inputs.items():
        full = [batch, *shape[1:]]
        if np.issubdtype(np.dtype(dtype), np.integer):
            high = (int_high or {}).get(name) or _int_input_high(gd, producer(name)) or 2
            feeds[name] = rng.integers(0, high, size=full).astype(dtype)
        else:
            feeds[name] = rng.standard_normal(full).astype(dtype)
    return feeds
