"""`neuronish.saved_model.compile`: one call from a SavedModel to a compiled one.

    report = neuronish.saved_model.compile("model/", "model_neuron/", batch_size=2)

The stages, each its own module:

    freeze      SavedModel signature -> one frozen GraphDef, dynamic batch  (freeze.py)
    shapes      the compile-time shape of every input                        (input_shapes.py)
    partition   mark -> cluster -> drop small -> encapsulate                 (partition/)
    compile     one `neuronish-cc` process per subgraph                      (compile_driver.py)
    recover     subgraphs the compiler rejects are partitioned again without
                the nodes it names; what still fails stays on TensorFlow     (recovery.py)
    splice      each compiled cluster becomes one `NeuronOp`     (partition/splice.py, neuron_op.py)
    export      the rewritten graph becomes the new SavedModel               (export.py)
    report      what runs where, and why                                     (compile_report.py)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from neuronish.runtime.executable import Executable, from_bytes

from . import calibration, external, keras_files, tfn_compat
from .cc_flags import check_compiler_flags
from .compile_cache import CacheStats, CompileCache, compile_with_cache
from .compile_driver import CompileJob, CompileResult
from .compile_report import build_report, format_report, modelled_figures, numpy_steps
from .contracts import model_config
from .dynamic_ops import DynamicOp, FreeShapes, compile_ahead, make_dynamic
from .errors import CompileWarning, SavedModelError, SubgraphCompileError
from .export import ExportedSignature, signature_method_names, write_saved_model
from .external import BlobFile
from .freeze import FrozenSignature, FrozenSignatures, freeze_signatures
from .input_shapes import batch_of, compile_shapes, plan_shapes
from .neuron_op import neuron_op_shell
from .partition import compiler_support, partition, splice
from .recovery import MAX_RECOVERY_ROUNDS, digest, recover
from .rewrites.rewrite import rewrite_for_device
from .shape_bounds import settle
from .shape_specialize import StoredShape
from .subgraph_files import hold_constants, release_constants, write_subgraph
from .warmup_file import WARMUP_FILE, warmup_records

if TYPE_CHECKING:
    from tensorflow.core.framework import graph_pb2

    from .input_shapes import ShapePlan
    from .partition import Partition, Subgraph
    from .shape_specialize import DynamicSpec
    from .verification import Verdict


def compile(  # noqa: A001, PLR0913 (the name and the arguments users know from tensorflow-neuron)
    model_dir: str,
    new_model_dir: str,
    tags: str | Sequence[str] | None = None,
    model_feed_dict: Mapping[str, object] | None = None,
    minimum_segment_size: int = 2,
    op_whitelist: Sequence[str] | None = None,
    no_fuse_ops: Sequence[str] | None = None,
    force_fuse_ops: Sequence[str] | None = None,
    *,
    batch_size: int = 1,
    model_shape_feed_dict: Mapping[str, Sequence[int]] | None = None,
    signature_def_key: str | None = None,
    compiler_args: str | Sequence[str] | None = None,
    compiler_workdir: str | None = None,
    compiler_timeout: float | None = None,
    max_num_compilers: int | None = None,
    dynamic_batch_size: bool = True,
    compiler_recovery: bool = True,
    progress: Callable[[int, int, CompileResult], None] | None = None,
    graph: str | None = None,
    verify: bool = False,
    quantize: str | None = None,
    calibration_data: Iterable[Mapping[str, object]] | None = None,
    max_error: float | None = None,
    import_modules: Sequence[str] = (),
    warmup_requests: bool = False,
    shape_bounds: Mapping[str, Mapping[int, tuple[int, int]]] | None = None,
    shape_buckets: Mapping[str, Mapping[int, Sequence[int]]] | None = None,
    **tensorflow_neuron_args: object,
) -> dict:
    """Compile the SavedModel at `model_dir` into a new one at `new_model_dir`.

    The positional arguments after the two directories are tensorflow-neuron 1.x's, in
    its order, with its `None` defaults; its other keyword arguments are taken as
    `tfn_compat.translate` says (docs/saved-model-compile.md, the migration table).
    `model_dir` may also be a Keras model file (`.keras`, `.h5`); `import_modules` are
    imported first, so the custom layers they register can be loaded. With
    `warmup_requests`, the new model gets TF Serving's warm-up file
    (`assets.extra/tf_serving_warmup_requests`), a Predict on `model_feed_dict`.

    Shapes come from `model_feed_dict` (example arrays), else
    `model_shape_feed_dict` (shapes), else the signature with its batch
    dimension set to `batch_size`; both dicts are keyed by signature input key.
    Dimensions other than the batch that none of them fixes stay free: every call
    within their bounds runs on the device, on an executable compiled for its shape
    (docs/saved-model-compile.md, "Free dimensions"); `shape_bounds` gives bounds,
    `{key: {axis: (low, high)}}`, where the model's own do not suit, and
    `shape_buckets`, `{key: {axis: [sizes]}}`, sizes to compile ahead instead of at
    the first call of each (stored in the SavedModel, so a server without a compiler
    serves them; each holds its own copy of the weights).
    `no_fuse_ops`/`force_fuse_ops` name nodes or op types to keep on TensorFlow
    / to fuse regardless of size; `op_whitelist` (tensorflow-neuron's), when given,
    limits the op types the device may run. `compiler_args` is a list of flags or one
    string split as a shell would. `graph` names an HTML file to draw the partition
    in (Graphviz DOT alongside; see `graph_picture`). With `verify`, each compiled
    subgraph runs on TensorFlow and on the device with example inputs, and one that
    differs beyond its tolerance stays on TensorFlow (neuronish/verification.py; the
    report's `verification`). With `quantize="int8"`, convolutions and matmuls are
    quantized from `calibration_data` (feed dicts like `model_feed_dict`); `max_error`
    keeps the costliest in float32 until the outputs' relative error on that set is
    within it (docs/int8.md; each NeuronOp's `quantization` in the report). Returns the
    compile report.
    """
    extras = tfn_compat.translate(tensorflow_neuron_args, op_whitelist)
    tfn_compat.import_modules(import_modules)
    if keras_files.is_keras_file(model_dir):
        with keras_files.as_saved_model(model_dir, model_shape_feed_dict) as exported:
            report = compile(exported, new_model_dir, tags, model_feed_dict,
                             minimum_segment_size, op_whitelist, no_fuse_ops, force_fuse_ops,
                             batch_size=batch_size, model_shape_feed_dict=model_shape_feed_dict,
                             signature_def_key=signature_def_key, compiler_args=compiler_args,
                             compiler_workdir=compiler_workdir,
                             compiler_timeout=compiler_timeout,
                             max_num_compilers=max_num_compilers,
                             dynamic_batch_size=dynamic_batch_size,
                             compiler_recovery=compiler_recovery, progress=progress,
                             graph=graph, verify=verify, import_modules=(),
                             warmup_requests=warmup_requests, quantize=quantize,
                             calibration_data=calibration_data, max_error=max_error,
                             shape_bounds=shape_bounds, shape_buckets=shape_buckets,
                             **tensorflow_neuron_args)
        report["model_dir"] = model_dir
        return report
    tags = tfn_compat.tags_list(tags)
    no_fuse_ops = (*tfn_compat.names_tuple(no_fuse_ops, "no_fuse_ops"), *extras.no_fuse_ops)
    force_fuse_ops = tfn_compat.names_tuple(force_fuse_ops, "force_fuse_ops")
    compiler_args = check_compiler_flags(  # before any work: a driver-owned flag is refused
        (*tfn_compat.compiler_args_tuple(compiler_args), *extras.compiler_args), "compiler_args")
    start = time.perf_counter()
    _check_dirs(model_dir, new_model_dir)
    external.threshold_from_env()  # a bad value is refused now, not after the compilers ran
    if batch_size < 1:
        raise SavedModelError(f"batch_size must be >= 1, got {batch_size}")
    if quantize not in (None, "none", "int8"):
        raise SavedModelError(f"quantize must be None or 'int8', got {quantize!r}")
    if (quantize == "int8") != (calibration_data is not None) or \
            (max_error is not None and quantize != "int8"):
        raise SavedModelError("quantize='int8' needs calibration_data (and calibration_data "
                              "and max_error need quantize='int8')")
    if max_error is not None and not max_error >= 0:
        raise SavedModelError(f"max_error must be a number >= 0, got {max_error!r}")
    if warmup_requests and not model_feed_dict:
        raise SavedModelError("warmup_requests writes a Predict request of model_feed_dict: "
                              "pass example inputs in model_feed_dict")
    signatures = freeze_signatures(model_dir, signature_def_key, tags)
    int8 = None
    if quantize == "int8":
        keys = [i.key for i in signatures.frozen[0].inputs]
        samples = calibration.collect(calibration_data, keys)  # type: ignore[arg-type]
        int8 = _Int8(samples, calibration.fingerprint(samples), max_error)
    options = _Options(batch_size=batch_size, model_shape_feed_dict=model_shape_feed_dict,
                       model_feed_dict=model_feed_dict,
                       minimum_segment_size=minimum_segment_size,
                       no_fuse_ops=tuple(no_fuse_ops), force_fuse_ops=tuple(force_fuse_ops),
                       compiler_args=tuple(compiler_args), compiler_workdir=compiler_workdir,
                       compiler_timeout=compiler_timeout, max_num_compilers=max_num_compilers,
                       dynamic_batch_size=dynamic_batch_size,
                       compiler_recovery=compiler_recovery, progress=progress, verify=verify,
                       op_whitelist=extras.op_whitelist, int8=int8,
                       shape_bounds=shape_bounds, shape_buckets=shape_buckets)
    # Files are hashed (for their names in assets/) on other threads, while the compilers
    # run and the executables are read: ~1 s per GB each, otherwise spent waiting.
    with _scratch_dir(new_model_dir) as scratch, \
            ThreadPoolExecutor(2, thread_name_prefix="neuronish-hash") as hasher:
        state = _State(scratch, hasher, CompileCache.from_env(), CacheStats(),
                       input_keys=frozenset(i.key for s in signatures.frozen for i in s.inputs))
        main, *others = signatures.frozen
        done = _compile_signature(main, options, state, _feeds_for(main, signatures, options))
        more, reports = [], {}
        for other in others:
            # Every signature of the model is compiled, so its clients work unchanged; one
            # that cannot be is kept as it was, on TensorFlow.
            try:
                extra = _compile_signature(other, replace(options, compiler_workdir=None if
                                                          compiler_workdir is None else
                                                          os.path.join(compiler_workdir,
                                                                       other.signature_key)),
                                           state, _feeds_for(other, signatures, options),
                                           main=False)
            except (SavedModelError, SubgraphCompileError) as e:
                warnings.warn(f"signature {other.signature_key!r} of {model_dir} stays on "
                              f"TensorFlow: {e}", CompileWarning, stacklevel=2)
                extra = _Compiled.left_on_tensorflow(other, str(e))
            more.append(extra)
        write_saved_model(done.graph_def, done.accepted(main), done.outputs, new_model_dir,
                          done.blobs,
                          more=[ExportedSignature(m.graph_def, m.accepted(m.signature),
                                                  m.outputs, m.blobs) for m in more],
                          method_names=signature_method_names(model_dir),
                          extra_files={**(_warmup_file(main, signatures, options)
                                          if warmup_requests else {}),
                                       **_shapes_file(done, more)})
        for m in more:
            reports[m.signature.signature_key] = m.report(model_dir, new_model_dir, batch_size)
        if graph is not None:
            from .graph_picture import placement, write_graph

            rewritten = done.signature.graph_def
            write_graph(graph, rewritten, placement(rewritten, [sg for sg, _ in done.compiled],
                                                    done.part.left_on_tensorflow,
                                                    done.excluded),
                        title=f"{model_dir} at batch {batch_size}")
    report = done.report(model_dir, new_model_dir, batch_size,
                         seconds=time.perf_counter() - start)
    report["compile_cache"] = state.cache_stats.as_dict()
    if verify:
        report["verification"] = [v.as_dict() for v in done.verdicts]
    # The other signatures the new model serves: each one's own report, or the same
    # function under another key (Keras' `serve`).
    report["aliases"] = list(main.aliases)
    report["signatures"] = {k: r for k, r in reports.items()}
    dropped = {s.signature_key: list(s.dropped_writes) for s in signatures.frozen
               if s.dropped_writes}
    if dropped:
        # Keras' BatchNormalization in training mode (a Resizing layer in front makes it so)
        # updates moving averages nothing in the signature reads.
        report["dropped_variable_writes"] = dropped
        for key, writes in dropped.items():
            warnings.warn(
                f"signature {key!r} of {model_dir} writes variables no output reads "
                f"({', '.join(writes[:4])}{', ...' if len(writes) > 4 else ''}: "
                f"{len(writes)} in all); the compiled model leaves the writes out, its outputs "
                "are TensorFlow's. (Keras runs BatchNormalization in training mode, on the "
                "batch's statistics, when a layer such as Resizing comes first in the model; "
                "its moving averages are the writes.)", CompileWarning, stacklevel=2)
    if signatures.refused:
        report["signatures_dropped"] = dict(signatures.refused)
        for key, why in signatures.refused.items():
            warnings.warn(f"signature {key!r} of {model_dir} is not in the compiled model: "
                          f"{why}", CompileWarning, stacklevel=2)
    return report


def _shapes_file(done: _Compiled, more: list[_Compiled]) -> dict[str, bytes]:
    """`assets.extra/neuronish_shapes.json`: the bounds of each signature's free
    dimensions, which the model server shows in its metadata (serving/signatures.py)."""
    import json

    from .shape_specialize import SHAPES_FILE

    bounds: dict[str, dict] = {}
    for c in (done, *more):
        if c.plan is None or not c.plan.free:
            continue
        for key in (c.signature.signature_key, *c.signature.aliases):
            entry = bounds.setdefault(key, {})
            for f in c.plan.free:
                low, high, _ = c.plan.bounds[f.symbol]
                entry.setdefault(f.key, {})[str(f.axis)] = [low, high]
    return {SHAPES_FILE: json.dumps(bounds, sort_keys=True).encode()} if bounds else {}


def _warmup_file(main: FrozenSignature, signatures: FrozenSignatures, options: _Options
                 ) -> dict[str, bytes]:
    """TF Serving's warm-up file: a Predict of the main signature on its examples, which
    must then name every input of it."""
    feeds = _feeds_for(main, signatures, options)[1] or {}
    missing = sorted({i.key for i in main.inputs} - set(feeds))
    if missing:
        raise SavedModelError(f"warmup_requests: model_feed_dict has no example for "
                              f"{missing} of signature {main.signature_key!r}; a warm-up "
                              "request must feed every input")
    return {WARMUP_FILE: warmup_records(main.signature_key,
                                        {i.key: feeds[i.key] for i in main.inputs})}


@dataclass(frozen=True, kw_only=True)
class _Options:
    """The compile's arguments that each signature is compiled with, checked and
    normalised by `compile` (names and flags as tuples); built by keyword only, so a new
    argument is one field here and one keyword there."""

    batch_size: int
    model_shape_feed_dict: Mapping[str, Sequence[int]] | None
    model_feed_dict: Mapping[str, object] | None
    minimum_segment_size: int
    no_fuse_ops: tuple[str, ...]
    force_fuse_ops: tuple[str, ...]
    compiler_args: tuple[str, ...]
    compiler_workdir: str | None
    compiler_timeout: float | None
    max_num_compilers: int | None
    dynamic_batch_size: bool
    compiler_recovery: bool
    progress: Callable[[int, int, CompileResult], None] | None
    verify: bool
    op_whitelist: frozenset[str] | None = None  # tensorflow-neuron's; None: every op type
    int8: _Int8 | None = None
    shape_bounds: Mapping[str, Mapping[int, tuple[int, int]]] | None = None
    shape_buckets: Mapping[str, Mapping[int, Sequence[int]]] | None = None


@dataclass(frozen=True)
class _Int8:
    """quantize='int8': the calibration samples (by signature input key) and the bound."""

    samples: list
    fingerprint: str
    max_error: float | None

    def key_args(self) -> tuple[str, ...]:
        """What the compile key needs beyond the file: the flags and the set's hash."""
        bound = () if self.max_error is None else ("--max-error", repr(self.max_error))
        return ("--quantize", "int8", f"calibration={self.fingerprint}", *bound)


@dataclass
class _State:
    """What the signatures of one compile share: a subgraph two signatures hold (a model's
    logits and its features) is compiled once."""

    scratch: str
    hasher: ThreadPoolExecutor
    cache: CompileCache
    cache_stats: CacheStats
    results: dict[str, CompileResult] = field(default_factory=dict)  # subgraph digest ->
    graphs: dict[str, BlobFile] = field(default_factory=dict)  # digest -> its GraphDef's file
    hashes: dict[str, Future[str]] = field(default_factory=dict)  # file -> its sha256
    input_keys: frozenset[str] = frozenset()  # every signature's input keys


@dataclass(frozen=True, kw_only=True)
class _Compiled:
    """One signature, compiled: its new graph and what the report says of it."""

    signature: FrozenSignature
    graph_def: graph_pb2.GraphDef  # with the NeuronOps spliced in
    outputs: dict[str, str]  # signature output key -> tensor of `graph_def`
    # NeuronOp -> its executable, graph_def and the executables compiled ahead ("stored")
    blobs: dict[str, dict[str, bytes | BlobFile | list[BlobFile]]]
    part: Partition | None  # None: the signature stays on TensorFlow whole (`error`)
    compiled: list[tuple[Subgraph, CompileResult]]  # the subgraphs that became NeuronOps
    excluded: dict[str, str]  # node -> why recovery kept it on TensorFlow
    failures: list[dict]  # the compiler's refusals, round by round
    executables: list[Executable]  # parsed, one per `compiled`, without constants
    verdicts: list[Verdict] = field(default_factory=list)
    error: str | None = None
    plan: ShapePlan | None = None  # the shapes compiled at, with the free dims' bounds
    dynamic: dict[str, DynamicSpec] = field(default_factory=dict)  # NeuronOp -> its spec
    ahead: list[str] = field(default_factory=list)  # shapes compiled ahead (shape_buckets)

    def accepted(self, signature: FrozenSignature) -> FrozenSignature:
        """`signature` declaring the shapes the compiled model accepts: a dimension the
        signature leaves free but the compile fixed (model_shape_feed_dict) is fixed in
        the new model's SignatureDef too, so its metadata tells clients (the batch and
        dimensions left free stay -1)."""
        if self.plan is None:
            return signature
        free = {(f.tensor, f.axis) for f in self.plan.free}
        inputs = []
        for i in signature.inputs:
            given = self.plan.shapes.get(i.tensor)
            if i.shape is None or given is None or len(given) != len(i.shape):
                inputs.append(i)
                continue
            shape = tuple(d if d is not None or k == 0 or (i.tensor, k) in free else given[k]
                          for k, d in enumerate(i.shape))
            inputs.append(replace(i, shape=shape))
        return replace(signature, inputs=tuple(inputs))

    @classmethod
    def left_on_tensorflow(cls, signature: FrozenSignature, error: str) -> _Compiled:
        """A signature that could not be compiled, kept as it was."""
        return cls(signature=signature, graph_def=signature.graph_def,
                   outputs=dict(signature.outputs), blobs={}, part=None, compiled=[],
                   excluded={}, failures=[], executables=[], error=error)

    def report(self, model_dir: str, new_model_dir: str, batch_size: int,
               seconds: float = 0.0) -> dict:
        if self.error is not None:
            return {"signature_def_key": self.signature.signature_key, "OnNeuronRatio": 0.0,
                    "NeuronOps": [], "aliases": list(self.signature.aliases),
                    "error": self.error}
        report = build_report(self.signature, self.part, self.compiled, self.failures,
                              self.excluded, model_dir=model_dir, new_model_dir=new_model_dir,
                              batch_size=batch_size, seconds=seconds,
                              modelled={sg.name: modelled_figures(e) for (sg, _), e in
                                        zip(self.compiled, self.executables, strict=True)},
                              numpy={sg.name: numpy_steps(e) for (sg, _), e in
                                     zip(self.compiled, self.executables, strict=True)})
        for op, exe in zip(report["NeuronOps"], self.executables, strict=True):
            if "quantization" in exe.stats:  # per instruction: precision and error it adds
                op["quantization"] = exe.stats["quantization"]
            if exe.stats.get("auto_cast", {}).get("note"):  # the host runs it slowly
                op["auto_cast_note"] = exe.stats["auto_cast"]["note"]
            if op.get("name") in self.dynamic:
                spec = self.dynamic[op["name"]]
                op["free_dims"] = [{"input": label, "axis": a, "low": b[0], "high": b[1]}
                                   for label, axes in zip(spec.labels, spec.bounds)
                                   for a, b in axes.items()]
        if self.plan is not None and self.plan.free:
            report["free_dims"] = [
                {"input": f.key, "axis": f.axis, "low": self.plan.bounds[f.symbol][0],
                 "high": self.plan.bounds[f.symbol][1], "bound_from": self.plan.bounds[
                     f.symbol][2], "compiled_at": self.plan.probe[f.symbol]}
                for f in self.plan.free]
            report["shapes_compiled_ahead"] = list(self.ahead)
        report["aliases"] = list(self.signature.aliases)
        return report


def _feeds_for(signature: FrozenSignature, signatures: FrozenSignatures, options: _Options
               ) -> tuple[dict | None, dict | None]:
    """The shape and example dicts for `signature`: the entries naming its inputs, and for
    the main signature also those naming no input of any signature (compile_shapes then
    says so)."""
    mine = {i.key for i in signature.inputs}
    known = {i.key for s in signatures.frozen for i in s.inputs}
    main = signature is signatures.frozen[0]

    def pick(given: Mapping | None) -> dict | None:
        if given is None:
            return None
        return {k: v for k, v in given.items() if k in mine or (main and k not in known)}

    return pick(options.model_shape_feed_dict), pick(options.model_feed_dict)


def _compile_signature(signature: FrozenSignature, options: _Options, state: _State,
                       feeds: tuple[dict | None, dict | None], main: bool = True) -> _Compiled:
    """Partition one frozen signature, compile its subgraphs and splice them in."""
    shape_feeds, example_feeds = feeds
    batch_size = options.batch_size
    plan = plan_shapes(signature, batch_size, shape_feeds, example_feeds)
    fetches = list(signature.outputs.values())
    # Rewrites into ops the device runs: constants folded, loops of a fixed count unrolled,
    # complex values as pairs of real ones. Free dimensions stay unknown here, so
    # nothing computed from them becomes a constant.
    # The one Graph of this signature from here to splice: the rewrites edit it in place,
    # and shape inference, the partitioner's rounds and splice read its indexes and the
    # shapes it keeps until an edit.
    graph = signature.graph
    rewrite_for_device(graph, plan.unknown() if plan.free else plan.shapes, fetches)
    plan = settle(plan, signature.graph_def, _mine(options.shape_bounds, signature, main,
                                                      state.input_keys))
    shapes = plan.shapes
    free_shapes = FreeShapes.infer(signature.graph_def, plan) if plan.free else None
    if free_shapes is not None and options.int8 is not None:
        raise SavedModelError("quantize='int8' needs static shapes: give the free dimensions "
                              f"{[f.label() for f in plan.free]} in model_shape_feed_dict")
    dynamic: dict[str, DynamicOp] = {}  # subgraph name -> how its NeuronOp is made dynamic
    graph_def = signature.graph_def
    scratch, hasher, cache, cache_stats = state.scratch, state.hasher, state.cache, \
        state.cache_stats
    results, graphs, hashes = state.results, state.graphs, state.hashes
    excluded: dict[str, str] = {}
    failures: list[dict] = []
    o = options
    # What the compiler accepts, node by node, asked once: the partition avoids what it
    # would refuse, so the recovery rounds below are the rare path.
    support = compiler_support(graph_def)
    if o.op_whitelist is not None:
        support = replace(support, ops=support.ops & o.op_whitelist)
    # Subgraphs built without copies of the large constants, written with them
    # (subgraph_files.py); verification runs the subgraphs in memory, so not then.
    held = {} if o.verify else hold_constants(graph)
    mixing: dict[str, str] = {}  # nodes the compiler's batch check keeps on TensorFlow
    for round_ in range(MAX_RECOVERY_ROUNDS):
        part = partition(graph, shapes, support.ops, refused=support.refused,
                         batch_size=batch_of(shapes, batch_size),
                         no_fuse_ops=o.no_fuse_ops, force_fuse_ops=o.force_fuse_ops,
                         minimum_segment_size=o.minimum_segment_size,
                         dynamic_batch_size=o.dynamic_batch_size, exclude_nodes=excluded,
                         fetches=fetches, batch_mixing=mixing)
        if round_ == 0 and main and part.marking.unmatched_selectors:
            ignored = list(part.marking.unmatched_selectors)
            warnings.warn(f"no_fuse_ops/force_fuse_ops entries {ignored} name no node and no "
                          "op type of the graph; they were ignored (a typo?)", CompileWarning,
                          stacklevel=4)
        if free_shapes is not None:
            keys = {i.tensor: i.key for i in signature.inputs}
            made = [make_dynamic(sg, free_shapes, keys, o.compiler_args)
                    for sg in part.subgraphs]
            part = replace(part, subgraphs=tuple(sg for sg, _ in made))
            dynamic.update({sg.name: d for sg, d in made if d is not None})
        key_args = o.int8.key_args() if o.int8 else ()
        digests = {sg.name: digest(sg, (*o.compiler_args, *key_args))
                   for sg in part.subgraphs}
        todo = [sg for sg in part.subgraphs if digests[sg.name] not in results]
        extra = _int8_args(o.int8, signature, todo, scratch, round_)
        # Each subgraph is written to its file once, streamed (no copy of the weights
        # held whole): the compiler reads it, and export links it into assets/.
        for sg in todo:
            file = write_subgraph(sg, os.path.join(scratch, digests[sg.name] + ".pb"), held)
            graphs[digests[sg.name]] = file
            hashes[file.path] = hasher.submit(external.file_sha256, file.path)
        jobs = [CompileJob(sg.name, Path(graphs[digests[sg.name]].path), sg.io_config,
                           (*o.compiler_args, *extra.get(sg.name, ()))) for sg in todo]
        workdir = o.compiler_workdir if round_ == 0 or o.compiler_workdir is None else \
            os.path.join(o.compiler_workdir, f"recovery-{round_}")
        for sg, result in zip(todo, compile_with_cache(
                jobs, cache, cache_stats, max_num_compilers=o.max_num_compilers,
                timeout=o.compiler_timeout, workdir=workdir, progress=o.progress,
                executables_dir=scratch), strict=True):
            results[digests[sg.name]] = result
            if result.executable_file is not None:
                hashes[result.executable_file] = hasher.submit(external.file_sha256,
                                                               result.executable_file)
        newly_excluded = recover(part, results, digests, excluded, failures,
                                 o.compiler_recovery, mixing)
        if not newly_excluded:
            break
    else:
        raise SubgraphCompileError(
            f"compiler recovery did not converge after {MAX_RECOVERY_ROUNDS} rounds; the "
            f"last failures: {failures[-3:]}; nodes kept on TensorFlow for mixing samples "
            f"across the batch: {len(mixing)} (the last: {list(mixing)[-3:]}). Pass "
            "no_fuse_ops=[...] for the nodes named, or dynamic_batch_size=False")
    release_constants(graph, held)

    compiled = [(sg, results[digests[sg.name]]) for sg in part.subgraphs]
    compiled = [(sg, r) for sg, r in compiled if r.ok]
    ahead: list[str] = []
    stored: dict[str, list[BlobFile]] = {}  # subgraph name -> executables compiled ahead
    buckets = _mine(o.shape_buckets, signature, main, state.input_keys)
    if buckets:
        if free_shapes is None:
            raise SavedModelError("shape_buckets names sizes of free dimensions, and "
                                  f"signature {signature.signature_key!r} has none")
        ahead, executables_ahead = compile_ahead(
            plan, buckets, graph_def, [sg for sg, _ in compiled if sg.name in dynamic],
            {sg.name: graphs[digests[sg.name]].path for sg, _ in compiled}, o.compiler_args,
            cache, cache_stats, o.max_num_compilers, o.compiler_timeout, scratch)
        # (hashed on the pool that hashes every other file of the compile, side by side)
        digests_ahead = [hasher.submit(external.file_sha256, a.executable.path)
                         for a in executables_ahead]
        for a, sha in zip(executables_ahead, digests_ahead, strict=True):
            # stored in the SavedModel, listed in the op's attr
            blob = replace(a.executable, sha256=sha.result())
            ref = external.reference(blob)[0].decode()
            d = dynamic[a.subgraph]
            dynamic[a.subgraph] = replace(d, spec=replace(d.spec, stored=[
                *d.spec.stored, StoredShape(a.shapes, ref)]))
            stored.setdefault(a.subgraph, []).append(blob)
    verdicts = []
    if o.verify:  # subgraphs that differ from TensorFlow stay on it (verification.py)
        from .verification import verify_signature

        # int8 is judged on data like its calibration set: random inputs unlike it
        # (negative pixels for a uint8 input) would fail it for no fault of its own.
        examples = example_feeds or (o.int8.samples[0] if o.int8 else None)
        compiled, verdicts = verify_signature(signature, shapes, examples, compiled,
                                              excluded)
    # Each executable is read once here, for its signature, core count and modelled
    # figures; it and its subgraph are handed to export as they are, never copied into
    # a NodeDef (VGG16's are 553 MB each). Its constants (views of the file) are not
    # needed, and the pages the read mapped (the checksum reads them all) go back to
    # the page cache, where export finds them to link: no weights stay in this process.
    executables = []
    for _, r in compiled:
        executables.append(replace(from_bytes(r.executable), constants={}))
        if isinstance(r.executable, mmap.mmap):
            r.executable.madvise(mmap.MADV_DONTNEED)
    cores = [e.num_cores for e in executables]
    replacements, blobs = [], {}
    for (sg, result), exe in zip(compiled, executables, strict=True):
        assert result.executable is not None
        node = neuron_op_shell(sg.name, sg.inputs, exe, input_signature=sg.input_signature,
                               output_signature=sg.output_signature,
                               # duplicates and placement are left to the runtime
                               model_config=model_config(sum(cores), exe.num_cores))
        if sg.name in dynamic:
            dynamic[sg.name].patch(node)
        replacements.append((sg, node))
        executable = result.executable if result.executable_file is None else BlobFile(
            result.executable_file, len(result.executable),
            hashes[result.executable_file].result())
        graph_file = graphs[digests[sg.name]]
        blobs[sg.name] = {"executable": executable, "graph_def": replace(
            graph_file, sha256=hashes[graph_file.path].result()),
            "stored": stored.get(sg.name, [])}
    new_graph_def, renamed = splice(graph, replacements, fetches=fetches)
    outputs = {k: renamed.get(t, t) for k, t in signature.outputs.items()}
    return _Compiled(signature=signature, graph_def=new_graph_def, outputs=outputs, blobs=blobs,
                     part=part, compiled=compiled, excluded=excluded, failures=failures,
                     executables=executables, verdicts=verdicts, plan=plan, ahead=ahead,
                     dynamic={k: v.spec for k, v in dynamic.items()})


def _mine(given: Mapping | None, signature: FrozenSignature, main: bool,
          known: frozenset[str]) -> dict | None:
    """The entries of `shape_bounds`/`shape_buckets` naming inputs of `signature`, and
    for the main signature also those naming no input of any signature (which it then
    refuses by name), as `_feeds_for` splits the shape dicts."""
    if not given:
        return None
    keys = {i.key for i in signature.inputs}
    return {k: v for k, v in given.items() if k in keys or (main and k not in known)}


def _int8_args(int8: _Int8 | None, signature: FrozenSignature, todo: list, scratch: str,
               round_: int) -> dict[str, tuple[str, ...]]:
    """Per subgraph to compile: the compiler's int8 flags, with its calibration file."""
    if int8 is None or not todo or any(i.key not in int8.samples[0] for i in signature.inputs):
        return {}  # (another signature, whose inputs the calibration set does not feed)
    directory = os.path.join(scratch, f"calibration-{round_}")
    os.makedirs(directory, exist_ok=True)
    tensor_of_key = {i.key: i.tensor for i in signature.inputs}
    files = calibration.write_files(signature.graph_def.SerializeToString(), int8.samples,
                                    tensor_of_key, todo, directory, signature.resources)
    bound = () if int8.max_error is None else ("--max-error", repr(int8.max_error))
    return {name: ("--quantize", "int8", "--calibration", path, *bound)
            for name, path in files.items()}


@contextlib.contextmanager
def _scratch_dir(new_model_dir: str) -> Iterator[str]:
    """A directory for the subgraphs and executables, removed afterwards. Next to the new
    model where that exists, so export can hard-link its files into assets/ (a link
    needs one filesystem) instead of copying gigabytes."""
    parent = os.path.dirname(os.path.abspath(new_model_dir))
    scratch = tempfile.mkdtemp(prefix=f".{os.path.basename(new_model_dir)}.", suffix=".work",
                               dir=parent if os.path.isdir(parent) else None)
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check_dirs(model_dir: str, new_model_dir: str) -> None:
    if not os.path.isdir(model_dir):
        raise SavedModelError(f"model_dir {model_dir} is not a directory")
    if os.path.realpath(model_dir) == os.path.realpath(new_model_dir):
        raise SavedModelError(f"new_model_dir {new_model_dir} is model_dir; the input model is "
                              "never modified: choose another directory")
    if os.path.exists(new_model_dir):
        raise SavedModelError(f"new_model_dir {new_model_dir} already exists; remove it or "
                              "choose another directory")
    source = os.path.realpath(model_dir)
    if os.path.commonpath([source, os.path.realpath(new_model_dir)]) == source:
        raise SavedModelError(f"new_model_dir {new_model_dir} is inside model_dir {model_dir}; "
                              "the input model is never modified: choose a directory outside it")


__all__ = ["build_report", "compile", "compile_shapes", "format_report"]
