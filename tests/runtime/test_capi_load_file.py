"""Loading an executable file on the C runtime (`nr_executable_load_file`) is bounded by
what its header declares, and refuses the files Python's loader refuses in its words.

- A sparse file of gigabytes is refused within 1 GiB of address space: one whose size
  disagrees with its header before its body is read, one whose header claims its size
  but whose checksum fails: the loader cannot hold its body, so it hashes the rest a
  piece at a time without keeping it.
- A valid file is read once: the kernel's count of bytes read is its size.
- Damaged headers, sizes, checksums and sealed bodies with a bad field: the C message
  is Python's (`executable.load_file`, and runtime.load's on the Python runtime) with
  the field it names; both begin "executable file '<path>': ".
- Python's loader hashes a file's body once: read_file hashes it as it reads, and the
  parse of those bytes (ExecutableFile.parse) does not hash them again.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import runtime
from runtime import executable
from runtime.capi import binding, library
from runtime.errors import ExecutableError
from tests.runtime import executable_fuzz

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="g++ is needed to build the C runtime library")

ADDRESS_SPACE = 1 << 30
# The child loads the library by its path and nothing else (no numpy, no TensorFlow), so
# the address-space limit bounds the loader, not the interpreter's imports.
CHILD = """
import ctypes, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
lib = ctypes.CDLL(sys.argv[1])
lib.nr_executable_load_file.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                        ctypes.c_char_p, ctypes.c_size_t]
exe, error = ctypes.c_void_p(), ctypes.create_string_buffer(4096)
status = lib.nr_executable_load_file(sys.argv[2].encode(), ctypes.byref(exe), error, 4096)
print(status, error.value.decode())
"""


def _sparse(path: Path, size: int, declared_body: int, digest: bytes) -> Path:
    """A file of `size` bytes, all but its header a hole, whose header declares a body of
    `declared_body` bytes sealed by `digest`."""
    with open(path, "wb") as f:
        f.write(executable_fuzz.HEADER.pack(b"NRNISHEX", 1, 0, declared_body, digest))
        f.truncate(size)
    return path


def _load_in_bounded_child(path: Path) -> tuple[int, str]:
    lib = library.build()  # built here: the child only loads it
    r = subprocess.run([sys.executable, "-c", CHILD.format(limit=ADDRESS_SPACE), str(lib),
                        str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    status, message = r.stdout.rstrip("\n").split(" ", 1)
    return int(status), message


def test_a_sparse_file_whose_size_disagrees_is_refused_before_its_body(tmp_path: Path) -> None:
    path = _sparse(tmp_path / "huge.neff", 8 << 30, 100, bytes(32))
    status, message = _load_in_bounded_child(path)
    assert (status, message) == (3, f"executable file '{path}': executable is truncated or "
                                    f"padded: the header says the body has 100 bytes, the file "
                                    f"has {(8 << 30) - 56} (field 'header.length')")


def test_a_sparse_file_with_a_bad_checksum_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """Its header claims its size, so only the checksum can refuse it: hashed a piece at a
    time, never held (the old loader allocated the file's 2 GiB and failed with
    NR_OUT_OF_MEMORY under this limit; 8 GiB would cost it 8 GiB, and here ~40 s of
    hashing, so 2 GiB is enough to show the bound)."""
    size = 2 << 30
    path = _sparse(tmp_path / "sealed.neff", size, size - executable.HEADER_SIZE,
                   hashlib.sha256(b"something else").digest())
    status, message = _load_in_bounded_child(path)
    assert (status, message) == (3, f"executable file '{path}': executable checksum mismatch: "
                                    "the file is corrupt (recompile it or copy it again) "
                                    "(field 'header.sha256')")


def _sealed_with(change: Callable[[dict], None]) -> bytes:
    """The golden executable with `change` made to its body, sealed again: it passes the
    header, size and checksum, so only the body's own checks can refuse it."""
    import msgpack

    good = executable_fuzz.GOLDEN.read_bytes()
    body = msgpack.unpackb(good[executable.HEADER_SIZE:], raw=False, strict_map_key=False)
    change(body)
    return executable_fuzz.seal(msgpack.packb(body, use_bin_type=True))


def _damaged() -> dict[str, bytes]:
    good = executable_fuzz.GOLDEN.read_bytes()
    body = good[executable.HEADER_SIZE:]
    return {
        "arena": _sealed_with(lambda b: b["memory"].update(arena_bytes=-1)),
        "no_program": _sealed_with(lambda b: b.update(programs=[])),
        # A signature that disagrees with its value: the dtype, the shape, or both.
        "input_dtype": _sealed_with(lambda b: b["inputs"][0].update(dtype="float64")),
        "input_dtype_not_a_name": _sealed_with(lambda b: b["inputs"][0].update(dtype=7)),
        "output_dtype": _sealed_with(lambda b: b["outputs"][0].update(dtype="bfloat16")),
        "output_shape": _sealed_with(lambda b: b["outputs"][0].update(shape=[2, 9])),
        "input_type": _sealed_with(lambda b: b["inputs"][0].update(dtype="int8", shape=[2])),
        "input_batch_axis": _sealed_with(lambda b: b["inputs"][0].update(batch_axis=4)),
        "input_value": _sealed_with(lambda b: b["inputs"][0].update(value=99)),
        "input_value_not_an_id": _sealed_with(lambda b: b["inputs"][0].update(value="x")),
        "output_name": _sealed_with(lambda b: b["outputs"][0].update(name=5)),
        "long_name_dtype": _sealed_with(lambda b: b["outputs"][0].update(
            name="model/block_16_project_BN/batchnorm/add_1:0", dtype="float16")),
        "good": good, "empty": b"", "short": good[:20],
        "magic": b"XXXXXXXX" + good[8:], "magic_bytes": b"NR'\x00\t\xff\\\"" + good[8:],
        "newer": executable_fuzz.seal(body, version=2),
        "zero_version": executable_fuzz.seal(body, version=0),
        "reserved": good[:12] + struct.pack("<I", 7) + good[16:],
        "truncated": good[:-1], "padded": good + b"\0",
        "checksum": good[:-1] + bytes([good[-1] ^ 1]),
        "not_msgpack": executable_fuzz.seal(b"\xc1"),
    }


# The field the C loader names for a signature at odds with its value.
_SIGNATURE_FIELDS = {
    "input_dtype": "inputs[0].dtype", "input_dtype_not_a_name": "inputs[0].dtype",
    "output_dtype": "outputs[0].dtype", "output_shape": "outputs[0].shape",
    "input_type": "inputs[0].dtype", "input_batch_axis": "inputs[0].batch_axis",
    "input_value": "inputs[0].value", "input_value_not_an_id": "inputs[0].value",
    "output_name": "outputs[0].name", "long_name_dtype": "outputs[0].dtype",
}


@pytest.mark.parametrize("name", list(_damaged()))
def test_files_are_refused_in_pythons_words(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.neff"
    path.write_bytes(_damaged()[name])
    try:
        executable.load_file(path)
        python = None
    except ExecutableError as e:
        python = str(e)
    for where in ("python", None):  # runtime.load says the same, the C runtime tried first
        with pytest.raises(ExecutableError) if python else contextlib.nullcontext() as raised:
            runtime.load(path, runtime=where).unload()
        assert python is None or str(raised.value) == python
    lib = binding.load_library()
    exe, error = ctypes.c_void_p(), ctypes.create_string_buffer(4096)
    status = lib.nr_executable_load_file(str(path).encode(), ctypes.byref(exe), error, 4096)
    lib.nr_executable_unload(exe)
    if python is None:
        assert status == 0, error.value.decode()
        return
    message = error.value.decode()
    assert status in (3, 4), message
    named = f"executable file '{path}': "  # every refusal of a file names it, body's too
    assert python.startswith(named) and message.startswith(named), (python, message)
    if name == "not_msgpack":  # the body's readers differ (msgpack's words against ours)
        assert message.startswith(named + "executable body is malformed") and python.startswith(
            named + "executable body is malformed")
        return
    # The C loader's words are Python's with the field named (at the end, or before the
    # advice of an inconsistent body).
    field = re.compile(r" \(field '[a-z0-9._\[\]]+'\)")
    assert len(field.findall(message)) == 1, message
    assert field.sub("", message) == python
    if name in _SIGNATURE_FIELDS:
        assert f"(field '{_SIGNATURE_FIELDS[name]}')" in message, message


def test_sha256_agrees_with_hashlib_whole_and_in_pieces(tmp_path: Path) -> None:
    """nr_sha256 (the CPU's SHA extensions where it has them, else portable code) on every
    length around the block and padding edges; and a file of several 1 MiB pieces whose
    header seals its (random) body: the digest of the pieces matches, so the loader goes
    on to refuse the body itself, as it refuses the same bytes in memory (naming the
    file)."""
    import random

    lib = binding.load_library()
    lib.nr_sha256.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p]
    rng = random.Random(25)
    for n in [*range(0, 200), 1000, 4096 + 55, 65536 + 63, 1 << 20]:
        data = rng.randbytes(n)
        digest = ctypes.create_string_buffer(32)
        lib.nr_sha256(data, n, digest)
        assert digest.raw == hashlib.sha256(data).digest(), n
    path = tmp_path / "pieces.neff"
    path.write_bytes(executable_fuzz.seal(b"\xc1" + rng.randbytes(3 << 20)))
    exe, error = ctypes.c_void_p(), ctypes.create_string_buffer(4096)
    assert lib.nr_executable_load_file(str(path).encode(), ctypes.byref(exe), error, 4096) == 3
    from_file = error.value.decode()
    assert lib.nr_executable_load_bytes(path.read_bytes(), path.stat().st_size, ctypes.byref(exe),
                                        error, 4096) == 3
    assert from_file == f"executable file '{path}': " + error.value.decode()
    assert error.value.decode().startswith("executable body is malformed"), from_file


PYTHON_CHILD = """
import resource, sys
import runtime
from runtime import executable
from runtime.errors import ExecutableError
# Bounded once the imports are done: what is left is the loader's own.
in_use = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (in_use + {extra}, in_use + {extra}))
try:
    executable.read_file(sys.argv[1])
except ExecutableError as e:
    print(e)
"""


def test_pythons_loader_refuses_the_same_sparse_file_in_bounded_memory(tmp_path: Path) -> None:
    """runtime.executable.read_file hashes a piece at a time too (it read the 2 GiB whole
    first and failed with MemoryError under this bound)."""
    size = 2 << 30
    path = _sparse(tmp_path / "sealed.neff", size, size - executable.HEADER_SIZE,
                   hashlib.sha256(b"something else").digest())
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", PYTHON_CHILD.format(extra=ADDRESS_SPACE),
                        str(path)], capture_output=True, text=True, timeout=300, cwd=root,
                       env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == (f"executable file '{path}': executable checksum mismatch: the file is "
                        "corrupt (recompile it or copy it again)\n")


PORTABLE_MAIN = r"""
#include <cstdio>
#include <vector>
#include "sha256.h"
// stdin: pieces as <length> <bytes>...; stdout: the hex digest of their concatenation.
int main() {
  nr::Sha256 digest;
  size_t n;
  while (std::fread(&n, sizeof n, 1, stdin) == 1) {
    std::vector<uint8_t> piece(n);
    if (n && std::fread(piece.data(), 1, n, stdin) != n) return 2;
    digest.update(piece.data(), n);
  }
  uint8_t out[32];
  digest.finish(out);
  for (uint8_t b : out) std::printf("%02x", b);
  return 0;
}
"""


def test_the_portable_sha256_agrees_with_hashlib(tmp_path: Path) -> None:
    """The code a CPU without SHA extensions runs (this one has them, so the library's
    own digest never takes it): built alone with NR_SHA256_PORTABLE, fed in pieces."""
    import random

    src = Path(library.__file__).resolve().parent / "sha256.cc"
    (tmp_path / "main.cc").write_text(PORTABLE_MAIN)
    exe = tmp_path / "sha"
    subprocess.run(["g++", "-std=c++17", "-O1", "-DNR_SHA256_PORTABLE", f"-I{src.parent}",
                    str(src), str(tmp_path / "main.cc"), "-o", str(exe)], check=True)
    rng = random.Random(13)
    for n in [*range(0, 130), 1000, 4096 + 55, 65536 + 63]:
        data = rng.randbytes(n)
        cuts = sorted(rng.randrange(n + 1) for _ in range(rng.randrange(4)))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, n])]
        feed = b"".join(struct.pack("=Q", len(p)) + p for p in pieces)
        got = subprocess.run([str(exe)], input=feed, capture_output=True, check=True).stdout
        assert got.decode() == hashlib.sha256(data).hexdigest(), (n, cuts)


def _bytes_read_by_this_thread() -> tuple[int, int]:
    """(bytes this thread has passed through read(2) and pread(2), the kernel's `rchar`;
    bytes this call itself read to learn it, which the next call's count includes)."""
    fd = os.open("/proc/thread-self/io", os.O_RDONLY)
    try:
        text = os.read(fd, 4096)  # one read: the whole record is ~120 bytes
    finally:
        os.close(fd)
    line = next(x for x in text.decode().splitlines() if x.startswith("rchar:"))
    return int(line.split()[1]), len(text)


def _valid_file_of_pieces(path: Path) -> Path:
    """The golden executable with 3 MiB more in its stats: valid, several 1 MiB pieces."""
    import msgpack

    good = executable_fuzz.GOLDEN.read_bytes()
    body = msgpack.unpackb(good[executable.HEADER_SIZE:], raw=False, strict_map_key=False)
    body["stats"]["padding"] = "x" * (3 << 20)
    path.write_bytes(executable_fuzz.seal(msgpack.packb(body, use_bin_type=True)))
    return path


def test_a_valid_file_is_read_once_by_both_loaders(tmp_path: Path) -> None:
    """The kernel's count of the bytes the loading thread read is the file's size: the
    body is read once, hashed as it lands in the buffer that is parsed (both loaders read
    it twice before: hashed in pieces, then read whole and hashed again)."""
    path = _valid_file_of_pieces(tmp_path / "big.neff")
    size = path.stat().st_size
    lib = binding.load_library()
    exe, error = ctypes.c_void_p(), ctypes.create_string_buffer(4096)
    before, probe = _bytes_read_by_this_thread()
    status = lib.nr_executable_load_file(str(path).encode(), ctypes.byref(exe), error, 4096)
    after, _ = _bytes_read_by_this_thread()
    lib.nr_executable_unload(exe)
    assert status == 0, error.value.decode()
    assert after - before - probe == size
    before, probe = _bytes_read_by_this_thread()
    data = executable.read_file(path)
    after, _ = _bytes_read_by_this_thread()
    assert after - before - probe == size
    assert data == path.read_bytes()
    executable.from_bytes(data)


def test_pythons_file_and_bytes_readers_check_the_digest_in_one_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """read_file's check (hashed as read) and from_bytes' (read_header's) are one
    `_check_digest`, so the two cannot word a checksum mismatch differently."""
    damaged = _damaged()["checksum"]
    path = tmp_path / "checksum.neff"
    path.write_bytes(damaged)
    seen = []
    check = executable._check_digest

    def counted(body: bytes, sealed: bytes) -> None:
        seen.append(body)
        check(body, sealed)

    monkeypatch.setattr(executable, "_check_digest", counted)
    for load in (lambda: executable.read_file(path), lambda: executable.from_bytes(damaged)):
        with pytest.raises(ExecutableError, match="checksum mismatch"):
            load()
    assert seen == [hashlib.sha256(damaged[executable.HEADER_SIZE:]).digest()] * 2


class _CountingSha256:
    """hashlib.sha256 that records how many bytes it was given."""

    hashed: list[int] = []

    def __init__(self, data: bytes | memoryview = b"") -> None:
        self._digest = hashlib.sha256()
        self.update(data)

    def update(self, data: bytes | memoryview) -> None:
        if n := memoryview(data).nbytes:
            self.hashed.append(n)
        self._digest.update(data)

    def digest(self) -> bytes:
        return self._digest.digest()


def test_a_file_is_hashed_once_by_pythons_loader(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime.load(path) on the Python runtime and executable.load_file hash the body
    once, as it is read (both hashed it again in from_bytes before); bytes handed to
    from_bytes, whose origin it cannot know, are still hashed, and an ExecutableFile
    cannot be made or changed to carry bytes that were not checked."""
    import types

    path = _valid_file_of_pieces(tmp_path / "big.neff")
    body = path.stat().st_size - executable.HEADER_SIZE
    monkeypatch.setattr(executable, "hashlib", types.SimpleNamespace(sha256=_CountingSha256))
    hashed = _CountingSha256.hashed
    for load in (lambda: executable.load_file(path),
                 lambda: runtime.load(path, runtime="python").unload()):
        hashed.clear()
        load()
        assert sum(hashed) == body, hashed
    hashed.clear()
    executable.from_bytes(path.read_bytes())
    assert sum(hashed) == body
    with pytest.raises(TypeError, match="ExecutableFile.read"):
        executable.ExecutableFile(str(path), _damaged()["checksum"], object())
    file = executable.ExecutableFile.read(path)
    with pytest.raises(AttributeError):
        file.data = _damaged()["checksum"]  # type: ignore[misc]


def test_a_file_loaded_on_the_c_runtime_is_read_and_hashed_once_in_c(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime.load(path) hands the path to the C library (nr_model_load_file), which reads
    the file once, hashing it as it lands: Python neither reads nor hashes it (it read and
    hashed it, then the library hashed its copy of those bytes again)."""
    import types

    path = _valid_file_of_pieces(tmp_path / "big.neff")
    runtime.load(path, runtime="c").unload()  # (the device opened: its own reads done)
    monkeypatch.setattr(executable, "hashlib", types.SimpleNamespace(sha256=_CountingSha256))
    _CountingSha256.hashed.clear()
    before, probe = _bytes_read_by_this_thread()
    model = runtime.load(path, runtime="c")
    after, _ = _bytes_read_by_this_thread()
    model.unload()
    assert _CountingSha256.hashed == []
    assert after - before - probe == path.stat().st_size
