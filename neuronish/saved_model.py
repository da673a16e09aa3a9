"""`neuronish.saved_model.compile`: one call from a SavedModel to a compiled one.

    report = neuronish.saved_model.compile("model/", "model_neuron/", batch_size=2)

The stages, each its own module:

    freeze      SavedModel signature -> one frozen GraphDef, dynamic batch  (freeze.py)
    shapes      the compile-time shape of every input                        (here)
    partition   mark -> cluster -> drop small -> encapsulate                 (partition/)
    compile     one `neuronish-cc` process per subgraph                      (compile_driver.py)
    recover     subgraphs the compiler rejects are partitioned again without
                the nodes it names; what still fails stays on TensorFlow     (here)
    splice      each compiled cluster becomes one `NeuronOp`     (partition/splice.py, neuron_op.py)
    export      the rewritten graph becomes the new SavedModel               (export.py)
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .compile_cache import CacheStats, CompileCache, compile_with_cache
from .compile_driver import CompileJob, CompileResult
from .contracts import INPUT_OPS, PASS_THROUGH_OPS, model_config
from .errors import CompileWarning, SavedModelError, SubgraphCompileError
from .export import write_saved_model
from .freeze import FrozenSignature, freeze_signature
from .neuron_op import neuron_op_node_def
from .partition import Partition, Subgraph, compiler_support, partition, splice
from .partition.graph import GraphIndex
from .partition.mark import Reason

# Nodes that compute nothing per call (inputs, and the partitioner's constants and
# pass-throughs): counting them would let a graph full of Identity nodes look mostly
# compiled while its real work stays on TensorFlow.
_NOT_OPERATIONS = PASS_THROUGH_OPS | INPUT_OPS
# Re-partitioning after a rejection converges fast (each round removes nodes);
# the bound only guards against a compiler that keeps naming new nodes.
_MAX_RECOVERY_ROUNDS = 8


def compile(  # noqa: A001 (the name users know from tensorflow-neuron)
    model_dir: str,
    new_model_dir: str,
    *,
    batch_size: int = 1,
    model_shape_feed_dict: Mapping[str, Sequence[int]] | None = None,
    model_feed_dict: Mapping[str, object] | None = None,
    tags: Sequence[str] | None = None,
    signature_def_key: str | None = None,
    minimum_segment_size: int = 2,
    no_fuse_ops: Sequence[str] = (),
    force_fuse_ops: Sequence[str] = (),
    compiler_args: Sequence[str] = (),
    compiler_workdir: str | None = None,
    compiler_timeout: float | None = None,
    max_num_compilers: int | None = None,
    dynamic_batch_size: bool = True,
    compiler_recovery: bool = True,
    progress: Callable[[int, int, CompileResult], None] | None = None,
    graph: str | None = None,
    verify: bool = False,
) -> dict:
    """Compile the SavedModel at `model_dir` into a new one at `new_model_dir`.

    Shapes come from `model_feed_dict` (example arrays), else
    `model_shape_feed_dict` (shapes), else the signature with its batch
    dimension set to `batch_size`; both dicts are keyed by signature input key.
    `no_fuse_ops`/`force_fuse_ops` name nodes or op types to keep on TensorFlow
    / to fuse regardless of size. `graph` names an HTML file to draw the partition
    in (Graphviz DOT alongside; see `graph_picture`). With `verify`, each compiled
    subgraph runs on TensorFlow and on the device with example inputs, and one that
    differs beyond its tolerance stays on TensorFlow (neuronish/verification.py; the
    report's `verification`). Returns the compile report.
    """
    start = time.perf_counter()
    _check_dirs(model_dir, new_model_dir)
    if batch_size < 1:
        raise SavedModelError(f"batch_size must be >= 1, got {batch_size}")
    signature = freeze_signature(model_dir, signature_def_key, tags)
    shapes = compile_shapes(signature, batch_size, model_shape_feed_dict, model_feed_dict)
    graph_def = signature.graph_def
    fetches = list(signature.outputs.values())

    cache, cache_stats = CompileCache.from_env(), CacheStats()
    excluded: dict[str, str] = {}
    results: dict[str, CompileResult] = {}     # subgraph digest -> result
    failures: list[dict] = []
    # What the compiler accepts, node by node, asked once: the partition avoids what it
    # would refuse, so the recovery rounds below are the rare path.
    support = compiler_support(graph_def)
    index = GraphIndex.build(graph_def)
    for round_ in range(_MAX_RECOVERY_ROUNDS):
        part = partition(graph_def, shapes, support.ops, refused=support.refused, index=index,
                         batch_size=_batch_of(shapes, batch_size),
                         no_fuse_ops=no_fuse_ops, force_fuse_ops=force_fuse_ops,
                         minimum_segment_size=minimum_segment_size,
                         dynamic_batch_size=dynamic_batch_size, exclude_nodes=excluded,
                         fetches=fetches)
        if round_ == 0 and part.marking.unmatched_selectors:
            ignored = list(part.marking.unmatched_selectors)
            warnings.warn(f"no_fuse_ops/force_fuse_ops entries {ignored} name no node and no "
                          "op type of the graph; they were ignored (a typo?)", CompileWarning,
                          stacklevel=2)
        digests = {sg.name: _digest(sg, compiler_args) for sg in part.subgraphs}
        todo = [sg for sg in part.subgraphs if digests[sg.name] not in results]
        jobs = [CompileJob(sg.name, sg.serialize(), sg.io_config, tuple(compiler_args))
                for sg in todo]
        workdir = compiler_workdir if round_ == 0 or compiler_workdir is None else \
            os.path.join(compiler_workdir, f"recovery-{round_}")
        for sg, result in zip(todo, compile_with_cache(
                jobs, cache, cache_stats, max_num_compilers=max_num_compilers,
                timeout=compiler_timeout, workdir=workdir, progress=progress), strict=True):
            results[digests[sg.name]] = result
        newly_excluded = _recover(part, results, digests, excluded, failures,
                                  compiler_recovery)
        if not newly_excluded:
            break
    else:
        raise SubgraphCompileError(
            f"compiler recovery did not converge after {_MAX_RECOVERY_ROUNDS} rounds; the "
            f"last failures: {failures[-3:]}. Pass no_fuse_ops=[...] for the nodes named")

    compiled = [(sg, results[digests[sg.name]]) for sg in part.subgraphs]
    compiled = [(sg, r) for sg, r in compiled if r.ok]
    verdicts = []
    if verify:  # subgraphs that differ from TensorFlow stay on it (verification.py)
        from .verification import verify_signature

        compiled, verdicts = verify_signature(signature, shapes, model_feed_dict, compiled,
                                              excluded)
    cores = [_num_cores(r.executable) for _, r in compiled]
    replacements = []
    for (sg, result), this_cores in zip(compiled, cores, strict=True):
        assert result.executable is not None
        node = neuron_op_node_def(
            sg.name, sg.inputs, result.executable, sg.graph_def,
            input_names=sg.input_names, input_dtypes=sg.input_dtypes,
            input_shapes=sg.input_shapes, input_batch_axis=sg.input_batch_axes,
            output_names=sg.output_names, output_dtypes=sg.output_dtypes,
            output_shapes=sg.output_shapes, output_batch_axis=sg.output_batch_axes,
            # duplicates and placement are left to the runtime
            model_config=model_config(sum(cores), this_cores))
        replacements.append((sg, node))
    new_graph_def, renamed = splice(graph_def, replacements, fetches=fetches, index=index)
    outputs = {k: renamed.get(t, t) for k, t in signature.outputs.items()}
    write_saved_model(new_graph_def, signature, outputs, new_model_dir)
    if graph is not None:
        from .graph_picture import placement, write_graph

        write_graph(graph, graph_def, placement(graph_def, [sg for sg, _ in compiled],
                                                part.left_on_tensorflow, excluded),
                    title=f"{model_dir} at batch {batch_size}")
    report = build_report(signature, part, compiled, failures, excluded,
                          model_dir=model_dir, new_model_dir=new_model_dir,
                          batch_size=batch_size, seconds=time.perf_counter() - start)
    report["compile_cache"] = cache_stats.as_dict()
    if verify:
        report["verification"] = [v.as_dict() for v in verdicts]
    return report


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


# --------------------------------------------------------------------------- shapes

def compile_shapes(signature: FrozenSignature, batch_size: int,
                   model_shape_feed_dict: Mapping[str, Sequence[int]] | None = None,
                   model_feed_dict: Mapping[str, object] | None = None) -> dict[str, list[int]]:
    """Compile-time shape of each input placeholder, keyed by its tensor name."""
    keys = {i.key for i in signature.inputs}
    for arg, given in (("model_feed_dict", model_feed_dict),
                       ("model_shape_feed_dict", model_shape_feed_dict)):
        unknown = sorted(set(given or ()) - keys)
        if unknown:
            raise SavedModelError(f"{arg} names {unknown}, which signature "
                                  f"{signature.signature_key!r} does not have; its inputs "
                                  f"are {sorted(keys)}")
    shapes: dict[str, list[int]] = {}
    for inp in signature.inputs:
        if model_feed_dict and inp.key in model_feed_dict:
            value = np.asarray(model_feed_dict[inp.key])
            if value.dtype != np.dtype(inp.dtype):
                raise SavedModelError(f"model_feed_dict[{inp.key!r}] has dtype {value.dtype}; "
                                      f"the signature expects {inp.dtype}")
            shape = list(value.shape)
            source = "model_feed_dict"
        elif model_shape_feed_dict and inp.key in model_shape_feed_dict:
            shape = [int(d) for d in model_shape_feed_dict[inp.key]]
            source = "model_shape_feed_dict"
        else:
            if inp.shape is None:
                raise SavedModelError(
                    f"input {inp.key!r} has an unknown rank; pass its shape in "
                    f"model_shape_feed_dict={{{inp.key!r}: [...]}} or an example in "
                    "model_feed_dict")
            shape = [batch_size if i == 0 and d is None else d for i, d in enumerate(inp.shape)]
            source = "the signature"
        if inp.shape is not None and (len(shape) != len(inp.shape) or any(
                s is not None and d != s for d, s in zip(shape, inp.shape, strict=True))):
            raise SavedModelError(f"{source} gives input {inp.key!r} the shape {shape}; the "
                                  f"signature declares {_fmt_shape(inp.shape)}")
        if any(d is None or d < 0 for d in shape):
            raise SavedModelError(
                f"input {inp.key!r} has shape {_fmt_shape(inp.shape)}: dimensions other than "
                "the batch are unknown, and the device needs static shapes. Pass "
                f"model_shape_feed_dict={{{inp.key!r}: [...]}} or an example array in "
                "model_feed_dict")
        shapes[inp.tensor] = shape
    return shapes


def _fmt_shape(shape: Sequence[int | None] | None) -> str:
    return "<unknown rank>" if shape is None else \
        "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _batch_of(shapes: dict[str, list[int]], batch_size: int) -> int:
    """The compile batch: dim 0 the inputs agree on (shapes given explicitly may set it),
    else `batch_size`."""
    firsts = {s[0] for s in shapes.values() if s}
    return firsts.pop() if len(firsts) == 1 else batch_size


# --------------------------------------------------------------------------- recovery

def _digest(sg: Subgraph, compiler_args: Sequence[str]) -> str:
    # Asked several times per subgraph; serializing and hashing ResNet50's 100 MB again
    # each time cost ~0.5 s per call, so it is kept on the (immutable) subgraph.
    memo = sg.__dict__.setdefault("_digests", {})
    if tuple(compiler_args) not in memo:
        h = hashlib.sha256(sg.serialize())
        h.update(repr((sorted(sg.io_config["inputs"].items()), sg.io_config["outputs"],
                       list(compiler_args))).encode())
        memo[tuple(compiler_args)] = h.hexdigest()
    return memo[tuple(compiler_args)]


def _recover(part: Partition, results: dict[str, CompileResult], digests: dict[str, str],
             excluded: dict[str, str], failures: list[dict], recovery: bool) -> bool:
    """Decide what to do with the subgraphs that did not compile; True if the graph must be
    partitioned again (some nodes are now excluded)."""
    changed = False
    for sg in part.subgraphs:
        result = results[digests[sg.name]]
        if result.ok:
            continue
        where = (f"subgraph {sg.name} ({len(sg.node_names)} nodes): {result.outcome}. "
                 f"Command line: {' '.join(result.command_line)}" +
                 (f"; log: {result.log_path}" if result.log_path else
                  "; pass compiler_workdir=DIR to keep its log"))
        if not recovery or result.outcome == "bad_usage":
            # A command line the compiler refuses fails every subgraph alike: recovering
            # would quietly leave the whole model on TensorFlow.
            raise SubgraphCompileError(f"{where}\n{result.error}")
        members = set(sg.node_names)
        named = [n for n in result.rejected_nodes if n.get("node") in members]
        if result.outcome == "rejected" and named:
            for n in named:
                excluded[n["node"]] = f"neuronish-cc rejected it: {n.get('reason', '')}".strip()
        else:
            reason = f"its subgraph failed to compile ({result.outcome}); see the compile report"
            for name in sg.node_names:
                excluded[name] = reason
        left = [n["node"] for n in named] or sorted(members)
        failures.append({"subgraph": sg.name, "outcome": result.outcome,
                         "error": result.error.strip(), "log": result.log_path,
                         "command_line": " ".join(result.command_line),
                         "nodes_left_on_tensorflow": left})
        what = ("partitioning again without " + ", ".join(left[:5]) +
                (f" and {len(left) - 5} more" if len(left) > 5 else "")
                if named else f"its {len(left)} nodes stay on TensorFlow")
        warnings.warn(f"subgraph {sg.name} ({len(sg.node_names)} nodes): {result.outcome}; "
                      f"{what} (the compile report's compile_failures say why" +
                      (f"; log: {result.log_path})" if result.log_path else ")"),
                      CompileWarning, stacklevel=3)
        changed = True
    return changed


def _num_cores(executable: bytes | None) -> int:
    from neuronish.runtime.executable import from_bytes

    assert executable is not None
    return from_bytes(executable).num_cores


def _modelled(executable: bytes | None) -> dict:
    """The compiler's modelled device figures for one core group (docs/device-model.md)."""
    from neuronish.runtime.executable import from_bytes

    m = from_bytes(executable).stats.get("device_model") if executable else None
    if not m:  # compiled by a compiler without the device model
        return {}
    return {"device": m["device"], "cores": len(m["stage_seconds"]), "batch": m["batch"],
            "latency_ms": round(m["latency_seconds"] * 1e3, 6),
            "inferences_per_second": round(m["throughput_per_second"], 1)}


# --------------------------------------------------------------------------- report

def build_report(signature: FrozenSignature, part: Partition,
                 compiled: list[tuple[Subgraph, CompileResult]], failures: list[dict],
                 excluded: dict[str, str], *, model_dir: str, new_model_dir: str,
                 batch_size: int, seconds: float) -> dict:
    """The compile report: what runs where, and why.

    `OnNeuronRatio` is the share of the frozen graph's operations (every node but
    those in `_NOT_OPERATIONS`: inputs, constants, pass-throughs) that now run
    inside a `NeuronOp`.
    """
    ops = {n.name: n.op for n in signature.graph_def.node if n.op not in _NOT_OPERATIONS}
    stays = part.left_on_tensorflow
    on_device = {name for sg, _ in compiled for name in sg.node_names
                 if name in ops and name not in stays}
    left: dict[str, Counter[str]] = {}
    per_node: dict[str, str] = {}
    for name, op in ops.items():
        if name in on_device:
            continue
        why = stays.get(name)
        # Rules group nodes; the compiler's own reason is worth showing in full.
        reason = excluded.get(name) or (
            str(why) if why and why.reason == Reason.UNSUPPORTED_ATTRS.value else
            why.reason if why else "not in any compiled cluster")
        left.setdefault(op, Counter())[reason] += 1
        per_node[name] = excluded.get(name) or (str(why) if why else reason)
    neuron_ops = []
    for sg, result in compiled:
        neuron_ops.append({
            "name": sg.name,
            "ops": sum(1 for n in sg.node_names if n in ops),
            "op_counts": dict(sorted(Counter(ops[n] for n in sg.node_names if n in ops).items())),
            "inputs": {n: [list(s), d] for n, s, d in zip(sg.input_names, sg.input_shapes,
                                                           sg.input_dtypes, strict=True)},
            "outputs": {n: [list(s), d] for n, s, d in zip(sg.output_names, sg.output_shapes,
                                                            sg.output_dtypes, strict=True)},
            "dynamic_batch": any(a >= 0 for a in sg.input_batch_axes),
            "dynamic_batch_note": sg.dynamic_batch_reason or "",
            "executable_bytes": len(result.executable or b""),
            "compile_seconds": round(result.seconds, 3),
            "cached": result.cached,
            "outcome": result.outcome,
            "modelled": _modelled(result.executable),
        })
    return {
        "OnNeuronRatio": round(len(on_device) / len(ops), 4) if ops else 0.0,
        "model_dir": model_dir,
        "new_model_dir": new_model_dir,
        "signature_def_key": signature.signature_key,
        "batch_size": batch_size,
        "operations": len(ops),
        "operations_on_neuron": len(on_device),
        "NeuronOps": neuron_ops,
        "OnTensorFlow": {op: {"count": sum(c.values()), "reasons": dict(c)}
                         for op, c in sorted(left.items())},
        "OnTensorFlowNodes": per_node,  # every operation left on TensorFlow, with why
        "compile_failures": failures,
        "ignored_fuse_selectors": list(part.marking.unmatched_selectors),
        "compile_seconds": round(seconds, 2),
    }


def format_report(report: dict) -> str:
    """The report as a table for people (what `neuronish compile` prints)."""
    lines = [f"compiled {report['model_dir']} -> {report['new_model_dir']} "
             f"(signature {report['signature_def_key']!r}, batch {report['batch_size']}) in "
             f"{report['compile_seconds']:.1f} s",
             f"OnNeuronRatio: {report['OnNeuronRatio']:.4f} "
             f"({report['operations_on_neuron']} of {report['operations']} operations on the "
             "device)", ""]
    cache = report.get("compile_cache")
    if cache:
        lines[-1:-1] = [f"compile cache: {cache['hits']} hit(s), {cache['misses']} miss(es)" +
                        (f", {cache['damaged']} damaged entry(ies) recompiled"
                         if cache["damaged"] else "") +
                        (f" (not used: {cache['not_used']})" if cache.get("not_used") else "")]
    rows = [("NeuronOp", "ops", "inputs", "outputs", "executable", "compile s", "batch")]
    for op in report["NeuronOps"]:
        rows.append((op["name"], str(op["ops"]),
                     ", ".join(f"{d}{s}" for s, d in op["inputs"].values()),
                     ", ".join(f"{d}{s}" for s, d in op["outputs"].values()),
                     _fmt_bytes(op["executable_bytes"]), f"{op['compile_seconds']:.2f}",
                     "dynamic" if op["dynamic_batch"] else "fixed"))
    lines += _table(rows)
    for op in report["NeuronOps"]:
        top = ", ".join(f"{k} {v}" for k, v in sorted(op["op_counts"].items(),
                                                      key=lambda kv: -kv[1])[:8])
        lines.append(f"  {op['name']}: {top}" + (", ..." if len(op["op_counts"]) > 8 else ""))
        if op.get("modelled"):
            m = op["modelled"]
            lines.append(f"    modelled on {m['device']} (not measured): {m['latency_ms']:.3f} ms "
                         f"per call of batch {m['batch']} on a group of {m['cores']} core(s), "
                         f"{m['inferences_per_second']:,.0f} inferences/s per group")
        if op["dynamic_batch_note"]:
            lines.append(f"    fixed batch: {op['dynamic_batch_note']}")
    if report["OnTensorFlow"]:
        lines += ["", "left on TensorFlow:"]
        rows = [("op type", "count", "reason")]
        for op, t in report["OnTensorFlow"].items():
            for i, (reason, n) in enumerate(t["reasons"].items()):
                rows.append((op if i == 0 else "", str(n), reason))
        lines += _table(rows)
    for f in report["compile_failures"]:
        lines += ["", f"subgraph {f['subgraph']} failed ({f['outcome']}); its nodes were "
                      f"partitioned again or left on TensorFlow. Log: {f['log'] or '-'}"]
    return "\n".join(lines)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


__all__ = ["build_report", "compile", "compile_shapes", "format_report"]
