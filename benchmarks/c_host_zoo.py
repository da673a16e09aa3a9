"""Zoo models served without Python: each compiled in one call, then run by TensorFlow's C
API (examples/c/tf_saved_model.c) with the native NeuronOp library, against TensorFlow on
the original SavedModel.

    python benchmarks/c_host_zoo.py bert_tiny qwen3_5_tiny ResNet50    # some zoo models
    python benchmarks/c_host_zoo.py --all       # every zoo model (benchmarks/zoo.py's): hours

Per model (built as a new user would, `models/third_party.py`, cached under
$NEURONISH_MODEL_CACHE): `neuronish.saved_model.compile(src, dst, batch_size=B)`, then the
C program runs the compiled model at batch B and at B + 1 (split and padded by the runtime)
on the zoo's example inputs with the runtime fallback off, so every NeuronOp ran on the
device: a kernel, an instruction or a dtype the C runtime lacks fails the model with its
message. Columns: OnNeuronRatio, NeuronOps, the instructions the compile report says the
native engine leaves to numpy (the C runtime refuses those), and the max relative error
(max |C host - TF| / max |TF| over all outputs) at each batch. Models with string inputs
are skipped (the C program feeds numbers only). Exits 1 if any model failed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_c_host(program: Path, library: str, model_dir: str, feeds: dict[str, np.ndarray],
               want: dict[str, np.ndarray], work: Path) -> dict[str, np.ndarray] | str:
    """The compiled model's outputs for `feeds` from the C program (shaped and typed as
    `want`), or its error message. No Python in its environment (the C-host tests' runner,
    with the fallback off)."""
    from tests.neuronish.test_op_library_c import _run, _signature

    inputs, outputs = _signature(Path(model_dir))
    keys, out_keys = sorted(feeds), sorted(want)
    (work / "in.bin").write_bytes(b"".join(np.ascontiguousarray(feeds[k]).tobytes()
                                           for k in keys))
    done = _run(program, "-l", library, "-i", str(work / "in.bin"), "-o",
                str(work / "out.bin"), model_dir,
                *(f"{inputs[k]}={feeds[k].dtype.name}:{','.join(map(str, feeds[k].shape))}"
                  for k in keys), "--", *(outputs[k] for k in out_keys),
                NEURONISH_TELEMETRY="0")
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else \
            f"exit status {done.returncode}"
    data, at, got = (work / "out.bin").read_bytes(), 0, {}
    for k in out_keys:
        w = want[k]
        got[k] = np.frombuffer(data[at:at + w.nbytes], w.dtype).reshape(w.shape)
        at += w.nbytes
    return got


def measure(name: str, batch: int, program: Path, library: str, work: Path) -> dict:
    import tensorflow as tf
    from zoo import max_rel_error

    import neuronish.saved_model
    from models.cache import cached_saved_model
    from models.third_party import example_inputs

    row: dict = {"model": name}
    dst = str(work / "compiled")
    shutil.rmtree(dst, ignore_errors=True)
    src = cached_saved_model(name)
    report = neuronish.saved_model.compile(src, dst, batch_size=batch)
    row["OnNeuronRatio"] = report["OnNeuronRatio"]
    row["NeuronOps"] = len(report["NeuronOps"])
    row["numpy"] = sum(len(op.get("numpy_instructions", [])) for op in report["NeuronOps"])
    original = tf.saved_model.load(src).signatures["serving_default"]
    for b in (batch, batch + 1):
        feeds = example_inputs(name, original, b, seed=b)
        if any(v.dtype.kind in "SUO" for v in feeds.values()):
            row["skipped"] = "string inputs"
            break
        want = {k: v.numpy() for k, v in original(
            **{k: tf.constant(v) for k, v in feeds.items()}).items()}
        got = run_c_host(program, library, dst, feeds, want, work)
        if isinstance(got, str):
            row["error"] = got
            break
        row[f"err@{b}"] = max_rel_error(got, want)
    shutil.rmtree(dst, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help="zoo model names (models/third_party.py)")
    p.add_argument("--all", action="store_true", help="every zoo model")
    p.add_argument("--batch", type=int, default=2)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from models import third_party
    from neuronish import native_op_library
    from tests.neuronish.test_op_library_c import _build_program

    names = list(third_party.ALL) if args.all else args.models
    if not names:
        p.error("name some models, or pass --all")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="c_host_zoo-") as tmp:
        work = Path(tmp)
        program = _build_program(work / "tf_saved_model")
        library = str(native_op_library.build())
        print(f"{'model':<28} {'OnNeuron':>8} {'ops':>4} {'numpy':>5} "
              f"{'err@' + str(args.batch):>9} {'err@' + str(args.batch + 1):>9}")
        for name in names:
            try:
                row = measure(name, args.batch, program, library, work)
            except Exception as e:  # noqa: BLE001 - one model's failure is its row
                row = {"model": name, "error": f"{type(e).__name__}: {e}"}
            errs = [row.get(f"err@{b}") for b in (args.batch, args.batch + 1)]
            cells = [f"{row.get('OnNeuronRatio', float('nan')):8.3f}",
                     f"{row.get('NeuronOps', 0):4d}", f"{row.get('numpy', 0):5d}",
                     *(f"{e:9.1e}" if e is not None else f"{'-':>9}" for e in errs)]
            note = row.get("error") or row.get("skipped") or ""
            failed += bool(row.get("error")) or bool(row.get("numpy"))
            print(f"{name:<28} {' '.join(cells)}  {note[:300]}", flush=True)
    print(f"{failed} of {len(names)} model(s) failed in the C host or left instructions to "
          "numpy")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
