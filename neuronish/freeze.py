"""Load one signature of a SavedModel as a single frozen GraphDef.

This is what the partitioner works on: variables become `Const` nodes, every
function call (`PartitionedCall`, `StatefulPartitionedCall`) is inlined, and
the batch dimension stays dynamic, exactly as in the signature. Shapes are
fixed later, per compiled subgraph; the part of the graph left on TensorFlow
keeps computing shapes at run time, so the compiled model still accepts any
batch size.

TF2 SavedModels (a `tf.Module` with `tf.function` signatures, `model.export`)
and TF1 ones (`tf.compat.v1.saved_model.Builder`) both load through
`tf.saved_model.load`, which lifts TF1 variables into resource variables; the
signature's concrete function is then frozen the way
`convert_variables_to_constants_v2` does it. Functional control flow (`While`, `If`)
is not lowered: each such op stays one node, which stays on TensorFlow with its
body, instead of a cycle of `Switch`/`Merge`/`NextIteration` nodes that no
partition could cut.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, tensor_pb2
from tensorflow.python.framework import convert_to_constants, tensor_util

from .common.nogc import paused_gc
from .errors import SavedModelError
from .graph import (
    Graph,
    PartitionError,
    data_refs,
    is_stateful,
    producer,
    rename_ref,
)
from .inline import InlineError, called_function, inline_calls
from .shape_inference.shapes import TensorInfo

# Variable access that must not survive freezing, anywhere (a control flow body
# too), and function calls, which must not survive in the outer graph.
VARIABLE_OPS = frozenset({"VarHandleOp", "ReadVariableOp", "VariableV2", "AssignVariableOp",
                           "AssignAddVariableOp", "AssignSubVariableOp", "ResourceGather",
                           "ResourceGatherNd", "VarIsInitializedOp", "Assign"})
_T = TypeVar("_T")
_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "Assign"})


@dataclass(frozen=True, kw_only=True)
class SignatureInput(TensorInfo):
    """One input of a signature: the shape and dtype record every stage of the
    TensorFlow side uses (`TensorInfo`, the signature's shape: None for the batch), with
    the signature's keyword argument and its placeholder in the frozen graph."""

    key: str                          # the signature's keyword argument
    tensor: str                       # its placeholder in the frozen graph ("x:0")


@dataclass(frozen=True)
class FrozenSignature:
    """One signature, frozen: the graph and how its inputs and outputs are named.

    `graph` is the one indexed Graph of the signature from freezing on: the rewrites,
    shape inference, the partitioner and splice edit and read it, so `graph_def` (its
    GraphDef) is the signature as rewritten so far."""

    graph: Graph = field(repr=False)
    signature_key: str
    inputs: tuple[SignatureInput, ...]
    outputs: dict[str, str]           # output key -> tensor in the frozen graph
    tags: tuple[str, ...]
    # Resources the signature captures that are not variables (lookup tables): the
    # placeholder standing for each in the frozen graph, and the loaded object owning
    # it, which the new SavedModel keeps (with its initializer) and feeds back in.
    resources: tuple[CapturedResource, ...] = ()
    # Other signature keys of the SavedModel that serve the same function.
    aliases: tuple[str, ...] = ()
    # Functions of the loaded object computing it under a key of it (Keras' `serve`).
    methods: tuple[Method, ...] = ()
    # Variable writes no output sees, left out of the frozen graph (`_drop_dead_writes`).
    dropped_writes: tuple[str, ...] = ()

    @property
    def graph_def(self) -> graph_pb2.GraphDef:
        return self.graph.graph_def


@dataclass(frozen=True)
class CapturedResource:
    tensor: str    # its placeholder in the frozen graph ("unknown:0")
    owner: object  # the loaded trackable whose resource_handle it is


def _tags_of(model_dir: str) -> list[list[str]]:
    from tensorflow.python.saved_model import loader_impl

    try:
        saved = loader_impl.parse_saved_model(model_dir)
    except OSError as e:
        raise SavedModelError(f"{model_dir} is not a SavedModel directory: {e}") from None
    return [list(m.meta_info_def.tags) for m in saved.meta_graphs]


def freeze_signature(model_dir: str, signature_def_key: str | None = None,
                     tags: list[str] | tuple[str, ...] | None = None) -> FrozenSignature:
    """Load `model_dir` and freeze one of its signatures (default `serving_default`,
    or the only one there is)."""
    with paused_gc():
        frozen = _freeze_signature(model_dir, signature_def_key, tags)
    return _collected(frozen)


def _collected(frozen: _T) -> _T:
    """`frozen`, once the SavedModel loaded to freeze it is collected.

    Loading allocates some hundred thousand long-lived objects and next to no garbage:
    the collector's full passes during it freed nothing (NASNetMobile: three, 8.5 s of
    a compile under load 10), so freezing runs with it paused (`paused_gc`). The loaded
    model's objects point at each other, so only a full pass frees them; it used to come
    at whatever allocated next (NASNetMobile: 252,885 objects and 215 MiB, timed as the
    rewrite stage, which held those 215 MiB while it copied what it needed). Collected
    here, the pass is freezing's."""
    gc.collect()
    return frozen


def _freeze_signature(model_dir: str, signature_def_key: str | None,
                      tags: list[str] | tuple[str, ...] | None) -> FrozenSignature:
    loaded, tags = _load(model_dir, tags)
    signatures = dict(loaded.signatures)
    if signature_def_key is None:
        signature_def_key = (tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
                             if tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY in signatures
                             else sorted(signatures)[0] if len(signatures) == 1 else None)
        if signature_def_key is None:
            raise SavedModelError(f"{model_dir} has several signatures {sorted(signatures)} "
                                  "and no 'serving_default'; pass signature_def_key=...")
    if signature_def_key not in signatures:
        raise SavedModelError(f"{model_dir} has no signature {signature_def_key!r}; it has "
                              f"{sorted(signatures)}")
    frozen = _freeze(loaded, signatures[signature_def_key], signature_def_key, model_dir, tags)
    method = _method(loaded, signature_def_key, signatures[signature_def_key])
    return replace(frozen, methods=(method,) if method else ())


@dataclass(frozen=True)
class FrozenSignatures:
    """Every signature of a SavedModel, frozen: `frozen[0]` is the main one (the default
    signature), each signature function frozen once (`aliases` name the other keys
    serving it); `refused` maps the key of a signature that could not be frozen to why."""

    frozen: tuple[FrozenSignature, ...]
    refused: dict[str, str]


def freeze_signatures(model_dir: str, signature_def_key: str | None = None,
                      tags: list[str] | tuple[str, ...] | None = None) -> FrozenSignatures:
    """Freeze every signature of `model_dir` (just `signature_def_key` if given, with the
    keys serving the same function): the default one (`serving_default`, else the first
    by name) first; signatures that wrap the same function with the same inputs (Keras'
    `serve` and `serving_default`) once.
    A signature other than the main one that cannot be frozen is left out with why;
    the main one raises."""
    with paused_gc():
        frozen = _freeze_signatures(model_dir, signature_def_key, tags)
    return _collected(frozen)


def _freeze_signatures(model_dir: str, signature_def_key: str | None,
                       tags: list[str] | tuple[str, ...] | None) -> FrozenSignatures:
    loaded, tags = _load(model_dir, tags)
    signatures = dict(loaded.signatures)
    if signature_def_key is not None and signature_def_key not in signatures:
        raise SavedModelError(f"{model_dir} has no signature {signature_def_key!r}; it has "
                              f"{sorted(signatures)}")
    main = signature_def_key or tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
    keys = sorted(signatures, key=lambda k: (k != main, k))
    groups: dict[tuple, list[str]] = {}
    for key in keys:
        groups.setdefault(_identity(signatures[key]), []).append(key)
    if signature_def_key is not None:  # that one, under its keys (Keras' serve too)
        groups = {k: g for k, g in groups.items() if g[0] == signature_def_key}
    frozen, refused = [], {}
    for first, *aliases in groups.values():
        try:
            one = _freeze(loaded, signatures[first], first, model_dir, tags)
        except SavedModelError as e:
            if not frozen:  # the main signature
                raise
            refused.update({k: str(e) for k in (first, *aliases)})
            continue
        methods = (_method(loaded, k, signatures[k]) for k in (first, *aliases))
        frozen.append(replace(one, aliases=tuple(aliases), methods=tuple(m for m in methods if m)))
    return FrozenSignatures(tuple(frozen), refused)


@dataclass(frozen=True)
class Method:
    """A function of the loaded object that computes a signature under the signature's
    key, called with positional tensors and returning its own structure (Keras' `serve`:
    `tf.saved_model.load(dir).serve(x)` is how Keras documents calling an export)."""

    name: str
    input_signature: tuple        # its arguments' TensorSpecs, as it takes them
    input_keys: tuple[str, ...]   # the signature input each flattened argument feeds
    outputs: object               # its output structure, each tensor the signature's key


def _method(loaded: object, key: str, signature: object) -> Method | None:
    """The attribute `key` of `loaded` as a `Method` of `signature`, if it is one: a
    function with one traced input signature whose tensors are the signature's inputs
    by name, and whose outputs are its outputs (a dict by key, else `output_<i>` in
    flattened order, as `tf.saved_model.save` names a signature's outputs)."""
    concretes = getattr(getattr(loaded, key, None), "concrete_functions", None)
    if not key.isidentifier() or not concretes or len(concretes) != 1:
        return None
    args, kwargs = concretes[0].structured_input_signature
    # Trailing arguments left at None (`model.call`'s training and mask) are not given.
    while args and args[-1] is None:
        args = args[:-1]
    flat = tf.nest.flatten(args)
    _, specs = signature.structured_input_signature
    if kwargs or not all(isinstance(t, tf.TensorSpec) for t in flat) or \
            sorted(t.name for t in flat) != sorted(specs):
        return None
    returned = concretes[0].structured_outputs
    out_keys = sorted(signature.structured_outputs)
    if isinstance(returned, dict) and sorted(returned) == out_keys and \
            all(not isinstance(v, (dict, list, tuple)) for v in returned.values()):
        outputs = {k: k for k in returned}
    elif sorted(f"output_{i}" for i in range(len(tf.nest.flatten(returned)))) == out_keys:
        outputs = tf.nest.pack_sequence_as(returned, [
            f"output_{i}" for i in range(len(out_keys))])
    else:
        return None
    return Method(key, tuple(args), tuple(t.name for t in flat), outputs)


def _identity(concrete: object) -> tuple:
    """What makes two loaded signatures the same computation: their inputs and output
    keys, the functions their wrappers call and the resources they capture (Keras'
    `serve` and `serving_default` differ only in their wrappers' names)."""
    _, specs = concrete.structured_input_signature
    calls = tuple((op.type, op.get_attr("f").name if op.type in _CALL_OPS else b"")
                  for op in concrete.graph.get_operations())
    return (tuple((k, tuple(s.shape.as_list()) if s.shape.rank is not None else None,
                   s.dtype.name) for k, s in sorted(specs.items())),
            tuple(sorted(concrete.structured_outputs)), calls,
            # TF1 signatures prune one shared graph: the tensors tell them apart
            tuple(t.name for t in concrete.inputs), tuple(t.name for t in concrete.outputs),
            tuple(id(c) for c in concrete.captured_inputs))


_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def _load(model_dir: str, tags: list[str] | tuple[str, ...] | None
          ) -> tuple[object, list[str] | tuple[str, ...]]:
    available_tags = _tags_of(model_dir)
    if tags is None:
        tags = available_tags[0] if len(available_tags) == 1 else [tf.saved_model.SERVING]
    if sorted(tags) not in [sorted(t) for t in available_tags]:
        raise SavedModelError(f"{model_dir} has no MetaGraph tagged {list(tags)}; it has "
                              f"{available_tags}. Pass tags=...")
    loaded = tf.saved_model.load(model_dir, tags=list(tags))
    if not loaded.signatures:
        raise SavedModelError(f"{model_dir} has no signatures; export the model with a "
                              "serving signature (tf.saved_model.save(..., signatures=...))")
    return loaded, tags


def _freeze(loaded: object, concrete: object, signature_def_key: str, model_dir: str,
            tags: list[str] | tuple[str, ...]) -> FrozenSignature:
    what = f"signature {signature_def_key!r} of {model_dir}"
    tables = concrete.graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
    if tables:  # (TF2 tables are objects the SavedModel tracks: see _captured_resources)
        raise SavedModelError(
            f"{what} is a TF1 graph with lookup tables (initialized by "
            f"{', '.join(sorted(op.name for op in tables)[:3])}): neuronish cannot carry a TF1 "
            "table's initialization into the compiled model. Re-export the model with "
            "TensorFlow 2 (tf.lookup tables or Keras StringLookup on a tf.Module / Keras "
            "model, saved with tf.saved_model.save or model.export)")
    writes = _variable_writes(concrete.graph.as_graph_def())
    try:
        graph_def, input_names = _variables_to_constants(concrete)
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        if writes:
            _refuse_variable_writes(writes, what)
        raise SavedModelError(f"{what} could not be frozen (its variables turned into "
                              f"constants): {e}") from None
    resources = _captured_resources(loaded, concrete, set(input_names), what)

    # Signature functions take keyword arguments only; their placeholders come
    # in the flattened (key-sorted) order of the input signature, and so do the
    # outputs of the structured (dict) result.
    _, specs = concrete.structured_input_signature
    keys = sorted(specs)
    placeholders = input_names[:len(keys)]
    inputs = []
    for key, tensor in zip(keys, placeholders, strict=True):
        spec = specs[key]
        shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
        inputs.append(SignatureInput(key=key, tensor=tensor, shape=shape,
                                     dtype=spec.dtype.name))
    out_keys = sorted(concrete.structured_outputs)
    if len(out_keys) != len(concrete.outputs):
        raise SavedModelError(f"signature {signature_def_key!r} returns "
                              f"{len(concrete.outputs)} tensors for keys {out_keys}")
    outputs = {k: t.name for k, t in zip(out_keys, concrete.outputs, strict=True)}

    try:
        graph_def = inline_calls(graph_def)
    except InlineError as e:
        if writes:
            _refuse_variable_writes(writes, what)
        raise SavedModelError(f"{what} could not be fully frozen: {e}") from None
    try:  # the signature's one Graph from here on (FrozenSignature.graph)
        graph = Graph(graph_def)
    except PartitionError as e:
        raise SavedModelError(f"{what} froze to a graph TensorFlow could not run: {e}") from None
    dropped = _drop_dead_writes(graph, list(outputs.values()), writes, what) if writes \
        else ()
    _check_frozen(graph_def, what)
    drop_dangling_colocations(graph_def, graph.nodes)
    _drop_ordering_edges(graph)
    _keep_what_outputs_need(graph, [*outputs.values(), *input_names[:len(keys)]])
    renamed = _strip_call_prefixes(graph)
    outputs = {k: rename_ref(t, renamed) for k, t in outputs.items()}
    inputs = [replace(i, tensor=rename_ref(i.tensor, renamed)) for i in inputs]
    resources = [CapturedResource(rename_ref(r.tensor, renamed), r.owner) for r in resources]
    return FrozenSignature(graph, signature_def_key, tuple(inputs), outputs, tuple(tags),
                           tuple(resources),
                           dropped_writes=dropped)


def _captured_resources(loaded: object, concrete: object, placeholders: set[str],
                        what: str) -> list[CapturedResource]:
    """The resources `concrete` captures that freezing left as placeholders (tables:
    only variables become constants), each with the trackable of `loaded` owning it."""
    from tensorflow.python.trackable.resource import CapturableResource

    captured = concrete.captured_inputs
    internal = concrete.inputs[len(concrete.inputs) - len(captured):]
    wanted = [(t.name, handle) for t, handle in zip(internal, captured, strict=True)
              if t.name in placeholders and handle.dtype == tf.resource]
    if not wanted:
        return []
    owners = [obj for obj in tf.train.TrackableView(loaded).descendants()
              if isinstance(obj, CapturableResource)]
    found = []
    for name, handle in wanted:
        owner = next((o for o in owners if o.resource_handle is handle), None)
        if owner is None:
            raise SavedModelError(f"{what} reads a resource ({name}) that is neither a "
                                  "variable nor a resource the SavedModel tracks (a lookup "
                                  "table, say), so it cannot be carried into the compiled "
                                  "model; track it on the exported object")
        found.append(CapturedResource(name, owner))
    return found


class _ConverterData(convert_to_constants._FunctionConverterDataInEager):
    """Reads each variable without the copy `.numpy()` makes (VGG16's 528 MB took ~1 s):
    the array shares the value's buffer, and is only read, into its constant.

    A subclass used by this module's own converter object, not a patch: TensorFlow's
    class and module stay as they are for every other caller and thread. It leans on
    convert_to_constants' private classes (as `_replace_variables_by_constants` does),
    which test_freeze's proto comparisons would catch changing in a TensorFlow upgrade;
    the public `convert_variables_to_constants_v2` costs the copy and a function wrap."""

    def _eval(self, tensor: object) -> object:
        value = tensor.read_value() if hasattr(tensor, "read_value") else tensor
        try:
            return value._numpy()  # noqa: SLF001
        except (AttributeError, TypeError, ValueError):
            return value.numpy()


def _variables_to_constants(concrete: object) -> tuple[graph_pb2.GraphDef, list[str]]:
    """`convert_variables_to_constants_v2(concrete, lower_control_flow=False)` without its
    last step, which wraps the frozen GraphDef into a new concrete function (half of its
    time on ResNet50) only for us to take the GraphDef back out. Returns the frozen
    GraphDef and the names of its input placeholders (the arguments that were not
    variables), in argument order; outputs keep the function's tensor names."""
    data = _ConverterData(func=concrete, lower_control_flow=False, aggressive_inlining=False)
    graph_def, converted = _replace_variables_by_constants(data)
    # Grappler notes where each node came from, under per-process function names
    # ("__inference_serve_105"): the same model would freeze to other bytes (and miss the
    # compile cache) in every process.
    for node in graph_def.node:
        node.ClearField("experimental_debug_info")
    captures = concrete.graph.internal_captures
    variables = {id(captures[i]) for i in converted}
    return graph_def, [t.name for t in concrete.inputs if id(t) not in variables]


def _replace_variables_by_constants(data: _ConverterData) -> tuple[graph_pb2.GraphDef, set[int]]:
    """convert_to_constants' `_replace_variables_by_constants`, but a variable whose value
    `_constant_proto` can store becomes its `Const` here, without the copy TensorFlow's
    `make_tensor_proto` makes first (`values.astype(dtype)`, even of an array that has
    that dtype already: 2.6 s of ConvNeXtXLarge's 1.4 GB). Everything else, and every
    use of the constant downstream (reads become Identity, function argument types),
    is TensorFlow's own code. Nothing of TensorFlow is replaced, so freezes may run on
    several threads at once."""
    graph = convert_to_constants._GraphDef(data.graph_def)
    for name, tensor_data in data.tensor_data.items():
        convertible = graph.nodes[name]
        proto = _constant_proto(tensor_data.numpy, tensor_data.dtype) \
            if isinstance(convertible, convert_to_constants._VarHandle) else None
        if proto is None:
            convertible.convert_variable_to_constant(None, tensor_data)
            continue
        # What _VarHandle.convert_variable_to_constant does, with our proto.
        node = convertible.converted_self().node
        node.Clear()
        node.name = convertible.node.name
        node.op = "Const"
        node.attr["dtype"].CopyFrom(tensor_data.dtype_attr)
        node.attr["value"].tensor.CopyFrom(proto)
        for edge in convertible.outgoing_edges:
            edge.destination.convertible.convert_variable_to_constant(edge, tensor_data)
    converted = {t.index for t in data.tensor_data.values() if t.index is not None}
    return graph.converted_self().graph_def, converted


_TENSOR_CONTENT_TYPES = getattr(tensor_util, "_TENSOR_CONTENT_TYPES", frozenset())


def _constant_proto(values: object, dtype: object) -> tensor_pb2.TensorProto | None:
    """The TensorProto `make_tensor_proto(values, dtype, values.shape)` returns, for the
    arrays it stores whole in `tensor_content` (numeric, more than one element, under
    2 GB, already of `dtype`, on a little-endian host), built without its copy; None
    for any other value, which TensorFlow's function then handles."""
    if not isinstance(values, np.ndarray) or sys.byteorder != "little":
        return None
    tf_dtype = tf.as_dtype(dtype)
    if (tf_dtype not in _TENSOR_CONTENT_TYPES or values.dtype != tf_dtype.as_numpy_dtype
            or values.size <= 1 or values.nbytes >= 1 << 31):
        return None
    return tensor_pb2.TensorProto(dtype=tf_dtype.as_datatype_enum,
                                  tensor_shape=tf.TensorShape(values.shape).as_proto(),
                                  tensor_content=values.tobytes())


def drop_dangling_colocations(graph_def: graph_pb2.GraphDef,
                              names: Collection[str] | None = None) -> None:
    """Remove `_class: loc:@node` entries naming nodes the frozen graph no longer has
    (inlining renames a called function's inputs and outputs): TensorFlow refuses to
    import a graph with them, and colocation means nothing on one CPU anyway. `names`:
    the graph's node names, if an index has them."""
    if names is None:
        names = {n.name for n in graph_def.node}
    for node in graph_def.node:
        if "_class" not in node.attr:
            continue
        keep = [c for c in node.attr["_class"].list.s
                if not c.startswith(b"loc:@") or c[5:].decode(errors="replace") in names]
        if len(keep) != len(node.attr["_class"].list.s):
            if keep:
                del node.attr["_class"].list.s[:]
                node.attr["_class"].list.s.extend(keep)
            else:
                del node.attr["_class"]


def _variable_writes(graph_def: graph_pb2.GraphDef) -> list[str]:
    """Every node, in the graph or a function it calls, that writes a variable."""
    writes = [f"{n.name} ({n.op})" for n in graph_def.node if n.op in _WRITES]
    return writes + [f"{n.name} ({n.op}) in function {f.signature.name}"
                     for f in graph_def.library.function for n in f.node_def if n.op in _WRITES]


def _drop_dead_writes(graph: Graph, outputs: list[str], writes: list[str],
                      what: str) -> tuple[str, ...]:
    """Remove, in place, the variable writes no output can see, and return their names;
    refuse the signature (naming the writes) if an output can.

    Keras runs BatchNormalization in training mode at serving when a layer whose `training`
    defaults to True (`Resizing`, `CenterCrop`) comes first in the model: the outputs use
    the batch's statistics and the moving averages are written, but nothing in the
    signature reads them. Such a write changes no output of any call, so the frozen graph
    goes without it. A write is visible when the variable it writes (the constant its
    handle became) or the write itself is a data input, at any distance, of an output
    (Keras' random layers read the seed they advance), or when it sits in a control flow
    body, which this does not look into.
    """
    nodes = graph.nodes
    own = [n for n in graph.graph_def.node if n.op in _WRITES]
    if len(own) < len(writes):  # some are left in control flow bodies
        _refuse_variable_writes(writes, what)

    def root(tensor: str) -> str:  # through the Identity chain a read or a write takes
        name = producer(tensor)
        while nodes[name].op == "Identity" and graph.data_inputs[name]:
            name = producer(graph.data_inputs[name][0])
        return name

    written = {root(graph.data_inputs[w.name][0]) for w in own if graph.data_inputs[w.name]}
    seen = graph.needed(outputs, control=False)  # the outputs and their data sources
    gone = {w.name for w in own}
    if seen & (written | gone):
        _refuse_variable_writes(writes, what)
    # What reads a write's output (an `Assign`'s ref) goes with it: no output reads it.
    todo = list(gone)
    while todo:
        for reader in graph.data_consumers(todo.pop()):
            if reader not in gone:
                gone.add(reader)
                todo.append(reader)
    for name in {c for g in gone for c in graph.control_consumers(g)} - gone:
        node = nodes[name]
        graph.set_inputs(name, [i for i in node.input if producer(i) not in gone])
    graph.remove(gone)
    return tuple(sorted(f"{w.name} ({w.op})" for w in own))


def _refuse_variable_writes(writes: list[str], what: str) -> None:
    """Refuse a signature whose variable writes matter, naming them."""
    if writes:
        # Keras' random layers (RandomFlip, RandomRotation, ...) step a seed variable on
        # every call, and their output depends on it: the usual way this comes about.
        seeded = any("random" in w.lower() or "seed" in w.lower() for w in writes)
        hint = (" (Keras random preprocessing layers, such as RandomFlip, advance a seed "
                "variable on every call and transform their input with it: export the "
                "inference model without them)") if seeded else ""
        raise SavedModelError(
            f"{what} cannot be frozen: {', '.join(writes[:10])} writes a variable at serving "
            "time, and a compiled model holds its weights as constants. Export a signature "
            f"that only reads its variables{hint}")


def _check_frozen(graph_def: graph_pb2.GraphDef, what: str) -> None:
    """Refuse a graph that still reads or writes variables, naming each node and the cause."""
    library = {f.signature.name for f in graph_def.library.function}
    problems = []
    for node in graph_def.node:
        if node.op in _WRITES:
            problems.append(f"{node.name} ({node.op}) writes a variable at serving time, and "
                            "a compiled model holds its weights as constants; export a "
                            "signature that only reads its variables")
        elif node.op in VARIABLE_OPS:
            problems.append(f"{node.name} ({node.op}) reads a variable that freezing could not "
                            "turn into a constant (is it created or initialized inside the "
                            "signature?)")
        elif called_function(node, library) is not None:
            problems.append(f"{node.name} ({node.op}) is a function call left after inlining")
    _keep_called_functions(graph_def)
    for f in graph_def.library.function:
        problems += [f"{n.name} ({n.op}) in the control flow body {f.signature.name} accesses "
                     "a variable at serving time" for n in f.node_def if n.op in VARIABLE_OPS]
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise SavedModelError(f"{what} could not be fully frozen: " + "; ".join(problems[:10])
                              + more)


def _drop_ordering_edges(graph: Graph) -> None:
    """Drop NoOps and the control edges that only order stateless nodes, in place.

    Inlined function bodies end in `NoOp`s that wait for their reads and results;
    such an edge crossing a cluster's boundary would make a cycle of the cluster and
    split what is one computation. A control edge from a stateful node (an `Assert`)
    carries meaning and is kept, through any NoOps it passed.
    """
    nodes = graph.nodes
    kept: dict[str, list[str]] = {}  # NoOp -> the meaningful control inputs it stands for

    def meaningful(name: str) -> list[str]:  # a control input's producer
        if nodes[name].op != "NoOp":
            return ["^" + name] if is_stateful(nodes[name].op) else []
        if name not in kept:
            kept[name] = []  # a cycle of NoOps (never in a valid graph) ends here
            kept[name] = sorted({r for c in graph.control_inputs[name] for r in meaningful(c)})
        return kept[name]

    for node in graph.graph_def.node:
        controls = graph.control_inputs[node.name]
        if controls:
            refs = data_refs(node)
            graph.set_inputs(node.name, refs + sorted({r for c in controls
                                                       for r in meaningful(c)}))
    graph.remove([name for name, node in nodes.items() if node.op == "NoOp"])


def _keep_what_outputs_need(graph: Graph, keep: list[str]) -> None:
    """Drop, in place, the nodes no output needs, as a signature call never runs them
    (Keras leaves shape arithmetic nothing reads); the inputs in `keep` stay."""
    graph.keep_only(graph.needed(keep))


def _keep_called_functions(graph_def: graph_pb2.GraphDef) -> None:
    """Drop the library functions nothing calls any more (inlining made most of them
    dead), keeping the bodies of functional control flow (`While`, `If`, `Case`) and
    whatever those call in turn: those ops stay on TensorFlow whole."""
    functions = {f.signature.name: f for f in graph_def.library.function}

    def called(nodes: object) -> set[str]:
        names = set()
        for node in nodes:
            if node.op in functions:  # a direct call: the op is the function
                names.add(node.op)
            for value in node.attr.values():
                if value.HasField("func"):
                    names.add(value.func.name)
                names.update(f.name for f in value.list.func)
        return names

    keep: set[str] = set()
    todo = called(graph_def.node)
    while todo:
        name = todo.pop()
        if name in keep or name not in functions:
            continue
        keep.add(name)
        todo |= called(functions[name].node_def)
    kept = [f for f in graph_def.library.function if f.signature.name in keep]
    del graph_def.library.function[:]
    graph_def.library.function.extend(kept)
    del graph_def.library.gradient[:]


_CALL_PREFIXES = ("StatefulPartitionedCall/", "PartitionedCall/")


def _strip_call_prefixes(graph: Graph) -> dict[str, str]:
    """Drop the call-site prefixes inlining leaves ("StatefulPartitionedCall/dense/MatMul"
    -> "dense/MatMul"), in place, for every node whose short name is still free: node
    names reach users in the compile report and in error messages, and should be the
    ones they wrote. Returns old name -> new name."""
    def short(name: str) -> str:
        while name.startswith(_CALL_PREFIXES):
            prefix = next(p for p in _CALL_PREFIXES if name.startswith(p))
            if len(name) == len(prefix):
                break
            name = name[len(prefix):]
        return name

    taken = set(graph.nodes)
    renamed = {}
    for name in graph.nodes:
        new = short(name)
        if new != name and new not in taken:
            renamed[name] = new
            taken.add(new)
    graph.rename(renamed)
    # Colocations name nodes too ("loc:@lstm/Identity"): renamed with them, or
    # TensorFlow refuses to import the graph (Keras 2's LSTM and GRU carry them).
    for node in graph.graph_def.node:
        if "_class" in node.attr:
            locs = [b"loc:@" + renamed.get(c[5:].decode(), c[5:].decode()).encode()
                    if c.startswith(b"loc:@") else c for c in node.attr["_class"].list.s]
            del node.attr["_class"].list.s[:]
            node.attr["_class"].list.s.extend(locs)
    return renamed
