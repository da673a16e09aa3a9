"""Layer by layer: where neuronish's time differs from OpenVINO's on one model.

    python benchmarks/peer_layers.py ResNet50 --batch 8 [--precision fp32|bf16|int8] \
        [--calls 5] [--top 15] [--calibration 32] [--saved-model DIR]

neuronish side: the model compiled as benchmarks/peers.py compiles it for the precision
(fp32; bf16 `--auto-cast matmult`; int8 `quantize="int8"` from peers.py's calibration
samples) by `neuronish.saved_model.compile`, run by
`neuronish profile` in a subprocess with ONEDNN_VERBOSE=1, so every oneDNN primitive
execution is listed with its implementation, shapes, post-ops and time, and the
instructions oneDNN does not run (the engine's own kernels, numpy) appear in the
profile's per-instruction times. OpenVINO side: the same SavedModel converted, compiled
for f32 with PERFORMANCE_HINT LATENCY and PERF_COUNT, its runtime model's per-node
counters (layer type, implementation, output layout, time) averaged over the calls; for
bf16 `INFERENCE_PRECISION_HINT` bf16, for int8 NNCF's quantization of the same samples.

Printed: time per call by kind of work on both sides (convolutions 1x1 / spatial /
depthwise, matmuls, pooling, element-wise, reorders, the rest), then convolutions
matched between the two by (input channels, output channels, output height, width,
groups) in execution order, the largest differences first. Times from ONEDNN_VERBOSE
include its logging; the totals say by how much (against the profile's own sum).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import peers  # noqa: E402  (benchmarks/peers.py: the same flags and calibration samples)

# mb8_ic16oc96_ih112oh112kh1sh1dh0ph0_iw112ow112kw1sw1dw0pw0 (g<groups> in front if grouped)
_CONV = re.compile(r"(?:g(\d+))?mb(\d+)_ic(\d+)oc(\d+)_ih\d+oh(\d+)kh(\d+)\w*?_iw\d+ow(\d+)")


def neuronish_side(saved_model: str, batch: int, calls: int, workdir: str,
                   precision: str = "fp32", calibration: list | None = None,
                   compiled: str | None = None) -> dict:
    """Per-primitive oneDNN executions and per-instruction profile of one call (of the
    model compiled here, or of `compiled`, a compiled SavedModel)."""
    import neuronish

    dst = compiled or os.path.join(workdir, precision)
    if not compiled:
        extra = ({"quantize": "int8",
                  "calibration_data": peers.batched(calibration or [], batch)}
                 if precision == "int8" else {})
        neuronish.saved_model.compile(saved_model, dst, batch_size=batch,
                                      compiler_args=peers.neuronish_flags(precision,
                                                                          peers.cpu_flags()),
                                      **extra)
    trace = os.path.join(workdir, "trace.json")
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    out = subprocess.run([str(Path(sys.executable).parent / "neuronish"), "profile", dst,
                          "-o", trace, "--batch-size", str(batch), "--requests", str(calls),
                          "--warmup", "2", "--top", "0"],
                         env=env, capture_output=True, text=True, check=True).stdout
    lines = [ln.split(",") for ln in out.splitlines() if ln.startswith("onednn_verbose,exec,cpu")]
    per_call = _period(lines, calls)
    prims = []
    for i, f in enumerate(lines[-per_call:]):
        times = [float(g[-1]) for g in lines[len(lines) - per_call + i::-per_call][:calls]]
        prims.append({"kind": f[3], "impl": f[4], "desc": f[-2], "post_ops": _post_ops(f),
                      "ms": float(np.median(times))})
    events = json.loads(Path(trace).read_text())["traceEvents"]
    instructions = collections.defaultdict(float)
    engines = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "instruction":
            instructions[e["name"]] += e["dur"] / 1000 / calls
            engines[e.get("args", {}).get("engine", "?")] += e["dur"] / 1000 / calls
        calls_ms = [e["dur"] / 1000 for e in events
                    if e.get("ph") == "X" and e.get("cat") == "tf" and e["name"] == "request"]
    return {"primitives": prims, "instructions": dict(instructions), "engines": dict(engines),
            "call_ms": float(np.median(calls_ms)) if calls_ms else None}


def _period(lines: list[list[str]], calls: int) -> int:
    """Primitives per call: the shortest tail that repeats `calls` times (loading and
    the warm-up calls are logged too, and load-time weight reorders only once)."""
    sigs = [(f[3], f[-2]) for f in lines]
    for p in range(1, len(sigs) // calls + 1):
        if all(sigs[len(sigs) - p * (k + 1):len(sigs) - p * k] == sigs[-p:]
               for k in range(1, calls)):
            return p
    raise RuntimeError(f"no repeating call in {len(sigs)} oneDNN executions")


def _post_ops(fields: list[str]) -> str:
    attrs = next((f for f in fields if "attr-post-ops:" in f), "")
    return " ".join(p.split(":")[0] for p in attrs.split("attr-post-ops:")[1].split("+")) \
        if attrs else ""


def openvino_side(saved_model: str, batch: int, calls: int, precision: str = "fp32",
                  model_name: str = "", calibration: list | None = None) -> dict:
    import openvino as ov

    model = ov.convert_model(saved_model)
    if precision == "int8":
        model = peers._nncf_int8(model, model_name, calibration or [])
    model.reshape({i.get_any_name(): [batch, *(d.get_length() for d in i.get_partial_shape()[1:])]
                   for i in model.inputs})
    config = {"PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": True}
    if peers.OV_HINT[precision]:
        config["INFERENCE_PRECISION_HINT"] = peers.OV_HINT[precision]
    compiled = ov.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    rng = np.random.default_rng(0)
    feeds = {i.get_any_name(): rng.standard_normal(list(i.get_shape())).astype("float32")
             for i in compiled.inputs}
    for _ in range(2):
        request.infer(feeds)
    totals: dict[str, float] = collections.defaultdict(float)
    wall = []
    for _ in range(calls):
        request.infer(feeds)
        wall.append(request.latency)
        for p in request.get_profiling_info():
            totals[p.node_name] += p.real_time.total_seconds() * 1000 / calls
    nodes = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = {k: v.astype(str) for k, v in op.get_rt_info().items()}
        name = op.get_friendly_name()
        if info.get("execTimeMcs") == "not_executed" or name not in totals:
            continue
        shape = [int(d) for d in op.get_output_partial_shape(0).to_shape()] \
            if op.get_output_size() else []
        ins = [[int(d) for d in op.input(i).get_partial_shape().to_shape()]
               for i in range(op.get_input_size())]
        nodes.append({"type": info.get("layerType"), "impl": info.get("primitiveType"),
                      "layout": info.get("outputLayouts"), "shape": shape, "inputs": ins,
                      "fused": info.get("originalLayersNames", "").count(",") + 1,
                      "ms": totals[name]})
    return {"nodes": nodes, "call_ms": float(np.median(wall))}


def _our_kind(p: dict) -> str:
    if p["kind"] == "convolution":
        m = _CONV.search(p["desc"])
        if m and m.group(1) and int(m.group(1)) == int(m.group(3)):
            return "conv depthwise"
        return "conv 1x1" if m and m.group(6) == "1" else "conv spatial"
    return {"inner_product": "matmul", "binary": "element-wise", "eltwise": "element-wise",
            "softmax": "other"}.get(p["kind"], p["kind"])


def _ov_kind(n: dict) -> str:
    if n["type"] == "Convolution":
        if "_dw_" in n["impl"] or "dw" in n["impl"]:
            return "conv depthwise"
        return "conv 1x1" if "1x1" in n["impl"] else "conv spatial"
    return {"FullyConnected": "matmul", "MatMul": "matmul", "Pooling": "pooling",
            "Reorder": "reorder", "Eltwise": "element-wise", "Reduce": "pooling",
            "Subgraph": "element-wise"}.get(n["type"], "other")


def _conv_key(p: dict) -> tuple | None:
    m = _CONV.search(p["desc"])
    if not m:
        return None
    g, _, ic, oc, oh, _, ow = m.groups()
    return int(ic), int(oc), int(oh), int(ow), int(g or 1)


def _ov_conv_key(n: dict) -> tuple | None:
    if n["type"] != "Convolution" or len(n["shape"]) != 4 or not n["inputs"]:
        return None
    _, oc, oh, ow = n["shape"]
    ic = n["inputs"][0][1]
    groups = n["inputs"][1][0] if len(n["inputs"]) > 1 and len(n["inputs"][1]) == 5 else 1
    return ic, oc, oh, ow, groups


def report(ours: dict, theirs: dict, top: int) -> str:
    out = []
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0.0, 0])
    for p in ours["primitives"]:
        k = kinds[_our_kind(p)]
        k[0] += p["ms"]
        k[1] += 1
    for n in theirs["nodes"]:
        k = kinds[_ov_kind(n)]
        k[2] += n["ms"]
        k[3] += 1
    ours_total = sum(p["ms"] for p in ours["primitives"])
    own = sum(v for e, v in ours["engines"].items() if e != "native") if ours["engines"] else 0
    out.append(f"call: neuronish {ours['call_ms']:.1f} ms (profile; instructions "
               f"{sum(ours['instructions'].values()):.1f} ms, of them off oneDNN/numpy "
               f"{own:.1f} ms; oneDNN primitives under ONEDNN_VERBOSE {ours_total:.1f} ms), "
               f"OpenVINO {theirs['call_ms']:.1f} ms (counters "
               f"{sum(n['ms'] for n in theirs['nodes']):.1f} ms)")
    out.append("| kind | neuronish ms | primitives | OpenVINO ms | nodes |")
    out.append("|---|---|---|---|---|")
    for kind, (a, na, b, nb) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        out.append(f"| {kind} | {a:.1f} | {na} | {b:.1f} | {nb} |")
    out.append("")
    impls = collections.Counter((p["kind"], p["impl"]) for p in ours["primitives"])
    out.append("neuronish implementations: " + ", ".join(
        f"{k}:{i} x{c}" for (k, i), c in impls.most_common()))
    ov_impls = collections.Counter((n["type"], n["impl"], n["layout"]) for n in theirs["nodes"])
    out.append("OpenVINO implementations: " + ", ".join(
        f"{t}:{i} [{lay}] x{c}" for (t, i, lay), c in ov_impls.most_common()))
    # convolutions matched by shape, in order
    queue: dict[tuple, list[dict]] = collections.defaultdict(list)
    for n in theirs["nodes"]:
        key = _ov_conv_key(n)
        if key:
            queue[key].append(n)
    rows = []
    for p in ours["primitives"]:
        key = _conv_key(p)
        if key and queue.get(key):
            n = queue[key].pop(0)
            rows.append((p["ms"] - n["ms"], key, p, n))
    rows.sort(key=lambda r: -r[0])
    out.append("")
    out.append(f"convolutions matched: {len(rows)}; sum of differences "
               f"{sum(r[0] for r in rows):+.1f} ms (positive: neuronish slower)")
    out.append("| ic,oc,oh,ow,groups | neuronish ms | impl, post-ops | OpenVINO ms | impl "
               "[layout], fused nodes |")
    out.append("|---|---|---|---|---|")
    for _diff, key, p, n in rows[:top]:
        out.append(f"| {','.join(map(str, key))} | {p['ms']:.2f} | {p['impl']} "
                   f"{p['post_ops']} | {n['ms']:.2f} | {n['impl']} [{n['layout']}], "
                   f"{n['fused']} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32")
    p.add_argument("--calibration", type=int, default=32, help="int8 calibration samples")
    p.add_argument("--compiled", help="profile this compiled SavedModel (compiled for the "
                   "same precision and batch) instead of compiling the model")
    p.add_argument("--json", help="also write both sides' raw figures here")
    p.add_argument("--saved-model", help="measure this SavedModel of MODEL instead of the "
                   "cached fresh-weights one (e.g. `python -m models.trained_like MODEL DIR`)")
    args = p.parse_args()
    import tensorflow as tf

    from models.cache import cached_saved_model

    src = args.saved_model or cached_saved_model(args.model)
    calibration = None
    if args.precision == "int8":
        signature = tf.saved_model.load(src).signatures["serving_default"]
        calibration = peers.calibration_samples(args.model, signature, args.calibration)
    with tempfile.TemporaryDirectory(prefix="peer-layers-") as work:
        ours = neuronish_side(src, args.batch, args.calls, work, args.precision, calibration,
                              args.compiled)
    theirs = openvino_side(src, args.batch, args.calls, args.precision, args.model, calibration)
    print(f"{args.model} batch {args.batch}, {args.precision}, medians of {args.calls} calls")
    print(report(ours, theirs, args.top))
    if args.json:
        Path(args.json).write_text(json.dumps({"neuronish": ours, "openvino": theirs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
