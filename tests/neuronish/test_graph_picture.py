"""The partition picture: what `neuronish compile --graph` draws, checked in the page's
data, in the DOT file and, where Chromium is installed, as rendered by a real browser."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from tensorflow.core.framework import graph_pb2

import neuronish.saved_model
from models.cache import cached_saved_model
from neuronish.graph_picture import TENSORFLOW, graph_data, placement, render_html, write_graph

ROOT = Path(__file__).resolve().parents[2]


def _render_graph_module():
    spec = importlib.util.spec_from_loader("render_graph", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec((ROOT / "scripts" / "render-graph").read_text(), module.__dict__)
    return module


@dataclass
class FakeSubgraph:  # the two fields of partition.Subgraph the picture reads
    name: str
    node_names: tuple[str, ...]


def _graph(*nodes: tuple[str, str, list[str]]) -> graph_pb2.GraphDef:
    g = graph_pb2.GraphDef()
    for name, op, inputs in nodes:
        g.node.add(name=name, op=op, input=inputs)
    return g


def _page_data(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', page, re.S)
    assert found, "the page has no embedded graph data"
    return json.loads(found.group(1))


def test_placement_names_the_neuron_op_or_why_tensorflow() -> None:
    g = _graph(("x", "Placeholder", []), ("w", "Const", []), ("mm", "MatMul", ["x", "w"]),
               ("odd", "Cumsum", ["mm:0", "^w"]), ("w_copy", "Const", []),
               ("rejected", "Relu", ["odd"]))
    where = placement(g, [FakeSubgraph("neuron_op_0", ("w", "mm", "w_copy"))],
                      {"x": "graph input", "odd": "op type not supported", "w_copy": "also on TF",
                       "rejected": "excluded"},
                      excluded={"rejected": "neuronish-cc: Relu with int8 operands"})
    assert where["mm"].device == where["w"].device == "neuron_op_0"
    assert where["odd"].device == TENSORFLOW and where["odd"].reason == "op type not supported"
    assert where["w_copy"].device == TENSORFLOW  # the partition kept a copy on TF
    assert where["rejected"].reason == "neuronish-cc: Relu with int8 operands"  # compiler's own
    data = graph_data(g, where)
    assert data["clusters"] == {"neuron_op_0": 2}
    odd = next(n for n in data["nodes"] if n["name"] == "odd")
    assert (odd["inputs"], odd["controls"]) == (["mm"], ["w"])


def test_page_and_dot_are_self_contained_and_escape_names(tmp_path: Path) -> None:
    evil = "a</script><script>alert(1)</script>"
    g = _graph(("x", "Placeholder", []), (evil, "Relu", ["x"]),
               ('q"uote', "Relu", [evil, "^x"]))
    where = placement(g, [FakeSubgraph("neuron_op_0", (evil, 'q"uote'))], {"x": "graph input"})
    html_path, dot_path = write_graph(tmp_path / "p.dot", g, where)  # .dot given: page is .html
    assert html_path == tmp_path / "p.html" and dot_path.exists()
    page = html_path.read_text()
    assert "<script src" not in page and "http://" not in page.replace(
        "http://www.w3.org/2000/svg", "")  # nothing fetched from anywhere
    assert page.count("</script>") == 2  # the data and the viewer; the name did not close one
    assert {n["name"] for n in _page_data(page)["nodes"]} == {"x", evil, 'q"uote'}
    dot = dot_path.read_text()
    assert 'subgraph "cluster_neuron_op_0"' in dot and '"q\\"uote"' in dot
    assert dot.count("{") == dot.count("}")
    assert f'"x" -> "{evil}";' in dot
    assert '"x" -> "q\\"uote" [style=dashed];' in dot


def test_unwritable_picture_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    g = _graph(("x", "Placeholder", []))
    with pytest.raises(neuronish.saved_model.SavedModelError, match="partition picture"):
        write_graph(tmp_path / "file" / "p.html", g, placement(g, [], {"x": "input"}))


def test_a_picture_never_replaces_what_is_not_a_file(tmp_path: Path) -> None:
    """A FIFO where the DOT file goes: refused before the page is written (a rename would
    replace it, as it would a device)."""
    os.mkfifo(tmp_path / "p.dot")
    g = _graph(("x", "Placeholder", []))
    with pytest.raises(neuronish.saved_model.SavedModelError,
                       match=r"p\.dot: the picture would replace a FIFO"):
        write_graph(tmp_path / "p.html", g, placement(g, [], {"x": "input"}))
    assert sorted(os.listdir(tmp_path)) == ["p.dot"]
    assert stat.S_ISFIFO(os.stat(tmp_path / "p.dot").st_mode)


@pytest.fixture(scope="module")
def partly_compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("cumsum")
    report = neuronish.saved_model.compile(cached_saved_model("cnn_cumsum"), str(out / "model"),
                                           batch_size=2, graph=str(out / "graph.html"))
    return report, out / "graph.html"


def test_compile_draws_each_node_where_the_report_puts_it(partly_compiled) -> None:
    report, page = partly_compiled
    data = _page_data(page.read_text())
    by_name = {n["name"]: n for n in data["nodes"]}
    assert set(data["clusters"]) == {op["name"] for op in report["NeuronOps"]}
    cumsum = [n for n in data["nodes"] if n["op"] == "CumulativeLogsumexp"]
    assert len(cumsum) == 1 and cumsum[0]["device"] == TENSORFLOW
    assert "not supported" in cumsum[0]["reason"]
    # Every convolution is on the device, one before the scan and one after it.
    convs = [n for n in data["nodes"] if n["op"] == "Conv2D"]
    assert len({n["device"] for n in convs}) == 2 and TENSORFLOW not in {n["device"] for n in convs}
    assert all(n["reason"] for n in data["nodes"] if n["device"] == TENSORFLOW)
    placeholders = [n for n in data["nodes"] if n["op"] == "Placeholder"]
    assert placeholders and all(by_name[n["name"]]["device"] == TENSORFLOW for n in placeholders)
    assert page.with_suffix(".dot").exists()


def test_page_renders_in_headless_chromium(partly_compiled, tmp_path: Path) -> None:
    render_graph = _render_graph_module()
    if render_graph.browser() is None:
        if os.environ.get("NEURONISH_REQUIRE_BROWSER"):  # CI installs it: missing is a failure
            pytest.fail("chromium is not installed but NEURONISH_REQUIRE_BROWSER is set")
        pytest.skip("chromium is not installed (apt-get install -y chromium); the page's data "
                    "is checked by the other tests, its drawing is not")
    _, page = partly_compiled
    data = _page_data(page.read_text())
    on_tf = sum(n["device"] == TENSORFLOW for n in data["nodes"])
    collapsed = render_graph.render(page, screenshot=tmp_path / "shot.png")
    assert collapsed["drawn_nodes"] == on_tf + len(data["clusters"]) and not collapsed["expanded"]
    assert (tmp_path / "shot.png").stat().st_size > 10_000
    everything = render_graph.render(page, "expand=all")
    assert everything["drawn_nodes"] == len(data["nodes"])
    assert everything["expanded"] == sorted(data["clusters"])
    # Finding a node by name expands its cluster and only that one.
    conv = next(n for n in data["nodes"] if n["op"] == "Conv2D")
    found = render_graph.render(page, f"find={conv['name']}")
    assert found["expanded"] == [conv["device"]]
    assert found["drawn_nodes"] == on_tf + len(data["clusters"]) - 1 + data["clusters"][
        conv["device"]]


def test_render_html_title_is_escaped() -> None:
    g = _graph(("x", "Placeholder", []))
    page = render_html(g, placement(g, [], {"x": "input"}), title="<b>m</b>")
    assert "<title>&lt;b&gt;m&lt;/b&gt;</title>" in page
