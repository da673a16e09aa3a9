"""`neuronish-cc`: the compiler's command line (see docs/contracts.md).

Exit status: 0 compiled; 1 the model could not be compiled (stderr says which
nodes and what to do); 2 bad usage (including an io-config that is not well-formed,
an --output that is not a regular file, a --workdir that is not a directory).
Never a traceback on stderr: a compiler bug is reported in one paragraph, its
trace kept in --workdir. Nothing is written at --output unless compiling succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import BadIOConfig, CompilerError, InvalidGraph, UnsupportedNodes

if TYPE_CHECKING:
    from neuronish.runtime.executable import Executable

# The most cores one core group can have (AWS's largest Inferentia host has 64);
# beyond it a pipeline cannot be placed, and splitting into 10^9 stages would not end.
MAX_PIPELINE_CORES = 64
_TRACE_MARK = "Traceback (most recent call last)"


class UsageError(Exception):
    """Bad command-line usage found before compiling: exit status 2."""


def _check_paths(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """--output must be (or become) a regular file, never a directory or a device;
    --workdir a directory. Checked before any work, so a mistake costs nothing."""
    output = Path(args.output)
    if output.exists() and not output.is_file():
        kind = "a directory" if output.is_dir() else "not a regular file (a device, FIFO or socket)"
        raise UsageError(f"--output {output} is {kind}; give the path of the executable file "
                         "to write")
    if output.parent.exists() and not output.parent.is_dir():
        raise UsageError(f"--output {output}: {output.parent} is not a directory")
    for path in (args.graph, args.io_config):
        try:
            if output.exists() and os.path.samefile(path, output):
                raise UsageError(f"--output {output} is the same file as the input {path}")
        except OSError:
            pass  # the input does not exist (or is inline JSON): reported later
    workdir = Path(args.workdir) if args.workdir else None
    if workdir:
        if workdir.exists() and not workdir.is_dir():
            raise UsageError(f"--workdir {workdir} exists and is not a directory")
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "command_line.txt").write_text(" ".join(["neuronish-cc", *args.argv]) + "\n")
        except OSError as e:
            raise UsageError(f"--workdir {workdir}: cannot write there ({e.strerror})") from None
    return output, workdir


def _write_output(output: Path, exe: Executable) -> int:
    """Write next to the target and rename, so `--output` is never half-written and
    a failed write leaves nothing behind; returns the bytes written.

    Not fsync'ed: the rename makes the file appear whole to every reader, which is what
    a crash of this process could break. Only a crash of the machine could leave a
    partial file (as with any build tool's output, and TensorFlow's SavedModels), and
    the header's length and checksum make the loader refuse that one. The sync cost
    ~0.3 s per GB, for every subgraph the SavedModel compile writes to a temporary
    directory it deletes afterwards."""
    from neuronish.common.nogc import paused_gc
    from neuronish.runtime.executable import write
    from neuronish.runtime.files import replace_atomically

    with paused_gc():  # packing allocates, frees no cycles
        return replace_atomically(output, lambda f: write(exe, f), "executable")


def _write_errors(workdir: Path | None, error: str, message: str, nodes: list[dict]) -> None:
    """errors.json: machine-readable, for the partitioner's recovery."""
    if workdir:
        (workdir / "errors.json").write_text(json.dumps(
            {"error": error, "message": message, "nodes": nodes}, indent=1))


def _keep_trace(workdir: Path | None, trace: str) -> None:
    if workdir:
        try:
            (workdir / "traceback.txt").write_text(trace)
        except OSError:
            pass


def _trace_hint(workdir: Path | None) -> str:
    return (f"neuronish-cc: the Python traceback is in {workdir / 'traceback.txt'}" if workdir
            else "neuronish-cc: pass --workdir DIR to keep the Python traceback "
                 "(DIR/traceback.txt)")


def _compile(args: argparse.Namespace, argv: list[str]) -> int:
    from neuronish.common.nogc import frozen_gc

    from .compiler import compile_executable
    from .device_model import DeviceModelError, load_device
    from .graphdef import load_graph_def
    from .ioconfig import parse_io_config
    from .pipeline import Timer, dump_dir_from_env, pass_names

    try:
        output, workdir = _check_paths(args)
    except UsageError as e:
        print(f"neuronish-cc: error: {e}", file=sys.stderr)
        return 2
    dump_dir = (workdir / "dumps") if workdir else dump_dir_from_env(output.stem)
    unknown = sorted(set(args.disable_pass) - set(pass_names()))
    if unknown:
        print(f"neuronish-cc: error: --disable-pass {', '.join(unknown)}: no such pass; the "
              f"passes are {', '.join(pass_names())}", file=sys.stderr)
        return 2
    try:
        device = load_device(args.device_model)
    except DeviceModelError as e:
        print(f"neuronish-cc: error: {e}", file=sys.stderr)
        return 2
    try:  # a malformed io-config is bad usage: say so before doing any work
        io = parse_io_config(args.io_config)
    except BadIOConfig as e:
        print(f"neuronish-cc: error: bad --io-config: {e}", file=sys.stderr)
        _write_errors(workdir, type(e).__name__, str(e), [])
        return 2
    if (args.quantize == "int8") != bool(args.calibration) or \
            (args.quantize != "int8" and (args.max_error is not None or
                                          args.int8_weight_bits is not None)):
        print("neuronish-cc: error: --quantize int8 needs --calibration FILE.npz (and "
              "--calibration, --max-error and --int8-weight-bits need --quantize int8)",
              file=sys.stderr)
        return 2
    calibration = None
    if args.calibration:
        from .passes.quantize import load_calibration

        try:
            calibration = load_calibration(args.calibration, [t.name for t in io.inputs])
        except CompilerError as e:
            print(f"neuronish-cc: error: {e}", file=sys.stderr)
            return 2
    try:
        timer = Timer()
        notes: list[str] = []
        with frozen_gc():  # the parsed graph is long-lived too (nogc.py)
            nodes = load_graph_def(args.graph)
            exe = compile_executable(nodes, io, auto_cast=args.auto_cast,
                                     auto_cast_type=args.auto_cast_type,
                                     pipeline_cores=args.neuroncore_pipeline_cores,
                                     dump_dir=dump_dir, command_line=["neuronish-cc", *argv],
                                     instruments=[timer], disabled_passes=args.disable_pass,
                                     device=device, notes=notes, calibration=calibration,
                                     max_error=args.max_error,
                                     int8_weight_bits=args.int8_weight_bits or 8)
        for note in notes:
            print(f"neuronish-cc: note: {note}", file=sys.stderr)
    except CompilerError as e:
        text = str(e)
        if _TRACE_MARK in text:  # a lowering's bug: the trace goes to the workdir only
            _keep_trace(workdir, text)
            text = text.split(_TRACE_MARK)[0].rstrip() + "\n" + _trace_hint(workdir)
        print(f"neuronish-cc: error: {type(e).__name__}: {text}", file=sys.stderr)
        problems = e.problems if isinstance(e, UnsupportedNodes) else []
        _write_errors(workdir, type(e).__name__, str(e), [p.to_json() for p in problems])
        if isinstance(e, (UnsupportedNodes, InvalidGraph)):
            # Refused while reading or lowering, before any pass ran: there is no IR to
            # dump, but errors.json has every problem.
            print(f"neuronish-cc: every problem, machine-readable: {workdir / 'errors.json'}"
                  if workdir else "neuronish-cc: pass --workdir DIR to get DIR/errors.json with "
                  "every problem, machine-readable", file=sys.stderr)
        elif not workdir and not os.environ.get("NEURONISH_DUMP_DIR"):
            print("neuronish-cc: set NEURONISH_DUMP_DIR=<dir> or pass --workdir to keep the "
                  "per-pass IR dumps", file=sys.stderr)
        return 1
    except Exception as e:  # a compiler bug: still exit cleanly and leave the evidence
        import traceback

        _keep_trace(workdir, traceback.format_exc())
        print(f"neuronish-cc: internal compiler error: {type(e).__name__}: {str(e)[:2000]}\n"
              "This is a bug in neuronish-cc, not in your model; please report it with the "
              f"--workdir contents. The partitioner leaves this subgraph on TensorFlow.\n"
              f"{_trace_hint(workdir)}", file=sys.stderr)
        _write_errors(workdir, "InternalCompilerError", f"{type(e).__name__}: {e}", [])
        return 1
    try:
        size = _write_output(output, exe)
    except OSError as e:
        print(f"neuronish-cc: error: cannot write --output {output}: {e.strerror}",
              file=sys.stderr)
        return 1
    if args.verbose:
        for r in timer.records:
            print(f"pass {r.name:<22} {r.seconds * 1000:8.1f} ms  {r.nodes_before:5d} -> "
                  f"{r.nodes_after:5d} instructions", file=sys.stderr)
        for name in args.disable_pass:
            print(f"pass {name:<22} disabled", file=sys.stderr)
        print(f"wrote {output} ({size} bytes)", file=sys.stderr)
    return 0


def _list_operators(args: argparse.Namespace) -> int:
    """The supported op types, one per line; with --json, each with its summary and
    whether it checks attribute values, and with --check GRAPH the nodes of GRAPH whose
    attribute values the compiler refuses, each with the reason (what `compile` would
    say): the partitioner keeps those on TensorFlow before compiling anything."""
    from .lower import lower  # noqa: F401  (imports every lowering module)
    from .ops.registry import LOWERINGS, refused_nodes

    if not args.json:
        if args.check:
            print("neuronish-cc: error: --check needs --json", file=sys.stderr)
            return 2
        print("\n".join(sorted(LOWERINGS)))
        return 0
    out: dict = {"framework": args.framework, "operators": {
        op: {"summary": (lw.fn.__doc__ or "").strip().split("\n")[0],
             "attribute_checks": lw.supports is not None}
        for op, lw in sorted(LOWERINGS.items())}}
    if args.check:
        from .graphdef import load_graph_def

        try:
            out["refused"] = refused_nodes(load_graph_def(args.check))
        except CompilerError as e:
            print(f"neuronish-cc: error: {args.check}: {e}", file=sys.stderr)
            return 1
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from neuronish.runtime.errors import ExecutableError
    from neuronish.runtime.executable import describe, from_bytes, read_file

    from .device_model import DeviceModelError, estimate, load_device

    path = Path(args.executable)
    if (path / "saved_model.pb").is_file():  # a compiled SavedModel: every NeuronOp's
        from .saved_model_executables import inspect_saved_model  # inline or in assets/

        return inspect_saved_model(path, args.json)
    if path.exists() and not path.is_file():
        print(f"neuronish-cc: error: {path} is not a regular file (an executable is one)",
              file=sys.stderr)
        return 2
    try:
        device = load_device(args.device_model)
    except DeviceModelError as e:
        print(f"neuronish-cc: error: {e}", file=sys.stderr)
        return 2
    try:
        exe = from_bytes(read_file(path))
        info = describe(exe)
        modelled = estimate(exe, device)
    except OSError as e:
        print(f"neuronish-cc: error: cannot read {args.executable}: {e.strerror}", file=sys.stderr)
        return 1
    except ExecutableError as e:
        print(f"neuronish-cc: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a file the reader did not foresee: refused, never a traceback
        print(f"neuronish-cc: error: {path} is not a readable neuronish executable "
              f"({type(e).__name__}: {str(e)[:500]})", file=sys.stderr)
        return 1
    info["modelled"] = {k: v for k, v in modelled.to_stats().items()
                        if k != "instruction_seconds"}
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"neuronish executable (format v{info['format_version']}, compiled by "
          f"{exe.compiler.get('name')} {exe.compiler.get('version')})")
    opts = exe.compiler.get("options", {})
    print(f"  options: auto-cast={opts.get('auto_cast')} ({opts.get('auto_cast_type')}), "
          f"pipeline cores={opts.get('pipeline_cores')}")
    for title, sigs in (("inputs", info["inputs"]), ("outputs", info["outputs"])):
        print(f"  {title}:")
        for s in sigs:
            axis = f"batch axis {s['batch_axis']}" if s["batch_axis"] >= 0 else "no batch axis"
            print(f"    {s['name']:<30} {s['dtype']}{s['shape']}  ({axis})")
    print(f"  constants: {info['constants']['count']} tensors, "
          f"{info['constants']['bytes'] / 2**20:.2f} MiB")
    mem = exe.stats.get("memory", {})
    print(f"  working memory: {info['memory']['arena_bytes'] / 2**20:.2f} MiB arena "
          f"(unshared {mem.get('unshared_bytes', 0) / 2**20:.2f} MiB)")
    print(f"  programs: {info['num_cores']} core(s), instructions {info['instructions_per_core']}, "
          f"{exe.stats.get('flops', 0) / 1e9:.3f} GFLOP per call")
    print("  instruction kinds: " + ", ".join(f"{k} x{n}" for k, n in
                                              info["instruction_kinds"].items()))
    if info["activation_layouts"]:
        print("  activation layouts (assign_layouts): " + ", ".join(
            f"{k} x{n}" for k, n in info["activation_layouts"].items()))
    if info["compute_precision"]:
        print("  matmul-like operands read in: " + ", ".join(
            f"{k} x{n}" for k, n in info["compute_precision"].items()))
    if info["value_dtypes"]:
        print("  values written, by dtype (assign_dtypes): " + ", ".join(
            f"{k} x{n}" for k, n in info["value_dtypes"].items()))
    slow = exe.stats.get("numpy_instructions", [])
    if slow:
        print(f"  warning: {len(slow)} instruction(s) will run on the numpy reference engine "
              "(no native kernel): " + ", ".join(
                  f"#{i['index']} {i['kind']} {i['fn']}".rstrip() for i in slow[:8]) +
              (", ..." if len(slow) > 8 else ""))
    q = exe.stats.get("quantization")
    if q:  # docs/int8.md
        n8 = sum(r["precision"] == "int8" for r in q["instructions"])
        print(f"  int8: {n8} of {len(q['instructions'])} convolutions/matmuls, output error "
              f"{q['output_error']:.3g} on {q['samples']} calibration sample(s)" +
              (f" (max_error {q['max_error']:g})" if q.get("max_error") is not None else "") +
              (f", {q['weight_bits']}-bit weights" if q.get("weight_bits", 8) != 8 else ""))
        if q.get("note"):
            print(f"  note: {q['note']}")
    if exe.stats.get("auto_cast", {}).get("note"):
        print(f"  note: {exe.stats['auto_cast']['note']}")
    if exe.stats.get("tf_ops"):
        print("  TF ops compiled: " + ", ".join(f"{k} x{n}" for k, n in
                                                exe.stats["tf_ops"].items()))
    _print_modelled(exe, modelled)
    return 0


def _print_modelled(exe, modelled) -> None:  # noqa: ANN001 (Executable, Estimate)
    """The device model's figures: modelled, never measured (docs/device-model.md)."""
    stages = modelled.stage_seconds
    print(f"  modelled on {modelled.device} (a roofline estimate, not a measurement):")
    print(f"    core group of {len(stages)} core(s), batch {modelled.batch}: latency "
          f"{modelled.latency * 1e3:.3f} ms per call, {modelled.throughput:,.0f} inferences/s")
    if len(stages) > 1:
        print("    stages: " + ", ".join(f"core {i} {t * 1e3:.3f} ms" for i, t in
                                        enumerate(stages)))
    costs = [(c, ins) for program, cs in zip(exe.programs, modelled.costs)
             for ins, c in zip(program, cs)]
    total = sum(c.seconds for c, _ in costs) or 1.0
    by_bound: dict[str, float] = {}
    for c, _ in costs:
        by_bound[c.bound] = by_bound.get(c.bound, 0.0) + c.seconds
    shares = sorted(by_bound.items(), key=lambda x: -x[1])
    print("    time by what bounds each instruction: " +
          ", ".join(f"{b} {t / total:.0%}" for b, t in shares))
    print("    top instructions:")
    for c, ins in sorted(costs, key=lambda x: -x[0].seconds)[:5]:
        print(f"      {c.seconds * 1e6:9.1f} us  {ins.kind:<16} {c.dtype:<9} {c.bound:<8} "
              f"{', '.join(ins.source[:2]) or '-'}")


class _Version(argparse.Action):
    """`--version`, its digest of the sources computed only when asked for."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from .identity import version_text

        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    # No prefix abbreviations: `--outp DIR` must not reach --output (the compile driver
    # owns that flag and refuses it in compiler_args by name), and a flag added later
    # must not change what an existing abbreviation meant.
    p = argparse.ArgumentParser(prog="neuronish-cc", description="Compile TensorFlow graphs for "
                                "the neuronish device.", allow_abbrev=False)
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print the version and the digest of the sources, and exit")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", allow_abbrev=False,
                       help="compile a GraphDef into an executable")
    c.add_argument("graph", help="GraphDef file: binary .pb or text .pbtxt")
    c.add_argument("--framework", required=True, choices=["TENSORFLOW"])
    c.add_argument("--io-config", required=True, help="JSON (inline or a file path)")
    c.add_argument("--output", required=True, help="executable file to write")
    c.add_argument("--auto-cast", default="none", choices=["none", "matmult", "all"])
    c.add_argument("--auto-cast-type", default="bf16", choices=["bf16", "fp16"])
    c.add_argument("--neuroncore-pipeline-cores", type=int, default=1, metavar="N")
    c.add_argument("--quantize", default="none", choices=["none", "int8"],
                   help="int8: quantize convolutions and matmuls from --calibration "
                   "(docs/int8.md)")
    c.add_argument("--calibration", metavar="FILE.npz", help="calibration samples: per "
                   "io-config input name an array [samples, *shape]")
    c.add_argument("--max-error", type=float, metavar="X", help="with --quantize int8: keep "
                   "the costliest instructions in float32 until the outputs' relative error "
                   "on the calibration samples is at most X")
    c.add_argument("--int8-weight-bits", type=int, choices=[8, 7], metavar="{8,7}",
                   help="with --quantize int8: 7 keeps every weight in [-64, 64], so oneDNN's "
                   "int8 kernels are exact, and used, on CPUs without VNNI (docs/int8.md)")
    c.add_argument("--workdir", help="keep command line, per-pass dumps and errors.json here")
    c.add_argument("--verbose", type=int, nargs="?", const=1, default=0, metavar="LEVEL",
                   help="1: print each pass's time and instruction counts")
    c.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                   help="skip this pass (every run of it), for debugging; repeatable")
    c.add_argument("--device-model", metavar="FILE", help="device description (JSON) for the "
                   "modelled times; default $NEURONISH_DEVICE_MODEL, else Inferentia2-like")
    lo = sub.add_parser("list-operators", allow_abbrev=False,
                        help="print the supported TF op types, one per line")
    lo.add_argument("--framework", required=True, choices=["TENSORFLOW"])
    lo.add_argument("--json", action="store_true", help="machine-readable: op types with their "
                    "summaries and whether they check attribute values")
    lo.add_argument("--check", metavar="GRAPH", help="with --json: also name the nodes of this "
                    "GraphDef whose attribute values the compiler refuses, with the reason")
    i = sub.add_parser("inspect", allow_abbrev=False,
                       help="describe an executable (or a compiled SavedModel's)")
    i.add_argument("executable")
    i.add_argument("--json", action="store_true")
    i.add_argument("--device-model", metavar="FILE", help="device description (JSON) to model "
                   "on; default $NEURONISH_DEVICE_MODEL, else Inferentia2-like")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:
        # The reader went away (`neuronish-cc list-operators | head`): stop quietly,
        # as Unix tools do, and keep the interpreter's last flush from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # killed by SIGPIPE, by shell convention


def _main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "compile":
        if not 1 <= args.neuroncore_pipeline_cores <= MAX_PIPELINE_CORES:
            print(f"neuronish-cc: error: --neuroncore-pipeline-cores must be in [1, "
                  f"{MAX_PIPELINE_CORES}] (cores of one core group), got "
                  f"{args.neuroncore_pipeline_cores}", file=sys.stderr)
            return 2
        args.argv = argv
        return _compile(args, argv)
    if args.command == "list-operators":
        return _list_operators(args)
    return _inspect(args)


if __name__ == "__main__":
    sys.exit(main())
