"""Pass instruments: verifying, dumping, timing and disabling passes are hooks around
the pipeline, not code in the passes; `neuronish-cc --verbose` / `--disable-pass`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neuronish.cc.errors import VerificationError
from neuronish.cc.graphdef import parse_graph_def
from neuronish.cc.ioconfig import parse_io_config
from neuronish.cc.ir import TensorType, Value
from neuronish.cc.lower import lower
from neuronish.cc.pipeline import (
    DisablePasses,
    Dumper,
    Pass,
    Timer,
    build_pipeline,
    pass_names,
    run_pipeline,
)
from tests.graphs import conv_bn_relu
from tests.helpers import compile_and_run

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def traced():
    return conv_bn_relu()


def _lowered(traced):
    return lower(parse_graph_def(traced.graph_def), parse_io_config(traced.io_config))


def test_dumper_timer_and_disable_see_every_pass_in_order(traced, tmp_path: Path) -> None:
    passes = build_pipeline()
    timer, disable = Timer(), DisablePasses({"fuse_activation", "eliminate_dead_code"})
    graph = run_pipeline(_lowered(traced), passes, [Dumper(tmp_path), timer, disable])
    ran = [p.name for p in passes if p.name not in disable.names]
    assert [r.name for r in timer.records] == ran
    assert disable.skipped == ["eliminate_dead_code", "fuse_activation", "eliminate_dead_code"]
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        f"{i:03d}_{name}.txt" for i, name in enumerate(["lowered", *ran])]
    # Node counts chain from one pass to the next; folding shrinks the graph.
    for a, b in zip(timer.records, timer.records[1:]):
        assert a.nodes_after == b.nodes_before
    assert timer.records[-1].nodes_after == len(graph.nodes) < timer.records[0].nodes_before
    # With fuse_activation off, the relu is still an instruction of its own.
    assert len(graph.nodes) == len(run_pipeline(_lowered(traced), passes).nodes) + 1


def test_the_verifier_names_the_pass_that_broke_the_graph(traced) -> None:
    def mistype_first_output(graph):
        node = graph.nodes[0]
        node.outputs = [Value(TensorType((7, 7), node.outputs[0].dtype), producer=node)]
        return graph

    passes = [*build_pipeline()[:2], Pass("mistype_first_output", mistype_first_output)]
    with pytest.raises(VerificationError, match="after pass mistype_first_output"):
        run_pipeline(_lowered(traced), passes)


@pytest.mark.parametrize("name", pass_names())
def test_each_pass_can_be_disabled_and_the_numbers_stay_the_same(traced, name: str) -> None:
    x = np.random.default_rng(1).standard_normal((2, 8, 8, 3)).astype(np.float32)
    feeds = {next(iter(traced.io_config["inputs"])): x}
    full = compile_and_run(traced.graph_def, traced.io_config, feeds)
    without = compile_and_run(traced.graph_def, traced.io_config, feeds, disabled_passes=[name])
    for key, value in full.items():
        np.testing.assert_allclose(without[key], value, rtol=1e-5, atol=1e-5)


def test_cli_verbose_prints_each_pass_and_disable_pass(traced, tmp_path: Path) -> None:
    graph = tmp_path / "g.pb"
    graph.write_bytes(traced.graph_def)
    base = [str(BIN / "neuronish-cc"), "compile", str(graph), "--framework", "TENSORFLOW",
            "--io-config", json.dumps(traced.io_config), "--output", str(tmp_path / "g.neff")]
    r = subprocess.run([*base, "--verbose", "--disable-pass", "fold_scale_shift"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("pass ")]
    assert [line.split()[1] for line in lines] == [
        *[n.name for n in build_pipeline() if n.name != "fold_scale_shift"], "fold_scale_shift"]
    assert " ms " in lines[0] and "instructions" in lines[0] and lines[-1].endswith("disabled")
    bad = subprocess.run([*base, "--disable-pass", "fold_everything"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "fold_everything: no such pass" in bad.stderr
    assert "fuse_activation" in bad.stderr and not (tmp_path / "x.neff").exists()
