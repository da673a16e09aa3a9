"""A content-addressed cache of compiled subgraphs, so that compiling the same
model again reuses every executable instead of starting `neuronish-cc` again.

    cache = CompileCache.from_env()          # None when NEURONISH_COMPILE_CACHE=off
    results = compile_with_cache(jobs, cache, stats, timeout=600, ...)

Key: SHA-256 over the subgraph's bytes (serialized deterministically, without
the debug info that names the traced function instance), its
io-config, every compiler flag (`compiler_args` and `$NEURONISH_CC_FLAGS`) and
the compiler's identity: its command line and what `--version` prints, which for
the bundled compiler includes a digest of its source files (so editing the compiler
invalidates the cache even while the version number stays). A compiler whose
version cannot be read is not cached at all. The C host's NeuronOp
(neuronish/ops/neuron_op_compile_cache.h) reads and writes the same entries under
the same keys.

Entries: `<dir>/<key>.neff`, the executable itself, and `<dir>/<key>.sum`, its
checksum record `MAGIC + key + HMAC-SHA-256(secret, key + SHA-256(executable))`,
the secret being 32 random bytes in `<dir>/.secret` (0600): a record rewritten by
anything but this cache (another executable's checksum, an fp16 entry presented
under an fp32 key) does not match. The directory follows the rule of every
neuronish cache (runtime/buildcache.py: a real directory of ours that nobody else
can write, else the cache is not used and a warning says why); entries and records
are read only if they are regular files of ours (no symlinks, no FIFOs) of the size
expected, through runtime/files.py. A hit hands out its own hard link of the very
file it checked (through /proc/self/fd), so a concurrent re-put of the key that
renames a new file over the entry cannot change what the caller links. The executable is hard-linked
from the compiler's output where the filesystem allows (no copy of the weights: 1.4
GB for ConvNeXtXLarge), and a hit hands out the entry's file, which export links
into the new SavedModel likewise; each file is written under a temporary name and
renamed, the record last. An entry whose record is wrong or whose executable does
not hash to it is damaged: both files are deleted and the subgraph compiled again,
never loaded (an executable without a record is a miss). Total size is bounded
(`NEURONISH_COMPILE_CACHE_SIZE`): after a write, least recently used entries (a hit
refreshes an entry's mtime) are removed until the cache fits. Only successful
compiles are cached. Behind this cache, a tier many machines share
(`$NEURONISH_COMPILE_CACHE_REMOTE`, an fsspec URL: remote_cache.py) answers its
misses and receives what is compiled.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import mmap
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .cc_flags import env_compiler_flags
from .compile_driver import CompileJob, CompileResult, compile_all, default_compiler
from .errors import CompileWarning, SavedModelError
from .remote_cache import RemoteCache
from .runtime.buildcache import BuildError, Cache
from .runtime.config import ConfigError, parse_bytes
from .runtime.files import FileRefused, open_regular, read_regular

ENV_CACHE_DIR = "NEURONISH_COMPILE_CACHE"
ENV_CACHE_SIZE = "NEURONISH_COMPILE_CACHE_SIZE"
DEFAULT_CACHE_DIR = "~/.cache/neuronish/compile"
DEFAULT_CACHE_SIZE = 10 << 30
_MAGIC = b"NRNISHC2"  # 2: the record's checksum is keyed with the cache's secret
_RECORD = len(_MAGIC) + 32 + 32  # magic, key, HMAC-SHA-256
_SECRET = ".secret"
_MAX_ENTRY_BYTES = 1 << 40  # a sanity bound; the record's checksum is the real check
_STALE_TMP_S = 3600.0  # a temporary file this old was left by a process that died writing it


class UntrustedCache(BuildError):
    """The compile cache's directory could have been written by another user."""
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass
class CacheStats:
    """What the cache did in one model's compile (the report's `compile_cache`)."""

    dir: str | None = None
    hits: int = 0
    misses: int = 0
    damaged: int = 0       # entries refused (and recompiled)
    evicted: int = 0
    shared_hits: int = 0   # of `hits`, how many came from the shared tier
    uncacheable: str = ""  # why the cache was not used, if it was not
    hit_names: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"dir": self.dir, "hits": self.hits, "misses": self.misses,
                "damaged": self.damaged, "evicted": self.evicted,
                **({"shared_hits": self.shared_hits} if self.shared_hits else {}),
                **({"not_used": self.uncacheable} if self.uncacheable else {})}


def _parse_size(text: str) -> int:
    try:
        return parse_bytes(text, ENV_CACHE_SIZE)
    except ConfigError as e:
        raise SavedModelError(str(e)) from None


class CompileCache:
    """Executables by key in one directory, at most `max_bytes` in total."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int = DEFAULT_CACHE_SIZE,
                 shared: RemoteCache | None = None):
        self.root = Path(root).expanduser()
        self.max_bytes = max_bytes
        self.shared = shared  # the tier other machines share (remote_cache.py), if any
        self._secret: bytes | None = None

    def secure(self) -> None:
        """Create the directory 0700 or check it can be trusted, and read (or make) its
        secret. Raises UntrustedCache, or OSError if it cannot be written."""
        Cache(self.root, "compile cache", ENV_CACHE_DIR, UntrustedCache,
              risk="could make this process use executables it did not compile",
              title="the").secure()
        path = self.root / _SECRET
        try:
            self._secret = self._read_secret(path)
            return
        except FileNotFoundError:
            pass
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
            with contextlib.suppress(FileExistsError):  # another process made one first
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
        self._secret = self._read_secret(path)

    def _read_secret(self, path: Path) -> bytes:
        with open_regular(path, 32, "compile cache's secret", follow_symlinks=False) as (fd, _):
            _check_ours(path, os.fstat(fd), "compile cache's secret", private=True)
            secret = os.read(fd, 33)
        if len(secret) != 32:
            raise UntrustedCache(f"the compile cache's secret {path} has {len(secret)} bytes, "
                                 f"not 32; remove it (a new one is made) or set "
                                 f"{ENV_CACHE_DIR} to another directory")
        return secret

    def _seal(self, key: str, executable: bytes | mmap.mmap) -> bytes:
        if self._secret is None:
            self.secure()
        assert self._secret is not None
        mac = hmac.new(self._secret, bytes.fromhex(key) + hashlib.sha256(executable).digest(),
                       hashlib.sha256).digest()
        return _MAGIC + bytes.fromhex(key) + mac

    @staticmethod
    def from_env() -> CompileCache | None:
        """The cache `$NEURONISH_COMPILE_CACHE` names (`off` or `0`: None)."""
        where = os.environ.get(ENV_CACHE_DIR, "").strip() or DEFAULT_CACHE_DIR
        if where.lower() in ("off", "0", "none", "false"):
            return None
        size = os.environ.get(ENV_CACHE_SIZE, "").strip()
        return CompileCache(where, _parse_size(size) if size else DEFAULT_CACHE_SIZE,
                            RemoteCache.from_env())

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.neff"

    def _record(self, key: str) -> Path:
        return self.root / f"{key}.sum"

    def get(self, key: str, stats: CacheStats) -> bytes | None:
        """The executable stored under `key`, None on a miss (see `lookup`)."""
        found = self.lookup(key, stats)
        return None if found is None else bytes(found[0])

    def lookup(self, key: str, stats: CacheStats, into: str | os.PathLike[str] | None = None
               ) -> tuple[bytes | mmap.mmap, str | None] | None:
        """(the executable stored under `key`, mapped read-only; a file holding it), None
        on a miss; a damaged entry is removed, counted and warned about, and is a miss.

        The file is a hard link of the very file checked, made in `into` (a directory
        the caller owns), so nothing renamed over the entry meanwhile reaches the
        caller; without `into`, the entry's own path (read it only if you trust no
        one re-puts the key meanwhile)."""
        path = self._path(key)
        try:
            record = read_regular(self._record(key), _RECORD, "compile-cache record",
                                  follow_symlinks=False)
            with open_regular(path, _MAX_ENTRY_BYTES, "compile-cache entry",
                              follow_symlinks=False) as (fd, size):
                _check_ours(path, os.fstat(fd), "compile-cache entry")
                exe = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
                if not hmac.compare_digest(record, self._seal(key, exe)):
                    raise _Damaged("its record or checksum does not match")
                file = str(path) if into is None else _own_link(fd, exe, Path(into), key)
        except FileNotFoundError:
            return None
        except (_Damaged, FileRefused, UntrustedCache) as e:
            stats.damaged += 1
            warnings.warn(f"compile cache: entry {path} is damaged or untrusted ({e}); "
                          "removed it and compiling the subgraph again",
                          CompileWarning, stacklevel=3)
            for stale in (self._record(key), path):
                with contextlib.suppress(OSError):
                    stale.unlink()
            return None
        except OSError as e:
            warnings.warn(f"compile cache: cannot read {path} ({e}); compiling instead",
                          CompileWarning, stacklevel=3)
            return None
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)  # most recently used: evicted last
        return exe, file

    def put(self, key: str, executable: bytes | mmap.mmap, stats: CacheStats,
            file: str | None = None) -> None:
        """Store an executable (atomically): `file`, if given, holds its bytes and is
        hard-linked where it can be. A cache that cannot be written only warns."""
        if len(executable) + _RECORD > self.max_bytes:
            return  # would evict everything and still not fit
        try:
            record = self._seal(key, executable)
            self._place(self._path(key), executable, file)
            self._place(self._record(key), record, None)
        except (OSError, UntrustedCache) as e:
            warnings.warn(f"compile cache: cannot write to {self.root} ({e}); the executable "
                          f"is used but not cached. Set {ENV_CACHE_DIR}=DIR or "
                          f"{ENV_CACHE_DIR}=off", CompileWarning, stacklevel=3)
            return
        stats.evicted += self.evict()

    def _place(self, target: Path, data: bytes | mmap.mmap, file: str | None) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.root)
        try:
            linked = False
            if file is not None:
                os.close(fd)
                fd = -1
                os.unlink(tmp)  # a link needs a free name; mkstemp only reserved one
                try:
                    os.link(file, tmp)
                    linked = True
                except OSError:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            if not linked:
                with os.fdopen(fd, "wb") as f:
                    fd = -1
                    f.write(data)
            os.replace(tmp, target)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def evict(self) -> int:
        """Remove least recently used entries until the cache fits; returns how many. Also
        removes temporary files older than an hour (a process killed while it wrote one
        leaves it, outside the size bound)."""
        entries = []
        stale = time.time() - _STALE_TMP_S
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                if entry.name.startswith(".tmp-"):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < stale:
                            os.unlink(entry.path)
                    continue
                if entry.name.endswith(".neff") and _KEY.fullmatch(entry.name[:-5]):
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        entries.append((st.st_mtime_ns, st.st_size + _RECORD, entry.name[:-5]))
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, key in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))
                removed += 1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._record(key))
            total -= size
        return removed


class _Damaged(Exception):
    """An entry that does not match its record."""


def _check_ours(path: Path, st: os.stat_result, what: str, private: bool = False) -> None:
    """A cache file must be ours and writable by nobody else (`private`: readable by
    nobody else either); raises UntrustedCache naming it."""
    if st.st_uid != os.getuid():
        raise UntrustedCache(f"the {what} {path} belongs to uid {st.st_uid}, not to you")
    if st.st_mode & (0o077 if private else 0o022):
        raise UntrustedCache(f"the {what} {path} has mode {st.st_mode & 0o777:04o}; others "
                             f"may {'read or ' if private else ''}write it")


def _own_link(fd: int, data: bytes | mmap.mmap, into: Path, key: str) -> str:
    """A new name in `into` for the file open at `fd` (the inode checked, whatever now
    sits at its path), else a copy of `data`, which was read from it."""
    handle, name = tempfile.mkstemp(prefix=f"{key[:16]}.", suffix=".neff", dir=into)
    os.close(handle)
    os.unlink(name)  # a link needs a free name; the directory is the caller's alone
    target = Path(name)
    try:  # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N: os.link uses it only given a dir fd
        fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.link(str(fd), target, src_dir_fd=fds, follow_symlinks=True)
        finally:
            os.close(fds)
    except OSError:  # no /proc, or another filesystem: the checked bytes, copied
        with open(target, "xb") as f:
            f.write(data)
    return str(target)


def compiler_identity(command: Sequence[str]) -> str | None:
    """What identifies the compiler `command` runs: the command and what its `--version`
    prints (the bundled compiler's includes a digest of its sources, cc/identity.py), as
    JSON; None if its version cannot be read. The C host computes the same text
    (neuronish/ops/neuron_op_compile_cache.h), so the two share entries."""
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, timeout=60,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return json.dumps([canonical_command(command), done.stdout.decode(errors="replace").strip()])


def canonical_command(command: Sequence[str]) -> list[str]:
    """`command` with its program as the key writes it: looked up on PATH (a word without a
    slash), then its real path; the word itself if not found. The two hosts name the same
    compiler differently (the venv's script by its path here, `neuronish-cc` on PATH in the
    C host) and must key it the same."""
    program = command[0]
    found = shutil.which(program) if "/" not in program else program
    if found is None or not os.path.exists(found):
        return list(command)
    return [os.path.realpath(found), *command[1:]]


def _stable_graph_bytes(graph_def: bytes) -> bytes:
    """The subgraph without `experimental_debug_info`, which names the traced function
    instance (`__inference_serve_293`): a counter that differs between two loads of the
    same SavedModel, even in one process. The compiler does not read it."""
    if graph_def.find(_MARK) < 0:  # a fast scan; parsing costs ~0.3 s per 100 MB
        return graph_def
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef.FromString(graph_def)
    for node in graph.node:
        node.ClearField("experimental_debug_info")
    for function in graph.library.function:
        for node in function.node_def:
            node.ClearField("experimental_debug_info")
    return graph.SerializeToString(deterministic=True)


def cache_key(job: CompileJob, identity: str, env_flags: Sequence[str]) -> str:
    graph = job.graph_def
    if not isinstance(graph, (bytes, bytearray, memoryview)):  # a file
        streamed = _key_from_file(graph, job, identity, env_flags)
        if streamed is not None:
            return streamed
        with open(graph, "rb") as f:
            graph = f.read()
    return _key(_stable_graph_bytes(bytes(graph)), job, identity, env_flags)


_MARK = b"__inference_"


def _key_from_file(path: str | os.PathLike[str], job: CompileJob, identity: str,
                   env_flags: Sequence[str]) -> str | None:
    """`_key` of the file's bytes, hashed as they are read and scanned for the debug
    info `_stable_graph_bytes` drops (one pass: 1.4 s for 1.4 GB instead of 2.5);
    None if the file has some (then the bytes must be parsed)."""
    digest = hashlib.sha256()
    buf = bytearray(8 << 20)
    tail = b""
    with open(path, "rb", buffering=0) as f:
        digest.update(os.fstat(f.fileno()).st_size.to_bytes(8, "little"))
        while n := f.readinto(buf):
            view = memoryview(buf)[:n]
            if (tail + bytes(view[:len(_MARK) - 1])).find(_MARK) >= 0 or \
                    buf.find(_MARK, 0, n) >= 0:
                return None
            tail = bytes(view[max(0, n - len(_MARK) + 1):])
            digest.update(view)
    return _key(b"", job, identity, env_flags, digest)


# Flags whose value is a file the compiler reads: the key takes the file's contents, not
# its path (an int8 compile's calibration file is written to a new scratch directory on
# every compile, so a path in the key would never be found again).
_FILE_FLAGS = ("--calibration",)


def _flags_for_key(flags: Sequence[str]) -> list[str]:
    """`flags` with each file a _FILE_FLAGS flag names replaced by its SHA-256 (left as
    the path if it cannot be read: then the key is new, and the compile runs)."""
    def content(path: str) -> str:
        try:
            with open(path, "rb") as f:
                return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
        except OSError:
            return path

    out = list(flags)
    for k, flag in enumerate(out):
        name, eq, value = flag.partition("=")
        if name in _FILE_FLAGS and eq:
            out[k] = f"{name}={content(value)}"
        elif flag in _FILE_FLAGS and k + 1 < len(out):
            out[k + 1] = content(out[k + 1])
    return out


def _key(graph: bytes, job: CompileJob, identity: str, env_flags: Sequence[str],
         digest: hashlib._Hash | None = None) -> str:
    """SHA-256 over each part's length and bytes; `digest`, if given, has taken the
    graph's already (and `graph` is then not used)."""
    h = digest or hashlib.sha256()
    parts = [graph] if digest is None else []
    flags = _flags_for_key([*job.compiler_args, *env_flags])
    for part in (*parts, json.dumps(job.io_config, sort_keys=True).encode(),
                 json.dumps(flags).encode(), identity.encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def compile_with_cache(jobs: Sequence[CompileJob], cache: CompileCache | None,
                       stats: CacheStats, *, compiler: Sequence[str] | None = None,
                       **compile_all_kwargs: object) -> list[CompileResult]:
    """`compile_all(jobs, ...)` that takes what it can from `cache` and stores what it
    compiles there; results in job order, hits marked `cached=True`."""
    jobs = list(jobs)
    if cache is None:
        stats.uncacheable = stats.uncacheable or f"{ENV_CACHE_DIR}=off"
        return compile_all(jobs, compiler=compiler, **compile_all_kwargs)  # type: ignore[arg-type]
    stats.dir = str(cache.root)
    if jobs:
        try:
            cache.secure()
        except (UntrustedCache, OSError) as e:
            reason = str(e) if isinstance(e, UntrustedCache) else \
                f"cannot create {cache.root}: {e.strerror}"
            warnings.warn(f"compile cache not used: {reason}", CompileWarning, stacklevel=2)
            stats.uncacheable = reason
            return compile_all(jobs, compiler=compiler, **compile_all_kwargs)  # type: ignore[arg-type]
    command = list(compiler) if compiler is not None else default_compiler()
    identity = compiler_identity(command) if jobs else None
    if identity is None:
        if jobs:
            stats.uncacheable = f"`{' '.join(command)} --version` failed"
        return compile_all(jobs, compiler=compiler, **compile_all_kwargs)  # type: ignore[arg-type]
    env_flags = env_compiler_flags()
    keys = [cache_key(job, identity, env_flags) for job in jobs]
    results: dict[int, CompileResult] = {}
    todo: list[int] = []
    into = compile_all_kwargs.get("executables_dir")
    for i, (job, key) in enumerate(zip(jobs, keys, strict=True)):
        found = cache.lookup(key, stats, into)  # type: ignore[arg-type]
        if found is None and cache.shared is not None:
            found = _from_shared(cache, key, stats, into)  # type: ignore[arg-type]
        if found is None:
            todo.append(i)
            continue
        stats.hits += 1
        stats.hit_names.append(job.name)
        results[i] = CompileResult(job.name, ok=True, executable=found[0], seconds=0.0,
                                   outcome="compiled", cached=True, executable_file=found[1])
    stats.misses += len(todo)
    compiled = compile_all([jobs[i] for i in todo], compiler=compiler,
                           **compile_all_kwargs)  # type: ignore[arg-type]
    for i, result in zip(todo, compiled, strict=True):
        results[i] = result
        if result.ok and result.executable is not None:
            cache.put(keys[i], result.executable, stats, result.executable_file)
            if cache.shared is not None:
                cache.shared.put(keys[i], result.executable, result.executable_file)
    return [results[i] for i in range(len(jobs))]


def _from_shared(cache: CompileCache, key: str, stats: CacheStats,
                 into: str | None) -> tuple[bytes | mmap.mmap, str | None] | None:
    """A local miss the shared tier has: checked there, stored here, read back from here
    (so the caller gets a file of the local cache as on any hit)."""
    assert cache.shared is not None
    executable = cache.shared.get(key)
    if executable is None:
        return None
    cache.put(key, executable, stats)
    found = cache.lookup(key, stats, into)  # None if the local tier could not take it
    stats.shared_hits += found is not None
    return found
