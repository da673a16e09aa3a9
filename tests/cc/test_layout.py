"""The layout pass (cc/passes/layout.py) and the native engine keeping values blocked."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from neuronish.cc import host
from neuronish.cc.compiler import compile_graph
from neuronish.runtime import load
from neuronish.runtime.executable import from_bytes
from neuronish.runtime.native import library
from tests.graphs import trace

RNG = np.random.default_rng(7)


def _blocked_kernels() -> bool:
    """Whether oneDNN has real float32 kernels for nChw16c here: AVX-512's. On an AVX2-only
    CPU its convolutions and pools on 16-channel blocks are reference code, so the loader
    keeps every value NHWC (what test_no_blocked_value_... asks of it)."""
    return "avx512f" in host.cpu_flags()


def _w(*shape: int) -> tf.Tensor:
    return tf.constant(RNG.standard_normal(shape).astype(np.float32) * 0.2)


def conv_chain() -> object:
    """A ResNet-like block: conv -> conv -> (residual add) -> pool -> conv -> conv(8
    channels) -> mean. The 32-channel activations can stay blocked; the 8-channel ones
    cannot (not a multiple of 16), nor what `reduce` reads."""
    w1, w2, w3, w4 = _w(3, 3, 8, 16), _w(1, 1, 16, 32), _w(1, 1, 8, 32), _w(3, 3, 32, 8)
    w5 = _w(3, 3, 32, 32)

    def fn(x: tf.Tensor) -> tf.Tensor:
        a = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"))
        b = tf.nn.conv2d(a, w2, 1, "SAME") + tf.nn.conv2d(x, w3, 1, "SAME")
        c = tf.nn.max_pool2d(tf.nn.relu(b), 3, 2, "SAME")
        d = tf.nn.conv2d(tf.nn.relu(tf.nn.conv2d(c, w5, 1, "SAME")), w4, 1, "SAME")
        return tf.reduce_mean(d, axis=[1, 2])

    return trace(fn, tf.TensorSpec([None, 12, 12, 8], tf.float32, name="x"), batch=2)


def test_pass_marks_values_that_stay_between_windowed_instructions() -> None:
    g = conv_chain()
    exe = from_bytes(compile_graph(g.graph_def, g.io_config))
    by_kind = [(i.kind, i.attrs.get("layout", "nhwc"), exe.values[i.outputs[0]][0][-1])
               for p in exe.programs for i in p]
    blocked = [(k, c) for k, layout, c in by_kind if layout == "nChw16c"]
    assert blocked and all(c % 16 == 0 for _, c in blocked), by_kind
    # Nothing read by a non-windowed instruction, or not a multiple of 16, is marked.
    assert ("conv2d", "nhwc", 8) in by_kind and not any(
        layout != "nhwc" and c % 16 for _, layout, c in by_kind)


@pytest.mark.parametrize("engine", ["numpy", "native"])
def test_blocked_values_give_tensorflows_numbers(engine: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", engine)
    if engine == "native":
        assert library.load() is not None, library.why_not()
    g = conv_chain()
    x = RNG.standard_normal((2, 12, 12, 8)).astype(np.float32)
    want = g.reference({"x:0": x})
    with load(compile_graph(g.graph_def, g.io_config), runtime="python") as model:
        program = model._idle.get()
        model._idle.put(program)
        # The native engine realizes the pass's decision where the CPU has kernels for
        # it; numpy never blocks anything.
        assert bool(program.blocked) == (engine == "native" and _blocked_kernels())
        got = model.run({"x:0": x})
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)


def test_the_pass_can_be_turned_off_and_changes_no_number() -> None:
    g = conv_chain()
    x = RNG.standard_normal((2, 12, 12, 8)).astype(np.float32)
    outs = []
    for disabled in ((), ("assign_layouts",)):
        exe = compile_graph(g.graph_def, g.io_config, disabled_passes=list(disabled))
        assert (b"nChw16c" in exe) == (not disabled)
        with load(exe) as model:
            outs.append(model.run({"x:0": x}))
    for name in outs[0]:
        np.testing.assert_allclose(outs[0][name], outs[1][name], rtol=1e-5, atol=1e-6)


def test_inspect_and_the_ir_dump_show_the_decisions(tmp_path, monkeypatch) -> None:
    import subprocess
    import sys
    from pathlib import Path

    g = conv_chain()
    exe, exe16 = tmp_path / "m.neff", tmp_path / "bf16.neff"
    monkeypatch.setenv("NEURONISH_DUMP_DIR", str(tmp_path / "dump"))
    exe.write_bytes(compile_graph(g.graph_def, g.io_config, dump_dir=tmp_path / "dump"))
    exe16.write_bytes(compile_graph(g.graph_def, g.io_config, auto_cast="matmult",
                                    auto_cast_type="bf16"))
    cc = Path(sys.executable).parent / "neuronish-cc"
    out, out16 = (subprocess.run([str(cc), "inspect", str(e)], capture_output=True, text=True,
                                 check=True).stdout for e in (exe, exe16))
    assert "activation layouts (assign_layouts): nChw16c x" in out, out
    assert "matmul-like operands read in" not in out, out
    # bf16 convolutions are fastest on NHWC (AMX / brgemm kernels): nothing is blocked.
    assert "matmul-like operands read in: bfloat16 x5" in out16, out16
    assert "nChw16c" not in out16, out16
    dumps = sorted((tmp_path / "dump").glob("*_assign_layouts.txt"))
    assert dumps and "layout=nChw16c" in dumps[0].read_text().replace("'", "")


def test_no_blocked_value_leaves_a_kernel_on_onednns_reference_path() -> None:
    """A 3-channel image into a 16-channel conv chain: oneDNN has no fast kernel from an
    NHWC 3-channel image to a blocked output, so the loader must not ask for one (it was
    ~1000x slower, silently)."""
    w1, w2, w3 = _w(3, 3, 3, 16), _w(3, 3, 16, 16), _w(1, 1, 16, 32)

    def fn(x: tf.Tensor) -> tf.Tensor:
        a = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"))
        b = tf.nn.relu(tf.nn.conv2d(a, w2, 1, "SAME"))
        return tf.reduce_mean(tf.nn.conv2d(tf.nn.max_pool2d(b, 2, 2, "VALID"), w3, 1, "SAME"),
                              axis=[1, 2])

    g = trace(fn, tf.TensorSpec([None, 16, 16, 3], tf.float32, name="x"), batch=2)
    assert library.load() is not None, library.why_not()
    with load(compile_graph(g.graph_def, g.io_config), runtime="python") as model:
        program = model._idle.get()
        model._idle.put(program)
        impls = program.implementations()
        assert not [v for v in impls.values() if v.startswith("ref")], impls
        # the 16-channel part still runs blocked (NHWC where that would be reference code)
        assert bool(program.blocked) == _blocked_kernels()
        x = RNG.standard_normal((2, 16, 16, 3)).astype(np.float32)
        got = model.run({"x:0": x})
    for name, value in g.reference({"x:0": x}).items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)


def inverted_residual() -> object:
    """MobileNetV2's block between 24-channel bottlenecks: 1x1 expand 24 -> 48 (its input
    cannot be blocked), depthwise 3x3 on 48, 1x1 project 48 -> 24; then a second expand
    and depthwise whose input *is* blocked (a 16 -> 32 conv after a 16-channel one)."""
    we, wd, wp = _w(1, 1, 24, 48), _w(3, 3, 48, 1), _w(1, 1, 48, 24)
    w0, w1, wd2 = _w(3, 3, 24, 16), _w(1, 1, 16, 32), _w(3, 3, 32, 1)

    def fn(x: tf.Tensor) -> tuple:
        e = tf.nn.relu6(tf.nn.conv2d(x, we, 1, "SAME"))
        d = tf.nn.relu6(tf.nn.depthwise_conv2d(e, wd, [1, 1, 1, 1], "SAME"))
        p = tf.nn.conv2d(d, wp, 1, "SAME") + x
        a = tf.nn.relu(tf.nn.conv2d(p, w0, 1, "SAME"))
        b = tf.nn.relu6(tf.nn.conv2d(a, w1, 1, "SAME"))
        c = tf.nn.relu6(tf.nn.depthwise_conv2d(b, wd2, [1, 1, 1, 1], "SAME"))
        return tf.reduce_mean(p, axis=[1, 2]), tf.nn.max_pool2d(c, 2, 2, "VALID")

    return trace(fn, tf.TensorSpec([None, 10, 10, 24], tf.float32, name="x"), batch=2)


def test_depthwise_stays_nhwc_behind_an_nhwc_input_and_blocks_behind_a_blocked_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    g = inverted_residual()
    exe_bytes = compile_graph(g.graph_def, g.io_config)
    exe = from_bytes(exe_bytes)
    producer = {i.outputs[0]: i for p in exe.programs for i in p}
    dws = [i for p in exe.programs for i in p if i.kind == "depthwise_conv2d"]
    assert len(dws) == 2
    behind_blocked, behind_nhwc = sorted(dws, key=lambda i: exe.values[i.outputs[0]][0][-1])
    assert producer[behind_nhwc.inputs[0]].attrs.get("layout", "nhwc") == "nhwc"
    assert behind_nhwc.attrs.get("layout", "nhwc") == "nhwc"  # (was blocked: 2 reorders)
    assert producer[behind_blocked.inputs[0]].attrs.get("layout") == "nChw16c"
    assert behind_blocked.attrs.get("layout") == "nChw16c"
    x = RNG.standard_normal((2, 10, 10, 24)).astype(np.float32)
    want = g.reference({"x:0": x})
    assert library.load() is not None, library.why_not()
    for engine in ("numpy", "native"):
        monkeypatch.setenv("NEURONISH_ENGINE", engine)
        with load(exe_bytes) as model:
            got = model.run({"x:0": x})
        for key, w in want.items():
            np.testing.assert_allclose(got[key], w, rtol=1e-5, atol=1e-5 * np.max(np.abs(w)))


@pytest.mark.parametrize("side, starts_blocked", [(56, True), (58, False)])
def test_a_blocked_region_starts_only_at_an_nhwc_image_of_at_most_56x56(
        side: int, starts_blocked: bool) -> None:
    """conv 8 -> 16 (its 8-channel input cannot be blocked, so its output is NHWC), then
    1x1 16 -> 32 and two 1x1 32 -> 32: the second conv would start a blocked region by
    reordering the 16-channel image; above 56x56 it stays NHWC, and so does the third."""
    w1, w2, w3, w4 = _w(3, 3, 8, 16), _w(1, 1, 16, 32), _w(1, 1, 32, 32), _w(1, 1, 32, 32)

    def fn(x: tf.Tensor) -> tf.Tensor:
        a = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"))
        b = tf.nn.relu(tf.nn.conv2d(a, w2, 1, "SAME"))
        c = tf.nn.relu(tf.nn.conv2d(b, w3, 1, "SAME"))
        return tf.reduce_mean(tf.nn.conv2d(c, w4, 1, "SAME"), axis=[1, 2])

    g = trace(fn, tf.TensorSpec([None, side, side, 8], tf.float32, name="x"), batch=1)
    exe = from_bytes(compile_graph(g.graph_def, g.io_config))
    convs = [i for p in exe.programs for i in p if i.kind == "conv2d"]
    assert [i.attrs.get("layout", "nhwc") for i in convs[:2]] == \
        ["nhwc", "nChw16c" if starts_blocked else "nhwc"]
