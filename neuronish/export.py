"""Write a rewritten frozen graph back out as a SavedModel.

The new SavedModel holds one `tf.function` per compiled signature whose body
imports the rewritten GraphDef (`NeuronOp` nodes and whatever stayed on
TensorFlow) with the signature's inputs mapped onto its placeholders. Its
signature keeps the original key, input keys, dtypes and dynamic shapes, and
output keys, so a client written for the original model works unchanged.

Large `NeuronOp` attributes (executables, and the subgraphs kept for the
fallback) go to the SavedModel's `assets/` under their content hash, and the op
reads them through asset-path inputs (neuronish/external.py says which and
why): a graph with them inline could not pass protobuf's 2 GiB limit.

The model is written to a temporary directory next to `new_model_dir` and
renamed into place, so a reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from . import external
from .freeze import FrozenSignature, Method, drop_dangling_colocations
from .graph import control_refs, data_refs, producer


class _CompiledModel(tf.Module):
    """What the new SavedModel's object graph holds: its serving function."""


Blob = bytes | mmap.mmap | external.BlobFile
# {NeuronOp: {attr: its value; "stored": the executables compiled ahead}}
Blobs = Mapping[str, Mapping[str, Blob | list[external.BlobFile]]]


def externalize(graph_def: graph_pb2.GraphDef, staging_dir: str, threshold: int,
                blobs: Blobs | None = None) -> dict[str, str]:
    """Move the NeuronOp attributes `external.plan` picks into files under `staging_dir`
    (in place); returns {placeholder tensor name: file path} to feed the ops' new
    `external_files` inputs. `blobs` holds attribute values not set in `graph_def` yet
    ({node name: {attribute: bytes, or a file holding them}}): each is stored in a file
    (a file is hard-linked, not copied, where the filesystem allows) or set inline.
    Its "stored" entry lists executables compiled ahead, which the op's dynamic_shapes
    attr names by reference: each always goes to a file."""
    blobs = blobs or {}
    ops = [n for n in graph_def.node if n.op == "NeuronOp"]
    attrs = [(n, a) for n in ops for a in ("executable", "graph_def")]

    def size(node: node_def_pb2.NodeDef, attr: str) -> int:
        value = blobs.get(node.name, {}).get(attr)
        # Reading a bytes attr copies it (100 MB for ResNet50), and so does ByteSize,
        # which serializes: blobs are measured without either.
        if isinstance(value, external.BlobFile):
            return value.size + 16
        return len(value) + 16 if value is not None else node.attr[attr].ByteSize()

    sizes = [size(n, a) for n, a in attrs]
    # The rest of the graph, without serializing the large attrs once more just to count.
    rest = sum(n.ByteSize() for n in graph_def.node if n.op != "NeuronOp") + \
        graph_def.library.ByteSize() + 1024 * len(ops)
    move = external.plan(sizes, rest, threshold)
    feeds: dict[str, str] = {}
    for (node, attr), go in zip(attrs, move, strict=True):
        value = blobs.get(node.name, {}).get(attr)
        if not go:
            if value is not None:
                node.attr[attr].s = value.read() if isinstance(value, external.BlobFile) \
                    else bytes(value)
            continue
        if value is None:
            value = node.attr[attr].s
        node.attr[attr].s = _feed_file(graph_def, node, value, staging_dir, attr, feeds)
    for node in ops:
        for value in blobs.get(node.name, {}).get("stored", []):
            _feed_file(graph_def, node, value, staging_dir, "executable", feeds)
    return feeds


def _feed_file(graph_def: graph_pb2.GraphDef, node: node_def_pb2.NodeDef, value: Blob,
               staging_dir: str, what: str, feeds: dict[str, str]) -> bytes:
    """Store `value` as the asset its content names, give `node` an `external_files`
    input fed with its path (in `feeds`); returns the reference that names it."""
    ref, digest = external.reference(value)
    path = os.path.join(staging_dir, digest + external.SUFFIX[what])
    if not os.path.exists(path):  # identical subgraphs share one file
        _store(value, path)
    k = node.attr["n_external"].i
    placeholder = node_def_pb2.NodeDef(name=f"{node.name}/external_{k}", op="Placeholder")
    placeholder.attr["dtype"].type = types_pb2.DT_STRING
    placeholder.attr["shape"].shape.SetInParent()  # a scalar
    graph_def.node.append(placeholder)
    # Data inputs come before control inputs ("^name") in a NodeDef.
    data = data_refs(node)
    control = control_refs(node)
    node.ClearField("input")
    node.input.extend([*data, placeholder.name, *control])
    node.attr["n_external"].i = k + 1
    feeds[placeholder.name + ":0"] = path
    return ref


def _store(value: Blob, path: str) -> None:
    """Put `value` at `path` (new) whole: a file is linked where it can be."""
    if isinstance(value, external.BlobFile):
        with contextlib.suppress(OSError):
            os.link(value.path, path)
            return
        shutil.copyfile(value.path, path + ".tmp")
    else:
        with open(path + ".tmp", "wb") as f:
            f.write(value)
    os.rename(path + ".tmp", path)  # no file there: ext4 does not flush it as for a replace


def _serving_function(graph_def: graph_pb2.GraphDef, signature: FrozenSignature,
                      outputs: dict[str, str], assets: dict[str, tf.saved_model.Asset]
                      ) -> tf.types.experimental.ConcreteFunction:
    specs = [tf.TensorSpec(i.shape, i.dtype, name=i.key) for i in signature.inputs]
    keys = [i.key for i in signature.inputs]
    out_keys = sorted(outputs)

    def serve(*args: tf.Tensor) -> dict[str, tf.Tensor]:
        input_map = {i.tensor: arg for i, arg in zip(signature.inputs, args, strict=True)}
        # Lookup tables and other captured resources: the handles of the objects the new
        # model keeps (module.resources), where the frozen graph has placeholders.
        present = {n.name for n in graph_def.node}
        input_map.update({r.tensor: tf.identity(r.owner.resource_handle)
                          for r in signature.resources if producer(r.tensor) in present})
        # Asset paths: TensorFlow points them at wherever the model is loaded from.
        input_map.update({name: tf.identity(asset.asset_path) for name, asset in assets.items()})
        results = tf.graph_util.import_graph_def(
            graph_def, input_map=input_map, return_elements=[outputs[k] for k in out_keys],
            name="model")
        # Output ops named after their keys read well in profiles and errors.
        return {k: tf.identity(t, name=k) for k, t in zip(out_keys, results, strict=True)}

    serve.__name__ = "serve_" + "_".join(keys)[:40]
    return tf.function(serve, input_signature=specs).get_concrete_function()


@dataclass(frozen=True)
class ExportedSignature:
    """One more signature of the new SavedModel: its rewritten graph, as
    `write_saved_model` takes the first one."""

    graph_def: graph_pb2.GraphDef
    signature: FrozenSignature
    outputs: dict[str, str]
    blobs: Blobs


def _method_function(fn: tf.types.experimental.ConcreteFunction, signature: FrozenSignature,
                     method: Method) -> tf.types.experimental.Function:
    """`method` of the original object, computed by the compiled signature `fn`."""
    def call(*args: object) -> object:
        given = dict(zip(method.input_keys, tf.nest.flatten(args), strict=True))
        result = fn(*[given[i.key] for i in signature.inputs])
        return tf.nest.map_structure(lambda key: result[key], method.outputs)

    return tf.function(call, input_signature=list(method.input_signature))


def signature_method_names(model_dir: str) -> dict[str, str]:
    """Each SignatureDef's `method_name` in the SavedModel at `model_dir` (every MetaGraph;
    a TF1 model's `classify`/`regress` signatures name their API there)."""
    saved_model = saved_model_pb2.SavedModel()
    path = os.path.join(model_dir, "saved_model.pb")
    if not os.path.isfile(path):
        return {}
    with open(path, "rb") as f:
        saved_model.ParseFromString(f.read())
    return {key: sd.method_name for mg in saved_model.meta_graphs
            for key, sd in mg.signature_def.items() if sd.method_name}


def _restore_method_names(model_dir: str, method_names: Mapping[str, str]) -> None:
    """tf.saved_model.save writes every signature as `tensorflow/serving/predict`; TF
    Serving's --enable_signature_method_name_check then refuses Classify and Regress on
    a TF1 model's signatures that the original served. Their method names are put back."""
    path = os.path.join(model_dir, "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        saved_model.ParseFromString(f.read())
    changed = False
    for mg in saved_model.meta_graphs:
        for key, sd in mg.signature_def.items():
            want = method_names.get(key)
            if want and sd.method_name != want:
                sd.method_name = want
                changed = True
    if changed:
        with open(path + ".tmp", "wb") as f:
            f.write(saved_model.SerializeToString())
        os.replace(path + ".tmp", path)
        _refresh_fingerprint(model_dir)


def _refresh_fingerprint(model_dir: str) -> None:
    """fingerprint.pb hashes saved_model.pb (its checksum and the SignatureDefs'): after
    saved_model.pb is edited it is computed again, so TF Serving and TensorFlow see a
    fingerprint of the model as it is."""
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    path = os.path.join(model_dir, "fingerprint.pb")
    if not os.path.exists(path):
        return  # a TensorFlow that writes none
    data = fingerprinting.CreateFingerprintDef(model_dir)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def write_saved_model(graph_def: graph_pb2.GraphDef, signature: FrozenSignature,
                      outputs: dict[str, str], new_model_dir: str,
                      blobs: Blobs | None = None,
                      more: Sequence[ExportedSignature] = (),
                      method_names: Mapping[str, str] | None = None,
                      extra_files: Mapping[str, bytes] | None = None) -> None:
    """Save `graph_def` as a SavedModel at `new_model_dir` (which must not exist).

    `outputs` maps each output key to its tensor in `graph_def`. Large NeuronOp
    attributes of `graph_def`, and the `blobs` not set in it yet (`externalize`), are
    replaced by references. `more` are further signatures, each its own function; every
    signature is saved under its key and its `aliases`. `method_names` (signature key ->
    the original's `method_name`) are written back into the new model's SignatureDefs;
    `extra_files` (relative path -> bytes, e.g. the warm-up file) are added before the
    model is renamed into place.
    """
    parent = os.path.dirname(os.path.abspath(new_model_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(new_model_dir)}.", suffix=".tmp",
                           dir=parent)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(new_model_dir)}.", suffix=".assets",
                               dir=parent)
    try:
        module = _CompiledModel()
        everything = [ExportedSignature(graph_def, signature, outputs, blobs or {}), *more]
        module.resources = [r.owner for e in everything for r in e.signature.resources]
        # TensorFlow copies every asset into the new model's assets/ (VGG16's 1.1 GB took
        # 1.8 s): it is given empty stand-ins of the same names, and the real files are
        # renamed over its copies before the model is renamed into place.
        stand_ins = os.path.join(staging, "stand-ins")
        os.mkdir(stand_ins)
        asset_of: dict[str, tf.saved_model.Asset] = {}  # file -> its one Asset
        signatures = {}
        for e in everything:
            # Splicing removes nodes other nodes may still name for colocation.
            drop_dangling_colocations(e.graph_def)
            # In place: a copy of a graph near 2 GiB would not fit twice in memory either.
            feeds = externalize(e.graph_def, staging, external.threshold_from_env(), e.blobs)
            for path in feeds.values():
                if path not in asset_of:
                    open(os.path.join(stand_ins, os.path.basename(path)), "wb").close()
                    asset_of[path] = tf.saved_model.Asset(
                        os.path.join(stand_ins, os.path.basename(path)))
            fn = _serving_function(e.graph_def, e.signature, e.outputs,
                                   {k: asset_of[p] for k, p in feeds.items()})
            for key in (e.signature.signature_key, *e.signature.aliases):
                signatures[key] = fn
            for method in e.signature.methods:  # `compiled.serve(x)` as `original.serve(x)`
                setattr(module, method.name, _method_function(fn, e.signature, method))
        module.external_files = list(asset_of.values())
        # No custom gradients: a node a model's tf.custom_gradient marks (Keras' silu is
        # an IdentityN of that kind) can stay on TensorFlow, and saving its gradient would
        # trace the function the loaded original registered, whose captures (silu's beta)
        # are not in this graph, and fail. A served model is never differentiated.
        tf.saved_model.save(module, tmp, signatures=signatures,
                            options=tf.saved_model.SaveOptions(experimental_custom_gradients=False))
        if method_names:
            _restore_method_names(tmp, method_names)
        for relative, data in (extra_files or {}).items():
            os.makedirs(os.path.dirname(os.path.join(tmp, relative)), exist_ok=True)
            with open(os.path.join(tmp, relative), "wb") as f:
                f.write(data)
        for path in asset_of:
            copied = os.path.join(tmp, "assets", os.path.basename(path))
            if not os.path.isfile(copied):
                raise RuntimeError(f"tf.saved_model.save did not write the asset {copied}; "
                                   "this TensorFlow stores assets differently, please report it")
            # Not os.replace: ext4 writes a file renamed over another out to disk at once
            # (0.3 s for a GB here); a rename to a free name does not.
            os.unlink(copied)
            os.rename(path, copied)
        if os.path.exists(new_model_dir):
            raise FileExistsError(f"{new_model_dir} appeared while compiling; not replacing it")
        os.rename(tmp, new_model_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
