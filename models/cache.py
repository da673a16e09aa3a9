"""Build reference models once and reuse them across tests and benchmarks.

Layout under the cache root (`$NEURONISH_MODEL_CACHE`, else
`~/.cache/neuronish/models`):

    <name>-<key>/                    SavedModel from `models.zoo` or `models.extra` BUILDERS
    <name>-<key>-frozen-b<batch>/    `FrozenGraph.save` output (graph.pb, io_config.json, ...)

`<key>` hashes the builder/freezer sources and the TF and Keras versions, so
an edited builder or a TF upgrade gets a fresh entry instead of a stale one. A
model's entries under other keys are deleted when a new one is built, once
they have gone unused for `STALE_AFTER_S` (an older checkout may still be
using one; each use touches the entry's marker).

Every entry is built in a temporary directory next to its final place and
renamed into place, so a reader never sees half a model; a lock file makes
concurrent processes wait for the one builder instead of building twice.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from models import extra, peer_models, third_party, user_models, zoo
from models.freeze import FrozenGraph, freeze_saved_model

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX: fall back to rename-only safety
    fcntl = None  # type: ignore[assignment]

ENV_VAR = "NEURONISH_MODEL_CACHE"
STALE_AFTER_S = 3600.0
_HERE = Path(__file__).resolve().parent
# Model name -> (builder, the source file whose hash keys its cache entry).
_BUILDERS: dict[str, tuple[Callable[[str], None], str]] = {
    **{name: (build, "zoo.py") for name, build in zoo.BUILDERS.items()},
    **{name: (build, "extra.py") for name, build in extra.BUILDERS.items()},
    # keras.applications and keras_hub models, as users export them (benchmarks/zoo.py).
    **{name: (functools.partial(third_party.build, name), "third_party.py")
       for name in third_party.ALL},
    # small user-written models (keyed by the file that defines them)
    **{name: (functools.partial(third_party.build, name), "user_models.py")
       for name in user_models.NAMES},
    # sized for speed comparisons with TensorFlow and OpenVINO (benchmarks/peers.py)
    **{name: (build, "peer_models.py") for name, build in peer_models.BUILDERS.items()},
}


def default_cache_root() -> str:
    """`$NEURONISH_MODEL_CACHE`, else `~/.cache/neuronish/models`."""
    return os.environ.get(ENV_VAR) or os.path.join(
        os.path.expanduser("~"), ".cache", "neuronish", "models"
    )


def _key(*sources: str) -> str:
    import keras
    import tensorflow as tf

    digest = hashlib.sha256()
    for source in sources:
        digest.update((_HERE / source).read_bytes())
    digest.update(f"tf={tf.__version__} keras={keras.__version__}".encode())
    return digest.hexdigest()[:12]


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    if fcntl is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _drop_stale(root: str, final: str, marker: str) -> None:
    """Delete the entries of `final`'s model and kind under other keys that have gone
    unused for STALE_AFTER_S (whole models are large: the cache otherwise grows by the
    whole zoo at every edit of a builder)."""
    keyed = re.fullmatch(r"(.+)-[0-9a-f]{12}(.*)", os.path.basename(final))
    if keyed is None:  # not a keyed entry: nothing of it can be stale
        return
    name, kind = keyed.groups()
    same_model = re.compile(re.escape(name) + r"-[0-9a-f]{12}" + re.escape(kind))
    for entry in os.listdir(root):
        path = os.path.join(root, entry)
        if entry == os.path.basename(final) or not same_model.fullmatch(entry):
            continue
        try:
            idle = time.time() - os.path.getmtime(os.path.join(path, marker))
        except OSError:  # no marker: a leftover nobody can be using
            idle = float("inf")
        if idle > STALE_AFTER_S:
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.remove(path + ".lock")


def _build_atomically(final: str, marker: str, build: Callable[[str], None], root: str) -> str:
    """Run `build(tmp_dir)` and rename the result to `final` unless it exists."""
    done = os.path.join(final, marker)
    if os.path.exists(done):
        with contextlib.suppress(OSError):
            os.utime(done)  # in use: not stale
        return final
    os.makedirs(root, exist_ok=True)
    with _locked(final + ".lock"):
        if os.path.exists(done):  # another process built it while we waited
            return final
        work = tempfile.mkdtemp(prefix=os.path.basename(final) + ".tmp-", dir=root)
        try:
            target = os.path.join(work, "entry")
            build(target)
            if os.path.isdir(final):  # a broken leftover (no marker): replace it
                shutil.rmtree(final)
            try:
                os.rename(target, final)
            except OSError:
                # Lost a race with a process that does not take the lock.
                if not os.path.exists(done):
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _drop_stale(root, final, marker)
    return final


def cached_saved_model(name: str, root: str | None = None) -> str:
    """Path of the SavedModel for zoo model `name`, building it on first use."""
    if name not in _BUILDERS:
        raise KeyError(f"unknown model {name!r}; known: {sorted(_BUILDERS)}")
    build, source = _BUILDERS[name]
    root = root or default_cache_root()
    final = os.path.join(root, f"{name}-{_key(source)}")
    return _build_atomically(final, "saved_model.pb", build, root)


def cached_frozen_graph(name: str, batch_size: int, root: str | None = None) -> FrozenGraph:
    """`freeze_saved_model(cached_saved_model(name), batch_size)`, cached on disk."""
    root = root or default_cache_root()
    export_dir = cached_saved_model(name, root)
    final = os.path.join(root, f"{name}-{_key('zoo.py', 'freeze.py')}-frozen-b{batch_size}")

    def build(target: str) -> None:
        freeze_saved_model(export_dir, batch_size).save(target)

    return FrozenGraph.load(_build_atomically(final, FrozenGraph.MARKER, build, root))
