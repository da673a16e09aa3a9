"""tensorflow-neuron 1.x's `saved_model.compile` call forms run on neuronish unchanged, or get
a message saying what to use instead (neuronish/tfn_compat.py, docs/saved-model-compile.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import neuronish.saved_model
from neuronish.cc_flags import env_compiler_flags
from neuronish.errors import CompileWarning, NeuronishError, SavedModelError
from neuronish.runtime.executable import from_bytes
from neuronish.tfn_compat import ArgumentError, compiler_args_tuple, names_tuple
from tests.neuronish.test_compile_options import neuron_op_executables
from tests.neuronish.test_compile_recovery import small_model
from tests.neuronish.test_saved_model_compile import assert_matches_original

compile_ = neuronish.saved_model.compile


def compiler_options(out: Path) -> dict:
    (exe,) = neuron_op_executables(out)
    return from_bytes(exe).compiler["options"]


def test_a_compiler_args_string_is_split_as_a_shell_would(tmp_path: Path) -> None:
    # tensorflow-neuron's docs pass one string; it was split into characters ("- - a u t o").
    src = small_model(tmp_path / "src")
    out = tmp_path / "out"
    compile_(src, str(out), compiler_args="--auto-cast all  --auto-cast-type 'fp16'")
    options = compiler_options(out)
    assert options["auto_cast"] == "all" and options["auto_cast_type"] == "fp16"
    assert compiler_args_tuple(None) == ()
    with pytest.raises(ArgumentError, match="cannot be split"):
        compiler_args_tuple("--auto-cast 'none")


def test_tensorflow_neuron_none_defaults_and_positional_order(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    out = tmp_path / "out"
    # model_dir, new_model_dir, tags, model_feed_dict, minimum_segment_size, op_whitelist,
    # no_fuse_ops, force_fuse_ops: tensorflow-neuron 1.x's order and its None defaults.
    report = compile_(src, str(out), "serve", None, 2, None, None, None, compiler_args=None,
                      compiler_workdir=None)
    assert report["OnNeuronRatio"] == 1.0
    assert_matches_original(src, out, tmp_path)
    # A positional no_fuse_ops keeps Relu on TensorFlow; one string is one name.
    report = compile_(src, str(tmp_path / "b"), ["serve"], None, 1, None, "Relu")
    assert "listed in no_fuse_ops" in report["OnTensorFlow"]["Relu"]["reasons"]
    assert names_tuple("Relu", "no_fuse_ops") == ("Relu",)


def test_op_whitelist_keeps_other_op_types_on_tensorflow(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    with pytest.warns(CompileWarning, match="op_whitelist: only these op types"):
        report = compile_(src, str(tmp_path / "a"), op_whitelist=["MatMul", "Relu"])
    assert report["OnNeuronRatio"] == 1.0
    with pytest.warns(CompileWarning, match="op_whitelist"):
        report = compile_(src, str(tmp_path / "b"), supported_op_types=["MatMul"],
                          minimum_segment_size=1)
    assert "Relu" in report["OnTensorFlow"]
    assert {op for n in report["NeuronOps"] for op in n["op_counts"]} == {"MatMul"}


def test_tensorflow_neuron_only_arguments(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    out = tmp_path / "out"
    with pytest.warns(CompileWarning) as caught:
        report = compile_(src, str(out), compiler_verbose=1, protected_op_names=["Relu"],
                          convert_constants_to_variables=True, minimum_segment_size=1)
    messages = " | ".join(str(w.message) for w in caught)
    assert "protected_op_names" in messages and "stay on TensorFlow" in messages
    assert "convert_constants_to_variables has no effect" in messages
    assert "Relu" in report["OnTensorFlow"]  # protected: kept as a node of the graph
    with pytest.raises(ArgumentError, match=r"amp_pass .*--auto-cast"):
        compile_(src, str(tmp_path / "x"), amp_pass=True)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'no_such_arg'.*"
                                        r"op_whitelist"):
        compile_(src, str(tmp_path / "x"), no_such_arg=1)
    assert not (tmp_path / "x").exists()


def test_neuron_cc_flags_is_honoured_before_neuronish_cc_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_CC_FLAGS", "--auto-cast all --auto-cast-type fp16")
    monkeypatch.setenv("NEURONISH_CC_FLAGS", "--auto-cast-type bf16")
    assert env_compiler_flags() == ("--auto-cast", "all", "--auto-cast-type", "fp16",
                                    "--auto-cast-type", "bf16")
    src = small_model(tmp_path / "src")
    out = tmp_path / "out"
    compile_(src, str(out))
    options = compiler_options(out)
    assert options["auto_cast"] == "all" and options["auto_cast_type"] == "bf16"
    monkeypatch.setenv("NEURON_CC_FLAGS", "--workdir /tmp")
    with pytest.raises(SavedModelError, match=r"\$NEURON_CC_FLAGS: '--workdir'"):
        env_compiler_flags()


def test_a_failed_subgraph_message_names_compiler_workdir(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    with pytest.raises(NeuronishError, match=r"compiler_workdir=DIR") as error:
        compile_(src, str(tmp_path / "out"), compiler_args="--no-such-flag")
    assert " workdir=" not in str(error.value)  # the argument is compiler_workdir


KERAS_LAYER_MODULE = '''
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="dropin_test")
class ScaledGelu(keras.layers.Layer):
    def __init__(self, scale=2.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def call(self, x):
        return tf.nn.gelu(x) * self.scale

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}
'''


def test_a_keras_file_with_a_custom_layer_compiles_with_import(tmp_path: Path) -> None:
    (tmp_path / "dropin_layers.py").write_text(KERAS_LAYER_MODULE)
    build = ("import keras, dropin_layers\n"
             "m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),"
             " dropin_layers.ScaledGelu(3.0)])\n"
             "m.save('model.keras')\n")
    subprocess.run([sys.executable, "-c", build], cwd=tmp_path, check=True)
    cli = [sys.executable, "-m", "neuronish.cli", "compile", "model.keras", "out"]
    refused = subprocess.run(cli, cwd=tmp_path, capture_output=True, text=True)
    assert refused.returncode == 1 and "ScaledGelu" in refused.stderr, refused.stderr
    done = subprocess.run([*cli, "--import", "dropin_layers"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "saved_model.pb").exists()
    missing = subprocess.run([*cli, "--import", "no_such_module_here"], cwd=tmp_path,
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "cannot import 'no_such_module_here'" in missing.stderr
    # The Python API takes the .keras path and the module too.
    script = ("import neuronish.saved_model as s\n"
              "r = s.compile('model.keras', 'out2', import_modules=['dropin_layers'])\n"
              "print(r['model_dir'], r['OnNeuronRatio'] > 0)\n")
    api = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                         text=True)
    assert api.returncode == 0, api.stderr
    assert api.stdout.split()[-2:] == ["model.keras", "True"]


def test_ctrl_c_during_a_compile_is_one_line_and_exit_130(tmp_path: Path) -> None:
    import os
    import signal
    import time

    from tests.neuronish.test_compile_recovery import wrapper_compiler

    src = small_model(tmp_path / "src")
    marker = tmp_path / "compiling"
    # The compiler of the (only) subgraph says it started, then hangs: Ctrl-C lands
    # while a compile is really in flight.
    compiler = wrapper_compiler(tmp_path, f"touch {marker}; sleep 120")
    # As under a terminal, SIGINT is the interpreter's KeyboardInterrupt: a test run
    # started in the background (`cmd &` in a script) passes SIGINT down ignored, and
    # Python then leaves it ignored, so the signal below would do nothing.
    cli = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
           "from neuronish.cli import main; sys.exit(main())")
    proc = subprocess.Popen([sys.executable, "-c", cli, "compile", src,
                             str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NEURONISH_CC": compiler,
                                 "NEURONISH_COMPILE_CACHE": "off"})
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    lines = [x for x in err.splitlines() if x.strip() and "neuronish" in x]
    assert lines[-1] == "neuronish: interrupted", err[-3000:]
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no scratch


def test_compile_writes_tf_servings_warmup_file_from_the_examples(tmp_path: Path) -> None:
    import numpy as np

    from neuronish.serving.servable import load_servable, warm_up

    src = small_model(tmp_path / "src")
    out = tmp_path / "out"
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    compile_(src, str(out), model_feed_dict={"x": x}, warmup_requests=True)
    assert (out / "assets.extra" / "tf_serving_warmup_requests").is_file()
    servable = load_servable("m", 1, str(out), ["serve"], warmup=False)
    assert warm_up(servable) == 1  # the record replays on the compiled model
    with pytest.raises(SavedModelError, match="pass example inputs in model_feed_dict"):
        compile_(src, str(tmp_path / "b"), warmup_requests=True)


def test_the_cli_writes_the_warmup_file_from_example_files(tmp_path: Path) -> None:
    import numpy as np

    src = small_model(tmp_path / "src")
    np.save(tmp_path / "x.npy", np.ones((3, 8), np.float32))
    cli = [sys.executable, "-m", "neuronish.cli", "compile", src, str(tmp_path / "out"),
           "--example", f"x={tmp_path / 'x.npy'}", "--warmup-requests"]
    done = subprocess.run(cli, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "assets.extra" / "tf_serving_warmup_requests").is_file()
    assert "[3, 8]" in done.stdout or "3, 8" in done.stdout  # the example's shape compiled
    bad = subprocess.run([*cli[:6], "--example", "x=/nonexistent.npy"], capture_output=True,
                         text=True)
    assert bad.returncode == 1 and "--example x: cannot read /nonexistent.npy" in bad.stderr
