"""The compile report: what runs where, and why (`neuronish.saved_model.compile`'s
return value), and its text form (what `neuronish compile` prints)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from .compile_driver import CompileResult
from .contracts import INPUT_OPS, PASS_THROUGH_OPS
from .freeze import FrozenSignature
from .partition import Partition, Subgraph
from .partition.mark import Reason

# Nodes that compute nothing per call (inputs, and the partitioner's constants and
# pass-throughs): counting them would let a graph full of Identity nodes look mostly
# compiled while its real work stays on TensorFlow.
_NOT_OPERATIONS = PASS_THROUGH_OPS | INPUT_OPS


def modelled_figures(executable: object | None) -> dict:
    """The compiler's modelled device figures for one core group (docs/device-model.md),
    from a parsed executable (`neuronish.runtime.executable.from_bytes`)."""
    m = executable.stats.get("device_model") if executable is not None else None
    if not m:  # compiled by a compiler without the device model
        return {}
    return {"device": m["device"], "cores": len(m["stage_seconds"]), "batch": m["batch"],
            "latency_ms": round(m["latency_seconds"] * 1e3, 6),
            "inferences_per_second": round(m["throughput_per_second"], 1)}


def numpy_steps(executable: object | None) -> list[dict]:
    """The instructions of a parsed executable the native engine will leave to the numpy
    reference kernels (`runtime/native/spec.py`'s `numpy_instructions`): slow steps."""
    if executable is None:
        return []
    return list(executable.stats.get("numpy_instructions", []))


def quantization_lines(q: Mapping) -> list[str]:
    """The int8 accuracy debugger: per quantizable instruction, its precision and the
    relative error quantizing it alone adds to its own output (docs/int8.md)."""
    bound = "" if q.get("max_error") is None else f", max_error {q['max_error']:g}"
    bits = "" if q.get("weight_bits", 8) == 8 else f", {q['weight_bits']}-bit weights"
    lines = [f"    int8 on {q['samples']} calibration sample(s){bound}{bits}: output error "
             f"{q['output_error']:.3g} (all int8: {q['all_int8_error']:.3g})"]
    if q.get("note"):
        lines.append(f"    note: {q['note']}")
    for row in q["instructions"]:
        lines.append(f"      {row['precision']:<9} {row['error']:9.2e}  {row['instruction']:<7} "
                     f"{', '.join(row['tf'])}")
    return lines


def build_report(signature: FrozenSignature, part: Partition,
                 compiled: list[tuple[Subgraph, CompileResult]], failures: list[dict],
                 excluded: dict[str, str], *, model_dir: str, new_model_dir: str,
                 batch_size: int, seconds: float,
                 modelled: Mapping[str, dict] | None = None,
                 numpy: Mapping[str, list[dict]] | None = None) -> dict:
    """The compile report: what runs where, and why.

    `OnNeuronRatio` is the share of the frozen graph's operations (every node but
    those in `_NOT_OPERATIONS`: inputs, constants, pass-throughs) that now run
    inside a `NeuronOp`. `modelled` maps a NeuronOp's name to its `modelled_figures`
    (read from its executable when not given), `numpy` to its `numpy_steps` (likewise).
    """
    if modelled is None or numpy is None:
        from neuronish.runtime.executable import from_bytes

        parsed = {sg.name: from_bytes(r.executable) if r.executable else None
                  for sg, r in compiled}
        modelled = modelled if modelled is not None else {
            k: modelled_figures(e) for k, e in parsed.items()}
        numpy = numpy if numpy is not None else {k: numpy_steps(e) for k, e in parsed.items()}
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
            "modelled": modelled.get(sg.name, {}),
            "numpy_instructions": numpy.get(sg.name, []),
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
        slow = op.get("numpy_instructions", [])
        if slow:
            kinds = Counter(f"{i['kind']} {i['fn']} {'/'.join(i['dtypes'])}".replace("  ", " ")
                            for i in slow)
            lines.append(f"    warning: {len(slow)} instruction(s) will run on the numpy "
                         "reference engine (slow; no native kernel for them): " +
                         ", ".join(f"{k} x{n}" for k, n in kinds.most_common(6)) +
                         (", ..." if len(kinds) > 6 else ""))
        if op.get("quantization"):
            lines += quantization_lines(op["quantization"])
        if op.get("auto_cast_note"):
            lines.append(f"    note: {op['auto_cast_note']}")
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
    lines += _other_signatures(report)
    return "\n".join(lines)


def _other_signatures(report: dict) -> list[str]:
    """The compiled model's other signatures, one line each."""
    lines = []
    if report.get("aliases"):
        lines.append(f"also served as: {', '.join(report['aliases'])} (the same function)")
    for key, r in report.get("signatures", {}).items():
        also = f" (also served as {', '.join(r['aliases'])})" if r.get("aliases") else ""
        lines.append(f"signature {key!r}{also}: stays on TensorFlow: {r['error']}"
                     if "error" in r else
                     f"signature {key!r}{also}: OnNeuronRatio {r['OnNeuronRatio']:.4f}, "
                     f"{len(r['NeuronOps'])} NeuronOp(s)")
    for key, why in report.get("signatures_dropped", {}).items():
        lines.append(f"signature {key!r} is not in the compiled model: {why}")
    return [""] + lines if lines else []


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
