"""Per-call latency of a compiled model served from TensorFlow's C API, against TensorFlow
running the original model, both in one tf_saved_model.c process, alternating.

    .venv/bin/python examples/c/latency.py [--calls 3000] [--runs 3] [--width 16]

Builds a WIDTHxWIDTH MatMul + Relu SavedModel, compiles it at batch 1 with the real
compiler, builds tf_saved_model.c with gcc, and runs it `--runs` times at batch 1 with
`-n CALLS -B original`: each run prints both medians (microseconds per call). Prints the
load average before and after. Scratch files go to a temporary directory, removed after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import neuronish.saved_model
from neuronish import native_op_library

HERE = Path(__file__).resolve().parent


class _MatMulRelu(tf.Module):
    def __init__(self, width: int) -> None:
        rng = np.random.default_rng(0)
        self.w = tf.Variable(rng.standard_normal((width, width)).astype(np.float32))
        self.__call__ = tf.function(
            lambda x: {"y": tf.nn.relu(tf.matmul(x, self.w))},
            input_signature=[tf.TensorSpec([None, width], tf.float32, name="x")])


def _names(model_dir: Path) -> tuple[str, str]:
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    sig = sm.meta_graphs[0].signature_def["serving_default"]
    [x] = sig.inputs.values()
    [y] = sig.outputs.values()
    return x.name, y.name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--width", type=int, default=16)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="neuronish-c-latency-") as tmp:
        src, out, program = Path(tmp, "src"), Path(tmp, "compiled"), Path(tmp, "tf_saved_model")
        module = _MatMulRelu(args.width)
        tf.saved_model.save(module, str(src), signatures=module.__call__)
        neuronish.saved_model.compile(str(src), str(out), batch_size=1, minimum_segment_size=1)
        tf_lib = tf.sysconfig.get_lib()
        subprocess.run(["gcc", "-std=c99", "-O2", f"-I{tf.sysconfig.get_include()}",
                        str(HERE / "tf_saved_model.c"), "-o", str(program), f"-L{tf_lib}",
                        "-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2",
                        f"-Wl,-rpath,{tf_lib}"], check=True)
        x, y = _names(out)
        _, y_src = _names(src)
        env = {**os.environ, "OMP_WAIT_POLICY": "passive", "TF_CPP_MIN_LOG_LEVEL": "2",
               "NEURONISH_FALLBACK": "0"}
        print("load average before:", os.getloadavg())
        for _ in range(args.runs):
            r = subprocess.run([str(program), "-l", str(native_op_library.build()), "-n",
                                str(args.calls), "-B", str(src), str(out),
                                f"{x}=float32:1,{args.width}", "--", y, "--", y_src],
                               check=True, capture_output=True, text=True, env=env)
            medians = [line.split() for line in r.stdout.splitlines()
                       if line.startswith("median_us")]
            print("  ".join(f"{'compiled' if m[1] == str(out) else 'tensorflow'} {m[2]} us"
                            for m in medians))
        print("load average after:", os.getloadavg())


if __name__ == "__main__":
    main()
