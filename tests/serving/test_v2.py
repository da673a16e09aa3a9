"""The Open Inference Protocol (KServe v2) on neuronish-model-server, spoken by its
reference client, tritonclient (HTTP and gRPC, unchanged), while TF Serving's own
client talks to the same server: health, metadata, inference on a compiled model and
on every datatype, binary tensor data, and the errors of bad requests.

Only the server process imports neuronish's v2 stubs (neuronish/serving/proto): this
process has tritonclient's, which define the same `inference.*` messages, and one
protobuf pool cannot hold both.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import neuronish
from tests.serving.harness import (
    Server,
    copy_version,
    predict_request,
    running_server,
    wait_for,
    write_text,
)

httpclient = pytest.importorskip(
    "tritonclient.http", reason="tritonclient is not installed: scripts/setup installs it "
    "(pip install --no-deps 'tritonclient==2.73.*' plus the [test] extra)")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] missing")
from tritonclient.utils import InferenceServerException  # noqa: E402 (after the skip)

COMPILED_BATCH = 4
# Every datatype a signature of ours can take: v2 name -> numpy dtype of test data.
NUMERIC = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
           "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
           "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


class DtypesModel(tf.Module):
    """One input per datatype; each output is its input plus one (not for bool; strings
    get a suffix), so a wrong decode or encode shows in the numbers."""

    def __init__(self) -> None:
        super().__init__()
        specs = {f"x_{n.lower()}": tf.TensorSpec([None, 3], tf.as_dtype(t), name=f"x_{n.lower()}")
                 for n, t in NUMERIC.items()}
        specs["x_bf16"] = tf.TensorSpec([None, 3], tf.bfloat16, name="x_bf16")
        specs["x_bytes"] = tf.TensorSpec([None, 3], tf.string, name="x_bytes")

        self.concrete = self.serve.get_concrete_function(**specs)

    @tf.function
    def serve(self, **inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        out = {}
        for key, x in inputs.items():
            name = "y" + key[1:]
            if x.dtype == tf.bool:
                out[name] = tf.logical_not(x)
            elif x.dtype == tf.string:
                out[name] = tf.strings.join([x, tf.constant(b"!")])
            else:
                out[name] = x + tf.ones_like(x)
        return out


def data_for(datatype: str) -> np.ndarray:
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BYTES":
        return np.array([[b"a", b"", b"\xc3\xa9t\xc3\xa9"], [b"xyz", b"0", b"1"]], dtype=object)
    if datatype == "BF16":
        return np.array([[1.5, -2.0, 0.25], [8.0, 3.0, -0.5]], dtype=ml_dtypes.bfloat16)
    return np.arange(6).reshape(2, 3).astype(NUMERIC[datatype])


def expected(datatype: str, x: np.ndarray) -> np.ndarray:
    if datatype == "BOOL":
        return ~x
    if datatype == "BYTES":
        return np.array([v + b"!" for v in x.reshape(-1)], dtype=object).reshape(x.shape)
    return x + 1


@pytest.fixture(scope="module")
def dtypes_model(serving_dir: Path) -> str:
    path = serving_dir / "v2" / "dtypes_src"
    module = DtypesModel()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.concrete})
    return str(path)


@pytest.fixture(scope="module")
def compiled_mlp(serving_dir: Path, mlp_model: str) -> str:
    target = serving_dir / "v2" / "mlp_neuron"
    report = neuronish.saved_model.compile(mlp_model, str(target), batch_size=COMPILED_BATCH)
    assert report["OnNeuronRatio"] > 0, report
    return str(target)


@pytest.fixture(scope="module")
def server(serving_dir: Path, compiled_mlp: str, dtypes_model: str) -> Iterator[Server]:
    root = serving_dir / "v2"
    copy_version(compiled_mlp, root / "models" / "mlp_neuron", 1)
    copy_version(dtypes_model, root / "models" / "dtypes", 3)
    (root / "models" / "later").mkdir(parents=True)  # no version yet: not ready
    config = write_text(root / "models.config", "model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{root / "models" / name}" '
        'model_platform: "tensorflow" }\n' for name in ("mlp_neuron", "dtypes", "later"))
        + "}\n")
    with running_server([f"--model_config_file={config}"], root,
                        {"mlp_neuron": [1], "dtypes": [3]}) as server:
        yield server


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[object]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server: Server) -> Iterator[object]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield client
    client.close()


def test_health_readiness_follows_the_models_loaded(server: Server, http: object,
                                                    grpc_client: object) -> None:
    for client in (http, grpc_client):
        assert client.is_server_live()
        assert client.is_model_ready("mlp_neuron") and client.is_model_ready("dtypes", "3")
        assert not client.is_model_ready("dtypes", "2")
        assert not client.is_model_ready("no_such_model")
        # "later" has no version on disk: the server is not ready, honestly.
        assert not client.is_server_ready()
        assert not client.is_model_ready("later")
    assert server.http("GET", "/v2/health/ready")[0] == 400
    copy_version(str(server_model_dir(server, "dtypes", 3)), server_model_dir(server, "later"),
                 1)
    wait_for(lambda: http.is_server_ready(), "the server to become ready", timeout=60)
    assert grpc_client.is_server_ready() and http.is_model_ready("later", "1")
    status, answer = server.http("GET", "/v2/health/live")
    assert status == 200 and answer == ""


def server_model_dir(server: Server, name: str, version: int | None = None) -> Path:
    base = server.log_path.parent / "models" / name
    return base if version is None else base / str(version)


def test_server_and_model_metadata(http: object, grpc_client: object) -> None:
    meta = http.get_server_metadata()
    assert meta["name"] == "neuronish-model-server" and meta["version"] == neuronish.__version__
    assert "binary_tensor_data" in meta["extensions"]
    assert grpc_client.get_server_metadata().name == "neuronish-model-server"
    model = http.get_model_metadata("mlp_neuron")
    assert model["name"] == "mlp_neuron" and model["versions"] == ["1"]
    assert model["platform"] == "tensorflow_savedmodel"
    # The shapes the compiled model really takes: any batch, fixed features.
    ((inp,), (out,)) = model["inputs"], model["outputs"]
    assert inp["datatype"] == "FP32" and inp["shape"][0] == -1 and -1 not in inp["shape"][1:]
    assert out["datatype"] == "FP32"
    g = grpc_client.get_model_metadata("dtypes", "3")
    assert g.versions == ["3"]
    types = {t.name: t.datatype for t in g.inputs}
    assert types["x_bf16"] == "BF16" and types["x_bytes"] == "BYTES" and types["x_uint64"] == \
        "UINT64"
    assert all(list(t.shape) == [-1, 3] for t in g.inputs)
    with pytest.raises(InferenceServerException, match="no_such"):
        http.get_model_metadata("no_such")


def mlp_input(meta: dict, batch: int, seed: int = 0) -> tuple[str, np.ndarray]:
    (inp,) = meta["inputs"]
    shape = [batch, *inp["shape"][1:]]
    shape = [int(d) for d in shape]  # JSON from gRPC metadata carries int64 as text
    return inp["name"], np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_infer_a_compiled_model_over_both_protocols_and_tf_serving_at_once(
        server: Server, http: object, grpc_client: object, mlp_reference: object) -> None:
    meta = http.get_model_metadata("mlp_neuron")
    name, x = mlp_input(meta, batch=5)  # not the compiled batch: split and padded
    want = {k: v.numpy() for k, v in mlp_reference(**{name: tf.constant(x)}).items()}
    (out_name,) = [o["name"] for o in meta["outputs"]]

    inp = httpclient.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    by_http = http.infer("mlp_neuron", [inp], request_id="r-1")
    assert by_http.get_response()["id"] == "r-1"
    assert by_http.get_response()["model_version"] == "1"
    inp_json = httpclient.InferInput(name, list(x.shape), "FP32")
    inp_json.set_data_from_numpy(x, binary_data=False)
    by_json = http.infer("mlp_neuron", [inp_json], outputs=[
        httpclient.InferRequestedOutput(out_name, binary_data=False)])
    ginp = grpcclient.InferInput(name, list(x.shape), "FP32")
    ginp.set_data_from_numpy(x)
    by_grpc = grpc_client.infer("mlp_neuron", [ginp], model_version="1")
    by_tfs = server.predictions.Predict(predict_request("mlp_neuron", {name: x}), timeout=30)
    tfs = tf.make_ndarray(by_tfs.outputs[out_name])
    for got in (by_http.as_numpy(out_name), by_json.as_numpy(out_name),
                by_grpc.as_numpy(out_name)):
        assert got.shape == want[out_name].shape and got.dtype == np.float32
        np.testing.assert_array_equal(got, tfs)  # one server, one model: the same numbers
        np.testing.assert_allclose(got, want[out_name], rtol=1e-4, atol=1e-4)  # vs TensorFlow


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips_over_http(http: object, binary: bool) -> None:
    inputs, outputs = [], []
    for datatype in [*NUMERIC, "BF16", "BYTES"]:
        if datatype in ("BF16",) and not binary:
            continue  # BF16 in JSON below
        x = data_for(datatype)
        inp = httpclient.InferInput(f"x_{datatype.lower()}", list(x.shape), datatype)
        inp.set_data_from_numpy(x, binary_data=binary)
        inputs.append(inp)
        outputs.append(httpclient.InferRequestedOutput(f"y_{datatype.lower()}",
                                                       binary_data=binary))
    if not binary:  # a BF16 tensor sent as JSON numbers
        inp = httpclient.InferInput("x_bf16", [2, 3], "BF16")
        # tritonclient refuses BF16 as JSON; the protocol allows it (numbers).
        inp._data = data_for("BF16").astype(np.float32).reshape(-1).tolist()
        inputs.append(inp)
    result = http.infer("dtypes", inputs, outputs=outputs)
    for datatype in NUMERIC:
        got = result.as_numpy(f"y_{datatype.lower()}")
        want = expected(datatype, data_for(datatype))
        assert got.dtype == want.dtype, datatype
        np.testing.assert_array_equal(got, want, err_msg=datatype)
    got = result.as_numpy("y_bytes")  # str from JSON, bytes from binary data
    assert [v.encode() if isinstance(v, str) else v for v in got.reshape(-1)] == \
        list(expected("BYTES", data_for("BYTES")).reshape(-1))
    if binary:
        bf16 = result.as_numpy("y_bf16")
        np.testing.assert_array_equal(bf16.astype(np.float32),
                                      (data_for("BF16") + 1).astype(np.float32))


def test_every_datatype_round_trips_over_grpc(grpc_client: object) -> None:
    inputs = []
    for datatype in [*NUMERIC, "BF16", "BYTES"]:
        x = data_for(datatype)
        inp = grpcclient.InferInput(f"x_{datatype.lower()}", list(x.shape), datatype)
        inp.set_data_from_numpy(x)
        inputs.append(inp)
    result = grpc_client.infer("dtypes", inputs)
    for datatype in NUMERIC:
        got = result.as_numpy(f"y_{datatype.lower()}")
        np.testing.assert_array_equal(got, expected(datatype, data_for(datatype)),
                                      err_msg=datatype)
        assert got.dtype == NUMERIC[datatype]
    assert [bytes(v) for v in result.as_numpy("y_bytes").reshape(-1)] == \
        list(expected("BYTES", data_for("BYTES")).reshape(-1))
    np.testing.assert_array_equal(result.as_numpy("y_bf16").astype(np.float32),
                                  (data_for("BF16") + 1).astype(np.float32))


def v2_infer(server: Server, model: str, doc: dict, binary: bytes = b"") -> tuple[int, object]:
    header = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    if binary:
        headers["Inference-Header-Content-Length"] = str(len(header))
    return server.http("POST", f"/v2/models/{model}/infer", header + binary, headers)


def test_nested_json_data_and_an_output_subset(server: Server) -> None:
    status, answer = v2_infer(server, "dtypes", {"id": "n", "inputs": [
        {"name": k, "datatype": d, "shape": [1, 3], "data": [v]} for k, d, v in (
            ("x_fp32", "FP32", [1.5, 2, 3]), ("x_int64", "INT64", [1, 2, 3]),
            ("x_bytes", "BYTES", ["a", "b", "c"]), ("x_bool", "BOOL", [True, False, True]),
            ("x_fp16", "FP16", [1, 2, 3]), ("x_fp64", "FP64", [1, 2, 3]),
            ("x_int8", "INT8", [1, 2, 3]), ("x_int16", "INT16", [1, 2, 3]),
            ("x_int32", "INT32", [1, 2, 3]), ("x_uint8", "UINT8", [1, 2, 3]),
            ("x_uint16", "UINT16", [1, 2, 3]), ("x_uint32", "UINT32", [1, 2, 3]),
            ("x_uint64", "UINT64", [1, 2, 3]), ("x_bf16", "BF16", [1, 2, 3]))],
        "outputs": [{"name": "y_fp32"}, {"name": "y_bytes"}]})
    assert status == 200, answer
    assert answer["id"] == "n" and answer["model_version"] == "3"
    assert answer["outputs"] == [
        {"name": "y_fp32", "datatype": "FP32", "shape": [1, 3], "data": [2.5, 3.0, 4.0]},
        {"name": "y_bytes", "datatype": "BYTES", "shape": [1, 3], "data": ["a!", "b!", "c!"]}]


def test_bad_requests_get_a_clear_error(server: Server, http: object,
                                        grpc_client: object) -> None:
    x = np.zeros((1, 3), np.float32)
    good = {"name": "x_fp32", "datatype": "FP32", "shape": [1, 3]}
    cases = [
        ({"inputs": [{**good, "datatype": "FP64", "data": [0, 0, 0]}]}, b"", 400,
         "input 'x_fp32' of model 'dtypes' takes FP32, but the request sent FP64"),
        ({"inputs": [{**good, "shape": [2, 3], "data": [0, 0, 0]}]}, b"", 400,
         "shape [2, 3] holds 6 elements, but 3 came"),
        ({"inputs": [{**good, "parameters": {"binary_data_size": 12}}]}, x.tobytes()[:8], 400,
         "binary_data_size 12 does not fit"),
        ({"inputs": [{**good, "parameters": {"binary_data_size": 12}}]}, x.tobytes() + b"1234",
         400, "4 bytes of binary data after the JSON header belong to no input"),
        ({"inputs": [{**good, "name": "x_other", "datatype": "FP8", "data": [0, 0, 0]}]}, b"",
         400, "input 'x_other': datatype 'FP8' is not one of"),
        ({"inputs": [{**good, "shape": [-1, 3], "data": []}]}, b"", 400, "negative dimension"),
        ({"inputs": "x"}, b"", 400, "'inputs' list"),
        # A shape of 2^40 elements with one element of data: refused, nothing allocated.
        ({"inputs": [{"name": "x_bytes", "datatype": "BYTES", "shape": [1 << 40, 1],
                      "parameters": {"binary_data_size": 5}}]}, b"\x01\x00\x00\x00a", 400,
         "holds 1099511627776 elements, but the BYTES data holds 1"),
        ({"inputs": [{**good, "shape": [1 << 40, 3], "data": [0, 0, 0]}]}, b"", 400,
         "holds 3298534883328 elements, but 3 came"),
    ]
    for doc, binary, want_status, message in cases:
        status, answer = v2_infer(server, "dtypes", doc, binary)
        assert status == want_status and message in answer["error"], (doc, answer)
    status, answer = server.http("POST", "/v2/models/dtypes/infer", b"{not json")
    assert status == 400 and "not JSON" in answer["error"]
    # Digits str.isdigit() takes and int() refuses: a clear 400, not a server error.
    body = json.dumps({"inputs": [{**good, "data": [0, 0, 0]}]}).encode()
    status, answer = server.http("POST", "/v2/models/dtypes/versions/%C2%B2/infer", body)
    assert status == 400 and "is not a version number" in answer["error"], answer
    status, answer = server.http("POST", "/v2/models/dtypes/infer", body,
                                 {"Inference-Header-Content-Length": "\u00b2"})
    assert status == 400 and "is not a length within" in answer["error"], answer
    # ... and more digits than int() converts (4300).
    status, answer = server.http("POST", "/v2/models/dtypes/versions/" + "9" * 5000 + "/infer",
                                 body)
    assert status == 400 and "is not a version number" in answer["error"], answer
    status, answer = server.http("POST", "/v2/models/dtypes/infer", body,
                                 {"Inference-Header-Content-Length": "9" * 5000})
    assert status == 400 and "is not a length within" in answer["error"], answer
    status, answer = v2_infer(server, "nope", {"inputs": [{**good, "data": [0, 0, 0]}]})
    assert status == 404 and "nope" in answer["error"]
    # A BYTES tensor whose length prefix runs past its data, over gRPC.
    raw = struct.pack("<I", 50) + b"abc"
    inp = grpcclient.InferInput("x_bytes", [1], "BYTES")
    inp._raw_content = raw
    inp._input.ClearField("contents")
    with pytest.raises(InferenceServerException, match="runs past the end"):
        grpc_client.infer("dtypes", [inp])
    # A signature input left out: TF Serving's wording, named.
    only = httpclient.InferInput("x_fp32", [1, 3], "FP32")
    only.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match=r"Missing but required: \{.*x_int64"):
        http.infer("dtypes", [only])



def test_typed_contents_over_grpc(server: Server, grpc_client: object,
                                  mlp_reference: object) -> None:
    """A v2 client that sends typed `contents` (not raw bytes) gets typed contents back.
    The request is built with tritonclient's own copy of the protocol's messages."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    meta = grpc_client.get_model_metadata("mlp_neuron", as_json=True)
    name, x = mlp_input(meta, batch=2, seed=1)
    (out_name,) = [o["name"] for o in meta["outputs"]]
    request = service_pb2.ModelInferRequest(model_name="mlp_neuron", id="typed")
    request.inputs.add(name=name, datatype="FP32", shape=list(x.shape)) \
        .contents.fp32_contents.extend(x.reshape(-1).tolist())
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(request, timeout=30)
        assert response.id == "typed" and not response.raw_output_contents
        (out,) = response.outputs
        got = np.array(out.contents.fp32_contents, np.float32).reshape(list(out.shape))
        want = mlp_reference(**{name: tf.constant(x)})[out_name].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        # FP16 has no contents field: such data must come raw.
        half = service_pb2.ModelInferRequest(model_name="dtypes")
        half.inputs.add(name="x_fp16", datatype="FP16", shape=[1, 3])
        with pytest.raises(grpc.RpcError, match="'FP16' data must come in raw_input_contents"):
            stub.ModelInfer(half, timeout=30)
