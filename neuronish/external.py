"""Executables (and subgraphs) stored outside the graph, in the SavedModel's `assets/`.

A GraphDef is a protobuf message and cannot pass 2 GiB, and a `NeuronOp`
carries its executable (weights included) and its subgraph (the same weights
again, for the fallback) as attributes. So a large one is written to
`assets/<sha256>.neff` / `assets/<sha256>.pb` and the attribute holds a
reference instead:

    neuronish-external:v1:<sha256 hex>:<size in bytes>

The op gets one extra string input per file (`external_files`, count
`n_external`), fed by the SavedModel's asset tensors, which TensorFlow points
at wherever the model was loaded from; the kernel hands those paths to
kernel_bridge, which reads the file the reference names and checks its size and
hash before the device sees it.

Which attributes go outside (`plan`): every one of at least `threshold` bytes
(`NEURONISH_EXTERNAL_THRESHOLD`, default 1 MiB), and then, while the graph would
still pass the protobuf limit (less a margin for the rest of the SavedModel),
the largest of those left. No TensorFlow here: the kernel bridge imports it.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from neuronish.runtime import ExecutableError
from neuronish.runtime.config import parse_bytes
from neuronish.runtime.files import FileRefused, read_regular

ENV_THRESHOLD = "NEURONISH_EXTERNAL_THRESHOLD"
# An attribute in the graph costs a TensorFlow process about 11x its bytes for as long as
# the model is loaded (the SavedModel proto, the function library, each instantiated graph
# and grappler's copies all hold it): ResNet50 bf16's 51 MB executable inline held 487 MiB
# more than the same bytes in assets/, and loaded 1.1 s slower (benchmarks/load_memory.py).
# Below 1 MiB that is at most ~11 MiB, and a tiny model keeps its one file.
DEFAULT_THRESHOLD = 1 << 20
# protobuf's hard limit is 2 GiB - 1; keep room for the rest of saved_model.pb.
GRAPH_LIMIT = (2 << 30) - (64 << 20)
PREFIX = b"neuronish-external:v1:"
_REFERENCE = re.compile(rb"neuronish-external:v1:([0-9a-f]{64}):(\d{1,15})")
SUFFIX = {"executable": ".neff", "graph_def": ".pb"}


@dataclass(frozen=True)
class BlobFile:
    """An attribute value already written to a file (the compiler's executable, the
    subgraph it read): export links it into assets/ instead of reading and writing it
    again. `sha256` (hex) when known, else it is computed from the file."""

    path: str
    size: int
    sha256: str | None = None

    def digest(self) -> str:
        return self.sha256 if self.sha256 is not None else file_sha256(self.path)

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()


def file_sha256(path: str) -> str:
    """The hex SHA-256 of a file, read in small pieces (nothing the size of it held)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def threshold_from_env() -> int:
    """`$NEURONISH_EXTERNAL_THRESHOLD` in bytes (`4096`, `512KiB`, `64MiB`)."""
    text = os.environ.get(ENV_THRESHOLD, "").strip()
    if not text:
        return DEFAULT_THRESHOLD
    return parse_bytes(text, ENV_THRESHOLD)  # (ConfigError is a ValueError)


def reference(data: bytes | BlobFile) -> tuple[bytes, str]:
    """(the attribute value that stands for `data`, the hex digest naming its file)."""
    if isinstance(data, BlobFile):
        digest, size = data.digest(), data.size
    else:
        digest, size = hashlib.sha256(data).hexdigest(), len(data)
    return PREFIX + f"{digest}:{size}".encode(), digest


def parse_reference(value: bytes | memoryview) -> tuple[str, int] | None:
    """(digest, size) if the attribute value is a reference, else None."""
    head = bytes(value[:len(PREFIX)])
    if head != PREFIX or len(value) > 200:
        return None
    m = _REFERENCE.fullmatch(bytes(value))
    if not m:
        raise ExecutableError(f"malformed external reference {bytes(value)[:120]!r}; expected "
                              "neuronish-external:v1:<sha256>:<size>")
    return m.group(1).decode(), int(m.group(2))


def plan(sizes: Sequence[int], rest: int, threshold: int,
         limit: int = GRAPH_LIMIT) -> list[bool]:
    """Which of the attributes of `sizes` bytes go outside, given `rest` bytes of graph
    besides them: all at or above `threshold`, then the largest until under `limit`."""
    out = [s >= threshold for s in sizes]
    total = rest + sum(s for s, o in zip(sizes, out, strict=True) if not o)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if total <= limit:
            break
        if not out[i]:
            out[i] = True
            total -= sizes[i]
    return out


def resolve(value: bytes | memoryview, files: Sequence[str], node: str, what: str) -> bytes:
    """The bytes an attribute stands for: itself if inline, else the named file, checked.
    Raises ExecutableError naming the op, the file and what is wrong."""
    ref = parse_reference(value)
    if ref is None:
        return bytes(value) if not isinstance(value, bytes) else value
    digest, size = ref
    name = digest + SUFFIX.get(what, "")
    matches = [f for f in files if os.path.basename(f) == name]
    if not matches:
        raise ExecutableError(f"NeuronOp '{node}': its {what} is stored outside the graph as "
                              f"{name}, but none of its external_files {list(files)} is that "
                              "file; copy the whole SavedModel directory, assets/ included")
    path = matches[0]
    parts = path.replace(os.sep, "/").split("/")
    if len(parts) < 2 or parts[-2] != "assets" or ".." in parts:
        raise ExecutableError(f"NeuronOp '{node}': its {what} file {path!r} is not a plain file "
                              "name inside the SavedModel's assets/ directory; an external "
                              "file must be assets/<sha256>.neff or .pb. Recompile the model")
    try:
        data = read_regular(path, size, f"{what} file of NeuronOp '{node}' (declared "
                                        f"{size} bytes)")
    except FileNotFoundError:
        raise ExecutableError(f"NeuronOp '{node}': its {what} file {path} does not exist; "
                              "copy the whole SavedModel directory, assets/ included") from None
    except FileRefused as e:
        raise ExecutableError(f"NeuronOp '{node}': {e}. The file is damaged or was "
                              "replaced") from None
    except OSError as e:
        raise ExecutableError(f"NeuronOp '{node}': cannot read its {what} from {path}: "
                              f"{e.strerror or e}") from None
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise ExecutableError(f"NeuronOp '{node}': {path} does not hash to the {what} the op "
                              "was compiled with (sha256 mismatch); the file is damaged or "
                              "was replaced. Recompile the model or restore the file")
    return data
