"""A model with more weights than a GraphDef can hold: compile, load, serve, compare.

    .venv/bin/python benchmarks/external_2gib.py [--gib 2.25] [--layers 3] [--keep DIR]

Builds a SavedModel of `--layers` dense layers (float32, fixed seed) holding
`--gib` GiB of weights in total, with a Relu6 between layers kept on TensorFlow
(`no_fuse_ops=["Relu6"]`, `force_fuse_ops=["MatMul"]`) so each layer is its own subgraph and its own
`neuronish-cc` process (one GraphDef per compiler must stay under 2 GiB). Then:
compiles it (the executables and subgraphs go to assets/), checks that
saved_model.pb is small and the assets hold the weights, runs the compiled model
in a fresh process against TensorFlow's result, and serves it with
neuronish-model-server, comparing one gRPC Predict. Prints each step's time and
peak memory; memory: about 4x the weights at the peak (freeze, compile, save).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_RUN = r"""
import json, sys, numpy as np, neuronish, tensorflow as tf
from neuronish.runtime import get_device
m = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
y = m(x=tf.constant(np.load(sys.argv[2])))["y"].numpy()
np.save(sys.argv[3], y)
print(json.dumps({"device_bytes": sum(c["used"] for c in get_device().memory_report().values())}))
"""


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def build(path: Path, gib: float, layers: int) -> tuple[int, int]:
    import tensorflow as tf

    width = int((gib * 2**30 / 4 / layers) ** 0.5)
    module = tf.Module()
    rng = np.random.default_rng(0)
    scale = np.float32(width ** -0.5)  # keeps activations ~N(0, 1) layer after layer
    module.w = [tf.Variable(rng.standard_normal((width, width), np.float32) * scale)
                for _ in range(layers)]

    @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32, name="x")])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        for w in module.w:
            x = tf.nn.relu6(tf.matmul(x, w))
        return {"y": x}

    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return width, width * width * 4 * layers


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=2.25, help="weights in GiB (default 2.25)")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--keep", help="work here instead of a temporary directory")
    args = p.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="neuronish-2gib-"))
    root.mkdir(parents=True, exist_ok=True)
    src, out = root / "src", root / "compiled"

    t = time.perf_counter()
    width, weight_bytes = build(src, args.gib, args.layers)
    print(f"built {args.layers} layers of {width}x{width}: {weight_bytes / 2**30:.2f} GiB of "
          f"weights in {time.perf_counter() - t:.1f} s (peak RSS {_peak_gib():.1f} GiB)",
          flush=True)

    import neuronish.saved_model

    t = time.perf_counter()
    report = neuronish.saved_model.compile(str(src), str(out), batch_size=1,
                                           no_fuse_ops=["Relu6"], force_fuse_ops=["MatMul"])
    pb = (out / "saved_model.pb").stat().st_size
    assets = sum(f.stat().st_size for f in (out / "assets").iterdir())
    print(f"compiled in {time.perf_counter() - t:.1f} s: {len(report['NeuronOps'])} NeuronOps, "
          f"saved_model.pb {pb / 2**20:.1f} MiB, assets {assets / 2**30:.2f} GiB "
          f"(peak RSS {_peak_gib():.1f} GiB)", flush=True)
    assert pb < 2**30 and assets >= weight_bytes

    import tensorflow as tf

    x = np.random.default_rng(1).standard_normal((2, width)).astype(np.float32)
    np.save(root / "x.npy", x)
    want = tf.saved_model.load(str(src)).signatures["serving_default"](x=tf.constant(x))["y"]
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _RUN, str(out), str(root / "x.npy"),
                        str(root / "y.npy")], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr[-3000:])
        return 1
    info = json.loads(r.stdout.strip().splitlines()[-1])
    got = np.load(root / "y.npy")
    err = float(np.max(np.abs(got - want.numpy())) / max(np.max(np.abs(want.numpy())), 1e-30))
    print(f"ran the compiled model in a fresh process in {time.perf_counter() - t:.1f} s: "
          f"{info['device_bytes'] / 2**30:.2f} GiB on the device, relative error vs "
          f"TensorFlow {err:.2e}", flush=True)

    from tests.serving.harness import predict_request, running_server

    base = root / "served"
    base.mkdir()
    os.rename(out, base / "1")  # the server's base_path/<version>/ layout
    t = time.perf_counter()
    with running_server(["--model_name=big", f"--model_base_path={base}"], root,
                        {"big": [1]}) as server:
        response = server.predictions.Predict(predict_request("big", {"x": x}), timeout=600)
    served = tf.make_ndarray(response.outputs["y"])
    serr = float(np.max(np.abs(served - want.numpy())) / max(np.max(np.abs(want.numpy())),
                                                               1e-30))
    print(f"served with neuronish-model-server (gRPC Predict) in {time.perf_counter() - t:.1f} "
          f"s: relative error vs TensorFlow {serr:.2e}")
    return 0 if max(err, serr) <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
