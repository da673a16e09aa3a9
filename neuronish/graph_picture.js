// The partition viewer (inlined by neuronish/graph_picture.py): a layered layout of
// the graph with every collapsed NeuronOp drawn as one box.  No libraries: the page
// must open offline and from a file.
"use strict";
const DATA = JSON.parse(document.getElementById("graph-data").textContent);
const TF = "TensorFlow";
const SVG_NS = "http://www.w3.org/2000/svg";
const BOX_H = 26, ROW_GAP = 46, COL_GAP = 14, CHAR_W = 6.4, MAX_CHARS = 34;
const byName = new Map(DATA.nodes.map(n => [n.name, n]));
const clusterNames = Object.keys(DATA.clusters);
const colour = new Map(clusterNames.map((c, i) => [c, hslHex((i * 137.508) % 360, 0.55, 0.78)]));
const expanded = new Set();
let selected = null;
let view = { x: 0, y: 0, w: 100, h: 100 };
let positions = new Map();

function hslHex(h, s, l) {  // the same colours as render_dot
  const c = (1 - Math.abs(2 * l - 1)) * s, x = c * (1 - Math.abs((h / 60) % 2 - 1)), m = l - c / 2;
  const rgb = [[c, x, 0], [x, c, 0], [0, c, x], [0, x, c], [x, 0, c], [c, 0, x]][Math.floor(h / 60) % 6];
  return "#" + rgb.map(v => Math.round((v + m) * 255).toString(16).padStart(2, "0")).join("");
}

// What is drawn: one item per TF node or expanded-cluster node, one per collapsed cluster.
function visibleGraph() {
  const rep = n => (n.device !== TF && !expanded.has(n.device)) ? "cluster:" + n.device : n.name;
  const items = new Map(), edges = new Map();
  for (const n of DATA.nodes) {
    const id = rep(n);
    if (!items.has(id)) {
      items.set(id, id.startsWith("cluster:")
        ? { id, cluster: n.device, label: `${n.device} (${DATA.clusters[n.device]} nodes)`, preds: new Set(), succs: new Set() }
        : { id, node: n, label: n.op + "  " + n.name.split("/").slice(-2).join("/"), preds: new Set(), succs: new Set() });
    }
  }
  for (const n of DATA.nodes) {
    const to = rep(n);
    for (const [list, control] of [[n.inputs, false], [n.controls || [], true]]) {
      for (const i of list) {
        const from = rep(byName.get(i)), key = from + "\u0000" + to;
        if (from === to) continue;
        items.get(to).preds.add(from); items.get(from).succs.add(to);
        // An edge is drawn dashed when only control dependencies make it.
        if (!edges.has(key) || !control) edges.set(key, [from, to, control]);
      }
    }
  }
  return { items, edges: [...edges.values()] };
}

// Layers: a node sits one row below its lowest input.  Cycles (TF1 loops) are broken
// by taking the waiting node with the fewest unplaced inputs.
function assignLayers(items) {
  const waiting = new Map([...items.values()].map(it => [it.id, it.preds.size]));
  const order = [], ready = [...items.values()].filter(it => it.preds.size === 0).map(it => it.id);
  while (order.length < items.size) {
    if (!ready.length) {
      let best = null;
      for (const [id, k] of waiting) if (best === null || k < waiting.get(best)) best = id;
      ready.push(best);
    }
    const id = ready.pop();
    if (!waiting.has(id)) continue;
    waiting.delete(id); order.push(id);
    for (const s of items.get(id).succs) {
      if (!waiting.has(s)) continue;
      waiting.set(s, waiting.get(s) - 1);
      if (waiting.get(s) === 0) ready.push(s);
    }
  }
  const layer = new Map();
  for (const id of order) {
    let l = 0;
    for (const p of items.get(id).preds) if (layer.has(p)) l = Math.max(l, layer.get(p) + 1);
    layer.set(id, l);
  }
  // Then every node moves down to just above its first consumer, so side inputs
  // (weights and their reshapes) sit beside the layer that reads them.
  for (const id of [...order].reverse()) {
    let l = Infinity;
    for (const s of items.get(id).succs) l = Math.min(l, layer.get(s) - 1);
    if (l !== Infinity && l > layer.get(id)) layer.set(id, l);
  }
  return layer;
}

function layout() {
  const { items, edges } = visibleGraph();
  const layer = assignLayers(items);
  const rows = [];
  for (const [id, l] of layer) (rows[l] = rows[l] || []).push(id);
  const rowsFilled = rows.map(r => r || []);
  const pos = new Map();
  rowsFilled.forEach(r => r.forEach((id, i) => pos.set(id, i)));
  // Barycentre sweeps: order each row by the mean position of its neighbours.
  for (let sweep = 0; sweep < 6; sweep++) {
    const down = sweep % 2 === 0;
    const seq = down ? rowsFilled : [...rowsFilled].reverse();
    for (const row of seq) {
      const key = new Map(row.map(id => {
        const nb = [...(down ? items.get(id).preds : items.get(id).succs)];
        return [id, nb.length ? nb.reduce((a, b) => a + pos.get(b), 0) / nb.length : pos.get(id)];
      }));
      row.sort((a, b) => key.get(a) - key.get(b));
      row.forEach((id, i) => pos.set(id, i));
    }
  }
  positions = new Map();
  let width = 0;
  const widthOf = id => Math.min(items.get(id).label.length, MAX_CHARS) * CHAR_W + 16;
  rowsFilled.forEach(row => { width = Math.max(width, row.reduce((a, id) => a + widthOf(id) + COL_GAP, 0)); });
  rowsFilled.forEach((row, l) => {
    let x = (width - row.reduce((a, id) => a + widthOf(id) + COL_GAP, 0)) / 2;
    for (const id of row) {
      positions.set(id, { x, y: l * (BOX_H + ROW_GAP), w: widthOf(id) });
      x += widthOf(id) + COL_GAP;
    }
  });
  return { items, edges, width, height: rowsFilled.length * (BOX_H + ROW_GAP) };
}

function el(tag, attrs, parent) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}

function draw(fit) {
  const svg = document.getElementById("graph");
  const { items, edges, width, height } = layout();
  svg.textContent = "";
  const root = el("g", {}, svg);
  for (const [a, b, control] of edges) {
    const p = positions.get(a), q = positions.get(b);
    const x1 = p.x + p.w / 2, y1 = p.y + BOX_H, x2 = q.x + q.w / 2, y2 = q.y, my = (y1 + y2) / 2;
    el("path", { class: "edge", d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}`,
                 "stroke-dasharray": control ? "3 3" : "" }, root);
  }
  for (const it of items.values()) {
    const p = positions.get(it.id);
    const device = it.cluster || it.node.device;
    const g = el("g", { class: "node" + (it.cluster ? " cluster" : "") + (selected === it.id ? " selected" : ""),
                        "data-id": it.id, "data-device": device, transform: `translate(${p.x},${p.y})` }, root);
    el("rect", { width: p.w, height: BOX_H, rx: 5, fill: device === TF ? "#d9d9d9" : colour.get(device),
                 "stroke-dasharray": device === TF ? "4 2" : "" }, g);
    const label = it.label.length > MAX_CHARS ? it.label.slice(0, MAX_CHARS - 1) + "\u2026" : it.label;
    el("text", { x: 8, y: 17 }, g).textContent = label;
    el("title", {}, g).textContent = it.cluster ? `${it.cluster}: ${DATA.clusters[it.cluster]} nodes, click to expand`
      : `${it.node.name} (${it.node.op})\n` + (device === TF ? "TensorFlow: " + it.node.reason : "on " + device);
    g.addEventListener("click", ev => { ev.stopPropagation(); clickItem(it); });
  }
  if (fit) {  // the whole graph, but never magnified past about natural size
    const w = Math.max(width + 40, 1000), h = Math.max(height + 40, 600);
    view = { x: -20 - (w - width - 40) / 2, y: -20, w, h };
  }
  applyView();
  document.body.dataset.drawnNodes = items.size;
  document.body.dataset.drawnEdges = edges.length;
  document.body.dataset.expanded = [...expanded].sort().join(",");
}

function applyView() {
  document.getElementById("graph").setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`);
}

function clickItem(it) {
  if (it.cluster) { expanded.add(it.cluster); draw(false); return; }
  if (it.node.device !== TF && selected === it.id) { expanded.delete(it.node.device); selected = null; draw(false); return; }
  select(it.id);
}

function select(id) {
  selected = id;
  const n = byName.get(id);
  document.getElementById("details").textContent = n
    ? `${n.name}\nop: ${n.op}\nruns on: ${n.device}` + (n.device === TF ? `\nwhy: ${n.reason}` : "\n(click again to collapse its NeuronOp)")
      + `\ninputs: ${n.inputs.join(", ") || "-"}`
    : id;
  draw(false);
}

function find(name) {
  const n = byName.get(name);
  if (!n && DATA.clusters[name] !== undefined) { expanded.add(name); draw(true); return true; }
  if (!n) return false;
  if (n.device !== TF) expanded.add(n.device);
  select(n.name);
  const p = positions.get(n.name);
  view = { x: p.x - 400, y: p.y - 300, w: 800 + p.w, h: 600 };
  applyView();
  return true;
}

function summary() {
  const onTf = DATA.nodes.filter(n => n.device === TF);
  document.getElementById("summary").textContent =
    `${DATA.nodes.length} nodes: ${DATA.nodes.length - onTf.length} in ${clusterNames.length} NeuronOp(s), ${onTf.length} on TensorFlow`;
  const legend = document.getElementById("legend");
  for (const c of clusterNames) {
    const d = document.createElement("div");
    d.innerHTML = '<span class="swatch"></span>';
    d.firstChild.style.background = colour.get(c);
    d.append(`${c}: ${DATA.clusters[c]} nodes`);
    d.addEventListener("click", () => find(c));
    legend.appendChild(d);
  }
  const reasons = new Map();
  for (const n of onTf) reasons.set(n.reason, (reasons.get(n.reason) || 0) + 1);
  for (const [r, k] of [...reasons].sort((a, b) => b[1] - a[1])) {
    const d = document.createElement("div");
    d.innerHTML = '<span class="swatch" style="background:#d9d9d9"></span>';
    d.append(`TensorFlow, ${k} node(s): ${r}`);
    legend.appendChild(d);
  }
  const list = document.getElementById("names");
  for (const name of [...clusterNames, ...byName.keys()].slice(0, 5000)) {
    const o = document.createElement("option"); o.value = name; list.appendChild(o);
  }
}

function panAndZoom() {
  const svg = document.getElementById("graph");
  svg.addEventListener("wheel", ev => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect(), k = ev.deltaY > 0 ? 1.2 : 1 / 1.2;
    const fx = (ev.clientX - r.left) / r.width, fy = (ev.clientY - r.top) / r.height;
    view = { x: view.x + fx * view.w * (1 - k), y: view.y + fy * view.h * (1 - k), w: view.w * k, h: view.h * k };
    applyView();
  }, { passive: false });
  let drag = null;
  svg.addEventListener("mousedown", ev => { drag = { x: ev.clientX, y: ev.clientY, v: { ...view } }; });
  window.addEventListener("mouseup", () => { drag = null; });
  window.addEventListener("mousemove", ev => {
    if (!drag) return;
    const r = svg.getBoundingClientRect();
    view.x = drag.v.x - (ev.clientX - drag.x) * view.w / r.width;
    view.y = drag.v.y - (ev.clientY - drag.y) * view.h / r.height;
    applyView();
  });
}

function fromFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  for (const c of (params.get("expand") || "").split(",").filter(Boolean)) {
    if (c === "all") clusterNames.forEach(x => expanded.add(x));
    else if (DATA.clusters[c] !== undefined) expanded.add(c);
  }
  draw(true);
  if (params.get("find")) find(params.get("find"));
}

document.getElementById("search").addEventListener("keydown", ev => {
  if (ev.key === "Enter" && !find(ev.target.value.trim())) ev.target.style.background = "#fdd";
  else ev.target.style.background = "";
});
document.getElementById("expand-all").addEventListener("click", () => { clusterNames.forEach(c => expanded.add(c)); draw(true); });
document.getElementById("collapse-all").addEventListener("click", () => { expanded.clear(); draw(true); });
summary();
panAndZoom();
fromFragment();
