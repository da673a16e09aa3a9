"""Reading a file that came from outside: a regular file, of a declared size, at most
so deep when it is JSON; and writing one a user named, whole or not at all.

Every file neuronish reads that a user, another process or a copied directory
could have put there (SavedModel assets, device models, run-directory records,
compile-cache entries) goes through `read_regular`. A path that is a FIFO would
block the reader forever, a symlink to /dev/zero never ends, and a sparse file
declares gigabytes it does not occupy; so the file is opened without blocking
(O_NONBLOCK: a FIFO opens at once), checked on the open descriptor (fstat: the
file checked is the file read, whatever is renamed meanwhile) to be a regular
file within `max_bytes`, and only then read, never past `max_bytes`.

`FileRefused` is an OSError, so callers that already report "cannot read X: why"
report these too, with `strerror` saying what is wrong and what was expected.

A file neuronish writes at a path a user gave (a profile's trace, a partition picture,
an executable) goes through `replace_atomically`: written beside the path and renamed
over it, so no reader sees half a file. A rename replaces whatever the path names, so a
path that exists and is not a regular file is refused first: `neuronish profile -o
/dev/null` once replaced the machine's null device with a file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

T = TypeVar("T")

MAX_JSON_DEPTH = 64  # nesting of any JSON neuronish reads; ours nest 4 deep at most


class FileRefused(OSError):
    """A file that is not a regular file, is larger than its reader allows, or (JSON)
    nests deeper than `MAX_JSON_DEPTH`."""

    def __init__(self, path: str | os.PathLike, reason: str):
        super().__init__(errno.EINVAL, reason, os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def _size_text(n: int) -> str:
    return f"{n} bytes" if n < 1 << 20 else f"{n} bytes ({n / 2**20:.1f} MiB)"


@contextlib.contextmanager
def open_regular(path: str | os.PathLike, max_bytes: int, what: str = "file", *,
                 follow_symlinks: bool = True) -> Iterator[tuple[int, int]]:
    """(descriptor, size) of `path`, checked to be a regular file of at most
    `max_bytes`; the descriptor is closed on leaving. With `follow_symlinks=False` a
    symlink at `path` itself is refused, for directories whose entries must be the
    files themselves (caches, run dirs). Raises OSErrors as `open` does, and
    FileRefused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise FileRefused(path, f"the {what} is a symlink; it must be the file itself "
                                    "(remove the link)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(path, f"the {what} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise FileRefused(path, f"the {what} has {_size_text(st.st_size)}, more than the "
                                    f"{_size_text(max_bytes)} allowed")
        yield fd, st.st_size
    finally:
        os.close(fd)


def read_fd(fd: int, path: str | os.PathLike, max_bytes: int, what: str = "file") -> bytes:
    """The rest of an open file, refusing it if it holds more than `max_bytes` (a file
    growing while read stops at the bound too)."""
    chunks, have = [], 0
    while have <= max_bytes:
        chunk = os.read(fd, min(max_bytes + 1 - have, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        have += len(chunk)
    if have > max_bytes:
        raise FileRefused(path, f"the {what} grew past {_size_text(max_bytes)} while read")
    return b"".join(chunks)


def read_regular(path: str | os.PathLike, max_bytes: int, what: str = "file", *,
                 follow_symlinks: bool = True) -> bytes:
    """The contents of `path`, a regular file of at most `max_bytes` (`open_regular`)."""
    with open_regular(path, max_bytes, what, follow_symlinks=follow_symlinks) as (fd, _):
        return read_fd(fd, path, max_bytes, what)


def json_depth(value: object) -> int:
    """How deeply lists and objects nest in a parsed JSON value (iterative: any depth)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            stack += [(x, depth + 1) for x in item]
    return deepest


def parse_json(data: bytes | str, path: str | os.PathLike, what: str = "file",
               max_depth: int = MAX_JSON_DEPTH) -> object:
    """`data` (the contents of `path`) as JSON, nesting at most `max_depth` deep.
    Raises FileRefused for text that is not JSON or nests deeper."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise FileRefused(path, f"the {what} nests deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise FileRefused(path, f"the {what} is not JSON ({e})") from None
    if json_depth(value) > max_depth:
        raise FileRefused(path, f"the {what} nests deeper than {max_depth} levels")
    return value


def read_json(path: str | os.PathLike, max_bytes: int, what: str = "file", *,
              follow_symlinks: bool = True, max_depth: int = MAX_JSON_DEPTH) -> object:
    """`read_regular` then `parse_json`."""
    return parse_json(read_regular(path, max_bytes, what, follow_symlinks=follow_symlinks),
                      path, what, max_depth)


def check_write_target(path: str | os.PathLike, what: str = "file") -> None:
    """Raises FileRefused when `path` exists (links followed) and is not a regular file:
    a device, FIFO, socket or directory is never replaced by the file meant for it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(path, f"the {what} would replace {_kind(st.st_mode)}; give the "
                                f"path of a file to write")


def replace_atomically(path: str | os.PathLike, fill: Callable[[BinaryIO], T],
                       what: str = "file", mode: int | None = None) -> T:
    """`fill`'s result, after it wrote the bytes of `path` into a temporary file beside it
    that then replaced `path` (permissions `mode`, else mkstemp's 0600). Nothing is left
    behind when `fill` or the rename fails. FileRefused (check_write_target) before
    anything is written."""
    path = Path(path)
    check_write_target(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            out = fill(f)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
