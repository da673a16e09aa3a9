"""Every file neuronish writes at a path a user named is written beside it and renamed
over it (runtime/files.py `replace_atomically`): a profile's trace, a partition picture,
`neuronish run`'s outputs, the compiler's executable. A rename replaces whatever the path
names, so a path that exists and is not a regular file is refused first, with a message
naming it: `neuronish profile -o /dev/null` once replaced the machine's null device with a
file. FIFOs stand in for devices here: a FIFO replaced by a file is harmless, and seen."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neuronish.cli import output_file_name
from neuronish.runtime.executable import load_file
from neuronish.runtime.files import FileRefused, replace_atomically

NEURONISH = str(Path(sys.executable).parent / "neuronish")
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "conv_bn.neff"


def _not_a_file(directory: Path, kind: str, name: str = "out.json") -> Path:
    path = directory / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:  # a symlink to a FIFO: the link is followed, as a rename would not
        os.mkfifo(directory / "fifo")
        path.symlink_to(directory / "fifo")
    return path


def _is_fifo(path: Path) -> bool:
    return stat.S_ISFIFO(os.stat(path).st_mode)


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink to a fifo"])
def test_a_path_that_is_not_a_regular_file_is_refused_and_kept(tmp_path: Path,
                                                               kind: str) -> None:
    target = _not_a_file(tmp_path, kind)
    before = sorted(os.listdir(tmp_path))
    what = {"fifo": "a FIFO", "directory": "a directory", "symlink to a fifo": "a FIFO"}[kind]
    with pytest.raises(FileRefused, match=f"the trace would replace {what}; give the path"):
        replace_atomically(target, lambda f: f.write(b"{}"), "trace")
    assert target.is_dir() if kind == "directory" else _is_fifo(target)
    assert target.is_symlink() == (kind == "symlink to a fifo")
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file left


def test_a_file_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "new" / "trace.json"  # its directory made
    assert replace_atomically(target, lambda f: f.write(b"first"), "trace", mode=0o644) == 5
    assert target.read_bytes() == b"first" and stat.S_IMODE(target.stat().st_mode) == 0o644

    def fails_half_way(f: object) -> None:
        f.write(b"half")  # type: ignore[attr-defined]
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        replace_atomically(target, fails_half_way, "trace")
    assert target.read_bytes() == b"first"
    assert os.listdir(target.parent) == ["trace.json"]


def test_neuronish_profile_refuses_an_output_that_is_not_a_file(tmp_path: Path) -> None:
    fifo = _not_a_file(tmp_path, "fifo", "trace.json")
    r = subprocess.run([NEURONISH, "profile", str(tmp_path / "no-model"), "-o", str(fifo)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"-o {fifo}: the trace would replace a FIFO" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and _is_fifo(fifo)


def test_neuronish_run_refuses_an_output_that_is_not_a_file(tmp_path: Path) -> None:
    exe = load_file(GOLDEN)
    feeds = []
    for k, sig in enumerate(exe.inputs):
        path = tmp_path / f"in{k}.npy"
        np.save(path, np.ones(sig.shape, sig.dtype))
        feeds += ["--input", f"{sig.name}={path}"]
    out = tmp_path / "out"
    out.mkdir()
    fifo = _not_a_file(out, "fifo", output_file_name(exe.outputs[0].name))
    r = subprocess.run([NEURONISH, "run", str(GOLDEN), *feeds, "--output-dir", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert f"{fifo}: the output {exe.outputs[0].name!r} would replace a FIFO" in r.stderr
    assert "Traceback" not in r.stderr and _is_fifo(fifo)
