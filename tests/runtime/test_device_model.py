"""The device model: a roofline estimate of each instruction's device time from a
device description (default: Inferentia2's published figures), stored in the
executable and shown by `neuronish-cc inspect`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuronish.cc.compiler import compile_graph
from neuronish.cc.device_model import (
    INFERENTIA2,
    DeviceModelError,
    estimate,
    load_device,
)
from neuronish.runtime.executable import from_bytes
from tests.graphs import conv_bn_relu, dense_relu

BIN = Path(sys.executable).parent


def test_default_is_inferentia2_per_core_and_bf16_beats_fp32(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEURONISH_DEVICE_MODEL", raising=False)
    d = load_device(None)
    assert d is INFERENTIA2
    assert d.matrix_flops["bfloat16"] == 190e12 / 2 and d.matrix_flops["float32"] == 47.5e12 / 2
    assert d.peak("matrix", "bfloat16") > d.peak("matrix", "float32") > d.peak("vector", "float32")
    assert d.peak("vector", "int32") == d.vector_flops["float32"]  # no figure: slowest listed


def test_a_matmul_costs_overhead_plus_the_slower_of_compute_and_memory() -> None:
    g = dense_relu(batch=4, features=16, units=8)
    exe = from_bytes(compile_graph(g.graph_def, g.io_config))
    (program,) = exe.programs
    (cost,) = estimate(exe, INFERENTIA2).costs[0]
    assert program[0].kind == "matmul" and len(program) == 1  # bias and relu fused
    flops = 2 * 4 * 8 * 16
    moved = 4 * (4 * 16 + 16 * 8 + 8 + 4 * 8)  # x, W, bias, y: all cross device memory
    assert (cost.flops, cost.bytes, cost.unit, cost.dtype) == (flops, moved, "matrix", "float32")
    expected = INFERENTIA2.instruction_overhead + max(flops / 23.75e12, moved / 410e9)
    assert cost.seconds == pytest.approx(expected)
    assert cost.bound == "overhead"  # a tiny layer: the fixed cost dominates
    stored = exe.stats["device_model"]
    assert stored["instruction_seconds"] == [[pytest.approx(expected)]]
    assert stored["throughput_per_second"] == pytest.approx(4 / expected)


def test_auto_cast_bf16_makes_matrix_instructions_faster_and_move_half_the_weights() -> None:
    g = conv_bn_relu(batch=8)
    fp32 = from_bytes(compile_graph(g.graph_def, g.io_config))
    bf16 = from_bytes(compile_graph(g.graph_def, g.io_config, auto_cast="matmult"))
    slow_device = {**INFERENTIA2.__dict__, "instruction_overhead": 0.0}
    device = type(INFERENTIA2)(**slow_device)

    def conv(exe):
        return next(c for i, c in zip(exe.programs[0], estimate(exe, device).costs[0])
                    if i.kind == "conv2d")

    a, b = conv(fp32), conv(bf16)
    assert (a.dtype, b.dtype) == ("float32", "bfloat16")
    assert b.seconds < a.seconds and b.flops == a.flops
    weights = 3 * 3 * 3 * 8
    assert a.bytes - b.bytes >= weights * 2  # 16-bit weights (and activations) on the device


def test_pipeline_stages_add_up_in_latency_and_overlap_in_throughput() -> None:
    g = conv_bn_relu(batch=2)
    exe = from_bytes(compile_graph(g.graph_def, g.io_config, pipeline_cores=2))
    est = estimate(exe, INFERENTIA2)
    assert len(est.stage_seconds) == 2 and all(t > 0 for t in est.stage_seconds)
    assert est.latency == pytest.approx(sum(est.stage_seconds))
    assert est.throughput == pytest.approx(2 / max(est.stage_seconds))


def test_a_description_file_overrides_fields_and_bad_ones_are_named(tmp_path: Path) -> None:
    f = tmp_path / "slow.json"
    f.write_text(json.dumps({"memory_bandwidth": 1e9, "vector_flops": {"float32": 1e9}}))
    d = load_device(f)
    assert d.name == "slow" and d.memory_bandwidth == 1e9
    assert d.matrix_flops == INFERENTIA2.matrix_flops  # left out: the default's
    for body, field in (({"memory_bandwith": 1}, "memory_bandwith"),
                        ({"cores": 0}, "cores"), ({"matrix_flops": {"float32": "fast"}},
                                                  "matrix_flops"),
                        ([1, 2], "JSON object")):
        f.write_text(json.dumps(body))
        with pytest.raises(DeviceModelError, match=field):
            load_device(f)
    with pytest.raises(DeviceModelError, match="cannot read"):
        load_device(tmp_path / "missing.json")


def test_inspect_shows_modelled_figures_on_the_chosen_device(tmp_path: Path) -> None:
    g = conv_bn_relu(batch=2)
    neff = tmp_path / "m.neff"
    neff.write_bytes(compile_graph(g.graph_def, g.io_config))
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"memory_bandwidth": 1e6, "instruction_overhead": 0}))

    def inspect(*extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "neuronish-cc"), "inspect", str(neff), *extra],
                              capture_output=True, text=True, timeout=60, env=env)

    text = inspect()
    assert text.returncode == 0 and "modelled on inferentia2-like" in text.stdout
    assert "not a measurement" in text.stdout and "inferences/s" in text.stdout
    fast = json.loads(inspect("--json").stdout)["modelled"]
    by_flag = json.loads(inspect("--json", "--device-model", str(slow)).stdout)["modelled"]
    env = {**os.environ, "NEURONISH_DEVICE_MODEL": str(slow)}
    by_env = json.loads(inspect("--json", env=env).stdout)["modelled"]
    assert by_flag == by_env and by_flag["device"] == "slow"
    assert by_flag["latency_seconds"] > 100 * fast["latency_seconds"]  # memory-bound now
    slow.write_text("{")
    bad = inspect("--device-model", str(slow))
    assert bad.returncode == 2 and "not JSON" in bad.stderr


def test_the_compile_report_shows_each_neuron_ops_modelled_figures(tmp_path: Path) -> None:
    import neuronish.saved_model
    from models.cache import cached_saved_model

    report = neuronish.saved_model.compile(cached_saved_model("cnn_cumsum"),
                                           str(tmp_path / "out"), batch_size=2)
    assert len(report["NeuronOps"]) == 2
    for op in report["NeuronOps"]:
        m = op["modelled"]
        assert m["device"] == load_device().name and m["cores"] == 1 and m["batch"] == 2
        assert m["inferences_per_second"] == pytest.approx(2 / (m["latency_ms"] / 1e3), rel=1e-3)
    text = neuronish.saved_model.format_report(report)
    assert text.count("modelled on") == 2 and "(not measured)" in text
