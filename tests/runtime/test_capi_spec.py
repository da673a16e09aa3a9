"""The C encoder (runtime/capi/engine_spec.cc) gives exactly runtime/native/spec.py's
engine specs: the same int64 list and the same floats (as float32, what the engine
reads) for every instruction of the native-coverage sample (one per admitted kind,
function and dtypes: runtime/native/coverage.py) and of real compiled models.

Python's specs are recorded where runtime/program.py hands them to the engine
(NativeProgram.add), so both sides use their loader's own placement (slots, offsets,
channel-blocked values); the C ones come from nr_model_instruction_spec.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from neuronish import runtime as py_runtime
from neuronish.runtime import isa
from neuronish.runtime.capi import binding
from neuronish.runtime.executable import to_bytes
from neuronish.runtime.native import coverage, engine_program
from neuronish.runtime.native.spec import encode
from neuronish.runtime.program import one_instruction_program
from tests.runtime.test_capi_execute import compile_graph

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")


@pytest.fixture(scope="module")
def device() -> binding.Device:
    dev = binding.Device(binding.load_library())
    yield dev
    dev.close()


def _python_specs(data: bytes, monkeypatch: pytest.MonkeyPatch) -> dict[int, object]:
    """Instruction index -> the spec Python's loader builds (None: left to numpy)."""
    specs: dict[int, object] = {}
    real = engine_program.NativeProgram.add

    def add(self: object, index: int, kind: str, attrs: dict, ins: list, outs: list,
            constant: list) -> int | None:
        specs[index] = encode(kind, attrs, ins, outs, constant)  # (the last build wins)
        return real(self, index, kind, attrs, ins, outs, constant)

    with monkeypatch.context() as m:
        m.setattr(engine_program.NativeProgram, "add", add)
        py_runtime.load(data, runtime="python").unload()
    return specs


def _same(label: str, py: object, c: object) -> None:
    if py is None or c is None:
        assert py is None and c is None, (label, py, c)
        return
    (pi, pf), (ci, cf) = py, c
    assert pi == ci, (label, pi, ci)
    assert np.array_equal(np.float32(pf), np.float32(cf)), (label, pf, cf)


def _compare(device: binding.Device, data: bytes, label: str,
             monkeypatch: pytest.MonkeyPatch) -> int:
    py = _python_specs(data, monkeypatch)
    model = binding.Model(device, data)
    try:
        for index, spec in py.items():
            _same(f"{label} #{index}", spec, model.spec(index))
    finally:
        model.unload()
    return len(py)


def _sample_executable(sample: coverage.Sample) -> bytes:
    types = [isa.Type(s, d) for s, d in sample.types]
    outs = [(tuple(t.shape), t.dtype) for t in isa.check(sample.kind, types, sample.attrs)]
    constant = frozenset({1}) if sample.kind in isa.MATMUL_LIKE | {"conv2d_int8",
                                                                   "matmul_int8"} else frozenset()
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 3, s).astype(binding._np_dtype(d)) for s, d in sample.types]
    program, _ = one_instruction_program(sample.kind, arrays, sample.attrs, outs,
                                         constant=constant)
    return to_bytes(program.exe)


def test_coverage_samples_encode_alike(device: binding.Device,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    samples = coverage.sample_instructions()
    for sample in samples:
        _compare(device, _sample_executable(sample), sample.label(), monkeypatch)
    print(f"{len(samples)} sample instructions: the same specs")
    assert len(samples) > 700


def test_real_models_encode_alike(device: binding.Device, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from models import cache
    from tests import graphs

    dense, cnn = graphs.dense_relu(batch=5, units=4), graphs.conv_bn_relu(batch=2)
    frozen = cache.cached_frozen_graph("bert_encoder", 2)
    files = {
        "cnn": compile_graph(tmp_path, "cnn", cnn.graph_def, cnn.io_config),
        "cnn_pipelined": compile_graph(tmp_path, "cnn2", cnn.graph_def, cnn.io_config,
                                       "--neuroncore-pipeline-cores", "2"),
        "dense_bf16": compile_graph(tmp_path, "bf16", dense.graph_def, dense.io_config,
                                    "--auto-cast", "matmult", "--auto-cast-type", "bf16"),
        "bert_encoder": compile_graph(tmp_path, "bert", frozen.graph_def, frozen.io_config()),
    }
    counts = {name: _compare(device, data, name, monkeypatch) for name, data in files.items()}
    print("instructions compared:", counts)
    assert counts["bert_encoder"] > 30
