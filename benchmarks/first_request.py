"""The first request after start-up against the tenth, for a compiled model served by
neuronish-model-server: with start-up loading (the default) and without it
(`--enable_model_warmup=false`: the NeuronOps load on the first request).

    python benchmarks/first_request.py [--model resnet50] [--batch-size 1] [--requests 10]

The model (a zoo model, random weights) is compiled once; for each mode one server is
started, and once it reports the version AVAILABLE, `--requests` Predict calls of
one batch each are sent one after another over gRPC and timed at the client.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timings(base: Path, name: str, warmup: bool, requests: int, batch: int) -> list[float]:
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import (
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    port = _free_port()
    server = str(Path(sys.executable).with_name("neuronish-model-server"))
    log = open(base.parent / f"server-{port}.log", "wb")  # noqa: SIM115 (lives with the process)
    proc = subprocess.Popen([server, f"--port={port}", f"--model_name={name}",
                             f"--model_base_path={base}",
                             f"--enable_model_warmup={str(warmup).lower()}"],
                            stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        status = model_service_pb2_grpc.ModelServiceStub(channel)
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        started = time.monotonic()
        while True:
            if proc.poll() is not None or time.monotonic() - started > 600:
                raise RuntimeError(f"the server did not serve {name}; see its log")
            try:
                states = status.GetModelStatus(request, timeout=5).model_version_status
                if any(s.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
                       for s in states):
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        fn = tf.saved_model.load(str(base / "1")).signatures["serving_default"]
        predict = predict_pb2.PredictRequest()
        predict.model_spec.name = name
        rng = np.random.default_rng(0)
        for key, spec in fn.structured_input_signature[1].items():
            shape = [batch, *spec.shape[1:]]
            predict.inputs[key].CopyFrom(tf.make_tensor_proto(
                rng.standard_normal(shape).astype(spec.dtype.as_numpy_dtype)))
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        seconds = []
        for _ in range(requests):
            start = time.perf_counter()
            stub.Predict(predict, timeout=600)
            seconds.append(time.perf_counter() - start)
        return seconds
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--requests", type=int, default=10)
    args = p.parse_args()

    import neuronish
    from models.cache import cached_saved_model

    with tempfile.TemporaryDirectory(prefix="neuronish-first-") as tmp:
        base = Path(tmp) / "models" / f"{args.model}_neuron"
        base.mkdir(parents=True)
        start = time.perf_counter()
        neuronish.saved_model.compile(cached_saved_model(args.model), str(base / "1"),
                                      batch_size=args.batch_size)
        print(f"{args.model} compiled at batch {args.batch_size} in "
              f"{time.perf_counter() - start:.1f} s; {os.cpu_count()} CPUs")
        for warmup in (True, False):
            s = _timings(base, f"{args.model}_neuron", warmup, args.requests, args.batch_size)
            mode = "start-up load (default)" if warmup else "--enable_model_warmup=false"
            last = s[min(9, len(s) - 1)]
            rest = float(np.median(s[1:])) if len(s) > 1 else s[0]
            print(f"{mode:<28} first {s[0] * 1e3:8.1f} ms  tenth {last * 1e3:8.1f} ms  "
                  f"median of the others {rest * 1e3:8.1f} ms  first/tenth "
                  f"{s[0] / last:5.2f}  all: " + " ".join(f"{x * 1e3:.1f}" for x in s),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
