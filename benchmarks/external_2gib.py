"""A model with more weights than a GraphDef can hold: compile, load, serve, compare.

    NEURONISH_COMPILE_CACHE=off .venv/bin/python benchmarks/external_2gib.py \
        [--gib 2.1] [--layers 3] [--max-num-compilers 1] [--cores 1] [--keep DIR]

Builds a SavedModel of `--layers` dense layers (float32, fixed seed) holding
`--gib` GiB of weights in total, with a Relu6 between layers kept on TensorFlow
(`no_fuse_ops=["Relu6"]`, `force_fuse_ops=["MatMul"]`) so each layer is its own subgraph
and its own `neuronish-cc` process (one GraphDef per compiler must stay under 2 GiB).
Then: computes TensorFlow's result; compiles it (the executables and subgraphs go to
assets/) and checks that saved_model.pb is small and the assets hold the weights; runs
the compiled model in a fresh process against TensorFlow's result; serves it with
neuronish-model-server and compares one gRPC Predict.

Every step is its own process, so no step holds another's memory; each prints the
peak RSS of its process tree (the compile's includes the `neuronish-cc` processes
running alongside it). Memory is what limits this on a small machine: the compile
peaks at about 0.8 GiB + 2x the weights (TensorFlow's freeze; 1.82 GiB for 0.5 GiB)
plus about 1.5x one layer per compiler running (`--max-num-compilers`, default 1 here;
its input is mapped, not copied), and a loaded copy of the model holds about
3x its weights on the host, so the run and the server get a device of `--cores`
cores (default 1: one copy of each layer; each more core can hold a duplicate).
Disk: the source SavedModel is deleted once the compile has frozen it (at its first
compiled subgraph), so the disk holds the weights at most twice at a time (the compiled
model's assets: executables and, for the fallback, subgraphs), not three times;
`NEURONISH_COMPILE_CACHE=off` keeps them out of the compile cache too. The work
directory is removed unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_BUILD = r"""
import json, sys, numpy as np, tensorflow as tf
path, gib, layers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
width = int((gib * 2**30 / 4 / layers) ** 0.5)
module = tf.Module()
rng = np.random.default_rng(0)
scale = np.float32(width ** -0.5)  # keeps activations ~N(0, 1) layer after layer
module.w = [tf.Variable(rng.standard_normal((width, width), np.float32) * scale)
            for _ in range(layers)]

@tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32, name="x")])
def serve(x):
    for w in module.w:
        x = tf.nn.relu6(tf.matmul(x, w))
    return {"y": x}

tf.saved_model.save(module, path, signatures={"serving_default": serve})
print(json.dumps({"width": width, "weight_bytes": width * width * 4 * layers}))
"""

_REFERENCE = r"""
import sys, numpy as np, tensorflow as tf
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
np.save(sys.argv[3], fn(x=tf.constant(np.load(sys.argv[2])))["y"].numpy())
"""

_COMPILE = r"""
import json, shutil, sys, time
import neuronish.saved_model

def drop_source(done, total, result):  # frozen by now: the weights are in memory
    shutil.rmtree(sys.argv[1], ignore_errors=True)

t = time.perf_counter()
report = neuronish.saved_model.compile(sys.argv[1], sys.argv[2], batch_size=1,
                                       no_fuse_ops=["Relu6"], force_fuse_ops=["MatMul"],
                                       max_num_compilers=int(sys.argv[3]),
                                       progress=drop_source)
print(json.dumps({"seconds": time.perf_counter() - t, "ops": len(report["NeuronOps"]),
                  "ratio": report["OnNeuronRatio"]}))
"""

_RUN = r"""
import json, sys, time, numpy as np, neuronish, tensorflow as tf
from neuronish.runtime import get_device
t = time.perf_counter()
m = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
x = tf.constant(np.load(sys.argv[2]))
y = m(x=x)["y"].numpy()  # the first call loads the executables onto the device
loaded = time.perf_counter() - t
t = time.perf_counter()
for _ in range(3):
    m(x=x)
np.save(sys.argv[3], y)
print(json.dumps({"load_and_first_call": loaded, "call": (time.perf_counter() - t) / 3,
                  "device_bytes": sum(c["used"] for c in get_device().memory_report().values())}))
"""

_GIB = 2**30


def _step(what: str, script: str, *args: str, env: dict | None = None) -> tuple[dict, float]:
    """Run `script` in a fresh Python; its last stdout line (JSON), and the peak RSS of
    its process tree (itself and the compilers it runs, sampled every 0.1 s)."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({time.perf_counter() - t:.0f} s):\n{stderr[-4000:]}")
    lines = stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines else {}), peak[0] / _GIB


def _tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and its descendants now. A child that has not exec'd yet
    (the same command line as its parent) shares its parent's pages: not counted."""
    total, stack = 0, [(pid, b"")]
    while stack:
        p, parent_cmdline = stack.pop()
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmdline = f.read()
            if cmdline == parent_cmdline:
                continue
            total += _status(p, "VmRSS:")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack.extend((int(c), cmdline) for c in f.read().split())
        except (OSError, ValueError):
            continue  # exited meanwhile
    return total


def _status(pid: int, field: str) -> int:
    """A /proc/PID/status memory field (VmRSS:, VmHWM:) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=2.1, help="weights in GiB (default 2.1)")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--max-num-compilers", type=int, default=1,
                   help="compilers at once (default 1: each holds ~4x its layer)")
    p.add_argument("--cores", type=int, default=1,
                   help="NEURONISH_NUM_CORES of the run and the server (default 1)")
    p.add_argument("--keep", help="work here instead of a temporary directory (kept)")
    args = p.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="neuronish-2gib-"))
    try:
        return _benchmark(root, args)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def _benchmark(root: Path, args: argparse.Namespace) -> int:
    root.mkdir(parents=True, exist_ok=True)
    src, out = root / "src", root / "compiled"

    t = time.perf_counter()
    built, peak = _step("build", _BUILD, str(src), str(args.gib), str(args.layers))
    width, weight_bytes = built["width"], built["weight_bytes"]
    print(f"built {args.layers} layers of {width}x{width}: {weight_bytes / _GIB:.2f} GiB of "
          f"weights in {time.perf_counter() - t:.1f} s (peak RSS {peak:.2f} GiB)", flush=True)

    x = np.random.default_rng(1).standard_normal((2, width)).astype(np.float32)
    np.save(root / "x.npy", x)
    t = time.perf_counter()
    _, peak = _step("TensorFlow", _REFERENCE, str(src), str(root / "x.npy"), str(root / "want.npy"))
    want = np.load(root / "want.npy")
    print(f"TensorFlow ran the original in {time.perf_counter() - t:.1f} s (peak RSS "
          f"{peak:.1f} GiB)", flush=True)

    compiled, peak = _step("compile", _COMPILE, str(src), str(out), str(args.max_num_compilers))
    pb = (out / "saved_model.pb").stat().st_size
    assets = sum(f.stat().st_size for f in (out / "assets").iterdir())
    print(f"compiled in {compiled['seconds']:.1f} s: {compiled['ops']} NeuronOps (OnNeuronRatio "
          f"{compiled['ratio']:.2f}), saved_model.pb {pb / 2**20:.2f} MiB, assets "
          f"{assets / _GIB:.2f} GiB (peak RSS {peak:.2f} GiB with {args.max_num_compilers} "
          "neuronish-cc at once)",
          flush=True)
    assert pb < 2**30 and assets >= weight_bytes

    device = {"NEURONISH_NUM_CORES": str(args.cores)}
    ran, peak = _step("run", _RUN, str(out), str(root / "x.npy"), str(root / "y.npy"), env=device)
    err = _rel_err(np.load(root / "y.npy"), want)
    print(f"ran the compiled model in a fresh process ({args.cores} core(s)): load + first call "
          f"{ran['load_and_first_call']:.1f} s, then {ran['call'] * 1e3:.0f} ms a call; "
          f"{ran['device_bytes'] / _GIB:.2f} GiB on the device, peak RSS {peak:.2f} GiB, "
          f"relative error vs TensorFlow {err:.2e}", flush=True)

    import tensorflow as tf

    from tests.serving.harness import predict_request, running_server

    base = root / "served"
    base.mkdir()
    os.rename(out, base / "1")  # the server's base_path/<version>/ layout
    t = time.perf_counter()
    with running_server(["--model_name=big", f"--model_base_path={base}"], root,
                        {"big": [1]}, env=device) as server:
        ready = time.perf_counter() - t
        response = server.predictions.Predict(predict_request("big", {"x": x}), timeout=600)
        peak = _status(server.proc.pid, "VmHWM:") / _GIB
    serr = _rel_err(tf.make_ndarray(response.outputs["y"]), want)
    print(f"served with neuronish-model-server: ready in {ready:.1f} s, gRPC Predict "
          f"answered in {time.perf_counter() - t - ready:.1f} s, server peak RSS {peak:.2f} GiB, "
          f"relative error vs TensorFlow {serr:.2e}")
    return 0 if max(err, serr) <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
