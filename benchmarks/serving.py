"""neuronish-model-server over gRPC: requests/s and p50/p99 latency, batching off vs on,
TF Serving's protocol vs the Open Inference Protocol (KServe v2).

    python benchmarks/serving.py [--clients 64] [--seconds 5] [--windows 3] [--rows 1]
                                 [--models mlp,mlp_neuron] [--client-processes 2]
                                 [--protocols tfs,v2]

For each model (the zoo's `mlp`, and `mlp_neuron`: the same model compiled for
the device with batch size 4) and each mode (batching off, then on with the
parameters printed below), one real server process is started; N concurrent
clients (threads spread over a few client processes, so the client side is not
one GIL) send Predict requests of `--rows` rows through the official stubs for
`--windows` windows of `--seconds` each, after a warm-up. Each window gives
requests/s and the p50/p99 of its latencies; the medians over the windows are
reported. `tfs` clients call PredictionService/Predict with TF Serving's stubs; `v2`
clients call inference.GRPCInferenceService/ModelInfer with tritonclient (raw tensor
bytes), the same model, input and server. One run: these machines are shared, so
quote medians, not best cases.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BATCHING = {"max_batch_size": 32, "batch_timeout_micros": 1000, "num_batch_threads": 2,
            "max_enqueued_batches": 1000, "allowed_batch_sizes": [4, 8, 16, 32]}


def _batching_text() -> str:
    lines = [f"{k} {{ value: {v} }}" for k, v in BATCHING.items() if k != "allowed_batch_sizes"]
    lines += [f"allowed_batch_sizes: {b}" for b in BATCHING["allowed_batch_sizes"]]
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _v2_call(port: int, model: str, x: np.ndarray):  # noqa: ANN202 (a closure)
    """One tritonclient gRPC client and its request; errors raise as grpc.RpcError does."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return lambda: client.infer(model, [inp], client_timeout=60)


def _client_process(port: int, model: str, threads: int, rows: int,
                    ready: multiprocessing.Queue, schedule: multiprocessing.Queue,
                    out: multiprocessing.Queue, protocol: str = "tfs") -> None:
    """Run `threads` clients until the last window ends; report latencies per window.
    The schedule comes once every client process is ready (imports take seconds)."""
    import grpc

    x = np.random.default_rng(0).standard_normal((rows, 32)).astype(np.float32)
    if protocol == "v2":
        from tritonclient.utils import InferenceServerException

        calls = [_v2_call(port, model, x) for _ in range(threads)]
        failures: tuple[type[Exception], ...] = (InferenceServerException, grpc.RpcError)
    else:
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _ in range(4)]
        for channel in channels:
            grpc.channel_ready_future(channel).result(timeout=60)
        stubs = [prediction_service_pb2_grpc.PredictionServiceStub(channels[k % 4])
                 for k in range(threads)]
        calls = [lambda stub=stub: stub.Predict(request, timeout=60) for stub in stubs]
        failures = (grpc.RpcError,)
    ready.put(True)
    start_at, windows = schedule.get()
    per_window: list[list[float]] = [[] for _ in windows]
    errors = [0]
    lock = threading.Lock()
    end = windows[-1][1]

    def client(k: int) -> None:
        call = calls[k]
        mine: list[list[float]] = [[] for _ in windows]
        while time.time() < start_at:
            time.sleep(0.001)
        while (now := time.time()) < end:
            try:
                call()
            except failures:
                with lock:
                    errors[0] += 1
                continue
            done = time.time()
            for w, (lo, hi) in enumerate(windows):
                if lo <= now and done <= hi:
                    mine[w].append(done - now)
        with lock:
            for w in range(len(windows)):
                per_window[w].extend(mine[w])

    workers = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put((per_window, errors[0]))


def _serve(model_dirs: dict[str, str], batching: bool, workdir: Path) -> tuple[subprocess.Popen,
                                                                                int]:
    port = _free_port()
    config = workdir / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{n}" base_path: "{p}" model_platform: "tensorflow" }}\n'
        for n, p in model_dirs.items()) + "}\n")
    args = [str(Path(sys.executable).with_name("neuronish-model-server")), f"--port={port}",
            f"--model_config_file={config}"]
    if batching:
        (workdir / "batching.config").write_text(_batching_text())
        args += ["--enable_batching", f"--batching_parameters_file={workdir / 'batching.config'}"]
    log = open(workdir / f"server-{port}.log", "wb")  # noqa: SIM115 (lives with the process)
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    _wait_ready(port, list(model_dirs), proc)
    return proc, port


def _wait_ready(port: int, models: list[str], proc: subprocess.Popen) -> None:
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    stub = model_service_pb2_grpc.ModelServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    deadline = time.time() + 120
    pending = set(models)
    while pending and time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the server exited; see its log")
        for model in list(pending):
            request = get_model_status_pb2.GetModelStatusRequest()
            request.model_spec.name = model
            try:
                states = stub.GetModelStatus(request, timeout=5).model_version_status
            except grpc.RpcError:
                continue
            if any(s.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE for s in states):
                pending.discard(model)
        time.sleep(0.2)
    if pending:
        raise TimeoutError(f"models not ready: {pending}")


class ClientFailed(RuntimeError):
    """A client process died or went silent; the measurement is void."""


def _collect(q: multiprocessing.Queue, procs: list, timeout_s: float, what: str) -> list:
    """One item per client process from `q`. Raises ClientFailed, instead of
    waiting forever, once a process has died without sending its item or
    `timeout_s` has passed."""
    items: list = []
    deadline = time.monotonic() + timeout_s
    while len(items) < len(procs):
        try:
            items.append(q.get(timeout=1))
            continue
        except queue.Empty:
            pass
        # A process that sent its item may have exited 0; any other exit is a failure.
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise ClientFailed(f"client process(es) died before sending their {what}: " +
                               ", ".join(f"pid {p.pid} exit code {p.exitcode}" for p in dead))
        if time.monotonic() > deadline:
            raise ClientFailed(f"{len(procs) - len(items)} client process(es) sent no {what} "
                               f"within {timeout_s:.0f} s")
    return items


def _measure(port: int, model: str, args: argparse.Namespace, protocol: str = "tfs") -> dict:
    ctx = multiprocessing.get_context("spawn")
    ready, schedule, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    k = args.client_processes
    counts = [args.clients // k + (i < args.clients % k) for i in range(k)]
    procs = [ctx.Process(target=_client_process,
                         args=(port, model, n, args.rows, ready, schedule, out, protocol))
             for n in counts if n]
    for p in procs:
        p.start()
    try:
        _collect(ready, procs, 120, "ready signal")
        start_at = time.time() + 0.2
        warm_end = start_at + args.warmup
        windows = [(warm_end + i * args.seconds, warm_end + (i + 1) * args.seconds)
                   for i in range(args.windows)]
        for _ in procs:
            schedule.put((start_at, windows))
        # Clients stop at the last window's end; a request still running then
        # may take up to its own 60 s timeout.
        run_s = 0.2 + args.warmup + args.windows * args.seconds
        results = _collect(out, procs, run_s + 60 + 30, "latencies")
    except ClientFailed:
        for p in procs:
            if p.is_alive():
                p.terminate()
        raise
    finally:
        for p in procs:
            p.join(10)
    rps, p50, p99 = [], [], []
    for w in range(args.windows):
        latencies = np.array([lat for per_window, _ in results for lat in per_window[w]])
        rps.append(len(latencies) / args.seconds)
        p50.append(float(np.percentile(latencies, 50)) * 1e3 if len(latencies) else float("nan"))
        p99.append(float(np.percentile(latencies, 99)) * 1e3 if len(latencies) else float("nan"))
    return {"rps": statistics.median(rps), "p50_ms": statistics.median(p50),
            "p99_ms": statistics.median(p99), "errors": sum(e for _, e in results),
            "windows_rps": rps}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--client-processes", type=int, default=2)
    p.add_argument("--seconds", type=float, default=5.0, help="length of one window")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--rows", type=int, default=1, help="rows per request")
    p.add_argument("--models", default="mlp,mlp_neuron")
    p.add_argument("--protocols", default="tfs,v2",
                   help="tfs: TF Serving's Predict; v2: the Open Inference Protocol's "
                        "ModelInfer (tritonclient)")
    args = p.parse_args()
    protocols = args.protocols.split(",")
    if set(protocols) - {"tfs", "v2"}:
        raise SystemExit(f"unknown protocol in {args.protocols!r} (tfs, v2)")

    from models.cache import cached_saved_model

    plain = cached_saved_model("mlp")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dirs = {}
        for name in args.models.split(","):
            base = work / name
            base.mkdir()
            if name == "mlp":
                shutil.copytree(plain, base / "1")
            elif name == "mlp_neuron":
                import neuronish

                neuronish.saved_model.compile(plain, str(base / "1"), batch_size=4)
            else:
                raise SystemExit(f"unknown model {name!r} (mlp, mlp_neuron)")
            model_dirs[name] = str(base)
        print(f"{args.clients} gRPC clients in {args.client_processes} processes, "
              f"{args.rows} row(s)/request, {args.windows} windows x {args.seconds:g}s, "
              f"{os.cpu_count()} CPUs")
        print(f"batching on: {BATCHING}")
        print(f"{'model':<12} {'batching':<9} {'protocol':<9} {'req/s':>8} {'p50 ms':>8} "
              f"{'p99 ms':>8} {'errors':>6}  req/s per window")
        for batching in (False, True):
            proc, port = _serve(model_dirs, batching, work)
            try:
                for name in model_dirs:
                    for protocol in protocols:
                        try:
                            r = _measure(port, name, args, protocol)
                        except ClientFailed as e:
                            print(f"benchmarks/serving.py: {name}, batching "
                                  f"{'on' if batching else 'off'}, {protocol}: {e}",
                                  file=sys.stderr)
                            return 1
                        print(f"{name:<12} {'on' if batching else 'off':<9} {protocol:<9} "
                              f"{r['rps']:>8.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                              f"{r['errors']:>6}  "
                              + " ".join(f"{x:.0f}" for x in r["windows_rps"]), flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
