"""A content-addressed cache of compiled subgraphs, so that compiling the same
model again reuses every executable instead of starting `neuronish-cc` again.

    cache = CompileCache.from_env()          # None when NEURONISH_COMPILE_CACHE=off
    results = compile_with_cache(jobs, cache, stats, timeout=600, ...)

Key: SHA-256 over the subgraph's bytes (serialized deterministically, without
the debug info that names the traced function instance), its
io-config, every compiler flag (`compiler_args` and `$NEURONISH_CC_FLAGS`) and
the compiler's identity: its command line, what `--version` prints and, for
the bundled compiler, a digest of its source files (so editing the compiler
invalidates the cache even while the version number stays). A compiler whose
version cannot be read is not cached at all.

Entries: `<dir>/<key>.neff`, each `MAGIC + key + SHA-256(executable) +
executable`, written to a temporary file and renamed. An entry whose header,
key or checksum is wrong is damaged: it is deleted and the subgraph compiled
again, never loaded. Total size is bounded (`NEURONISH_COMPILE_CACHE_SIZE`):
after a write, least recently used entries (a hit refreshes an entry's mtime)
are removed until the cache fits. Only successful compiles are cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import mmap
import os
import re
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .cc_flags import env_compiler_flags
from .compile_driver import CompileJob, CompileResult, compile_all, default_compiler
from .errors import CompileWarning, SavedModelError
from .runtime.config import ConfigError, parse_bytes

ENV_CACHE_DIR = "NEURONISH_COMPILE_CACHE"
ENV_CACHE_SIZE = "NEURONISH_COMPILE_CACHE_SIZE"
DEFAULT_CACHE_DIR = "~/.cache/neuronish/compile"
DEFAULT_CACHE_SIZE = 10 << 30
_MAGIC = b"NRNISHCC"
_HEADER = len(_MAGIC) + 32 + 32  # magic, key, SHA-256 of the executable
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass
class CacheStats:
    """What the cache did in one model's compile (the report's `compile_cache`)."""

    dir: str | None = None
    hits: int = 0
    misses: int = 0
    damaged: int = 0       # entries refused (and recompiled)
    evicted: int = 0
    uncacheable: str = ""  # why the cache was not used, if it was not
    hit_names: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"dir": self.dir, "hits": self.hits, "misses": self.misses,
                "damaged": self.damaged, "evicted": self.evicted,
                **({"not_used": self.uncacheable} if self.uncacheable else {})}


def _parse_size(text: str) -> int:
    try:
        return parse_bytes(text, ENV_CACHE_SIZE)
    except ConfigError as e:
        raise SavedModelError(str(e)) from None


class CompileCache:
    """Executables by key in one directory, at most `max_bytes` in total."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int = DEFAULT_CACHE_SIZE):
        self.root = Path(root).expanduser()
        self.max_bytes = max_bytes

    @staticmethod
    def from_env() -> CompileCache | None:
        """The cache `$NEURONISH_COMPILE_CACHE` names (`off` or `0`: None)."""
        where = os.environ.get(ENV_CACHE_DIR, "").strip() or DEFAULT_CACHE_DIR
        if where.lower() in ("off", "0", "none", "false"):
            return None
        size = os.environ.get(ENV_CACHE_SIZE, "").strip()
        return CompileCache(where, _parse_size(size) if size else DEFAULT_CACHE_SIZE)

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.neff"

    def get(self, key: str, stats: CacheStats) -> bytes | None:
        """The executable stored under `key`, None on a miss; a damaged entry is removed,
        counted and warned about, and is a miss."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            warnings.warn(f"compile cache: cannot read {path} ({e}); compiling instead",
                          CompileWarning, stacklevel=3)
            return None
        exe = data[_HEADER:]
        if (data[:len(_MAGIC)] != _MAGIC or data[len(_MAGIC):len(_MAGIC) + 32] !=
                bytes.fromhex(key) or data[len(_MAGIC) + 32:_HEADER] !=
                hashlib.sha256(exe).digest()):
            stats.damaged += 1
            warnings.warn(f"compile cache: entry {path} is damaged (its header or checksum "
                          "does not match); removed it and compiling the subgraph again",
                          CompileWarning, stacklevel=3)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used: evicted last
        return exe

    def put(self, key: str, executable: bytes, stats: CacheStats) -> None:
        """Store an executable (atomically); a cache that cannot be written only warns."""
        if len(executable) + _HEADER > self.max_bytes:
            return  # would evict everything and still not fit
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.root)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_MAGIC + bytes.fromhex(key) + hashlib.sha256(executable).digest())
                    f.write(executable)
                os.replace(tmp, self._path(key))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as e:
            warnings.warn(f"compile cache: cannot write to {self.root} ({e}); the executable "
                          f"is used but not cached. Set {ENV_CACHE_DIR}=DIR or "
                          f"{ENV_CACHE_DIR}=off", CompileWarning, stacklevel=3)
            return
        stats.evicted += self.evict()

    def evict(self) -> int:
        """Remove least recently used entries until the cache fits; returns how many."""
        entries = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                if entry.name.endswith(".neff") and _KEY.fullmatch(entry.name[:-5]):
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        entries.append((st.st_mtime_ns, st.st_size, entry.path))
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed += 1
            total -= size
        return removed


def _source_digest() -> str:
    """Digest of the bundled compiler's sources and the executable-format writer."""
    h = hashlib.sha256()
    for package in ("neuronish.cc", "neuronish.runtime"):
        spec = importlib.util.find_spec(package)
        roots = list(spec.submodule_search_locations or []) if spec else []
        for root in roots:
            for path in sorted(Path(root).rglob("*.py")):
                if package == "neuronish.runtime" and path.name not in (
                        "executable.py", "validate.py"):
                    continue
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def compiler_identity(command: Sequence[str]) -> str | None:
    """What identifies the compiler `command` runs, or None if its version cannot be read."""
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, timeout=60,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return json.dumps([list(command), done.stdout.decode(errors="replace").strip(),
                       _source_digest()])


def _stable_graph_bytes(graph_def: bytes | mmap.mmap) -> bytes | mmap.mmap:
    """The subgraph without `experimental_debug_info`, which names the traced function
    instance (`__inference_serve_293`): a counter that differs between two loads of the
    same SavedModel, even in one process. The compiler does not read it."""
    if graph_def.find(b"__inference_") < 0:  # a fast scan; parsing costs ~0.3 s per 100 MB
        return graph_def
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef.FromString(bytes(graph_def))
    for node in graph.node:
        node.ClearField("experimental_debug_info")
    for function in graph.library.function:
        for node in function.node_def:
            node.ClearField("experimental_debug_info")
    return graph.SerializeToString(deterministic=True)


def cache_key(job: CompileJob, identity: str, env_flags: Sequence[str]) -> str:
    with contextlib.ExitStack() as stack:
        graph = job.graph_def
        if not isinstance(graph, (bytes, bytearray, memoryview)):  # a file: mapped, not read
            f = stack.enter_context(open(graph, "rb"))
            graph = b"" if os.fstat(f.fileno()).st_size == 0 else \
                stack.enter_context(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        return _key(_stable_graph_bytes(graph), job, identity, env_flags)


def _key(graph: bytes | mmap.mmap, job: CompileJob, identity: str,
         env_flags: Sequence[str]) -> str:
    h = hashlib.sha256()
    for part in (graph,
                 json.dumps(job.io_config, sort_keys=True).encode(),
                 json.dumps([*job.compiler_args, *env_flags]).encode(), identity.encode()):
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
    for i, (job, key) in enumerate(zip(jobs, keys, strict=True)):
        exe = cache.get(key, stats)
        if exe is None:
            todo.append(i)
            continue
        stats.hits += 1
        stats.hit_names.append(job.name)
        results[i] = CompileResult(job.name, ok=True, executable=exe, seconds=0.0,
                                   outcome="compiled", cached=True)
    stats.misses += len(todo)
    compiled = compile_all([jobs[i] for i in todo], compiler=compiler,
                           **compile_all_kwargs)  # type: ignore[arg-type]
    for i, result in zip(todo, compiled, strict=True):
        results[i] = result
        if result.ok and result.executable is not None:
            cache.put(keys[i], result.executable, stats)
    return [results[i] for i in range(len(jobs))]
