"""The compile cache's shared tier: executables in an object store (or any filesystem
fsspec reaches), so compile jobs on many machines reuse each other's work.

    NEURONISH_COMPILE_CACHE_REMOTE=s3://bucket/neuronish-cache   # gs://, az://, file://, ...

The local cache (`compile_cache.CompileCache`) stays the first tier and the only one
a compile reads files from: a local miss asks this tier, and a remote hit is checked,
then put into the local cache as if compiled here; what is compiled is put in both.

Entries: `<url>/<key>.neff` and `<url>/<key>.sum`, the record
`MAGIC + key + tag`, where the tag is HMAC-SHA-256(secret, key + SHA-256(executable))
when `NEURONISH_COMPILE_CACHE_REMOTE_SECRET` names a file holding a secret every
machine shares, else SHA-256(key + SHA-256(executable)). Without a secret, whoever
may write the store is trusted as the compiler is (say so to whoever grants that
access); with one, only holders of the secret can make an entry match. Either way a
torn pair (one writer's executable beside another's record, a partly written object
on a filesystem without atomic writes) does not match: it is a miss, never a wrong
hit. Objects are written whole (`pipe_file`), the record last; nothing is deleted
here (another machine may be writing the key), and size bounds come from the store's
own metadata before any byte is read. fsspec is optional: without it, or without
the variable, there is no shared tier.
"""

from __future__ import annotations

import hashlib
import hmac
import mmap
import os
import warnings

from .errors import CompileWarning
from .runtime.files import FileRefused, read_regular

ENV_REMOTE = "NEURONISH_COMPILE_CACHE_REMOTE"
ENV_REMOTE_SECRET = "NEURONISH_COMPILE_CACHE_REMOTE_SECRET"
_MAGIC = b"NRNISHR1"
_RECORD = len(_MAGIC) + 32 + 32  # magic, key, tag


class RemoteCache:
    """Executables by key under one fsspec URL."""

    def __init__(self, url: str, secret: bytes | None = None,
                 max_entry_bytes: int = 1 << 40) -> None:
        try:
            import fsspec
        except ImportError:
            raise ValueError(f"{ENV_REMOTE}={url} needs fsspec (pip install "
                             "'neuronish[remote-cache]' and the store's fsspec "
                             "driver, e.g. s3fs)") from None
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as e:
            raise ValueError(f"{ENV_REMOTE}={url}: fsspec cannot open it ({e})") from None
        self.url = url
        self.secret = secret
        self.max_entry_bytes = max_entry_bytes

    @staticmethod
    def from_env() -> RemoteCache | None:
        """The shared tier `$NEURONISH_COMPILE_CACHE_REMOTE` names, or None (unset, or it
        cannot be used: a warning says why and compiles go on without it)."""
        url = os.environ.get(ENV_REMOTE, "").strip()
        if not url:
            return None
        try:
            secret_file = os.environ.get(ENV_REMOTE_SECRET, "").strip()
            secret = read_regular(secret_file, 4096, f"{ENV_REMOTE_SECRET} file") \
                if secret_file else None
            if secret is not None and len(secret) < 16:
                raise ValueError(f"{ENV_REMOTE_SECRET} file {secret_file} holds "
                                 f"{len(secret)} bytes; give it at least 16 random bytes")
            return RemoteCache(url, secret)
        except (ValueError, FileRefused, OSError) as e:
            warnings.warn(f"shared compile cache not used: {e}", CompileWarning, stacklevel=2)
            return None

    def _path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def _record(self, key: str, executable: bytes | mmap.mmap) -> bytes:
        message = bytes.fromhex(key) + hashlib.sha256(executable).digest()
        tag = (hmac.new(self.secret, message, hashlib.sha256).digest() if self.secret
               else hashlib.sha256(message).digest())
        return _MAGIC + bytes.fromhex(key) + tag

    def _read(self, name: str, limit: int) -> bytes | None:
        """The object's bytes if it exists and its stored size is within `limit`."""
        path = self._path(name)
        try:
            size = self.fs.size(path)
        except FileNotFoundError:
            return None
        if size is None or size > limit:
            raise _Refused(f"{name} is {size} bytes, more than the {limit} expected")
        data = self.fs.cat_file(path, start=0, end=size)
        if len(data) != size:
            raise _Refused(f"{name} changed while it was read")
        return data

    def get(self, key: str) -> bytes | None:
        """The executable stored under `key`, or None: a miss, a torn or forged pair, or
        a store that cannot be read (warned about; the subgraph is compiled instead)."""
        try:
            record = self._read(f"{key}.sum", _RECORD)
            if record is None:
                return None
            executable = self._read(f"{key}.neff", self.max_entry_bytes)
        except (_Refused, OSError) as e:
            warnings.warn(f"shared compile cache {self.url}: entry {key} not used ({e})",
                          CompileWarning, stacklevel=2)
            return None
        if executable is None or not hmac.compare_digest(record, self._record(key, executable)):
            return None  # torn by a concurrent writer, or not made with this secret
        return executable

    def put(self, key: str, executable: bytes | mmap.mmap, file: str | None = None) -> None:
        """Store an executable (uploaded from `file` if given: no copy of the weights in
        memory), its record last; a store that cannot be written warns."""
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            if file is not None:
                self.fs.put_file(file, self._path(f"{key}.neff"))
            else:
                self.fs.pipe_file(self._path(f"{key}.neff"), bytes(executable))
            self.fs.pipe_file(self._path(f"{key}.sum"), self._record(key, executable))
        except OSError as e:
            warnings.warn(f"shared compile cache {self.url}: cannot store {key} ({e}); "
                          "the executable is used but not shared", CompileWarning,
                          stacklevel=2)


class _Refused(Exception):
    """An object the shared tier will not read."""
