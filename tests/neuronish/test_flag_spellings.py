"""A flag is taken only as spelled: argparse's prefix abbreviations let
`--outp DIR` and `--workd DIR` in `compiler_args` or `$NEURONISH_CC_FLAGS` reach the
driver-owned `--output`/`--workdir` (writing outside the job folder) while the compile
exited 0 with the subgraph silently left on TensorFlow. Every parser here refuses
abbreviations; the driver-owned flags are refused in every spelling before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import neuronish.saved_model
from neuronish.cc_flags import CompilerFlagsError, check_compiler_flags, env_compiler_flags
from neuronish.errors import NeuronishError
from neuronish.serving.server import FlagError, parse_flags
from tests.graphs import dense_relu
from tests.neuronish.test_compile_recovery import small_model

DRIVER_FLAG_SPELLINGS = ["--outp", "--workd=/tmp", "--io-conf", "--framew", "--output=x",
                         "-output", "--OUTPUT", "--io_config", "---workdir", "--o"]


@pytest.mark.parametrize("flag", DRIVER_FLAG_SPELLINGS)
def test_driver_flags_are_refused_in_any_spelling(flag: str) -> None:
    with pytest.raises(CompilerFlagsError, match="set by neuronish"):
        check_compiler_flags([flag, "/tmp/elsewhere"], "compiler_args")


def test_other_flags_pass() -> None:
    flags = ["--auto-cast", "matmult", "--verbose=1", "--device-model", "d.json"]
    assert check_compiler_flags(flags, "compiler_args") == tuple(flags)


@pytest.mark.parametrize("variable", ["NEURONISH_CC_FLAGS", "NEURON_CC_FLAGS"])
def test_environment_abbreviations_are_refused(monkeypatch: pytest.MonkeyPatch,
                                               variable: str) -> None:
    monkeypatch.setenv(variable, "--workd /tmp/elsewhere")
    with pytest.raises(CompilerFlagsError, match=rf"\${variable}: '--workd'"):
        env_compiler_flags()


@pytest.mark.parametrize("abbreviation", [["--outp", "OUT"], ["--workd", "W"],
                                          ["--io-conf", "IO"], ["--framew", "TENSORFLOW"],
                                          ["--auto", "all"]])
def test_the_compiler_takes_no_abbreviations(tmp_path: Path, abbreviation: list[str]) -> None:
    g = dense_relu(batch=4)
    graph, io = tmp_path / "g.pb", g.io_config
    graph.write_bytes(g.graph_def)
    full = {"--outp": "--output", "--workd": "--workdir", "--io-conf": "--io-config",
            "--framew": "--framework", "--auto": "--auto-cast"}
    args = {"--framework": "TENSORFLOW", "--io-config": json.dumps(io),
            "--output": str(tmp_path / "out.neff")}
    args.pop(full[abbreviation[0]], None)
    value = abbreviation[1]
    if value in ("OUT", "W"):
        value = str(tmp_path / "elsewhere")
    elif value == "IO":
        value = json.dumps(io)
    argv = [str(Path(sys.executable).parent / "neuronish-cc"), "compile", str(graph),
            *[x for kv in args.items() for x in kv], abbreviation[0], value]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "unrecognized arguments" in proc.stderr or "required" in proc.stderr, proc.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_compile_refuses_an_abbreviated_driver_flag_before_work(tmp_path: Path) -> None:
    src = small_model(tmp_path / "src")
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(CompilerFlagsError, match="'--outp' is set by neuronish"):
        neuronish.saved_model.compile(src, str(tmp_path / "out"),
                                      compiler_args=f"--outp {elsewhere}")
    assert not elsewhere.exists() and not (tmp_path / "out").exists()


def test_a_subgraph_the_compiler_refused_for_bad_usage_fails_the_compile(tmp_path: Path) -> None:
    # An unknown flag reaches the compiler, which exits 2: an error, not a TF fallback.
    src = small_model(tmp_path / "src")
    with pytest.raises(NeuronishError, match=r"bad usage: check the job's compiler_args"):
        neuronish.saved_model.compile(src, str(tmp_path / "out"), compiler_args="--auto-cas all")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["ls", "--jso"], ["compile", "--compiler-work", "w", "a", "b"],
                                  ["run", "x.neff", "--output-d", "o"]])
def test_the_neuronish_cli_takes_no_abbreviations(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "neuronish", *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "unrecognized arguments" in proc.stderr or "required: --output-dir" in proc.stderr


@pytest.mark.parametrize("flag", ["--model_nam=m", "--rest_api_po=8501", "--port8500",
                                  "--enable_batch"])
def test_the_model_server_takes_no_abbreviations(flag: str) -> None:
    with pytest.raises(FlagError, match="unknown command line flag"):
        parse_flags([flag])
