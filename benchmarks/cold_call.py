"""The C runtime's cost per call of a tiny model, warm and cold, in a C program.

    python benchmarks/cold_call.py [--calls 20000] [--rounds 3] [--evict-mib 4]
                                   [--library OTHER.so]

The tiny model of issue 25 (16x16 MatMul + Relu, batch 1, compiled by neuronish-cc
in-process) is loaded with 4 duplicates, as a NeuronOp loads it, and called through
`nr_execute_with` with a cancel byte, as the NeuronOp calls it, by a small C program built
against the runtime library (`runtime.capi.library.build()`, or `--library`, e.g. a build
of another commit, so two runtimes can be compared in one run, alternating). Each round
prints the median and the 10th/90th percentiles of one call's wall time (the output is
checked against numpy first):

- warm: calls back to back, everything in the CPU's caches;
- cold: `--evict-mib` MiB of other memory written between calls, so the runtime's data
  comes from L3 as it does inside TensorFlow, whose executor runs between two NeuronOp
  calls (docs/c-api.md, "Tiny-call latency: a call's cold first touches").

No TensorFlow: this is the runtime alone, not the op (benchmarks/capi_binding.py figure 1
measures the op inside TensorFlow, where the noise is larger than these differences).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_PROGRAM = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "neuronish_runtime.h"

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}
static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* cold_call MODEL.neff CALLS EVICT_BYTES: one line, "median p10 p90" in ns and the sum of
 * the output for x[i] = (i + 1) / 16 (checked against numpy by the caller). */
int main(int argc, char **argv) {
  char err[1024];
  nr_device *dev;
  nr_model *model;
  if (argc != 4) return 2;
  if (nr_device_open(&dev, err, sizeof err) ||
      nr_model_load_file(dev, argv[1], 4, &model, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int calls = atoi(argv[2]);
  size_t evict = (size_t)atol(argv[3]);
  float x[16], y[16];
  for (int i = 0; i < 16; ++i) x[i] = (float)(i + 1) / 16.0f;
  int64_t x_shape[2] = {1, 16}, y_shape[2] = {1, 16};
  nr_tensor in = {"x:0", NR_FLOAT32, 2, x_shape, x, sizeof x};
  nr_tensor out = {NULL, NR_FLOAT32, 2, y_shape, y, sizeof y};
  in.name = NULL;  /* (the signature's name is read from the model: see below) */
  nr_tensor_info info;
  nr_executable_tensor(nr_model_executable(model), NR_INPUT, 0, &info);
  in.name = info.name;
  volatile uint8_t cancel = 0;
  nr_execute_options options = {0, &cancel};
  char *other = evict ? malloc(evict) : NULL;
  if (other) memset(other, 1, evict);
  double *took = malloc(sizeof(double) * (size_t)calls);
  for (int i = 0; i < calls; ++i) {
    for (size_t k = 0; k < evict; k += 64) other[k]++;
    double start = now_ns();
    if (nr_execute_with(model, &in, 1, &out, 1, &options, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    took[i] = now_ns() - start;
  }
  qsort(took, (size_t)calls, sizeof(double), by_value);
  double sum = 0;
  for (int i = 0; i < 16; ++i) sum += y[i];
  printf("%.0f %.0f %.0f %.9g\n", took[calls / 2], took[calls / 10], took[calls * 9 / 10], sum);
  nr_model_unload(model);
  nr_device_close(dev);
  return 0;
}
"""


def _tiny_executable(path: Path) -> float:
    """The tiny model (weights as benchmarks/capi_binding.py draws them), compiled; the sum
    of its output for the C program's input, as numpy computes it."""
    import numpy as np
    import tensorflow as tf

    from neuronish import contracts
    from neuronish.cc.compiler import compile_graph

    w = (np.random.default_rng(0).standard_normal((16, 16)) * 0.35).astype(np.float32)
    fn = tf.function(lambda x: tf.nn.relu(tf.matmul(x, w)),
                     input_signature=[tf.TensorSpec([1, 16], tf.float32, name="x")])
    graph = fn.get_concrete_function().graph.as_graph_def()
    out = next(n.name for n in graph.node if n.op == "Relu")
    io = contracts.io_config([("x:0", [1, 16], "float32", 0)], {f"{out}:0": 0})
    path.write_bytes(compile_graph(graph.SerializeToString(), io))
    x = (np.arange(16, dtype=np.float32) + 1) / 16
    return float(np.maximum(x @ w, 0).sum())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--evict-mib", type=float, default=4.0)
    p.add_argument("--library", action="append", default=[],
                   help="another runtime library to compare (repeatable)")
    args = p.parse_args()
    from neuronish.runtime.capi import library

    libraries = [library.build(), *(Path(x).resolve() for x in args.library)]
    with tempfile.TemporaryDirectory(prefix="cold-call-") as tmp:
        exe = Path(tmp) / "tiny.neff"
        want = _tiny_executable(exe)
        (Path(tmp) / "cold_call.c").write_text(_PROGRAM)
        programs = []
        for k, lib in enumerate(libraries):
            program = Path(tmp) / f"cold_call_{k}"
            subprocess.run(["gcc", "-O2", "-std=c99", f"-I{library.INCLUDE}",
                            str(Path(tmp) / "cold_call.c"), "-o", str(program), str(lib),
                            f"-Wl,-rpath,{lib.parent}"], check=True)
            programs.append(program)
        evict = str(int(args.evict_mib * (1 << 20)))
        got: dict[tuple[int, str], list[list[float]]] = {}
        for r in range(args.rounds):
            order = list(enumerate(programs))
            for k, program in (order if r % 2 == 0 else order[::-1]):
                for label, calls, evicting in (("warm", args.calls * 10, "0"),
                                               ("cold", args.calls, evict)):
                    done = subprocess.run([str(program), str(exe), str(calls), evicting],
                                          capture_output=True, text=True, check=True)
                    row = [float(v) for v in done.stdout.split()]
                    if abs(row[3] - want) > 1e-4 * max(1.0, abs(want)):
                        raise SystemExit(f"{libraries[k]}: output sum {row[3]}, numpy {want}")
                    got.setdefault((k, label), []).append(row)
    print(f"tiny model (16x16 MatMul + Relu, batch 1), nr_execute_with, {args.rounds} rounds; "
          f"CPUs {len(os.sched_getaffinity(0))}, load {os.getloadavg()[0]:.2f}")
    for k, lib in enumerate(libraries):
        for label in ("warm", "cold"):
            rows = got[(k, label)]
            median = statistics.median(row[0] for row in rows)
            spread = ", ".join(f"{row[0]:.0f}" for row in rows)
            print(f"  {lib.name:45s} {label}: median {median:5.0f} ns (rounds: {spread}; "
                  f"p10-p90 of the last {rows[-1][1]:.0f}-{rows[-1][2]:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
