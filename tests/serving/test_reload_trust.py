"""Reloading a config: pinning a version that is not on disk unloaded the
live model (NOT_FOUND for every client); a version directory symlinked out of
--reload_config_allowed_roots was served. The manager with a stub loader here (what
it loads is a real path check); the end-to-end refusal of base paths is in
test_hostile.py."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from neuronish.serving.manager import ModelManager
from neuronish.serving.servable import Servable


def _version(base: Path, v: int) -> Path:
    (base / str(v)).mkdir(parents=True)
    (base / str(v) / "saved_model.pb").write_bytes(b"")
    return base / str(v)


def _config(base: Path, policy: str = "") -> model_server_config_pb2.ModelServerConfig:
    return text_format.Parse(f"""model_config_list {{ config {{
        name: "m" base_path: "{base}" model_platform: "tensorflow"
        {policy} }} }}""", model_server_config_pb2.ModelServerConfig())


def _manager(loaded: list[str]) -> ModelManager:
    def loader(name: str, version: int, path: str) -> Servable:
        loaded.append(path)
        return Servable(name, version, path, {}, {}, None)
    return ModelManager(poll_wait_seconds=0, max_num_load_retries=0, loader=loader)


def test_pinning_a_missing_version_keeps_the_live_model(tmp_path: Path) -> None:
    _version(tmp_path, 1)
    manager = _manager([])
    try:
        manager.set_config(_config(tmp_path))
        manager.set_config(_config(tmp_path, "model_version_policy { specific { versions: 9 } }"))
        manager.poll_once()
        with manager.acquire("m") as servable:
            assert servable.version == 1  # still serving, not NOT_FOUND
        _version(tmp_path, 9)  # the pinned version arrives: it takes over
        manager.poll_once()
        assert manager.wait_until(lambda: 9 in manager._models["m"].servables, 10)
        assert manager.wait_until(lambda: 1 not in manager._models["m"].servables, 10)
        with manager.acquire("m") as servable:
            assert servable.version == 9
    finally:
        manager.stop()


def test_a_version_linked_out_of_the_allowed_roots_is_not_served(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    base = allowed / "m"
    _version(base, 1)
    _version(outside, 5)
    (base / "5").symlink_to(outside / "5")  # inside the base path, leading out
    (base / "3").symlink_to(base / "1")  # a link that stays inside is fine
    loaded: list[str] = []
    manager = _manager(loaded)
    try:
        manager.set_config(_config(base, "model_version_policy { all {} }"),
                           confine={"m": [str(allowed.resolve())]})
        manager.poll_once()
        assert manager.wait_until(lambda: not manager._models["m"].loading, 10)
        assert sorted(manager._models["m"].servables) == [1, 3]
        assert not any(str(outside) in p for p in loaded), loaded
        with manager.acquire("m", 3) as servable:
            assert servable.path == str((base / "1").resolve())  # loaded where it was checked
    finally:
        manager.stop()


def test_without_confinement_links_are_followed_as_tf_serving_does(tmp_path: Path) -> None:
    _version(tmp_path / "store", 5)
    base = tmp_path / "m"
    base.mkdir()
    (base / "5").symlink_to(tmp_path / "store" / "5")
    manager = _manager([])
    try:
        manager.set_config(_config(base))  # the operator's own config: not confined
        with manager.acquire("m") as servable:
            assert servable.version == 5
    finally:
        manager.stop()
