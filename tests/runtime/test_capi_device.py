"""The C runtime's device reads the NEURONISH_* environment as runtime/config.py does
(the same values accepted, the same refused, naming the variable), and refuses loads
that do not fit: too few core groups (NR_DEVICE_ERROR), too little core memory
(NR_OUT_OF_DEVICE_MEMORY), holding no memory afterwards."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from neuronish.runtime.capi import binding
from neuronish.runtime.config import ConfigError, DeviceConfig
from tests.runtime.test_capi_execute import compile_graph

NR_INVALID_CONFIG, NR_DEVICE_ERROR, NR_OUT_OF_DEVICE_MEMORY = 7, 8, 9
VARS = ("NEURONISH_NUM_CORES", "NEURONISH_VISIBLE_CORES", "NEURONISH_CORE_GROUP_SIZES",
        "NEURONISH_CORE_MEMORY", "NEURONISH_CORE_THREADS", "NEURONISH_HOST_PARALLELISM",
        "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "NEURONISH_NARROW_TWIN")

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")


@pytest.fixture(scope="module")
def lib() -> object:
    return binding.load_library()


CONFIGS = [
    {}, {"NEURONISH_NUM_CORES": "2"}, {"NEURONISH_NUM_CORES": "0"},
    {"NEURONISH_NUM_CORES": "x"}, {"NEURONISH_NUM_CORES": "-3"},
    {"NEURONISH_NUM_CORES": "8", "NEURONISH_VISIBLE_CORES": "2-5,7"},
    {"NEURONISH_VISIBLE_CORES": "0-9"}, {"NEURONISH_VISIBLE_CORES": "1,1"},
    {"NEURONISH_VISIBLE_CORES": "a"}, {"NEURONISH_CORE_GROUP_SIZES": "2,2"},
    {"NEURONISH_CORE_GROUP_SIZES": "2x2"}, {"NEURONISH_CORE_GROUP_SIZES": "3,3"},
    {"NEURONISH_CORE_GROUP_SIZES": "0"}, {"NEURONISH_CORE_GROUP_SIZES": "2y2"},
    {"NEURONISH_CORE_MEMORY": "64MiB"}, {"NEURONISH_CORE_MEMORY": "2 gb"},
    {"NEURONISH_CORE_MEMORY": "12XB"}, {"NEURONISH_CORE_MEMORY": "-1"},
    {"NEURONISH_CORE_THREADS": "0"}, {"NEURONISH_CORE_THREADS": "2"},
    {"NEURONISH_HOST_PARALLELISM": "-1"}, {"NEURONISH_HOST_PARALLELISM": "3"},
    # What Python's int() reads and C does not (a sign, `_`, other scripts' digits), counts
    # of ten digits and more, and devices too large to build: refused alike, in the same
    # words, before anything is built (each of the last four took gigabytes or crashed).
    {"NEURONISH_NUM_CORES": "+2"}, {"NEURONISH_NUM_CORES": "1_0"},
    {"NEURONISH_NUM_CORES": "\u0662"}, {"NEURONISH_NUM_CORES": "1024"},
    {"NEURONISH_NUM_CORES": "1025"}, {"NEURONISH_NUM_CORES": "99999999999"},
    {"NEURONISH_CORE_THREADS": "\u00b2"}, {"NEURONISH_HOST_PARALLELISM": "1_0"},
    {"NEURONISH_CORE_MEMORY": "\u0664GiB"}, {"OMP_NUM_THREADS": "\u00b2"},
    {"NEURONISH_VISIBLE_CORES": "0-999999999"}, {"NEURONISH_CORE_GROUP_SIZES": "999999999x1"},
    {"NEURONISH_CORE_MEMORY": "1048576GiB"}, {"NEURONISH_CORE_MEMORY": "1048577GiB"},
    {"NEURONISH_CORE_MEMORY": "17179869184G"},
    # Blank means unset; only ASCII spaces are trimmed; a sign then a space is no count.
    {"NEURONISH_CORE_MEMORY": ""}, {"NEURONISH_NARROW_TWIN": "off\x1c"},
    {"NEURONISH_NARROW_TWIN": " queued "}, {"NEURONISH_NUM_CORES": "- 5"},
]


@pytest.mark.parametrize("env", CONFIGS, ids=[",".join(f"{k[10:]}={v}" for k, v in e.items())
                                              or "defaults" for e in CONFIGS])
def test_environment_read_as_python_reads_it(lib: object, monkeypatch: pytest.MonkeyPatch,
                                             env: dict) -> None:
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    try:
        config = DeviceConfig.from_env()
    except ConfigError as e:
        with pytest.raises(binding.CRuntimeError) as c:
            binding.Device(lib)
        assert c.value.status == NR_INVALID_CONFIG
        assert c.value.message == str(e)  # the same words as Python's
        return
    device = binding.Device(lib)
    memory = device.memory()
    device.close()
    assert list(memory) == list(config.visible_cores)
    assert {total for _, total in memory.values()} == {config.core_memory}


def test_loads_that_do_not_fit_are_refused(lib: object, monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    from tests import graphs

    graph = graphs.conv_bn_relu(batch=2)
    pipelined = compile_graph(tmp_path, "cnn2", graph.graph_def, graph.io_config,
                              "--neuroncore-pipeline-cores", "2")
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NEURONISH_NUM_CORES", "3")
    device = binding.Device(lib)
    with pytest.raises(binding.CRuntimeError) as e:
        binding.Model(device, pipelined, duplicates=2)
    assert e.value.status == NR_DEVICE_ERROR
    assert "needs 2 core(s) per copy: the device has 1 such core group(s)" in e.value.message
    model = binding.Model(device, pipelined)  # one copy fits
    model.unload()
    device.close()
    monkeypatch.setenv("NEURONISH_CORE_MEMORY", "4KiB")
    device = binding.Device(lib)
    with pytest.raises(binding.CRuntimeError) as e:
        binding.Model(device, pipelined)
    assert e.value.status == NR_OUT_OF_DEVICE_MEMORY
    assert "out of device memory" in e.value.message and "NEURONISH_CORE_MEMORY" in e.value.message
    assert all(used == 0 for used, _ in device.memory().values())
    device.close()


@pytest.mark.parametrize("env, words", [
    ({"NEURONISH_NUM_CORES": "1025"}, "NEURONISH_NUM_CORES must be at most 1024, got 1025"),
    ({"NEURONISH_NUM_CORES": "99999999999"}, "must be a positive integer, got '99999999999'"),
    ({"NEURONISH_VISIBLE_CORES": "0-999999999"}, "cores must be distinct and in 0..3"),
    ({"NEURONISH_CORE_GROUP_SIZES": "999999999x1"}, "needs 999999999 cores, only 4 are"),
    ({"NEURONISH_CORE_MEMORY": "1048577GiB"}, "at most 1PiB (1125899906842624 bytes) per"),
    ({"NEURONISH_CORE_THREADS": "\u00b2"}, "NEURONISH_CORE_THREADS must be a positive integer"),
], ids=["cores", "digits", "range", "groups", "memory", "superscript"])
def test_a_device_too_large_to_build_is_refused_at_once(monkeypatch: pytest.MonkeyPatch,
                                                        env: dict, words: str) -> None:
    """Typos that would build a device core by core (a billion cores, gigabytes of lists,
    minutes, the process killed) or crash Python's int() are refused before anything is
    built, naming the variable: by both runtimes in the same words (above)."""
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as e:
        DeviceConfig.from_env()
    assert words in str(e.value)
