"""The compile report's notes about the compiling CPU (cc/host.py): --auto-cast on a CPU
without kernels of that 16-bit type runs slower than float32 there, and says so; full
8-bit weights without VNNI compute in float32, and say so."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc import compiler, host
from neuronish.compile_report import format_report
from tests.graphs import trace

AVX2 = {"fpu", "sse4_2", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


@pytest.mark.parametrize("cast_type, flags, noted", [
    ("bf16", AVX2, True),
    ("bf16", AVX512, False),            # oneDNN's bfloat16 kernels from avx512_core
    ("bf16", AVX2 | {"avx_ne_convert"}, False),
    ("fp16", AVX512, True),             # float16 needs AVX512-FP16
    ("fp16", AVX512 | {"avx512_fp16"}, False),
    ("bf16", set(), False),             # flags unknown: nothing said
], ids=["bf16_avx2", "bf16_avx512", "bf16_ne_convert", "fp16_avx512", "fp16_avx512fp16",
        "unknown"])
def test_auto_cast_note_follows_the_kernels_the_cpu_has(cast_type: str, flags: set[str],
                                                        noted: bool) -> None:
    note = host.auto_cast_note(cast_type, flags)
    assert (note is not None) == noted
    if noted:
        name = {"bf16": "bfloat16", "fp16": "float16"}[cast_type]
        assert f"no {name} kernels" in note and "without --auto-cast" in note


def test_int8_note_only_for_eight_bit_weights_without_vnni() -> None:
    assert "--int8-weight-bits 7" in host.int8_note(8, AVX2)
    assert host.int8_note(7, AVX2) is None
    assert host.int8_note(8, AVX512 | {"avx512_vnni"}) is None


def test_cpu_flags_are_this_hosts() -> None:
    flags = host.cpu_flags()
    assert flags == set() or "fpu" in flags  # (every x86 Linux lists fpu)


def _matmul_graph():  # noqa: ANN202 (a TracedGraph)
    w = tf.constant(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    return trace(lambda x: tf.matmul(x, w), tf.TensorSpec((2, 8), tf.float32, name="x"))


@pytest.mark.parametrize("flags, noted", [(AVX2, True), (AVX512, False)],
                         ids=["avx2", "avx512"])
def test_an_auto_cast_executable_carries_the_note(flags: set[str], noted: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "cpu_flags", lambda: flags)
    g = _matmul_graph()
    exe = compiler.compile_executable(g.graph_def, g.io_config, auto_cast="matmult",
                                      auto_cast_type="bf16")
    assert ("note" in exe.stats["auto_cast"]) == noted
    plain = compiler.compile_executable(g.graph_def, g.io_config)
    assert "auto_cast" not in plain.stats  # (nothing to say without --auto-cast)


def test_the_report_prints_a_neuron_ops_note() -> None:
    report = {"OnNeuronRatio": 1.0, "model_dir": "m", "new_model_dir": "n",
              "signature_def_key": "serving_default", "batch_size": 1, "operations": 1,
              "operations_on_neuron": 1, "OnTensorFlow": {}, "OnTensorFlowNodes": {},
              "compile_failures": [], "ignored_fuse_selectors": [], "compile_seconds": 0.1,
              "NeuronOps": [{"name": "neuron_op_0", "ops": 1, "op_counts": {"MatMul": 1},
                             "inputs": {}, "outputs": {}, "dynamic_batch": False,
                             "dynamic_batch_note": "", "executable_bytes": 10,
                             "compile_seconds": 0.1, "cached": False, "outcome": "ok",
                             "auto_cast_note": host.auto_cast_note("bf16", AVX2)}]}
    text = format_report(report)
    assert "    note: the compiling CPU has no bfloat16 kernels" in text
