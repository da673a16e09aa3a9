"""Shared models and the main server (plain models, no batching) for the serving tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tensorflow as tf

from models.cache import cached_saved_model
from tests.serving import toy_model
from tests.serving.harness import Server, copy_version, running_server, write_text

# 1 MiB: small enough that the size-limit tests send little.
MAX_BODY = 1 << 20


@pytest.fixture(scope="package")
def serving_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serving")


@pytest.fixture(scope="package")
def mlp_model() -> str:
    return cached_saved_model("mlp")


@pytest.fixture(scope="package")
def toy_model_dir(serving_dir: Path) -> str:
    path = serving_dir / "toy_src"
    toy_model.build(str(path))
    return str(path)


@pytest.fixture(scope="package")
def mlp_reference(mlp_model: str):  # noqa: ANN201 (a ConcreteFunction)
    """The uncompiled mlp's serving function, in this process."""
    return tf.saved_model.load(mlp_model).signatures["serving_default"]


@pytest.fixture(scope="package")
def main_server(serving_dir: Path, mlp_model: str, toy_model_dir: str) -> Iterator[Server]:
    """mlp versions 1 and 2 (policy all, labels stable=1 and canary=2) and the toy
    model; Prometheus on; a 1 MiB limit on REST bodies and on gRPC messages."""
    root = serving_dir / "main"
    copy_version(mlp_model, root / "mlp", 1)
    copy_version(mlp_model, root / "mlp", 2)
    copy_version(toy_model_dir, root / "toy", 1)
    config = write_text(root / "models.config", f"""
model_config_list {{
  config {{
    name: "mlp"
    base_path: "{root / 'mlp'}"
    model_platform: "tensorflow"
    model_version_policy {{ all {{}} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 2 }}
  }}
  config {{
    name: "toy"
    base_path: "{root / 'toy'}"
    model_platform: "tensorflow"
  }}
}}
""")
    monitoring = write_text(root / "monitoring.config", "prometheus_config { enable: true }\n")
    args = [f"--model_config_file={config}", f"--monitoring_config_file={monitoring}",
            f"--rest_api_max_body_bytes={MAX_BODY}",
            f"--grpc_channel_arguments=grpc.max_receive_message_length={MAX_BODY}"]
    with running_server(args, root, {"mlp": [1, 2], "toy": [1]}) as server:
        yield server
