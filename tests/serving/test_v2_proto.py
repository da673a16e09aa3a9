"""neuronish's Open Inference Protocol schema (neuronish/serving/proto/grpc_predict_v2.proto,
written here): the checked-in Python modules are what protoc generates from it, and
every message and field in it has the name, number and type of tritonclient's copy of
the protocol (Triton's grpc_service.proto, a superset), so the two talk on the wire.
The schema is read as a descriptor set, never registered in this process's pool, where
tritonclient's messages of the same names live."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parents[2]
PROTO = "neuronish/serving/proto/grpc_predict_v2.proto"


def _protoc(tmp_path: Path, *outputs: str) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO}", *outputs, PROTO],
                   check=True, cwd=tmp_path)


def test_the_generated_modules_are_protocs_output(tmp_path: Path) -> None:
    _protoc(tmp_path, f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}")
    for name in ("grpc_predict_v2_pb2.py", "grpc_predict_v2_pb2_grpc.py"):
        generated = (tmp_path / "neuronish/serving/proto" / name).read_text()
        assert generated == (REPO / "neuronish/serving/proto" / name).read_text(), (
            f"{name} is stale: regenerate it (the command is in {PROTO})")


def _messages(prefix: str, messages: object) -> dict[str, dict[str, tuple]]:
    out: dict[str, dict[str, tuple]] = {}
    for m in messages:  # type: ignore[attr-defined]
        name = f"{prefix}{m.name}"
        out[name] = {f.name: (f.number, f.type, f.label, f.type_name.rsplit(".", 1)[-1])
                     for f in m.field}
        out.update(_messages(f"{name}.", m.nested_type))
    return out


def test_every_message_and_field_matches_tritonclients(tmp_path: Path) -> None:
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2",
                                      reason="tritonclient is installed by scripts/setup")
    _protoc(tmp_path, f"--descriptor_set_out={tmp_path / 'set.pb'}")
    (ours,) = descriptor_pb2.FileDescriptorSet.FromString(
        (tmp_path / "set.pb").read_bytes()).file
    theirs = descriptor_pb2.FileDescriptorProto()
    service_pb2.DESCRIPTOR.CopyToProto(theirs)
    assert ours.package == theirs.package == "inference"
    mine, triton = _messages("", ours.message_type), _messages("", theirs.message_type)
    assert len(mine) == 23 and sum(len(f) for f in mine.values()) > 50
    for message, fields in mine.items():
        assert message in triton, message
        for field, spec in fields.items():
            if spec[3].endswith("Entry"):  # map entries: generated names, same shape
                assert triton[message][field][:3] == spec[:3], (message, field)
                continue
            assert triton[message].get(field) == spec, (message, field, spec,
                                                        triton[message].get(field))
    (service,) = ours.service
    (triton_service,) = [s for s in theirs.service if s.name == service.name]
    theirs_methods = {m.name: (m.input_type, m.output_type) for m in triton_service.method}
    for method in service.method:
        assert theirs_methods[method.name] == (method.input_type, method.output_type)
