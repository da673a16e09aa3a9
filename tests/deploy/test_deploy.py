"""deploy/: the Kubernetes and KServe documents are valid for Kubernetes' schemas (with
`kubernetes-validate`, strict: an unknown field is an error), their server arguments are
flags the server takes, and their probes are endpoints the server answers
(tests/serving/test_v2.py runs them against a real server)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from neuronish.serving.server import parse_flags

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSION = "1.33.0"


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def entrypoint_args() -> list[str]:
    """The Dockerfile's ENTRYPOINT after the program name."""
    import json

    (line,) = [x for x in (DEPLOY / "Dockerfile").read_text().splitlines()
               if x.startswith("ENTRYPOINT")]
    program, *args = json.loads(line.removeprefix("ENTRYPOINT"))
    assert program == "neuronish-model-server"
    return args


def test_kubernetes_documents_validate_against_the_schemas() -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is in the [test] extra")
    docs = documents(DEPLOY / "kubernetes" / "neuronish-model-server.yaml")
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service",
                                         "HorizontalPodAutoscaler"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    broken = {**docs[1], "spec": {**docs[1]["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_deployment_runs_the_server_with_flags_it_takes_and_probes_it_serves() -> None:
    _, deployment, service, hpa = documents(DEPLOY / "kubernetes" /
                                            "neuronish-model-server.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    options = parse_flags([*entrypoint_args(), *container["args"]])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": options.port, "http": options.rest_api_port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready",
                                                      "port": "http"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # The pod's grace outlasts the server's own drain on SIGTERM.
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > \
        options.shutdown_grace_period_seconds
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]


def test_the_kserve_runtime_speaks_v2_with_the_servers_flags() -> None:
    runtime, service = documents(DEPLOY / "kserve" / "neuronish-runtime.yaml")
    assert (runtime["apiVersion"], runtime["kind"]) == ("serving.kserve.io/v1alpha1",
                                                        "ServingRuntime")
    assert (service["apiVersion"], service["kind"]) == ("serving.kserve.io/v1beta1",
                                                        "InferenceService")
    assert set(runtime["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    (container,) = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"  # the name KServe looks for
    args = [a.replace("{{.Name}}", "resnet-neuron") for a in container["args"]]
    options = parse_flags([*entrypoint_args(), *args])
    # KServe sends HTTP to 8080 and gRPC to 8081, and puts the model in /mnt/models.
    assert (options.rest_api_port, options.port) == (8080, 8081)
    assert options.model_base_path == "/mnt/models" and options.model_name == "resnet-neuron"
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"] and model["protocolVersion"] == "v2"
    assert model["modelFormat"]["name"] in {f["name"] for f in
                                            runtime["spec"]["supportedModelFormats"]}
