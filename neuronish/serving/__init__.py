"""neuronish's model server: TensorFlow Serving's protocols for compiled and plain models.

    neuronish-model-server --port=8500 --rest_api_port=8501 \\
        --model_name=mlp --model_base_path=/models/mlp

Modules, in the order a request meets them:

    server.py        flags (TF Serving's names and defaults), start-up, SIGTERM
    grpc_service.py  PredictionService / ModelService on the generated stubs
    rest.py          /v1/models/... JSON API, Prometheus metrics endpoint
    json_codec.py    REST JSON <-> arrays (row/columnar, b64), tf.Example JSON
    codec.py         TensorProto <-> numpy, classify/regress inputs
    core.py          predict / classify / regress / metadata / status
    signatures.py    SignatureDefs and checking requests against them
    batching.py      merging concurrent requests into batches
    manager.py       versions on disk -> loaded servables, policies, labels
    servable.py      one loaded version
    config.py        ModelServerConfig, BatchingParameters, MonitoringConfig files
    metrics.py       Prometheus text exposition
    status.py        TF status codes, their gRPC and HTTP equivalents

Importing this package is cheap; TensorFlow is imported by the modules that need it.
"""
