"""The server's configuration files, read exactly as TF Serving reads them.

* `--model_config_file`: a text `ModelServerConfig` (tensorflow_serving.config).
* `--batching_parameters_file`: a text `BatchingParameters`.
* `--monitoring_config_file`: a text `MonitoringConfig`.

The `tensorflow-serving-api` wheel ships `ModelServerConfig` but not
`BatchingParameters` (servables/tensorflow/session_bundle_config.proto) nor
`MonitoringConfig` (config/monitoring_config.proto), and there is no protoc in
the environment. So those two messages are declared here, field for field
(same names, numbers and wrapper types; BatchingParameters' fields 1-9 as of
TF Serving 2.x), in a private descriptor pool: the files people already use
with TF Serving parse unchanged, e.g.

    max_batch_size { value: 32 }
    batch_timeout_micros { value: 2000 }
    allowed_batch_sizes: 8
    allowed_batch_sizes: 32
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message,
    message_factory,
    text_format,
    wrappers_pb2,
)
from tensorflow_serving.config import model_server_config_pb2

log = logging.getLogger("neuronish.serving")
DEFAULT_PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
TENSORFLOW_PLATFORM = "tensorflow"


class ConfigError(ValueError):
    """A configuration file or flag combination the server cannot use."""


def _declare_messages() -> tuple[type[message.Message], type[message.Message],
                                 type[message.Message]]:
    F = descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)

    fdp = descriptor_pb2.FileDescriptorProto(
        name="neuronish/serving/tf_serving_configs.proto", package="tensorflow.serving",
        syntax="proto3", dependency=["google/protobuf/wrappers.proto"])

    def field(msg: descriptor_pb2.DescriptorProto, name: str, number: int, type_: int,
              type_name: str = "", repeated: bool = False) -> None:
        added = msg.field.add(name=name, number=number, type=type_,
                              label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:  # setting it at all, even to "", marks a message/enum field
            added.type_name = type_name

    batching = fdp.message_type.add(name="BatchingParameters")
    for name, number in (("max_batch_size", 1), ("batch_timeout_micros", 2),
                         ("max_enqueued_batches", 3), ("num_batch_threads", 4)):
        field(batching, name, number, F.TYPE_MESSAGE, ".google.protobuf.Int64Value")
    field(batching, "thread_pool_name", 5, F.TYPE_MESSAGE, ".google.protobuf.StringValue")
    field(batching, "allowed_batch_sizes", 6, F.TYPE_INT64, repeated=True)
    field(batching, "pad_variable_length_inputs", 7, F.TYPE_BOOL)
    field(batching, "enable_large_batch_splitting", 8, F.TYPE_MESSAGE,
          ".google.protobuf.BoolValue")
    field(batching, "max_execution_batch_size", 9, F.TYPE_MESSAGE,
          ".google.protobuf.Int64Value")

    prometheus = fdp.message_type.add(name="PrometheusConfig")
    field(prometheus, "enable", 1, F.TYPE_BOOL)
    field(prometheus, "path", 2, F.TYPE_STRING)
    monitoring = fdp.message_type.add(name="MonitoringConfig")
    field(monitoring, "prometheus_config", 1, F.TYPE_MESSAGE,
          ".tensorflow.serving.PrometheusConfig")
    # tensorflow_serving/config/ssl_config.proto (--ssl_config_file)
    ssl = fdp.message_type.add(name="SSLConfig")
    for name, number in (("server_key", 1), ("server_cert", 2), ("custom_ca", 3)):
        field(ssl, name, number, F.TYPE_STRING)
    field(ssl, "client_verify", 4, F.TYPE_BOOL)
    pool.Add(fdp)
    return tuple(message_factory.GetMessageClass(  # type: ignore[return-value]
        pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))
        for name in ("BatchingParameters", "MonitoringConfig", "SSLConfig"))


BatchingParameters, MonitoringConfig, SSLConfig = _declare_messages()


def ssl_config_message() -> type[message.Message]:
    return SSLConfig


def _parse_text(path: str, msg: message.Message) -> message.Message:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as e:
        raise ConfigError(f"Invalid protobuf file: '{path}': {e}") from None
    return msg


# ----------------------------------------------------------------- ModelServerConfig


def single_model_config(name: str, base_path: str) -> model_server_config_pb2.ModelServerConfig:
    """What `--model_name`/`--model_base_path` mean: a one-model config."""
    config = model_server_config_pb2.ModelServerConfig()
    model = config.model_config_list.config.add()
    model.name = name
    model.base_path = base_path
    model.model_platform = TENSORFLOW_PLATFORM
    return config


def read_model_server_config(path: str) -> model_server_config_pb2.ModelServerConfig:
    config = _parse_text(path, model_server_config_pb2.ModelServerConfig())
    validate_model_server_config(config)
    return config


def validate_model_server_config(config: model_server_config_pb2.ModelServerConfig) -> None:
    """Refuse what the manager could not serve, naming the model at fault."""
    if config.WhichOneof("config") == "custom_model_config":
        raise ConfigError("custom_model_config is not supported; use model_config_list")
    seen: set[str] = set()
    for model in config.model_config_list.config:
        if not model.name:
            raise ConfigError("a model in model_config_list has no name")
        if model.name in seen:
            raise ConfigError(f"model {model.name!r} appears twice in model_config_list")
        seen.add(model.name)
        if not model.base_path:
            raise ConfigError(f"model {model.name!r} has no base_path")
        # TF Serving insists on a platform; configs in the wild always say
        # "tensorflow", and an omitted one can only mean that here.
        if model.model_platform not in ("", TENSORFLOW_PLATFORM):
            raise ConfigError(f"model {model.name!r}: model_platform "
                              f"{model.model_platform!r} is not supported (only 'tensorflow')")
        policy = model.model_version_policy
        if policy.WhichOneof("policy_choice") == "latest" and policy.latest.num_versions < 0:
            raise ConfigError(f"model {model.name!r}: latest.num_versions must be >= 0")
        for label, version in model.version_labels.items():
            if version < 0:
                raise ConfigError(f"model {model.name!r}: label {label!r} points at a negative "
                                  f"version {version}")


# ----------------------------------------------------------------- BatchingParameters


@dataclass(frozen=True)
class BatchingOptions:
    """BatchingParameters with TF's defaults filled in (SharedBatchScheduler's
    QueueOptions and Options: 1000, 0 µs, 10 batches, one thread per CPU).

    With `enable_large_batch_splitting`, `max_batch_size` bounds a request and
    `max_execution_batch_size` (default: `max_batch_size`) a merged batch; a
    request that does not fit is split over batches, as in TF Serving. Without
    it, `max_execution_batch_size` is ignored, its value unchecked."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = os.cpu_count() or 1
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int | None = None

    @property
    def batch_limit(self) -> int:
        """The most rows one merged batch (one model call) may hold."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size is not None:
            return self.max_execution_batch_size
        return self.max_batch_size

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.batch_timeout_micros < 0:
            raise ConfigError("batch_timeout_micros must be >= 0")
        if self.max_enqueued_batches < 1:
            raise ConfigError("max_enqueued_batches must be >= 1")
        if self.num_batch_threads < 1:
            raise ConfigError("num_batch_threads must be >= 1")
        execution = self.max_execution_batch_size
        # Only with splitting is the field read (TF Serving's GetQueueOptions skips
        # it otherwise), so only then can its value make the file wrong.
        if self.enable_large_batch_splitting:
            if execution is not None and not 1 <= execution <= self.max_batch_size:
                raise ConfigError(f"max_execution_batch_size must be between 1 and "
                                  f"max_batch_size ({self.max_batch_size}), got {execution}")
            # A request of max_batch_size rows needs this many batches on an idle
            # queue. TF Serving accepts a file where they do not fit, then refuses
            # every such request UNAVAILABLE, even on an idle server, and counts
            # it as a full queue; refusing the file says what is wrong, once.
            needed = -(-self.max_batch_size // self.batch_limit)
            if needed > self.max_enqueued_batches:
                raise ConfigError(
                    f"max_enqueued_batches ({self.max_enqueued_batches}) cannot hold one "
                    f"request of max_batch_size ({self.max_batch_size}) rows split into "
                    f"batches of max_execution_batch_size ({self.batch_limit}): it needs "
                    f"{needed}; raise max_enqueued_batches to at least {needed}, or lower "
                    f"max_batch_size to at most "
                    f"{self.max_enqueued_batches * self.batch_limit}")
        sizes = self.allowed_batch_sizes
        if sizes:
            # TF Serving's rules (batching_session.cc).
            if any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] < 1:
                raise ConfigError(f"allowed_batch_sizes must be positive and strictly "
                                  f"increasing, got {list(sizes)}")
            if self.enable_large_batch_splitting:
                if sizes[-1] != self.batch_limit:
                    raise ConfigError(f"The last entry in allowed_batch_sizes ({sizes[-1]}) "
                                      f"must equal max_execution_batch_size "
                                      f"({self.batch_limit})")
            elif sizes[-1] != self.max_batch_size:
                raise ConfigError(f"The last entry in allowed_batch_sizes ({sizes[-1]}) must "
                                  f"equal max_batch_size ({self.max_batch_size})")


def batching_options(params: message.Message | None) -> BatchingOptions:
    if params is None:
        return BatchingOptions()
    values: dict[str, object] = {}
    for name in ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
                 "num_batch_threads", "enable_large_batch_splitting",
                 "max_execution_batch_size"):
        if params.HasField(name):
            values[name] = getattr(params, name).value
    values["allowed_batch_sizes"] = tuple(params.allowed_batch_sizes)
    values["pad_variable_length_inputs"] = params.pad_variable_length_inputs
    if "max_execution_batch_size" in values and not values.get("enable_large_batch_splitting"):
        # TF Serving reads it only with splitting on; so does this server.
        log.warning("max_execution_batch_size has no effect without "
                    "enable_large_batch_splitting { value: true }")
    return BatchingOptions(**values)  # type: ignore[arg-type]


def read_batching_parameters(path: str) -> BatchingOptions:
    return batching_options(_parse_text(path, BatchingParameters()))


# ----------------------------------------------------------------- MonitoringConfig


def read_prometheus_path(path: str) -> str | None:
    """The metrics path if the monitoring config enables Prometheus, else None."""
    config = _parse_text(path, MonitoringConfig())
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    metrics_path = prometheus.path or DEFAULT_PROMETHEUS_PATH
    if not metrics_path.startswith("/"):
        raise ConfigError(f"prometheus_config.path must start with '/', got {metrics_path!r}")
    return metrics_path
