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
import subprocess
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


def _python_specs(data: bytes, monkeypatch: pytest.MonkeyPatch,
                  device: py_runtime.Device | None = None
                  ) -> tuple[dict[int, object], dict[int, int]]:
    """Instruction index -> the spec Python's loader builds (None: left to numpy), and
    the team it runs on (0: left to numpy)."""
    specs: dict[int, object] = {}
    teams: dict[int, int] = {}
    real = engine_program.NativeProgram.add

    def add(self: engine_program.NativeProgram, offer: engine_program.Offer) -> int | None:
        specs[offer.index] = encode(offer.kind, offer.attrs, offer.ins, offer.outs,
                                    offer.constant)  # (the last build wins)
        k = real(self, offer)
        teams[offer.index] = self.teams.get(offer.index, 0)
        return k

    with monkeypatch.context() as m:
        m.setattr(engine_program.NativeProgram, "add", add)
        py_runtime.load(data, runtime="python", device=device).unload()
    return specs, teams


def _same(label: str, py: object, c: object) -> None:
    if py is None or c is None:
        assert py is None and c is None, (label, py, c)
        return
    (pi, pf), (ci, cf) = py, c
    assert pi == ci, (label, pi, ci)
    assert np.array_equal(np.float32(pf), np.float32(cf)), (label, pf, cf)


def _compare(device: binding.Device, data: bytes, label: str,
             monkeypatch: pytest.MonkeyPatch) -> int:
    py, teams = _python_specs(data, monkeypatch)
    model = binding.Model(device, data)
    try:
        for index, spec in py.items():
            _same(f"{label} #{index}", spec, model.spec(index))
            assert model.team(index) == teams[index], (label, index)
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


def test_team_size_twins_agree(tmp_path: Path) -> None:
    """engine_spec.h's is_wide and team_size give spec.py's answers on every side of
    both thresholds (a C++ program built from the header prints them)."""
    from neuronish.runtime.native.spec import SMALL_WORK, TINY_WORK, is_wide, team_size

    sizes = [0, 1, TINY_WORK - 1, TINY_WORK, TINY_WORK + 1, SMALL_WORK - 1, SMALL_WORK,
             SMALL_WORK + 1, 1 << 40]
    programs = [[], [SMALL_WORK - 1], [SMALL_WORK], [0, TINY_WORK, SMALL_WORK + 7],
                [TINY_WORK] * 3]
    cases = [(w, wide, t) for w in sizes for wide in (False, True) for t in (1, 2, 5)]
    source = tmp_path / "teams.cc"
    source.write_text(
        '#include <cstdio>\n#include "engine_spec.h"\nusing namespace nr::spec;\n'
        "int main() {\n"
        + "".join(f'  std::printf("%d\\n", team_size({w}LL, {str(wide).lower()}, {t}));\n'
                  for w, wide, t in cases)
        + "".join("  std::printf(\"%d\\n\", int(is_wide({"
                  + ", ".join(f"{w}LL" for w in p) + "})));\n" for p in programs)
        + "}\n")
    exe = tmp_path / "teams"
    root = Path(binding.__file__).parent
    subprocess.run(["g++", "-std=c++17", f"-I{root}", str(source), "-o", str(exe)],
                   check=True, capture_output=True, timeout=300)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    want = [team_size(w, wide, t) for w, wide, t in cases] + [int(is_wide(p)) for p in programs]
    assert [int(x) for x in got] == want
    assert set(want[:len(cases)]) == {1, 2, 5}  # (both answers reached)


def test_a_wide_programs_teams_match_pythons(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """On two threads per core, the C loader gives each instruction the team the Python
    loader gives it: a wide program's small pool runs on both threads (the pre-pass over
    the whole stage), the same pool alone on one."""
    import tensorflow as tf

    from neuronish.runtime.config import DeviceConfig
    from tests.graphs import trace

    env = {"NEURONISH_NUM_CORES": "1", "NEURONISH_CORE_THREADS": "2",
           "NEURONISH_HOST_PARALLELISM": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    w = tf.constant(np.random.default_rng(0).standard_normal((3, 3, 64, 64), np.float32))
    pool = lambda x: tf.nn.avg_pool2d(x, 3, 1, "SAME")  # noqa: E731 - 2.4 MFLOP
    spec = tf.TensorSpec([4, 32, 32, 64], tf.float32, name="x")
    wide = trace(lambda x: pool(tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME"))), spec)
    narrow = trace(pool, spec)
    c_device = binding.Device(binding.load_library())
    try:
        for name, graph, want in (("wide", wide, [2, 2]), ("narrow", narrow, [1])):
            data = compile_graph(tmp_path, name, graph.graph_def, graph.io_config)
            _, teams = _python_specs(data, monkeypatch,
                                     py_runtime.Device(DeviceConfig.from_env(env)))
            assert [teams[i] for i in sorted(teams)] == want, name
            model = binding.Model(c_device, data)
            try:
                assert [model.team(i) for i in sorted(teams)] == want, name
            finally:
                model.unload()
    finally:
        c_device.close()
