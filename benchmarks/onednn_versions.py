"""Does another oneDNN pay? The native engine on the pinned oneDNN 3.2 against one built
on another oneDNN install, processes alternating, same model and executable.

    python -m venv /tmp/dnn && /tmp/dnn/bin/pip install onednn==2026.1.0 onednn-devel==2026.1.0
    python benchmarks/onednn_versions.py /tmp/dnn --model ResNet50 --batch-size 8 \
        [--compiler-args "--auto-cast matmult --auto-cast-type bf16"] [--repeats 2]

Two shared libraries called libdnnl.so.3 cannot live in one process, so each side runs
in its own process (NEURONISH_ONEDNN_ROOT and NEURONISH_ENGINE_CACHE pick the build;
the 2026.x wheels' CPU runtime is SYCL over the OpenCL CPU device, found through
OCL_ICD_FILENAMES). A process compiles nothing: it loads the executable this script
compiled once, and reports the seconds from start to its first answer (engine library,
oneDNN start-up, primitive creation, weight reorders) and then the median of
`--rounds` calls against TensorFlow's on the same frozen graph in that process, so the
throughput is a ratio that machine load hits on both sides alike. The sides alternate
`--repeats` times.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def child(exe: str, model: str, batch: int, rounds: int) -> dict:
    start = time.perf_counter()
    import neuronish.runtime as rt
    from models.cache import cached_frozen_graph
    from models.freeze import example_inputs

    frozen = cached_frozen_graph(model, batch)
    feeds = example_inputs(frozen, batch, seed=0)
    load_start = time.perf_counter()
    device = rt.load(exe)
    device.run(feeds)
    first_s = time.perf_counter() - load_start
    import tensorflow as tf

    fn = frozen.tf_function(static=True)
    args = [tf.constant(feeds[n]) for n in frozen.inputs]
    fn(*args)
    times: dict[str, list[float]] = {"tf": [], "device": []}
    for r in range(rounds):
        pair = [("tf", lambda: fn(*args)), ("device", lambda: device.run(feeds))]
        for name, call in pair if r % 2 == 0 else pair[::-1]:
            t = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t)
    device.unload()
    return {"first_answer_s": first_s, "process_to_first_s": time.perf_counter() - start,
            "device_ms": statistics.median(times["device"]) * 1000,
            "tf_ms": statistics.median(times["tf"]) * 1000}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("other_root", help="prefix holding lib/libdnnl.so.3 and include/oneapi")
    p.add_argument("--model", default="ResNet50")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--compiler-args", default="")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.model, args.batch_size, args.rounds)))
        return 0

    from models.cache import cached_frozen_graph

    frozen = cached_frozen_graph(args.model, args.batch_size)
    root = Path(args.other_root)
    sides = {"3.2 (pinned)": {}, str(root): {
        "NEURONISH_ONEDNN_ROOT": str(root),
        "NEURONISH_ENGINE_CACHE": str(root / "neuronish-engine-cache"),
        "LD_LIBRARY_PATH": str(root / "lib"),
        "OCL_ICD_FILENAMES": str(root / "lib" / "libintelocl.so")}}
    results: dict[str, list[dict]] = {k: [] for k in sides}
    with tempfile.TemporaryDirectory() as tmp:
        pb, exe = Path(tmp) / "graph.pb", Path(tmp) / "model.neff"
        pb.write_bytes(frozen.graph_def)
        subprocess.run([str(Path(sys.executable).parent / "neuronish-cc"), "compile", str(pb),
                        "--framework", "TENSORFLOW", "--io-config",
                        json.dumps(frozen.io_config()), "--output", str(exe),
                        *args.compiler_args.split()], check=True)
        for _ in range(args.repeats):
            for side, env in sides.items():
                out = subprocess.run(
                    [sys.executable, __file__, args.other_root, "--model", args.model,
                     "--batch-size", str(args.batch_size), "--rounds", str(args.rounds),
                     "--child", str(exe)], env={**os.environ, **env}, check=True,
                    capture_output=True, text=True).stdout
                results[side].append(json.loads(out.strip().splitlines()[-1]))
                print(side, results[side][-1], flush=True)
    print(f"{args.model} batch {args.batch_size} {args.compiler_args or 'fp32'}: "
          "medians over repeats")
    for side, runs in results.items():
        ratio = statistics.median(r["tf_ms"] / r["device_ms"] for r in runs)
        print(f"  {side:<28} device {statistics.median(r['device_ms'] for r in runs):8.1f} ms"
              f"  vs TF {ratio:.2f}x  first answer "
              f"{statistics.median(r['first_answer_s'] for r in runs):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
