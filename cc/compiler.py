"""compile_graph: GraphDef + io-config → executable bytes (the whole compiler)."""

from __future__ import annotations

import functools
import time
from collections import Counter
from pathlib import Path

import numpy as np

from neuronish.common.nogc import frozen_gc, paused_gc
from neuronish.runtime import isa
from neuronish.runtime.executable import Executable, Instruction, to_bytes
from neuronish.runtime.native.spec import numpy_instructions
from neuronish.runtime.signature import TensorSignature

from . import __version__
from .device_model import DeviceDescription, ValueTypes, estimate, load_device
from .errors import InvalidGraph
from .graphdef import TFNode, parse_graph_def
from .host import auto_cast_note
from .ioconfig import IOConfig, parse_io_config
from .ir import Graph, Node, TensorType, Value
from .lower import lower
from .memory import plan_memory
from .passes.choices import kept_float32
from .passes.quantize import QuantizeReport, check_calibration, quantize_int8
from .pipeline import DisablePasses, Dumper, Instrument, build_pipeline, run_pipeline
from .signature import Memo, attrs_fixed, attrs_key, signature_key

AUTO_CAST_MODES = ("none", "matmult", "all")
AUTO_CAST_TYPES = ("bf16", "fp16")


# (signature, output shapes) -> flops: a pure function of them, worked out once each
_FLOPS: Memo[int] = Memo()


def flops(node: Node) -> int:
    """Estimated arithmetic of one instruction (runtime/isa.py's rule)."""
    signature = signature_key(node.kind, node.inputs, node.attrs)
    key = None if signature is None else (signature, tuple(o.shape for o in node.outputs))
    count = _FLOPS.get(key)
    if count is None:
        count = _FLOPS.put(key, isa.flops(node.kind, [v.shape for v in node.inputs],
                                          [v.shape for v in node.outputs], node.attrs))
    return count


def _distinct_outputs(graph: Graph) -> None:
    """Each signature output gets its own computed value: the device writes outputs
    straight into the caller's arrays, so an output cannot alias an input or another
    output."""
    seen: set[int] = set()
    inputs = {v.id for v in graph.inputs}
    for i, v in enumerate(graph.outputs):
        if v.is_const:
            continue
        if v.id in seen or v.id in inputs:
            node = Node("copy", [v], [], {}, ())
            node.outputs = [Value(TensorType(v.shape, v.dtype), producer=node)]
            graph.append(node)
            graph.outputs[i] = node.outputs[0]
        seen.add(graph.outputs[i].id)


def split_stages(costs: list[float], cores: int) -> list[list[int]]:
    """Contiguous stages, one per pipeline core, whose slowest is as fast as a split can
    make it (a pipeline's throughput is its slowest stage's); never more stages than
    instructions, none of them empty."""
    n = len(costs)
    cores = max(1, min(cores, n))
    costs = [max(float(c), 1e-12) for c in costs]
    lo, hi = max(costs), sum(costs)
    for _ in range(64):  # bisect the smallest bottleneck that `cores` stages can hold
        mid = (lo + hi) / 2
        if len(_pack(costs, mid)) <= cores:
            hi = mid
        else:
            lo = mid
    stages = _pack(costs, hi)
    while len(stages) < cores:  # fewer sufficed: split the costliest stage (no stage grows)
        k = max((i for i, st in enumerate(stages) if len(st) > 1),
                key=lambda i: sum(costs[j] for j in stages[i]))
        stage = stages[k]
        cum = np.cumsum([costs[j] for j in stage])
        cut = min(max(int(np.searchsorted(cum, cum[-1] / 2)), 1), len(stage) - 1)
        stages[k:k + 1] = [stage[:cut], stage[cut:]]
    return stages


def _pack(costs: list[float], limit: float) -> list[list[int]]:
    """Instructions in order into as few stages as hold at most `limit` each (one
    instruction costlier than `limit` still gets a stage of its own)."""
    stages: list[list[int]] = [[]]
    total = 0.0
    for i, c in enumerate(costs):
        if stages[-1] and total + c > limit:
            stages.append([])
            total = 0.0
        stages[-1].append(i)
        total += c
    return stages


def _numpy_instructions(exe: Executable) -> list[dict]:
    """`numpy_instructions` of the executable, asked once per distinct instruction (kind,
    attributes, operand types, which operands are constants: all it reads besides the
    TF nodes), then listed for every instruction like it, in program order."""
    types = ValueTypes(exe)
    constants = exe.constants
    groups: dict[object, list[tuple[int, Instruction]]] = {}
    alone: list[tuple[int, Instruction]] = []  # (not keyable: asked on their own)
    index = 0
    for program in exe.programs:
        for ins in program:
            attrs = attrs_key(ins.attrs)
            key = None if attrs is None else (
                ins.kind, attrs, tuple([(types[v], v in constants) for v in ins.inputs]),
                tuple([types[v] for v in ins.outputs]))
            if key is None:
                alone.append((index, ins))
            else:
                groups.setdefault(key, []).append((index, ins))
            index += 1
    batches = [*groups.values(), *([one] for one in alone)]
    firsts = [members[0][1] for members in batches]
    slow = {f["index"]: f for f in numpy_instructions([firsts], exe.values, exe.constants)}
    found = [{**slow[k], "index": i, "tf": list(ins.source)}
             for k, members in enumerate(batches) if k in slow for i, ins in members]
    return sorted(found, key=lambda f: f["index"])


def build_executable(graph: Graph, options: dict, tf_op_counts: dict[str, int],
                     stage_costs: list[float] | None = None) -> Executable:
    """The executable of `graph`: one program, or with `stage_costs` (each node's modelled
    seconds) one per pipeline core, balanced by that cost."""
    _distinct_outputs(graph)
    plan = plan_memory(graph)
    # Compact value ids: inputs, then constants, then everything else.
    ids: dict[int, int] = {}

    def vid(v: Value) -> int:
        return ids.setdefault(v.id, len(ids))

    input_values = [vid(v) for v in graph.inputs]
    inputs = [TensorSignature(v.name, v.dtype, v.shape, axis)
              for v, axis in zip(graph.inputs, graph.input_batch_axes)]
    constants = {vid(v): v.data for v in graph.constants()}
    values: dict[int, tuple[tuple[int, ...], str]] = {}
    for v in graph.inputs:
        values[vid(v)] = (v.shape, v.dtype)
    programs = []
    stages = split_stages(stage_costs, options["pipeline_cores"]) if stage_costs else \
        [list(range(len(graph.nodes)))]
    nodes = graph.nodes
    scratch = plan.scratch
    for stage in stages:
        program = []
        for i in stage:  # (vid inlined: 200,000 instructions ask it ~5 times each)
            node = nodes[i]
            outs = []
            for o in node._outputs:
                k = ids.get(o.id)
                if k is None:
                    k = ids[o.id] = len(ids)
                t = o._type
                values[k] = (t.shape, t.dtype)
                outs.append(k)
            program.append(Instruction(
                node.kind, tuple([vid(v) for v in node._inputs]), tuple(outs),
                node._attrs, scratch.get(i), node.origin))
        programs.append(program)
    output_values = [vid(v) for v in graph.outputs]
    outputs = [TensorSignature(name, v.dtype, v.shape, axis)
               for v, name, axis in zip(graph.outputs, options["output_names"],
                                        graph.output_batch_axes)]
    return Executable(
        compiler={"name": "neuronish-cc", "version": __version__,
                  "options": {k: v for k, v in options.items() if k != "output_names"}},
        inputs=inputs, outputs=outputs, input_values=input_values,
        output_values=output_values, constants=constants, values=values,
        arena_bytes=plan.arena_bytes,
        offsets={ids[k]: off for k, off in plan.value_offsets.items()},
        programs=programs,
        stats={"flops": int(sum(flops(n) for n in graph.nodes)),
               "instructions": len(graph.nodes), "tf_ops": tf_op_counts,
               "memory": plan.summary()},
    )


def compile_graph(graph_def: bytes | list[TFNode], io_config: str | dict | IOConfig,
                  **options: object) -> bytes:
    """Compile a GraphDef (serialized bytes or parsed nodes) into executable bytes;
    the options are `compile_executable`'s."""
    return to_bytes(compile_executable(graph_def, io_config, **options))  # type: ignore[arg-type]


def compile_executable(graph_def: bytes | list[TFNode], io_config: str | dict | IOConfig, *,
                       auto_cast: str = "none", auto_cast_type: str = "bf16",
                       pipeline_cores: int = 1, dump_dir: str | Path | None = None,
                       command_line: list[str] | None = None,
                       timings: dict[str, float] | None = None,
                       instruments: list[Instrument] | None = None,
                       disabled_passes: list[str] | None = None,
                       device: DeviceDescription | None = None,
                       notes: list[str] | None = None,
                       calibration: list[list[np.ndarray]] | None = None,
                       max_error: float | None = None,
                       int8_weight_bits: int = 8) -> Executable:
    """Compile a GraphDef (serialized bytes or parsed nodes) into an executable
    (`neuronish.runtime.executable.write` writes its file without copying the weights).

    Raises a `CompilerError` subclass naming every node that stands in the way
    (`BadIOConfig` if the io-config is not well-formed). Things the user should know
    that do not stop the compile (a clamped pipeline) are appended to `notes`.

    With `calibration` (samples, each a list of arrays in io-config input order),
    convolutions and matmuls are quantized to int8 (docs/int8.md); `max_error` bounds
    the outputs' relative error on those samples; `int8_weight_bits` 7 keeps weights in
    [-64, 64] (int8 kernels exact on CPUs without VNNI)."""
    if auto_cast not in AUTO_CAST_MODES:
        raise InvalidGraph(f"auto-cast must be one of {AUTO_CAST_MODES}, got {auto_cast!r}")
    if auto_cast_type not in AUTO_CAST_TYPES:
        raise InvalidGraph(f"auto-cast-type must be one of {AUTO_CAST_TYPES}, "
                           f"got {auto_cast_type!r}")
    if pipeline_cores < 1:
        raise InvalidGraph(f"neuroncore-pipeline-cores must be >= 1, got {pipeline_cores}")
    start = time.perf_counter()
    # The parsed and lowered graphs are long-lived: out of the collector's sight, and
    # what each paused block below makes is frozen as it ends (nogc.py).
    with frozen_gc():
        nodes = parse_graph_def(graph_def) if isinstance(graph_def, bytes) else graph_def
        io = parse_io_config(io_config)
        graph = lower(nodes, io, notes)
        by_name = {n.name: n.op for n in nodes}
        tf_ops = Counter(by_name[name] for node in graph.nodes for name in node.origin)
        dumper = Dumper(dump_dir)
        instruments = [dumper, *(instruments or []), DisablePasses(disabled_passes or [])]
        quantized = None
        if calibration is not None:
            quantized = QuantizeReport()
            check_calibration(graph, calibration)
            quantize = functools.partial(quantize_int8, samples=calibration, max_error=max_error,
                                         report=quantized, weight_bits=int8_weight_bits)
        graph = run_pipeline(graph, build_pipeline(auto_cast, auto_cast_type,
                                                   quantize if quantized else None),
                             instruments, timings)
        options = {"auto_cast": auto_cast, "auto_cast_type": auto_cast_type,
                   "pipeline_cores": pipeline_cores, "command_line": command_line or [],
                   "output_names": list(io.outputs)}
        if quantized is not None:
            options["quantize"] = "int8"
            if max_error is not None:
                options["max_error"] = max_error
            if int8_weight_bits != 8:
                options["int8_weight_bits"] = int8_weight_bits
        if disabled_passes:  # only when used, so ordinary executables are unchanged
            options["disabled_passes"] = sorted(disabled_passes)
        device = device or load_device()
        # Only allocation from here on, no cyclic garbage; and no attribute is edited.
        with paused_gc(), attrs_fixed():
            exe = _finish(graph, options, dict(sorted(tf_ops.items())), device, notes, quantized)
    exe.stats["compile_seconds"] = round(time.perf_counter() - start, 3)
    if dumper.directory:
        memory = "\n".join(f"%{k} @ {off}" for k, off in sorted(exe.offsets.items()))
        dumper.write("memory_plan", f"arena_bytes {exe.arena_bytes}\n{memory}\n")
    return exe


def _finish(graph: Graph, options: dict, tf_ops: dict[str, int], device: DeviceDescription,
            notes: list[str] | None, quantized: QuantizeReport | None) -> Executable:
    """The executable of the final graph, with its modelled times and statistics."""
    pipeline_cores = options["pipeline_cores"]
    exe = build_executable(graph, options, tf_ops)
    if pipeline_cores > 1:
        # Stages balanced by the device model's time per instruction, not by flops alone
        # (a memory-bound layer with few flops still takes its time).
        seconds = [c.seconds for c in estimate(exe, device).costs[0]]
        exe = build_executable(graph, options, tf_ops, seconds)
        if exe.num_cores < pipeline_cores:
            note = (f"--neuroncore-pipeline-cores {pipeline_cores} asks for more stages than "
                    f"the program has instructions ({len(graph.nodes)}); compiled for "
                    f"{exe.num_cores} pipeline core(s)")
            exe.stats["pipeline"] = {"requested_cores": pipeline_cores,
                                     "cores": exe.num_cores, "note": note}
            if notes is not None:
                notes.append(note)
    if quantized is not None:
        exe.stats["quantization"] = quantized.to_stats()
    if options["auto_cast"] != "none":
        # what auto-cast left in float32, and why (cc/passes/choices.py)
        exe.stats["auto_cast"] = {"float32": kept_float32(graph)}
        note = auto_cast_note(options["auto_cast_type"])
        if note:  # (this CPU computes the 16-bit instructions in float32: slower)
            exe.stats["auto_cast"]["note"] = note
    # Modelled device time per instruction (docs/device-model.md): an optional key.
    exe.stats["device_model"] = estimate(exe, device).to_stats()
    # What the native engine will leave to numpy (slow): the compile report warns of it.
    exe.stats["numpy_instructions"] = _numpy_instructions(exe)
    return exe
