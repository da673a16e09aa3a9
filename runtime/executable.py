"""The executable file: the one module that writes and reads it.

The compiler (writer) and the runtime (reader) both import this module, so they
cannot drift apart; tests/runtime/test_executable_format.py pins the layout with a
golden file. Layout (docs/executable-format.md):

    offset 0   8 bytes   magic b"NRNISHEX"
    offset 8   u32 LE    format version, 1 to FORMAT_VERSION
    offset 12  u32 LE    reserved, must be 0
    offset 16  u64 LE    body length in bytes
    offset 24  32 bytes  SHA-256 of the body
    offset 56  body      msgpack map (see `Executable`)
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import ml_dtypes  # noqa: F401 (gives numpy the "bfloat16" dtype of auto-cast weights)
import msgpack
import numpy as np

from . import files
from .errors import ExecutableError
from .signature import TensorSignature
from .validate import check_executable

MAGIC = b"NRNISHEX"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIIQ32s")
HEADER_SIZE = _HEADER.size  # 56
MAX_FILE_BYTES = 1 << 40  # a sanity bound; the header's declared length is the real one


@dataclass(frozen=True)
class Instruction:
    kind: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: dict
    scratch: tuple[int, int] | None  # (arena offset, bytes) of working memory
    source: tuple[str, ...]  # TF node names


@dataclass
class Executable:
    compiler: dict  # name, version, options, command line
    inputs: list[TensorSignature]
    outputs: list[TensorSignature]
    # The value id each input is read from and each output written to, in the order of
    # `inputs` and `outputs`: the program's wiring, which no caller of the model sees,
    # so it stays out of the signature records every other part shares.
    input_values: list[int]
    output_values: list[int]
    constants: dict[int, np.ndarray]
    values: dict[int, tuple[tuple[int, ...], str]]  # every non-constant value's type
    arena_bytes: int
    offsets: dict[int, int]  # value id -> arena offset (intermediates only)
    programs: list[list[Instruction]]  # one per core of the model's core group
    stats: dict = field(default_factory=dict)

    @property
    def num_cores(self) -> int:
        return len(self.programs)

    @property
    def constant_bytes(self) -> int:
        return sum(a.nbytes for a in self.constants.values())


def _sig_to_raw(s: TensorSignature, value: int) -> dict:
    # The key order is the file format's (docs/executable-format.md): msgpack keeps it.
    return {"name": s.name, "value": value, "shape": list(s.shape), "dtype": s.dtype,
            "batch_axis": s.batch_axis}


def _sig_from_raw(raw: dict) -> TensorSignature:
    return TensorSignature(raw["name"], raw["dtype"], tuple(raw["shape"]), raw["batch_axis"])


def _constant_data(a: np.ndarray) -> memoryview:
    """The array's little-endian bytes: a view of it on little-endian hosts (copies of
    the weights cost ~1 s per 500 MB)."""
    return memoryview(np.ascontiguousarray(a).astype(
        a.dtype.newbyteorder("<"), copy=False).reshape(-1).view(np.uint8))


def _bin_header(n: int) -> bytes:
    """msgpack's header of a bin of `n` bytes, as `Packer(use_bin_type=True)` writes it."""
    if n <= 0xFF:
        return b"\xc4" + n.to_bytes(1, "big")
    if n <= 0xFFFF:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


_INLINE_BYTES = 4096  # constants up to this size are copied into the packed pieces


def _body_parts(exe: Executable) -> list[bytes | memoryview]:
    """The msgpack body as pieces whose concatenation is `packb(body)`: the constants'
    data are views of the arrays, never copied into a buffer (a GB of weights copied
    into fresh memory costs ~1 s here), so the body can be hashed and written as is."""
    pack = msgpack.Packer(use_bin_type=True).pack
    small = bytearray()
    parts: list[bytes | memoryview] = []

    def item(key: str, value: object) -> None:
        small.extend(pack(key))
        small.extend(pack(value))

    small.extend(b"\x88")  # a map of the 8 keys below, in this order
    item("compiler", exe.compiler)
    item("inputs", [_sig_to_raw(s, v) for s, v in zip(exe.inputs, exe.input_values,
                                                       strict=True)])
    item("outputs", [_sig_to_raw(s, v) for s, v in zip(exe.outputs, exe.output_values,
                                                        strict=True)])
    small.extend(pack("constants"))
    small.extend(msgpack.Packer().pack_array_header(len(exe.constants)))
    # {value, shape, dtype, data}: the fixed keys packed once (a graph may hold 100,000
    # small constants); small data is copied in line, large data stays a view.
    value_key, shape_key, dtype_key, data_key = (pack(k) for k in ("value", "shape", "dtype",
                                                                   "data"))
    packed_dtypes: dict[np.dtype, bytes] = {}  # (numpy's dtype.name is slow: once each)
    for vid, a in sorted(exe.constants.items()):
        data = _constant_data(a)
        small += b"\x84" + value_key
        small += pack(vid)
        small += shape_key
        small += pack(list(a.shape))
        small += dtype_key
        dtype = packed_dtypes.get(a.dtype)
        if dtype is None:
            dtype = packed_dtypes[a.dtype] = pack(a.dtype.name)
        small += dtype
        small += data_key
        small += _bin_header(data.nbytes)
        if data.nbytes <= _INLINE_BYTES:
            small += data
        else:
            parts += (bytes(small), data)
            small.clear()
    item("values", [[vid, list(shape), dtype]
                    for vid, (shape, dtype) in sorted(exe.values.items())])
    item("memory", {"arena_bytes": exe.arena_bytes,
                    "offsets": [[vid, off] for vid, off in sorted(exe.offsets.items())]})
    item("programs", [
        [{"kind": i.kind, "in": list(i.inputs), "out": list(i.outputs), "attrs": i.attrs,
          "scratch": list(i.scratch) if i.scratch else None, "tf": list(i.source)}
         for i in program]
        for program in exe.programs
    ])
    item("stats", exe.stats)
    parts.append(bytes(small))
    return parts


def _header(parts: list[bytes | memoryview]) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return _HEADER.pack(MAGIC, FORMAT_VERSION, 0, sum(memoryview(p).nbytes for p in parts),
                        digest.digest())


def to_bytes(exe: Executable) -> bytes:
    """The executable file's bytes (one copy of the weights: the result)."""
    parts = _body_parts(exe)
    return b"".join((_header(parts), *parts))


def write(exe: Executable, file: BinaryIO) -> int:
    """Write the executable file's bytes to `file` (open for binary writing) without
    building them in memory: the weights go from the arrays to the file. Returns the
    number of bytes written. A seekable file gets the body while another thread hashes
    it (both let go of the GIL: ~1 s per GB each), then the header."""
    parts = _body_parts(exe)
    size = HEADER_SIZE + sum(memoryview(p).nbytes for p in parts)
    if not file.seekable():
        file.write(_header(parts))
        for part in parts:
            file.write(part)
        return size
    start = file.tell()
    file.write(bytes(HEADER_SIZE))  # the header's place, filled in once the hash is known
    with ThreadPoolExecutor(1, thread_name_prefix="neuronish-exe-hash") as pool:
        header = pool.submit(_header, parts)
        for part in parts:
            file.write(part)
        end = file.tell()
        file.seek(start)
        file.write(header.result())
        file.seek(end)
    return size


def header_digest(data: bytes | memoryview) -> str:
    """The SHA-256 the header records for the body, as hex, unchecked ("" when there is
    no header): a name for the executable, not a proof of it (read_header checks)."""
    if len(data) < HEADER_SIZE:
        return ""
    return _HEADER.unpack_from(data)[4].hex()


def read_header(data: bytes) -> tuple[int, int]:
    """Check magic, version, length and checksum; return (version, body length)."""
    version, length, sealed = _check_head(data)
    _check_length(length, len(data) - HEADER_SIZE)
    _check_digest(hashlib.sha256(memoryview(data)[HEADER_SIZE:]).digest(), sealed)
    return version, length


def _check_head(data: bytes) -> tuple[int, int, bytes]:
    """The header's own fields (its size, magic, version, reserved) checked; returns
    (version, body length, sealed SHA-256) as it declares them."""
    if len(data) < HEADER_SIZE:
        raise ExecutableError(f"executable is truncated: {len(data)} bytes, but the header alone "
                              f"is {HEADER_SIZE}")
    magic, version, reserved, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ExecutableError(f"not a neuronish executable: magic {magic!r}, expected {MAGIC!r}")
    if version > FORMAT_VERSION:
        raise ExecutableError(
            f"executable format version {version} is newer than this runtime reads "
            f"(up to {FORMAT_VERSION}); upgrade neuronish or recompile with this version")
    if version < 1:  # versions count from 1; 0 is what a zeroed or foreign header holds
        raise ExecutableError(f"executable format version {version} does not exist (versions "
                              f"are 1 to {FORMAT_VERSION}); the file is corrupt or not written "
                              "by neuronish-cc: recompile the model")
    if reserved != 0:
        raise ExecutableError(f"executable header's reserved field is {reserved}, expected 0; "
                              "the file is corrupt or not written by neuronish-cc: recompile "
                              "the model")
    return version, length, digest


def _check_length(declared: int, body: int) -> None:
    if declared != body:
        raise ExecutableError(f"executable is truncated or padded: the header says the body has "
                              f"{declared} bytes, the file has {body}")


def _check_digest(body: bytes, sealed: bytes) -> None:
    """Refuse a body whose SHA-256 `body` is not the `sealed` one its header records
    (read_header's and read_file's check, one message)."""
    if body != sealed:
        raise ExecutableError("executable checksum mismatch: the file is corrupt (recompile it "
                              "or copy it again)")


def read_file(path: str | os.PathLike) -> bytes:
    """An executable file's bytes, read only once its header has been checked and the
    file is the size the header declares: a FIFO, a device, or gigabytes of anything
    else (a sparse file) are refused before a byte of the body is read. The body is read
    once, hashed piece by piece as it comes, and the bytes returned are the bytes whose
    digest matched the header's. A refusal of the header, size or checksum is
    read_header's, preceded by "executable file '<path>': " (the C loader's words).
    To parse the file too, `ExecutableFile.read(path).parse()` (or `load_file`) does not
    hash the bytes a second time, as `from_bytes` of these bytes would."""
    return ExecutableFile.read(path).data


def load_file(path: str | os.PathLike) -> Executable:
    """The executable in the file at `path`, read and hashed once (`read_file`), parsed
    and validated (`from_bytes`); every refusal begins "executable file '<path>': "."""
    return ExecutableFile.read(path).parse()


_READER = object()  # what only ExecutableFile.read holds: see ExecutableFile.__init__


class ExecutableFile:
    """An executable file read by `read`: `data`, its bytes, whose body's SHA-256 matched
    its header's as they were read, and `path`. Bytes are immutable, so the digest still
    holds when `parse` reads them: it does not hash them again (from_bytes, for bytes of
    unknown origin, always does). Only `read` makes one, so bytes that were not checked
    cannot pass for checked ones."""

    __slots__ = ("_data", "_path")

    def __init__(self, path: str, data: bytes, reader: object) -> None:
        if reader is not _READER:
            raise TypeError("ExecutableFile is made by ExecutableFile.read(path) only: its "
                            "bytes are trusted to match their checksum")
        self._path, self._data = path, data

    # Read-only: bytes swapped in after the check would be parsed unchecked.
    @property
    def data(self) -> bytes:
        return self._data

    @property
    def path(self) -> str:
        return self._path

    @classmethod
    def read(cls, path: str | os.PathLike) -> ExecutableFile:
        """Read the file as `read_file` does (refusals and all)."""
        where = os.fspath(path)
        with files.open_regular(path, MAX_FILE_BYTES, "executable") as (fd, size):
            head = os.pread(fd, HEADER_SIZE, 0)
            with _naming(where):
                _, length, sealed = _check_head(head)
                _check_length(length, size - HEADER_SIZE)
                data = _read_sealed(fd, head, size, sealed)
            if data is None:
                raise MemoryError(f"out of host memory reading executable {where}: its "
                                  f"body has {length} bytes")
            return cls(where, data, _READER)

    def parse(self) -> Executable:
        """The executable, parsed and validated as `from_bytes` does, without hashing
        its body again; a refusal begins "executable file '<path>': "."""
        with _naming(self.path):
            return _parse_checked(self.data)


@contextmanager
def _naming(path: str) -> Iterator[None]:
    """An ExecutableError raised inside, preceded by "executable file '<path>': " (the C
    loader's words, nr_executable_load_file)."""
    try:
        yield
    except ExecutableError as e:
        raise ExecutableError(f"executable file '{path}': {e}") from None


def _read_sealed(fd: int, head: bytes, size: int, sealed: bytes) -> bytes | None:
    """The file, read once, its body hashed piece by piece as it comes and checked against
    `sealed`; None when the process could not hold it (the digest was still checked)."""
    # Kept while the process can hold it; past that the rest is hashed without being
    # kept, so a file whose header claims its size but whose checksum fails (gigabytes
    # of a sparse file) is still refused as corrupt, in a piece's memory.
    digest, offset = hashlib.sha256(), HEADER_SIZE
    pieces: list[bytes] | None = [head]
    while offset < size:
        try:
            piece = os.pread(fd, min(1 << 20, size - offset), offset)
            if pieces is not None:
                pieces.append(piece)
        except MemoryError:
            if pieces is None:
                raise
            pieces = None  # frees what was kept; this piece is read again
            continue
        if not piece:
            raise OSError(errno.EIO, "the executable shrank while it was read")
        digest.update(piece)
        offset += len(piece)
    _check_digest(digest.digest(), sealed)
    return None if pieces is None else b"".join(pieces)


def _array(raw: dict) -> np.ndarray:
    dtype = np.dtype(raw["dtype"]).newbyteorder("<")
    a = np.frombuffer(raw["data"], dtype=dtype)
    if dtype.byteorder not in ("=", "|") and not np.little_endian:
        a = a.astype(dtype.newbyteorder("="))
    return a.reshape(raw["shape"])


class _Unexpected(Exception):
    """A body this module did not write the way it writes: msgpack itself reads it."""


# Bytes after the type byte: fixed-size values, then (size of a length, what follows).
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
          0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
          0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)}
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}


def _header_of(buf: memoryview, pos: int) -> tuple[int, int, int]:
    """(end of the object's header, bytes of payload after it, child objects) of the
    msgpack object at `pos`."""
    if pos >= len(buf):
        raise _Unexpected
    b = buf[pos]
    if b <= 0x7F or b >= 0xE0:
        return pos + 1, 0, 0
    if b <= 0x8F:
        return pos + 1, 0, 2 * (b & 0x0F)
    if b <= 0x9F:
        return pos + 1, 0, b & 0x0F
    if b <= 0xBF:
        return pos + 1, b & 0x1F, 0
    if b in _FIXED:
        return pos + 1, _FIXED[b], 0
    if b in _SIZED:
        width, extra = _SIZED[b]
        return pos + 1 + width, int.from_bytes(buf[pos + 1:pos + 1 + width], "big") + extra, 0
    if b in _CONTAINERS:
        width, per = _CONTAINERS[b]
        return pos + 1 + width, 0, per * int.from_bytes(buf[pos + 1:pos + 1 + width], "big")
    raise _Unexpected  # 0xC1: never used


def _skip(buf: memoryview, pos: int) -> int:
    """Where the msgpack object at `pos` ends (its children included)."""
    remaining = 1
    while remaining:
        pos, payload, children = _header_of(buf, pos)
        pos += payload
        if pos > len(buf):
            raise _Unexpected
        remaining += children - 1
    return pos


def _unpack(buf: memoryview) -> object:
    return msgpack.unpackb(buf, raw=False, strict_map_key=False)


def _unpack_body(body: memoryview) -> dict[str, Any]:
    """`msgpack.unpackb(body)`, except that each constant's `data` is a view of `body`
    instead of a copy (the weights: ~1 s per GB here). The body is walked as `_body_parts`
    writes it; anything else is left to msgpack, so it is read (or refused) the same."""
    try:
        if not (0x80 <= body[0] <= 0x8F or body[0] in (0xDE, 0xDF)):  # a map
            raise _Unexpected
        pos, _, children = _header_of(body, 0)
        out: dict[str, Any] = {}
        for i in range(children // 2):
            key_end = _skip(body, pos)
            key = _unpack(body[pos:key_end])
            if key != "constants":
                end = _skip(body, key_end)
                out[key] = _unpack(body[key_end:end])
                pos = end
                continue
            out[key], pos = _constants(body, key_end)
            left = children // 2 - i - 1  # the rest holds no weights: msgpack reads it
            rest = _unpack(memoryview(bytes([0x80 | left]) + bytes(body[pos:]))) if left <= 15 \
                else None
            if not isinstance(rest, dict):
                raise _Unexpected
            out.update(rest)
            return out
        if pos != len(body):
            raise _Unexpected
        return out
    except (_Unexpected, ValueError, TypeError, msgpack.UnpackException):
        return _unpack(body)  # type: ignore[return-value]


def _constants(body: memoryview, pos: int) -> tuple[list[dict], int]:
    """The constants array at `pos` (each `data` a view) and where it ends."""
    if not (0x90 <= body[pos] <= 0x9F or body[pos] in (0xDC, 0xDD)):  # an array
        raise _Unexpected
    pos, _, count = _header_of(body, pos)
    constants = []
    for _ in range(count):
        if not (0x80 <= body[pos] <= 0x8F or body[pos] in (0xDE, 0xDF)):  # a map
            raise _Unexpected
        pos, _, fields = _header_of(body, pos)
        constant: dict[str, Any] = {}
        for _ in range(fields // 2):
            key_end = _skip(body, pos)
            key = _unpack(body[pos:key_end])
            end = _skip(body, key_end)
            if key == "data" and body[key_end] in (0xC4, 0xC5, 0xC6):
                start, size, _ = _header_of(body, key_end)
                constant[key] = body[start:start + size]
            else:
                constant[key] = _unpack(body[key_end:end])
            pos = end
        constants.append(constant)
    return constants, pos


def from_bytes(data: bytes | bytearray | memoryview | mmap.mmap) -> Executable:
    """Parse and validate an executable (header, body fields, and that its contents are
    consistent: runtime/validate.py); raises ExecutableError, never crashes. The
    constants are read-only views of `data` (not copies), which must not change."""
    read_header(data)
    return _parse_checked(data)


def _parse_checked(data: bytes | bytearray | memoryview | mmap.mmap) -> Executable:
    """from_bytes' parse and validation of bytes whose header, length and checksum were
    checked (read_header, or ExecutableFile.read as it read them)."""
    try:
        body = _unpack_body(memoryview(data).toreadonly()[HEADER_SIZE:])
        exe = Executable(
            compiler=body["compiler"],
            inputs=[_sig_from_raw(s) for s in body["inputs"]],
            outputs=[_sig_from_raw(s) for s in body["outputs"]],
            input_values=[s["value"] for s in body["inputs"]],
            output_values=[s["value"] for s in body["outputs"]],
            constants={c["value"]: _array(c) for c in body["constants"]},
            values={vid: (tuple(shape), dtype) for vid, shape, dtype in body["values"]},
            arena_bytes=body["memory"]["arena_bytes"],
            offsets=dict(body["memory"]["offsets"]),
            programs=[
                [Instruction(i["kind"], tuple(i["in"]), tuple(i["out"]), i["attrs"],
                             tuple(i["scratch"]) if i["scratch"] else None, tuple(i["tf"]))
                 for i in program]
                for program in body["programs"]
            ],
            stats=body.get("stats", {}),
        )
        check_executable(exe)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError,
            RecursionError, msgpack.UnpackException) as e:  # whatever a hostile body provokes
        raise ExecutableError(f"executable body is malformed ({type(e).__name__}: {e}); it was "
                              "not written by a compatible neuronish-cc") from None
    return exe


def describe(exe: Executable) -> dict:
    """A JSON-able summary for `neuronish-cc inspect --json`."""
    def sig(s: TensorSignature) -> dict:
        return {"name": s.name, "shape": list(s.shape), "dtype": s.dtype,
                "batch_axis": s.batch_axis}
    kinds: dict[str, int] = {}
    layouts: dict[str, int] = {}  # the layout pass's decisions (windowed outputs)
    compute: dict[str, int] = {}  # the precision matmul-like instructions read operands in
    written: dict[str, int] = {}  # dtypes of the values instructions write (assign_dtypes)
    for program in exe.programs:
        for ins in program:
            for v in ins.outputs:
                if v in exe.values:
                    dtype = exe.values[v][1]
                    written[dtype] = written.get(dtype, 0) + 1
            kinds[ins.kind] = kinds.get(ins.kind, 0) + 1
            if "layout" in ins.attrs:
                layouts[ins.attrs["layout"]] = layouts.get(ins.attrs["layout"], 0) + 1
            if "compute" in ins.attrs:
                compute[ins.attrs["compute"]] = compute.get(ins.attrs["compute"], 0) + 1
    return {
        "format_version": FORMAT_VERSION,
        "compiler": exe.compiler,
        "inputs": [sig(s) for s in exe.inputs],
        "outputs": [sig(s) for s in exe.outputs],
        "num_cores": exe.num_cores,
        "instructions_per_core": [len(p) for p in exe.programs],
        "instruction_kinds": dict(sorted(kinds.items())),
        "activation_layouts": dict(sorted(layouts.items())),
        "compute_precision": dict(sorted(compute.items())),
        "value_dtypes": dict(sorted(written.items())),
        "constants": {"count": len(exe.constants), "bytes": exe.constant_bytes},
        "memory": {"arena_bytes": exe.arena_bytes, "planned_values": len(exe.offsets)},
        "stats": exe.stats,
    }
