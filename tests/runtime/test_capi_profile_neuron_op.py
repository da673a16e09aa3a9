"""A NeuronOp in a TensorFlow Python process profiled with NEURONISH_PROFILE runs on the C
runtime (its kernel calls nr_execute_with itself), and the trace the process writes at
exit holds its calls, chunks and engine instructions, which `neuronish profile --read`
lists; its outputs are TensorFlow's. Real TensorFlow, compiler, op library and C runtime.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.runtime.test_profiler import spans_by_category

NEURONISH = str(Path(sys.executable).parent / "neuronish")
ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 600  # seconds: TensorFlow's import and a compile on a loaded machine

# Batch 11 of a batch-4 executable: three chunks per call; two calls.
SCRIPT = """
import gc, json, os
import numpy as np
import tensorflow as tf
from neuronish import kernel_bridge
from neuronish.cc.compiler import compile_graph
from neuronish.neuron_op import neuron_op_node_def
from neuronish.runtime import executable
from tests.graphs import dense_relu
from tests.neuronish.test_neuron_op import neuron_function, rows

g = dense_relu(batch=4)
exe = compile_graph(g.graph_def, g.io_config)
node = neuron_op_node_def("profiled_op", ["x:0"], exe, g.graph_def)
f = neuron_function(g, node, [tf.TensorSpec(None, tf.float32)])
x = rows(11)
for _ in range(2):
    np.testing.assert_allclose(f(tf.constant(x))[0].numpy(), g.reference({"x:0": x})["Identity:0"],
                               rtol=1e-5, atol=1e-6)
[handle] = [h for h in gc.get_objects()
            if isinstance(h, kernel_bridge.Handle) and h.node_name == "profiled_op"]
print(json.dumps({"pid": os.getpid(), "on_c_runtime": handle.native_entry is not None,
                  "kinds": [i.kind for i in executable.from_bytes(exe).programs[0]]}))
"""


def test_a_profiled_neuron_op_runs_on_the_c_runtime_and_its_trace_lists_the_engine(
        tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    env = {k: v for k, v in os.environ.items() if k not in ("NEURONISH_KERNEL",
                                                             "NEURONISH_ENGINE")}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=DEADLINE, cwd=ROOT,
                       env={**env, "NEURONISH_PROFILE": str(traces), "NEURONISH_TELEMETRY": "0",
                            "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["on_c_runtime"], "the profiled NeuronOp loaded on the Python runtime"
    path = traces / f"neuronish-{got['pid']}.json"
    assert [p.name for p in traces.iterdir()] == [path.name]  # one file, one writer

    trace = json.loads(path.read_text())
    by_cat = spans_by_category(trace)  # (trace-event format; spans nest per track)
    assert len(by_cat["call"]) == 2 and len(by_cat["execute"]) == 6
    assert "tf" not in by_cat  # (no kernel_bridge call: the kernel ran it in C++)
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
              if e["name"] == "thread_name"}
    # (on whichever of its copies' cores; named by the node, as the Python runtime names it)
    assert all(re.fullmatch(r"device cores \[\d\]: profiled_op", tracks[e["tid"]])
               for e in by_cat["execute"])
    assert sorted(e["name"] for e in by_cat["instruction"]) == sorted(got["kinds"] * 6)

    r = subprocess.run([NEURONISH, "profile", "--read", str(path)], capture_output=True,
                       text=True, timeout=DEADLINE)
    assert r.returncode == 0, r.stderr
    rows = [row for row in map(str.split, r.stdout.splitlines()[1:]) if row[4:5] == ["native"]]
    assert {row[5] for row in rows} == set(got["kinds"])
    assert all(row[1] == "6" for row in rows)  # calls: one per chunk
    assert all(float(row[3]) > 0 for row in rows)  # the modelled time, from the executable
    assert "2 call, 6 execute" in r.stderr
