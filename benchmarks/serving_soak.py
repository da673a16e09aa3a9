"""neuronish-model-server under long load and hostile connections (not run in CI).

    python benchmarks/serving_soak.py soak [--seconds 180] [--clients 32]
    python benchmarks/serving_soak.py hostile [--idle 500] [--slow 300] [--requests 200]

soak: one real server serving the zoo's `mlp` from a base path; `--clients`
threads send gRPC Predict requests through the official stubs for `--seconds`.
A third of the way in, version 2 is published (copy + rename); two thirds in it
is removed again, so the server swaps 1 -> 2 -> 1 under load. The server's RSS
is sampled every 2 s from /proc; printed: requests, failed requests, requests/s,
RSS after warm-up / max / at the end, and the versions that answered.

hostile: good REST and gRPC requests, one at a time, first alone, then while
`--idle` connections sit idle and `--slow` slow-loris clients trickle one header
byte every 0.5 s (reconnecting when the server closes them). Printed: median, p99
and max latency of both phases and the difference.

Both start the server with its defaults plus what they say; one run, medians:
these machines are shared (2 CPUs for the whole team), quote them as such.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SERVER = Path(sys.executable).with_name("neuronish-model-server")
ROW = [0.5] * 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _publish(src: str, base: Path, version: int) -> None:
    staging = base / f".staging-{version}"
    shutil.copytree(src, staging)
    os.rename(staging, base / str(version))


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class _Server:
    def __init__(self, base: Path, workdir: Path, extra: list[str]):
        self.grpc_port, self.rest_port = _free_port(), _free_port()
        self.log = open(workdir / "server.log", "wb")
        self.proc = subprocess.Popen(
            [str(SERVER), f"--port={self.grpc_port}", f"--rest_api_port={self.rest_port}",
             "--model_name=mlp", f"--model_base_path={base}", *extra],
            stdout=self.log, stderr=subprocess.STDOUT,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: see {workdir / 'server.log'}")
            try:
                if self.rest("GET", "/v1/models/mlp")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError("server not ready")

    def rest(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.rest_port, timeout=30)
        try:
            conn.request(method, path, body=json.dumps(body) if body else None)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        finally:
            self.log.close()


def _predict_request():  # noqa: ANN202 (a PredictRequest; TF imported lazily)
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlp"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.full((1, 32), 0.5, np.float32)))
    return request


def soak(args: argparse.Namespace, src: str, workdir: Path) -> None:
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    base = workdir / "mlp"
    base.mkdir()
    _publish(src, base, 1)
    server = _Server(base, workdir, ["--file_system_poll_wait_seconds=1"])
    request = _predict_request()
    channels = [grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") for _ in range(4)]
    stop = threading.Event()
    done = [0] * args.clients
    failures: list[str] = []
    versions: Counter[int] = Counter()
    lock = threading.Lock()

    def client(k: int) -> None:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channels[k % len(channels)])
        seen: Counter[int] = Counter()
        while not stop.is_set():
            try:
                response = stub.Predict(request, timeout=30)
                seen[response.model_spec.version.value] += 1
                done[k] += 1
            except grpc.RpcError as e:
                with lock:
                    failures.append(f"{e.code()}: {e.details()}")
        with lock:
            versions.update(seen)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(10)  # warm-up: first calls trace the function
    start, rss = time.monotonic(), [_rss_bytes(server.proc.pid)]
    warm_count = sum(done)
    swapped_in = swapped_out = False
    while (elapsed := time.monotonic() - start) < args.seconds:
        if not swapped_in and elapsed > args.seconds / 3:
            _publish(src, base, 2)
            swapped_in = True
        if not swapped_out and elapsed > 2 * args.seconds / 3:
            shutil.rmtree(base / "2")
            swapped_out = True
        time.sleep(2)
        rss.append(_rss_bytes(server.proc.pid))
    stop.set()
    for t in threads:
        t.join()
    total = sum(done) - warm_count
    status = server.stop()
    mib = [r / 2**20 for r in rss]
    print(f"soak: {args.clients} gRPC clients, {args.seconds:.0f} s (after 10 s warm-up), "
          f"version 2 added at {args.seconds / 3:.0f} s and removed at "
          f"{2 * args.seconds / 3:.0f} s")
    print(f"  requests: {total} ({total / args.seconds:.0f}/s), failed: {len(failures)}")
    if failures:
        print("  first failures: " + "; ".join(failures[:5]))
    print(f"  versions that answered (whole run): {dict(sorted(versions.items()))}")
    print(f"  server RSS: {mib[0]:.0f} MiB after warm-up, max {max(mib):.0f} MiB, "
          f"{mib[-1]:.0f} MiB at the end ({len(mib)} samples)")
    print(f"  server exit status on SIGTERM: {status}")


def _latencies(server: _Server, n: int) -> tuple[list[float], list[float]]:
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    request = _predict_request()
    rest, grpc_times = [], []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for _ in range(n):
            t = time.perf_counter()
            status, _ = server.rest("POST", "/v1/models/mlp:predict", {"instances": [ROW]})
            rest.append(time.perf_counter() - t)
            assert status == 200
            t = time.perf_counter()
            stub.Predict(request, timeout=30)
            grpc_times.append(time.perf_counter() - t)
    return rest, grpc_times


def _summary(name: str, alone: list[float], attacked: list[float]) -> str:
    def p99(xs: list[float]) -> float:
        return float(np.percentile(xs, 99))

    ms = 1e3
    return (f"  {name}: alone median {statistics.median(alone) * ms:.1f} ms, p99 "
            f"{p99(alone) * ms:.1f}, max {max(alone) * ms:.1f}; under attack median "
            f"{statistics.median(attacked) * ms:.1f} ms, p99 {p99(attacked) * ms:.1f}, max "
            f"{max(attacked) * ms:.1f}; max delay over the alone median "
            f"{(max(attacked) - statistics.median(alone)) * ms:.1f} ms")


def hostile(args: argparse.Namespace, src: str, workdir: Path) -> None:
    base = workdir / "mlp"
    base.mkdir()
    _publish(src, base, 1)
    server = _Server(base, workdir, [])
    _latencies(server, 20)  # warm-up
    alone_rest, alone_grpc = _latencies(server, args.requests)
    stop = threading.Event()
    idle = [socket.create_connection(("127.0.0.1", server.rest_port)) for _ in range(args.idle)]
    prefix = b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nX-Slow: "

    def loris() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", server.rest_port)) as s:
                    s.sendall(prefix)
                    while not stop.is_set():
                        s.sendall(b"a")
                        stop.wait(0.5)
            except OSError:
                continue

    lorises = [threading.Thread(target=loris, daemon=True) for _ in range(args.slow)]
    for t in lorises:
        t.start()
    time.sleep(1)
    attacked_rest, attacked_grpc = _latencies(server, args.requests)
    stop.set()
    for s in idle:
        s.close()
    server.stop()
    print(f"hostile: {args.requests} good requests one at a time, alone then with {args.idle} "
          f"idle connections and {args.slow} slow-loris clients")
    print(_summary("REST", alone_rest, attacked_rest))
    print(_summary("gRPC", alone_grpc, attacked_grpc))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("soak")
    s.add_argument("--seconds", type=float, default=180)
    s.add_argument("--clients", type=int, default=32)
    h = sub.add_parser("hostile")
    h.add_argument("--idle", type=int, default=500)
    h.add_argument("--slow", type=int, default=300)
    h.add_argument("--requests", type=int, default=200)
    args = p.parse_args()
    from models.cache import cached_saved_model

    src = cached_saved_model("mlp")
    with tempfile.TemporaryDirectory(prefix="neuronish-soak-") as tmp:
        (soak if args.mode == "soak" else hostile)(args, src, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
