"""Do two compiler trees write the same executables? Byte for byte, on a sample.

    .venv/bin/python scripts/compare_compilers.py                   # this tree vs main
    .venv/bin/python scripts/compare_compilers.py --base REV --quick

For a refactoring of the compiler that must not change its output (issue 21: use
lists and the rewrite driver). The base tree is `git archive REV` (default: the
merge base of HEAD and main) unpacked in a temporary directory. The sample:

- small graphs traced with TensorFlow from tests/graphs.py, tests/cc/test_passes.py and
  tests/cc/test_idioms.py (fusions, layer norms, GELUs, attention scores);
- the frozen models already in the model cache (`models/cache.py`: ResNet50,
  MobileNetV2, EfficientNetB0, bert_encoder, ... whichever `*-frozen-b*` entries
  exist; none is built here);
- each with the default options and with `--auto-cast all` (bf16) and
  `--auto-cast matmult --auto-cast-type fp16`, which run autocast and assign_dtypes.

Each tree compiles every case in one process of its own (`PYTHONPATH` at the tree);
the executables are compared after zeroing `stats.compile_seconds`, the one field
that is a measurement. Exit status 1 if any differ (the first differences are named).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"default": {}, "bf16_all": {"auto_cast": "all"},
            "fp16_matmult": {"auto_cast": "matmult", "auto_cast_type": "fp16"}}

# Run inside each tree: compile the cases listed in argv[1] into the directory argv[2],
# importing neuronish, neuronish.cc and neuronish.runtime from the tree argv[3] alone (the
# venv's editable install would map the last two to the tree it was installed from).
RUNNER = r"""
import json, os, sys, tempfile
from pathlib import Path
tree = Path(sys.argv[3])
sys.meta_path = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()
                 and "editable" not in getattr(f, "__name__", "").lower()]
sys.path.insert(0, str(tree))
import neuronish
shim = Path(tempfile.mkdtemp(prefix="compare-compilers-shim-"))
import atexit, shutil
atexit.register(shutil.rmtree, shim, True)
for name in ("cc", "runtime"):
    os.symlink(tree / name, shim / name)
neuronish.__path__.append(str(shim))
from neuronish.cc.compiler import compile_executable
from neuronish.runtime.executable import to_bytes
import neuronish.cc, neuronish.runtime
jobs, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
print(*(Path(m.__file__).resolve() for m in (neuronish, neuronish.cc, neuronish.runtime)),
      flush=True)
for job in jobs:
    exe = compile_executable(Path(job["graph"]).read_bytes(),
                             json.loads(Path(job["io"]).read_text()), **job["options"])
    exe.stats["compile_seconds"] = 0.0
    (out / (job["name"] + ".neff")).write_bytes(to_bytes(exe))
"""


def _traced_cases(tmp: Path, quick: bool) -> list[tuple[str, Path, Path]]:
    sys.path.insert(0, str(ROOT))
    from tests import graphs
    from tests.cc import test_idioms, test_passes

    builders = dict(test_passes.GRAPHS)
    builders.update({"dense_residual": test_passes._dense_residual,
                     "attention_scores": test_passes._attention_scores,
                     "dense_relu": graphs.dense_relu})
    builders["idioms"] = lambda: _idioms(graphs, test_idioms)
    cases = []
    for name, build in builders.items():
        g = build()
        pb, io = tmp / f"{name}.pb", tmp / f"{name}.json"
        pb.write_bytes(g.graph_def)
        io.write_text(json.dumps(g.io_config))
        cases.append((name, pb, io))
    return cases


def _idioms(graphs, test_idioms):  # noqa: ANN001, ANN202 (modules imported late)
    """Every layer-norm spelling, both GELUs, swish and constant powers in one graph."""
    import numpy as np
    import tensorflow as tf

    norms = test_idioms._layer_norms()
    w = tf.constant(np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32))

    def fn(x: tf.Tensor) -> tf.Tensor:
        for norm in norms:
            x = norm(x) * 1.5 + 0.25
        x = tf.nn.gelu(tf.matmul(x, w), approximate=False)
        x = tf.nn.gelu(tf.matmul(x, w), approximate=True)
        x = tf.nn.silu(tf.matmul(x, w))
        return x ** 2 + x ** 3 + tf.abs(x) ** 0.5 + (x * x + 1) ** -0.5 + x ** 1

    return graphs.trace(fn, tf.TensorSpec([None, 5, 16], tf.float32, name="x"), batch=3)


def _cached_models(limit: int | None) -> list[tuple[str, Path, Path]]:
    from models.cache import default_cache_root

    found = sorted(Path(default_cache_root()).glob("*-frozen-b*/graph.pb"))
    cases = [(p.parent.name, p, p.parent / "io_config.json") for p in found
             if (p.parent / "io_config.json").exists() and "-frozen-bNone" not in str(p)]
    return cases[:limit] if limit is not None else cases


def _compile_all(tree: Path, jobs: list[dict], out: Path, tmp: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", RUNNER, str(tmp / "jobs.json"), str(out),
                          str(tree)], cwd=tree, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"compiling in {tree} failed:\n{run.stderr[-4000:]}")
    used = run.stdout.splitlines()[0].split()
    if not all(str(Path(u).resolve()).startswith(str(tree.resolve())) for u in used):
        raise SystemExit(f"the compiler run for {tree} was imported from {used}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="git revision of the other compiler (default: the "
                        "merge base of HEAD and main)")
    parser.add_argument("--quick", action="store_true", help="fewer graphs, two models")
    args = parser.parse_args()
    base = args.base or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT,
                                       capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="compare-compilers-") as tmp_name:
        tmp = Path(tmp_name)
        base_tree = tmp / "base"
        base_tree.mkdir()
        archive = subprocess.run(["git", "archive", base], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base_tree)], input=archive, check=True)
        cases = _traced_cases(tmp, args.quick) + _cached_models(2 if args.quick else None)
        jobs = [{"name": f"{name}.{variant}", "graph": str(pb), "io": str(io),
                 "options": options}
                for name, pb, io in cases for variant, options in VARIANTS.items()]
        _compile_all(base_tree, jobs, tmp / "out-base", tmp)
        _compile_all(ROOT, jobs, tmp / "out-this", tmp)
        differ, total = [], 0
        for j in jobs:
            ours = (tmp / "out-this" / f"{j['name']}.neff").read_bytes()
            total += len(ours)
            if (tmp / "out-base" / f"{j['name']}.neff").read_bytes() != ours:
                differ.append(j["name"])
    print(f"{len(jobs) - len(differ)} of {len(jobs)} executables identical, {total:,} bytes "
          f"({len(cases)} graphs x {len(VARIANTS)} option sets; base {base[:10]})")
    for name in differ[:20]:
        print(f"  differs: {name}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
