"""`neuronish-model-server`: TF Serving's command line, protocols and behaviour, and the
Open Inference Protocol (KServe v2: v2.py) on the same gRPC and REST ports.

    neuronish-model-server --port=8500 --rest_api_port=8501 \\
        --model_name=resnet --model_base_path=/models/resnet
    neuronish-model-server --model_config_file=models.config --enable_batching \\
        --batching_parameters_file=batching.config

Flags are TF Serving's, with its defaults and its `--flag=value` syntax (a
bool flag may also be given bare, `--enable_batching`). A few flags of TF
Serving's that concern its C++ runtime (GPU memory, SSL, platform configs) are
refused rather than silently ignored, so a deployment never believes it got
something it did not.

SIGTERM (or SIGINT): stop accepting on both ports, let the requests in flight
finish (up to --shutdown_grace_period_seconds), unload, exit 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NoReturn

log = logging.getLogger("neuronish.serving")


@dataclass
class Options:
    port: int = 8500
    grpc_socket_path: str = ""
    grpc_channel_arguments: str = ""
    grpc_max_threads: int = 256
    rest_api_port: int = 0
    rest_api_num_threads: int = 4 * (os.cpu_count() or 1)
    rest_api_timeout_in_ms: int = 30000
    rest_api_max_body_bytes: int = 64 << 20
    rest_api_enable_cors_support: bool = False
    model_name: str = "default"
    model_base_path: str = ""
    model_config_file: str = ""
    model_config_file_poll_wait_seconds: int = 0
    file_system_poll_wait_seconds: int = 1
    saved_model_tags: str = "serve"
    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60_000_000
    allow_version_labels_for_unavailable_models: bool = False
    enable_model_warmup: bool = True
    enable_signature_method_name_check: bool = False
    enable_batching: bool = False
    batching_parameters_file: str = ""
    monitoring_config_file: str = ""
    tensorflow_intra_op_parallelism: int = 0
    tensorflow_inter_op_parallelism: int = 0
    tensorflow_session_parallelism: int = 0
    shutdown_grace_period_seconds: int = 30
    request_timeout_in_ms: int = 0
    request_max_elements: int = 1 << 27
    request_memory_budget_bytes: int = 8 << 30
    rest_api_idle_timeout_in_ms: int = 30000
    rest_api_max_connections: int = 1024
    allow_reload_config_request: bool = False
    reload_config_allowed_roots: str = ""
    ssl_config_file: str = ""
    version: bool = False
    help: bool = False


HELP = {
    "port": "TCP port for gRPC (TF Serving: required unless --grpc_socket_path)",
    "grpc_socket_path": "also serve gRPC on this UNIX socket",
    "grpc_channel_arguments": "comma-separated gRPC server arguments, e.g. "
                              "grpc.max_receive_message_length=1048576",
    "grpc_max_threads": "threads serving gRPC calls (requests waiting for a batch hold one)",
    "rest_api_port": "TCP port for HTTP/REST; 0 (default) = no REST API",
    "rest_api_num_threads": "REST requests processed at once",
    "rest_api_timeout_in_ms": "REST request deadline; <= 0 = none",
    "rest_api_max_body_bytes": "largest REST request body accepted (413 above it)",
    "rest_api_enable_cors_support": "CORS: Access-Control-Allow-Origin: * on REST answers, "
                                    "OPTIONS preflights answered",
    "model_name": "model name (ignored with --model_config_file)",
    "model_base_path": "directory whose numeric subdirectories are the model's versions",
    "model_config_file": "text ModelServerConfig with several models, policies, labels",
    "model_config_file_poll_wait_seconds": "re-read --model_config_file this often; 0 = never",
    "file_system_poll_wait_seconds": "look for new versions this often; 0 = only at start",
    "saved_model_tags": "comma-separated tag set of the MetaGraph to load",
    "max_num_load_retries": "retries of a failed version load",
    "load_retry_interval_micros": "wait between load retries",
    "allow_version_labels_for_unavailable_models": "allow labels on versions not loaded yet",
    "enable_model_warmup": "replay assets.extra/tf_serving_warmup_requests before serving",
    "enable_signature_method_name_check": "Predict/Classify/Regress only run signatures whose "
                                          "method_name fits the API",
    "enable_batching": "merge concurrent requests into batches",
    "batching_parameters_file": "text BatchingParameters (with --enable_batching)",
    "monitoring_config_file": "text MonitoringConfig; Prometheus metrics on the REST port",
    "tensorflow_intra_op_parallelism": "TensorFlow intra-op threads; 0 = auto",
    "tensorflow_inter_op_parallelism": "TensorFlow inter-op threads; 0 = auto",
    "tensorflow_session_parallelism": "both of the above, if they are 0",
    "shutdown_grace_period_seconds": "on SIGTERM, how long in-flight requests may take",
    "request_timeout_in_ms": "server-side deadline of every gRPC/REST request (the earlier of "
                             "it and the client's); a call past it is abandoned and answered "
                             "DEADLINE_EXCEEDED; 0 = the client's deadline only",
    "request_max_elements": "most tensor elements one request may declare "
                            "(RESOURCE_EXHAUSTED above it); 0 = no limit",
    "request_memory_budget_bytes": "server memory requests may hold at once: a gRPC Predict "
                                   "counted as 8x its tensors' bytes, a JSON REST request as "
                                   "6x its body + 128 bytes per value; one that does not fit "
                                   "waits (until its deadline), one larger than the budget is "
                                   "RESOURCE_EXHAUSTED; 0 = no budget",
    "rest_api_idle_timeout_in_ms": "close a REST connection that is idle, or whose request has "
                                   "not fully arrived, after this long; <= 0 = never",
    "rest_api_max_connections": "most REST connections open at once (each holds a thread); "
                                "one more is answered 503 and closed; <= 0 = no limit",
    "allow_reload_config_request": "serve ModelService/HandleReloadConfigRequest (off: refused "
                                   "with PERMISSION_DENIED)",
    "reload_config_allowed_roots": "comma-separated directories a reloaded config's base paths "
                                   "must lie under (besides the base paths served at start)",
    "ssl_config_file": "text SSLConfig (server_key, server_cert, custom_ca, client_verify): "
                       "gRPC over TLS, as TF Serving",
    "version": "print the version and exit",
    "help": "print this help and exit",
}

# TF Serving flags that change nothing here; accepted so command lines carry over.
_NO_EFFECT = {"num_load_threads", "num_unload_threads",
              "flush_filesystem_caches", "xla_cpu_compilation_enabled"}
# TF Serving flags whose effect this server cannot give: refused.
_REFUSED = {"per_process_gpu_memory_fraction", "platform_config_file",
            "use_tflite_model", "prefer_tflite_model", "remove_unused_fields_from_bundle_metagraph",
            "use_alts_credentials", "grpc_max_receive_message_size"}


class FlagError(ValueError):
    pass


def usage() -> str:
    lines = ["usage: neuronish-model-server [--flag=value ...]", "", "Flags:"]
    for f in fields(Options):
        flag = f"--{f.name}={str(f.default).lower() if f.type == 'bool' else f.default}"
        lines.append(f"  {flag:<50} {HELP.get(f.name, '')}")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """argparse with TF Serving's flag spellings; its errors raise FlagError (main
    prints them with the usage) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        # "argument --port/-port: expected one argument" -> "--port needs a value: ..."
        found = re.fullmatch(r"argument ([^/:]+)\S*: (.*)", message, re.DOTALL)
        if found is None:
            raise FlagError(message)
        flag, problem = found.groups()
        if problem == "expected one argument":
            raise FlagError(f"{flag} needs a value: {flag}=...")
        raise FlagError(f"{flag} {problem}")


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"takes true or false, got {value!r}")


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes an integer, got {value!r}") from None


def _parser() -> _Parser:
    """Every flag as `--name=value`, `--name value` or gflags' `-name=value`; a bool one
    also bare (`--enable_batching`). No abbreviations: a misspelt flag is refused."""
    parser = _Parser(prog="neuronish-model-server", add_help=False, allow_abbrev=False)
    for f in fields(Options):
        spellings = ["-h", "--help", "-help"] if f.name == "help" else \
            [f"--{f.name}", f"-{f.name}"]
        if f.type == "bool":
            parser.add_argument(*spellings, dest=f.name, type=_bool, nargs="?", const=True,
                                default=f.default)
        else:
            parser.add_argument(*spellings, dest=f.name, default=f.default,
                                type=_int if f.type == "int" else str)
    for name in sorted(_NO_EFFECT | _REFUSED):  # taken, to be warned about or refused
        parser.add_argument(f"--{name}", f"-{name}", dest=f"other:{name}", nargs="?",
                            default=None, const="")
    return parser


def parse_flags(argv: Sequence[str]) -> Options:
    """TF Serving's command line as Options (FlagError naming the flag and the fix)."""
    known, rest = _parser().parse_known_args(list(argv))
    for arg in rest:
        if arg.startswith("-"):
            raise FlagError(f"unknown command line flag '{arg.lstrip('-').partition('=')[0]}'")
        raise FlagError(f"unexpected argument {arg!r} (flags are --name=value)")
    given = vars(known)
    for name in sorted(_REFUSED):
        if given[f"other:{name}"] is not None:
            raise FlagError(f"--{name} is not supported by neuronish-model-server")
    for name in sorted(_NO_EFFECT):
        if given[f"other:{name}"] is not None:
            log.warning("--%s has no effect in neuronish-model-server", name)
    return Options(**{f.name: given[f.name] for f in fields(Options)})


def grpc_server_options(arguments: str) -> list[tuple[str, object]]:
    """TF Serving's: no message size limit, plus --grpc_channel_arguments."""
    args: dict[str, object] = {
        "grpc.max_receive_message_length": 2**31 - 1,
        "grpc.max_send_message_length": 2**31 - 1,
        # Two servers must not share a port without noticing (grpcio enables reuse).
        "grpc.so_reuseport": 0,
    }
    for item in filter(None, (a.strip() for a in arguments.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise FlagError(f"--grpc_channel_arguments: {item!r} is not key=value")
        try:
            args[key] = int(value)
        except ValueError:
            args[key] = value
    return list(args.items())


class ModelServer:
    """Everything one server process runs, started and stopped in order."""

    def __init__(self, options: Options):
        import grpc  # noqa: F401  (fail here, not later, if gRPC is missing)
        import tensorflow as tf

        from . import config as cfg
        from .batching import BatchScheduler
        from .core import ServingCore
        from .manager import ModelManager
        from .metrics import Metrics

        self.options = options
        intra = options.tensorflow_intra_op_parallelism or options.tensorflow_session_parallelism
        inter = options.tensorflow_inter_op_parallelism or options.tensorflow_session_parallelism
        if intra:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
        if inter:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
        if options.port <= 0 and not options.grpc_socket_path:
            raise cfg.ConfigError("At least one of --port or --grpc_socket_path must be set")
        if options.model_config_file:
            self.model_config = cfg.read_model_server_config(options.model_config_file)
        elif options.model_base_path:
            self.model_config = cfg.single_model_config(options.model_name,
                                                        options.model_base_path)
        else:
            raise cfg.ConfigError("Both --model_base_path and --model_config_file are empty: "
                                  "nothing to serve")
        batching = None
        if options.enable_batching:
            batching = (cfg.read_batching_parameters(options.batching_parameters_file)
                        if options.batching_parameters_file else cfg.BatchingOptions())
            log.info("Batching: %s", batching)
        elif options.batching_parameters_file:
            log.warning("--batching_parameters_file is ignored without --enable_batching")
        self.metrics_path = None
        if options.monitoring_config_file:
            self.metrics_path = cfg.read_prometheus_path(options.monitoring_config_file)
            if self.metrics_path and options.rest_api_port <= 0:
                log.warning("Prometheus metrics are served on the REST port; set "
                            "--rest_api_port to expose them")
        self.metrics = Metrics()
        self.ssl_credentials = read_ssl_config(options.ssl_config_file) \
            if options.ssl_config_file else None
        self.manager = ModelManager(
            poll_wait_seconds=options.file_system_poll_wait_seconds,
            tags=[t.strip() for t in options.saved_model_tags.split(",") if t.strip()],
            max_num_load_retries=max(0, options.max_num_load_retries),
            load_retry_interval_s=options.load_retry_interval_micros / 1e6,
            allow_labels_for_unavailable=options.allow_version_labels_for_unavailable_models,
            warmup=options.enable_model_warmup)
        self.metrics.known_model = self.manager.knows
        self.scheduler = BatchScheduler(batching, self.metrics) if batching else None
        self.core = ServingCore(self.manager, self.scheduler,
                                options.enable_signature_method_name_check,
                                timeout_s=max(0, options.request_timeout_in_ms) / 1000,
                                max_elements=max(0, options.request_max_elements),
                                compute_threads=options.grpc_max_threads,
                                memory_budget=max(0, options.request_memory_budget_bytes))
        # Base paths a HandleReloadConfigRequest may name: those served at start, and
        # anything under --reload_config_allowed_roots.
        self._reload_paths = {os.path.realpath(m.base_path)
                              for m in self.model_config.model_config_list.config}
        self._reload_roots = [os.path.realpath(r.strip())
                              for r in options.reload_config_allowed_roots.split(",") if r.strip()]
        self.grpc_server = None
        self.rest_server = None
        self._config_mtime = self._mtime(options.model_config_file)
        self._stopping = threading.Event()
        self._reload_lock = threading.Lock()

    @staticmethod
    def _mtime(path: str) -> float | None:
        try:
            return os.stat(path).st_mtime if path else None
        except OSError:
            return None

    def start(self) -> None:
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        from .grpc_service import ModelService, PredictionService
        from .rest import RestApi, RestServer

        self.manager.set_config(self.model_config)
        self.manager.start()
        options = self.options
        server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=options.grpc_max_threads,
                                                  thread_name_prefix="grpc"),
            options=grpc_server_options(options.grpc_channel_arguments))
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionService(self.core, self.metrics), server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(
            ModelService(self.core, self.metrics, self.reload_config_request), server)
        # The Open Inference Protocol (KServe v2) on the same two ports.
        from neuronish import __version__

        from .proto import grpc_predict_v2_pb2_grpc
        from .v2 import V2Service
        from .v2_grpc import InferenceService
        from .v2_rest import V2RestApi

        v2 = V2Service(self.core, __version__)
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceService(v2, self.metrics), server)
        if options.port > 0:
            if self.ssl_credentials is not None:
                server.add_secure_port(f"0.0.0.0:{options.port}", self.ssl_credentials)
            else:
                server.add_insecure_port(f"0.0.0.0:{options.port}")  # raises if taken
        if options.grpc_socket_path:
            server.add_insecure_port(f"unix:{options.grpc_socket_path}")
        server.start()
        self.grpc_server = server
        log.info("Running gRPC ModelServer at 0.0.0.0:%d ...", options.port)
        if options.rest_api_port > 0:
            api = RestApi(self.core, self.metrics, options.rest_api_timeout_in_ms,
                          self.metrics_path)
            self.rest_server = RestServer(options.rest_api_port, api,
                                          options.rest_api_max_body_bytes,
                                          max(1, options.rest_api_num_threads),
                                          cors=options.rest_api_enable_cors_support,
                                          idle_timeout_s=options.rest_api_idle_timeout_in_ms / 1000,
                                          max_connections=options.rest_api_max_connections)
            self.rest_server.v2 = V2RestApi(v2, self.metrics, options.rest_api_timeout_in_ms)
            self.rest_server.start()
            log.info("Exporting HTTP/REST API at:localhost:%d ...", options.rest_api_port)
        if options.model_config_file and options.model_config_file_poll_wait_seconds > 0:
            threading.Thread(target=self._watch_config_file, name="config-poll",
                             daemon=True).start()

    def reload_config_request(self, model_config: object) -> None:
        """HandleReloadConfigRequest: anyone who reaches the port can send one, so it is
        off unless --allow_reload_config_request, and may only name base paths served
        at start or under --reload_config_allowed_roots."""
        from .status import PERMISSION_DENIED, ServingError

        if not self.options.allow_reload_config_request:
            raise ServingError(PERMISSION_DENIED, "HandleReloadConfigRequest is disabled on this "
                               "server; start it with --allow_reload_config_request (and "
                               "--reload_config_allowed_roots=DIR,...) to allow it")
        for model in model_config.model_config_list.config:  # type: ignore[attr-defined]
            path = os.path.realpath(model.base_path)
            if path in self._reload_paths or any(
                    os.path.commonpath([path, root]) == root for root in self._reload_roots):
                continue
            raise ServingError(PERMISSION_DENIED, f"model {model.name!r}: base_path "
                               f"{model.base_path!r} is neither served already nor under "
                               "--reload_config_allowed_roots "
                               f"({', '.join(self._reload_roots) or 'none given'})")
        # The version directories too, whenever they are listed: one symlinked out of the
        # roots (or, for a base path served at start, out of that base path) is not served.
        confine = {}
        for model in model_config.model_config_list.config:  # type: ignore[attr-defined]
            path = os.path.realpath(model.base_path)
            confine[model.name] = [*self._reload_roots,
                                   *([path] if path in self._reload_paths else [])]
        self.reload_config(model_config, confine=confine)

    def reload_config(self, model_config: object,
                      confine: dict[str, list[str]] | None = None) -> None:
        """Apply a new ModelServerConfig (HandleReloadConfigRequest, the config file poller)."""
        from . import config as cfg
        from .status import UNKNOWN, ServingError, invalid_argument

        try:
            cfg.validate_model_server_config(model_config)  # type: ignore[arg-type]
        except cfg.ConfigError as e:
            raise invalid_argument(str(e)) from None
        with self._reload_lock:
            self.manager.set_config(model_config, confine=confine)  # type: ignore[arg-type]
            names = [m.name for m in model_config.model_config_list.config]  # type: ignore
            missing = [n for n in names if not self._available(n)]
            if missing:
                raise ServingError(UNKNOWN, "Some models did not become available: {"
                                   + ", ".join(missing) + "}")

    def _available(self, name: str) -> bool:
        from .status import ServingError

        try:
            with self.manager.acquire(name):
                return True
        except ServingError:
            return False

    def _watch_config_file(self) -> None:
        from . import config as cfg
        from .status import ServingError

        path = self.options.model_config_file
        while not self._stopping.wait(self.options.model_config_file_poll_wait_seconds):
            mtime = self._mtime(path)
            if mtime is None or mtime == self._config_mtime:
                continue
            self._config_mtime = mtime
            try:
                self.reload_config(cfg.read_model_server_config(path))
                log.info("Reloaded %s", path)
            except (cfg.ConfigError, ServingError) as e:
                log.error("Reloading %s failed: %s", path, e)

    def stop(self) -> None:
        """Stop accepting, drain in-flight requests, unload."""
        self._stopping.set()
        grace = max(0, self.options.shutdown_grace_period_seconds)
        done = self.grpc_server.stop(grace) if self.grpc_server is not None else None
        if self.rest_server is not None:
            self.rest_server.stop(grace, lambda n: log.info("Waiting for %d REST request(s)", n))
        if done is not None:
            done.wait(grace + 1)
        if self.scheduler is not None:
            self.scheduler.stop()
        self.core.stop()
        self.manager.stop()


def read_ssl_config(path: str) -> object:
    """TF Serving's --ssl_config_file: a text SSLConfig with the server's PEM key and
    certificate, optionally a CA to check clients against and whether to require
    client certificates. Returns gRPC server credentials."""
    import grpc
    from google.protobuf import text_format

    from . import config as cfg

    ssl = cfg.ssl_config_message()()
    try:
        with open(path, encoding="utf-8") as f:
            text_format.Parse(f.read(), ssl)
    except (OSError, UnicodeDecodeError, text_format.ParseError) as e:
        raise cfg.ConfigError(f"--ssl_config_file={path}: {e}") from None
    if not ssl.server_key or not ssl.server_cert:
        raise cfg.ConfigError(f"--ssl_config_file={path}: server_key and server_cert (PEM text) "
                              "are both required")
    if ssl.client_verify and not ssl.custom_ca:
        raise cfg.ConfigError(f"--ssl_config_file={path}: client_verify needs custom_ca, the "
                              "CA that client certificates are checked against")
    try:
        return grpc.ssl_server_credentials(
            [(ssl.server_key.encode(), ssl.server_cert.encode())],
            root_certificates=ssl.custom_ca.encode() or None,
            require_client_auth=ssl.client_verify)
    except Exception as e:  # grpc raises on malformed PEM only when used; some here
        raise cfg.ConfigError(f"--ssl_config_file={path}: {e}") from None


class _Interrupted(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = parse_flags(sys.argv[1:] if argv is None else argv)
    except FlagError as e:
        print(f"neuronish-model-server: {e}\n\n{usage()}", file=sys.stderr)
        return 2
    if options.help:
        print(usage())
        return 0
    if options.version:
        from neuronish import __version__
        print(f"neuronish-model-server {__version__} (TensorFlow Serving API compatible)")
        return 0
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(levelname).1s %(name)s] %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's own INFO chatter off

    import neuronish  # noqa: F401  (registers the NeuronOp custom op before any load)

    from .config import ConfigError
    from .status import ServingError

    stop = threading.Event()
    started = False

    def on_signal(signum: int, frame: object) -> None:
        log.info("Received %s: shutting down", signal.Signals(signum).name)
        stop.set()
        if not started:  # still loading models: nothing is in flight, just leave
            raise _Interrupted

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server = ModelServer(options)
        server.start()
        started = True
    except _Interrupted:
        return 0
    except (ConfigError, ServingError, RuntimeError, OSError) as e:
        log.error("Cannot start the model server: %s", e)
        return 1
    while not stop.wait(1):
        pass
    server.stop()
    log.info("Server stopped")
    _exit_now(0)
    return 0  # not reached


def _exit_now(status: int) -> None:
    """Exit without joining leftover threads: a call abandoned at its deadline may
    still be running inside TensorFlow (which cannot cancel it), and the
    interpreter's exit would wait for it forever (a SIGTERM that never ends)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
