"""A picture of the partition: the frozen graph, each node coloured by where it runs.

`placement` reads what the partitioner and the compiler decided (which `NeuronOp`
a node went into, or why it stays on TensorFlow); `write_graph` turns that into
two files: a self-contained HTML page (the graph drawn as SVG by the page's own
script, no network, no Graphviz needed) and a Graphviz DOT file alongside it.

In the page every `NeuronOp` starts collapsed to one box, so ResNet50's 867
nodes are a handful of boxes; a click on a box expands it (a click on one of its
nodes collapses it again), and the search field expands the cluster holding a
node by name.  The URL fragment does the same for scripts and links:
`graph.html#expand=all`, `#expand=NeuronOp_0,NeuronOp_1`, `#find=conv1/Conv2D`.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tensorflow.core.framework import graph_pb2

from .errors import SavedModelError
from .graph import control_refs, data_refs, producer
from .runtime.files import check_write_target, replace_atomically

TENSORFLOW = "TensorFlow"
_VIEWER = Path(__file__).with_name("graph_picture.js")


@dataclass(frozen=True)
class Where:
    """Where one node of the frozen graph runs."""

    device: str  # the NeuronOp's name, or TENSORFLOW
    reason: str = ""  # for TENSORFLOW: why the node is not on the device


def placement(graph_def: graph_pb2.GraphDef, compiled: Iterable[object],
              left_on_tensorflow: Mapping[str, object],
              excluded: Mapping[str, str] | None = None) -> dict[str, Where]:
    """node name -> `Where`, from the partition's results.

    `compiled` are the `Subgraph`s that became NeuronOps (their `name` and
    `node_names`), `left_on_tensorflow` is `Partition.left_on_tensorflow` (node ->
    why) and `excluded` the nodes the compiler rejected, with its reason (which
    is shown in full, as in the compile report)."""
    excluded = excluded or {}
    on_device = {}
    for sg in compiled:
        for name in sg.node_names:  # type: ignore[attr-defined]
            if name not in left_on_tensorflow:
                on_device[name] = sg.name  # type: ignore[attr-defined]
    where = {}
    for node in graph_def.node:
        if node.name in on_device:
            where[node.name] = Where(on_device[node.name])
        else:
            why = excluded.get(node.name) or left_on_tensorflow.get(node.name)
            where[node.name] = Where(TENSORFLOW, str(why) if why else
                                     "in a cluster whose compile failed")
    return where


def graph_data(graph_def: graph_pb2.GraphDef, where: Mapping[str, Where]) -> dict:
    """What the page draws: nodes (name, op, device, reason, data inputs, control
    inputs) and the clusters."""
    nodes = []
    for node in graph_def.node:
        w = where.get(node.name, Where(TENSORFLOW, "not placed"))
        data_in = {producer(i) for i in data_refs(node)} & where.keys()
        control = {producer(i) for i in control_refs(node)} & where.keys()
        nodes.append({"name": node.name, "op": node.op, "device": w.device,
                      "reason": w.reason, "inputs": sorted(data_in),
                      "controls": sorted(control - data_in)})
    clusters: dict[str, int] = {}
    for n in nodes:
        if n["device"] != TENSORFLOW:
            clusters[n["device"]] = clusters.get(n["device"], 0) + 1
    return {"nodes": nodes, "clusters": clusters}


def render_html(graph_def: graph_pb2.GraphDef, where: Mapping[str, Where],
                title: str = "partition") -> str:
    data = json.dumps(graph_data(graph_def, where), separators=(",", ":"))
    # Inside <script>, "</" could close the element early; "<\/" is the same JSON string.
    data = data.replace("</", "<\\/")
    return (_PAGE.replace("$TITLE", html.escape(title))
            .replace("$DATA", data).replace("$SCRIPT", _VIEWER.read_text()))


def render_dot(graph_def: graph_pb2.GraphDef, where: Mapping[str, Where]) -> str:
    """Graphviz DOT: one `cluster_` subgraph per NeuronOp, TF nodes grey with their reason."""
    data = graph_data(graph_def, where)
    colours = {c: _colour(i) for i, c in enumerate(data["clusters"])}
    lines = ["digraph partition {", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']
    for cluster in data["clusters"]:
        lines.append(f"  subgraph {_q('cluster_' + cluster)} {{")
        lines.append(f"    label={_q(cluster)}; color={_q(colours[cluster])};")
        for n in data["nodes"]:
            if n["device"] == cluster:
                lines.append(f"    {_q(n['name'])} [label={_q(n['op'])}, "
                             f"fillcolor={_q(colours[cluster])}, tooltip={_q(n['name'])}];")
        lines.append("  }")
    for n in data["nodes"]:
        if n["device"] == TENSORFLOW:
            lines.append(f"  {_q(n['name'])} [label={_q(n['op'] + ' (TF)')}, "
                         f'fillcolor="#d9d9d9", tooltip={_q(n["name"] + ": " + n["reason"])}];')
    for n in data["nodes"]:
        for i in n["inputs"]:
            lines.append(f"  {_q(i)} -> {_q(n['name'])};")
        for i in n["controls"]:
            lines.append(f"  {_q(i)} -> {_q(n['name'])} [style=dashed];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_graph(path: str | os.PathLike, graph_def: graph_pb2.GraphDef,
                where: Mapping[str, Where], title: str = "partition") -> tuple[Path, Path]:
    """Write the HTML page and the DOT file next to it (`x.html` and `x.dot`; given
    `x.dot`, the page is `x.html`), each atomically. Returns the two paths.

    Raises `SavedModelError` naming the file if it cannot be written."""
    given = Path(path)
    html_path = given.with_suffix(".html") if given.suffix == ".dot" else given
    dot_path = given.with_suffix(".dot")
    try:
        for target in (html_path, dot_path):  # both, before either is written
            check_write_target(target, "picture")
        _write_atomically(html_path, render_html(graph_def, where, title))
        _write_atomically(dot_path, render_dot(graph_def, where))
    except OSError as e:
        raise SavedModelError(f"cannot write the partition picture {e.filename or path}: "
                              f"{e.strerror or e}") from e
    return html_path, dot_path


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _colour(i: int) -> str:
    """Distinct light colours, one per NeuronOp (the page uses the same rule)."""
    hue = (i * 137.508) % 360  # golden angle: neighbours in the list differ most
    return _hsl_to_hex(hue, 0.55, 0.78)


def _hsl_to_hex(h: float, s: float, lightness: float) -> str:
    c = (1 - abs(2 * lightness - 1)) * s
    x = c * (1 - abs((h / 60) % 2 - 1))
    m = lightness - c / 2
    r, g, b = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][int(h // 60) % 6]
    return "#" + "".join(f"{round((v + m) * 255):02x}" for v in (r, g, b))


def _write_atomically(path: Path, text: str) -> None:
    # 0644: mkstemp makes it private; a picture is for sharing.
    replace_atomically(path, lambda f: f.write(text.encode("utf-8")), "picture", mode=0o644)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>$TITLE</title>
<style>
body { margin: 0; font: 13px Helvetica, Arial, sans-serif; display: flex; height: 100vh; }
#side { width: 330px; overflow: auto; padding: 8px 10px; border-right: 1px solid #ccc; }
#side h1 { font-size: 15px; margin: 4px 0 8px; }
#side input { width: 95%; }
#canvas { flex: 1; overflow: hidden; }
svg { width: 100%; height: 100%; cursor: grab; background: #fff; }
.legend div { margin: 2px 0; cursor: pointer; }
.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #888;
          vertical-align: middle; margin-right: 4px; }
.node rect { stroke: #555; stroke-width: 1; }
.node.cluster rect { stroke-width: 2.5; }
.node.selected rect { stroke: #d00; stroke-width: 3; }
.node text { font-size: 11px; pointer-events: none; }
.edge { fill: none; stroke: #999; stroke-width: 1; }
#details { white-space: pre-wrap; word-break: break-all; background: #f6f6f6; padding: 4px; }
</style></head>
<body>
<div id="side">
<h1>$TITLE</h1>
<div id="summary"></div>
<p><input id="search" placeholder="find a node or NeuronOp by name, Enter"
  list="names"><datalist id="names"></datalist></p>
<p><button id="expand-all">expand all</button> <button id="collapse-all">collapse all</button></p>
<div class="legend" id="legend"></div>
<h2 style="font-size:13px">selected</h2><div id="details">click a node</div>
</div>
<div id="canvas"><svg id="graph" xmlns="http://www.w3.org/2000/svg"></svg></div>
<script type="application/json" id="graph-data">$DATA</script>
<script>
$SCRIPT
</script>
</body></html>
"""
