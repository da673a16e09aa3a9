"""How `neuronish-cc` scales with the node count: seconds for 20k- and 100k-node graphs.

    .venv/bin/python benchmarks/compiler_scale.py                     # 20000 100000
    .venv/bin/python benchmarks/compiler_scale.py --nodes 5000 10000 --graphs relu_chain
    .venv/bin/python benchmarks/compiler_scale.py --passes            # + slowest passes
    .venv/bin/python benchmarks/compiler_scale.py --compare /work/main/.venv/bin/neuronish-cc

Graphs, built as GraphDefs with the compiler's own protobuf module (no TensorFlow):

    relu_chain   x -> Relu -> Relu -> ... (N Relus), one output
    addn         AddN of N inputs, each x * c_i (N Muls by a constant, one AddN)
    fusable      N/4 blocks of MatMul -> Mul by a per-channel constant -> Add of a
                 constant -> Relu: fold_scale_shift and fuse_activation rewrite
                 every block

Each compile is `neuronish-cc compile --verbose` in its own process (as the
partitioner runs it); printed per graph: the wall seconds of the whole process, its CPU
seconds (user + system: less sensitive than wall to what else runs), the seconds spent
in passes, its peak resident memory, and with `--passes` the passes that took longest.
`--compare OTHER` compiles each graph with OTHER too, right before this tree's compiler
(same graph, same load), and prints the ratio of CPU seconds. Nothing is asserted;
compare runs on a quiet machine and note what else was running (the load average is
printed before each graph).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuronish.cc.proto import tf_graph_pb2 as pb  # noqa: E402

FEATURES = 8


def _node(g: pb.GraphDef, name: str, op: str, inputs: tuple[str, ...] = (),
          **attrs: object) -> None:
    n = g.node.add()
    n.name, n.op = name, op
    n.input.extend(inputs)
    for key, value in attrs.items():
        if isinstance(value, np.ndarray):
            t = n.attr[key].tensor
            t.dtype = pb.DT_FLOAT
            t.tensor_shape.dim.extend(pb.TensorShapeProto.Dim(size=d) for d in value.shape)
            t.tensor_content = value.astype(np.float32).tobytes()
        elif key in ("T", "dtype"):
            n.attr[key].type = value  # a DataType
        else:
            n.attr[key].i = value


def _input(g: pb.GraphDef) -> None:
    _node(g, "x", "Placeholder", dtype=pb.DT_FLOAT)


def relu_chain(n: int) -> pb.GraphDef:
    g = pb.GraphDef()
    _input(g)
    prev = "x"
    for i in range(n):
        _node(g, f"r{i}", "Relu", (prev,), T=pb.DT_FLOAT)
        prev = f"r{i}"
    return g


def addn(n: int) -> pb.GraphDef:
    g = pb.GraphDef()
    _input(g)
    rng = np.random.default_rng(0)
    names = []
    for i in range(n):
        _node(g, f"c{i}", "Const", value=rng.standard_normal(FEATURES).astype(np.float32),
              dtype=pb.DT_FLOAT)
        _node(g, f"m{i}", "Mul", ("x", f"c{i}"), T=pb.DT_FLOAT)
        names.append(f"m{i}")
    _node(g, "y", "AddN", tuple(names), T=pb.DT_FLOAT, N=n)
    return g


def fusable(n: int) -> pb.GraphDef:
    g = pb.GraphDef()
    _input(g)
    rng = np.random.default_rng(0)
    prev = "x"
    for i in range(max(1, n // 4)):
        w = rng.standard_normal((FEATURES, FEATURES)).astype(np.float32) / 3
        _node(g, f"w{i}", "Const", value=w, dtype=pb.DT_FLOAT)
        _node(g, f"s{i}", "Const", value=rng.uniform(0.5, 1.5, FEATURES).astype(np.float32),
              dtype=pb.DT_FLOAT)
        _node(g, f"b{i}", "Const", value=rng.standard_normal(FEATURES).astype(np.float32),
              dtype=pb.DT_FLOAT)
        _node(g, f"mm{i}", "MatMul", (prev, f"w{i}"), T=pb.DT_FLOAT)
        _node(g, f"mul{i}", "Mul", (f"mm{i}", f"s{i}"), T=pb.DT_FLOAT)
        _node(g, f"add{i}", "AddV2", (f"mul{i}", f"b{i}"), T=pb.DT_FLOAT)
        _node(g, f"relu{i}", "Relu", (f"add{i}",), T=pb.DT_FLOAT)
        prev = f"relu{i}"
    return g


GRAPHS: dict[str, Callable[[int], pb.GraphDef]] = {
    "relu_chain": relu_chain, "addn": addn, "fusable": fusable}


def compile_once(graph: pb.GraphDef, workdir: Path, compiler: list[str],
                 timeout: float | None = None) -> dict | None:
    """One `neuronish-cc compile --verbose` of `graph`: wall seconds, compile_seconds, and
    the per-pass lines it printed."""
    (workdir / "g.pb").write_bytes(graph.SerializeToString())
    output = graph.node[-1].name
    io = {"inputs": {"x:0": [[4, FEATURES], "float32"]}, "outputs": [f"{output}:0"]}
    exe = workdir / "out.neff"
    start = time.perf_counter()
    # Waited for with wait4: this compile's own CPU seconds and peak RSS (the children's
    # totals of getrusage would mix every compile run so far).
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([*compiler, "compile", str(workdir / "g.pb"), "--framework",
                                 "TENSORFLOW", "--io-config", json.dumps(io), "--output",
                                 str(exe), "--verbose"], stdout=out, stderr=err, text=True)
        killer = threading.Timer(timeout, proc.kill) if timeout else None
        if killer:
            killer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if killer:
            killer.cancel()
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        run = subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())
    if timeout and wall >= timeout and run.returncode < 0:
        return None  # (the compiler was killed)
    cpu = usage.ru_utime + usage.ru_stime
    if run.returncode != 0:
        raise SystemExit(f"compile failed ({run.returncode}):\n{run.stderr[-3000:]}")
    passes = []
    for line in run.stderr.splitlines():
        m = re.match(r"pass (\S+)\s+([\d.]+) ms", line)
        if m:
            passes.append((float(m.group(2)) / 1000, m.group(1)))
    m = re.search(r"compile_seconds\D+([\d.]+)", run.stderr + run.stdout)
    return {"wall": wall, "cpu": cpu, "passes": passes, "rss_mb": usage.ru_maxrss / 1024,
            "compile_seconds": float(m.group(1)) if m else None, "bytes": exe.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=list(GRAPHS))
    parser.add_argument("--passes", action="store_true", help="print the slowest passes")
    parser.add_argument("--compiler", default=str(Path(sys.executable).parent / "neuronish-cc"),
                        help="the neuronish-cc to run (another tree's, to compare)")
    parser.add_argument("--timeout", type=float, help="give up on a compile after this many "
                        "seconds (printed as '> T s')")
    parser.add_argument("--compare", metavar="OTHER", help="another neuronish-cc (main's): "
                        "compile each graph with it first, print both and the CPU ratio")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, "
          f"compiler {args.compiler}" + (f", against {args.compare}" if args.compare else ""))
    compilers = [("other", args.compare), ("this", args.compiler)] if args.compare else \
        [("this", args.compiler)]
    with tempfile.TemporaryDirectory(prefix="compiler-scale-") as tmp:
        for name in args.graphs:
            for n in args.nodes:
                graph = GRAPHS[name](n)
                cpu: dict[str, float] = {}
                for label, compiler in compilers:
                    load = os.getloadavg()[0]
                    r = compile_once(graph, Path(tmp), [compiler], args.timeout)
                    tag = f"{label:<5} " if args.compare else ""
                    if r is None:
                        print(f"{tag}{name:<11} {n:>7} nodes  > {args.timeout:.0f} s (stopped)",
                              flush=True)
                        continue
                    cpu[label] = r["cpu"]
                    in_passes = sum(s for s, _ in r["passes"])
                    print(f"{tag}{name:<11} {n:>7} nodes  {r['wall']:7.2f} s wall  "
                          f"{r['cpu']:7.2f} s CPU  {in_passes:7.2f} s in passes  "
                          f"{r['rss_mb']:6.0f} MB peak  ({r['bytes']} bytes, load {load:.1f})",
                          flush=True)
                    if args.passes:
                        for seconds, p in sorted(r["passes"], reverse=True)[:4]:
                            print(f"      {p:<24} {seconds:7.3f} s")
                if len(cpu) == 2:
                    print(f"      CPU this / other: {cpu['this'] / cpu['other']:.2f}", flush=True)


if __name__ == "__main__":
    main()
