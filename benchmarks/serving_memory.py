"""Peak memory and time of one large gRPC Predict on the model server (issue 23).

Starts `neuronish-model-server` on a SavedModel computing y = 2x over a float32
vector, sends one Predict of `--elements` values (tensor_content), and reports the
server's resident-memory growth over its idle size (its VmRSS sampled every 10 ms
during the call) as a multiple of the tensor's bytes, and the call's seconds.

    .venv/bin/python benchmarks/serving_memory.py --elements 16777216
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_service_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's tests/ harness
from tests.serving.harness import predict_request, running_server


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


def _model(directory: Path) -> None:
    class Double(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x * 2.0}

    m = Double()
    tf.saved_model.save(m, str(directory / "1"), signatures={"serving_default": m.serve})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=1 << 24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="serving-memory-") as tmp:
        root = Path(tmp)
        _model(root / "double")
        x = np.random.default_rng(0).random(args.elements, dtype=np.float32)
        request = predict_request("double", {"x": x})
        with running_server(["--model_name=double", f"--model_base_path={root / 'double'}",
                             "--grpc_channel_arguments=grpc.max_receive_message_length="
                             f"{2**31 - 1}"], root, {"double": [1]}, rest=False) as server:
            pid = server.proc.pid
            time.sleep(1.0)
            idle = _rss(pid)
            peak, done = idle, threading.Event()

            def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, _rss(pid))
                    time.sleep(0.01)

            sampler = threading.Thread(target=sample)
            sampler.start()
            start = time.perf_counter()
            channel = grpc.insecure_channel(
                f"localhost:{server.grpc_port}",
                options=[("grpc.max_receive_message_length", 2**31 - 1),
                         ("grpc.max_send_message_length", 2**31 - 1)])
            try:
                response = prediction_service_pb2_grpc.PredictionServiceStub(
                    channel).Predict(request, timeout=600)
            finally:
                seconds = time.perf_counter() - start
                done.set()
                sampler.join()
                channel.close()
            y = tf.make_ndarray(response.outputs["y"])
            assert np.array_equal(y, x * 2)
        growth = peak - idle
        print(f"elements={args.elements} tensor={x.nbytes / 2**20:.0f} MiB  server idle "
              f"{idle / 2**20:.0f} MiB, peak growth {growth / 2**20:.0f} MiB "
              f"({growth / x.nbytes:.1f}x the tensor), {seconds:.1f} s")


if __name__ == "__main__":
    main()
