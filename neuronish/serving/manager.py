"""Which versions of which models are loaded, and handing them to requests.

What TF Serving's FileSystemStoragePathSource + AspiredVersionsManager do:

* Every `file_system_poll_wait_seconds` each model's base path is listed; its
  numeric subdirectories are its versions, and the version policy (`latest`
  N, default 1; `all`; `specific`) picks the *aspired* ones.
* Aspired versions are loaded in the background; a load that fails is retried
  `max_num_load_retries` times, then the version ends in state END with the
  error, which GetModelStatus reports; the other versions keep serving.
* Availability first (TF Serving's AvailabilityPreservingPolicy): a version
  that is no longer aspired is unloaded only once an aspired version is
  available, so rolling 1 -> 2 never leaves a gap, and a broken version 2
  leaves version 1 serving.
* A request holds a reference to its version (`acquire`); unloading takes the
  version out of reach of new requests at once, then waits for the requests
  already holding it before releasing the model.

One difference: a numeric directory without `saved_model.pb(txt)` is not a
version yet. Copying a model into place is not atomic, and TF Serving would
try (and fail) to load a half-copied directory; here it is picked up on the
poll after the file appears. Renaming a finished directory into place is still
the safe way to publish.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.config import model_server_config_pb2

from .. import kernel_bridge
from .servable import Servable, load_servable
from .signatures import accepted_shape_changes
from .status import (
    FAILED_PRECONDITION,
    PERMISSION_DENIED,
    UNKNOWN,
    ServingError,
    invalid_argument,
    not_found,
)

log = logging.getLogger("neuronish.serving")
State = get_model_status_pb2.ModelVersionStatus.State
ModelConfig = model_server_config_pb2.ModelConfig
Loader = Callable[[str, int, str], Servable]


@dataclass
class _VersionState:
    state: int
    error: ServingError | None = None


@dataclass
class _Model:
    config: ModelConfig
    states: dict[int, _VersionState] = field(default_factory=dict)
    servables: dict[int, Servable] = field(default_factory=dict)  # the AVAILABLE ones
    loading: set[int] = field(default_factory=set)
    first_try: set[int] = field(default_factory=set)  # loading, first attempt not over
    failed: set[int] = field(default_factory=set)  # not retried while still on disk
    on_disk: list[int] | None = None
    labels: dict[str, int] = field(default_factory=dict)
    removed: bool = False
    warned: set[str] = field(default_factory=set)
    # Set by a HandleReloadConfigRequest: the real paths its version directories must lie
    # under (a version symlinked out of them is not served); None = not confined.
    confine: tuple[str, ...] | None = None


def aspired_versions(policy: object, on_disk: Sequence[int]) -> list[int]:
    """The versions `policy` (a ServableVersionPolicy) wants, of those on disk."""
    versions = sorted(on_disk)
    choice = policy.WhichOneof("policy_choice")  # type: ignore[attr-defined]
    if choice == "all":
        return versions
    if choice == "specific":
        wanted = set(policy.specific.versions)  # type: ignore[attr-defined]
        return [v for v in versions if v in wanted]
    n = policy.latest.num_versions if choice == "latest" else 1  # type: ignore[attr-defined]
    return versions[-max(n, 1):]


def confined_path(path: str, roots: Sequence[str] | None) -> str | None:
    """`path` resolved (symlinks followed) if it lies under one of `roots` (real
    paths), else None; `path` itself when `roots` is None (not confined)."""
    if roots is None:
        return path
    real = os.path.realpath(path)
    return real if any(os.path.commonpath([real, r]) == r for r in roots) else None


def list_versions(base_path: str, confine: Sequence[str] | None = None
                  ) -> tuple[list[int] | None, list[str]]:
    """Numeric subdirectories holding a SavedModel, or None if the base path
    cannot be listed; plus the numeric directories that are not (yet) models, or
    (with `confine`) lead out of the allowed roots, as "name (outside ...)"."""
    try:
        names = os.listdir(base_path)
    except OSError:
        return None, []
    versions, pending = [], []
    for name in names:
        path = os.path.join(base_path, name)
        if not (name.isascii() and name.isdigit() and os.path.isdir(path)):
            continue
        if confined_path(path, confine) is None:
            pending.append(f"{name} (a link out of --reload_config_allowed_roots)")
            continue
        if any(os.path.exists(os.path.join(path, f))
               for f in ("saved_model.pb", "saved_model.pbtxt")):
            versions.append(int(name))
        else:
            pending.append(name)
    return sorted(set(versions)), pending


class ModelManager:
    def __init__(self, *, poll_wait_seconds: float = 1, tags: Sequence[str] = ("serve",),
                 max_num_load_retries: int = 5, load_retry_interval_s: float = 60,
                 allow_labels_for_unavailable: bool = False, warmup: bool = True,
                 loader: Loader | None = None):
        self.poll_wait_seconds = poll_wait_seconds
        self.max_num_load_retries = max_num_load_retries
        self.load_retry_interval_s = load_retry_interval_s
        self.allow_labels_for_unavailable = allow_labels_for_unavailable
        self._loader: Loader = loader or (lambda n, v, p: load_servable(n, v, p, tags, warmup))
        self._models: dict[str, _Model] = {}
        self._cond = threading.Condition()
        # tf.saved_model.load is not documented as thread-safe; loads take turns.
        self._load_lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._poller: threading.Thread | None = None

    # -- configuration -------------------------------------------------------------
    def set_config(self, config: model_server_config_pb2.ModelServerConfig,
                   wait_s: float | None = None,
                   confine: dict[str, Sequence[str]] | None = None) -> None:
        """Serve exactly the models of `config`: add new ones, update changed ones,
        unload removed ones. Returns once every load started for the new set has
        succeeded or failed its first attempt (retries go on in the background) or
        `wait_s` passed; label errors raise FAILED_PRECONDITION and leave the
        previous labels in place. With `confine` (model name -> real paths), a model's
        version directories must resolve under one of its paths to be loaded."""
        wanted = {m.name: m for m in config.model_config_list.config}
        with self._cond:
            for name, model in self._models.items():
                if name not in wanted and not model.removed:
                    log.info("Removing model %s", name)
                    model.removed = True
            for name, model_config in wanted.items():
                model = self._models.get(name)
                if model is None:
                    model = self._models[name] = _Model(ModelConfig())
                model.removed = False  # a re-added model keeps its version history
                model.config.CopyFrom(model_config)
                model.confine = tuple(confine[name]) if confine is not None else None
        self.poll_once()
        deadline = None if wait_s is None else time.monotonic() + wait_s
        with self._cond:
            while any(self._models[n].first_try for n in wanted) \
                    and not self._stopping.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            self._apply_labels(wanted)

    def _apply_labels(self, wanted: dict[str, ModelConfig]) -> None:
        new_labels: dict[str, dict[str, int]] = {}
        for name, model_config in wanted.items():
            model = self._models[name]
            labels = dict(model_config.version_labels)
            for label, version in sorted(labels.items()):
                if version not in model.servables and not self.allow_labels_for_unavailable:
                    raise ServingError(
                        FAILED_PRECONDITION,
                        f"Request to assign label to version {version} of model {name}, which "
                        "is not currently available for inference (label "
                        f"{label!r}); pass --allow_version_labels_for_unavailable_models to "
                        "allow it")
            new_labels[name] = labels
        for name, labels in new_labels.items():
            self._models[name].labels = labels

    # -- polling ---------------------------------------------------------------------
    def start(self) -> None:
        """Poll the base paths in the background (TF: 0 = only the initial poll)."""
        if self.poll_wait_seconds > 0:
            self._poller = threading.Thread(target=self._poll_loop, name="fs-poll", daemon=True)
            self._poller.start()

    def _poll_loop(self) -> None:
        while not self._stopping.wait(self.poll_wait_seconds):
            try:
                self.poll_once()
            except Exception:  # a poll must never kill the poller
                log.exception("file system poll failed")

    def poll_once(self) -> None:
        with self._cond:
            paths = {n: (m.config.base_path, m.confine) for n, m in self._models.items()
                     if not m.removed}
        listings = {n: list_versions(p, c) for n, (p, c) in paths.items()}
        with self._cond:
            for name, model in self._models.items():
                if model.removed:
                    model.on_disk = []
                elif name in listings:
                    versions, pending = listings[name]
                    self._note_listing(name, model, versions, pending)
                    if versions is not None:
                        model.on_disk = versions
                self._reconcile(name, model)

    def _note_listing(self, name: str, model: _Model, versions: list[int] | None,
                      pending: list[str]) -> None:
        def warn_once(key: str, message: str) -> None:
            if key not in model.warned:
                model.warned.add(key)
                log.warning(message)
        base = model.config.base_path
        if versions is None:
            warn_once("base", f"Could not find base path {base} for servable {name}; keeping "
                              "what is loaded")
        elif not versions:
            warn_once("empty", f"No versions of servable {name} found under base path {base}")
        for d in pending:
            if d.endswith(")"):
                warn_once(f"outside:{d}", f"{os.path.join(base, d)}: not served")
                continue
            warn_once(f"pending:{d}", f"{os.path.join(base, d)} has no saved_model.pb yet; "
                                      "not loading it until it has")
        policy = model.config.model_version_policy
        if versions and policy.WhichOneof("policy_choice") == "specific":
            missing = sorted(set(policy.specific.versions) - set(versions))
            if missing:
                warn_once(f"missing:{missing}", f"Servable {name}: version(s) {missing} of its "
                          f"specific version policy are not under base path {base}"
                          + ("; keeping the versions loaded serving" if model.servables
                             else ""))

    def _reconcile(self, name: str, model: _Model) -> None:
        """Under the lock: start loads of aspired versions, retire unaspired ones."""
        if model.on_disk is None:
            return
        model.failed &= set(model.on_disk)  # a failed version that reappears is retried
        aspired = [] if model.removed else aspired_versions(
            model.config.model_version_policy, model.on_disk)
        for version in aspired:
            if version not in model.servables and version not in model.loading \
                    and version not in model.failed:
                self._start_load(name, model, version)
        # AvailabilityPreservingPolicy: while no aspired version is available (still
        # loading, or failed), the newest unaspired one keeps serving. So too when a
        # specific policy pins only versions that are not on disk (a typo, or a version
        # not copied yet): that must not unload the live model.
        unaspired = sorted(v for v in model.servables if v not in aspired)
        pinned_missing = not model.removed and not aspired and \
            model.config.model_version_policy.WhichOneof("policy_choice") == "specific"
        if (aspired and not any(v in model.servables for v in aspired)) or pinned_missing:
            unaspired = unaspired[:-1]
        for version in unaspired:
            self._retire(name, model, version)

    def _start_load(self, name: str, model: _Model, version: int) -> None:
        path = os.path.join(model.config.base_path, str(version))
        # Confined (a reloaded config): load from the path checked, resolved now, so a
        # link swapped after the listing cannot lead the load out of the allowed roots.
        resolved = confined_path(path, model.confine)
        if resolved is None:
            model.failed.add(version)
            model.states[version] = _VersionState(State.END, ServingError(
                PERMISSION_DENIED, f"{path} leads out of --reload_config_allowed_roots"))
            return
        model.loading.add(version)
        model.first_try.add(version)
        model.states[version] = _VersionState(State.LOADING)
        thread = threading.Thread(target=self._load, args=(name, model, version, resolved),
                                  name=f"load-{name}-{version}", daemon=True)
        self._track(thread)

    def _load(self, name: str, model: _Model, version: int, path: str) -> None:
        error: ServingError | None = None
        servable: Servable | None = None
        for attempt in range(self.max_num_load_retries + 1):
            if attempt and self._stopping.wait(self.load_retry_interval_s):
                break
            log.info("Loading servable: {name: %s version: %d} from %s", name, version, path)
            try:
                with self._load_lock:
                    servable = self._loader(name, version, path)
                error = None
                break
            except ServingError as e:
                error = e
            except Exception as e:  # any loader failure is this version's, not the server's
                error = ServingError(UNKNOWN, f"{type(e).__name__}: {e}")
            log.error("Loading servable: {name: %s version: %d} failed: %s", name, version,
                      error.message)
            with self._cond:
                model.first_try.discard(version)
                self._cond.notify_all()
        with self._cond:
            model.loading.discard(version)
            model.first_try.discard(version)
            if servable is not None:
                serving = max((v for v in model.servables if v != version), default=None)
                model.servables[version] = servable
                model.states[version] = _VersionState(State.AVAILABLE)
                log.info("Successfully loaded servable version {name: %s version: %d}", name,
                         version)
                if serving is not None:
                    # Compiled models accept the shapes they were compiled for: a client
                    # of the serving version may send what this one refuses.
                    changes = accepted_shape_changes(
                        model.servables[serving].signature_defs, servable.signature_defs)
                    if changes:
                        log.warning("servable {name: %s version: %d} accepts other shapes "
                                    "than version %d: %s", name, version, serving,
                                    "; ".join(changes))
            else:
                model.failed.add(version)
                error = error or ServingError(UNKNOWN, "the server stopped during the load")
                model.states[version] = _VersionState(State.END, ServingError(
                    error.code, f"Loading servable: {{name: {name} version: {version}}} "
                                f"failed: {error.message}"))
            self._reconcile(name, model)
            self._cond.notify_all()

    def _retire(self, name: str, model: _Model, version: int) -> None:
        """Under the lock: take `version` away from new requests, then release it
        in the background once its in-flight requests are done."""
        servable = model.servables.pop(version)
        model.states[version] = _VersionState(State.UNLOADING)
        log.info("Unloading servable version {name: %s version: %d}", name, version)

        def unload() -> None:
            servable.wait_idle()
            servable.release()
            gc.collect()  # TF resources are freed with their Python owners
            kernel_bridge.wait_for_unloads(timeout=60)  # and their device memory, queued
            with self._cond:
                if model.states.get(version, _VersionState(0)).state == State.UNLOADING:
                    model.states[version] = _VersionState(State.END)
                self._cond.notify_all()
            log.info("Done unloading servable version {name: %s version: %d}", name, version)

        thread = threading.Thread(target=unload, name=f"unload-{name}-{version}", daemon=True)
        self._track(thread)

    def _track(self, thread: threading.Thread) -> None:
        """Start a load/unload thread; `stop` joins the ones still running."""
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    # -- requests --------------------------------------------------------------------
    @contextlib.contextmanager
    def acquire(self, name: str, version: int | None = None,
                label: str | None = None) -> Iterator[Servable]:
        """The servable for a ModelSpec, held (not unloadable) inside the block."""
        if not name:
            raise invalid_argument("ModelSpec has no name specified.")
        with self._cond:
            model = self._models.get(name)
            if model is not None and not model.removed and label:
                if label not in model.labels:
                    raise invalid_argument(f"Unrecognized servable version label: {label}")
                version = model.labels[label]
            servables = model.servables if model is not None and not model.removed else {}
            if version is not None:
                servable = servables.get(version)
                request = f"Specific({name}, {version})"
            else:
                servable = servables[max(servables)] if servables else None
                request = f"Latest({name})"
            if servable is None:
                raise not_found(f"Servable not found for request: {request}")
            servable.hold()
        try:
            yield servable
        finally:
            servable.unhold()

    def status(self, name: str, version: int | None = None,
               label: str | None = None) -> get_model_status_pb2.GetModelStatusResponse:
        if not name:
            raise invalid_argument("Missing model name in request.")
        response = get_model_status_pb2.GetModelStatusResponse()
        with self._cond:
            model = self._models.get(name)
            states = dict(model.states) if model is not None else {}
            if label:
                if model is None or label not in model.labels:
                    raise invalid_argument(f"Unrecognized servable version label: {label}")
                version = model.labels[label]
        if version is not None:
            if version not in states:
                raise not_found(f"Could not find version {version} of model {name}")
            states = {version: states[version]}
        elif not states:
            raise not_found(f"Could not find any versions of model {name}")
        for v in sorted(states, reverse=True):  # TF Serving lists newest first
            entry = response.model_version_status.add(version=v, state=states[v].state)
            entry.status.SetInParent()  # TF Serving always sends a status (OK included)
            error = states[v].error
            if error is not None:
                entry.status.error_code = error.code
                entry.status.error_message = error.message
        return response

    def knows(self, name: str) -> bool:
        """`name` is (or was) a configured model: a bounded set, unlike request names."""
        return name in self._models

    def model_names(self) -> list[str]:
        with self._cond:
            return sorted(n for n, m in self._models.items() if not m.removed)

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """For tests and start-up: wait until `predicate()` (called under the lock)."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout_s)

    def stop(self) -> None:
        """Stop polling and unload everything (waiting for in-flight requests)."""
        self._stopping.set()
        with self._cond:
            for name, model in self._models.items():
                model.removed = True
                model.on_disk = []
                self._reconcile(name, model)
            self._cond.notify_all()
        for thread in list(self._threads):
            thread.join(timeout=30)
