"""What `neuronish.saved_model.compile` produced for some zoo models, written so two
checkouts can be compared byte for byte: a refactoring must not change it.

    .venv/bin/python scripts/compile_fingerprint.py OUT_DIR MobileNetV3Small bert_tiny:2
    diff -r BEFORE_DIR AFTER_DIR

Run it from the root of the checkout to measure, with that checkout's venv (the
script itself may come from another checkout: `models` and `neuronish` are imported
from the working directory).

Per model (`name[:batch]`, a `models.cache` name, compiled with the compile cache off):

    NAME.graph.txt   the spliced outer graph as text (NAME.signatureK.graph.txt: the
                     model's other signatures, compiled too)
    NAME.json        per NeuronOp the sha256 of its subgraph's GraphDef and of the
                     executable's content, and the compile report

Left out, because they differ from process to process with the same compile: the
per-process function numbers TensorFlow puts in library function names
(`..._frozen_24047`), the compiler's command line (temporary paths), and seconds
and directories in the report. The library's function order follows those numbers,
so compare models compiled in the same order in both runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

_FUNCTION_NUMBER = re.compile(r"_frozen_\d+")


def _executable_digest(data: bytes) -> str:
    """sha256 of what the executable holds, its compiler command line aside."""
    from neuronish.runtime.executable import from_bytes

    exe = from_bytes(data)
    digest = hashlib.sha256()
    for value in sorted(exe.constants):
        array = exe.constants[value]
        digest.update(repr((value, array.dtype.str, array.shape)).encode())
        digest.update(array.tobytes())
    options = {k: v for k, v in exe.compiler.get("options", {}).items() if k != "command_line"}
    digest.update(repr((exe.inputs, exe.outputs, sorted(exe.values.items()), exe.arena_bytes,
                        sorted(exe.offsets.items()), exe.programs, options)).encode())
    return digest.hexdigest()


def _blob_bytes(blob: object) -> bytes:
    path = getattr(blob, "path", None)
    return Path(path).read_bytes() if path is not None else bytes(blob)  # type: ignore[arg-type]


def _without_run_facts(report: object) -> object:
    """The report without what changes from run to run (seconds, directories)."""
    if isinstance(report, dict):
        return {k: _without_run_facts(v) for k, v in report.items()
                if "seconds" not in k and k not in ("compile_cache", "new_model_dir")}
    if isinstance(report, list):
        return [_without_run_facts(v) for v in report]
    return report


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    os.environ["NEURONISH_COMPILE_CACHE"] = "off"
    sys.path.insert(0, os.getcwd())  # the checkout measured (see the docstring)
    import neuronish.saved_model as sm
    from models.cache import cached_saved_model

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    seen: dict[str, object] = {}
    write = sm.write_saved_model

    def keep(graph_def: object, main: object, outputs: object, new_model_dir: str,
             blobs: dict, **kwargs: object) -> object:
        # Read before export runs: it fills attributes of the graph in, and the files
        # are gone once compile returns.
        seen["graph"] = _FUNCTION_NUMBER.sub("_frozen_N", str(graph_def))
        seen["other_signatures"] = [_FUNCTION_NUMBER.sub("_frozen_N", str(m.graph_def))
                                    for m in kwargs.get("more") or ()]  # type: ignore[attr-defined]
        seen["neuron_ops"] = {
            op: {"graph_def": hashlib.sha256(_blob_bytes(files["graph_def"])).hexdigest(),
                 "executable": _executable_digest(_blob_bytes(files["executable"]))}
            for op, files in blobs.items()}
        return write(graph_def, main, outputs, new_model_dir, blobs, **kwargs)

    sm.write_saved_model = keep
    failed = False
    for spec in argv[1:]:
        name, _, batch = spec.partition(":")
        target = tempfile.mkdtemp(prefix="compile-fingerprint-")
        shutil.rmtree(target)
        seen.clear()
        try:
            report = sm.compile(cached_saved_model(name), target, batch_size=int(batch or 1))
        except Exception as e:  # noqa: BLE001 (a failure is written down and compared too)
            (out / f"{name}.error").write_text(f"{type(e).__name__}: {e}\n")
            print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
            failed = True
            continue
        finally:
            shutil.rmtree(target, ignore_errors=True)
        (out / f"{name}.graph.txt").write_text(str(seen["graph"]))
        for k, text in enumerate(seen["other_signatures"]):  # type: ignore[arg-type]
            (out / f"{name}.signature{k + 1}.graph.txt").write_text(text)
        (out / f"{name}.json").write_text(json.dumps(
            {"neuron_ops": seen["neuron_ops"], "report": _without_run_facts(report)}, indent=1,
            sort_keys=True, default=str) + "\n")
        print(f"{name}: done", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    # Set ordering (the library functions of a model with several loops) follows the
    # string hash: two runs with different seeds differ with nothing changed.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "PYTHONHASHSEED": "0"})
    sys.exit(main(sys.argv[1:]))
