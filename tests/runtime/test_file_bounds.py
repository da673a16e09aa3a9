"""Every file read from outside is a regular file checked for its size (and JSON
for its depth) before it is read: a symlink to /dev/zero, a FIFO, a
sparse file of gigabytes or a deeply nested JSON file is refused with a message
naming it, never read whole, never waited on, never a traceback.

The commands run as subprocesses under an address-space cap and a timeout, so a
reader that would read /dev/zero forever fails at the cap and one that would wait
on a FIFO fails at the timeout."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from neuronish.runtime.files import FileRefused, read_json, read_regular

CC = str(Path(sys.executable).parent / "neuronish-cc")
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "conv_bn.neff"
CAP = 2 << 30


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def _run(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, preexec_fn=_cap,
                          env={**os.environ, **(env or {})})


def _hostile(directory: Path, kind: str, name: str = "f") -> Path:
    """A path at `directory/name` that is `kind`."""
    path = directory / name
    if kind == "dev-zero symlink":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse 3 GiB":
        with open(path, "wb") as f:
            f.truncate(3 << 30)
    elif kind == "deep json":
        path.write_text("[" * 5000 + "]" * 5000)
    elif kind == "directory":
        path.mkdir()
    return path


KINDS = ["dev-zero symlink", "fifo", "sparse 3 GiB", "directory"]
WHY = {"dev-zero symlink": "a character device, not a regular file",
       "fifo": "a FIFO, not a regular file", "sparse 3 GiB": "3221225472 bytes",
       "directory": "a directory, not a regular file", "deep json": "nests deeper than 64"}


# ------------------------------------------------------------------ the helper itself

@pytest.mark.parametrize("kind", [*KINDS, "deep json"])
def test_read_json_refuses(kind: str, tmp_path: Path) -> None:
    path = _hostile(tmp_path, kind)
    with pytest.raises(FileRefused, match=WHY[kind]) as caught:
        read_json(path, 1 << 20, "device model")
    assert str(path) in str(caught.value)


def test_read_regular_refuses_a_symlink_when_told(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_regular(tmp_path / "link", 10) == b"x"
    with pytest.raises(FileRefused, match="is a symlink; it must be the file itself"):
        read_regular(tmp_path / "link", 10, follow_symlinks=False)


# ------------------------------------------------------------------ neuronish-cc inspect

@pytest.mark.parametrize("kind", [*KINDS, "deep json"])
def test_inspect_device_model(kind: str, tmp_path: Path) -> None:
    path = _hostile(tmp_path, kind)
    for argv, env in (([CC, "inspect", str(GOLDEN), "--device-model", str(path)], None),
                      ([CC, "inspect", str(GOLDEN)], {"NEURONISH_DEVICE_MODEL": str(path)})):
        done = _run(argv, env)
        assert done.returncode == 2, done.stderr
        assert f"device model {path}: the device model " in done.stderr, done.stderr
        assert WHY[kind] in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_executable_path(kind: str, tmp_path: Path) -> None:
    done = _run([CC, "inspect", str(_hostile(tmp_path, kind))])
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert "not a regular file" in done.stderr or "not a neuronish executable" in done.stderr


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _saved_model(root: Path, executable_attr: bytes) -> None:
    """saved_model.pb with one NeuronOp whose `executable` attribute is given (the
    wire fields inspect walks: SavedModel.meta_graphs > graph_def > node)."""
    attr = _field(1, b"executable") + _field(2, _field(2, executable_attr))
    node = _field(1, b"neuron_op") + _field(2, b"NeuronOp") + _field(5, attr)
    root.mkdir()
    (root / "saved_model.pb").write_bytes(_field(2, _field(2, _field(1, node))))
    (root / "assets").mkdir()


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_saved_model_asset(kind: str, tmp_path: Path) -> None:
    """The asset a NeuronOp names is a FIFO (it hung inspect), a /dev/zero link (OOM at
    21.9 GB), a 3 GiB sparse file (read whole before being refused)..."""
    data = GOLDEN.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    root = tmp_path / "model"
    _saved_model(root, f"neuronish-external:v1:{digest}:{len(data)}".encode())
    shutil_copy = root / "assets" / f"{digest}.neff"
    shutil_copy.write_bytes(data)
    good = _run([CC, "inspect", str(root)])
    assert good.returncode == 0 and "1 NeuronOp(s)" in good.stdout, good.stderr
    shutil_copy.unlink()
    _hostile(root / "assets", kind, f"{digest}.neff")
    done = _run([CC, "inspect", str(root)])
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{digest}.neff: the executable of NeuronOp 'neuron_op' (declared " in done.stderr
    assert (f"more than the {len(data)} bytes" if kind == "sparse 3 GiB" else WHY[kind]) \
        in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["dev-zero symlink", "fifo"])
def test_inspect_saved_model_pb(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    _hostile(root, kind, "saved_model.pb")
    done = _run([CC, "inspect", str(root)])
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr


def test_runtime_load_refuses_a_fifo(tmp_path: Path) -> None:
    script = ("import sys\nfrom neuronish import runtime\n"
              "try:\n    runtime.load(sys.argv[1])\n"
              "except runtime.DeviceError as e:\n    print('refused:', e)\n")
    done = _run([sys.executable, "-c", script, str(_hostile(tmp_path, "fifo"))])
    assert "refused:" in done.stdout and "a FIFO, not a regular file" in done.stdout, done.stderr


def test_deep_json_helper_counts_depth() -> None:
    from neuronish.runtime.files import json_depth
    assert json_depth(json.loads('{"a": [1, {"b": []}]}')) == 4
    assert json_depth(5) == 0


# ------------------------------------------------------------------ NeuronOp external files

def _external(tmp_path: Path, data: bytes) -> tuple[bytes, str, Path]:
    from neuronish import external
    value, digest = external.reference(data)
    assets = tmp_path / "model" / "assets"
    assets.mkdir(parents=True)
    return value, digest, assets


def test_an_external_file_outside_assets_is_refused(tmp_path: Path) -> None:
    """An asset name `../../outside/<sha>.neff` made the model load an executable from
    outside its SavedModel: the runtime checked only the base name and the hash."""
    from neuronish import external
    from neuronish.runtime import ExecutableError
    data = GOLDEN.read_bytes()
    value, digest, assets = _external(tmp_path, data)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"{digest}.neff").write_bytes(data)  # the right bytes, the wrong place
    sneaky = f"{assets}/../../outside/{digest}.neff"
    with pytest.raises(ExecutableError, match="not a plain file name inside the SavedModel's "
                                              "assets/ directory"):
        external.resolve(value, [sneaky], "net/neuron_op", "executable")
    with pytest.raises(ExecutableError, match="not a plain file name"):
        external.resolve(value, [str(outside / f"{digest}.neff")], "net/neuron_op",
                         "executable")
    (assets / f"{digest}.neff").write_bytes(data)
    assert external.resolve(value, [str(assets / f"{digest}.neff")], "n", "executable") == data


@pytest.mark.parametrize("kind", KINDS)
def test_an_external_file_that_is_not_a_regular_file_is_refused(kind: str,
                                                                tmp_path: Path) -> None:
    script = ("import sys\nfrom neuronish import external\nfrom neuronish.runtime import "
              "ExecutableError\ntry:\n    external.resolve(sys.argv[1].encode(), [sys.argv[2]], "
              "'net/op', 'executable')\nexcept ExecutableError as e:\n    print('refused:', e)\n")
    data = GOLDEN.read_bytes()
    value, digest, assets = _external(tmp_path, data)
    path = _hostile(assets, kind, f"{digest}.neff")
    done = _run([sys.executable, "-c", script, value.decode(), str(path)])
    assert done.stdout.startswith("refused: NeuronOp 'net/op': "), done.stderr[-2000:]
    assert (f"more than the {len(data)} bytes" if kind == "sparse 3 GiB" else WHY[kind]) \
        in done.stdout
