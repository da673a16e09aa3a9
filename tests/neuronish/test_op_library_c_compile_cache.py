"""Run-time compiles in a host without Python go through the compile cache
(neuronish/ops/neuron_op_compile_cache.h), the same one the Python host uses: a length one
process compiled is read from there by the next, C host or Python host, under the same key;
a damaged entry is compiled again, and a cache directory others can write is not used.

The compiler is the real neuronish-cc behind a wrapper that logs how it was called, so
"not compiled again" is what the compiler saw (only `--version`, which identifies it), and
every number is compared with TensorFlow on the original SavedModel."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tests.neuronish.test_op_library_c_shapes import (  # noqa: F401 (compiled: a fixture)
    _call,
    _close,
    _executables_run,
    compiled,
)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None,
                                reason="gcc and g++ are needed to build the op library and the "
                                       "C program")

COMPILER = str(Path(sys.executable).parent / "neuronish-cc")


@pytest.fixture(scope="module")
def model(compiled: dict[str, Any]) -> dict[str, Any]:  # noqa: F811 (the fixture)
    """test_op_library_c_shapes' free-length sequence model, compiled at batch 2."""
    return compiled


@pytest.fixture
def logged_compiler(tmp_path: Path) -> tuple[str, Path]:
    """A neuronish-cc that writes its first argument (`--version`, `compile`) to a log."""
    log, wrapper = tmp_path / "calls.log", tmp_path / "logged-cc"
    wrapper.write_text(f'#!/bin/sh\necho "$1" >> {log}\nexec {COMPILER} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), log


def _calls(log: Path) -> list[str]:
    calls = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return calls


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob("*.neff"))


def test_a_length_one_c_host_compiled_is_read_from_the_cache_by_the_next(
        model: dict[str, Any], tmp_path: Path, logged_compiler: tuple[str, Path],
        _fresh_compile_cache: Path) -> None:
    cc, log = logged_compiler
    label = "neuron_op_0@2x17x8"
    assert _executables_run(model, tmp_path, 2, 17, NEURONISH_CC=cc) == {label}
    assert _calls(log) == ["--version", "compile"]
    [entry] = _entries(_fresh_compile_cache)
    assert (_fresh_compile_cache / (entry[:-5] + ".sum")).stat().st_size == 72
    assert stat.S_IMODE(_fresh_compile_cache.stat().st_mode) == 0o700
    # A new process: the compiler is asked who it is, and nothing is compiled.
    assert _executables_run(model, tmp_path, 2, 17, NEURONISH_CC=cc) == {label}
    assert _calls(log) == ["--version"]
    # Another batch of that length is another executable (batch 3 -> 4), compiled once.
    assert _executables_run(model, tmp_path, 3, 17, NEURONISH_CC=cc) == {"neuron_op_0@4x17x8"}
    assert _calls(log) == ["--version", "compile"]
    assert len(_entries(_fresh_compile_cache)) == 2
    # Other compiler flags are another key: compiled again.
    assert _executables_run(model, tmp_path, 2, 17, NEURONISH_CC=cc,
                            NEURONISH_CC_FLAGS="--auto-cast none") == {label}
    assert _calls(log) == ["--version", "compile"]


def test_the_python_and_c_hosts_share_entries(
        model: dict[str, Any], tmp_path: Path, logged_compiler: tuple[str, Path],
        monkeypatch: pytest.MonkeyPatch, _fresh_compile_cache: Path) -> None:
    """The two hosts compute the same key (subgraph, io-config, flags, the compiler's
    identity): what one compiled, the other reads."""
    cc, log = logged_compiler
    monkeypatch.setenv("NEURONISH_CC", cc)
    monkeypatch.setenv("NEURONISH_FALLBACK", "0")
    served = tf.saved_model.load(str(model["out"])).signatures["serving_default"]

    def python_host(batch: int, length: int) -> None:
        x = np.random.default_rng(length).standard_normal((batch, length, 8)).astype(np.float32)
        _close(served(x=tf.constant(x))["y"].numpy(), model["tf"](x=tf.constant(x))["y"].numpy())

    python_host(2, 19)  # the Python host compiles length 19...
    assert _calls(log) == ["--version", "compile"]
    assert _executables_run(model, tmp_path, 2, 19, NEURONISH_CC=cc) == {"neuron_op_0@2x19x8"}
    assert _calls(log) == ["--version"]  # ...and the C host reads it
    assert _executables_run(model, tmp_path, 2, 21, NEURONISH_CC=cc) == {"neuron_op_0@2x21x8"}
    assert _calls(log) == ["--version", "compile"]  # the C host compiles length 21...
    python_host(2, 21)
    assert _calls(log) == ["--version"]  # ...and the Python host reads it
    assert len(_entries(_fresh_compile_cache)) == 2


def test_a_damaged_entry_is_compiled_again(
        model: dict[str, Any], tmp_path: Path, logged_compiler: tuple[str, Path],
        _fresh_compile_cache: Path) -> None:
    cc, log = logged_compiler
    assert _executables_run(model, tmp_path, 2, 23, NEURONISH_CC=cc) == {"neuron_op_0@2x23x8"}
    [entry] = _entries(_fresh_compile_cache)
    path = _fresh_compile_cache / entry
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # (same size: only the record can tell)
    path.write_bytes(bytes(data))
    _calls(log)
    r, got, want = _call(model, tmp_path, 2, 23, NEURONISH_CC=cc, TF_CPP_MIN_LOG_LEVEL="1")
    assert r.returncode == 0, r.stderr[-3000:]
    _close(got, want)
    assert f"compile cache: entry {path} is damaged or untrusted (its record or checksum " \
           "does not match); removed it and compiling the subgraph again" in r.stderr, \
        r.stderr[-3000:]
    assert _calls(log) == ["--version", "compile"]
    assert path.read_bytes() != bytes(data)  # (stored again, whole)


def test_a_cache_others_can_write_is_not_used(
        model: dict[str, Any], tmp_path: Path, logged_compiler: tuple[str, Path]) -> None:
    cc, log = logged_compiler
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    r, got, want = _call(model, tmp_path, 2, 25, NEURONISH_CC=cc, TF_CPP_MIN_LOG_LEVEL="1",
                         NEURONISH_COMPILE_CACHE=str(shared))
    assert r.returncode == 0, r.stderr[-3000:]
    _close(got, want)
    assert f"compile cache not used: the directory {shared} has mode 0777; others may write " \
           "it; set NEURONISH_COMPILE_CACHE to a directory only you can write" in r.stderr, \
        r.stderr[-3000:]
    assert _calls(log) == ["compile"] and not list(shared.iterdir())
    # A size nobody can read is named, and the compile goes on without the cache.
    r, got, want = _call(model, tmp_path, 2, 25, NEURONISH_CC=cc, TF_CPP_MIN_LOG_LEVEL="1",
                         NEURONISH_COMPILE_CACHE_SIZE="lots")
    assert r.returncode == 0 and "NEURONISH_COMPILE_CACHE_SIZE='lots': expected a byte count" \
        in r.stderr, r.stderr[-3000:]
    _close(got, want)


def test_the_hosts_share_entries_with_the_default_compiler_command(
        model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        _fresh_compile_cache: Path) -> None:
    """NEURONISH_CC unset: the Python host runs the venv's neuronish-cc by its path, the C
    host `neuronish-cc` found on PATH; the key names the program by its real path, so the
    two still share the entry (one entry after both hosts ran the length)."""
    monkeypatch.delenv("NEURONISH_CC", raising=False)
    monkeypatch.setenv("NEURONISH_FALLBACK", "0")
    served = tf.saved_model.load(str(model["out"])).signatures["serving_default"]
    x = np.random.default_rng(27).standard_normal((2, 27, 8)).astype(np.float32)
    _close(served(x=tf.constant(x))["y"].numpy(), model["tf"](x=tf.constant(x))["y"].numpy())
    assert len(_entries(_fresh_compile_cache)) == 1
    venv_bin = str(Path(sys.executable).parent)
    assert _executables_run(model, tmp_path, 2, 27, PATH=f"{venv_bin}:/usr/bin:/bin") == \
        {"neuron_op_0@2x27x8"}
    assert len(_entries(_fresh_compile_cache)) == 1, "the C host keyed the compiler otherwise"


def test_a_subgraph_with_debug_info_is_keyed_alike_by_both_hosts(
        model: dict[str, Any], tmp_path: Path, logged_compiler: tuple[str, Path],
        monkeypatch: pytest.MonkeyPatch, _fresh_compile_cache: Path) -> None:
    """A subgraph whose nodes carry experimental_debug_info (the traced function's name,
    which differs between two loads of one model) is keyed without it: each host parses
    it, drops the info and serializes deterministically (C++ protobuf against Python's),
    and the two keys agree."""
    from tensorflow.core.framework import graph_pb2

    from tests.neuronish.test_op_library_c import _set_neuron_op_attr

    cc, log = logged_compiler
    out = tmp_path / "with-debug-info"
    shutil.copytree(model["out"], out)

    def add_debug_info(attrs: Any) -> None:  # noqa: ANN401 (a protobuf map)
        graph = graph_pb2.GraphDef.FromString(attrs["graph_def"].s)
        for k, node in enumerate(graph.node):
            node.experimental_debug_info.original_node_names.append(f"orig_{k}")
            node.experimental_debug_info.original_func_names.append("__inference_serve_293")
        attrs["graph_def"].s = graph.SerializeToString()

    assert _set_neuron_op_attr(out, add_debug_info) == 1
    monkeypatch.setenv("NEURONISH_CC", cc)
    monkeypatch.setenv("NEURONISH_FALLBACK", "0")
    served = tf.saved_model.load(str(out)).signatures["serving_default"]
    x = np.random.default_rng(29).standard_normal((2, 29, 8)).astype(np.float32)
    _close(served(x=tf.constant(x))["y"].numpy(), model["tf"](x=tf.constant(x))["y"].numpy())
    assert _calls(log) == ["--version", "compile"]
    assert _executables_run({**model, "out": out}, tmp_path, 2, 29, NEURONISH_CC=cc) == \
        {"neuron_op_0@2x29x8"}
    assert _calls(log) == ["--version"], "the C host keyed the subgraph otherwise"


def test_the_cache_keeps_to_its_size_least_recently_used_out(
        model: dict[str, Any], tmp_path: Path, logged_compiler: tuple[str, Path],
        _fresh_compile_cache: Path) -> None:
    """NEURONISH_COMPILE_CACHE_SIZE holding two entries: a third evicts the least recently
    used, and a hit makes an entry the most recently used."""
    cc, log = logged_compiler
    assert _executables_run(model, tmp_path, 2, 31, NEURONISH_CC=cc) == {"neuron_op_0@2x31x8"}
    [first] = _entries(_fresh_compile_cache)
    one = (_fresh_compile_cache / first).stat().st_size + 72
    size = str(2 * one + one // 2)  # (the lengths' executables differ by a few bytes at most)
    assert _executables_run(model, tmp_path, 2, 33, NEURONISH_CC=cc,
                            NEURONISH_COMPILE_CACHE_SIZE=size) == {"neuron_op_0@2x33x8"}
    [second] = [e for e in _entries(_fresh_compile_cache) if e != first]
    time.sleep(0.05)  # (mtimes in order)
    # A hit on the first: now the second is the least recently used.
    assert _executables_run(model, tmp_path, 2, 31, NEURONISH_CC=cc,
                            NEURONISH_COMPILE_CACHE_SIZE=size) == {"neuron_op_0@2x31x8"}
    _calls(log)
    # (and a temporary file a dead writer left an hour ago goes with the next store)
    dead = _fresh_compile_cache / ".tmp-dead"
    dead.write_bytes(bytes(100))
    os.utime(dead, (time.time() - 7200,) * 2)
    assert _executables_run(model, tmp_path, 2, 35, NEURONISH_CC=cc,
                            NEURONISH_COMPILE_CACHE_SIZE=size) == {"neuron_op_0@2x35x8"}
    assert not dead.exists()
    assert _calls(log) == ["--version", "compile"]
    left = _entries(_fresh_compile_cache)
    assert len(left) == 2 and first in left and second not in left, (first, second, left)
    assert not (_fresh_compile_cache / (second[:-5] + ".sum")).exists()


def test_both_hosts_key_a_calibration_file_by_its_contents(
        model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        _fresh_compile_cache: Path) -> None:
    """A `--calibration` flag's file is in the key by its contents on both hosts
    (compile_cache._flags_for_key, neuron_op_compile_cache.h FlagsForKey): what one host
    compiled with it, the other reads; the same bytes under another path are the same key,
    other bytes another. (The wrapper drops the flag: only the keys are under test.)"""
    log, cc = tmp_path / "calls.log", tmp_path / "flag-dropping-cc"
    cc.write_text(f'#!/bin/sh\necho "$1" >> {log}\nfor a; do shift; case "$a" in '
                  f'--calibration=*) ;; *) set -- "$@" "$a";; esac; done\n'
                  f'exec {COMPILER} "$@"\n')
    cc.chmod(0o755)
    first, same, other = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"
    first.write_bytes(b"calibration set 1")
    same.write_bytes(b"calibration set 1")
    other.write_bytes(b"calibration set 2")
    monkeypatch.setenv("NEURONISH_CC", str(cc))
    monkeypatch.setenv("NEURONISH_FALLBACK", "0")
    monkeypatch.setenv("NEURONISH_CC_FLAGS", f"--calibration={first}")
    served = tf.saved_model.load(str(model["out"])).signatures["serving_default"]
    x = np.random.default_rng(23).standard_normal((2, 23, 8)).astype(np.float32)
    _close(served(x=tf.constant(x))["y"].numpy(), model["tf"](x=tf.constant(x))["y"].numpy())
    assert _calls(log) == ["--version", "compile"]  # the Python host compiled length 23
    label = "neuron_op_0@2x23x8"
    assert _executables_run(model, tmp_path, 2, 23, NEURONISH_CC=str(cc),
                            NEURONISH_CC_FLAGS=f"--calibration={same}") == {label}
    assert _calls(log) == ["--version"]  # the C host: the same bytes elsewhere, a hit
    assert _executables_run(model, tmp_path, 2, 23, NEURONISH_CC=str(cc),
                            NEURONISH_CC_FLAGS=f"--calibration={other}") == {label}
    assert _calls(log) == ["--version", "compile"]  # other bytes: another key
