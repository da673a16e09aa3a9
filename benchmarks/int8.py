"""int8 (--quantize int8) against TensorFlow fp32, neuronish fp32 and OpenVINO, one run.

    python benchmarks/int8.py [--model resnet50] [--batch-size 8] [--calibration 8]
                              [--rounds 7] [--max-error X]

One frozen graph (random weights, fixed seeds; models/cache.py): TensorFlow runs it,
`neuronish-cc` (a real subprocess) compiles it in fp32 and in int8 from `--calibration`
batches of example inputs (seeds 1..N), and, if `openvino` and `nncf` are importable
(`pip install -e '.[bench]'`), OpenVINO runs the model's SavedModel in f32 and in int8
quantized by `nncf.quantize` from the same batches. Calls alternate, one process;
medians. Errors: max |x − TF fp32| / max |TF fp32| per output, on an input (seed 0)
outside the calibration set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _compile(frozen, tmp: Path, name: str, extra: list[str]) -> tuple[Path, float]:  # noqa: ANN001
    pb, exe = tmp / "graph.pb", tmp / f"{name}.neff"
    if not pb.exists():
        pb.write_bytes(frozen.graph_def)
    cmd = [str(Path(sys.executable).parent / "neuronish-cc"), "compile", str(pb),
           "--framework", "TENSORFLOW", "--io-config", json.dumps(frozen.io_config()),
           "--output", str(exe), *extra]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return exe, time.perf_counter() - start


def _openvino(graph_pb: Path, names: list[str], calib: list[dict], feeds: dict,
              outputs: list[str]) -> dict[str, Callable[[], list[np.ndarray]]]:
    """OpenVINO f32 and NNCF int8 runners on the same frozen graph (empty if OpenVINO is
    not installed or cannot take the model)."""
    try:
        import nncf
        import openvino as ov
    except ImportError as e:
        print(f"OpenVINO/NNCF not importable ({e}); their rows are left out")
        return {}
    core = ov.Core()
    try:
        model = ov.convert_model(str(graph_pb))
        model.reshape({p.get_any_name(): list(feeds[n].shape)
                       for p, n in zip(model.inputs, names)})
    except Exception as e:  # noqa: BLE001 (a benchmark row, not a failure of ours)
        print(f"OpenVINO could not convert the frozen graph: {type(e).__name__}: "
              f"{str(e)[:300]}")
        return {}
    inputs = [p.get_any_name() for p in model.inputs]
    runners = {}

    def position(name: str) -> int:  # the OpenVINO output that is TF's output `name`
        for k, port in enumerate(model.outputs):
            if name in port.get_names() or name.split(":")[0] in port.get_names():
                return k
        raise KeyError(f"OpenVINO has no output {name}")
    order = [position(o) for o in outputs]
    quantized = nncf.quantize(model, nncf.Dataset(calib, lambda s: [s[n] for n in names]),
                              subset_size=len(calib))
    for label, m in (("openvino f32", model), ("openvino int8 (nncf)", quantized)):
        compiled = core.compile_model(m, "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                 "INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        args = {inputs[k]: feeds[n] for k, n in enumerate(names)}

        def run(request=request, args=args) -> list[np.ndarray]:  # noqa: ANN001
            result = request.infer(args)
            return [result[request.model_outputs[k]] for k in order]
        runners[label] = run
    return runners


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--calibration", type=int, default=8, help="calibration batches")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--max-error", type=float)
    args = p.parse_args()

    import tensorflow as tf

    import neuronish.runtime as rt
    from models.cache import cached_frozen_graph
    from models.freeze import example_inputs
    from neuronish.runtime.executable import from_bytes

    frozen = cached_frozen_graph(args.model, args.batch_size)
    names = list(frozen.inputs)
    feeds = example_inputs(frozen, args.batch_size, seed=0)
    calib = [example_inputs(frozen, args.batch_size, seed=s)
             for s in range(1, args.calibration + 1)]
    runners: dict[str, Callable[[], list[np.ndarray]]] = {}
    notes = {}
    with tempfile.TemporaryDirectory(prefix="int8-bench-") as tmp:
        np.savez(Path(tmp) / "calib.npz", **{n: np.stack([c[n] for c in calib]) for n in names})
        flags = ["--quantize", "int8", "--calibration", str(Path(tmp) / "calib.npz")]
        if args.max_error is not None:
            flags += ["--max-error", str(args.max_error)]
        for label, extra in (("neuronish fp32", []), ("neuronish bf16", ["--auto-cast",
                                                                         "matmult"]),
                             ("neuronish int8", flags)):
            path, seconds = _compile(frozen, Path(tmp), label.split()[1], extra)
            exe = from_bytes(path.read_bytes())
            q = exe.stats.get("quantization")
            notes[label] = f"compile {seconds:.1f} s" + (
                f", {sum(r['precision'] == 'int8' for r in q['instructions'])}/"
                f"{len(q['instructions'])} instructions int8" if q else "")
            model = rt.load(path)

            def run_device(model=model) -> list[np.ndarray]:  # noqa: ANN001
                out = model.run(feeds)
                return [out[n] for n in frozen.outputs]
            runners[label] = run_device
        ov_runners = _openvino(Path(tmp) / "graph.pb", names, calib, feeds,
                               list(frozen.outputs))
    tf_fn = frozen.tf_function(static=True)
    tf_args = [tf.constant(feeds[n]) for n in names]
    runners = {"tensorflow fp32": lambda: [t.numpy() for t in tf_fn(*tf_args)], **runners}
    runners.update(ov_runners)
    want = runners["tensorflow fp32"]()
    errors = {}
    for label, run in runners.items():
        got = run()
        errors[label] = [float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30))
                         for g, w in zip(got, want)]
        for _ in range(2):
            run()
    times: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners.items())
    for r in range(args.rounds):
        for label, run in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            run()
            times[label].append(time.perf_counter() - start)
    base = statistics.median(times["tensorflow fp32"])
    print(f"{args.model} batch {args.batch_size}, {args.calibration} calibration batches, "
          f"{args.rounds} rounds (medians), CPU flags: {_flags()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'runner':<22}{'ms/call':>9}{'img/s':>9}{'vs TF':>8}  error vs TF fp32 (per output)")
    for label in runners:
        med = statistics.median(times[label])
        print(f"{label:<22}{med * 1e3:9.1f}{args.batch_size / med:9.1f}{base / med:7.2f}x  "
              + ", ".join(f"{e:.1e}" for e in errors[label]) + f"  {notes.get(label, '')}")
    return 0


def _flags() -> str:
    wanted = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
    from neuronish.cc.host import cpu_flags

    have = cpu_flags()
    return " ".join(f for f in wanted if f in have) if have else "?"


if __name__ == "__main__":
    sys.exit(main())
